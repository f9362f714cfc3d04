// Passes that put a model in terms every backend runs.
// lower-nll (passes/lower_nll.cpp): NegativeLogLikelihoodLoss becomes SoftmaxCrossEntropyLoss over a
// LogSoftmax's input, or GatherElements, weights and a reduction. On fresh random data the lowered
// graph gives the same loss and the same gradient as the op, in f64, for every reduction, with and
// without weights and ignore_index, over [N, C] and [N, C, d].
// narrow-checks (passes/narrow_checks.cpp): IsNaN and IsInf of a widening Cast read its operand.
// fuse-rms-norm (passes/fuse_rms_norm.cpp): RMS normalisation written op by op becomes one
// ampc.RmsNorm with the loss and gradients of the ops it replaces, in f64.
// dense-experts (passes/dense_experts.cpp): a product with a gathered matrix per row becomes every
// expert's product and a pick, with the same loss and gradients in f64.
#include <gtest/gtest.h>

#include <random>

#include "compiler/ir/text.h"
#include "compiler/target.h"
#include "passes/attach_loss.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

std::unique_ptr<Graph> build(const std::string& body, uint64_t seed, int opset = 17) {
  auto g = parseGraph("graph \"g\" opset " + std::to_string(opset) + " {\n" + body + "\n}\n", "case");
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (Value* p : g->params()) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, normal(rng));
    p->setData(std::move(t));
  }
  g->bindOps();
  verify(*g);
  return g;
}

std::vector<Tensor> lossAndGrad(std::unique_ptr<Graph> g) {
  createAutodiffPass()->run(*g);
  auto backend = createCpuBackend();
  return evaluate(*g, {}, *backend);
}

// got equals want output by output: the same types, every element within 1e-12 of the output's
// largest magnitude, and no output all zeros.
void expectSameOutputs(const std::vector<Tensor>& want, const std::vector<Tensor>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < want.size(); ++o) {
    ASSERT_EQ(want[o].type, got[o].type) << o;
    double scale = 0;
    for (int64_t i = 0; i < want[o].numel(); ++i) scale = std::max(scale, std::abs(want[o].getDouble(i)));
    ASSERT_GT(scale, 0.0) << "output " << o;
    for (int64_t i = 0; i < want[o].numel(); ++i)
      EXPECT_NEAR(got[o].getDouble(i), want[o].getDouble(i), 1e-12 * scale) << "output " << o << " element " << i;
  }
}

int count(const Graph& g, const std::string& op) {
  int k = 0;
  for (const auto& n : g.nodes()) k += n->op() == op;
  return k;
}

}  // namespace

TEST(LowerNll, SameLossAndGradientAsTheOp) {
  const std::string t4 = " const %t : i64[4] = [0, 3, 2, 3]\n";
  const std::string w = " const %w : f64[5] = [0.5, 1.0, 1.5, 2.0, 0.25]\n";
  // reduction none: the loss is the sum of the per-sample losses' squares (a scalar for autodiff).
  auto squareSum = [](const std::string& shape) {
    return " %q : f64[" + shape + "] = Mul(%l, %l)\n %s : f64[] = ReduceSum(%q) {keepdims = 0}\n output %s";
  };
  const struct {
    std::string body;
    bool viaSce;
  } cases[] = {
      {"param %x : f64[4,5]\n" + t4 + " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t)\n output %l", false},
      {"param %x : f64[4,5]\n" + t4 + w + " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t, %w) {ignore_index = 3}\n output %l", false},
      {"param %x : f64[4,5]\n" + t4 + w + " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t, %w) {reduction = \"sum\"}\n output %l", false},
      {"param %x : f64[4,5]\n" + t4 + " %l : f64[4] = NegativeLogLikelihoodLoss(%x, %t) {ignore_index = 2, reduction = \"none\"}\n" + squareSum("4"), false},
      {"param %x : f64[2,5,3]\n const %t : i64[2,3] = [4, 0, 1, 1, 4, 2]\n" + w +
           " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t, %w) {ignore_index = 1}\n output %l",
       false},
      {"param %x : f64[2,5,3]\n const %t : i32[2,3] = [4, 0, 1, 1, 4, 2]\n %l : f64[2,3] = NegativeLogLikelihoodLoss(%x, %t) {reduction = \"none\"}\n" +
           squareSum("2,3"),
       false},
      // F.nll_loss(F.log_softmax(z, 1)): the pair becomes one SoftmaxCrossEntropyLoss.
      {"param %z : f64[4,5]\n" + t4 + w + " %x : f64[4,5] = LogSoftmax(%z) {axis = 1}\n"
           " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t, %w) {ignore_index = 3}\n output %l",
       true},
      {"param %z : f64[2,5,3]\n const %t : i64[2,3] = [4, 0, 1, 1, 4, 2]\n %x : f64[2,5,3] = LogSoftmax(%z) {axis = 1}\n"
           " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t) {reduction = \"sum\"}\n output %l",
       true},
  };
  for (const auto& c : cases)
    for (const uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(c.body);
      auto lowered = build(c.body, seed);
      ASSERT_TRUE(createLowerNllPass()->run(*lowered));
      verify(*lowered);
      EXPECT_EQ(count(*lowered, "NegativeLogLikelihoodLoss"), 0);
      EXPECT_EQ(count(*lowered, "SoftmaxCrossEntropyLoss"), c.viaSce ? 1 : 0);
      EXPECT_EQ(count(*lowered, "LogSoftmax"), 0 + (c.viaSce ? 0 : c.body.find("LogSoftmax") != std::string::npos));
      const auto want = lossAndGrad(build(c.body, seed)), got = lossAndGrad(std::move(lowered));
      ASSERT_EQ(want.size(), got.size());
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_EQ(want[k].type, got[k].type) << k;
        for (int64_t i = 0; i < want[k].numel(); ++i) EXPECT_NEAR(got[k].getDouble(i), want[k].getDouble(i), 1e-12) << "output " << k << " element " << i;
      }
    }
}

