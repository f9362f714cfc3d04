// fuse-norm-epilogue (the CUDA target's lowering, runtime/lower.cpp): what a norm's kernel can
// write on its way out, as explicit target nodes.
//
// - BatchNormalization (f32/f16/bf16) whose y is read only by Add(y, r), and/or whose y (or that
//   sum) is read only by a Relu: cuda::BatchNormalization(X, scale, B, mean, var[, r])
//   {residual, relu} writes relu(round(y) + r) in one pass (ResNet's bn3 + identity + ReLU; the Relu
//   commutes with rounding, so the result is the unfused graph's bit for bit).
// - ampc::LayerNormGrad whose dX is read only by Add(dX, r) (a transformer's residual-stream
//   gradient): cuda::LayerNormGrad(dY, X, scale, r) {residual} writes round(dX) + r.
//
// r must have the sum's type and be made before the norm (the new node takes the norm's place). A
// sum or Relu that a narrowing Cast reads alone is left to the elementwise kernel, which writes
// through the Cast. The CPU reference runs the norm's kernel and then the Add and Relu as the
// unfused nodes did (kernels/cpu/k_target.cpp).
#include <map>
#include <vector>

#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {

bool isNorm(const Node& n) {
  return isOnnxOp(&n, "BatchNormalization") || (n.domain() == "ampc" && n.op() == "LayerNormGrad");
}

// Read alone by a narrowing Cast (f32 -> f16/bf16), which the elementwise op before it writes through.
bool narrowedAlone(const Graph& g, const Value* v) {
  const Node* c = onlyReader(g, v);
  return isOnnxOp(c, "Cast") && v->type().dtype == DType::f32 && isLowFloat(c->result(0)->type().dtype);
}

struct Match {
  Node* norm = nullptr;
  Node* add = nullptr;   // the residual's Add, or null
  Node* relu = nullptr;  // BatchNormalization only
};

Match match(const Graph& g, Node& n, const std::map<const Node*, size_t>& order) {
  Match m;
  if (!isNorm(n)) return m;
  const bool bn = isOnnxOp(&n, "BatchNormalization");
  Value* y = n.result(0);
  const DType t = y->type().dtype;
  if (t != DType::f32 && !isLowFloat(t)) return m;
  if (Node* a = onlyReader(g, y); isOnnxOp(a, "Add") && a->input(0) != a->input(1) && a->result(0)->type() == y->type() &&
                                  !narrowedAlone(g, a->result(0))) {
    const Value* r = a->input(0) == y ? a->input(1) : a->input(0);
    const Node* rp = r->producer();
    if (r->type() == y->type() && (!rp || order.at(rp) < order.at(&n))) m.add = a;
  }
  if (bn) {
    const Value* v = m.add ? m.add->result(0) : y;
    if (Node* r = onlyReader(g, v); isOnnxOp(r, "Relu") && r->result(0)->type() == v->type() && !narrowedAlone(g, r->result(0)))
      m.relu = r;
  }
  if (m.add || m.relu) m.norm = &n;
  return m;
}

class FuseNormEpiloguePass final : public Pass {
 public:
  std::string name() const override { return "fuse-norm-epilogue"; }
  bool run(Graph& g) override {
    std::map<const Node*, size_t> order;
    for (const auto& n : g.nodes()) order.emplace(n.get(), order.size());
    std::vector<Match> found;
    for (const auto& n : g.nodes())
      if (Match m = match(g, *n, order); m.norm) found.push_back(m);
    // Rewritten one by one, each reading its operands now: a residual may be an earlier match's result.
    for (const Match& m : found) {
      Node& n = *m.norm;
      std::vector<Value*> ins(n.inputs().begin(), n.inputs().end());
      if (m.add) ins.push_back(m.add->input(0) == n.result(0) ? m.add->input(1) : m.add->input(0));
      Value* last = m.relu ? m.relu->result(0) : m.add->result(0);
      std::vector<Value*> stands = {last};
      for (size_t r = 1; r < n.numResults(); ++r) stands.push_back(n.result(r));
      std::vector<Node*> erase;
      if (m.relu) erase.push_back(m.relu);
      if (m.add) erase.push_back(m.add);
      erase.push_back(&n);
      const bool relu = m.relu != nullptr, residual = m.add != nullptr;
      const std::string op = n.op();
      Node* f = replaceByTargetNode(g, op, n, ins, stands, erase);
      f->setAttr("residual", static_cast<int64_t>(residual));
      if (op == "BatchNormalization") f->setAttr("relu", static_cast<int64_t>(relu));
    }
    if (!found.empty()) g.bindOps();
    return !found.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseNormEpiloguePass() { return std::make_unique<FuseNormEpiloguePass>(); }

}  // namespace ampc
