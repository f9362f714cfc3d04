// OverflowWatch (runtime/overflow.h) on graphs evaluated by the CPU backend: the node it names is the
// first that made an Inf or NaN from operands without one, not a later node that only carried it.
#include <gtest/gtest.h>

#include "compiler/ir/text.h"
#include "runtime/evaluator.h"
#include "runtime/overflow.h"

using namespace ampc;

namespace {

// Runs g on `in` with a watch and returns it.
OverflowWatch watched(const Graph& g, const std::map<std::string, Tensor>& in) {
  OverflowWatch w(g);
  w.startStep();
  auto cpu = createCpuBackend();
  evaluate(g, in, *cpu, {}, {}, [&](const Node& n, const std::vector<const Tensor*>& i, const std::vector<Tensor>& o) { w.observe(n, i, o); });
  return w;
}

}  // namespace

// f16 overflow in a product: 300 x 300 = 90000 > 65504 in the Mul, carried (not made) by the Add and
// Relu after it.
TEST(Overflow, FirstNodeToMakeInfIsNamed) {
  auto g = parseGraph(R"(graph "o" opset 17 {
  input %x : f16[4]
  input %y : f16[4]
  %p : f16[4] = Mul(%x, %y) @prod
  %s : f16[4] = Add(%p, %x) @sum
  %r : f16[4] = Relu(%s) @relu
  output %r
}
)");
  const auto w = watched(*g, {{"x", Tensor::fromDoubles(DType::f16, {4}, {1, 2, 300, -4})}, {"y", Tensor::fromDoubles(DType::f16, {4}, {1, 2, 300, 5})}});
  ASSERT_TRUE(w.found());
  EXPECT_EQ(w.finding().node, "prod");
  EXPECT_EQ(w.finding().op, "Mul");
  EXPECT_EQ(w.finding().inf, 1);
  EXPECT_EQ(w.finding().nan, 0);
  EXPECT_EQ(w.finding().count, 4);
  EXPECT_EQ(w.finding().largestFinite, 20.0);  // -4 x 5
  EXPECT_FALSE(w.finding().scaled);  // no loss scale in this graph
  const std::string text = w.explain(7, 1.0);
  EXPECT_NE(text.find("step 7: overflow: node 'prod' (Mul) made 1 Inf"), std::string::npos) << text;
  EXPECT_NE(text.find("f16 holds up to 6.55e+04"), std::string::npos) << text;
  EXPECT_NE(text.find("the forward pass"), std::string::npos) << text;
  EXPECT_NE(text.find("--fp32-nodes 'prod'"), std::string::npos) << text;
  // In range: nothing to name.
  EXPECT_FALSE(watched(*g, {{"x", Tensor::fromDoubles(DType::f16, {4}, {1, 2, 3, 4})}, {"y", Tensor::fromDoubles(DType::f16, {4}, {1, 2, 3, 4})}}).found());
}

// A mask's -inf added to the scores is by design; the softmax of a row that is -inf everywhere makes
// NaN from operands without NaN, and is named.
TEST(Overflow, MaskedRowSoftmaxMakesNaN) {
  auto g = parseGraph(R"(graph "m" opset 17 {
  input %x : f32[2,3]
  input %m : f32[2,3]
  %s : f32[2,3] = Add(%x, %m) @masked
  %p : f32[2,3] = Softmax(%s) {axis = 1} @softmax
  output %p
}
)");
  const double inf = std::numeric_limits<double>::infinity();
  const auto w = watched(*g, {{"x", Tensor::fromDoubles(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6})},
                              {"m", Tensor::fromDoubles(DType::f32, {2, 3}, {0, -inf, 0, -inf, -inf, -inf})}});
  ASSERT_TRUE(w.found());
  EXPECT_EQ(w.finding().node, "softmax");
  EXPECT_EQ(w.finding().nan, 3);
  EXPECT_NE(w.explain(1, 1.0).find("undefined operation"), std::string::npos);
}
