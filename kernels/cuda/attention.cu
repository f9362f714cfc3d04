// Fused attention (ampc.Attention / ampc.AttentionGrad): O = Dropout(Softmax(scale * Q KT + mask)) V
// without writing the [.., Tq, Tk] scores. The CPU reference is kernels/cpu/k_attention.cpp.
//
// Tiles of 64 queries x 64 keys, four warps per block. f16/bf16 with head dims multiples of 8 up to
// 128 (and, with dropout, Tk a multiple of 8) run the mma.sync kernels further down (one-pass
// forward, scores in registers: attentionTensorCores; where built for sm_90a, the forward issues
// its products as wgmma instead: attnFwdWgKernel). Otherwise, for head dims up to 64
// (zero-padded), the products run on tensor cores through WMMA 16x16x16 (f16/bf16 in, f32
// accumulate) with the tiles in shared memory, or for f32 as FMAs on a 4 x 8 register block per lane
// (WarpMma<float>), as follows.
// Scores and softmax are f32; the probabilities (and in the backward the score gradients) are
// rounded to the storage type before their products, as the reference does.
//   forward (one block per query tile): pass 1 computes each row's log-sum-exp over the key tiles;
//     pass 2 recomputes the scores, P = exp(s - lse) (dropped), and accumulates P V. No running
//     rescale: O stays in the accumulators.
//   backward (one block per key tile): for each query tile, S and dP = dO V^T, then
//     dS = P (dP - rowsum(dO O)) scale; dV += P^T dO and dK += dS^T Q in the accumulators,
//     dQ += dS K into an f32 buffer with atomics, converted at the end (deterministic: into a
//     slice per key tile, summed in key-tile order at the end).
// Both: key tiles where every mask entry is <= -1e30 are skipped (their probabilities are exactly
// 0 in f32), unless some row of the query tile has no key above -1e30 (then nothing is skipped, so
// such rows get the same softmax as the reference). Dropout draws the Dropout op's Philox stream at the
// scores' flat index ((n * Tq + i) * Tk + j), so masks equal the CPU's; on the mma.sync path a
// kernel of their own draws the keep decisions ahead of the forward (AttentionArgs::keep, one bit a
// score), which the forward and the backward of the same step read instead of drawing. A row
// whose every score is a mask's finite fill has a log-sum-exp that lost log(l): the fix-ups at the
// end of this file (attentionFillRows*) recompute such rows after either implementation, the
// kernels' or cuDNN's.
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/limits.h"
#if AMPC_WGMMA
#include "kernels/cuda/wgmma.cuh"
#endif

namespace ampc::cuda {
namespace {

constexpr int kTile = 64, kThreads = 128, kMaxD = kAttentionMaxHeadDim, kLdF = 68;
static_assert(kMaxD == 64, "the WMMA/FMA tiles below are laid out for head rows of at most 64");
constexpr float kDead = -1e30f;

// Shared-memory row pitch (elements) of a T tile: WMMA-aligned, off the bank pattern.
template <typename T>
inline constexpr int kLdT = sizeof(T) == 4 ? 68 : 72;

// A warp's 16 x (16 nf) f32 accumulator tile: acc += A (16 x K) B (K x 16 nf), operands in shared
// memory. AT: A is stored transposed (element (m, k) at A[k * lda + m]); BT: B is stored
// transposed (element (k, n) at B[n * ldb + k]). BTL: the instance's products read B transposed
// (only the f32 tile below lays its columns out by it).
template <typename T, bool BTL = false>
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
// f32: the same tile as FMAs on a 4 x 8 block per lane. Lane (rg, cg) = (lane / 8, lane % 8) owns
// rows rg + 4 i (i < 4) and columns cg * 4 + c + 32 h (c < 4, h < 2; B read as stored, float4
// along n) or cg + 8 c (c < 8; BTL, float4 along k). At the tiles' pitch of 68 floats every
// float4 load of a warp is free of bank conflicts: 12 loads per 4 k and 128 FMAs (A as stored), or
// 24 (AT, A's 16 elements read one by one). K is a multiple of 4; all 64 columns are computed (B's
// tiles are 64 wide, zero-padded), `nf` limits the store.
template <bool BTL>
struct WarpMma<float, BTL> {
  float acc[4][8];
  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
  }
  __device__ static int column(int cg, int j) { return BTL ? cg + 8 * j : cg * 4 + (j & 3) + 32 * (j >> 2); }
  template <bool AT, bool BT>
  __device__ void mma(const float* A, int lda, const float* B, int ldb, int K, int /*nf*/) {
    static_assert(BT == BTL, "a WarpMma<float> instance reads B one way");
    const int lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
    for (int k0 = 0; k0 < K; k0 += 4) {
      float a[4][4];  // [row i][k0 + kk]
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (AT) {
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) a[i][kk] = A[(k0 + kk) * lda + rg + 4 * i];
        } else {
          const float4 v = *reinterpret_cast<const float4*>(A + (rg + 4 * i) * lda + k0);
          a[i][0] = v.x, a[i][1] = v.y, a[i][2] = v.z, a[i][3] = v.w;
        }
      }
      if constexpr (BT) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 b = *reinterpret_cast<const float4*>(B + (cg + 8 * j) * ldb + k0);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            float x = acc[i][j];
            x = fmaf(a[i][0], b.x, x);
            x = fmaf(a[i][1], b.y, x);
            x = fmaf(a[i][2], b.z, x);
            acc[i][j] = fmaf(a[i][3], b.w, x);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 b = *reinterpret_cast<const float4*>(B + (k0 + kk) * ldb + cg * 4 + 32 * h);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[i][4 * h] = fmaf(a[i][kk], b.x, acc[i][4 * h]);
              acc[i][4 * h + 1] = fmaf(a[i][kk], b.y, acc[i][4 * h + 1]);
              acc[i][4 * h + 2] = fmaf(a[i][kk], b.z, acc[i][4 * h + 2]);
              acc[i][4 * h + 3] = fmaf(a[i][kk], b.w, acc[i][4 * h + 3]);
            }
          }
      }
    }
  }
  __device__ void store(float* C, int ldc, int nf) {
    const int lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (column(cg, j) < nf * 16) C[(rg + 4 * i) * ldc + column(cg, j)] = acc[i][j];
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

// Max and sum over groups of `Lanes` consecutive lanes (16: the lanes that share a row in the
// elementwise phases; 32: the warp).
template <int Lanes>
__device__ __forceinline__ float lanesMax(float v) {
  for (int o = Lanes / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <int Lanes>
__device__ __forceinline__ float lanesSum(float v) {
  for (int o = Lanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// w[k] for a k that is not known at compile time, without a local-memory array.
__device__ __forceinline__ uint32_t pick4(const uint32_t (&w)[4], int k) { return k == 0 ? w[0] : k == 1 ? w[1] : k == 2 ? w[2] : w[3]; }

// Dropout factors of scores e0 .. e0+3 (consecutive keys of one row): 0, 1/(1-ratio), or 1 (off).
__device__ __forceinline__ void dropFactors(const AttentionArgs& a, uint64_t step, uint64_t e0, float f[4]) {
  if (a.ratio <= 0.0f) {
    f[0] = f[1] = f[2] = f[3] = 1.0f;
    return;
  }
  const float sc = 1.0f / (1.0f - a.ratio);
  const uint32_t thr = dropoutThreshold(a.ratio);
  uint32_t w[4];
  if ((e0 & 3) == 0) {  // one block: words (e0 % 8) / 2 and the next
    streamBlock(a.seed, step, a.key, e0 >> 3, w);
    const int k0 = static_cast<int>(e0 & 7) >> 1;
    const uint32_t lo = k0 == 0 ? w[0] : w[2], hi = k0 == 0 ? w[1] : w[3];
    f[0] = keptLow(lo, thr) ? sc : 0.0f, f[1] = keptHigh(lo, thr) ? sc : 0.0f;
    f[2] = keptLow(hi, thr) ? sc : 0.0f, f[3] = keptHigh(hi, thr) ? sc : 0.0f;
    return;
  }
  for (int k = 0; k < 4; ++k) {
    const uint64_t e = e0 + k;
    streamBlock(a.seed, step, a.key, e >> 3, w);
    const uint32_t v = pick4(w, static_cast<int>(e >> 1) & 3);
    f[k] = ((e & 1) ? keptHigh(v, thr) : keptLow(v, thr)) ? sc : 0.0f;
  }
}

// The mask slice batch-head n reads (one division per block), and the offset of its element (i, j).
__device__ __forceinline__ int64_t maskSlice(const AttentionArgs& a, int64_t n) { return a.mask ? (n / a.maskDiv) % a.maskMod : 0; }
__device__ __forceinline__ int64_t maskOffset(const AttentionArgs& a, int64_t mb, int64_t i, int64_t j) {
  return a.maskRows ? (mb * a.Tq + i) * a.Tk + j : mb * a.Tk + j;
}
__device__ __forceinline__ float maskAt(const AttentionArgs& a, int64_t mb, int64_t i, int64_t j) {
  return a.mask ? loadF(a.mask, a.maskType, maskOffset(a, mb, i, j)) : 0.0f;
}
__device__ __forceinline__ bool skipTile(const uint8_t* flags, const AttentionArgs& a, int64_t mb, int qt, int kt) {
  if (!flags) return false;
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  return flags[(mb * nq + qt) * nk + kt] == 1;
}
// Whether the tile's mask entries must be read: not where there is no mask, nor where every entry
// is 0 (flag 2).
__device__ __forceinline__ bool readsMask(const uint8_t* flags, const AttentionArgs& a, int64_t mb, int qt, int kt) {
  if (!a.mask || !flags) return a.mask != nullptr;
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  return flags[(mb * nq + qt) * nk + kt] != 2;
}
// A trained mask's gradient: score (n, i, j)'s d loss / d score, added to its mask element, or with
// stored as score (n, i, j)'s part (maskGradInParts; maskGradSumKernel sums the parts in a fixed order).
__device__ __forceinline__ void addMaskGrad(const AttentionArgs& a, float* parts, int64_t n, int64_t mb, int64_t i, int64_t j, float g) {
  if (!a.dMask || g == 0.0f) return;
  if (parts) parts[(n * a.Tq + i) * a.Tk + j] = g;
  else atomicAdd(a.dMask + maskOffset(a, mb, i, j), g);
}
// Each mask element of a mask gradient summed through parts (maskGradInParts): the parts of the
// batch-heads that read it (n = (o maskMod + slice) maskDiv + r) and, for a row [.., 1, Tk], of every
// query. A block takes 32 elements (threadIdx.x, along Tk) and 32 lanes of their sharers
// (threadIdx.y, sharer k, k + 32, ...), then adds the 32 lanes in order: a fixed order, so the sum is
// the same from run to run. Stop 61's kernel, one thread an element summing every sharer, took 3.4
// ms at Swin-T's first stage (4096 windows share each element of a [1, 3, 49, 49] bias: 7203
// elements, 29 blocks; H100, 2026-12-07); this one reads the parts with every SM busy.
__global__ void __launch_bounds__(1024) maskGradSumKernel(const float* parts, AttentionArgs a) {
  __shared__ float lanes[32][33];
  const int64_t rows = a.maskRows ? a.Tq : 1, total = a.maskMod * rows * a.Tk;
  const int64_t e = blockIdx.x * 32LL + threadIdx.x;
  const int64_t per = a.N / a.maskMod, queries = a.maskRows ? 1 : a.Tq, sharers = per * queries;
  float s = 0.0f;
  if (e < total) {
    const int64_t j = e % a.Tk, r = e / a.Tk % rows, slice = e / (a.Tk * rows);
    for (int64_t k = threadIdx.y; k < sharers; k += 32) {
      const int64_t m = k / queries, i = a.maskRows ? r : k % queries;
      const int64_t n = (m / a.maskDiv * a.maskMod + slice) * a.maskDiv + m % a.maskDiv;
      s += parts[(n * a.Tq + i) * a.Tk + j];
    }
  }
  lanes[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && e < total) {
    float t = 0.0f;
    for (int y = 0; y < 32; ++y) t += lanes[y][threadIdx.x];
    a.dMask[e] = t;
  }
}
// Whether a trained mask's gradient is stored per score and summed after (maskGradSumKernel) rather
// than added by atomics: with `deterministic` (a fixed order). Not by default where many scores
// share each element (a bias shared over the batch): stop 61 took parts there too, reading Swin-T's
// 1.47 ms attention backward as the atomics' contention, but it was the first stage's size (4096
// windows x 3 heads): by atomics, 4096 adds on each element of its [1, 3, 49, 49] bias, 1.28 ms;
// its shifted block, a mask of every score and no sharing, 1.47 ms (H100, 2026-12-06 and -07).
bool maskGradInParts(const AttentionArgs& a) { return a.dMask && a.deterministic; }
// The row's log-sum-exp from its running max and sum; zero_empty_rows: +inf where every score was
// -inf, so that every exp(s - LSE) is 0 (O = 0 here, no gradient in the backward).
__device__ __forceinline__ float rowLse(const AttentionArgs& a, float m, float l) {
  return a.zeroEmpty && m == -INFINITY ? INFINITY : m + logf(l);
}
// f32 tiles: P (and in the backward dS) overwrite the scores (dP) they are made from, element by
// element (the same pitch), which keeps two f32 forward and backward blocks resident per SM.
template <typename T>
inline constexpr bool kAliasP = std::is_same_v<T, float>;

// flags[mb][qt][kt] = 1 where key tile kt is dead (every mask entry <= kDead) for query tile qt and
// every row of qt has a live key; else 2 where every mask entry of the tile is 0 (the kernels need
// not read it); else 3 where the tile is causal (0 at key j <= query i, <= kDead above) and every
// row of qt has a live key (the mma kernels take -inf above the diagonal without reading the mask:
// the same probabilities, exactly 0); else 0. Two launches: maskTileKernel looks at one tile per
// block (its dead / nonzero / causal bits and which of its rows have a live key) and
// maskFlagsKernel combines a query tile's rows over the key tiles.
struct MaskTile {
  uint64_t alive;  // bit r: row r has a key above kDead in this tile (rows past Tq: set)
  uint32_t bits;   // 1 dead, 2 some entry nonzero, 4 causal
};
// Grid (key tiles, query tiles, mask batches), 256 threads: 16 entries each.
__global__ void __launch_bounds__(256) maskTileKernel(AttentionArgs a, MaskTile* tiles) {
  __shared__ int alive[kTile];
  const int kt = blockIdx.x, qt = blockIdx.y, t = threadIdx.x;
  const int64_t mb = blockIdx.z, i0 = static_cast<int64_t>(qt) * kTile, j0 = static_cast<int64_t>(kt) * kTile;
  const int rows = static_cast<int>(a.Tq - i0 < kTile ? a.Tq - i0 : kTile), cols = static_cast<int>(a.Tk - j0 < kTile ? a.Tk - j0 : kTile);
  if (t < kTile) alive[t] = t < rows ? 0 : 1;
  __syncthreads();
  float v[16];
#pragma unroll
  for (int k = 0; k < 16; ++k) {  // all loads first: 16 in flight per thread
    const int e = t + 256 * k, r = e / kTile, c = e % kTile;
    v[k] = r < rows && c < cols ? loadF(a.mask, a.maskType, maskOffset(a, mb, i0 + r, j0 + c)) : 0.0f;
  }
  int dead = 1, nonzero = 0, causal = 1;
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    const int e = t + 256 * k, r = e / kTile, c = e % kTile;
    if (r >= rows || c >= cols) continue;
    if (v[k] > kDead) dead = 0, alive[r] = 1;
    if (v[k] != 0.0f) nonzero = 1;
    if (j0 + c <= i0 + r ? v[k] != 0.0f : v[k] > kDead) causal = 0;
  }
  dead = __syncthreads_and(dead);
  nonzero = __syncthreads_or(nonzero);
  causal = __syncthreads_and(causal);
  if (t == 0) {
    uint64_t m = 0;
    for (int r = 0; r < kTile; ++r) m |= static_cast<uint64_t>(alive[r] != 0) << r;
    const int nq = gridDim.y, nk = gridDim.x;
    tiles[(mb * nq + qt) * nk + kt] = {m, static_cast<uint32_t>(dead | nonzero << 1 | causal << 2)};
  }
}
// Grid (query tiles, mask batches), one warp: the key tiles' flags of query tile qt.
__global__ void maskFlagsKernel(const MaskTile* tiles, uint8_t* flags, int nk) {
  const int qt = blockIdx.x, nq = gridDim.x, lane = threadIdx.x;
  const int64_t row = (static_cast<int64_t>(blockIdx.y) * nq + qt) * nk;
  uint64_t alive = 0;
  for (int k = lane; k < nk; k += 32) alive |= tiles[row + k].alive;
  for (int o = 16; o > 0; o >>= 1) alive |= __shfl_xor_sync(0xffffffffu, alive, o);
  const bool allAlive = alive == ~0ull;
  for (int k = lane; k < nk; k += 32) {
    const uint32_t b = tiles[row + k].bits;
    flags[row + k] = static_cast<uint8_t>((b & 1) && allAlive ? 1 : !(b & 2) ? 2 : (b & 4) && allAlive ? 3 : 0);
  }
}

template <typename T>
size_t fwdSmem() { return (kAliasP<T> ? 3 : 4) * kTile * kLdT<T> * sizeof(T) + kTile * kLdF * sizeof(float) + kTile * sizeof(float); }
template <typename T>
size_t bwdSmem() { return (kAliasP<T> ? 4 : 6) * kTile * kLdT<T> * sizeof(T) + 2 * kTile * kLdF * sizeof(float) + 2 * kTile * sizeof(float); }

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
  float* Ss = reinterpret_cast<float*>(kAliasP<T> ? Ps : Ps + kTile * LT);
  float* rowL = Ss + kTile * kLdF;
  const int qt = blockIdx.x, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int64_t n = blockIdx.y, i0 = static_cast<int64_t>(qt) * kTile;
  const int64_t mb = maskSlice(a, n);
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
    if (skipTile(flags, a, mb, qt, kt)) continue;
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    const bool rm = readsMask(flags, a, mb, qt, kt);
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
        s[c] = i < a.Tq && j < a.Tk ? Ss[r * kLdF + c4 + c] * a.scale + (rm ? maskAt(a, mb, i, j) : 0.0f) : -INFINITY;
        mt = fmaxf(mt, s[c]);
      }
      mt = lanesMax<16>(mt);
      const float mn = fmaxf(m[k], mt);
      float part = 0.0f;
      for (int c = 0; c < 4; ++c) part += s[c] == -INFINITY ? 0.0f : __expf(s[c] - mn);
      part = lanesSum<16>(part);
      l[k] = (m[k] == -INFINITY ? 0.0f : l[k] * __expf(m[k] - mn)) + part;
      m[k] = mn;
    }
  }
  for (int k = 0; k < 8; ++k) {
    const int r = r0 + 8 * k;
    const float L = rowLse(a, m[k], l[k]);
    if ((t & 15) == 0) {
      rowL[r] = L;
      if (i0 + r < a.Tq) lse[n * a.Tq + i0 + r] = L;
    }
  }
  // pass 2: O = sum_j P_ij V_j
  WarpMma<T> acc;
  acc.zero();
  for (int kt = 0; kt < nk; ++kt) {
    if (skipTile(flags, a, mb, qt, kt)) continue;
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    const bool rm = readsMask(flags, a, mb, qt, kt);
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
        if (i < a.Tq && j < a.Tk) p = __expf(Ss[r * kLdF + c4 + c] * a.scale + (rm ? maskAt(a, mb, i, j) : 0.0f) - rowL[r]) * f[c];
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

// The offset of slice n's first element (AttnLayout).
__device__ __forceinline__ int64_t sliceAt(const AttnLayout& l, int64_t n) {
  const int64_t h = n % l.heads;
  return (n / l.heads) * l.sB + (l.group == 1 ? h : h / l.group) * l.sH;
}

// rowD[row] = sum_d dO[row, d] O[row, d] (f32), row = n Tq + i, one warp per row.
template <typename T>
__global__ void rowDotKernel(const T* dO, const T* O, float* rowD, AttentionArgs a) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.N * a.Tq) return;
  const int64_t n = row / a.Tq, i = row % a.Tq;
  const T* g = dO + sliceAt(a.dO, n) + i * a.dO.sRow;
  const T* o = O + sliceAt(a.o, n) + i * a.o.sRow;
  float s = 0.0f;
  for (int64_t d = threadIdx.x & 31; d < a.Dv; d += 32) s += toF(g[d]) * toF(o[d]);
  for (int k = 16; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  if ((threadIdx.x & 31) == 0) rowD[row] = s;
}

// The same two for f16/bf16 rows of 16-byte aligned runs of 8 (rowsVec, opt-in for now): eight
// lanes a row, each 16 bytes (8 elements) a step of 64, and the indices in 32 bits (N Tq < 2^31).
// The warp-a-row kernels above read 2 bytes a lane and divide in 64 bits: at the GPT-2 shape they
// took 38 and 29 us of the backward's 0.28 ms (ncu, H100, stop 70), for 25 and 38 MB.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);  // (below: two values rounded, lo in the low half)
__device__ __forceinline__ int64_t sliceAt32(const AttnLayout& l, uint32_t n) {
  const uint32_t heads = static_cast<uint32_t>(l.heads), h = n % heads;
  return static_cast<int64_t>(n / heads) * l.sB + (l.group == 1 ? h : h / static_cast<uint32_t>(l.group)) * l.sH;
}
template <typename T>
__global__ void __launch_bounds__(256) rowDotVecKernel(const T* dO, const T* O, float* rowD, AttentionArgs a) {
  const uint32_t row = blockIdx.x * 32u + threadIdx.x / 8, rows = static_cast<uint32_t>(a.N * a.Tq), tq = static_cast<uint32_t>(a.Tq);
  float s = 0.0f;
  if (row < rows) {
    const uint32_t n = row / tq, i = row - n * tq;
    const T* g = dO + sliceAt32(a.dO, n) + i * a.dO.sRow;
    const T* o = O + sliceAt32(a.o, n) + i * a.o.sRow;
    for (int d = (threadIdx.x & 7) * 8; d < a.Dv; d += 64) {
      const uint4 gv = *reinterpret_cast<const uint4*>(g + d), ov = *reinterpret_cast<const uint4*>(o + d);
      const T* gp = reinterpret_cast<const T*>(&gv);
      const T* op = reinterpret_cast<const T*>(&ov);
#pragma unroll
      for (int k = 0; k < 8; ++k) s += toF(gp[k]) * toF(op[k]);
    }
  }
  for (int k = 4; k > 0; k >>= 1) s += __shfl_xor_sync(0xffffffffu, s, k);
  if ((threadIdx.x & 7) == 0 && row < rows) rowD[row] = s;
}
template <typename T>
__global__ void __launch_bounds__(256) fromF32VecKernel(const float* x, T* y, AttentionArgs a, int parts) {
  const uint32_t row = blockIdx.x * 32u + threadIdx.x / 8, rows = static_cast<uint32_t>(a.N * a.Tq), tq = static_cast<uint32_t>(a.Tq);
  if (row >= rows) return;
  const uint32_t n = row / tq, i = row - n * tq;
  const int64_t slice = a.N * a.Tq * a.D;
  T* dst = y + sliceAt32(a.dq, n) + i * a.dq.sRow;
  for (int d = (threadIdx.x & 7) * 8; d < a.D; d += 64) {
    const float* src = x + static_cast<int64_t>(row) * a.D + d;
    float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
    for (int p = 1; p < parts; ++p) {
      const float4 l2 = *reinterpret_cast<const float4*>(src + p * slice), h2 = *reinterpret_cast<const float4*>(src + p * slice + 4);
      lo = make_float4(lo.x + l2.x, lo.y + l2.y, lo.z + l2.z, lo.w + l2.w);
      hi = make_float4(hi.x + h2.x, hi.y + h2.y, hi.z + h2.z, hi.w + h2.w);
    }
    uint4 out;
    out.x = pack2<T>(lo.x, lo.y);
    out.y = pack2<T>(lo.z, lo.w);
    out.z = pack2<T>(hi.x, hi.y);
    out.w = pack2<T>(hi.z, hi.w);
    *reinterpret_cast<uint4*>(dst + d) = out;
  }
}
// Whether rows of `cols` elements (a multiple of 8) at p in layout l all start on 16 bytes, and N Tq
// fits the vector kernels' 32-bit indices. Opt-in (AMPC_ATTENTION_ROWS_VEC=1) until they have run
// on a GPU: stop 70 built them and had no device time left (tools/bench/stop71_call1.sh).
bool rowsVec(const AttentionArgs& a, const AttnLayout& l, const void* p, int64_t cols) {
  static const bool on = [] {
    const char* e = std::getenv("AMPC_ATTENTION_ROWS_VEC");
    return e && e[0] == '1';
  }();
  return on && reinterpret_cast<uintptr_t>(p) % 16 == 0 && cols % 8 == 0 && l.sRow % 8 == 0 && l.sB % 8 == 0 && l.sH % 8 == 0 &&
         a.N * a.Tq <= INT32_MAX && l.heads <= INT32_MAX && l.group <= INT32_MAX;
}

// dQ (layout a.dq) from the f32 accumulator [N, Tq, D], or the sum of `parts` of them in order (the
// deterministic backward's key-tile slices): a warp per row (one division each).
template <typename T>
__global__ void fromF32Kernel(const float* x, T* y, AttentionArgs a, int parts) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.N * a.Tq) return;
  const int64_t n = row / a.Tq, i = row % a.Tq, slice = a.N * a.Tq * a.D;
  T* dst = y + sliceAt(a.dq, n) + i * a.dq.sRow;
  for (int64_t d = threadIdx.x & 31; d < a.D; d += 32) {
    float s = x[row * a.D + d];
    for (int p = 1; p < parts; ++p) s += x[p * slice + row * a.D + d];
    dst[d] = fromF<T>(s);
  }
}

