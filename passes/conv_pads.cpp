// conv-pads: Conv whose pads differ at the two ends of a spatial dim (pads [1, 0, 2, 1], or auto_pad
// SAME_UPPER / SAME_LOWER over an even window or a stride that leaves an odd total), for a target
// whose convolutions take one pad per dim (Target::convPadsBothEnds: cuDNN's descriptors). The
// difference becomes a Pad of the input with zeros, and the Conv pads both ends by the smaller
// amount, explicitly (auto_pad dropped): zeros either way, so the same result, and autodiff gives
// the Pad its gradient (a Slice). Runs before autodiff, so the Conv's gradient has the same window.
#include <algorithm>
#include <vector>

#include "compiler/ops/geometry.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class ConvPadsPass final : public Pass {
 public:
  explicit ConvPadsPass(const Target& t) : target_(t) {}
  std::string name() const override { return "conv-pads"; }
  bool run(Graph& g) override {
    if (!target_.convPadsBothEnds) return false;
    std::vector<Node*> convs;
    for (const auto& up : g.nodes())
      if (isOnnxOp(up.get(), "Conv")) convs.push_back(up.get());
    bool changed = false;
    for (Node* n : convs) changed |= rewrite(g, n);
    return changed;
  }

 private:
  const Target& target_;

  static bool rewrite(Graph& g, Node* n) {
    Value* x = n->input(0);
    Value* w = n->input(1);
    const TensorType xt = x->type();
    const auto& ws = w->type().shape;
    const int64_t rank = xt.rank(), nsp = rank - 2;
    if (nsp < 1 || static_cast<int64_t>(ws.size()) != rank) return false;  // (shape inference reports these)
    const std::vector<int64_t> spatialIn(xt.shape.begin() + 2, xt.shape.end());
    const Window win = windowOf(*n, spatialIn, n->getInts("kernel_shape", std::vector<int64_t>(ws.begin() + 2, ws.end())), false);
    std::vector<int64_t> extra(static_cast<size_t>(2 * rank), 0), pads(static_cast<size_t>(2 * nsp));
    bool uneven = false;
    for (int64_t i = 0; i < nsp; ++i) {
      const int64_t b = win.padBegin[static_cast<size_t>(i)], e = win.padEnd[static_cast<size_t>(i)], both = std::min(b, e);
      uneven |= b != e;
      extra[static_cast<size_t>(2 + i)] = b - both;
      extra[static_cast<size_t>(rank + 2 + i)] = e - both;
      pads[static_cast<size_t>(i)] = pads[static_cast<size_t>(nsp + i)] = both;
    }
    if (!uneven) return false;
    TensorType padded = xt;
    for (int64_t i = 0; i < nsp; ++i)
      padded.shape[static_cast<size_t>(2 + i)] += extra[static_cast<size_t>(2 + i)] + extra[static_cast<size_t>(rank + 2 + i)];
    const std::string base = n->name().empty() ? n->result(0)->name() : n->name();
    Value* amounts = g.addConst(g.uniqueName(base + ".pads"), Tensor::fromInts(DType::i64, {2 * rank}, extra));
    Node* pad = g.createNode("Pad", "", {x, amounts}, {{g.uniqueName(x->name() + ".padded"), padded}}, n);
    pad->setName(base + "/Pad");
    n->setInput(0, pad->result(0));
    n->setAttr("pads", pads);
    n->removeAttr("auto_pad");
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createConvPadsPass(const Target& t) { return std::make_unique<ConvPadsPass>(t); }

}  // namespace ampc
