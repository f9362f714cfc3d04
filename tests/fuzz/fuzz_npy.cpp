// The .npy reader (amprun --data, ampc --eval --inputs, --bind).
#include "runtime/npy.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  const std::string path = fuzz::asFile("x.npy", data, size);
  return fuzz::refusedOrDone([&] {
    Tensor t = readNpy(path);
    for (int64_t i = 0; i < t.numel(); i += 97) (void)t.getDouble(i);  // every byte it claims is there
  });
}
