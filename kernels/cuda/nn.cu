// Normalisation, softmax, loss and pooling kernels of the CUDA backend (kernels/cuda/ops.h). Rows
// are reduced by one block each, in f32, as the CPU reference does.
#include <algorithm>

#include "kernels/cuda/device.cuh"

namespace ampc::cuda {
namespace {

constexpr int kRowBlock = 256;

// ---- softmax: one block per (outer, inner) row, elements `inner` apart ----
__global__ void softmaxKernel(const void* x, void* y, DT t, int64_t axis, int64_t inner, bool log) {
  const int64_t row = blockIdx.x, o = row / inner, in = row % inner;
  const int64_t base = o * axis * inner + in;
  float mx = -INFINITY;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) mx = fmaxf(mx, loadF(x, t, base + a * inner));
  mx = blockMax(mx);
  float s = 0;
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) s += expf(loadF(x, t, base + a * inner) - mx);
  s = blockSum(s);
  const float ls = logf(s);
  for (int64_t a = threadIdx.x; a < axis; a += blockDim.x) {
    const float v = loadF(x, t, base + a * inner) - mx;
    storeF(y, t, base + a * inner, log ? v - ls : expf(v) / s);
  }
}

// ---- layer norm ----
// The mean and 1 / sqrt(variance + eps) of one row of D elements (the whole block). rms (RMS
// normalisation, ampc.RmsNorm): the mean taken as 0, so inv is 1 / sqrt(mean(x^2) + eps).
__device__ __forceinline__ void rowStats(const void* x, DT t, int64_t base, int64_t D, float eps, bool rms, float& m, float& inv) {
  m = 0.0f;
  if (!rms) {  // (uniform over the block)
    float s = 0;
    for (int64_t k = threadIdx.x; k < D; k += blockDim.x) s += loadF(x, t, base + k);
    m = blockSum(s) / static_cast<float>(D);
  }
  float q = 0;
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    const float d = loadF(x, t, base + k) - m;
    q += d * d;
  }
  inv = 1.0f / sqrtf(blockSum(q) / static_cast<float>(D) + eps);
}
__global__ void layerNormKernel(const void* x, const void* scale, const void* bias, void* y, DT t, DT yT, DT pt, int64_t D, float eps,
                                bool rms, float* meanOut, float* invOut) {
  const int64_t row = blockIdx.x, base = row * D;
  float m, inv;
  rowStats(x, t, base, D, eps, rms, m, inv);
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    const float b = bias ? loadF(bias, pt, k) : 0.0f;
    storeF(y, yT, base + k, (loadF(x, t, base + k) - m) * inv * loadF(scale, pt, k) + b);
  }
  if (threadIdx.x == 0) {
    if (meanOut) meanOut[row] = m;
    if (invOut) invOut[row] = inv;
  }
}
// dx per row; the row's mean and 1/std go to ws for the column pass. rms: no mean, nor its term in dx.
__global__ void layerNormGradRows(const void* dy, DT dyT, const void* x, const void* scale, DT t, DT st, void* dx, DT dxT, const void* res,
                                  int64_t D, float eps, bool rms, float* ws) {
  const int64_t row = blockIdx.x, base = row * D;
  float m, inv;
  rowStats(x, t, base, D, eps, rms, m, inv);
  float a = 0, b = 0;
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    const float g = loadF(dy, dyT, base + k) * loadF(scale, st, k);
    a += g;
    b += g * (loadF(x, t, base + k) - m) * inv;
  }
  a = rms ? 0.0f : blockSum(a) / static_cast<float>(D);
  b = blockSum(b) / static_cast<float>(D);
  for (int64_t k = threadIdx.x; k < D; k += blockDim.x) {
    const float xhat = (loadF(x, t, base + k) - m) * inv;
    const float d = inv * (loadF(dy, dyT, base + k) * loadF(scale, st, k) - a - xhat * b);
    storeF(dx, dxT, base + k, res ? loadF(res, dxT, base + k) + roundTo(dxT, d) : d);
  }
  if (threadIdx.x == 0) {
    ws[2 * row] = m;
    ws[2 * row + 1] = inv;
  }
}
// dscale, dbias partial sums: a block covers 32 columns and one slice of the rows (8 rows at a time,
// coalesced along the columns); slice y's partials go to part[y][2D] (dscale at k, dbias at D + k),
// which layerNormGradNarrow adds up in slice order.
__global__ void layerNormGradCols(const void* dy, DT dyT, const void* x, DT t, int64_t rows, int64_t D, const float* ws, float* acc,
                                  int64_t rowsPerBlock) {
  const int64_t k = blockIdx.x * 32 + threadIdx.x;
  const int64_t r0 = blockIdx.y * rowsPerBlock, r1 = min(rows, r0 + rowsPerBlock);
  float ds = 0, db = 0;
  if (k < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const float g = loadF(dy, dyT, r * D + k);
      ds += g * (loadF(x, t, r * D + k) - ws[2 * r]) * ws[2 * r + 1];
      db += g;
    }
  __shared__ float sds[8][33], sdb[8][33];
  sds[threadIdx.y][threadIdx.x] = ds;
  sdb[threadIdx.y][threadIdx.x] = db;
  __syncthreads();
  if (threadIdx.y == 0 && k < D) {
    for (int j = 1; j < static_cast<int>(blockDim.y); ++j) {
      ds += sds[j][threadIdx.x];
      db += sdb[j][threadIdx.x];
    }
    acc[blockIdx.y * 2 * D + k] = ds;
    acc[blockIdx.y * 2 * D + D + k] = db;
  }
}
__global__ void layerNormGradNarrow(const float* part, int slices, void* dscale, void* dbias, DT pt, int64_t D) {
  AMPC_GRID_LOOP(k, D) {
    float ds = 0, db = 0;
    for (int y = 0; y < slices; ++y) {
      ds += part[y * 2 * D + k];
      db += part[y * 2 * D + D + k];
    }
    if (dscale) storeF(dscale, pt, k, ds);
    if (dbias) storeF(dbias, pt, k, db);
  }
}

// Warp-per-row layer norm, for rows of D <= 32 * 4 * kLnChunks elements with D % 4 == 0 and every
// buffer 16-byte aligned: lane l holds elements c * 128 + 4 l .. + 3 (c < kLnChunks) in registers,
// so x and dy are read from memory once (the block-per-row kernels above read x three times through
// a per-element type switch). Loads and stores are 4 elements wide; the type switch is per 4 and
// warp-uniform. The formulas are the block kernels': mean, then the centred sum of squares.
constexpr int kLnChunks = 8, kLnWarps = 8, kLnGradWarps = 4;
// The backward's dscale/dbias: each of kLnGradBlocks blocks (a fixed count, so the sums' order does
// not depend on the device: 4 per multiprocessor on an H200) adds its rows into per-block partials,
// which one pass then sums in a fixed order: deterministic, no atomics.
constexpr int kLnGradBlocks = 528;

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// This lane's elements of row `base` (zeros past D) and the row's mean and 1 / std; CH chunks of
// 128 elements cover D. rms: the mean taken as 0 (rowStats).
template <int CH>
__device__ __forceinline__ void warpRowStats(const void* x, DT t, int64_t base, int D, float eps, bool rms, float (&v)[CH][4], float& m,
                                             float& inv) {
  const int lane = threadIdx.x & 31;
  float s = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c) {
    const int k = c * 128 + lane * 4;
    if (k < D) load4(x, t, base + k, v[c]);
    else v[c][0] = v[c][1] = v[c][2] = v[c][3] = 0.0f;
    s += (v[c][0] + v[c][1]) + (v[c][2] + v[c][3]);
  }
  m = rms ? 0.0f : warpSum(s) / static_cast<float>(D);
  float q = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c)
    if (c * 128 + lane * 4 < D)
#pragma unroll
      for (int e = 0; e < 4; ++e) q += (v[c][e] - m) * (v[c][e] - m);
  inv = 1.0f / sqrtf(warpSum(q) / static_cast<float>(D) + eps);
}
__global__ void __launch_bounds__(32 * kLnWarps) layerNormWarp(const void* x, const void* scale, const void* bias, void* y, DT t, DT yT,
                                                               DT pt, int64_t rows, int D, float eps, bool rms, float* meanOut, float* invOut) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kLnWarps) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t base = row * D;
  float v[kLnChunks][4], m, inv;
  warpRowStats<kLnChunks>(x, t, base, D, eps, rms, v, m, inv);
