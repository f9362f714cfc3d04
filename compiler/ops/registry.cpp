#include "compiler/ops/registry.h"

#include <algorithm>
#include <map>

#include "compiler/ops/families.h"
#include "compiler/ops/geometry.h"

namespace ampc {

std::string_view ampCategoryName(AmpCategory c) {
  switch (c) {
    case AmpCategory::Allow: return "allow";
    case AmpCategory::Deny: return "deny";
    case AmpCategory::Infer: return "infer";
    case AmpCategory::Clear: return "clear";
  }
  return "?";
}

InferContext::InferContext(const Node& node, int opset) : node_(node), opset_(opset) {}

const TensorType& InferContext::in(size_t i) const {
  const Value* v = node_.input(i);
  if (!v) fail("input " + std::to_string(i) + " is required");
  return v->type();
}

const Tensor* InferContext::constIn(size_t i) const {
  const Value* v = node_.input(i);
  return v ? v->constData() : nullptr;
}

std::vector<int64_t> InferContext::constInts(size_t i) const {
  const Tensor* t = constIn(i);
  if (!t) {
    const Value* v = node_.input(i);
    fail("input " + std::to_string(i) + (v ? " ('" + v->name() + "')" : std::string()) +
         " must be a compile-time constant (static shapes); fix the shape with --input-shape");
  }
  if (!isInteger(t->type.dtype)) fail("input " + std::to_string(i) + " must be an integer tensor");
  return t->toInts();
}

void InferContext::setOut(size_t i, TensorType t) {
  // Every shape rule's result: no negative dim, an element count that fits (a rule's arithmetic
  // gone wrong is refused here rather than allocated or indexed).
  if (!t.sizeFits()) fail("output " + std::to_string(i) + " would be " + t.str() + ": a negative dim or more elements than fit");
  if (outputs.size() <= i) outputs.resize(i + 1);
  outputs[i] = std::move(t);
}

void InferContext::fail(const std::string& msg) const { throw Error(node_.describe() + ": " + msg); }

int64_t InferContext::axis(int64_t a, int64_t r) const {
  if (a < -r || a >= std::max<int64_t>(r, 1))
    fail("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(r));
  return a < 0 ? a + r : a;
}

std::vector<int64_t> broadcastShapes(const InferContext& c, const std::vector<int64_t>& a,
                                     const std::vector<int64_t>& b) {
  if (auto out = broadcastShapes(a, b)) return *out;
  auto str = [](const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t k = 0; k < s.size(); ++k) t += (k ? "," : "") + std::to_string(s[k]);
    return t + "]";
  };
  c.fail("shapes " + str(a) + " and " + str(b) + " do not broadcast");
}

const std::vector<OpDef>& allOps() {
  static const std::vector<OpDef> table = [] {
    std::vector<OpDef> t;
    registerElementwiseOps(t);
    registerNNOps(t);
    registerTensorOps(t);
    registerGradOps(t);
    registerTrainOps(t);
    attachGradRules(t);
    attachPointwise(t);
    attachOnnxAttributes(t);
    return t;
  }();
  return table;
}

// The attributes of each ONNX op that its shape rule, gradient, CPU kernels and CUDA lowering
// read (OpDef::attrs); an op not listed takes none. Notes on the less obvious ones:
// - the random ops' seed keys their Philox stream, so the draws repeat with it;
// - TopK's results are always sorted, which sorted = 0 allows;
// - Cast's saturate matters only for float8 targets, which Cast's rule refuses;
// - LayerNormalization's statistics are f32 or wider whatever stash_type says.
void attachOnnxAttributes(std::vector<OpDef>& t) {
  static const std::map<std::string_view, std::string_view> kAttrs = {
      {"HardSigmoid", "alpha beta"},
      {"Elu", "alpha"},
      {"Selu", "alpha gamma"},
      {"Celu", "alpha"},
      {"LeakyRelu", "alpha"},
      {"Gelu", "approximate"},
      {"Mod", "fmod"},
      {"IsInf", "detect_negative detect_positive"},
      {"Softmax", "axis"},
      {"LogSoftmax", "axis"},
      {"RandomUniformLike", "dtype high low seed"},
      {"RandomNormalLike", "dtype mean scale seed"},
      {"Bernoulli", "dtype seed"},
      {"Dropout", "seed"},
      {"Gemm", "alpha beta transA transB"},
      {"Conv", "auto_pad dilations group kernel_shape pads strides"},
      {"MaxPool", "auto_pad ceil_mode dilations kernel_shape pads storage_order strides"},
      {"AveragePool", "auto_pad ceil_mode count_include_pad dilations kernel_shape pads strides"},
      {"BatchNormalization", "epsilon momentum training_mode"},
      {"LayerNormalization", "axis epsilon stash_type"},
      {"ReduceSum", "keepdims noop_with_empty_axes"},
      {"ReduceMean", "axes keepdims noop_with_empty_axes"},
      {"ReduceMax", "axes keepdims noop_with_empty_axes"},
      {"ReduceMin", "axes keepdims noop_with_empty_axes"},
      {"ArgMax", "axis keepdims select_last_index"},
      {"TopK", "axis largest sorted"},
      {"GridSample", "align_corners mode padding_mode"},
      {"CumSum", "exclusive reverse"},
      {"SoftmaxCrossEntropyLoss", "ignore_index reduction"},
      {"NegativeLogLikelihoodLoss", "ignore_index reduction"},
      {"Reshape", "allowzero"},
      {"Transpose", "perm"},
      {"Concat", "axis"},
      {"Split", "axis num_outputs"},
      {"Gather", "axis"},
      {"GatherElements", "axis"},
      {"GatherND", "batch_dims"},
      {"ScatterElements", "axis reduction"},
      {"ScatterND", "reduction"},
      {"Flatten", "axis"},
      {"Pad", "mode"},
      {"Trilu", "upper"},
      {"Cast", "to saturate"},
      {"Shape", "end start"},
      {"ConstantOfShape", "value"},
      {"Constant", "value value_float value_floats value_int value_ints"},
  };
  for (OpDef& d : t) {
    if (!d.domain.empty()) continue;
    if (auto it = kAttrs.find(d.name); it != kAttrs.end()) d.attrs = it->second;
  }
}

bool attributeTaken(std::string_view attrs, std::string_view name) {
  while (!attrs.empty()) {
    const size_t end = std::min(attrs.find(' '), attrs.size());
    if (attrs.substr(0, end) == name) return true;
    attrs.remove_prefix(std::min(end + 1, attrs.size()));
  }
  return false;
}

double nodeFlops(const Node& n) {
  if (n.def() && n.def()->flops) return n.def()->flops(n);
  double f = 0;
  for (size_t i = 0; i < n.numResults(); ++i) f += static_cast<double>(n.result(i)->type().numel());
  return f;
}

const OpDef* lookupOp(std::string_view domain, std::string_view op, int opset) {
  if (domain == "ai.onnx") domain = "";
  for (const OpDef& d : allOps())
    if (d.name == op && d.domain == domain && opset >= d.sinceOpset && opset <= d.lastOpset) return &d;
  return nullptr;
}

std::vector<TensorType> inferTypes(const Node& n) {
  const OpDef* d = n.def();
  if (!d) throw Error(n.describe() + ": op is not in the registry (domain '" + n.domain() + "')");
  InferContext c(n, n.graph() ? n.graph()->opset : kMaxOpset);
  int ni = static_cast<int>(n.numInputs());
  if (ni < d->minInputs || (d->maxInputs >= 0 && ni > d->maxInputs))
    c.fail("takes " + std::to_string(d->minInputs) + (d->maxInputs == d->minInputs ? "" : " to " + (d->maxInputs < 0 ? std::string("any") : std::to_string(d->maxInputs))) +
           " inputs, got " + std::to_string(ni));
  for (int i = 0; i < d->minInputs; ++i)
    if (!n.input(i)) c.fail("input " + std::to_string(i) + " is required");
  int no = static_cast<int>(n.numResults());
  if (no < d->minOutputs || (d->maxOutputs >= 0 && no > d->maxOutputs))
    c.fail("has " + std::to_string(no) + " outputs; the op has " + std::to_string(d->minOutputs) +
           (d->maxOutputs == d->minOutputs ? "" : " to " + (d->maxOutputs < 0 ? std::string("any") : std::to_string(d->maxOutputs))));
  d->infer(c);
  if (c.outputs.size() < n.numResults()) c.fail("internal: shape rule left outputs untyped");
  c.outputs.resize(n.numResults());
  for (const auto& t : c.outputs) {
    for (int64_t dim : t.shape)
      if (dim < 0) c.fail("inferred a negative dimension in " + t.str());
    if (!t.sizeFits()) c.fail("inferred " + t.str() + ", which has too many elements");
  }
  return c.outputs;
}

}  // namespace ampc
