// fold-transposes: a Transpose of a Transpose becomes one Transpose of the first one's input, or
// nothing where the two permutations undo each other; a Transpose [1, 0] of a Gemm without C (read
// by nothing else) becomes the Gemm with its operands swapped, (op(A) op(B))^T = op(B)^T op(A)^T.
// Autodiff writes MatMul's dA = dY B^T with a Transpose of B and dB as a Gemm, and the dynamo
// exporter writes Linear's B as Transpose(W): the backward then transposes W's transpose back and
// transposes dW^T into dW, two launches and copies per layer and step. Exact: a transpose moves
// elements, and the swapped Gemm sums each element's products in the same order.
#include <string>
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// The perm of a Transpose (default: reversed dims), or empty when the node is not one.
std::vector<int64_t> permOf(const Node& n) {
  if (!n.domain().empty() || n.op() != "Transpose" || n.inputs().size() != 1 || !n.inputs()[0] || n.numResults() != 1) return {};
  const int64_t r = n.inputs()[0]->type().rank();
  std::vector<int64_t> p = n.getInts("perm");
  if (p.empty())
    for (int64_t i = r - 1; i >= 0; --i) p.push_back(i);
  return static_cast<int64_t>(p.size()) == r ? p : std::vector<int64_t>{};
}

// A Gemm without C (or an empty one) whose result only `t`, a Transpose [1, 0], reads.
bool gemmUnderTranspose(const Graph& g, const Node& t) {
  const std::vector<int64_t> p = permOf(t);
  const Node* m = p == std::vector<int64_t>{1, 0} ? t.inputs()[0]->producer() : nullptr;
  if (!m || !m->domain().empty() || m->op() != "Gemm" || m->numResults() != 1 || m->inputs().size() < 2) return false;
  if (m->inputs().size() > 2 && m->inputs()[2] && m->inputs()[2]->type().numel() > 0) return false;
  return m->result(0)->uses().size() == 1 && !g.isOutput(m->result(0)) && !g.isOutput(t.result(0));
}

class FoldTransposesPass final : public Pass {
 public:
  std::string name() const override { return "fold-transposes"; }
  bool run(Graph& g) override {
    std::vector<Node*> gemms;
    for (const auto& n : g.nodes())
      if (!permOf(*n).empty() && gemmUnderTranspose(g, *n)) gemms.push_back(n.get());
    for (Node* t : gemms) {
      Node* m = t->inputs()[0]->producer();
      Value* y = t->result(0);
      Node* swapped = g.copyNode(*m, {m->inputs()[1], m->inputs()[0]}, {{g.uniqueName(y->name() + ".gemm"), y->type()}}, t);
      swapped->setAttr("transA", static_cast<int64_t>(m->getInt("transB", 0) == 0));
      swapped->setAttr("transB", static_cast<int64_t>(m->getInt("transA", 0) == 0));
      const std::string name = y->name();
      y->replaceAllUsesWith(swapped->result(0));
      g.eraseNode(t);
      g.eraseNode(m);
      g.renameValue(swapped->result(0), name);
    }
    std::vector<Node*> outer;
    for (const auto& n : g.nodes()) {
      const Node* inner = n->inputs().empty() || !n->inputs()[0] ? nullptr : n->inputs()[0]->producer();
      if (inner && !permOf(*n).empty() && !permOf(*inner).empty() && !g.isOutput(n->result(0))) outer.push_back(n.get());
    }
    for (Node* t : outer) {
      const Node* inner = t->inputs()[0]->producer();  // again: an earlier fold may have changed it
      if (!inner || permOf(*inner).empty()) continue;
      const std::vector<int64_t> p1 = permOf(*inner), p2 = permOf(*t);
      // y = T(T(x, p1), p2): y's dim i is x's dim p1[p2[i]].
      std::vector<int64_t> q(p2.size());
      bool identity = true;
      for (size_t i = 0; i < q.size(); ++i) {
        q[i] = p1[static_cast<size_t>(p2[i])];
        identity = identity && q[i] == static_cast<int64_t>(i);
      }
      Value* x = inner->inputs()[0];
      Value* y = t->result(0);
      if (identity) {
        y->replaceAllUsesWith(x);
      } else {
        Node* t2 = g.copyNode(*t, {x}, {{g.uniqueName(y->name() + ".folded"), y->type()}}, t);
        t2->setAttr("perm", q);
        const std::string name = y->name();
        y->replaceAllUsesWith(t2->result(0));
        g.eraseNode(t);
        g.renameValue(t2->result(0), name);
        continue;
      }
      g.eraseNode(t);
    }
    if (!outer.empty()) createDcePass()->run(g);  // the inner Transposes nothing reads any more
    return !outer.empty() || !gemms.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFoldTransposesPass() { return std::make_unique<FoldTransposesPass>(); }

}  // namespace ampc
