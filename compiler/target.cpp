#include "compiler/target.h"

#include <set>

#include "compiler/ir/ir.h"
#include "compiler/ops/geometry.h"
#include "compiler/ops/registry.h"
#include "kernels/cuda/limits.h"

namespace ampc {
namespace {

bool cudnnOnlyAttention(const AttentionShape& s) { return cuda::attentionCudnnOnly(s.lowFloat, s.headDim, s.vHeadDim, s.dropout, s.maskForCudnn); }
// Soft-capped scores: not in the CUDA kernels yet (the CPU reference has them).
bool cudaAttention(const AttentionShape& s) {
  return !s.softcap && (cuda::attentionFits(s.lowFloat, s.headDim, s.vHeadDim, s.keys, s.dropout) || cudnnOnlyAttention(s));
}
// The mma.sync kernels take strided operands, and cuDNN (which wants K as rows).
bool cudaAttentionInPlace(const AttentionShape& s) {
  return !s.softcap && (cuda::attentionMmaShape(s.lowFloat, s.headDim, s.vHeadDim, s.keys, s.dropout) || cudnnOnlyAttention(s));
}

bool onnxOp(const Node& n, const char* op) { return n.domain().empty() && n.op() == op; }
bool lossGrad(const Node& n) { return (n.domain() == "ampc" || n.domain() == kCudaDomain) && n.op() == "SoftmaxCrossEntropyLossGrad"; }
// The elementwise ops whose hand-written kernels widen any operand and round the result in
// registers (Max/Min, chained launches, do not).
bool elementwiseThroughCasts(const Node& n) {
  static const std::set<std::string> kOps = {"Add",  "Sub",  "Mul",        "Div",   "Pow",   "Equal", "Less",     "LessOrEqual", "Greater",
                                             "GreaterOrEqual", "Where", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid", "Erf",
                                             "Softplus", "LeakyRelu", "Relu", "Neg", "Abs", "Gelu", "Clip"};
  return n.domain().empty() && kOps.count(n.op()) != 0;
}
// Elementwise ops any operand, the cross-entropy loss (without its log-prob result) and its
// gradient the scores, LayerNormalization and RmsNorm X, LayerNormGrad dY and X, UnscaleCheck the gradients, a
// tiled Transpose its input (it converts in its tiles).
bool cudaReadsWidened(const Node& user, size_t i) {
  if (elementwiseThroughCasts(user)) return true;
  if (onnxOp(user, "SoftmaxCrossEntropyLoss")) return i == 0 && user.numResults() == 1;
  if (user.domain() == kCudaDomain && user.op() == "SoftmaxCrossEntropyLoss") return i == 0;  // result 1: the row statistics
  if ((user.domain() == "ampc" || user.domain() == kCudaDomain) && user.op() == "LayerNormGrad") return i <= 1;
  if (onnxOp(user, "LayerNormalization") || (user.domain() == "ampc" && user.op() == "RmsNorm")) return i == 0;
  if (user.domain() == "ampc" && user.op() == "UnscaleCheck") return i >= 1;
  int64_t b, r, c;
  if (tiledTranspose(user, b, r, c)) return i == 0;
  return lossGrad(user) && i == 1;
}
// Elementwise ops (not one computed at load), the loss gradient and LayerNormalization's (RmsNorm's) result 0.
bool cudaWritesNarrowed(const Node& n) {
  const bool layerNorm = onnxOp(n, "LayerNormalization") || (n.domain() == "ampc" && n.op() == "RmsNorm");
  if (!(elementwiseThroughCasts(n) && !allConstInputs(n)) && !lossGrad(n) && !layerNorm) return false;
  return (n.numResults() == 1 || layerNorm) && n.result(0)->type().dtype == DType::f32;
}
// DropoutGrad's dY (a residual stream's gradient cast down for the dropout's backward).
bool cudaReadsNarrowed(const Node& user, size_t i) { return user.domain() == "ampc" && user.op() == "DropoutGrad" && i == 0; }
// The pointwise ops runtime/cuda/program.cpp lowers by hand (its elementwise kernel, GELU, SiLU,
// Max/Min, Clip, Identity). An op missing here runs generated (correct); one listed that
// program.cpp lacks fails at load, naming it.
bool cudaPointwiseByHand(const Node& n) {
  static const std::set<std::string> kOnnx = {
      "Add",     "Sub",       "Mul",      "Div",         "Pow",      "Equal",       "Less",      "LessOrEqual", "Greater",
      "GreaterOrEqual", "And", "Or",      "Where",       "Sqrt",     "Reciprocal",  "Exp",       "Log",         "Tanh",
      "Sigmoid", "Erf",       "Softplus", "LeakyRelu",   "Relu",     "Neg",         "Abs",       "Not",         "IsNaN",
      "IsInf",   "Cast",      "CastLike", "Sin",         "Cos",      "HardSigmoid", "HardSwish", "Elu",         "Selu",
      "Celu",    "Mish",      "Floor",    "Ceil",        "Round",    "Sign",        "PRelu",     "Mod",         "Gelu",
      "Max",     "Min",       "Clip",     "Identity"};
  static const std::set<std::string> kAmpc = {"Gelu", "GeluGrad", "Silu", "SiluGrad"};
  return n.domain().empty() ? kOnnx.count(n.op()) != 0 : n.domain() == "ampc" && kAmpc.count(n.op()) != 0;
}

// What the CUDA program has no kernel for, known from the node alone (runtime/cuda/program.cpp
// refuses it at load too).
std::string cudaRefusal(const Node& n) {
  if (!n.domain().empty()) return {};
  const std::string cpu = " has no CUDA kernel; compile with --target cpu to run it on the CPU backend";
  if (n.op() == "ScatterElements" || n.op() == "ScatterND") {
    const std::string r = n.getString("reduction", "none");
    if (r != "none" && r != "add") return "reduction '" + r + "'" + cpu;
  }
  if (n.op() == "MaxPool" && n.getInt("storage_order", 0) != 0) return "storage_order = 1 (column-major Indices)" + cpu;
  if (n.op() == "ArgMax" && n.getInt("select_last_index", 0) != 0) return "select_last_index = 1 (the last maximum)" + cpu;
  // Tile's copy reads the output as [reps, x] per dim, twice the rank, within kMaxRank (8).
  if (n.op() == "Tile" && n.input(0) && n.input(0)->type().rank() > 4)
    return "rank " + std::to_string(n.input(0)->type().rank()) + " (CUDA's Tile takes up to 4)" + cpu;
  return {};
}

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {.name = "cuda",
       .attention = cudaAttention,
       .attentionInPlace = cudaAttentionInPlace,
       .paddedGemm = cuda::gemmRunsPadded,
       .readsWidened = cudaReadsWidened,
       .writesNarrowed = cudaWritesNarrowed,
       .readsNarrowed = cudaReadsNarrowed,
       .pointwiseByHand = cudaPointwiseByHand,
       // LayerNorm's kernels with `rms` (kernels/cuda/nn.cu); GpuOps' RmsNorm cases check them.
       .rmsNorm = true,
       .convPadsBothEnds = true,
       .matmulWholeBatch = true,  // cuBLASLt's one batch stride (runtime/cuda/program.cpp, MatMul)
       .padsNonNegative = true,
       .refusal = cudaRefusal},
      {.name = "cpu", .rmsNorm = true},
  };
  return t;
}

}  // namespace

bool allConstInputs(const Node& n) {
  bool all = !n.inputs().empty() && !(n.def() && n.def()->random);
  for (const Value* v : n.inputs()) all = all && (!v || (v->kind() == ValueKind::Const && v->constData()));
  return all;
}

const Target& findTarget(const std::string& name) {
  for (const auto& t : targets())
    if (t.name == name) return t;
  std::string known;
  for (const auto& t : targets()) known += (known.empty() ? "" : ", ") + t.name;
  throw Error("unknown target '" + name + "' (known: " + known + ")");
}

std::vector<std::string> targetNames() {
  std::vector<std::string> n;
  for (const auto& t : targets()) n.push_back(t.name);
  return n;
}

}  // namespace ampc
