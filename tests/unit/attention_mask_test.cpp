// passes/attention_mask.h: which attention masks are the causal one before the first step (the
// CUDA backend then runs cuDNN's causal graph, which makes the mask itself).
#include <cmath>
#include <regex>

#include <gtest/gtest.h>

#include "compiler/ir/text.h"
#include "compiler/ops/geometry.h"
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

// A causal LM's padding mask as transformers' sdpa masks export it (the Gemma and Llama form): the
// causal condition (a constant LessOrEqual of key and query positions) And the batch's padding row
// (GatherND of the input attention_mask), expanded, then Where(c, 0, lowest). Above the diagonal it
// masks whatever the input holds; its values are not known before the step (not the causal mask).
TEST(AttentionMask, CausalWithPaddingIsFoundWhateverTheInputs) {
  const std::string head = R"(graph "m" opset 18 {
  input %am : i64[2,6]
  const %kv : i64[1,1,1,6] = [0, 1, 2, 3, 4, 5]
  const %q : i64[1,1,6,1] = [0, 1, 2, 3, 4, 5]
  const %ax : i64[2] = [1, 2]
  const %shape : i64[4] = [2, 1, 6, 6]
  const %zero : f32[] = [0.0]
  const %low : f32[] = [-3.4028235e+38]
  %pad : bool[2,6] = Cast(%am) {to = 9}
  %pad4 : bool[2,1,1,6] = Unsqueeze(%pad, %ax)
)";
  const std::string where = "  %e : bool[2,1,6,6] = Expand(%c, %shape)\n  %out : f32[2,1,6,6] = Where(%e, %zero, %low)\n  output %out\n}\n";
  auto g = parseGraph(head + "  %le : bool[1,1,6,6] = LessOrEqual(%kv, %q)\n  %c : bool[2,1,6,6] = And(%le, %pad4)\n" + where, "gemma");
  EXPECT_TRUE(containsCausalMask(g->lookup("out"), 6, 6));
  EXPECT_FALSE(isCausalMask(g->lookup("out"), 6, 6));
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6, 100)) << "past the evaluation budget";
  // The key condition one past the diagonal: key i + 1 is kept whatever the input.
  g = parseGraph(head + "  const %one : i64[] = [1]\n  %q1 : i64[1,1,6,1] = Add(%q, %one)\n  %le : bool[1,1,6,6] = LessOrEqual(%kv, %q1)\n"
                        "  %c : bool[2,1,6,6] = And(%le, %pad4)\n" + where, "shifted");
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6));
  // Padding alone, and Or (kept where either holds: the input decides above the diagonal).
  g = parseGraph(head + "  %c : bool[2,1,6,6] = Expand(%pad4, %shape)\n" + where, "padding");
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6));
  g = parseGraph(head + "  %le : bool[1,1,6,6] = LessOrEqual(%kv, %q)\n  %c : bool[2,1,6,6] = Or(%le, %pad4)\n" + where, "or");
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6));
  // masked_fill's polarity: masked where Or(above the diagonal, padded) holds, Where(c, lowest, 0).
  g = parseGraph(head + "  %gt : bool[1,1,6,6] = Greater(%kv, %q)\n  %np : bool[2,1,1,6] = Not(%pad4)\n  %c : bool[2,1,6,6] = Or(%gt, %np)\n"
                        "  %e : bool[2,1,6,6] = Expand(%c, %shape)\n  %out : f32[2,1,6,6] = Where(%e, %low, %zero)\n  output %out\n}\n", "masked_fill");
  EXPECT_TRUE(containsCausalMask(g->lookup("out"), 6, 6));
  // An additive padding term: the sum is not known (the input could make it anything).
  g = parseGraph(head + "  %le : bool[1,1,6,6] = LessOrEqual(%kv, %q)\n  %cm : f32[1,1,6,6] = Where(%le, %zero, %low)\n"
                        "  %pf : f32[2,1,1,6] = Cast(%pad4) {to = 1}\n  %out : f32[2,1,6,6] = Add(%cm, %pf)\n  output %out\n}\n", "additive");
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6));
  EXPECT_TRUE(containsCausalMask(g->lookup("cm"), 6, 6)) << "the causal part alone, known";
}

// The older transformers form (TorchScript exports of Llama): the causal constant (lowest above the
// diagonal) plus the padding row, compared with 0, then masked_fill(lowest) over the causal constant.
// Above the diagonal both branches of the Where are lowest, so it is known there whatever the input.
TEST(AttentionMask, BranchesThatAgreeAreKnown) {
  auto g = parseGraph(R"(graph "m" opset 18 {
  input %am : i64[2,6]
  const %causal : f32[1,1,6,6] = ...
  const %ax : i64[2] = [1, 2]
  const %zero : f32[] = [0.0]
  const %low : f32[] = [-3.4028235e+38]
  %pf : f32[2,6] = Cast(%am) {to = 1}
  %p4 : f32[2,1,1,6] = Unsqueeze(%pf, %ax)
  %sum : f32[2,1,6,6] = Add(%causal, %p4)
  %eq : bool[2,1,6,6] = Equal(%sum, %zero)
  %out : f32[2,1,6,6] = Where(%eq, %low, %causal)
  output %out
}
)",
                      "older");
  Tensor c(g->lookup("causal")->type());
  for (int64_t e = 0; e < c.numel(); ++e) c.setDouble(e, e % 6 > e / 6 ? -3.4028234663852886e38 : 0.0);
  g->lookup("causal")->setData(c);
  EXPECT_TRUE(containsCausalMask(g->lookup("out"), 6, 6));
  EXPECT_FALSE(containsCausalMask(g->lookup("sum"), 6, 6)) << "an unknown term added";
  // The branches agree only below the diagonal: not causal.
  for (int64_t e = 0; e < c.numel(); ++e) c.setDouble(e, e % 6 < e / 6 ? -3.4028234663852886e38 : 0.0);
  g->lookup("causal")->setData(c);
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 6, 6));
}

