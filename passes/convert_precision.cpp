// convert-f64 / convert-f32 / convert-f16 / convert-bf16: retypes every float tensor of the graph
// (inputs, params, constants, Cast targets, float tensor attributes) to one dtype and re-infers
// the results. This is whole-graph precision for reference runs (`ampc --eval --precision-run`),
// not autocast: every op runs in the one dtype.
#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class ConvertPrecisionPass : public Pass {
 public:
  explicit ConvertPrecisionPass(DType to) : to_(to) {}
  std::string name() const override { return "convert-" + std::string(dtypeName(to_)); }
  bool run(Graph& g) override {
    bool changed = false;
    auto retype = [&](Value* v) {
      if (!isFloat(v->type().dtype) || v->type().dtype == to_) return;
      if (v->data()) v->setData(cpu::castTensor(*v->data(), to_));
      v->setType(TensorType{to_, v->type().shape});
      changed = true;
    };
    for (Value* v : g.inputs()) retype(v);
    for (Value* v : g.params()) retype(v);
    for (Value* v : g.consts()) retype(v);
    for (const auto& n : g.nodes()) {
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
};

}  // namespace

std::unique_ptr<Pass> createConvertPrecisionPass(DType to) { return std::make_unique<ConvertPrecisionPass>(to); }

}  // namespace ampc
