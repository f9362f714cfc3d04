// Targets: what a backend can run, as the compile passes need to know it ahead of time (the Glow
// and XLA habit: a pass asks the target, it holds no backend's constants). `ampc --target`
// chooses one; the plan records it, and amprun runs a plan only on a backend that can take it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ampc {

struct Target {
  std::string name;                  // "cuda", "cpu"
  int64_t attentionMaxHeadDim = 0;   // the largest head dim its fused attention takes; 0: any
  // Whether fused attention with these head dims (Q/K's and V's) runs on this target.
  bool fusesAttention(int64_t qkHeadDim, int64_t vHeadDim) const {
    return attentionMaxHeadDim == 0 || (qkHeadDim <= attentionMaxHeadDim && vHeadDim <= attentionMaxHeadDim);
  }
  // Whether a plan compiled for this target runs on `backend` ("cpu" runs every target's plans:
  // the reference has every fused op at any size).
  bool runsOn(const std::string& backend) const { return backend == "cpu" || backend == name; }
};

// "cuda" (the default: such plans run on the GPU and on the CPU reference) or "cpu". Error naming
// the known targets for another name.
const Target& findTarget(const std::string& name);
std::vector<std::string> targetNames();

}  // namespace ampc