// A LogSoftmax read by something else too, or over another axis, stays; the loss is lowered alone.
TEST(LowerNll, LogSoftmaxWithOtherReadersStays) {
  auto g = build("param %z : f64[4,5]\n const %t : i64[4] = [0, 3, 2, 3]\n %x : f64[4,5] = LogSoftmax(%z) {axis = 1}\n"
                 " %l : f64[] = NegativeLogLikelihoodLoss(%x, %t)\n %e : f64[4,5] = Exp(%x)\n output %l\n output %e",
                 3);
  ASSERT_TRUE(createLowerNllPass()->run(*g));
  verify(*g);
  EXPECT_EQ(count(*g, "LogSoftmax"), 1);
  EXPECT_EQ(count(*g, "SoftmaxCrossEntropyLoss"), 0);
  EXPECT_EQ(count(*g, "GatherElements"), 1);
  EXPECT_EQ(g->outputs()[0]->name(), "l");
}

// torch.nan_to_num's IsInf(Cast(x, f64)) and an IsNaN of an f16 -> f32 Cast read x itself, the same
// answers on NaN, infinities and numbers; the f64 Cast goes, the f32 one with another reader stays.
TEST(NarrowChecks, ChecksOfAWideningCastReadItsSource) {
  const std::string text =
      "graph \"g\" opset 17 {\n  input %x : f32[6]\n  input %h : f16[6]\n"
      "  %d : f64[6] = Cast(%x) {to = 11}\n  %i : bool[6] = IsInf(%d) {detect_negative = 0}\n"
      "  %w : f32[6] = Cast(%h) {to = 1}\n  %n : bool[6] = IsNaN(%w)\n  %e : f32[6] = Exp(%w)\n"
      "  output %i\n  output %n\n  output %e\n}\n";
  auto g = parseGraph(text);
  g->bindOps();
  auto before = parseGraph(text);
  before->bindOps();
  ASSERT_TRUE(createNarrowChecksPass()->run(*g));
  verify(*g);
  EXPECT_EQ(count(*g, "Cast"), 1);
  for (const auto& n : g->nodes())
    for (size_t i = 0; i < n->numInputs(); ++i) EXPECT_NE(n->input(i)->type().dtype, DType::f64) << n->describe();
  const double inf = INFINITY;
  std::map<std::string, Tensor> in{{"x", Tensor::fromDoubles(DType::f32, {6}, {1.0, inf, -inf, NAN, 0.0, 3e38})},
                                   {"h", Tensor::fromDoubles(DType::f16, {6}, {NAN, 1.0, inf, -inf, 65504.0, 0.0})}};
  auto backend = createCpuBackend();
  const auto a = evaluate(*before, in, *backend), b = evaluate(*g, in, *backend);
  for (size_t k = 0; k < 2; ++k)
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(a[k].getDouble(i), b[k].getDouble(i)) << "output " << k << " element " << i;
}

