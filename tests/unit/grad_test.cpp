// Gradient rules: every differentiable op, checked against central finite differences in f64 on
// the CPU backend, on fresh random data: broadcasting, negative axes, multi-output ops.
// Each case's float tensors are params; the loss is sum(output * R) with a random R per output.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "compiler/ir/text.h"
#include "compiler/ops/registry.h"
#include "passes/autodiff.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    uint64_t seed = std::random_device{}();
    std::printf("grad_test seed %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return r;
}

struct Case {
  const char* body;  // params (float), consts, nodes and outputs; opset 20
  double lo = -2, hi = 2;
};

// The case's graph with random param data and a scalar loss sum_k sum(out_k * R_k).
std::unique_ptr<Graph> build(const Case& c) {
  auto g = parseGraph(std::string("graph \"g\" opset 20 {\n") + c.body + "\n}\n", "case");
  std::uniform_real_distribution<double> u(c.lo, c.hi), r(-1, 1);
  for (Value* p : g->params()) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, u(rng()));
    p->setData(std::move(t));
  }
  std::vector<Value*> outs = g->outputs();
  g->clearOutputs();
  Value* loss = nullptr;
  int k = 0;
  for (Value* y : outs) {
    if (!isFloat(y->type().dtype)) continue;
    Tensor w(TensorType{DType::f64, y->type().shape});
    for (int64_t i = 0; i < w.numel(); ++i) w.setDouble(i, r(rng()));
    Value* wv = g->addConst("R" + std::to_string(k), std::move(w));
    Value* m = g->createNode("Mul", "", {y, wv}, {{"m" + std::to_string(k), y->type()}})->result(0);
    Node* s = g->createNode("ReduceSum", "", {m}, {{"s" + std::to_string(k), TensorType{DType::f64, {}}}});
    s->setAttr("keepdims", int64_t{0});
    loss = loss ? g->createNode("Add", "", {loss, s->result(0)}, {{"l" + std::to_string(k), TensorType{DType::f64, {}}}})->result(0)
                : s->result(0);
    ++k;
  }
  g->addOutput(loss);
  verify(*g);
  return g;
}

double lossOf(const Graph& g) {
  auto backend = createCpuBackend();
  ExecOptions o;
  o.seed = 3;
  return evaluate(g, {}, *backend, o)[0].getDouble(0);
}

