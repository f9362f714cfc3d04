#include "passes/attention_mask.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"

namespace ampc {

namespace {

// A value known in part: `value` where `known` (1 where known, 0 elsewhere). Both have the value's
// rank, each dim its own or 1 where the value is the same along it (a broadcast kept unexpanded:
// an Expand's result, an elementwise op's over such operands, or a value known nowhere).
struct Partial {
  Tensor value, known;
  bool all = false;   // known everywhere (`known` unused)
  bool none = false;  // known nowhere
};

Tensor filled(const TensorType& t, double x) {
  Tensor r(t);
  for (int64_t e = 0; e < r.numel(); ++e) r.setDouble(e, x);
  return r;
}

// Element e of a value of shape os, read from an operand of shape s broadcast to it (right-aligned,
// size-1 dims repeated): the operand's flat index.
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

// `t` broadcast to `type`'s shape (a copy where it is smaller).
Tensor expandTo(const Tensor& t, const TensorType& type) {
  if (t.type.shape == type.shape) return t;
  Tensor r(TensorType{t.type.dtype, type.shape});
  for (int64_t e = 0; e < r.numel(); ++e) r.setDouble(e, t.getDouble(broadcastAt(e, type.shape, t.type.shape)));
  return r;
}

class PartialEval {
 public:
  explicit PartialEval(int64_t budget) : budget_(budget) {}

  const Partial* eval(const Value* v) {
    if (auto it = memo_.find(v); it != memo_.end()) return &it->second;
    const Node* n = v->producer();
    if (const Tensor* c = v->constData()) {
      Partial p;
      p.value = *c;
      p.all = true;
      return &memo_.emplace(v, std::move(p)).first->second;
    }
    if (!n || !n->def() || n->def()->random) return &memo_.emplace(v, unknown(v->type())).first->second;  // input, parameter, random
    if (!evalNode(*n)) return nullptr;
    return &memo_.at(v);
  }

 private:
  static bool movesData(const std::string& op) {
    static const std::set<std::string> ops = {"Identity", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten", "Slice",
                                              "Tile",     "Gather",  "GatherND",  "Concat",    "Cast"};
    return ops.count(op) != 0;
  }
  // Elementwise ops evaluated here, exactly, over kept broadcasts (arithmetic on f32/f64 results,
  // and on integers of at most 2^52; comparisons, logic and Where on any type).
  static bool ownLoop(const std::string& op, DType result) {
    static const std::set<std::string> any = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where"};
    static const std::set<std::string> arith = {"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Min", "Max"};
    if (any.count(op)) return true;
    if (!arith.count(op)) return false;
    const bool wide = result == DType::f32 || result == DType::f64;
    const bool integer = result == DType::i64 || result == DType::i32;
    return wide || (integer && op != "Div");
  }
  static Partial unknown(const TensorType& t) {
    Partial p;
    TensorType one{t.dtype, std::vector<int64_t>(t.shape.size(), 1)};
    p.value = filled(one, 1.0);  // (ones: no division by zero where it is read)
    p.known = Tensor(TensorType{t.dtype, one.shape});
    p.none = true;
    return p;
  }
  bool spend(int64_t elements) {
    budget_ -= elements;
    return budget_ >= 0;
  }
  bool setUnknown(const Node& n) {
    for (size_t r = 0; r < n.numResults(); ++r) memo_.emplace(n.result(r), unknown(n.result(r)->type()));
    return true;
  }
  // Runs n's CPU kernel on `ins` at their full shapes. False where it has none (or past the budget).
  bool run(const Node& n, const std::vector<const Tensor*>& ins, std::vector<Tensor>& out) {
    std::vector<Tensor> full(ins.size());
    std::vector<const Tensor*> args(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i]) continue;
      full[i] = expandTo(*ins[i], n.input(i)->type());
      args[i] = &full[i];
    }
    for (size_t r = 0; r < n.numResults(); ++r)
      if (!spend(n.result(r)->type().numel())) return false;
    try {
      out = cpu::runNode(n, args);
    } catch (const Error&) {
      return false;
    }
    return true;
  }