// Grid (key tiles, N).
template <typename T>
__global__ void __launch_bounds__(kThreads) attnBwdKernel(const T* dO, const T* Q, const T* KT, const T* V, const float* lse,
                                                         const float* rowD, T* dKT, T* dV, float* dQacc, float* dMaskParts,
                                                         const uint8_t* flags, AttentionArgs a) {
  constexpr int LT = kLdT<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);  // [d][j]
  T* Vs = Ks + kTile * LT;             // [j][d]
  T* Qs = Vs + kTile * LT;             // [i][d]
  T* dOs = Qs + kTile * LT;            // [i][d]
  T* Ps = dOs + kTile * LT;            // [i][j], dropped
  T* dSs = Ps + kTile * LT;            // [i][j], scale * dScores
  float* Ss = reinterpret_cast<float*>(kAliasP<T> ? Ps : dSs + kTile * LT);
  float* dPs = Ss + kTile * kLdF;
  if constexpr (kAliasP<T>) Ps = reinterpret_cast<T*>(Ss), dSs = reinterpret_cast<T*>(dPs);
  float* rowL = dPs + kTile * kLdF;
  float* rowDs = rowL + kTile;
  const int kt = blockIdx.x, warp = threadIdx.x >> 5, t = threadIdx.x;
  const int64_t n = blockIdx.y, j0 = static_cast<int64_t>(kt) * kTile;
  const int64_t mb = maskSlice(a, n);
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
    if (skipTile(flags, a, mb, qt, kt)) continue;
    const int64_t i0 = static_cast<int64_t>(qt) * kTile;
    const bool rm = readsMask(flags, a, mb, qt, kt);
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
      WarpMma<T, true> s;  // dP = dO V^T
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
          const float p = __expf(Ss[r * kLdF + c4 + c] * a.scale + (rm ? maskAt(a, mb, i, j) : 0.0f) - rowL[r]);
          pd = p * f[c];
          const float gs = p * (dPs[r * kLdF + c4 + c] * f[c] - rowDs[r]);  // d loss / d score
          addMaskGrad(a, dMaskParts, n, mb, i, j, gs);
          g = a.scale * gs;
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
      WarpMma<T, true> dq;
      dq.zero();
      dq.template mma<false, true>(dSs + warp * 16 * LT, LT, Ks, LT, kTile, dp / 16);  // dS K
      if constexpr (kAliasP<T>) __syncthreads();  // every warp is done with P (in Ss) before dS K goes there
      dq.store(Ss + warp * 16 * kLdF, kLdF, dp / 16);
    }
    __syncthreads();
    for (int e = t; e < kTile * kTile; e += kThreads) {
      const int r = e / kTile, c = e % kTile;
      if (i0 + r < a.Tq && c < a.D) {
        float* at = dQacc + (n * a.Tq + i0 + r) * a.D + c;
        if (a.deterministic) at[kt * a.N * a.Tq * a.D] = Ss[r * kLdF + c];
        else atomicAdd(at, Ss[r * kLdF + c]);
      }
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

// ---- f16/bf16 fast path: mma.sync m16n8k16 with the scores and softmax in registers ---------
// For head dims that are multiples of 8 up to kAttentionMaxHeadDimMma (16-byte rows of Q, V and K
// as rows, which load with cp.async; KT [d][j] rows with Tk not a multiple of 8 load element by
// element) and, with dropout, Tk a multiple of 4 (a dropout group of 4 keys never straddles two
// rows): attentionMmaShape (limits.h). The kernels are instantiated per head tile DK (64 or 128:
// head dims zero-padded to it). A warp owns 16 rows of a 64-row tile; fragments come from shared
// memory through ldmatrix (rows of 64 keys or queries at pitch kP = 72 elements, head rows at
// kPD<DK> = DK + 8: 144 or 272 bytes, no bank conflicts). The forward is one pass with the running
// max (flash attention 2): O and the row sums are rescaled when a row's max grows, and the unnormalised probabilities are
// rounded to the storage type before P V. The backward is one block per key tile: S^T = K Q^T
// and dP^T = V dO^T per warp of 16 keys, dV += P^T dO and dK += dS^T Q in registers, and
// dQ += dS K through shared memory and f32 atomics. P and dS are made in two passes over the
// warp's 32 scores with no branch per element (selects, exp2 with the scale folded in; masked tiles
// keep the natural-base formula): a branch per element split the code into small blocks whose
// latencies did not overlap, and took half the backward's time (tools/bench/NOTES.md). Tiles
// stream in three cp.async stages (two at head tile 128, dS^T over the dO tile just used). The
// mask's tile flags come precomputed (attentionMaskTiles, once per mask and step) and are staged in
// shared memory.
constexpr int kP = 72;
template <int DK>
inline constexpr int kPD = DK + 8;
// Elements of one K tile (KT [d][j]: DK rows of kP, or K rows [j][d]: 64 rows of kPD) and of one
// Q, V or dO tile ([row][d]).
template <int DK>
inline constexpr int kKBuf = DK * kP > kTile * kPD<DK> ? DK * kP : kTile * kPD<DK>;
template <int DK>
inline constexpr int kRowBuf = kTile * kPD<DK>;

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x on the MUFU (ex2.approx.ftz: 2^-inf = 0), and log2(e) for exp(x) = 2^(x log2(e)).
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float fastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t smemAddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// Four 8x8 matrices; lane L gives the address of row L % 8 of matrix L / 8.
__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smemAddr(p)));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smemAddr(p)));
}
// Fragment addresses for this lane (s: a tile in smem with pitch p, row-major as stored).
//   A (16 x 16 at m0, k0) stored [m][k]:   ldsm4(aRowMajor)   -> a0..a3
//   A stored [k][m]:                       ldsm4t(aColMajor)  -> a0..a3
//   B, two n-tiles (16 k x 16 n at k0, n0) stored [n][k]: ldsm4(bNK)  -> b0,b1 of n0, b0,b1 of n0 + 8
//   B stored [k][n]:                       ldsm4t(bKN)        -> the same
template <typename T>
__device__ __forceinline__ const T* aRowMajor(const T* s, int p, int m0, int k0) {
  const int l = threadIdx.x & 31;
  return s + (m0 + (l & 15)) * p + k0 + (l >> 4) * 8;
}
template <typename T>
__device__ __forceinline__ const T* aColMajor(const T* s, int p, int m0, int k0) {
  const int l = threadIdx.x & 31;
  return s + (k0 + (l >> 4) * 8 + (l & 7)) * p + m0 + ((l >> 3) & 1) * 8;
}
template <typename T>
__device__ __forceinline__ const T* bNK(const T* s, int p, int k0, int n0) {
  const int l = threadIdx.x & 31;
  return s + (n0 + (l >> 4) * 8 + (l & 7)) * p + k0 + ((l >> 3) & 1) * 8;
}
template <typename T>
__device__ __forceinline__ const T* bKN(const T* s, int p, int k0, int n0) {
  const int l = threadIdx.x & 31;
  return s + (k0 + ((l >> 3) & 1) * 8 + (l & 7)) * p + n0 + (l >> 4) * 8;
}
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}
// The A fragment of k-step kk from a 16 x 64 f32 accumulator in C layout (n-tiles 2kk, 2kk + 1).
template <typename T>
__device__ __forceinline__ void cToA(uint32_t (&a)[4], const float (&c)[8][4], int kk) {
  a[0] = pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

__device__ __forceinline__ void cpAsync16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smemAddr(s)), "l"(g));
}
__device__ __forceinline__ void cpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cpAsyncWait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// rows x cols of a global matrix with pitch ld into an R x C smem tile (pitch p), zeros outside.
// Rows that start on 16 bytes (g and ld) load 8 elements per cp.async; a chunk that crosses `cols`,
// or rows that do not (KT [d][j] with Tk not a multiple of 8, as ViT's 197 tokens), load element by
// element (plain stores, seen by the block after the __syncthreads that follows the cp.async wait).
// SW: into the wgmma layout instead (wgmma.cuh: panels of 64 columns, 128-byte swizzle; p unused).
template <int R, int C, bool SW = false, typename T>
__device__ void loadTileAsync(T* s, int p, const T* g, int64_t ld, int64_t rows, int64_t cols) {
  static_assert(C % (SW ? 64 : 8) == 0, "rows load in chunks of 8 elements, swizzled tiles in panels of 64");
  const bool aligned = ((reinterpret_cast<uintptr_t>(g) | static_cast<uintptr_t>(ld) * sizeof(T)) & 15) == 0;
  // 16-byte rows and a whole number of chunks a row (every tile of an aligned operand): each thread
  // keeps one column chunk (kThreads is a multiple of the chunks a row), so its chunks are one
  // source and one destination stride apart, and the swizzle is the same for each (the row step is
  // a multiple of 8). No index arithmetic per chunk: per key tile, index work had been most of the
  // forward's instructions (ncu, 2026-12-03).
  constexpr int rowChunks = C / 8, rowStep = kThreads / rowChunks, perThread = R * rowChunks / kThreads;
  if constexpr (kThreads % rowChunks == 0 && (R * rowChunks) % kThreads == 0 && rowStep % 8 == 0) {
    if (aligned && cols % 8 == 0) {
      const int r0 = threadIdx.x / rowChunks, k = (threadIdx.x % rowChunks) * 8;
      T* dst = SW ? s + (k / 64) * (R * 64) + r0 * 64 + ((((k % 64) >> 3) ^ (r0 & 7)) << 3) : s + r0 * p + k;
      const int dstStep = SW ? rowStep * 64 : rowStep * p;
      const T* src = g + r0 * ld + k;
      const int64_t srcStep = rowStep * ld;
      const bool live = k < cols;
#pragma unroll
      for (int i = 0; i < perThread; ++i, dst += dstStep, src += srcStep) {
        if (live && r0 + i * rowStep < rows) cpAsync16(dst, src);
        else *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
      }
      return;
    }
  }
  for (int c = threadIdx.x; c < R * (C / 8); c += kThreads) {
    const int r = c / (C / 8), k = (c % (C / 8)) * 8;
    T* dst = SW ? s + (k / 64) * (R * 64) + r * 64 + ((((k % 64) >> 3) ^ (r & 7)) << 3) : s + r * p + k;
    if (r < rows && k < cols) {
      if (aligned && k + 8 <= cols) {
        cpAsync16(dst, g + r * ld + k);
      } else {
        const T* src = g + r * ld + k;
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = k + e < cols ? src[e] : fromF<T>(0.0f);
      }
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Tile flags (maskTileKernel, maskFlagsKernel): 1 dead (skipped), 2 no mask entry other than 0 (the mask is not
// read), 3 causal (not read: -inf above the diagonal), 0 read it.
// This block's flags (a row over key tiles, or a column over query tiles) staged in shared memory,
// so the loops do not wait on global loads; more than kFlagsSmem tiles read them from global.
constexpr int kFlagsSmem = 256;
struct TileFlags {
  const uint8_t* g;  // null: no mask, every tile 2
  int64_t stride;    // between consecutive tiles of this block's row or column
  uint8_t* s;        // null when the count is above kFlagsSmem
  __device__ uint8_t operator[](int k) const { return !g ? 2 : s ? s[k] : g[k * stride]; }
};
// Row (key tiles of query tile qt) or column (query tiles of key tile kt) of n's flags; call with
// every thread of the block, before a __syncthreads.
__device__ TileFlags stageFlags(const uint8_t* flags, const AttentionArgs& a, int64_t n, bool row, int fixed, uint8_t* smem) {
  if (!a.mask) return {nullptr, 0, nullptr};
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  const uint8_t* base = flags + maskSlice(a, n) * nq * nk + (row ? static_cast<int64_t>(fixed) * nk : fixed);
  const int count = row ? nk : nq;
  const int64_t stride = row ? 1 : nk;
  if (count > kFlagsSmem) return {base, stride, nullptr};
  for (int k = threadIdx.x; k < count; k += blockDim.x) smem[k] = base[k * stride];
  return {base, stride, smem};
}

// Keep bits (a.keep): the forward records each score's dropout decision, and the backward reads
// them instead of drawing Philox again. A 64 x 64 tile is 128 words, one per lane of the forward:
// word fw * 32 + g * 4 + tq, bit nt * 4 + r * 2 + c holds query fw * 16 + g + 8 r, key nt * 8 +
// 2 tq + c (warp fw, lane (g, tq), fragment element (nt, r, c)).
__device__ __forceinline__ int64_t keepTile(const AttentionArgs& a, int64_t n, int qt, int kt) {
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  return ((n * nq + qt) * nk + kt) * 128;
}

// The backward's cp.async stages of Q and dO (with their rows' L and D and keep bits). At head tile
// 128, two stages, and dS^T written over the dO tile just used: 105 KB, so that two blocks share an
// SM (three stages and a dS^T of its own took 152 KB, one block of four warps per SM).
template <int DK>
inline constexpr int kBwdStages = DK == 128 ? 2 : 3;
template <int DK>
inline constexpr bool kBwdDsOverDo = DK == 128;
inline constexpr int kBwdStagesWg = 2;  // the wgmma backward's (head tile 64, attnBwdMmaKernel<.., WG>)
template <typename T, int DK>
size_t bwdSmemMma() {
  constexpr int st = kBwdStages<DK>;
  return (kKBuf<DK> + (1 + 2 * st) * kRowBuf<DK> + (kBwdDsOverDo<DK> ? 0 : kTile * kP)) * sizeof(T) + 2 * st * kTile * sizeof(float) +
         st * 128 * sizeof(uint32_t);
}

// The tensor-core forwards' dropout decisions, drawn ahead of them into a.keep (keepTile's layout:
// word fw * 32 + g * 4 + tq of a 64 x 64 tile, bit nt * 4 + r * 2 + c, for query row fw * 16 + g + 8 r
// and key nt * 8 + 2 tq + c), then read by the forward (one word a lane a tile) and by the backward.
// Drawn inside the forward, the Philox rounds ran at its three warps a scheduler and took a third of
// its time (ncu, stop 66); here they run at full occupancy. One block of 128 threads a live tile
// (the tiles the forward computes: flag not 1); grid (key tiles, query tiles, N in steps of
// gridDim.z). Keys 8q .. 8q + 7 of a row are one Philox block, whose word k holds keys 8q + 2k
// (low half) and 8q + 2k + 1 (high half): thread (fw, g, tq) draws n-tiles tq and tq + 4 of both its
// rows, and word k of each goes to lane (g, k)'s keep word, nibble nt, ORed together in shared
// memory (Tk % 8 == 0).
__global__ void __launch_bounds__(kThreads) attnKeepDrawKernel(AttentionArgs a, PhiloxKeys pk) {
  __shared__ uint32_t words[kThreads];
  const int kt = static_cast<int>(blockIdx.x), qt = static_cast<int>(blockIdx.y), nk = static_cast<int>(gridDim.x),
            nq = static_cast<int>(gridDim.y);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t i0 = static_cast<int64_t>(qt) * kTile + warp * 16 + g, j0 = static_cast<int64_t>(kt) * kTile;
  const uint64_t step = a.step ? *a.step : 0;
  // kept: a 16-bit draw at least the threshold, compared in the high half (a threshold of 65536, a
  // ratio within 2^-16 of 1, keeps none)
  const uint32_t thr = dropoutThreshold(a.ratio), thrHi = thr << 16;
  const bool none = thr > 0xffffu;
  for (int64_t n = blockIdx.z; n < a.N; n += gridDim.z) {
    if (a.mask && a.flags[(maskSlice(a, n) * nq + qt) * nk + kt] == 1) continue;  // a dead tile: the forward skips it
    words[threadIdx.x] = 0;
    __syncthreads();
    uint32_t part[4] = {0, 0, 0, 0};  // lane (g, k)'s word: bits of n-tiles tq and tq + 4, before the shift by 4 tq
#pragma unroll
    for (int r = 0; r < 2 && !none; ++r) {
      const uint64_t blk0 = static_cast<uint64_t>((n * a.Tq + i0 + 8 * r) * a.Tk + j0) >> 3;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t w[4];
        streamBlockKeyed(pk, step, a.key, blk0 + 4 * h + tq, w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (w[k] << 16 >= thrHi) part[k] |= 1u << (16 * h + r * 2);  // n-tile 4 h + tq: nibble 4 h + tq
          if (w[k] >= thrHi) part[k] |= 2u << (16 * h + r * 2);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) atomicOr(&words[warp * 32 + g * 4 + k], part[k] << (4 * tq));
    __syncthreads();
    a.keep[keepTile(a, n, qt, kt) + threadIdx.x] = words[threadIdx.x];
    __syncthreads();  // words is cleared for the next n
  }
}

// One key tile of the one-pass forward on a warp's MT m-tiles of 16 x 64 scores in m16n8 C layout
// (rows g and g + 8 of each 16, lane (g, tq)): scale and mask (flag: each m-tile's TileFlags entry;
// 1, a dead tile, gives every score -inf), the online softmax (m, l; O rescaled), then dropout by
// the keep words kw[mt] (drawn ahead by attnKeepDrawKernel and read before the tile's
// products). The m-tiles' rows are rowI, the tile's first key j0. Each phase runs over every m-tile
// before the next, so that their chains (shuffles, MUFU) interleave. Dropped probabilities become 0;
// the kept ones are not scaled by 1 / (1 - ratio) here: storeRows scales O once (the CPU reference
// rounds p / (1 - ratio) to the storage type; this rounds p, within the same rounding).
template <int DK, int MT>
__device__ __forceinline__ void softmaxTiles(float (&s)[MT][8][4], float (&o)[MT][DK / 8][4], float (&m)[MT][2], float (&l)[MT][2],
                                             const AttentionArgs& a, int64_t mb, const int64_t (&rowI)[MT][2], int64_t j0,
                                             const uint8_t (&flag)[MT], int tq, const uint32_t (&kw)[MT]) {
  const int jRem = static_cast<int>(a.Tk - j0 < kTile ? a.Tk - j0 : kTile);  // keys of this tile (32-bit checks)
  // Every score of the warp's rows lives and is s scale (no mask, no causal edge, a whole key tile,
  // every row in): the max over the raw products, then p = 2^(s scale log2(e) - m log2(e)), one
  // FFMA and the MUFU an element. Warp-uniform (the max's shuffles run in every lane).
  bool plainTiles = jRem == kTile && a.scale > 0.0f;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) plainTiles = plainTiles && flag[mt] == 2;
  const bool plain = plainTiles && __all_sync(0xffffffffu, rowI[MT - 1][1] < a.Tq);
  float mx[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float (&sm)[8][4] = s[mt];
      float x = -INFINITY;
      if (plain) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) x = fmaxf(x, fmaxf(sm[nt][2 * r], sm[nt][2 * r + 1]));
      } else {
        const int64_t i = rowI[mt][r];
        const bool rowIn = i < a.Tq;
        // keys above jLast are masked: a causal tile's above the diagonal (flag 3), a dead tile's all
        const int jLast = flag[mt] == 3 ? static_cast<int>(i - j0) : flag[mt] == 1 ? -1 : kTile;
        if (flag[mt] == 0) {  // the mask's loads stay under the bounds
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int jl = nt * 8 + 2 * tq + c;
              float v = -INFINITY;
              if (rowIn && jl < jRem && jl <= jLast) v = sm[nt][2 * r + c] * a.scale + maskAt(a, mb, i, j0 + jl);
              sm[nt][2 * r + c] = v;
              x = fmaxf(x, v);
            }
        } else {  // selects, no branch per element
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int jl = nt * 8 + 2 * tq + c;
              const float v = rowIn && jl < jRem && jl <= jLast ? sm[nt][2 * r + c] * a.scale : -INFINITY;
              sm[nt][2 * r + c] = v;
              x = fmaxf(x, v);
            }
        }
      }
      mx[mt][r] = x;
    }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[mt][r] = fmaxf(mx[mt][r], __shfl_xor_sync(0xffffffffu, mx[mt][r], 1));
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) mx[mt][r] = fmaxf(mx[mt][r], __shfl_xor_sync(0xffffffffu, mx[mt][r], 2));
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float (&sm)[8][4] = s[mt];
      const float mn = fmaxf(m[mt][r], plain ? mx[mt][r] * a.scale : mx[mt][r]), base = mn == -INFINITY ? 0.0f : mn;
      const float alpha = __expf(m[mt][r] - base);  // 0 while the row had no score
      float sum = 0.0f;
      if (plain) {
        const float sl2 = a.scale * kLog2e, bl2 = base * kLog2e;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p = fastExp2(fmaf(sm[nt][2 * r + c], sl2, -bl2));
            sum += p;
            sm[nt][2 * r + c] = p;
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float p = __expf(sm[nt][2 * r + c] - base);
            sum += p;
            sm[nt][2 * r + c] = p;
          }
      }
      l[mt][r] = l[mt][r] * alpha + sum;
      m[mt][r] = mn;
