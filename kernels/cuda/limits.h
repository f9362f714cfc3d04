// What the CUDA kernels can take, as plain C++: the kernels (.cu) and the compile passes
// (compiler/target.cpp) read the same rules, so a pass never plans what a kernel refuses.
#pragma once

#include <cstdint>

namespace ampc::cuda {

// Fused attention (attention.cu) holds a whole head row of Q, K and V in shared-memory tiles.
// f16/bf16 with head dims multiples of 8 (and, with dropout, Tk a multiple of 8: a Philox block of
// 8 keys never straddles two rows) run the mma.sync kernels, head dims up to
// kAttentionMaxHeadDimMma; every other case runs the WMMA (f16/bf16) or FMA (f32) kernels, head
// dims up to kAttentionMaxHeadDim.
inline constexpr int kAttentionMaxHeadDim = 64;
inline constexpr int kAttentionMaxHeadDimMma = 128;

inline bool attentionMmaShape(bool lowFloat, int64_t D, int64_t Dv, int64_t Tk, bool dropout) {
  return lowFloat && D % 8 == 0 && Dv % 8 == 0 && D <= kAttentionMaxHeadDimMma && Dv <= kAttentionMaxHeadDimMma &&
         (!dropout || Tk % 8 == 0);
}
// Whether some attention kernel takes these head dims (D: Q's and K's, Dv: V's).
inline bool attentionFits(bool lowFloat, int64_t D, int64_t Dv, int64_t Tk, bool dropout) {
  return attentionMmaShape(lowFloat, D, Dv, Tk, dropout) || (D <= kAttentionMaxHeadDim && Dv <= kAttentionMaxHeadDim);
}
// Fused attention's rows masked everywhere by a finite fill (transformers' masks write the lowest
// float): f32 rounding makes each score the fill, and PyTorch's softmax gives the row 1 / l on the
// l scores at its max. Its log-sum-exp, the fill + log(l), rounds to the fill, so exp(s - LSE) is 1
// there, not 1 / l. A row whose LSE is below kAttentionFillLse (f32 spacing 2^-7 there and coarser
// below) is recomputed in full: the CPU reference (kernels/cpu/k_attention.cpp) and the CUDA
// kernels' and cuDNN's fix-ups (attentionFillRowsForward, attentionFillRowsBackward) alike.
inline constexpr float kAttentionFillLse = -65536.0f;

// Head dims past the kernels' run through cuDNN's fused SDPA only (runtime/cuda/cudnn_sdpa.h; cuDNN
// 9.1+ on Hopper): f16/bf16, multiples of 8 up to 256, without dropout, and no mask or one that
// needs no gradient (maskForCudnn).
inline constexpr int kAttentionMaxHeadDimCudnn = 256;
inline bool attentionCudnnOnly(bool lowFloat, int64_t D, int64_t Dv, bool dropout, bool maskForCudnn) {
  return lowFloat && !dropout && maskForCudnn && D % 8 == 0 && Dv % 8 == 0 && D <= kAttentionMaxHeadDimCudnn && Dv <= kAttentionMaxHeadDimCudnn;
}

// cuBLASLt's fast kernels need every row stride to be a multiple of 16 bytes. A GEMM of at least
// kPaddedGemmWork multiply-adds whose strides are not (GPT-2's vocabulary of 50257 words) runs on
// copies padded to such dims (runtime/cuda/program.cpp); a smaller one runs as it is. M, N, K as
// the product computes them; transA: A is stored [K, M] (its row stride is M).
inline constexpr double kPaddedGemmWork = double{1 << 30};
inline bool gemmRunsPadded(int64_t M, int64_t N, int64_t K, bool transA, int64_t elementBytes) {
  const bool misaligned = (K * elementBytes) % 16 != 0 || (N * elementBytes) % 16 != 0 || (transA && (M * elementBytes) % 16 != 0);
  return misaligned && static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >= kPaddedGemmWork;
}

}  // namespace ampc::cuda
