// Float conversions on the GPU (f32 <-> f16/bf16), the device side of the casts autocast inserts.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ampc::cuda {

// dst[i] = round-to-nearest-even(src[i]); device pointers; 16-byte vector loads when aligned.
cudaError_t f32ToF16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream);
cudaError_t f32ToBf16(const float* src, uint16_t* dst, size_t n, cudaStream_t stream);
cudaError_t f16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream);
cudaError_t bf16ToF32(const uint16_t* src, float* dst, size_t n, cudaStream_t stream);

}  // namespace ampc::cuda
