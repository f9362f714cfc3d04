// Which op overflowed, and why (amprun --explain-overflow). Watches a train-step graph's nodes as
// the CPU backend runs them (an evaluate() observer) and keeps the first node of the step that made
// a non-finite float value from operands without one: the first Inf from operands with neither Inf
// nor NaN, or the first NaN from operands without NaN. A mask's -inf, added to the scores, is not
// such a node; the softmax of a row that is -inf everywhere (NaN) is.
//
// The explanation says where the node sits: in the forward pass (a loss scale cannot help: keep the
// op in f32, or train at bf16) or on the backward path that carries the loss scale (the values there
// are S times the gradients: the dynamic scaler skips the step and backs off, which is expected
// while the scale settles), and what its result type holds (f16's largest finite value is 65504).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// A float value's non-finite elements and its largest finite |x|.
struct FiniteScan {
  int64_t inf = 0, nan = 0;
  double largest = 0;
};
FiniteScan scanFinite(const Tensor& t);  // zeros for a non-float tensor

struct OverflowFinding {
  std::string node, op;  // the node's name and op ("" when none made a non-finite value)
  std::string target;    // the forward node to keep in f32: the node's own, or a Cast's reader's
  DType type = DType::f32;       // the non-finite result's element type
  bool scaled = false;           // on the backward path that carries the loss scale
  int64_t inf = 0, nan = 0, count = 0;  // non-finite elements of that result, of `count`
  double largestFinite = 0;      // its largest finite |x|
  std::vector<std::string> operands;  // "name type max |x| M" per float operand
  std::vector<std::string> fusedWith;  // CUDA: the other nodes of the one launch the finding comes from
};

class OverflowWatch {
 public:
  // g: a train-step graph (passes/train_step.h): its `ampc.loss_scale` param seeds the backward.
  explicit OverflowWatch(const Graph& g);
  void startStep() { found_ = OverflowFinding{}; }
  // The evaluate() observer: node n ran on `ins` (null where an operand is absent) and made `outs`.
  void observe(const Node& n, const std::vector<const Tensor*>& ins, const std::vector<Tensor>& outs);
  // The same from scans: node n's result r (`out`) from its float operands' scans (value, scan); a
  // backend that runs several nodes in one launch passes the launch's outside operands and the
  // other nodes in `fusedWith`.
  void observeScans(const Node& n, size_t r, const FiniteScan& out, const std::vector<std::pair<const Value*, FiniteScan>>& operands,
                    const std::vector<std::string>& fusedWith = {});
  bool found() const { return !found_.node.empty(); }
  const OverflowFinding& finding() const { return found_; }
  // A few lines: the node, its result, its operands, where it sits and what to do about it.
  std::string explain(int64_t step, double lossScale) const;

 private:
  std::set<const Node*> scaled_;  // nodes downstream of the loss scale, before the unscale
  OverflowFinding found_;
};

}  // namespace ampc
