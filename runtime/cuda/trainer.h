// Training on the CUDA backend: the train-step graph as one Program whose epilogue writes every
// `<state>.next` back into its state buffer and records the step's metrics into a device ring. The
// host reads the ring once every `logEvery` steps (one counted synchronisation), so steps in
// between never wait for the device.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/program.h"
#include "runtime/trainer.h"

namespace ampc::cuda {

class CudaTrainer {
 public:
  CudaTrainer(Graph& g, const ProgramOptions& o, int logEvery);
  ~CudaTrainer();
  // The step number (0-based) the next step() runs: Dropout's counter.
  void begin(uint64_t firstStep);
  // One step; `batch` is uploaded first (null: the previous batch stays on the device). Returns the
  // metrics of the steps finished so far when the log interval closes, else nothing.
  std::vector<Trainer::Metrics> step(const std::map<std::string, Tensor>* batch);
  // The metrics of every step not returned yet.
  std::vector<Trainer::Metrics> flush();
  // Copies every state param back into the graph (for checkpoints, --save, evaluation).
  void syncState();
  Program& program() { return *prog_; }
  int64_t syncsInSteps() const { return syncsInSteps_; }

 private:
  Graph& g_;
  std::unique_ptr<Program> prog_;
  std::vector<std::pair<Value*, size_t>> writeBack_;
  int slots_;
  double* ring_ = nullptr;  // device, 5 doubles per slot
  double* hostRing_ = nullptr;
  int* pos_ = nullptr;
  int nextSlot_ = 0, pending_ = 0;
  std::vector<cudaEvent_t> start_, end_;
  int64_t syncsInSteps_ = 0;
};

}  // namespace ampc::cuda
