// The safetensors reader: plan weights files, checkpoints (amprun --resume reads a checkpoint
// through it before it checks the metadata) and --save files; with the per-tensor hashes.
#include "runtime/safetensors.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  const std::string path = fuzz::asFile("w.safetensors", data, size);
  return fuzz::refusedOrDone([&] {
    Safetensors s = readSafetensors(path);
    for (const auto& [name, t] : s.tensors) (void)tensorHash(t);
  });
}