const Case kCases[] = {
    {"param %a : f64[2,1,4]\n param %b : f64[3,1]\n %y : f64[2,3,4] = Add(%a, %b)\n output %y"},
    {"param %a : f64[2,3]\n param %b : f64[3]\n %y : f64[2,3] = Sub(%a, %b)\n output %y"},
    {"param %a : f64[1,3]\n param %b : f64[2,1]\n %y : f64[2,3] = Mul(%a, %b)\n output %y"},
    {"param %a : f64[2,3]\n param %b : f64[3]\n %y : f64[2,3] = Div(%a, %b)\n output %y", 0.5, 2},
    {"param %a : f64[2,3]\n param %b : f64[3]\n %y : f64[2,3] = Pow(%a, %b)\n output %y", 0.5, 2},
    // fmod of either sign (a / b in [-4, 4]: the quotient a gradient of b takes is 0 to 4 either way).
    {"param %a : f64[2,3]\n param %b : f64[3]\n %y : f64[2,3] = Mod(%a, %b) {fmod = 1}\n %n : f64[2,3] = Neg(%a)\n"
     " %z : f64[2,3] = Mod(%n, %b) {fmod = 1}\n output %y\n output %z", 0.5, 2},
    {"param %x : f64[5]\n %y : f64[5] = Sqrt(%x)\n output %y", 0.5, 3},
    {"param %x : f64[5]\n %y : f64[5] = Reciprocal(%x)\n output %y", 0.5, 3},
    {"param %x : f64[5]\n %y : f64[5] = Neg(%x)\n output %y"},
    {"param %x : f64[5]\n %y : f64[5] = Abs(%x)\n output %y"},
    {"param %x : f64[5]\n %y : f64[5] = Exp(%x)\n output %y"},
    {"param %x : f64[5]\n %y : f64[5] = Log(%x)\n output %y", 0.5, 3},
    {"param %x : f64[5]\n %y : f64[5] = Tanh(%x)\n output %y"},
    {"param %x : f64[5]\n %y : f64[5] = Sigmoid(%x)\n output %y"},
    {"param %x : f64[6]\n %y : f64[6] = Relu(%x)\n output %y"},
    {"param %x : f64[6]\n %y : f64[6] = LeakyRelu(%x) {alpha = 0.2}\n output %y"},
    {"param %x : f64[6]\n %y : f64[6] = Erf(%x)\n output %y"},
    {"param %x : f64[6]\n %y : f64[6] = Gelu(%x)\n %z : f64[6] = Gelu(%x) {approximate = \"tanh\"}\n output %y\n output %z"},
    {"param %x : f64[6]\n %y : f64[6] = Softplus(%x)\n output %y"},
    {"param %x : f64[6]\n %a : f64[6] = Tan(%x)\n %b : f64[6] = Asin(%x)\n %c : f64[6] = Acos(%x)\n %d : f64[6] = Atanh(%x)\n"
     " output %a\n output %b\n output %c\n output %d", -0.9, 0.9},
    {"param %x : f64[6]\n %a : f64[6] = Atan(%x)\n %b : f64[6] = Sinh(%x)\n %c : f64[6] = Cosh(%x)\n %d : f64[6] = Asinh(%x)\n"
     " output %a\n output %b\n output %c\n output %d", -2, 2},
    {"param %x : f64[6]\n %y : f64[6] = Acosh(%x)\n output %y", 1.2, 3},
    {"domain \"ampc\" 1\n param %x : f64[8]\n %y : f64[8] = ampc::Silu(%x)\n output %y", -6, 6},
    {"domain \"ampc\" 1\n param %x : f64[3,8]\n %y : f64[3,8] = ampc::RotateHalf(%x) {sign = 1}\n"
     " %z : f64[3,8] = ampc::RotateHalf(%x) {sign = -1}\n output %y\n output %z"},
    {"param %x : f64[6]\n const %lo : f64[] = [-0.5]\n const %hi : f64[] = [0.8]\n %y : f64[6] = Clip(%x, %lo, %hi)\n output %y"},
    {"param %x : f64[8]\n param %lo : f64[]\n param %hi : f64[]\n %l : f64[] = Sub(%lo, %hi)\n %y : f64[8] = Clip(%x, %l, %hi)\n output %y", -1.5, 1.5},
    {"param %a : f64[2,3]\n param %b : f64[3]\n param %c : f64[2,1]\n %y : f64[2,3] = Max(%a, %b, %c)\n %z : f64[2,3] = Min(%a, %b)\n output %y\n output %z"},
    {"param %a : f64[2,3]\n param %b : f64[3]\n const %c : bool[2,1] = [1, 0]\n %y : f64[2,3] = Where(%c, %a, %b)\n output %y"},
    // Casts between f64 and itself: a lossy cast is a step function that finite differences
    // cannot see through (its rule is checked in the mixed-precision tests).
    {"param %x : f64[4]\n %y : f64[4] = Identity(%x)\n %z : f64[4] = Cast(%y) {to = 11}\n"
     " const %l : f64[] = [0.0]\n %w : f64[4] = CastLike(%z, %l)\n output %w"},
    {"param %x : f64[8,8]\n const %p : f64[] = [0.3]\n const %t : bool[] = [1]\n %y : f64[8,8] = Dropout(%x, %p, %t)\n output %y"},
    {"param %a : f64[2,1,3,4]\n param %b : f64[5,4,2]\n %y : f64[2,5,3,2] = MatMul(%a, %b)\n output %y"},
    {"param %a : f64[4]\n param %b : f64[3,4,2]\n %y : f64[3,2] = MatMul(%a, %b)\n param %c : f64[3,4]\n param %d : f64[4]\n"
     " %z : f64[3] = MatMul(%c, %d)\n output %y\n output %z"},
    {"param %a : f64[4,3]\n param %b : f64[5,4]\n param %c : f64[5]\n %y : f64[3,5] = Gemm(%a, %b, %c) {alpha = 0.5, beta = 1.5, transA = 1, transB = 1}\n"
     " param %d : f64[3,4]\n param %e : f64[4,2]\n %z : f64[3,2] = Gemm(%d, %e)\n output %y\n output %z"},
    {"param %x : f64[2,4,6,5]\n param %w : f64[6,2,3,2]\n param %b : f64[6]\n"
     " %y : f64[2,6,3,6] = Conv(%x, %w, %b) {dilations = [1, 2], group = 2, pads = [1, 1, 1, 2], strides = [2, 1]}\n output %y"},
    {"param %x : f64[1,2,9]\n param %w : f64[3,2,3]\n %y : f64[1,3,4] = Conv(%x, %w) {pads = [1, 0], strides = [2]}\n output %y"},
    {"param %x : f64[2,2,5,5]\n %y : f64[2,2,3,3] = MaxPool(%x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n output %y"},
    {"param %x : f64[2,2,5,5]\n %y : f64[2,2,3,3] = AveragePool(%x) {count_include_pad = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
     " %z : f64[2,2,2,2] = AveragePool(%x) {kernel_shape = [2, 2], strides = [2, 2]}\n output %y\n output %z"},
    {"param %x : f64[2,3,4,4]\n %y : f64[2,3,1,1] = GlobalAveragePool(%x)\n output %y"},
    {"param %x : f64[2,2,2,3]\n %y : f64[2,2,1,1] = AveragePool(%x) {ceil_mode = 1, kernel_shape = [9, 9], strides = [9, 9]}\n"
     " %z : f64[2,2,1,1] = MaxPool(%x) {ceil_mode = 1, kernel_shape = [3, 5], pads = [1, 1, 1, 1], strides = [3, 5]}\n output %y\n output %z"},
    {"param %x : f64[4,3,5]\n param %s : f64[3]\n param %b : f64[3]\n param %m : f64[3]\n param %v : f64[3]\n"
     " %y : f64[4,3,5], %rm : f64[3], %rv : f64[3] = BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}\n output %y", 0.2, 2},
    {"param %x : f64[4,3]\n param %s : f64[3]\n param %b : f64[3]\n param %m : f64[3]\n param %v : f64[3]\n"
     " %y : f64[4,3] = BatchNormalization(%x, %s, %b, %m, %v)\n output %y", 0.2, 2},
    // Inference form with computed statistics (the dynamo exporter's weight standardisation): the
    // mean and variance operands get their gradients.
    {"param %x : f64[4,3,2]\n param %s : f64[3]\n param %b : f64[3]\n param %m : f64[3]\n param %v : f64[3]\n"
     " %mi : f64[3] = Identity(%m)\n %vi : f64[3] = Identity(%v)\n"
     " %y : f64[4,3,2] = BatchNormalization(%x, %s, %b, %mi, %vi) {epsilon = 0.01}\n output %y", 0.2, 2},
    {"param %x : f64[2,3,8]\n param %s : f64[8]\n param %b : f64[8]\n %y : f64[2,3,8] = LayerNormalization(%x, %s, %b) {axis = -1}\n"
     " param %x2 : f64[2,3,4]\n param %s2 : f64[3,4]\n %z : f64[2,3,4] = LayerNormalization(%x2, %s2) {axis = 1}\n output %y\n output %z"},
    {"param %x : f64[2,3,5]\n %y : f64[2,3,5] = Softmax(%x) {axis = -2}\n %z : f64[2,3,5] = LogSoftmax(%x) {axis = -1}\n output %y\n output %z"},
    {"param %x : f64[2,3,4]\n const %ax : i64[2] = [0, -1]\n %y : f64[3] = ReduceSum(%x, %ax) {keepdims = 0}\n"
     " %z : f64[2,1,4] = ReduceMean(%x) {axes = [-2]}\n output %y\n output %z"},
    {"param %x : f64[2,3,4]\n %y : f64[2,1,1] = ReduceMax(%x) {axes = [1, 2]}\n %z : f64[] = ReduceMin(%x) {keepdims = 0}\n output %y\n output %z"},
    {"param %x : f64[6,5,2]\n const %t : i64[6,2] = [0, 1, 2, 3, 4, 1, 2, 2, 0, 4, 3, 1]\n param %w : f64[5]\n"
     " %l : f64[] = SoftmaxCrossEntropyLoss(%x, %t, %w) {ignore_index = 2}\n"
     " %n : f64[6,2] = SoftmaxCrossEntropyLoss(%x, %t) {reduction = \"none\"}\n output %l\n output %n", 0.2, 2},
    {"param %x : f64[6,5]\n const %t : i64[6] = [0, 1, 4, 3, 2, 1]\n %l : f64[] = NegativeLogLikelihoodLoss(%x, %t) {reduction = \"sum\"}\n output %l"},
    {"param %x : f64[2,3,4]\n const %s : i64[2] = [4, -1]\n %y : f64[4,6] = Reshape(%x, %s)\n %z : f64[6,4] = Flatten(%x) {axis = -1}\n output %y\n output %z"},
    {"param %x : f64[3,1,2]\n const %a : i64[1] = [-2]\n %y : f64[3,2] = Squeeze(%x, %a)\n %z : f64[3,1,1,2] = Unsqueeze(%x, %a)\n output %y\n output %z"},
    {"param %x : f64[2,3,4]\n %y : f64[4,2,3] = Transpose(%x) {perm = [2, 0, 1]}\n output %y"},
    {"param %a : f64[2,3]\n param %b : f64[2,1]\n %y : f64[2,4] = Concat(%a, %b) {axis = -1}\n output %y"},
    {"param %x : f64[7,2]\n const %sp : i64[2] = [3, 4]\n %a : f64[3,2], %b : f64[4,2] = Split(%x, %sp)\n output %b"},
    {"param %x : f64[10,8]\n const %st : i64[2] = [-1, 1]\n const %en : i64[2] = [-100, 7]\n const %ax : i64[2] = [0, -1]\n const %sp : i64[2] = [-3, 2]\n"
     " %y : f64[4,3] = Slice(%x, %st, %en, %ax, %sp)\n output %y"},
    // Slices that tile a value along one axis, torch.roll's (a negative start, an end past the dim)
    // and three chunks, and one slice that overlaps them: the tiles' gradients are one Concat
    // (autodiff's concatTiles), the overlapping one's a SliceGrad added to it.
    {"param %x : f64[2,6,3]\n const %a : i64[1] = [1]\n const %neg2 : i64[1] = [-2]\n const %big : i64[1] = [9223372036854775807]\n"
     " const %i0 : i64[1] = [0]\n %p : f64[2,2,3] = Slice(%x, %neg2, %big, %a)\n %q : f64[2,4,3] = Slice(%x, %i0, %neg2, %a)\n"
     " %y : f64[2,6,3] = Concat(%p, %q) {axis = 1}\n const %i1 : i64[1] = [1]\n const %i5 : i64[1] = [5]\n"
     " %o : f64[2,4,3] = Slice(%x, %i1, %i5, %a)\n param %w : f64[3,5]\n const %b : i64[1] = [-1]\n const %i2 : i64[1] = [2]\n"
     " %c : f64[3,3] = Slice(%w, %i2, %i5, %b)\n %d : f64[3,2] = Slice(%w, %i0, %i2, %b)\n"
     " output %y\n output %o\n output %c\n output %d"},
    {"param %x : f64[5,4]\n const %i : i64[2,2] = [0, -1, 3, 0]\n %y : f64[2,2,4] = Gather(%x, %i)\n %z : f64[5,2,2] = Gather(%x, %i) {axis = 1}\n output %y\n output %z"},
    {"param %x : f64[3,1]\n const %s : i64[3] = [2, 3, 4]\n %y : f64[2,3,4] = Expand(%x, %s)\n output %y"},
    {"param %x : f64[2,3]\n const %r : i64[2] = [2, 3]\n %y : f64[4,9] = Tile(%x, %r)\n output %y"},
    {"param %x : f64[3,4]\n const %p : i64[4] = [1, 2, 2, 3]\n %y : f64[6,9] = Pad(%x, %p) {mode = \"reflect\"}\n"
     " const %q : i64[4] = [0, 1, 2, 0]\n %z : f64[5,5] = Pad(%x, %q)\n %e : f64[5,5] = Pad(%x, %q) {mode = \"edge\"}\n output %y\n output %z\n output %e"},
    {"param %x : f64[2,4,4]\n const %k : i64[] = [1]\n %y : f64[2,4,4] = Trilu(%x, %k)\n output %y"},
    {"param %x : f64[4,5]\n %a : f64[4,5] = HardSigmoid(%x) {alpha = 0.3, beta = 0.4}\n %b : f64[4,5] = HardSwish(%x)\n"
     " %c : f64[4,5] = Elu(%x) {alpha = 0.7}\n %d : f64[4,5] = Selu(%x)\n %e : f64[4,5] = Celu(%x) {alpha = 2.0}\n %f : f64[4,5] = Mish(%x)\n"
     " %g : f64[4,5] = Softsign(%x)\n output %a\n output %b\n output %c\n output %d\n output %e\n output %f\n output %g", -4, 4},
    {"param %x : f64[2,3,4]\n param %s : f64[3,1]\n %y : f64[2,3,4] = PRelu(%x, %s)\n output %y"},
    {"param %x : f64[3,4]\n %s : f64[3,4] = Sin(%x)\n %c : f64[3,4] = Cos(%x)\n output %s\n output %c"},
    {"param %x : f64[3,5]\n const %a : i64[] = [-1]\n %y : f64[3,5] = CumSum(%x, %a)\n %z : f64[3,5] = CumSum(%x, %a) {exclusive = 1}\n"
     " %w : f64[3,5] = CumSum(%x, %a) {reverse = 1}\n output %y\n output %z\n output %w"},
    {"param %x : f64[3,4]\n const %i : i64[2,4] = [0, 1, 2, 0, 0, 1, -1, 0]\n %y : f64[2,4] = GatherElements(%x, %i)\n output %y"},
    {"param %x : f64[2,3,5,4]\n param %g : f64[2,3,2,2]\n %y : f64[2,3,3,2] = GridSample(%x, %g)\n"
     " %z : f64[2,3,3,2] = GridSample(%x, %g) {align_corners = 1, padding_mode = \"border\"}\n"
     " %w : f64[2,3,3,2] = GridSample(%x, %g) {padding_mode = \"reflection\"}\n output %y\n output %z\n output %w", -1.3, 1.3},
    {"param %x : f64[3,5,2]\n const %k : i64[1] = [2]\n %v : f64[3,2,2], %i : i64[3,2,2] = TopK(%x, %k) {axis = 1}\n"
     " const %k1 : i64[1] = [1]\n %w : f64[3,5,1], %j : i64[3,5,1] = TopK(%x, %k1) {largest = 0}\n output %v\n output %w"},
    {"param %x : f64[3,4]\n param %u : f64[2,4]\n const %i : i64[2,4] = [0, 1, 2, 0, 2, 0, 1, 1]\n"
     " %y : f64[3,4] = ScatterElements(%x, %i, %u)\n %z : f64[3,4] = ScatterElements(%x, %i, %u) {reduction = \"add\"}\n output %y\n output %z"},
    // Max and min with repeated indices: each result's gradient goes to the contributor that won.
    {"param %x : f64[3,4]\n param %u : f64[3,4]\n const %i : i64[3,4] = [0, 1, 2, 0, 0, 1, 2, 2, 0, 0, 0, 2]\n"
     " %y : f64[3,4] = ScatterElements(%x, %i, %u) {reduction = \"max\"}\n %z : f64[3,4] = ScatterElements(%x, %i, %u) {reduction = \"min\"}\n"
     " param %v : f64[3,3]\n const %j : i64[3,1] = [1, 3, 1]\n param %w : f64[4,3]\n %m : f64[4,3] = ScatterND(%w, %j, %v) {reduction = \"max\"}\n"
     " output %y\n output %z\n output %m"},
    {"param %x : f64[4,3]\n param %u : f64[2,3]\n const %i : i64[2,1] = [3, 1]\n %y : f64[4,3] = ScatterND(%x, %i, %u)\n"
     " %z : f64[4,3] = ScatterND(%x, %i, %u) {reduction = \"add\"}\n output %y\n output %z"},
    // Det over a batch of 4 x 4 matrices, and a 1 x 1 one.
    {"param %x : f64[2,3,4,4]\n %y : f64[2,3] = Det(%x)\n param %z : f64[1,1]\n %d : f64[] = Det(%z)\n output %y\n output %d"},
    {"param %x : f64[3,4,2]\n const %i : i64[3,2] = [0, 1, 2, 3, 0, 1]\n %y : f64[3,2] = GatherND(%x, %i)\n"
     " const %j : i64[3,2,1] = [1, 1, 0, 3, 2, 2]\n %z : f64[3,2,2] = GatherND(%x, %j) {batch_dims = 1}\n output %y\n output %z"},
};

}  // namespace

