// fuse-attention: finds scaled dot-product attention as exporters emit it,
//
//   S = MatMul(Q', KT')           Q' = Q, or Q times / divided by a scalar constant; KT' the same
//                                 (KT and V may have heads of 1 that the products broadcast: MQA)
//   S = S * c  or  S / c          (optional, scalar constant; also above the masks: (S + M) / c;
//                                  or S * t, t a tensor [.., 1, 1]: a scale per head, moved onto Q)
//   S = cap * Tanh(S * f)         (optional, scalar constants cap > 0 and f, or Tanh(S / d): Gemma 2's
//                                  soft-capping, cap * tanh(S / cap); the fused op's softcap)
//   S = Where(c, S, fill)  or  Where(c, fill, S)   (optional: masked_fill, transformers' eager
//                                  causal mask; fill a scalar constant at most -1e30 or -inf, or
//                                  at most -1e6 with no mask added: see below)
//   S = S + mask  or  S - mask    (optional, any number, also under the Where; a trainable one, a bias,
//                                  gets its gradient)
//   S = Max(S, c)                 (optional, c a scalar constant at most -1e30, over the masks: XGLM's
//                                  clamp at the lowest float; the fused op's score_floor)
//   S = Cast(S) to S's own dtype, or Identity(S)  (any number: softmax(S, dtype=torch.float32))
//   P = Softmax(S, axis = -1)
//   P = Where(IsNaN(P), 0, P)     (optional: rows with every score -inf give 0, zero_empty_rows)
//   P = Cast(P) to P's own dtype  (any number: transformers casts to V's dtype; softmax's dtype)
//   P = Dropout(P, ratio, training)  (optional, constant ratio and mode, mask result unused)
//   P = Identity(P)               (any number, before or after the Cast and the Dropout: clone)
//   O = MatMul(P, V)
//
// and replaces it with one ampc.Attention node (compiler/ops/ops_nn.cpp). Its backward,
// ampc.AttentionGrad, recomputes the probabilities from the saved row log-sum-exp, so neither the
// [.., Tq, Tk] scores nor the probabilities are stored: the fused kernels never write them. The
// dropout keeps the Dropout node's Philox stream (its key and the element index over [.., Tq, Tk]),
// so the fused graph draws the same masks as the graph it replaces.
//
// A Where mask becomes the additive mask Where(c, 0, fill) (or Where(c, fill, 0)), added to the
// mask of an Add above it if there is one. That is exact: in f32 a score s with |s| below 2^-24
// |fill| (any sane score, at |fill| >= 1e30) gives s + fill == fill, and s + -inf == -inf, so the
// masked scores take the same value as under Where (a row masked everywhere included). A fill
// above -1e30 would make s + fill differ from fill: such a Where (the Annotated Transformer's
// masked_fill(mask == 0, -1e9)) fuses only with no mask added, as -inf entries under the fused op's
// score_floor = fill (floor_tie 0: no gradient at the fill, as Where gives), which gives the masked
// scores exactly the fill; and only where the fill is at most -1e6, so that a row the floor changes
// has a log-sum-exp the fill-row fix-ups take (kernels/cuda/limits.h). A fill of -1e4 stays unfused.
//
// Runs before autocast: the fused op is on the allow list (low-precision Q, K, V; FP32 softmax
// inside; the mask stays FP32). Head dims the target's fused attention does not take are left
// unfused (compiler/target.h: CUDA's kernels hold a whole head row in one tile).
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "compiler/ops/geometry.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "kernels/cpu/kernel.h"
#include "passes/attention_mask.h"
#include "passes/pass.h"

