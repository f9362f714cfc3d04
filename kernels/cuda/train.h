// The training step's ops on the device (the "ampc" train ops of compiler/ops/ops_train.cpp, with
// the CPU kernels' semantics, kernels/cpu/k_train.cpp): multi-tensor launches that cover every
// parameter at once, each predicated on found_inf read from device memory, so a step never
// synchronises with the host. A skipped step copies state through bitwise.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/ops.h"

namespace ampc::cuda {

// One multi-tensor launch's tensors: `roles` pointer lists of equal length (for example param,
// grad, momentum, param out, momentum out), their element counts, and the chunk table (each block
// one chunk). Built once when a plan loads; the tables live on the device.
class TensorList {
 public:
  TensorList(const std::vector<int64_t>& sizes, const std::vector<std::vector<void*>>& roles, int64_t chunk = 16384);
  ~TensorList();
  TensorList(const TensorList&) = delete;
  TensorList& operator=(const TensorList&) = delete;
  int chunks() const { return chunks_; }
  int tensors() const { return tensors_; }
  const int* chunkTensor() const { return chunkTensor_; }
  const int64_t* chunkStart() const { return chunkStart_; }
  const int64_t* sizes() const { return sizes_; }
  void* const* role(int r) const { return roles_ + static_cast<size_t>(r) * tensors_; }
  int64_t chunkSize() const { return chunk_; }

 private:
  int chunks_ = 0, tensors_ = 0;
  int64_t chunk_;
  int* chunkTensor_ = nullptr;
  int64_t* chunkStart_ = nullptr;
  int64_t* sizes_ = nullptr;
  void** roles_ = nullptr;
};

// Casts of many tensors in one launch: roles {src (f32), dst (`to`: f16 or bf16)} (the step's
// parameter casts).
cudaError_t castTensors(const TensorList& l, DT to, cudaStream_t st);
// UnscaleCheck: roles {grad (t: f32, or f16/bf16 read through a widening Cast), out (f32)}:
// out = grad * *invScale; *found = any non-finite out (cleared first when `clear`: the node's first
// launch of one per gradient type).
cudaError_t unscaleCheck(const TensorList& l, DT t, const float* invScale, bool* found, bool clear, cudaStream_t st);
// The gradient an optimizer reads where the step's UnscaleCheck (and ClipByGlobalNorm) fold into it
// (folds::fusedGradChain): its role g holds UnscaleCheck's operand, of type t (f32, or f16/bf16
// read through a widening Cast), and each element is u = g * *invScale, then with a clip
// (normSq non-null) u * coef as ClipByGlobalNorm computes it: the same operations, so the same
// values as the unfused nodes. The default reads an f32 gradient as it is.
struct GradIn {
  DT t = DT::f32;
  const float* invScale = nullptr;  // null: g is the gradient itself
  const double* normSq = nullptr;   // the clip's sum of squares; null: no clip
  const bool* clipFound = nullptr;  // the clip's found_inf operand
  float maxNorm = 0.0f;
};
// UnscaleCheck folded into the optimizer: roles {grad}; only *found, and with normSq each chunk's
// sum of the unscaled gradients' squares at normSq[chunk] (f64; sumInOrder adds them up). Nothing
// else is written.
cudaError_t unscaleCheckNorm(const TensorList& l, DT t, const float* invScale, bool* found, bool clear, double* normSq, cudaStream_t st);
// *out = parts[0] + ... + parts[n - 1], in an order fixed by n alone (no atomics).
cudaError_t sumInOrder(const double* parts, int n, double* out, cudaStream_t st);
// ClipByGlobalNorm folded into the optimizer: its norm output, from the sum of squares.
cudaError_t clipNormOut(const double* normSq, float* normOut, cudaStream_t st);
// ClipByGlobalNorm: roles {grad, out}. norm = ||grads||_2 (f64 accumulation in a fixed order;
// `normSq` scratch of 1 + l.chunks() doubles);
// out = grad * min(1, maxNorm / (norm + 1e-6)) when maxNorm > 0 and !*found, else grad.
cudaError_t clipByGlobalNorm(const TensorList& l, const bool* found, float maxNorm, double* normSq, float* normOut, cudaStream_t st);
// StepIncrement: *out = *step + (*found ? 0 : 1).
cudaError_t stepIncrement(const int64_t* step, const bool* found, int64_t* out, cudaStream_t st);
// LearningRate for the 1-based step: schedule 0 constant, 1 linear warmup, 2 cosine.
cudaError_t learningRate(const int64_t* step, float* out, float lr, int schedule, int64_t warmup, int64_t total, cudaStream_t st);
// SGD: roles {p, g, buf, pOut, bufOut}.
cudaError_t sgd(const TensorList& l, const float* lr, const bool* found, float momentum, float weightDecay, bool nesterov, const GradIn& gin,
                cudaStream_t st);
// Adam / AdamW: roles {p, g, m, v, pOut, mOut, vOut}; `step` the step count after the increment.
// LAMB (lamb): the same roles; `norms` is f64 scratch of 2 per tensor and 2 per chunk.
cudaError_t adam(const TensorList& l, const float* lr, const int64_t* step, const bool* found, float beta1, float beta2, float eps,
                 float weightDecay, bool decoupled, bool lamb, double* norms, const GradIn& gin, cudaStream_t st);
// ScalerUpdate (PyTorch's GradScaler plus hysteresis and bounds; 0: unbounded).
cudaError_t scalerUpdate(const float* scale, const int64_t* tracker, const int64_t* left, const bool* found, float* scaleOut,
                         int64_t* trackerOut, int64_t* leftOut, float growthFactor, float backoffFactor, int64_t growthInterval,
                         int64_t hysteresis, float minScale, float maxScale, cudaStream_t st);

// Writes the step's metrics (loss, loss scale, found_inf, grad norm, lr; any dtype, read as `types`)
// as 5 doubles into ring slot *pos, then advances *pos modulo `slots`.
cudaError_t recordMetrics(const void* const values[5], const int types[5], double* ring, int* pos, int slots, cudaStream_t st);

}  // namespace ampc::cuda
