// autodiff: builds the backward graph of a forward graph whose first output is a scalar loss.
// The graph's outputs become the loss followed by one gradient per trainable parameter, named
// `<param>_grad`.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "passes/pass.h"

namespace ampc {

struct AutodiffOptions {
  std::string freeze;  // --freeze REGEX: parameters whose name matches are not trained
  // The loss gradient's seed: a scalar value of the graph (the loss scale S), or 1 when empty.
  std::string seed;
};

// The parameters autodiff trains: float initializers that are not frozen, not an op's state
// (BatchNorm's running statistics), and on a differentiable path to the loss.
std::vector<Value*> trainableParams(const Graph& g, const AutodiffOptions& opts);

std::unique_ptr<Pass> createAutodiffPass(const AutodiffOptions& opts = {});

}  // namespace ampc
