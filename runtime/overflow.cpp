#include "runtime/overflow.h"

#include <cmath>
#include <deque>

#include <fmt/format.h>

namespace ampc {

namespace {

// The forward node a backward node was made for (autodiff names them "<forward>_grad/..."), or n.
std::string forwardName(const std::string& n) {
  const size_t at = n.find("_grad/");
  return at == std::string::npos ? n : n.substr(0, at);
}

}  // namespace

FiniteScan scanFinite(const Tensor& t) {
  FiniteScan s;
  if (!isFloat(t.type.dtype)) return s;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.getDouble(i);
    if (std::isnan(x)) ++s.nan;
    else if (std::isinf(x)) ++s.inf;
    else s.largest = std::max(s.largest, std::fabs(x));
  }
  return s;
}

OverflowWatch::OverflowWatch(const Graph& g) {
  const Value* scale = g.lookup("ampc.loss_scale");
  if (!scale) return;
  // Downstream of the scale: the backward it seeds, up to the unscale. Its reciprocal (the unscale's
  // factor) and the scaler's update are not on that path.
  std::deque<const Value*> todo{scale};
  while (!todo.empty()) {
    const Value* v = todo.front();
    todo.pop_front();
    for (const Use& u : v->uses()) {
      const Node* n = u.user;
      if (scaled_.count(n) || (n->domain() == "ampc" && (n->op() == "UnscaleCheck" || n->op() == "ScalerUpdate"))) continue;
      if (v == scale && n->op() == "Reciprocal") continue;
      scaled_.insert(n);
      for (size_t i = 0; i < n->numResults(); ++i) todo.push_back(n->result(i));
    }
  }
}

void OverflowWatch::observe(const Node& n, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs) {
  if (found()) return;
  std::vector<std::pair<const Value*, FiniteScan>> operands;
  for (size_t i = 0; i < ins.size(); ++i)
    if (ins[i] && isFloat(ins[i]->type.dtype)) operands.emplace_back(n.inputs()[i], scanFinite(*ins[i]));
  for (size_t r = 0; r < outs.size() && !found(); ++r) {
    const FiniteScan s = scanFinite(outs[r]);
    if (s.inf || s.nan) observeScans(n, r, s, operands);
  }
}

void OverflowWatch::observeScans(const Node& n, size_t r, const FiniteScan& s, const std::vector<std::pair<const Value*, FiniteScan>>& operands,
                                 const std::vector<std::string>& fusedWith) {
  if (found() || (s.inf == 0 && s.nan == 0)) return;
  bool inNan = false, inInf = false;
  std::vector<std::string> described;
  for (const auto& [v, o] : operands) {
    inNan |= o.nan > 0;
    inInf |= o.inf > 0;
    std::string d = fmt::format("{} {} max |x| {:.4g}", v->name(), v->type().str(), o.largest);
    if (o.inf || o.nan) d += fmt::format(" ({} Inf, {} NaN)", o.inf, o.nan);
    described.push_back(std::move(d));
  }
  const bool makesNan = s.nan > 0 && !inNan, makesInf = s.inf > 0 && !inInf && !inNan;
  if (!makesNan && !makesInf) return;
  const Value* res = n.result(r);
  found_.node = n.name().empty() ? n.result(0)->name() : n.name();
  found_.op = n.qualifiedOp();
  found_.target = forwardName(found_.node);
  if (n.op() == "Cast")  // a cast autocast placed: the op it feeds is the one to keep in f32
    for (const Use& u : res->uses())
      if (u.user->op() != "Cast") {
        found_.target = forwardName(u.user->name().empty() ? u.user->result(0)->name() : u.user->name());
        break;
      }
  found_.type = res->type().dtype;
  found_.scaled = scaled_.count(&n) != 0;
  found_.inf = s.inf;
  found_.nan = s.nan;
  found_.count = res->type().numel();
  found_.largestFinite = s.largest;
  found_.operands = std::move(described);
  found_.fusedWith = fusedWith;
}

std::string OverflowWatch::explain(int64_t step, double lossScale) const {
  if (!found())
    return fmt::format("step {}: the step was skipped, but no node made a non-finite value from finite operands (a non-finite input?)\n", step);
  const OverflowFinding& f = found_;
  const std::string type(dtypeName(f.type));
  std::string s = fmt::format("step {}: overflow: node '{}' ({}) made {} Inf and {} NaN of its {} {} values from operands without them\n",
                              step, f.node, f.op, f.inf, f.nan, f.count, type);
  if (!f.fusedWith.empty()) {
    s += "  in one launch with";
    for (size_t i = 0; i < f.fusedWith.size(); ++i) s += (i ? ", " : " ") + f.fusedWith[i];
    s += " (the operands are the launch's)\n";
  }
  for (const auto& o : f.operands) s += "  operand " + o + "\n";
  s += fmt::format("  its largest finite |x|: {:.4g}; {} holds up to {:.4g}\n", f.largestFinite, type, largestFinite(f.type));
  const std::string& fwd = f.target;
  const bool low = f.type == DType::f16 || f.type == DType::bf16;
  if (f.op == "Cast") s += fmt::format("  a Cast: the values enter {} here, on their way into '{}'\n", type, fwd);
  if (f.scaled) {
    s += fmt::format(
        "  where: the backward pass, whose values carry the loss scale {:g} (they are {:g} times the gradients). The dynamic scaler "
        "skips this step and lowers the scale: expected while the scale settles in the first steps.\n",
        lossScale, lossScale);
    if (low)
      s += fmt::format("  if it keeps happening at small scales, the gradient itself overflows {}: keep '{}' in f32 (ampc --fp32-nodes '{}') "
                       "or train at bf16\n",
                       type, fwd, fwd);
  } else {
    s += "  where: the forward pass (or an op outside the loss-scaled backward): no loss scale is involved, so the scaler cannot help and "
         "the following steps will overflow too.\n";
    if (low)
      s += fmt::format("  keep '{}' in f32: ampc --fp32-nodes '{}', or train at bf16, whose range is f32's\n", fwd, fwd);
  }
  if (!low)
    s += "  an f32 result: an overflow past 3.4e38, or an undefined operation (0/0, Inf - Inf, the log or square root of a negative "
         "number) in this op\n";
  return s;
}

}  // namespace ampc
