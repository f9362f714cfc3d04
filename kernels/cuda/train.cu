#include <cmath>

#include "kernels/cuda/device.cuh"
#include "kernels/cuda/train.h"

namespace ampc::cuda {

TensorList::TensorList(const std::vector<int64_t>& sizes, const std::vector<std::vector<void*>>& roles, int64_t chunk)
    : tensors_(static_cast<int>(sizes.size())), chunk_(chunk) {
  std::vector<int> tensor;
  std::vector<int64_t> start;
  for (size_t t = 0; t < sizes.size(); ++t)
    for (int64_t s = 0; s < sizes[t]; s += chunk) {
      tensor.push_back(static_cast<int>(t));
      start.push_back(s);
    }
  std::vector<void*> table;
  for (const auto& r : roles) table.insert(table.end(), r.begin(), r.end());
  chunks_ = static_cast<int>(tensor.size());
  // Load time, before any step: plain synchronous copies.
  cudaMalloc(&chunkTensor_, sizeof(int) * tensor.size() + 8);
  cudaMalloc(&chunkStart_, sizeof(int64_t) * start.size() + 8);
  cudaMalloc(&sizes_, sizeof(int64_t) * sizes.size() + 8);
  cudaMalloc(&roles_, sizeof(void*) * table.size() + 8);
  cudaMemcpy(chunkTensor_, tensor.data(), sizeof(int) * tensor.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(chunkStart_, start.data(), sizeof(int64_t) * start.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(sizes_, sizes.data(), sizeof(int64_t) * sizes.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(roles_, table.data(), sizeof(void*) * table.size(), cudaMemcpyHostToDevice);
}

TensorList::~TensorList() {
  cudaFree(chunkTensor_);
  cudaFree(chunkStart_);
  cudaFree(sizes_);
  cudaFree(roles_);
}

namespace {

constexpr int kThreads = 256;

struct Chunk {
  int t;
  int64_t begin, end;
};
__device__ __forceinline__ Chunk chunkOf(const int* ct, const int64_t* cs, const int64_t* sizes, int64_t chunk) {
  const int t = ct[blockIdx.x];
  const int64_t b = cs[blockIdx.x];
  return {t, b, min(b + chunk, sizes[t])};
}
#define AMPC_CHUNK_ARGS const int *ct, const int64_t *cs, const int64_t *sizes, int64_t chunk, int n
#define AMPC_CHUNK_PASS(l) (l).chunkTensor(), (l).chunkStart(), (l).sizes(), (l).chunkSize(), (l).tensors()
template <typename T>
__device__ __forceinline__ T* rolePtr(void* const* roles, int n, int r, int t) {
  return static_cast<T*>(roles[static_cast<size_t>(r) * n + t]);
}

// T: the gradients' type (f16/bf16 when a widening Cast in front is read through).
template <typename T>
__global__ void unscaleKernel(AMPC_CHUNK_ARGS, void* const* roles, const float* invScale, bool* found) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const T* g = rolePtr<const T>(roles, n, 0, c.t);
  float* o = rolePtr<float>(roles, n, 1, c.t);
  const float inv = *invScale;
  int bad = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const float v = toF(g[i]) * inv;
    o[i] = v;
    bad |= !isfinite(v);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = true;
}

// UnscaleCheck folded into the optimizer: the check, and the squares for the clip's norm.
template <typename T>
__global__ void unscaleNormKernel(AMPC_CHUNK_ARGS, void* const* roles, const float* invScale, bool* found, double* normSq) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const T* g = rolePtr<const T>(roles, n, 0, c.t);
  const float inv = *invScale;
  int bad = 0;
  double sq = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const float v = toF(g[i]) * inv;
    bad |= !isfinite(v);
    sq += static_cast<double>(v) * v;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = true;
  if (normSq) {  // this chunk's sum of squares, summed with the others in chunk order (sumInOrder)
    sq = blockSum(sq);
    if (threadIdx.x == 0) normSq[blockIdx.x] = sq;
  }
}

// An optimizer's view of its gradient (GradIn): the unscale and clip factors, read once a block.
struct GradView {
  float inv;
  double coef;
  bool unscale;
  __device__ explicit GradView(const GradIn& gi) : inv(gi.invScale ? *gi.invScale : 1.0f), coef(1.0), unscale(gi.invScale != nullptr) {
    if (gi.normSq && gi.maxNorm > 0 && !*gi.clipFound) coef = fmin(1.0, static_cast<double>(gi.maxNorm) / (sqrt(*gi.normSq) + 1e-6));
  }
  template <typename G>
  __device__ __forceinline__ float operator()(const G* g, int64_t i) const {
    const float u = unscale ? toF(g[i]) * inv : toF(g[i]);
    return coef < 1.0 ? static_cast<float>(u * coef) : u;
  }
};

// roles {src f32, dst f16/bf16}: four elements per thread and step (chunks start at multiples of
// the chunk size, so the pack stays aligned when the tensors are), the rest one by one.
__global__ void castKernel(AMPC_CHUNK_ARGS, void* const* roles, DT to) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float* x = rolePtr<const float>(roles, n, 0, c.t);
  void* y = roles[static_cast<size_t>(n) + c.t];
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0;
  const int64_t packs = vec ? (c.end - c.begin) / 4 : 0;
  for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
    float v[4];
    load4(x, DT::f32, c.begin + 4 * p, v);
    store4(y, to, c.begin + 4 * p, v);
  }
  for (int64_t i = c.begin + 4 * packs + threadIdx.x; i < c.end; i += blockDim.x) storeF(y, to, i, x[i]);
}

__global__ void normKernel(AMPC_CHUNK_ARGS, void* const* roles, double* normSq) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float* g = rolePtr<float>(roles, n, 0, c.t);
  double sq = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) sq += static_cast<double>(g[i]) * g[i];
  sq = blockSum(sq);
  if (threadIdx.x == 0) normSq[blockIdx.x] = sq;  // partials, summed in order by sumInOrder
}

