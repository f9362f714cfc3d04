// The CUDA backend's folds (pure IR, so testable without a GPU): which nodes launch nothing because
// a neighbour does their work (a cast read or written through, as fold-casts recorded it; a
// comparison inside its Where; the gradient chain inside the optimizer), where
// each node's work runs, and which values are never written (no bytes in the memory plan).
// runtime/cuda/program.cpp lowers by these decisions; tests/unit/folds_test.cpp checks them on the
// committed models. The fusions that became IR rewrites (passes/fuse_*.cpp, run by runtime/lower.cpp)
// make explicit cuda:: nodes instead.
#pragma once

#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc::folds {

bool isOnnx(const Node& n, std::string_view op);

// A float comparison run inside the Where that reads it, as fold-comparisons recorded it
// (passes/fold_comparisons.cpp): the bool tensor is never written.
bool fusedComparison(const Node& c);

bool isLossGrad(const Node& n);
// The casts folded into the ops around them, as fold-casts recorded them (passes/fold_casts.h):
// the folded Cast launches nothing, and the value on its f32 side (its narrow result, for a
// DropoutGrad's) gets no bytes.
// The widening Cast (fold readers) that produced v, or null.
const Node* widenedSource(const Value* v);
// The value a reader of v reads: the narrow source of a folded widening Cast, or v.
const Value* readThrough(const Value* v);
// The narrowing Cast (fold producer) that node n writes directly, or null.
const Node* narrowedResult(const Node& n);
// The narrowing Cast (fold grad_reader) whose f32 operand node n reads as its operand 0, or null.
const Node* narrowedGradInput(const Node& n);
// A Cast that launches nothing, and the value it stands in for that nothing writes.
bool castFolded(const Node& c);
const Value* castUnwritten(const Node& c);

// The step's gradient chain folded into the optimizer, as fuse-grad-chain recorded it
// (passes/fuse_grad_chain.cpp): UnscaleCheck only checks (and sums the squares for the clip), the
// clip only writes its norm, and each optimizer node reads the gradient UnscaleCheck read,
// unscaling and clipping it in registers; the unscaled and clipped gradients are never written.
// Returns whether `unscale` is such a node; `clip` gets the ClipByGlobalNorm or null.
bool fusedGradChain(const Node& unscale, const Node** clip = nullptr);

// When each node's work runs (an index into the node order, for the memory plan), and the values
// no launch writes.
struct Schedule {
  std::vector<size_t> leader;       // the optimizer groups group-optimizers recorded (passes/group_optimizers.h)
  std::vector<int> positions;       // per node
  std::set<const Value*> unwritten;
  std::map<const Node*, int> order;  // each node's index
  std::vector<std::pair<const Value*, int>> extraReads;  // reads no operand shows (the folded gradient chain's)
  // Optimizer results (and the Identity naming each the state's next value) stored in the bytes of
  // the state they update: in unwritten too (no arena bytes); the program points them at the state.
  std::map<const Value*, const Value*> aliases;
  // Kernels that may write a result over an operand (written -> read) because each thread reads its
  // elements of the operand before it writes the same ones: the operand's bytes go to the result
  // where nothing reads the operand afterwards (the memory plan checks that). The cross-entropy
  // gradient over its scores: the logits, often the step's largest value, and their gradient then
  // share one buffer.
  std::map<const Value*, const Value*> inPlace;
};
Schedule schedule(const Graph& g);

}  // namespace ampc::folds
