// lower-nll: NegativeLogLikelihoodLoss (F.nll_loss, nn.NLLLoss) in terms every backend runs.
// - Over a LogSoftmax on the class axis whose one use it is (F.nll_loss(F.log_softmax(z))), the
//   pair becomes SoftmaxCrossEntropyLoss(z) with the same target, weight, ignore_index and
//   reduction: the same function, the fused loss kernels.
// - Otherwise: -x[n, t[n, ..], ..] picked by GatherElements along the class axis, times the
//   target's class weight (Gather) and 0 where the target is ignore_index, then the reduction:
//   none, sum, or mean = the sum over the weights' sum (ONNX's and PyTorch's definition; NaN when
//   every target is ignored, as PyTorch gives).
// Each result keeps the loss's name.
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class LowerNllPass final : public Pass {
 public:
  std::string name() const override { return "lower-nll"; }
  bool run(Graph& g) override {
    std::vector<Node*> found;
    for (const auto& up : g.nodes())
      if (isOnnxOp(up.get(), "NegativeLogLikelihoodLoss")) found.push_back(up.get());
    for (Node* n : found) lower(g, n);
    return !found.empty();
  }

 private:
  static void lower(Graph& g, Node* n) {
    if (g.opset < 13) return;  // Squeeze and Unsqueeze take their axes as inputs from 13
    Value* x = n->input(0);
    Value* t = n->input(1);
    Value* w = n->numInputs() > 2 ? n->input(2) : nullptr;
    const bool ignore = n->hasAttr("ignore_index");
    const int64_t ignoreIndex = n->getInt("ignore_index", 0);
    const std::string reduction = n->getString("reduction", "mean");
    Value* loss = n->result(0);
    const std::string lossName = loss->name();
    const TensorType xt = x->type();
    const DType ft = xt.dtype;

    // F.nll_loss(F.log_softmax(z, 1)): the softmax cross-entropy of z.
    Node* ls = x->producer();
    if (isOnnxOp(ls, "LogSoftmax") && singleUse(g, x) && xt.rank() >= 2) {
      const int64_t a = ls->getInt("axis", -1), axis = a < 0 ? a + xt.rank() : a;
      if (axis == 1) {
        std::vector<Value*> ins{ls->input(0), t};
        if (w) ins.push_back(w);
        Node* sce = g.createNode("SoftmaxCrossEntropyLoss", "", ins, {{g.uniqueName(lossName + ".sce"), loss->type()}}, n);
        sce->setName(n->name() + "/SoftmaxCrossEntropyLoss");
        sce->setAttr("reduction", reduction);
        if (ignore) sce->setAttr("ignore_index", ignoreIndex);
        loss->replaceAllUsesWith(sce->result(0));
        g.eraseNode(n);
        g.eraseNode(ls);
        g.renameValue(sce->result(0), lossName);
        return;
      }
    }

    // The target without its class axis: [N, d..]; indices as i64.
    const TensorType tt = t->type();
    Value* t64 = tt.dtype == DType::i64 ? t : emitBefore(g, n, "Cast", {t}, TensorType{DType::i64, tt.shape}, {{"to", int64_t{7}}});
    const TensorType boolT{DType::boolean, tt.shape}, idxT{DType::i64, tt.shape}, perT{ft, tt.shape};
    Value* valid = nullptr;
    Value* safe = t64;
    if (ignore) {
      Value* ig = g.addConst(g.uniqueName(lossName + ".ignore_index"), Tensor::fromInts(DType::i64, {}, {ignoreIndex}));
      valid = emitBefore(g, n, "Not", {emitBefore(g, n, "Equal", {t64, ig}, boolT)}, boolT);
      Value* zero = g.addConst(g.uniqueName(lossName + ".zero"), Tensor::fromInts(DType::i64, {}, {0}));
      safe = emitBefore(g, n, "Where", {valid, t64, zero}, idxT);
    }
    std::vector<int64_t> withAxis = tt.shape;
    withAxis.insert(withAxis.begin() + 1, 1);
    Value* idx = emitBefore(g, n, "Unsqueeze", {safe, i64Const(g, n, "axes", {1})}, TensorType{DType::i64, withAxis});
    Value* picked = emitBefore(g, n, "GatherElements", {x, idx}, TensorType{ft, withAxis}, {{"axis", int64_t{1}}});
    Value* per = emitBefore(g, n, "Neg", {emitBefore(g, n, "Squeeze", {picked, i64Const(g, n, "squeeze_axes", {1})}, perT)}, perT);
    // The weight of each target: its class's weight, 0 where ignored; none at all: 1.
    Value* wt = nullptr;
    if (w) wt = emitBefore(g, n, "Gather", {w->type().dtype == ft ? w : emitBefore(g, n, "Cast", {w}, TensorType{ft, w->type().shape}, {{"to", static_cast<int64_t>(dtypeToOnnx(ft))}}), safe},
                     perT, {{"axis", int64_t{0}}});
    if (valid) {
      Value* m = emitBefore(g, n, "Cast", {valid}, perT, {{"to", static_cast<int64_t>(dtypeToOnnx(ft))}});
      wt = wt ? emitBefore(g, n, "Mul", {wt, m}, perT) : m;
    }
    if (wt) per = emitBefore(g, n, "Mul", {per, wt}, perT);
    const TensorType scalar{ft, {}};
    auto sumAll = [&](Value* v) {
      return emitBefore(g, n, "ReduceSum", {v}, scalar, {{"keepdims", int64_t{0}}});
    };
    Value* result = nullptr;
    if (reduction == "none") result = emitBefore(g, n, "Identity", {per}, loss->type());
    else if (reduction == "sum") result = sumAll(per);
    else result = wt ? emitBefore(g, n, "Div", {sumAll(per), sumAll(wt)}, scalar) : emitBefore(g, n, "ReduceMean", {per}, scalar, {{"keepdims", int64_t{0}}});
    loss->replaceAllUsesWith(result);
    g.eraseNode(n);
    g.renameValue(result, lossName);
  }
};

}  // namespace

std::unique_ptr<Pass> createLowerNllPass() { return std::make_unique<LowerNllPass>(); }

}  // namespace ampc