// out[0] = parts[0] + ... + parts[n - 1] in a fixed order (one block: each thread sums a strided
// slice in order, then the block's tree): no atomics, the same bits every run.
__global__ void sumInOrderKernel(const double* parts, int n, double* out) {
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += parts[i];
  s = blockSum(s);
  if (threadIdx.x == 0) *out = s;
}
// LAMB's per-tensor norms from the chunks' partials (2 per chunk), each tensor's chunks in order.
__global__ void lambNormsKernel(const int* ct, int chunks, const double* parts, double* norms, int tensors) {
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < tensors; t += gridDim.x * blockDim.x) {
    double pn = 0, un = 0;
    for (int c = 0; c < chunks; ++c)
      if (ct[c] == t) {
        pn += parts[2 * c];
        un += parts[2 * c + 1];
      }
    norms[2 * t] = pn;
    norms[2 * t + 1] = un;
  }
}

__global__ void clipKernel(AMPC_CHUNK_ARGS, void* const* roles, const double* normSq, const bool* found, float maxNorm) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float* g = rolePtr<float>(roles, n, 0, c.t);
  float* o = rolePtr<float>(roles, n, 1, c.t);
  const double norm = sqrt(*normSq);
  const double coef = maxNorm > 0 && !*found ? fmin(1.0, static_cast<double>(maxNorm) / (norm + 1e-6)) : 1.0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) o[i] = coef < 1.0 ? static_cast<float>(g[i] * coef) : g[i];
}
__global__ void normOutKernel(const double* normSq, float* out) { *out = static_cast<float>(sqrt(*normSq)); }

__global__ void stepKernel(const int64_t* step, const bool* found, int64_t* out) { *out = *step + (*found ? 0 : 1); }

__global__ void lrKernel(const int64_t* step, float* out, float lr, int schedule, int64_t warmup, int64_t total) {
  const double t = static_cast<double>(*step < 1 ? 1 : *step), w = static_cast<double>(warmup);
  double r = lr;
  if (schedule != 0 && warmup > 0 && t < w) r = static_cast<double>(lr) * t / w;
  else if (schedule == 2 && total > warmup) r = 0.5 * lr * (1 + cos(3.141592653589793 * fmin(1.0, (t - w) / (static_cast<double>(total) - w))));
  else if (schedule == 3 && total > warmup) r = lr * fmax(0.0, (static_cast<double>(total) - t) / (static_cast<double>(total) - w));
  *out = static_cast<float>(r);
}

