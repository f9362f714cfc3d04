// Pointwise formulas: an elementwise op's scalar math, written once (compiler/ops/pointwise.cpp)
// against an abstract builder. A generated-kernel backend implements the builder (the NVPTX code
// generator, compiler/codegen/nvptx.cpp, emits LLVM IR through it), so an elementwise op that has a
// formula fuses into generated kernels with no backend code of its own.
//
// Values are f32 scalars or predicates. An f16/bf16 operand is widened to f32 before the formula
// sees it, and the kernel rounds each node's result to the node's dtype, as the op-by-op kernels
// do (each op rounds its result once): a fused group computes the same roundings as its ops.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// The arithmetic the builder provides: IEEE f32 operations, correctly rounded where IEEE says so
// (add, sub, mul, div, sqrt), and the CUDA math library's functions (libdevice) for the others.
// Pow computes in f64, as the CPU reference does.
enum class PwMath : uint8_t {
  Add, Sub, Mul, Div, Pow,                                           // binary
  Neg, Sqrt, Exp, Log, Tanh, Erf, Sin, Cos, Log1p, Expm1, Floor, Ceil, Rint,  // unary
  Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh,
};
enum class PwCmp : uint8_t { Eq, Lt, Le, Gt, Ge, Unordered };  // Unordered: either is NaN (a != a)
enum class PwLogic : uint8_t { And, Or, Not };

struct PwValue {
  int id = -1;  // the builder's handle; -1: an absent optional operand
  bool present() const { return id >= 0; }
};

class PwBuilder {
 public:
  virtual ~PwBuilder() = default;
  virtual PwValue constant(float v) = 0;
  virtual PwValue math(PwMath op, PwValue a, PwValue b = {}) = 0;
  virtual PwValue compare(PwCmp c, PwValue a, PwValue b) = 0;  // a predicate
  virtual PwValue logic(PwLogic op, PwValue a, PwValue b = {}) = 0;  // predicates
  virtual PwValue select(PwValue cond, PwValue a, PwValue b) = 0;    // a and b both f32 or both predicates
  virtual PwValue toPredicate(PwValue f) = 0;                        // f != 0
  virtual PwValue fromPredicate(PwValue p) = 0;                      // 1 or 0

  // Conveniences over the above.
  PwValue add(PwValue a, PwValue b) { return math(PwMath::Add, a, b); }
  PwValue sub(PwValue a, PwValue b) { return math(PwMath::Sub, a, b); }
  PwValue mul(PwValue a, PwValue b) { return math(PwMath::Mul, a, b); }
  PwValue div(PwValue a, PwValue b) { return math(PwMath::Div, a, b); }
  PwValue k(float v) { return constant(v); }
};

// One node's formula: in[i] is operand i (absent ones not present). Error naming the node for an
// attribute value the formula does not model.
using PointwiseFn = PwValue (*)(PwBuilder& b, const Node& n, const std::vector<PwValue>& in);  // = PwFormula

// The formula of n's op, or null (not pointwise, or an attribute value no formula covers). Only for
// nodes whose operands and result are float or bool.
PointwiseFn pointwiseFormula(const Node& n);

// ampc.Fused: a connected group of pointwise nodes of one result shape (the domain), made by
// passes/fuse_elementwise.cpp. Its attribute "body" is the group as a graph in the IR's text form
// (compiler/ir/text.h): the body's inputs are the node's operands (any that broadcast to the
// domain), its outputs the node's results, its constants one-element operands folded in. The
// NVPTX code generator adds "ptx" (the kernel: entries "entry" and "vector_entry") for the CUDA backend; the CPU
// backend runs the body's nodes with its own kernels, so the fused node computes exactly what the
// group did.
// The parsed, verified body of an ampc.Fused node (cached by its text). Error naming the node for a
// body that does not parse, does not verify, holds a node without a pointwise formula, or whose
// interface does not match the node's operands.
std::shared_ptr<const Graph> fusedBody(const Node& fused);

}  // namespace ampc
