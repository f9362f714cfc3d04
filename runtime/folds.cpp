#include "runtime/folds.h"

#include <algorithm>
#include <string>

#include "compiler/ops/registry.h"

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
bool isLossGrad(const Node& n) { return n.domain() == "ampc" && n.op() == "SoftmaxCrossEntropyLossGrad"; }
bool isLayerNorm(const Node& n) { return n.domain().empty() && n.op() == "LayerNormalization"; }
// Whether `user` reads its operand `i` through a widening Cast: elementwise ops any operand, the
// cross-entropy loss (without its log-prob result) and its gradient the scores, LayerNormGrad dY.
bool readsWidened(const Node& user, size_t i) {
  if (foldsCasts(user)) return true;
  if (user.domain().empty() && user.op() == "SoftmaxCrossEntropyLoss") return i == 0 && user.numResults() == 1;
  if (user.domain() == "ampc" && user.op() == "LayerNormGrad") return i == 0;
  return isLossGrad(user) && i == 1;
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
bool isZeroScalar(const Value* v) {
  const Tensor* t = v && v->type().numel() == 1 ? v->constData() : nullptr;
  return t && t->getDouble(0) == 0.0;
}
// Relus folded into the op before them: a BatchNormalization (its y) or a float Add whose result's
// one reader is a Relu writes max(0, .) straight into the Relu's result (exact: a Relu commutes
// with rounding). The Relu launches nothing and the producer's own result gets no bytes. Returns
// the Relu that n writes, or null.
const Node* foldedRelu(const Graph& g, const Node& n) {
  if (!isOnnx(n, "BatchNormalization") && !(isOnnx(n, "Add") && !allConstInputs(n))) return nullptr;
  const Value* r = n.result(0);
  if (r->uses().size() != 1 || g.isOutput(r) || !isFloat(r->type().dtype) || r->type().dtype == DType::f64) return nullptr;
  const Node& relu = *r->uses()[0].user;
  if (!isOnnx(relu, "Relu") || relu.result(0)->type() != r->type() || narrowedResult(g, relu)) return nullptr;
  if (isOnnx(n, "Add") && narrowedResult(g, n)) return nullptr;
  return &relu;
}
// A residual Add folded into the norm before it, a BatchNormalization (its y) or a LayerNormGrad
// (its dX: a transformer's residual-stream gradient): Add(y, r) with y read only there, r of y's
// shape and type and ready before the norm runs (made by an earlier node, or a graph input). The
// norm writes round(y) + r (and the Add's folded Relu) into the Add's result (or the Relu's); y
// gets no bytes. Returns the Add, or null.
const Node* foldedResidual(const Graph& g, const Node& bn, const std::map<const Node*, int>& order) {
  if (!isOnnx(bn, "BatchNormalization") && !(bn.domain() == "ampc" && bn.op() == "LayerNormGrad")) return nullptr;
  const Value* y = bn.result(0);
  if (y->uses().size() != 1 || g.isOutput(y)) return nullptr;
  const Node& add = *y->uses()[0].user;
  if (!isOnnx(add, "Add") || add.inputs()[0] == add.inputs()[1] || narrowedResult(g, add) || add.result(0)->type() != y->type()) return nullptr;
  if (addGated(g, add)) return nullptr;  // already summed by a ReLU-gradient Where (Ew::GateSum reads y)
  if (!isOnnx(bn, "BatchNormalization") && foldedRelu(g, add)) return nullptr;  // LayerNormGrad applies no Relu
  const Value* r = residualOf(add, y);
  if (r->type() != y->type() || widenedSource(g, r)) return nullptr;
  const Node* rp = r->producer();
  return !rp || order.at(rp) < order.at(&bn) ? &add : nullptr;
}
const Value* residualOf(const Node& add, const Value* y) { return add.inputs()[0] == y ? add.inputs()[1] : add.inputs()[0]; }
bool addFoldedIntoNorm(const Graph& g, const Node& add, const std::map<const Node*, int>& order) {
  if (!isOnnx(add, "Add")) return false;
  for (const Value* v : add.inputs())
    if (v && v->producer() && foldedResidual(g, *v->producer(), order) == &add) return true;
  return false;
}
// A residual Add after a Dropout's widening Cast: Add(Cast(y) to f32, r) with y (f16/bf16) the
// Dropout's result read only by that Cast, the Cast read only by the Add, r f32 of the sum's shape
// and ready before the Dropout runs. The Dropout writes r + widen(y) into the Add's result (the
// Add rounds once either way); y gets no bytes, the Cast and the Add launch nothing.
const Node* droppedResidual(const Graph& g, const Node& d, const std::map<const Node*, int>& order) {
  if (!isOnnx(d, "Dropout") || !isLowFloat(d.result(0)->type().dtype)) return nullptr;
  const Value* y = d.result(0);
  if (y->uses().size() != 1 || g.isOutput(y)) return nullptr;
  const Node& c = *y->uses()[0].user;
  if (!isCastBetween(c, true) || widenedSource(g, c.result(0)) != &c || c.result(0)->uses().size() != 1) return nullptr;
  const Value* w = c.result(0);
  const Node& add = *w->uses()[0].user;
  if (!isOnnx(add, "Add") || add.inputs()[0] == add.inputs()[1] || add.result(0)->type() != w->type()) return nullptr;
  if (narrowedResult(g, add) || foldedRelu(g, add) || addGated(g, add) || addFoldedIntoNorm(g, add, order)) return nullptr;
  const Value* r = residualOf(add, w);
  if (r->type() != w->type() || widenedSource(g, r)) return nullptr;
  const Node* rp = r->producer();
  return !rp || order.at(rp) < order.at(&d) ? &add : nullptr;
}
bool addFoldedIntoDropout(const Graph& g, const Node& add, const std::map<const Node*, int>& order) {
  if (!isOnnx(add, "Add")) return false;
  for (const Value* v : add.inputs()) {
    const Node* c = v ? v->producer() : nullptr;
    const Node* d = c && isCastBetween(*c, true) && c->inputs()[0] ? c->inputs()[0]->producer() : nullptr;
    if (d && droppedResidual(g, *d, order) == &add) return true;
  }
  return false;
}
bool reluFolded(const Graph& g, const Node& relu) {
  const Node* p = isOnnx(relu, "Relu") && relu.inputs()[0] ? relu.inputs()[0]->producer() : nullptr;
  return p && foldedRelu(g, *p) == &relu;
}
// A Relu's gradient folded into the BatchNormGrad that reads it: Where(Greater(y, 0), dz, 0) whose
// one reader is BatchNormGrad's dY, all of one type and shape. BatchNormGrad reads dz gated by y
// (batchNormGrad's `gate`); the Where and its comparison launch nothing, and dY gets no bytes.
// Returns the Where that BatchNormGrad node n reads through, or null.
const Node* gatedGrad(const Graph& g, const Node& n) {
  if (n.domain() != "ampc" || n.op() != "BatchNormGrad" || !n.inputs()[0]) return nullptr;
  const Value* dy = n.inputs()[0];
  const Node* w = dy->producer();
  if (!w || !isOnnx(*w, "Where") || dy->uses().size() != 1 || g.isOutput(dy) || !isZeroScalar(w->inputs()[2])) return nullptr;
  const Node* c = w->inputs()[0]->producer();
  if (!c || !isOnnx(*c, "Greater") || !fusedComparison(g, *c) || !isZeroScalar(c->inputs()[1])) return nullptr;
  const Value *y = c->inputs()[0], *dz = w->inputs()[1];
  for (const Value* v : {y, dz})
    if (v->type() != dy->type() || widenedSource(g, v)) return nullptr;
  return w;
}
// A sum's ReLU gradient in one pass: Where(Greater(y, 0), Add(a, b), 0) whose Add has this Where
// as its one reader, a, b and the sum of one shape: out = y > 0 ? a + b : 0 (Ew::GateSum; exact:
// the sum is rounded once either way). The Add launches nothing and its result gets no bytes.
// Returns the Add that Where w reads through, or null.
const Node* summedGate(const Graph& g, const Node& w) {
  if (!isOnnx(w, "Where") || whereGated(g, w) || !isZeroScalar(w.inputs()[2])) return nullptr;
  const Node* c = w.inputs()[0]->producer();
  if (!c || !isOnnx(*c, "Greater") || !fusedComparison(g, *c) || !isZeroScalar(c->inputs()[1])) return nullptr;
  const Value* sum = w.inputs()[1];
  const Node* add = sum->producer();
  if (!add || !isOnnx(*add, "Add") || allConstInputs(*add) || sum->uses().size() != 1 || g.isOutput(sum) || widenedSource(g, sum))
    return nullptr;
  if (!isFloat(sum->type().dtype) || sum->type().dtype == DType::f64) return nullptr;
  for (const Value* v : add->inputs())
    if (v->type() != sum->type() || widenedSource(g, v)) return nullptr;
  return add;
}
bool addGated(const Graph& g, const Node& add) {
  const Value* r = add.result(0);
  return isOnnx(add, "Add") && r->uses().size() == 1 && summedGate(g, *r->uses()[0].user) == &add;
}
bool whereGated(const Graph& g, const Node& w) {
  const Value* r = w.result(0);
  return isOnnx(w, "Where") && r->uses().size() == 1 && gatedGrad(g, *r->uses()[0].user) == &w;
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
  // An optimizer group runs at its first node, a comparison fused into its Where at the Where
  // (the plan then keeps the comparison's operands alive until there).
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
  // A folded Relu runs where its producer does; a residual Add where the batch norm that writes it
  // does; a gated Where and its comparison where the BatchNormGrad that reads through them does; a
  // gated Add where its Where does. The values they stand in for get no bytes, nor does a
  // ConvGrad's unread dX.
  for (const auto& n : g.nodes()) {
    if (reluFolded(g, *n)) {
      positions[indexOf[n.get()]] = positions[indexOf[n->inputs()[0]->producer()]];
      unwritten.insert(n->inputs()[0]);
    } else if (const Node* w = gatedGrad(g, *n)) {
      positions[indexOf[w]] = positions[indexOf[w->inputs()[0]->producer()]] = positions[indexOf[n.get()]];
      unwritten.insert(w->result(0));
    } else if (const Node* add = foldedResidual(g, *n, indexOf)) {
      positions[indexOf[add]] = positions[indexOf[n.get()]];
      unwritten.insert(n->result(0));
    } else if (const Node* dadd = droppedResidual(g, *n, indexOf)) {
      positions[indexOf[dadd]] = positions[indexOf[n.get()]];
      unwritten.insert(n->result(0));
    } else if (addGated(g, *n)) {
      positions[indexOf[n.get()]] = positions[indexOf[n->result(0)->uses()[0].user]];
      unwritten.insert(n->result(0));
    } else if (n->domain() == "ampc" && n->op() == "ConvGrad" && n->result(0)->uses().empty() && !g.isOutput(n->result(0))) {
      unwritten.insert(n->result(0));  // a dX nobody reads is not computed
    }
  }
  return s;
}

}  // namespace ampc::folds
