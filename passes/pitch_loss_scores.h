// The loss scores' row pitch (pitch-loss-scores, passes/pitch_loss_scores.cpp): which values the
// CUDA target stores with a padded row pitch, as the pass recorded on each loss gradient.
#pragma once

#include <cstdint>
#include <map>

#include "compiler/ir/ir.h"

namespace ampc {

// Each pitched value (the scores, the gradient, and their views) and its row pitch in elements.
std::map<const Value*, int64_t> pitchedValues(const Graph& g);

}  // namespace ampc
