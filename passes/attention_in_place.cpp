// attention-in-place (the CUDA target's lowering, runtime/lower.cpp): fused attention reads and
// writes its operands where they lie, as explicit target nodes.
//
// The exporters put head transposes around attention, and before them the Split of the QKV
// projection, after the backward the Concat of its gradient. Where the target's attention takes
// strided operands at the node's shape (Target::attentionInPlace: the CUDA mma.sync kernels,
// f16/bf16, head dims multiples of 8, rank 4), ampc::Attention / ampc::AttentionGrad become
// cuda::Attention / cuda::AttentionGrad that read and write through layouts (compiler/ops/geometry.h,
// AttentionLayout; attribute dims holds the logical [B, H, Tq, Tk, D, Dv]), and the views go:
//   reads: Q, V, dO = Transpose(u, (0,2,1,3)) and KT = Transpose(u, (0,2,3,1)) of u [B, T, H, D],
//     every reader of the Transpose such an operand: read from u (K as rows [j][d]); and u a Reshape
//     of a Split output (last axis, every output so used): read from the Split's input.
//   grouped-query K and V: V = Reshape(Expand(Unsqueeze(x, 2), [B, Hkv, rep, T, D]),
//     [B, Hkv rep, T, D]) with x [B, Hkv, T, D] (Hugging Face's repeat_kv), KT = Transpose of that
//     (0, 1, 3, 2), every reader such an operand: read from x, head h at x's head h / rep. Their
//     gradients, per query head, are summed over each group by the graph's Expand gradient as before.
//   K of its own heads: KT = Transpose(x, (0, 1, 3, 2)) with x [B, H, T, D] (Llama's K after the
//     rotary embedding, without repeats), every reader KT: read from x as rows.
//   writes: O whose readers are one Transpose (0,2,1,3) and AttentionGrad operands: written as the
//     Transpose's value (and read back from there); dQ, dV (Transpose (0,2,1,3)) and dKT
//     (Transpose (0,3,1,2), dK as rows): written as the Transpose's value, or, when all three are
//     Reshaped into one Concat on the last axis, as the Concat's value (packed_grads = 1); dKT whose
//     one reader is Transpose (0,1,3,2): written as that value, [B, H, T, D] (dK as rows).
// The CPU reference runs the target nodes by gathering and scattering through the same layouts
// (kernels/cpu/k_attention.cpp), so a rewritten plan computes on the CPU exactly what it did before.
#include <map>
#include <optional>
#include <set>

#include "compiler/ops/geometry.h"
#include "compiler/target.h"
#include "passes/attention_mask.h"
#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

bool isAttn(const Node* n) { return n && n->domain() == "ampc" && (n->op() == "Attention" || n->op() == "AttentionGrad"); }
bool hasPerm(const Node* t, std::initializer_list<int64_t> p) { return isOnnxOp(t, "Transpose") && t->getInts("perm") == std::vector<int64_t>(p); }

// An operand's value and, when it is not the logical tensor itself, its layout.
struct Operand {
  Value* value = nullptr;
  std::optional<AttentionLayout> layout;
};

// u [B, T, H, D] as [B, H, T, D] or [B, H, D, T] rows (keyRows) at `base`, rows `sRow` apart.
Operand headsOf(Value* base, int64_t offset, const std::vector<int64_t>& u, int64_t sRow, bool keyRows) {
  AttentionLayout l;
  l.offset = offset;
  l.heads = u[2];
  l.sRow = sRow;
  l.sB = u[1] * sRow;
  l.sH = u[3];
  l.keyRows = keyRows;
  return {base, l};
}
// x [B, H, T, D] itself, as K rows.
Operand keyRowsOf(Value* x) {
  const auto& s = x->type().shape;
  AttentionLayout l;
  l.heads = s[1];
  l.sB = s[1] * s[2] * s[3];
  l.sH = s[2] * s[3];
  l.sRow = s[3];
  l.keyRows = true;
  return {x, l};
}

class Planner {
 public:
  Planner(const Graph& g, const Target& t) : g_(g), target_(t) {}

