// CPU kernels on random data (fresh every run), two ways:
//  1. Every registry op in f32, f16 and bf16 against the same graph evaluated in f64, within the
//     tolerances of METHOD.md (relative L2: f32 1e-5, f16 2e-3, bf16 1.6e-2; NaN never passes).
//  2. The numerically central kernels against naive f64 references written here, independently
//     of the kernels: broadcasting, negative axes, empty dims, Transpose feeding MatMul.
// (ONNX's own node tests check every kernel against NumPy too: tests/conformance.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "compiler/ir/text.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    uint64_t seed = std::random_device{}();
    std::printf("kernel_test seed %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return r;
}

struct Range {
  double lo = -2, hi = 2;
};

Tensor randomTensor(const TensorType& t, Range fr, int64_t ilo, int64_t ihi) {
  Tensor x(t);
  std::uniform_real_distribution<double> u(fr.lo, fr.hi);
  std::uniform_int_distribution<int64_t> ui(ilo, ihi);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (isFloat(t.dtype)) x.setDouble(i, u(rng()));
    else if (t.dtype == DType::boolean) x.setInt(i, ui(rng()) & 1);
    else x.setInt(i, ui(rng()));
  }
  return x;
}

// Parses `text`, converts the graph's floats to `dt`, evaluates on the CPU backend, and returns
// the outputs widened to f64.
std::vector<Tensor> runAt(const std::string& text, const std::map<std::string, Tensor>& feeds, DType dt) {
  auto g = parseGraph(text, "case");
  PassManager pm;
  pm.add(createFoldConstantsPass());  // Shape -> ConstantOfShape needs its shape folded first
  pm.add(createConvertPrecisionPass(dt));
  pm.run(*g);
  std::map<std::string, Tensor> f;
  for (const auto& [k, v] : feeds) f.emplace(k, isFloat(v.type.dtype) ? cpu::castTensor(v, dt) : v);
  auto backend = createCpuBackend();
  ExecOptions opts;
  opts.seed = 7;
  auto outs = evaluate(*g, f, *backend, opts);
  for (auto& o : outs)
    if (isFloat(o.type.dtype)) o = cpu::castTensor(o, DType::f64);
  return outs;
}

