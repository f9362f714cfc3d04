// fuse-linear: nn.Linear as PyTorch's dynamo exporter writes it, MatMul(X, Transpose(W)) with W a
// [N, K] parameter and an optional Add of a [N] bias, becomes the Gemm the TorchScript exporter
// writes for the same layer (and PyTorch runs, addmm): Gemm(X2, W, b) {transB = 1} on X viewed as
// [M, K] (a Reshape when X has more than two dims), viewed back as [..., N].
//
//   - The weight is read transposed by the GEMM instead of copied transposed every step.
//   - The bias is the GEMM's epilogue (added to the f32 sums, rounded once, as cuBLASLt's addmm
//     rounds it), and its gradient the weight gradient's GEMM sums (runtime/folds.h biasGradGemm).
//   - Both exporters' graphs of one model compile to the same step.
//
// Only a Transpose [1, 0] of a parameter is taken (a layer's weight: tied embeddings too), read by
// MatMuls as the B operand; an Add whose other operand is not a [N] vector (or that reads the
// product elsewhere) leaves the bias as it is.
#include <numeric>
#include <set>
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// W when t is Transpose(W) [1, 0] of a rank-2 parameter.
Value* transposedParam(const Value* t) {
  const Node* n = t ? t->producer() : nullptr;
  if (!isOnnxOp(n, "Transpose") || !n->inputs()[0]) return nullptr;
  Value* w = n->inputs()[0];
  if (w->kind() != ValueKind::Param || w->type().rank() != 2) return nullptr;
  const auto perm = n->getInts("perm", {1, 0});
  return perm == std::vector<int64_t>{1, 0} ? w : nullptr;
}

class FuseLinearPass final : public Pass {
 public:
  std::string name() const override { return "fuse-linear"; }

  bool run(Graph& g) override {
    std::vector<Node*> matmuls;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "MatMul") && n->inputs().size() == 2 && n->inputs()[0] && transposedParam(n->inputs()[1]))
        matmuls.push_back(n.get());
    bool changed = false;
    std::set<Node*> transposes;  // of the rewritten products' weights
    for (Node* m : matmuls) {
      Node* t = m->inputs()[1]->producer();
      if (rewrite(g, m)) {
        changed = true;
        transposes.insert(t);
      }
    }
    // Those that nothing reads any more.
    for (Node* t : transposes)
      if (t->result(0)->uses().empty() && !g.isOutput(t->result(0))) g.eraseNode(t);
    return changed;
  }

 private:
  static bool rewrite(Graph& g, Node* m) {
    Value *x = m->inputs()[0], *w = transposedParam(m->inputs()[1]), *y = m->result(0);
    const auto& xs = x->type().shape;
    const int64_t N = w->type().shape[0], K = w->type().shape[1];
    if (xs.size() < 2 || xs.back() != K || x->type().dtype != w->type().dtype || !isFloat(x->type().dtype)) return false;
    if (y->type().shape.back() != N || y->type().numel() == 0) return false;
    const int64_t M = std::accumulate(xs.begin(), xs.end() - 1, int64_t{1}, std::multiplies<>());
    // A bias: Add(y, b) or Add(b, y), y read only there, b a [N] vector of y's type.
    Node* add = nullptr;
    Value* bias = nullptr;
    if (y->uses().size() == 1 && !g.isOutput(y) && isOnnxOp(y->uses()[0].user, "Add")) {
      Node* a = y->uses()[0].user;
      Value* b = a->inputs()[a->inputs()[0] == y ? 1 : 0];
      if (b && b != y && b->type().dtype == y->type().dtype && b->type().shape == std::vector<int64_t>{N} &&
          a->result(0)->type() == y->type())
        add = a, bias = b;
    }
    Value* out = add ? add->result(0) : y;
    Node* before = add ? add : m;
    const std::string base = (add ? add : m)->name();
    auto shapeConst = [&](const std::vector<int64_t>& s, const std::string& what) {
      return g.addConst(g.uniqueName(out->name() + "/" + what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(s.size())}, s));
    };
    Value* x2 = x;
    if (xs.size() > 2) {
      Node* r = g.createNode("Reshape", "", {x, shapeConst({M, K}, "rows")}, {{g.uniqueName(x->name() + ".rows"), TensorType{x->type().dtype, {M, K}}}},
                             before);
      r->setName(base + "/rows");
      x2 = r->result(0);
    }
    std::vector<Value*> ins{x2, w};
    if (bias) ins.push_back(bias);
    Node* gemm = g.createNode("Gemm", "", ins, {{g.uniqueName(out->name() + ".gemm"), TensorType{y->type().dtype, {M, N}}}}, before);
    gemm->setName(base + "/gemm");
    gemm->setAttr("transB", int64_t{1});
    Value* result = gemm->result(0);
    if (xs.size() > 2) {
      Node* r = g.createNode("Reshape", "", {result, shapeConst(y->type().shape, "shape")}, {{g.uniqueName(out->name() + ".nd"), y->type()}}, before);
      r->setName(base);
      result = r->result(0);
    }
    const std::string keep = out->name();
    out->replaceAllUsesWith(result);
    if (add) g.eraseNode(add);
    g.eraseNode(m);
    g.renameValue(result, keep);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseLinearPass() { return std::make_unique<FuseLinearPass>(); }

}  // namespace ampc
