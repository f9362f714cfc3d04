// Shape and type inference for every registry op: broadcasting, negative axes, attribute-vs-input
// forms across opsets, multi-output ops, and the errors bad shapes and dtypes give.
#include <gtest/gtest.h>

#include <set>

#include "compiler/ir/text.h"
#include "compiler/ops/registry.h"

using namespace ampc;

namespace {

struct Case {
  int opset;
  const char* decls;  // input/param/const lines of the text form
  int outs;           // number of results
  const char* call;   // the node: Op(%a, ...) {attrs}
  const char* expect; // "f32[2,3]; bool[2,3]" or "error: substring"
};

// Builds the graph, runs the last node's shape rule, and returns "t0; t1" or "error: msg".
std::string inferCase(const Case& c, std::string& op) {
  std::string text = "graph \"t\" opset " + std::to_string(c.opset) + " {\n" + c.decls + "\n  ";
  for (int i = 0; i < c.outs; ++i) text += (i ? ", " : "") + std::string("%out") + std::to_string(i) + " : f32[]";
  text += std::string(" = ") + c.call + "\n  output %out0\n}\n";
  auto g = parseGraph(text, "case");
  const Node& n = *g->nodes().back();
  op = n.op();
  try {
    auto types = inferTypes(n);
    std::string r;
    for (size_t i = 0; i < types.size(); ++i) r += (i ? "; " : "") + types[i].str();
    return r;
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
}

const Case kCases[] = {
    // Unary float ops keep the type.
    {17, "input %x : f32[2,3]", 1, "Sqrt(%x)", "f32[2,3]"},
    {17, "input %x : f16[2,3]", 1, "Reciprocal(%x)", "f16[2,3]"},
    {17, "input %x : bf16[4]", 1, "Exp(%x)", "bf16[4]"},
    {17, "input %x : f64[]", 1, "Log(%x)", "f64[]"},
    {17, "input %x : f32[5]", 1, "Tanh(%x)", "f32[5]"},
    {17, "input %x : f32[5]", 1, "Sigmoid(%x)", "f32[5]"},
    {17, "input %x : f32[5]", 1, "Erf(%x)", "f32[5]"},
    {20, "input %x : f32[5]", 1, "Gelu(%x) {approximate = \"tanh\"}", "f32[5]"},
    {17, "input %x : f32[5]", 1, "Gelu(%x)", "error: "},  // Gelu is opset 20+
    {17, "input %x : f32[5]", 1, "Softplus(%x)", "f32[5]"},
    {17, "input %x : f32[5]", 1, "LeakyRelu(%x) {alpha = 0.1}", "f32[5]"},
    {17, "input %x : i32[5]", 1, "Relu(%x)", "i32[5]"},
    {17, "input %x : i64[5]", 1, "Neg(%x)", "i64[5]"},
    {17, "input %x : f32[5]", 1, "Abs(%x)", "f32[5]"},
    {17, "input %x : bool[5]", 1, "Identity(%x)", "bool[5]"},
    {17, "input %x : i64[5]", 1, "Exp(%x)", "error: input 0 must be a float tensor"},
    {17, "input %x : f32[2,3,4]", 1, "Softmax(%x) {axis = -1}", "f32[2,3,4]"},
    {17, "input %x : f32[2,3,4]", 1, "LogSoftmax(%x) {axis = -3}", "f32[2,3,4]"},
    {17, "input %x : f32[2,3,4]", 1, "Softmax(%x) {axis = 3}", "error: axis 3 is out of range for rank 3"},
    {17, "input %x : f32[2,3]\n const %lo : f32[] = [0.0]\n const %hi : f32[] = [6.0]", 1, "Clip(%x, %lo, %hi)", "f32[2,3]"},
    {17, "input %x : f32[2,3]\n const %hi : f32[] = [6.0]", 1, "Clip(%x, _, %hi)", "f32[2,3]"},
    {17, "input %x : f32[2,3]\n const %lo : f32[1] = [0.0]", 1, "Clip(%x, %lo)", "error: min and max must be scalars"},
    // Broadcasting binary ops.
    {17, "input %a : f32[2,1,4]\n input %b : f32[3,1]", 1, "Add(%a, %b)", "f32[2,3,4]"},
    {17, "input %a : f32[]\n input %b : f32[3,1]", 1, "Sub(%a, %b)", "f32[3,1]"},
    {17, "input %a : f16[5,1]\n input %b : f16[1,6]", 1, "Mul(%a, %b)", "f16[5,6]"},
    {17, "input %a : i64[2,3]\n input %b : i64[3]", 1, "Div(%a, %b)", "i64[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : f32[4]", 1, "Div(%a, %b)", "error: shapes [2,3] and [4] do not broadcast"},
    {17, "input %a : f32[2,3]\n input %b : f16[2,3]", 1, "Add(%a, %b)", "error: inputs 0 and 1 must have the same dtype, got f32[2,3] and f16[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : i64[]", 1, "Pow(%a, %b)", "f32[2,3]"},
    {17, "input %a : f32[2,1]\n input %b : f32[3]\n input %c : f32[1,1]", 1, "Max(%a, %b, %c)", "f32[2,3]"},
    {17, "input %a : f32[4]", 1, "Min(%a)", "f32[4]"},
    {17, "input %c : bool[2,1]\n input %a : f32[3]\n input %b : f32[]", 1, "Where(%c, %a, %b)", "f32[2,3]"},
    {17, "input %c : f32[2,1]\n input %a : f32[3]\n input %b : f32[]", 1, "Where(%c, %a, %b)", "error: condition must be bool"},
    {17, "input %a : i64[2,3]\n input %b : i64[3]", 1, "Equal(%a, %b)", "bool[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : f32[]", 1, "Less(%a, %b)", "bool[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : f32[]", 1, "LessOrEqual(%a, %b)", "bool[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : f32[]", 1, "Greater(%a, %b)", "bool[2,3]"},
    {17, "input %a : f32[2,3]\n input %b : f32[]", 1, "GreaterOrEqual(%a, %b)", "bool[2,3]"},
    {17, "input %a : bool[4]", 1, "Not(%a)", "bool[4]"},
    {17, "input %a : bool[4]\n input %b : bool[1]", 1, "And(%a, %b)", "bool[4]"},
    {17, "input %a : bool[4]\n input %b : bool[4]", 1, "Or(%a, %b)", "bool[4]"},
    {17, "input %a : f32[4]\n input %b : bool[4]", 1, "Or(%a, %b)", "error: input 0 must be bool"},
    {17, "input %a : f16[4]", 1, "IsNaN(%a)", "bool[4]"},
    {17, "input %a : f32[4]", 1, "IsInf(%a)", "bool[4]"},
    {17, "input %x : f32[4,8]\n const %p : f32[] = [0.1]\n const %t : bool[] = [1]", 2, "Dropout(%x, %p, %t)", "f32[4,8]; bool[4,8]"},
    {17, "input %x : f32[4,8]", 1, "Dropout(%x)", "f32[4,8]"},
    // GEMMs.
    {17, "input %a : f32[2,1,3,4]\n input %b : f32[5,4,6]", 1, "MatMul(%a, %b)", "f32[2,5,3,6]"},
    {17, "input %a : f32[4]\n input %b : f32[3,4,6]", 1, "MatMul(%a, %b)", "f32[3,6]"},
    {17, "input %a : f32[3,4]\n input %b : f32[4]", 1, "MatMul(%a, %b)", "f32[3]"},
    {17, "input %a : f32[3,4]\n input %b : f32[5,6]", 1, "MatMul(%a, %b)", "error: inner dimensions differ"},
    {17, "input %a : f16[3,4]\n input %b : f32[4,6]", 1, "MatMul(%a, %b)", "error: inputs 0 and 1 must have the same dtype"},
    {17, "input %a : f32[4,3]\n input %b : f32[5,4]\n input %c : f32[5]", 1, "Gemm(%a, %b, %c) {transA = 1, transB = 1}", "f32[3,5]"},
    {17, "input %a : f32[3,4]\n input %b : f32[4,5]", 1, "Gemm(%a, %b)", "f32[3,5]"},
    {17, "input %a : f32[3,4]\n input %b : f32[4,5]\n input %c : f32[2,5]", 1, "Gemm(%a, %b, %c)", "error: "},
    // Convolution and pooling.
    {17, "input %x : f32[2,8,32,32]\n param %w : f32[16,4,3,3]\n param %b : f32[16]", 1,
     "Conv(%x, %w, %b) {group = 2, pads = [1, 1, 1, 1], strides = [2, 2]}", "f32[2,16,16,16]"},
    {17, "input %x : f32[2,4,20]\n param %w : f32[6,4,5]", 1, "Conv(%x, %w) {dilations = [2], pads = [0, 0]}", "f32[2,6,12]"},
    {17, "input %x : f32[1,3,7,7]\n param %w : f32[5,3,3,3]", 1, "Conv(%x, %w) {auto_pad = \"SAME_UPPER\", strides = [2, 2]}", "f32[1,5,4,4]"},
    {17, "input %x : f32[1,3,7,7]\n param %w : f32[5,2,3,3]", 1, "Conv(%x, %w)", "error: W f32[5,2,3,3] expects 2 input channels, X has 3"},
    {17, "input %x : f32[1,3,9,9]", 2, "MaxPool(%x) {ceil_mode = 1, kernel_shape = [2, 2], strides = [2, 2]}", "f32[1,3,5,5]; i64[1,3,5,5]"},
    {17, "input %x : f32[1,3,8,8]", 1, "MaxPool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}", "f32[1,3,4,4]"},
    {17, "input %x : f32[1,3,8,8]", 1, "AveragePool(%x) {kernel_shape = [2, 2], strides = [2, 2]}", "f32[1,3,4,4]"},
    {17, "input %x : f32[1,3,8,8]", 1, "AveragePool(%x)", "error: kernel_shape is required"},
    {17, "input %x : f16[2,64,7,7]", 1, "GlobalAveragePool(%x)", "f16[2,64,1,1]"},
    // Normalisation.
    {17, "input %x : f32[4,8,5,5]\n param %s : f32[8]\n param %b : f32[8]\n param %m : f32[8]\n param %v : f32[8]", 3,
     "BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}", "f32[4,8,5,5]; f32[8]; f32[8]"},
    {17, "input %x : f16[4,8]\n param %s : f32[8]\n param %b : f32[8]\n param %m : f32[8]\n param %v : f32[8]", 1,
     "BatchNormalization(%x, %s, %b, %m, %v)", "f16[4,8]"},
    {17, "input %x : f32[4,8]\n param %s : f32[7]\n param %b : f32[8]\n param %m : f32[8]\n param %v : f32[8]", 1,
     "BatchNormalization(%x, %s, %b, %m, %v)", "error: input 1 must have shape [8], got f32[7]"},
    {17, "input %x : f32[2,5,16]\n param %s : f32[16]\n param %b : f32[16]", 3, "LayerNormalization(%x, %s, %b) {axis = -1}",
     "f32[2,5,16]; f32[2,5,1]; f32[2,5,1]"},
    {17, "input %x : f16[2,5,16]\n param %s : f16[5,16]", 1, "LayerNormalization(%x, %s) {axis = 1}", "f16[2,5,16]"},
    // Reductions.
    {17, "input %x : f32[2,3,4]\n const %ax : i64[2] = [0, -1]", 1, "ReduceSum(%x, %ax) {keepdims = 0}", "f32[3]"},
    {17, "input %x : f32[2,3,4]", 1, "ReduceSum(%x)", "f32[1,1,1]"},
    {17, "input %x : f32[2,3,4]", 1, "ReduceSum(%x) {noop_with_empty_axes = 1}", "f32[2,3,4]"},
    {17, "input %x : f32[2,3,4]", 1, "ReduceMean(%x) {axes = [-2]}", "f32[2,1,4]"},
    {18, "input %x : f32[2,3,4]\n const %ax : i64[1] = [1]", 1, "ReduceMean(%x, %ax) {keepdims = 0}", "f32[2,4]"},
    {17, "input %x : f32[2,3,4]", 1, "ReduceMax(%x) {keepdims = 0}", "f32[]"},
    {18, "input %x : f16[2,3,4]\n const %ax : i64[0] = []", 1, "ReduceMin(%x, %ax) {noop_with_empty_axes = 1}", "f16[2,3,4]"},
    {17, "input %x : f32[2,3,4]", 1, "ReduceMin(%x) {axes = [5]}", "error: axis 5 is out of range for rank 3"},
    {17, "input %x : f32[2,3,4]\n input %ax : i64[1]", 1, "ReduceSum(%x, %ax)", "error: must be a compile-time constant"},
    {17, "input %x : f32[2,3,4]", 1, "ArgMax(%x) {axis = -1, keepdims = 0}", "i64[2,3]"},
    {17, "input %x : i64[2,3]\n const %ax : i64[] = [1]", 1, "CumSum(%x, %ax) {reverse = 1}", "i64[2,3]"},
    {17, "input %x : f16[2,7,3]\n const %k : i64[1] = [4]", 2, "TopK(%x, %k) {axis = 1}", "f16[2,4,3]; i64[2,4,3]"},
    {17, "input %x : f32[2,7]\n const %k : i64[1] = [8]", 2, "TopK(%x, %k)", "error: K 8 must be in [0, 7]"},
    {17, "input %x : f32[2,7]\n input %k : i64[1]", 2, "TopK(%x, %k)", "error: K must be a compile-time constant"},
    {17, "input %x : f32[2,3,5,6]\n input %g : f32[2,4,7,2]", 1, "GridSample(%x, %g) {mode = \"nearest\"}", "f32[2,3,4,7]"},
    {17, "input %x : f32[2,3,5,6]\n input %g : f32[2,4,7,2]", 1, "GridSample(%x, %g) {mode = \"bicubic\"}", "error: mode 'bicubic' is not supported"},
    {17, "input %x : f32[2,3,4,5,6]\n input %g : f32[2,4,7,8,3]", 1, "GridSample(%x, %g)", "error: only 2-d sampling is supported"},
    {17, "input %x : f32[2,3]\n const %ax : i64[] = [2]", 1, "CumSum(%x, %ax)", "error: axis 2 is out of range for rank 2"},
    {17, "input %x : f32[5,2,3,3]", 1, "Det(%x)", "f32[5,2]"},
    {17, "input %x : f16[4,4]", 1, "Det(%x)", "f16[]"},
    {17, "input %x : f32[2,3,4]", 1, "Det(%x)", "error: X must be [*, M, M] (square matrices), got f32[2,3,4]"},
    {17, "input %x : i64[2,2]", 1, "Det(%x)", "error: input 0 must be a float tensor, got i64[2,2]"},
    {17, "input %x : f32[2,3]\n input %ax : i64[]", 1, "CumSum(%x, %ax)", "error: axis must be a compile-time constant"},
    {17, "input %x : f16[4]", 1, "Sin(%x)", "f16[4]"},
    {17, "input %x : f32[4]", 1, "Cos(%x)", "f32[4]"},
    {22, "input %x : bf16[4]", 1, "Tan(%x)", "bf16[4]"},
    {17, "input %x : f16[2,3]", 1, "Asin(%x)", "f16[2,3]"},
    {17, "input %x : f32[4]", 1, "Acos(%x)", "f32[4]"},
    {17, "input %x : f64[4]", 1, "Atan(%x)", "f64[4]"},
    {17, "input %x : f32[]", 1, "Sinh(%x)", "f32[]"},
    {17, "input %x : f32[4]", 1, "Cosh(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Asinh(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Acosh(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Atanh(%x)", "f32[4]"},
    {17, "input %x : i64[4]", 1, "Atan(%x)", "error: input 0 must be a float tensor"},
    {17, "input %x : f16[4]", 1, "HardSigmoid(%x) {alpha = 0.3}", "f16[4]"},
    {17, "input %x : f32[4]", 1, "HardSwish(%x)", "f32[4]"},
    {17, "input %x : f16[2,3]", 1, "RandomUniformLike(%x) {dtype = 1}", "f32[2,3]"},
    {17, "input %x : bf16[2,3]", 1, "RandomNormalLike(%x)", "bf16[2,3]"},
    {17, "input %x : f32[5]", 1, "Bernoulli(%x)", "f32[5]"},
    {17, "input %x : i64[5]", 1, "RandomUniformLike(%x)", "error: the result must be a float type, got i64"},
    {17, "input %x : f32[4]", 1, "Elu(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Selu(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Celu(%x)", "f32[4]"},
    {18, "input %x : bf16[4]", 1, "Mish(%x)", "bf16[4]"},
    {22, "input %x : bf16[4]", 1, "Softsign(%x)", "bf16[4]"},
    {17, "input %x : f32[4]", 1, "Floor(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Ceil(%x)", "f32[4]"},
    {17, "input %x : f32[4]", 1, "Round(%x)", "f32[4]"},
    {17, "input %x : i64[4]", 1, "Sign(%x)", "i64[4]"},
    {17, "input %x : f32[2,3,4]\n param %s : f32[3,1]", 1, "PRelu(%x, %s)", "f32[2,3,4]"},
    {17, "input %x : f32[2,3]\n param %s : f32[2,3,4]", 1, "PRelu(%x, %s)", "error: shapes [2,3] and [2,3,4] do not broadcast"},
    {17, "input %a : i64[3]\n input %b : i64[1]", 1, "Mod(%a, %b)", "i64[3]"},
    {17, "input %a : f32[3]\n input %b : f32[3]", 1, "Mod(%a, %b)", "error: a float Mod needs fmod = 1"},
    {17, "input %x : i64[4]", 1, "Sin(%x)", "error: input 0 must be a float tensor"},
    {17, "input %x : f32[3,4]\n input %i : i64[3,2]", 1, "GatherElements(%x, %i) {axis = 1}", "f32[3,2]"},
    {17, "input %x : f32[3,4]\n input %i : i64[3]", 1, "GatherElements(%x, %i)", "error: indices i64[3] must have the data's rank 2"},
    {17, "input %x : f32[3,4,5]\n input %i : i64[2,2]", 1, "GatherND(%x, %i)", "f32[2,5]"},
    {17, "input %x : f32[3,4,5]\n input %i : i64[3,2,1]", 1, "GatherND(%x, %i) {batch_dims = 1}", "f32[3,2,5]"},
    {17, "input %x : f32[3,4]\n input %i : i64[2,3]", 1, "GatherND(%x, %i)", "error: the indices' last dim 3 must be in [1, data rank - batch_dims]"},
    {17, "input %x : f32[3,4]\n input %i : i64[2,4]\n input %u : f32[2,4]", 1, "ScatterElements(%x, %i, %u)", "f32[3,4]"},
    {17, "input %x : f32[3,4]\n input %i : i64[2,4]\n input %u : f32[2,3]", 1, "ScatterElements(%x, %i, %u) {axis = 1}",
     "error: updates f32[2,3] must have the indices' shape i64[2,4]"},
    {18, "input %x : f32[3,4]\n input %i : i64[2,4]\n input %u : f32[2,4]", 1, "ScatterElements(%x, %i, %u) {reduction = \"max\"}", "f32[3,4]"},
    {18, "input %x : f32[3,4]\n input %i : i64[2,4]\n input %u : f32[2,4]", 1, "ScatterElements(%x, %i, %u) {reduction = \"mul\"}",
     "error: reduction 'mul' is not supported (none, add, max and min are)"},
    {17, "input %x : f32[4,5,6]\n input %i : i64[3,2]\n input %u : f32[3,6]", 1, "ScatterND(%x, %i, %u) {reduction = \"add\"}", "f32[4,5,6]"},
    {17, "input %x : f32[4,5,6]\n input %i : i64[3,2]\n input %u : f32[3,5]", 1, "ScatterND(%x, %i, %u)", "error: updates f32[3,5] must have shape f32[3,6]"},
    {17, "input %x : f32[4,5]\n input %i : i64[3,1]\n input %u : f16[3,5]", 1, "ScatterND(%x, %i, %u)",
     "error: updates f16[3,5] must have the data's dtype f32[4,5]"},
    // Losses.
    {17, "input %s : f32[8,10]\n input %y : i64[8]", 2, "SoftmaxCrossEntropyLoss(%s, %y)", "f32[]; f32[8,10]"},
    {17, "input %s : f32[8,10,5]\n input %y : i64[8,5]", 1, "SoftmaxCrossEntropyLoss(%s, %y) {ignore_index = -100, reduction = \"none\"}", "f32[8,5]"},
    {17, "input %s : f32[8,10]\n input %y : i64[7]", 1, "SoftmaxCrossEntropyLoss(%s, %y)", "error: labels i64[7] do not match scores f32[8,10]"},
    {17, "input %s : f32[8,10]\n input %y : f32[8]", 1, "SoftmaxCrossEntropyLoss(%s, %y)", "error: labels must be i32 or i64"},
    {17, "input %s : f32[8,10]\n input %y : i64[8]\n param %w : f32[10]", 1, "NegativeLogLikelihoodLoss(%s, %y, %w) {reduction = \"sum\"}", "f32[]"},
    {17, "input %s : f32[8,10]\n input %y : i64[8]", 1, "NegativeLogLikelihoodLoss(%s, %y) {reduction = \"avg\"}", "error: unknown reduction 'avg'"},
    // Data movement.
    {17, "input %x : f32[2,3,4]\n const %s : i64[3] = [0, -1, 2]", 1, "Reshape(%x, %s)", "f32[2,6,2]"},
    {17, "input %x : f32[2,3,4]\n const %s : i64[2] = [5, -1]", 1, "Reshape(%x, %s)", "error: cannot infer -1"},
    {17, "input %x : f32[2,3,4]", 1, "Transpose(%x)", "f32[4,3,2]"},
    {17, "input %x : f32[2,3,4]", 1, "Transpose(%x) {perm = [1, 0, 2]}", "f32[3,2,4]"},
    {17, "input %x : f32[2,3,4]", 1, "Transpose(%x) {perm = [1, 1, 2]}", "error: perm is not a permutation"},
    {17, "input %a : f32[2,3]\n input %b : f32[2,5]", 1, "Concat(%a, %b) {axis = -1}", "f32[2,8]"},
    {17, "input %a : f32[2,3]\n input %b : f32[3,5]", 1, "Concat(%a, %b) {axis = 1}", "error: input 1 f32[3,5] differs off the concat axis"},
    {13, "input %x : f32[6,4]\n const %sp : i64[2] = [2, 4]", 2, "Split(%x, %sp)", "f32[2,4]; f32[4,4]"},
    {13, "input %x : f32[6,4]", 3, "Split(%x) {axis = 0}", "f32[2,4]; f32[2,4]; f32[2,4]"},
    {18, "input %x : f32[4,7]", 3, "Split(%x) {axis = -1, num_outputs = 3}", "f32[4,3]; f32[4,3]; f32[4,1]"},
    {17, "input %x : f32[10,8]\n const %st : i64[2] = [-3, 1]\n const %en : i64[2] = [100, -1]", 1, "Slice(%x, %st, %en)", "f32[3,6]"},
    {17, "input %x : f32[10,8]\n const %st : i64[1] = [-1]\n const %en : i64[1] = [-100]\n const %ax : i64[1] = [-2]\n const %sp : i64[1] = [-2]", 1,
     "Slice(%x, %st, %en, %ax, %sp)", "f32[5,8]"},
    {17, "input %x : f32[5,4,3]\n input %i : i64[2,2]", 1, "Gather(%x, %i) {axis = -2}", "f32[5,2,2,3]"},
    {17, "input %x : f32[5,4]\n const %i : i64[1] = [5]", 1, "Gather(%x, %i)", "error: index 5 is out of range"},
    {17, "input %x : f32[1,3,1,2]\n const %a : i64[1] = [-2]", 1, "Squeeze(%x, %a)", "f32[1,3,2]"},
    {17, "input %x : f32[1,3,1,2]", 1, "Squeeze(%x)", "f32[3,2]"},
    {17, "input %x : f32[1,3]\n const %a : i64[1] = [1]", 1, "Squeeze(%x, %a)", "error: cannot squeeze axis 1 of length 3"},
    {17, "input %x : f32[3,4]\n const %a : i64[2] = [0, -1]", 1, "Unsqueeze(%x, %a)", "f32[1,3,4,1]"},
    {17, "input %x : f32[3,1]\n const %s : i64[3] = [2, 1, 6]", 1, "Expand(%x, %s)", "f32[2,3,6]"},
    {17, "input %x : f32[2,3,4,5]", 1, "Flatten(%x) {axis = -1}", "f32[24,5]"},
    {17, "input %x : f32[2,3,4,5]", 1, "Flatten(%x) {axis = 0}", "f32[1,120]"},
    {17, "input %x : f32[2,3]\n const %p : i64[4] = [0, 1, 1, 2]", 1, "Pad(%x, %p)", "f32[3,6]"},
    {18, "input %x : f32[2,3]\n const %p : i64[2] = [1, 1]\n const %v : f32[] = [0.0]\n const %a : i64[1] = [-1]", 1,
     "Pad(%x, %p, %v, %a) {mode = \"reflect\"}", "f32[2,5]"},
    {17, "input %x : f32[2,3,4]", 1, "Shape(%x) {start = 1}", "i64[2]"},
    {17, "input %x : f32[2,3,4]", 1, "Shape(%x) {end = -1}", "i64[2]"},
    {17, "const %s : i64[2] = [3, 4]", 1, "ConstantOfShape(%s) {value = f16[1] [1.0]}", "f16[3,4]"},
    {17, "", 1, "Constant() {value_ints = [1, 2, 3]}", "i64[3]"},
    {17, "", 1, "Constant() {value = f32[2,2] [1.0, 2.0, 3.0, 4.0]}", "f32[2,2]"},
    {17, "const %a : i64[] = [2]\n const %b : i64[] = [11]\n const %d : i64[] = [3]", 1, "Range(%a, %b, %d)", "i64[3]"},
    {17, "const %a : f32[] = [1.0]\n const %b : f32[] = [0.0]\n const %d : f32[] = [-0.25]", 1, "Range(%a, %b, %d)", "f32[4]"},
    {17, "input %x : f32[2,3]\n const %r : i64[2] = [3, 2]", 1, "Tile(%x, %r)", "f32[6,6]"},
    {17, "input %x : f32[4,4]\n const %k : i64[] = [1]", 1, "Trilu(%x, %k) {upper = 0}", "f32[4,4]"},
    {17, "input %x : f32[2,3]", 1, "Cast(%x) {to = 10}", "f16[2,3]"},
    {17, "input %x : f32[2,3]", 1, "Cast(%x) {to = 8}", "error: 'to' names a dtype ampc does not support"},
    {17, "input %x : f32[2,3]\n input %y : bf16[]", 1, "CastLike(%x, %y)", "bf16[2,3]"},
    // int64 arithmetic that would wrap is refused, naming the node (issue 21: these compiled to
    // wrapped shapes such as f32[0,3,4]).
    {17, "input %x : f32[2,3]\n const %p : i64[4] = [9223372036854775807, 0, 1, 0]", 1, "Pad(%x, %p)", "error: overflows int64"},
    {17, "input %x : f32[2,3]\n const %p : i64[4] = [0, 0, -9223372036854775807, 0]", 1, "Pad(%x, %p)", "error: pads shrink axis"},
    {17, "input %x : f32[5,3]\n const %st : i64[1] = [4]\n const %en : i64[1] = [-9223372036854775807]\n const %ax : i64[1] = [0]\n"
         " const %sp : i64[1] = [-9223372036854775808]", 1, "Slice(%x, %st, %en, %ax, %sp)", "f32[1,3]"},
    {17, "input %x : f32[5,3]\n const %st : i64[1] = [0]\n const %en : i64[1] = [5]\n const %ax : i64[1] = [0]\n"
         " const %sp : i64[1] = [9223372036854775807]", 1, "Slice(%x, %st, %en, %ax, %sp)", "f32[1,3]"},
    {17, "input %x : f32[65536,65536]\n const %r : i64[2] = [65536, 65536]", 1, "Tile(%x, %r)", "error: more elements than fit"},
    {17, "input %x : f32[2,3]\n const %r : i64[2] = [4611686018427387904, 3]", 1, "Tile(%x, %r)", "error: overflows int64"},
    {17, "input %x : f32[2,3]\n const %s : i64[2] = [4611686018427387904, 4]", 1, "Reshape(%x, %s)", "error: overflows int64"},
    {17, "input %x : f32[7]\n const %s : i64[2] = [9223372036854775807, -9223372036854775800]", 2, "Split(%x, %s)", "error: split sizes must be non-negative"},
    {17, "input %x : f32[1,1,8,8]\n param %w : f32[1,1,3,3]", 1, "Conv(%x, %w) {dilations = [4611686018427387904, 1]}", "error: overflows int64"},
};

}  // namespace

TEST(ShapeInference, EveryCase) {
  std::set<std::string> covered;
  for (const Case& c : kCases) {
    std::string op;
    std::string got = inferCase(c, op);
    std::string want = c.expect;
    if (want.rfind("error: ", 0) == 0) {
      EXPECT_EQ(got.rfind("error: ", 0), 0u) << c.call << " should fail, inferred " << got;
      EXPECT_NE(got.find(want.substr(7)), std::string::npos) << c.call << ": " << got;
      EXPECT_NE(got.find("(" + op + ")"), std::string::npos) << "error does not name the op: " << got;
    } else {
      EXPECT_EQ(got, want) << c.call;
      covered.insert(op);
    }
  }
  // Every registry op has at least one passing case here.
  for (const OpDef& d : allOps())  // the "ampc" backward ops are covered by the gradient tests
    if (d.domain.empty()) EXPECT_TRUE(covered.count(std::string(d.name))) << "no shape case for " << d.name;
}

TEST(ShapeInference, OpsetRanges) {
  EXPECT_NE(lookupOp("", "Add", 13), nullptr);
  EXPECT_NE(lookupOp("", "Add", 24), nullptr);
  EXPECT_EQ(lookupOp("", "Add", 12), nullptr);
  EXPECT_EQ(lookupOp("", "Add", 25), nullptr);
  EXPECT_EQ(lookupOp("", "LayerNormalization", 16), nullptr);
  EXPECT_NE(lookupOp("ai.onnx", "Gelu", 20), nullptr);
  EXPECT_EQ(lookupOp("com.example", "Add", 17), nullptr);
  // Every row says its autocast category and differentiability.
  auto row = [](const char* op) { return lookupOp("", op, 17); };
  EXPECT_EQ(row("MatMul")->amp, AmpCategory::Allow);
  EXPECT_EQ(row("Softmax")->amp, AmpCategory::Deny);
  EXPECT_EQ(row("SoftmaxCrossEntropyLoss")->amp, AmpCategory::Deny);
  EXPECT_EQ(row("Add")->amp, AmpCategory::Infer);
  EXPECT_EQ(row("Reshape")->amp, AmpCategory::Clear);
  EXPECT_FALSE(row("Equal")->differentiable);
  EXPECT_FALSE(row("Shape")->differentiable);
  EXPECT_TRUE(row("Conv")->differentiable);
}
