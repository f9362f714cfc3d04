// The op registry: one declarative row per op. Passes ask the registry; none switches over op names.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// Autocast categories (DESIGN.md): allow runs low with FP32 accumulation, deny stays FP32,
// infer follows its float inputs, clear moves data and is precision-neutral.
enum class AmpCategory : uint8_t { Allow, Deny, Infer, Clear };
std::string_view ampCategoryName(AmpCategory c);

// What a node's shape rule sees: its input types, the data of inputs that are compile-time
// constants, and its attributes. It fills `outputs` (one type per result).
class InferContext {
 public:
  InferContext(const Node& node, int opset);

  const Node& node() const { return node_; }
  int opset() const { return opset_; }
  size_t numInputs() const { return node_.numInputs(); }
  bool hasInput(size_t i) const { return node_.input(i) != nullptr; }
  const TensorType& in(size_t i) const;               // Error if absent
  const Tensor* constIn(size_t i) const;              // null if absent or not constant
  std::vector<int64_t> constInts(size_t i) const;     // Error if not constant
  size_t numOutputs() const { return node_.numResults(); }

  std::vector<TensorType> outputs;
  void setOut(size_t i, TensorType t);

  // Throws Error("node 'x' (Op): msg").
  [[noreturn]] void fail(const std::string& msg) const;
  void check(bool ok, const std::string& msg) const {
    if (!ok) fail(msg);
  }
  // Normalises a possibly negative axis against rank r, failing if out of range.
  int64_t axis(int64_t a, int64_t r) const;

 private:
  const Node& node_;
  int opset_;
};

using ShapeFn = void (*)(InferContext&);
class GradBuilder;  // compiler/ops/grad.h
using GradFn = void (*)(GradBuilder&);
class PwBuilder;       // compiler/ops/pointwise.h
struct PwValue;
using PwFormula = PwValue (*)(PwBuilder&, const Node&, const std::vector<PwValue>&);

struct OpDef {
  std::string_view name;
  std::string_view domain;  // "" = ai.onnx
  int sinceOpset;           // the registry accepts this op at opsets [sinceOpset, lastOpset]
  int lastOpset;
  int minInputs, maxInputs;    // maxInputs -1: variadic
  int minOutputs, maxOutputs;
  AmpCategory amp;
  bool differentiable;      // false: comparisons, Shape, ArgMax, integer/bool paths
  ShapeFn infer;
  std::string_view dtypeAttr = {};  // the attribute that names the result dtype (Cast's "to")
  bool explicitCast = false;        // Cast, CastLike: the model chose the dtype; autocast keeps it
  bool random = false;          // draws random numbers (Dropout): never folded
  bool readsOnlyTypes = false;  // the result depends on input types alone (Shape): it folds even
                                // when its input is not a constant
  // Autocast: float operands that stay FP32 when the op runs low (bit i = input i): BatchNorm's
  // scale, bias and statistics, Dropout's ratio, Pow's exponent.
  uint32_t fp32Operands = 0;
  // Operands that are state the op updates, not trained (BatchNorm's running statistics).
  uint32_t stateOperands = 0;
  // Float operands no gradient flows into (the losses' class weights, as in PyTorch).
  uint32_t noGradOperands = 0;
  // Optional results the gradient rule reads (Dropout's mask, MaxPool's Indices): autodiff
  // adds them when the model left them out.
  int gradResults = 0;
  bool loss = false;            // a loss: FP32, and so is its value
  // Floating-point operations of one execution (for the report's FLOP share); null: one per
  // output element.
  double (*flops)(const Node&) = nullptr;
  // Elementwise: result 0's element k reads only element k of each input, so result 0 may take
  // the bytes of an input of its dtype and size that nothing reads afterwards (memory planning).
  bool inplace = false;
  // A view: result 0 is input 0's bytes under another shape (Reshape, Flatten, Squeeze, Unsqueeze,
  // Identity), so memory planning gives it input 0's bytes and the backends copy nothing.
  bool view = false;
  // The gradient rule of a differentiable op (compiler/ops/grad_*.cpp).
  GradFn grad = nullptr;
  // The scalar formula of an elementwise op (compiler/ops/pointwise.h): such ops fuse into
  // generated kernels (passes/fuse_elementwise.cpp).
  PwFormula pointwise = nullptr;
  // ONNX ops: the attributes the op's rules read, space-separated. Each value of each is
  // reproduced, or refused by the rules naming the node. Import refuses any other attribute,
  // naming the node: an attribute ampc does not read would be a silently wrong answer.
  std::string_view attrs = {};
};

// Whether `name` is in `attrs`, an OpDef::attrs list.
bool attributeTaken(std::string_view attrs, std::string_view name);

// FLOPs of a node: its row's estimate, else one per output element.
double nodeFlops(const Node& n);

// On a node an import lowering writes (the MatMul or Conv of a DFT or STFT, fake quantization's
// arithmetic): autocast runs it in FP32 whatever its category, as PyTorch computes its FFTs in the
// input's precision, not lowered, and quantization steps need every bit of x / scale.
inline constexpr const char* kKeepFp32 = "ampc_fp32";

// The newest opset the registry covers, and the oldest.
inline constexpr int kMinOpset = 13;
// Opset 24 (ONNX 1.19) changed no op that ampc runs, besides types it does not have (float8e8m0;
// bf16 for TopK and SplitToSequence, which it takes) and Attention's in-place KV cache (refused at
// import); it added Swish (a composition at import) and TensorScatter (unsupported).
inline constexpr int kMaxOpset = 24;

// The row for (domain, op) at `opset`, or null (unknown op, or outside its opset range).
const OpDef* lookupOp(std::string_view domain, std::string_view op, int opset);
// Every row.
const std::vector<OpDef>& allOps();

// Runs the node's shape rule and returns the result types. Error for unknown ops and bad shapes.
std::vector<TensorType> inferTypes(const Node& n);

// A ScatterElements / ScatterND node `n` with reduction 'none' over `data`: the first two updates
// that the indices `idx` send to one element (ScatterND: one slice); ONNX leaves which lands
// undefined. nullopt: none do (or another reduction).
std::optional<std::pair<int64_t, int64_t>> scatterWritesTwice(const Node& n, const TensorType& data, const Tensor& idx);
std::string scatterWritesTwiceMessage(std::pair<int64_t, int64_t> updates);

// Shared shape helpers.
std::vector<int64_t> broadcastShapes(const InferContext& c, const std::vector<int64_t>& a, const std::vector<int64_t>& b);

}  // namespace ampc
