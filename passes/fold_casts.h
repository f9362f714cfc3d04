// The casts a target's kernels do inside their own launches (fold-casts, passes/fold_casts.cpp):
// the decision the pass records on each such Cast as its `fold` attribute, and reading it back.
#pragma once

#include "compiler/ir/ir.h"

namespace ampc {

struct Target;  // compiler/target.h

enum class CastFold {
  None,        // the Cast launches
  Readers,     // f16/bf16 -> f32: every reader widens the narrow operand itself; the f32 result is never written
  Producer,    // f32 -> f16/bf16: the producer rounds as it stores; the f32 operand is never written
  GradReader,  // f32 -> f16/bf16: the one reader rounds the f32 operand itself; the narrow result is never written
};

// Whether c is a Cast from f16/bf16 to f32 (widening) or from f32 to f16/bf16.
bool isCastBetween(const Node* c, bool widening);
// The fold the target's kernels allow Cast c in g as it stands (None for any other node).
CastFold foldableCast(const Graph& g, const Node& c, const Target& t);
// The fold node c carries (the Cast's `fold` attribute), None where it has none. Error naming the
// node for an attribute of another value.
CastFold castFold(const Node& c);
// Error, naming the node, for a Cast whose recorded fold the graph no longer allows (a rewrite
// after fold-casts changed its readers or its producer without running fold-casts again).
void checkCastFolds(const Graph& g, const Target& t);

}  // namespace ampc
