#include "passes/attention_mask.h"

#include <set>
#include <vector>

#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"

namespace ampc {

const Tensor* constantValue(const Value* v, std::map<const Value*, Tensor>& memo, int64_t& budget) {
  if (const Tensor* t = v->constData()) return t;
  if (auto it = memo.find(v); it != memo.end()) return &it->second;
  const Node* n = v->producer();
  if (!n || !n->def() || n->def()->random) return nullptr;
  std::vector<const Tensor*> ins;
  for (const Value* x : n->inputs()) {
    const Tensor* t = x ? constantValue(x, memo, budget) : nullptr;
    if (x && !t) return nullptr;
    ins.push_back(t);
  }
  for (size_t r = 0; r < n->numResults(); ++r) budget -= n->result(r)->type().numel();
  if (budget < 0) return nullptr;
  try {
    auto out = cpu::runNode(*n, ins);
    for (size_t r = 0; r < out.size(); ++r) memo.emplace(n->result(r), std::move(out[r]));
  } catch (const Error&) {
    return nullptr;  // no CPU kernel for it
  }
  return &memo.at(v);
}

bool isCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements) {
  const auto& s = mask->type().shape;
  if (s.size() < 2 || s[s.size() - 2] != Tq || s[s.size() - 1] != Tk) return false;
  std::map<const Value*, Tensor> memo;
  const Tensor* m = constantValue(mask, memo, maxElements);
  if (!m) return false;
  // masked (key j > query i): at most -1e30; kept: exactly 0
  for (int64_t e = 0, n = m->numel(); e < n; ++e) {
    const int64_t j = e % Tk, i = (e / Tk) % Tq;
    const double x = m->getDouble(e);
    if (j > i ? !(x <= -1e30) : x != 0.0) return false;
  }
  return true;
}

namespace {

// A value known in part: `value` where `known` (the same type, 1 where known, 0 elsewhere).
struct Partial {
  Tensor value, known;
  bool all = false;  // known everywhere
};

Tensor filled(const TensorType& t, double x) {
  Tensor r(t);
  for (int64_t e = 0; e < r.numel(); ++e) r.setDouble(e, x);
  return r;
}

// Element e of `out` (shape os) read from a broadcast operand of shape s: its flat index.
int64_t broadcastAt(int64_t e, const std::vector<int64_t>& os, const std::vector<int64_t>& s) {
  int64_t at = 0, stride = 1;
  for (size_t k = 0; k < os.size(); ++k) {
    const size_t d = os.size() - 1 - k;
    const int64_t i = e % os[d];
    e /= os[d];
    if (k < s.size()) {
      const int64_t sd = s[s.size() - 1 - k];
      at += (sd == 1 ? 0 : i) * stride;
      stride *= sd;
    }
  }
  return at;
}

class PartialEval {
 public:
  explicit PartialEval(int64_t budget) : budget_(budget) {}

  const Partial* eval(const Value* v) {
    if (auto it = memo_.find(v); it != memo_.end()) return &it->second;
    Partial p;
    const Node* n = v->producer();
    if (const Tensor* c = v->constData()) {
      p.value = *c;
      p.all = true;
    } else if (!n || !n->def() || n->def()->random) {  // an input, a parameter, a random draw
      p.value = filled(v->type(), 1.0);  // (ones where unknown: no division by zero downstream)
      p.known = Tensor(v->type());
    } else if (!evalNode(*n)) {
      return nullptr;
    } else {
      return &memo_.at(v);
    }
    if (p.all) p.known = Tensor();
    return &memo_.emplace(v, std::move(p)).first->second;
  }

 private:
  static bool movesData(const std::string& op) {
    static const std::set<std::string> ops = {"Identity", "Reshape", "Expand", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Slice",
                                              "Tile", "Gather", "GatherND", "Concat", "Cast"};
    return ops.count(op) != 0;
  }
  static bool elementwise(const std::string& op) {
    static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Equal", "Less", "LessOrEqual", "Greater",
                                              "GreaterOrEqual", "Not", "Sqrt", "Exp", "Log", "Pow", "Reciprocal", "Xor"};
    return ops.count(op) != 0;
  }
  Tensor knownOf(const Partial& p, const TensorType& t) const { return p.all ? filled(t, 1.0) : p.known; }

