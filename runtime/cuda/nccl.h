// Data-parallel groups on CUDA devices: NCCL, the GPUs' collective engine (the CPU backend's groups
// use Gloo: runtime/dist.h). NCCL is opened at run time (libnccl.so.2, which the GPU machines carry
// in their system library folder), so that a build needs no NCCL headers and a machine without
// NCCL still runs everything but CUDA groups. The processes find each other as they do for Gloo:
// rank 0 makes NCCL's unique id, and the group's rendezvous store hands it to the others.
//
// Failure: NCCL's kernels wait for their peers without end, so every host wait on the stream of a
// group (hostSync) polls instead. It ends in an Error naming this rank when NCCL reports an
// asynchronous error (a peer's connection closed) or when the wait outlasts the group's timeout; the
// communicator is aborted first, so that the stream's kernels end and nothing deadlocks.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <cuda_runtime.h>

#include "kernels/cpu/kernel.h"

namespace ampc::cuda {

class NcclGroup {
 public:
  // Joins the group that `host` (Gloo's, for the rendezvous) describes, on CUDA device `device`.
  // Error naming this rank when NCCL cannot be loaded or the communicator cannot be made.
  NcclGroup(Collective& host, int device, std::chrono::milliseconds timeout);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  // Enqueues an in-place sum of n floats across the group on `st` (capturable in a CUDA graph).
  // Error naming this rank when NCCL refuses the call.
  void allReduceSum(float* data, size_t n, cudaStream_t st);
  // Waits for `st` (hostSync routes its waits here while a group is open): an Error naming this rank
  // and the cause when a peer fails or the wait outlasts the timeout.
  void wait(cudaStream_t st, const char* why);
  // "NCCL 2.28.3", for reports.
  std::string version() const;

 private:
  [[noreturn]] void abort(const std::string& why);
  int rank_ = 0, world_ = 1;
  std::chrono::milliseconds timeout_;
  void* comm_ = nullptr;  // ncclComm_t
  bool aborted_ = false;
};

}  // namespace ampc::cuda