// The forms the exporters write (dynamo's Llama: Pow, ReduceMean over an axes input, Reciprocal of
// Sqrt, then weight * normed; TorchScript's: axes attribute, Div(1, Sqrt); Gemma's (1 + w); ampc's
// own import of RMSNormalization: Mul(x, x) and Div(x, Sqrt); Pow(a, -0.5) without a weight; two
// trailing axes; Llama's no-op Cast before the weight) each become one RmsNorm, and the loss and
// the gradients of x and w equal the unfused graph's on fresh random data, for the CUDA target and the
// CPU one. (eps is 2^-20 or 2^-10: an f64 eps that the op's float
// attribute does not hold exactly keeps the norm unfused, OtherFormsStay.)
TEST(FuseRmsNorm, ExportersFormsBecomeOneOpWithTheSameLossAndGradients) {
  const std::string head = "param %x : f64[3,5,8]\n param %w : f64[8]\n param %k : f64[3,5,8]\n const %two : f64[] = [2]\n"
                           " const %ax : i64[1] = [-1]\n const %eps : f64[] = [9.5367431640625e-07]\n const %one : f64[] = [1]\n";
  const std::string mean = " %q : f64[3,5,8] = Pow(%x, %two)\n %m : f64[3,5,1] = ReduceMean(%q, %ax) {keepdims = 1}\n"
                           " %a : f64[3,5,1] = Add(%m, %eps)\n %s : f64[3,5,1] = Sqrt(%a)\n";
  const std::string loss = " %p : f64[3,5,8] = Mul(%y, %k)\n %l : f64[] = ReduceSum(%p) {keepdims = 0}\n output %l";
  const struct {
    const char* name;
    std::string body;
  } cases[] = {
      {"dynamo", head + mean + " %r : f64[3,5,1] = Reciprocal(%s)\n %n : f64[3,5,8] = Mul(%x, %r)\n %y : f64[3,5,8] = Mul(%w, %n)\n" + loss},
      {"torchscript", head + " %q : f64[3,5,8] = Pow(%x, %two)\n %m : f64[3,5,1] = ReduceMean(%q) {axes = [-1], keepdims = 1}\n"
                             " %a : f64[3,5,1] = Add(%eps, %m)\n %s : f64[3,5,1] = Sqrt(%a)\n %r : f64[3,5,1] = Div(%one, %s)\n"
                             " %n : f64[3,5,8] = Mul(%r, %x)\n %y : f64[3,5,8] = Mul(%n, %w)\n" + loss},
      {"gemma", head + mean + " %r : f64[3,5,1] = Reciprocal(%s)\n %n : f64[3,5,8] = Mul(%x, %r)\n %w1 : f64[8] = Add(%w, %one)\n"
                              " %y : f64[3,5,8] = Mul(%n, %w1)\n" + loss},
      {"import", head + " %q : f64[3,5,8] = Mul(%x, %x)\n %m : f64[3,5,1] = ReduceMean(%q, %ax) {keepdims = 1}\n"
                        " %a : f64[3,5,1] = Add(%m, %eps)\n %s : f64[3,5,1] = Sqrt(%a)\n %n : f64[3,5,8] = Div(%x, %s)\n"
                        " %y : f64[3,5,8] = Mul(%n, %w)\n" + loss},
      {"pow_no_weight", head + " const %mh : f64[] = [-0.5]\n %q : f64[3,5,8] = Pow(%x, %two)\n"
                               " %m : f64[3,5,1] = ReduceMean(%q, %ax) {keepdims = 1}\n %a : f64[3,5,1] = Add(%m, %eps)\n"
                               " %r : f64[3,5,1] = Pow(%a, %mh)\n %y : f64[3,5,8] = Mul(%r, %x)\n" + loss},
      {"two_axes", "param %x : f64[3,5,8]\n param %w : f64[5,8]\n param %k : f64[3,5,8]\n const %two : f64[] = [2]\n"
                   " const %ax : i64[2] = [1, 2]\n const %eps : f64[] = [0.0009765625]\n %q : f64[3,5,8] = Pow(%x, %two)\n"
                   " %m : f64[3,1,1] = ReduceMean(%q, %ax) {keepdims = 1}\n %a : f64[3,1,1] = Add(%m, %eps)\n %s : f64[3,1,1] = Sqrt(%a)\n"
                   " %r : f64[3,1,1] = Reciprocal(%s)\n %n : f64[3,5,8] = Mul(%x, %r)\n %y : f64[3,5,8] = Mul(%w, %n)\n" + loss},
      {"cast_before_weight", head + mean + " %r : f64[3,5,1] = Reciprocal(%s)\n %n : f64[3,5,8] = Mul(%x, %r)\n"
                                           " %c : f64[3,5,8] = Cast(%n) {to = 11}\n %y : f64[3,5,8] = Mul(%w, %c)\n" + loss},
  };
  for (const auto& c : cases)
    for (const uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(c.name);
      auto fused = build(c.body, seed, 18);
      ASSERT_TRUE(createFuseRmsNormPass(findTarget(seed == 1 ? "cuda" : "cpu"))->run(*fused));
      verify(*fused);
      EXPECT_EQ(count(*fused, "RmsNorm"), 1);
      for (const char* gone : {"ReduceMean", "Sqrt", "Reciprocal", "Pow", "Div", "Cast"}) EXPECT_EQ(count(*fused, gone), 0) << gone;
      EXPECT_EQ(count(*fused, "Mul"), 1);  // the loss's, by k
      const auto want = lossAndGrad(build(c.body, seed, 18)), got = lossAndGrad(std::move(fused));
      const bool weighted = std::string(c.name) != "pow_no_weight";
      ASSERT_EQ(want.size(), weighted ? 4u : 3u);  // the loss, and the gradients of x, (w) and k
      expectSameOutputs(want, got);
    }
}

