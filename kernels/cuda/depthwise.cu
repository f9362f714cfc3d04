// Depthwise convolutions (group == input channels == output channels) on NCHW planes, in place of
// cuDNN, whose depthwise forward and gradients run far below memory speed on every algorithm it has
// for these shapes (ConvNeXt-T's 7 x 7 gradients took 1.7 ms each on the H200, about 40% of its step).
//
// Square kernels of 3, 5 or 7 at stride 1 or 2 without dilation take the register-window kernels:
// a thread computes kV consecutive outputs of one row, reading each input row's window once for all
// of them. The filter gradient sums over (image, row) slices per channel into f32 partials that a
// second kernel adds in a fixed order, so it is deterministic. Other windows take the plain kernels.
// Every sum is f32, rounded once to the storage type, as the CPU reference does.
#include <algorithm>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/ops.h"

namespace ampc::cuda {
namespace {

constexpr int kV = 4;         // outputs per thread along a row
constexpr int kBlock = 256;   // threads per block
constexpr int kTarget = 528;  // blocks the filter gradient aims for (4 per SM of an H100/H200)

bool fastWindow(const DwArgs& a) {
  return a.KH == a.KW && (a.KH == 3 || a.KH == 5 || a.KH == 7) && a.SH == a.SW && (a.SH == 1 || a.SH == 2) && a.DH == 1 && a.DW == 1;
}

// The kWin inputs of row ih of plane xp from column iw0 on (zero outside the plane); false when
// the row is outside it.
template <typename T, int kWin>
__device__ __forceinline__ bool loadWindow(const T* xp, int ih, int iw0, const DwArgs& a, float (&xw)[kWin]) {
  if (ih < 0 || ih >= a.H) return false;
  const T* row = xp + static_cast<int64_t>(ih) * a.W;
#pragma unroll
  for (int j = 0; j < kWin; ++j) {
    const int iw = iw0 + j;
    xw[j] = iw >= 0 && iw < a.W ? toF(row[iw]) : 0.0f;
  }
  return true;
}

// y[p, oh, ow] = bias[c] + sum over (kh, kw) of x[p, oh*S - PH + kh, ow*S - PW + kw] * w[c, kh, kw]
// (w read flipped when `flip`: the data gradient at stride 1 is this convolution of dy).
template <typename T, int K, int S>
__global__ void dwForwardFast(DwArgs a, const T* __restrict__ x, const T* __restrict__ w, const void* bias, DT biasT, bool flip, T* __restrict__ y) {
  constexpr int kWin = (kV - 1) * S + K;
  const int G = (a.OW + kV - 1) / kV;
  const int64_t items = a.planes * a.OH * G;
  AMPC_GRID_LOOP(i, items) {
    const int g = static_cast<int>(i % G);
    const int64_t r = i / G;
    const int oh = static_cast<int>(r % a.OH);
    const int64_t plane = r / a.OH;
    const int c = static_cast<int>(plane % a.C);
    const T* wc = w + static_cast<int64_t>(c) * K * K;
    const T* xp = x + plane * a.H * a.W;
    const float b = bias ? loadF(bias, biasT, c) : 0.0f;
    float acc[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) acc[v] = b;
    const int ow0 = g * kV, iw0 = ow0 * S - a.PW;
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
      float xw[kWin];
      if (!loadWindow<T, kWin>(xp, oh * S - a.PH + kh, iw0, a, xw)) continue;
#pragma unroll
      for (int kw = 0; kw < K; ++kw) {
        const float wv = toF(wc[flip ? (K - 1 - kh) * K + (K - 1 - kw) : kh * K + kw]);
#pragma unroll
        for (int v = 0; v < kV; ++v) acc[v] += xw[v * S + kw] * wv;
      }
    }
    T* yr = y + (plane * a.OH + oh) * a.OW;
#pragma unroll
    for (int v = 0; v < kV; ++v)
      if (ow0 + v < a.OW) yr[ow0 + v] = fromF<T>(acc[v]);
  }
}

// Any window: a thread per output.
template <typename T>
__global__ void dwForwardPlain(DwArgs a, const T* __restrict__ x, const T* __restrict__ w, const void* bias, DT biasT, T* __restrict__ y) {
  const int64_t n = a.planes * a.OH * a.OW;
  AMPC_GRID_LOOP(i, n) {
    const int ow = static_cast<int>(i % a.OW);
    const int64_t r = i / a.OW;
    const int oh = static_cast<int>(r % a.OH);
    const int64_t plane = r / a.OH;
    const int c = static_cast<int>(plane % a.C);
    const T* xp = x + plane * a.H * a.W;
    float acc = bias ? loadF(bias, biasT, c) : 0.0f;
    for (int kh = 0; kh < a.KH; ++kh) {
      const int ih = oh * a.SH - a.PH + kh * a.DH;
      if (ih < 0 || ih >= a.H) continue;
      for (int kw = 0; kw < a.KW; ++kw) {
        const int iw = ow * a.SW - a.PW + kw * a.DW;
        if (iw >= 0 && iw < a.W) acc += toF(xp[static_cast<int64_t>(ih) * a.W + iw]) * toF(w[(static_cast<int64_t>(c) * a.KH + kh) * a.KW + kw]);
      }
    }
    y[i] = fromF<T>(acc);
  }
}

// dx[p, ih, iw] = sum over the taps that reach it of dy[p, oh, ow] * w[c, kh, kw]: a thread per input.
template <typename T>
__global__ void dwDataPlain(DwArgs a, const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx) {
  const int64_t n = a.planes * a.H * a.W;
  AMPC_GRID_LOOP(i, n) {
    const int iw = static_cast<int>(i % a.W);
    const int64_t r = i / a.W;
    const int ih = static_cast<int>(r % a.H);
    const int64_t plane = r / a.H;
    const int c = static_cast<int>(plane % a.C);
    const T* dp = dy + plane * a.OH * a.OW;
    float acc = 0.0f;
    for (int kh = 0; kh < a.KH; ++kh) {
      const int th = ih + a.PH - kh * a.DH;
      if (th < 0 || th % a.SH != 0 || th / a.SH >= a.OH) continue;
      for (int kw = 0; kw < a.KW; ++kw) {
        const int tw = iw + a.PW - kw * a.DW;
        if (tw < 0 || tw % a.SW != 0 || tw / a.SW >= a.OW) continue;
        acc += toF(dp[static_cast<int64_t>(th / a.SH) * a.OW + tw / a.SW]) * toF(w[(static_cast<int64_t>(c) * a.KH + kh) * a.KW + kw]);
      }
    }
    dx[i] = fromF<T>(acc);
  }
}

// The filter gradient's split of channel c's (image, output row) rows: block (s, c) takes rows
// [s * chunk, (s + 1) * chunk).
struct Split {
  int n = 1;
  int64_t chunk = 0;
};
Split splitOf(const DwArgs& a, int64_t perChannelBlocks) {
  const int64_t rows = a.N * a.OH;
  Split s;
  const int64_t want = std::max<int64_t>(1, (kTarget + perChannelBlocks * a.C - 1) / (perChannelBlocks * a.C));
  s.n = static_cast<int>(std::min<int64_t>({want, std::max<int64_t>(1, rows / 8), 65535}));
  s.chunk = (rows + s.n - 1) / s.n;
  return s;
}

// part[s, c, kh*K + kw] = sum over block s's rows of channel c of dy[., oh, ow] * x[., oh*S - PH + kh, ow*S - PW + kw].
template <typename T, int K, int S>
__global__ void __launch_bounds__(kBlock) dwFilterFast(DwArgs a, int64_t chunk, const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ part) {
  constexpr int kWin = (kV - 1) * S + K;
  const int c = blockIdx.y, s = blockIdx.x;
  const int G = (a.OW + kV - 1) / kV;
  const int64_t rows = a.N * a.OH, r0 = s * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc[K * K];
#pragma unroll
  for (int t = 0; t < K * K; ++t) acc[t] = 0.0f;
  for (int64_t i = r0 * G + threadIdx.x; i < r1 * G; i += blockDim.x) {
    const int g = static_cast<int>(i % G);
    const int64_t r = i / G;
    const int oh = static_cast<int>(r % a.OH);
    const int64_t plane = (r / a.OH) * a.C + c;
    const int ow0 = g * kV, iw0 = ow0 * S - a.PW;
    const T* dr = dy + (plane * a.OH + oh) * a.OW;
    float d[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) d[v] = ow0 + v < a.OW ? toF(dr[ow0 + v]) : 0.0f;
    const T* xp = x + plane * a.H * a.W;
#pragma unroll
    for (int kh = 0; kh < K; ++kh) {
      float xw[kWin];
      if (!loadWindow<T, kWin>(xp, oh * S - a.PH + kh, iw0, a, xw)) continue;
#pragma unroll
      for (int kw = 0; kw < K; ++kw)
#pragma unroll
        for (int v = 0; v < kV; ++v) acc[kh * K + kw] += d[v] * xw[v * S + kw];
    }
  }
  __shared__ float sums[kBlock / 32][K * K];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int t = 0; t < K * K; ++t) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sums[warp][t] = v;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < K * K; t += blockDim.x) {
    float v = 0.0f;
    for (int k = 0; k < kBlock / 32; ++k) v += sums[k][t];
    part[(static_cast<int64_t>(s) * a.C + c) * K * K + t] = v;
  }
}

