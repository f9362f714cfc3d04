// train-step: turns a forward graph (painted or not) into one complete training step (DESIGN.md
// steps 5-8): the backward graph seeded with the loss scale S, unscale + Inf/NaN check, optional
// global-norm clipping of the unscaled gradients, the optimizer update and the step counter (both
// predicated on found_inf), the learning-rate schedule, and the dynamic loss scaler. With
// accumulate N > 1, each parameter gets a gradient accumulator and the step a micro-step counter:
// every run adds its gradients to the accumulators; only the N-th run of a window acts on the sum
// (unscaled by 1 / (S N), checked, clipped), updates the parameters, the step counter and the
// scaler, and clears the accumulators.
//
// The result is self-describing: its outputs are loss, loss_scale (the S this step used),
// found_inf, grad_norm and lr, then one `<state>.next` per state tensor (parameters, optimizer
// state, scaler state, step counter, BatchNorm running statistics): a runtime writes each back
// into the param named `<state>` after the step.
#pragma once

#include <memory>
#include <string>

#include "passes/autodiff.h"
#include "passes/pass.h"

namespace ampc {

struct TrainOptions {
  std::string optimizer = "sgd";  // sgd, adam, adamw, lamb
  float lr = 0.01f;
  std::string schedule = "constant";  // constant, linear-warmup, cosine, linear
  int64_t warmup = 0, total = 0;
  float momentum = 0, weightDecay = 0;
  // Parameters that get no weight decay, as PyTorch's parameter groups leave them out: "1d" (fewer
  // than 2 dims: biases and normalisation scales, as timm, nanoGPT and transformers' Trainer group
  // them), or a regex that matches the whole name. Empty: every parameter decays.
  std::string noDecay;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float clipNorm = 0;  // 0: no clipping (the norm is still computed for the metrics)
  // Gradient accumulation: the step graph runs once per micro-batch, and every `accumulate`-th run
  // applies the mean of the micro-batches' gradients (as PyTorch with the loss divided by N and
  // optimizer.step() every N backward passes). 1: every run is an optimizer step.
  int64_t accumulate = 1;
  // An exponential moving average of the parameters with this decay (0: none), kept as state
  // "<param>.ema" and updated on every step the optimizer takes (amprun --save-ema writes it).
  float ema = 0;
  // "auto" (dynamic for fp16, none for bf16 and fp32), "dynamic", "none", or a static number.
  std::string lossScale = "auto";
  DType precision = DType::f32;  // the autocast precision, for "auto"
  float initScale = 65536, growthFactor = 2, backoffFactor = 0.5, minScale = 0, maxScale = 0;
  int64_t growthInterval = 2000, hysteresis = 1;
  AutodiffOptions autodiff;
  // The target the plan is compiled for (compiler/target.h); recorded in the plan.
  std::string target = "cuda";
  // runtime/plan.h lowerStep: the target's pointwise groups become generated kernels.
  bool fuseElementwise = true;
  // cuda: recompute pointwise results and batch norms read again far later (passes/rematerialize.cpp).
  bool rematerialize = true;
  // cuda, with rematerialize: the backward recasts the low-precision weights it reads.
  bool rematerializeParamCasts = true;
};

std::unique_ptr<Pass> createTrainStepPass(const TrainOptions& opts);

// The suffix of a state tensor's next value among the step's outputs.
inline constexpr const char* kNextSuffix = ".next";

}  // namespace ampc
