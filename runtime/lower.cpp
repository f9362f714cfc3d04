// The step graph as a target runs it (runtime/plan.h, lowerStep): for CUDA, pointwise groups fused
// into generated kernels, leaving to the CUDA backend's folds (runtime/folds.h) the nodes they
// already run inside a neighbour.
#include <map>
#include <set>

#include "compiler/ops/pointwise.h"
#include "passes/pass.h"
#include "runtime/folds.h"
#include "runtime/plan.h"

namespace ampc {
namespace {

bool pointwise(const Node* n) { return n && pointwiseFormula(*n) && n->numResults() == 1; }

// Nodes a fold runs inside a non-pointwise neighbour (a batch norm, a layer norm, a loss, a
// dropout, the optimizer): fusing them would write what the fold never writes.
bool claimedByFold(const Graph& g, const Node& n, const std::map<const Node*, int>& order) {
  using namespace folds;
  if (isOnnx(n, "Relu") && reluFolded(g, n)) return true;
  if (isOnnx(n, "Add") && (foldedRelu(g, n) || addFoldedIntoNorm(g, n, order) || addFoldedIntoDropout(g, n, order) || addGated(g, n)))
    return true;
  if (isOnnx(n, "Where") && (whereGated(g, n) || summedGate(g, n))) return true;
  if (fusedComparison(g, n)) {  // inside its Where: fused with it, or left with it
    const Node* w = n.result(0)->uses()[0].user;
    return whereGated(g, *w) || summedGate(g, *w);
  }
  if (isOnnx(n, "Cast") && castFolded(g, n)) {
    if (castReadByDropoutGrad(g, n)) return true;
    // Folded into a neighbour that is not pointwise (a loss, a norm, UnscaleCheck, a Transpose): keep
    // the fold; between pointwise ops the group does the same work in registers.
    if (isCastBetween(n, true)) {
      for (const Use& u : n.result(0)->uses())
        if (!pointwise(u.user)) return true;
      return false;
    }
    return !pointwise(n.input(0)->producer());
  }
  return false;
}

}  // namespace

int lowerStep(Graph& step, const TrainOptions& opts, const KernelGenerator& generate) {
  if (opts.target != "cuda" || !opts.fuseElementwise) return 0;
  std::map<const Node*, int> order;
  for (const auto& n : step.nodes()) order.emplace(n.get(), static_cast<int>(order.size()));
  std::set<const Node*> claimed;
  for (const auto& n : step.nodes())
    if (claimedByFold(step, *n, order)) claimed.insert(n.get());
  createFuseElementwisePass([&](const Node& n) { return claimed.count(&n) != 0; })->run(step);
  int k = 0, without = 0;
  for (const auto& n : step.nodes()) {
    if (n->domain() != "ampc" || n->op() != "Fused") continue;
    if (!generate) {
      ++without;
      continue;
    }
    try {
      const codegen::Kernel kernel = generate(*n, "ampc_fused_" + std::to_string(k++));
      n->setAttr("ptx", kernel.ptx);
      n->setAttr("entry", kernel.name);
      if (kernel.vector > 1) {
        n->setAttr("vector_entry", kernel.vectorName);
        n->setAttr("vector", static_cast<int64_t>(kernel.vector));
      }
    } catch (const codegen::NoLibdevice&) {
      ++without;  // amprun runs its ops one by one
    }
  }
  return without;
}

void expandFused(Graph& g, bool onlyWithoutKernel) {
  std::vector<Node*> fused;
  for (const auto& n : g.nodes())
    if (n->domain() == "ampc" && n->op() == "Fused" && (!onlyWithoutKernel || n->getString("ptx", "").empty())) fused.push_back(n.get());
  for (Node* f : fused) {
    const auto body = fusedBody(*f);
    std::map<const Value*, Value*> map;
    for (size_t i = 0; i < body->inputs().size(); ++i) map[body->inputs()[i]] = f->input(i);
    for (const Value* c : body->consts()) map[c] = g.addConst(g.uniqueName(f->name() + "/" + c->name()), *c->data());
    for (const auto& bn : body->nodes()) {
      std::vector<Value*> ins;
      for (const Value* v : bn->inputs()) ins.push_back(v ? map.at(v) : nullptr);
      std::vector<std::pair<std::string, TensorType>> results;
      for (size_t r = 0; r < bn->numResults(); ++r) results.emplace_back(g.uniqueName(bn->result(r)->name() + ".x"), bn->result(r)->type());
      Node* c = g.createNode(bn->op(), bn->domain(), ins, results, f);
      c->setName(bn->name());
      for (const auto& [k, a] : bn->attrs()) c->setAttr(k, a);
      for (size_t r = 0; r < bn->numResults(); ++r) map[bn->result(r)] = c->result(r);
    }
    std::vector<std::string> names;
    for (size_t r = 0; r < f->numResults(); ++r) {
      names.push_back(f->result(r)->name());
      f->result(r)->replaceAllUsesWith(map.at(body->outputs()[r]));
    }
    g.eraseNode(f);
    for (size_t r = 0; r < names.size(); ++r) g.renameValue(map.at(body->outputs()[r]), names[r]);
  }
  if (!fused.empty()) g.bindOps();
}

}  // namespace ampc
