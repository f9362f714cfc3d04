// What an attention mask is, read from the graph ahead of the step: the CUDA target fuses attention
// at head dims only cuDNN's fused SDPA takes where the mask needs no gradient (passes/fuse_attention.cpp,
// attention_in_place.cpp), and the CUDA backend runs attention whose mask is the causal one through
// cuDNN's causal graph (runtime/cuda/cudnn_sdpa.h), which builds that mask itself instead of reading it.
#pragma once

#include <cstdint>
#include <map>

#include "compiler/ir/ir.h"

namespace ampc {

// The value of `v` where it is a constant or is computed from constants only (no graph input,
// parameter or random op), evaluated by the CPU reference kernels: at most `budget` result elements
// in all (decremented); null otherwise, or where a node has no CPU kernel. `memo` holds the
// evaluated values (and owns what the result points to when `v` is not a constant).
// fold-constants folds small values only, so a long sequence's causal mask is computed in the step.
const Tensor* constantValue(const Value* v, std::map<const Value*, Tensor>& memo, int64_t& budget);

// Whether `mask` [.., Tq, Tk] (every leading plane alike) is the causal mask: 0 where key j <= query
// i and at most -1e30 above (exp() of it is 0 in f32), its value known before the step
// (constantValue, at most maxElements evaluated).
bool isCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26);

// Whether `mask` [.., Tq, Tk] is at most -1e30 above the diagonal (key j > query i) whatever the
// step's inputs and parameters hold: the causal mask, with more masked besides (padding, windows).
// Evaluated ahead of the step with the inputs, parameters and random results unknown: known
// elements flow through data movement (Reshape, Expand, Transpose, Slice, Gather, Concat, Cast ...),
// elementwise ops (known where every operand is), And and Or (known where one operand decides them)
// and Where (known where its condition picks a known value, or both branches agree); other ops make
// their results unknown. At most maxElements result elements are evaluated.
bool containsCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26);

// Whether `v` is computed from a parameter that may be trained (a float initializer; bool and integer
// ones are constants, Value::constData), so that a mask made from it may need a gradient, through any
// path of producers.
bool dependsOnParams(const Value* v);

}  // namespace ampc