// The batch's broadcasts stay unexpanded: transformers' causal-and-padding chain at B 8 is evaluated
// within a budget of 4 planes of T x T (the causal plane, its And with the unknown padding, the
// Where), where expanding every value to [8, 1, T, T] would need more than 24.
TEST(AttentionMask, BroadcastsAreNotExpanded) {
  auto g = parseGraph(R"(graph "m" opset 18 {
  input %am : i64[8,256]
  const %r0 : i64[] = [0]
  const %r1 : i64[] = [1]
  const %rT : i64[] = [256]
  const %skv : i64[4] = [1, 1, 1, 256]
  const %sq : i64[4] = [1, 1, 256, 1]
  const %shape : i64[4] = [8, 1, 256, 256]
  const %ax : i64[2] = [1, 2]
  const %zero : f32[] = [0.0]
  const %low : f32[] = [-3.4028235e+38]
  %pos : i64[256] = Range(%r0, %rT, %r1)
  %kv : i64[1,1,1,256] = Reshape(%pos, %skv)
  %q : i64[1,1,256,1] = Reshape(%pos, %sq)
  %pad : bool[8,256] = Cast(%am) {to = 9}
  %pad4 : bool[8,1,1,256] = Unsqueeze(%pad, %ax)
  %le : bool[1,1,256,256] = LessOrEqual(%kv, %q)
  %c : bool[8,1,256,256] = And(%le, %pad4)
  %e : bool[8,1,256,256] = Expand(%c, %shape)
  %out : f32[8,1,256,256] = Where(%e, %zero, %low)
  output %out
}
)",
                      "b8");
  EXPECT_TRUE(containsCausalMask(g->lookup("out"), 256, 256, 4 * 256 * 256));
  EXPECT_FALSE(containsCausalMask(g->lookup("out"), 256, 256, 2 * 256 * 256)) << "past the budget";
}

// Integers past a double's exact range are not taken as known, even where a double happens to hold
// them: positions 256 apart offset by 2^60 (a multiple of its ulp) would compare right, but the
// analysis does not claim what it cannot hold exactly in general.
TEST(AttentionMask, HugeIntegersAreNotKnown) {
  const std::string text = R"(graph "m" opset 18 {
  const %kv : i64[1,1,1,6] = [0, 256, 512, 768, 1024, 1280]
  const %q : i64[1,1,6,1] = [0, 256, 512, 768, 1024, 1280]
  const %big : i64[] = [OFFSET]
  const %zero : f32[] = [0.0]
  const %low : f32[] = [-3.4028235e+38]
  %kb : i64[1,1,1,6] = Add(%kv, %big)
  %qb : i64[1,1,6,1] = Add(%q, %big)
  %le : bool[1,1,6,6] = LessOrEqual(%kb, %qb)
  %m : f32[1,1,6,6] = Where(%le, %zero, %low)
  output %m
}
)";
  auto small = parseGraph(std::regex_replace(text, std::regex("OFFSET"), "1000"), "small");
  EXPECT_TRUE(containsCausalMask(small->lookup("m"), 6, 6));
  auto huge = parseGraph(std::regex_replace(text, std::regex("OFFSET"), "1152921504606846976"), "huge");
  EXPECT_FALSE(containsCausalMask(huge->lookup("m"), 6, 6));
}

// compiler/ops/geometry.h attentionMaskMap: how scores slice n (over the flattened leading dims)
// reads a mask: ONNX's broadcasting first (a run of the scores' own dims), else the periodic form
// fuse-attention writes for masks summed in a finer view (Swin's [1, nW H] over [B nW, H]).
TEST(AttentionMaskMap, BroadcastThenPeriodic) {
  AttentionMaskMap m;
  std::string why;
  auto at = [&](std::vector<int64_t> lead, std::vector<int64_t> mask) {
    why.clear();
    return attentionMaskMap(lead, 7, 7, mask, m, &why);
  };
  ASSERT_TRUE(at({4, 3}, {1, 3, 7, 7}));  // per head
  EXPECT_EQ(m.div, 1);
  EXPECT_EQ(m.mod, 3);
  ASSERT_TRUE(at({4, 3}, {4, 1, 1, 7}));  // per batch, one row
  EXPECT_EQ(m.div, 3);
  EXPECT_EQ(m.mod, 4);
  EXPECT_FALSE(m.rows);
  ASSERT_TRUE(at({4096, 3}, {1, 192, 7, 7}));  // one slice per window and head, 64 windows an image
  EXPECT_EQ(m.div, 1);
  EXPECT_EQ(m.mod, 192);
  ASSERT_TRUE(at({128, 3}, {8, 1, 7, 7}));  // a window mask alone: per window, over the heads
  EXPECT_EQ(m.div, 3);
  EXPECT_EQ(m.mod, 8);
  EXPECT_FALSE(at({4, 3}, {1, 5, 7, 7}));  // 12 slices do not repeat 5
  EXPECT_NE(why.find("do not repeat"), std::string::npos) << why;
  EXPECT_FALSE(at({4, 2, 3}, {2, 1, 3, 7, 7}));  // not one run: neither form
  EXPECT_FALSE(at({4, 3}, {1, 3, 5, 7}));         // Tq is neither 7 nor 1
  EXPECT_FALSE(at({4, 3}, {2, 4, 3, 7, 7}));      // more dims than the scores
}