TEST(Gradients, EveryDifferentiableOpMatchesFiniteDifferences) {
  std::set<std::string> covered;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.body);
    auto g = build(c);
    for (const auto& n : g->nodes()) covered.insert(n->op());
    // Analytic gradients.
    auto gg = parseGraph(printGraph(*g), "copy");  // the text form drops data: copy it over
    for (Value* p : g->params()) gg->lookup(p->name())->setData(*p->data());
    for (Value* k : g->consts()) gg->lookup(k->name())->setData(*k->data());
    PassManager pm;
    pm.add(createAutodiffPass());
    pm.run(*gg);
    auto backend = createCpuBackend();
    ExecOptions o;
    o.seed = 3;
    auto outs = evaluate(*gg, {}, *backend, o);
    ASSERT_EQ(outs[0].getDouble(0), lossOf(*g));
    size_t k = 1;
    for (Value* p : trainableParams(*g, {})) {
      const Value* gv = gg->outputs().size() > k ? gg->outputs()[k] : nullptr;
      ASSERT_NE(gv, nullptr);
      ASSERT_EQ(gv->name(), p->name() + "_grad");
      const Tensor& an = outs[k++];
      ASSERT_EQ(an.type, p->type());
      // Central differences on up to 24 elements.
      double num = 0, den = 0;
      const int64_t n = p->type().numel();
      for (int64_t s = 0; s < std::min<int64_t>(n, 24); ++s) {
        const int64_t i = n <= 24 ? s : static_cast<int64_t>(rng()() % n);
        Tensor base = *p->data();
        const double x = base.getDouble(i), h = 1e-6 * std::max(1.0, std::fabs(x));
        Tensor t = base;
        t.setDouble(i, x + h);
        p->setData(t);
        const double lp = lossOf(*g);
        t.setDouble(i, x - h);
        p->setData(t);
        const double lm = lossOf(*g);
        p->setData(base);
        const double fd = (lp - lm) / (2 * h), a = an.getDouble(i);
        num += (fd - a) * (fd - a);
        den += fd * fd;
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      EXPECT_LE(rel, 1e-6) << p->name();
    }
  }
  for (const OpDef& d : allOps())
    if (d.domain.empty() && d.differentiable) EXPECT_TRUE(covered.count(std::string(d.name))) << "no gradient case for " << d.name;
}

