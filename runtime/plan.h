// Training plans (runtime/plan.proto): written by ampc, read by amprun.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "compiler/codegen/nvptx.h"
#include "compiler/ir/ir.h"
#include "passes/memory_plan.h"
#include "passes/train_step.h"
#include "runtime/folds.h"
#include "runtime/session.h"

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
  Tuning tuning;                // the choices `amprun --tune` stored (plan.proto, Tuning)
};

// Generates an ampc.Fused node's kernel (codegen::fusedKernel, which only ampc links).
using KernelGenerator = std::function<codegen::Kernel(const Node& fused, const std::string& name)>;

// The train-step graph as opts.target runs it (runtime/lower.cpp). For cuda: connected pointwise
// nodes become ampc.Fused groups (passes/fuse_elementwise.cpp), except nodes the CUDA backend's
// folds run inside a norm, loss, dropout or optimizer; with `generate`, each group gets its kernel
// (attributes "ptx" and "entry"; "vector_entry" and "vector" for its vector entry, if any); groups
// whose bodies differ only in names carry the same kernel, generated once. Without one, amprun
// runs a group's nodes one by one on CUDA.
// Returns the groups left without a kernel (no generator, or no libdevice for their formulas).
int lowerStep(Graph& step, const TrainOptions& opts, const KernelGenerator& generate = {});
// The CUDA lowering's last rewrites, which record on the graph what runs inside a neighbour: the
// gradient chain in the optimizer, comparisons in their Where, the optimizer launch groups and the
// casts (passes/fuse_grad_chain.h, fold_comparisons.h, group_optimizers.h, fold_casts.h). Each
// decides afresh, so running them again after a rewrite at load (data-parallel, expanded groups)
// records what the rewritten graph allows; planCudaMemory refuses a stale record, naming the node.
void recordFolds(Graph& step);
// The inverse: each ampc.Fused node (only those without a kernel, if asked) replaced by its body's
// nodes, its results keeping their names. Returns how many it expanded. The casts' folds recorded
// before stay sound (no group reads or writes a folded Cast); the expanded casts launch unless
// fold-casts runs again.
int expandFused(Graph& g, bool onlyWithoutKernel);

// The CUDA backend's memory plan of a lowered step: over the folds' schedule (runtime/folds.h),
// without the values they never write, the loss's scores at their padded row pitch. amprun
// allocates it at load; `ampc --train --memory` explains its peak at compile time. `sched` (if given)
// receives the schedule.
MemoryPlan planCudaMemory(const Graph& step, folds::Schedule* sched = nullptr, std::map<const Value*, int64_t>* pitches = nullptr);

// Builds the plan of `forward` (already painted) with `opts` and writes it atomically, with its
// weights file `<path>.safetensors` beside it (written first, also atomically). The step graph is
// lowered (lowerStep) with `generate`. Returns lowerStep's count of groups left without a kernel.
int writePlan(const std::string& path, const Graph& forward, const TrainOptions& opts, const std::string& source,
               const KernelGenerator& generate = {});
// Error naming the file: missing, not a plan, a newer format version.
LoadedPlan readPlan(const std::string& path);
// Stores `t` in the plan at `path` in place of the tuning it held (amprun --tune): the plan is read
// and checked as readPlan checks it, then rewritten atomically with a new checksum; its weights file
// is not touched. Error naming the file.
void storeTuning(const std::string& path, const Tuning& t);

}  // namespace ampc
