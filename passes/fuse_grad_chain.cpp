// fuse-grad-chain (the CUDA target's lowering, runtime/lower.cpp): the step's gradient chain runs
// inside its optimizer.
//
// An UnscaleCheck each of whose unscaled gradients has one reader, either all one ClipByGlobalNorm
// (taking UnscaleCheck's found_inf) each of whose clipped gradients has one reader, or directly, and
// those readers the gradient operand of SGD or Adam/AdamW nodes (not LAMB, which reads its gradient
// twice); none a graph output. UnscaleCheck then only checks (and sums the squares for the clip),
// the clip only writes its norm, and each optimizer node reads the gradient UnscaleCheck read,
// unscaling and clipping it in registers with the same operations: the unscaled and clipped
// gradients are never written. The pass records the decision as fold = "optimizer" on the
// UnscaleCheck and on the clip; the CUDA program and the memory plan read it back (runtime/folds.h,
// fusedGradChain) and check it (checkGradChain).
#include "passes/fuse_grad_chain.h"

#include "passes/pass.h"

namespace ampc {
namespace {

bool isAmpc(const Node* n, const char* op) { return n && n->domain() == "ampc" && n->op() == op; }

class FuseGradChainPass final : public Pass {
 public:
  std::string name() const override { return "fuse-grad-chain"; }
  bool run(Graph& g) override {
    bool changed = false;
    for (const auto& n : g.nodes())
      if ((isAmpc(n.get(), "UnscaleCheck") || isAmpc(n.get(), "ClipByGlobalNorm")) && n->hasAttr("fold")) {
        n->removeAttr("fold");
        changed = true;
      }
    for (const auto& n : g.nodes()) {
      const Node* clip = nullptr;
      if (!foldableGradChain(g, *n, &clip)) continue;
      n->setAttr("fold", std::string("optimizer"));
      if (clip) const_cast<Node*>(clip)->setAttr("fold", std::string("optimizer"));
      changed = true;
    }
    return changed;
  }
};

}  // namespace

bool foldableGradChain(const Graph& g, const Node& u, const Node** clipOut) {
  if (!isAmpc(&u, "UnscaleCheck") || u.inputs().size() < 2 || u.numResults() != u.inputs().size()) return false;
  const size_t k = u.inputs().size() - 1;
  auto single = [&](const Value* r) -> const Use* { return g.isOutput(r) || r->uses().size() != 1 ? nullptr : &r->uses()[0]; };
  auto optimizerGrad = [](const Use& use) {
    const Node& o = *use.user;
    return o.domain() == "ampc" && use.operand == 1 && (o.op() == "SGD" || (o.op() == "Adam" && o.getInt("lamb", 0) == 0));
  };
  const Use* first = single(u.result(0));
  if (!first) return false;
  const Node* clip = isAmpc(first->user, "ClipByGlobalNorm") ? first->user : nullptr;
  if (clip && (clip->inputs().size() != k + 1 || clip->inputs()[0] != u.result(k) || clip->numResults() < k)) return false;
  for (size_t i = 0; i < k; ++i) {
    const Use* use = single(u.result(i));
    if (!use) return false;
    if (clip) {
      const Use* c = single(clip->result(i));
      if (use->user != clip || use->operand != static_cast<int>(i) + 1 || !c || !optimizerGrad(*c)) return false;
    } else if (!optimizerGrad(*use)) {
      return false;
    }
  }
  if (clipOut) *clipOut = clip;
  return true;
}

void checkGradChain(const Graph& g) {
  for (const auto& n : g.nodes()) {
    if (!isAmpc(n.get(), "UnscaleCheck") || n->getString("fold", "") != "optimizer") continue;
    const Node* clip = nullptr;
    if (!foldableGradChain(g, *n, &clip))
      throw Error(n->describe() + ": fold = 'optimizer', but its results are no longer read by the optimizer alone (a rewrite after "
                  "fuse-grad-chain; run it again)");
    if (clip && clip->getString("fold", "") != "optimizer") throw Error(clip->describe() + ": its UnscaleCheck folds into the optimizer, it does not");
  }
}

std::unique_ptr<Pass> createFuseGradChainPass() { return std::make_unique<FuseGradChainPass>(); }

}  // namespace ampc
