// What an attention mask is, read from the graph ahead of the step: the CUDA target fuses attention
// at head dims only cuDNN's fused SDPA takes where the mask needs no gradient (passes/fuse_attention.cpp,
// attention_in_place.cpp), and the CUDA backend runs attention whose mask is the causal one through
// cuDNN's causal graph (runtime/cuda/cudnn_sdpa.h), which builds that mask itself instead of reading it.
#pragma once

#include <cstdint>

#include "compiler/ir/ir.h"

namespace ampc {

// What an attention mask [.., Tq, Tk] is ahead of the step, evaluated with the step's inputs,
// parameters and random results unknown: known elements flow through data movement (Reshape,
// Expand, Transpose, Slice, Gather, Concat, Cast ...), elementwise ops (known where every operand
// is), And and Or (known where one operand decides them) and Where (known where its condition picks a
// known value, or both branches agree); other ops make their results unknown. At most maxElements
// result elements are evaluated (broadcasts stay unexpanded). fold-constants folds small values only,
// so a long sequence's causal mask is computed in the step, and this evaluates it.
//   exact:    the causal mask, known: 0 where key j <= query i, at most -1e30 above (exp() of it is 0
//             in f32), in every leading plane;
//   contains: at most -1e30 above the diagonal whatever the inputs hold: the causal mask with more
//             masked besides (a causal LM's padding mask, a window);
//   none:     neither (or not known within the budget).
enum class CausalMask { none, contains, exact };
CausalMask classifyCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26);
inline bool isCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26) {
  return classifyCausalMask(mask, Tq, Tk, maxElements) == CausalMask::exact;
}
inline bool containsCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26) {
  return classifyCausalMask(mask, Tq, Tk, maxElements) != CausalMask::none;
}
// Whether a Where's condition c [.., Tq, Tk], which picks the fill where (c != 0) == fillFirst,
// picks it exactly above the diagonal (key j > query i) in every plane, known ahead of the step as
// classifyCausalMask knows a mask.
bool isCausalCondition(const Value* c, bool fillFirst, int64_t Tq, int64_t Tk, int64_t maxElements = int64_t{1} << 26);

// Whether `v` is computed from a parameter that may be trained (a float initializer; bool and integer
// ones are constants, Value::constData), so that a mask made from it may need a gradient, through any
// path of producers.
bool dependsOnParams(const Value* v);

}  // namespace ampc
