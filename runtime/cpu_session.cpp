// The CPU reference backend as a TrainSession: the step graph evaluated node by node, each step's
// metrics at once.
#include <chrono>

#include "passes/memory_plan.h"
#include "runtime/session.h"

namespace ampc {
namespace {

class CpuSession : public TrainSession {
 public:
  CpuSession(Graph& g, const SessionOptions& o) : g_(g), o_(o), backend_(createCpuBackend()), trainer_(g, *backend_) {
    scale_ = g.lookup("ampc.loss_scale");
    if (o.watch)
      trainer_.setObserver([w = o.watch](const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor>& out) { w->observe(n, in, out); });
  }
  void begin(uint64_t firstStep) override { next_ = firstStep; }
  std::vector<Trainer::Metrics> step(const std::map<std::string, Tensor>* batch) override {
    if (batch) batch_ = *batch;
    ExecOptions e;
    e.seed = o_.seed;
    e.step = next_++;
    e.collective = o_.collective;
    if (o_.watch) o_.watch->startStep();
    const auto a = std::chrono::steady_clock::now();
    auto m = trainer_.step(batch_, e);
    m.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
    return {m};
  }
  double lossScale() override { return scale_ && scale_->data() ? scale_->data()->getDouble(0) : 0.0; }
  void findOverflow() override {}  // the watch saw every node of the step as it ran
  SessionReport report() override {
    SessionReport r;
    r.arenaBytes = planMemory(g_).arenaBytes;
    return r;
  }

 private:
  Graph& g_;
  SessionOptions o_;
  std::unique_ptr<Backend> backend_;
  Trainer trainer_;
  const Value* scale_ = nullptr;
  std::map<std::string, Tensor> batch_;
  uint64_t next_ = 0;
};

}  // namespace

std::unique_ptr<TrainSession> openCpuSession(Graph& g, const SessionOptions& o) { return std::make_unique<CpuSession>(g, o); }

}  // namespace ampc
