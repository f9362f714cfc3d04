// split-heads: attention's q, k and v cut from one projection as timm writes it, the projection
// [B, T, k C] viewed [B, T, k, H, d], permuted [2, 0, 3, 1, 4] to [k, B, H, T, d] and unbound along
// its first dim (the dynamo exporter: a Slice [s, s + 1) and a Squeeze each; the TorchScript
// exporter: one Split into ones and Squeezes), becomes the form Hugging Face's GPT-2 writes: a Split
// of the projection along its last dim into k [B, T, C], each viewed [B, T, H, d] and transposed
// [0, 2, 1, 3] to [B, H, T, d]. The same values (the ops only move them), and the form whose
// operands the CUDA attention kernels read in place (runtime/folds.h), where the permuted copy of
// the whole projection, the slices, and their gradients' zero-padded sums were written before.
#include <map>
#include <optional>
#include <vector>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// The i64 constant operand i of n, or the attribute `attr` (older opsets); nullopt if neither.
std::optional<std::vector<int64_t>> ints(const Node& n, size_t i, const char* attr) {
  if (i < n.inputs().size() && n.inputs()[i]) {
    const Tensor* t = n.inputs()[i]->constData();
    if (!t) return std::nullopt;
    return t->toInts();
  }
  if (n.hasAttr(attr)) return n.getInts(attr);
  return std::nullopt;
}

bool axisZero(const std::optional<std::vector<int64_t>>& axes, int64_t rank) {
  return axes && axes->size() == 1 && ((*axes)[0] == 0 || (*axes)[0] == -rank);
}

// The Squeeze of axis 0 that is v's one reader, or null.
Node* squeezedOnce(const Graph& g, const Value* v) {
  if (v->uses().size() != 1 || g.isOutput(v)) return nullptr;
  Node* q = v->uses()[0].user;
  if (!isOnnxOp(q, "Squeeze") || q->inputs()[0] != v || !axisZero(ints(*q, 1, "axes"), v->type().rank())) return nullptr;
  return q;
}

// K^T as the exporters write k.transpose(-2, -1) of [B, H, T, d]: Reshape to [B H, T, d], Transpose
// [0, 2, 1], Reshape to [B, H, d, T]. That is Transpose [0, 1, 3, 2] of k itself; the lowering's
// fold-transposes then makes it one Transpose [0, 2, 3, 1] of the [B, T, H, d] view, which the
// attention kernels read in place as K. Returns whether it rewrote the Reshape `r2`.
bool mergedTranspose(Graph& g, Node* r2) {
  if (!isOnnxOp(r2, "Reshape") || !r2->inputs()[0]) return false;
  Node* t = r2->inputs()[0]->producer();
  if (!isOnnxOp(t, "Transpose") || t->getInts("perm") != std::vector<int64_t>{0, 2, 1} || t->result(0)->uses().size() != 1 ||
      g.isOutput(t->result(0)))
    return false;
  Node* r1 = t->inputs()[0]->producer();
  if (!isOnnxOp(r1, "Reshape") || r1->result(0)->uses().size() != 1 || g.isOutput(r1->result(0))) return false;
  Value* y = r1->inputs()[0];
  const auto& ys = y->type().shape;
  const auto& out = r2->result(0)->type().shape;
  if (ys.size() != 4 || r1->result(0)->type().shape != std::vector<int64_t>{ys[0] * ys[1], ys[2], ys[3]}) return false;
  if (out != std::vector<int64_t>{ys[0], ys[1], ys[3], ys[2]}) return false;
  Node* tr = g.createNode("Transpose", "", {y}, {{g.uniqueName(r2->result(0)->name() + ".t"), r2->result(0)->type()}}, r2);
  tr->setName(r2->name());
  tr->setAttr("perm", std::vector<int64_t>{0, 1, 3, 2});
  Value* old = r2->result(0);
  const std::string keep = old->name();
  old->replaceAllUsesWith(tr->result(0));
  g.eraseNode(r2);
  g.eraseNode(t);
  g.eraseNode(r1);
  g.renameValue(tr->result(0), keep);
  return true;
}

class SplitHeadsPass final : public Pass {
 public:
  std::string name() const override { return "split-heads"; }