#pragma unroll
  for (int c = 0; c < kLnChunks; ++c) {
    const int k = c * 128 + lane * 4;
    if (k >= D) continue;
    float sc[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o[4];
    load4(scale, pt, k, sc);
    if (bias) load4(bias, pt, k, b);
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = (v[c][e] - m) * inv * sc[e] + b[e];
    store4(y, yT, base + k, o);
  }
  if (lane == 0) {
    if (meanOut) meanOut[row] = m;
    if (invOut) invOut[row] = inv;
  }
}
// dx for the rows of this warp (rows warp, warp + all warps, ...), and this block's partial dscale
// and dbias (part[block][0 .. D) and [D .. 2D)). CH chunks of 128 elements cover D (instantiated for
// 2, 4, 6, 8): a row's x and dy stay in registers; each lane accumulates its columns' sums in its
// own float4 slots of shared memory (registers would cost occupancy), and the block adds its warps'
// sums in warp order.
template <int CH>
__global__ void __launch_bounds__(32 * kLnGradWarps) layerNormGradWarp(const void* dy, DT dyT, const void* x, const void* scale, DT t,
                                                                       DT st, void* dx, DT dxT, const void* res, int64_t rows, int D, float eps,
                                                                       bool rms, float* part) {
  __shared__ float4 acc[kLnGradWarps][2][32 * CH];  // [warp][dscale, dbias][column / 4]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int c = 0; c < CH; ++c) acc[warp][0][c * 32 + lane] = acc[warp][1][c * 32 + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int64_t row = blockIdx.x * static_cast<int64_t>(kLnGradWarps) + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kLnGradWarps) {
    const int64_t base = row * D;
    float v[CH][4], g[CH][4], r[CH][4], m, inv;
    // dy (and up to CH 6 the residual: 126 registers, four blocks a multiprocessor) are loaded
    // before x's statistics, so that the rows' loads are in flight together instead of one after
    // another around the reductions.
    constexpr bool kEarlyRes = CH <= 6;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int k = c * 128 + lane * 4;
      if (k >= D) continue;
      load4(dy, dyT, base + k, g[c]);
      if (kEarlyRes && res) load4(res, dxT, base + k, r[c]);
    }
    warpRowStats<CH>(x, t, base, D, eps, rms, v, m, inv);
    float a = 0, b = 0;
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int k = c * 128 + lane * 4;
      if (k >= D) continue;
      float sc[4];
      load4(scale, st, k, sc);
      float4& ds = acc[warp][0][c * 32 + lane];
      float4& db = acc[warp][1][c * 32 + lane];
      float xh[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        xh[e] = (v[c][e] - m) * inv;
        const float gs = g[c][e] * sc[e];
        a += gs;
        b += gs * xh[e];
      }
      ds = make_float4(ds.x + g[c][0] * xh[0], ds.y + g[c][1] * xh[1], ds.z + g[c][2] * xh[2], ds.w + g[c][3] * xh[3]);
      db = make_float4(db.x + g[c][0], db.y + g[c][1], db.z + g[c][2], db.w + g[c][3]);
    }
    a = rms ? 0.0f : warpSum(a) / static_cast<float>(D);
    b = warpSum(b) / static_cast<float>(D);
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int k = c * 128 + lane * 4;
      if (k >= D) continue;
      float sc[4], o[4];
      load4(scale, st, k, sc);
#pragma unroll
      for (int e = 0; e < 4; ++e) o[e] = inv * (g[c][e] * sc[e] - a - (v[c][e] - m) * inv * b);
      if (res) {
        if (!kEarlyRes) load4(res, dxT, base + k, r[c]);
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] = r[c][e] + roundTo(dxT, o[e]);
      }
      store4(dx, dxT, base + k, o);
    }
  }
  __syncthreads();
  const float* sums = reinterpret_cast<const float*>(acc);  // [warp][2][4 * 32 * CH]
  constexpr int kCols = 4 * 32 * CH;
  for (int k = threadIdx.x; k < D; k += blockDim.x) {
    float ds = 0, db = 0;
    for (int w = 0; w < kLnGradWarps; ++w) {
      ds += sums[(w * 2) * kCols + k];
      db += sums[(w * 2 + 1) * kCols + k];
    }
    part[blockIdx.x * 2 * static_cast<int64_t>(D) + k] = ds;
    part[blockIdx.x * 2 * static_cast<int64_t>(D) + D + k] = db;
  }
}
// dscale[k] (and dbias) = the blocks' partials summed in a fixed order: a block of 32 x 16 threads
// per 32 columns, thread y summing blocks y, y + 16, ..., then the 16 sums in order (so enough
// loads are in flight: one thread per column was latency-bound).
constexpr int kLnSumRows = 16;
__global__ void __launch_bounds__(32 * kLnSumRows) layerNormGradPartials(const float* part, int blocks, void* dscale, void* dbias, DT pt,
                                                                         int64_t D) {
  __shared__ float sums[kLnSumRows][33];
  const int64_t k = blockIdx.x * 32 + threadIdx.x;
  float s = 0;
  if (k < 2 * D)
    for (int b = threadIdx.y; b < blocks; b += kLnSumRows) s += part[b * 2 * D + k];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || k >= 2 * D) return;
  for (int y = 1; y < kLnSumRows; ++y) s += sums[y][threadIdx.x];
  void* out = k < D ? dscale : dbias;
  if (out) storeF(out, pt, k < D ? k : k - D, s);
}

bool warpRows(int64_t D, std::initializer_list<const void*> ptrs) {
  if (D % 4 != 0 || D > 32 * 4 * kLnChunks) return false;
  for (const void* p : ptrs)
    if (p && (reinterpret_cast<uintptr_t>(p) & 15) != 0) return false;
  return true;
}

// ---- batch norm ----
// Passes over x [N, C, S] typed on the storage type T and read V elements at a time (V * sizeof(T)
// of 16, 8 or sizeof(T) bytes: the widest that divides S), so there is no per-element type switch
// and no 64-bit division per element.
//
// Scratch: doubles w[4C], then floats f[6C] (and for NHWC the per-block partial sums after them):
//   w[c], w[C + c]            sums of x' and x'^2, x' = x - K_c (K_c the channel's first element,
//                             so the one-pass variance keeps its precision)
//   w[2C + c], w[3C + c]      sums of g and g x' (the gradient passes; g = dy, or 0 where gate <= 0)
//   f[2c], f[2c + 1]          the mean and variance used
//   f[2C + 4c .. 2C + 4c + 3] the apply pass's per-channel coefficients
// NCHW: per-channel sums are reduced by C x P blocks, each over a slice of the batch, into partials
// [P][4C] (after f), which bnSumsTotalNchw adds up in slice order into w. NHWC: see bnSumsNhwc.
// Both orders are fixed by the shapes: the same bits every run.

