// Data-parallel groups: the processes that train one plan together, each on its share of every
// global batch (DESIGN.md, "Scale-out"). The collectives are Gloo's (libgloo-dev, PyTorch's CPU
// engine) over TCP; the processes find each other through a small key-value store that rank 0
// serves at MASTER_ADDR:MASTER_PORT (torchrun's environment convention).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "kernels/cpu/kernel.h"

namespace ampc {

// A process's place in its group, from the torchrun environment: RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT. Under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True) the
// agent holds MASTER_PORT, so rank 0 serves at MASTER_PORT + 1; AMPC_STORE_PORT overrides both.
struct DistEnv {
  int rank = 0, world = 1, localRank = 0;
  std::string masterAddr = "127.0.0.1";
  int storePort = 0;
  // WORLD_SIZE=1 needs nothing else: that group of one serves its own store on a free loopback port.
  // None when WORLD_SIZE is not set; Error naming the variable for a value that does not parse
  // or does not fit (RANK outside [0, WORLD_SIZE), a port outside [1, 65535], ...).
  static std::optional<DistEnv> fromEnvironment();
};

// A group's collectives. `timeout` bounds the rendezvous and every collective: a peer that died or
// stopped answering gives an Error naming this rank, within the timeout (at once for a peer whose
// process ended: its connections close).
class ProcessGroup : public Collective {
 public:
  static std::unique_ptr<ProcessGroup> connect(const DistEnv& env, std::chrono::milliseconds timeout);
  ~ProcessGroup() override;
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void allReduceSum(float* data, size_t n) override;
  std::string shareFromRankZero(const std::string& key, const std::string& bytes) override;
  void barrier();

 private:
  struct Impl;
  ProcessGroup(int rank, int world, std::unique_ptr<Impl> impl);
  int rank_, world_;
  std::unique_ptr<Impl> impl_;
};

// A free TCP port on the loopback interface (the launcher's MASTER_PORT).
int freeLoopbackPort();

}  // namespace ampc