// Slices that tile a value along one axis (torch.roll's two) take one Concat for their gradients
// instead of a SliceGrad each (each zero-filling the whole value) and the Adds between them; slices
// with a gap between them, or along different axes, keep their SliceGrads. (The values are
// checked against finite differences in EveryDifferentiableOpMatchesFiniteDifferences.)
TEST(Gradients, SlicesThatTileAValueTakeOneConcat) {
  auto g = build({"param %x : f64[2,6,3]\n const %a : i64[1] = [1]\n const %neg2 : i64[1] = [-2]\n const %big : i64[1] = [9223372036854775807]\n"
                  " const %i0 : i64[1] = [0]\n %p : f64[2,2,3] = Slice(%x, %neg2, %big, %a)\n %q : f64[2,4,3] = Slice(%x, %i0, %neg2, %a)\n"
                  " %y : f64[2,6,3] = Concat(%p, %q) {axis = 1}\n param %w : f64[4,5]\n const %b : i64[1] = [-1]\n const %i2 : i64[1] = [2]\n"
                  " const %i3 : i64[1] = [3]\n const %i5 : i64[1] = [5]\n const %z : i64[1] = [0]\n %c : f64[4,2] = Slice(%w, %i0, %i2, %b)\n"
                  " %d : f64[4,2] = Slice(%w, %i3, %i5, %b)\n %e : f64[2,5] = Slice(%w, %i0, %i2, %z)\n %f : f64[2,5] = Slice(%w, %i2, %big, %z)\n"
                  " %h : f64[4,3] = Slice(%w, %i2, %big, %b)\n output %y\n output %c\n output %d\n output %e\n output %f\n output %h"});
  PassManager pm;
  pm.add(createAutodiffPass());
  pm.run(*g);
  std::map<std::string, int> ops;
  for (const auto& n : g->nodes()) ++ops[n->op()];
  const Value* dx = g->lookup("x_grad");
  ASSERT_NE(dx, nullptr);
  // x: its two slices tile axis 1, their gradients one Concat. w: [0:2] and [2:] along axis 0 tile
  // it (a Concat); [0:2], [3:5] and [2:] along axis 1 overlap: three SliceGrads.
  EXPECT_EQ(dx->producer()->op(), "Concat");
  EXPECT_EQ(ops["SliceGrad"], 3);
  EXPECT_EQ(ops["Concat"], 3);  // the forward's, x's and w's axis-0 tiles
}

