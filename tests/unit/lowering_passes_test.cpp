// Passes that put a model in terms every backend runs.
// lower-nll (passes/lower_nll.cpp): NegativeLogLikelihoodLoss becomes SoftmaxCrossEntropyLoss over a
// LogSoftmax's input, or GatherElements, weights and a reduction. On fresh random data the lowered
// graph gives the same loss and the same gradient as the op, in f64, for every reduction, with and
// without weights and ignore_index, over [N, C] and [N, C, d].
// narrow-checks (passes/narrow_checks.cpp): IsNaN and IsInf of a widening Cast read its operand.
#include <gtest/gtest.h>

#include <random>

#include "compiler/ir/text.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

std::unique_ptr<Graph> build(const std::string& body, uint64_t seed) {
  auto g = parseGraph("graph \"g\" opset 17 {\n" + body + "\n}\n", "case");
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