// dy's V elements at i, zero where gate <= 0 (a Relu's gradient folded in; gate may be null).
template <typename T, int V>
__device__ __forceinline__ void loadGated(const T* dy, const T* gate, int64_t i, float (&g)[V]) {
  loadPack<T, V>(dy, i, g);
  if (!gate) return;
  float gt[V];
  loadPack<T, V>(gate, i, gt);
#pragma unroll
  for (int e = 0; e < V; ++e) g[e] = gt[e] > 0.0f ? g[e] : 0.0f;
}
// dx's V elements at i: A g + B (x - m) + D in training, else A g (per-element coefficients).
template <typename T, int V>
__device__ __forceinline__ void bnGradVector(const T* dy, const T* gate, const T* x, T* dx, int64_t i, const float (&m)[V], const float (&A)[V],
                                             const float (&B)[V], const float (&D)[V], bool training) {
  float g[V];
  loadGated<T, V>(dy, gate, i, g);
  if (training) {
    float xv[V];
    loadPack<T, V>(x, i, xv);
#pragma unroll
    for (int e = 0; e < V; ++e) g[e] = A[e] * g[e] + B[e] * (xv[e] - m[e]) + D[e];
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) g[e] *= A[e];
  }
  storePack<T, V>(dx, i, g);
}
// Shift-free sums of one block's slice; kGrad adds the gradient sums (g = gate > 0 ? dy : 0).
template <typename T, int V, bool kGrad>
__global__ void bnSums(const T* x, const T* dy, const T* gate, BatchNormArgs a, double* part) {
  const int64_t c = blockIdx.x, per = (a.N + gridDim.y - 1) / gridDim.y, n0 = blockIdx.y * per, n1 = min(a.N, n0 + per);
  double* w = part + static_cast<int64_t>(blockIdx.y) * 4 * a.C;
  if (n0 >= n1) {  // the whole block: an empty slice
    if (threadIdx.x == 0)
      for (int q = 0; q < 4; ++q) w[q * a.C + c] = 0.0;
    return;
  }
  const float K = toF(x[c * a.S]);
  const uint32_t SV = static_cast<uint32_t>(a.S / V), total = static_cast<uint32_t>(n1 - n0) * SV;
  float s = 0, q = 0, sd = 0, sdx = 0;
  for (uint32_t j = threadIdx.x; j < total; j += blockDim.x) {
    const uint32_t nn = j / SV;
    const int64_t i = ((n0 + nn) * a.C + c) * a.S + static_cast<int64_t>(j - nn * SV) * V;
    float xv[V], g[V];
    loadPack<T, V>(x, i, xv);
    if constexpr (kGrad) loadGated<T, V>(dy, gate, i, g);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = xv[e] - K;
      s += d;
      q += d * d;
      if constexpr (kGrad) {
        sd += g[e];
        sdx += g[e] * d;
      }
    }
  }
  s = blockSum(s);
  q = blockSum(q);
  if constexpr (kGrad) {
    sd = blockSum(sd);
    sdx = blockSum(sdx);
  }
  if (threadIdx.x == 0) {
    w[c] = s;
    w[a.C + c] = q;
    w[2 * a.C + c] = kGrad ? sd : 0.0f;
    w[3 * a.C + c] = kGrad ? sdx : 0.0f;
  }
}
// w[k] = the slices' partials summed in slice order.
__global__ void bnSumsTotalNchw(const double* part, int P, int64_t n, double* w) {
  AMPC_GRID_LOOP(k, n) {
    double s = 0;
    for (int p = 0; p < P; ++p) s += part[p * n + k];
    w[k] = s;
  }
}
// The mean and variance used (batch statistics in training, else the given ones) and, for the
// forward, the coefficients of y = (x - mean) * a + b with a = scale / sqrt(var + eps).
// For the backward (sums of the gradient in w), dscale and dbias, and the coefficients of
// dx = A g + B (x - mean) + D.
template <typename T>
__global__ void bnFinalize(const T* x, const void* scale, const void* bias, const void* mean, const void* var, const double* w, float* f,
                           void* dscale, void* dbias, BatchNormArgs a, bool grad) {
  AMPC_GRID_LOOP(c, a.C) {
    const double n = static_cast<double>(a.N * a.S), K = toF(x[a.nhwc ? c : c * a.S]), ms = w[c] / n;  // ms: the mean of x'
    double m, v;
    if (a.training) {
      m = K + ms;
      v = fmax(w[a.C + c] / n - ms * ms, 0.0);
    } else {
      m = loadF(mean, a.pT, c);
      v = loadF(var, a.pT, c);
    }
    const float mf = static_cast<float>(m), vf = static_cast<float>(v), inv = 1.0f / sqrtf(vf + a.eps), sc = loadF(scale, a.pT, c);
    f[2 * c] = mf;
    f[2 * c + 1] = vf;
    float* k = f + 2 * a.C + 4 * c;
    k[0] = mf;
    if (!grad) {
      k[1] = sc * inv;
      k[2] = loadF(bias, a.pT, c);
      continue;
    }
    // sum g (x - m) = sum g x' - (m - K) sum g
    const double sdd = w[2 * a.C + c], sdxd = (w[3 * a.C + c] - (m - K) * sdd) * inv;
    const float sd = static_cast<float>(sdd), sdx = static_cast<float>(sdxd), count = static_cast<float>(n);
    if (dbias) storeF(dbias, a.pT, c, sd);
    if (dscale) storeF(dscale, a.pT, c, sdx);
    const float A = sc * inv;
    k[1] = A;
    k[2] = a.training ? -A * inv * sdx / count : 0.0f;
    k[3] = a.training ? -A * sd / count : 0.0f;
  }
}
// The channel of the v-th V-element group (32-bit division when the count allows).
__device__ __forceinline__ int64_t bnChannel(int64_t v, int64_t total, uint32_t SV, const BatchNormArgs& a) {
  if (total <= 0xffffffffll) return (static_cast<uint32_t>(v) / SV) % static_cast<uint32_t>(a.C);
  return (v / SV) % a.C;
}
// The value written for a normalised element y: y, or with a folded residual Add round(y) + r (the
// Add's operand rounded first, as the unfused graph does), then a folded Relu.
template <typename T>
__device__ __forceinline__ float bnOut(float y, const BatchNormArgs& a, float r) {
  if (a.residual) y = toF(fromF<T>(y)) + r;
  return a.relu ? (y > 0.0f ? y : (y != y ? y : 0.0f)) : y;
}
template <typename T, int V>
__global__ void bnApply(const T* x, T* y, const float* f, BatchNormArgs a) {
  const uint32_t SV = static_cast<uint32_t>(a.S / V);
  const int64_t total = a.N * a.C * SV;
  const float* k = f + 2 * a.C;
  AMPC_GRID_LOOP(v, total) {
    const int64_t c = bnChannel(v, total, SV, a);
    const float m = k[4 * c], sc = k[4 * c + 1], b = k[4 * c + 2];
    float xv[V], rv[V] = {};
    loadPack<T, V>(x, v * V, xv);
    if (a.residual) loadPack<T, V>(static_cast<const T*>(a.residual), v * V, rv);
#pragma unroll
    for (int e = 0; e < V; ++e) xv[e] = bnOut<T>((xv[e] - m) * sc + b, a, rv[e]);
    storePack<T, V>(y, v * V, xv);
  }
}
template <typename T, int V>
__global__ void bnGradApply(const T* dy, const T* gate, const T* x, T* dx, const float* f, BatchNormArgs a) {
  const uint32_t SV = static_cast<uint32_t>(a.S / V);
  const int64_t total = a.N * a.C * SV;
  const float* k = f + 2 * a.C;
  AMPC_GRID_LOOP(v, total) {
    const int64_t c = bnChannel(v, total, SV, a);
    float m[V], A[V], B[V], D[V];  // the channel's, for each element
#pragma unroll
    for (int e = 0; e < V; ++e) {
      m[e] = k[4 * c];
      A[e] = k[4 * c + 1];
      B[e] = k[4 * c + 2];
      D[e] = k[4 * c + 3];
    }
    bnGradVector<T, V>(dy, gate, x, dx, v * V, m, A, B, D, a.training);
  }
}
// NHWC: x is [R = N * S, C]. A block has G * (blockDim / G) threads for G = C / V channel groups;
// each thread keeps one group of V channels for its whole grid-stride loop (the stride is a
// multiple of G), so its channel constants stay in registers. The sums are reduced in a fixed
// order (deterministic): per block through shared memory into `partial` [gridDim][nq][C], then over
// the blocks in f64 by bnSumsNhwcTotal.
template <typename T, int V, bool kGrad>
__global__ void bnSumsNhwc(const T* x, const T* dy, const T* gate, BatchNormArgs a, float* partial) {
  extern __shared__ float red[];  // [blockDim / G][nq][C]
  const int C = static_cast<int>(a.C), G = C / V, nq = kGrad ? 4 : 2;
  const int cg = threadIdx.x % G, RB = blockDim.x / G, rr = threadIdx.x / G;
  float K[V], s[V] = {}, q[V] = {}, sd[V] = {}, sdx[V] = {};
  loadPack<T, V>(x, cg * V, K);  // row 0: the shift
  const int64_t R = a.N * a.S;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * RB + rr; r < R; r += static_cast<int64_t>(gridDim.x) * RB) {
    const int64_t i = r * C + cg * V;
    float xv[V], g[V];
    loadPack<T, V>(x, i, xv);
    if constexpr (kGrad) loadGated<T, V>(dy, gate, i, g);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = xv[e] - K[e];
      s[e] += d;
      q[e] += d * d;
      if constexpr (kGrad) {
        sd[e] += g[e];
        sdx[e] += g[e] * d;
      }
    }
  }
  float* mine = red + rr * nq * C + cg * V;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    mine[e] = s[e];
    mine[C + e] = q[e];
    if constexpr (kGrad) {
      mine[2 * C + e] = sd[e];
      mine[3 * C + e] = sdx[e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nq * C; i += blockDim.x) {
    float t = 0.0f;
    for (int k = 0; k < RB; ++k) t += red[k * nq * C + i];
    partial[static_cast<int64_t>(blockIdx.x) * nq * C + i] = t;
  }
}
// w[i] = sum over the blocks of partial[b][i], for i < nq * C.
__global__ void bnSumsNhwcTotal(const float* partial, int blocks, int64_t n, double* w) {
  AMPC_GRID_LOOP(i, n) {
    double t = 0.0;
    for (int b = 0; b < blocks; ++b) t += partial[b * n + i];
    w[i] = t;
  }
}
template <typename T, int V>
__global__ void bnApplyNhwc(const T* x, T* y, const float* f, BatchNormArgs a) {
  const int G = static_cast<int>(a.C) / V, cg = threadIdx.x % G;
  const float* k = f + 2 * a.C;
  float m[V], sc[V], b[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int c = cg * V + e;
    m[e] = k[4 * c];
    sc[e] = k[4 * c + 1];
    b[e] = k[4 * c + 2];
  }
  const int64_t total = a.N * a.S * G;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float xv[V], rv[V] = {};
    loadPack<T, V>(x, v * V, xv);
    if (a.residual) loadPack<T, V>(static_cast<const T*>(a.residual), v * V, rv);
#pragma unroll
    for (int e = 0; e < V; ++e) xv[e] = bnOut<T>((xv[e] - m[e]) * sc[e] + b[e], a, rv[e]);
    storePack<T, V>(y, v * V, xv);
  }
}
template <typename T, int V>
__global__ void bnGradApplyNhwc(const T* dy, const T* gate, const T* x, T* dx, const float* f, BatchNormArgs a) {
  const int G = static_cast<int>(a.C) / V, cg = threadIdx.x % G;
  const float* k = f + 2 * a.C;
  float m[V], A[V], B[V], D[V];
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const int c = cg * V + e;
    m[e] = k[4 * c];
    A[e] = k[4 * c + 1];
    B[e] = k[4 * c + 2];
    D[e] = k[4 * c + 3];
  }
  const int64_t total = a.N * a.S * G;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < total; v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    bnGradVector<T, V>(dy, gate, x, dx, v * V, m, A, B, D, a.training);
  }
}
__global__ void bnRunning(const void* mean, const void* var, void* rm, void* rv, const float* ws, BatchNormArgs a) {
  AMPC_GRID_LOOP(c, a.C) {
    if (rm) storeF(rm, a.pT, c, loadF(mean, a.pT, c) * a.momentum + ws[2 * c] * (1.0f - a.momentum));
    if (rv) storeF(rv, a.pT, c, loadF(var, a.pT, c) * a.momentum + ws[2 * c + 1] * (1.0f - a.momentum));
  }
}

