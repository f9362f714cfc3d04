// Gradient rules: each differentiable registry row has a GradFn that, given the gradients of the
// node's results, adds the nodes computing the gradients of its inputs. The rules build with
// GradBuilder; ops ONNX lacks (convolution and pooling backward, scatter-adds) are registry ops
// of the "ampc" domain with CPU kernels.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

inline constexpr const char* kGradDomain = "ampc";
// On a ReduceMax / ReduceMin node (set by the importer): its gradient goes to the first extreme
// element, as PyTorch's max(dim) and adaptive max pooling give it, not shared among ties.
inline constexpr const char* kGradToFirst = "ampc_grad_to_first";
// On a Max / Min node (set by the importer): tied operands share the gradient evenly, as
// torch.maximum's derivative gives it, even where one is a constant; without it a constant operand
// is read as a clamp's bound (the other takes all of it at a tie). The importer sets it where an
// operand is a tensor the forward created (torch.max(x, torch.tensor(c)): XGLM's and OPT's clamp of
// the masked scores), which torch.export lifts (onnx_import.cpp, liftedConstant); a clamp's Python
// number is no such tensor.
inline constexpr const char* kTiesShared = "ampc_ties_shared";
// On any node (set by the importer): a bit mask of operands that get no gradient through it, beside
// its op's own (OpDef::noGradOperands). A straight-through estimator is x + (f(x) - x) with the
// second operand's bit set: f's value forward, x's gradient back (fake quantization).
inline constexpr const char* kNoGradOperands = "ampc_no_grad_operands";
// The operands of n that get no gradient through it: its op's and the node's own kNoGradOperands.
uint32_t noGradOperands(const Node& n);
// The stop-gradient marker that tools/export/ampc_export.py writes where the forward called
// detach() (or computed under torch.no_grad() from a value with a gradient): a node of this op in
// domain kGradDomain, one operand, one result, its value. No exporter keeps detach(); without the
// marker ampc would differentiate straight through it. The importer writes it as an Identity with
// kNoGradOperands 1.
inline constexpr const char* kStopGradientOp = "StopGradient";

class GradBuilder {
 public:
  GradBuilder(Graph& g, Node& fwd, std::vector<Value*> dOut, std::vector<bool> needs)
      : g(g), node(fwd), dOut_(std::move(dOut)), needs_(std::move(needs)), dIn_(fwd.numInputs(), nullptr), zero_(fwd.numInputs(), false) {}

  Graph& g;
  Node& node;

  Value* x(size_t i) const { return node.input(i); }
  Value* y(size_t i) const { return node.result(i); }
  Value* dy(size_t i) const { return i < dOut_.size() ? dOut_[i] : nullptr; }
  bool needs(size_t i) const { return i < needs_.size() && needs_[i]; }
  void setGrad(size_t i, Value* v);  // Error if shape or dtype differ from the input's
  // Input i's gradient is zero: the results do not depend on it (BatchNormalization's statistics
  // operands in training form). A needed input that a rule neither sets nor declares zero is an
  // error naming the node (autodiff), never a gradient silently dropped.
  void zeroGrad(size_t i) {
    if (i < zero_.size()) zero_[i] = true;
  }
  bool declaredZero(size_t i) const { return i < zero_.size() && zero_[i]; }
  const std::vector<Value*>& grads() const { return dIn_; }
  [[noreturn]] void fail(const std::string& msg) const { throw Error(node.describe() + ": gradient: " + msg); }

  // A node of the registry (default domain, or kGradDomain), typed by its shape rule.
  Value* op(const std::string& op, const std::vector<Value*>& ins, const std::map<std::string, Attribute>& attrs = {},
            const std::string& domain = "");
  std::vector<Value*> opN(const std::string& op, const std::vector<Value*>& ins, const std::map<std::string, Attribute>& attrs,
                          const std::string& domain, size_t results);
  Value* scalar(double v, DType t);                   // constant of rank 0
  Value* ints(const std::vector<int64_t>& v);         // i64 constant of rank 1
  Value* cast(Value* v, DType t);                     // v itself when already t
  Value* zerosLike(Value* v);
  // Sums a broadcast gradient back to `shape` (numpy broadcasting in reverse).
  Value* reduceTo(Value* grad, const std::vector<int64_t>& shape);
  // Elementwise helpers.
  Value* mul(Value* a, Value* b) { return op("Mul", {a, b}); }
  Value* add(Value* a, Value* b) { return op("Add", {a, b}); }
  Value* sub(Value* a, Value* b) { return op("Sub", {a, b}); }
  Value* div(Value* a, Value* b) { return op("Div", {a, b}); }
  Value* neg(Value* a) { return op("Neg", {a}); }
  Value* where(Value* c, Value* a, Value* b) { return op("Where", {c, a, b}); }
  Value* reshape(Value* v, const std::vector<int64_t>& shape) {
    return v->type().shape == shape ? v : op("Reshape", {v, ints(shape)});
  }

 private:
  std::string base() const;
  std::vector<Value*> dOut_;
  std::vector<bool> needs_;
  std::vector<Value*> dIn_;
  std::vector<bool> zero_;
};

}  // namespace ampc