// Not an RMS norm, or one whose pieces are read elsewhere: a mean over a leading axis, the mean
// also an output, eps not a constant, a cube instead of the square, a mean without keepdims, an f64
// eps of 1e-6 (the op's float epsilon would change it). Nothing changes.
TEST(FuseRmsNorm, OtherFormsStay) {
  const std::string head = "param %x : f64[3,5,8]\n param %w : f64[8]\n const %two : f64[] = [2]\n const %ax : i64[1] = [-1]\n"
                           " const %eps : f64[] = [9.5367431640625e-07]\n";
  const std::string tail = " %s : f64[3,5,1] = Sqrt(%a)\n %r : f64[3,5,1] = Reciprocal(%s)\n %n : f64[3,5,8] = Mul(%x, %r)\n"
                           " %y : f64[3,5,8] = Mul(%w, %n)\n output %y";
  const std::string square = " %q : f64[3,5,8] = Pow(%x, %two)\n";
  const std::string mean = " %m : f64[3,5,1] = ReduceMean(%q, %ax) {keepdims = 1}\n";
  const std::string cases[] = {
      head + " const %a1 : i64[1] = [1]\n" + square + " %m : f64[3,1,8] = ReduceMean(%q, %a1) {keepdims = 1}\n %a : f64[3,1,8] = Add(%m, %eps)\n"
                                                      " %s : f64[3,1,8] = Sqrt(%a)\n %r : f64[3,1,8] = Reciprocal(%s)\n %y : f64[3,5,8] = Mul(%x, %r)\n output %y",
      head + square + mean + " %a : f64[3,5,1] = Add(%m, %eps)\n" + tail + "\n output %m",
      head + " input %e : f64[]\n" + square + mean + " %a : f64[3,5,1] = Add(%m, %e)\n" + tail,
      head + " const %three : f64[] = [3]\n %q : f64[3,5,8] = Pow(%x, %three)\n" + mean + " %a : f64[3,5,1] = Add(%m, %eps)\n" + tail,
      head + square + " %m : f64[3,5] = ReduceMean(%q, %ax) {keepdims = 0}\n const %sh : i64[3] = [3, 5, 1]\n %mr : f64[3,5,1] = Reshape(%m, %sh)\n"
                      " %a : f64[3,5,1] = Add(%mr, %eps)\n" + tail,
      head + " const %e6 : f64[] = [1e-06]\n" + square + mean + " %a : f64[3,5,1] = Add(%m, %e6)\n" + tail,
  };
  for (const auto& body : cases) {
    SCOPED_TRACE(body);
    auto g = build(body, 4, 18);
    EXPECT_FALSE(createFuseRmsNormPass(findTarget("cpu"))->run(*g));
    EXPECT_EQ(count(*g, "RmsNorm"), 0);
  }
  // A weight that varies over the batch: the normalisation fuses with a scale of ones, the Mul stays.
  auto g = build("param %x : f64[3,5,8]\n param %w : f64[3,5,8]\n const %two : f64[] = [2]\n const %ax : i64[1] = [-1]\n"
                 " const %eps : f64[] = [9.5367431640625e-07]\n" + square + mean + " %a : f64[3,5,1] = Add(%m, %eps)\n" + tail,
                 5, 18);
  ASSERT_TRUE(createFuseRmsNormPass(findTarget("cpu"))->run(*g));
  EXPECT_EQ(count(*g, "RmsNorm"), 1);
  EXPECT_EQ(count(*g, "Mul"), 1);
}

