// fuse-relu-grad (the CUDA target's lowering, runtime/lower.cpp): a ReLU's gradient read through by
// the batch norm's gradient under it, as an explicit target node.
//
// ampc::BatchNormGrad(dY, X, scale, mean, var) whose dY is Where(Greater(y, 0), dz, 0), read only
// there, the comparison read only by the Where, y, dz and dY of one type and shape (f32/f16/bf16):
// cuda::BatchNormGrad(dz, X, scale, mean, var, y) {gate = 1} reads dz where y > 0 and 0 elsewhere,
// so the gated gradient is never written. The CPU reference gates dz exactly as the Where did and
// runs BatchNormGrad's kernel (kernels/cpu/k_target.cpp). A Where read by several nodes (a ResNet
// block's ReLU gradient, also the shortcut's) stays: the elementwise kernels fuse it with its sum.
#include <vector>

#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

bool zeroScalar(const Value* v) {
  const Tensor* t = v && v->type().numel() == 1 ? v->constData() : nullptr;
  return t && t->getDouble(0) == 0.0;
}

struct Match {
  Node *grad = nullptr, *where = nullptr, *cmp = nullptr;
};

Match match(const Graph& g, Node& n) {
  if (n.domain() != "ampc" || n.op() != "BatchNormGrad" || !n.input(0)) return {};
  const Value* dy = n.input(0);
  Node* w = dy->producer();
  if (!isOnnxOp(w, "Where") || onlyReader(g, dy) != &n || !zeroScalar(w->input(2))) return {};
  Node* c = w->input(0)->producer();
  if (!isOnnxOp(c, "Greater") || onlyReader(g, c->result(0)) != w || !zeroScalar(c->input(1))) return {};
  const DType t = dy->type().dtype;
  if (t != DType::f32 && !isLowFloat(t)) return {};
  for (const Value* v : {c->input(0), w->input(1)})
    if (v->type() != dy->type()) return {};
  return {&n, w, c};
}

class FuseReluGradPass final : public Pass {
 public:
  std::string name() const override { return "fuse-relu-grad"; }
  bool run(Graph& g) override {
    std::vector<Match> found;
    for (const auto& n : g.nodes())
      if (Match m = match(g, *n); m.grad) found.push_back(m);
    for (const Match& m : found) {
      Node& n = *m.grad;
      std::vector<Value*> ins(n.inputs().begin(), n.inputs().end());
      ins[0] = m.where->input(1);
      ins.push_back(m.cmp->input(0));
      std::vector<Value*> stands;
      for (size_t r = 0; r < n.numResults(); ++r) stands.push_back(n.result(r));
      Node* f = replaceByTargetNode(g, "BatchNormGrad", n, ins, stands, {&n, m.where, m.cmp});
      f->setAttr("gate", int64_t{1});
    }
    if (!found.empty()) g.bindOps();
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseReluGradPass() { return std::make_unique<FuseReluGradPass>(); }

}  // namespace ampc