  bool evalNode(const Node& n) {
    std::vector<const Partial*> ins;
    std::vector<const Tensor*> values;
    bool all = true;
    for (const Value* x : n.inputs()) {
      const Partial* p = x ? eval(x) : nullptr;
      if (x && !p) return false;
      ins.push_back(p);
      values.push_back(p ? &p->value : nullptr);
      all &= !p || p->all;
    }
    for (size_t r = 0; r < n.numResults(); ++r) budget_ -= n.result(r)->type().numel();
    if (budget_ < 0) return false;
    const std::string& op = n.op();
    const bool plain = n.domain().empty(), one = n.numResults() == 1;
    // Data movement: the data operands' known flags move the same way (index and shape operands
    // must be known). Elementwise, And, Or, Where: known element by element. Anything else with
    // an unknown operand: unknown, and not run (its kernel might not take made-up operands).
    const bool dataAll = op == "Concat";
    bool moves = !all && plain && one && movesData(op);
    for (size_t i = 1; moves && !dataAll && i < ins.size(); ++i) moves = !ins[i] || ins[i]->all;
    const bool pointwise = !all && plain && one && (elementwise(op) || op == "And" || op == "Or" || op == "Where");
    if (!all && !moves && !pointwise) return unknownResults(n, {});
    std::vector<Tensor> out;
    try {
      out = cpu::runNode(n, values);
    } catch (const Error&) {
      if (all) return false;  // no CPU kernel for it
      return unknownResults(n, {});
    }
    std::vector<Tensor> known(out.size());
    if (all) {
      for (auto& k : known) k = Tensor();
    } else if (moves) {
      std::vector<Tensor> flags(ins.size());
      std::vector<const Tensor*> kin(ins.size());
      for (size_t i = 0; i < ins.size(); ++i) {
        if (!ins[i]) continue;
        if (i == 0 || dataAll) {
          flags[i] = knownOf(*ins[i], n.input(i)->type());
          kin[i] = &flags[i];
        } else {
          kin[i] = &ins[i]->value;
        }
      }
      try {
        known[0] = cpu::runNode(n, kin)[0];
      } catch (const Error&) {
        return unknownResults(n, {});
      }
    } else {
      const auto& os = n.result(0)->type().shape;
      Tensor k(n.result(0)->type());
      auto at = [&](size_t i, int64_t e, bool flag) {
        const auto& s = n.input(i)->type().shape;
        const int64_t j = broadcastAt(e, os, s);
        return flag ? (ins[i]->all || ins[i]->known.getDouble(j) != 0.0) : ins[i]->value.getDouble(j) != 0.0;
      };
      for (int64_t e = 0; e < k.numel(); ++e) {
        bool kn = true;
        if (op == "And" || op == "Or") {
          const bool decides = op == "Or";  // the operand value that decides the result
          bool decided = false;
          for (size_t i = 0; i < ins.size(); ++i) {
            const bool ki = at(i, e, true);
            kn &= ki;
            decided |= ki && at(i, e, false) == decides;
          }
          kn |= decided;
        } else if (op == "Where") {
          const bool kc = at(0, e, true), c = at(0, e, false);
          const bool kx = at(1, e, true), ky = at(2, e, true);
          const double x = ins[1]->value.getDouble(broadcastAt(e, os, n.input(1)->type().shape));
          const double y = ins[2]->value.getDouble(broadcastAt(e, os, n.input(2)->type().shape));
          kn = (kc && (c ? kx : ky)) || (kx && ky && x == y);
        } else {
          for (size_t i = 0; i < ins.size(); ++i)
            if (ins[i]) kn &= at(i, e, true);
        }
        k.setDouble(e, kn ? 1.0 : 0.0);
      }
      known[0] = std::move(k);
    }
    for (size_t r = 0; r < out.size(); ++r) {
      Partial p;
      p.value = std::move(out[r]);
      p.all = all;
      if (!all) p.known = std::move(known[r]);
      memo_.emplace(n.result(r), std::move(p));
    }
    return true;
  }
  bool unknownResults(const Node& n, std::vector<Tensor> out) {
    for (size_t r = 0; r < n.numResults(); ++r) {
      Partial p;
      p.known = Tensor(n.result(r)->type());
      p.value = r < out.size() ? std::move(out[r]) : filled(n.result(r)->type(), 1.0);
      memo_.emplace(n.result(r), std::move(p));
    }
    return true;
  }

  std::map<const Value*, Partial> memo_;
  int64_t budget_;
};

}  // namespace

bool containsCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements) {
  const auto& s = mask->type().shape;
  if (s.size() < 2 || s[s.size() - 2] != Tq || s[s.size() - 1] != Tk || Tq < 2) return false;
  PartialEval pe(maxElements);
  const Partial* p = pe.eval(mask);
  if (!p) return false;
  for (int64_t e = 0, n = p->value.numel(); e < n; ++e) {
    const int64_t j = e % Tk, i = (e / Tk) % Tq;
    if (j <= i) continue;
    if ((!p->all && p->known.getDouble(e) == 0.0) || !(p->value.getDouble(e) <= -1e30)) return false;
  }
  return true;
}

bool dependsOnParams(const Value* v) {
  std::vector<const Value*> todo{v};
  std::set<const Value*> seen{v};
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x->kind() == ValueKind::Param && !x->constData()) return true;  // (bool and integer initializers are constants)
    if (const Node* n = x->producer())
      for (const Value* in : n->inputs())
        if (in && seen.insert(in).second) todo.push_back(in);
  }
  return false;
}

}  // namespace ampc
