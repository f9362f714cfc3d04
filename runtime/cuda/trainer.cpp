#include "runtime/cuda/trainer.h"

#include "kernels/cuda/train.h"
#include "runtime/cuda/libs.h"

namespace ampc::cuda {

CudaTrainer::CudaTrainer(Graph& g, const ProgramOptions& o, int logEvery)
    : g_(g), writeBack_(stateUpdates(g)), slots_(std::max(logEvery, 1)) {
  prog_ = std::make_unique<Program>(g, o);
  Program& p = *prog_;
  check(cudaMalloc(&ring_, sizeof(double) * 5 * slots_), "metrics ring");
  check(cudaMalloc(&pos_, sizeof(int)), "metrics ring");
  check(cudaMemset(pos_, 0, sizeof(int)), "metrics ring");
  check(cudaHostAlloc(&hostRing_, sizeof(double) * 5 * slots_, cudaHostAllocDefault), "metrics ring");
  start_.resize(slots_);
  end_.resize(slots_);
  for (int i = 0; i < slots_; ++i) {
    check(cudaEventCreate(&start_[i]), "cudaEventCreate");
    check(cudaEventCreate(&end_[i]), "cudaEventCreate");
  }
  // Epilogue: metrics first (they read outputs 0-4), then the state write-back.
  const void* values[5];
  int types[5];
  for (int k = 0; k < 5; ++k) {
    const Value* v = g.outputs()[k];
    values[k] = p.ptr(v);
    types[k] = static_cast<int>(deviceType(v->type().dtype, "metric '" + v->name() + "'"));
  }
  std::vector<const void*> vals(values, values + 5);
  std::vector<int> tys(types, types + 5);
  double* ring = ring_;
  int* pos = pos_;
  const int slots = slots_;
  p.addEpilogue([vals, tys, ring, pos, slots](cudaStream_t st) { return recordMetrics(vals.data(), tys.data(), ring, pos, slots, st); });
  for (auto& [state, i] : writeBack_) {
    void* dst = p.ptr(state);
    const void* src = p.ptr(g.outputs()[i]);
    const size_t bytes = state->type().bytes();
    if (dst != src && bytes > 0)
      p.addEpilogue([dst, src, bytes](cudaStream_t st) { return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st); });
  }
}

CudaTrainer::~CudaTrainer() {
  if (prog_) cudaStreamSynchronize(prog_->stream());
  for (auto e : start_) cudaEventDestroy(e);
  for (auto e : end_) cudaEventDestroy(e);
  cudaFree(ring_);
  cudaFree(pos_);
  cudaFreeHost(hostRing_);
}

void CudaTrainer::begin(uint64_t firstStep) { prog_->setStep(firstStep); }

std::vector<Trainer::Metrics> CudaTrainer::step(const std::map<std::string, Tensor>* batch) {
  Program& p = *prog_;
  const int64_t before = hostSyncs();
  if (batch)
    for (const Value* v : g_.inputs()) {
      auto it = batch->find(v->name());
      if (it == batch->end()) throw Error("input '" + v->name() + "' (" + v->type().str() + ") was not given");
      p.upload(v, it->second);
    }
  const int slot = (nextSlot_ + pending_) % slots_;
  check(cudaEventRecord(start_[slot], p.stream()), "cudaEventRecord");
  p.run();
  check(cudaEventRecord(end_[slot], p.stream()), "cudaEventRecord");
  syncsInSteps_ += hostSyncs() - before;
  ++pending_;
  if (pending_ < slots_) return {};
  return flush();
}

std::vector<Trainer::Metrics> CudaTrainer::flush() {
  std::vector<Trainer::Metrics> out;
  if (pending_ == 0) return out;
  Program& p = *prog_;
  check(cudaMemcpyAsync(hostRing_, ring_, sizeof(double) * 5 * slots_, cudaMemcpyDeviceToHost, p.stream()), "metrics read");
  hostSync(p.stream(), "metrics read");
  for (int k = 0; k < pending_; ++k) {
    const int s = (nextSlot_ + k) % slots_;
    const double* r = hostRing_ + 5 * s;
    Trainer::Metrics m;
    m.loss = r[0];
    m.lossScale = r[1];
    m.skipped = r[2] != 0;
    m.gradNorm = r[3];
    m.lr = r[4];
    float ms = 0;
    if (cudaEventElapsedTime(&ms, start_[s], end_[s]) == cudaSuccess) m.ms = ms;
    out.push_back(m);
  }
  nextSlot_ = (nextSlot_ + pending_) % slots_;
  pending_ = 0;
  return out;
}

void CudaTrainer::syncState() {
  for (auto& [state, i] : writeBack_) state->setData(prog_->download(state));
}

}  // namespace ampc::cuda