template <typename G>
__global__ void sgdKernel(AMPC_CHUNK_ARGS, void* const* roles, const float* lrp, const bool* found, float mom, float wd, bool nesterov,
                          GradIn gin) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float *p = rolePtr<float>(roles, n, 0, c.t), *buf = rolePtr<float>(roles, n, 2, c.t);
  const G* g = rolePtr<const G>(roles, n, 1, c.t);
  float *po = rolePtr<float>(roles, n, 3, c.t), *bo = rolePtr<float>(roles, n, 4, c.t);
  const bool skip = *found;
  if (skip && po == p && bo == buf) return;  // a skipped step's update in place: nothing to write
  const float lr = *lrp;
  const GradView gv(gin);
  // Without momentum there is no buffer (buf and bo null), as PyTorch's SGD keeps none.
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    if (skip) {
      po[i] = p[i];
      if (bo) bo[i] = buf[i];
      continue;
    }
    float d = gv(g, i) + wd * p[i];
    if (mom != 0.0f) {
      const float b = mom * buf[i] + d;
      d = nesterov ? d + mom * b : b;
      bo[i] = b;
    } else if (bo) {
      bo[i] = buf[i];
    }
    po[i] = p[i] - lr * d;
  }
}

struct AdamConsts {
  float b1, b2, eps, wd, stepSize, bc1, bc2, bc2Sqrt, lr;
};
__device__ __forceinline__ AdamConsts adamConsts(const float* lrp, const int64_t* stepp, float b1, float b2, float eps, float wd) {
  const double t = static_cast<double>(*stepp);
  AdamConsts k{b1, b2, eps, wd, 0, 0, 0, 0, *lrp};
  k.bc1 = static_cast<float>(1 - pow(static_cast<double>(b1), t));
  k.bc2 = static_cast<float>(1 - pow(static_cast<double>(b2), t));
  k.stepSize = k.lr / k.bc1;
  k.bc2Sqrt = sqrtf(k.bc2);
  return k;
}

// Adam / AdamW; with lamb, phase 1: the moments and the per-tensor ||p||^2, ||u||^2.
template <typename G>
__global__ void adamKernel(AMPC_CHUNK_ARGS, void* const* roles, const float* lrp, const int64_t* stepp, const bool* found, float b1, float b2,
                           float eps, float wd, bool decoupled, bool lamb, double* norms, GradIn gin) {
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float* p = rolePtr<float>(roles, n, 0, c.t);
  const G* g = rolePtr<const G>(roles, n, 1, c.t);
  const float *m = rolePtr<float>(roles, n, 2, c.t), *v = rolePtr<float>(roles, n, 3, c.t);
  float *po = rolePtr<float>(roles, n, 4, c.t), *mo = rolePtr<float>(roles, n, 5, c.t), *vo = rolePtr<float>(roles, n, 6, c.t);
  if (*found) {
    // A skipped step (an overflow; every run but a window's last with --accumulate): in place,
    // nothing is written and nothing read.
    if (po == p && mo == m && vo == v) return;
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      po[i] = p[i];
      mo[i] = m[i];
      vo[i] = v[i];
    }
    return;
  }
  const AdamConsts k = adamConsts(lrp, stepp, b1, b2, eps, wd);
  const GradView gv(gin);
  double pn = 0, un = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    float pi = p[i], gi = gv(g, i);
    if (lamb) {
      const float mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
      const float u = (mi / k.bc1) / (sqrtf(vi / k.bc2) + eps) + wd * pi;
      mo[i] = mi;
      vo[i] = vi;
      pn += static_cast<double>(pi) * pi;
      un += static_cast<double>(u) * u;
      continue;
    }
    if (decoupled) pi *= 1 - k.lr * wd;
    else gi += wd * pi;
    const float mi = b1 * m[i] + (1 - b1) * gi, vi = b2 * v[i] + (1 - b2) * gi * gi;
    mo[i] = mi;
    vo[i] = vi;
    po[i] = pi - k.stepSize * mi / (sqrtf(vi) / k.bc2Sqrt + eps);
  }
  if (lamb) {
    pn = blockSum(pn);
    un = blockSum(un);
    if (threadIdx.x == 0) {  // this chunk's partials (after the per-tensor norms), summed by lambNormsKernel
      norms[2 * (n + blockIdx.x)] = pn;
      norms[2 * (n + blockIdx.x) + 1] = un;
    }
  }
}
// LAMB phase 2: p -= lr * trust * u, u recomputed from the new moments.
__global__ void lambApply(AMPC_CHUNK_ARGS, void* const* roles, const float* lrp, const int64_t* stepp, const bool* found, float b1, float b2,
                          float eps, float wd, const double* norms) {
  if (*found) return;
  const Chunk c = chunkOf(ct, cs, sizes, chunk);
  const float* p = rolePtr<float>(roles, n, 0, c.t);
  float *po = rolePtr<float>(roles, n, 4, c.t), *mo = rolePtr<float>(roles, n, 5, c.t), *vo = rolePtr<float>(roles, n, 6, c.t);
  const AdamConsts k = adamConsts(lrp, stepp, b1, b2, eps, wd);
  const double pn = norms[2 * c.t], un = norms[2 * c.t + 1];
  const float trust = pn > 0 && un > 0 ? static_cast<float>(sqrt(pn) / sqrt(un)) : 1.0f;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const float u = (mo[i] / k.bc1) / (sqrtf(vo[i] / k.bc2) + eps) + wd * p[i];
    po[i] = p[i] - k.lr * trust * u;
  }
}