double relL2(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.getDouble(i), w = want.getDouble(i);
    if (std::isnan(g) != std::isnan(w)) return INFINITY;
    if (std::isnan(w)) continue;
    num += (g - w) * (g - w);
    den += w * w;
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

struct Case {
  const char* text;     // a graph; its float inputs get random data
  Range range = {};     // for float inputs
  int64_t ilo = 0, ihi = 3;  // for integer inputs
};

std::string graph(const std::string& body) { return "graph \"k\" opset 20 {\n" + body + "\n}\n"; }

const Case kCases[] = {
    {"input %x : f32[3,5]\n %y : f32[3,5] = Sqrt(%x)\n output %y", {0.1, 4}},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Reciprocal(%x)\n output %y", {0.5, 3}},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Exp(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Log(%x)\n output %y", {0.1, 5}},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Tanh(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Sigmoid(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Erf(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Softplus(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Gelu(%x)\n %z : f32[3,5] = Gelu(%x) {approximate = \"tanh\"}\n output %y\n output %z"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = LeakyRelu(%x) {alpha = 0.2}\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Relu(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Neg(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Abs(%x)\n output %y"},
    {"input %x : f32[3,5]\n %y : f32[3,5] = Identity(%x)\n output %y"},
    {"input %x : f32[2,3,5]\n %y : f32[2,3,5] = Softmax(%x) {axis = -2}\n output %y"},
    {"input %x : f32[2,3,5]\n %y : f32[2,3,5] = LogSoftmax(%x) {axis = 1}\n output %y"},
    {"input %x : f32[3,5]\n const %lo : f32[] = [-0.5]\n const %hi : f32[] = [0.7]\n %y : f32[3,5] = Clip(%x, %lo, %hi)\n output %y"},
    {"input %a : f32[2,1,4]\n input %b : f32[3,1]\n %y : f32[2,3,4] = Add(%a, %b)\n output %y"},
    {"input %a : f32[2,3,4]\n input %b : f32[4]\n %y : f32[2,3,4] = Sub(%a, %b)\n output %y"},
    {"input %a : f32[1,3,1]\n input %b : f32[2,1,4]\n %y : f32[2,3,4] = Mul(%a, %b)\n output %y"},
    {"input %a : f32[2,3]\n input %b : f32[3]\n %y : f32[2,3] = Div(%a, %b)\n output %y", {0.5, 2}},
    {"input %a : f32[2,3]\n input %b : f32[]\n %y : f32[2,3] = Pow(%a, %b)\n output %y", {0.5, 2}},
    {"input %a : f32[2,3]\n input %b : f32[3]\n input %c : f32[2,1]\n %y : f32[2,3] = Max(%a, %b, %c)\n output %y"},
    {"input %a : f32[2,3]\n input %b : f32[3]\n %y : f32[2,3] = Min(%a, %b)\n output %y"},
    {"input %c : bool[2,1]\n input %a : f32[3]\n input %b : f32[2,3]\n %y : f32[2,3] = Where(%c, %a, %b)\n output %y"},
    {"input %a : f32[4,5]\n input %b : f32[5]\n %y : bool[4,5] = Greater(%a, %b)\n %z : f32[4,5] = Cast(%y) {to = 1}\n output %z"},
    {"input %a : f32[4,5]\n %y : bool[4,5] = IsNaN(%a)\n %z : f32[4,5] = Cast(%y) {to = 1}\n output %z"},
    {"input %x : f32[6,8]\n const %p : f32[] = [0.25]\n const %t : bool[] = [1]\n %y : f32[6,8], %m : bool[6,8] = Dropout(%x, %p, %t)\n output %y"},
    {"input %a : f32[2,1,3,4]\n input %b : f32[5,4,6]\n %y : f32[2,5,3,6] = MatMul(%a, %b)\n output %y"},
    {"input %a : f32[4]\n input %b : f32[3,4,2]\n %y : f32[3,2] = MatMul(%a, %b)\n output %y"},
    {"input %a : f32[4,3]\n input %b : f32[5,4]\n input %c : f32[5]\n %y : f32[3,5] = Gemm(%a, %b, %c) {alpha = 0.5, beta = 2.0, transA = 1, transB = 1}\n output %y"},
    {"input %x : f32[2,4,7,7]\n input %w : f32[6,2,3,3]\n input %b : f32[6]\n %y : f32[2,6,4,4] = Conv(%x, %w, %b) {group = 2, pads = [1, 1, 1, 1], strides = [2, 2]}\n output %y"},
    {"input %x : f32[1,2,9]\n input %w : f32[3,2,3]\n %y : f32[1,3,5] = Conv(%x, %w) {dilations = [2], pads = [1, 0]}\n output %y"},
    {"input %x : f32[2,3,7,7]\n %y : f32[2,3,4,4], %i : i64[2,3,4,4] = MaxPool(%x) {ceil_mode = 1, kernel_shape = [3, 3], pads = [1, 1, 0, 0], strides = [2, 2]}\n output %y"},
    {"input %x : f32[2,3,7,7]\n %y : f32[2,3,4,4] = AveragePool(%x) {count_include_pad = 1, kernel_shape = [2, 2], pads = [1, 1, 1, 1], strides = [2, 2]}\n output %y"},
    {"input %x : f32[2,3,5,5]\n %y : f32[2,3,1,1] = GlobalAveragePool(%x)\n output %y"},
    {"input %x : f32[4,3,5]\n input %s : f32[3]\n input %b : f32[3]\n input %m : f32[3]\n input %v : f32[3]\n %y : f32[4,3,5], %rm : f32[3], %rv : f32[3] = BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}\n output %y\n output %rm\n output %rv", {0.2, 2}},
    {"input %x : f32[4,3,5]\n input %s : f32[3]\n input %b : f32[3]\n input %m : f32[3]\n input %v : f32[3]\n %y : f32[4,3,5] = BatchNormalization(%x, %s, %b, %m, %v)\n output %y", {0.2, 2}},
    {"input %x : f32[2,3,8]\n input %s : f32[8]\n input %b : f32[8]\n %y : f32[2,3,8], %mu : f32[2,3,1], %r : f32[2,3,1] = LayerNormalization(%x, %s, %b) {axis = -1}\n output %y"},
    {"input %x : f32[2,3,4]\n const %ax : i64[2] = [0, -1]\n %y : f32[3] = ReduceSum(%x, %ax) {keepdims = 0}\n output %y"},
    {"input %x : f32[2,3,4]\n const %ax : i64[1] = [-2]\n %y : f32[2,1,4] = ReduceMean(%x, %ax)\n output %y"},
    {"input %x : f32[2,3,4]\n %y : f32[] = ReduceMax(%x) {keepdims = 0}\n output %y"},
    {"input %x : f32[2,3,4]\n const %ax : i64[1] = [1]\n %y : f32[2,1,4] = ReduceMin(%x, %ax)\n output %y"},
    {"input %x : f32[2,3,4]\n %y : i64[2,4] = ArgMax(%x) {axis = -2, keepdims = 0}\n %z : f32[2,4] = Cast(%y) {to = 1}\n output %z"},
    {"input %x : f32[6,5,2]\n input %t : i64[6,2]\n input %w : f32[5]\n %l : f32[], %lp : f32[6,5,2] = SoftmaxCrossEntropyLoss(%x, %t, %w) {ignore_index = 1}\n output %l\n output %lp", {0.1, 2}, 0, 4},
    {"input %x : f32[6,5]\n input %t : i64[6]\n %l : f32[6] = NegativeLogLikelihoodLoss(%x, %t) {reduction = \"none\"}\n output %l", {-3, 0}, 0, 4},
    {"input %x : f32[2,3,4]\n const %s : i64[2] = [4, -1]\n %y : f32[4,6] = Reshape(%x, %s)\n output %y"},
    {"input %a : f32[2,3,4]\n input %b : f32[4,5]\n %t : f32[2,4,3] = Transpose(%a) {perm = [0, 2, 1]}\n %tb : f32[5,4] = Transpose(%b)\n %y : f32[2,3,5] = MatMul(%a, %b)\n %z : f32[2,5,3] = MatMul(%tb, %t)\n output %y\n output %z"},
    {"input %a : f32[2,3]\n input %b : f32[2,0]\n input %c : f32[2,2]\n %y : f32[2,5] = Concat(%a, %b, %c) {axis = -1}\n output %y"},
    {"input %x : f32[7,2]\n const %sp : i64[3] = [2, 0, 5]\n %a : f32[2,2], %b : f32[0,2], %c : f32[5,2] = Split(%x, %sp)\n output %a\n output %c"},
    {"input %x : f32[10,8]\n const %st : i64[2] = [-1, 1]\n const %en : i64[2] = [-100, 7]\n const %ax : i64[2] = [0, -1]\n const %sp : i64[2] = [-3, 2]\n %y : f32[4,3] = Slice(%x, %st, %en, %ax, %sp)\n output %y"},
    {"input %x : f32[5,4]\n const %i : i64[2,2] = [0, -1, 3, 2]\n %y : f32[5,2,2] = Gather(%x, %i) {axis = -1}\n output %y"},
    {"input %x : f32[1,3,1,2]\n const %a : i64[1] = [-2]\n %y : f32[1,3,2] = Squeeze(%x, %a)\n output %y"},
    {"input %x : f32[3,4]\n %s : f32[3,4] = Sin(%x)\n %c : f32[3,4] = Cos(%x)\n %y : f32[3,4] = Add(%s, %c)\n output %y", {-4, 4}},
    {"input %x : f32[3,4]\n %a : f32[3,4] = Tan(%x)\n %b : f32[3,4] = Asin(%x)\n %c : f32[3,4] = Acos(%x)\n %d : f32[3,4] = Atanh(%x)\n"
     " output %a\n output %b\n output %c\n output %d", {-0.9, 0.9}},
    {"input %x : f32[3,4]\n %a : f32[3,4] = Atan(%x)\n %b : f32[3,4] = Sinh(%x)\n %c : f32[3,4] = Cosh(%x)\n %d : f32[3,4] = Asinh(%x)\n"
     " output %a\n output %b\n output %c\n output %d", {-3, 3}},
    {"input %x : f32[3,4]\n %y : f32[3,4] = Acosh(%x)\n output %y", {1.1, 4}},
    {"input %x : f32[4,6]\n %a : f32[4,6] = HardSigmoid(%x) {alpha = 0.3, beta = 0.4}\n %b : f32[4,6] = HardSwish(%x)\n"
     " %c : f32[4,6] = Elu(%x) {alpha = 0.7}\n %d : f32[4,6] = Selu(%x)\n %e : f32[4,6] = Celu(%x) {alpha = 2.0}\n %f : f32[4,6] = Mish(%x)\n"
     " %g : f32[4,6] = Softsign(%x)\n output %a\n output %b\n output %c\n output %d\n output %e\n output %f\n output %g", {-5, 5}},
    {"input %x : f32[4,6]\n %a : f32[4,6] = Floor(%x)\n %b : f32[4,6] = Ceil(%x)\n %c : f32[4,6] = Round(%x)\n %d : f32[4,6] = Sign(%x)\n"
     " output %a\n output %b\n output %c\n output %d", {-5, 5}},
    {"input %x : f32[2,3,4]\n input %s : f32[3,1]\n %y : f32[2,3,4] = PRelu(%x, %s)\n output %y"},
    {"input %x : f32[6,7]\n %u : f32[6,7] = RandomUniformLike(%x) {high = 3.0, low = -1.0}\n %n : f32[6,7] = RandomNormalLike(%x) {mean = 1.0}\n"
     " %b : f32[6,7] = Bernoulli(%x)\n output %u\n output %n\n output %b", {0.05, 0.95}},
    {"input %a : f32[3,4]\n input %b : f32[4]\n %y : f32[3,4] = Mod(%a, %b) {fmod = 1}\n output %y", {0.5, 4}},
    {"input %a : i64[3,4]\n input %b : i64[4]\n %y : i64[3,4] = Mod(%a, %b)\n %f : f32[3,4] = Cast(%y) {to = 1}\n output %f", {}, -7, 7},
    {"input %x : f32[3,6,6]\n %y : f32[3] = Det(%x)\n output %y"},
    {"input %x : f32[3,5]\n const %a : i64[] = [1]\n %y : f32[3,5] = CumSum(%x, %a)\n %z : f32[3,5] = CumSum(%x, %a) {exclusive = 1, reverse = 1}\n output %y\n output %z", {0.5, 2}},
    {"input %x : f32[3,4]\n const %i : i64[3,2] = [0, 3, -1, 1, 2, 2]\n %y : f32[3,2] = GatherElements(%x, %i) {axis = 1}\n output %y"},
    {"input %x : f32[2,3,5,4]\n input %g : f32[2,3,2,2]\n %y : f32[2,3,3,2] = GridSample(%x, %g)\n"
     " %z : f32[2,3,3,2] = GridSample(%x, %g) {mode = \"nearest\", padding_mode = \"reflection\", align_corners = 1}\n output %y\n output %z"},
    {"input %x : f32[3,7,2]\n const %k : i64[1] = [3]\n %v : f32[3,3,2], %i : i64[3,3,2] = TopK(%x, %k) {axis = 1}\n %f : f32[3,3,2] = Cast(%i) {to = 1}\n"
     " const %k1 : i64[1] = [1]\n %w : f32[3,1,2], %j : i64[3,1,2] = TopK(%x, %k1) {axis = 1, largest = 0}\n output %v\n output %f\n output %w"},
    {"input %x : f32[3,4,5]\n const %i : i64[2,2] = [0, 1, 2, -1]\n %y : f32[2,5] = GatherND(%x, %i)\n const %j : i64[3,1] = [1, 0, 3]\n"
     " %z : f32[3,5] = GatherND(%x, %j) {batch_dims = 1}\n output %y\n output %z"},
    {"input %x : f32[3,4]\n input %u : f32[2,4]\n const %i : i64[2,4] = [0, 1, 2, 0, 2, 0, 1, 1]\n"
     " %y : f32[3,4] = ScatterElements(%x, %i, %u)\n %z : f32[3,4] = ScatterElements(%x, %i, %u) {reduction = \"add\"}\n output %y\n output %z"},
    {"input %x : f32[4,3]\n input %u : f32[2,3]\n const %i : i64[2,1] = [3, -3]\n %y : f32[4,3] = ScatterND(%x, %i, %u)\n"
     " const %j : i64[3,2] = [0, 1, 0, 1, 3, 2]\n input %v : f32[3]\n %z : f32[4,3] = ScatterND(%x, %j, %v) {reduction = \"add\"}\n output %y\n output %z"},
    {"input %x : f32[3,2]\n const %a : i64[2] = [0, -1]\n %y : f32[1,3,2,1] = Unsqueeze(%x, %a)\n output %y"},
    {"input %x : f32[3,1]\n const %s : i64[3] = [2, 1, 4]\n %y : f32[2,3,4] = Expand(%x, %s)\n output %y"},
    {"input %x : f32[2,3,4]\n %y : f32[6,4] = Flatten(%x) {axis = -1}\n output %y"},
    {"input %x : f32[3,4]\n const %p : i64[4] = [1, 2, 2, 3]\n %y : f32[6,9] = Pad(%x, %p) {mode = \"reflect\"}\n output %y"},
    {"input %x : f32[3,4]\n const %p : i64[4] = [0, 1, 2, -1]\n const %v : f32[] = [1.5]\n %y : f32[5,4] = Pad(%x, %p, %v)\n output %y"},
    {"input %x : f32[3,4]\n const %p : i64[4] = [2, 0, 1, 3]\n %y : f32[6,7] = Pad(%x, %p) {mode = \"edge\"}\n output %y"},
    {"input %x : f32[2,3]\n const %r : i64[2] = [2, 3]\n %y : f32[4,9] = Tile(%x, %r)\n output %y"},
    {"input %x : f32[2,4,4]\n const %k : i64[] = [-1]\n %y : f32[2,4,4] = Trilu(%x, %k) {upper = 0}\n output %y"},
    {"input %x : f32[3,4]\n %y : f64[3,4] = Cast(%x) {to = 11}\n %z : i32[3,4] = Cast(%x) {to = 6}\n %w : f32[3,4] = Cast(%z) {to = 1}\n output %y\n output %w"},
    {"input %x : f32[3,4]\n input %l : bf16[]\n %y : bf16[3,4] = CastLike(%x, %l)\n output %y"},
    {"input %x : f32[3,4]\n %s : i64[2] = Shape(%x)\n %c : f32[3,4] = ConstantOfShape(%s) {value = f32[1] [0.5]}\n %y : f32[3,4] = Add(%x, %c)\n output %y"},
    {"input %x : f32[5]\n %c : f32[5] = Constant() {value = f32[5] [1.0, 2.0, 3.0, 4.0, 5.0]}\n const %a : f32[] = [0.5]\n const %b : f32[] = [3.0]\n const %d : f32[] = [0.5]\n %r : f32[5] = Range(%a, %b, %d)\n %y : f32[5] = Mul(%x, %c)\n %z : f32[5] = Add(%y, %r)\n output %z"},
    {"input %x : bool[4]\n input %y : bool[4]\n %a : bool[4] = And(%x, %y)\n %o : bool[4] = Or(%a, %y)\n %n : bool[4] = Not(%o)\n %e : bool[4] = Equal(%n, %x)\n %f : f32[4] = Cast(%e) {to = 1}\n output %f"},
    {"input %x : f32[3,4]\n input %z : f32[4]\n %y : bool[3,4] = Less(%x, %z)\n %f : f32[3,4] = Cast(%y) {to = 1}\n output %f"},
    {"input %a : f32[3,4]\n input %b : f32[3,4]\n %l : bool[3,4] = LessOrEqual(%a, %b)\n %g : bool[3,4] = GreaterOrEqual(%a, %b)\n %o : bool[3,4] = Or(%l, %g)\n %f : f32[3,4] = Cast(%o) {to = 1}\n output %f"},
    {"input %x : f32[3,4]\n %y : bool[3,4] = IsInf(%x)\n %f : f32[3,4] = Cast(%y) {to = 1}\n output %f"},
    {"input %x : f32[3,0]\n input %b : f32[0]\n %y : f32[3,0] = Add(%x, %b)\n const %ax : i64[1] = [1]\n %s : f32[3] = ReduceSum(%y, %ax) {keepdims = 0}\n output %s"},
    {"input %a : f32[3,0]\n input %b : f32[0,4]\n %y : f32[3,4] = MatMul(%a, %b)\n output %y"},
};

}  // namespace

TEST(Kernels, EveryOpInLowPrecisionAgainstF64) {
  std::set<std::string> covered;
  for (const Case& c : kCases) {
    const std::string text = graph(c.text);
    SCOPED_TRACE(c.text);
    auto g = parseGraph(text, "case");
    for (const auto& n : g->nodes()) covered.insert(n->op());
    std::map<std::string, Tensor> feeds;
    for (const Value* v : g->inputs()) feeds.emplace(v->name(), randomTensor(v->type(), c.range, c.ilo, c.ihi));
    for (const auto& [dt, tol] : {std::pair{DType::f32, 1e-5}, {DType::f16, 2e-3}, {DType::bf16, 1.6e-2}}) {
      // Data exactly representable in the low type, so only the arithmetic's rounding is measured.
      std::map<std::string, Tensor> low;
      for (const auto& [k, v] : feeds) low.emplace(k, isFloat(v.type.dtype) ? cpu::castTensor(cpu::castTensor(v, dt), DType::f64) : v);
      auto want = runAt(text, low, DType::f64);
      auto got = runAt(text, low, dt);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].type.shape, want[i].type.shape);
        EXPECT_LE(relL2(got[i], want[i]), tol) << dtypeName(dt) << " output " << i;
      }
    }
  }
  for (const OpDef& d : allOps())  // the "ampc" backward ops are covered by the gradient tests
    if (d.domain.empty()) EXPECT_TRUE(covered.count(std::string(d.name))) << "no kernel case for " << d.name;
}

// ---- independent f64 references

namespace {

std::vector<double> values(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.getDouble(i);
  return v;
}

// Runs an f64 graph on random inputs; returns inputs (as doubles) and outputs.
struct Run {
  std::map<std::string, std::vector<double>> in;
  std::map<std::string, std::vector<int64_t>> ints;
  std::vector<std::vector<double>> out;
};
Run runF64(const std::string& body, Range r = {}, int64_t ilo = 0, int64_t ihi = 3) {
  const std::string text = graph(body);
  auto g = parseGraph(text, "ref");
  std::map<std::string, Tensor> feeds;
  Run run;
  for (const Value* v : g->inputs()) {
    Tensor t = randomTensor(v->type(), r, ilo, ihi);
    if (isFloat(v->type().dtype)) run.in[v->name()] = values(t);
    else run.ints[v->name()] = t.toInts();
    feeds.emplace(v->name(), std::move(t));
  }
  for (auto& o : runAt(text, feeds, DType::f64)) run.out.push_back(values(o));
  return run;
}

void expectClose(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << i;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(num / std::max(den, 1e-300)), tol);
}

}  // namespace

TEST(KernelReference, BatchedMatMulWithBroadcastAndTransposedOperand) {
  // y[b, i, j] = sum_k a[0, i, k] * bt[b, j, k] with bt fed through a Transpose (non-contiguous).
  auto r = runF64("input %a : f64[1,3,4]\n input %bt : f64[2,5,4]\n %b : f64[2,4,5] = Transpose(%bt) {perm = [0, 2, 1]}\n"
                  " %y : f64[2,3,5] = MatMul(%a, %b)\n output %y");
  const auto &a = r.in["a"], &bt = r.in["bt"];
  std::vector<double> want;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double s = 0;
        for (int k = 0; k < 4; ++k) s += a[i * 4 + k] * bt[(b * 5 + j) * 4 + k];
        want.push_back(s);
      }
  expectClose(r.out[0], want);
}

TEST(KernelReference, GemmTransposedWithBroadcastBias) {
  auto r = runF64("input %a : f64[4,3]\n input %b : f64[5,4]\n input %c : f64[1,5]\n"
                  " %y : f64[3,5] = Gemm(%a, %b, %c) {alpha = 0.5, beta = -1.5, transA = 1, transB = 1}\n output %y");
  std::vector<double> want;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 5; ++j) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += r.in["a"][k * 3 + i] * r.in["b"][j * 4 + k];
      want.push_back(0.5 * s - 1.5 * r.in["c"][j]);
    }
  expectClose(r.out[0], want);
}

