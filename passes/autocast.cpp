// autocast: whole-graph precision painting in topological order.
//   allow -> low; deny (and losses) -> FP32; infer -> the widest precision of its float
//   activation inputs; clear -> its input's precision, so it never causes a cast of its own.
//   Parameters and constants are not activations: they stay FP32 (master weights) and are cast
//   once wherever a low op reads them, one cast per (value, dtype) shared by every use. FP32
//   therefore spreads forward through infer and clear ops until an allow op takes it low.
//   Integer and bool tensors are never cast; custom-domain ops are FP32; an explicit Cast in the
//   model keeps its target; user pins win over everything. Graph outputs keep their dtypes.
//   An allow op whose results are only the angles of Sin/Cos (through clear ops) runs FP32: a
//   rotary or sinusoidal embedding's positions x frequencies reach hundreds of radians, where a
//   bf16 angle is off by a whole period (Hugging Face computes them with autocast disabled).
//   A node marked kKeepFp32 by import (a DFT's or STFT's product with its Fourier matrix) runs FP32.
#include "passes/autocast.h"

#include <algorithm>
#include <set>

namespace ampc {

std::string_view ampRuleName(AmpRule r) {
  switch (r) {
    case AmpRule::AllowList: return "allow list";
    case AmpRule::DenyList: return "deny list";
    case AmpRule::Inferred: return "inferred from inputs";
    case AmpRule::Clear: return "clear (follows input)";
    case AmpRule::CustomOp: return "custom op (FP32)";
    case AmpRule::UserPin: return "user pin";
    case AmpRule::Loss: return "loss (FP32)";
    case AmpRule::ExplicitCast: return "cast in the model";
    case AmpRule::NotFloat: return "no float data";
    case AmpRule::Angle: return "angle of Sin/Cos (FP32)";
    case AmpRule::Fp32Lowering: return "part of an FP32 op's lowering (DFT, STFT, fake quantization)";
  }
  return "?";
}

DType parsePrecision(const std::string& s) {
  if (s == "fp16" || s == "f16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  if (s == "fp32" || s == "f32") return DType::f32;
  throw Error("unknown precision '" + s + "' (use fp16, bf16 or fp32)");
}

namespace {

// The precision wider of two float dtypes (f32 wins; f16 vs bf16 promotes to f32).
DType widest(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;
}

bool isWeight(const Value* v) { return v->kind() == ValueKind::Param || v->kind() == ValueKind::Const; }

class AutocastPass : public Pass {
 public:
  AutocastPass(AutocastOptions o, AutocastReport* r) : opts_(std::move(o)), report_(r) {
    for (const auto& p : opts_.pins)
      if (!p.pattern.empty()) regexes_.emplace_back(std::regex(p.pattern), p.precision);
  }
  std::string name() const override { return "autocast"; }

  bool run(Graph& g) override {
    if (report_) {
      *report_ = AutocastReport{};
      report_->lowName = std::string(dtypeName(opts_.low));
    }
    // The dtypes the graph outputs must keep.
    std::vector<DType> outTypes;
    for (const Value* v : g.outputs()) outTypes.push_back(v->type().dtype);
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    firstNode_ = order.empty() ? nullptr : order.front();
    int inserted = 0;
    for (Node* n : order) inserted += paint(g, n);
    // Outputs keep their dtype: a low result gets a cast back, under the output's own name.
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      Value* v = g.outputs()[i];
      if (v->type().dtype == outTypes[i]) continue;
      const std::string name = v->name();
      g.renameValue(v, g.uniqueName(name + "." + std::string(dtypeName(v->type().dtype))));
      Value* back = castOf(g, v, outTypes[i]);
      g.setOutput(i, back);
      g.renameValue(back, name);
      ++inserted;
    }
    if (report_) report_->castsInserted = inserted;
    return inserted > 0;
  }

 private:
  struct Decision {
    std::optional<DType> precision;  // none: the node is left as it is
    AmpRule rule;
  };

  std::optional<DType> pinOf(const Node& n) const {
    for (const auto& p : opts_.pins)
      if (!p.name.empty() && p.name == n.name()) return p.precision;
    for (const auto& [re, dt] : regexes_)
      if (std::regex_match(n.name(), re)) return dt;
    return std::nullopt;
  }

  AmpCategory categoryOf(const Node& n) const {
    auto it = opts_.opCategories.find(n.op());
    return it != opts_.opCategories.end() ? it->second : n.def()->amp;
  }

  // Whether every use of n's results, followed through clear ops, is the input of Sin or Cos.
  bool onlyAngles(const Graph& g, const Node& n) const {
    std::vector<const Value*> work;
    for (size_t i = 0; i < n.numResults(); ++i) work.push_back(n.result(i));
    bool any = false;
    for (size_t k = 0; k < work.size() && k < 256; ++k) {
      if (g.isOutput(work[k]) || work[k]->uses().empty()) return false;
      for (const auto& use : work[k]->uses()) {
        const Node* u = use.user;
        if (!u->def() || !u->domain().empty()) return false;
        if (u->op() == "Sin" || u->op() == "Cos") {
          any = true;
        } else if (categoryOf(*u) == AmpCategory::Clear && !u->def()->explicitCast) {
          for (size_t i = 0; i < u->numResults(); ++i) work.push_back(u->result(i));
        } else {
          return false;
        }
      }
    }
    return any && work.size() <= 256;
  }

  Decision decide(const Graph& g, const Node& n) const {
    const OpDef* d = n.def();
    bool anyFloat = false;
    for (const Value* v : n.inputs()) anyFloat |= v && isFloat(v->type().dtype);
    for (size_t i = 0; i < n.numResults(); ++i) anyFloat |= isFloat(n.result(i)->type().dtype);
    if (!anyFloat) return {std::nullopt, AmpRule::NotFloat};
    if (auto pin = pinOf(n)) return {*pin, AmpRule::UserPin};
    if (!d) return {DType::f32, AmpRule::CustomOp};
    if (d->explicitCast) return {std::nullopt, AmpRule::ExplicitCast};
    if (n.getInt(kKeepFp32, 0)) return {DType::f32, AmpRule::Fp32Lowering};
    switch (categoryOf(n)) {
      case AmpCategory::Allow: return onlyAngles(g, n) ? Decision{DType::f32, AmpRule::Angle} : Decision{opts_.low, AmpRule::AllowList};
      case AmpCategory::Deny: return {DType::f32, d->loss ? AmpRule::Loss : AmpRule::DenyList};
      case AmpCategory::Infer:
      case AmpCategory::Clear: {
        // The widest float activation input decides; weights adapt. Only weights: FP32.
        std::optional<DType> p;
        for (size_t i = 0; i < n.numInputs(); ++i) {
          const Value* v = n.input(i);
          if (!v || !isFloat(v->type().dtype) || isWeight(v) || (d->fp32Operands >> i & 1)) continue;
          p = p ? widest(*p, v->type().dtype) : v->type().dtype;
        }
        return {p.value_or(DType::f32), categoryOf(n) == AmpCategory::Infer ? AmpRule::Inferred : AmpRule::Clear};
      }
    }
    return {std::nullopt, AmpRule::NotFloat};
  }

  // The value cast to `dt`, one Cast per (value, dtype), placed right after the value's producer.
  Value* castOf(Graph& g, Value* v, DType dt) {
    auto key = std::make_pair(v, dt);
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    Node* before = nullptr;
    if (Node* p = v->producer()) {
      before = g.nodeAfter(p);
    } else {
      before = firstNode_;  // casts of inputs and params go first, in the order they are made
    }
    const std::string suffix(dtypeName(dt));
    Node* c = g.createNode("Cast", "", {v}, {{g.uniqueName(v->name() + "." + suffix), TensorType{dt, v->type().shape}}}, before);
    c->setName(g.uniqueName(v->name() + "/cast_" + suffix));
    c->setAttr("to", static_cast<int64_t>(dtypeToOnnx(dt)));
    casts_[key] = c->result(0);
    return c->result(0);
  }

  // Paints one node; returns the number of casts it inserted.
  int paint(Graph& g, Node* n) {
    const Decision dec = decide(g, *n);
    int inserted = 0;
    if (dec.precision) {
      const uint32_t keep = n->def() ? n->def()->fp32Operands : 0;
      for (size_t i = 0; i < n->numInputs(); ++i) {
        Value* v = n->input(i);
        if (!v || !isFloat(v->type().dtype) || (keep >> i & 1) || v->type().dtype == *dec.precision) continue;
        const size_t before = casts_.size();
        n->setInput(i, castOf(g, v, *dec.precision));
        inserted += casts_.size() != before;
      }
      if (n->def()) {
        auto types = inferTypes(*n);
        for (size_t i = 0; i < n->numResults(); ++i) n->result(i)->setType(types[i]);
      }
    }
    if (report_) {
      AutocastReport::Row row{n->name(), n->qualifiedOp(), "-", std::string(ampRuleName(dec.rule)), nodeFlops(*n), n};
      if (dec.rule == AmpRule::ExplicitCast) row.precision = std::string(dtypeName(n->result(0)->type().dtype));
      if (dec.precision) {
        row.precision = std::string(dtypeName(*dec.precision));
        report_->floatOps++;
        report_->flops += row.flops;
        if (isLowFloat(*dec.precision)) {
          report_->lowOps++;
          report_->lowFlops += row.flops;
        }
      }
      report_->rows.push_back(std::move(row));
    }
    return inserted;
  }

  AutocastOptions opts_;
  AutocastReport* report_;
  std::vector<std::pair<std::regex, DType>> regexes_;
  std::map<std::pair<Value*, DType>, Value*> casts_;
  Node* firstNode_ = nullptr;
};

}  // namespace

std::unique_ptr<Pass> createAutocastPass(const AutocastOptions& opts, AutocastReport* report) {
  return std::make_unique<AutocastPass>(opts, report);
}

void finalizeReport(AutocastReport& r, const Graph& g, int modelCasts) {
  std::set<const Node*> alive;
  for (const auto& n : g.nodes()) alive.insert(n.get());
  r.floatOps = r.lowOps = 0;
  r.flops = r.lowFlops = 0;
  for (auto& row : r.rows) {
    if (row.precision == "-" || !alive.count(row.ir)) continue;
    for (size_t i = 0; i < row.ir->numResults(); ++i) {
      const DType t = row.ir->result(i)->type().dtype;
      if (!isFloat(t)) continue;
      if (std::string(dtypeName(t)) != row.precision && row.rule != ampRuleName(AmpRule::ExplicitCast)) {
        row.precision = std::string(dtypeName(t));
        row.rule += "; cleanup moved a cast through it";
      }
      break;
    }
    if (row.rule == ampRuleName(AmpRule::ExplicitCast)) continue;
    r.floatOps++;
    r.flops += row.flops;
    if (row.precision == "f16" || row.precision == "bf16") {
      r.lowOps++;
      r.lowFlops += row.flops;
    }
  }
  r.castsAfterCleanup = countCasts(g) - modelCasts;
}

int countCasts(const Graph& g) {
  int c = 0;
  for (const auto& n : g.nodes()) c += n->op() == "Cast" && n->domain().empty();
  return c;
}

}  // namespace ampc