namespace ampc {
namespace {

const Node* producerOf(const Value* v, const char* op) {
  const Node* n = v ? v->producer() : nullptr;
  return n && n->domain().empty() && n->op() == op ? n : nullptr;
}
// The value of a constant scalar operand, or NaN.
double scalarConst(const Value* v) {
  const Tensor* t = v ? v->constData() : nullptr;
  if (!t || t->numel() != 1 || !isFloat(t->type.dtype)) return std::nan("");
  return t->getDouble(0);
}
// x * c or x / c with a scalar constant c (either side of Mul): the factor on x, and x.
bool scaleOf(const Graph& g, const Value* v, double& factor, Value*& x) {
  if (!singleUse(g, v)) return false;
  if (const Node* m = producerOf(v, "Mul")) {
    for (int i = 0; i < 2; ++i) {
      const double c = scalarConst(m->input(i));
      if (!std::isnan(c) && m->input(1 - i)->type().shape == v->type().shape) {
        factor = c;
        x = m->input(1 - i);
        return true;
      }
    }
  }
  if (const Node* d = producerOf(v, "Div")) {
    const double c = scalarConst(d->input(1));
    if (!std::isnan(c) && c != 0.0 && d->input(0)->type().shape == v->type().shape) {
      factor = 1.0 / c;
      x = d->input(0);
      return true;
    }
  }
  return false;
}

bool sameLeading(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return a.size() == b.size() && a.size() >= 2 && std::equal(a.begin(), a.end() - 2, b.begin());
}
// b's leading dims broadcast to a's (each equal or 1) without being the same: K and V of one head
// read by every query head through the product's broadcast (Falcon's multi-query attention).
bool broadcastLeading(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (a.size() != b.size() || a.size() < 2 || sameLeading(a, b)) return false;
  for (size_t i = 0; i + 2 < a.size(); ++i)
    if (b[i] != a[i] && b[i] != 1) return false;
  return true;
}
// A mask the fused op takes: one that broadcasts to the scores as attentionMaskMap says (per
// batch, per head, both or shared; [.., Tq, Tk] or a row [.., 1, Tk] for every query).
bool maskShapeOk(const std::vector<int64_t>& m, const std::vector<int64_t>& s) {
  AttentionMaskMap map;
  return s.size() >= 2 && attentionMaskMap(std::vector<int64_t>(s.begin(), s.end() - 2), s[s.size() - 2], s.back(), m, map);
}

struct Match {
  Node *qScale = nullptr, *kScale = nullptr, *scores = nullptr, *scale = nullptr, *add = nullptr, *softmax = nullptr, *cast = nullptr,
       *dropout = nullptr, *out = nullptr, *isNan = nullptr, *nanWhere = nullptr, *where = nullptr;
  Node *capMul = nullptr, *tanh = nullptr, *capScale = nullptr;  // soft-capping: cap * Tanh(S * f)
  Value *q = nullptr, *kt = nullptr, *v = nullptr, *mask = nullptr;
  double scale_ = 1.0, ratio = 0.0, softcap = 0.0;
  std::vector<Node*> down;  // the nodes between P and the product with V, in order: Identity (clone), Cast, Dropout
  std::vector<Node*> up;    // the no-op Casts and Identity nodes between the scores and the Softmax, nearest first
  // Attention written on [N, T, D] with the scores viewed as [B, H, T, T] around the softmax (BLOOM's
  // baddbmm, DeBERTa's bmm): the Reshape of the scores up to the Softmax's frame and the one of the
  // probabilities back; the product, its scale and `innerMask` (an Add below the first Reshape) are
  // in the inner frame. Null: one frame throughout.
  Node *reshapeUp = nullptr, *reshapeDown = nullptr, *innerAdd = nullptr;
  Value* innerMask = nullptr;
  // A mask added in another view of the scores, viewed back before the Softmax (torchvision's Swin:
  // [B nW, H, N, N] viewed as [B, nW, H, N, N] for the shifted-window mask [1, nW, 1, N, N], then back):
  // the view there, the Add, the view back; the product and the softmax share a frame.
  Node *sandwichTo = nullptr, *sandwichAdd = nullptr, *sandwichBack = nullptr;
  Value* sandwichMask = nullptr;
  // More masks added in the Softmax's frame (MPNet: its relative-position bias, then the padding
  // mask; MPT: ALiBi under the Where): summed with `mask` at rewrite.
  std::vector<Node*> moreAdds;
  std::vector<Value*> moreMasks;
  // No-op Casts and Identities between the masks' Adds: erased with the chain.
  std::vector<Node*> passThrough;
  // Masks subtracted, S - M (Funnel, XLNet: scores - 1e30 (1 - mask)): each taken as + Neg(M) at rewrite.
  std::set<const Value*> negated;
  // A scale above the added masks, (S + M) / c (CodeGen, GPT-J): the masks are scaled too at rewrite.
  Node* outerScale = nullptr;
  double maskFactor = 1.0;
  // K (and V) with leading dims of 1 where Q has heads, read through the product's broadcast: expanded
  // to Q's at rewrite (their gradients sum back through the Expand).
  bool broadcastKv = false;
  // A tensor scale [.., 1, 1] on the scores: Q is multiplied by it at rewrite.
  Value* qFactor = nullptr;
  // Fused only where cuDNN's SDPA runs it (head dims past the kernels'): its masks are brought to
  // the Softmax's view as before refinedMasks (cuDNN reads a mask per batch, head, both or shared,
  // no periodic one; the other views are not run on a GPU there).
  bool cudnnOnly = false;
  // max(S', c) over the masked scores, c a constant at most -1e30 (XGLM's and OPT's clamp at the
  // lowest float): the fused op's score_floor (floor_tie 1/2 where the Max shares ties, else 1).
  Node* floorNode = nullptr;
  double floor = 0.0;
  bool floorTiesShared = false;
  bool whereFloor = false;  // the Where's finite fill as score_floor (floor_tie 0), its entries -inf
  double fill = 0.0;       // with `where`: the value of its masked entries
  bool fillFirst = false;  // Where(c, fill, S) (masked_fill), else Where(c, S, fill)
  bool maskedOverWhere = false;  // with `where`: masks added over it (to its fill), not under
  // With `where`: how many of the Softmax frame's masks (`mask`, then `moreMasks`) were added over
  // it; the rest were added under it, to the scores it picks (MPT's ALiBi).
  size_t masksOverWhere = 0;
  // Its condition, not the causal one, as the fused op's where_masked operand (match, below).
  bool whereMaskedOperand = false;
  // With `where` and masks added over or under it: rows may hold the fill throughout, where only
  // the Where's entries get no gradient (where_causal or where_masked tells the fix-ups which).
  bool whereFillRows = false;
};
// Whether a Where condition c (Where(c, S, fill), or with fillFirst Where(c, fill, S)) may mask a
// row everywhere: computed (not known here), or a constant with such a row ([.., Tq or 1, Tk]).
bool whereMayMaskARow(const Value& c, bool fillFirst) {
  const Tensor* t = c.constData();
  if (!t) return true;
  const auto& sh = t->type.shape;
  const int64_t tk = sh.empty() ? 1 : sh.back();
  if (tk == 0) return false;
  for (int64_t r = 0; r * tk < t->numel(); ++r) {
    bool all = true;
    for (int64_t j = 0; j < tk && all; ++j) all = (t->getDouble(r * tk + j) != 0.0) == fillFirst;
    if (all) return true;
  }
  return false;
}

// Whether the match's mask is one cuDNN's fused SDPA reads (AttentionShape::maskForCudnn): none, or
// an added mask or a Where's condition computed from no parameter.
bool maskForCudnn(const Match& m) {
  for (const Value* mk : m.moreMasks)
    if (dependsOnParams(mk)) return false;
  return !(m.mask && dependsOnParams(m.mask)) && !(m.where && dependsOnParams(m.where->input(0))) &&
         !(m.innerMask && dependsOnParams(m.innerMask)) && !(m.sandwichMask && dependsOnParams(m.sandwichMask));
}

// A mask added to the scores in one view `frame` ([.., Tq, Tk]) seen in another, `outer`, with the
// same elements: the leading dims of the two are matched in groups whose products agree ([B, nW, H]
// against [B nW, H]: (B, nW) with (B nW), H with H). Per group the mask is 1 throughout (it stays 1
// in the outer view), the whole group (viewed as the outer dims), or partly broadcast (expanded over
// the group first). Returns the mask's shape in the outer view, and in `expand` the shape to expand
// it to first (empty: none); nullopt where the leading dims do not group.
std::optional<std::vector<int64_t>> maskInFrameShape(std::vector<int64_t> ms, const std::vector<int64_t>& frame,
                                                     const std::vector<int64_t>& outer, std::vector<int64_t>& expand) {
  if (ms.size() > frame.size() || frame.size() < 2 || outer.size() < 2) return std::nullopt;
  ms.insert(ms.begin(), frame.size() - ms.size(), 1);
  const size_t fl = frame.size() - 2, ol = outer.size() - 2;
  std::vector<int64_t> result, grown = ms;
  bool mixed = false;
  size_t i = 0, j = 0;
  while (i < fl || j < ol) {
    const size_t i0 = i, j0 = j;
    int64_t a = i < fl ? frame[i++] : 1, b = j < ol ? outer[j++] : 1;
    while (a != b) {
      if (a < b && i < fl) a *= frame[i++];
      else if (b < a && j < ol) b *= outer[j++];
      else return std::nullopt;
    }
    bool ones = true, whole = true;
    for (size_t k = i0; k < i; ++k) {
      ones = ones && ms[k] == 1;
      whole = whole && ms[k] == frame[k];
    }
    for (size_t k = j0; k < j; ++k) result.push_back(ones ? 1 : outer[k]);
    if (!ones && !whole) {
      mixed = true;
      for (size_t k = i0; k < i; ++k) grown[k] = frame[k];
    }
  }
  result.insert(result.end(), ms.end() - 2, ms.end());
  expand = mixed ? grown : std::vector<int64_t>{};
  return result;
}
// A Reshape that changes only the leading dims (the last two kept, the same elements): a view of the
// scores or probabilities in another frame ([N, Tq, Tk] <-> [B, H, Tq, Tk]).
bool leadingReshape(const Node* r) {
  if (!r || !r->domain().empty() || r->op() != "Reshape") return false;
  const auto &a = r->input(0)->type().shape, &b = r->result(0)->type().shape;
  return a.size() >= 3 && b.size() >= 3 && a[a.size() - 2] == b[b.size() - 2] && a.back() == b.back() &&
         r->input(0)->type().numel() == r->result(0)->type().numel();
}

// The scores' producers that the mask forms sit on: the product or its scaling.
bool scoresProducer(const Value* v) {
  const Node* p = v->producer();
  return p && p->domain().empty() && (p->op() == "MatMul" || p->op() == "Mul" || p->op() == "Div" || leadingReshape(p));
}
// The product itself, scaled by a scalar constant, or viewed (leadingReshape): surely the scores'
// side of an Add, where scoresProducer also takes any Mul, Div or view (a mask made by one).
bool productSide(const Value* v) {
  const Node* p = v->producer();
  if (!p || !p->domain().empty()) return false;
  if (p->op() == "MatMul") return true;
  if (leadingReshape(p)) return producerOf(p->input(0), "MatMul") != nullptr;
  if (p->op() != "Mul" && p->op() != "Div") return false;
  for (int i = 0; i < 2; ++i)
    if (!std::isnan(scalarConst(p->input(1 - i))) && (p->op() == "Mul" || i == 0) && producerOf(p->input(i), "MatMul")) return true;
  return false;
}
// Whether v is computed from a product through what the matcher passes on its way up (scalar
// scales, views, no-op Casts and Identity, Adds, a Where with a scalar fill, soft-capping's Tanh):
// which side of an Add the scores are, where both sides are made by such ops.
bool leadsToProduct(const Value* v, int depth = 8) {
  const Node* p = v ? v->producer() : nullptr;
  if (!p || !p->domain().empty() || depth == 0) return false;
  const std::string& op = p->op();
  if (op == "MatMul") return true;
  if (op == "Mul" || op == "Div") {
    for (int i = 0; i < 2; ++i)
      if (!std::isnan(scalarConst(p->input(1 - i))) && (op == "Mul" || i == 0)) return leadsToProduct(p->input(i), depth - 1);
    return false;
  }
  if (op == "Add") return leadsToProduct(p->input(0), depth - 1) || leadsToProduct(p->input(1), depth - 1);
  if (op == "Where" && p->numInputs() == 3) {
    for (int i = 1; i < 3; ++i)
      if (!std::isnan(scalarConst(p->input(3 - i)))) return leadsToProduct(p->input(i), depth - 1);
    return false;
  }
  if (op == "Cast" || op == "Identity" || op == "Tanh" || leadingReshape(p)) return leadsToProduct(p->input(0), depth - 1);
  return false;
}
// Where(c, S, fill) or Where(c, fill, S) on the scores s (shape ss), with a constant scalar fill at
// most -1e6 (above -1e30: only alone, as score_floor; matchAt checks): records it in m and returns S.
Value* matchWhereMask(const Graph& g, Value* s, const std::vector<int64_t>& ss, Match& m) {
  const Node* w = producerOf(s, "Where");
  if (!w || w->numInputs() != 3 || !singleUse(g, s) || w->input(0)->type().dtype != DType::boolean ||
      !maskShapeOk(w->input(0)->type().shape, ss))
    return nullptr;
  for (const int i : {1, 2}) {
    const double fill = scalarConst(w->input(i));
    Value* other = w->input(3 - i);
    if (std::isnan(fill) || !(fill <= -1e6) || other->type() != s->type() || !(scoresProducer(other) || leadsToProduct(other))) continue;
    m.where = const_cast<Node*>(w);
    m.fill = fill;
    m.fillFirst = i == 1;
    return other;
  }
  return nullptr;
}

// Max(X, c) or Max(c, X) on the scores s, c a scalar constant at most -1e30: X, and the floor
// recorded in m (where `record`); null where s is no such Max.
Value* matchFloor(const Graph& g, Value* s, Match& m, bool record) {
  const Node* mx = producerOf(s, "Max");
  if (!mx || mx->numInputs() != 2 || !singleUse(g, s) || m.floorNode) return nullptr;
  for (int i = 0; i < 2; ++i) {
    const double c = scalarConst(mx->input(i));
    Value* x = mx->input(1 - i);
    if (std::isnan(c) || !(c <= -1e30) || x->type() != s->type()) continue;
    if (record) {
      m.floorNode = const_cast<Node*>(mx);
      m.floor = c;
      m.floorTiesShared = mx->getInt(kTiesShared, 0) != 0;
    }
    return x;
  }
  return nullptr;
}

// cap * Tanh(S') (either side of the Mul), cap > 0 a scalar constant, S' = S * f or S / d (or S):
// records the soft-capping in m, folds cap f into the scale (cap tanh(scale' S / cap) with scale'
// = cap f), and returns S.
Value* matchSoftcap(const Graph& g, Value* s, Match& m) {
  const Node* mul = producerOf(s, "Mul");
  if (!mul || !singleUse(g, s)) return nullptr;
  for (int i = 0; i < 2; ++i) {
    const double cap = scalarConst(mul->input(i));
    Value* t = mul->input(1 - i);
    const Node* th = producerOf(t, "Tanh");
    if (std::isnan(cap) || !(cap > 0.0) || !std::isfinite(cap) || !th || !singleUse(g, t) || t->type() != s->type()) continue;
    Value* x = th->input(0);
    double f = 1.0;
    Value* inner = nullptr;
    if (scaleOf(g, x, f, inner)) {
      m.capScale = x->producer();
      x = inner;
    }
    if (!(f != 0.0) || !std::isfinite(f) || x->type() != s->type()) return nullptr;
    m.capMul = const_cast<Node*>(mul);
    m.tanh = const_cast<Node*>(th);
    m.softcap = cap;
    m.scale_ *= cap * f;
    return x;
  }
  return nullptr;
}

bool matchAt(const Graph& g, Node* sm, Match& m, const Target& target, DType compute) {
  if (!sm->domain().empty() || sm->op() != "Softmax" || sm->numInputs() != 1) return false;
  const auto& ss = sm->input(0)->type().shape;
  if (ss.size() < 2 || g.opset < 13) return false;
  const int64_t axis = sm->getInt("axis", -1);
  if (axis != -1 && axis != static_cast<int64_t>(ss.size()) - 1) return false;
  m.softmax = sm;
  Value* s = sm->input(0);
  // softmax(S, dtype=torch.float32) of f32 scores (transformers' eager attention): a Cast to the
  // scores' own dtype, or an Identity, in front of the Softmax. The fused softmax runs in f32 anyway.
  for (const Node* c = s->producer(); c && c->domain().empty() && singleUse(g, s) &&
                                      ((c->op() == "Cast" && c->input(0)->type().dtype == s->type().dtype) || (c->op() == "Identity" && !noGradOperands(*c)));
       c = s->producer()) {
    m.up.push_back(const_cast<Node*>(c));
    s = c->input(0);
  }
  // The masked scores clamped at a floor: max(S + M, lowest) (XGLM's, older OPT's), also in the
  // view of the sandwich below.
  if (Value* x = matchFloor(g, s, m, true)) s = x;
  // A mask added in another view of the scores, viewed back before the Softmax (torchvision's Swin:
  // the shifted-window mask [1, nW, 1, N, N] on the scores viewed as [B, nW, H, N, N]).
  if (const Node* back = s->producer(); leadingReshape(back) && singleUse(g, s)) {
    Value* x = back->input(0);
    Value* unfloored = matchFloor(g, x, m, false);
    if (unfloored) x = unfloored;
    const Node* add = producerOf(x, "Add");
    for (int i = 0; add && singleUse(g, x) && i < 2; ++i) {
      Value* to = add->input(1 - i);
      Value* mk = add->input(i);
      const Node* fwd = to->producer();
      if (!leadingReshape(fwd) || !singleUse(g, to) || fwd->input(0)->type().shape != ss || to->type().shape != x->type().shape ||
          !isFloat(mk->type().dtype))
        continue;
      std::vector<int64_t> expand;
      const auto seen = maskInFrameShape(mk->type().shape, x->type().shape, ss, expand);
      const auto both = broadcastShapes(mk->type().shape, x->type().shape);
      if (!both || *both != x->type().shape || !seen || !maskShapeOk(*seen, ss)) continue;
      if (unfloored) matchFloor(g, back->input(0), m, true);
      m.sandwichBack = const_cast<Node*>(back);
      m.sandwichAdd = const_cast<Node*>(add);
      m.sandwichTo = const_cast<Node*>(fwd);
      m.sandwichMask = mk;
      s = fwd->input(0);
      break;
    }
  }
  // (S + M) * f (or (S - M) * f): the scale taken here where an Add is under it; M becomes M * f at rewrite.
  {
    double f = 1.0;
    Value* x = nullptr;
    if (scaleOf(g, s, f, x) && (producerOf(x, "Add") || producerOf(x, "Sub")) && !m.sandwichAdd) {
      m.outerScale = s->producer();
      m.maskFactor = f;
      m.scale_ *= f;
      s = x;
    }
  }
  // + mask, any number of them. Of an Add's two sides the scores are the one that makes them (the
  // product, scaled or viewed: productSide), else the one that alone leads to the product
  // (leadsToProduct), else, for the first Add, the scores or a Where on them (transformers' eager
  // causal mask, then + its padding mask). T5's TorchScript export adds Where(mask, bias, fill) to
  // the product, whose Where side the last rule alone would take for the scores.
  auto takeAdd = [&](bool first) {
    // No-op Casts and Identities between the Adds (Funnel: (S + P + T).float() - M), skipped where
    // an Add or Sub lies under them.
    {
      Value* t = s;
      std::vector<Node*> skipped;
      for (const Node* c = t->producer(); c && c->domain().empty() && singleUse(g, t) &&
                                          ((c->op() == "Cast" && c->input(0)->type().dtype == t->type().dtype) || (c->op() == "Identity" && !noGradOperands(*c)));
           c = t->producer()) {
        skipped.push_back(const_cast<Node*>(c));
        t = c->input(0);
      }
      if (!skipped.empty() && (producerOf(t, "Add") || producerOf(t, "Sub"))) {
        m.passThrough.insert(m.passThrough.end(), skipped.begin(), skipped.end());
        s = t;
      }
    }
    const Node* sub = producerOf(s, "Sub");
    const Node* add = sub ? sub : producerOf(s, "Add");
    if (!add || !singleUse(g, s)) return false;
    for (int pass = 0; pass < 3; ++pass)
      for (int i = sub ? 1 : 0; i < 2; ++i) {  // S - M: the mask is the Sub's second operand
        Value* other = add->input(1 - i);
        Value* mk = add->input(i);
        if (other->type().shape != ss || !maskShapeOk(mk->type().shape, ss) || !isFloat(mk->type().dtype)) continue;
        const bool ok = pass == 0   ? productSide(other)
                        : pass == 1 ? leadsToProduct(other) && !leadsToProduct(mk)
                                    : first && (scoresProducer(other) || (producerOf(other, "Where") && mk->type().dtype == DType::f32));
        if (!ok) continue;
        if (sub) m.negated.insert(mk);
        if (!m.add) {
          m.add = const_cast<Node*>(add);
          m.mask = mk;
        } else {
          m.moreAdds.push_back(const_cast<Node*>(add));
          m.moreMasks.push_back(mk);
        }
        s = other;
        return true;
      }
    return false;
  };
  if (takeAdd(true))
    while (takeAdd(false)) {
    }
  // Where(c, S, fill): alone, or under the Add of an f32 mask (transformers' eager attention); and
  // masks added under it (MPT: Where(c, fill, S + ALiBi)), which rewrite takes into the Where.
  if (Value* inner = matchWhereMask(g, s, ss, m)) {
    m.maskedOverWhere = m.add || m.sandwichAdd;
    m.masksOverWhere = (m.mask ? 1 : 0) + m.moreMasks.size();
    s = inner;
    while (takeAdd(false)) {
    }
  } else if (m.add && !scoresProducer(s)) {
    return false;
  }
  if (m.outerScale && (!m.add || m.where)) return false;  // only added masks are scaled (a Where's fill would move)
  {  // the masks' sum broadcasts as the fused op reads a mask
    std::optional<std::vector<int64_t>> all;
    std::vector<const Value*> masks(m.moreMasks.begin(), m.moreMasks.end());
    if (m.mask) masks.push_back(m.mask);
    if (m.where) masks.push_back(m.where->input(0));
    for (const Value* mk : masks) all = all ? broadcastShapes(*all, mk->type().shape) : std::optional<std::vector<int64_t>>(mk->type().shape);
    if (all && (masks.size() > 1) && !maskShapeOk(*all, ss)) return false;
  }
  // [B, H, Tq, Tk] viewed from [N, Tq, Tk], and an additive mask in that frame (BLOOM's ALiBi,
  // DeBERTa's relative-position terms).
  if (const Node* r = s->producer(); leadingReshape(r) && singleUse(g, s) && !m.outerScale) {
    m.reshapeUp = const_cast<Node*>(r);
    s = r->input(0);
    const auto& inner = s->type().shape;
    if (const Node* add = producerOf(s, "Add"); add && singleUse(g, s)) {
      for (int i = 0; i < 2; ++i) {
        Value* other = add->input(1 - i);
        if (other->type().shape != inner || !scoresProducer(other) || !isFloat(add->input(i)->type().dtype)) continue;
        const auto ms = add->input(i)->type().shape;
        if (ms.size() > inner.size() || !broadcastShapes(ms, inner) || *broadcastShapes(ms, inner) != inner) continue;
        std::vector<int64_t> expand;
        const auto seen = maskInFrameShape(ms, inner, ss, expand);
        if (!seen || !maskShapeOk(*seen, ss)) continue;
        m.innerAdd = const_cast<Node*>(add);
        m.innerMask = add->input(i);
        s = other;
        break;
      }
    }
  }
  // soft-capping (before the scale: its outer Mul by cap would read as one)
  if (Value* inner = matchSoftcap(g, s, m)) s = inner;
  // * scale
  double f = 1.0;
  Value* x = nullptr;
  if (scaleOf(g, s, f, x)) {
    m.scale = s->producer();
    m.scale_ *= f;
    s = x;
  } else if (const Node* mul = producerOf(s, "Mul"); mul && singleUse(g, s) && !m.reshapeUp) {
    // A scale per head (or per batch) that is a tensor, [.., H, 1, 1]: Swin V2's trained logit
    // scale on its cosine scores. (Q K^T) t = (Q t) K^T: it moves onto Q, where its gradient follows.
    for (int i = 0; i < 2; ++i) {
      Value* t = mul->input(i);
      const auto& ts = t->type().shape;
      if (mul->input(1 - i)->type().shape != ss || !producerOf(mul->input(1 - i), "MatMul") || !isFloat(t->type().dtype) || ts.size() < 2 ||
          ts.size() > ss.size() || ts[ts.size() - 1] != 1 || ts[ts.size() - 2] != 1 || !broadcastShapes(ts, ss) || *broadcastShapes(ts, ss) != ss)
        continue;
      m.scale = const_cast<Node*>(mul);
      m.qFactor = t;
      s = mul->input(1 - i);
      break;
    }
  }
  const Node* mm = producerOf(s, "MatMul");
  if (!mm || !singleUse(g, s)) return false;
  m.scores = const_cast<Node*>(mm);
  m.q = mm->input(0);
  m.kt = mm->input(1);
  if (scaleOf(g, m.q, f, x)) {  // Q scaled before the product (PyTorch's MultiheadAttention)
    m.qScale = m.q->producer();
    m.scale_ *= f;
    m.q = x;
  }
  if (scaleOf(g, m.kt, f, x)) {  // KT scaled too (the dynamo exporter's SDPA: sqrt(scale) on each side)
    m.kScale = m.kt->producer();
    m.scale_ *= f;
    m.kt = x;
  }
  const auto &qs = m.q->type().shape, &ks = m.kt->type().shape;
  const auto& inner = m.reshapeUp ? m.reshapeUp->input(0)->type().shape : ss;
  m.broadcastKv = broadcastLeading(qs, ks) && !m.reshapeUp;
  if (!(sameLeading(qs, ks) || m.broadcastKv) || !sameLeading(qs, inner) || m.q->type().dtype != m.kt->type().dtype ||
      (m.qFactor && m.qFactor->type().dtype != m.q->type().dtype))
    return false;
  // downstream: Dropout? then the product with V
  Value* p = sm->result(0);
  // Where(IsNaN(P), 0, P): the dynamo exporter's SDPA (and the TorchScript exports of transformers'
  // models) make a row with every score -inf (a padded query) give probabilities 0 rather than
  // NaN. The fused node does that with zero_empty_rows.
  if (p->uses().size() == 2 && !g.isOutput(p)) {
    Node *isNan = nullptr, *where = nullptr;
    for (const Use& u : p->uses()) {
      if (u.user->domain().empty() && u.user->op() == "IsNaN") isNan = u.user;
      else if (u.user->domain().empty() && u.user->op() == "Where" && u.operand == 2) where = u.user;
    }
    if (!isNan || !where || !singleUse(g, isNan->result(0)) || where->input(0) != isNan->result(0) || scalarConst(where->input(1)) != 0.0 ||
        where->result(0)->type() != p->type())
      return false;
    m.isNan = isNan;
    m.nanWhere = where;
    p = where->result(0);
  }
  if (!singleUse(g, p)) return false;
  Node* user = p->uses()[0].user;
  // Identity nodes on the way (torch.export's clone of the probabilities): passed through, unless
  // one stops the gradient (a detach(): the fused op's backward would not). So is a view there and
  // back to the same shape (XGLM's attn_weights.view(B, H, T, T).view(B H, T, T)).
  auto skipIdentities = [&]() {
    for (;;) {
      if (user->domain().empty() && user->op() == "Identity" && !noGradOperands(*user) && singleUse(g, user->result(0))) {
        m.down.push_back(user);
        p = user->result(0);
        user = p->uses()[0].user;
        continue;
      }
      if (leadingReshape(user) && singleUse(g, user->result(0))) {
        Node* back = user->result(0)->uses()[0].user;
        if (leadingReshape(back) && back->result(0)->type() == p->type() && singleUse(g, back->result(0))) {
          m.down.push_back(user);
          m.down.push_back(back);
          p = back->result(0);
          user = p->uses()[0].user;
          continue;
        }
      }
      return;
    }
  };
  skipIdentities();
  // Casts to the probabilities' own dtype (transformers casts them to V's dtype, and the TorchScript
  // exporter writes softmax's dtype as a Cast after it): identities.
  while (user->domain().empty() && user->op() == "Cast" && user->result(0)->type().dtype == p->type().dtype) {
    m.cast = user;
    m.down.push_back(user);
    p = user->result(0);
    if (!singleUse(g, p)) return false;
    user = p->uses()[0].user;
    skipIdentities();
  }
  if (user->domain().empty() && user->op() == "Dropout") {
    const double ratio = user->numInputs() > 1 ? scalarConst(user->input(1)) : 0.5;
    const Tensor* mode = user->numInputs() > 2 && user->input(2) ? user->input(2)->constData() : nullptr;
    if (std::isnan(ratio) || (user->numInputs() > 2 && user->input(2) && !mode)) return false;
    if (user->numResults() > 1 && (!user->result(1)->uses().empty() || g.isOutput(user->result(1)))) return false;
    const bool training = mode && mode->getInt(0) != 0;
    if (training && (ratio < 0.0 || ratio >= 1.0)) return false;
    m.dropout = user;
    m.down.push_back(user);
    m.ratio = training ? ratio : 0.0;
    p = user->result(0);
    if (!singleUse(g, p)) return false;
    user = p->uses()[0].user;
    skipIdentities();
  }
  // The probabilities viewed back in the product's frame.
  if (m.reshapeUp) {
    if (!leadingReshape(user) || user->result(0)->type().shape != inner) return false;
    m.reshapeDown = user;
    m.down.push_back(user);
    p = user->result(0);
    if (!singleUse(g, p)) return false;
    user = p->uses()[0].user;
  }
  if (!user->domain().empty() || user->op() != "MatMul" || user->input(0) != p) return false;
  m.out = user;
  m.v = user->input(1);
  const auto& vs = m.v->type().shape;
  if (!(sameLeading(qs, vs) || (m.broadcastKv && broadcastLeading(qs, vs))) || m.v->type().dtype != m.q->type().dtype) return false;
  // The masks are summed into one at rewrite: one dtype (a Where's additive form is f32).
  std::optional<DType> maskType;
  std::vector<const Value*> allMasks{m.mask, m.innerMask, m.sandwichMask};
  allMasks.insert(allMasks.end(), m.moreMasks.begin(), m.moreMasks.end());
  for (const Value* mk : allMasks)
    if (mk && maskType.value_or(mk->type().dtype) != mk->type().dtype) return false;
    else if (mk) maskType = mk->type().dtype;
  if (m.where && maskType.value_or(DType::f32) != DType::f32) return false;
  // A Where with a finite fill and no mask added: a row it masks everywhere is uniform, and Where
  // gives the scores no gradient there; the additive form (s + fill is fill) gives the values but
  // the scores' gradient too. So its masked entries become -inf under score_floor = fill with
  // floor_tie 0: the floor makes the row uniform, and each entry, below the floor, gets none. Only
  // where the condition may mask a row everywhere (not the constant causal one: nothing changes
  // there). With masks added over it (to its fill: transformers' eager attention, Where then + a
  // padding mask) the additive form stays, and in a row the two mask everywhere together the entries
  // the Where masked must get no gradient, those the added mask masked theirs: one summed mask
  // cannot tell them apart. The same with masks added under it in the Softmax's frame (MPT's ALiBi,
  // a padding mask under a causal Where: a row whose every allowed key is padding holds the fill
  // throughout, and only the allowed entries give their scores a gradient); rewrite takes such
  // masks into the Where, s + Where(c, M, fill), which is the Where's value exactly (s + fill is fill).
  // Where the condition is the causal one (known ahead of the step) rewrite marks it where_causal
  // and the fix-ups tell them apart by the diagonal. Any other condition (a window, one computed
  // from the inputs) becomes the fused op's where_masked operand, which the fix-ups read (on the CPU
  // and in fillRowsBackwardKernel), where the masks are all in the Softmax's frame; else it stays
  // unfused. Masks under the Where in another frame (BLOOM's ALiBi below its
  // view of the scores) keep the additive form: a row the Where masks everywhere there still gives
  // the scores a gradient (tools/bench/NOTES.md, stops 65, 68, 69 and 70).
  const bool aloneWhere = m.where && !m.add && m.moreMasks.empty() && !m.innerMask && !m.sandwichMask && !m.floorNode && !m.outerScale;
  if (m.where && m.fill > -1e30 && !aloneWhere) return false;  // s + fill is not fill: the floor form only
  const bool maskedUnderWhere = m.where && (m.mask ? 1u : 0u) + m.moreMasks.size() > m.masksOverWhere;
  m.whereFillRows = m.where && std::isfinite(m.fill) && (m.maskedOverWhere || maskedUnderWhere);
  if (m.whereFillRows) {
    const auto& ss = m.softmax->input(0)->type().shape;
    if (!isCausalCondition(m.where->input(0), m.fillFirst, ss[ss.size() - 2], ss.back())) {
      // in the Softmax's frame only (the operand has the summed mask's shape)
      if (m.reshapeUp || m.sandwichMask || m.innerMask || m.outerScale) return false;
      m.whereMaskedOperand = true;
    }
  }
  if (aloneWhere && std::isfinite(m.fill) && (m.fill > -1e30 || whereMayMaskARow(*m.where->input(0), m.fillFirst))) m.whereFloor = true;
  AttentionShape shape{isLowFloat(m.q->type().dtype) || isLowFloat(compute), qs.back(), vs.back(), ks.back(), m.ratio > 0.0};
  shape.softcap = m.softcap > 0.0;
  if (target.fusesAttention(shape)) return true;
  shape.maskForCudnn = true;  // would the target take it with a mask cuDNN reads?
  m.cudnnOnly = true;
  return target.fusesAttention(shape) && maskForCudnn(m);
}

std::string dirOf(const std::string& name) {
  const auto slash = name.rfind('/');
  return slash == std::string::npos ? "" : name.substr(0, slash + 1);
}

// The additive forms made so far, per condition, fill and polarity: every layer of a model
// masks with the same condition (CSE has merged the exporter's copies), so one mask serves all.
using MaskCache = std::map<std::tuple<const Value*, double, bool>, Value*>;
// An inner-frame mask in the Softmax's frame, and the sum of two masks, made once for every layer
// that reads the same values (BLOOM's ALiBi and causal mask are each one value for all layers, after
// CSE): one [B, H, T, T] sum kept for the backward, not one per layer.
struct SumCache {
  std::map<std::pair<const Value*, std::vector<int64_t>>, Value*> views;  // by the mask and the view it was added in
  std::map<std::pair<const Value*, const Value*>, Value*> sums;
  std::map<std::pair<std::vector<const Value*>, std::vector<int64_t>>, Value*> refined;  // refinedMasks' sums, by the masks and the view
  std::map<const Value*, Value*> negated;  // signedMask's -M, by M
  std::map<std::tuple<const Value*, bool, std::vector<int64_t>>, Value*> whereMasked;  // by condition, polarity and shape
  std::map<std::tuple<const Value*, const Value*, double, bool>, Value*> wheres;  // maskUnderWhere's, by condition, masks, fill, polarity
};

// The masks added under the Where (their sum M) taken into it: Where(c, M, fill) (or Where(c, fill,
// M)), f32, so that S + it is the Where's value of S + M exactly (S + fill is fill at a fill of at
// most -1e30), its gradient reaching M only where the Where picked it.
Value* maskUnderWhere(Graph& g, const Match& m, Value* under, SumCache& sums) {
  Value* c = m.where->input(0);
  Value*& made = sums.wheres[{c, under, m.fill, m.fillFirst}];
  if (made) return made;
  const std::string base = dirOf(m.where->name()) + "where_over_masks";
  if (under->type().dtype != DType::f32) {
    Node* n = g.createNode("Cast", "", {under}, {{g.uniqueName(base + ".f32"), TensorType{DType::f32, under->type().shape}}}, m.out);
    n->setAttr("to", static_cast<int64_t>(1));
    n->setName(base + "_f32");
    under = n->result(0);
  }
  Value* f = g.addConst(g.uniqueName(base + ".fill"), Tensor::fromDoubles(DType::f32, {}, {m.fill}));
  Node* n = g.createNode("Where", "", {c, m.fillFirst ? f : under, m.fillFirst ? under : f},
                         {{g.uniqueName(base), TensorType{DType::f32, *broadcastShapes(c->type().shape, under->type().shape)}}}, m.out);
  n->setName(base);
  return made = n->result(0);
}

// A subtracted mask M (Match::negated) as the added -M, made once for every layer that subtracts it.
void signedMask(Graph& g, const Match& m, Value*& mk, SumCache& sums) {
  if (!mk || !m.negated.count(mk)) return;
  Value*& neg = sums.negated[mk];
  if (!neg) {
    Node* n = g.createNode("Neg", "", {mk}, {{g.uniqueName(mk->name() + ".negated"), mk->type()}}, m.out);
    n->setName(dirOf(m.softmax->name()) + "mask_negated");
    neg = n->result(0);
  }
  mk = neg;
}

// The additive form of the Where mask (c's shape, f32).
Value* additiveMask(Graph& g, const Match& m, MaskCache& cache) {
  Value* c = m.where->input(0);
  const double keep = 0.0, fill = m.whereFloor ? -INFINITY : m.fill;  // (whereFloor: the fill is the op's floor)
  Value*& cached = cache[{c, fill, m.fillFirst}];
  const std::string base = dirOf(m.where->name()) + "where_mask";
  if (!cached) {
    if (const Tensor* ct = c->constData()) {  // a constant condition (a causal buffer): a constant mask
      Tensor t(TensorType{DType::f32, c->type().shape});
      for (int64_t e = 0; e < t.numel(); ++e) t.setDouble(e, (ct->getInt(e) != 0) == m.fillFirst ? fill : keep);
      cached = g.addConst(g.uniqueName(base), std::move(t));
    } else {
      Value* zero = g.addConst(g.uniqueName(base + ".zero"), Tensor::fromDoubles(DType::f32, {}, {keep}));
      Value* f = g.addConst(g.uniqueName(base + ".fill"), Tensor::fromDoubles(DType::f32, {}, {fill}));
      Node* n = g.createNode("Where", "", {c, m.fillFirst ? f : zero, m.fillFirst ? zero : f},
                             {{g.uniqueName(base), TensorType{DType::f32, c->type().shape}}}, m.out);
      n->setName(base);
      cached = n->result(0);
    }
  }
  return cached;
}

// The entries the Where masked (true where it picked the fill), of the summed mask's shape `to`: the
// fused op's where_masked operand, made once for every layer that masks with the same condition.
Value* whereMaskedOperand(Graph& g, const Match& m, const std::vector<int64_t>& to, SumCache& sums) {
  Value* c = m.where->input(0);
  Value*& made = sums.whereMasked[{c, m.fillFirst, to}];
  if (made) return made;
  const std::string base = dirOf(m.where->name()) + "where_masked";
  Value* v = c;
  if (!m.fillFirst) {  // Where(c, S, fill): masked where c is false
    Node* n = g.createNode("Not", "", {c}, {{g.uniqueName(base + ".not"), c->type()}}, m.out);
    n->setName(base + "_not");
    v = n->result(0);
  }
  if (v->type().shape != to) {
    Value* k = g.addConst(g.uniqueName(base + ".shape"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(to.size())}, to));
    Node* e = g.createNode("Expand", "", {v, k}, {{g.uniqueName(base), TensorType{DType::boolean, to}}}, m.out);
    e->setName(base);
    v = e->result(0);
  }
  return made = v;
}

// v viewed with the leading dims `lead` (its last two kept), by a Reshape before `at`.
Value* withLeading(Graph& g, Value* v, const std::vector<int64_t>& lead, Node* at, const std::string& base) {
  std::vector<int64_t> shape = lead;
  const auto& s = v->type().shape;
  const size_t r = s.size();
  if (r >= 2) shape.insert(shape.end(), s.end() - 2, s.end());
  if (shape == s) return v;
  Value* k = g.addConst(g.uniqueName(base + ".shape"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(shape.size())}, shape));
  Node* n = g.createNode("Reshape", "", {v, k}, {{g.uniqueName(v->name() + ".heads"), TensorType{v->type().dtype, shape}}}, at);
  n->setName(base);
  return n->result(0);
}

