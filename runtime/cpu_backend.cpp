#include "runtime/backend.h"

namespace ampc {
namespace {

class CpuBackend : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  std::vector<Tensor> run(const Node& n, const std::vector<const Tensor*>& inputs, const ExecOptions& opts) override {
    return cpu::runNode(n, inputs, opts);
  }
};

}  // namespace

std::unique_ptr<Backend> createCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace ampc
