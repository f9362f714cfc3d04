// Fused attention (ampc.Attention / ampc.AttentionGrad): O = Dropout(Softmax(scale * Q KT + mask)) V
// without writing the [.., Tq, Tk] scores. The CPU reference is kernels/cpu/k_attention.cpp.
//
// Tiles of 64 queries x 64 keys, head dims up to 64 (zero-padded), four warps per block. The
// products run on tensor cores (WMMA 16x16x16, f16/bf16 in, f32 accumulate) for f16/bf16 and as
// f32 loops for f32. Scores and softmax are f32; the probabilities (and in the backward the score
// gradients) are rounded to the storage type before their products, as the reference does.
//   forward (one block per query tile): pass 1 computes each row's log-sum-exp over the key tiles;
//     pass 2 recomputes the scores, P = exp(s - lse) (dropped), and accumulates P V. No running
//     rescale: O stays in the accumulators.
//   backward (one block per key tile): for each query tile, S and dP = dO V^T, then
//     dS = P (dP - rowsum(dO O)) scale; dV += P^T dO and dK += dS^T Q in the accumulators,
//     dQ += dS K into an f32 buffer with atomics, converted at the end.
// Key tiles where every mask entry is <= -1e30 are skipped (their probabilities are exactly 0 in
// f32), unless some row of the query tile has no key above -1e30 (then nothing is skipped, so such
// rows get the same softmax as the reference). Dropout draws the Dropout op's Philox stream at the
// scores' flat index ((n * Tq + i) * Tk + j), so masks equal the CPU's.
#include <mma.h>

#include <type_traits>

#include "kernels/cuda/device.cuh"

namespace ampc::cuda {
namespace {

constexpr int kTile = 64, kThreads = 128, kMaxD = 64, kLdF = 68;
constexpr float kDead = -1e30f;

// Shared-memory row pitch (elements) of a T tile: WMMA-aligned, off the bank pattern.
template <typename T>
inline constexpr int kLdT = sizeof(T) == 4 ? 68 : 72;

template <typename T> __device__ __forceinline__ T fromF(float v);
template <> __device__ __forceinline__ float fromF<float>(float v) { return v; }
template <> __device__ __forceinline__ __half fromF<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float toF(float v) { return v; }
__device__ __forceinline__ float toF(__half v) { return __half2float(v); }
__device__ __forceinline__ float toF(__nv_bfloat16 v) { return __bfloat162float(v); }

// A warp's 16 x (16 nf) f32 accumulator tile: acc += A (16 x K) B (K x 16 nf), operands in shared
// memory. AT: A is stored transposed (element (m, k) at A[k * lda + m]); BT: B is stored
// transposed (element (k, n) at B[n * ldb + k]).
template <typename T>
struct WarpMma {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> acc[4];
  __device__ void zero() {
    for (int f = 0; f < 4; ++f) nvcuda::wmma::fill_fragment(acc[f], 0.0f);
  }
  template <bool AT, bool BT>
  __device__ void mma(const T* A, int lda, const T* B, int ldb, int K, int nf) {
    using namespace nvcuda;
    using LA = std::conditional_t<AT, wmma::col_major, wmma::row_major>;
    using LB = std::conditional_t<BT, wmma::col_major, wmma::row_major>;
    for (int k = 0; k < K; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> a;
      wmma::load_matrix_sync(a, AT ? A + k * lda : A + k, lda);
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        if (f >= nf) break;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> b;
        wmma::load_matrix_sync(b, BT ? B + f * 16 * ldb + k : B + k * ldb + f * 16, ldb);
        wmma::mma_sync(acc[f], a, b, acc[f]);
      }
    }
  }
  __device__ void store(float* C, int ldc, int nf) {
    for (int f = 0; f < nf; ++f) nvcuda::wmma::store_matrix_sync(C + f * 16, acc[f], ldc, nvcuda::wmma::mem_row_major);
  }
};
// f32: the same tile as plain FMAs (lane: row lane / 2, 32 columns).
template <>
struct WarpMma<float> {
  float acc[32];
  __device__ void zero() {
    for (float& x : acc) x = 0.0f;
  }
  template <bool AT, bool BT>
  __device__ void mma(const float* A, int lda, const float* B, int ldb, int K, int nf) {
    const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 32;
    for (int k = 0; k < K; ++k) {
      const float a = AT ? A[k * lda + r] : A[r * lda + k];
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = c0 + c;
        if (col < nf * 16) acc[c] += a * (BT ? B[col * ldb + k] : B[k * ldb + col]);
      }
    }
  }
  __device__ void store(float* C, int ldc, int nf) {
    const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 32;
    for (int c = 0; c < 32; ++c)
      if (c0 + c < nf * 16) C[r * ldc + c0 + c] = acc[c];
  }
};

