// Optimizer nodes that run as one launch (group-optimizers, passes/group_optimizers.cpp).
#pragma once

#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// Per node index, the index of the first node of its recorded optimizer group (or itself).
std::vector<size_t> recordedOptimizerGroups(const Graph& g);
// Error, naming the node, for a recorded group whose members can no longer share one launch.
void checkOptimizerGroups(const Graph& g);

}  // namespace ampc
