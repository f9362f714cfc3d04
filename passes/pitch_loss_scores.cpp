// pitch-loss-scores (the CUDA target's lowering, runtime/lower.cpp, its last rewrite): the loss
// scores' row pitch as an attribute of the plan.
//
// A softmax cross-entropy loss over f16/bf16 scores [rows, C] whose rows are not a multiple of 16
// bytes (GPT-2's vocabulary of 50257 words) had its scores and their gradient copied to a padded
// pitch around each of the three GEMMs that write or read them (cuBLASLt's fast kernels need
// 16-byte strides: Target::paddedGemm). Instead the two values (and their views) are stored with a
// row pitch of C rounded up to 16 bytes: the GEMMs read and write them in place, the loss and its
// gradient index rows by the pitch, and the gradient's pad columns are written as zeros (they are
// part of the next product's contraction). Only where every node that touches their bytes is one
// of those: the producing MatMul/Gemm (no bias, large enough to take the padded path), views keeping
// the last dim, a widening Cast read only by the loss and its gradient (which read through it), the
// loss and its gradient, and the consuming MatMul (scores gradient as A) / Gemm (as A, or as B not
// transposed). The gradient node records the decision: scores_pitch (its scores), grad_pitch (its
// result, or the narrowing Cast it writes); pitchedValues reads it back.
#include "passes/pitch_loss_scores.h"

#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/fold_casts.h"
#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

bool isView(const Node* n) { return n && n->def() && n->def()->view && n->numResults() == 1 && n->numInputs() > 0; }
bool isLoss(const Node& n) { return n.op() == "SoftmaxCrossEntropyLoss" && (n.domain().empty() || n.domain() == kCudaDomain); }
bool isLossGrad(const Node& n) { return n.op() == "SoftmaxCrossEntropyLossGrad" && (n.domain() == "ampc" || n.domain() == kCudaDomain); }
// The loss (without log-probs; the target's keeps row statistics instead) or its gradient reading 2-d scores.
bool lossReads(const Node& n, int operand) {
  if (isLoss(n)) return operand == 0 && (n.numResults() == 1 || n.domain() == kCudaDomain) && n.input(0)->type().rank() == 2;
  return isLossGrad(n) && operand == 1 && n.input(1)->type().rank() == 2;
}
// The scores a loss gradient reads: through a widening Cast read only by the loss and its gradients.
const Value* scoresOf(const Graph& g, const Node& grad) {
  const Value* v = grad.input(1);
  const Node* c = v->producer();
  if (!isCastBetween(c, true) || g.isOutput(v)) return v;
  for (const Use& u : v->uses())
    if (!lossReads(*u.user, u.operand)) return v;
  return c->input(0);
}
// The gradient's stored value: the narrowing Cast it writes, or its result.
const Value* gradOf(const Graph& g, const Node& grad) {
  const Node* c = onlyReader(g, grad.result(0));
  return grad.result(0)->type().dtype == DType::f32 && isCastBetween(c, false) ? c->result(0) : grad.result(0);
}
// v and its views (recursively), if every one keeps the last dim C, is f16/bf16 and no graph output.
bool viewTree(const Graph& g, const Value* v, int64_t C, std::vector<const Value*>& out) {
  const auto& s = v->type().shape;
  if (s.empty() || s.back() != C || g.isOutput(v) || !isLowFloat(v->type().dtype)) return false;
  out.push_back(v);
  for (const Use& u : v->uses())
    if (isView(u.user) && u.operand == 0 && !viewTree(g, u.user->result(0), C, out)) return false;
  return true;
}
// The product's M, N, K: a MatMul whose B is one matrix (A's batch is rows of one GEMM), or a Gemm without C.
bool gemmDims(const Node& n, int64_t& M, int64_t& N, int64_t& K) {
  if (n.numInputs() < 2 || !n.input(0) || !n.input(1)) return false;
  const auto &as = n.input(0)->type().shape, &bs = n.input(1)->type().shape;
  if (isOnnxOp(&n, "MatMul")) {
    if (as.size() < 2 || bs.size() != 2) return false;
    K = as.back();
    N = bs.back();
    M = K ? n.input(0)->type().numel() / K : 0;
    return true;
  }
  if (!isOnnxOp(&n, "Gemm") || as.size() != 2 || bs.size() != 2 || (n.input(2) && n.input(2)->type().numel() > 0)) return false;
  const bool ta = n.getInt("transA", 0) != 0, tb = n.getInt("transB", 0) != 0;
  M = ta ? as[1] : as[0];
  K = ta ? as[0] : as[1];
  N = tb ? bs[0] : bs[1];
  return true;
}