  bool run(Graph& g) override {
    std::vector<Node*> permutes;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "Transpose") && n->getInts("perm") == std::vector<int64_t>{2, 0, 3, 1, 4}) permutes.push_back(n.get());
    bool changed = false;
    if (g.opset >= 13)  // Split's sizes as an input
      for (Node* t : permutes) changed |= rewrite(g, t);
    std::vector<Node*> reshapes;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "Reshape")) reshapes.push_back(n.get());
    for (Node* r : reshapes) changed |= mergedTranspose(g, r);
    return changed;
  }

 private:
  static bool rewrite(Graph& g, Node* t) {
    Node* r = t->inputs()[0] ? t->inputs()[0]->producer() : nullptr;
    if (!isOnnxOp(r, "Reshape") || g.isOutput(t->result(0))) return false;
    Value* x = r->inputs()[0];
    const auto& xs = x->type().shape;
    const auto& vs = r->result(0)->type().shape;  // [B, T, k, H, d]
    if (xs.size() != 3 || vs.size() != 5 || xs[0] != vs[0] || xs[1] != vs[1] || xs[2] != vs[2] * vs[3] * vs[4]) return false;
    const int64_t k = vs[2], B = vs[0], T = vs[1], H = vs[3], d = vs[4];
    // Part s of the unbind: the Squeeze that yields it.
    std::map<int64_t, Node*> parts;
    std::vector<Node*> cuts;  // the Slices or the Split
    for (const Use& u : t->result(0)->uses()) {
      Node* c = u.user;
      if (u.operand != 0) return false;
      if (isOnnxOp(c, "Slice")) {
        const auto starts = ints(*c, 1, "starts"), ends = ints(*c, 2, "ends");
        const auto steps = c->inputs().size() > 4 && c->inputs()[4] ? ints(*c, 4, "steps") : std::optional<std::vector<int64_t>>{{1}};
        if (!starts || !ends || !steps || starts->size() != 1 || ends->size() != 1 || (*steps) != std::vector<int64_t>{1}) return false;
        if (!axisZero(c->inputs().size() > 3 && c->inputs()[3] ? ints(*c, 3, "axes") : std::optional<std::vector<int64_t>>{{0}}, 5)) return false;
        const int64_t s = (*starts)[0];
        Node* q = squeezedOnce(g, c->result(0));
        if (s < 0 || s >= k || (*ends)[0] != s + 1 || !q || parts.count(s)) return false;
        parts[s] = q;
        cuts.push_back(c);
      } else if (isOnnxOp(c, "Split")) {
        const int64_t axis = c->getInt("axis", 0);
        if ((axis != 0 && axis != -5) || static_cast<int64_t>(c->numResults()) != k) return false;
        for (size_t s = 0; s < c->numResults(); ++s) {
          Node* q = c->result(s)->type().shape[0] == 1 ? squeezedOnce(g, c->result(s)) : nullptr;
          if (!q || parts.count(static_cast<int64_t>(s))) return false;
          parts[static_cast<int64_t>(s)] = q;
        }
        cuts.push_back(c);
      } else {
        return false;
      }
    }
    if (static_cast<int64_t>(parts.size()) != k) return false;
    for (const auto& [s, q] : parts)
      if (q->result(0)->type().shape != std::vector<int64_t>{B, H, T, d}) return false;
    const int64_t C = H * d;
    const std::string base = t->name();
    auto i64 = [&](const std::vector<int64_t>& v, const std::string& what) {
      return g.addConst(g.uniqueName(base + "/" + what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
    };
    std::vector<std::pair<std::string, TensorType>> pieces;
    for (int64_t s = 0; s < k; ++s) pieces.push_back({g.uniqueName(x->name() + ".part" + std::to_string(s)), TensorType{x->type().dtype, {B, T, C}}});
    Node* split = g.createNode("Split", "", {x, i64(std::vector<int64_t>(static_cast<size_t>(k), C), "sizes")}, pieces, t);
    split->setName(base + "/split");
    split->setAttr("axis", int64_t{2});
    Value* heads = i64({B, T, H, d}, "heads");
    for (int64_t s = 0; s < k; ++s) {
      Node* q = parts.at(s);
      Value* old = q->result(0);
      Node* view = g.createNode("Reshape", "", {split->result(static_cast<size_t>(s)), heads},
                                {{g.uniqueName(old->name() + ".heads"), TensorType{x->type().dtype, {B, T, H, d}}}}, t);
      view->setName(base + "/heads" + std::to_string(s));
      Node* tr = g.createNode("Transpose", "", {view->result(0)}, {{g.uniqueName(old->name() + ".bhtd"), old->type()}}, t);
      tr->setName(q->name());
      tr->setAttr("perm", std::vector<int64_t>{0, 2, 1, 3});
      const std::string keep = old->name();
      old->replaceAllUsesWith(tr->result(0));
      g.eraseNode(q);
      g.renameValue(tr->result(0), keep);
    }
    for (Node* c : cuts) g.eraseNode(c);
    g.eraseNode(t);
    if (r->result(0)->uses().empty() && !g.isOutput(r->result(0))) g.eraseNode(r);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createSplitHeadsPass() { return std::make_unique<SplitHeadsPass>(); }

}  // namespace ampc