  bool evalNode(const Node& n) {
    std::vector<const Partial*> ins;
    bool all = true, none = true;
    for (const Value* x : n.inputs()) {
      const Partial* p = x ? eval(x) : nullptr;
      if (x && !p) return false;
      ins.push_back(p);
      all &= !p || p->all;
    }
    const std::string& op = n.op();
    const bool plain = n.domain().empty(), one = n.numResults() == 1;
    // Expand keeps its data operand's partial value as it is (the broadcast unexpanded)
    if (plain && one && op == "Expand" && ins.size() == 2 && ins[0] && ins[1] && ins[1]->all) {
      Partial p = *ins[0];
      memo_.emplace(n.result(0), std::move(p));
      return true;
    }
    if (plain && one && ownLoop(op, n.result(0)->type().dtype)) return elementwise(n, ins, all);
    if (all) {  // known operands: the CPU kernel
      std::vector<const Tensor*> values;
      for (const Partial* p : ins) values.push_back(p ? &p->value : nullptr);
      std::vector<Tensor> out;
      if (!run(n, values, out)) return false;
      for (size_t r = 0; r < out.size(); ++r) {
        Partial p;
        p.value = std::move(out[r]);
        p.all = true;
        memo_.emplace(n.result(r), std::move(p));
      }
      return true;
    }
    // Data movement: the data operands' known flags move the same way (index and shape operands
    // must be known); data known nowhere stays so. Anything else with an unknown operand: unknown,
    // and not run (its kernel might not take made-up operands).
    const bool dataAll = op == "Concat";
    bool moves = plain && one && movesData(op);
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i]) continue;
      if (i == 0 || dataAll) none &= ins[i]->none;
      else moves &= ins[i]->all;
    }
    if (!moves || none) return setUnknown(n);
    std::vector<Tensor> flags(ins.size());
    std::vector<const Tensor*> values(ins.size()), kin(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i]) continue;
      values[i] = &ins[i]->value;
      if (i == 0 || dataAll) {
        flags[i] = ins[i]->all ? filled(TensorType{ins[i]->value.type.dtype, n.input(i)->type().shape}, 1.0) : ins[i]->known;
        kin[i] = &flags[i];
      } else {
        kin[i] = &ins[i]->value;
      }
    }
    std::vector<Tensor> out, known;
    if (!run(n, values, out) || !run(n, kin, known)) return setUnknown(n);
    Partial p;
    p.value = std::move(out[0]);
    p.known = std::move(known[0]);
    memo_.emplace(n.result(0), std::move(p));
    return true;
  }

  // One elementwise op over its operands' kept shapes: values and known flags element by element.
  bool elementwise(const Node& n, const std::vector<const Partial*>& ins, bool all) {  // all: every operand known
    const std::string& op = n.op();
    const DType rt = n.result(0)->type().dtype;
    const size_t rank = n.result(0)->type().shape.size();
    std::vector<int64_t> os(rank, 1);
    for (const Partial* p : ins) {
      if (!p) continue;
      const auto& s = p->value.type.shape;
      for (size_t k = 0; k < s.size() && k < rank; ++k) os[rank - 1 - k] = std::max(os[rank - 1 - k], s[s.size() - 1 - k]);
    }
    bool none = !all;
    for (const Partial* p : ins) none &= !p || p->none;
    if (none && op != "Where") return setUnknown(n);  // (And/Or decide only with a known operand)
    Tensor value(TensorType{rt, os}), known(TensorType{rt, os});
    if (!spend(value.numel())) return false;
    const bool integer = rt == DType::i64 || rt == DType::i32;
    std::vector<double> x(ins.size());
    std::vector<bool> k(ins.size());
    bool knownAll = true;
    for (int64_t e = 0; e < value.numel(); ++e) {
      for (size_t i = 0; i < ins.size(); ++i) {
        if (!ins[i]) continue;
        const int64_t at = broadcastAt(e, os, ins[i]->value.type.shape);
        x[i] = ins[i]->value.getDouble(at);
        k[i] = ins[i]->all || (!ins[i]->none && ins[i]->known.getDouble(at) != 0.0);
      }
      bool kn = true;
      for (size_t i = 0; i < ins.size(); ++i) kn = kn && (!ins[i] || k[i]);
      double y = 0;
      if (op == "And" || op == "Or") {
        const bool decides = op == "Or";  // the operand value that decides the result
        bool decided = false, r = !decides;
        for (size_t i = 0; i < ins.size(); ++i) {
          decided |= k[i] && (x[i] != 0.0) == decides;
          r = decides ? (r || x[i] != 0.0) : (r && x[i] != 0.0);
        }
        kn |= decided;
        y = decided ? decides : r;
      } else if (op == "Where") {
        const bool c = x[0] != 0.0;
        kn = (k[0] && (c ? k[1] : k[2])) || (k[1] && k[2] && x[1] == x[2]);
        y = c ? x[1] : x[2];
      } else if (op == "Not") {
        y = x[0] == 0.0;
      } else if (op == "Xor") {
        y = (x[0] != 0.0) != (x[1] != 0.0);
      } else if (op == "Equal") {
        y = x[0] == x[1];
      } else if (op == "Less") {
        y = x[0] < x[1];
      } else if (op == "LessOrEqual") {
        y = x[0] <= x[1];
      } else if (op == "Greater") {
        y = x[0] > x[1];
      } else if (op == "GreaterOrEqual") {
        y = x[0] >= x[1];
      } else if (op == "Neg") {
        y = -x[0];
      } else if (op == "Abs") {
        y = std::fabs(x[0]);
      } else if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Min" || op == "Max") {
        y = op == "Add" ? x[0] + x[1] : op == "Sub" ? x[0] - x[1] : op == "Mul" ? x[0] * x[1] : op == "Div" ? x[0] / x[1]
          : op == "Min" ? std::min(x[0], x[1]) : std::max(x[0], x[1]);
      }
      // Exact only where every integer (operand or result) fits a double's 2^52, or an i32 result
      // its range, and where Min and Max see no NaN (how a kernel treats it varies): else not known.
      constexpr double kExact = 4503599627370496.0;
      if (kn) {
        for (size_t i = 0; i < ins.size(); ++i)
          if (ins[i] && isInteger(n.input(i)->type().dtype)) kn = kn && std::fabs(x[i]) <= kExact;
        if (integer) kn = kn && std::fabs(y) <= (rt == DType::i32 ? 2147483647.0 : kExact);
        if (op == "Min" || op == "Max") kn = kn && !std::isnan(x[0]) && !std::isnan(x[1]);
      }
      value.setDouble(e, y);
      known.setDouble(e, kn ? 1.0 : 0.0);
      knownAll = knownAll && kn;
    }
    Partial p;
    p.value = std::move(value);
    p.all = knownAll;
    if (!knownAll) p.known = std::move(known);
    memo_.emplace(n.result(0), std::move(p));
    return true;
  }

  std::map<const Value*, Partial> memo_;
  int64_t budget_;
};

