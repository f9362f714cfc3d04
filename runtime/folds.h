// The CUDA backend's folds (pure IR, so testable without a GPU): which nodes launch nothing because
// a neighbour does their work (a cast read or written through, a comparison inside its Where,
// the gradient chain inside the optimizer), where
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
// Every input a constant with data (and the op not random): the CUDA lowering computes such a node on the CPU.
bool allConstInputs(const Node& n);

// A float comparison whose one use is the condition of a Where (not a graph output) runs inside
// that Where: the bool tensor is never written.
bool fusedComparison(const Graph& g, const Node& c);

// Casts folded into the ops around them (exact: the op widens to f32 and rounds once either way):
// a widening Cast (f16/bf16 -> f32) all of whose readers can widen in registers is read through by
// each of them, and a narrowing Cast (f32 -> f16/bf16) that is the one use of such an op's result
// is written by it. The Cast itself launches nothing, and its f32 side gets no bytes.
bool foldsCasts(const Node& n);  // the elementwise ops that read or write through casts
bool isLossGrad(const Node& n);
bool isLayerNorm(const Node& n);
// Whether `user` reads its operand `i` through a widening Cast: elementwise ops any operand, the
// cross-entropy loss (without its log-prob result) and its gradient the scores, LayerNormGrad dY,
// UnscaleCheck the gradients, a tiled Transpose its input (GPT-2's tied embedding gradient).
bool readsWidened(const Node& user, size_t i);
// The pointwise ops runtime/cuda/program.cpp lowers by hand (its elementwise kernel, GELU, SiLU,
// Max/Min, Clip, Identity). Any other op with a pointwise formula (compiler/ops/pointwise.h) runs on
// CUDA only as a generated kernel: runtime/lower.cpp makes even a lone node of it a group. An op
// missing here runs generated (correct); one listed that program.cpp lacks fails at load, naming it.
bool cudaPointwiseByHand(const Node& n);
// A Transpose that is [batch, R, C] -> [batch, C, R] once adjacent input dims are merged and size-1
// dims dropped: the CUDA backend's tiled kernel (transpose2d). Fills batch, R, C.
bool tiledTranspose(const Node& t, int64_t& batch, int64_t& R, int64_t& C);
bool isCastBetween(const Node& c, bool widening);
// The widening Cast that produced v, when every reader of v reads through it; else null.
const Node* widenedSource(const Graph& g, const Value* v);
// The value a node reads for operand v: the narrow source of a folded widening Cast, or v.
const Value* readThrough(const Graph& g, const Value* v);
// The narrowing Cast that node n writes directly, or null: elementwise ops, the loss gradient and
// LayerNormalization (its result 0) write through it.
const Node* narrowedResult(const Graph& g, const Node& n);
// A narrowing Cast whose one reader is a DropoutGrad's dY: DropoutGrad reads the f32 source and
// rounds it as the Cast would. Returns the Cast that DropoutGrad n reads through, or null.
const Node* narrowedGradInput(const Graph& g, const Node& n);
bool castReadByDropoutGrad(const Graph& g, const Node& c);
// A Cast that launches nothing: folded into its readers or its producer.
bool castFolded(const Graph& g, const Node& c);
// The value a folded Cast stands in for, never written: a widening Cast's f32 result, a narrowing
// Cast's f32 operand where its producer writes the narrow result, its narrow result where a
// DropoutGrad reads the operand.
const Value* castUnwritten(const Graph& g, const Node& c);

// The step's gradient chain folded into the optimizer: an UnscaleCheck each of whose unscaled
// gradients has one reader, either all one ClipByGlobalNorm (taking UnscaleCheck's found_inf) each
// of whose clipped gradients has one reader, or directly, and those readers the gradient operand
// of SGD or Adam/AdamW nodes (not LAMB); none a graph output. UnscaleCheck then only checks (and
// sums the squares for the clip), the clip only writes its norm, and the optimizer reads each
// gradient as UnscaleCheck did, unscaling and clipping it in registers with the same operations:
// the unscaled and clipped gradients are never written. Returns whether `unscale` is such a node;
// `clip` gets the ClipByGlobalNorm or null.
bool fusedGradChain(const Graph& g, const Node& unscale, const Node** clip = nullptr);

// Optimizer nodes that run as one launch: same op, attributes, lr/step/found operands. Per node
// index, the index of its group's first node (or itself).
std::vector<size_t> optimizerGroups(const Graph& g);

// When each node's work runs (an index into the node order, for the memory plan), and the values
// no launch writes.
struct Schedule {
  std::vector<size_t> leader;       // optimizerGroups
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
