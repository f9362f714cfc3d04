// attach-loss (attach_loss.cpp): a loss on a model exported without one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "passes/pass.h"

namespace ampc {

struct LossOptions {
  std::string kind;              // cross-entropy, mse, l1, bce-with-logits
  std::string output;            // the output the loss reads ("": the first)
  std::string target = "target";  // the new input of targets
  int64_t classAxis = 1;         // cross-entropy: 1 ([N, C, d...]) or -1 (the last: [B, T, V])
  int64_t ignoreIndex = -100;    // cross-entropy: targets with this class add nothing (PyTorch's default)
  double labelSmoothing = 0.0;   // cross-entropy: PyTorch's label_smoothing
  bool shiftTargets = false;     // cross-entropy on [B, T, V]: logits at t against the target at t + 1 (a causal LM's labels)
};

std::unique_ptr<Pass> createAttachLossPass(const LossOptions& o);

}  // namespace ampc