#pragma unroll
      for (int nt = 0; nt < DK / 8; ++nt) o[mt][nt][2 * r] *= alpha, o[mt][nt][2 * r + 1] *= alpha;
    }
  if (a.ratio > 0.0f) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = kw[mt] & 1u << (nt * 4 + e) ? s[mt][nt][e] : 0.0f;  // bit nt * 4 + r * 2 + c
  }
}
// One m-tile (the mma.sync forward at head tile 128, the wgmma forward).
template <int DK>
__device__ __forceinline__ void softmaxTile(float (&s)[8][4], float (&o)[DK / 8][4], float (&m)[2], float (&l)[2], const AttentionArgs& a,
                                            int64_t mb, const int64_t (&rowI)[2], int64_t j0, uint8_t flag, int tq, uint32_t kw) {
  const uint8_t f[1] = {flag};
  const uint32_t k[1] = {kw};
  softmaxTiles<DK, 1>(reinterpret_cast<float(&)[1][8][4]>(s), reinterpret_cast<float(&)[1][DK / 8][4]>(o),
                      reinterpret_cast<float(&)[1][2]>(m), reinterpret_cast<float(&)[1][2]>(l), a, mb,
                      reinterpret_cast<const int64_t(&)[1][2]>(rowI), j0, f, tq, k);
}

