// Runs a train-step graph (passes/train_step.h) step after step on a Backend: each step evaluates
// the graph on a batch, then writes every `<state>.next` output back into the param `<state>`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/evaluator.h"

namespace ampc {

class Trainer {
 public:
  struct Metrics {
    double loss = 0, lossScale = 0, gradNorm = 0, lr = 0;
    bool skipped = false;
  };
  // Error if the graph is not a train-step graph.
  Trainer(Graph& g, Backend& backend);
  Metrics step(const std::map<std::string, Tensor>& batch, ExecOptions opts);

 private:
  Graph& g_;
  Backend& backend_;
  std::vector<std::pair<Value*, size_t>> writeBack_;  // state param, index of its next value
};

}  // namespace ampc
