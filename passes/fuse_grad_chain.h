// The step's gradient chain folded into its optimizer (fuse-grad-chain, passes/fuse_grad_chain.cpp):
// the decision, and checking the one the pass recorded.
#pragma once

#include "compiler/ir/ir.h"

namespace ampc {

// Whether UnscaleCheck `unscale` and the ClipByGlobalNorm after it (set in *clip, or null) can fold
// into the optimizer nodes that read their results, as the graph stands.
bool foldableGradChain(const Graph& g, const Node& unscale, const Node** clip = nullptr);
// Error, naming the node, for an UnscaleCheck or clip that carries fold = "optimizer" where the
// graph no longer allows it (a rewrite after fuse-grad-chain).
void checkGradChain(const Graph& g);

}  // namespace ampc
