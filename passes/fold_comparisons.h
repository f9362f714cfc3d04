// A comparison run inside the Where that reads it (fold-comparisons, passes/fold_comparisons.cpp).
#pragma once

#include "compiler/ir/ir.h"

namespace ampc {

// Whether comparison c in g can run inside its Where, as the graph stands.
bool foldableComparison(const Graph& g, const Node& c);
// Error, naming the node, for a comparison that carries fold = "where" where the graph no longer
// allows it (a rewrite after fold-comparisons).
void checkComparisonFolds(const Graph& g);

}  // namespace ampc
