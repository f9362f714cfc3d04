// The plan loader (amprun's readPlan: protobuf, format version, weights file, the two graphs, the
// structural checks). The input is a plan's body: the driver appends the XXH3 checksum field that
// ampc writes, so that mutations reach past the checksum. The weights file is the seed plan's
// (AMPC_FUZZ_WEIGHTS, copied beside the plan under its own name); a mutated plan that names
// another one is refused as missing.
#include <filesystem>

#include "runtime/hash.h"
#include "runtime/plan.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* w = std::getenv("AMPC_FUZZ_WEIGHTS")) {
    std::error_code ec;
    std::filesystem::copy_file(w, ampc::fuzz::workDir() + "/" + std::filesystem::path(w).filename().string(),
                               std::filesystem::copy_options::overwrite_existing, ec);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  const uint64_t h = hash64(bytes.data(), bytes.size());
  bytes.push_back(static_cast<char>((15 << 3) | 1));  // Plan.checksum: field 15, fixed64
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  const char* name = std::getenv("AMPC_FUZZ_PLAN_NAME");
  const std::string path = fuzz::asFile(name ? name : "fuzz.ampplan", reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return fuzz::refusedOrDone([&] { (void)readPlan(path); });
}