// The forward's end: each row's log-sum-exp, and O = acc / l.
template <typename T, int DK>
__device__ __forceinline__ void storeRows(const float (&o)[DK / 8][4], const float (&m)[2], float (&l)[2], const AttentionArgs& a, T* O,
                                          float* lse, int64_t n, const int64_t (&rowI)[2], int tq) {
  T* const On = O + sliceAt(a.o, n);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t i = rowI[r];
    if (i >= a.Tq) continue;
    const float L = rowLse(a, m[r], l[r]);
    if (tq == 0) lse[n * a.Tq + i] = L;
    // 1 / l, written as the backward (and the CPU reference) normalise, exp(s - lse): where lse
    // absorbs log(l) (a row masked everywhere by -3.4e38) both then take every p as 1. An empty
    // row under zero_empty_rows: exp(-inf - inf) = 0.
    const float inv = expf(m[r] - L) * (a.ratio > 0.0f ? 1.0f / (1.0f - a.ratio) : 1.0f);  // and dropout's 1 / (1 - ratio)
#pragma unroll
    for (int nt = 0; nt < DK / 8; ++nt) {
      const int d = nt * 8 + 2 * tq;
      if (d < a.Dv)
        *reinterpret_cast<uint32_t*>(On + i * a.o.sRow + d) = pack2<T>(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
    }
  }
}

// The one-pass forward. Grid (N, query tiles of MT x 64). DK: the head tile (64 or 128); KR: K as
// rows [j][d] (else KT [d][j]); MT: m-tiles a warp. A block holds MT x 64 queries, query tiles MT qb
// .. MT qb + MT - 1 of the 64-query grid (whose flags and keep bits it reads and writes), warp w
// rows 16 w .. 16 w + 15 of each. One m-tile runs (three blocks a SM at head tile 64, two at 128);
// two (FlashAttention-2's shape at head dim 64: each K and V fragment read from shared memory feeds
// both m-tiles, and their softmax chains interleave) are built for comparison (forwardMma) and ran
// slower with dropout. A key tile dead for some m-tiles only (a causal diagonal) is computed for
// all, the dead ones masked to -inf.
template <typename T, int DK, int MT>
size_t fwdSmemMma() {  // K and V in three stages; Q over K's third stage at one m-tile, else its own
  return (3 * (kKBuf<DK> + kRowBuf<DK>) + (MT > 1 ? MT * kRowBuf<DK> : 0)) * sizeof(T);
}
template <typename T, bool KR, int DK, int MT>
__global__ void __launch_bounds__(kThreads, MT == 1 && DK == 64 ? 3 : 2) attnFwdMmaKernel(const T* Q, const T* KT, const T* V, T* O,
                                                                                      float* lse, const uint8_t* flags, AttentionArgs a) {
  constexpr int pD = kPD<DK>, pK = KR ? pD : kP, kb = kKBuf<DK>, rb = kRowBuf<DK>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);               // 3 x [d][j] (or [j][d])
  T* Vs = Ks + 3 * kb;                               // 3 x [j][d]
  T* Qs = MT == 1 ? Ks + 2 * kb : Vs + 3 * rb;       // MT x [i][d] (one: K's third buffer, free until the loop's first prefetch)
  __shared__ uint8_t flagsS[MT][kFlagsSmem];
  // The last query tiles first over every head: under a causal mask they have the most key tiles,
  // so the long blocks all start early and the grid ends on short ones.
  const int qb = static_cast<int>(gridDim.y - 1 - blockIdx.y), warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
            tq = lane & 3;
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile), nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  const int64_t n = blockIdx.x, i0 = static_cast<int64_t>(qb) * MT * kTile;
  const int64_t mb = maskSlice(a, n);
  int qt[MT];
  TileFlags tf[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    qt[mt] = MT * qb + mt;
    tf[mt] = qt[mt] < nq ? stageFlags(flags, a, n, true, qt[mt], flagsS[mt]) : TileFlags{};
  }
  __syncthreads();
  auto flag = [&](int mt, int kt) -> uint8_t { return qt[mt] < nq ? tf[mt][kt] : 1; };  // an m-tile past the rows: dead
  auto live = [&](int kt) {
    for (; kt < nk; ++kt) {
      bool dead = true;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) dead = dead && flag(mt, kt) == 1;
      if (!dead) break;
    }
    return kt;
  };
  const T* Kn = KT + sliceAt(a.k, n);
  const T* Vn = V + sliceAt(a.v, n);
  auto loadKV = [&](int kt, int buf) {
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    if constexpr (KR) loadTileAsync<kTile, DK>(Ks + buf * kb, pK, Kn + j0 * a.k.sRow, a.k.sRow, a.Tk - j0, a.D);  // [j][d]
    else loadTileAsync<DK, kTile>(Ks + buf * kb, pK, Kn + j0, a.k.sRow, a.D, a.Tk - j0);                     // [d][j]
    loadTileAsync<kTile, DK>(Vs + buf * rb, pD, Vn + j0 * a.v.sRow, a.v.sRow, a.Tk - j0, a.Dv);
  };
  // Three stages: tiles kt and k1 are in flight while kt is computed, k2 is issued.
  const T* Qn = Q + sliceAt(a.q, n);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    loadTileAsync<kTile, DK>(Qs + mt * rb, pD, Qn + (i0 + mt * kTile) * a.q.sRow, a.q.sRow, a.Tq - i0 - mt * kTile, a.D);
  cpAsyncCommit();
  int kt = live(0);
  int k1 = kt < nk ? live(kt + 1) : nk;
  if (kt < nk) loadKV(kt, 0);
  cpAsyncCommit();
  if (k1 < nk) loadKV(k1, 1);
  cpAsyncCommit();
  cpAsyncWait<2>();
  __syncthreads();
  uint32_t qf[MT][DK / 16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) ldsm4(qf[mt][ks], aRowMajor(Qs + mt * rb, pD, warp * 16, ks * 16));
  if constexpr (MT == 1) __syncthreads();  // Q's bytes take the third K tile next
  float o[MT][DK / 8][4] = {};
  float m[MT][2], l[MT][2];
  int64_t rowI[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) m[mt][r] = -INFINITY, l[mt][r] = 0.0f, rowI[mt][r] = i0 + mt * kTile + warp * 16 + g + 8 * r;
  for (int buf = 0; kt < nk; buf = buf == 2 ? 0 : buf + 1) {
    const int k2 = k1 < nk ? live(k1 + 1) : nk;
    if (k2 < nk) loadKV(k2, buf == 0 ? 2 : buf - 1);  // the buffer computed last iteration
    cpAsyncCommit();
    cpAsyncWait<2>();
    __syncthreads();
    const T* Kb = Ks + buf * kb;
    const T* Vb = Vs + buf * rb;
    uint32_t kw[MT];  // the tile's keep words (dropout), read before the products that hide their latency
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      kw[mt] = a.ratio > 0.0f && flag(mt, kt) != 1 ? a.keep[keepTile(a, n, qt[mt], kt) + warp * 32 + lane] : 0u;
    float s[MT][8][4] = {};
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks)
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        if constexpr (KR) ldsm4(b, bNK(Kb, pK, ks * 16, np * 16));
        else ldsm4t(b, bKN(Kb, pK, ks * 16, np * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(s[mt][2 * np], qf[mt][ks], b[0], b[1]);
          mma16816<T>(s[mt][2 * np + 1], qf[mt][ks], b[2], b[3]);
        }
      }
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    uint8_t f[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) f[mt] = flag(mt, kt);
    softmaxTiles<DK, MT>(s, o, m, l, a, mb, rowI, j0, f, tq, kw);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) cToA<T>(pa[mt], s[mt], kk);
#pragma unroll
      for (int np = 0; np < DK / 16; ++np) {
        uint32_t b[4];
        ldsm4t(b, bKN(Vb, pD, kk * 16, np * 16));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816<T>(o[mt][2 * np], pa[mt], b[0], b[1]);
          mma16816<T>(o[mt][2 * np + 1], pa[mt], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this buffer is refilled next iteration
    kt = k1;
    k1 = k2;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) storeRows<T, DK>(o[mt], m[mt], l[mt], a, O, lse, n, rowI[mt], tq);
}

#if AMPC_WGMMA
// The forward on Hopper's warpgroup products (wgmma.cuh): the mma.sync kernel's one-pass loop, its
// grid, tiles, softmax, dropout and keep bits, with the two products per key tile issued by the
// whole block (one warpgroup) from shared memory instead of 4 x 16 rows of mma.sync fed by
// ldmatrix. Q is the score product's A operand in registers; K and V tiles are stored swizzled
// (loadTileAsync<R, C, true>), K as rows [j][d] (KR, K-major) or KT [d][j] (N-major), V [j][d]
// (N-major). Two stages of K and V (kWgStages): at head tile 64 42 KB in all with Q's, at most 128
// registers: four blocks a SM, 7-8% faster than three stages at three blocks on the GPT-2 shape's
// causal forward (H200, stop 68); at 128 64 KB, at most 168 registers: three blocks a SM, 14% faster
// than three stages at two on the Llama shape's (H100, stop 69: 0.561 -> 0.483 ms). At head tile 64 Q
// also keeps its own 9 KB and its fragments are read again from there every key tile: ptxas
// (CUDA 13.0) took the fragments, loop-invariant A operands, as dead after the first score product and
// gave their registers to the probabilities, so every key tile after the first read P as Q (the SASS
// of stop 65: HGMMA's A registers rewritten right after the wait). At 128 it keeps them (Q shares the
// last stage, loaded once). The default forward at both head tiles (forwardMma).
template <int DK>
inline constexpr int kWgStages = 2;
template <typename T, int DK>
size_t fwdSmemWg() {  // + 1024: the panels start on 1024 bytes
  return kWgStages<DK> * 2 * DK * kTile * sizeof(T) + 1024 + (DK == 64 ? kTile * kPD<DK> * sizeof(T) : 0);
}

template <typename T, bool KR, int DK>
__global__ void __launch_bounds__(kThreads, DK == 64 ? 4 : 3) attnFwdWgKernel(const T* Q, const T* KT, const T* V, T* O, float* lse,
                                                                              const uint8_t* flags, AttentionArgs a) {
  constexpr int tile = DK * kTile, ST = kWgStages<DK>;  // elements of a K or a V tile; stages
  extern __shared__ __align__(128) unsigned char smemRaw[];
  T* const Ks = reinterpret_cast<T*>(smemRaw + ((1024u - (smemAddr(smemRaw) & 1023u)) & 1023u));  // stage b: K, then V
  // Q, pitch kPD: the last stage's bytes, free until the loop's first prefetch (head tile 128); its own (64)
  T* const Qs = Ks + (DK == 64 ? ST : ST - 1) * 2 * tile;
  __shared__ uint8_t flagsS[kFlagsSmem];
  const int qt = static_cast<int>(gridDim.y - 1 - blockIdx.y), warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
  const int64_t n = blockIdx.x, i0 = static_cast<int64_t>(qt) * kTile;  // the mma.sync kernel's grid
  const int64_t mb = maskSlice(a, n);
  const int nk = static_cast<int>((a.Tk + kTile - 1) / kTile);
  const TileFlags tf = stageFlags(flags, a, n, true, qt, flagsS);
  __syncthreads();
  // The live key tiles end before `end` (every tile from the last live one on is dead: a causal
  // row's), so that finding the next one does not walk the dead tail each iteration.
  int end = nk;
  if (tf.g)
    while (end > 0 && tf[end - 1] == 1) --end;
  auto live = [&](int kt) {
    while (kt < end && tf[kt] == 1) ++kt;
    return kt < end ? kt : nk;
  };
  const T* Kn = KT + sliceAt(a.k, n);
  const T* Vn = V + sliceAt(a.v, n);
  auto loadKV = [&](int kt, int buf) {
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    T* const Kb = Ks + buf * 2 * tile;
    if constexpr (KR) loadTileAsync<kTile, DK, true>(Kb, 0, Kn + j0 * a.k.sRow, a.k.sRow, a.Tk - j0, a.D);
    else loadTileAsync<DK, kTile, true>(Kb, 0, Kn + j0, a.k.sRow, a.D, a.Tk - j0);
    loadTileAsync<kTile, DK, true>(Kb + tile, 0, Vn + j0 * a.v.sRow, a.v.sRow, a.Tk - j0, a.Dv);
  };
  loadTileAsync<kTile, DK>(Qs, kPD<DK>, Q + sliceAt(a.q, n) + i0 * a.q.sRow, a.q.sRow, a.Tq - i0, a.D);
  cpAsyncCommit();
  int kt = live(0);
  int k1 = kt < nk ? live(kt + 1) : nk;
  if (kt < nk) loadKV(kt, 0);
  cpAsyncCommit();
  if (ST == 3 && k1 < nk) loadKV(k1, 1);
  cpAsyncCommit();
  cpAsyncWait<2>();  // Q (with two stages the third group is empty)
  __syncthreads();
  uint32_t qf[DK / 16][4];
  auto loadQf = [&] {
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) ldsm4(qf[ks], aRowMajor(Qs, kPD<DK>, warp * 16, ks * 16));
  };
  if constexpr (DK != 64) {
    loadQf();
    __syncthreads();  // Q's bytes take the last stage next
  }
  float o[DK / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int64_t rowI[2] = {i0 + warp * 16 + (lane >> 2), i0 + warp * 16 + (lane >> 2) + 8};
  for (int buf = 0; kt < nk; buf = buf == ST - 1 ? 0 : buf + 1) {
    const int k2 = k1 < nk ? live(k1 + 1) : nk;
    const int ahead = ST == 3 ? k2 : k1;  // the tile loaded now, into the stage computed last iteration
    if (ahead < nk) loadKV(ahead, buf == 0 ? ST - 1 : buf - 1);
    cpAsyncCommit();
    cpAsyncWait<ST - 1>();  // tile kt (the groups after it: the ST - 1 tiles ahead)
    wg::proxyFence();  // the tiles were written through the generic proxy; wgmma reads them
    __syncthreads();
    const uint32_t kAddr = smemAddr(Ks + buf * 2 * tile), vAddr = kAddr + tile * sizeof(T);
    const uint32_t kw = a.ratio > 0.0f ? a.keep[keepTile(a, n, qt, kt) + warp * 32 + lane] : 0u;  // dropout's keep word
    if constexpr (DK == 64) loadQf();  // every key tile (the comment above the kernel says why)
    float s[8][4];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
      if constexpr (KR) wg::mma64<T, 0>(s, qf[ks], wg::desc(kAddr + (ks / 4) * kTile * 128 + (ks % 4) * 32, 16, 1024), ks);
      else wg::mma64<T, 1>(s, qf[ks], wg::desc(kAddr + ks * 2048, 16, 1024), ks);
    }
    wg::commit();
    wg::wait0();
    wg::pin(s);
    wg::pinA(qf);
    const int64_t j0 = static_cast<int64_t>(kt) * kTile;
    softmaxTile<DK>(s, o, m, l, a, mb, rowI, j0, tf[kt], tq, kw);
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) cToA<T>(pa[kk], s, kk);
    wg::pin(o);
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t dv = wg::desc(vAddr + kk * 2048, kTile * 128, 1024);  // LBO: the next 64 columns' panel
      if constexpr (DK == 64) wg::mma64<T, 1>(o, pa[kk], dv, 1);
      else wg::mma128<T, 1>(o, pa[kk], dv, 1);
    }
    wg::commit();
    wg::wait0();
    wg::pin(o);
    wg::pinA(pa);  // the products read pa until the wait: no register of it is reused before
    __syncthreads();  // this stage is refilled next iteration
    kt = k1;
    k1 = k2;
  }
  storeRows<T, DK>(o, m, l, a, O, lse, n, rowI, tq);
}
#endif

