// Device helpers the CUDA kernels share: typed loads and stores by runtime dtype, launch sizes,
// block reductions.
#pragma once

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/ops.h"

namespace ampc::cuda {

// Element i of p (type t) widened to float.
__device__ __forceinline__ float loadF(const void* p, DT t, int64_t i) {
  switch (t) {
    case DT::f32: return static_cast<const float*>(p)[i];
    case DT::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case DT::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DT::i64: return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case DT::i32: return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case DT::i8: return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    case DT::u8: return static_cast<float>(static_cast<const uint8_t*>(p)[i]);
    case DT::boolean: return static_cast<const uint8_t*>(p)[i] ? 1.0f : 0.0f;
  }
  return 0.0f;
}
__device__ __forceinline__ int64_t loadI(const void* p, DT t, int64_t i) {
  switch (t) {
    case DT::i64: return static_cast<const int64_t*>(p)[i];
    case DT::i32: return static_cast<const int32_t*>(p)[i];
    case DT::i8: return static_cast<const int8_t*>(p)[i];
    case DT::u8: return static_cast<const uint8_t*>(p)[i];
    case DT::boolean: return static_cast<const uint8_t*>(p)[i] ? 1 : 0;
    default: return static_cast<int64_t>(loadF(p, t, i));  // float -> int truncates, as Cast does
  }
}
// v rounded once to type t (float -> int truncates; -> bool is v != 0).
__device__ __forceinline__ void storeF(void* p, DT t, int64_t i, float v) {
  switch (t) {
    case DT::f32: static_cast<float*>(p)[i] = v; break;
    case DT::f16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case DT::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    case DT::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DT::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DT::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DT::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DT::boolean: static_cast<uint8_t*>(p)[i] = v != 0.0f; break;
  }
}
__device__ __forceinline__ void storeI(void* p, DT t, int64_t i, int64_t v) {
  switch (t) {
    case DT::i64: static_cast<int64_t*>(p)[i] = v; break;
    case DT::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DT::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case DT::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DT::boolean: static_cast<uint8_t*>(p)[i] = v != 0; break;
    default: storeF(p, t, i, static_cast<float>(v)); break;
  }
}

// Typed conversions for kernels templated on the storage type (float, __half, __nv_bfloat16).
__device__ __forceinline__ float toF(float v) { return v; }
__device__ __forceinline__ float toF(__half v) { return __half2float(v); }
__device__ __forceinline__ float toF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T fromF(float v) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v);
  else return v;
}
// v rounded to storage type t and widened back (what a store of v as t and a load give).
__device__ __forceinline__ float roundTo(DT t, float v) {
  switch (t) {
    case DT::f16: return __half2float(__float2half_rn(v));
    case DT::bf16: return __bfloat162float(__float2bfloat16_rn(v));
    default: return v;
  }
}
// V consecutive elements of T in one load or store of V * sizeof(T) bytes (p + i aligned to it).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T, int V>
__device__ __forceinline__ void loadPack(const T* p, int64_t i, float (&o)[V]) {
  const Pack<T, V> r = *reinterpret_cast<const Pack<T, V>*>(p + i);
#pragma unroll
  for (int e = 0; e < V; ++e) o[e] = toF(r.v[e]);
}
template <typename T, int V>
__device__ __forceinline__ void storePack(T* p, int64_t i, const float (&x)[V]) {
  Pack<T, V> r;
#pragma unroll
  for (int e = 0; e < V; ++e) r.v[e] = fromF<T>(x[e]);
  *reinterpret_cast<Pack<T, V>*>(p + i) = r;
}