// Walks every element of every plane of `v` [.., Tq, Tk] known ahead of the step (read through the
// value's kept broadcasts): visit(i, j, known, x) returns false to stop. False where `v` is not
// [.., Tq, Tk], is not evaluated within the budget, or visit stopped.
template <typename Visit>
bool walkPlanes(const Value* v, int64_t Tq, int64_t Tk, int64_t maxElements, Visit visit) {
  const auto& s = v->type().shape;
  if (s.size() < 2 || s[s.size() - 2] != Tq || s[s.size() - 1] != Tk) return false;
  PartialEval pe(maxElements);
  const Partial* p = pe.eval(v);
  if (!p || p->none) return false;
  std::vector<int64_t> ps = p->value.type.shape;  // (an Expand's operand may have a lower rank)
  if (ps.size() < s.size()) ps.insert(ps.begin(), s.size() - ps.size(), 1);
  int64_t planes = 1;
  for (size_t d = 0; d + 2 < ps.size(); ++d) planes *= ps[d];
  std::vector<int64_t> full(ps.begin(), ps.end());
  full[full.size() - 2] = Tq, full[full.size() - 1] = Tk;
  for (int64_t plane = 0; plane < planes; ++plane)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) {
        const int64_t at = broadcastAt((plane * Tq + i) * Tk + j, full, ps);
        if (!visit(i, j, p->all || p->known.getDouble(at) != 0.0, p->value.getDouble(at))) return false;
      }
  return true;
}

}  // namespace

CausalMask classifyCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements) {
  bool exact = true;  // (kept below the diagonal too)
  const bool causal = walkPlanes(mask, Tq, Tk, maxElements, [&](int64_t i, int64_t j, bool known, double x) {
    if (j > i) return known && x <= -1e30;
    exact = exact && known && x == 0.0;
    return true;
  });
  if (!causal) return CausalMask::none;
  return exact ? CausalMask::exact : CausalMask::contains;
}

bool isCausalCondition(const Value* c, bool fillFirst, int64_t Tq, int64_t Tk, int64_t maxElements) {
  return walkPlanes(c, Tq, Tk, maxElements,
                    [&](int64_t i, int64_t j, bool known, double x) { return known && ((x != 0.0) == fillFirst) == (j > i); });
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
