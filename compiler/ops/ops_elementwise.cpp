// Elementwise ops: unary math and activations, broadcasting binary ops, comparisons and logic,
// Where, Clip, Dropout.
#include "compiler/ops/families.h"
#include "compiler/ops/pointwise.h"
#include "compiler/target.h"

namespace ampc {

namespace {

void requireFloat(InferContext& c, size_t i) {
  if (!isFloat(c.in(i).dtype)) c.fail("input " + std::to_string(i) + " must be a float tensor, got " + c.in(i).str());
}

void requireSameDType(InferContext& c, size_t a, size_t b) {
  if (c.in(a).dtype != c.in(b).dtype)
    c.fail("inputs " + std::to_string(a) + " and " + std::to_string(b) + " must have the same dtype, got " +
           c.in(a).str() + " and " + c.in(b).str());
}

// Float unary ops: Y has X's type.
void inferUnaryFloat(InferContext& c) {
  requireFloat(c, 0);
  c.setOut(0, c.in(0));
}

// Unary ops over any numeric type (Neg, Abs, Relu, Identity).
void inferUnaryAny(InferContext& c) { c.setOut(0, c.in(0)); }

void inferSoftmax(InferContext& c) {
  requireFloat(c, 0);
  c.axis(c.node().getInt("axis", -1), c.in(0).rank());
  c.setOut(0, c.in(0));
}

void inferClip(InferContext& c) {
  for (size_t i = 1; i < 3; ++i) {
    if (!c.hasInput(i)) continue;
    requireSameDType(c, 0, i);
    if (c.in(i).rank() != 0) c.fail("min and max must be scalars");
  }
  c.setOut(0, c.in(0));
}

// Binary numpy-broadcasting ops whose operands share a dtype; result dtype `out` or the operands'.
void inferBinary(InferContext& c, std::optional<DType> out) {
  requireSameDType(c, 0, 1);
  c.setOut(0, TensorType{out.value_or(c.in(0).dtype), broadcastShapes(c, c.in(0).shape, c.in(1).shape)});
}
void inferArith(InferContext& c) { inferBinary(c, std::nullopt); }
void inferCompare(InferContext& c) { inferBinary(c, DType::boolean); }
void inferLogic(InferContext& c) {
  for (size_t i = 0; i < c.numInputs(); ++i)
    if (c.in(i).dtype != DType::boolean) c.fail("input " + std::to_string(i) + " must be bool, got " + c.in(i).str());
  if (c.numInputs() == 1) c.setOut(0, c.in(0));
  else inferBinary(c, DType::boolean);
}
void inferPRelu(InferContext& c) {  // the slope broadcasts to X (unidirectionally)
  requireFloat(c, 0);
  requireSameDType(c, 0, 1);
  auto s = broadcastShapes(c, c.in(0).shape, c.in(1).shape);
  c.check(s == c.in(0).shape, "slope " + c.in(1).str() + " must broadcast to X " + c.in(0).str());
  c.setOut(0, c.in(0));
}
void inferMod(InferContext& c) {
  inferBinary(c, std::nullopt);
  if (isFloat(c.in(0).dtype)) c.check(c.node().getInt("fmod", 0) != 0, "a float Mod needs fmod = 1");
}
// RandomUniformLike, RandomNormalLike, Bernoulli: the input's shape, dtype `dtype` or the input's.
void inferRandomLike(InferContext& c) {
  DType t = c.in(0).dtype;
  if (c.node().hasAttr("dtype")) {
    auto d = dtypeFromOnnx(static_cast<int>(c.node().getInt("dtype", 0)));
    c.check(d.has_value(), "dtype names a type ampc does not support");
    t = *d;
  }
  if (c.node().op() == "Bernoulli") requireFloat(c, 0);
  else c.check(isFloat(t), "the result must be a float type, got " + std::string(dtypeName(t)));
  c.setOut(0, TensorType{t, c.in(0).shape});
}
void inferPow(InferContext& c) {
  if (!isFloat(c.in(0).dtype) && !isInteger(c.in(0).dtype)) c.fail("base must be numeric");
  c.setOut(0, TensorType{c.in(0).dtype, broadcastShapes(c, c.in(0).shape, c.in(1).shape)});
}
void inferVariadic(InferContext& c) {  // Max, Min
  std::vector<int64_t> s = c.in(0).shape;
  for (size_t i = 1; i < c.numInputs(); ++i) {
    requireSameDType(c, 0, i);
    s = broadcastShapes(c, s, c.in(i).shape);
  }
  c.setOut(0, TensorType{c.in(0).dtype, s});
}
void inferIsNaN(InferContext& c) {
  requireFloat(c, 0);
  c.setOut(0, TensorType{DType::boolean, c.in(0).shape});
}
void inferWhere(InferContext& c) {
  if (c.in(0).dtype != DType::boolean) c.fail("condition must be bool, got " + c.in(0).str());
  requireSameDType(c, 1, 2);
  auto s = broadcastShapes(c, c.in(0).shape, broadcastShapes(c, c.in(1).shape, c.in(2).shape));
  c.setOut(0, TensorType{c.in(1).dtype, s});
}
void inferDropout(InferContext& c) {
  requireFloat(c, 0);
  if (c.hasInput(1) && !isFloat(c.in(1).dtype)) c.fail("ratio must be a float scalar");
  if (c.hasInput(2) && c.in(2).dtype != DType::boolean) c.fail("training_mode must be a bool scalar");
  c.setOut(0, c.in(0));
  if (c.numOutputs() > 1) c.setOut(1, TensorType{DType::boolean, c.in(0).shape});
}

void inferTargetDropout(InferContext& c) {
  inferDropout(c);
  c.check(c.hasInput(3), "input 3, the residual, is required");
  c.check(c.in(3).dtype == DType::f32 && c.in(3).shape == c.in(0).shape, "the residual must be f32 of X's shape, got " + c.in(3).str());
  c.setOut(0, c.in(3));
}

constexpr auto A = AmpCategory::Allow;
constexpr auto D = AmpCategory::Deny;
constexpr auto I = AmpCategory::Infer;
constexpr auto C = AmpCategory::Clear;
constexpr int L = kMinOpset, H = kMaxOpset;

}  // namespace

void registerElementwiseOps(std::vector<OpDef>& t) {
  (void)A;
  auto row = [&](std::string_view name, int since, int minIn, int maxIn, int minOut, int maxOut, AmpCategory amp,
                 bool diff, ShapeFn f) { t.push_back(OpDef{name, "", since, H, minIn, maxIn, minOut, maxOut, amp, diff, f}); };
  // name            since  in    out   amp diff  shape rule
  row("Sqrt", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Reciprocal", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Exp", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Log", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Tanh", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Sigmoid", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Erf", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Sin", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Cos", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  // The rest of the trigonometric and hyperbolic family; FP32 where PyTorch's autocast runs them
  // in FP32 (tan, asin, acos, sinh, cosh), the input's precision otherwise.
  row("Tan", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Asin", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Acos", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Atan", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Sinh", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Cosh", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("Asinh", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Acosh", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Atanh", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("HardSigmoid", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("HardSwish", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Elu", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Selu", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Celu", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Mish", 18, 1, 1, 1, 1, I, true, inferUnaryFloat);
  // x / (1 + |x|). Its formula is its CUDA support: the CUDA target runs it as a generated kernel
  // (runtime/lower.cpp), with no hand-written lowering.
  row("Softsign", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  t.back().pointwise = [](PwBuilder& b, const Node&, const std::vector<PwValue>& in) {
    const PwValue x = in[0], neg = b.compare(PwCmp::Lt, x, b.k(0));
    return b.div(x, b.add(b.k(1), b.select(neg, b.math(PwMath::Neg, x), x)));
  };
  // Piecewise constant: zero gradient almost everywhere, as PyTorch gives.
  row("Floor", L, 1, 1, 1, 1, I, false, inferUnaryFloat);
  row("Ceil", L, 1, 1, 1, 1, I, false, inferUnaryFloat);
  row("Round", L, 1, 1, 1, 1, I, false, inferUnaryFloat);
  row("Sign", L, 1, 1, 1, 1, I, false, inferUnaryAny);
  row("PRelu", L, 2, 2, 1, 1, I, true, inferPRelu);
  // Differentiable in both operands (PyTorch's fmod and remainder): a gradient of zero would be a
  // silently wrong answer.
  row("Mod", L, 2, 2, 1, 1, I, true, inferMod);
  row("Gelu", 20, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Softplus", L, 1, 1, 1, 1, D, true, inferUnaryFloat);
  row("LeakyRelu", L, 1, 1, 1, 1, I, true, inferUnaryFloat);
  row("Relu", L, 1, 1, 1, 1, I, true, inferUnaryAny);
  row("Neg", L, 1, 1, 1, 1, I, true, inferUnaryAny);
  row("Abs", L, 1, 1, 1, 1, I, true, inferUnaryAny);
  row("Identity", L, 1, 1, 1, 1, C, true, inferUnaryAny);
  row("Softmax", L, 1, 1, 1, 1, D, true, inferSoftmax);
  row("LogSoftmax", L, 1, 1, 1, 1, D, true, inferSoftmax);
  row("Clip", L, 1, 3, 1, 1, I, true, inferClip);
  row("Add", L, 2, 2, 1, 1, I, true, inferArith);
  row("Sub", L, 2, 2, 1, 1, I, true, inferArith);
  row("Mul", L, 2, 2, 1, 1, I, true, inferArith);
  row("Div", L, 2, 2, 1, 1, I, true, inferArith);
  row("Pow", L, 2, 2, 1, 1, D, true, inferPow);
  t.back().fp32Operands = 0b10;  // exponent
  row("Max", L, 1, -1, 1, 1, I, true, inferVariadic);
  row("Min", L, 1, -1, 1, 1, I, true, inferVariadic);
  row("Where", L, 3, 3, 1, 1, I, true, inferWhere);
  row("Equal", L, 2, 2, 1, 1, I, false, inferCompare);
  row("Less", L, 2, 2, 1, 1, I, false, inferCompare);
  row("LessOrEqual", L, 2, 2, 1, 1, I, false, inferCompare);
  row("Greater", L, 2, 2, 1, 1, I, false, inferCompare);
  row("GreaterOrEqual", L, 2, 2, 1, 1, I, false, inferCompare);
  row("Not", L, 1, 1, 1, 1, C, false, inferLogic);
  row("And", L, 2, 2, 1, 1, C, false, inferLogic);
  row("Or", L, 2, 2, 1, 1, C, false, inferLogic);
  row("IsNaN", L, 1, 1, 1, 1, I, false, inferIsNaN);
  row("IsInf", L, 1, 1, 1, 1, I, false, inferIsNaN);
  // Random draws on Dropout's Philox stream, keyed by (seed, step, node): the same numbers on every
  // backend, and regenerated identically for a resumed run.
  for (const char* op : {"RandomUniformLike", "RandomNormalLike", "Bernoulli"}) {
    row(op, op[0] == 'B' ? 15 : L, 1, 1, 1, 1, C, false, inferRandomLike);
    t.back().random = true;
    t.back().dtypeAttr = "dtype";
  }
  row("Dropout", L, 1, 3, 1, 2, I, true, inferDropout);
  // The ops whose result 0 may overwrite a same-sized input (memory planning): elementwise ones.
  for (std::string_view name : {"Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
                                "Celu", "Mish", "Softsign", "Floor", "Ceil", "Round", "Sign", "PRelu", "Mod", "Gelu", "Softplus", "LeakyRelu", "Relu",
                                "Neg", "Abs", "Identity", "Clip", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Where", "Dropout"})
    for (OpDef& d : t)
      if (d.name == name) d.inplace = true;
  for (OpDef& d : t)
    if (d.domain.empty() && d.name == "Identity") d.view = true;
  t.back().random = true;
  t.back().fp32Operands = 0b10;  // ratio
  t.back().gradResults = 2;      // the mask
  // cuda::Dropout (passes/fuse_dropout_residual.cpp): Dropout's operands and an f32 residual r;
  // result 0 is r + the dropped X widened to f32.
  // Its ratio and training_mode may be absent (ONNX's defaults), as Dropout's.
  t.push_back(OpDef{"Dropout", kCudaDomain, 1, 1, 1, 4, 1, 2, I, false, inferTargetDropout});
  t.back().random = true;
}

}  // namespace ampc
