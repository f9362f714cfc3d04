// Fused scaled-dot-product attention through cuDNN's backend graph API: the forward (O and the
// rows' log-sum-exp) and the backward (dQ, dK, dV) of softmax(scale Q K^T [+ bias] [causal]) V, as
// operation graphs that cuDNN's flash-attention runtime-fusion engines take (cuDNN 9, sm_80 and up).
// The CUDA backend runs it in place of its own kernels (kernels/cuda/attention.cu) where the
// attention has no dropout and no trained mask, and it is faster there, and for
// head dims past the kernels' (up to 256) always (runtime/cuda/program.cpp: ProgramOptions::attention).
//
// The statistics are the natural-log log-sum-exp of each row's scaled (and masked) scores, f32
// [B, H, Tq]: the same numbers as ampc.Attention's LSE result, so that either backward can follow
// either forward.
//
// A known difference: a query row masked everywhere by a finite fill (transformers' finfo.min with a
// sequence that starts with padding) has all its scores equal to the fill in f32, and its LSE
// (fill + log Tk) rounds to the fill. cuDNN's forward divides by the row's sum and gives the mean of V,
// as PyTorch does; the CPU reference and the kernels normalise by exp(m - LSE) = 1 and give the sum.
// Every backward then takes P = exp(s - LSE) = 1 there, Tk times PyTorch's 1/Tk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/cuda/ops.h"

namespace ampc::cuda {

// Where a [B, heads, rows, cols] operand's elements are: (b, h, r, c) at b sB + h sH + r sRow + c
// (elements). K and dK are given as rows (K [Tk, D]); grouped K/V heads (Hk < H) hold head h at
// h / (H / Hk).
struct SdpaStrides {
  int64_t sB = 0, sH = 0, sRow = 0;
};
struct SdpaDesc {
  DT t = DT::bf16;  // f16 or bf16
  int64_t B = 1, H = 1, Hk = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  SdpaStrides q, k, v, o, dO, dq, dk, dv;
  bool causal = false;  // key j > query i masked (top-left aligned)
  // An additive mask or bias on the scaled scores, [B, H, Tq, Tk] at these strides (0 where it
  // broadcasts, also along the queries), of biasT; not trained (no gradient).
  bool bias = false;
  DT biasT = DT::f32;
  SdpaStrides biasAt;
  float scale = 1.0f;
  bool backward = false;  // the backward graph (else the forward)
  // Grouped heads: dK and dV per query head ([B, H, Tk, D], as a graph whose K/V repeats' gradient is
  // summed after the node has them) rather than summed per K/V head.
  bool fullHeadGrads = false;
};

class CudnnSdpa {
 public:
  // Builds the graph and finalizes the plans of the first few engine configurations cuDNN's
  // heuristics offer that take it (the caller times them: ProgramOptions::attention). Throws Error
  // (with cuDNN's status) where none does.
  CudnnSdpa(cudnnHandle_t h, const SdpaDesc& d);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;
  // Scratch the runs need, with any plan (cuDNN's workspace, and the backward's f32 row sums and dQ
  // accumulator).
  size_t workspaceBytes() const { return wsBytes_; }
  size_t plans() const;
  const std::string& engine(size_t plan) const;  // "engine <cuDNN's global index>"
  // `bias`: the mask (SdpaDesc::bias), else null.
  cudnnStatus_t forward(const void* Q, const void* K, const void* V, const void* bias, void* O, float* stats, void* ws, size_t plan,
                        cudaStream_t st) const;
  cudnnStatus_t backward(const void* dO, const void* Q, const void* K, const void* V, const void* O, const void* bias, const float* stats,
                         void* dQ, void* dK, void* dV, void* ws, size_t plan, cudaStream_t st) const;
  // Whether the graphs can take `d` at all (type, head dims, strides); the engines may still refuse.
  static bool shapeSupported(const SdpaDesc& d, std::string* why = nullptr);

 private:
  struct Graph;
  cudnnStatus_t execute(const std::vector<std::pair<int64_t, const void*>>& ptrs, void* ws, size_t plan, cudaStream_t st) const;
  cudnnHandle_t h_;
  SdpaDesc d_;
  std::unique_ptr<Graph> g_;
  size_t planWs_ = 0, sumOffset_ = 0, accOffset_ = 0, wsBytes_ = 0;
};

}  // namespace ampc::cuda