// ---- softmax cross-entropy ----
// Per (outer, inner) row: the row's loss (weighted, 0 when ignored) and weight in ws[2 row], ws[2 row + 1];
// the log-probabilities when asked.
// Adds v to a running (max m, sum s of exp(x - m)): the sum is rescaled when the max grows.
__device__ __forceinline__ void onlineAdd(float v, float& m, float& s) {
  if (v > m) {
    s = s * expf(m - v) + 1.0f;
    m = v;
  } else if (v != -INFINITY) {  // (-inf - -inf would be NaN)
    s += expf(v - m);
  }
}
// Row max and sum of exp(x - max) in one pass over the row (each thread rescales its running sum
// when its max grows), then combined over the block.
__device__ __forceinline__ void sceRowStats(const void* x, DT t, int64_t base, int64_t C, int64_t stride, float& mx, float& sum) {
  float m = -INFINITY, s = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) onlineAdd(loadF(x, t, base + c * stride), m, s);
  mx = blockMax(m);
  sum = blockSum(m == -INFINITY ? 0.0f : s * expf(m - mx));
}
__global__ void sceRows(const void* x, const void* labels, const void* weights, void* logProb, float* ws, LossArgs a) {
  const int64_t row = blockIdx.x, o = row / a.inner, in = row % a.inner;
  const int64_t base = o * a.C * a.inner + in;
  float mx, s;
  sceRowStats(x, a.t, base, a.C, a.inner, mx, s);
  const float lse = logf(s) + mx;
  if (logProb)
    for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) storeF(logProb, a.t, base + c * a.inner, loadF(x, a.t, base + c * a.inner) - lse);
  if (threadIdx.x == 0) {
    const int64_t y = loadI(labels, a.labelT, row);
    float l = 0, w = 0;
    if (!(a.hasIgnore && y == a.ignore) && y >= 0 && y < a.C) {
      w = weights ? loadF(weights, a.wT, y) : 1.0f;
      l = -(loadF(x, a.t, base + y * a.inner) - lse) * w;
    }
    ws[2 * row] = l;
    ws[2 * row + 1] = w;
  }
}
// Contiguous rows (inner == 1) of a known float type: the same passes with typed loads, four in
// flight per thread (the generic kernels above serve strided rows and the log-prob result).
__device__ __forceinline__ float asF(float v) { return v; }
__device__ __forceinline__ float asF(__half v) { return __half2float(v); }
__device__ __forceinline__ float asF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ void sceRowStatsT(const T* x, int64_t C, float& mx, float& sum) {
  float m = -INFINITY, s = 0;
  const int64_t step = blockDim.x;
  int64_t c = threadIdx.x;
  if constexpr (!std::is_same_v<T, float>) {
    // f16/bf16 rows (GPT-2's logits): 16-byte packs of 8 after the row's unaligned head, each pack
    // merged into the running (max, sum) with one rescale and no branch per element.
    const uintptr_t ax = reinterpret_cast<uintptr_t>(x) & 15;
    if (ax % sizeof(T) == 0) {
      const int64_t head = min(C, static_cast<int64_t>(((16 - ax) & 15) / sizeof(T))), packs = (C - head) / 8;
      for (int64_t j = threadIdx.x; j < head; j += step) onlineAdd(asF(x[j]), m, s);
      for (int64_t p = threadIdx.x; p < packs; p += step) {
        float v[8];
        loadPack<T, 8>(x, head + 8 * p, v);
        float pm = v[0];
#pragma unroll
        for (int k = 1; k < 8; ++k) pm = fmaxf(pm, v[k]);
        if (pm == -INFINITY) continue;  // (a NaN anywhere makes pm or the sum NaN, as onlineAdd does)
        const float nm = fmaxf(m, pm);
        float add = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) add += expf(v[k] - nm);
        s = (m == -INFINITY ? 0.0f : s * expf(m - nm)) + add;
        m = nm;
      }
      c = head + 8 * packs + threadIdx.x;
    }
  }
  for (; c + 3 * step < C; c += 4 * step) {
    const float v0 = asF(x[c]), v1 = asF(x[c + step]), v2 = asF(x[c + 2 * step]), v3 = asF(x[c + 3 * step]);
    onlineAdd(v0, m, s);
    onlineAdd(v1, m, s);
    onlineAdd(v2, m, s);
    onlineAdd(v3, m, s);
  }
  for (; c < C; c += step) onlineAdd(asF(x[c]), m, s);
  mx = blockMax(m);
  sum = blockSum(m == -INFINITY ? 0.0f : s * expf(m - mx));
}
template <typename T>
__global__ void sceRowsT(const T* x, const void* labels, const void* weights, float* ws, LossArgs a) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * (a.pitch ? a.pitch : a.C);
  float mx, s;
  sceRowStatsT(xr, a.C, mx, s);
  if (threadIdx.x == 0) {
    if (a.rowStats) a.rowStats[2 * row] = mx, a.rowStats[2 * row + 1] = s;
    const float lse = logf(s) + mx;
    const int64_t y = loadI(labels, a.labelT, row);
    float l = 0, w = 0;
    if (!(a.hasIgnore && y == a.ignore) && y >= 0 && y < a.C) {
      w = weights ? loadF(weights, a.wT, y) : 1.0f;
      l = -(asF(xr[y]) - lse) * w;
    }
    ws[2 * row] = l;
    ws[2 * row + 1] = w;
  }
}
template <typename T>
__global__ void sceGradRowsT(const void* dl, DT dlT, const T* x, const void* labels, const void* weights, void* dx, const float* ws,
                             LossArgs a, int64_t rows) {
  const int64_t row = blockIdx.x, base = row * (a.gPitch ? a.gPitch : a.C);  // dx's row
  const T* xr = x + row * (a.pitch ? a.pitch : a.C);
  const int64_t y = loadI(labels, a.labelT, row);
  for (int64_t c = a.C + threadIdx.x; c < a.gPitch; c += blockDim.x) storeF(dx, a.gT, base + c, 0.0f);  // the pad
  if ((a.hasIgnore && y == a.ignore) || y < 0 || y >= a.C) {
    for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) storeF(dx, a.gT, base + c, 0.0f);
    return;
  }
  const float w = weights ? loadF(weights, a.wT, y) : 1.0f;
  const float g = (a.reduction == 0 ? loadF(dl, dlT, row) : a.reduction == 1 ? loadF(dl, dlT, 0) : loadF(dl, dlT, 0) / ws[2 * rows + 1]) * w;
  float mx, s;
  if (a.rowStats) mx = a.rowStats[2 * row], s = a.rowStats[2 * row + 1];  // the loss's pass
  else sceRowStatsT(xr, a.C, mx, s);
  const float inv = 1.0f / s;
  const int64_t step = blockDim.x;
  if constexpr (!std::is_same_v<T, float>) {
    // dx of x's type with the same alignment (GPT-2's logits and their gradient, bf16): 16-byte
    // packs of 8 after the row's unaligned head, the rest element by element.
    T* dxr = static_cast<T*>(dx) + base;
    const uintptr_t ax = reinterpret_cast<uintptr_t>(xr) & 15;
    if (a.gT == (std::is_same_v<T, __half> ? DT::f16 : DT::bf16) && ax == (reinterpret_cast<uintptr_t>(dxr) & 15) && ax % sizeof(T) == 0) {
      const int64_t head = min(a.C, static_cast<int64_t>(((16 - ax) & 15) / sizeof(T))), packs = (a.C - head) / 8;
      auto one = [&](int64_t j) { dxr[j] = fromF<T>(g * (expf(asF(xr[j]) - mx) * inv - (j == y ? 1.0f : 0.0f))); };
      for (int64_t j = threadIdx.x; j < head; j += step) one(j);
      for (int64_t p = threadIdx.x; p < packs; p += step) {
        const int64_t j0 = head + 8 * p;
        float v[8];
        loadPack<T, 8>(xr, j0, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = g * (expf(v[k] - mx) * inv - (j0 + k == y ? 1.0f : 0.0f));
        storePack<T, 8>(dxr, j0, v);
      }
      for (int64_t j = head + 8 * packs + threadIdx.x; j < a.C; j += step) one(j);
      return;
    }
  }
  int64_t c = threadIdx.x;
  for (; c + 3 * step < a.C; c += 4 * step) {
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = asF(xr[c + k * step]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t j = c + k * step;
      storeF(dx, a.gT, base + j, g * (expf(v[k] - mx) * inv - (j == y ? 1.0f : 0.0f)));
    }
  }
  for (; c < a.C; c += step) storeF(dx, a.gT, base + c, g * (expf(asF(xr[c]) - mx) * inv - (c == y ? 1.0f : 0.0f)));
}

// ws[2 rows] = sum of losses, ws[2 rows + 1] = sum of weights; the reduced loss when asked.
__global__ void sceTotal(float* ws, int64_t rows, void* loss, DT t, int reduction) {
  float l = 0, w = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    l += ws[2 * r];
    w += ws[2 * r + 1];
  }
  l = blockSum(l);
  w = blockSum(w);
  if (threadIdx.x == 0) {
    ws[2 * rows] = l;
    ws[2 * rows + 1] = w;
    if (loss && reduction == 1) storeF(loss, t, 0, l);
    if (loss && reduction == 2) storeF(loss, t, 0, l / w);
  }
}
__global__ void sceNone(const float* ws, int64_t rows, void* loss, DT t) {
  AMPC_GRID_LOOP(r, rows) storeF(loss, t, r, ws[2 * r]);
}
// Weight sums only (for the gradient).
__global__ void sceWeights(const void* labels, const void* weights, float* ws, LossArgs a, int64_t rows) {
  AMPC_GRID_LOOP(r, rows) {
    const int64_t y = loadI(labels, a.labelT, r);
    ws[2 * r] = 0;
    ws[2 * r + 1] = (a.hasIgnore && y == a.ignore) || y < 0 || y >= a.C ? 0.0f : (weights ? loadF(weights, a.wT, y) : 1.0f);
  }
}
__global__ void sceGradRows(const void* dl, DT dlT, const void* x, const void* labels, const void* weights, void* dx, const float* ws,
                            LossArgs a, int64_t rows) {
  const int64_t row = blockIdx.x, o = row / a.inner, in = row % a.inner;
  const int64_t base = o * a.C * a.inner + in;
  const int64_t y = loadI(labels, a.labelT, row);
  if ((a.hasIgnore && y == a.ignore) || y < 0 || y >= a.C) {
    for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x) storeF(dx, a.gT, base + c * a.inner, 0.0f);
    return;
  }
  const float w = weights ? loadF(weights, a.wT, y) : 1.0f;
  const float g = (a.reduction == 0 ? loadF(dl, dlT, row) : a.reduction == 1 ? loadF(dl, dlT, 0) : loadF(dl, dlT, 0) / ws[2 * rows + 1]) * w;
  float mx, s;
  sceRowStats(x, a.t, base, a.C, a.inner, mx, s);
  const float inv = 1.0f / s;
  for (int64_t c = threadIdx.x; c < a.C; c += blockDim.x)
    storeF(dx, a.gT, base + c * a.inner, g * (expf(loadF(x, a.t, base + c * a.inner) - mx) * inv - (c == y ? 1.0f : 0.0f)));
}