// Any window: block (s, c * KH * KW + tap) sums one tap over its rows.
template <typename T>
__global__ void dwFilterPlain(DwArgs a, int64_t chunk, const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ part) {
  const int taps = a.KH * a.KW;
  const int c = blockIdx.y / taps, tap = blockIdx.y % taps, kh = tap / a.KW, kw = tap % a.KW, s = blockIdx.x;
  const int64_t rows = a.N * a.OH, r0 = s * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc = 0.0f;
  for (int64_t i = r0 * a.OW + threadIdx.x; i < r1 * a.OW; i += blockDim.x) {
    const int ow = static_cast<int>(i % a.OW);
    const int64_t r = i / a.OW;
    const int oh = static_cast<int>(r % a.OH);
    const int64_t plane = (r / a.OH) * a.C + c;
    const int ih = oh * a.SH - a.PH + kh * a.DH, iw = ow * a.SW - a.PW + kw * a.DW;
    if (ih < 0 || ih >= a.H || iw < 0 || iw >= a.W) continue;
    acc += toF(dy[(plane * a.OH + oh) * a.OW + ow]) * toF(x[(plane * a.H + ih) * a.W + iw]);
  }
  const float v = blockSum(acc);
  if (threadIdx.x == 0) part[(static_cast<int64_t>(s) * a.C + c) * taps + tap] = v;
}