__global__ void scalerKernel(const float* scale, const int64_t* tracker, const int64_t* left, const bool* found, float* so, int64_t* to,
                             int64_t* lo, float growth, float backoff, int64_t interval, int64_t hysteresis, float minScale, float maxScale) {
  double s = *scale;
  int64_t t = *tracker, l = *left;
  if (*found) {
    t = 0;
    l = l - 1 > 0 ? l - 1 : 0;
    if (l == 0) s *= backoff;
  } else {
    l = hysteresis;
    if (++t >= interval) {
      s *= growth;
      t = 0;
    }
  }
  if (minScale > 0) s = fmax(s, static_cast<double>(minScale));
  if (maxScale > 0) s = fmin(s, static_cast<double>(maxScale));
  *so = static_cast<float>(s);
  *to = t;
  *lo = l;
}

struct MetricSources {
  const void* v[5];
  int t[5];
};
__global__ void metricsKernel(MetricSources m, double* ring, int* pos, int slots) {
  const int p = *pos;
  for (int k = 0; k < 5; ++k) ring[5 * p + k] = loadF(m.v[k], static_cast<DT>(m.t[k]), 0);
  *pos = (p + 1) % slots;
}

}  // namespace

cudaError_t recordMetrics(const void* const values[5], const int types[5], double* ring, int* pos, int slots, cudaStream_t st) {
  MetricSources m;
  for (int k = 0; k < 5; ++k) {
    m.v[k] = values[k];
    m.t[k] = types[k];
  }
  metricsKernel<<<1, 1, 0, st>>>(m, ring, pos, slots);
  return cudaGetLastError();
}

cudaError_t castTensors(const TensorList& l, DT to, cudaStream_t st) {
  if (l.chunks() == 0) return cudaSuccess;
  castKernel<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), to);
  return cudaGetLastError();
}

cudaError_t unscaleCheck(const TensorList& l, DT t, const float* invScale, bool* found, bool clear, cudaStream_t st) {
  if (clear)
    if (cudaError_t e = cudaMemsetAsync(found, 0, 1, st); e != cudaSuccess) return e;
  if (l.chunks() == 0) return cudaSuccess;
  switch (t) {
    case DT::f16: unscaleKernel<__half><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found); break;
    case DT::bf16: unscaleKernel<__nv_bfloat16><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found); break;
    default: unscaleKernel<float><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found); break;
  }
  return cudaGetLastError();
}

cudaError_t sumInOrder(const double* parts, int n, double* out, cudaStream_t st) {
  sumInOrderKernel<<<1, kThreads, 0, st>>>(parts, n, out);
  return cudaGetLastError();
}