// ---- pooling: one thread per output element ----
__device__ __forceinline__ void poolCoords(const PoolArgs& a, int64_t i, int64_t& plane, int64_t o[3]) {
  int64_t rest = i;
  for (int d = a.nsp - 1; d >= 0; --d) {
    o[d] = rest % a.out[d];
    rest /= a.out[d];
  }
  plane = rest;
}
// Window tap t (row-major over the kernel dims) of output position o: its offset in the input
// plane, whether it lies inside the input and whether inside the padded input.
__device__ __forceinline__ int64_t poolTap(const PoolArgs& a, const int64_t o[3], int64_t t, bool& inside, bool& inPadded) {
  int64_t kk[3] = {0, 0, 0};
  for (int d = a.nsp - 1; d >= 0; --d) {
    kk[d] = t % a.k[d];
    t /= a.k[d];
  }
  int64_t off = 0;
  inside = inPadded = true;
  for (int d = 0; d < a.nsp; ++d) {
    const int64_t c = o[d] * a.s[d] - a.pad[d] + kk[d] * a.d[d];
    inside = inside && c >= 0 && c < a.in[d];
    inPadded = inPadded && c >= -a.pad[d] && c < a.in[d] + a.padEnd[d];
    off = off * a.in[d] + c;
  }
  return off;
}
__device__ __forceinline__ void poolSizes(const PoolArgs& a, int64_t& IS, int64_t& P, int64_t& taps) {
  IS = P = taps = 1;
  for (int d = 0; d < a.nsp; ++d) IS *= a.in[d], P *= a.out[d], taps *= a.k[d];
}
// AveragePool's divisor for output position o: its window's taps inside the input, or inside the
// padded input with count_include_pad.
__device__ __forceinline__ float poolDivisor(const PoolArgs& a, const int64_t o[3], int64_t taps) {
  int64_t count = 0, padded = 0;
  bool inside, inPadded;
  for (int64_t t = 0; t < taps; ++t) {
    poolTap(a, o, t, inside, inPadded);
    padded += inPadded;
    count += inside;
  }
  return static_cast<float>(a.includePad ? padded : count);
}
__global__ void poolKernel(const void* x, void* y, int64_t* indices, PoolArgs a, bool isMax) {
  int64_t IS, P, taps;
  poolSizes(a, IS, P, taps);
  AMPC_GRID_LOOP(i, a.N * a.C * P) {
    int64_t plane, o[3] = {0, 0, 0};
    poolCoords(a, i, plane, o);
    float acc = isMax ? -INFINITY : 0.0f;
    int64_t best = -1, count = 0, padded = 0;
    for (int64_t t = 0; t < taps; ++t) {
      bool inside, inPadded;
      const int64_t off = poolTap(a, o, t, inside, inPadded);
      padded += inPadded;
      if (!inside) continue;
      const float v = loadF(x, a.t, plane * IS + off);
      ++count;
      if (isMax) {
        if (best < 0 || v > acc || v != v) {
          acc = v;
          best = off;
        }
      } else {
        acc += v;
      }
    }
    if (isMax) {
      storeF(y, a.t, i, acc);
      if (indices) indices[i] = best < 0 ? -1 : plane * IS + best;
    } else {
      const int64_t div = a.includePad ? padded : count;
      storeF(y, a.t, i, div > 0 ? acc / static_cast<float>(div) : 0.0f);
    }
  }
}
// Max pooling over 2 spatial dims, typed, with 32-bit coordinates (the plane's offset and the
// index written are 64-bit): the same choice of element as poolKernel (the first maximum; a NaN
// wins).
template <typename T>
__global__ void maxPool2d(const T* x, T* y, int64_t* indices, PoolArgs a) {
  const uint32_t IH = static_cast<uint32_t>(a.in[0]), IW = static_cast<uint32_t>(a.in[1]);
  const uint32_t OH = static_cast<uint32_t>(a.out[0]), OW = static_cast<uint32_t>(a.out[1]);
  const int64_t total = a.N * a.C * OH * OW, IS = static_cast<int64_t>(IH) * IW;
  AMPC_GRID_LOOP(i, total) {
    int64_t plane;
    uint32_t oh, ow;
    if (total <= 0xffffffffll) {
      const uint32_t u = static_cast<uint32_t>(i), t = u / OW;
      ow = u - t * OW;
      oh = t % OH;
      plane = t / OH;
    } else {
      const int64_t t = i / OW;
      ow = static_cast<uint32_t>(i - t * OW);
      oh = static_cast<uint32_t>(t % OH);
      plane = t / OH;
    }
    const T* xp = x + plane * IS;
    float best = -INFINITY;
    int32_t at = -1;
    const int h0 = static_cast<int>(oh) * static_cast<int>(a.s[0]) - static_cast<int>(a.pad[0]);
    const int w0 = static_cast<int>(ow) * static_cast<int>(a.s[1]) - static_cast<int>(a.pad[1]);
    for (int kh = 0; kh < a.k[0]; ++kh) {
      const int h = h0 + kh * static_cast<int>(a.d[0]);
      if (h < 0 || h >= static_cast<int>(IH)) continue;
      for (int kw = 0; kw < a.k[1]; ++kw) {
        const int w = w0 + kw * static_cast<int>(a.d[1]);
        if (w < 0 || w >= static_cast<int>(IW)) continue;
        const int32_t off = h * static_cast<int32_t>(IW) + w;
        const float v = toF(xp[off]);
        if (at < 0 || v > best || v != v) {
          best = v;
          at = off;
        }
      }
    }
    y[i] = fromF<T>(best);
    if (indices) indices[i] = at < 0 ? -1 : plane * IS + at;
  }
}
// Pack v's place in an [N, H, W, G] grid of channel packs (a channels-last tensor, V channels a pack).
template <typename I>
__device__ __forceinline__ void packCoords(I v, I G, I H, I W, I& n, I& h, I& w, I& cg) {
  I t = v / G;
  cg = v - t * G;
  w = t % W;
  t /= W;
  h = t % H;
  n = t / H;
}
// Max pooling of x [N, H, W, C] (2 spatial dims), V channels per thread; the indices are offsets in
// that order (ScatterAddFlat scatters the gradient into the same layout). I: the index arithmetic's
// type (int where every offset fits: 64-bit division costs more than the pool's bytes).
template <typename T, int V, typename I>
__global__ void maxPoolNhwc(const T* x, T* y, int64_t* indices, PoolArgs a) {
  const I C = static_cast<I>(a.C), G = C / V, OH = static_cast<I>(a.out[0]), OW = static_cast<I>(a.out[1]);
  const I IH = static_cast<I>(a.in[0]), IW = static_cast<I>(a.in[1]), k0 = static_cast<I>(a.k[0]), k1 = static_cast<I>(a.k[1]);
  const I total = static_cast<I>(a.N) * OH * OW * G;
  for (I v = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); v < total;
       v += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    I n, oh, ow, cg;
    packCoords(v, G, OH, OW, n, oh, ow, cg);
    float best[V];
    I at[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      best[e] = -INFINITY;
      at[e] = -1;
    }
    for (I kh = 0; kh < k0; ++kh) {
      const I h = oh * static_cast<I>(a.s[0]) - static_cast<I>(a.pad[0]) + kh * static_cast<I>(a.d[0]);
      if (h < 0 || h >= IH) continue;
      for (I kw = 0; kw < k1; ++kw) {
        const I w = ow * static_cast<I>(a.s[1]) - static_cast<I>(a.pad[1]) + kw * static_cast<I>(a.d[1]);
        if (w < 0 || w >= IW) continue;
        const I off = ((n * IH + h) * IW + w) * C + cg * V;
        float xv[V];
        loadPack<T, V>(x, off, xv);
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (at[e] < 0 || xv[e] > best[e] || xv[e] != xv[e]) {
            best[e] = xv[e];
            at[e] = off + e;
          }
      }
    }
    storePack<T, V>(y, static_cast<int64_t>(v) * V, best);
    if (indices) {  // V offsets as 16-byte pairs (V is even, and the row of V starts 16-byte aligned)
      longlong2* out = reinterpret_cast<longlong2*>(indices + static_cast<int64_t>(v) * V);
#pragma unroll
      for (int e = 0; e < V; e += 2) out[e / 2] = make_longlong2(at[e], at[e + 1]);
    }
  }
}
// The output positions along one spatial dim whose window covers input position x (with dilation d,
// those where x + pad - o * s is a multiple of d as well): o in [lo, hi].
template <typename I>
__device__ __forceinline__ void coveringWindows(I x, I pad, I k, I s, I d, I outN, I& lo, I& hi) {
  const I top = x + pad, first = top - (k - 1) * d;  // o * s lies in [first, top]
  lo = first <= 0 ? 0 : (first + s - 1) / s;
  hi = top / s < outN - 1 ? top / s : outN - 1;
}
// MaxPool's gradient as a gather over x [N, H, W, C] (2 spatial dims), V channels per thread: each
// input element sums dy over the windows that cover it and chose it (indices from maxPoolNhwc), in
// the order of the windows (the CPU's ScatterAddFlat's order). The same sums as the scatter, without
// its f32 buffer and atomics.
template <typename T, int V, typename I>
__global__ void maxPoolGradNhwc(const T* dy, const int64_t* indices, T* dx, PoolArgs a) {
  const I C = static_cast<I>(a.C), G = C / V, OH = static_cast<I>(a.out[0]), OW = static_cast<I>(a.out[1]);
  const I IH = static_cast<I>(a.in[0]), IW = static_cast<I>(a.in[1]), d0 = static_cast<I>(a.d[0]), d1 = static_cast<I>(a.d[1]);
  const I s0 = static_cast<I>(a.s[0]), s1 = static_cast<I>(a.s[1]), p0 = static_cast<I>(a.pad[0]), p1 = static_cast<I>(a.pad[1]);
  const I total = static_cast<I>(a.N) * IH * IW * G;
  for (I v = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); v < total;
       v += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    I n, h, w, cg;
    packCoords(v, G, IH, IW, n, h, w, cg);
    const int64_t self = static_cast<int64_t>(v) * V;  // the flat offset of channel cg * V here
    I hlo, hhi, wlo, whi;
    coveringWindows<I>(h, p0, static_cast<I>(a.k[0]), s0, d0, OH, hlo, hhi);
    coveringWindows<I>(w, p1, static_cast<I>(a.k[1]), s1, d1, OW, wlo, whi);
    float acc[V] = {};
    for (I oh = hlo; oh <= hhi; ++oh) {
      if (d0 != 1 && (h + p0 - oh * s0) % d0 != 0) continue;
      for (I ow = wlo; ow <= whi; ++ow) {
        if (d1 != 1 && (w + p1 - ow * s1) % d1 != 0) continue;
        const I o = ((n * OH + oh) * OW + ow) * C + cg * V;
        float g[V];
        loadPack<T, V>(dy, o, g);
        const longlong2* at = reinterpret_cast<const longlong2*>(indices + o);
#pragma unroll
        for (int e = 0; e < V; e += 2) {
          const longlong2 p = at[e / 2];
          if (p.x == self + e) acc[e] += g[e];
          if (p.y == self + e + 1) acc[e + 1] += g[e + 1];
        }
      }
    }
    storePack<T, V>(dx, self, acc);
  }
}
// GlobalAveragePool of x [N, P, C]: y[n, c] = mean over p (f32 sums, one thread per (n, c)).
template <typename T>
__global__ void gapNhwc(const T* x, T* y, int64_t N, int64_t P, int64_t C) {
  AMPC_GRID_LOOP(i, N * C) {
    const int64_t n = i / C, c = i - n * C;
    float acc = 0.0f;
    for (int64_t p = 0; p < P; ++p) acc += toF(x[(n * P + p) * C + c]);
    y[i] = fromF<T>(acc / static_cast<float>(P));
  }
}
template <typename E>
__global__ void broadcastNhwcKernel(const E* x, E* y, int64_t P, int64_t C, int64_t total) {
  AMPC_GRID_LOOP(i, total) y[i] = x[i / (P * C) * C + i % C];
}
__global__ void avgPoolGradKernel(const void* dy, float* acc, PoolArgs a) {
  int64_t IS, P, taps;
  poolSizes(a, IS, P, taps);
  AMPC_GRID_LOOP(i, a.N * a.C * P) {
    int64_t plane, o[3] = {0, 0, 0};
    poolCoords(a, i, plane, o);
    const float div = poolDivisor(a, o, taps);
    bool inside, inPadded;
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t off = poolTap(a, o, t, inside, inPadded);
      if (inside) atomicAdd(acc + plane * IS + off, loadF(dy, a.t, i) / div);
    }
  }
}
// The same gradient gathered, for --deterministic: a thread per input element sums, over the taps in
// order, dy / div of each output window that covers it (no atomics; the divisor recounted per window).
__global__ void avgPoolGradGatherKernel(const void* dy, void* dx, PoolArgs a) {
  int64_t IS, P, taps;
  poolSizes(a, IS, P, taps);
  AMPC_GRID_LOOP(i, a.N * a.C * IS) {
    const int64_t plane = i / IS;
    int64_t c[3] = {0, 0, 0}, rest = i % IS;
    for (int d = a.nsp - 1; d >= 0; --d) {
      c[d] = rest % a.in[d];
      rest /= a.in[d];
    }
    float sum = 0.0f;
    for (int64_t t = 0; t < taps; ++t) {
      int64_t kk[3] = {0, 0, 0}, o[3] = {0, 0, 0}, r = t, flat = 0;
      for (int d = a.nsp - 1; d >= 0; --d) {
        kk[d] = r % a.k[d];
        r /= a.k[d];
      }
      bool ok = true;
      for (int d = 0; d < a.nsp && ok; ++d) {
        const int64_t num = c[d] + a.pad[d] - kk[d] * a.d[d];
        ok = num >= 0 && num % a.s[d] == 0 && num / a.s[d] < a.out[d];
        o[d] = ok ? num / a.s[d] : 0;
        flat = flat * a.out[d] + o[d];
      }
      if (!ok) continue;
      sum += loadF(dy, a.t, plane * P + flat) / poolDivisor(a, o, taps);
    }
    storeF(dx, a.t, i, sum);
  }
}
__global__ void narrowF32(const float* acc, void* out, DT t, int64_t n) {
  AMPC_GRID_LOOP(i, n) storeF(out, t, i, acc[i]);
}