// `mask`, added in the view `frame` of the scores, in the Softmax's view `outer` (maskInFrameShape):
// expanded over a partly broadcast group of dims first, then viewed.
Value* maskInFrame(Graph& g, Value* mask, const std::vector<int64_t>& frame, const std::vector<int64_t>& outer, Node* at,
                   const std::string& base) {
  std::vector<int64_t> expand;
  const auto shape = *maskInFrameShape(mask->type().shape, frame, outer, expand);
  Value* v = mask;
  if (!expand.empty()) {
    Value* k = g.addConst(g.uniqueName(base + ".expand"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(expand.size())}, expand));
    Node* e = g.createNode("Expand", "", {v, k}, {{g.uniqueName(base + ".whole"), TensorType{v->type().dtype, expand}}}, at);
    e->setName(base + "_expand");
    v = e->result(0);
  }
  return withLeading(g, v, std::vector<int64_t>(shape.begin(), shape.end() - 2), at, base + "_view");
}

// The common refinement of several frames' leading dims with one element count: the dims between
// every cut (running product) of any of them, ([B nW, H] and [B, nW, H]: [B, nW, H]). None where a
// cut does not divide the next, ([6, 4] and [4, 6]).
std::optional<std::vector<int64_t>> commonRefinement(const std::vector<std::vector<int64_t>>& leads) {
  std::set<int64_t> cuts;
  std::optional<int64_t> total;
  for (const auto& l : leads) {
    int64_t c = 1;
    for (int64_t x : l) {
      if (x <= 0) return std::nullopt;
      cuts.insert(c *= x);
    }
    if (total.value_or(c) != c) return std::nullopt;
    total = c;
  }
  std::vector<int64_t> r;
  int64_t prev = 1;
  for (int64_t c : cuts) {
    if (c == 1) continue;
    if (c % prev != 0) return std::nullopt;
    r.push_back(c / prev);
    prev = c;
  }
  return r;
}

