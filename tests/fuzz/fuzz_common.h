// Shared by the libFuzzer drivers (tests/fuzz, built by tools/fuzz.sh under ASan+UBSan): each input
// is written to a file in this process's own temporary folder and handed to the reader that
// amprun and ampc use on files. A reader may refuse an input with ampc::Error (or another
// std::exception: protobuf, the JSON parser); anything else, a sanitizer report, a crash, a
// timeout or an allocation past -malloc_limit_mb, is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>

#include "compiler/ir/ir.h"

namespace ampc::fuzz {

inline const std::string& workDir() {
  static const std::string dir = [] {
    std::string t = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) + "/ampc-fuzz-XXXXXX";
    if (!mkdtemp(t.data())) std::abort();
    return t;
  }();
  return dir;
}

// The input as the file `name` in the work folder; returns its path.
inline std::string asFile(const char* name, const uint8_t* data, size_t size) {
  const std::string path = workDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) std::abort();
  return path;
}

// Runs f; a clean refusal is fine.
template <typename F>
int refusedOrDone(F&& f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const std::exception&) {
  }
  return 0;
}

}  // namespace ampc::fuzz
