// passes/attention_mask.h: which attention masks are the causal one before the first step (the
// CUDA backend then runs cuDNN's causal graph, which makes the mask itself).
#include <cmath>

#include <gtest/gtest.h>

#include "compiler/ir/text.h"
#include "passes/attention_mask.h"

using namespace ampc;

namespace {

// A graph whose %m f32[1,2,T,T] is set from `fill(i, j)` (a constant), with %zero, %x (an input) and
// `extra` nodes after it.
std::unique_ptr<Graph> maskGraph(int64_t T, double (*fill)(int64_t, int64_t), const std::string& extra) {
  const std::string t = std::to_string(T), type = "f32[1,2," + t + "," + t + "]";
  std::string text = "graph \"m\" opset 18 {\n  input %x : " + type + "\n  const %m : " + type + " = ...\n  const %zero : f32[] = [0.0]\n";
  text += extra + "  output %out\n}\n";
  auto g = parseGraph(text, "mask");
  Tensor m(g->lookup("m")->type());
  for (int64_t e = 0; e < m.numel(); ++e) m.setDouble(e, fill((e / T) % T, e % T));
  g->lookup("m")->setData(m);
  return g;
}
double causal(int64_t i, int64_t j) { return j > i ? -3.4028234663852886e38 : 0.0; }
double causalInf(int64_t i, int64_t j) { return j > i ? -INFINITY : 0.0; }
double shifted(int64_t i, int64_t j) { return j > i + 1 ? -3.4028234663852886e38 : 0.0; }  // one key past the diagonal too
double shallow(int64_t i, int64_t j) { return j > i ? -1e4 : 0.0; }                         // exp() of it is not 0

}  // namespace

TEST(AttentionMask, TheCausalConstantAndOneComputedFromConstants) {
  for (auto* f : {causal, causalInf}) {
    auto g = maskGraph(80, f, "  %out : f32[1,2,80,80] = Add(%m, %zero)\n");
    EXPECT_TRUE(isCausalMask(g->lookup("m"), 80, 80));
    EXPECT_TRUE(isCausalMask(g->lookup("out"), 80, 80));  // computed in the step: evaluated here
    EXPECT_FALSE(isCausalMask(g->lookup("out"), 80, 79)) << "the scores' shape";
  }
}

TEST(AttentionMask, OtherMasksAreNot) {
  for (auto* f : {shifted, shallow}) {
    auto g = maskGraph(80, f, "  %out : f32[1,2,80,80] = Add(%m, %zero)\n");
    EXPECT_FALSE(isCausalMask(g->lookup("m"), 80, 80));
    EXPECT_FALSE(isCausalMask(g->lookup("out"), 80, 80));
  }
  // Causal values that depend on an input (here zero, but not known before the step).
  auto g = maskGraph(80, causal, "  %y : f32[1,2,80,80] = Mul(%x, %zero)\n  %out : f32[1,2,80,80] = Add(%m, %y)\n");
  EXPECT_FALSE(isCausalMask(g->lookup("out"), 80, 80));
  // A random op is no constant, whatever its operands.
  g = maskGraph(80, causal, "  const %r : f32[] = [0.0]\n  %out : f32[1,2,80,80], %keep : bool[1,2,80,80] = Dropout(%m, %r)\n");
  EXPECT_FALSE(isCausalMask(g->lookup("out"), 80, 80));
  // Past the evaluation budget: not known.
  g = maskGraph(80, causal, "  %out : f32[1,2,80,80] = Add(%m, %zero)\n");
  EXPECT_FALSE(isCausalMask(g->lookup("out"), 80, 80, 1000));
  EXPECT_TRUE(isCausalMask(g->lookup("out"), 80, 80, 2 * 80 * 80));
}
