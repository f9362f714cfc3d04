// cast-cleanup: runs after autocast and stands alone. Until nothing changes:
//   - a Cast to its input's own dtype goes;
//   - Cast(Cast(x, B), C) reads x directly when x -> B is exact (never a high->low->high pair,
//     which changes the numbers); it disappears when C is x's own dtype;
//   - a Cast of a constant becomes a constant;
//   - one Cast per (value, dtype);
//   - a Cast after a clear op moves above it when the op's input has no more elements than its
//     output (so the cast lands on the parameter, or merges with a cast there), and a Cast before
//     a clear op moves below it when the op's output has fewer elements; around a view (Reshape
//     and the like, which moves no bytes) a widening Cast moves below and a narrowing one above,
//     so each sits next to the op that computes in FP32 and can read or write through it;
//   - casts nothing reads are dropped.
#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "kernels/cpu/kernel.h"
#include "passes/autocast.h"

namespace ampc {
namespace {

// True if every value of `from` is exactly representable in `to`.
bool castIsExact(DType from, DType to) {
  if (from == to) return true;
  auto significand = [](DType t) {
    switch (t) {
      case DType::bf16: return 8;
      case DType::f16: return 11;
      case DType::f32: return 24;
      default: return 53;
    }
  };
  auto magnitude = [](DType t) {  // value bits of an integer type, sign excluded
    switch (t) {
      case DType::boolean: return 1;
      case DType::u8: return 8;
      case DType::i8: return 7;
      case DType::i32: return 31;
      default: return 63;
    }
  };
  if (isFloat(from)) {
    if (!isFloat(to)) return false;
    if (to == DType::f64) return true;
    return to == DType::f32 && isLowFloat(from);  // f16 <-> bf16 lose both ways
  }
  if (isFloat(to)) return magnitude(from) <= significand(to);
  if (from == DType::boolean) return true;
  if (to == DType::boolean || to == DType::u8) return false;
  if (from == DType::u8) return magnitude(to) > 8;
  return magnitude(from) <= magnitude(to);
}

bool isCast(const Node& n) { return n.domain().empty() && n.op() == "Cast"; }
DType castTarget(const Node& n) { return n.result(0)->type().dtype; }

// A clear op that moves one float tensor (input 0) with no other float input and one result.
bool isMovableClear(const Node& n) {
  if (!n.def() || n.def()->amp != AmpCategory::Clear || n.def()->explicitCast || n.numResults() != 1) return false;
  if (!n.input(0) || !isFloat(n.input(0)->type().dtype)) return false;
  for (size_t i = 1; i < n.numInputs(); ++i)
    if (n.input(i) && isFloat(n.input(i)->type().dtype)) return false;
  return true;
}

bool isView(const Node& n) { return n.def() && n.def()->view; }

void retype(Node* n) {
  auto types = inferTypes(*n);
  for (size_t i = 0; i < n->numResults(); ++i) n->result(i)->setType(types[i]);
}

class CastCleanupPass : public Pass {
 public:
  std::string name() const override { return "cast-cleanup"; }
  bool run(Graph& g) override {
    bool any = false;
    for (bool changed = true; changed;) {
      changed = false;
      // simplify() only adds nodes (dropDeadCasts erases them, after the sweep), and an added node
      // leaves the others' order as it was: positions taken here order any two of them.
      std::vector<Node*> order;
      position_.clear();
      for (const auto& n : g.nodes()) {
        position_[n.get()] = order.size();
        order.push_back(n.get());
      }
      for (Node* n : order) {
        if (!isCast(*n)) continue;
        if (simplify(g, n)) changed = true;
      }
      changed |= dropDeadCasts(g);
      any |= changed;
    }
    return any;
  }

 private:
  // Replaces every use of the cast's result by `v` (a graph output keeps its name via a rename
  // only when `v` is not itself graph-level).
  static bool forward(Graph& g, Node* cast, Value* v) {
    Value* r = cast->result(0);
    if (g.isOutput(r)) return false;  // the output's name and dtype are the contract
    r->replaceAllUsesWith(v);
    return true;
  }