TEST(KernelReference, ConvGroupedStridedPaddedDilated) {
  // N=2, C=4, H=W=8, M=6, groups=2, k=3x2, stride (2,1), dilation (1,2), pads (1,0,2,1).
  auto r = runF64("input %x : f64[2,4,8,8]\n input %w : f64[6,2,3,2]\n input %b : f64[6]\n"
                  " %y : f64[2,6,5,7] = Conv(%x, %w, %b) {dilations = [1, 2], group = 2, pads = [1, 0, 2, 1], strides = [2, 1]}\n output %y");
  const auto &x = r.in["x"], &w = r.in["w"], &b = r.in["b"];
  std::vector<double> want;
  for (int n = 0; n < 2; ++n)
    for (int m = 0; m < 6; ++m)
      for (int oh = 0; oh < 5; ++oh)
        for (int ow = 0; ow < 7; ++ow) {
          double s = b[m];
          const int g = m / 3;
          for (int ci = 0; ci < 2; ++ci)
            for (int kh = 0; kh < 3; ++kh)
              for (int kw = 0; kw < 2; ++kw) {
                const int ih = oh * 2 - 1 + kh, iw = ow - 0 + kw * 2;
                if (ih < 0 || ih >= 8 || iw < 0 || iw >= 8) continue;
                s += x[((n * 4 + g * 2 + ci) * 8 + ih) * 8 + iw] * w[((m * 2 + ci) * 3 + kh) * 2 + kw];
              }
          want.push_back(s);
        }
  expectClose(r.out[0], want);
}

