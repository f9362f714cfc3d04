// fold-comparisons (the CUDA target's lowering, runtime/lower.cpp): a float comparison (Greater,
// Less, GreaterOrEqual, LessOrEqual, Equal; not f64) whose one use is the condition of a Where, and
// not a graph output, runs inside that Where's kernel: the bool tensor is never written. The pass
// records it as fold = "where" on the comparison; the CUDA program and the memory plan read it back
// (runtime/folds.h, fusedComparison) and check it (checkComparisonFolds). Between pointwise ops
// fuse-elementwise's groups do the same; this is for the pairs no group takes.
#include "passes/fold_comparisons.h"

#include <set>

#include "passes/pass.h"

namespace ampc {
namespace {

bool isComparison(const Node& c) {
  static const std::set<std::string> kCmp = {"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"};
  return c.domain().empty() && kCmp.count(c.op()) != 0;
}

class FoldComparisonsPass final : public Pass {
 public:
  std::string name() const override { return "fold-comparisons"; }
  bool run(Graph& g) override {
    bool changed = false;
    for (const auto& n : g.nodes()) {
      const bool was = isComparison(*n) && n->hasAttr("fold");
      if (was) n->removeAttr("fold");
      const bool now = foldableComparison(g, *n);
      if (now) n->setAttr("fold", std::string("where"));
      changed = changed || was || now;
    }
    return changed;
  }
};

}  // namespace

bool foldableComparison(const Graph& g, const Node& c) {
  if (!isComparison(c)) return false;
  const Value* r = c.result(0);
  if (r->uses().size() != 1 || r->uses()[0].operand != 0 || !isOnnxOp(r->uses()[0].user, "Where") || g.isOutput(r)) return false;
  for (const Value* v : c.inputs())
    if (!v || !isFloat(v->type().dtype) || v->type().dtype == DType::f64) return false;
  return true;
}

void checkComparisonFolds(const Graph& g) {
  for (const auto& n : g.nodes())
    if (isComparison(*n) && n->getString("fold", "") == "where" && !foldableComparison(g, *n))
      throw Error(n->describe() + " -> " + n->result(0)->name() +
                  ": fold = 'where', but its one reader is no longer a Where's condition (a rewrite after fold-comparisons; run it again)");
}

std::unique_ptr<Pass> createFoldComparisonsPass() { return std::make_unique<FoldComparisonsPass>(); }

}  // namespace ampc
