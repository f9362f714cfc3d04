#include <cmath>

#include "kernels/cuda/train.h"

namespace ampc::cuda {

TensorList::TensorList(const std::vector<int64_t>& sizes, int64_t chunk) : chunk_(chunk) {
  std::vector<int> tensor;
  std::vector<int64_t> start;
  for (size_t t = 0; t < sizes.size(); ++t)
    for (int64_t s = 0; s < sizes[t]; s += chunk) {
      tensor.push_back(static_cast<int>(t));
      start.push_back(s);
    }
  chunks_ = static_cast<int>(tensor.size());
  cudaMalloc(&chunkTensor_, sizeof(int) * tensor.size() + 1);
  cudaMalloc(&chunkStart_, sizeof(int64_t) * start.size() + 1);
  cudaMalloc(&sizes_, sizeof(int64_t) * sizes.size() + 1);
  cudaMemcpy(chunkTensor_, tensor.data(), sizeof(int) * tensor.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(chunkStart_, start.data(), sizeof(int64_t) * start.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(sizes_, sizes.data(), sizeof(int64_t) * sizes.size(), cudaMemcpyHostToDevice);
}

TensorList::~TensorList() {
  cudaFree(chunkTensor_);
  cudaFree(chunkStart_);
  cudaFree(sizes_);
}

namespace {

constexpr int kThreads = 256;

__global__ void zeroFlags(int* found, double* normSq) {
  *found = 0;
  *normSq = 0.0;
}

__global__ void unscaleKernel(const int* chunkTensor, const int64_t* chunkStart, const int64_t* sizes, int64_t chunk,
                              float* const* grads, const float* scale, int* found, double* normSq) {
  const int t = chunkTensor[blockIdx.x];
  const int64_t begin = chunkStart[blockIdx.x], end = min(begin + chunk, sizes[t]);
  float* g = grads[t];
  const float inv = 1.0f / *scale;
  double sq = 0;
  int bad = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float v = g[i] * inv;
    g[i] = v;
    bad |= !isfinite(v);
    sq += static_cast<double>(v) * v;
  }
  // Block reduction of the sum of squares; one atomic per block.
  __shared__ double part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_down_sync(0xffffffffu, sq, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = sq;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    double s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += part[w];
    atomicAdd(normSq, s);
    if (bad) atomicOr(found, 1);
  }
}

__device__ float clipCoef(const double* normSq, float maxNorm) {
  if (maxNorm <= 0.0f) return 1.0f;
  const double c = static_cast<double>(maxNorm) / (sqrt(*normSq) + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

__global__ void stepLrKernel(int64_t* step, float* lrOut, const int* found, float lr, int schedule, int64_t warmup, int64_t total) {
  const int64_t s = *step + (*found ? 0 : 1);
  *step = s;
  const double t = static_cast<double>(s < 1 ? 1 : s);
  double r = lr;
  if (schedule != 0 && warmup > 0 && t < static_cast<double>(warmup)) r = lr * t / static_cast<double>(warmup);
  else if (schedule == 2 && total > warmup)
    r = 0.5 * lr * (1 + cos(3.141592653589793 * fmin(1.0, (t - warmup) / static_cast<double>(total - warmup))));
  *lrOut = static_cast<float>(r);
}

__global__ void sgdKernel(const int* chunkTensor, const int64_t* chunkStart, const int64_t* sizes, int64_t chunk,
                          float* const* params, float* const* grads, float* const* bufs, const float* lrPtr, const int* found,
                          const double* normSq, float maxNorm, float mom, float wd, bool nesterov) {
  if (*found) return;  // a skipped step writes nothing
  const int t = chunkTensor[blockIdx.x];
  const int64_t begin = chunkStart[blockIdx.x], end = min(begin + chunk, sizes[t]);
  const float coef = clipCoef(normSq, maxNorm), lr = *lrPtr;
  float *p = params[t], *b = bufs[t];
  const float* g = grads[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float d = (coef < 1.0f ? g[i] * coef : g[i]) + wd * p[i];
    if (mom != 0.0f) {
      b[i] = mom * b[i] + d;
      d = nesterov ? d + mom * b[i] : b[i];
    }
    p[i] -= lr * d;
  }
}

__global__ void adamKernel(const int* chunkTensor, const int64_t* chunkStart, const int64_t* sizes, int64_t chunk,
                           float* const* params, float* const* grads, float* const* ms, float* const* vs, const float* lrPtr,
                           const int64_t* step, const int* found, const double* normSq, float maxNorm, float b1, float b2,
                           float eps, float wd, bool decoupled) {
  if (*found) return;
  const int t = chunkTensor[blockIdx.x];
  const int64_t begin = chunkStart[blockIdx.x], end = min(begin + chunk, sizes[t]);
  const float coef = clipCoef(normSq, maxNorm), lr = *lrPtr;
  const double n = static_cast<double>(*step);
  const float bc1 = static_cast<float>(1 - pow(static_cast<double>(b1), n)), bc2 = static_cast<float>(1 - pow(static_cast<double>(b2), n));
  const float stepSize = lr / bc1, bc2Sqrt = sqrtf(bc2);
  float *p = params[t], *m = ms[t], *v = vs[t];
  const float* g = grads[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float gi = coef < 1.0f ? g[i] * coef : g[i];
    if (decoupled) p[i] *= 1 - lr * wd;
    else gi += wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    p[i] -= stepSize * m[i] / (sqrtf(v[i]) / bc2Sqrt + eps);
  }
}

__global__ void zeroDoubles(double* d, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = 0.0;
}

// LAMB phase 1: moments, u (written over the gradient), and per-tensor ||p||^2, ||u||^2.
__global__ void lambMomentsKernel(const int* chunkTensor, const int64_t* chunkStart, const int64_t* sizes, int64_t chunk,
                                  float* const* params, float* const* grads, float* const* ms, float* const* vs, const int64_t* step,
                                  const int* found, const double* normSq, float maxNorm, float b1, float b2, float eps, float wd,
                                  double* norms) {
  if (*found) return;
  const int t = chunkTensor[blockIdx.x];
  const int64_t begin = chunkStart[blockIdx.x], end = min(begin + chunk, sizes[t]);
  const float coef = clipCoef(normSq, maxNorm);
  const double n = static_cast<double>(*step);
  const float bc1 = static_cast<float>(1 - pow(static_cast<double>(b1), n)), bc2 = static_cast<float>(1 - pow(static_cast<double>(b2), n));
  const float* p = params[t];
  float *g = grads[t], *m = ms[t], *v = vs[t];
  double pn = 0, un = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float gi = coef < 1.0f ? g[i] * coef : g[i];
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    const float u = (m[i] / bc1) / (sqrtf(v[i] / bc2) + eps) + wd * p[i];
    g[i] = u;
    pn += static_cast<double>(p[i]) * p[i];
    un += static_cast<double>(u) * u;
  }
  for (int o = 16; o > 0; o >>= 1) {
    pn += __shfl_down_sync(0xffffffffu, pn, o);
    un += __shfl_down_sync(0xffffffffu, un, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&norms[2 * t], pn);
    atomicAdd(&norms[2 * t + 1], un);
  }
}

// LAMB phase 2: p -= lr * trust * u, trust = ||p|| / ||u|| (1 when either is 0).
__global__ void lambApplyKernel(const int* chunkTensor, const int64_t* chunkStart, const int64_t* sizes, int64_t chunk,
                                float* const* params, float* const* us, const float* lrPtr, const int* found, const double* norms) {
  if (*found) return;
  const int t = chunkTensor[blockIdx.x];
  const int64_t begin = chunkStart[blockIdx.x], end = min(begin + chunk, sizes[t]);
  const double pn = norms[2 * t], un = norms[2 * t + 1];
  const float trust = pn > 0 && un > 0 ? static_cast<float>(sqrt(pn) / sqrt(un)) : 1.0f;
  const float lr = *lrPtr;
  float* p = params[t];
  const float* u = us[t];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) p[i] -= lr * trust * u[i];
}

__global__ void scalerKernel(float* scalePtr, int64_t* growthPtr, int64_t* hystPtr, const int* found, float growth, float backoff,
                             int64_t interval, int64_t hysteresis, float lo, float hi) {
  double scale = *scalePtr;
  int64_t tracker = *growthPtr, left = *hystPtr;
  if (*found) {
    tracker = 0;
    left = left > 1 ? left - 1 : 0;
    if (left == 0) scale *= backoff;
  } else {
    left = hysteresis;
    if (++tracker >= interval) {
      scale *= growth;
      tracker = 0;
    }
  }
  if (lo > 0) scale = fmax(scale, static_cast<double>(lo));
  if (hi > 0) scale = fmin(scale, static_cast<double>(hi));
  *scalePtr = static_cast<float>(scale);
  *growthPtr = tracker;
  *hystPtr = left;
}

}  // namespace

cudaError_t unscaleCheckNorm(const TensorList& l, float* const* grads, const StepState& s, cudaStream_t st) {
  zeroFlags<<<1, 1, 0, st>>>(s.foundInf, s.normSq);
  if (l.chunks() > 0)
    unscaleKernel<<<l.chunks(), kThreads, 0, st>>>(l.chunkTensor(), l.chunkStart(), l.sizes(), l.chunkSize(), grads, s.scale, s.foundInf,
                                                    s.normSq);
  return cudaGetLastError();
}

cudaError_t stepAndLr(const StepState& s, float lr, int schedule, int64_t warmup, int64_t total, cudaStream_t st) {
  stepLrKernel<<<1, 1, 0, st>>>(s.step, s.lr, s.foundInf, lr, schedule, warmup, total);
  return cudaGetLastError();
}

cudaError_t sgdStep(const TensorList& l, float* const* params, float* const* grads, float* const* bufs, const StepState& s,
                    float maxNorm, float momentum, float weightDecay, bool nesterov, cudaStream_t st) {
  if (l.chunks() > 0)
    sgdKernel<<<l.chunks(), kThreads, 0, st>>>(l.chunkTensor(), l.chunkStart(), l.sizes(), l.chunkSize(), params, grads, bufs, s.lr,
                                                s.foundInf, s.normSq, maxNorm, momentum, weightDecay, nesterov);
  return cudaGetLastError();
}

cudaError_t adamStep(const TensorList& l, float* const* params, float* const* grads, float* const* m, float* const* v,
                     const StepState& s, float maxNorm, float beta1, float beta2, float eps, float weightDecay, bool decoupled,
                     cudaStream_t st) {
  if (l.chunks() > 0)
    adamKernel<<<l.chunks(), kThreads, 0, st>>>(l.chunkTensor(), l.chunkStart(), l.sizes(), l.chunkSize(), params, grads, m, v, s.lr,
                                                 s.step, s.foundInf, s.normSq, maxNorm, beta1, beta2, eps, weightDecay, decoupled);
  return cudaGetLastError();
}

cudaError_t lambStep(const TensorList& l, float* const* params, float* const* grads, float* const* m, float* const* v,
                     const StepState& s, float maxNorm, float beta1, float beta2, float eps, float weightDecay, double* norms,
                     int numTensors, cudaStream_t st) {
  zeroDoubles<<<1, kThreads, 0, st>>>(norms, 2 * numTensors);
  if (l.chunks() > 0) {
    lambMomentsKernel<<<l.chunks(), kThreads, 0, st>>>(l.chunkTensor(), l.chunkStart(), l.sizes(), l.chunkSize(), params, grads, m, v,
                                                        s.step, s.foundInf, s.normSq, maxNorm, beta1, beta2, eps, weightDecay, norms);
    lambApplyKernel<<<l.chunks(), kThreads, 0, st>>>(l.chunkTensor(), l.chunkStart(), l.sizes(), l.chunkSize(), params, grads, s.lr,
                                                      s.foundInf, norms);
  }
  return cudaGetLastError();
}

cudaError_t scalerUpdate(const StepState& s, float growthFactor, float backoffFactor, int64_t growthInterval, int64_t hysteresis,
                         float minScale, float maxScale, cudaStream_t st) {
  scalerKernel<<<1, 1, 0, st>>>(s.scale, s.growth, s.hysteresis, s.foundInf, growthFactor, backoffFactor, growthInterval, hysteresis,
                                minScale, maxScale);
  return cudaGetLastError();
}

}  // namespace ampc::cuda