int blocksFor(int64_t rows) { return static_cast<int>(rows); }

// C x P blocks: enough slices of the batch per channel to fill the GPU, each of a few thousand elements.
dim3 bnGrid(const BatchNormArgs& a) {
  const int64_t p = std::max<int64_t>(1, std::min<int64_t>({(2048 + a.C - 1) / a.C, (a.N * a.S + 4095) / 4096, a.N, 65535}));
  return dim3(static_cast<unsigned>(a.C), static_cast<unsigned>(p));
}
bool alignedTo(const void* p, int bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }
// Calls fn(T{}, integral_constant<int, V>{}) for a.t and the widest V (16 or 8 bytes, else one
// element) that divides S and that every pointer's alignment allows.
template <typename Fn>
cudaError_t bnDispatch(const BatchNormArgs& a, std::initializer_list<const void*> ptrs, Fn&& fn) {
  auto byType = [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    constexpr int V16 = 16 / sizeof(T), V8 = 8 / sizeof(T);
    auto fits = [&](int v) {
      if ((a.nhwc ? a.C : a.S) % v != 0) return false;
      for (const void* p : ptrs)
        if (!alignedTo(p, v * static_cast<int>(sizeof(T)))) return false;
      return true;
    };
    if (fits(V16)) return fn(T{}, std::integral_constant<int, V16>{});
    if (fits(V8)) return fn(T{}, std::integral_constant<int, V8>{});
    return fn(T{}, std::integral_constant<int, 1>{});
  };
  switch (a.t) {
    case DT::f32: return byType(float{});
    case DT::f16: return byType(__half{});
    case DT::bf16: return byType(__nv_bfloat16{});
    default: return cudaErrorInvalidValue;
  }
}
int bnApplyBlocks(const BatchNormArgs& a, int v) { return gridFor(a.N * a.C * a.S / v); }
// NHWC launches: G = C / V channel groups, blockDim a multiple of G (at most 1024).
int nhwcThreads(const BatchNormArgs& a, int v) {
  const int G = static_cast<int>(a.C / v);
  return G >= 256 ? G : G * (256 / G);
}
// One wave: as many blocks of `kernel` as fit on the GPU at once (each thread then streams many
// rows or vectors; its channel constants are loaded once), at most `most`.
template <typename K>
int oneWave(K kernel, int threads, size_t smem, int64_t most) {
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  int perSm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, kernel, threads, smem) != cudaSuccess || perSm < 1) perSm = 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(most, static_cast<int64_t>(perSm) * sms)));
}
size_t nhwcSumSmem(const BatchNormArgs& a, int v, int nq) { return static_cast<size_t>(nhwcThreads(a, v)) * v * nq * sizeof(float); }
// The NHWC sums: per-block partials after the doubles and floats of the scratch, then their total.
template <typename T, int V, bool kGrad>
void launchSumsNhwc(const T* x, const T* dy, const T* gate, const BatchNormArgs& a, double* w, float* f, cudaStream_t st) {
  const int nq = kGrad ? 4 : 2, threads = nhwcThreads(a, V);
  const size_t smem = nhwcSumSmem(a, V, nq);
  const int64_t rows = (a.N * a.S + threads / (a.C / V) - 1) / (threads / (a.C / V));  // rows per block step
  const int blocks = oneWave(bnSumsNhwc<T, V, kGrad>, threads, smem, std::min<int64_t>(kNhwcSumBlocks, rows));
  float* partial = f + 6 * a.C;
  bnSumsNhwc<T, V, kGrad><<<blocks, threads, smem, st>>>(x, dy, gate, a, partial);
  bnSumsNhwcTotal<<<gridFor(nq * a.C), 256, 0, st>>>(partial, blocks, nq * a.C, w);
}

}  // namespace

