// The checkpoint loader (amprun --resume FILE): safetensors, every tensor against the plan's state,
// the metadata's ranges and the seed. The graph is the seed plan's step graph
// (AMPC_FUZZ_PLAN_FILE; tools/fuzz.sh compiles it and writes a checkpoint of it as the seed).
#include <cstdlib>

#include "runtime/checkpoint.h"
#include "runtime/plan.h"
#include "tests/fuzz/fuzz_common.h"

namespace {
ampc::LoadedPlan* plan = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* p = std::getenv("AMPC_FUZZ_PLAN_FILE");
  if (!p) return 0;
  plan = new ampc::LoadedPlan(ampc::readPlan(p));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  if (!plan) std::abort();  // AMPC_FUZZ_PLAN_FILE names the plan the checkpoints belong to
  const std::string path = fuzz::asFile("ckpt-00000001.safetensors", data, size);
  return fuzz::refusedOrDone([&] { (void)resumeFile(path, *plan->step, 0); });
}
