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
  // --trainable REGEX: only parameters whose name matches are trained (instead of the model's
  // ampc.trainable list or the default rule); --freeze still applies.
  std::string trainable;
  // The loss gradient's seed: a scalar value of the graph (the loss scale S), or 1 when empty.
  std::string seed;
};

// Whether a float initializer is a training candidate, and if not, why. In order: an op's state
// (BatchNorm's running statistics) is not; --freeze matches are not; with --trainable, exactly its
// matches are; else with the model's ampc.trainable list, exactly its names are; else every float
// initializer is, except those holding Inf or NaN (masks: a registered buffer, not a parameter).
struct ParamPolicy {
  Value* param;
  bool candidate;
  std::string why;  // the rule that decided
};
std::vector<ParamPolicy> paramPolicy(const Graph& g, const AutodiffOptions& opts);

// The parameters autodiff trains: the candidates above that reach the loss on a differentiable path.
std::vector<Value*> trainableParams(const Graph& g, const AutodiffOptions& opts);

// The names the model's ampc.trainable list gives that autodiff will not train although no option
// froze them: not a float initializer of the graph, or one that reaches the loss by no differentiable
// path. PyTorch trains such a parameter where its forward reads it differentiably, so each is either
// unused there too or a path the export cut: ampc names them (a note), and --summary says why.
std::vector<std::string> listedButUntrained(const Graph& g, const AutodiffOptions& opts);

std::unique_ptr<Pass> createAutodiffPass(const AutodiffOptions& opts = {});

}  // namespace ampc