cudaError_t softmax(const void* x, void* y, DT t, int64_t outer, int64_t axis, int64_t inner, bool log, cudaStream_t st) {
  if (outer * inner == 0 || axis == 0) return cudaSuccess;
  softmaxKernel<<<blocksFor(outer * inner), kRowBlock, 0, st>>>(x, y, t, axis, inner, log);
  return cudaGetLastError();
}

cudaError_t layerNorm(const void* x, const void* scale, const void* bias, void* y, DT t, DT yT, DT pt, int64_t rows, int64_t D, float eps,
                      bool rms, float* mean, float* invStd, cudaStream_t st) {
  if (rows == 0) return cudaSuccess;
  if (warpRows(D, {x, scale, bias, y})) {
    const int64_t blocks = (rows + kLnWarps - 1) / kLnWarps;
    layerNormWarp<<<static_cast<unsigned>(blocks), 32 * kLnWarps, 0, st>>>(x, scale, bias, y, t, yT, pt, rows, static_cast<int>(D), eps, rms,
                                                                           mean, invStd);
    return cudaGetLastError();
  }
  layerNormKernel<<<blocksFor(rows), kRowBlock, 0, st>>>(x, scale, bias, y, t, yT, pt, D, eps, rms, mean, invStd);
  return cudaGetLastError();
}

// The block path's row slices for dscale and dbias (layerNormGradCols).
static int64_t lnColSlices(int64_t rows, int64_t D) {
  const int64_t colBlocks = (D + 31) / 32;
  return std::max<int64_t>(1, std::min<int64_t>((rows + 63) / 64, (2048 + colBlocks - 1) / colBlocks));
}

size_t layerNormGradScratch(int64_t rows, int64_t D) {
  return sizeof(float) * static_cast<size_t>(std::max<int64_t>(2 * rows + 2 * D * lnColSlices(rows, D), 2 * D * kLnGradBlocks));
}

cudaError_t layerNormGrad(const void* dy, DT dyT, const void* x, const void* scale, DT t, DT scaleT, void* dx, DT dxT, const void* res, void* dscale, void* dbias,
                          DT pT, int64_t rows, int64_t D, float eps, bool rms, float* ws, cudaStream_t st) {
  if (rows == 0) return cudaSuccess;
  if (warpRows(D, {dy, x, scale, dx, res})) {
    const int blocks = static_cast<int>(std::min<int64_t>(kLnGradBlocks, (rows + kLnGradWarps - 1) / kLnGradWarps));
    const int chunks = static_cast<int>((D + 127) / 128), d = static_cast<int>(D);
    const unsigned th = 32 * kLnGradWarps;
    if (chunks <= 2) layerNormGradWarp<2><<<blocks, th, 0, st>>>(dy, dyT, x, scale, t, scaleT, dx, dxT, res, rows, d, eps, rms, ws);
    else if (chunks <= 4) layerNormGradWarp<4><<<blocks, th, 0, st>>>(dy, dyT, x, scale, t, scaleT, dx, dxT, res, rows, d, eps, rms, ws);
    else if (chunks <= 6) layerNormGradWarp<6><<<blocks, th, 0, st>>>(dy, dyT, x, scale, t, scaleT, dx, dxT, res, rows, d, eps, rms, ws);
    else layerNormGradWarp<8><<<blocks, th, 0, st>>>(dy, dyT, x, scale, t, scaleT, dx, dxT, res, rows, d, eps, rms, ws);
    layerNormGradPartials<<<static_cast<unsigned>((2 * D + 31) / 32), dim3(32, kLnSumRows), 0, st>>>(ws, blocks, dscale, dbias, pT, D);
    return cudaGetLastError();
  }
  layerNormGradRows<<<blocksFor(rows), kRowBlock, 0, st>>>(dy, dyT, x, scale, t, scaleT, dx, dxT, res, D, eps, rms, ws);
  float* acc = ws + 2 * rows;
  const int64_t colBlocks = (D + 31) / 32, slices = lnColSlices(rows, D);
  const int64_t perBlock = (rows + slices - 1) / slices;
  layerNormGradCols<<<dim3(static_cast<unsigned>(colBlocks), static_cast<unsigned>(slices)), dim3(32, 8), 0, st>>>(dy, dyT, x, t, rows, D, ws, acc, perBlock);
  layerNormGradNarrow<<<gridFor(D), 256, 0, st>>>(acc, static_cast<int>(slices), dscale, dbias, pT, D);
  return cudaGetLastError();
}

cudaError_t batchNorm(const void* x, const void* scale, const void* bias, const void* mean, const void* var, void* y, void* runMeanOut,
                      void* runVarOut, float* ws, const BatchNormArgs& a, cudaStream_t st) {
  if (a.N * a.C * a.S == 0) return cudaSuccess;
  double* w = reinterpret_cast<double*>(ws);
  float* f = reinterpret_cast<float*>(w + 4 * a.C);
  if (cudaError_t e = cudaMemsetAsync(w, 0, sizeof(double) * 4 * a.C, st); e != cudaSuccess) return e;
  const cudaError_t e = bnDispatch(a, {x, y, a.residual}, [&](auto tag, auto vc) {
    using T = decltype(tag);
    constexpr int V = decltype(vc)::value;
    const T* X = static_cast<const T*>(x);
    if (a.nhwc) {
      if constexpr (V == 1) {
        return cudaErrorInvalidValue;  // channels not a multiple of the vector: placeChannelsLast never picks this
      } else {
        if (a.training) launchSumsNhwc<T, V, false>(X, nullptr, nullptr, a, w, f, st);
        bnFinalize<T><<<gridFor(a.C), 256, 0, st>>>(X, scale, bias, mean, var, w, f, nullptr, nullptr, a, false);
        const int threads = nhwcThreads(a, V);
        bnApplyNhwc<T, V><<<oneWave(bnApplyNhwc<T, V>, threads, 0, gridFor(a.N * a.S * (a.C / V), threads)), threads, 0, st>>>(X, static_cast<T*>(y), f, a);
        return cudaSuccess;
      }
    }
    if (a.training) {
      const dim3 grid = bnGrid(a);
      double* part = reinterpret_cast<double*>(f + 6 * a.C);
      bnSums<T, V, false><<<grid, kRowBlock, 0, st>>>(X, nullptr, nullptr, a, part);
      bnSumsTotalNchw<<<gridFor(4 * a.C), 256, 0, st>>>(part, static_cast<int>(grid.y), 4 * a.C, w);
    }
    bnFinalize<T><<<gridFor(a.C), 256, 0, st>>>(X, scale, bias, mean, var, w, f, nullptr, nullptr, a, false);
    bnApply<T, V><<<bnApplyBlocks(a, V), 256, 0, st>>>(X, static_cast<T*>(y), f, a);
    return cudaSuccess;
  });
  if (e != cudaSuccess) return e;
  if (runMeanOut || runVarOut) bnRunning<<<gridFor(a.C), 256, 0, st>>>(mean, var, runMeanOut, runVarOut, f, a);
  return cudaGetLastError();
}