  // Whether the target reads and writes this attention node's operands in place.
  bool strided(const Node* n) const {
    if (!isAttn(n) || !target_.attentionInPlace) return false;
    const size_t q = n->op() == "AttentionGrad" ? 1 : 0;
    const TensorType &Q = n->input(q)->type(), &K = n->input(q + 1)->type(), &V = n->input(q + 2)->type();
    if (Q.rank() != 4) return false;
    AttentionShape s{isLowFloat(Q.dtype), Q.shape[3], V.shape[3], K.shape[3], n->getFloat("dropout_ratio", 0.0f) > 0.0f};
    s.softcap = n->getFloat("softcap", 0.0f) > 0.0f;
    if (target_.attentionInPlace(s)) return true;
    s.maskForCudnn = true;  // would the target take it with a mask cuDNN reads?
    if (!target_.attentionInPlace(s)) return false;
    // The mask (operand 3, AttentionGrad's 6): none, or computed from no parameter (once per mask value)
    const size_t maskAt = q ? 6 : 3;
    const Value* mask = n->numInputs() > maskAt ? n->input(maskAt) : nullptr;
    if (!mask) return true;
    auto [it, first] = untrained_.try_emplace(mask, false);
    if (first) it->second = !dependsOnParams(mask);
    return it->second;
  }
  // Operand i of an attention node: 0 Q, 1 KT, 2 V, 3 dO, 4 O, else -1.
  static int slotOf(const Node* n, size_t i) {
    if (n->op() == "Attention") return i < 3 ? static_cast<int>(i) : -1;
    static const int kGrad[] = {3, 0, 1, 2, 4};
    return i < 5 ? kGrad[i] : -1;
  }

