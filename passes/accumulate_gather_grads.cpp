// accumulate-gather-grads: the gradient of a weight that is both gathered and read otherwise (a tied
// embedding: GPT-2's token embedding is also its output projection) is written by autodiff as
// Add(GatherGrad(dY, idx), X). The scatter-add then starts from X instead of from zeros:
// GatherGrad(dY, idx, X). A widening Cast in front of X (the other path's f16/bf16 gradient) is read
// through: GatherGrad widens its base. On the CUDA backend that removes a pass that zeroes the
// weight-sized buffer, the Add's pass (two reads and a write of the weight's f32 bytes) and the
// Cast's. Exact up to the order of the f32 sums: X + (sum of rows) becomes (X + row) + row ...
#include <string>
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// The GatherGrad operand of Add `a` that can take the other operand as its base (its index, 0 or 1),
// or -1.
int gatherGradOperand(const Graph& g, const Node& a) {
  if (!isOnnxOp(&a, "Add") || a.inputs().size() != 2 || a.numResults() != 1) return -1;
  for (int k = 0; k < 2; ++k) {
    const Value* v = a.inputs()[k];
    const Value* other = a.inputs()[1 - k];
    const Node* p = v ? v->producer() : nullptr;
    if (!p || p->domain() != "ampc" || p->op() != "GatherGrad" || p->inputs().size() != 2 || !singleUse(g, v))
      continue;
    if (!other || other == v || other->type() != v->type() || a.result(0)->type() != v->type() || !isFloat(v->type().dtype)) continue;
    return k;
  }
  return -1;
}

class AccumulateGatherGradsPass final : public Pass {
 public:
  std::string name() const override { return "accumulate-gather-grads"; }
  bool run(Graph& g) override {
    std::vector<Node*> adds;
    for (const auto& n : g.nodes())
      if (gatherGradOperand(g, *n) >= 0) adds.push_back(n.get());
    for (Node* a : adds) {
      const int k = gatherGradOperand(g, *a);
      Node* gg = a->inputs()[k]->producer();
      Value* base = a->inputs()[1 - k];
      Node* cast = base->producer();
      const bool readThrough = isOnnxOp(cast, "Cast") && cast->inputs().size() == 1 && cast->inputs()[0] &&
                               isFloat(cast->inputs()[0]->type().dtype) &&
                               dtypeSize(cast->inputs()[0]->type().dtype) < dtypeSize(base->type().dtype) && singleUse(g, base);
      if (readThrough) base = cast->inputs()[0];
      // Placed at the Add, after both operands are made.
      Node* acc = g.copyNode(*gg, {gg->inputs()[0], gg->inputs()[1], base},
                             {{g.uniqueName(a->result(0)->name() + ".acc"), a->result(0)->type()}}, a);
      const std::string name = a->result(0)->name();  // the gradient keeps its name
      a->result(0)->replaceAllUsesWith(acc->result(0));
      g.eraseNode(a);
      g.renameValue(acc->result(0), name);
      g.eraseNode(gg);
      if (readThrough) g.eraseNode(cast);
    }
    return !adds.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createAccumulateGatherGradsPass() { return std::make_unique<AccumulateGatherGradsPass>(); }

}  // namespace ampc
