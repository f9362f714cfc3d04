// narrow-checks: IsNaN and IsInf of a widening Cast (f16/bf16/f32 -> a wider float) read the Cast's
// operand instead. Exact: widening keeps every value, NaN and infinity included. torch.nan_to_num
// exports IsInf(Cast(x, f64)); with the check narrowed the f64 value is dead (the CUDA backend has
// no f64 kernels) and the Cast goes.
#include <set>

#include "passes/pass.h"

namespace ampc {
namespace {

int width(DType t) { return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2; }

class NarrowChecksPass final : public Pass {
 public:
  std::string name() const override { return "narrow-checks"; }
  bool run(Graph& g) override {
    bool changed = false;
    std::set<Node*> casts;
    for (const auto& up : g.nodes()) {
      Node* n = up.get();
      if (!(isOnnxOp(n, "IsNaN") || isOnnxOp(n, "IsInf")) || !n->input(0)) continue;
      Node* c = n->input(0)->producer();
      if (!isOnnxOp(c, "Cast") || !c->input(0)) continue;
      const DType from = c->input(0)->type().dtype, to = c->result(0)->type().dtype;
      if (!isFloat(from) || !isFloat(to) || width(to) <= width(from)) continue;
      n->setInput(0, c->input(0));
      casts.insert(c);
      changed = true;
    }
    for (Node* c : casts)
      if (c->result(0)->uses().empty() && !g.isOutput(c->result(0))) g.eraseNode(c);
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createNarrowChecksPass() { return std::make_unique<NarrowChecksPass>(); }

}  // namespace ampc