  bool transposeRead(const Node* t) const {
    const bool kt = hasPerm(t, {0, 2, 3, 1});
    if ((!kt && !hasPerm(t, {0, 2, 1, 3})) || t->result(0)->uses().empty() || g_.isOutput(t->result(0))) return false;
    for (const Use& u : t->result(0)->uses()) {
      if (!strided(u.user)) return false;
      const int slot = slotOf(u.user, u.operand);
      if (kt ? slot != 1 : (slot != 0 && slot != 2 && slot != 3)) return false;
    }
    return true;
  }
  bool splitRead(const Node* split) const {
    if (!isOnnxOp(split, "Split") || split->input(0)->type().rank() != 3) return false;
    const auto& xs = split->input(0)->type().shape;
    if (normalizeAxis(split->getInt("axis", 0), 3) != 2) return false;
    for (size_t k = 0; k < split->numResults(); ++k) {
      const Value* w = split->result(k);
      const Node* r = nullptr;
      if (w->type().shape[2] % 8 != 0 || !(r = onlyReader(g_, w)) || !isOnnxOp(r, "Reshape")) return false;
      const auto& us = r->result(0)->type().shape;
      if (us.size() != 4 || us[0] != xs[0] || us[1] != xs[1] || r->result(0)->uses().empty() || g_.isOutput(r->result(0))) return false;
      for (const Use& u : r->result(0)->uses())
        if (!transposeRead(u.user)) return false;
    }
    return true;
  }
  // The Reshape of a grouped K or V read in place: x, and the repeat through rep; else null.
  Value* groupedSource(const Node* r, int64_t& rep, std::vector<Node*>& chain) const {
    if (!isOnnxOp(r, "Reshape") || g_.isOutput(r->result(0)) || r->result(0)->uses().empty()) return nullptr;
    Node* e = r->input(0)->producer();
    Node* u = isOnnxOp(e, "Expand") ? e->input(0)->producer() : nullptr;
    if (!isOnnxOp(u, "Unsqueeze") || !onlyReader(g_, e->result(0)) || !onlyReader(g_, u->result(0))) return nullptr;
    Value* x = u->input(0);
    const auto &xs = x->type().shape, &us = u->result(0)->type().shape, &es = e->result(0)->type().shape, &rs = r->result(0)->type().shape;
    // x [B, Hkv, T, D] -> [B, Hkv, 1, T, D] -> [B, Hkv, rep, T, D] -> [B, Hkv rep, T, D]
    if (xs.size() != 4 || us != std::vector<int64_t>{xs[0], xs[1], 1, xs[2], xs[3]} || es.size() != 5 || es[0] != xs[0] ||
        es[1] != xs[1] || es[3] != xs[2] || es[4] != xs[3] || es[2] < 1 || rs != std::vector<int64_t>{xs[0], xs[1] * es[2], xs[2], xs[3]})
      return nullptr;
    for (const Use& use : r->result(0)->uses()) {
      const Node* a = use.user;
      if (strided(a) && slotOf(a, use.operand) == 2) continue;  // V
      if (!hasPerm(a, {0, 1, 3, 2}) || g_.isOutput(a->result(0)) || a->result(0)->uses().empty()) return nullptr;
      for (const Use& k : a->result(0)->uses())  // KT
        if (!strided(k.user) || slotOf(k.user, k.operand) != 1) return nullptr;
    }
    rep = es[2];
    chain.insert(chain.end(), {e, u});
    return x;
  }
  // The Transpose that Attention a writes O into, or null.
  Node* outputTransposed(const Node* a) const {
    if (!a || a->op() != "Attention" || !strided(a) || g_.isOutput(a->result(0))) return nullptr;
    Node* t = nullptr;
    for (const Use& u : a->result(0)->uses()) {
      if (hasPerm(u.user, {0, 2, 1, 3}) && !t) t = u.user;
      else if (!(u.user->op() == "AttentionGrad" && u.operand == 4 && strided(u.user))) return nullptr;
    }
    return t;
  }
  // The Transpose a gradient is written into: to [B, T, H, D], or (headsMajor, dKT only) to
  // [B, H, T, D].
  Node* gradTransposed(const Node* a, size_t r, bool headsMajor = false) const {
    Node* t = onlyReader(g_, a->result(r));
    if (headsMajor) return r == 1 && hasPerm(t, {0, 1, 3, 2}) ? t : nullptr;
    if (r == 1) return hasPerm(t, {0, 3, 1, 2}) ? t : nullptr;
    return hasPerm(t, {0, 2, 1, 3}) ? t : nullptr;
  }
  // KT = Transpose(x, (0, 1, 3, 2)) that only attention nodes read, as KT.
  bool keyTransposeRead(const Node* t) const {
    if (!hasPerm(t, {0, 1, 3, 2}) || t->result(0)->uses().empty() || g_.isOutput(t->result(0))) return false;
    for (const Use& u : t->result(0)->uses())
      if (!strided(u.user) || slotOf(u.user, u.operand) != 1) return false;
    return true;
  }
  // The Concat that all three of AttentionGrad a's gradients are Reshaped into, or null.
  Node* gradConcat(const Node* a) const {
    Node* concat = nullptr;
    for (size_t r = 0; r < 3; ++r) {
      const Node* t = gradTransposed(a, r);
      Node *re = nullptr, *c = nullptr;
      if (!t || !(re = onlyReader(g_, t->result(0))) || !isOnnxOp(re, "Reshape") || re->result(0)->type().rank() != 3 ||
          !(c = onlyReader(g_, re->result(0))) || !isOnnxOp(c, "Concat") || (concat && c != concat))
        return nullptr;
      // [B, T, H, D] -> [B, T, H D]: the Concat's rows are the gradient's rows
      const auto &ts = t->result(0)->type().shape, &rs = re->result(0)->type().shape;
      if (rs[0] != ts[0] || rs[1] != ts[1]) return nullptr;
      concat = c;
    }
    if (concat->numInputs() != 3 || concat->result(0)->type().rank() != 3 || normalizeAxis(concat->getInt("axis", 0), 3) != 2) return nullptr;
    for (const Value* v : concat->inputs())
      if (v->type().shape[2] % 8 != 0) return nullptr;
    return concat;
  }

