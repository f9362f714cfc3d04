// fuse-bias-grad (the CUDA target's lowering, runtime/lower.cpp): a bias gradient summed by its
// weight gradient's GEMM, as an explicit target node.
//
// ReduceSum(dY, axes = [0]) of a 2-d float dY [R, N] into N sums of dY's type (keepdims either way),
// the only ReduceSum of dY, and an earlier Gemm {transA = 1, transB = 0, alpha = 1, no C} of dY's
// type that reads dY as one operand and something else as the other: X^T dY (weights stored
// [in, out], GPT-2's Conv1D) or dY^T X (stored [out, in], torch.nn.Linear). The product must not
// run on padded copies (cuda::gemmRunsPadded: the epilogue reads the operand as stored). Both
// become one cuda::Gemm(A, B) {transA = 1, bias_grad = k, keepdims} at the Gemm's place: result 0
// is the product, result 1 the ReduceSum's sums of operand k over its rows. On CUDA cuBLASLt's
// BGRADA/BGRADB epilogue writes them (or a column reduction right after the product, where the
// epilogue does not take the shape); the CPU reference computes the product and the sums as the two
// nodes did, in the same order (kernels/cpu/k_linear.cpp), so the fused graph is bitwise the unfused
// one there.
#include <map>
#include <set>
#include <vector>

#include "kernels/cuda/limits.h"
#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {


// The Gemm that can sum ReduceSum r's operand, or null (see the file comment).
Node* summingGemm(const Node& r, const std::map<const Node*, size_t>& order) {
  if (!isOnnxOp(&r, "ReduceSum") || r.inputs().empty() || !r.input(0)) return nullptr;
  Value* dy = r.input(0);
  const auto& s = dy->type().shape;
  const DType t = dy->type().dtype;
  if (s.size() != 2 || (t != DType::f32 && !isLowFloat(t))) return nullptr;
  if (r.result(0)->type().dtype != t || r.result(0)->type().numel() != s[1]) return nullptr;
  std::vector<int64_t> axes = r.getInts("axes");  // opset < 13; an input from 13
  if (r.numInputs() > 1 && r.input(1)) {
    const Tensor* a = r.input(1)->constData();
    if (!a) return nullptr;
    axes = a->toInts();
  }
  if (axes.size() != 1 || (axes[0] != 0 && axes[0] != -2)) return nullptr;
  int reductions = 0;
  for (const Use& u : dy->uses()) reductions += isOnnxOp(u.user, "ReduceSum");
  if (reductions != 1) return nullptr;
  for (const Use& u : dy->uses()) {
    Node* m = u.user;
    if (!isOnnxOp(m, "Gemm") || u.operand > 1 || m->input(0) == m->input(1)) continue;
    const Value* other = m->input(1 - u.operand);
    if (m->getInt("transA", 0) == 0 || m->getInt("transB", 0) != 0 || m->getFloat("alpha", 1.0f) != 1.0f) continue;
    if (m->numInputs() > 2 && m->input(2) && m->input(2)->type().numel() > 0) continue;
    if (other->type().rank() != 2 || other->type().dtype != t || m->result(0)->type().dtype != t) continue;
    const auto& as = m->input(0)->type().shape;
    const int64_t M = as[1], K = as[0], N = m->input(1)->type().shape[1];
    if (cuda::gemmRunsPadded(M, N, K, /*transA=*/true, static_cast<int64_t>(dtypeSize(t)))) continue;
    if (order.at(m) < order.at(&r)) return m;
  }
  return nullptr;
}

class FuseBiasGradPass final : public Pass {
 public:
  std::string name() const override { return "fuse-bias-grad"; }
  bool run(Graph& g) override {
    std::map<const Node*, size_t> order;
    for (const auto& n : g.nodes()) order.emplace(n.get(), order.size());
    std::vector<std::pair<Node*, Node*>> found;  // (ReduceSum, Gemm)
    std::set<const Node*> taken;                 // a Gemm sums one operand (dY1^T dY2 could match twice)
    for (const auto& n : g.nodes())
      if (Node* m = summingGemm(*n, order); m && taken.insert(m).second) found.emplace_back(n.get(), m);
    for (const auto& [r, m] : found) {
      const int64_t k = m->input(0) == r->input(0) ? 0 : 1, keepdims = r->result(0)->type().rank() == 2 ? 1 : 0;
      Node* f = replaceByTargetNode(g, "Gemm", *m, {m->input(0), m->input(1)}, {m->result(0), r->result(0)}, {r, m});
      f->setAttr("bias_grad", k);
      f->setAttr("keepdims", keepdims);
    }
    if (!found.empty()) g.bindOps();
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseBiasGradPass() { return std::make_unique<FuseBiasGradPass>(); }

}  // namespace ampc