TEST(KernelReference, PoolsWithPadding) {
  auto r = runF64("input %x : f64[1,2,5,5]\n %m : f64[1,2,3,3] = MaxPool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
                  " %a : f64[1,2,3,3] = AveragePool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n output %m\n output %a");
  const auto& x = r.in["x"];
  std::vector<double> wantMax, wantAvg;
  for (int c = 0; c < 2; ++c)
    for (int oh = 0; oh < 3; ++oh)
      for (int ow = 0; ow < 3; ++ow) {
        double mx = -INFINITY, sum = 0;
        int count = 0;
        for (int kh = 0; kh < 3; ++kh)
          for (int kw = 0; kw < 3; ++kw) {
            const int ih = oh * 2 - 1 + kh, iw = ow * 2 - 1 + kw;
            if (ih < 0 || ih >= 5 || iw < 0 || iw >= 5) continue;
            const double v = x[(c * 5 + ih) * 5 + iw];
            mx = std::max(mx, v);
            sum += v;
            ++count;
          }
        wantMax.push_back(mx);
        wantAvg.push_back(sum / count);  // count_include_pad = 0
      }
  expectClose(r.out[0], wantMax);
  expectClose(r.out[1], wantAvg);
}

// A window past the input under ceil_mode (Hugging Face's EfficientNet pools a 2 x 2 map with
// AvgPool2d(2560, ceil_mode=True)): one window, the mean (or max) of the map; with pads, padding
// counts where count_include_pad says so and taps past the padded input never do (PyTorch's divisor).
TEST(KernelReference, CeilModeWindowPastTheInput) {
  auto r = runF64("input %x : f64[2,3,2,3]\n %a : f64[2,3,1,1] = AveragePool(%x) {ceil_mode = 1, kernel_shape = [40, 40], strides = [40, 40]}\n"
                  " %m : f64[2,3,1,1] = MaxPool(%x) {ceil_mode = 1, kernel_shape = [6, 9], strides = [6, 9]}\n"
                  " %p : f64[2,3,1,1] = AveragePool(%x) {ceil_mode = 1, count_include_pad = 1, kernel_shape = [7, 7], pads = [1, 1, 1, 1], strides = [7, 7]}\n"
                  " output %a\n output %m\n output %p");
  const auto& x = r.in["x"];
  std::vector<double> mean, mx, padded;
  for (int pl = 0; pl < 6; ++pl) {
    double s = 0, m = -INFINITY;
    for (int i = 0; i < 6; ++i) s += x[pl * 6 + i], m = std::max(m, x[pl * 6 + i]);
    mean.push_back(s / 6);
    mx.push_back(m);
    padded.push_back(s / (4 * 5));  // the padded input is 4 x 5
  }
  expectClose(r.out[0], mean);
  expectClose(r.out[1], mx);
  expectClose(r.out[2], padded);
}

