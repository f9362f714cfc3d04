// The training step's ops (DESIGN.md steps 5-8), in the "ampc" domain: unscale + finite check,
// global-norm clipping, the optimizer updates predicated on found_inf, the step counter, the
// learning-rate schedule and the dynamic loss scaler. Kernels: kernels/cpu/k_train.cpp.
#include "compiler/ops/families.h"
#include "compiler/ops/grad.h"

namespace ampc {
namespace {

void requireScalar(InferContext& c, size_t i, DType t, const char* what) {
  c.check(c.in(i).rank() == 0 && c.in(i).dtype == t, std::string(what) + " must be a " + std::string(dtypeName(t)) + " scalar, got " + c.in(i).str());
}

// UnscaleCheck(inv_scale, g1..gn) -> u1..un, found_inf
void inferUnscale(InferContext& c) {
  requireScalar(c, 0, DType::f32, "inv_scale");
  c.check(c.numOutputs() == c.numInputs(), "needs one output per gradient plus found_inf");
  for (size_t i = 1; i < c.numInputs(); ++i) c.setOut(i - 1, c.in(i));
  c.setOut(c.numInputs() - 1, TensorType{DType::boolean, {}});
}
// ClipByGlobalNorm(found_inf, g1..gn) {max_norm} -> c1..cn, norm
void inferClip(InferContext& c) {
  requireScalar(c, 0, DType::boolean, "found_inf");
  c.check(c.numOutputs() == c.numInputs(), "needs one output per gradient plus the norm");
  for (size_t i = 1; i < c.numInputs(); ++i) c.setOut(i - 1, c.in(i));
  c.setOut(c.numInputs() - 1, TensorType{DType::f32, {}});
}
// StepIncrement(step, found_inf) -> step'
void inferStep(InferContext& c) {
  requireScalar(c, 0, DType::i64, "step");
  requireScalar(c, 1, DType::boolean, "found_inf");
  c.setOut(0, c.in(0));
}
// LearningRate(step) {lr, schedule, warmup, total} -> lr
void inferLr(InferContext& c) {
  requireScalar(c, 0, DType::i64, "step");
  const std::string s = c.node().getString("schedule", "constant");
  c.check(s == "constant" || s == "linear-warmup" || s == "cosine" || s == "linear", "unknown schedule '" + s + "'");
  c.setOut(0, TensorType{DType::f32, {}});
}
// SGD(param, grad, momentum_buf?, lr, found_inf) -> param', buf'? (the buffer exactly with momentum)
// Adam(param, grad, m, v, lr, step, found_inf) -> param', m', v'
void inferOptimizer(InferContext& c) {
  const bool sgd = c.node().op() == "SGD";
  const size_t nState = c.numOutputs() - 1;
  if (sgd) {
    c.check(c.numInputs() == 5, "SGD takes 5 operands (param, grad, momentum buffer or _, lr, found_inf)");
    c.check(c.hasInput(2) == (nState == 1), "SGD takes a momentum buffer exactly when it returns the buffer's next value");
    c.check(c.hasInput(2) || c.node().getFloat("momentum", 0.0f) == 0.0f, "SGD with momentum needs a momentum buffer");
  }
  for (size_t i = 0; i < 2 + nState; ++i) c.check(c.in(i).shape == c.in(0).shape && c.in(i).dtype == DType::f32, "param, grad and state must be f32 of one shape");
  requireScalar(c, sgd ? 3 : 4, DType::f32, "lr");
  requireScalar(c, c.numInputs() - 1, DType::boolean, "found_inf");
  c.setOut(0, c.in(0));
  for (size_t i = 0; i < nState; ++i) c.setOut(1 + i, c.in(2 + i));
}
// ScalerUpdate(scale, growth_tracker, hysteresis_left, found_inf) -> scale', growth', hysteresis'
void inferScaler(InferContext& c) {
  requireScalar(c, 0, DType::f32, "scale");
  requireScalar(c, 1, DType::i64, "growth_tracker");
  requireScalar(c, 2, DType::i64, "hysteresis_left");
  requireScalar(c, 3, DType::boolean, "found_inf");
  for (size_t i = 0; i < 3; ++i) c.setOut(i, c.in(i));
}

// AllReduce(x1..xn) {reduction: "mean"} -> y1..yn: each x averaged over the processes that train
// together (data parallel: passes/data_parallel.h inserts it before UnscaleCheck). Floats only.
void inferAllReduce(InferContext& c) {
  c.check(c.numOutputs() == c.numInputs(), "needs one output per input");
  c.check(c.node().getString("reduction", "mean") == "mean", "reduction must be 'mean'");
  for (size_t i = 0; i < c.numInputs(); ++i) {
    c.check(isFloat(c.in(i).dtype), "input " + std::to_string(i) + " must be a float tensor, got " + c.in(i).str());
    c.setOut(i, c.in(i));
  }
}

}  // namespace

void registerTrainOps(std::vector<OpDef>& t) {
  auto row = [&](std::string_view name, int minIn, int maxIn, int minOut, int maxOut, ShapeFn f) {
    t.push_back(OpDef{name, kGradDomain, 1, 1, minIn, maxIn, minOut, maxOut, AmpCategory::Deny, false, f});
  };
  row("UnscaleCheck", 2, -1, 2, 1 << 16, inferUnscale);
  row("ClipByGlobalNorm", 2, -1, 2, 1 << 16, inferClip);
  row("StepIncrement", 2, 2, 1, 1, inferStep);
  row("LearningRate", 1, 1, 1, 1, inferLr);
  row("SGD", 2, 5, 1, 2, inferOptimizer);  // five operands, the buffer optional (inferOptimizer)
  row("Adam", 7, 7, 3, 3, inferOptimizer);
  row("ScalerUpdate", 4, 4, 3, 3, inferScaler);
  row("AllReduce", 1, -1, 1, 1 << 16, inferAllReduce);
}

}  // namespace ampc
