// Targets: what a backend can run, as the compile passes need to know it ahead of time (the Glow
// and XLA habit: a pass asks the target, it holds no backend's constants). `ampc --target`
// chooses one; the plan records it, and amprun runs a plan only on a backend that can take it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ampc {

class Node;  // compiler/ir/ir.h

// The shape of one fused attention, as the target's support query takes it.
struct AttentionShape {
  bool lowFloat = false;          // f16/bf16 operands (else f32)
  int64_t headDim = 0, vHeadDim = 0, keys = 0;  // D (Q's and K's), Dv (V's), Tk
  bool dropout = false;
  // No mask, or one cuDNN's fused SDPA reads as it is: computed from no parameter (so it needs no
  // gradient). The passes work it out only where the target refuses the shape without it.
  bool maskForCudnn = false;
  bool softcap = false;  // the scores soft-capped, c tanh(s / c) (Gemma 2)
};

// The domain of the CUDA target's lowered nodes (cuda::Gemm, cuda::MultiCast, cuda::BatchNormalization,
// cuda::BatchNormGrad, cuda::LayerNormGrad, cuda::Dropout: runtime/lower.cpp's rewrites), which the
// CPU reference runs too.
inline constexpr const char* kCudaDomain = "cuda";

struct Target {
  std::string name;  // "cuda", "cpu"
  // Whether its fused attention takes this shape; null: any (the CPU reference).
  bool (*attention)(const AttentionShape&) = nullptr;
  bool fusesAttention(const AttentionShape& s) const { return !attention || attention(s); }
  // Whether its fused attention reads and writes its operands in place, through strides
  // (compiler/ops/geometry.h, AttentionLayout), at this shape; null: never. The attention-in-place
  // rewrite asks it.
  bool (*attentionInPlace)(const AttentionShape&) = nullptr;
  // Whether its GEMM runs this product (M, N, K as it computes them; transA: A stored [K, M]) on
  // copies padded to 16-byte rows; null: never. pitch-loss-scores asks it.
  bool (*paddedGemm)(int64_t M, int64_t N, int64_t K, bool transA, int64_t elementBytes) = nullptr;
  // Casts a kernel does inside its own launch (fold-casts, passes/fold_casts.h, asks; null: none):
  // - readsWidened: its kernel for `user` widens operand i (f16/bf16 -> f32) in registers, so it can
  //   read the narrow value in front of a widening Cast;
  // - writesNarrowed: its kernel for n rounds result 0 to f16/bf16 as it stores it, so it can write
  //   the result of the narrowing Cast after it;
  // - readsNarrowed: its kernel for `user` rounds operand i to f16/bf16 in registers, so it can read
  //   the f32 value in front of a narrowing Cast.
  bool (*readsWidened)(const Node& user, size_t i) = nullptr;
  bool (*writesNarrowed)(const Node& n) = nullptr;
  bool (*readsNarrowed)(const Node& user, size_t i) = nullptr;
  // The pointwise ops it runs with kernels of its own; any other op with a pointwise formula
  // (compiler/ops/pointwise.h) it runs only as a generated kernel, so the lowering makes even a
  // lone such node a group. Null: every op by its own kernels.
  bool (*pointwiseByHand)(const Node& n) = nullptr;
  // Whether its kernels run ampc.RmsNorm and LayerNormGrad {rms} (fuse-rms-norm asks).
  bool rmsNorm = false;
  // Whether its convolutions pad a spatial dim's two ends alike (cuDNN's descriptors take one pad
  // per dim): conv-pads then writes a Conv whose ends differ as a Pad of its input and a Conv with
  // the smaller pad at both ends.
  bool convPadsBothEnds = false;
  // Whether its batched GEMM takes each operand as one matrix or as the whole batch only (one batch
  // stride): target-shapes then expands an operand that broadcasts over part of the batch.
  bool matmulWholeBatch = false;
  // Whether its Pad takes only non-negative amounts: target-shapes then writes a crop as a Slice.
  bool padsNonNegative = false;
  // Why its backend cannot run node n (the plan's lowering refuses it, naming the node), or ""
  // when it can; null: it runs every node.
  std::string (*refusal)(const Node& n) = nullptr;
  // Whether a plan compiled for this target runs on `backend` ("cpu" runs every target's plans:
  // the reference has every fused op at any size).
  bool runsOn(const std::string& backend) const { return backend == "cpu" || backend == name; }
};

// Every input a constant with data, and the op not random: a target computes such a node on the
// CPU at load (the CUDA lowering), so no kernel of its reads or writes anything.
bool allConstInputs(const Node& n);

// "cuda" (the default: such plans run on the GPU and on the CPU reference) or "cpu". Error naming
// the known targets for another name.
const Target& findTarget(const std::string& name);
std::vector<std::string> targetNames();

}  // namespace ampc