// conv-pads (the cuda target, whose cuDNN convolutions pad a dim's two ends alike): a Conv whose pads
// differ at a dim's ends (explicit [0, 1, 2, 0]; auto_pad SAME_UPPER over an even window; SAME_LOWER
// with stride 2; 1-d) reads a zero Pad of its input and pads both ends by the smaller amount, and
// the loss and the gradients of x, w, b and k equal the graph's as written on fresh random data.
// The cpu target, and a Conv with even ends, are left alone.
TEST(ConvPads, UnevenEndsBecomeAPadWithTheSameLossAndGradients) {
  auto body = [](const std::string& x, const std::string& w, const std::string& y, const std::string& attrs) {
    return " param %x : f64" + x + "\n param %w : f64" + w + "\n param %b : f64[4]\n param %k : f64" + y + "\n %y : f64" + y +
           " = Conv(%x, %w, %b) {" + attrs + "} @conv\n %p : f64" + y + " = Mul(%y, %k)\n %l : f64[] = ReduceSum(%p) {keepdims = 0}\n output %l";
  };
  const struct {
    const char* name;
    std::string body;
    std::vector<int64_t> pads;  // the Conv's pads after the rewrite
  } cases[] = {
      {"explicit", body("[2,3,7,6]", "[4,3,3,2]", "[2,4,7,6]", "pads = [0, 1, 2, 0]"), {0, 0, 0, 0}},
      {"same_upper_even", body("[2,3,5,5]", "[4,3,2,2]", "[2,4,5,5]", "auto_pad = \"SAME_UPPER\""), {0, 0, 0, 0}},
      {"same_lower_stride2", body("[2,3,6,6]", "[4,3,3,3]", "[2,4,3,3]", "auto_pad = \"SAME_LOWER\", strides = [2, 2]"), {0, 0, 0, 0}},
      {"one_d", body("[2,3,9]", "[4,3,4]", "[2,4,9]", "pads = [2, 1]"), {1, 1}},
  };
  for (const auto& c : cases)
    for (const uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(c.name);
      auto cpu = build(c.body, seed);
      EXPECT_FALSE(createConvPadsPass(findTarget("cpu"))->run(*cpu));
      auto g = build(c.body, seed);
      ASSERT_TRUE(createConvPadsPass(findTarget("cuda"))->run(*g));
      verify(*g);
      EXPECT_EQ(count(*g, "Pad"), 1);
      const Node* conv = g->lookup("y")->producer();
      EXPECT_EQ(conv->getInts("pads"), c.pads);
      EXPECT_FALSE(conv->hasAttr("auto_pad"));
      EXPECT_EQ(conv->input(0)->producer()->op(), "Pad");
      const auto want = lossAndGrad(build(c.body, seed)), got = lossAndGrad(std::move(g));
      ASSERT_EQ(want.size(), 5u);  // the loss, and the gradients of x, w, b and k
      expectSameOutputs(want, got);
    }
  auto even = build(" param %x : f64[1,2,5,5]\n param %w : f64[2,2,3,3]\n %y : f64[1,2,5,5] = Conv(%x, %w) {pads = [1, 1, 1, 1]}\n"
                    " %l : f64[] = ReduceSum(%y) {keepdims = 0}\n output %l", 1);
  EXPECT_FALSE(createConvPadsPass(findTarget("cuda"))->run(*even));
  EXPECT_EQ(count(*even, "Pad"), 0);
}

