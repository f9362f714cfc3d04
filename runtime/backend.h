// A Backend executes the IR's ops over tensors. `cpu` is the reference; a CUDA backend will sit
// behind the same interface (which therefore names no CUDA type).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"
#include "kernels/cpu/kernel.h"

namespace ampc {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Runs one node. Inputs are in the node's operand order (null for an omitted optional input);
  // the results come back in the node's result order and types. Error naming the node on failure.
  virtual std::vector<Tensor> run(const Node& n, const std::vector<const Tensor*>& inputs, const ExecOptions& opts) = 0;
};

std::unique_ptr<Backend> createCpuBackend();

}  // namespace ampc
