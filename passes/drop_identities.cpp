// drop-identities: an Identity whose result is not a graph output goes, its readers reading its
// operand. Exporters write Identity for `clone`, a one-operand `cat` and a tuple's getitem
// (the dynamo exporter, around Hugging Face attention's heads). An Identity launches a copy or
// stands between two nodes that a fold matches as a pair (a Transpose of a Transpose, a head
// Transpose read in place by attention), so the lowering drops them first. Exact: Identity is
// its operand.
#include "passes/pass.h"

namespace ampc {
namespace {

class DropIdentitiesPass final : public Pass {
 public:
  std::string name() const override { return "drop-identities"; }
  bool run(Graph& g) override {
    std::vector<Node*> ids;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "Identity") && n->inputs().size() == 1 && n->inputs()[0] && n->numResults() == 1 &&
          !g.isOutput(n->result(0)) && n->inputs()[0]->type() == n->result(0)->type())
        ids.push_back(n.get());
    for (Node* n : ids) {
      n->result(0)->replaceAllUsesWith(n->inputs()[0]);
      g.eraseNode(n);
    }
    return !ids.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createDropIdentitiesPass() { return std::make_unique<DropIdentitiesPass>(); }

}  // namespace ampc