cudaError_t batchNormGrad(const void* dy, const void* gate, const void* x, const void* scale, const void* mean, const void* var, void* dx,
                          void* dscale, void* dbias, float* ws, const BatchNormArgs& a, cudaStream_t st) {
  if (a.N * a.C * a.S == 0) return cudaSuccess;
  double* w = reinterpret_cast<double*>(ws);
  float* f = reinterpret_cast<float*>(w + 4 * a.C);
  if (cudaError_t e = cudaMemsetAsync(w, 0, sizeof(double) * 4 * a.C, st); e != cudaSuccess) return e;
  const cudaError_t e = bnDispatch(a, {dy, gate, x, dx}, [&](auto tag, auto vc) {
    using T = decltype(tag);
    constexpr int V = decltype(vc)::value;
    const T *X = static_cast<const T*>(x), *G = static_cast<const T*>(dy), *Gate = static_cast<const T*>(gate);
    if (a.nhwc) {
      if constexpr (V == 1) {
        return cudaErrorInvalidValue;
      } else {
        launchSumsNhwc<T, V, true>(X, G, Gate, a, w, f, st);
        bnFinalize<T><<<gridFor(a.C), 256, 0, st>>>(X, scale, nullptr, mean, var, w, f, dscale, dbias, a, true);
        const int threads = nhwcThreads(a, V);
        bnGradApplyNhwc<T, V><<<oneWave(bnGradApplyNhwc<T, V>, threads, 0, gridFor(a.N * a.S * (a.C / V), threads)), threads, 0, st>>>(
            G, Gate, X, static_cast<T*>(dx), f, a);
        return cudaSuccess;
      }
    }
    const dim3 grid = bnGrid(a);
    double* part = reinterpret_cast<double*>(f + 6 * a.C);
    bnSums<T, V, true><<<grid, kRowBlock, 0, st>>>(X, G, Gate, a, part);
    bnSumsTotalNchw<<<gridFor(4 * a.C), 256, 0, st>>>(part, static_cast<int>(grid.y), 4 * a.C, w);
    bnFinalize<T><<<gridFor(a.C), 256, 0, st>>>(X, scale, nullptr, mean, var, w, f, dscale, dbias, a, true);
    bnGradApply<T, V><<<bnApplyBlocks(a, V), 256, 0, st>>>(G, Gate, X, static_cast<T*>(dx), f, a);
    return cudaSuccess;
  });
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

cudaError_t softmaxCrossEntropy(const void* x, const void* labels, const void* weights, void* loss, void* logProb, float* ws,
                                const LossArgs& a, cudaStream_t st) {
  const int64_t rows = a.outer * a.inner;
  if (rows == 0) return cudaSuccess;
  if ((a.pitch || a.rowStats) && (a.inner != 1 || logProb)) return cudaErrorInvalidValue;  // the typed kernels only
  if (a.inner == 1 && !logProb && a.t == DT::f32)
    sceRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(static_cast<const float*>(x), labels, weights, ws, a);
  else if (a.inner == 1 && !logProb && a.t == DT::f16)
    sceRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(static_cast<const __half*>(x), labels, weights, ws, a);
  else if (a.inner == 1 && !logProb && a.t == DT::bf16)
    sceRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(static_cast<const __nv_bfloat16*>(x), labels, weights, ws, a);
  else
    sceRows<<<blocksFor(rows), kRowBlock, 0, st>>>(x, labels, weights, logProb, ws, a);
  if (a.reduction == 0) sceNone<<<gridFor(rows), 256, 0, st>>>(ws, rows, loss, a.outT);
  else sceTotal<<<1, 1024, 0, st>>>(ws, rows, loss, a.outT, a.reduction);
  return cudaGetLastError();
}

cudaError_t softmaxCrossEntropyGrad(const void* dloss, DT dlT, const void* x, const void* labels, const void* weights, void* dx, float* ws,
                                    const LossArgs& a, cudaStream_t st) {
  const int64_t rows = a.outer * a.inner;
  if (rows == 0) return cudaSuccess;
  if ((a.pitch || a.gPitch || a.rowStats) && a.inner != 1) return cudaErrorInvalidValue;  // the typed kernels only
  sceWeights<<<gridFor(rows), 256, 0, st>>>(labels, weights, ws, a, rows);
  sceTotal<<<1, 1024, 0, st>>>(ws, rows, nullptr, a.t, a.reduction);
  if (a.inner == 1 && a.t == DT::f32)
    sceGradRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(dloss, dlT, static_cast<const float*>(x), labels, weights, dx, ws, a, rows);
  else if (a.inner == 1 && a.t == DT::f16)
    sceGradRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(dloss, dlT, static_cast<const __half*>(x), labels, weights, dx, ws, a, rows);
  else if (a.inner == 1 && a.t == DT::bf16)
    sceGradRowsT<<<blocksFor(rows), kRowBlock, 0, st>>>(dloss, dlT, static_cast<const __nv_bfloat16*>(x), labels, weights, dx, ws, a, rows);
  else
    sceGradRows<<<blocksFor(rows), kRowBlock, 0, st>>>(dloss, dlT, x, labels, weights, dx, ws, a, rows);
  return cudaGetLastError();
}

namespace {
// Whether every element offset of a channels-last pool's x and y (and the grid's thread index past
// them) fits an int with room to spare.
bool offsets32(const PoolArgs& a) {
  const int64_t in = a.N * a.in[0] * a.in[1] * a.C, out = a.N * a.out[0] * a.out[1] * a.C;
  return std::max(in, out) < (int64_t{1} << 30);
}
template <typename I>
void launchPoolNhwc(const void* x, void* y, int64_t* indices, const PoolArgs& a, int64_t vec, cudaStream_t st) {
  if (a.t == DT::f16) maxPoolNhwc<__half, 8, I><<<gridFor(vec), 256, 0, st>>>(static_cast<const __half*>(x), static_cast<__half*>(y), indices, a);
  else if (a.t == DT::bf16)
    maxPoolNhwc<__nv_bfloat16, 8, I><<<gridFor(vec), 256, 0, st>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), indices, a);
  else maxPoolNhwc<float, 4, I><<<gridFor(vec * 2), 256, 0, st>>>(static_cast<const float*>(x), static_cast<float*>(y), indices, a);
}
template <typename I>
void launchPoolGradNhwc(const void* dy, const int64_t* indices, void* dx, const PoolArgs& a, int64_t vec, cudaStream_t st) {
  if (a.t == DT::f16) maxPoolGradNhwc<__half, 8, I><<<gridFor(vec), 256, 0, st>>>(static_cast<const __half*>(dy), indices, static_cast<__half*>(dx), a);
  else if (a.t == DT::bf16)
    maxPoolGradNhwc<__nv_bfloat16, 8, I><<<gridFor(vec), 256, 0, st>>>(static_cast<const __nv_bfloat16*>(dy), indices, static_cast<__nv_bfloat16*>(dx), a);
  else maxPoolGradNhwc<float, 4, I><<<gridFor(vec * 2), 256, 0, st>>>(static_cast<const float*>(dy), indices, static_cast<float*>(dx), a);
}
}  // namespace

cudaError_t maxPool(const void* x, void* y, int64_t* indices, const PoolArgs& a, cudaStream_t st) {
  int64_t P = a.N * a.C;
  for (int d = 0; d < a.nsp; ++d) P *= a.out[d];
  if (P == 0) return cudaSuccess;
  if (a.nhwc) {  // placeChannelsLast: 2 spatial dims, C a multiple of 8
    if (a.nsp != 2 || a.C % 8 != 0) return cudaErrorInvalidValue;
    const int64_t vec = P / 8;
    if (offsets32(a)) launchPoolNhwc<int>(x, y, indices, a, vec, st);
    else launchPoolNhwc<int64_t>(x, y, indices, a, vec, st);
    return cudaGetLastError();
  }
  const bool plane32 = a.nsp == 2 && a.in[0] * a.in[1] < (int64_t{1} << 31);
  if (plane32 && a.t == DT::f16) maxPool2d<<<gridFor(P), 256, 0, st>>>(static_cast<const __half*>(x), static_cast<__half*>(y), indices, a);
  else if (plane32 && a.t == DT::bf16)
    maxPool2d<<<gridFor(P), 256, 0, st>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), indices, a);
  else if (plane32 && a.t == DT::f32) maxPool2d<<<gridFor(P), 256, 0, st>>>(static_cast<const float*>(x), static_cast<float*>(y), indices, a);
  else poolKernel<<<gridFor(P), 256, 0, st>>>(x, y, indices, a, true);
  return cudaGetLastError();
}

cudaError_t maxPoolGradChannelsLast(const void* dy, const int64_t* indices, void* dx, const PoolArgs& a, cudaStream_t st) {
  if (!a.nhwc || a.nsp != 2 || a.C % 8 != 0) return cudaErrorInvalidValue;
  const int64_t vec = a.N * a.in[0] * a.in[1] * a.C / 8;
  if (vec == 0) return cudaSuccess;
  if (a.t != DT::f16 && a.t != DT::bf16 && a.t != DT::f32) return cudaErrorInvalidValue;
  if (offsets32(a)) launchPoolGradNhwc<int>(dy, indices, dx, a, vec, st);
  else launchPoolGradNhwc<int64_t>(dy, indices, dx, a, vec, st);
  return cudaGetLastError();
}

cudaError_t globalAveragePoolChannelsLast(const void* x, void* y, DT t, int64_t N, int64_t P, int64_t C, cudaStream_t st) {
  if (N * C == 0) return cudaSuccess;
  if (t == DT::f16) gapNhwc<<<gridFor(N * C), 256, 0, st>>>(static_cast<const __half*>(x), static_cast<__half*>(y), N, P, C);
  else if (t == DT::bf16) gapNhwc<<<gridFor(N * C), 256, 0, st>>>(static_cast<const __nv_bfloat16*>(x), static_cast<__nv_bfloat16*>(y), N, P, C);
  else if (t == DT::f32) gapNhwc<<<gridFor(N * C), 256, 0, st>>>(static_cast<const float*>(x), static_cast<float*>(y), N, P, C);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t broadcastChannelsLast(const void* x, void* y, int64_t N, int64_t P, int64_t C, int elemBytes, cudaStream_t st) {
  const int64_t total = N * P * C;
  if (total == 0) return cudaSuccess;
  if (elemBytes == 2) broadcastNhwcKernel<<<gridFor(total), 256, 0, st>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), P, C, total);
  else if (elemBytes == 4) broadcastNhwcKernel<<<gridFor(total), 256, 0, st>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), P, C, total);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t averagePool(const void* x, void* y, const PoolArgs& a, cudaStream_t st) {
  int64_t P = a.N * a.C;
  for (int d = 0; d < a.nsp; ++d) P *= a.out[d];
  if (P == 0) return cudaSuccess;
  poolKernel<<<gridFor(P), 256, 0, st>>>(x, y, nullptr, a, false);
  return cudaGetLastError();
}

cudaError_t averagePoolGrad(const void* dy, void* dx, float* acc, const PoolArgs& a, cudaStream_t st) {
  int64_t P = a.N * a.C, I = a.N * a.C;
  for (int d = 0; d < a.nsp; ++d) P *= a.out[d], I *= a.in[d];
  if (!acc) {  // gathered (deterministic)
    if (I > 0) avgPoolGradGatherKernel<<<gridFor(I), 256, 0, st>>>(dy, dx, a);
    return cudaGetLastError();
  }
  if (cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * I, st); e != cudaSuccess) return e;
  if (P > 0) avgPoolGradKernel<<<gridFor(P), 256, 0, st>>>(dy, acc, a);
  narrowF32<<<gridFor(I), 256, 0, st>>>(acc, dx, a.t, I);
  return cudaGetLastError();
}

}  // namespace ampc::cuda
