#include "runtime/folds.h"

#include <algorithm>
#include <string>

#include "compiler/ops/geometry.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/target_node.h"
#include "passes/train_step.h"

namespace ampc::folds {

bool fusedComparison(const Graph& g, const Node& c) {
  static const std::set<std::string> kCmp = {"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"};
  if (!c.domain().empty() || !kCmp.count(c.op())) return false;
  const Value* r = c.result(0);
  if (r->uses().size() != 1 || r->uses()[0].operand != 0 || r->uses()[0].user->op() != "Where" || !r->uses()[0].user->domain().empty())
    return false;
  if (g.isOutput(r)) return false;
  for (const Value* v : c.inputs())
    if (!v || !isFloat(v->type().dtype) || v->type().dtype == DType::f64) return false;
  return true;
}

// Casts folded into the ops around them (exact: the op widens to f32 and rounds once either
// way): a widening Cast (f16/bf16 -> f32) all of whose readers can widen in registers is read
// through by each of them, and a narrowing Cast (f32 -> f16/bf16) that is the one use of such an
// op's result is written by it. The Cast itself launches nothing, and its f32 side gets no bytes.
bool foldsCasts(const Node& n) {
  static const std::set<std::string> kOps = {"Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "LessOrEqual", "Greater",
                                             "GreaterOrEqual", "Where", "Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid",
                                             "Erf", "Softplus", "LeakyRelu", "Relu", "Neg", "Abs", "Gelu", "Clip"};  // Max/Min (chained launches) not
  return n.domain().empty() && kOps.count(n.op()) != 0;
}
bool isLossGrad(const Node& n) { return (n.domain() == "ampc" || n.domain() == kCudaDomain) && n.op() == "SoftmaxCrossEntropyLossGrad"; }
bool isLayerNorm(const Node& n) { return n.domain().empty() && n.op() == "LayerNormalization"; }
// A Transpose that moves one group of adjacent input dims past another ([batch, R, C] ->
// [batch, C, R] once adjacent dims are merged and size-1 dims dropped): the tiled kernel.
bool tiledTranspose(const Node& t, int64_t& batch, int64_t& R, int64_t& C) {
  if (!isOnnx(t, "Transpose") || !t.inputs()[0]) return false;
  const auto& xs = t.inputs()[0]->type().shape;
  const int64_t r = static_cast<int64_t>(xs.size());
  std::vector<int64_t> perm = t.getInts("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  std::vector<std::vector<int64_t>> groups;  // output order; input dims of each group
  for (int64_t d = 0; d < r; ++d) {
    if (xs[perm[d]] == 1) continue;
    if (!groups.empty() && groups.back().back() + 1 == perm[d]) groups.back().push_back(perm[d]);
    else groups.push_back({perm[d]});
  }
  auto size = [&](const std::vector<int64_t>& grp) {
    int64_t p = 1;
    for (int64_t d : grp) p *= xs[d];
    return p;
  };
  const size_t gn = groups.size();
  if (gn < 2 || gn > 3 || groups[gn - 1].front() > groups[gn - 2].front() || (gn == 3 && groups[0].front() > groups[2].front())) return false;
  batch = gn == 3 ? size(groups[0]) : 1;
  R = size(groups[gn - 1]);
  C = size(groups[gn - 2]);
  return true;
}

// Whether `user` reads its operand `i` through a widening Cast: elementwise ops any operand, the
// cross-entropy loss (without its log-prob result) and its gradient the scores, LayerNormGrad dY,
// UnscaleCheck the gradients, a tiled Transpose its input.
bool readsWidened(const Node& user, size_t i) {
  if (foldsCasts(user)) return true;
  if (user.domain().empty() && user.op() == "SoftmaxCrossEntropyLoss") return i == 0 && user.numResults() == 1;
  if (user.domain() == kCudaDomain && user.op() == "SoftmaxCrossEntropyLoss") return i == 0;  // result 1: the row statistics
  if ((user.domain() == "ampc" || user.domain() == kCudaDomain) && user.op() == "LayerNormGrad") return i <= 1;  // dY and X
  if (isLayerNorm(user)) return i == 0;
  if (user.domain() == "ampc" && user.op() == "UnscaleCheck") return i >= 1;  // the gradients
  int64_t b, r, c;
  if (tiledTranspose(user, b, r, c)) return i == 0;  // converts in its tiles
  return isLossGrad(user) && i == 1;
}
bool cudaPointwiseByHand(const Node& n) {
  static const std::set<std::string> kOnnx = {
      "Add",     "Sub",       "Mul",      "Div",         "Pow",      "Equal",       "Less",      "LessOrEqual", "Greater",
      "GreaterOrEqual", "And", "Or",      "Where",       "Sqrt",     "Reciprocal",  "Exp",       "Log",         "Tanh",
      "Sigmoid", "Erf",       "Softplus", "LeakyRelu",   "Relu",     "Neg",         "Abs",       "Not",         "IsNaN",
      "IsInf",   "Cast",      "CastLike", "Sin",         "Cos",      "HardSigmoid", "HardSwish", "Elu",         "Selu",
      "Celu",    "Mish",      "Floor",    "Ceil",        "Round",    "Sign",        "PRelu",     "Mod",         "Gelu",
      "Max",     "Min",       "Clip",     "Identity"};
  static const std::set<std::string> kAmpc = {"Gelu", "GeluGrad", "Silu", "SiluGrad"};
  return n.domain().empty() ? kOnnx.count(n.op()) != 0 : n.domain() == "ampc" && kAmpc.count(n.op()) != 0;
}
bool isCastBetween(const Node& c, bool widening) {
  if (!c.domain().empty() || c.op() != "Cast" || !c.inputs()[0]) return false;
  const DType a = c.inputs()[0]->type().dtype, b = c.result(0)->type().dtype;
  return widening ? (isLowFloat(a) && b == DType::f32) : (a == DType::f32 && isLowFloat(b));
}
// The widening Cast that produced v, when every reader of v reads through it; else null.
const Node* widenedSource(const Graph& g, const Value* v) {
  const Node* c = v ? v->producer() : nullptr;
  if (!c || !isCastBetween(*c, true) || v->uses().empty() || g.isOutput(v)) return nullptr;
  for (const Use& u : v->uses())
    if (!readsWidened(*u.user, u.operand)) return nullptr;
  return c;
}
// The value node n reads for operand v: the narrow source of a folded widening Cast, or v.
const Value* readThrough(const Graph& g, const Value* v) {
  const Node* c = widenedSource(g, v);
  return c ? c->inputs()[0] : v;
}
// Every input a constant with data (and the op not random): lower() computes such a node on the CPU.
bool allConstInputs(const Node& n) {
  bool all = !n.inputs().empty() && !(n.def() && n.def()->random);
  for (const Value* v : n.inputs()) all = all && (!v || (v->kind() == ValueKind::Const && v->constData()));
  return all;
}
// The narrowing Cast that node n writes directly, or null: elementwise ops, the loss gradient and
// LayerNormalization (its result 0) write through it.
const Node* narrowedResult(const Graph& g, const Node& n) {
  if (!(foldsCasts(n) && !allConstInputs(n)) && !isLossGrad(n) && !isLayerNorm(n)) return nullptr;
  if ((n.numResults() != 1 && !isLayerNorm(n)) || n.result(0)->type().dtype != DType::f32) return nullptr;
  const Value* r = n.result(0);
  if (r->uses().size() != 1 || g.isOutput(r)) return nullptr;
  const Node* d = r->uses()[0].user;
  return isCastBetween(*d, false) ? d : nullptr;
}
bool castWrittenByProducer(const Graph& g, const Node& c) {
  return isCastBetween(c, false) && c.inputs()[0]->producer() && narrowedResult(g, *c.inputs()[0]->producer()) == &c;
}
// A narrowing Cast whose one reader is a DropoutGrad's dY (a residual-stream gradient cast down
// for the Dropout's backward): DropoutGrad reads the f32 source and rounds it as the Cast would.
const Node* narrowedGradInput(const Graph& g, const Node& n) {
  if (n.domain() != "ampc" || n.op() != "DropoutGrad" || !n.inputs()[0]) return nullptr;
  const Value* dy = n.inputs()[0];
  const Node* c = dy->producer();
  if (!c || !isCastBetween(*c, false) || dy->uses().size() != 1 || g.isOutput(dy) || castWrittenByProducer(g, *c)) return nullptr;
  return c;
}
bool castReadByDropoutGrad(const Graph& g, const Node& c) {
  const Value* r = c.numResults() == 1 ? c.result(0) : nullptr;
  return r && r->uses().size() == 1 && narrowedGradInput(g, *r->uses()[0].user) == &c;
}
// A Cast that launches nothing: folded into its readers or its producer.
bool castFolded(const Graph& g, const Node& c) {
  if (isCastBetween(c, true)) return widenedSource(g, c.result(0)) != nullptr;
  return castWrittenByProducer(g, c) || (isCastBetween(c, false) && castReadByDropoutGrad(g, c));
}
// The value a folded Cast stands in for, never written: it needs no bytes. A widening Cast's f32
// result, a narrowing Cast's f32 operand when its producer writes the narrow result, and the
// narrow result when DropoutGrad reads the f32 operand.
const Value* castUnwritten(const Graph& g, const Node& c) {
  if (isCastBetween(c, true) || castReadByDropoutGrad(g, c)) return c.result(0);
  return c.inputs()[0];
}

bool isOnnx(const Node& n, std::string_view op) { return n.domain().empty() && n.op() == op; }

bool fusedGradChain(const Graph& g, const Node& u, const Node** clipOut) {
  if (u.domain() != "ampc" || u.op() != "UnscaleCheck" || u.inputs().size() < 2 || u.numResults() != u.inputs().size()) return false;
  const size_t k = u.inputs().size() - 1;
  auto single = [&](const Value* r) -> const Use* { return g.isOutput(r) || r->uses().size() != 1 ? nullptr : &r->uses()[0]; };
  auto optimizerGrad = [](const Use& use) {
    const Node& o = *use.user;
    return o.domain() == "ampc" && use.operand == 1 && (o.op() == "SGD" || (o.op() == "Adam" && o.getInt("lamb", 0) == 0));
  };
  const Use* first = single(u.result(0));
  if (!first) return false;
  const Node* clip = first->user->domain() == "ampc" && first->user->op() == "ClipByGlobalNorm" ? first->user : nullptr;
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

std::vector<size_t> optimizerGroups(const Graph& g) {
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());
  std::vector<size_t> leader(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) leader[i] = i;
  auto key = [](const Node* n) {
    std::string k = n->op() + "|";
    for (const auto& [name, a] : n->attrs())
      if (const float* f = std::get_if<float>(&a)) k += name + "=" + std::to_string(*f) + ";";
      else if (const int64_t* v = std::get_if<int64_t>(&a)) k += name + "=" + std::to_string(*v) + ";";
    const size_t first = n->op() == "SGD" ? 3 : 4;  // the shared operands: lr (step) found
    for (size_t i = first; i < n->inputs().size(); ++i) k += n->inputs()[i] ? n->inputs()[i]->name() + "," : "_,";
    return k;
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node* n = nodes[i];
    if (n->domain() != "ampc" || (n->op() != "SGD" && n->op() != "Adam") || leader[i] != i) continue;
    const std::string k = key(n);
    // Later nodes join while nothing else runs in between (the optimizer tail of a train step).
    for (size_t j = i + 1; j < nodes.size(); ++j) {
      const Node* m = nodes[j];
      if (m->domain() != "ampc" || (m->op() != "SGD" && m->op() != "Adam")) break;
      if (key(m) == k) leader[j] = i;
      else break;
    }
  }
  return leader;
}

Schedule schedule(const Graph& g) {
  Schedule s;
  for (const auto& n : g.nodes()) s.order[n.get()] = static_cast<int>(s.order.size());
  // An optimizer group runs at its first node, a comparison fused into its Where at the Where (the
  // plan then keeps the comparison's operands alive until there).
  s.leader = optimizerGroups(g);
  const std::vector<size_t>& leader = s.leader;
  std::vector<int>& positions = s.positions;
  positions.resize(leader.size());
  std::map<const Node*, int>& indexOf = s.order;
  for (const auto& n : g.nodes()) {
    const int i = indexOf[n.get()];
    positions[i] = static_cast<int>(leader[i]);
    if (fusedComparison(g, *n)) positions[i] = indexOf[n->result(0)->uses()[0].user];
  }
  // A folded Cast runs where its last reader or its writer does: the value it reads stays alive
  // until then, and the value it writes is born then. Its f32 side is never written: no bytes.
  std::set<const Value*>& unwritten = s.unwritten;
  for (const auto& n : g.nodes()) {
    if (!castFolded(g, *n)) continue;
    int& at = positions[indexOf[n.get()]];
    if (isCastBetween(*n, true) || castReadByDropoutGrad(g, *n)) {
      at = 0;
      for (const Use& u : n->result(0)->uses()) at = std::max(at, positions[indexOf[u.user]]);
    } else {
      at = positions[indexOf[n->inputs()[0]->producer()]];
    }
    unwritten.insert(castUnwritten(g, *n));
  }
  // A ConvGrad's dX that nothing reads is not computed: no bytes.
  for (const auto& n : g.nodes())
    if (n->domain() == "ampc" && n->op() == "ConvGrad" && n->result(0)->uses().empty() && !g.isOutput(n->result(0)))
      unwritten.insert(n->result(0));
  // The gradient chain folded into the optimizer: the unscaled and clipped gradients get no bytes,
  // and each optimizer node reads again the gradient UnscaleCheck read, UnscaleCheck's 1/scale and
  // the clip's found_inf.
  for (const auto& n : g.nodes()) {
    const Node* clip = nullptr;
    if (!fusedGradChain(g, *n, &clip)) continue;
    for (size_t i = 0; i + 1 < n->inputs().size(); ++i) {
      unwritten.insert(n->result(i));
      const Value* read = clip ? clip->result(i) : n->result(i);
      if (clip) unwritten.insert(read);
      const int at = positions[indexOf[read->uses()[0].user]];
      s.extraReads.emplace_back(readThrough(g, n->inputs()[i + 1]), at);
      s.extraReads.emplace_back(n->inputs()[0], at);
      if (clip) s.extraReads.emplace_back(clip->inputs()[0], at);
    }
  }
  // Optimizer updates in place, as PyTorch's: SGD's and Adam's kernels read each element of a state
  // before they write its update (the same thread), so a result that the step writes back into its
  // state (through the output STATE.next) may take the state's bytes when nothing reads the state
  // after the optimizer runs. Then neither the results nor the write-back copies of the step's end
  // take memory or time.
  for (const auto& n : g.nodes()) {
    if (n->domain() != "ampc" || (n->op() != "SGD" && n->op() != "Adam")) continue;
    const int at = positions[indexOf[n.get()]];
    for (size_t r = 0; r < n->numResults(); ++r) {  // result 0 updates operand 0, result r > 0 operand r + 1
      const size_t i = r == 0 ? 0 : r + 1;
      if (i >= n->inputs().size()) continue;
      const Value *state = n->inputs()[i], *out = n->result(r);
      if (!state || state->kind() != ValueKind::Param || state->type() != out->type() || g.isOutput(state)) continue;
      bool readLater = false;
      for (const Use& u : state->uses()) readLater |= u.user != n.get() && positions[indexOf[u.user]] >= at;
      const std::string next = state->name() + kNextSuffix;
      const Value* written = g.isOutput(out) && out->name() == next ? out : nullptr;
      for (const Use& u : out->uses())
        if (isOnnx(*u.user, "Identity") && g.isOutput(u.user->result(0)) && u.user->result(0)->name() == next) written = u.user->result(0);
      if (readLater || !written) continue;
      for (const Value* v : {out, written}) {
        s.aliases[v] = state;
        unwritten.insert(v);
      }
    }
  }
  // The cross-entropy gradient reads each row's scores (its statistics kept by the loss, or
  // reduced over the row before the first write) and writes each element after reading it.
  for (const auto& n : g.nodes()) {
    if (!isLossGrad(*n) || n->inputs().size() < 2) continue;
    const Node* narrow = narrowedResult(g, *n);
    s.inPlace[narrow ? narrow->result(0) : n->result(0)] = readThrough(g, n->inputs()[1]);
  }
  // A data-parallel AllReduce (passes/data_parallel.h) may average its bucket on a stream of its own
  // while the backward goes on (the CUDA backend, in a group): its operands are read until the first
  // node that reads one of its results, where that stream joins the main one again.
  for (const auto& n : g.nodes()) {
    if (n->domain() != "ampc" || n->op() != "AllReduce") continue;
    int join = static_cast<int>(positions.size());
    for (size_t r = 0; r < n->numResults(); ++r)
      for (const Use& u : n->result(r)->uses()) join = std::min(join, positions[indexOf[u.user]]);
    for (const Value* v : n->inputs())
      if (v) s.extraReads.emplace_back(v, join);
  }
  return s;
}

}  // namespace ampc::folds
