// fold-transposes: a Transpose of a Transpose becomes one Transpose of the first one's input, or
// nothing where the two permutations undo each other. Autodiff writes MatMul's dA = dY B^T with a
// Transpose of B, and the dynamo exporter writes Linear's B as Transpose(W): the backward then
// transposes W's transpose back, a launch and a copy of W per layer and step for the value W
// itself. Exact: a transpose moves elements, so the folded graph computes the same bits.
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

class FoldTransposesPass final : public Pass {
 public:
  std::string name() const override { return "fold-transposes"; }
  bool run(Graph& g) override {
    std::vector<Node*> outer;
    for (const auto& n : g.nodes()) {
      const Node* inner = n->inputs().empty() || !n->inputs()[0] ? nullptr : n->inputs()[0]->producer();
      if (inner && !permOf(*n).empty() && !permOf(*inner).empty() && !g.isOutput(n->result(0))) outer.push_back(n.get());
    }
    for (Node* t : outer) {
      const Node* inner = t->inputs()[0]->producer();
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
        y->replaceAllUsesWith(t2->result(0));
      }
      g.eraseNode(t);
    }
    if (!outer.empty()) createDcePass()->run(g);  // the inner Transposes nothing reads any more
    return !outer.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFoldTransposesPass() { return std::make_unique<FoldTransposesPass>(); }

}  // namespace ampc