// This warp's 16 rows of the scores tile, Ss = Qs Ks (K = dp, the padded head dim), in f32.
template <typename T>
__device__ void scoresTile(const T* Qs, const T* Ks, float* Ss, int dp) {
  constexpr int LT = kLdT<T>;
  const int warp = threadIdx.x >> 5;
  WarpMma<T> s;
  s.zero();
  s.template mma<false, false>(Qs + warp * 16 * LT, LT, Ks, LT, dp, 4);
  s.store(Ss + warp * 16 * kLdF, kLdF, 4);
}

// rows x cols of a row-major global matrix (pitch `ld` elements) into smem (pitch lds), zeros
// outside [rows, cols), over a kTile x kTile tile.
template <typename T>
__device__ void loadTile(T* s, int lds, const T* g, int64_t ld, int64_t rows, int64_t cols) {
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    s[r * lds + c] = r < rows && c < cols ? g[r * ld + c] : fromF<T>(0.0f);
  }
}

// Reduction over the 16 lanes that share a row in the elementwise phases.
__device__ __forceinline__ float max16(float v) {
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float sum16(float v) {
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Dropout factors of scores e0 .. e0+3 (consecutive keys of one row): 0, 1/(1-ratio), or 1 (off).
__device__ __forceinline__ void dropFactors(const AttentionArgs& a, uint64_t step, uint64_t e0, float f[4]) {
  if (a.ratio <= 0.0f) {
    f[0] = f[1] = f[2] = f[3] = 1.0f;
    return;
  }
  const float sc = 1.0f / (1.0f - a.ratio);
  float u[4];
  if ((e0 & 3) == 0) {
    dropoutUniform4(a.seed, step, a.key, e0 >> 2, u);
  } else {
    for (int k = 0; k < 4; ++k) {
      float w[4];
      dropoutUniform4(a.seed, step, a.key, (e0 + k) >> 2, w);
      u[k] = w[(e0 + k) & 3];
    }
  }
  for (int k = 0; k < 4; ++k) f[k] = u[k] >= a.ratio ? sc : 0.0f;
}

__device__ __forceinline__ float maskAt(const AttentionArgs& a, int64_t n, int64_t i, int64_t j) {
  return a.mask ? loadF(a.mask, a.maskType, (a.maskStride ? n * a.maskStride : 0) + i * a.Tk + j) : 0.0f;
}
__device__ __forceinline__ bool skipTile(const uint8_t* flags, const AttentionArgs& a, int64_t n, int qt, int kt) {
  if (!flags) return false;
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  const int64_t mb = a.maskStride ? n : 0;
  return flags[(mb * nq + qt) * nk + kt] != 0;
}

// flags[mb][qt][kt] = 1 where key tile kt is dead (every mask entry <= kDead) for query tile qt and
// every row of qt has a live key. Grid (query tiles, mask batches); dynamic smem: one int per key tile.
__global__ void maskTilesKernel(AttentionArgs a, uint8_t* flags) {
  extern __shared__ int dead[];
  __shared__ int alive[kTile];
  const int qt = blockIdx.x, nk = static_cast<int>((a.Tk + kTile - 1) / kTile), nq = gridDim.x;
  const int64_t mb = blockIdx.y, i0 = static_cast<int64_t>(qt) * kTile;
  const int rows = static_cast<int>(a.Tq - i0 < kTile ? a.Tq - i0 : kTile);
  for (int k = threadIdx.x; k < nk; k += blockDim.x) dead[k] = 1;
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) alive[r] = r < rows ? 0 : 1;
  __syncthreads();
  for (int64_t e = threadIdx.x; e < rows * a.Tk; e += blockDim.x) {
    const int r = static_cast<int>(e / a.Tk);
    const int64_t j = e % a.Tk;
    if (loadF(a.mask, a.maskType, mb * a.maskStride + (i0 + r) * a.Tk + j) > kDead) {
      dead[j / kTile] = 0;
      alive[r] = 1;
    }
  }
  __syncthreads();
  __shared__ int allAlive;
  if (threadIdx.x == 0) {
    int all = 1;
    for (int r = 0; r < kTile; ++r) all &= alive[r];
    allAlive = all;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < nk; k += blockDim.x) flags[(mb * nq + qt) * nk + k] = static_cast<uint8_t>(dead[k] && allAlive);
}

template <typename T>
size_t fwdSmem() { return 4 * kTile * kLdT<T> * sizeof(T) + kTile * kLdF * sizeof(float) + kTile * sizeof(float); }
template <typename T>
size_t bwdSmem() { return 6 * kTile * kLdT<T> * sizeof(T) + 2 * kTile * kLdF * sizeof(float) + 2 * kTile * sizeof(float); }

// Grid (query tiles, N).
template <typename T>
__global__ void __launch_bounds__(kThreads) attnFwdKernel(const T* Q, const T* KT, const T* V, T* O, float* lse,
                                                         const uint8_t* flags, AttentionArgs a) {
  constexpr int LT = kLdT<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + kTile * LT;  // [d][j]
  T* Vs = Ks + kTile * LT;  // [j][d]
  T* Ps = Vs + kTile * LT;  // [i][j]
  float* Ss = reinterpret_cast<float*>(Ps + kTile * LT);
  float* rowL = Ss + kTile * kLdF;
  const int qt = blockIdx.x, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int64_t n = blockIdx.y, i0 = static_cast<int64_t>(qt) * kTile;
  const int nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  const int dp = static_cast<int>((a.D + 15) / 16) * 16, nfv = static_cast<int>((a.Dv + 15) / 16);
  const uint64_t step = a.step ? *a.step : 0;
  loadTile(Qs, LT, Q + (n * a.Tq + i0) * a.D, a.D, a.Tq - i0, a.D);
  // Elementwise mapping: thread t owns rows t / 16 + 8 k (k < 8), keys (t % 16) * 4 .. + 3.
  const int r0 = t >> 4, c4 = (t & 15) * 4;
  float m[8], l[8];
  for (int k = 0; k < 8; ++k) m[k] = -INFINITY, l[k] = 0.0f;
  // pass 1: log-sum-exp of each row
  for (int kt = 0; kt < nk; ++kt) {
    if (skipTile(flags, a, n, qt, kt)) continue;
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    __syncthreads();
    loadTile(Ks, LT, KT + n * a.D * a.Tk + j0, a.Tk, a.D, a.Tk - j0);
    __syncthreads();
    scoresTile(Qs, Ks, Ss, dp);
    __syncthreads();
    for (int k = 0; k < 8; ++k) {
      const int r = r0 + 8 * k;
      const int64_t i = i0 + r;
      float s[4], mt = -INFINITY;
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + c4 + c;
        s[c] = i < a.Tq && j < a.Tk ? Ss[r * kLdF + c4 + c] * a.scale + maskAt(a, n, i, j) : -INFINITY;
        mt = fmaxf(mt, s[c]);
      }
      mt = max16(mt);
      const float mn = fmaxf(m[k], mt);
      float part = 0.0f;
      for (int c = 0; c < 4; ++c) part += s[c] == -INFINITY ? 0.0f : __expf(s[c] - mn);
      part = sum16(part);
      l[k] = (m[k] == -INFINITY ? 0.0f : l[k] * __expf(m[k] - mn)) + part;
      m[k] = mn;
    }
  }
  for (int k = 0; k < 8; ++k) {
    const int r = r0 + 8 * k;
    const float L = m[k] + logf(l[k]);
    if ((t & 15) == 0) {
      rowL[r] = L;
      if (i0 + r < a.Tq) lse[n * a.Tq + i0 + r] = L;
    }
  }
  // pass 2: O = sum_j P_ij V_j
  WarpMma<T> acc;
  acc.zero();
  for (int kt = 0; kt < nk; ++kt) {
    if (skipTile(flags, a, n, qt, kt)) continue;
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    __syncthreads();
    loadTile(Ks, LT, KT + n * a.D * a.Tk + j0, a.Tk, a.D, a.Tk - j0);
    loadTile(Vs, LT, V + (n * a.Tk + j0) * a.Dv, a.Dv, a.Tk - j0, a.Dv);
    __syncthreads();
    scoresTile(Qs, Ks, Ss, dp);
    __syncthreads();
    for (int k = 0; k < 8; ++k) {
      const int r = r0 + 8 * k;
      const int64_t i = i0 + r;
      float f[4];
      dropFactors(a, step, static_cast<uint64_t>((n * a.Tq + i) * a.Tk + j0 + c4), f);
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + c4 + c;
        float p = 0.0f;
        if (i < a.Tq && j < a.Tk) p = __expf(Ss[r * kLdF + c4 + c] * a.scale + maskAt(a, n, i, j) - rowL[r]) * f[c];
        Ps[r * LT + c4 + c] = fromF<T>(p);
      }
    }
    __syncthreads();
    acc.template mma<false, false>(Ps + warp * 16 * LT, LT, Vs, LT, kTile, nfv);
  }
  __syncthreads();
  acc.store(Ss + warp * 16 * kLdF, kLdF, nfv);
  __syncthreads();
  for (int e = t; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    if (i0 + r < a.Tq && c < a.Dv) O[(n * a.Tq + i0 + r) * a.Dv + c] = fromF<T>(Ss[r * kLdF + c]);
  }
}

