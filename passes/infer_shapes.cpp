// infer-shapes: sets every node's result types from the op registry, in topological order.
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class InferShapesPass : public Pass {
 public:
  std::string name() const override { return "infer-shapes"; }
  bool run(Graph& g) override {
    bool changed = false;
    for (const auto& n : g.nodes()) {
      if (!n->def()) continue;  // a custom op keeps the types its model declared
      auto types = inferTypes(*n);
      for (size_t i = 0; i < n->numResults(); ++i) {
        if (n->result(i)->type() != types[i]) {
          n->result(i)->setType(types[i]);
          changed = true;
        }
      }
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createInferShapesPass() { return std::make_unique<InferShapesPass>(); }

}  // namespace ampc
