// dense-experts: a product with one gathered matrix per row, MatMul(GatherND(W [E, N, K], I [M, 1]),
// B [M, K, 1]) -> [M, N, 1], as transformers' batched_mm experts backend exports a mixture of
// experts (each token's expert matrix gathered, then one batched matrix-vector product), becomes
// every expert's product at once and a pick: Z = B' W'^T ([M, K] x [E N, K]^T: one GEMM, [M, E, N]),
// then row m's expert I[m] (GatherElements on axis 1), [M, N, 1]. The same sums (each output element
// is row m's dot product with the same row of W[I[m]]); the gathered copy, M N K elements and as many
// again for its gradient, becomes M E N, at E times the products' arithmetic. Only where that holds
// less (E < K), and the gathered copy has no other reader. Identity Transposes (the dynamo exporter
// writes perm [0, 1, 2] around both) are looked through. Negative indices pick as GatherND picks
// (both count from the end).
#include <numeric>
#include <vector>

#include "passes/pass.h"

namespace ampc {
namespace {

bool identityTranspose(const Node* n) {
  if (!isOnnxOp(n, "Transpose") || n->numInputs() != 1) return false;
  const auto perm = n->getInts("perm");
  std::vector<int64_t> iota(perm.size());
  std::iota(iota.begin(), iota.end(), 0);
  return !perm.empty() && perm == iota;
}
// v, or the operand of the identity Transposes that make it.
Value* throughIdentities(Value* v) {
  while (v && v->producer() && identityTranspose(v->producer())) v = v->producer()->input(0);
  return v;
}

class DenseExpertsPass final : public Pass {
 public:
  std::string name() const override { return "dense-experts"; }
  bool run(Graph& g) override {
    std::vector<Node*> found;
    for (const auto& up : g.nodes())
      if (matches(g, up.get())) found.push_back(up.get());
    for (Node* n : found) rewrite(g, n);
    return !found.empty();
  }

 private:
  // The gathered operand's chain from the MatMul back to its GatherND, each link read by the next only.
  static std::vector<Node*> chain(const Graph& g, Node* mm) {
    std::vector<Node*> links;
    Value* v = mm->input(0);
    while (v && v->producer() && identityTranspose(v->producer())) {
      if (!singleUse(g, v)) return {};
      links.push_back(v->producer());
      v = v->producer()->input(0);
    }
    if (!v || !isOnnxOp(v->producer(), "GatherND") || !singleUse(g, v)) return {};
    links.push_back(v->producer());
    return links;
  }
  static bool matches(const Graph& g, Node* mm) {
    if (!isOnnxOp(mm, "MatMul") || mm->numInputs() != 2) return false;
    const auto links = chain(g, mm);
    if (links.empty()) return false;
    const Node* gather = links.back();
    if (gather->numInputs() != 2 || gather->getInt("batch_dims", 0) != 0) return false;
    const Value* w = throughIdentities(gather->input(0));
    const TensorType wt = w->type(), it = gather->input(1)->type(), bt = mm->input(1)->type();
    if (wt.rank() != 3 || it.rank() != 2 || it.shape[1] != 1 || bt.rank() != 3 || !isFloat(wt.dtype) || bt.dtype != wt.dtype) return false;
    const int64_t e = wt.shape[0], n = wt.shape[1], k = wt.shape[2], m = it.shape[0];
    return bt.shape == std::vector<int64_t>{m, k, 1} && mm->result(0)->type().shape == std::vector<int64_t>{m, n, 1} && e < k;
  }
  static void rewrite(Graph& g, Node* mm) {
    const auto links = chain(g, mm);
    Node* gather = links.back();
    Value* w = throughIdentities(gather->input(0));
    Value* idx = gather->input(1);
    Value* b = mm->input(1);
    const TensorType wt = w->type();
    const DType ft = wt.dtype;
    const int64_t e = wt.shape[0], n = wt.shape[1], k = wt.shape[2], m = idx->type().shape[0];
    Value* rows = emitBefore(g, mm, "Reshape", {b, i64Const(g, mm, "rows", {m, k})}, TensorType{ft, {m, k}});
    Value* flat = emitBefore(g, mm, "Reshape", {w, i64Const(g, mm, "experts", {e * n, k})}, TensorType{ft, {e * n, k}});
    Value* all = emitBefore(g, mm, "Gemm", {rows, flat}, TensorType{ft, {m, e * n}}, {{"transB", int64_t{1}}});
    Value* each = emitBefore(g, mm, "Reshape", {all, i64Const(g, mm, "each", {m, e, n})}, TensorType{ft, {m, e, n}});
    Value* i64 = idx->type().dtype == DType::i64 ? idx : emitBefore(g, mm, "Cast", {idx}, TensorType{DType::i64, {m, 1}}, {{"to", int64_t{7}}});
    Value* col = emitBefore(g, mm, "Reshape", {i64, i64Const(g, mm, "col", {m, 1, 1})}, TensorType{DType::i64, {m, 1, 1}});
    Value* pick = emitBefore(g, mm, "Expand", {col, i64Const(g, mm, "pick", {m, 1, n})}, TensorType{DType::i64, {m, 1, n}});
    Value* got = emitBefore(g, mm, "GatherElements", {each, pick}, TensorType{ft, {m, 1, n}}, {{"axis", int64_t{1}}});
    Value* out = emitBefore(g, mm, "Reshape", {got, i64Const(g, mm, "out", {m, n, 1})}, mm->result(0)->type());
    const std::string name = mm->result(0)->name();
    Value* wIn = gather->input(0);
    mm->result(0)->replaceAllUsesWith(out);
    g.eraseNode(mm);
    for (Node* l : links) g.eraseNode(l);  // each was read by the one before only
    // The identity Transposes that made W's operand, now read by nothing.
    while (wIn != w && wIn->uses().empty() && !g.isOutput(wIn)) {
      Node* t = wIn->producer();
      wIn = t->input(0);
      g.eraseNode(t);
    }
    g.renameValue(out, name);
  }
};

}  // namespace

std::unique_ptr<Pass> createDenseExpertsPass() { return std::make_unique<DenseExpertsPass>(); }

}  // namespace ampc
