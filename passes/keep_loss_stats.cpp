// keep-loss-stats (the CUDA target's lowering, runtime/lower.cpp): the softmax cross-entropy loss
// keeps each row's statistics for its gradient, as an explicit value.
//
// SoftmaxCrossEntropyLoss(scores [rows, C], labels[, weights]) without log-probs, and the
// ampc::SoftmaxCrossEntropyLossGrad nodes after it that read the same scores (the same value, or
// widening Casts of one source: the statistics of widened values are the same): the loss becomes
// cuda::SoftmaxCrossEntropyLoss, whose result 1 is f32 [rows, 2] (each row's max and the sum of
// exp(x - max)), and each gradient cuda::SoftmaxCrossEntropyLossGrad(dL, scores, labels, stats[,
// weights]), which reads them instead of a second pass over the scores (GPT-2's [8192, 50257]
// logits). The CPU reference computes the loss and the gradient as before; the statistics are
// the loss kernel's own (kernels/cpu/k_target.cpp).
#include <map>
#include <set>
#include <vector>

#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

// The scores before a widening Cast (f16/bf16 -> f32), or v.
const Value* source(const Value* v) {
  const Node* c = v ? v->producer() : nullptr;
  if (isOnnxOp(c, "Cast") && c->input(0) && isLowFloat(c->input(0)->type().dtype) && v->type().dtype == DType::f32) return c->input(0);
  return v;
}

bool isGrad(const Node& n) { return n.domain() == "ampc" && n.op() == "SoftmaxCrossEntropyLossGrad"; }

class KeepLossStatsPass final : public Pass {
 public:
  std::string name() const override { return "keep-loss-stats"; }
  bool run(Graph& g) override {
    std::map<const Node*, size_t> order;
    for (const auto& n : g.nodes()) order.emplace(n.get(), order.size());
    std::vector<std::pair<Node*, std::vector<Node*>>> found;
    std::set<const Node*> taken;  // a gradient reads one loss's statistics
    for (const auto& n : g.nodes()) {
      if (!isOnnxOp(n.get(), "SoftmaxCrossEntropyLoss") || n->numResults() != 1) continue;
      const Value* x = n->input(0);
      if (x->type().rank() != 2 || !isFloat(x->type().dtype) || x->type().dtype == DType::f64) continue;
      std::vector<Node*> grads;
      for (const auto& m : g.nodes())
        if (isGrad(*m) && m->input(1) && source(m->input(1)) == source(x) && order.at(m.get()) > order.at(n.get()) && taken.insert(m.get()).second)
          grads.push_back(m.get());
      if (!grads.empty()) found.emplace_back(n.get(), grads);
    }
    for (auto& [loss, grads] : found) {
      const int64_t rows = loss->input(0)->type().shape[0];
      Node* l = replaceByTargetNode(g, "SoftmaxCrossEntropyLoss", *loss, std::vector<Value*>(loss->inputs().begin(), loss->inputs().end()),
                                    {loss->result(0)}, {loss}, {{loss->result(0)->name() + ".row_stats", TensorType{DType::f32, {rows, 2}}}});
      for (Node* m : grads) {
        std::vector<Value*> ins = {m->input(0), m->input(1), m->input(2), l->result(1)};
        if (m->input(3)) ins.push_back(m->input(3));
        replaceByTargetNode(g, "SoftmaxCrossEntropyLossGrad", *m, ins, {m->result(0)}, {m});
      }
    }
    if (!found.empty()) g.bindOps();
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createKeepLossStatsPass() { return std::make_unique<KeepLossStatsPass>(); }

}  // namespace ampc
