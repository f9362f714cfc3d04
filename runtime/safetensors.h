// safetensors files (https://huggingface.co/docs/safetensors): how weights and checkpoints leave
// and enter ampc. Layout: u64 little-endian header size, a JSON header mapping each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows) plus an
// optional "__metadata__" map of strings, then the data.
#pragma once

#include <map>
#include <string>

#include "compiler/ir/ir.h"

namespace ampc {

struct Safetensors {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The metadata key under which ampc writes each tensor's XXH3-64 hash (a JSON object, name -> 16
// hex digits). readSafetensors checks them and drops the key; files from elsewhere have none.
inline constexpr const char* kHashKey = "ampc.xxh3";
std::string tensorHash(const Tensor& t);

// Tensors are views of the mapped file (no copy). Writes atomically: a temp file beside `path`, fsync, rename, fsync of the folder. A failure
// leaves any previous file at `path` untouched.
void writeSafetensors(const std::string& path, const Safetensors& st);
// Error naming the file (and the tensor) for a missing, truncated or malformed file.
Safetensors readSafetensors(const std::string& path);

}  // namespace ampc