// target-shapes (the cuda target): a MatMul operand that broadcasts over part of the batch ([1, 3]
// or [2, 1] of [2, 3], a rank-3 operand under a rank-4 batch) is expanded to the whole batch, and a
// Pad with negative amounts (crops, with or without axes, mixed with pads on other ends) reads a
// Slice and pads only; the loss and every gradient equal the graph's as written on fresh random
// data. Whole or single-matrix batches, non-negative pads and the cpu target are left alone.
TEST(TargetShapes, PartialBatchesAndCropsBecomeWhatTheKernelsTakeWithTheSameGradients) {
  const std::string tail = " %l : f64[] = ReduceSum(%p) {keepdims = 0}\n output %l";
  auto product = [&](const std::string& a, const std::string& b) {  // to [2,3,4,6], weighted
    return " param %a : f64" + a + "\n param %b : f64" + b + "\n param %k : f64[2,3,4,6]\n %y : f64[2,3,4,6] = MatMul(%a, %b)\n"
           " %p : f64[2,3,4,6] = Mul(%y, %k)\n" + tail;
  };
  const struct {
    const char* name;
    std::string body;
    int expands, slices;
  } cases[] = {
      {"head_shared_b", product("[2,3,4,5]", "[1,3,5,6]"), 1, 0},
      {"both_partial", product("[2,1,4,5]", "[3,5,6]"), 2, 0},
      {"crop_and_pad",
       " param %x : f64[3,7,6]\n const %pads : i64[6] = [0, -2, 1, 1, 1, -3]\n param %k : f64[4,6,4]\n"
       " %y : f64[4,6,4] = Pad(%x, %pads)\n %p : f64[4,6,4] = Mul(%y, %k)\n" + tail, 0, 1},
      {"crop_axes",
       " param %x : f64[3,7,6]\n const %pads : i64[4] = [-1, 2, -2, -1]\n const %axes : i64[2] = [-1, 1]\n const %v : f64[] = [0.5]\n"
       " param %k : f64[3,8,3]\n %y : f64[3,8,3] = Pad(%x, %pads, %v, %axes)\n %p : f64[3,8,3] = Mul(%y, %k)\n" + tail, 0, 1},
  };
  for (const auto& c : cases)
    for (const uint64_t seed : {1u, 2u}) {
      SCOPED_TRACE(c.name);
      auto cpu = build(c.body, seed, 18);
      EXPECT_FALSE(createTargetShapesPass(findTarget("cpu"))->run(*cpu));
      auto g = build(c.body, seed, 18);
      ASSERT_TRUE(createTargetShapesPass(findTarget("cuda"))->run(*g));
      verify(*g);
      EXPECT_EQ(count(*g, "Expand"), c.expands);
      EXPECT_EQ(count(*g, "Slice"), c.slices);
      for (const auto& n : g->nodes()) {
        if (n->op() == "MatMul") {  // each operand one matrix or the whole batch
          for (size_t i = 0; i < 2; ++i) {
            const auto& s = n->input(i)->type().shape;
            int64_t count = 1;
            for (size_t d = 0; d + 2 < s.size(); ++d) count *= s[d];
            const auto& y = n->result(0)->type().shape;
            EXPECT_TRUE(count == 1 || std::equal(s.begin(), s.end() - 2, y.end() - static_cast<std::ptrdiff_t>(s.size()), y.end() - 2)) << i;
          }
        }
        if (n->op() == "Pad")
          for (int64_t i = 0; i < n->input(1)->constData()->numel(); ++i) EXPECT_GE(n->input(1)->constData()->getInt(i), 0);
      }
      const auto want = lossAndGrad(build(c.body, seed, 18)), got = lossAndGrad(std::move(g));
      expectSameOutputs(want, got);
    }
  auto whole = build(" param %a : f64[2,3,4,5]\n param %b : f64[5,6]\n param %c : f64[2,3,6,2]\n %y : f64[2,3,4,6] = MatMul(%a, %b)\n"
                     " %z : f64[2,3,4,2] = MatMul(%y, %c)\n const %pads : i64[8] = [0, 0, 1, 0, 0, 0, 0, 2]\n"
                     " %q : f64[2,3,5,4] = Pad(%z, %pads)\n %l : f64[] = ReduceSum(%q) {keepdims = 0}\n output %l", 1, 18);
  EXPECT_FALSE(createTargetShapesPass(findTarget("cuda"))->run(*whole));
}

