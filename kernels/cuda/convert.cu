#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/convert.h"

namespace ampc::cuda {
namespace {

struct ToHalf {
  __device__ uint16_t operator()(float f) const { return __half_as_ushort(__float2half_rn(f)); }
};
struct ToBf16 {
  __device__ uint16_t operator()(float f) const { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
};
struct FromHalf {
  __device__ float operator()(uint16_t h) const { return __half2float(__ushort_as_half(h)); }
};
struct FromBf16 {
  __device__ float operator()(uint16_t h) const { return __bfloat162float(__ushort_as_bfloat16(h)); }
};

// Grid-stride elementwise map. Each thread handles a pack of kPack elements with one vector load
// when the pointers are 16-byte aligned, and the tail element by element.
template <typename In, typename Out, typename F>
__global__ void mapKernel(const In* __restrict__ src, Out* __restrict__ dst, size_t n, F f, bool vec) {
  constexpr int kPack = 16 / sizeof(In);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vec) {
    const size_t packs = n / kPack;
    for (size_t p = t; p < packs; p += stride) {
      uint4 raw = reinterpret_cast<const uint4*>(src)[p];
      const In* v = reinterpret_cast<const In*>(&raw);
#pragma unroll
      for (int k = 0; k < kPack; ++k) dst[p * kPack + k] = f(v[k]);
    }
    for (size_t i = packs * kPack + t; i < n; i += stride) dst[i] = f(src[i]);
  } else {
    for (size_t i = t; i < n; i += stride) dst[i] = f(src[i]);
  }
}

template <typename In, typename Out, typename F>
cudaError_t launch(const In* src, Out* dst, size_t n, F f, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int threads = 256;
  const size_t want = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 132 * 32 ? want : 132 * 32);
  mapKernel<<<blocks, threads, 0, stream>>>(src, dst, n, f, vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t f32ToF16(const float* s, uint16_t* d, size_t n, cudaStream_t st) { return launch(s, d, n, ToHalf{}, st); }
cudaError_t f32ToBf16(const float* s, uint16_t* d, size_t n, cudaStream_t st) { return launch(s, d, n, ToBf16{}, st); }
cudaError_t f16ToF32(const uint16_t* s, float* d, size_t n, cudaStream_t st) { return launch(s, d, n, FromHalf{}, st); }
cudaError_t bf16ToF32(const uint16_t* s, float* d, size_t n, cudaStream_t st) { return launch(s, d, n, FromBf16{}, st); }

}  // namespace ampc::cuda