// rowD[row] = sum_d dO[row, d] O[row, d] (f32), one warp per row.
template <typename T>
__global__ void rowDotKernel(const T* dO, const T* O, float* rowD, int64_t rows, int64_t Dv) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  float s = 0.0f;
  for (int64_t d = threadIdx.x & 31; d < Dv; d += 32) s += toF(dO[row * Dv + d]) * toF(O[row * Dv + d]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) rowD[row] = s;
}

template <typename T>
__global__ void fromF32Kernel(const float* x, T* y, int64_t n) {
  AMPC_GRID_LOOP(i, n) y[i] = fromF<T>(x[i]);
}

// Grid (key tiles, N).
template <typename T>
__global__ void __launch_bounds__(kThreads) attnBwdKernel(const T* dO, const T* Q, const T* KT, const T* V, const float* lse,
                                                         const float* rowD, T* dKT, T* dV, float* dQacc, const uint8_t* flags,
                                                         AttentionArgs a) {
  constexpr int LT = kLdT<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);  // [d][j]
  T* Vs = Ks + kTile * LT;             // [j][d]
  T* Qs = Vs + kTile * LT;             // [i][d]
  T* dOs = Qs + kTile * LT;            // [i][d]
  T* Ps = dOs + kTile * LT;            // [i][j], dropped
  T* dSs = Ps + kTile * LT;            // [i][j], scale * dScores
  float* Ss = reinterpret_cast<float*>(dSs + kTile * LT);
  float* dPs = Ss + kTile * kLdF;
  float* rowL = dPs + kTile * kLdF;
  float* rowDs = rowL + kTile;
  const int kt = blockIdx.x, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int64_t n = blockIdx.y, j0 = static_cast<int64_t>(kt) * kTile;
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile);
  const int dp = static_cast<int>((a.D + 15) / 16) * 16, dvp = static_cast<int>((a.Dv + 15) / 16) * 16;
  const uint64_t step = a.step ? *a.step : 0;
  loadTile(Ks, LT, KT + n * a.D * a.Tk + j0, a.Tk, a.D, a.Tk - j0);
  loadTile(Vs, LT, V + (n * a.Tk + j0) * a.Dv, a.Dv, a.Tk - j0, a.Dv);
  const int r0 = t >> 4, c4 = (t & 15) * 4;
  WarpMma<T> dKacc, dVacc;
  dKacc.zero();
  dVacc.zero();
  for (int qt = 0; qt < nq; ++qt) {
    if (skipTile(flags, a, n, qt, kt)) continue;
    const int64_t i0 = static_cast<int64_t>(qt) * kTile;
    __syncthreads();
    loadTile(Qs, LT, Q + (n * a.Tq + i0) * a.D, a.D, a.Tq - i0, a.D);
    loadTile(dOs, LT, dO + (n * a.Tq + i0) * a.Dv, a.Dv, a.Tq - i0, a.Dv);
    for (int r = t; r < kTile; r += kThreads) {
      rowL[r] = i0 + r < a.Tq ? lse[n * a.Tq + i0 + r] : 0.0f;
      rowDs[r] = i0 + r < a.Tq ? rowD[n * a.Tq + i0 + r] : 0.0f;
    }
    __syncthreads();
    scoresTile(Qs, Ks, Ss, dp);
    {
      WarpMma<T> s;  // dP = dO V^T
      s.zero();
      s.template mma<false, true>(dOs + warp * 16 * LT, LT, Vs, LT, dvp, 4);
      s.store(dPs + warp * 16 * kLdF, kLdF, 4);
    }
    __syncthreads();
    for (int k = 0; k < 8; ++k) {
      const int r = r0 + 8 * k;
      const int64_t i = i0 + r;
      float f[4];
      dropFactors(a, step, static_cast<uint64_t>((n * a.Tq + i) * a.Tk + j0 + c4), f);
      for (int c = 0; c < 4; ++c) {
        const int64_t j = j0 + c4 + c;
        float pd = 0.0f, g = 0.0f;
        if (i < a.Tq && j < a.Tk) {
          const float p = __expf(Ss[r * kLdF + c4 + c] * a.scale + maskAt(a, n, i, j) - rowL[r]);
          pd = p * f[c];
          g = a.scale * p * (dPs[r * kLdF + c4 + c] * f[c] - rowDs[r]);
        }
        Ps[r * LT + c4 + c] = fromF<T>(pd);
        dSs[r * LT + c4 + c] = fromF<T>(g);
      }
    }
    __syncthreads();
    // warp w: key rows 16w .. 16w+15 of dV and dK; query rows 16w .. of this tile's dQ
    dVacc.template mma<true, false>(Ps + warp * 16, LT, dOs, LT, kTile, dvp / 16);
    dKacc.template mma<true, false>(dSs + warp * 16, LT, Qs, LT, kTile, dp / 16);
    {
      WarpMma<T> dq;
      dq.zero();
      dq.template mma<false, true>(dSs + warp * 16 * LT, LT, Ks, LT, kTile, dp / 16);  // dS K
      dq.store(Ss + warp * 16 * kLdF, kLdF, dp / 16);
    }
    __syncthreads();
    for (int e = t; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      if (i0 + r < a.Tq && c < a.D) atomicAdd(dQacc + (n * a.Tq + i0 + r) * a.D + c, Ss[r * kLdF + c]);
    }
  }
  __syncthreads();
  dVacc.store(Ss + warp * 16 * kLdF, kLdF, dvp / 16);
  dKacc.store(dPs + warp * 16 * kLdF, kLdF, dp / 16);
  __syncthreads();
  for (int e = t; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;  // dV [j][d]
    if (j0 + r < a.Tk && c < a.Dv) dV[(n * a.Tk + j0 + r) * a.Dv + c] = fromF<T>(Ss[r * kLdF + c]);
  }
  for (int e = t; e < kTile * kTile; e += kThreads) {
    const int d = e / kTile, jj = e % kTile;  // dKT [d][j]
    if (d < a.D && j0 + jj < a.Tk) dKT[(n * a.D + d) * a.Tk + j0 + jj] = fromF<T>(dPs[jj * kLdF + d]);
  }
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
size_t flagBytes(const AttentionArgs& a) {
  return a.mask ? align256(static_cast<size_t>((a.maskStride ? a.N : 1) * cdiv(a.Tq, kTile) * cdiv(a.Tk, kTile))) : 0;
}

