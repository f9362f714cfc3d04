// The IR text parser (ampc MODEL.ir) and the verifier on what it accepts.
#include "compiler/ir/text.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  const std::string text(reinterpret_cast<const char*>(data), size);
  return fuzz::refusedOrDone([&] {
    auto g = parseGraph(text, "fuzz.ir");
    verify(*g);
    (void)printGraph(*g);
  });
}