// dw[c, tap] = the partials of every split, added in order.
template <typename T>
__global__ void dwFilterFinish(int64_t elems, int splits, const float* __restrict__ part, T* __restrict__ dw) {
  AMPC_GRID_LOOP(i, elems) {
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += part[s * elems + i];
    dw[i] = fromF<T>(v);
  }
}

template <typename T, int K, int S>
void forwardFast(const DwArgs& a, const void* x, const void* w, const void* bias, DT biasT, bool flip, void* y, cudaStream_t st) {
  const int64_t items = a.planes * a.OH * ((a.OW + kV - 1) / kV);
  dwForwardFast<T, K, S><<<gridFor(items, kBlock), kBlock, 0, st>>>(a, static_cast<const T*>(x), static_cast<const T*>(w), bias, biasT, flip,
                                                                     static_cast<T*>(y));
}
template <typename T, int K, int S>
void filterFast(const DwArgs& a, const Split& sp, const void* x, const void* dy, float* part, cudaStream_t st) {
  dwFilterFast<T, K, S><<<dim3(sp.n, a.C), kBlock, 0, st>>>(a, sp.chunk, static_cast<const T*>(x), static_cast<const T*>(dy), part);
}

// The kernel for (K, S) of a fast window.
template <typename T, template <typename, int, int> class F>
struct Pick {
  template <typename... Args>
  static void run(const DwArgs& a, Args... args) {
    const int k = a.KH, s = a.SH;
    if (k == 3) s == 1 ? F<T, 3, 1>::run(a, args...) : F<T, 3, 2>::run(a, args...);
    else if (k == 5) s == 1 ? F<T, 5, 1>::run(a, args...) : F<T, 5, 2>::run(a, args...);
    else s == 1 ? F<T, 7, 1>::run(a, args...) : F<T, 7, 2>::run(a, args...);
  }
};
template <typename T, int K, int S>
struct ForwardFast {
  static void run(const DwArgs& a, const void* x, const void* w, const void* bias, DT biasT, bool flip, void* y, cudaStream_t st) {
    forwardFast<T, K, S>(a, x, w, bias, biasT, flip, y, st);
  }
};
template <typename T, int K, int S>
struct FilterFast {
  static void run(const DwArgs& a, const Split* sp, const void* x, const void* dy, float* part, cudaStream_t st) {
    filterFast<T, K, S>(a, *sp, x, dy, part, st);
  }
};

