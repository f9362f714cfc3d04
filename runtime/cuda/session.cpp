// The CUDA backend as a TrainSession: the step graph lowered once to device launches
// (CudaTrainer), its metrics read every log interval.
#include "runtime/cuda/session.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/cuda/nccl.h"
#include "runtime/cuda/trainer.h"
#include "runtime/plan.h"

namespace ampc::cuda {
namespace {

class CudaSession : public TrainSession {
 public:
  CudaSession(Graph& g, const SessionOptions& o) : o_(o) {
    ProgramOptions po;
    po.device = parseDevice(o.device);
    // A data-parallel group: its AllReduce runs through NCCL on this device (Gloo's group finds the
    // peers and hands out NCCL's unique id).
    if (o.collective) {
      nccl_ = std::make_unique<NcclGroup>(*o.collective, po.device, o.collectiveTimeout);
      po.collective = nccl_.get();
    }
    po.allowTf32 = o.allowTf32;
    po.cudaGraph = o.cudaGraph;
    po.seed = o.seed;
    po.checkPlan = o.checkPlan;
    po.watchFinite = o.watch != nullptr;
    po.deterministic = o.deterministic;
    if (o.attention == "kernels") po.attention = ProgramOptions::Attention::kernels;
    else if (o.attention == "cudnn") po.attention = ProgramOptions::Attention::cudnn;
    else if (o.attention != "auto") throw Error("attention must be auto, kernels or cudnn, not '" + o.attention + "'");
    po.attentionChoices = o.tuning.attention;
    po.algoChoices = o.tuning.algorithms;
    if (o.algos == "auto") po.algos = ProgramOptions::Algos::measured;
    else if (o.algos != "heuristics") throw Error("algos must be auto or heuristics, not '" + o.algos + "'");
    po.tunedOn = o.tuning.device;
    // A plan from an ampc without the code generator: its groups run as their ops, folded as the
    // lowering would fold them.
    if (expandFused(g, /*onlyWithoutKernel=*/true) > 0) recordFolds(g);
    device_ = po.device;
    memBase_ = deviceMemoryUsed(po.device);
    // --explain-overflow reads every step's metrics at once (one synchronisation a step), so a
    // skipped step's scans are still the device's when the host looks at them.
    trainer_ = std::make_unique<CudaTrainer>(g, po, o.watch ? 1 : std::max(o.logEvery, 1));
    scale_ = g.lookup("ampc.loss_scale");
  }
  void begin(uint64_t firstStep) override { trainer_->begin(firstStep); }
  std::vector<Trainer::Metrics> step(const std::map<std::string, Tensor>* batch) override {
    auto ms = trainer_->step(batch);
    if (!ms.empty()) peak_ = std::max(peak_, deviceMemoryUsed(device_) - memBase_);
    return ms;
  }
  std::vector<Trainer::Metrics> flush() override {
    auto ms = trainer_->flush();
    peak_ = std::max(peak_, deviceMemoryUsed(device_) - memBase_);
    return ms;
  }
  void syncState() override { trainer_->syncState(); }
  double lossScale() override { return scale_ ? trainer_->program().download(scale_).getDouble(0) : 0.0; }
  void findOverflow() override {
    if (!o_.watch) return;
    o_.watch->startStep();
    trainer_->program().findOverflow(*o_.watch);
  }
  SessionReport report() override {
    const auto& st = trainer_->program().stats();
    SessionReport r;
    r.device = true;
    r.arenaBytes = st.arenaBytes;
    r.plannedBytes = st.arenaBytes + st.paramBytes + st.workspaceBytes;
    r.peakBytes = std::max(peak_, deviceMemoryUsed(device_) - memBase_);
    r.syncsInSteps = trainer_->syncsInSteps();
    r.replays = st.replays;
    r.launches = st.launches;
    const Program& prog = trainer_->program();
    for (const auto& [shape, pick] : prog.attentionPicks()) r.attention.push_back(shape + ": " + pick);
    r.tuningNote = prog.tuningNote();
    r.tuning.device = prog.tuningIdentity();
    r.tuning.attention = prog.attentionChoices();
    r.tuning.algorithms = prog.algoChoices();
    r.algosMeasured = prog.algoCounts().first;
    r.algosStored = prog.algoCounts().second;
    const Program::LoadTimes& lt = prog.loadTimes();
    r.loadSeconds = {{"memory plan", lt.memoryPlan}, {"uploads", lt.uploads},           {"lowering", lt.lowering},
                     {"convolutions", lt.convolutions}, {"GEMMs", lt.gemms}, {"algorithm timing", lt.measuring}};
    return r;
  }
  // Device time per op (summed over its nodes) and the costliest nodes of one more step.
  std::string profile(size_t top) override {
    const auto t = trainer_->program().profile();
    double total = 0;
    std::map<std::string, std::pair<double, int>> byOp;
    for (const auto& x : t) {
      total += x.ms;
      byOp[x.op].first += x.ms;
      ++byOp[x.op].second;
    }
    std::vector<std::pair<std::string, std::pair<double, int>>> ops(byOp.begin(), byOp.end());
    std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    std::string s = fmt::format("profile: one step, {:.3f} ms of device time in {} nodes (eager, events around every node)\n", total, t.size());
    for (size_t i = 0; i < std::min(top, ops.size()); ++i)
      s += fmt::format("  {:>9.3f} ms {:5.1f}%  {:4}x {}\n", ops[i].second.first, 100 * ops[i].second.first / total, ops[i].second.second,
                       ops[i].first);
    auto nodes = t;
    std::sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
    s += "  costliest nodes:\n";
    for (size_t i = 0; i < std::min(top, nodes.size()); ++i) s += fmt::format("  {:>9.3f} ms  {}\n", nodes[i].ms, nodes[i].what);
    return s + explainPeak(trainer_->program().memoryPlan(), top);
  }
  std::string checkPlanReport() override {
    const auto bad = trainer_->program().nanWriters();
    std::string s = fmt::format("check-plan: {} nodes wrote NaNs{}\n", bad.size(), bad.empty() ? "" : " (first 12, in order):");
    for (size_t i = 0; i < bad.size() && i < 12; ++i) s += fmt::format("  {}  {}\n", bad[i].second, bad[i].first);
    return s;
  }

 private:
  SessionOptions o_;
  std::unique_ptr<NcclGroup> nccl_;  // outlives the trainer, whose end waits for the stream
  std::unique_ptr<CudaTrainer> trainer_;
  const Value* scale_ = nullptr;
  int device_ = 0;
  int64_t memBase_ = 0, peak_ = 0;
};

}  // namespace

std::unique_ptr<TrainSession> openCudaSession(Graph& g, const SessionOptions& o) { return std::make_unique<CudaSession>(g, o); }

}  // namespace ampc::cuda
