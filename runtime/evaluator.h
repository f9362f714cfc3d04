// Forward evaluation of a graph on a Backend: inputs by name, params and constants from their
// data, every node in order, each value freed after its last use.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "runtime/backend.h"

namespace ampc {

// Called after each node runs, with its operands (null where absent) and its results.
using NodeObserver = std::function<void(const Node&, const std::vector<const Tensor*>&, const std::vector<Tensor>&)>;

// Returns the graph outputs, then the values in `extra` (any values of g, for inspection).
// Error if an input is missing or its dtype or shape differs from the graph's.
std::vector<Tensor> evaluate(const Graph& g, const std::map<std::string, Tensor>& inputs, Backend& backend,
                             const ExecOptions& opts = {}, const std::vector<const Value*>& extra = {}, const NodeObserver& observe = {});

}  // namespace ampc