// attach-loss (`ampc --loss`): a model exported without its loss gets PyTorch's: cross-entropy over
// classes on axis 1 and, with class axis -1, on the last axis of [B, T, V] logits (an ignored target
// among them; with and without label smoothing; shifted as a causal LM's labels), mse, l1 and binary cross-entropy with logits, each against the definition computed
// here in f64 on fresh random data, and its gradients against the graph's own loss written out
// (the rows below); the other outputs are dropped. A scalar output, an unknown output, a target
// name the graph has and a class axis in the middle are refused by name.
TEST(AttachLoss, PyTorchLossesOnAModelWithoutOne) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](const TensorType& t, int64_t classes = 0) {
    Tensor x(t);
    for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, classes ? static_cast<double>(rng() % classes) : normal(rng));
    return x;
  };
  const struct {
    std::string kind;
    int64_t classAxis;
    std::vector<int64_t> y;  // the output's shape
    double smoothing = 0.0;
    bool shift = false;  // a causal LM's: logits at t against the target at t + 1
  } cases[] = {{"cross-entropy", 1, {6, 4}}, {"cross-entropy", 1, {3, 4, 5}}, {"cross-entropy", -1, {2, 3, 4}},
               {"cross-entropy", 1, {3, 4, 5}, 0.1}, {"cross-entropy", -1, {2, 3, 4}, 0.25}, {"cross-entropy", -1, {2, 4, 5}, 0.0, true},
               {"mse", 1, {6, 4}}, {"l1", 1, {6, 4}}, {"bce-with-logits", 1, {6, 4}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.kind + " " + std::to_string(c.classAxis) + " rank " + std::to_string(c.y.size()) + " smoothing " + std::to_string(c.smoothing));
    // y = x * w (w broadcast over the rows), plus a second output the loss does not read.
    std::string dims, wdims;
    for (int64_t d : c.y) dims += (dims.empty() ? "" : ",") + std::to_string(d);
    auto g = build(" input %x : f64[" + dims + "]\n param %w : f64[" + std::to_string(c.y.back()) + "]\n %y : f64[" + dims +
                       "] = Mul(%x, %w)\n %z : f64[" + dims + "] = Exp(%y)\n output %y\n output %z",
                   7);
    LossOptions o;
    o.kind = c.kind;
    o.classAxis = c.classAxis;
    o.labelSmoothing = c.smoothing;
    o.shiftTargets = c.shift;
    ASSERT_TRUE(createAttachLossPass(o)->run(*g));
    verify(*g);
    ASSERT_EQ(g->outputs().size(), 1u);
    EXPECT_EQ(g->outputs()[0]->type().rank(), 0);
    EXPECT_EQ(g->lookup("z"), nullptr);  // dropped with the output
    const bool ce = c.kind == "cross-entropy";
    const int64_t r = static_cast<int64_t>(c.y.size()), axis = c.classAxis < 0 ? r - 1 : 1, classes = c.y[static_cast<size_t>(axis)];
    std::vector<int64_t> ts = c.y;
    if (ce) ts.erase(ts.begin() + axis);
    Tensor x = random(TensorType{DType::f64, c.y}), t = ce ? random(TensorType{DType::i64, ts}, classes) : random(TensorType{DType::f64, ts});
    if (ce) t.setDouble(1, -100.0);  // ignored
    const Tensor w = *g->lookup("w")->data();  // a copy: the differences below replace the data
    auto backend = createCpuBackend();
    const double got = evaluate(*g, {{"x", x}, {"target", t}}, *backend)[0].getDouble(0);
    // The definition.
    auto yAt = [&](int64_t i) { return x.getDouble(i) * w.getDouble(i % c.y.back()); };
    double want = 0;
    if (ce && c.shift) {  // [B, T, V]: row (b, t) against target (b, t + 1)
      const int64_t T = c.y[1], V = c.y[2];
      double sum = 0;
      int64_t count = 0;
      for (int64_t b = 0; b < c.y[0]; ++b)
        for (int64_t tt = 0; tt + 1 < T; ++tt) {
          const int64_t label = t.getInt(b * T + tt + 1);
          if (label == -100) continue;
          double mx = -1e300, z = 0;
          for (int64_t k = 0; k < V; ++k) mx = std::max(mx, yAt((b * T + tt) * V + k));
          for (int64_t k = 0; k < V; ++k) z += std::exp(yAt((b * T + tt) * V + k) - mx);
          sum += -(yAt((b * T + tt) * V + label) - mx - std::log(z));
          ++count;
        }
      want = sum / static_cast<double>(count);
    } else if (ce) {
      // element (outer o, class k, inner n) of y, for classes on `axis`
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= c.y[static_cast<size_t>(d)];
      for (int64_t d = axis + 1; d < r; ++d) inner *= c.y[static_cast<size_t>(d)];
      double sum = 0;
      int64_t count = 0;
      for (int64_t oi = 0; oi < outer; ++oi)
        for (int64_t n = 0; n < inner; ++n) {
          const int64_t label = t.getInt(oi * inner + n);
          if (label == -100) continue;
          double mx = -1e300, z = 0, all = 0;
          for (int64_t k = 0; k < classes; ++k) mx = std::max(mx, yAt((oi * classes + k) * inner + n));
          for (int64_t k = 0; k < classes; ++k) z += std::exp(yAt((oi * classes + k) * inner + n) - mx);
          for (int64_t k = 0; k < classes; ++k) all += -(yAt((oi * classes + k) * inner + n) - mx - std::log(z));
          sum += (1 - c.smoothing) * -(yAt((oi * classes + label) * inner + n) - mx - std::log(z)) + c.smoothing * all / static_cast<double>(classes);
          ++count;
        }
      want = sum / static_cast<double>(count);
    } else {
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double y = yAt(i), tt = t.getDouble(i);
        want += c.kind == "mse" ? (y - tt) * (y - tt) : c.kind == "l1" ? std::fabs(y - tt) : std::max(y, 0.0) - y * tt + std::log1p(std::exp(-std::fabs(y)));
      }
      want /= static_cast<double>(x.numel());
    }
    EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::fabs(want)));
    // The gradient of w against central differences.
    auto gg = parseGraph(printGraph(*g), "copy");
    for (Value* p : g->params()) gg->lookup(p->name())->setData(*p->data());
    for (Value* k : g->consts()) gg->lookup(k->name())->setData(*k->data());
    createAutodiffPass()->run(*gg);
    const Tensor dw = evaluate(*gg, {{"x", x}, {"target", t}}, *backend)[1];
    for (int64_t i = 0; i < w.numel(); ++i) {
      Tensor base = w, p = w;
      const double h = 1e-6;
      p.setDouble(i, base.getDouble(i) + h);
      g->lookup("w")->setData(p);
      const double lp = evaluate(*g, {{"x", x}, {"target", t}}, *backend)[0].getDouble(0);
      p.setDouble(i, base.getDouble(i) - h);
      g->lookup("w")->setData(p);
      const double lm = evaluate(*g, {{"x", x}, {"target", t}}, *backend)[0].getDouble(0);
      g->lookup("w")->setData(base);
      EXPECT_NEAR(dw.getDouble(i), (lp - lm) / (2 * h), 1e-6 * std::max(1.0, std::fabs(dw.getDouble(i)))) << i;
    }
  }
  auto expectError = [&](const std::string& body, LossOptions o, const std::string& want) {
    auto g = build(body, 1);
    try {
      createAttachLossPass(o)->run(*g);
      ADD_FAILURE() << "no error for " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  LossOptions ce;
  ce.kind = "cross-entropy";
  expectError(" input %x : f64[3]\n %l : f64[] = ReduceSum(%x) {keepdims = 0}\n output %l", ce, "already a scalar");
  expectError(" input %target : f64[3,2]\n %y : f64[3,2] = Exp(%target)\n output %y", ce, "'target' names a value the graph has");
  LossOptions named = ce;
  named.output = "nope";
  expectError(" input %x : f64[3,2]\n %y : f64[3,2] = Exp(%x)\n output %y", named, "no output 'nope' (its outputs: y)");
  LossOptions middle = ce;
  middle.classAxis = 2;
  expectError(" input %x : f64[3,2,4,5]\n %y : f64[3,2,4,5] = Exp(%x)\n output %y", middle, "--class-axis 2");
}

// dense-experts (passes/dense_experts.cpp): transformers' batched_mm experts, MatMul(GatherND(W, I),
// x) with identity Transposes around W and the gathered copy, as the dynamo exporter writes it,
// becomes one GEMM over every expert and a pick: the same loss and gradients (W's, x's) in f64, on
// fresh random weights, with indices from the end (-1) among them; the gathered copy goes. Where the
// experts are not fewer than K, or the copy has another reader, the graph stays.
TEST(DenseExperts, SameLossAndGradientsAsTheGatheredProduct) {
  auto body = [](int64_t e, int64_t k, bool otherReader) {
    const std::string E = std::to_string(e), K = std::to_string(k);
    return "param %w : f64[" + E + ",6," + K + "]\n param %x : f64[5," + K + ",1]\n const %i : i64[5,1] = [2, 0, -1, 1, 2]\n"
           " %wt : f64[" + E + ",6," + K + "] = Transpose(%w) {perm = [0, 1, 2]}\n"
           " %g : f64[5,6," + K + "] = GatherND(%wt, %i)\n %gt : f64[5,6," + K + "] = Transpose(%g) {perm = [0, 1, 2]}\n"
           " %y : f64[5,6,1] = MatMul(%gt, %x)\n %q : f64[5,6,1] = Mul(%y, %y)\n %s : f64[] = ReduceSum(%q) {keepdims = 0}\n" +
           (otherReader ? " %o : f64[5,6," + K + "] = Exp(%gt)\n %os : f64[] = ReduceSum(%o) {keepdims = 0}\n %t : f64[] = Add(%s, %os)\n output %t"
                        : std::string(" output %s"));
  };
  for (const uint64_t seed : {1u, 2u}) {
    auto dense = build(body(3, 8, false), seed);
    ASSERT_TRUE(createDenseExpertsPass()->run(*dense));
    verify(*dense);
    EXPECT_EQ(count(*dense, "GatherND"), 0);
    EXPECT_EQ(count(*dense, "MatMul"), 0);
    EXPECT_EQ(count(*dense, "Transpose"), 0);
    EXPECT_EQ(count(*dense, "Gemm"), 1);
    EXPECT_EQ(count(*dense, "GatherElements"), 1);
    expectSameOutputs(lossAndGrad(build(body(3, 8, false), seed)), lossAndGrad(std::move(dense)));
  }
  for (const bool other : {false, true}) {
    auto g = build(body(other ? 3 : 8, 8, other), 3);
    EXPECT_FALSE(createDenseExpertsPass()->run(*g)) << (other ? "the gathered copy has another reader" : "8 experts of K 8");
    EXPECT_EQ(count(*g, "GatherND"), 1);
  }
}