// Ties at the extreme, where finite differences have no answer: the gradients PyTorch's derivatives
// give (derivatives.yaml). amax / amin and the full max() share dy evenly among the tied elements;
// max(dim) and adaptive max pooling (marked ampc_grad_to_first by the importer) give it all to the
// first, in row-major order over the reduced axes; torch.maximum splits it between tied inputs, and
// a clamp's constant bound leaves all of it to x. Every loss is sum(y * w) with w = 1, 2, 3, ...
namespace {
std::vector<double> tieGradient(const std::string& body, const std::vector<std::vector<double>>& data, const std::string& param) {
  auto g = parseGraph("graph \"t\" opset 20 {\n" + body + "\n}\n", "ties");
  size_t k = 0;
  for (Value* p : g->params()) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, data.at(k)[i]);
    p->setData(std::move(t));
    ++k;
  }
  Value* y = g->outputs()[0];
  g->clearOutputs();
  Tensor w(TensorType{DType::f64, y->type().shape});
  for (int64_t i = 0; i < w.numel(); ++i) w.setDouble(i, static_cast<double>(i + 1));
  Value* wv = g->addConst("W", std::move(w));
  Value* m = g->createNode("Mul", "", {y, wv}, {{"m", y->type()}})->result(0);
  Node* s = g->createNode("ReduceSum", "", {m}, {{"loss", TensorType{DType::f64, {}}}});
  s->setAttr("keepdims", int64_t{0});
  g->addOutput(s->result(0));
  PassManager pm;
  pm.add(createAutodiffPass());
  pm.run(*g);
  auto backend = createCpuBackend();
  auto outs = evaluate(*g, {}, *backend, ExecOptions{});
  for (size_t i = 0; i < g->outputs().size(); ++i)
    if (g->outputs()[i]->name() == param + "_grad") {
      std::vector<double> v(outs[i].numel());
      for (int64_t j = 0; j < outs[i].numel(); ++j) v[j] = outs[i].getDouble(j);
      return v;
    }
  ADD_FAILURE() << "no gradient for " << param;
  return {};
}
}  // namespace

