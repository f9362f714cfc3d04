#include "passes/data_parallel.h"

#include <algorithm>
#include <map>

#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "passes/train_step.h"

namespace ampc {
namespace {

class DataParallelPass : public Pass {
 public:
  explicit DataParallelPass(int64_t bucketBytes) : bucketBytes_(bucketBytes) {}
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
    // Buckets: the values in the order the backward makes them, cut where a bucket's f32 bytes
    // reach bucketBytes_, each bucket's AllReduce right after its last value's producer, so that a
    // backend can average a bucket while the backward goes on (CUDA: on a stream of its own).
    std::map<const Node*, size_t> position;
    size_t k = 0;
    for (const auto& n : g.nodes()) position[n.get()] = k++;
    auto ready = [&](const Value* v) { return v->producer() ? position.at(v->producer()) : size_t{0}; };
    std::vector<size_t> order(values.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (bucketBytes_ > 0) std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ready(values[a]) < ready(values[b]); });
    std::vector<std::vector<size_t>> buckets(1);
    int64_t bytes = 0;
    for (size_t i : order) {
      if (bucketBytes_ > 0 && bytes >= bucketBytes_) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().push_back(i);
      bytes += values[i]->type().numel() * 4;
    }
    std::vector<Value*> averaged(values.size());
    for (size_t b = 0; b < buckets.size(); ++b) {
      std::vector<Value*> ins;
      std::vector<std::pair<std::string, TensorType>> results;
      size_t last = 0;
      for (size_t i : buckets[b]) {
        ins.push_back(values[i]);
        results.emplace_back(g.uniqueName(values[i]->name() + ".mean"), values[i]->type());
        last = std::max(last, ready(values[i]));
      }
      // Before the node after the last producer (UnscaleCheck at the latest).
      Node* before = unscale;
      if (buckets.size() > 1)
        for (const auto& n : g.nodes())
          if (auto it = position.find(n.get()); it != position.end() && it->second > last) {  // not the AllReduces made here
            before = it->second < position.at(unscale) ? n.get() : unscale;
            break;
          }
      Node* ar = g.createNode("AllReduce", kGradDomain, ins, results, before);
      ar->setName(buckets.size() == 1 ? "ampc/allreduce" : "ampc/allreduce/bucket" + std::to_string(b));
      ar->setAttr("reduction", std::string("mean"));
      for (size_t j = 0; j < buckets[b].size(); ++j) averaged[buckets[b][j]] = ar->result(j);
    }
    g.setOutput(0, averaged[0]);
    for (size_t i = 0; i < readers.size(); ++i) readers[i].first->setInput(readers[i].second, averaged[i + 1]);
    g.sortNodes();  // a state's write-back Identity may stand before the AllReduce it now reads
    return true;
  }

 private:
  int64_t bucketBytes_;
};

}  // namespace

std::unique_ptr<Pass> createDataParallelPass(int64_t bucketBytes) { return std::make_unique<DataParallelPass>(bucketBytes); }

}  // namespace ampc