  // Where node n reads operand i; the views it bypasses go to `views`.
  Operand read(const Node* n, size_t i, std::vector<Node*>& views) const {
    Value* v = n->input(i);
    Node* p = v ? v->producer() : nullptr;
    const int slot = slotOf(n, i);
    if (!p || slot < 0) return {v, {}};
    if (slot == 4) {  // O, read back from where Attention wrote it
      if (const Node* t = outputTransposed(p)) {
        const auto& ts = t->result(0)->type().shape;
        return headsOf(t->result(0), 0, ts, ts[2] * ts[3], false);
      }
      return {v, {}};
    }
    {  // grouped-query K (through its Transpose) or V
      Node* r = slot == 1 && hasPerm(p, {0, 1, 3, 2}) ? p->input(0)->producer() : p;
      int64_t rep = 1;
      std::vector<Node*> chain = {r};
      if (Value* x = r && (slot == 1) == (r != p) ? groupedSource(r, rep, chain) : nullptr) {
        const auto& xs = x->type().shape;  // [B, Hkv, T, D]
        AttentionLayout l;
        l.heads = xs[1] * rep;
        l.sB = xs[1] * xs[2] * xs[3];
        l.sH = xs[2] * xs[3];
        l.sRow = xs[3];
        l.group = rep;
        l.keyRows = slot == 1;
        views.insert(views.end(), chain.begin(), chain.end());
        views.push_back(p);
        return {x, l};
      }
    }
    if (slot == 1 && keyTransposeRead(p)) {  // K [B, H, T, D] itself
      views.push_back(p);
      return keyRowsOf(p->input(0));
    }
    if (!transposeRead(p)) return {v, {}};
    views.push_back(p);
    const bool keyRows = hasPerm(p, {0, 2, 3, 1});
    Value* u = p->input(0);
    const auto& us = u->type().shape;
    Node* re = u->producer();
    Node* split = isOnnxOp(re, "Reshape") ? re->input(0)->producer() : nullptr;
    if (split && splitRead(split)) {
      Value* x = split->input(0);
      int64_t offset = 0;
      for (size_t k = 0; split->result(k) != re->input(0); ++k) offset += split->result(k)->type().shape[2];
      views.insert(views.end(), {re, split});
      return headsOf(x, offset, us, x->type().shape[2], keyRows);
    }
    return headsOf(u, 0, us, us[2] * us[3], keyRows);
  }

 private:
  const Graph& g_;
  const Target& target_;
  mutable std::map<const Value*, bool> untrained_;  // masks: whether each is computed from no parameter
};

// One attention node's rewrite, decided on the graph before any rewrite.
struct Plan {
  Node* node = nullptr;
  std::vector<Value*> inputs;
  std::vector<std::pair<std::string, AttentionLayout>> layouts;  // slot, layout
  std::vector<Value*> standsFor;                                 // per result of the target node
  bool packed = false;
  AttentionDims dims;
};

Plan plan(const Planner& p, Node* n, std::vector<Node*>& views) {
  Plan pl;
  pl.node = n;
  const bool grad = n->op() == "AttentionGrad";
  const size_t q = grad ? 1 : 0;
  const auto &Q = n->input(q)->type().shape, &KT = n->input(q + 1)->type().shape, &V = n->input(q + 2)->type().shape;
  pl.dims = {Q[0], Q[1], Q[2], KT[3], Q[3], V[3]};
  for (size_t i = 0; i < n->numInputs(); ++i) {
    const Operand o = p.read(n, i, views);
    pl.inputs.push_back(o.value);
    if (o.layout) pl.layouts.emplace_back(attentionOperandSlot(grad, i), *o.layout);
  }
  if (!grad) {
    Node* t = p.outputTransposed(n);
    if (t) {
      const auto& ts = t->result(0)->type().shape;
      pl.layouts.emplace_back("o", *headsOf(t->result(0), 0, ts, ts[2] * ts[3], false).layout);
      views.push_back(t);
    }
    pl.standsFor = {t ? t->result(0) : n->result(0), n->result(1)};
    return pl;
  }
  Node* c = p.gradConcat(n);
  for (size_t r = 0; r < 3; ++r) {
    Node* t = p.gradTransposed(n, r);
    if (!t && !c) {
      if (Node* h = p.gradTransposed(n, r, true)) {  // dK rows [B, H, T, D]
        views.push_back(h);
        pl.layouts.emplace_back(attentionGradSlot(r), *keyRowsOf(h->result(0)).layout);
        pl.standsFor.push_back(h->result(0));
        continue;
      }
    }
    if (!t) {
      pl.standsFor.push_back(n->result(r));
      continue;
    }
    const auto& ts = t->result(0)->type().shape;
    views.push_back(t);
    if (!c) {
      pl.layouts.emplace_back(attentionGradSlot(r), *headsOf(t->result(0), 0, ts, ts[2] * ts[3], r == 1).layout);
      pl.standsFor.push_back(t->result(0));
      continue;
    }
    Node* re = t->result(0)->uses()[0].user;
    views.push_back(re);
    int64_t offset = 0;
    for (const Value* in : c->inputs()) {
      if (in == re->result(0)) break;
      offset += in->type().shape[2];
    }
    pl.layouts.emplace_back(attentionGradSlot(r), *headsOf(c->result(0), offset, ts, c->result(0)->type().shape[2], r == 1).layout);
  }
  if (c) {
    pl.packed = true;
    pl.standsFor = {c->result(0)};
    views.push_back(c);
  }
  for (size_t r = 3; r < n->numResults(); ++r) pl.standsFor.push_back(n->result(r));  // the mask's gradient
  return pl;
}