// Grid (N, key tiles). MG: the mask is trained (a.dMask), so each score's gradient is also summed
// into it. A template flag rather than a branch: the per-score gradient store, inlined at each of
// the 64 element sites, bloated the common kernel and cost it about a quarter of its speed (GPT-2
// shape backward 0.55 -> 0.66 ms when it came in as a runtime branch).
// WG (head tile 64, built with AMPC_WGMMA): the five products as Hopper's warpgroup products
// (wgmma.cuh) instead of mma.sync fed by ldmatrix, the elementwise work between them unchanged (a
// wgmma accumulator's registers are eight m16n8 tiles of mma.sync's, so S^T and dP^T land where the
// mma.sync kernel has them). Every tile in shared memory is stored swizzled (loadTileAsync<.., true>):
// S^T = K Q^T and dP^T = V dO^T read both operands from there (K and V as A, K-major, or KT's [d][j]
// M-major), dV += P^T dO and dK += dS^T Q take P^T and dS^T from registers and dO and Q N-major,
// and dQ = dS K reads dS^T from shared memory (M-major) with K. Two stages (kBwdStagesWg): 60 KB;
// 244-252 registers (ptxas; at three blocks a SM, 168, it spilled 436 bytes): two blocks a SM.
// GPT-2 shape's causal backward 0.295 -> 0.270 ms without dropout, 0.309 -> 0.281 with (H100, stop
// 69; three stages measured the same). The default at head tile 64 (bwdWg).
template <typename T, bool KR, int DK, bool MG, bool WG = false>
__global__ void __launch_bounds__(kThreads, WG ? 2 : 1) attnBwdMmaKernel(const T* dO, const T* Q, const T* KT, const T* V, const float* lse,
                                                                       const float* rowD, T* dKT, T* dV, float* dQacc, float* dMaskParts,
                                                                       const uint8_t* flags, AttentionArgs a) {
  static_assert(!WG || DK == 64, "the wgmma backward is built at head tile 64");
  constexpr int pD = kPD<DK>, pK = KR ? pD : kP, rb = WG ? DK * kTile : kRowBuf<DK>, ST = WG ? kBwdStagesWg : kBwdStages<DK>;
  constexpr bool dsOverDo = !WG && kBwdDsOverDo<DK>;
  extern __shared__ __align__(128) unsigned char smem[];
  // (WG: every tile starts on 1024 bytes, as the swizzled panels must)
  T* Ks = reinterpret_cast<T*>(WG ? smem + ((1024u - (smemAddr(smem) & 1023u)) & 1023u) : smem);  // [d][j] (or [j][d])
  T* Vs = Ks + (WG ? rb : kKBuf<DK>);   // [j][d]
  T* Qs = Vs + rb;                      // ST x [i][d]
  T* dOs = Qs + ST * rb;                // ST x [i][d]
  T* dSown = dOs + ST * rb;             // [j][i]: dS^T, scale included (or over the dO tile just used)
  float* rowL = reinterpret_cast<float*>(dSown + (dsOverDo ? 0 : WG ? rb : kTile * kP));  // ST x [i]
  float* rowDs = rowL + ST * kTile;                                              // ST x [i]
  uint32_t* keepS = reinterpret_cast<uint32_t*>(rowDs + ST * kTile);             // ST x 128 words (a.keep)
  __shared__ uint8_t flagsS[kFlagsSmem];
  // Grid (N, key tiles), the first key tiles first over every head (under a causal mask they have
  // the most query tiles).
  const int kt = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t n = blockIdx.x, j0 = static_cast<int64_t>(kt) * kTile;
  const int64_t mb = maskSlice(a, n);
  const int nq = static_cast<int>((a.Tq + kTile - 1) / kTile);
  const uint64_t step = a.step ? *a.step : 0;
  const TileFlags tf = stageFlags(flags, a, n, false, kt, flagsS);
  __syncthreads();
  auto live = [&](int qt) {
    while (qt < nq && tf[qt] == 1) ++qt;
    return qt;
  };
  const T* Qn = Q + sliceAt(a.q, n);
  const T* dOn = dO + sliceAt(a.dO, n);
  auto loadQ = [&](int qt, int buf) {
    const int64_t i0 = static_cast<int64_t>(qt) * kTile;
    loadTileAsync<kTile, DK, WG>(Qs + buf * rb, pD, Qn + i0 * a.q.sRow, a.q.sRow, a.Tq - i0, a.D);
    loadTileAsync<kTile, DK, WG>(dOs + buf * rb, pD, dOn + i0 * a.dO.sRow, a.dO.sRow, a.Tq - i0, a.Dv);
    if (a.keep && a.ratio > 0.0f && threadIdx.x < 32)  // the forward's keep bits of tile (qt, kt)
      cpAsync16(keepS + buf * 128 + threadIdx.x * 4, a.keep + keepTile(a, n, qt, kt) + threadIdx.x * 4);
    const int64_t row0 = n * a.Tq + i0;
    if (i0 + kTile <= a.Tq && row0 % 4 == 0) {  // whole tile, 16-byte aligned: with the tiles
      if (threadIdx.x < 32) {
        const int c = (threadIdx.x & 15) * 4;
        if (threadIdx.x < 16) cpAsync16(rowL + buf * kTile + c, lse + row0 + c);
        else cpAsync16(rowDs + buf * kTile + c, rowD + row0 + c);
      }
    } else {
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        rowL[buf * kTile + r] = i0 + r < a.Tq ? lse[row0 + r] : 0.0f;
        rowDs[buf * kTile + r] = i0 + r < a.Tq ? rowD[row0 + r] : 0.0f;
      }
    }
  };
  const T* Kn = KT + sliceAt(a.k, n);
  if constexpr (KR) loadTileAsync<kTile, DK, WG>(Ks, pK, Kn + j0 * a.k.sRow, a.k.sRow, a.Tk - j0, a.D);  // [j][d]
  else loadTileAsync<DK, kTile, WG>(Ks, pK, Kn + j0, a.k.sRow, a.D, a.Tk - j0);                        // [d][j]
  loadTileAsync<kTile, DK, WG>(Vs, pD, V + sliceAt(a.v, n) + j0 * a.v.sRow, a.v.sRow, a.Tk - j0, a.Dv);
  cpAsyncCommit();
  // Three stages, as the forward: query tiles qt and q1 in flight, q2 issued while qt is computed
  // (two: qt in flight, q1 issued while qt is computed).
  int qt = live(0);
  int q1 = qt < nq ? live(qt + 1) : nq;
  if (qt < nq) loadQ(qt, 0);
  cpAsyncCommit();
  if constexpr (ST == 3) {
    if (q1 < nq) loadQ(q1, 1);
    cpAsyncCommit();
  }
  cpAsyncWait<ST - 1>();
  __syncthreads();
  // This warp's 16 keys of K (from [d][j], or rows [j][d]) as A fragments: at DK 64 loaded once and
  // kept, at DK 128 loaded per query tile (the registers hold dK and dV). V's are loaded per tile.
  uint32_t kf[DK / 16][4];
  auto loadKf = [&](int ks) {
    if constexpr (KR) ldsm4(kf[ks], aRowMajor(Ks, pK, warp * 16, ks * 16));
    else ldsm4t(kf[ks], aColMajor(Ks, pK, warp * 16, ks * 16));
  };
  if constexpr (DK == 64 && !WG) {
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) loadKf(ks);
  }
  float dk[DK / 8][4] = {}, dv[DK / 8][4] = {};
  const int64_t keyJ[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  const bool keyIn[2] = {keyJ[0] < a.Tk, keyJ[1] < a.Tk};
  const bool keysFull = j0 + kTile <= a.Tk;  // the whole key tile (the same in every lane)
  for (int buf = 0; qt < nq; buf = buf == ST - 1 ? 0 : buf + 1) {
    const int q2 = q1 < nq ? live(q1 + 1) : nq;
    const int ahead = ST == 3 ? q2 : q1;
    if (ahead < nq) loadQ(ahead, buf == 0 ? ST - 1 : buf - 1);  // the buffer computed last iteration
    cpAsyncCommit();
    cpAsyncWait<ST - 1>();
#if AMPC_WGMMA
    if constexpr (WG) wg::proxyFence();  // the tiles were written through the generic proxy; wgmma reads them
#endif
    __syncthreads();
    const T* Qb = Qs + buf * rb;
    const T* dOb = dOs + buf * rb;
    const float* Lb = rowL + buf * kTile;
    const float* Db = rowDs + buf * kTile;
    const int64_t i0 = static_cast<int64_t>(qt) * kTile;
    float s[8][4], dp[8][4];  // S^T and dP^T: 16 keys x 64 queries
#if AMPC_WGMMA
    [[maybe_unused]] const uint32_t kAddr = smemAddr(Ks), qAddr = smemAddr(Qb), oAddr = smemAddr(dOb);
    if constexpr (WG) {  // K (KT: M-major) and V as A, Q and dO as B, all K-major but KT
      const uint32_t vAddr = smemAddr(Vs);
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
        wg::mma64ss<T, KR ? 0 : 1, 0>(s, wg::desc(kAddr + (KR ? ks * 32 : ks * 2048), 16, 1024), wg::desc(qAddr + ks * 32, 16, 1024), ks);
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wg::mma64ss<T, 0, 0>(dp, wg::desc(vAddr + ks * 32, 16, 1024), wg::desc(oAddr + ks * 32, 16, 1024), ks);
      wg::commit();
      wg::wait0();
      wg::pin(s);
      wg::pin(dp);
    }
#endif
    if constexpr (!WG) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks) {
        if constexpr (DK != 64) loadKf(ks);
        uint32_t vf[4];
        ldsm4(vf, aRowMajor(Vs, pD, warp * 16, ks * 16));
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t b[4];
          ldsm4(b, bNK(Qb, pD, ks * 16, np * 16));
          mma16816<T>(s[2 * np], kf[ks], b[0], b[1]);
          mma16816<T>(s[2 * np + 1], kf[ks], b[2], b[3]);
          ldsm4(b, bNK(dOb, pD, ks * 16, np * 16));
          mma16816<T>(dp[2 * np], vf, b[0], b[1]);
          mma16816<T>(dp[2 * np + 1], vf, b[2], b[3]);
        }
      }
    }
    const uint8_t flag = tf[qt];
    const bool readMask = flag == 0, causal = flag == 3;
    // s -> P (dropped), dp -> dS (scale included), element (key g + 8 r, query nt * 8 + 2 tq + c),
    // in two passes with no branch per element, so that the 32 elements' chains interleave:
    // first P = exp(s scale + mask - L), 0 outside the tile's rows and keys and above a causal
    // diagonal; then the dropout factor f and dS = P (dP f - D) scale, P f.
    const int iRem = static_cast<int>(a.Tq - i0 < kTile ? a.Tq - i0 : kTile);  // queries of this tile (32-bit checks)
    const int lead = static_cast<int>(j0 - i0) + warp * 16 + g;  // key - query = lead + 8 r - qi
    auto inTile = [&](int nt, int r, int c) {
      const int qi = nt * 8 + 2 * tq + c;
      return qi < iRem && keyIn[r] && !(causal && lead + 8 * r > qi);
    };
    if (readMask) {  // exp in the natural base, as the forward: a row masked everywhere by -3.4e38 has its mask in L
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int qi = nt * 8 + 2 * tq + c;
            float p = 0.0f;
            if (inTile(nt, r, c)) p = __expf(s[nt][2 * r + c] * a.scale + maskAt(a, mb, i0 + qi, keyJ[r]) - Lb[qi]);
            s[nt][2 * r + c] = p;
          }
    } else {  // exp2(s scale log2(e) - L log2(e)): one FFMA and the MUFU
      const float sl2 = a.scale * kLog2e;
      float lq[8][2];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) lq[nt][c] = Lb[nt * 8 + 2 * tq + c] * kLog2e;
      if (iRem == kTile && keysFull && !causal) {  // every element lives
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = fastExp2(s[nt][e] * sl2 - lq[nt][e & 1]);
      } else {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = fastExp2(inTile(nt, e >> 1, e & 1) ? s[nt][e] * sl2 - lq[nt][e & 1] : -INFINITY);
      }
    }
    float rd[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) rd[nt][c] = Db[nt * 8 + 2 * tq + c];
    auto element = [&](int nt, int r, int c, float f) {
      const float p = s[nt][2 * r + c];
      const float gs = p * (dp[nt][2 * r + c] * f - rd[nt][c]);  // d loss / d score
      // Only live elements: outside the tile gs is 0 * (dP - D), NaN where dO holds an overflow's inf,
      // and its index is past the mask's row.
      if constexpr (MG)
        if (inTile(nt, r, c)) addMaskGrad(a, dMaskParts, n, mb, i0 + nt * 8 + 2 * tq + c, keyJ[r], gs);
      s[nt][2 * r + c] = p * f;
      dp[nt][2 * r + c] = a.scale * gs;
    };
    const bool dropout = a.ratio > 0.0f;
    const float keep = dropout ? 1.0f / (1.0f - a.ratio) : 1.0f;
    if (!dropout) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) element(nt, r, c, 1.0f);
    } else if (a.keep) {
      // Element (nt, r, c): query nt * 8 + 2 tq + c, key warp * 16 + g + 8 r of the tile, i.e. the
      // forward's warp nt / 2, lane (2 tq + c, g / 2), element (2 warp + r, nt % 2, g % 2): one word
      // per pair of n-tiles and c.
      const uint32_t* kb = keepS + buf * 128;
#pragma unroll
      for (int np = 0; np < 4; ++np)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const uint32_t w = kb[np * 32 + (2 * tq + c) * 4 + (g >> 1)];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 2; ++r) element(2 * np + h, r, c, w >> ((2 * warp + r) * 4 + h * 2 + (g & 1)) & 1u ? keep : 0.0f);
        }
    } else {
      // A Philox block covers keys 8q .. 8q + 7 of one query: here the eight lanes of one tq (a team;
      // key g's draw is half g % 2 of word g / 2). Lane g draws n-tile g of both r and c, and the team
      // broadcasts each block's four words, so a lane makes 4 draws per tile instead of 32.
      const uint32_t thr = dropoutThreshold(a.ratio);
      const int wd = g >> 1, hi = g & 1;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          uint32_t w[4];
          const int64_t iq = i0 + g * 8 + 2 * tq + c, key8 = j0 + warp * 16 + 8 * r;
          streamBlock(a.seed, step, a.key, static_cast<uint64_t>((n * a.Tq + iq) * a.Tk + key8) >> 3, w);
#pragma unroll
          for (int y = 0; y < 8; ++y) {
            const int src = (y << 2) | tq;
            uint32_t v[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) v[k] = __shfl_sync(0xffffffffu, w[k], src);
            const uint32_t word = pick4(v, wd);
            element(y, r, c, (hi ? keptHigh(word, thr) : keptLow(word, thr)) ? keep : 0.0f);
          }
        }
    }
    // dV += P^T dO, dK += dS^T Q (k: the 64 queries); dS^T to smem for dQ.
    T* const dSs = dsOverDo ? dOs + buf * rb : dSown;