// Four consecutive elements of runtime type t (p + i aligned to four of them): one load or store
// for f32/f16/bf16 (the switch is per four, and warp-uniform), element-wise otherwise.
__device__ __forceinline__ void load4(const void* p, DT t, int64_t i, float (&o)[4]) {
  switch (t) {
    case DT::f32: loadPack<float, 4>(static_cast<const float*>(p), i, o); break;
    case DT::f16: loadPack<__half, 4>(static_cast<const __half*>(p), i, o); break;
    case DT::bf16: loadPack<__nv_bfloat16, 4>(static_cast<const __nv_bfloat16*>(p), i, o); break;
    default:
      for (int e = 0; e < 4; ++e) o[e] = loadF(p, t, i + e);
  }
}
__device__ __forceinline__ void store4(void* p, DT t, int64_t i, const float (&x)[4]) {
  switch (t) {
    case DT::f32: storePack<float, 4>(static_cast<float*>(p), i, x); break;
    case DT::f16: storePack<__half, 4>(static_cast<__half*>(p), i, x); break;
    case DT::bf16: storePack<__nv_bfloat16, 4>(static_cast<__nv_bfloat16*>(p), i, x); break;
    default:
      for (int e = 0; e < 4; ++e) storeF(p, t, i + e, x[e]);
  }
}

// Philox 4x32-10 on counter c with key (k0, k1), in place: the stream of kernels/cpu's Philox.
__device__ __forceinline__ void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}
// Philox's round keys for one seed, (k0 + r 0x9E3779B9, k1 + r 0xBB67AE85) for rounds r = 0..9: made
// once on the host and passed as a kernel parameter, so that each round's key is a constant-bank
// operand of its XOR instead of two adds a round (the attention forward draws four blocks a tile).
struct PhiloxKeys {
  uint32_t k[10][2];
};
inline PhiloxKeys philoxKeys(uint64_t seed) {
  PhiloxKeys p{};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r, k0 += 0x9E3779B9u, k1 += 0xBB67AE85u) p.k[r][0] = k0, p.k[r][1] = k1;
  return p;
}
// streamBlock (below) with the round keys given.
__device__ __forceinline__ void streamBlockKeyed(const PhiloxKeys& K, uint64_t step, uint32_t key, uint64_t b, uint32_t c[4]) {
  c[0] = static_cast<uint32_t>(b), c[1] = static_cast<uint32_t>(b >> 32), c[2] = static_cast<uint32_t>(step), c[3] = key;
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    const uint32_t n0 = hi1 ^ c[1] ^ K.k[r][0], n2 = hi0 ^ c[3] ^ K.k[r][1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
}
// The stream (seed, step, node key)'s Philox block b: kernels/cpu's streamBlock.
__device__ __forceinline__ void streamBlock(uint64_t seed, uint64_t step, uint32_t key, uint64_t b, uint32_t w[4]) {
  w[0] = static_cast<uint32_t>(b), w[1] = static_cast<uint32_t>(b >> 32), w[2] = static_cast<uint32_t>(step), w[3] = key;
  philox(w, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
// The random ops' uniform draws for elements 4b .. 4b+3 of the stream, in [0, 1) (kernels/cpu's
// randomUniform).
__device__ __forceinline__ void randomUniform4(uint64_t seed, uint64_t step, uint32_t key, uint64_t b, float u[4]) {
  uint32_t c[4];
  streamBlock(seed, step, key, b, c);
  for (int k = 0; k < 4; ++k) u[k] = static_cast<float>(c[k] >> 8) * (1.0f / 16777216.0f);
}
// Dropout's draws (kernels/cpu's dropoutDraw): block b holds elements 8b .. 8b+7, word k the pair
// 8b + 2k (low 16 bits) and 8b + 2k + 1 (high 16 bits). An element is kept when its draw is at
// least dropoutThreshold(ratio).
__device__ __forceinline__ uint32_t dropoutThreshold(float ratio) { return static_cast<uint32_t>(ceilf(ratio * 65536.0f)); }
__device__ __forceinline__ bool keptLow(uint32_t w, uint32_t thr) { return (w & 0xffffu) >= thr; }
__device__ __forceinline__ bool keptHigh(uint32_t w, uint32_t thr) { return (w >> 16) >= thr; }

inline int gridFor(int64_t n, int block = 256) {
  const int64_t g = (n + block - 1) / block;
  return static_cast<int>(g < 1 ? 1 : (g > 65535 * 8 ? 65535 * 8 : g));
}
#define AMPC_GRID_LOOP(i, n) for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <typename T>
__device__ __forceinline__ T blockSum(T v) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T r = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) r += part[w];
  return r;
}
__device__ __forceinline__ float blockMax(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float r = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) r = fmaxf(r, part[w]);
  return r;
}

}  // namespace ampc::cuda