cudaError_t unscaleCheckNorm(const TensorList& l, DT t, const float* invScale, bool* found, bool clear, double* normSq, cudaStream_t st) {
  if (clear)
    if (cudaError_t e = cudaMemsetAsync(found, 0, 1, st); e != cudaSuccess) return e;
  if (l.chunks() == 0) return cudaSuccess;
  switch (t) {
    case DT::f16: unscaleNormKernel<__half><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found, normSq); break;
    case DT::bf16: unscaleNormKernel<__nv_bfloat16><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found, normSq); break;
    default: unscaleNormKernel<float><<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), invScale, found, normSq); break;
  }
  return cudaGetLastError();
}

cudaError_t clipNormOut(const double* normSq, float* normOut, cudaStream_t st) {
  normOutKernel<<<1, 1, 0, st>>>(normSq, normOut);
  return cudaGetLastError();
}

cudaError_t clipByGlobalNorm(const TensorList& l, const bool* found, float maxNorm, double* normSq, float* normOut, cudaStream_t st) {
  if (l.chunks() > 0) normKernel<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), normSq + 1);
  sumInOrderKernel<<<1, kThreads, 0, st>>>(normSq + 1, l.chunks(), normSq);
  if (l.chunks() > 0) clipKernel<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), normSq, found, maxNorm);
  normOutKernel<<<1, 1, 0, st>>>(normSq, normOut);
  return cudaGetLastError();
}

cudaError_t stepIncrement(const int64_t* step, const bool* found, int64_t* out, cudaStream_t st) {
  stepKernel<<<1, 1, 0, st>>>(step, found, out);
  return cudaGetLastError();
}

cudaError_t learningRate(const int64_t* step, float* out, float lr, int schedule, int64_t warmup, int64_t total, cudaStream_t st) {
  lrKernel<<<1, 1, 0, st>>>(step, out, lr, schedule, warmup, total);
  return cudaGetLastError();
}

cudaError_t sgd(const TensorList& l, const float* lr, const bool* found, float momentum, float weightDecay, bool nesterov, const GradIn& gin,
                cudaStream_t st) {
  if (l.chunks() == 0) return cudaSuccess;
  auto run = [&](auto kernel) { kernel<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), lr, found, momentum, weightDecay, nesterov, gin); };
  if (gin.t == DT::f16) run(sgdKernel<__half>);
  else if (gin.t == DT::bf16) run(sgdKernel<__nv_bfloat16>);
  else run(sgdKernel<float>);
  return cudaGetLastError();
}

cudaError_t adam(const TensorList& l, const float* lr, const int64_t* step, const bool* found, float beta1, float beta2, float eps,
                 float weightDecay, bool decoupled, bool lamb, double* norms, const GradIn& gin, cudaStream_t st) {
  if (l.chunks() == 0) return cudaSuccess;
  auto run = [&](auto kernel) {
    kernel<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), lr, step, found, beta1, beta2, eps, weightDecay, decoupled, lamb, norms, gin);
  };
  if (gin.t == DT::f16) run(adamKernel<__half>);
  else if (gin.t == DT::bf16) run(adamKernel<__nv_bfloat16>);
  else run(adamKernel<float>);
  if (lamb) {
    const int tensors = l.tensors();
    lambNormsKernel<<<(tensors + kThreads - 1) / kThreads, kThreads, 0, st>>>(l.chunkTensor(), l.chunks(), norms + 2 * tensors, norms, tensors);
  }
  if (lamb) lambApply<<<l.chunks(), kThreads, 0, st>>>(AMPC_CHUNK_PASS(l), l.role(0), lr, step, found, beta1, beta2, eps, weightDecay, norms);
  return cudaGetLastError();
}

cudaError_t scalerUpdate(const float* scale, const int64_t* tracker, const int64_t* left, const bool* found, float* scaleOut,
                         int64_t* trackerOut, int64_t* leftOut, float growthFactor, float backoffFactor, int64_t growthInterval,
                         int64_t hysteresis, float minScale, float maxScale, cudaStream_t st) {
  scalerKernel<<<1, 1, 0, st>>>(scale, tracker, left, found, scaleOut, trackerOut, leftOut, growthFactor, backoffFactor, growthInterval,
                                hysteresis, minScale, maxScale);
  return cudaGetLastError();
}

}  // namespace ampc::cuda
