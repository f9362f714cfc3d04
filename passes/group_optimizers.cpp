// group-optimizers (the CUDA target's lowering, runtime/lower.cpp): the optimizer nodes of a step
// that run as one launch (a multi-tensor apply, as PyTorch's foreach optimizers): consecutive SGD
// or Adam nodes with the same op, the same attributes and the same shared operands (lr, step,
// found_inf), nothing else in between (the optimizer tail of a train step). The pass records each
// group as `group = K` on its members (K counts the groups in node order); the CUDA program and the
// memory plan read it back (runtime/folds.h, Schedule::leader) and check it (checkOptimizerGroups).
#include "passes/group_optimizers.h"

#include <string>

#include "passes/pass.h"

namespace ampc {
namespace {

bool isOptimizer(const Node* n) { return n->domain() == "ampc" && (n->op() == "SGD" || n->op() == "Adam"); }

// What members of one launch share: the op, its attributes (not the group's own), and the operands
// after the per-tensor ones (SGD: lr, found; Adam: lr, step, found).
std::string launchKey(const Node* n) {
  std::string k = n->op() + "|";
  for (const auto& [name, a] : n->attrs()) {
    if (name == "group") continue;
    if (const float* f = std::get_if<float>(&a)) k += name + "=" + std::to_string(*f) + ";";
    else if (const int64_t* v = std::get_if<int64_t>(&a)) k += name + "=" + std::to_string(*v) + ";";
  }
  const size_t first = n->op() == "SGD" ? 3 : 4;
  for (size_t i = first; i < n->inputs().size(); ++i) k += n->inputs()[i] ? n->inputs()[i]->name() + "," : "_,";
  return k;
}

class GroupOptimizersPass final : public Pass {
 public:
  std::string name() const override { return "group-optimizers"; }
  bool run(Graph& g) override {
    std::vector<Node*> nodes;
    for (const auto& n : g.nodes()) nodes.push_back(n.get());
    bool changed = false;
    for (Node* n : nodes)
      if (isOptimizer(n) && n->hasAttr("group")) n->removeAttr("group"), changed = true;
    int64_t groups = 0;
    for (size_t i = 0; i < nodes.size();) {
      if (!isOptimizer(nodes[i])) {
        ++i;
        continue;
      }
      const std::string k = launchKey(nodes[i]);
      size_t j = i + 1;
      while (j < nodes.size() && isOptimizer(nodes[j]) && launchKey(nodes[j]) == k) ++j;
      if (j - i > 1) {
        for (size_t m = i; m < j; ++m) nodes[m]->setAttr("group", groups);
        ++groups;
        changed = true;
      }
      i = j;
    }
    return changed;
  }
};

}  // namespace

std::vector<size_t> recordedOptimizerGroups(const Graph& g) {
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());
  std::vector<size_t> leader(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    leader[i] = i;
    const Node* n = nodes[i];
    if (i > 0 && isOptimizer(n) && n->hasAttr("group") && isOptimizer(nodes[i - 1]) && nodes[i - 1]->hasAttr("group") &&
        nodes[i - 1]->getInt("group", -1) == n->getInt("group", -2))
      leader[i] = leader[i - 1];
  }
  return leader;
}

void checkOptimizerGroups(const Graph& g) {
  const std::vector<size_t> leader = recordedOptimizerGroups(g);
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());
  for (size_t i = 0; i < nodes.size(); ++i)
    if (leader[i] != i && launchKey(nodes[i]) != launchKey(nodes[leader[i]]))
      throw Error(nodes[i]->describe() + ": group = " + std::to_string(nodes[i]->getInt("group", -1)) + ", but its op, attributes or shared operands differ from " +
                  nodes[leader[i]]->describe() + "'s (a rewrite after group-optimizers; run it again)");
}

std::unique_ptr<Pass> createGroupOptimizersPass() { return std::make_unique<GroupOptimizersPass>(); }

}  // namespace ampc