class AttentionInPlacePass final : public Pass {
 public:
  explicit AttentionInPlacePass(const Target& t) : target_(t) {}
  std::string name() const override { return "attention-in-place"; }
  bool run(Graph& g) override {
    const Planner planner(g, target_);
    std::vector<Plan> plans;
    std::set<Node*> dead;  // the attention nodes and views that go, once nothing reads them
    for (const auto& n : g.nodes()) {
      if (!planner.strided(n.get())) continue;
      std::vector<Node*> views;
      plans.push_back(plan(planner, n.get(), views));
      dead.insert(views.begin(), views.end());
      dead.insert(n.get());
    }
    if (plans.empty()) return false;
    g.domainOpsets.emplace(kCudaDomain, 1);
    std::map<Value*, Value*> now;  // a value a plan names -> what holds it after the rewrites so far
    auto current = [&](Value* v) {
      auto it = now.find(v);
      return it == now.end() ? v : it->second;
    };
    std::vector<std::pair<Value*, std::string>> names;
    for (const Plan& pl : plans) {
      Node& n = *pl.node;
      std::vector<Value*> ins;
      for (Value* v : pl.inputs) ins.push_back(v ? current(v) : nullptr);
      std::vector<std::pair<std::string, TensorType>> results;
      for (const Value* v : pl.standsFor) results.emplace_back(g.uniqueName(v->name() + ".f"), v->type());
      Node* f = g.createNode(n.op(), kCudaDomain, ins, results, &n);
      f->setName(n.name());
      for (const auto& [k, a] : n.attrs()) f->setAttr(k, a);
      f->setAttr("dims", std::vector<int64_t>{pl.dims.B, pl.dims.H, pl.dims.Tq, pl.dims.Tk, pl.dims.D, pl.dims.Dv});
      for (const auto& [slot, l] : pl.layouts) f->setAttr(slot + "_layout", l.toInts());
      if (pl.packed) f->setAttr("packed_grads", int64_t{1});
      for (size_t r = 0; r < pl.standsFor.size(); ++r) {
        Value* v = pl.standsFor[r];
        v->replaceAllUsesWith(f->result(r));
        now[v] = f->result(r);
        names.emplace_back(f->result(r), v->name());
      }
    }
    // Readers before producers: the old nodes, then the views they read through.
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    std::set<Value*> consts;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (!dead.count(n)) continue;
      bool read = false;
      for (size_t r = 0; r < n->numResults(); ++r) read |= !n->result(r)->uses().empty() || g.isOutput(n->result(r));
      if (read) continue;
      for (Value* v : n->inputs())
        if (v && v->kind() == ValueKind::Const) consts.insert(v);
      g.eraseNode(n);
    }
    for (Value* c : consts)
      if (c->uses().empty() && !g.isOutput(c)) g.eraseGraphValue(c);
    for (const auto& [v, name] : names)
      if (!g.lookup(name)) g.renameValue(v, name);
    g.bindOps();
    return true;
  }

 private:
  const Target& target_;
};

}  // namespace

std::unique_ptr<Pass> createAttentionInPlacePass(const Target& target) { return std::make_unique<AttentionInPlacePass>(target); }

}  // namespace ampc
