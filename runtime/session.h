// Training on a backend, as amprun drives it: a train-step graph (passes/train_step.h) opened on one
// device behind one interface, so that amprun has one loop for every backend. The CPU reference
// runs the graph node by node (runtime/trainer.h); CUDA lowers it once to device launches
// (runtime/cuda/trainer.h) and reads its metrics every few steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/overflow.h"
#include "runtime/trainer.h"

namespace ampc {

// Implementation choices measured on one device and stored in the plan (`amprun --tune`,
// plan.proto's Tuning): per fused attention shape, "kernels" or "cuDNN engine <n>"; per
// convolution shape and direction, cuDNN's algorithm; per GEMM, the rank of cuBLASLt's candidate.
struct Tuning {
  std::string device;  // where they were measured (runtime/cuda/program.h, Program::tuningIdentity)
  std::map<std::string, std::string> attention;
  std::map<std::string, std::string> algorithms;  // "conv ..." / "gemm ..." (ProgramOptions::algoChoices)
};

struct SessionOptions {
  std::string device = "cpu";        // cpu, cuda or cuda:N
  uint64_t seed = 0;                 // Dropout's Philox key
  Collective* collective = nullptr;  // a data-parallel group (ampc.AllReduce), or none
  // cuda: how long a wait for a step may take in a group before its peers are taken for dead
  // (the CPU's Gloo group has the same timeout of its own).
  std::chrono::milliseconds collectiveTimeout{300000};
  int logEvery = 10;                 // cuda: the metrics are read every N steps (one host sync)
  bool allowTf32 = false, cudaGraph = true, checkPlan = false, deterministic = false;
  // cuda: the fused attention's implementation: auto (the faster of ampc's kernels and cuDNN's fused
  // SDPA where cuDNN takes the node, measured in the first step), kernels or cudnn
  // (runtime/cuda/program.h, ProgramOptions::attention).
  std::string attention = "auto";
  // cuda: convolutions' cuDNN and GEMMs' cuBLASLt algorithms: auto (each shape's measured when the
  // plan loads, unless the plan stores one for this machine) or heuristics (the libraries' first,
  // nothing timed) (runtime/cuda/program.h, ProgramOptions::algos). Heuristics by default until
  // the measuring has run on a GPU (stop 63 got none).
  std::string algos = "heuristics";
  // cuda, attention auto: the choices the plan stores, followed where `tuning.device` is this
  // machine's; shapes without one are measured in the first step.
  Tuning tuning;
  // --explain-overflow: the session feeds this watch what it needs to name the op of a skipped
  // step (cpu: every node as it runs; cuda: per-launch scans, read after the step, every step).
  OverflowWatch* watch = nullptr;
};

// What --bench prints besides the step times.
struct SessionReport {
  bool device = false;  // a device's numbers (cuda): planned and measured memory, syncs, graphs
  int64_t arenaBytes = 0, plannedBytes = 0, peakBytes = 0, syncsInSteps = 0, replays = 0, launches = 0;
  std::vector<std::string> attention;  // cuda: "<attention shape>: <implementation>" where cuDNN takes the node
  int algosMeasured = 0, algosStored = 0;  // cuda: GEMM and convolution keys timed at load / followed from the plan
  // cuda: the choices in force after the steps (measured or stored), for `amprun --tune` to store
  Tuning tuning;
  std::string tuningNote;  // why the plan's stored choices were not followed, or ""
  // cuda: where opening the session went, in seconds, in the order to print (Program::LoadTimes)
  std::vector<std::pair<std::string, double>> loadSeconds;
};

class TrainSession {
 public:
  virtual ~TrainSession() = default;
  // The 0-based number of the next step (Dropout's counter; a resumed run starts past 0).
  virtual void begin(uint64_t firstStep) = 0;
  // One step on `batch` (null: the previous step's batch again, kept where it was). Returns the
  // metrics of every step finished since the last call: cpu each step's at once, cuda those of a
  // log interval when it closes. Each metric's `ms` is the step's time (cuda: device time).
  virtual std::vector<Trainer::Metrics> step(const std::map<std::string, Tensor>* batch) = 0;
  // The metrics of the steps not returned yet.
  virtual std::vector<Trainer::Metrics> flush() { return {}; }
  // Every state tensor back into the graph's params (checkpoints, --save, evaluation).
  virtual void syncState() {}
  // The loss scale the next step runs with.
  virtual double lossScale() = 0;
  // With a watch, after a step that came back skipped: the watch holds that step's finding.
  virtual void findOverflow() = 0;
  virtual SessionReport report() = 0;
  // Device diagnostics (--profile N: the costliest ops and nodes of one more step; --check-plan:
  // the nodes that wrote NaNs), as text; empty where the backend has none.
  virtual std::string profile(size_t /*top*/) { return ""; }
  virtual std::string checkPlanReport() { return ""; }
};

// Opens `g` on o.device. Error naming the device when this build or machine cannot run it.
std::unique_ptr<TrainSession> openTrainSession(Graph& g, const SessionOptions& o);
// The device amprun uses when none is named: cuda where this build has CUDA and a GPU is present.
std::string defaultDevice();
// Why `device` cannot run here (not a device name, no CUDA in this build, no GPU), or "".
std::string deviceUnavailable(const std::string& device);

// The CPU reference's session (runtime/cpu_session.cpp).
std::unique_ptr<TrainSession> openCpuSession(Graph& g, const SessionOptions& o);

}  // namespace ampc