#if AMPC_WGMMA
    uint32_t pa[4][4], sa[4][4];  // (WG) P^T and dS^T as A fragments, read until the wait
    if constexpr (WG) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        cToA<T>(pa[kk], s, kk);
        cToA<T>(sa[kk], dp, kk);
      }
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg::mma64<T, 1>(dv, pa[kk], wg::desc(oAddr + kk * 2048, kTile * 128, 1024), 1);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg::mma64<T, 1>(dk, sa[kk], wg::desc(qAddr + kk * 2048, kTile * 128, 1024), 1);
      wg::commit();
      // dS^T [j][i] swizzled while they run: row j's 16-byte chunk c at c ^ (j % 8), and j % 8 is g
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + g + 8 * r) * 64 + ((nt ^ g) << 3) + 2 * tq) = pack2<T>(dp[nt][2 * r], dp[nt][2 * r + 1]);
      wg::proxyFence();
    }
#endif
    if constexpr (!WG) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t pf[4], sf[4];
        cToA<T>(pf, s, kk);
        cToA<T>(sf, dp, kk);
#pragma unroll
        for (int np = 0; np < DK / 16; ++np) {
          uint32_t b[4];
          ldsm4t(b, bKN(dOb, pD, kk * 16, np * 16));
          mma16816<T>(dv[2 * np], pf, b[0], b[1]);
          mma16816<T>(dv[2 * np + 1], pf, b[2], b[3]);
          ldsm4t(b, bKN(Qb, pD, kk * 16, np * 16));
          mma16816<T>(dk[2 * np], sf, b[0], b[1]);
          mma16816<T>(dk[2 * np + 1], sf, b[2], b[3]);
        }
      }
      if constexpr (dsOverDo) __syncthreads();  // every warp is done with this dO tile
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = nt * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + g) * kP + col) = pack2<T>(dp[nt][0], dp[nt][1]);
        *reinterpret_cast<uint32_t*>(dSs + (warp * 16 + g + 8) * kP + col) = pack2<T>(dp[nt][2], dp[nt][3]);
      }
    }
    __syncthreads();
    // dQ (this warp's 16 queries x DK d) = dS K, 64 columns of d at a time: A = dS from dS^T [j][i],
    // B = K from [d][j] (or [j][d]).
#pragma unroll
    for (int dc = 0; dc < DK / 64; ++dc) {
      float dq[8][4];
#if AMPC_WGMMA
      if constexpr (WG) {  // A: dS^T M-major; B: K [j][d] N-major, or KT [d][j] K-major
        const uint32_t sAddr = smemAddr(dSs);
        wg::fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          wg::mma64ss<T, 1, KR ? 1 : 0>(dq, wg::desc(sAddr + kk * 2048, 16, 1024),
                                        KR ? wg::desc(kAddr + kk * 2048, kTile * 128, 1024) : wg::desc(kAddr + kk * 32, 16, 1024), kk);
        wg::commit();
        wg::wait0();  // (dV's and dK's products too)
        wg::pin(dq);
        wg::pin(dv);
        wg::pin(dk);
        wg::pinA(pa);
        wg::pinA(sa);
      }
#endif
      if constexpr (!WG) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dq[nt][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          uint32_t sf[4];
          ldsm4t(sf, aColMajor(dSs, kP, warp * 16, kk * 16));
#pragma unroll
          for (int np = 0; np < 4; ++np) {
            uint32_t b[4];
            if constexpr (KR) ldsm4t(b, bKN(Ks, pK, kk * 16, dc * 64 + np * 16));
            else ldsm4(b, bNK(Ks, pK, kk * 16, dc * 64 + np * 16));
            mma16816<T>(dq[2 * np], sf, b[0], b[1]);
            mma16816<T>(dq[2 * np + 1], sf, b[2], b[3]);
          }
        }
      }
      if (!a.deterministic && iRem == kTile && a.D == DK) {  // the whole tile: no bounds, one base address
        float* const dst = dQacc + (n * a.Tq + i0 + warp * 16 + g) * DK + dc * 64 + 2 * tq;
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            atomicAdd(reinterpret_cast<float2*>(dst + r * 8 * DK + nt * 8), make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]));
        continue;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + warp * 16 + g + 8 * r;
        if (i >= a.Tq) continue;
        float* dst = dQacc + (n * a.Tq + i) * a.D + (a.deterministic ? kt * a.N * a.Tq * a.D : 0);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int d = dc * 64 + nt * 8 + 2 * tq;
          if (d >= a.D) continue;
          if (a.deterministic) *reinterpret_cast<float2*>(dst + d) = make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]);
          else atomicAdd(reinterpret_cast<float2*>(dst + d), make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]));
        }
      }
    }
    __syncthreads();  // dSs and this buffer are rewritten next iteration
    qt = q1;
    q1 = q2;
  }
  T* const dVn = dV + sliceAt(a.dv, n);  // slice n's outputs (a division each, after the loop)
  T* const dKn = dKT + sliceAt(a.dk, n);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t j = keyJ[r];
    if (j >= a.Tk) continue;
#pragma unroll
    for (int nt = 0; nt < DK / 8; ++nt) {
      const int d = nt * 8 + 2 * tq;
      if (d < a.Dv) *reinterpret_cast<uint32_t*>(dVn + j * a.dv.sRow + d) = pack2<T>(dv[nt][2 * r], dv[nt][2 * r + 1]);
      if (d < a.D) {
        T* dk0 = dKn;
        if (a.dkRows) {
          *reinterpret_cast<uint32_t*>(dk0 + j * a.dk.sRow + d) = pack2<T>(dk[nt][2 * r], dk[nt][2 * r + 1]);
        } else {
          dk0[d * a.dk.sRow + j] = fromF<T>(dk[nt][2 * r]);
          dk0[(d + 1) * a.dk.sRow + j] = fromF<T>(dk[nt][2 * r + 1]);
        }
      }
    }
  }
}

// Dynamic shared memory above 48 KB, and the whole carveout for shared memory (several blocks of
// these kernels per multiprocessor need it; they use no L1 to speak of).
template <typename K>
cudaError_t smemAttributes(K kernel, size_t bytes) {
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)); e != cudaSuccess)
    return e;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}


int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
bool mmaPath(const AttentionArgs& a) { return attentionTensorCores(a); }
size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// The head tile of the mma.sync kernels: 64 where both head dims fit it, else 128.
int headTile(const AttentionArgs& a) { return a.D <= 64 && a.Dv <= 64 ? 64 : 128; }

// The mma.sync forward with MT m-tiles a warp, K as rows or as KT.
template <typename T, int DK, int MT>
cudaError_t forwardMmaLaunch(const void* Q, const void* KT, const void* V, void* O, float* lse, const AttentionArgs& a, cudaStream_t st) {
  static const cudaError_t mattr = smemAttributes(attnFwdMmaKernel<T, false, DK, MT>, fwdSmemMma<T, DK, MT>());
  static const cudaError_t rattr = smemAttributes(attnFwdMmaKernel<T, true, DK, MT>, fwdSmemMma<T, DK, MT>());
  if (mattr != cudaSuccess || rattr != cudaSuccess) return mattr != cudaSuccess ? mattr : rattr;
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(cdiv(a.Tq, MT * kTile)));
  (a.kRows ? attnFwdMmaKernel<T, true, DK, MT> : attnFwdMmaKernel<T, false, DK, MT>)<<<grid, kThreads, fwdSmemMma<T, DK, MT>(), st>>>(
      static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V), static_cast<T*>(O), lse, a.flags, a);
  return cudaGetLastError();
}
// K as rows [j][d] (operands in place) or as KT [d][j]: one kernel each, no branch inside.
template <typename T, int DK>
cudaError_t forwardMma(const void* Q, const void* KT, const void* V, void* O, float* lse, const AttentionArgs& a, cudaStream_t st) {
#if AMPC_WGMMA
  // The wgmma forward at both head tiles. At 64 it runs the GPT-2 shape's forward 10-13% faster than
  // mma.sync on an H100 (tools/bench/NOTES.md, stop 67); until stop 65 it failed wherever a row had
  // more than one key tile (ptxas reused Q's fragments' registers: see attnFwdWgKernel), and it became
  // the default at 64 in stop 67. For comparisons (attn_bench, gpu_tests): AMPC_ATTENTION_MMA_SYNC=1,
  // the mma.sync forward at both; AMPC_ATTENTION_WGMMA64=0, mma.sync at 64 only;
  // AMPC_ATTENTION_FWD_MT2=1, mma.sync with two m-tiles a warp at 64 (below).
  if constexpr (DK == 128 || DK == 64) {
    auto on = [](const char* name) {
      const char* v = std::getenv(name);
      return v && v[0] == '1';
    };
    const char* w64 = std::getenv("AMPC_ATTENTION_WGMMA64");
    const bool wg = !on("AMPC_ATTENTION_MMA_SYNC") && (DK == 128 || (!(w64 && w64[0] == '0') && !on("AMPC_ATTENTION_FWD_MT2")));
    if (wg) {
      static const cudaError_t wattr = smemAttributes(attnFwdWgKernel<T, false, DK>, fwdSmemWg<T, DK>());
      static const cudaError_t wrattr = smemAttributes(attnFwdWgKernel<T, true, DK>, fwdSmemWg<T, DK>());
      if (wattr != cudaSuccess || wrattr != cudaSuccess) return wattr != cudaSuccess ? wattr : wrattr;
      const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(cdiv(a.Tq, kTile)));
      (a.kRows ? attnFwdWgKernel<T, true, DK> : attnFwdWgKernel<T, false, DK>)<<<grid, kThreads, fwdSmemWg<T, DK>(), st>>>(
          static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V), static_cast<T*>(O), lse, a.flags, a);
      return cudaGetLastError();
    }
  }