TEST(Gradients, TiesAtTheExtremeFollowPyTorch) {
  using V = std::vector<double>;
  // amax over axis 1: row 0 has two 3s, row 1 four 5s (dy = 1, then 2).
  const std::vector<V> x{{1, 3, 3, 2, 5, 5, 5, 5}};
  EXPECT_EQ(tieGradient("param %x : f64[2,4]\n %y : f64[2] = ReduceMax(%x) {axes = [1], keepdims = 0}\n output %y", x, "x"),
            (V{0, 0.5, 0.5, 0, 0.5, 0.5, 0.5, 0.5}));
  EXPECT_EQ(tieGradient("param %x : f64[2,4]\n %y : f64[2,1] = ReduceMin(%x) {axes = [1]}\n output %y", {{4, 1, 1, 1, 2, 3, 3, 2}}, "x"),
            (V{0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 1, 0, 0, 1}));
  // max(dim): the first of the ties takes dy.
  EXPECT_EQ(tieGradient("param %x : f64[2,4]\n %y : f64[2] = ReduceMax(%x) {axes = [1], keepdims = 0, ampc_grad_to_first = 1}\n output %y",
                        x, "x"),
            (V{0, 1, 0, 0, 2, 0, 0, 0}));
  // Adaptive max pooling to 1 x 1 over [1, 2, 2, 2]: row-major over (h, w) in each channel.
  EXPECT_EQ(tieGradient("param %x : f64[1,2,2,2]\n %y : f64[1,2,1,1] = ReduceMax(%x) {axes = [2, 3], ampc_grad_to_first = 1}\n output %y",
                        {{1, 3, 3, 3, 7, 7, 7, 7}}, "x"),
            (V{0, 1, 0, 0, 2, 0, 0, 0}));
  // torch.maximum(a, b): a tie splits dy.
  const char* maximum = "param %a : f64[3]\n param %b : f64[3]\n %y : f64[3] = Max(%a, %b)\n output %y";
  EXPECT_EQ(tieGradient(maximum, {{1, 2, 3}, {1, 5, 0}}, "a"), (V{0.5, 0, 3}));
  EXPECT_EQ(tieGradient(maximum, {{1, 2, 3}, {1, 5, 0}}, "b"), (V{0.5, 2, 0}));
  EXPECT_EQ(tieGradient("param %a : f64[2]\n param %b : f64[2]\n param %c : f64[2]\n %y : f64[2] = Min(%a, %b, %c)\n output %y",
                        {{1, 4}, {1, 2}, {1, 2}}, "c"),
            (V{1.0 / 3, 1}));
  // pow at its edges, as PyTorch's derivatives: d/dx is 0 where e = 0 (not 0 * 0^-1); d/de is 0 where
  // x = 0 and e >= 0 (not 0 * log 0). Elsewhere (dy = 3) 3 e x^(e-1) = 3 * 3 * 2^2 and 3 x^e log x = 3 * 8 log 2.
  const char* pow = "param %x : f64[3]\n param %e : f64[3]\n %y : f64[3] = Pow(%x, %e)\n output %y";
  EXPECT_EQ(tieGradient(pow, {{0, 0, 2}, {0, 2, 3}}, "x"), (V{0, 0, 36}));
  EXPECT_EQ(tieGradient(pow, {{0, 0, 2}, {0, 2, 3}}, "e"), (V{0, 0, 3 * 8 * std::log(2.0)}));
  // PRelu at x = 0 takes the slope (PyTorch: x > 0 ? dy : w dy).
  EXPECT_EQ(tieGradient("param %x : f64[3]\n const %w : f64[] = [0.25]\n %y : f64[3] = PRelu(%x, %w)\n output %y", {{0, 1, -1}}, "x"),
            (V{0.25, 2, 0.75}));
  // clamp_min(x, t) with a constant t: x keeps all of dy at x == t.
  EXPECT_EQ(tieGradient("param %a : f64[3]\n const %t : f64[3] = [1.0, 0.0, 1.0]\n %y : f64[3] = Max(%a, %t)\n output %y", {{1, 2, 0}}, "a"),
            (V{1, 2, 0}));
}
