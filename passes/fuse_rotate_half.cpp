// fuse-rotate-half: rotary embeddings' rotate_half, as Hugging Face writes it and both exporters
// emit it, Concat(Neg(Slice(x, h..2h)), Slice(x, 0..h)) along the last axis of x [.., 2h], becomes
// one ampc::RotateHalf(x). Its gradient is one RotateHalf of dY with the sign flipped
// (dx = [dy2, -dy1]), where the unfused graph's backward is two zero-padded SliceGrads, a Neg, the
// Concat's two Slices and an Add. Exact: the values move and one half changes sign. Each
// intermediate value must have its one use inside the pattern.
#include <vector>

#include "compiler/ops/geometry.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

std::vector<int64_t> constInts(const Value* v) {
  const Tensor* t = v ? v->constData() : nullptr;
  return t && !isFloat(t->type.dtype) ? t->toInts() : std::vector<int64_t>{};
}

// The first index along x's last axis of Slice `n` when it takes `len` elements there with step 1
// and every other dim whole, else -1.
int64_t lastAxisSlice(const Node* n, const Value* x, int64_t len) {
  if (!isOnnxOp(n, "Slice") || n->numInputs() < 3 || n->input(0) != x || n->numResults() != 1) return -1;
  const auto& shape = x->type().shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  const auto starts = constInts(n->input(1)), ends = constInts(n->input(2));
  std::vector<int64_t> axes, steps;
  if (n->numInputs() > 3 && n->input(3)) {
    axes = constInts(n->input(3));
    if (axes.empty()) return -1;
  }
  if (n->numInputs() > 4 && n->input(4)) {
    steps = constInts(n->input(4));
    if (steps.empty()) return -1;
  }
  if (starts.empty() || starts.size() != ends.size()) return -1;
  SliceSpec s;
  try {
    s = sliceSpecOf(shape, starts, ends, axes, steps);
  } catch (const Error&) {
    return -1;
  }
  for (int64_t d = 0; d < rank; ++d) {
    const bool last = d == rank - 1;
    if (s.step[d] != 1 || s.out[d] != (last ? len : shape[d]) || (!last && s.start[d] != 0)) return -1;
  }
  return s.start[rank - 1];
}

class FuseRotateHalfPass final : public Pass {
 public:
  std::string name() const override { return "fuse-rotate-half"; }
  bool run(Graph& g) override {
    struct Match {
      Node *cat, *neg, *hi, *lo;
      Value* x;
    };
    std::vector<Match> found;
    for (const auto& up : g.nodes()) {
      Node* cat = up.get();
      if (!isOnnxOp(cat, "Concat") || cat->numInputs() != 2 || cat->numResults() != 1) continue;
      const TensorType& yt = cat->result(0)->type();
      const int64_t rank = yt.rank();
      if (rank < 1) continue;
      const int64_t a = cat->getInt("axis", 0), axis = a < 0 ? a + rank : a;
      if (axis != rank - 1 || yt.shape.back() % 2 != 0 || yt.shape.back() <= 0) continue;
      const int64_t h = yt.shape.back() / 2;
      Node* neg = cat->input(0) ? cat->input(0)->producer() : nullptr;
      Node* lo = cat->input(1) ? cat->input(1)->producer() : nullptr;
      if (!isOnnxOp(neg, "Neg") || !singleUse(g, cat->input(0)) || !lo || !singleUse(g, cat->input(1))) continue;
      Node* hi = neg->input(0) ? neg->input(0)->producer() : nullptr;
      if (!hi || !singleUse(g, neg->input(0))) continue;
      Value* x = lo->input(0);
      if (!x || x->type() != yt || !isFloat(yt.dtype)) continue;
      if (lastAxisSlice(lo, x, h) != 0 || lastAxisSlice(hi, x, h) != h) continue;
      found.push_back({cat, neg, hi, lo, x});
    }
    for (const Match& m : found) {
      g.domainOpsets.emplace(kGradDomain, 1);
      Node* r = g.createNode("RotateHalf", kGradDomain, {m.x}, {{g.uniqueName(m.cat->result(0)->name() + ".rot"), m.cat->result(0)->type()}}, m.cat);
      r->setName(m.cat->name() + "/RotateHalf");
      r->setAttr("sign", int64_t{1});
      const std::string name = m.cat->result(0)->name();
      m.cat->result(0)->replaceAllUsesWith(r->result(0));
      for (Node* n : {m.cat, m.neg, m.hi, m.lo}) g.eraseNode(n);
      g.renameValue(r->result(0), name);
    }
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseRotateHalfPass() { return std::make_unique<FuseRotateHalfPass>(); }

}  // namespace ampc