#endif
  // AMPC_ATTENTION_FWD_MT2=1: two m-tiles a warp at head tile 64, to compare (attn_bench). It passes
  // GpuAttention but ran the GPT-2 shape's causal forward with dropout slower than one m-tile at
  // three blocks a SM (0.181 against 0.160 ms, H100, stop 59: tools/bench/NOTES.md).
  if constexpr (DK == 64) {
    if (const char* e = std::getenv("AMPC_ATTENTION_FWD_MT2"); e && e[0] == '1') return forwardMmaLaunch<T, DK, 2>(Q, KT, V, O, lse, a, st);
  }
  return forwardMmaLaunch<T, DK, 1>(Q, KT, V, O, lse, a, st);
}
// The wgmma backward's shared memory: K, V, the stages of Q and dO, dS^T (8 KB each at head tile
// 64), the rows' L and D and the keep bits, and 1024 bytes to align the tiles.
template <typename T, int DK>
size_t bwdSmemWg() {
  constexpr int st = kBwdStagesWg;
  return 1024 + (3 + 2 * st) * DK * kTile * sizeof(T) + 2 * st * kTile * sizeof(float) + st * 128 * sizeof(uint32_t);
}
// Whether the backward at head tile DK runs the wgmma kernel: at 64 where it is built, unless
// AMPC_ATTENTION_BWD_MMA_SYNC=1 (to compare: attn_bench, gpu_tests).
template <int DK>
bool bwdWg() {
#if AMPC_WGMMA
  static const bool off = [] {
    const char* e = std::getenv("AMPC_ATTENTION_BWD_MMA_SYNC");
    return e && e[0] == '1';
  }();
  return DK == 64 && !off;
#else
  return false;
#endif
}
// The backward's four instances at head tile DK (K as rows, trained mask), mma.sync or wgmma (WG),
// their shared-memory attributes set once.
template <typename T, int DK>
struct BwdMma {
  using Kernel = decltype(&attnBwdMmaKernel<T, false, DK, false>);
  Kernel kernels[4];
  size_t smem;
  cudaError_t attr;
  Kernel pick(const AttentionArgs& a) const { return kernels[(a.dMask ? 2 : 0) + (a.kRows ? 1 : 0)]; }
};
template <typename T, int DK, bool WG>
const BwdMma<T, DK>& bwdMmaSet() {
  static const BwdMma<T, DK> set = [] {
    BwdMma<T, DK> s{{attnBwdMmaKernel<T, false, DK, false, WG>, attnBwdMmaKernel<T, true, DK, false, WG>,
                         attnBwdMmaKernel<T, false, DK, true, WG>, attnBwdMmaKernel<T, true, DK, true, WG>},
                        WG ? bwdSmemWg<T, DK>() : bwdSmemMma<T, DK>(),
                        cudaSuccess};
    for (auto k : s.kernels)
      if ((s.attr = smemAttributes(k, s.smem)) != cudaSuccess) break;
    return s;
  }();
  return set;
}
template <typename T, int DK>
const BwdMma<T, DK>& bwdMma() {
#if AMPC_WGMMA
  if constexpr (DK == 64)
    if (bwdWg<DK>()) return bwdMmaSet<T, DK, true>();
#endif
  return bwdMmaSet<T, DK, false>();
}
template <typename T, int DK>
int bwdBlocksPerSm(const AttentionArgs& a) {
  const auto& set = bwdMma<T, DK>();
  int blocks = 0;
  if (set.attr != cudaSuccess || cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, set.pick(a), kThreads, set.smem) != cudaSuccess)
    return -1;
  return blocks;
}
template <typename T, int DK>
cudaError_t backwardMma(const void* dO, const void* Q, const void* KT, const void* V, const float* lse, const float* rowD, void* dKT,
                        void* dV, float* dQacc, float* dMaskParts, const AttentionArgs& a, cudaStream_t st) {
  const auto& set = bwdMma<T, DK>();
  if (set.attr != cudaSuccess) return set.attr;
  const dim3 grid(static_cast<unsigned>(a.N), static_cast<unsigned>(cdiv(a.Tk, kTile)));
  set.pick(a)<<<grid, kThreads, set.smem, st>>>(
      static_cast<const T*>(dO), static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V), lse, rowD,
      static_cast<T*>(dKT), static_cast<T*>(dV), dQacc, dMaskParts, a.flags, a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t forwardT(const void* Q, const void* KT, const void* V, void* O, float* lse, const AttentionArgs& a,
                     cudaStream_t st) {
  static const cudaError_t attr = cudaFuncSetAttribute(attnFwdKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fwdSmem<T>()));
  if (attr != cudaSuccess) return attr;
  const uint8_t* flags = a.flags;
  const dim3 grid(static_cast<unsigned>(cdiv(a.Tq, kTile)), static_cast<unsigned>(a.N));
  if constexpr (!std::is_same_v<T, float>) {
    if (mmaPath(a)) {
      if (a.ratio > 0.0f) {  // the dropout decisions first, into the keep bits the forward reads
        if (!a.keep) return cudaErrorInvalidValue;
        const int64_t nq = cdiv(a.Tq, kTile), nk = cdiv(a.Tk, kTile);
        if (nq > 65535 || nk > INT32_MAX) return cudaErrorInvalidValue;
        const dim3 grid(static_cast<unsigned>(nk), static_cast<unsigned>(nq), static_cast<unsigned>(std::min<int64_t>(a.N, 65535)));
        attnKeepDrawKernel<<<grid, kThreads, 0, st>>>(a, philoxKeys(a.seed));
      }
      return headTile(a) == 64 ? forwardMma<T, 64>(Q, KT, V, O, lse, a, st) : forwardMma<T, 128>(Q, KT, V, O, lse, a, st);
    }
  }
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
  const uint8_t* flags = a.flags;
  float* rowD = reinterpret_cast<float*>(base);
  base += align256(sizeof(float) * a.N * a.Tq);
  float* dQacc = reinterpret_cast<float*>(base);
  const int parts = a.deterministic ? static_cast<int>(cdiv(a.Tk, kTile)) : 1;
  const int64_t nq = a.N * a.Tq * a.D * parts;
  if (cudaError_t e = cudaMemsetAsync(dQacc, 0, sizeof(float) * nq, st); e != cudaSuccess) return e;
  float* dMaskParts = nullptr;  // maskGradInParts: a score gradient per score, summed after
  if (maskGradInParts(a)) {
    base += align256(sizeof(float) * nq);
    dMaskParts = reinterpret_cast<float*>(base);
    if (cudaError_t e = cudaMemsetAsync(dMaskParts, 0, sizeof(float) * a.N * a.Tq * a.Tk, st); e != cudaSuccess) return e;
  } else if (a.dMask) {
    const int64_t maskElems = a.maskMod * (a.maskRows ? a.Tq : 1) * a.Tk;
    if (cudaError_t e = cudaMemsetAsync(a.dMask, 0, sizeof(float) * maskElems, st); e != cudaSuccess) return e;
  }
  const int64_t rows = a.N * a.Tq;
  constexpr bool half = !std::is_same_v<T, float>;
  const bool vecD = half && rowsVec(a, a.dO, dO, a.Dv) && rowsVec(a, a.o, O, a.Dv), vecQ = half && rowsVec(a, a.dq, dQ, a.D);
  if constexpr (half)
    if (vecD) rowDotVecKernel<T><<<static_cast<unsigned>(cdiv(rows, 32)), 256, 0, st>>>(static_cast<const T*>(dO), static_cast<const T*>(O), rowD, a);
  if (!vecD) rowDotKernel<T><<<static_cast<unsigned>(cdiv(rows, 8)), 256, 0, st>>>(static_cast<const T*>(dO), static_cast<const T*>(O), rowD, a);
  const dim3 grid(static_cast<unsigned>(cdiv(a.Tk, kTile)), static_cast<unsigned>(a.N));
  bool mma = false;
  if constexpr (!std::is_same_v<T, float>) {
    if (mmaPath(a)) {
      const cudaError_t e = headTile(a) == 64 ? backwardMma<T, 64>(dO, Q, KT, V, lse, rowD, dKT, dV, dQacc, dMaskParts, a, st)
                                              : backwardMma<T, 128>(dO, Q, KT, V, lse, rowD, dKT, dV, dQacc, dMaskParts, a, st);
      if (e != cudaSuccess) return e;
      mma = true;
    }
  }
  if (!mma)
    attnBwdKernel<T><<<grid, kThreads, bwdSmem<T>(), st>>>(static_cast<const T*>(dO), static_cast<const T*>(Q), static_cast<const T*>(KT),
                                                        static_cast<const T*>(V), lse, rowD, static_cast<T*>(dKT), static_cast<T*>(dV),
                                                        dQacc, dMaskParts, flags, a);
  if constexpr (half)  // (dQacc: 256-byte aligned, rows of D floats)
    if (vecQ) fromF32VecKernel<T><<<static_cast<unsigned>(cdiv(rows, 32)), 256, 0, st>>>(dQacc, static_cast<T*>(dQ), a, parts);
  if (!vecQ) fromF32Kernel<T><<<static_cast<unsigned>(cdiv(rows, 8)), 256, 0, st>>>(dQacc, static_cast<T*>(dQ), a, parts);
  if (dMaskParts) maskGradSumKernel<<<static_cast<unsigned>(cdiv(a.maskMod * (a.maskRows ? a.Tq : 1) * a.Tk, 32)), dim3(32, 32), 0, st>>>(dMaskParts, a);
  return cudaGetLastError();
}

}  // namespace

int attentionBackwardBlocksPerSm(const AttentionArgs& a) {
  if (!mmaPath(a)) return 0;
  const bool h64 = headTile(a) == 64;
  switch (a.t) {
    case DT::f16: return h64 ? bwdBlocksPerSm<__half, 64>(a) : bwdBlocksPerSm<__half, 128>(a);
    case DT::bf16: return h64 ? bwdBlocksPerSm<__nv_bfloat16, 64>(a) : bwdBlocksPerSm<__nv_bfloat16, 128>(a);
    default: return 0;
  }
}
bool attentionTensorCores(const AttentionArgs& a) { return attentionMmaShape(a.t != DT::f32, a.D, a.Dv, a.Tk, a.ratio > 0.0f); }

// The flags (a byte per tile), then the per-tile records maskTileKernel hands to maskFlagsKernel.
size_t attentionFlagBytes(const AttentionArgs& a) {
  const size_t tiles = static_cast<size_t>(a.maskMod * cdiv(a.Tq, kTile) * cdiv(a.Tk, kTile));
  return a.mask ? align256(tiles) + align256(tiles * sizeof(MaskTile)) : 0;
}

cudaError_t attentionMaskTiles(const AttentionArgs& a, uint8_t* flags, cudaStream_t st) {
  if (!a.mask || a.Tq == 0 || a.Tk == 0) return cudaSuccess;
  const int64_t nq = cdiv(a.Tq, kTile), nk = cdiv(a.Tk, kTile), mb = a.maskMod;
  MaskTile* tiles = reinterpret_cast<MaskTile*>(flags + align256(static_cast<size_t>(mb * nq * nk)));
  maskTileKernel<<<dim3(static_cast<unsigned>(nk), static_cast<unsigned>(nq), static_cast<unsigned>(mb)), 256, 0, st>>>(a, tiles);
  maskFlagsKernel<<<dim3(static_cast<unsigned>(nq), static_cast<unsigned>(mb)), 32, 0, st>>>(tiles, flags, static_cast<int>(nk));
  return cudaGetLastError();
}

namespace {
// ---- rows masked everywhere by a finite fill (kernels/cuda/limits.h, kAttentionFillLse) ----------
// Such rows are rare (an all-padding sequence, a left-padded query under a causal mask), so each is
// recomputed by itself at CUDA-core speed: every key of the row, the mask read in full (no tile
// skipped, no causal mask generated: a fill above the diagonal counts as PyTorch counts it).

// Whether the forward's row needs recomputing: its LSE below the fill bound, or not finite (a row
// whose every tile the kernels skipped, or cuDNN's -inf / NaN; a row truly masked everywhere by -inf
// comes out as before: NaN, or under zero_empty_rows O = 0 and LSE +inf).
__device__ __forceinline__ bool recomputeRow(float L) { return !(L >= kAttentionFillLse && L < INFINITY); }
// A fill row in the backward: the recomputed forward's LSE below the bound and finite.
__device__ __forceinline__ bool fillRow(float L) { return L < kAttentionFillLse && L > -INFINITY; }

// The dropout factor of score e (one element of dropFactors).
__device__ __forceinline__ float dropFactor(const AttentionArgs& a, uint64_t step, uint64_t e) {
  if (a.ratio <= 0.0f) return 1.0f;
  uint32_t w[4];
  streamBlock(a.seed, step, a.key, e >> 3, w);
  const uint32_t v = pick4(w, static_cast<int>(e >> 1) & 3), thr = dropoutThreshold(a.ratio);
  return ((e & 1) ? keptHigh(v, thr) : keptLow(v, thr)) ? 1.0f / (1.0f - a.ratio) : 0.0f;
}

constexpr int kFillThreads = 256, kFillWarps = kFillThreads / 32;
// A row's scores (and in the backward its score gradients), Tk floats each, sit in shared memory up
// to kFillSmemKeys keys; past that in global scratch, a slice per block (the forward then runs
// kFillGlobalBlocks blocks).
constexpr int64_t kFillSmemKeys = 24576, kFillGlobalBlocks = 128;
__host__ __device__ constexpr bool fillRowsInSmem(int64_t Tk) { return Tk <= kFillSmemKeys; }
// Dynamic shared memory of the fix-ups: q (and in the backward dO) as f32 rows, then the row's
// scores (and gradients) where they fit.
constexpr size_t fillSmemBytes(bool backward, int64_t Tk) {
  return sizeof(float) * static_cast<size_t>((backward ? 2 : 1) * (kAttentionMaxHeadDimCudnn + (fillRowsInSmem(Tk) ? Tk : 0)));
}
// Global scratch of the fix-ups' rows where they do not fit (0 where they do): `blocks` slices.
constexpr size_t fillGlobalBytes(bool backward, int64_t Tk, int64_t blocks) {
  return fillRowsInSmem(Tk) ? 0 : sizeof(float) * static_cast<size_t>((backward ? 2 : 1) * Tk * blocks);
}
// A block-wide max or sum (every thread gets it); red: kFillWarps floats of shared memory.
__device__ __forceinline__ float blockReduce(float v, bool max, float* red) {
  v = max ? lanesMax<32>(v) : lanesSum<32>(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kFillWarps; ++w) r = max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}
// Element (j, d) of K (rows [j][d], or KT [d][j]).
template <typename T>
__device__ __forceinline__ float keyAt(const AttentionArgs& a, const T* Kn, int64_t j, int64_t d) {
  return toF(a.kRows ? Kn[j * a.k.sRow + d] : Kn[d * a.k.sRow + j]);
}
// Row i's scores into s[Tk], with q (f32) in shared memory: a warp a key, its lanes over the head
// dim (K's row read whole, coalesced where K is stored as rows). Ends with a barrier.
template <typename T>
__device__ void fillRowScores(const AttentionArgs& a, const float* q, const T* Kn, int64_t mb, int64_t i, float* s) {
  const int lane = threadIdx.x & 31;
  for (int64_t j = threadIdx.x >> 5; j < a.Tk; j += kFillWarps) {
    float acc = 0.0f;
    for (int64_t d = lane; d < a.D; d += 32) acc += q[d] * keyAt(a, Kn, j, d);
    acc = lanesSum<32>(acc);
    if (lane == 0) s[j] = acc * a.scale + maskAt(a, mb, i, j);
  }
  __syncthreads();
}

// Score s (scale q . k + mask) under the floor (AttentionArgs::floor: max(s, floor)), and the
// factor its gradient takes through it: 1 above the floor, floorTie at it, 0 below.
__device__ __forceinline__ float floored(const AttentionArgs& a, float s) { return fmaxf(s, a.floor); }
__device__ __forceinline__ float floorGrad(const AttentionArgs& a, float s) { return s > a.floor ? 1.0f : s == a.floor ? a.floorTie : 0.0f; }

// Row i's scores into s[Tk] (fillRowScores; before the floor), the max m and sum
// l = sum_j exp(floored(s_j) - m), every thread getting both.
template <typename T>
__device__ void fillRowStats(const AttentionArgs& a, const float* q, const T* Kn, int64_t mb, int64_t i, float* s, float* red, float& m, float& l) {
  fillRowScores(a, q, Kn, mb, i, s);
  m = -INFINITY;
  for (int64_t j = threadIdx.x; j < a.Tk; j += kFillThreads) m = fmaxf(m, floored(a, s[j]));
  m = blockReduce(m, true, red);
  l = 0.0f;
  for (int64_t j = threadIdx.x; j < a.Tk; j += kFillThreads) l += expf(floored(a, s[j]) - m);
  l = blockReduce(l, false, red);
}

// out(x, sum_j w[j] at(j, x)) for x < cols (up to kAttentionMaxHeadDimCudnn): a warp a key (j =
// warp mod kFillWarps), its lanes along the row, then the warps' sums added in warp order (part:
// kFillWarps x kAttentionMaxHeadDimCudnn floats of shared memory). skipZero: keys of weight 0 are
// not read (the forward's p = 0, as the CPU reference skips them). Ends with a barrier.
template <typename At, typename Out>
__device__ void weightedRowSum(const float* w, int64_t Tk, int64_t cols, bool skipZero, float* part, At at, Out out) {
  constexpr int kCols = kAttentionMaxHeadDimCudnn / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float acc[kCols] = {};
  for (int64_t j = warp; j < Tk; j += kFillWarps) {
    const float wj = w[j];
    if (skipZero && wj == 0.0f) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (c * 32 + lane < cols) acc[c] += wj * at(j, c * 32 + lane);
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) part[warp * kAttentionMaxHeadDimCudnn + c * 32 + lane] = acc[c];
  __syncthreads();
  for (int64_t x = threadIdx.x; x < cols; x += kFillThreads) {
    float sum = 0.0f;
    for (int k = 0; k < kFillWarps; ++k) sum += part[k * kAttentionMaxHeadDimCudnn + x];
    out(x, sum);
  }
  __syncthreads();
}

// The rows the forward's fix-up recomputes (recomputeRow), listed in scratch by one thread each.
__global__ void fillRowsListKernel(const float* lse, int64_t rows, uint32_t* count, uint32_t* list) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows && recomputeRow(lse[r])) list[atomicAdd(count, 1u)] = static_cast<uint32_t>(r);
}