class PitchLossScoresPass final : public Pass {
 public:
  explicit PitchLossScoresPass(const Target& t) : target_(t) {}
  std::string name() const override { return "pitch-loss-scores"; }
  bool run(Graph& g) override {
    if (!target_.paddedGemm) return false;
    std::set<const Value*> claimed;
    bool changed = false;
    for (const auto& np : g.nodes()) {
      Node& n = *np;
      if (!isLossGrad(n) || n.numInputs() < 3 || !n.input(1) || n.input(1)->type().rank() != 2) continue;
      const int64_t C = n.input(1)->type().shape[1];
      if (C <= 0) continue;
      // The scores: a padded product's result, read by the loss and its gradients (through the Cast or directly).
      const Value* x = scoresOf(g, n);
      while (isView(x->producer())) x = x->producer()->input(0);
      if (!claimed.count(x) && padded(x->producer(), x) &&
          claim(g, x, C, [&](const Node& user, int operand) {
            if (lossReads(user, operand)) return true;
            if (!isCastBetween(&user, true) || user.result(0)->uses().empty()) return false;
            for (const Use& w : user.result(0)->uses())
              if (!lossReads(*w.user, w.operand)) return false;
            return !g.isOutput(user.result(0));
          })) {
        n.setAttr("scores_pitch", pitchOf(x, C));
        claimed.insert(x);
        changed = true;
      }
      // The gradient: read by padded products only, as MatMul's A (the contraction over C), Gemm's A
      // (either way: C is K, or M transposed) or Gemm's B (not transposed: C is N).
      const Value* dx = gradOf(g, n);
      if (misaligned(dx, C) && claim(g, dx, C, [&](const Node& user, int operand) {
            if (!paddedGemm(user)) return false;
            if (isOnnxOp(&user, "MatMul")) return operand == 0;
            return operand == 0 || (operand == 1 && user.getInt("transB", 0) == 0);
          })) {
        n.setAttr("grad_pitch", pitchOf(dx, C));
        changed = true;
      }
    }
    return changed;
  }

 private:
  static int64_t unit(const Value* v) { return 16 / static_cast<int64_t>(dtypeSize(v->type().dtype)); }
  static int64_t pitchOf(const Value* v, int64_t C) { return (C + unit(v) - 1) / unit(v) * unit(v); }
  static bool misaligned(const Value* v, int64_t C) { return (C * static_cast<int64_t>(dtypeSize(v->type().dtype))) % 16 != 0; }
  bool paddedGemm(const Node& n) const {
    int64_t M = 0, N = 0, K = 0;
    if (!gemmDims(n, M, N, K)) return false;
    return target_.paddedGemm(M, N, K, isOnnxOp(&n, "Gemm") && n.getInt("transA", 0) != 0, static_cast<int64_t>(dtypeSize(n.input(0)->type().dtype)));
  }
  bool padded(const Node* producer, const Value* x) const { return producer && paddedGemm(*producer) && misaligned(x, x->type().shape.back()); }
  // Whether the view tree of root (rows a multiple of the 16-byte unit) is read only as usesOk allows.
  template <typename F>
  static bool claim(const Graph& g, const Value* root, int64_t C, F usesOk) {
    std::vector<const Value*> group;
    if (!viewTree(g, root, C, group) || (root->type().numel() / C) % unit(root) != 0) return false;
    for (const Value* m : group)
      for (const Use& u : m->uses())
        if (!(isView(u.user) && u.operand == 0) && !usesOk(*u.user, u.operand)) return false;
    return true;
  }
  const Target& target_;
};

}  // namespace

std::map<const Value*, int64_t> pitchedValues(const Graph& g) {
  std::map<const Value*, int64_t> pitch;
  for (const auto& n : g.nodes()) {
    if (!isLossGrad(*n) || n->numInputs() < 2 || !n->input(1) || n->input(1)->type().rank() != 2) continue;
    const int64_t C = n->input(1)->type().shape[1];
    auto mark = [&](const Value* root, const char* attr) {
      const int64_t p = n->getInt(attr, 0);
      std::vector<const Value*> tree;
      if (p < C || !viewTree(g, root, C, tree)) return;
      for (const Value* v : tree) pitch[v] = p;
    };
    const Value* x = scoresOf(g, *n);
    while (isView(x->producer())) x = x->producer()->input(0);
    mark(x, "scores_pitch");
    mark(gradOf(g, *n), "grad_pitch");
  }
  return pitch;
}

std::unique_ptr<Pass> createPitchLossScoresPass(const Target& target) { return std::make_unique<PitchLossScoresPass>(target); }

}  // namespace ampc