// Clip with crossed bounds is hi everywhere (ONNX's reference is numpy.clip; PyTorch's clamp too).
TEST(KernelReference, ClipWithCrossedBoundsIsTheUpperOne) {
  auto r = runF64("input %x : f64[16]\n const %lo : f64[] = [0.5]\n const %hi : f64[] = [-0.25]\n %y : f64[16] = Clip(%x, %lo, %hi)\n"
                  " const %lo2 : f64[] = [-0.25]\n const %hi2 : f64[] = [0.5]\n %z : f64[16] = Clip(%x, %lo2, %hi2)\n output %y\n output %z");
  std::vector<double> want(16, -0.25), inside;
  for (double v : r.in["x"]) inside.push_back(std::min(std::max(v, -0.25), 0.5));
  expectClose(r.out[0], want);
  expectClose(r.out[1], inside);
}

TEST(KernelReference, SoftmaxNegativeAxisAndLayerNorm) {
  auto r = runF64("input %x : f64[2,3,4]\n input %s : f64[4]\n input %b : f64[4]\n"
                  " %y : f64[2,3,4] = Softmax(%x) {axis = -2}\n"
                  " %z : f64[2,3,4] = LayerNormalization(%x, %s, %b) {axis = -1, epsilon = 0.001}\n output %y\n output %z");
  const auto& x = r.in["x"];
  std::vector<double> sm(24), ln(24);
  for (int a = 0; a < 2; ++a)
    for (int k = 0; k < 4; ++k) {
      double sum = 0;
      for (int j = 0; j < 3; ++j) sum += std::exp(x[(a * 3 + j) * 4 + k]);
      for (int j = 0; j < 3; ++j) sm[(a * 3 + j) * 4 + k] = std::exp(x[(a * 3 + j) * 4 + k]) / sum;
    }
  for (int row = 0; row < 6; ++row) {
    double mean = 0, var = 0;
    for (int k = 0; k < 4; ++k) mean += x[row * 4 + k] / 4;
    for (int k = 0; k < 4; ++k) var += (x[row * 4 + k] - mean) * (x[row * 4 + k] - mean) / 4;
    const double eps = 0.001f;  // attributes are f32
    for (int k = 0; k < 4; ++k) ln[row * 4 + k] = (x[row * 4 + k] - mean) / std::sqrt(var + eps) * r.in["s"][k] + r.in["b"][k];
  }
  expectClose(r.out[0], sm);
  expectClose(r.out[1], ln);
}

