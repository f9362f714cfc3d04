// convert-f64 / convert-f32 / convert-f16 / convert-bf16: retypes every float tensor of the graph
// (inputs, params, constants, Cast targets, float tensor attributes) to one dtype and re-infers
// the results. This is whole-graph precision for reference runs (`ampc --eval --precision-run`),
// not autocast: every op runs in the one dtype. Nodes whose name matches `keep` (ampc
// --precision-run-except) run as the model wrote them: their float operands are cast back to the
// dtype they had, and their float results cast to the run's. That bisects which op's rounding
// matters (`--precision-run f64 --precision-run-except NAME`).
#include <algorithm>
#include <regex>
#include <set>

#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class ConvertPrecisionPass : public Pass {
 public:
  ConvertPrecisionPass(DType to, std::string keep) : to_(to), keep_(std::move(keep)) {}
  std::string name() const override { return "convert-" + std::string(dtypeName(to_)); }
  bool run(Graph& g) override {
    bool changed = false;
    // The kept nodes, with each operand's dtype as the model wrote it (their results keep theirs).
    std::vector<std::pair<Node*, std::vector<DType>>> kept;
    if (!keep_.empty()) {
      std::regex re;
      try {
        re = std::regex(keep_);
      } catch (const std::regex_error& e) {
        throw Error("--precision-run-except: '" + keep_ + "' is not a regex: " + e.what());
      }
      for (const auto& n : g.nodes()) {
        if (!n->def() || !std::regex_search(n->name(), re)) continue;
        std::vector<DType> was;
        for (Value* v : n->inputs()) was.push_back(v ? v->type().dtype : DType::f32);
        kept.emplace_back(n.get(), std::move(was));
      }
      if (kept.empty()) throw Error("--precision-run-except: no node's name matches '" + keep_ + "'");
    }
    // The kept nodes and the Casts around them keep their dtypes.
    std::set<const Node*> asWritten;
    for (const auto& k : kept) asWritten.insert(k.first);
    auto retype = [&](Value* v) {
      if (!isFloat(v->type().dtype) || v->type().dtype == to_) return;
      if (v->data()) v->setData(cpu::castTensor(*v->data(), to_));
      v->setType(TensorType{to_, v->type().shape});
      changed = true;
    };
    for (Value* v : g.inputs()) retype(v);
    for (Value* v : g.params()) retype(v);
    for (Value* v : g.consts()) retype(v);
    for (const auto& [n, was] : kept) {
      for (size_t i = 0; i < n->numInputs(); ++i) {
        Value* v = n->input(i);
        if (!v || !isFloat(was[i]) || was[i] == to_) continue;  // a produced operand is not retyped yet
        Node* c = g.createNode("Cast", "", {v}, {{g.uniqueName(v->name() + ".kept"), TensorType{was[i], v->type().shape}}}, n);
        c->setAttr("to", static_cast<int64_t>(dtypeToOnnx(was[i])));
        asWritten.insert(c);
        n->setInput(i, c->result(0));
      }
    }
    for (const auto& [n, was] : kept) {
      for (size_t r = 0; r < n->numResults(); ++r) {
        Value* v = n->result(r);
        if (!isFloat(v->type().dtype) || v->type().dtype == to_ || (v->uses().empty() && !g.isOutput(v))) continue;
        Node* c = g.createNode("Cast", "", {v}, {{g.uniqueName(v->name() + ".run"), TensorType{to_, v->type().shape}}}, g.nodeAfter(n));
        c->setAttr("to", static_cast<int64_t>(dtypeToOnnx(to_)));
        asWritten.insert(c);
        for (const auto& u : std::vector<Use>(v->uses()))
          if (u.user != c) u.user->setInput(static_cast<size_t>(u.operand), c->result(0));
        for (size_t o = 0; o < g.outputs().size(); ++o)
          if (g.outputs()[o] == v) g.setOutput(o, c->result(0));
      }
      changed = true;
    }
    for (const auto& n : g.nodes()) {
      if (asWritten.count(n.get())) continue;
      for (const auto& [name, a] : n->attrs()) {
        if (const auto* t = std::get_if<Tensor>(&a); t && isFloat(t->type.dtype) && t->type.dtype != to_) {
          n->setAttr(name, cpu::castTensor(*t, to_));
          changed = true;
        }
      }
      // An attribute that names a float result dtype (Cast's "to") is retargeted too.
      if (n->def() && !n->def()->dtypeAttr.empty()) {
        const std::string attr(n->def()->dtypeAttr);
        auto target = dtypeFromOnnx(static_cast<int>(n->getInt(attr, 0)));
        if (target && isFloat(*target) && *target != to_) {
          n->setAttr(attr, static_cast<int64_t>(dtypeToOnnx(to_)));
          changed = true;
        }
      }
      if (!n->def()) continue;  // a custom op keeps its declared types
      auto types = inferTypes(*n);
      for (size_t i = 0; i < n->numResults(); ++i) n->result(i)->setType(types[i]);
    }
    return changed;
  }

 private:
  DType to_;
  std::string keep_;
};

}  // namespace

std::unique_ptr<Pass> createConvertPrecisionPass(DType to, const std::string& keep) {
  return std::make_unique<ConvertPrecisionPass>(to, keep);
}

}  // namespace ampc