// Masks added in other views of the scores (the sandwich's, the product's) beside `mask` (the
// Softmax's view's sum, if any), summed where each is small. A mask alone in another view ([B, 1,
// T, T] added on the scores [B H, T, T] viewed as [B, H, T, T]: XGLM's, older OPT's) is read in
// that view, not expanded over the heads. Expanded into the Softmax's view, Swin's
// shifted-window mask [1, nW, 1, N, N] plus its relative-position bias [1, H, N, N] is a tensor of
// every score, [B nW, H, N, N] in f32 (112 MiB at Swin-T's first stage, batch 64), read and
// written again by the backward. In the views' common refinement [B, nW, H] no mask needs
// expanding (each dim of a view is 1 or whole in each mask), and their sum is [1, nW, H, N, N]; the
// attention then stays in the Softmax's view and reads that sum as a periodic mask [1, nW H, N, N]
// (compiler/ops/geometry.h: slice n % (nW H), one per window and head, read by every image), or
// runs in a view with two leading dims that the sum broadcasts to, Q, KT and V viewed there.
// Returns the sum and the attention's leading dims, or none where no such view exists (each mask
// then goes to the Softmax's view as before).
std::optional<std::pair<Value*, std::vector<int64_t>>> refinedMasks(Graph& g, const Match& m, Value* mask, SumCache& sums) {
  const auto& ss = m.softmax->result(0)->type().shape;
  std::vector<std::pair<Value*, std::vector<int64_t>>> framed;  // each mask and the full shape of the view it is added in
  if (mask) framed.emplace_back(mask, ss);
  if (m.innerMask) framed.emplace_back(m.innerMask, m.reshapeUp->input(0)->type().shape);
  if (m.sandwichMask) framed.emplace_back(m.sandwichMask, m.sandwichTo->result(0)->type().shape);
  if ((!m.innerMask && !m.sandwichMask) || m.cudnnOnly) return std::nullopt;
  if (const char* e = std::getenv("AMPC_EXP_NO_REFINED"); e && e[0] == '1') return std::nullopt;
  std::vector<std::vector<int64_t>> leads;
  for (const auto& [mk, frame] : framed) leads.emplace_back(frame.begin(), frame.end() - 2);
  const auto refined = commonRefinement(leads);
  if (!refined || refined->empty()) return std::nullopt;
  const int64_t tq = ss[ss.size() - 2], tk = ss.back();
  auto full = [&](std::vector<int64_t> lead) {
    lead.push_back(tq);
    lead.push_back(tk);
    return lead;
  };
  const std::vector<int64_t> rf = full(*refined);
  // Each mask in the refinement, and their broadcast shape there.
  std::vector<std::vector<int64_t>> shapes;
  std::optional<std::vector<int64_t>> all;
  for (const auto& [mk, frame] : framed) {
    std::vector<int64_t> expand;
    const auto seen = maskInFrameShape(mk->type().shape, frame, rf, expand);
    if (!seen || !expand.empty()) return std::nullopt;
    all = all ? broadcastShapes(*all, *seen) : seen;
    if (!all) return std::nullopt;
    shapes.push_back(*seen);
  }
  // The sum, built once per set of masks and view, viewed with the leading dims `maskLead`.
  auto build = [&](const std::vector<int64_t>& attnLead, const std::vector<int64_t>& maskLead) {
    Value*& sum = sums.refined[{std::vector<const Value*>{framed[0].first, m.innerMask, m.sandwichMask}, full(attnLead)}];
    if (!sum) {
      const std::string base = dirOf(m.softmax->name());
      Value* acc = nullptr;
      for (size_t i = 0; i < framed.size(); ++i) {
        Value* v = withLeading(g, framed[i].first, std::vector<int64_t>(shapes[i].begin(), shapes[i].end() - 2), m.out, base + "mask_refined");
        if (acc) {
          const auto both = *broadcastShapes(acc->type().shape, v->type().shape);
          Node* n = g.createNode("Add", "", {acc, v}, {{g.uniqueName(m.out->result(0)->name() + ".masks"), TensorType{acc->type().dtype, both}}}, m.out);
          n->setName(base + "masks_sum");
          v = n->result(0);
        }
        acc = v;
      }
      sum = withLeading(g, acc, maskLead, m.out, base + "masks_view");
    }
    return std::make_pair(sum, attnLead);
  };
  // The attention's view, where the sum is seen without expanding and the fused op reads it
  // (attentionMaskMap): the Softmax's, broadcast as ONNX does; else the Softmax's with the sum as a
  // periodic mask (one run of the refinement's dims, the Softmax's whole dims after it: the
  // operands keep their view, and the CUDA target reads and writes them in place); else two leading
  // dims split from the refinement.
  const std::vector<int64_t> outerLead(ss.begin(), ss.end() - 2);
  {
    std::vector<int64_t> expand;
    const auto seen = maskInFrameShape(*all, rf, ss, expand);
    if (seen && expand.empty() && maskShapeOk(*seen, ss)) return build(outerLead, std::vector<int64_t>(seen->begin(), seen->end() - 2));
  }
  {
    const size_t R = refined->size();
    size_t first = R, last = 0;
    for (size_t k = 0; k < R; ++k)
      if ((*all)[k] != 1) first = std::min(first, k), last = k + 1;
    int64_t period = 1, div = 1, tail = 1;
    bool run = first < last;
    for (size_t k = first; k < last && run; ++k) run = (*all)[k] == (*refined)[k], period *= (*refined)[k];
    for (size_t k = last; k < R; ++k) div *= (*refined)[k];
    size_t t = 0;  // the Softmax's last t leading dims make `div`
    while (run && tail < div && t < outerLead.size()) tail *= outerLead[outerLead.size() - 1 - t++];
    if (run && tail == div && t < outerLead.size()) {
      std::vector<int64_t> maskLead(outerLead.size() - 1 - t, 1);  // [1.., P, 1..], as many dims as the scores' lead
      maskLead.push_back(period);
      maskLead.insert(maskLead.end(), t, 1);
      AttentionMaskMap map;
      std::vector<int64_t> shape = maskLead;
      shape.insert(shape.end(), all->end() - 2, all->end());
      if (attentionMaskMap(outerLead, tq, tk, shape, map) && map.div == div && map.mod == period) return build(outerLead, maskLead);
    }
  }
  for (size_t k = 1; k < refined->size(); ++k) {
    int64_t a = 1, b = 1;
    for (size_t i = 0; i < refined->size(); ++i) (i < k ? a : b) *= (*refined)[i];
    const std::vector<int64_t> lead{a, b};
    std::vector<int64_t> expand;
    const auto seen = maskInFrameShape(*all, rf, full(lead), expand);
    if (seen && expand.empty() && maskShapeOk(*seen, full(lead))) return build(lead, std::vector<int64_t>(seen->begin(), seen->end() - 2));
  }
  return std::nullopt;
}