template <typename T>
void forwardT(const DwArgs& a, const void* x, const void* w, const void* bias, DT biasT, void* y, cudaStream_t st) {
  if (fastWindow(a)) return Pick<T, ForwardFast>::run(a, x, w, bias, biasT, false, y, st);
  dwForwardPlain<T><<<gridFor(a.planes * a.OH * a.OW, kBlock), kBlock, 0, st>>>(a, static_cast<const T*>(x), static_cast<const T*>(w), bias, biasT,
                                                                                static_cast<T*>(y));
}
template <typename T>
void dataT(const DwArgs& a, const void* dy, const void* w, void* dx, cudaStream_t st) {
  if (fastWindow(a) && a.SH == 1) {
    // At stride 1 the data gradient is the forward convolution of dy with the flipped filter,
    // padded by K - 1 - P: the (OH, OW) planes in, the (H, W) planes out.
    DwArgs b = a;
    b.H = a.OH;
    b.W = a.OW;
    b.OH = a.H;
    b.OW = a.W;
    b.PH = a.KH - 1 - a.PH;
    b.PW = a.KW - 1 - a.PW;
    return Pick<T, ForwardFast>::run(b, dy, w, nullptr, DT::f32, true, dx, st);
  }
  dwDataPlain<T><<<gridFor(a.planes * a.H * a.W, kBlock), kBlock, 0, st>>>(a, static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx));
}
template <typename T>
void filterT(const DwArgs& a, const void* x, const void* dy, void* dw, float* part, cudaStream_t st) {
  const int64_t taps = static_cast<int64_t>(a.KH) * a.KW, elems = a.C * taps;
  Split sp;
  if (fastWindow(a)) {
    sp = splitOf(a, 1);
    Pick<T, FilterFast>::run(a, &sp, x, dy, part, st);
  } else {
    sp = splitOf(a, taps);
    dwFilterPlain<T><<<dim3(sp.n, static_cast<unsigned>(elems)), kBlock, 0, st>>>(a, sp.chunk, static_cast<const T*>(x), static_cast<const T*>(dy), part);
  }
  dwFilterFinish<T><<<gridFor(elems, kBlock), kBlock, 0, st>>>(elems, sp.n, part, static_cast<T*>(dw));
}

template <template <typename> class F, typename... Args>
cudaError_t byType(DT t, Args... args) {
  switch (t) {
    case DT::f32: F<float>::run(args...); break;
    case DT::f16: F<__half>::run(args...); break;
    case DT::bf16: F<__nv_bfloat16>::run(args...); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
template <typename T>
struct Forward {
  static void run(const DwArgs& a, const void* x, const void* w, const void* bias, DT biasT, void* y, cudaStream_t st) { forwardT<T>(a, x, w, bias, biasT, y, st); }
};
template <typename T>
struct Data {
  static void run(const DwArgs& a, const void* dy, const void* w, void* dx, cudaStream_t st) { dataT<T>(a, dy, w, dx, st); }
};
template <typename T>
struct Filter {
  static void run(const DwArgs& a, const void* x, const void* dy, void* dw, float* part, cudaStream_t st) { filterT<T>(a, x, dy, dw, part, st); }
};

}  // namespace

size_t depthwiseFilterScratch(const DwArgs& a) {
  const int64_t taps = static_cast<int64_t>(a.KH) * a.KW;
  const Split sp = splitOf(a, fastWindow(a) ? 1 : taps);
  return static_cast<size_t>(sp.n) * static_cast<size_t>(a.C * taps) * sizeof(float);
}
cudaError_t depthwiseForward(const DwArgs& a, DT t, const void* x, const void* w, const void* bias, DT biasT, void* y, cudaStream_t st) {
  return byType<Forward>(t, a, x, w, bias, biasT, y, st);
}
cudaError_t depthwiseBackwardData(const DwArgs& a, DT t, const void* dy, const void* w, void* dx, cudaStream_t st) {
  return byType<Data>(t, a, dy, w, dx, st);
}
cudaError_t depthwiseBackwardFilter(const DwArgs& a, DT t, const void* x, const void* dy, void* dw, float* part, cudaStream_t st) {
  return byType<Filter>(t, a, x, dy, dw, part, st);
}

}  // namespace ampc::cuda
