// Converts a buffer of `n` elements between float dtypes (f64, f32, f16, bf16) on the CPU, with
// the same rounding the GPU applies (round to nearest even, subnormals, Inf, NaN kept).
#pragma once

#include <cstddef>

#include "compiler/ir/dtype.h"

namespace ampc::cpu {

void convert(const void* src, DType from, void* dst, DType to, size_t n);

}  // namespace ampc::cpu
