// sink-casts: a widening Cast (f16/bf16 -> f32) read only by a Transpose moves below it, so the
// Transpose moves the narrow bytes and the f32 side is made where it is read, where a backend can
// read through it (the CUDA backend's norms, losses and elementwise ops read the narrow source and
// never write the f32 copy). Autocast puts the Cast first when the Transpose follows its f32 reader
// (a layer norm after a permute, as ConvNeXt writes it). Exact: both orders give the same bits.
#include <string>
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class SinkCastsPass final : public Pass {
 public:
  std::string name() const override { return "sink-casts"; }
  bool run(Graph& g) override {
    std::vector<Node*> transposes;
    for (const auto& n : g.nodes())
      if (n->domain().empty() && n->op() == "Transpose" && n->numResults() == 1 && n->inputs().size() == 1 && n->inputs()[0]) {
        const Node* c = n->inputs()[0]->producer();
        if (c && c->domain().empty() && c->op() == "Cast" && c->inputs()[0] && isLowFloat(c->inputs()[0]->type().dtype) &&
            c->result(0)->type().dtype == DType::f32 && c->result(0)->uses().size() == 1 && !g.isOutput(c->result(0)))
          transposes.push_back(n.get());
      }
    for (Node* t : transposes) {
      Node* c = t->inputs()[0]->producer();
      Value* src = c->inputs()[0];
      Value* y = t->result(0);
      TensorType low = y->type();
      low.dtype = src->type().dtype;
      Node* t2 = g.copyNode(*t, {src}, {{g.uniqueName(y->name() + "." + std::string(dtypeName(low.dtype))), low}}, t);
      Node* c2 = g.copyNode(*c, {t2->result(0)}, {{g.uniqueName(y->name() + ".f32"), y->type()}}, t);
      y->replaceAllUsesWith(c2->result(0));
      g.eraseNode(t);
      g.eraseNode(c);
    }
    return !transposes.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createSinkCastsPass() { return std::make_unique<SinkCastsPass>(); }

}  // namespace ampc