TEST(KernelReference, BatchNormTrainingStatistics) {
  auto r = runF64("input %x : f64[3,2,4]\n input %s : f64[2]\n input %b : f64[2]\n input %m : f64[2]\n input %v : f64[2]\n"
                  " %y : f64[3,2,4], %rm : f64[2], %rv : f64[2] = BatchNormalization(%x, %s, %b, %m, %v) {epsilon = 0.01, momentum = 0.8, training_mode = 1}\n"
                  " output %y\n output %rm\n output %rv", {0.1, 2});
  const auto& x = r.in["x"];
  std::vector<double> y(24), rm(2), rv(2);
  const double eps = 0.01f;  // attributes are f32
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) mean += x[(n * 2 + c) * 4 + i] / 12;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) var += std::pow(x[(n * 2 + c) * 4 + i] - mean, 2) / 12;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i)
        y[(n * 2 + c) * 4 + i] = (x[(n * 2 + c) * 4 + i] - mean) / std::sqrt(var + eps) * r.in["s"][c] + r.in["b"][c];
    const double mom = 0.8f;
    rm[c] = r.in["m"][c] * mom + mean * (1 - mom);
    rv[c] = r.in["v"][c] * mom + var * (1 - mom);
  }
  expectClose(r.out[0], y);
  expectClose(r.out[1], rm);
  expectClose(r.out[2], rv);
}

TEST(KernelReference, CrossEntropyWithWeightsAndIgnoreIndex) {
  auto r = runF64("input %x : f64[5,4]\n input %t : i64[5]\n input %w : f64[4]\n"
                  " %l : f64[] = SoftmaxCrossEntropyLoss(%x, %t, %w) {ignore_index = 2}\n output %l", {0.1, 2}, 0, 3);
  const auto &x = r.in["x"], &w = r.in["w"];
  const auto& t = r.ints["t"];
  double sum = 0, wsum = 0;
  for (int n = 0; n < 5; ++n) {
    if (t[n] == 2) continue;
    double lse = 0;
    for (int c = 0; c < 4; ++c) lse += std::exp(x[n * 4 + c]);
    sum += -(x[n * 4 + t[n]] - std::log(lse)) * w[t[n]];
    wsum += w[t[n]];
  }
  expectClose(r.out[0], {sum / wsum});
}

// Scatter max and min (indices repeated, so updates meet each other and the data) against a loop.
TEST(KernelReference, ScatterMaxAndMin) {
  auto r = runF64("input %x : f64[3,4]\n input %u : f64[3,4]\n const %i : i64[3,4] = [0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 0, 2]\n"
                  " %a : f64[3,4] = ScatterElements(%x, %i, %u) {reduction = \"max\"}\n"
                  " %b : f64[3,4] = ScatterElements(%x, %i, %u) {reduction = \"min\"}\n"
                  " input %v : f64[3,4]\n const %j : i64[3,1] = [2, 0, 2]\n %c : f64[3,4] = ScatterND(%x, %j, %v) {reduction = \"max\"}\n"
                  " output %a\n output %b\n output %c");
  const auto &x = r.in["x"], &u = r.in["u"], &v = r.in["v"];
  const int64_t idx[12] = {0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 0, 2}, rows[3] = {2, 0, 2};
  std::vector<double> a = x, b = x, c = x;
  for (int k = 0; k < 12; ++k) {
    const size_t at = static_cast<size_t>(idx[k] * 4 + k % 4);  // axis 0: the row from the index, the column its own
    a[at] = std::max(a[at], u[k]);
    b[at] = std::min(b[at], u[k]);
  }
  for (int k = 0; k < 3; ++k)
    for (int col = 0; col < 4; ++col) c[rows[k] * 4 + col] = std::max(c[rows[k] * 4 + col], v[k * 4 + col]);
  expectClose(r.out[0], a, 0);
  expectClose(r.out[1], b, 0);
  expectClose(r.out[2], c, 0);
  EXPECT_NE(a, x);  // some update won somewhere
}

TEST(KernelReference, ReduceGatherSliceWithNegativeAxes) {
  auto r = runF64("input %x : f64[3,4,5]\n const %ax : i64[2] = [-1, 0]\n %s : f64[4] = ReduceSum(%x, %ax) {keepdims = 0}\n"
                  " const %i : i64[3] = [-1, 0, -4]\n %g : f64[3,3,5] = Gather(%x, %i) {axis = -2}\n"
                  " const %st : i64[1] = [-1]\n const %en : i64[1] = [-6]\n const %sa : i64[1] = [-1]\n const %sp : i64[1] = [-2]\n"
                  " %sl : f64[3,4,3] = Slice(%x, %st, %en, %sa, %sp)\n output %s\n output %g\n output %sl");
  const auto& x = r.in["x"];
  auto at = [&](int a, int b, int c) { return x[(a * 4 + b) * 5 + c]; };
  std::vector<double> s(4, 0), g, sl;
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 5; ++c) s[b] += at(a, b, c);
  const int idx[3] = {3, 0, 0};
  for (int a = 0; a < 3; ++a)
    for (int j = 0; j < 3; ++j)
      for (int c = 0; c < 5; ++c) g.push_back(at(a, idx[j], c));
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 4; c >= 0; c -= 2) sl.push_back(at(a, b, c));
  expectClose(r.out[0], s);
  expectClose(r.out[1], g, 0);
  expectClose(r.out[2], sl, 0);
}