void rewrite(Graph& g, const Match& matched, MaskCache& cache, SumCache& sums) {
  Match m = matched;
  signedMask(g, m, m.mask, sums);
  for (Value*& mk : m.moreMasks) signedMask(g, m, mk, sums);
  Value* old = m.out->result(0);
  const std::string oldName = old->name();
  std::vector<Value*> ins{m.q, m.kt, m.v};
  const auto& ss = m.softmax->result(0)->type().shape;
  const std::vector<int64_t> outerLead(ss.begin(), ss.end() - 2);
  if (m.qFactor) {  // (Q K^T) t = (Q t) K^T
    const auto both = broadcastShapes(ins[0]->type().shape, m.qFactor->type().shape);
    Node* n = g.createNode("Mul", "", {ins[0], m.qFactor}, {{g.uniqueName(ins[0]->name() + ".scaled"), TensorType{ins[0]->type().dtype, *both}}}, m.out);
    n->setName(dirOf(m.scale->name()) + "q_scaled");
    ins[0] = n->result(0);
  }
  if (m.broadcastKv)  // one K and V for several query heads: expanded to Q's heads
    for (size_t i = 1; i < 3; ++i) {
      std::vector<int64_t> to(m.q->type().shape.begin(), m.q->type().shape.end() - 2);
      to.insert(to.end(), ins[i]->type().shape.end() - 2, ins[i]->type().shape.end());
      if (to == ins[i]->type().shape) continue;
      const std::string base = dirOf(m.softmax->name()) + (i == 1 ? "kv_heads_k" : "kv_heads_v");
      Value* k = g.addConst(g.uniqueName(base + ".shape"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(to.size())}, to));
      Node* e = g.createNode("Expand", "", {ins[i], k}, {{g.uniqueName(ins[i]->name() + ".heads"), TensorType{ins[i]->type().dtype, to}}}, m.out);
      e->setName(base);
      ins[i] = e->result(0);
    }
  // The Softmax frame's masks in the order they were matched (from the Softmax up), each with its Add.
  std::vector<Value*> masks;
  std::vector<const Node*> adds;
  if (m.mask) masks.push_back(m.mask), adds.push_back(m.add);
  masks.insert(masks.end(), m.moreMasks.begin(), m.moreMasks.end());
  adds.insert(adds.end(), m.moreAdds.begin(), m.moreAdds.end());
  auto sumOf = [&](Value* a, Value* b, const Node* at) {
    Value*& sum = sums.sums[{a, b}];
    if (!sum) {
      Node* n = g.createNode("Add", "", {a, b},
                             {{g.uniqueName(oldName + ".masks"), TensorType{a->type().dtype, *broadcastShapes(a->type().shape, b->type().shape)}}}, m.out);
      n->setName(dirOf(at->name()) + "masks_sum");
      sum = n->result(0);
    }
    return sum;
  };
  Value* mask = nullptr;
  const size_t over = m.where ? m.masksOverWhere : masks.size();
  if (m.where) {
    if (masks.size() > over) {  // masks under the Where: into it
      Value* under = masks[over];
      for (size_t k = over + 1; k < masks.size(); ++k) under = sumOf(under, masks[k], adds[k]);
      mask = maskUnderWhere(g, m, under, sums);
    } else {
      mask = additiveMask(g, m, cache);
    }
  }
  for (size_t k = 0; k < over; ++k) mask = mask ? sumOf(mask, masks[k], adds[k]) : masks[k];
  if (mask && m.outerScale) {  // (S + M) f = S f + M f
    Value* f = g.addConst(g.uniqueName(oldName + ".mask_factor"), Tensor::fromDoubles(mask->type().dtype, {}, {m.maskFactor}));
    Node* n = g.createNode("Mul", "", {mask, f}, {{g.uniqueName(oldName + ".mask_scaled"), mask->type()}}, m.out);
    n->setName(dirOf(m.outerScale->name()) + "mask_scaled");
    mask = n->result(0);
  }
  // Masks added in another view of the scores: the product's (below reshapeUp) and the sandwich's.
  // Summed where they are small, in the views' common refinement, where that has a frame of the
  // attention that the sum broadcasts to (refinedMasks); else each brought to the Softmax's view.
  std::vector<int64_t> lead = outerLead;
  if (auto r = refinedMasks(g, m, mask, sums)) {
    mask = r->first;
    lead = r->second;
  } else {
    const std::vector<std::tuple<Value*, std::vector<int64_t>, const Node*>> framed = {
        {m.innerMask, m.reshapeUp ? m.reshapeUp->input(0)->type().shape : std::vector<int64_t>{}, m.innerAdd},
        {m.sandwichMask, m.sandwichTo ? m.sandwichTo->result(0)->type().shape : std::vector<int64_t>{}, m.sandwichAdd}};
    for (const auto& [extra, frame, add] : framed) {
      if (!extra) continue;
      Value*& im = sums.views[{extra, frame}];
      if (!im) im = maskInFrame(g, extra, frame, ss, m.out, dirOf(add->name()) + "framed_mask");
      if (mask) {
        Value*& sum = sums.sums[{mask, im}];
        if (!sum) {
          const auto both = broadcastShapes(mask->type().shape, im->type().shape);
          Node* n = g.createNode("Add", "", {mask, im}, {{g.uniqueName(oldName + ".masks"), TensorType{mask->type().dtype, *both}}}, m.out);
          n->setName(dirOf(m.softmax->name()) + "masks_sum");
          sum = n->result(0);
        }
        mask = sum;
      } else {
        mask = im;
      }
    }
  }
  if (lead != outerLead || m.reshapeUp)  // Q, KT and V viewed in the attention's frame
    for (size_t i = 0; i < 3; ++i) ins[i] = withLeading(g, ins[i], lead, m.out, dirOf(m.softmax->name()) + "attention_view" + std::to_string(i));
  if (mask) ins.push_back(mask);
  if (m.whereMaskedOperand) ins.push_back(whereMaskedOperand(g, m, mask->type().shape, sums));
  std::vector<int64_t> outShape = lead;
  outShape.push_back(ss[ss.size() - 2]);
  outShape.push_back(m.v->type().shape.back());
  const TensorType fusedType{old->type().dtype, outShape};
  Node* a = g.createNode("Attention", kGradDomain, ins,
                         {{g.uniqueName(oldName + ".fused"), fusedType},
                          {g.uniqueName(oldName + ".lse"), TensorType{DType::f32, std::vector<int64_t>(ins[0]->type().shape.begin(), ins[0]->type().shape.end() - 1)}}},
                         m.out);
  a->setName(dirOf(m.softmax->name()) + "Attention");
  a->setAttr("scale", static_cast<float>(m.scale_));
  if (m.softcap > 0.0) a->setAttr("softcap", static_cast<float>(m.softcap));
  // The floor changes rows masked everywhere alone: with no mask none is, and max(S, floor) is S.
  if (m.floorNode && a->numInputs() > 3 && a->input(3)) {
    a->setAttr("score_floor", static_cast<float>(m.floor));
    a->setAttr("floor_tie", m.floorTiesShared ? 0.5f : 1.0f);
  } else if (m.whereFloor && a->numInputs() > 3 && a->input(3)) {
    a->setAttr("score_floor", static_cast<float>(m.fill));
    a->setAttr("floor_tie", 0.0f);
  }
  if (m.nanWhere) a->setAttr("zero_empty_rows", static_cast<int64_t>(1));
  // A Where with a finite fill and masks added over it (transformers' eager attention in GPT-2's
  // form: Where(causal, S, finfo.min) + padding) or under it (MPT's order): in a row masked
  // everywhere the entries the Where masks and those the masks mask all hold the fill, and only the
  // latter give their scores a gradient. One summed mask cannot tell them apart: under the causal condition where_causal tells
  // the fill-row fix-ups the Where's entries (above the diagonal), under any other the where_masked
  // operand does.
  if (m.whereFillRows && !m.whereMaskedOperand) a->setAttr("where_causal", static_cast<int64_t>(1));
  if (m.ratio > 0.0) {
    a->setAttr("dropout_ratio", static_cast<float>(m.ratio));
    a->setAttr("dropout_key", static_cast<int64_t>(cpu::dropoutNodeKey(*m.dropout)));
    if (m.dropout->hasAttr("seed")) a->setAttr("seed", m.dropout->getInt("seed", 0));
  }
  auto types = inferTypes(*a);
  for (size_t i = 0; i < a->numResults(); ++i) a->result(i)->setType(types[i]);
  Value* result = a->result(0);
  if (fusedType.shape != old->type().shape) {  // back in the product's frame ([N, Tq, Dv] below reshapeUp)
    const auto& os = old->type().shape;
    result = withLeading(g, result, std::vector<int64_t>(os.begin(), os.end() - 2), m.out, dirOf(m.softmax->name()) + "attention_flat");
  }
  old->replaceAllUsesWith(result);
  g.eraseNode(m.out);
  for (auto it = m.down.rbegin(); it != m.down.rend(); ++it) g.eraseNode(*it);
  for (Node* n : {m.nanWhere, m.isNan, m.softmax})
    if (n) g.eraseNode(n);
  for (Node* n : m.up) g.eraseNode(n);
  // The chain up from the product, readers before what they read (the extra Adds sit above or
  // below the Where): each erased once nothing reads it.
  std::vector<Node*> chain{m.floorNode, m.outerScale, m.sandwichBack, m.sandwichAdd, m.sandwichTo, m.add, m.where, m.reshapeUp, m.innerAdd, m.capMul, m.tanh, m.capScale, m.scale,
                           m.scores, m.qScale, m.kScale};
  chain.insert(chain.end(), m.moreAdds.begin(), m.moreAdds.end());
  chain.insert(chain.end(), m.passThrough.begin(), m.passThrough.end());
  std::erase(chain, nullptr);
  for (bool erased = true; erased && !chain.empty();) {
    erased = false;
    for (auto it = chain.begin(); it != chain.end(); ++it) {
      bool read = false;
      for (size_t r = 0; r < (*it)->numResults(); ++r) read = read || !(*it)->result(r)->uses().empty();
      if (read) continue;
      g.eraseNode(*it);
      chain.erase(it);
      erased = true;
      break;
    }
  }
  if (!chain.empty()) throw Error("fuse-attention: node '" + chain.front()->name() + "' of a fused attention is still read");
  g.renameValue(result, oldName);
}

class FuseAttentionPass final : public Pass {
 public:
  FuseAttentionPass(const Target& target, DType compute) : target_(target), compute_(compute) {}
  std::string name() const override { return "fuse-attention"; }
  bool run(Graph& g) override {
    std::vector<Node*> softmaxes;
    for (const auto& n : g.nodes())
      if (n->domain().empty() && n->op() == "Softmax") softmaxes.push_back(n.get());
    bool changed = false;
    MaskCache cache;
    SumCache sums;
    for (Node* sm : softmaxes) {
      Match m;
      if (!matchAt(g, sm, m, target_, compute_)) continue;
      g.domainOpsets.emplace(kGradDomain, 1);
      rewrite(g, m, cache, sums);
      changed = true;
    }
    return changed;
  }

 private:
  const Target& target_;
  DType compute_;
};

}  // namespace

std::unique_ptr<Pass> createFuseAttentionPass(const Target& target, DType compute) {
  return std::make_unique<FuseAttentionPass>(target, compute);
}
std::unique_ptr<Pass> createFuseAttentionPass() { return createFuseAttentionPass(findTarget("cuda")); }

}  // namespace ampc
