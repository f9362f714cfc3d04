// fold-casts (the CUDA target's lowering, runtime/lower.cpp, its last rewrite, and again after a
// rewrite at load): the Casts that launch nothing because a neighbour's kernel does their work.
//
// Casting between f32 and f16/bf16 is exact to do inside a neighbour: the neighbour widens to f32
// and rounds once either way. Three forms, each where the target's kernels say they can
// (Target::readsWidened, writesNarrowed, readsNarrowed):
// - a widening Cast none of whose readers is a graph output, every reader of which widens the
//   narrow operand in registers (elementwise ops, the loss and its gradient, LayerNorm and its
//   gradient, UnscaleCheck, a tiled Transpose): `fold = "readers"`, its f32 result never written;
// - a narrowing Cast, the one reader of its operand, produced by a kernel that rounds as it stores
//   (elementwise ops, the loss gradient, LayerNormalization): `fold = "producer"`, its f32 operand
//   never written;
// - otherwise a narrowing Cast whose one reader rounds the f32 operand in registers (DropoutGrad's
//   dY): `fold = "grad_reader"`, its narrow result never written.
// The pass clears every fold first, so running it again after a rewrite (data-parallel's
// AllReduce, expanded groups) decides on the graph that runs. The CUDA program and the memory plan
// read the attribute back (runtime/folds.h) and check it (checkCastFolds).
#include "passes/fold_casts.h"

#include "compiler/target.h"
#include "passes/pass.h"

namespace ampc {
namespace {

const char* foldName(CastFold f) {
  switch (f) {
    case CastFold::Readers: return "readers";
    case CastFold::Producer: return "producer";
    case CastFold::GradReader: return "grad_reader";
    case CastFold::None: break;
  }
  return "";
}

class FoldCastsPass final : public Pass {
 public:
  explicit FoldCastsPass(const Target& t) : target_(t) {}
  std::string name() const override { return "fold-casts"; }
  bool run(Graph& g) override {
    bool changed = false;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "Cast") && n->hasAttr("fold")) {
        n->removeAttr("fold");
        changed = true;
      }
    for (const auto& n : g.nodes())
      if (const CastFold f = foldableCast(g, *n, target_); f != CastFold::None) {
        n->setAttr("fold", std::string(foldName(f)));
        changed = true;
      }
    return changed;
  }

 private:
  const Target& target_;
};

}  // namespace

bool isCastBetween(const Node* c, bool widening) {
  if (!isOnnxOp(c, "Cast") || !c->input(0)) return false;
  const DType a = c->input(0)->type().dtype, b = c->result(0)->type().dtype;
  return widening ? (isLowFloat(a) && b == DType::f32) : (a == DType::f32 && isLowFloat(b));
}

CastFold foldableCast(const Graph& g, const Node& c, const Target& t) {
  if (isCastBetween(&c, true)) {
    const Value* r = c.result(0);
    if (!t.readsWidened || r->uses().empty() || g.isOutput(r)) return CastFold::None;
    for (const Use& u : r->uses())
      if (!t.readsWidened(*u.user, static_cast<size_t>(u.operand))) return CastFold::None;
    return CastFold::Readers;
  }
  if (!isCastBetween(&c, false)) return CastFold::None;
  const Value *x = c.input(0), *r = c.result(0);
  const Node* p = x->producer();
  if (p && x == p->result(0) && x->uses().size() == 1 && !g.isOutput(x) && t.writesNarrowed && t.writesNarrowed(*p)) return CastFold::Producer;
  if (t.readsNarrowed && r->uses().size() == 1 && !g.isOutput(r) && t.readsNarrowed(*r->uses()[0].user, static_cast<size_t>(r->uses()[0].operand)))
    return CastFold::GradReader;
  return CastFold::None;
}

CastFold castFold(const Node& c) {
  if (!isOnnxOp(&c, "Cast") || !c.hasAttr("fold")) return CastFold::None;
  const std::string f = c.getString("fold", "");
  for (CastFold k : {CastFold::Readers, CastFold::Producer, CastFold::GradReader})
    if (f == foldName(k)) return k;
  throw Error(c.describe() + " -> " + c.result(0)->name() + ": fold = '" + f + "' is none of readers, producer, grad_reader");
}

void checkCastFolds(const Graph& g, const Target& t) {
  for (const auto& n : g.nodes()) {
    const CastFold f = castFold(*n);
    if (f != CastFold::None && foldableCast(g, *n, t) != f)
      throw Error(n->describe() + " -> " + n->result(0)->name() + ": fold = '" + foldName(f) + "', which its readers and producer no longer allow on target " + t.name +
                  " (a rewrite after fold-casts; run fold-casts again)");
  }
}

std::unique_ptr<Pass> createFoldCastsPass(const Target& target) { return std::make_unique<FoldCastsPass>(target); }

}  // namespace ampc