cudaError_t maskTiles(const AttentionArgs& a, uint8_t* flags, cudaStream_t st) {
  if (!a.mask) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(cdiv(a.Tq, kTile)), static_cast<unsigned>(a.maskStride ? a.N : 1));
  maskTilesKernel<<<grid, 256, sizeof(int) * cdiv(a.Tk, kTile), st>>>(a, flags);
  return cudaGetLastError();
}

template <typename T>
cudaError_t forwardT(const void* Q, const void* KT, const void* V, void* O, float* lse, void* scratch, const AttentionArgs& a,
                     cudaStream_t st) {
  static const cudaError_t attr = cudaFuncSetAttribute(attnFwdKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fwdSmem<T>()));
  if (attr != cudaSuccess) return attr;
  uint8_t* flags = a.mask ? static_cast<uint8_t*>(scratch) : nullptr;
  if (cudaError_t e = maskTiles(a, flags, st); e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(cdiv(a.Tq, kTile)), static_cast<unsigned>(a.N));
  attnFwdKernel<T><<<grid, kThreads, fwdSmem<T>(), st>>>(static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V),
                                                        static_cast<T*>(O), lse, flags, a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backwardT(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                      void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st) {
  static const cudaError_t attr = cudaFuncSetAttribute(attnBwdKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bwdSmem<T>()));
  if (attr != cudaSuccess) return attr;
  char* base = static_cast<char*>(scratch);
  uint8_t* flags = a.mask ? reinterpret_cast<uint8_t*>(base) : nullptr;
  base += flagBytes(a);
  float* rowD = reinterpret_cast<float*>(base);
  base += align256(sizeof(float) * a.N * a.Tq);
  float* dQacc = reinterpret_cast<float*>(base);
  const int64_t nq = a.N * a.Tq * a.D;
  if (cudaError_t e = cudaMemsetAsync(dQacc, 0, sizeof(float) * nq, st); e != cudaSuccess) return e;
  if (cudaError_t e = maskTiles(a, flags, st); e != cudaSuccess) return e;
  const int64_t rows = a.N * a.Tq;
  rowDotKernel<T><<<static_cast<unsigned>(cdiv(rows, 8)), 256, 0, st>>>(static_cast<const T*>(dO), static_cast<const T*>(O), rowD, rows, a.Dv);
  const dim3 grid(static_cast<unsigned>(cdiv(a.Tk, kTile)), static_cast<unsigned>(a.N));
  attnBwdKernel<T><<<grid, kThreads, bwdSmem<T>(), st>>>(static_cast<const T*>(dO), static_cast<const T*>(Q), static_cast<const T*>(KT),
                                                        static_cast<const T*>(V), lse, rowD, static_cast<T*>(dKT), static_cast<T*>(dV),
                                                        dQacc, flags, a);
  fromF32Kernel<T><<<gridFor(nq), 256, 0, st>>>(dQacc, static_cast<T*>(dQ), nq);
  return cudaGetLastError();
}

}  // namespace

