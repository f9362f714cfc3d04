#include "runtime/folds.h"

#include <algorithm>
#include <string>

#include "compiler/target.h"
#include "passes/fold_casts.h"
#include "passes/group_optimizers.h"
#include "passes/train_step.h"

namespace ampc::folds {

bool fusedComparison(const Node& c) { return c.domain().empty() && c.getString("fold", "") == "where"; }

bool isLossGrad(const Node& n) { return (n.domain() == "ampc" || n.domain() == kCudaDomain) && n.op() == "SoftmaxCrossEntropyLossGrad"; }

// The casts' folds as fold-casts recorded them (passes/fold_casts.h).
const Node* widenedSource(const Value* v) {
  const Node* c = v ? v->producer() : nullptr;
  return c && castFold(*c) == CastFold::Readers ? c : nullptr;
}
const Value* readThrough(const Value* v) {
  const Node* c = widenedSource(v);
  return c ? c->inputs()[0] : v;
}
const Node* narrowedResult(const Node& n) {
  const Value* r = n.numResults() > 0 ? n.result(0) : nullptr;
  const Node* d = r && r->uses().size() == 1 ? r->uses()[0].user : nullptr;
  return d && castFold(*d) == CastFold::Producer ? d : nullptr;
}
const Node* narrowedGradInput(const Node& n) {
  const Node* c = n.numInputs() > 0 && n.input(0) ? n.input(0)->producer() : nullptr;
  return c && castFold(*c) == CastFold::GradReader && c->result(0)->uses()[0].user == &n ? c : nullptr;
}
bool castFolded(const Node& c) { return castFold(c) != CastFold::None; }
const Value* castUnwritten(const Node& c) { return castFold(c) == CastFold::Producer ? c.inputs()[0] : c.result(0); }

bool isOnnx(const Node& n, std::string_view op) { return n.domain().empty() && n.op() == op; }

bool fusedGradChain(const Node& u, const Node** clipOut) {
  if (u.domain() != "ampc" || u.op() != "UnscaleCheck" || u.getString("fold", "") != "optimizer") return false;
  const Node* first = u.result(0)->uses().empty() ? nullptr : u.result(0)->uses()[0].user;
  if (clipOut) *clipOut = first && first->op() == "ClipByGlobalNorm" && first->getString("fold", "") == "optimizer" ? first : nullptr;
  return true;
}

Schedule schedule(const Graph& g) {
  Schedule s;
  for (const auto& n : g.nodes()) s.order[n.get()] = static_cast<int>(s.order.size());
  // An optimizer group runs at its first node, a comparison fused into its Where at the Where (the
  // plan then keeps the comparison's operands alive until there).
  s.leader = recordedOptimizerGroups(g);
  const std::vector<size_t>& leader = s.leader;
  std::vector<int>& positions = s.positions;
  positions.resize(leader.size());
  std::map<const Node*, int>& indexOf = s.order;
  for (const auto& n : g.nodes()) {
    const int i = indexOf[n.get()];
    positions[i] = static_cast<int>(leader[i]);
    if (fusedComparison(*n)) positions[i] = indexOf[n->result(0)->uses()[0].user];
  }
  // A folded Cast runs where its last reader or its writer does: the value it reads stays alive
  // until then, and the value it writes is born then. Its f32 side is never written: no bytes.
  std::set<const Value*>& unwritten = s.unwritten;
  for (const auto& n : g.nodes()) {
    if (!castFolded(*n)) continue;
    int& at = positions[indexOf[n.get()]];
    if (castFold(*n) != CastFold::Producer) {
      at = 0;
      for (const Use& u : n->result(0)->uses()) at = std::max(at, positions[indexOf[u.user]]);
    } else {
      at = positions[indexOf[n->inputs()[0]->producer()]];
    }
    unwritten.insert(castUnwritten(*n));
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
    if (!fusedGradChain(*n, &clip)) continue;
    for (size_t i = 0; i + 1 < n->inputs().size(); ++i) {
      unwritten.insert(n->result(i));
      const Value* read = clip ? clip->result(i) : n->result(i);
      if (clip) unwritten.insert(read);
      const int at = positions[indexOf[read->uses()[0].user]];
      s.extraReads.emplace_back(readThrough(n->inputs()[i + 1]), at);
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
    const Node* narrow = narrowedResult(*n);
    s.inPlace[narrow ? narrow->result(0) : n->result(0)] = readThrough(n->inputs()[1]);
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
