// What the CUDA kernels can take, as plain C++ constants: the kernels (.cu) and the compile
// passes (compiler/target.cpp) read the same numbers, so a pass never plans what a kernel refuses.
#pragma once

namespace ampc::cuda {

// Fused attention (attention.cu) holds a whole head row of Q, K and V in one shared-memory tile.
inline constexpr int kAttentionMaxHeadDim = 64;

}  // namespace ampc::cuda
