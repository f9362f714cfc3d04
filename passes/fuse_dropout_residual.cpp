// fuse-dropout-residual (the CUDA target's lowering, runtime/lower.cpp): a residual sum written by
// the dropout before it, as an explicit target node.
//
// Add(Cast(y) to f32, r) where y (f16/bf16) is a Dropout's result read only by that Cast, the Cast
// read only by the Add, r f32 of the sum's shape and made before the Dropout (a transformer's
// x + dropout(sublayer(x))): cuda::Dropout(X, ratio, training_mode, r) writes r + widen(y) (f32) as
// result 0 and the mask as result 1, so y and its widened copy are never written. The node keeps
// the Dropout's random stream: attribute `stream` names the result whose name keys it
// (cpu::dropoutNodeKey), so the masks are the unfused graph's. The CPU reference runs Dropout's
// kernel and the Add as the unfused nodes did (kernels/cpu/k_target.cpp).
#include <map>
#include <vector>

#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

struct Match {
  Node *dropout = nullptr, *cast = nullptr, *add = nullptr;
};

Match match(const Graph& g, Node& d, const std::map<const Node*, size_t>& order) {
  if (!isOnnxOp(&d, "Dropout") || !isLowFloat(d.result(0)->type().dtype)) return {};
  Node* c = onlyReader(g, d.result(0));
  if (!isOnnxOp(c, "Cast") || c->result(0)->type().dtype != DType::f32) return {};
  const Value* w = c->result(0);
  Node* add = onlyReader(g, w);
  if (!isOnnxOp(add, "Add") || add->input(0) == add->input(1) || add->result(0)->type() != w->type()) return {};
  if (Node* n = onlyReader(g, add->result(0)); isOnnxOp(n, "Cast") && isLowFloat(n->result(0)->type().dtype)) return {};
  const Value* r = add->input(0) == w ? add->input(1) : add->input(0);
  const Node* rp = r->producer();
  if (r->type() != w->type() || (rp && order.at(rp) > order.at(&d))) return {};
  return {&d, c, add};
}

class FuseDropoutResidualPass final : public Pass {
 public:
  std::string name() const override { return "fuse-dropout-residual"; }
  bool run(Graph& g) override {
    std::map<const Node*, size_t> order;
    for (const auto& n : g.nodes()) order.emplace(n.get(), order.size());
    std::vector<Match> found;
    for (const auto& n : g.nodes())
      if (Match m = match(g, *n, order); m.dropout) found.push_back(m);
    for (const Match& m : found) {
      Node& d = *m.dropout;
      const Value* w = m.cast->result(0);
      std::vector<Value*> ins(3, nullptr);
      for (size_t i = 0; i < d.numInputs() && i < 3; ++i) ins[i] = d.input(i);
      ins.push_back(m.add->input(0) == w ? m.add->input(1) : m.add->input(0));
      std::vector<Value*> stands = {m.add->result(0)};
      if (d.numResults() > 1) stands.push_back(d.result(1));
      const std::string stream = d.hasAttr("stream") ? d.getString("stream", "") : d.result(0)->name();
      Node* f = replaceByTargetNode(g, "Dropout", d, ins, stands, {m.add, m.cast, &d});
      f->setAttr("stream", stream);
    }
    if (!found.empty()) g.bindOps();
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseDropoutResidualPass() { return std::make_unique<FuseDropoutResidualPass>(); }

}  // namespace ampc