  bool simplify(Graph& g, Node* c) {
    Value* x = c->input(0);
    const DType to = castTarget(*c);
    // No-op cast.
    if (x->type().dtype == to) return forward(g, c, x);
    // Cast(Cast(y)) with an exact inner cast.
    if (Node* inner = x->producer(); inner && isCast(*inner)) {
      Value* y = inner->input(0);
      if (castIsExact(y->type().dtype, x->type().dtype)) {
        if (y->type().dtype == to) return forward(g, c, y);
        c->setInput(0, y);
        return true;
      }
    }
    // Cast of a constant.
    if (x->kind() == ValueKind::Const && x->data() && !g.isOutput(c->result(0))) {
      Value* k = g.addConst(g.uniqueName(x->name() + "." + std::string(dtypeName(to))), cpu::castTensor(*x->data(), to));
      c->result(0)->replaceAllUsesWith(k);
      foldedFrom_.insert(x);
      return true;
    }
    // One cast per (value, dtype): keep the first.
    for (const Use& u : x->uses()) {
      Node* other = u.user;
      if (other != c && isCast(*other) && castTarget(*other) == to && before(g, other, c)) {
        if (forward(g, c, other->result(0))) return true;
      }
    }
    const bool widening = castIsExact(x->type().dtype, to);
    // Hoist above a clear op: Cast(clear(x)) -> clear(Cast(x)).
    if (Node* p = x->producer(); p && isMovableClear(*p) && x->uses().size() == 1 && !g.isOutput(x) &&
                                 p->input(0)->type().numel() <= x->type().numel() && !(isView(*p) && widening) &&
                                 !g.isOutput(c->result(0))) {
      Value* src = p->input(0);
      Node* pre = g.createNode("Cast", "", {src}, {{g.uniqueName(src->name() + "." + std::string(dtypeName(to))), TensorType{to, src->type().shape}}}, p);
      pre->setName(g.uniqueName(c->name().empty() ? "cast" : c->name()));
      pre->setAttr("to", static_cast<int64_t>(dtypeToOnnx(to)));
      p->setInput(0, pre->result(0));
      retype(p);
      c->result(0)->replaceAllUsesWith(p->result(0));
      return true;
    }
    // Sink below a clear op that shrinks: clear(Cast(x)) -> Cast(clear(x)).
    Value* r = c->result(0);
    if (r->uses().size() == 1 && !g.isOutput(r)) {
      Node* q = r->uses()[0].user;
      if (r->uses()[0].operand == 0 && isMovableClear(*q) &&
          (q->result(0)->type().numel() < r->type().numel() || (isView(*q) && widening)) && !g.isOutput(q->result(0))) {
        Value* out = q->result(0);
        q->setInput(0, x);
        retype(q);
        // The cast now follows q: a new Cast of q's result replaces q's uses.
        std::vector<Use> uses = out->uses();
        Node* after = g.nodeAfter(q);
        Node* post = g.createNode("Cast", "", {out}, {{g.uniqueName(out->name() + "." + std::string(dtypeName(to))), TensorType{to, out->type().shape}}}, after);
        post->setName(g.uniqueName(c->name().empty() ? "cast" : c->name()));
        post->setAttr("to", static_cast<int64_t>(dtypeToOnnx(to)));
        for (const Use& u : uses) u.user->setInput(u.operand, post->result(0));
        return true;
      }
    }
    return false;
  }

  bool before(const Graph& g, const Node* a, const Node* b) const {
    if (auto pa = position_.find(a), pb = position_.find(b); pa != position_.end() && pb != position_.end()) return pa->second < pb->second;
    for (const auto& n : g.nodes()) {  // a node this sweep added
      if (n.get() == a) return true;
      if (n.get() == b) return false;
    }
    return false;
  }

  bool dropDeadCasts(Graph& g) {
    bool changed = false;
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      Node* n = *it;
      if (isCast(*n) && n->result(0)->uses().empty() && !g.isOutput(n->result(0))) {
        g.eraseNode(n);
        changed = true;
      }
    }
    // Constants whose only reader was a cast that folded them.
    for (Value* k : std::vector<Value*>(foldedFrom_.begin(), foldedFrom_.end()))
      if (k->uses().empty() && !g.isOutput(k)) {
        foldedFrom_.erase(k);
        g.eraseGraphValue(k);
        changed = true;
      }
    return changed;
  }

  std::set<Value*> foldedFrom_;
  std::unordered_map<const Node*, size_t> position_;  // the nodes at the start of a sweep, in order
};

}  // namespace

std::unique_ptr<Pass> createCastCleanupPass() { return std::make_unique<CastCleanupPass>(); }

}  // namespace ampc
