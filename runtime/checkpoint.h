// Checkpoints of a training run (amprun --checkpoint DIR, --resume DIR|FILE): every state param of
// the step graph, the data position and the seed, as safetensors with per-tensor XXH3 hashes.
#pragma once

#include <cstdint>
#include <string>

#include "compiler/ir/ir.h"
#include "runtime/data.h"

namespace ampc {

struct Resumed {
  int64_t step = 0;
  DataSource::Position pos;
};

// DIR/ckpt-STEP.safetensors and DIR/latest naming it, both written atomically.
void writeCheckpoint(const std::string& dir, const Graph& g, int64_t step, const DataSource::Position& pos, uint64_t seed);
// Loads a checkpoint file into g's params after checking everything in it (tensors, types, the
// range of every metadata field, the seed); Error naming the file otherwise, g untouched.
Resumed resumeFile(const std::string& file, Graph& g, uint64_t seed);
// A folder resumes from the checkpoint `latest` names (kept inside the folder); if that one is
// damaged, from the newest other checkpoint that loads, with a note on stderr naming both.
Resumed resume(const std::string& where, Graph& g, uint64_t seed);

}  // namespace ampc
