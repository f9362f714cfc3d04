// dce: removes nodes none of whose results reach a graph output, and constants nothing uses.
// Params stay: they are model state even when a graph does not read them.
#include <algorithm>

#include "passes/pass.h"

namespace ampc {
namespace {

class DcePass : public Pass {
 public:
  std::string name() const override { return "dce"; }
  bool run(Graph& g) override {
    bool changed = false;
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      bool live = false;
      for (size_t i = 0; i < n->numResults(); ++i) live |= !n->result(i)->uses().empty() || g.isOutput(n->result(i));
      if (!live) {
        g.eraseNode(n);
        changed = true;
      }
    }
    std::vector<Value*> consts = g.consts();
    for (Value* c : consts)
      if (c->uses().empty() && !g.isOutput(c)) {
        g.eraseGraphValue(c);
        changed = true;
      }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createDcePass() { return std::make_unique<DcePass>(); }

}  // namespace ampc