// The forward's fix-up, a block a listed row: the scores over every key (shared memory), the
// row's max m and sum l, then O = sum_j round(p_j f_j) V_j with p_j = exp(s_j - m) / l (the CPU
// reference's rounding; threads over O's columns) and the LSE m + log(l).
template <typename T>
__global__ void __launch_bounds__(kFillThreads) fillRowsForwardKernel(const T* Q, const T* KT, const T* V, T* O, float* lse, AttentionArgs a,
                                                                      const uint32_t* count, const uint32_t* list, float* rows) {
  extern __shared__ float fillSmem[];
  float *q = fillSmem, *s = rows ? rows + blockIdx.x * a.Tk : fillSmem + kAttentionMaxHeadDimCudnn;
  __shared__ float red[kFillWarps], part[kFillWarps * kAttentionMaxHeadDimCudnn];
  const int tid = threadIdx.x;
  const uint64_t step = a.step ? *a.step : 0;
  for (uint32_t e = blockIdx.x; e < *count; e += gridDim.x) {
    const int64_t row = list[e], n = row / a.Tq, i = row % a.Tq, mb = maskSlice(a, n);
    const T *Kn = KT + sliceAt(a.k, n), *Vn = V + sliceAt(a.v, n), *qg = Q + sliceAt(a.q, n) + i * a.q.sRow;
    for (int64_t d = tid; d < a.D; d += kFillThreads) q[d] = toF(qg[d]);
    __syncthreads();
    float m, l;
    fillRowStats(a, q, Kn, mb, i, s, red, m, l);
    const bool empty = a.zeroEmpty && m == -INFINITY;
    for (int64_t j = tid; j < a.Tk; j += kFillThreads)
      s[j] = empty ? 0.0f : toF(fromF<T>(expf(floored(a, s[j]) - m) / l * dropFactor(a, step, static_cast<uint64_t>(row * a.Tk + j))));
    __syncthreads();
    T* out = O + sliceAt(a.o, n) + i * a.o.sRow;
    weightedRowSum(
        s, a.Tk, a.Dv, true, part, [&](int64_t j, int64_t x) { return toF(Vn[j * a.v.sRow + x]); },
        [&](int64_t x, float v) { out[x] = fromF<T>(v); });
    if (tid == 0) lse[row] = empty ? INFINITY : m + logf(l);
  }
}

// The LSE the main backward reads: +inf on fill rows, so that it leaves them alone (P = 0 there).
__global__ void fillRowsLseKernel(const float* lse, float* out, int64_t rows) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r < rows) out[r] = fillRow(lse[r]) ? INFINITY : lse[r];
}

// The backward's fix-up: each fill row's whole gradient, added where the main backward left it
// none. A block owns `group` consecutive batch-heads (those whose dK and dV share slices) and takes
// their fill rows one after another, so that every sum runs in a fixed order; a row whose dO is 0
// adds nothing (the loss reads none of it: padding) and is passed over. Per row, with q and dO in
// shared memory: the scores again over every key, m and l; D = dO . O; dp_j = dO . V_j (a warp a
// key); p_j, f_j, the score gradient ds_j = p_j (dp_j f_j - D); then dV_j += round(p_j f_j) dO and
// dK_j += round(scale ds_j) q (a warp a key, lanes along the row), and dQ = sum_j round(scale ds_j)
// K_j (written: the main backward left the row 0). A trained mask's gradient gets ds (atomics; one
// block in all where `deterministic`).
template <typename T>
__global__ void __launch_bounds__(kFillThreads) fillRowsBackwardKernel(const T* dO, const T* Q, const T* KT, const T* V, const T* O, const float* lse,
                                                                       T* dQ, T* dKT, T* dV, AttentionArgs a, int64_t group, float* rows) {
  extern __shared__ float fillSmem[];
  float *q = fillSmem, *g = q + kAttentionMaxHeadDimCudnn, *s = rows ? rows + 2 * blockIdx.x * a.Tk : g + kAttentionMaxHeadDimCudnn,
        *gs = s + a.Tk;
  __shared__ float red[kFillWarps], part[kFillWarps * kAttentionMaxHeadDimCudnn];
  __shared__ bool fills[kFillThreads];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const uint64_t step = a.step ? *a.step : 0;
  for (int64_t n = blockIdx.x * group; n < (blockIdx.x + 1) * group && n < a.N; ++n) {
    const int64_t mb = maskSlice(a, n);
    const T *Kn = KT + sliceAt(a.k, n), *Vn = V + sliceAt(a.v, n);
    T *dKn = dKT + sliceAt(a.dk, n), *dVn = dV + sliceAt(a.dv, n);
    for (int64_t c0 = 0; c0 < a.Tq; c0 += kFillThreads) {  // a chunk of rows' LSE at a time; most have no fill row
      const bool mine = c0 + tid < a.Tq && fillRow(lse[n * a.Tq + c0 + tid]);
      if (!__syncthreads_or(mine)) continue;
      fills[tid] = mine;
      __syncthreads();
      for (int k = 0; k < kFillThreads && c0 + k < a.Tq; ++k) {
        if (!fills[k]) continue;  // (the same for every thread)
        const int64_t i = c0 + k, row = n * a.Tq + i;
        const T* dOi = dO + sliceAt(a.dO, n) + i * a.dO.sRow;
        const T* Oi = O + sliceAt(a.o, n) + i * a.o.sRow;
        const T* qg = Q + sliceAt(a.q, n) + i * a.q.sRow;
        float any = 0.0f, D = 0.0f;
        for (int64_t x = tid; x < a.Dv; x += kFillThreads) {
          g[x] = toF(dOi[x]);
          any = fmaxf(any, fabsf(g[x]));
          D += g[x] * toF(Oi[x]);
        }
        for (int64_t d = tid; d < a.D; d += kFillThreads) q[d] = toF(qg[d]);
        if (blockReduce(any, true, red) == 0.0f) continue;  // (after its barriers: the same for every thread)
        D = blockReduce(D, false, red);
        float m, l;
        fillRowStats(a, q, Kn, mb, i, s, red, m, l);
        for (int64_t j = warp; j < a.Tk; j += kFillWarps) {  // dp_j, then p, ds: s[j] = round(p f), gs[j] = round(scale ds)
          float dp = 0.0f;
          for (int64_t x = lane; x < a.Dv; x += 32) dp += g[x] * toF(Vn[j * a.v.sRow + x]);
          dp = lanesSum<32>(dp);
          if (lane == 0) {
            const float p = expf(floored(a, s[j]) - m) / l, f = dropFactor(a, step, static_cast<uint64_t>(row * a.Tk + j));
            const float ds = p * (dp * f - D) * floorGrad(a, s[j]);
            if (a.dMask && ds != 0.0f) atomicAdd(a.dMask + maskOffset(a, mb, i, j), ds);
            s[j] = toF(fromF<T>(p * f));
            // where_causal, where_masked: a Where's entry, no gradient
            const bool where = (a.whereCausal && j > i) || (a.whereMasked && a.whereMasked[maskOffset(a, mb, i, j)]);
            gs[j] = where ? 0.0f : toF(fromF<T>(a.scale * ds));
          }
        }
        __syncthreads();
        for (int64_t j = warp; j < a.Tk; j += kFillWarps) {
          T* dv = dVn + j * a.dv.sRow;
          for (int64_t x = lane; x < a.Dv; x += 32) dv[x] = fromF<T>(toF(dv[x]) + s[j] * g[x]);
          for (int64_t d = lane; d < a.D; d += 32) {
            T* dk = a.dkRows ? dKn + j * a.dk.sRow + d : dKn + d * a.dk.sRow + j;
            *dk = fromF<T>(toF(*dk) + gs[j] * q[d]);
          }
        }
        T* dqRow = dQ + sliceAt(a.dq, n) + i * a.dq.sRow;
        weightedRowSum(
            gs, a.Tk, a.D, false, part, [&](int64_t j, int64_t d) { return keyAt(a, Kn, j, d); },
            [&](int64_t d, float v) { dqRow[d] = fromF<T>(v); });
      }
    }
  }
}

// One warp a row: a row whose log-sum-exp is NaN or -inf gets O = 0 and +inf.
__global__ void zeroEmptyRowsKernel(char* O, int eb, float* lse, int64_t rows, int64_t H, int64_t Tq, int64_t Dv, int64_t sB, int64_t sH,
                                    int64_t sRow) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (r >= rows) return;
  const float l = lse[r];
  if (l > -INFINITY) return;  // finite or +inf (NaN and -inf fail the test)
  const int64_t q = r % Tq, h = (r / Tq) % H, b = r / (Tq * H);
  char* row = O + (b * sB + h * sH + q * sRow) * eb;
  for (int64_t c = threadIdx.x % 32; c < Dv * eb; c += 32) row[c] = 0;
  if (threadIdx.x % 32 == 0) lse[r] = INFINITY;
}
}  // namespace

cudaError_t attentionZeroEmptyRows(void* O, DT t, float* lse, int64_t B, int64_t H, int64_t Tq, int64_t Dv, int64_t sB, int64_t sH, int64_t sRow,
                                   cudaStream_t st) {
  const int64_t rows = B * H * Tq;
  if (rows == 0) return cudaSuccess;
  const int eb = t == DT::f32 ? 4 : 2;
  zeroEmptyRowsKernel<<<static_cast<unsigned>(cdiv(rows * 32, 256)), 256, 0, st>>>(static_cast<char*>(O), eb, lse, rows, H, Tq, Dv, sB, sH, sRow);
  return cudaGetLastError();
}

namespace {
// The forward's list of rows to recompute: a count (padded to 256 bytes), then one index a row.
size_t fillListBytes(const AttentionArgs& a) { return align256(sizeof(uint32_t) * (64 + static_cast<size_t>(a.N * a.Tq))); }
// The backward's blocks each own `group` consecutive batch-heads, those whose dK and dV slices are
// shared (grouped heads stored once); one block for all where a trained mask's gradient must sum in
// a fixed order.
int64_t fillBackwardGroup(const AttentionArgs& a) {
  auto shared = [](const AttnLayout& l) { return l.heads > 1 ? l.group : int64_t{1}; };
  return a.dMask && a.deterministic ? std::max<int64_t>(a.N, 1) : std::max(shared(a.dk), shared(a.dv));
}
template <typename T>
cudaError_t fillRowsForwardT(const void* Q, const void* KT, const void* V, void* O, float* lse, void* scratch, const AttentionArgs& a,
                             cudaStream_t st) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(fillRowsForwardKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fillSmemBytes(false, kFillSmemKeys)));
  if (attr != cudaSuccess) return attr;
  const int64_t rows = a.N * a.Tq;
  uint32_t* count = static_cast<uint32_t*>(scratch);
  uint32_t* list = count + 64;
  float* global = fillRowsInSmem(a.Tk) ? nullptr : reinterpret_cast<float*>(static_cast<char*>(scratch) + fillListBytes(a));
  if (cudaError_t e = cudaMemsetAsync(count, 0, sizeof(uint32_t), st); e != cudaSuccess) return e;
  fillRowsListKernel<<<static_cast<unsigned>(cdiv(rows, 256)), 256, 0, st>>>(lse, rows, count, list);
  fillRowsForwardKernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, global ? kFillGlobalBlocks : 1024)), kFillThreads,
                             fillSmemBytes(false, a.Tk), st>>>(static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V),
                                                               static_cast<T*>(O), lse, a, count, list, global);
  return cudaGetLastError();
}
template <typename T>
cudaError_t fillRowsBackwardT(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                              void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(fillRowsBackwardKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fillSmemBytes(true, kFillSmemKeys)));
  if (attr != cudaSuccess) return attr;
  const int64_t group = fillBackwardGroup(a);
  fillRowsBackwardKernel<T><<<static_cast<unsigned>(cdiv(a.N, group)), kFillThreads, fillSmemBytes(true, a.Tk), st>>>(
      static_cast<const T*>(dO), static_cast<const T*>(Q), static_cast<const T*>(KT), static_cast<const T*>(V), static_cast<const T*>(O), lse,
      static_cast<T*>(dQ), static_cast<T*>(dKT), static_cast<T*>(dV), a, group, fillRowsInSmem(a.Tk) ? nullptr : static_cast<float*>(scratch));
  return cudaGetLastError();
}
}  // namespace

bool attentionNeedsFillRows(const AttentionArgs& a) { return a.mask != nullptr; }
size_t attentionFillRowsScratch(const AttentionArgs& a, bool backward) {
  if (backward) return fillGlobalBytes(true, a.Tk, cdiv(a.N, fillBackwardGroup(a)));
  return fillListBytes(a) + fillGlobalBytes(false, a.Tk, std::min<int64_t>(a.N * a.Tq, kFillGlobalBlocks));
}

cudaError_t attentionFillRowsForward(const void* Q, const void* KT, const void* V, void* O, float* lse, void* scratch, const AttentionArgs& a,
                                     cudaStream_t st) {
  if (a.N == 0 || a.Tq == 0) return cudaSuccess;
  if (a.D > kAttentionMaxHeadDimCudnn || a.N * a.Tq >= (int64_t{1} << 32)) return cudaErrorInvalidValue;
  switch (a.t) {
    case DT::f32: return fillRowsForwardT<float>(Q, KT, V, O, lse, scratch, a, st);
    case DT::f16: return fillRowsForwardT<__half>(Q, KT, V, O, lse, scratch, a, st);
    case DT::bf16: return fillRowsForwardT<__nv_bfloat16>(Q, KT, V, O, lse, scratch, a, st);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t attentionFillRowsLse(const float* lse, float* out, const AttentionArgs& a, cudaStream_t st) {
  const int64_t rows = a.N * a.Tq;
  if (rows == 0) return cudaSuccess;
  fillRowsLseKernel<<<static_cast<unsigned>(cdiv(rows, 256)), 256, 0, st>>>(lse, out, rows);
  return cudaGetLastError();
}

cudaError_t attentionFillRowsBackward(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                                      void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st) {
  if (a.N == 0 || a.Tq == 0 || a.Tk == 0) return cudaSuccess;
  if (a.D > kAttentionMaxHeadDimCudnn || a.Dv > kAttentionMaxHeadDimCudnn) return cudaErrorInvalidValue;
  switch (a.t) {
    case DT::f32: return fillRowsBackwardT<float>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::f16: return fillRowsBackwardT<__half>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::bf16: return fillRowsBackwardT<__nv_bfloat16>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    default: return cudaErrorInvalidValue;
  }
}

size_t attentionKeepBytes(const AttentionArgs& a) {
  if (a.ratio <= 0.0f || !mmaPath(a)) return 0;
  return align256(static_cast<size_t>(a.N * cdiv(a.Tq, kTile) * cdiv(a.Tk, kTile)) * 128 * sizeof(uint32_t));
}

size_t attentionScratch(const AttentionArgs& a, bool backward) {
  const int64_t parts = a.deterministic ? cdiv(a.Tk, kTile) : 1;
  const size_t maskParts = maskGradInParts(a) ? align256(sizeof(float) * a.N * a.Tq * a.Tk) : 0;
  return backward ? align256(sizeof(float) * a.N * a.Tq) + align256(sizeof(float) * a.N * a.Tq * a.D * parts) + maskParts : 0;
}

cudaError_t attentionForward(const void* Q, const void* KT, const void* V, void* O, float* lse, const AttentionArgs& a,
                             cudaStream_t st) {
  if (!attentionFits(a.t != DT::f32, a.D, a.Dv, a.Tk, a.ratio > 0.0f) || (a.mask && !a.flags)) return cudaErrorInvalidValue;
  if (a.N == 0 || a.Tq == 0) return cudaSuccess;
  switch (a.t) {
    case DT::f32: return forwardT<float>(Q, KT, V, O, lse, a, st);
    case DT::f16: return forwardT<__half>(Q, KT, V, O, lse, a, st);
    case DT::bf16: return forwardT<__nv_bfloat16>(Q, KT, V, O, lse, a, st);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t attentionBackward(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                              void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st) {
  if (!attentionFits(a.t != DT::f32, a.D, a.Dv, a.Tk, a.ratio > 0.0f) || (a.mask && !a.flags) || (a.dMask && !a.mask))
    return cudaErrorInvalidValue;
  if (a.N == 0 || (a.Tq == 0 && a.Tk == 0)) return cudaSuccess;
  switch (a.t) {
    case DT::f32: return backwardT<float>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::f16: return backwardT<__half>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    case DT::bf16: return backwardT<__nv_bfloat16>(dO, Q, KT, V, O, lse, dQ, dKT, dV, scratch, a, st);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ampc::cuda
