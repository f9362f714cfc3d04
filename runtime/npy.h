// NumPy .npy files: how inputs, outputs and training data come and go. Dtypes: f16, f32, f64, i64,
// i32, i8, u8, bool (bf16 tensors are written as f32, since NumPy has no bf16).
#pragma once

#include <string>

#include "compiler/ir/ir.h"

namespace ampc {

// Error naming the file for a missing, truncated or unsupported file (Fortran order, big-endian,
// other dtypes).
Tensor readNpy(const std::string& path);
// Written atomically (temp file + rename).
void writeNpy(const std::string& path, const Tensor& t);

}  // namespace ampc
