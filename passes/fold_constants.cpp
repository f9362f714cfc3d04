// fold-constants: in topological order, infers each node's types and replaces nodes whose inputs
// are all compile-time constants by constants, evaluated with the CPU reference kernels.
// This is what turns exporters' shape subgraphs (Shape -> Gather -> Unsqueeze -> Concat ->
// Reshape) into constant shapes, and ONNX Constant nodes into graph constants.
#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// Results larger than this stay computed at run time (folding is for shapes and scalars).
constexpr int64_t kMaxFoldElements = 4096;

class FoldConstantsPass : public Pass {
 public:
  std::string name() const override { return "fold-constants"; }
  bool run(Graph& g) override {
    bool changed = false;
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    for (Node* n : order) changed |= inferAndFoldNode(g, n);
    return changed;
  }
};

bool tryFold(Graph& g, Node* n, const std::vector<TensorType>& types) {
  const OpDef* d = n->def();
  if (!evaluableAhead(*n)) return false;  // (a random op is not a constant, whatever its inputs)
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < n->numInputs(); ++i) {
    const Value* v = n->input(i);
    const Tensor* t = v ? v->constData() : nullptr;
    if (v && !t && !d->readsOnlyTypes) return false;
    ins.push_back(t);
  }
  if (n->numInputs() > 0)         // a source op (Constant) already holds its data
    for (const auto& t : types)
      if (t.numel() > kMaxFoldElements) return false;
  auto folded = cpu::runNode(*n, ins);
  std::vector<std::string> names;
  std::vector<Value*> consts;
  for (size_t i = 0; i < n->numResults(); ++i) {
    Value* r = n->result(i);
    names.push_back(r->name());
    Value* c = g.addConst(g.uniqueName(r->name() + ".folded"), std::move(folded[i]));
    r->replaceAllUsesWith(c);
    consts.push_back(c);
  }
  g.eraseNode(n);
  for (size_t i = 0; i < consts.size(); ++i) g.renameValue(consts[i], names[i]);
  return true;
}

}  // namespace

bool evaluableAhead(const Node& n) { return n.def() && n.domain().empty() && !n.def()->random && cpu::findKernel(n.op()); }

bool inferAndFoldNode(Graph& g, Node* n) {
  if (!n->def()) return false;  // a custom op keeps the types its model declared
  auto types = inferTypes(*n);
  bool changed = false;
  for (size_t i = 0; i < n->numResults(); ++i) {
    changed |= n->result(i)->type() != types[i];
    n->result(i)->setType(types[i]);
  }
  return tryFold(g, n, types) || changed;
}

std::unique_ptr<Pass> createFoldConstantsPass() { return std::make_unique<FoldConstantsPass>(); }

}  // namespace ampc