size_t attentionScratch(const AttentionArgs& a, bool backward) {
  size_t b = flagBytes(a);
  if (backward) b += align256(sizeof(float) * a.N * a.Tq) + align256(sizeof(float) * a.N * a.Tq * a.D);
  return b;
}

cudaError_t attentionForward(const void* Q, const void* KT, const void* V, void* O, float* lse, void* scratch, const AttentionArgs& a,
                             cudaStream_t st) {
  if (a.D > kMaxD || a.Dv > kMaxD) return cudaErrorInvalidValue;
  if (a.N == 0 || a.Tq == 0) return cudaSuccess;
  switch (a.t) {
    case DT::f32: return forwardT<float>(Q, KT, V, O, lse, scratch, a, st);
    case DT::f16: return forwardT<__half>(Q, KT, V, O, lse, scratch, a, st);
    case DT::bf16: return forwardT<__nv_bfloat16>(Q, KT, V, O, lse, scratch, a, st);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t attentionBackward(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                              void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st) {
  if (a.D > kMaxD || a.Dv > kMaxD) return cudaErrorInvalidValue;
  if (a.N == 0 || (a.Tq == 0 && a.Tk == 0)) return cudaSuccess;
  switch (a.t) {
    case DT::f32: return backwardT<float>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::f16: return backwardT<__half>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::bf16: return backwardT<__nv_bfloat16>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ampc::cuda
