// The device-resident training step's multi-tensor kernels (issue 7): unscale + Inf/NaN check +
// global norm in one pass over every gradient; fused clip + SGD / Adam / AdamW updates predicated
// on found_inf (a skipped step writes nothing); the step counter, the learning-rate schedule and
// the dynamic loss scaler as device kernels. Everything stays on the device: no host
// synchronisation, no device-to-host copy. Semantics equal the CPU kernels (kernels/cpu/k_train.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

namespace ampc::cuda {

// The chunk table of a list of tensors (element counts), built once when a plan loads: one
// launch covers every tensor, each block one chunk.
class TensorList {
 public:
  TensorList(const std::vector<int64_t>& sizes, int64_t chunk = 16384);
  ~TensorList();
  TensorList(const TensorList&) = delete;
  TensorList& operator=(const TensorList&) = delete;
  int chunks() const { return chunks_; }
  const int* chunkTensor() const { return chunkTensor_; }    // device: tensor of each chunk
  const int64_t* chunkStart() const { return chunkStart_; }  // device: first element of each chunk
  const int64_t* sizes() const { return sizes_; }            // device
  int64_t chunkSize() const { return chunk_; }

 private:
  int chunks_ = 0;
  int64_t chunk_;
  int* chunkTensor_ = nullptr;
  int64_t* chunkStart_ = nullptr;
  int64_t* sizes_ = nullptr;
};

// Device state of the loss scaler and the step.
struct StepState {
  float* scale;           // the loss scale S
  int64_t* growth;        // growth tracker
  int64_t* hysteresis;    // overflow budget left
  int64_t* step;          // optimizer step count
  float* lr;              // this step's learning rate
  int* foundInf;          // set by unscaleCheckNorm
  double* normSq;         // sum of squares of the unscaled gradients
};

// Zeroes foundInf and normSq, then g *= 1/S in place for every gradient, sets foundInf on any
// non-finite result and accumulates normSq.
cudaError_t unscaleCheckNorm(const TensorList& l, float* const* grads, const StepState& s, cudaStream_t st);
// step += found ? 0 : 1, then lr = schedule(step) (0 constant, 1 linear-warmup, 2 cosine).
cudaError_t stepAndLr(const StepState& s, float lr, int schedule, int64_t warmup, int64_t total, cudaStream_t st);
// Clip by the global norm (maxNorm > 0) fused with the update; nothing is written when found_inf.
cudaError_t sgdStep(const TensorList& l, float* const* params, float* const* grads, float* const* bufs, const StepState& s,
                    float maxNorm, float momentum, float weightDecay, bool nesterov, cudaStream_t st);
cudaError_t adamStep(const TensorList& l, float* const* params, float* const* grads, float* const* m, float* const* v,
                     const StepState& s, float maxNorm, float beta1, float beta2, float eps, float weightDecay, bool decoupled,
                     cudaStream_t st);
// LAMB: Adam moments, u = m^ / (sqrt(v^) + eps) + wd p, then p -= lr (||p|| / ||u||) u per tensor.
// `norms` is device scratch of 2 doubles per tensor; the grads are overwritten with u.
cudaError_t lambStep(const TensorList& l, float* const* params, float* const* grads, float* const* m, float* const* v,
                     const StepState& s, float maxNorm, float beta1, float beta2, float eps, float weightDecay, double* norms,
                     int numTensors, cudaStream_t st);
// PyTorch's GradScaler update plus hysteresis and [minScale, maxScale] (0: unbounded).
cudaError_t scalerUpdate(const StepState& s, float growthFactor, float backoffFactor, int64_t growthInterval, int64_t hysteresis,
                         float minScale, float maxScale, cudaStream_t st);

}  // namespace ampc::cuda
