// Runs a train-step graph (passes/train_step.h) step after step on a Backend: each step evaluates
// the graph on a batch, then writes every `<state>.next` output back into the param `<state>`.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/evaluator.h"

namespace ampc {

// The state updates of a train-step graph: each state param and the index of the output that holds
// its next value. Error if the graph is not a train-step graph.
std::vector<std::pair<Value*, size_t>> stateUpdates(Graph& g);

class Trainer {
 public:
  struct Metrics {
    double loss = 0, lossScale = 0, gradNorm = 0, lr = 0;
    bool skipped = false;
    double ms = -1;  // device time of the step, where the backend measures it
  };
  // Error if the graph is not a train-step graph.
  Trainer(Graph& g, Backend& backend);
  Metrics step(const std::map<std::string, Tensor>& batch, ExecOptions opts);
  // Sees every node of every step as it runs (runtime/overflow.h).
  void setObserver(NodeObserver o) { observe_ = std::move(o); }

 private:
  Graph& g_;
  Backend& backend_;
  std::vector<std::pair<Value*, size_t>> writeBack_;  // state param, index of its next value
  NodeObserver observe_;
};

}  // namespace ampc
