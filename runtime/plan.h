// Training plans (runtime/plan.proto): written by ampc, read by amprun.
#pragma once

#include <memory>
#include <string>

#include "compiler/ir/ir.h"
#include "passes/train_step.h"

namespace ampc {

// 2: the plan ends with its checksum (plan.proto, Plan.checksum).
// 3: the weights are in a safetensors file beside the plan (Plan.weights_file), stored once.
// Older plans are refused: they embedded the weights three times and no ampc writes them now.
inline constexpr uint32_t kPlanFormatVersion = 3;
inline constexpr uint32_t kOldestPlanFormat = 3;

struct LoadedPlan {
  std::unique_ptr<Graph> step;  // the train-step graph (state in its params)
  std::unique_ptr<Graph> eval;  // the forward graph, for --eval-data
  TrainOptions options;
  int64_t batchSize = 0;
  std::string source;
  std::string dump;             // a readable listing (amprun --dump)
};

// Builds the plan of `forward` (already painted) with `opts` and writes it atomically, with its
// weights file `<path>.safetensors` beside it (written first, also atomically).
void writePlan(const std::string& path, const Graph& forward, const TrainOptions& opts, const std::string& source);
// Error naming the file: missing, not a plan, a newer format version.
LoadedPlan readPlan(const std::string& path);

}  // namespace ampc
