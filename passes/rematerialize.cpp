// rematerialize: a result that the step reads again much later (a backward op reading a forward
// activation: the next layer's weight gradient reading a GELU's or SiLU's output, a SiLU's gradient
// reading the batch norm's output under it) is computed a second time just before those late reads,
// from operands that are live there anyway, instead of being held across everything in between.
// torch.compile's partitioner makes the same trade: one more memory-bound pass for one activation
// fewer at the peak.
//
// A node qualifies when it is recomputable (a pointwise formula with one result, or a
// BatchNormalization, whose y is recomputed from its X: the same batch statistics, the running
// statistics left alone), the target's folds do not claim it (`excluded`), some reader of its
// (first) result (seen through Identity nodes and views) comes more than kWindow nodes after it,
// and it reads a full-size activation (not only parameters: their casts stay computed once, but
// see `paramCasts`), every full-size one read at or after the first late reader anyway (so
// recomputing keeps nothing alive longer).
// Operands smaller than the result (broadcast scales and biases, a norm's parameters) are small and
// always allowed. With `paramCasts`, a parameter's low-precision cast qualifies too (the parameter is
// held all step): the backward recasts the weights it reads instead of holding their copies from
// the forward, at the cost of one more read of the weights. The copy goes before the first late
// reader and takes every late read (a read through views reads the same views of the copy); the
// early reads keep the original.
//
// Nodes are visited last to first, so chains recompute: a SiLU's late copy reads the batch norm's
// output late, which then makes that batch norm's output a late read too, recomputed from the
// convolution's output that the batch norm's gradient holds anyway.
#include <algorithm>
#include <functional>
#include <unordered_map>
#include <vector>

#include "compiler/ops/pointwise.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

constexpr double kWindow = 16;  // reads within this many nodes are early (fuse_elementwise's join window)

bool recomputable(const Node& n) {
  if (isOnnxOp(&n, "BatchNormalization")) return true;
  return pointwiseFormula(n) && n.numResults() == 1;
}

// A low-precision copy of a parameter (autocast's weight casts): recomputed from the parameter,
// which every step holds anyway, as torch.compile's partitioner recomputes it.
bool paramCast(const Node& n) {
  if (!isOnnxOp(&n, "Cast") || n.numResults() != 1 || !n.inputs()[0]) return false;
  const Value* in = n.inputs()[0];
  return in->kind() == ValueKind::Param && dtypeSize(n.result(0)->type().dtype) < dtypeSize(in->type().dtype);
}

class RematerializePass final : public Pass {
 public:
  RematerializePass(std::function<bool(const Node&)> excluded, bool paramCasts) : excluded_(std::move(excluded)), paramCasts_(paramCasts) {}
  std::string name() const override { return "rematerialize"; }

  bool run(Graph& g) override {
    // Positions: the nodes' order; a copy sits just below its first reader (a copy made later, in
    // front of an earlier copy, lower still). Copies are the only nodes added.
    std::vector<Node*> order;
    std::unordered_map<const Node*, double> pos;
    for (const auto& n : g.nodes()) {
      pos.emplace(n.get(), static_cast<double>(order.size()));
      order.push_back(n.get());
    }
    const double end = static_cast<double>(order.size());
    double below = 0;
    // The last read of each value (a graph output: after the step).
    auto lastRead = [&](const Value* v) {
      if (g.isOutput(v)) return end;
      double last = 0;
      for (const Use& u : v->uses()) last = std::max(last, pos.at(u.user));
      return last;
    };
    bool changed = false;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* p = *it;
      if (!recomputable(*p) || (excluded_ && excluded_(*p))) continue;
      Value* r = p->result(0);
      if (g.isOutput(r) || r->type().numel() <= 1) continue;
      // A parameter cast stands wherever autocast put it (often all at the step's start): its
      // reads count from its first reader.
      const bool recast = paramCasts_ && paramCast(*p);
      double at = pos.at(p);
      if (recast) {
        at = end;
        for (const Use& u : r->uses()) at = std::min(at, pos.at(u.user));
      }
      // Its reads, through Identity nodes (a model's clone()) and views (a Reshape to a GEMM's
      // rows), and the late ones among them with the views they read through.
      struct Late {
        Use use;
        std::vector<const Node*> views;
      };
      std::vector<Late> late;
      const Node* first = nullptr;
      std::vector<const Node*> chain;
      std::function<void(const Value*)> reads = [&](const Value* v) {
        for (const Use& u : v->uses()) {
          const Node* un = u.user;
          const bool identity = isOnnxOp(un, "Identity");
          const bool view = un->def() && un->def()->view && u.operand == 0 && un->numResults() == 1;
          if ((identity || view) && !g.isOutput(un->result(0))) {
            if (!identity) chain.push_back(un);
            reads(un->result(0));
            if (!identity) chain.pop_back();
            continue;
          }
          const double k = pos.at(un);
          if (k <= at + kWindow) continue;
          late.push_back({u, chain});
          if (!first || k < pos.at(first)) first = un;
        }
      };
      reads(r);
      if (late.empty()) continue;
      const double firstLate = pos.at(first);
      // An activation among the operands (a parameter's cast stays computed once), and every
      // full-size one read at or after the first late read anyway.
      bool activation = recast, live = true;
      for (const Value* in : p->inputs()) {
        if (!in || in->kind() != ValueKind::Result || in->type().numel() < r->type().numel()) continue;
        activation = true;
        if (lastRead(in) < firstLate) live = false;
      }
      if (!activation || !live) continue;
      // Only the first result: a batch norm's copy leaves the running statistics to the original.
      Node* copy = g.copyNode(*p, p->inputs(), {{g.uniqueName(r->name() + ".remat"), r->type()}}, const_cast<Node*>(first));
      copy->setName(p->name() + "/remat");
      below += 1e-6;
      pos.emplace(copy, firstLate - below);
      // A late read through views reads the same views of the copy (made once each, after it).
      std::unordered_map<const Node*, Value*> viewed;
      for (const Late& l : late) {
        Value* v = copy->result(0);
        for (const Node* vn : l.views) {
          auto vit = viewed.find(vn);
          if (vit == viewed.end()) {
            std::vector<Value*> ins(vn->inputs().begin(), vn->inputs().end());
            ins[0] = v;
            Node* c = g.copyNode(*vn, ins, {{g.uniqueName(vn->result(0)->name() + ".remat"), vn->result(0)->type()}}, const_cast<Node*>(first));
            c->setName(vn->name() + "/remat");
            pos.emplace(c, firstLate - below);
            vit = viewed.emplace(vn, c->result(0)).first;
          }
          v = vit->second;
        }
        l.use.user->setInput(static_cast<size_t>(l.use.operand), v);
      }
      changed = true;
    }
    // Copies placed before the first reader that the positions saw; where two copies share a
    // slot, the order among them may need a fix.
    if (changed) g.sortNodes();
    return changed;
  }

 private:
  std::function<bool(const Node&)> excluded_;
  bool paramCasts_;
};

}  // namespace

std::unique_ptr<Pass> createRematerializePass(std::function<bool(const Node&)> excluded, bool paramCasts) {
  return std::make_unique<RematerializePass>(std::move(excluded), paramCasts);
}

}  // namespace ampc
