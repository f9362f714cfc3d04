#include "passes/data_parallel.h"

#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "passes/train_step.h"

namespace ampc {
namespace {

class DataParallelPass : public Pass {
 public:
  std::string name() const override { return "data-parallel"; }

  bool run(Graph& g) override {
    Node* unscale = nullptr;
    for (const auto& n : g.nodes()) {
      if (n->domain() != kGradDomain) continue;
      if (n->op() == "AllReduce") throw Error("data-parallel: the graph already averages across replicas (" + n->describe() + ")");
      if (n->op() == "UnscaleCheck") {
        if (unscale) throw Error("data-parallel: the graph has two UnscaleCheck nodes; want one train step");
        unscale = n.get();
      }
    }
    if (!unscale || g.outputs().empty()) throw Error("data-parallel: not a train-step graph (no UnscaleCheck)");

    // What each replica computes from its own batch: the loss, the gradients, and the running
    // statistics (state results of ops with state operands) that a graph output writes back.
    std::vector<std::pair<Node*, size_t>> readers;  // (node, operand) to point at the average
    std::vector<Value*> values;
    values.push_back(g.outputs()[0]);
    for (size_t i = 1; i < unscale->numInputs(); ++i) {
      values.push_back(unscale->input(i));
      readers.emplace_back(unscale, i);
    }
    for (const auto& n : g.nodes()) {
      const OpDef* d = n->def();
      if (!d || !d->stateOperands) continue;
      for (size_t r = 1; r < n->numResults(); ++r)
        for (const Use& u : n->result(r)->uses())
          if (u.user->op() == "Identity" && u.user->domain().empty() && g.isOutput(u.user->result(0))) {
            values.push_back(n->result(r));
            readers.emplace_back(u.user, static_cast<size_t>(u.operand));
          }
    }
    std::vector<std::pair<std::string, TensorType>> results;
    for (Value* v : values) results.emplace_back(g.uniqueName(v->name() + ".mean"), v->type());
    Node* ar = g.createNode("AllReduce", kGradDomain, values, results, unscale);
    ar->setName("ampc/allreduce");
    ar->setAttr("reduction", std::string("mean"));
    g.setOutput(0, ar->result(0));
    for (size_t k = 0; k < readers.size(); ++k) readers[k].first->setInput(readers[k].second, ar->result(k + 1));
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createDataParallelPass() { return std::make_unique<DataParallelPass>(); }

}  // namespace ampc