TEST(KernelReference, Gelu) {
  auto r = runF64("input %x : f64[20]\n %y : f64[20] = Gelu(%x)\n %z : f64[20] = Gelu(%x) {approximate = \"tanh\"}\n output %y\n output %z", {-4, 4});
  std::vector<double> exact, approx;
  for (double x : r.in["x"]) {
    exact.push_back(0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
    approx.push_back(0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))));
  }
  expectClose(r.out[0], exact);
  expectClose(r.out[1], approx);
}

TEST(KernelReference, PhiloxKnownAnswers) {
  // Random123's published known-answer vectors for Philox4x32-10.
  const uint32_t zero[4] = {0, 0, 0, 0}, zkey[2] = {0, 0};
  const uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, okey[2] = {0xffffffffu, 0xffffffffu};
  const uint32_t pi[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, pkey[2] = {0xa4093822u, 0x299f31d0u};
  uint32_t out[4];
  cpu::Philox::block(zero, zkey, out);
  EXPECT_EQ(std::vector<uint32_t>(out, out + 4), (std::vector<uint32_t>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  cpu::Philox::block(ones, okey, out);
  EXPECT_EQ(std::vector<uint32_t>(out, out + 4), (std::vector<uint32_t>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  cpu::Philox::block(pi, pkey, out);
  EXPECT_EQ(std::vector<uint32_t>(out, out + 4), (std::vector<uint32_t>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// Dropout's stream layout, which the CUDA kernels reproduce: element i's 16-bit draw is half i % 2 of
// word (i / 2) % 4 of Philox block i / 8, counter (block, step, node key), key the seed; it is kept
// when the draw is at least ceil(ratio * 2^16).
TEST(KernelReference, DropoutDrawsSixteenBitsEightToABlock) {
  const uint64_t seed = 0x123456789abcdefull, step = 7, blk = (1ull << 32) + 5;
  const uint32_t key = 0xdeadbeefu;
  const uint32_t ctr[4] = {5u, 1u, 7u, key}, k2[2] = {0x89abcdefu, 0x01234567u};
  uint32_t words[4];
  cpu::Philox::block(ctr, k2, words);
  uint32_t d[8];
  cpu::dropoutDraws8(seed, step, key, blk, d);
  for (int e = 0; e < 8; ++e) {
    const uint32_t want = e % 2 ? words[e / 2] >> 16 : words[e / 2] & 0xffffu;
    EXPECT_EQ(d[e], want) << e;
    EXPECT_EQ(cpu::dropoutDraw(seed, step, key, 8 * blk + e), want) << e;
  }
  EXPECT_EQ(cpu::dropoutThreshold(0.0f), 0u);  // keeps every draw
  EXPECT_EQ(cpu::dropoutThreshold(0.5f), 32768u);
  EXPECT_EQ(cpu::dropoutThreshold(0.1f), 6554u);  // 0.1f * 65536 = 6553.6000...
  EXPECT_EQ(cpu::dropoutThreshold(0.99999f), 65536u);  // above every draw: nothing kept
}

TEST(KernelReference, DropoutMaskIsKeyedAndScaled) {
  const std::string text = graph("input %x : f32[64,64]\n const %p : f32[] = [0.3]\n const %t : bool[] = [1]\n"
                                 " %y : f32[64,64], %m : bool[64,64] = Dropout(%x, %p, %t)\n output %y\n output %m");
  auto g = parseGraph(text);
  Tensor x = randomTensor(g->inputs()[0]->type(), {0.5, 1.5}, 0, 0);
  auto backend = createCpuBackend();
  ExecOptions o;
  o.seed = 42;
  auto a = evaluate(*g, {{"x", x}}, *backend, o);
  auto b = evaluate(*g, {{"x", x}}, *backend, o);
  EXPECT_EQ(a[1].data, b[1].data);  // same (seed, step, node): same mask
  int64_t kept = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const bool keep = a[1].data[i] != 0;
    kept += keep;
    EXPECT_FLOAT_EQ(static_cast<float>(a[0].getDouble(i)), keep ? static_cast<float>(x.getDouble(i) / 0.7) : 0.0f);
  }
  EXPECT_NEAR(static_cast<double>(kept) / x.numel(), 0.7, 0.03);  // 4096 draws: 4.5 sigma
  o.step = 1;
  EXPECT_NE(evaluate(*g, {{"x", x}}, *backend, o)[1].data, a[1].data);  // a new step draws a new mask
  o.dropout = false;
  EXPECT_EQ(evaluate(*g, {{"x", x}}, *backend, o)[0].data, x.data);  // --no-dropout: identity
}

// The random ops draw Dropout's Philox stream: the moments their attributes give, a new stream for
// every step and seed, and the same numbers again for the same (seed, step).
TEST(KernelReference, RandomOpsDrawTheDropoutStream) {
  auto g = parseGraph("graph \"r\" opset 20 {\n input %x : f32[100,100]\n"
                      " %u : f32[100,100] = RandomUniformLike(%x) {high = 3.0, low = -1.0}\n"
                      " %n : f32[100,100] = RandomNormalLike(%x) {mean = 1.0, scale = 2.0}\n"
                      " %b : f32[100,100] = Bernoulli(%x)\n output %u\n output %n\n output %b\n}\n",
                      "random");
  Tensor p(TensorType{DType::f32, {100, 100}});
  for (int64_t i = 0; i < p.numel(); ++i) p.setDouble(i, 0.25);
  auto backend = createCpuBackend();
  auto run = [&](uint64_t seed, uint64_t step) {
    ExecOptions o;
    o.seed = seed;
    o.step = step;
    return evaluate(*g, {{"x", p}}, *backend, o);
  };
  auto moments = [](const Tensor& t) {
    double s = 0, q = 0;
    for (int64_t i = 0; i < t.numel(); ++i) s += t.getDouble(i), q += t.getDouble(i) * t.getDouble(i);
    const double m = s / static_cast<double>(t.numel());
    return std::pair{m, q / static_cast<double>(t.numel()) - m * m};
  };
  const auto a = run(7, 3);
  auto [um, uv] = moments(a[0]);
  EXPECT_NEAR(um, 1.0, 0.05);        // uniform on [-1, 3): mean 1, variance 16/12
  EXPECT_NEAR(uv, 16.0 / 12, 0.05);
  auto [nm, nv] = moments(a[1]);
  EXPECT_NEAR(nm, 1.0, 0.06);        // normal(1, 2)
  EXPECT_NEAR(nv, 4.0, 0.2);
  auto [bm, bv] = moments(a[2]);
  EXPECT_NEAR(bm, 0.25, 0.02);       // ones at the rate the input gives
  for (int64_t i = 0; i < a[2].numel(); ++i) EXPECT_TRUE(a[2].getDouble(i) == 0 || a[2].getDouble(i) == 1);
  EXPECT_EQ(run(7, 3)[0].data, a[0].data);  // regenerated identically (a resumed run, the GPU)
  EXPECT_NE(run(7, 4)[0].data, a[0].data);  // a new step draws anew
  EXPECT_NE(run(8, 3)[1].data, a[1].data);  // and so does another seed
}

// A crafted loss gradient (a plan is not trusted): labels outside the classes, or a loss gradient
// of the wrong size, are errors naming the node, checked before the class weights are read.
TEST(KernelReference, LossGradientChecksLabelsBeforeReadingWeights) {
  auto g = parseGraph(
      "graph \"t\" opset 17 {\n  domain \"ampc\" 1\n  input %dl : f32[]\n  input %x : f32[2,3]\n  input %y : i64[2]\n  input %w : f32[3]\n"
      "  %dx : f32[2,3] = ampc::SoftmaxCrossEntropyLossGrad(%dl, %x, %y, %w) @lossgrad\n  output %dx\n}\n",
      "case");
  auto backend = createCpuBackend();
  std::map<std::string, Tensor> feeds{{"dl", Tensor::fromDoubles(DType::f32, {}, {1.0})},
                                      {"x", Tensor::fromDoubles(DType::f32, {2, 3}, {0.1, 0.2, 0.3, -1, 0, 1})},
                                      {"y", Tensor::fromInts(DType::i64, {2}, {1, 300})},
                                      {"w", Tensor::fromDoubles(DType::f32, {3}, {1, 2, 3})}};
  try {
    evaluate(*g, feeds, *backend);
    ADD_FAILURE() << "label 300 of 3 classes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 300 is outside [0, 3)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lossgrad"), std::string::npos) << e.what();
  }
  feeds["y"] = Tensor::fromInts(DType::i64, {2}, {1, 2});
  Tensor dx = evaluate(*g, feeds, *backend)[0];
  // mean over weights 2 + 3: row 0's label 1 gets (softmax - 1) * 2 / 5.
  double z = std::exp(0.1) + std::exp(0.2) + std::exp(0.3);
  EXPECT_NEAR(dx.getDouble(1), (std::exp(0.2) / z - 1) * 2 / 5, 1e-6);
}

// TopK and ArgMax rank as PyTorch's topk and argmax do: NaN above every number, equal values in
// index order (so the two backends and both ops agree on which element is chosen).
TEST(KernelReference, TopKAndArgMaxRankNaNFirstAndTiesInIndexOrder) {
  const std::string text = graph(
      "input %x : f32[2,5]\n const %k : i64[1] = [3]\n %v : f32[2,3], %i : i64[2,3] = TopK(%x, %k)\n"
      " %w : f32[2,3], %j : i64[2,3] = TopK(%x, %k) {largest = 0}\n %a : i64[2] = ArgMax(%x) {axis = 1, keepdims = 0}\n"
      " output %v\n output %i\n output %w\n output %j\n output %a");
  const double nan = std::nan("");
  const std::map<std::string, Tensor> feeds = {{"x", Tensor::fromDoubles(DType::f32, {2, 5}, {1, 3, nan, 3, -2, 4, 0, 4, 4, -1})}};
  const auto out = runAt(text, feeds, DType::f32);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_TRUE(std::isnan(out[0].getDouble(0)));
  EXPECT_EQ(out[0].getDouble(1), 3);
  EXPECT_EQ(out[0].getDouble(2), 3);
  EXPECT_EQ(out[1].toInts(), (std::vector<int64_t>{2, 1, 3, 0, 2, 3}));  // row 1: the three 4s in index order
  EXPECT_EQ(out[3].toInts(), (std::vector<int64_t>{4, 0, 1, 4, 1, 0}));  // smallest: NaN last
  EXPECT_EQ(out[2].getDouble(0), -2);
  EXPECT_EQ(out[4].toInts(), (std::vector<int64_t>{2, 0}));  // the NaN, then the first of the 4s
}

// Det by elimination with row exchanges (a zero leading pivot) and at a singular matrix; its
// gradient is dY times the cofactor matrix, which a singular matrix of rank n - 1 still has
// (PyTorch's derivative of det), where det * inv(X)^T has no value.
TEST(KernelReference, DetAndItsCofactorGradientAtSingularMatrices) {
  const std::string text = graph(
      "domain \"ampc\" 1\n input %x : f32[2,3,3]\n input %dy : f32[2]\n %d : f32[2] = Det(%x)\n"
      " %g : f32[2,3,3] = ampc::DetGrad(%dy, %x)\n output %d\n output %g");
  const std::map<std::string, Tensor> feeds = {
      {"x", Tensor::fromDoubles(DType::f32, {2, 3, 3}, {0, 2, 1, 1, 1, 0, 3, 0, 1, 1, 2, 3, 2, 4, 6, 1, 0, 1})},
      {"dy", Tensor::fromDoubles(DType::f32, {2}, {2, 3})}};
  const auto out = runAt(text, feeds, DType::f32);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0].getDouble(0), -5, 1e-6);
  EXPECT_EQ(out[0].getDouble(1), 0);
  const std::vector<double> cof = {1, -1, -3, -2, -3, 6, -1, 1, -2, 4, 4, -4, -2, -2, 2, 0, 0, 0};
  for (int i = 0; i < 18; ++i) EXPECT_NEAR(out[1].getDouble(i), cof[i] * (i < 9 ? 2 : 3), 1e-5) << i;
}
