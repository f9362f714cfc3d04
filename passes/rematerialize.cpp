// rematerialize: a pointwise result that the step reads again much later (a backward op reading a
// forward activation: the next layer's weight gradient reading a GELU's or SiLU's output) is
// computed a second time just before those late reads, from operands that are live there anyway,
// instead of being held across everything in between. torch.compile's partitioner makes the same
// trade: one more memory-bound pass for one activation fewer at the peak.
//
// A node qualifies when it has a pointwise formula and one result, the target's folds do not claim
// it (`excluded`), some reader (seen through Identity nodes) comes more than kWindow nodes after it,
// and it reads a full-size activation (not only parameters: their casts stay computed once), every
// full-size one read at or after the first late reader anyway (so recomputing keeps nothing alive
// longer). Operands smaller than the result (broadcast scales and biases) are small and always
// allowed. The copy goes before the first late reader and takes every late read; the early reads
// keep the original.
#include <algorithm>
#include <functional>
#include <unordered_map>
#include <vector>

#include "compiler/ops/pointwise.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

constexpr size_t kWindow = 16;  // reads within this many nodes are early (fuse_elementwise's join window)

class RematerializePass final : public Pass {
 public:
  explicit RematerializePass(std::function<bool(const Node&)> excluded) : excluded_(std::move(excluded)) {}
  std::string name() const override { return "rematerialize"; }

  bool run(Graph& g) override {
    std::vector<Node*> order;
    std::unordered_map<const Node*, size_t> index;
    for (const auto& n : g.nodes()) {
      index.emplace(n.get(), order.size());
      order.push_back(n.get());
    }
    const size_t end = order.size();
    // The last read of each value (a graph output: after the step).
    auto lastRead = [&](const Value* v) {
      if (g.isOutput(v)) return end;
      size_t last = 0;
      for (const Use& u : v->uses()) {
        last = std::max(last, index.at(u.user));
      }
      return last;
    };
    bool changed = false;
    for (Node* p : order) {
      if (!pointwiseFormula(*p) || p->numResults() != 1 || (excluded_ && excluded_(*p))) continue;
      Value* r = p->result(0);
      if (g.isOutput(r) || r->type().numel() <= 1) continue;
      const size_t at = index.at(p);
      // Its reads, through Identity nodes (a model's clone()), and the late ones among them.
      std::vector<Use> late;
      size_t firstLate = end;
      std::function<void(const Value*)> reads = [&](const Value* v) {
        for (const Use& u : v->uses()) {
          if (u.user->domain().empty() && u.user->op() == "Identity" && !g.isOutput(u.user->result(0))) {
            reads(u.user->result(0));
            continue;
          }
          const size_t k = index.at(u.user);
          if (k <= at + kWindow) continue;
          late.push_back(u);
          firstLate = std::min(firstLate, k);
        }
      };
      reads(r);
      if (late.empty()) continue;
      // An activation among the operands (a parameter's cast stays computed once), and every
      // full-size one read at or after the first late read anyway.
      bool activation = false, live = true;
      for (const Value* in : p->inputs()) {
        if (!in || in->kind() != ValueKind::Result || in->type().numel() < r->type().numel()) continue;
        activation = true;
        if (lastRead(in) < firstLate) live = false;
      }
      if (!activation || !live) continue;
      Node* copy = g.copyNode(*p, p->inputs(), {{g.uniqueName(r->name() + ".remat"), r->type()}}, order[firstLate]);
      copy->setName(p->name() + "/remat");
      index.emplace(copy, firstLate);  // it runs just before that reader
      for (const Use& u : late) u.user->setInput(static_cast<size_t>(u.operand), copy->result(0));
      changed = true;
    }
    return changed;
  }

 private:
  std::function<bool(const Node&)> excluded_;
};

}  // namespace

std::unique_ptr<Pass> createRematerializePass(std::function<bool(const Node&)> excluded) {
  return std::make_unique<RematerializePass>(std::move(excluded));
}

}  // namespace ampc
