// rematerialize (passes/rematerialize.cpp): a pointwise result read again far later is recomputed
// just before those reads, from operands that are live there anyway; otherwise nothing changes.
// sink-casts (passes/sink_casts.cpp): a widening Cast moves below the Transpose it feeds, exactly.
// cse (passes/cse.cpp): repeated work merges, random ops and graph outputs stay.
// fuse-linear (passes/fuse_linear.cpp): a dynamo export's linear layer becomes one Gemm.
// accumulate-gather-grads (passes/accumulate_gather_grads.cpp): a tied embedding's gradient sum.
// fuse-rotate-half (passes/fuse_rotate_half.cpp): rotary embeddings' rotate_half as one op.
// split-heads (passes/split_heads.cpp): timm's unbound q, k, v become a Split of the projection.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "compiler/ir/text.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"
#include "runtime/folds.h"
#include "passes/autodiff.h"
#include "passes/memory_plan.h"
#include "passes/pass.h"

using namespace ampc;

namespace {

// Lines %t1 ... %tN, each the Transpose of the one before (%t0 is the caller's): a gap of N nodes.
std::string transposes(int n, const std::string& type) {
  std::string t;
  for (int i = 1; i <= n; ++i) t += "  %t" + std::to_string(i) + " : " + type + " = Transpose(%t" + std::to_string(i - 1) + ")\n";
  return t;
}

// x -> a = MatMul -> s = OP(a) read by an early MatMul and, after a chain of `gap` Transposes, by
// `lateReader` (which reads `%s` or whatever it names); `tail` follows.
std::unique_ptr<Graph> graph(const std::string& op, const std::string& sIn, int gap, const std::string& lateReader, const std::string& tail) {
  std::string t = "graph \"g\" opset 17 {\n  input %x : f32[64,64]\n  input %w : f32[64,64]\n";
  t += "  %a : f32[64,64] = MatMul(%x, %w)\n  %s : f32[64,64] = " + op + "(" + sIn + ")\n  %c : f32[64,64] = Identity(%s)\n";
  t += "  %y0 : f32[64,64] = MatMul(%s, %w)\n  %t0 : f32[64,64] = Transpose(%y0)\n";
  t += transposes(gap, "f32[64,64]");
  t += "  %late : f32[64,64] = " + lateReader + "\n" + tail + "}\n";
  auto g = parseGraph(t);
  g->bindOps();
  verify(*g);
  return g;
}

const Node* producer(const Graph& g, const std::string& v) { return g.lookup(v)->producer(); }

// Both graphs on the CPU backend on the same inputs (element i of input v: fill(v, i)): their
// outputs, in order.
std::pair<std::vector<Tensor>, std::vector<Tensor>> evaluateBoth(const Graph& ref, const Graph& g,
                                                                 const std::function<double(const Value*, int64_t)>& fill,
                                                                 const ExecOptions& eo = {}) {
  std::map<std::string, Tensor> in;
  for (const Value* v : ref.inputs()) {
    Tensor x(v->type());
    for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, fill(v, i));
    in.emplace(v->name(), x);
  }
  auto cpu = createCpuBackend();
  return {evaluate(ref, in, *cpu, eo), evaluate(g, in, *cpu, eo)};
}

}  // namespace

TEST(Rematerialize, LateReadsOfAPointwiseResultGetACopy) {
  // %a is read after %late anyway (the Mul), so recomputing %s there keeps nothing longer alive.
  auto g = graph("Sigmoid", "%a", 20, "MatMul(%s, %t20)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  const MemoryPlan before = planMemory(*g);
  ASSERT_TRUE(createRematerializePass()->run(*g));
  verify(*g);
  const Node* late = producer(*g, "late");
  const Value* copy = late->inputs()[0];
  ASSERT_NE(copy, g->lookup("s"));
  EXPECT_EQ(copy->producer()->op(), "Sigmoid");
  EXPECT_EQ(copy->producer()->inputs()[0], g->lookup("a"));
  EXPECT_EQ(producer(*g, "y0")->inputs()[0], g->lookup("s")) << "the early read keeps the original";
  // The copy runs right before its reader.
  const Node* prev = nullptr;
  for (const auto& n : g->nodes()) {
    if (n.get() == late) break;
    prev = n.get();
  }
  EXPECT_EQ(prev, copy->producer());
  // %s is no longer held across the Transposes (position 10 is among them): one value fewer live.
  const MemoryPlan after = planMemory(*g);
  EXPECT_LE(after.peakLiveBytes, before.peakLiveBytes);
  EXPECT_EQ(liveAt(after, 10).size() + 1, liveAt(before, 10).size());
}

TEST(Rematerialize, ReadsThroughIdentity) {
  auto g = graph("Sigmoid", "%a", 20, "MatMul(%c, %t20)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  ASSERT_TRUE(createRematerializePass()->run(*g));
  const Value* copy = producer(*g, "late")->inputs()[0];
  EXPECT_NE(copy, g->lookup("c"));
  EXPECT_EQ(copy->producer()->op(), "Sigmoid");
}

// A late read through a view (the next GEMM reading the activation as rows): the copy gets the
// same view, made after it; an early read of the view keeps the original's.
TEST(Rematerialize, ReadsThroughAView) {
  std::string t = "graph \"g\" opset 17 {\n  input %x : f32[4,16,64]\n  input %w : f32[64,64]\n  const %rows : i64[2] = [64, 64]\n"
                  "  %a : f32[4,16,64] = MatMul(%x, %w)\n  %s : f32[4,16,64] = Sigmoid(%a)\n  %v : f32[64,64] = Reshape(%s, %rows)\n"
                  "  %y0 : f32[64,64] = MatMul(%v, %w)\n  %t0 : f32[64,64] = Transpose(%y0)\n";
  t += transposes(20, "f32[64,64]");
  t += "  %late : f32[64,64] = MatMul(%v, %t20)\n  %o : f32[4,16,64] = Mul(%a, %a)\n  %p : f32[64,64] = MatMul(%late, %w)\n"
       "  output %o\n  output %p\n}\n";
  auto ref = parseGraph(t), g = parseGraph(t);
  for (auto* x : {ref.get(), g.get()}) x->bindOps();
  ASSERT_TRUE(createRematerializePass()->run(*g));
  verify(*g);
  const Value* v2 = producer(*g, "late")->inputs()[0];
  ASSERT_NE(v2, g->lookup("v"));
  ASSERT_EQ(v2->producer()->op(), "Reshape");
  const Node* s2 = v2->producer()->inputs()[0]->producer();
  ASSERT_EQ(s2->op(), "Sigmoid");
  EXPECT_EQ(s2->inputs()[0], g->lookup("a"));
  EXPECT_EQ(producer(*g, "y0")->inputs()[0], g->lookup("v"));
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value*, int64_t i) { return 0.01 * static_cast<double>((i * 7) % 29) - 0.1; });
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
}

TEST(Rematerialize, LeavesWhatItCannotRecomputeForFree) {
  // %a dies before the late read: recomputing would hold it longer.
  auto dead = graph("Sigmoid", "%a", 20, "MatMul(%s, %t20)", "  output %late\n");
  EXPECT_FALSE(createRematerializePass()->run(*dead));
  // A near read (within the window) is not late.
  auto near = graph("Sigmoid", "%a", 4, "MatMul(%s, %t4)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  EXPECT_FALSE(createRematerializePass()->run(*near));
  // Only graph inputs as operands: a parameter's cast or the like is computed once.
  auto inputs = graph("Sigmoid", "%w", 20, "MatMul(%s, %t20)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  EXPECT_FALSE(createRematerializePass()->run(*inputs));
  // Not pointwise (no formula), and a node the backend's folds claim.
  auto soft = graph("Softmax", "%a", 20, "MatMul(%s, %t20)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  EXPECT_FALSE(createRematerializePass()->run(*soft));
  auto claimed = graph("Sigmoid", "%a", 20, "MatMul(%s, %t20)", "  %o : f32[64,64] = Mul(%a, %late)\n  output %o\n");
  EXPECT_FALSE(createRematerializePass([](const Node& n) { return n.op() == "Sigmoid"; })->run(*claimed));
}

// A batch norm under a pointwise op (EfficientNet's Conv -> BatchNorm -> SiLU): the SiLU's late
// reader (the next layer's weight gradient) and the batch norm's (the SiLU's gradient) both read
// copies, the SiLU's copy reading the batch norm's, which recomputes y from X (held for the batch
// norm's own gradient anyway) with the same batch statistics. The running statistics stay with the
// original, and every output keeps its bits.
TEST(Rematerialize, ABatchNormUnderAPointwiseOpRecomputesInAChain) {
  std::string t = "graph \"g\" opset 17 {\n  input %x : f32[64,64]\n  input %w : f32[64,64]\n";
  for (const char* p : {"gamma", "beta", "mean", "var"}) t += std::string("  input %") + p + " : f32[64]\n";
  t += "  %a : f32[64,64] = MatMul(%x, %w)\n"
       "  %n : f32[64,64], %rm : f32[64], %rv : f32[64] = BatchNormalization(%a, %gamma, %beta, %mean, %var) "
       "{epsilon = 1e-05, momentum = 0.9, training_mode = 1} @bn\n"
       "  %s : f32[64,64] = Sigmoid(%n) @act\n  %y0 : f32[64,64] = MatMul(%s, %w)\n  %t0 : f32[64,64] = Transpose(%y0)\n";
  t += transposes(20, "f32[64,64]");
  t += "  %late : f32[64,64] = MatMul(%s, %t20)\n  %dn : f32[64,64] = Mul(%late, %n)\n  %o : f32[64,64] = Add(%dn, %a)\n"
       "  output %o\n  output %rm\n  output %rv\n}\n";
  auto ref = parseGraph(t), g = parseGraph(t);
  for (auto* x : {ref.get(), g.get()}) {
    x->bindOps();
    verify(*x);
  }
  const MemoryPlan before = planMemory(*g);
  ASSERT_TRUE(createRematerializePass()->run(*g));
  verify(*g);
  const Value* s2 = producer(*g, "late")->inputs()[0];
  ASSERT_NE(s2, g->lookup("s"));
  ASSERT_EQ(s2->producer()->op(), "Sigmoid");
  const Value* n2 = s2->producer()->inputs()[0];
  ASSERT_NE(n2, g->lookup("n")) << "the SiLU's copy reads the batch norm's copy";
  const Node* bn2 = n2->producer();
  ASSERT_EQ(bn2->op(), "BatchNormalization");
  EXPECT_EQ(bn2->numResults(), 1u) << "the copy leaves the running statistics alone";
  EXPECT_EQ(bn2->inputs()[0], g->lookup("a"));
  EXPECT_EQ(bn2->getInt("training_mode", 0), 1);
  EXPECT_EQ(producer(*g, "dn")->inputs()[1], n2) << "the late read of y takes the copy";
  EXPECT_EQ(producer(*g, "rm"), producer(*g, "n"));
  EXPECT_EQ(producer(*g, "y0")->inputs()[0], g->lookup("s"));
  // Neither y nor the activation is held across the Transposes any more.
  const MemoryPlan after = planMemory(*g);
  EXPECT_EQ(liveAt(after, 12).size() + 2, liveAt(before, 12).size());
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value* v, int64_t i) { return v->name() == "var" ? 0.5 + 0.01 * (i % 7) : 0.13 * static_cast<double>((i * 7) % 29) - 1.7; });
  ASSERT_EQ(want.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
  // Excluded by the caller (runtime/lower.cpp excludes what the target's folds claim): nothing moves for it.
  auto kept = parseGraph(t);
  kept->bindOps();
  createRematerializePass([](const Node& n) { return n.op() == "BatchNormalization"; })->run(*kept);
  EXPECT_EQ(producer(*kept, "dn")->inputs()[1], kept->lookup("n"));
}

// A weight's bf16 cast (autocast's, at the step's start) read by the forward and again far later by
// the backward: with paramCasts the late reads take a recast placed before them, counted from the
// cast's first reader, and the CUDA schedule runs that recast where it stands, not in the
// forward's one launch of parameter casts (runtime/folds.cpp, groups). Without, nothing moves.
TEST(Rematerialize, TheBackwardRecastsAWeight) {
  std::string t = "graph \"g\" opset 17 {\n  input %x : bf16[64,64]\n  param %w : f32[64,64]\n  param %v : f32[64,64]\n"
                  "  %wb : bf16[64,64] = Cast(%w) {to = 16} @w/cast\n  %vb : bf16[64,64] = Cast(%v) {to = 16} @v/cast\n";
  for (int i = 0; i < 20; ++i) t += "  %n" + std::to_string(i) + " : bf16[64,64] = Neg(" + (i ? "%n" + std::to_string(i - 1) : "%x") + ")\n";
  t += "  %y0 : bf16[64,64] = MatMul(%n19, %wb)\n  %y1 : bf16[64,64] = MatMul(%y0, %vb)\n  %t0 : bf16[64,64] = Transpose(%y1)\n";
  t += transposes(20, "bf16[64,64]");
  t += "  %late : bf16[64,64] = MatMul(%t20, %wb)\n  output %late\n}\n";
  auto plain = parseGraph(t), g = parseGraph(t);
  for (auto* x : {plain.get(), g.get()}) {
    x->bindOps();
    verify(*x);
  }
  EXPECT_FALSE(createRematerializePass({}, false)->run(*plain));
  ASSERT_TRUE(createRematerializePass({}, true)->run(*g));
  verify(*g);
  const Value* copy = producer(*g, "late")->inputs()[1];
  ASSERT_NE(copy, g->lookup("wb"));
  EXPECT_EQ(copy->producer()->op(), "Cast");
  EXPECT_EQ(copy->producer()->inputs()[0], g->lookup("w"));
  EXPECT_EQ(producer(*g, "y0")->inputs()[1], g->lookup("wb")) << "the forward keeps the original";
  EXPECT_EQ(producer(*g, "y1")->inputs()[1], g->lookup("vb")) << "a weight read only near its first reader is not recast";
  // As the CUDA lowering groups them (passes/fuse_param_casts.cpp): the forward's casts one launch,
  // the recast its own, where it stands.
  const std::string recastName = copy->name();
  ASSERT_TRUE(createFuseParamCastsPass()->run(*g));
  verify(*g);
  const Node* forward = producer(*g, "wb");
  EXPECT_EQ(forward->op(), "MultiCast");
  EXPECT_EQ(producer(*g, "vb"), forward) << "the forward's casts: one launch";
  const Node* again = producer(*g, recastName);
  EXPECT_EQ(again->op(), "MultiCast");
  EXPECT_NE(again, forward);
  EXPECT_EQ(again->numResults(), 1u);
  std::map<const Node*, int> order;
  for (const auto& n : g->nodes()) order.emplace(n.get(), static_cast<int>(order.size()));
  EXPECT_GT(order.at(again), order.at(producer(*g, "t20"))) << "the recast runs where it stands";
}

// fuse-linear (passes/fuse_linear.cpp): nn.Linear as the dynamo exporter writes it,
// MatMul(X, Transpose(W)) + b, becomes Gemm(X as rows, W, b) {transB = 1} viewed back; a 2-D X needs
// no view; a MatMul by the transpose of anything but a parameter stays. The results agree with the
// graph as written (the bias now added to the sums before rounding: within an f32 rounding).
TEST(FuseLinear, ALinearLayerBecomesOneGemmWithItsBias) {
  const std::string text = R"(graph "g" opset 17 {
  input %x : f32[2,3,4]
  input %x2 : f32[3,4]
  param %w : f32[5,4]
  param %b : f32[5]
  %wt : f32[4,5] = Transpose(%w) {perm = [1, 0]}
  %y : f32[2,3,5] = MatMul(%x, %wt)
  %z : f32[2,3,5] = Add(%b, %y)
  %y2 : f32[3,5] = MatMul(%x2, %wt)
  %xt : f32[4,3] = Transpose(%x2) {perm = [1, 0]}
  %q : f32[3,3] = MatMul(%x2, %xt)
  output %z
  output %y2
  output %q
})";
  auto ref = parseGraph(text), g = parseGraph(text);
  for (auto* x : {ref.get(), g.get()}) {
    x->bindOps();
    for (const char* p : {"w", "b"}) {
      Value* v = x->lookup(p);
      Tensor t(v->type());
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, 0.11 * static_cast<double>((i * 7) % 13) - 0.6);
      v->setData(t);
    }
  }
  ASSERT_TRUE(createFuseLinearPass()->run(*g));
  verify(*g);
  const Node* z = producer(*g, "z");
  ASSERT_EQ(z->op(), "Reshape");
  const Node* gemm = z->inputs()[0]->producer();
  ASSERT_EQ(gemm->op(), "Gemm");
  EXPECT_EQ(gemm->getInt("transB", 0), 1);
  ASSERT_EQ(gemm->inputs().size(), 3u);
  EXPECT_EQ(gemm->inputs()[1], g->lookup("w"));
  EXPECT_EQ(gemm->inputs()[2], g->lookup("b"));
  EXPECT_EQ(gemm->inputs()[0]->type().str(), "f32[6,4]");
  const Node* y2 = producer(*g, "y2");
  ASSERT_EQ(y2->op(), "Gemm");
  EXPECT_EQ(y2->inputs()[0], g->lookup("x2"));
  EXPECT_EQ(y2->inputs().size(), 2u);
  EXPECT_EQ(producer(*g, "q")->op(), "MatMul") << "the transpose of an input is no layer's weight";
  EXPECT_EQ(g->lookup("wt"), nullptr) << "the weight's Transpose is gone";
  EXPECT_FALSE(createFuseLinearPass()->run(*g));
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value*, int64_t i) { return 0.37 * static_cast<double>((i * 5) % 17) - 2.5; });
  ASSERT_EQ(want.size(), 3u);
  for (size_t o = 0; o < 3; ++o) {
    ASSERT_EQ(got[o].type, want[o].type) << o;
    for (int64_t i = 0; i < want[o].numel(); ++i) EXPECT_NEAR(got[o].getDouble(i), want[o].getDouble(i), 1e-6 * (1 + std::fabs(want[o].getDouble(i)))) << o << " " << i;
  }
}

// split-heads (passes/split_heads.cpp): timm's q, k, v, unbound from a [3, B, H, T, d] permute of
// the projection (the dynamo exporter's Slices, the TorchScript exporter's Split into ones), become
// a Split of the projection with views and Transposes; k.transpose(-2, -1) over merged dims becomes
// one Transpose. The same bits either way.
TEST(SplitHeads, AnUnboundPermuteBecomesASplitOfTheProjection) {
  const std::string head = R"(graph "g" opset 18 {
  input %x : f32[2,5,24]
  const %shape : i64[5] = [2, 5, 3, 2, 4]
  const %zero : i64[1] = [0]
  const %one : i64[1] = [1]
  const %two : i64[1] = [2]
  const %three : i64[1] = [3]
  const %ones : i64[3] = [1, 1, 1]
  const %merged : i64[3] = [4, 5, 4]
  const %split : i64[4] = [2, 2, 4, 5]
  %v5 : f32[2,5,3,2,4] = Reshape(%x, %shape)
  %p : f32[3,2,2,5,4] = Transpose(%v5) {perm = [2, 0, 3, 1, 4]}
)";
  const std::string slices = R"(  %s0 : f32[1,2,2,5,4] = Slice(%p, %zero, %one, %zero)
  %q : f32[2,2,5,4] = Squeeze(%s0, %zero)
  %s1 : f32[1,2,2,5,4] = Slice(%p, %one, %two, %zero)
  %k : f32[2,2,5,4] = Squeeze(%s1, %zero)
  %s2 : f32[1,2,2,5,4] = Slice(%p, %two, %three, %zero)
  %v : f32[2,2,5,4] = Squeeze(%s2, %zero)
)";
  const std::string split = R"(  %s0 : f32[1,2,2,5,4], %s1 : f32[1,2,2,5,4], %s2 : f32[1,2,2,5,4] = Split(%p, %ones) {axis = 0}
  %q : f32[2,2,5,4] = Squeeze(%s0, %zero)
  %k : f32[2,2,5,4] = Squeeze(%s1, %zero)
  %v : f32[2,2,5,4] = Squeeze(%s2, %zero)
)";
  const std::string tail = R"(  %km : f32[4,5,4] = Reshape(%k, %merged)
  %kt3 : f32[4,4,5] = Transpose(%km) {perm = [0, 2, 1]}
  %kt : f32[2,2,4,5] = Reshape(%kt3, %split)
  %qk : f32[2,2,5,5] = MatMul(%q, %kt)
  %o : f32[2,2,5,4] = MatMul(%qk, %v)
  output %o
  output %kt
})";
  for (const auto& [form, cut] : {std::pair{"Slices", slices}, std::pair{"Split", split}}) {
    SCOPED_TRACE(form);
    auto ref = parseGraph(head + cut + tail), g = parseGraph(head + cut + tail);
    for (auto* x : {ref.get(), g.get()}) x->bindOps();
    ASSERT_TRUE(createSplitHeadsPass()->run(*g));
    verify(*g);
    int transposes = 0, splits = 0;
    for (const auto& n : g->nodes()) {
      transposes += n->op() == "Transpose";
      splits += n->op() == "Split";
      if (n->op() == "Transpose") {
        EXPECT_EQ(n->result(0)->type().rank(), 4) << "no 5-D permute, no merged-dims transpose";
      }
    }
    EXPECT_EQ(splits, 1);
    EXPECT_EQ(transposes, 4);  // q, k, v to [B, H, T, d], and K^T
    const Node* sp = producer(*g, "q")->inputs()[0]->producer()->inputs()[0]->producer();
    ASSERT_EQ(sp->op(), "Split");
    EXPECT_EQ(sp->inputs()[0], g->lookup("x"));
    const Node* kt = producer(*g, "kt");
    ASSERT_EQ(kt->op(), "Transpose");
    EXPECT_EQ(kt->getInts("perm"), (std::vector<int64_t>{0, 1, 3, 2}));
    EXPECT_EQ(kt->inputs()[0], g->lookup("k"));
    EXPECT_FALSE(createSplitHeadsPass()->run(*g));
    const auto [want, got] = evaluateBoth(*ref, *g, [](const Value*, int64_t i) { return 0.37 * static_cast<double>((i * 5) % 17) - 2.5; });
    ASSERT_EQ(want.size(), 2u);
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
  }
}

TEST(SinkCasts, AWideningCastMovesBelowItsTransposeExactly) {
  const std::string text =
      "graph \"g\" opset 17 {\n  input %x : bf16[2,6,5]\n  const %s : f32[6] = [1.0, 0.5, 2.0, 1.5, 1.0, 0.25]\n"
      "  const %b : f32[6] = [0.0, 0.1, -0.2, 0.3, 0.0, 1.0]\n"
      "  %w : f32[2,6,5] = Cast(%x) {to = 1}\n  %t : f32[2,5,6] = Transpose(%w) {perm = [0, 2, 1]}\n"
      "  %y : f32[2,5,6] = LayerNormalization(%t, %s, %b) {axis = -1}\n  output %y\n}\n";
  auto ref = parseGraph(text), g = parseGraph(text);
  for (auto* x : {ref.get(), g.get()}) {
    x->bindOps();
    verify(*x);
  }
  ASSERT_TRUE(createSinkCastsPass()->run(*g));
  verify(*g);
  const Node* ln = producer(*g, "y");
  const Node* cast = ln->inputs()[0]->producer();
  ASSERT_EQ(cast->op(), "Cast");
  const Node* tr = cast->inputs()[0]->producer();
  ASSERT_EQ(tr->op(), "Transpose");
  EXPECT_EQ(tr->inputs()[0], g->lookup("x"));
  EXPECT_EQ(tr->result(0)->type().str(), "bf16[2,5,6]");
  EXPECT_FALSE(createSinkCastsPass()->run(*g)) << "nothing left to move";
  // The same bits: a transpose moves values, a widening cast is exact.
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value*, int64_t i) { return 0.37 * static_cast<double>(i % 17) - 2.5; });
  ASSERT_EQ(want.size(), 1u);
  EXPECT_TRUE(got[0].data == want[0].data);
  // A Cast with another reader stays where it is.
  auto two = parseGraph(
      "graph \"g\" opset 17 {\n  input %x : bf16[2,6]\n  %w : f32[2,6] = Cast(%x) {to = 1}\n"
      "  %t : f32[6,2] = Transpose(%w) {perm = [1, 0]}\n  %n : f32[2,6] = Neg(%w)\n  output %t\n  output %n\n}\n");
  two->bindOps();
  EXPECT_FALSE(createSinkCastsPass()->run(*two));
}

// accumulate-gather-grads: a tied embedding's gradient, Add(GatherGrad(dY, idx), Cast(G)), becomes
// one GatherGrad that starts its sum from G (read through the widening Cast). The same values up to
// the order of the f32 sums; an Add that does not fit stays.
TEST(AccumulateGatherGrads, ATiedEmbeddingsGradientSumsIntoTheOtherPath) {
  const std::string text =
      "graph \"g\" opset 17 {\n  domain \"ampc\" 1\n  input %dy : f32[7,4]\n  input %idx : i64[7]\n  input %gb : bf16[5,4]\n"
      "  %gg : f32[5,4] = ampc::GatherGrad(%dy, %idx) {axis = 0, shape = [5, 4]}\n  %c : f32[5,4] = Cast(%gb) {to = 1}\n"
      "  %w_grad : f32[5,4] = Add(%c, %gg)\n  output %w_grad\n}\n";
  auto ref = parseGraph(text), g = parseGraph(text);
  for (auto* x : {ref.get(), g.get()}) {
    x->bindOps();
    verify(*x);
  }
  ASSERT_TRUE(createAccumulateGatherGradsPass()->run(*g));
  verify(*g);
  const Node* acc = producer(*g, "w_grad");  // the gradient keeps its name
  ASSERT_EQ(acc->op(), "GatherGrad");
  ASSERT_EQ(acc->inputs().size(), 3u);
  EXPECT_EQ(acc->inputs()[2], g->lookup("gb"));  // the Cast read through
  EXPECT_EQ(g->numNodes(), 1u);
  EXPECT_FALSE(createAccumulateGatherGradsPass()->run(*g));
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value* v, int64_t i) {
    return v->name() == "idx" ? static_cast<double>((i * 3) % 5) : 0.37 * static_cast<double>((i * 7) % 23) - 2.5;
  });
  ASSERT_EQ(want.size(), 1u);
  ASSERT_EQ(got[0].numel(), 20);
  for (int64_t i = 0; i < 20; ++i) EXPECT_NEAR(got[0].getDouble(i), want[0].getDouble(i), 1e-6 * (1 + std::abs(want[0].getDouble(i)))) << i;
  // The GatherGrad read elsewhere too, and an Add that broadcasts, stay.
  for (const char* body : {"  %w_grad : f32[5,4] = Add(%c, %gg)\n  output %w_grad\n  output %gg\n",
                           "  %r : f32[4] = Cast(%row) {to = 1}\n  %w_grad : f32[5,4] = Add(%gg, %r)\n  output %w_grad\n"}) {
    auto keep = parseGraph(
        "graph \"g\" opset 17 {\n  domain \"ampc\" 1\n  input %dy : f32[7,4]\n  input %idx : i64[7]\n  input %gb : bf16[5,4]\n"
        "  input %row : bf16[4]\n  %gg : f32[5,4] = ampc::GatherGrad(%dy, %idx) {axis = 0, shape = [5, 4]}\n"
        "  %c : f32[5,4] = Cast(%gb) {to = 1}\n" + std::string(body) + "}\n");
    keep->bindOps();
    EXPECT_FALSE(createAccumulateGatherGradsPass()->run(*keep)) << body;
  }
}

// fuse-rotate-half: rotary embeddings' rotate_half as both exporters write it (slices with an
// open end or an explicit one, axis -1 or the last index) becomes one ampc::RotateHalf, with the same
// bits forward and the same gradient through autodiff; a slice pair that is not the two halves, or
// a half read elsewhere, stays.
TEST(FuseRotateHalf, RotateHalfBecomesOneOpWithTheSameBitsAndGradient) {
  for (const char* ends : {"[9223372036854775807]", "[8]"})
    for (const char* axis : {"-1", "3"}) {
      const std::string text = std::string("graph \"g\" opset 17 {\n  param %x : f32[2,3,5,8]\n  const %z : i64[1] = [0]\n"
                                           "  const %h : i64[1] = [4]\n  const %e : i64[1] = ") + ends +
                               "\n  const %ax : i64[1] = [-1]\n  const %one : i64[1] = [1]\n"
                               "  %x1 : f32[2,3,5,4] = Slice(%x, %z, %h, %ax, %one)\n  %x2 : f32[2,3,5,4] = Slice(%x, %h, %e, %ax, %one)\n"
                               "  %n : f32[2,3,5,4] = Neg(%x2)\n  %r : f32[2,3,5,8] = Concat(%n, %x1) {axis = " + axis + "}\n"
                               "  %c : f32[2,3,5,8] = Cos(%x)\n  %p : f32[2,3,5,8] = Mul(%r, %c)\n  %s : f32[] = ReduceSum(%p) {keepdims = 0}\n"
                               "  output %s\n  output %r\n}\n";
      auto ref = parseGraph(text), g = parseGraph(text);
      for (auto* x : {ref.get(), g.get()}) {
        x->bindOps();
        Tensor xv(x->lookup("x")->type());
        for (int64_t i = 0; i < xv.numel(); ++i) xv.setDouble(i, 0.37 * static_cast<double>((i * 7) % 23) - 2.5);
        x->lookup("x")->setData(std::move(xv));
      }
      ASSERT_TRUE(createFuseRotateHalfPass()->run(*g)) << ends << " axis " << axis;
      verify(*g);
      const Node* rot = producer(*g, "r");
      ASSERT_EQ(rot->op(), "RotateHalf");
      EXPECT_EQ(rot->inputs()[0], g->lookup("x"));
      EXPECT_FALSE(createFuseRotateHalfPass()->run(*g));
      const auto fill = [](const Value*, int64_t i) { return 0.37 * static_cast<double>((i * 7) % 23) - 2.5; };
      const auto [want, got] = evaluateBoth(*ref, *g, fill);
      ASSERT_EQ(want.size(), 2u);
      EXPECT_TRUE(got[1].data == want[1].data);  // the rotation: the same bits
      // The gradient through the fused op equals the unfused graph's.
      for (auto* x : {ref.get(), g.get()}) {
        AutodiffOptions ao;
        ASSERT_TRUE(createAutodiffPass(ao)->run(*x));
      }
      const auto [gw, gg] = evaluateBoth(*ref, *g, fill);
      bool compared = false;
      for (size_t i = 0; i < ref->outputs().size(); ++i)
        if (ref->outputs()[i]->name() == "x_grad") {
          ASSERT_EQ(gg[i].numel(), 240);
          for (int64_t k = 0; k < 240; ++k) EXPECT_NEAR(gg[i].getDouble(k), gw[i].getDouble(k), 1e-6) << k;
          compared = true;
        }
      EXPECT_TRUE(compared);
    }
  // Not the halves (a slice of 3 from 1), and a half that is also read elsewhere: nothing changes.
  for (const char* variant : {"%x1 : f32[2,8] = Slice(%x, %z, %h, %ax, %one)\n  %x2 : f32[2,8] = Slice(%x, %h, %e, %ax, %one)\n"
                              "  %n : f32[2,8] = Neg(%x2)\n  %r : f32[2,16] = Concat(%n, %x1) {axis = -1}\n  output %r\n  output %x2\n",
                              "%x1 : f32[2,8] = Slice(%x, %z, %h, %ax, %one)\n  %x2 : f32[2,8] = Slice(%x, %h, %e, %ax, %one)\n"
                              "  %n : f32[2,8] = Neg(%x1)\n  %r : f32[2,16] = Concat(%n, %x2) {axis = -1}\n  output %r\n"}) {
    auto keep = parseGraph(std::string("graph \"g\" opset 17 {\n  input %x : f32[2,16]\n  const %z : i64[1] = [0]\n  const %h : i64[1] = [8]\n"
                                       "  const %e : i64[1] = [16]\n  const %ax : i64[1] = [-1]\n  const %one : i64[1] = [1]\n  ") +
                           variant + "}\n");
    keep->bindOps();
    EXPECT_FALSE(createFuseRotateHalfPass()->run(*keep)) << variant;
  }
}

// fold-transposes: Linear's backward as autodiff writes it over the dynamo exporter's
// MatMul(X, Transpose(W)) reads Transpose(Transpose(W)): that is W itself (no node left); a pair
// that does not undo itself becomes one Transpose with the composed perm. The same bits, and a
// Transpose that is a graph output stays.
TEST(FoldTransposes, ATransposeOfATransposeFolds) {
  const std::string text =
      "graph \"g\" opset 17 {\n  input %x : f32[3,4]\n  input %dy : f32[3,5]\n  input %a : f32[2,3,4]\n"
      "  %wt : f32[4,5] = Transpose(%w0) {perm = [1, 0]}\n  %y : f32[3,5] = MatMul(%x, %wt)\n"
      "  %wtt : f32[5,4] = Transpose(%wt) {perm = [1, 0]}\n  %dx : f32[3,4] = MatMul(%dy, %wtt)\n"
      "  %a1 : f32[3,4,2] = Transpose(%a) {perm = [1, 2, 0]}\n  %a2 : f32[4,2,3] = Transpose(%a1) {perm = [1, 2, 0]}\n"
      "  %o : f32[4,2,3] = Neg(%a2)\n  output %y\n  output %dx\n  output %o\n}\n";
  const std::string withW = std::string(text).insert(text.find("  input %x"), "  input %w0 : f32[5,4]\n");
  auto ref = parseGraph(withW), g = parseGraph(withW);
  for (auto* x : {ref.get(), g.get()}) x->bindOps();
  ASSERT_TRUE(createFoldTransposesPass()->run(*g));
  verify(*g);
  EXPECT_EQ(producer(*g, "dx")->inputs()[1], g->lookup("w0"));  // W itself
  const Node* t = producer(*g, "o")->inputs()[0]->producer();
  ASSERT_EQ(t->op(), "Transpose");
  EXPECT_EQ(t->inputs()[0], g->lookup("a"));
  EXPECT_EQ(t->getInts("perm"), (std::vector<int64_t>{2, 0, 1}));
  int transposes = 0;
  for (const auto& n : g->nodes()) transposes += n->op() == "Transpose";
  EXPECT_EQ(transposes, 2);  // W's (the forward reads it) and a's composed one
  EXPECT_FALSE(createFoldTransposesPass()->run(*g));
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value*, int64_t i) { return 0.37 * static_cast<double>((i * 7) % 23) - 2.5; });
  ASSERT_EQ(want.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
  auto out = parseGraph("graph \"g\" opset 17 {\n  input %x : f32[2,6]\n  %t : f32[6,2] = Transpose(%x) {perm = [1, 0]}\n"
                        "  %u : f32[2,6] = Transpose(%t) {perm = [1, 0]}\n  output %u\n}\n");
  out->bindOps();
  EXPECT_FALSE(createFoldTransposesPass()->run(*out));
}

// fold-transposes on a Gemm: dW^T = X^T dY (autodiff's weight gradient of MatMul(X, Transpose(W)))
// transposed into dW becomes one Gemm dY^T X, bitwise the same; transA/transB flip and swap; a
// Gemm with C, or read elsewhere, keeps its Transpose. A chain of three Transposes folds to one.
TEST(FoldTransposes, ATransposeOfAGemmSwapsItsOperands) {
  const std::string text =
      "graph \"g\" opset 17 {\n  input %x : f32[6,4]\n  input %dy : f32[6,5]\n  input %c : f32[4,5]\n  input %a : f32[2,3,4]\n"
      "  %dwt : f32[4,5] = Gemm(%x, %dy) {transA = 1, alpha = 0.5} @dw\n  %dw : f32[5,4] = Transpose(%dwt) {perm = [1, 0]}\n"
      "  %e : f32[4,5] = Gemm(%x, %dy, %c) {transA = 1}\n  %et : f32[5,4] = Transpose(%e) {perm = [1, 0]}\n"
      "  %a1 : f32[3,4,2] = Transpose(%a) {perm = [1, 2, 0]}\n  %a2 : f32[4,2,3] = Transpose(%a1) {perm = [1, 2, 0]}\n"
      "  %a3 : f32[2,3,4] = Transpose(%a2) {perm = [1, 2, 0]}\n  %o : f32[2,3,4] = Neg(%a3)\n"
      "  output %dw\n  output %et\n  output %o\n}\n";
  auto g = parseGraph(text);
  g->bindOps();
  ASSERT_TRUE(createFoldTransposesPass()->run(*g));  // the chain folds; %dw, an output, stays
  verify(*g);
  const Node* m = producer(*g, "dw");
  ASSERT_EQ(m->op(), "Transpose") << "an output Transpose stays";
  // The same with %dw read by a node: its Transpose folds into the Gemm.
  auto wrapped = parseGraph(std::string(text).replace(text.find("  output %dw"), 13, "  %dwn : f32[5,4] = Neg(%dw)\n  output %dwn\n"));
  auto wref = parseGraph(std::string(text).replace(text.find("  output %dw"), 13, "  %dwn : f32[5,4] = Neg(%dw)\n  output %dwn\n"));
  for (auto* x : {wrapped.get(), wref.get()}) x->bindOps();
  ASSERT_TRUE(createFoldTransposesPass()->run(*wrapped));
  verify(*wrapped);
  const Node* gemm = producer(*wrapped, "dw");
  ASSERT_EQ(gemm->op(), "Gemm");
  EXPECT_EQ(gemm->inputs()[0], wrapped->lookup("dy"));
  EXPECT_EQ(gemm->inputs()[1], wrapped->lookup("x"));
  EXPECT_EQ(gemm->getInt("transA", -1), 1);
  EXPECT_EQ(gemm->getInt("transB", -1), 0);
  EXPECT_FLOAT_EQ(gemm->getFloat("alpha", 0.0f), 0.5f);
  EXPECT_EQ(producer(*wrapped, "et")->op(), "Transpose");  // the Gemm with C keeps it
  EXPECT_EQ(producer(*wrapped, "o")->inputs()[0], wrapped->lookup("a"));  // three transposes undo each other
  const auto [want, got] = evaluateBoth(*wref, *wrapped, [](const Value*, int64_t i) { return 0.29 * static_cast<double>((i * 5) % 19) - 2.0; });
  ASSERT_EQ(want.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
}

// The dynamo exporter's per-layer mask: the same Slice and Where on the same boolean mask in every
// layer, and equal constants. CSE leaves one of each, and the graph computes the same bits; the two
// Dropouts on one input draw different masks and stay; a repeated node whose result is a graph
// output stays; a repeat with other attributes stays.
TEST(Cse, RepeatedWorkMergesRandomOpsAndOutputsStay) {
  const std::string text = R"(graph "g" opset 17 {
  input %m : bool[4,4]
  input %x : f32[4,4]
  const %zero : f32[] = [0.0]
  const %neg : f32[] = [-1e9]
  const %neg2 : f32[] = [-1e9]
  const %half : f32[] = [0.5]
  const %on : bool[] = [1]
  %w1 : f32[4,4] = Where(%m, %zero, %neg) @layer0/mask
  %w2 : f32[4,4] = Where(%m, %zero, %neg2) @layer1/mask
  %a1 : f32[4,4] = Add(%x, %w1) @layer0/add
  %a2 : f32[4,4] = Add(%x, %w2) @layer1/add
  %s1 : f32[4,4] = Softmax(%a1) {axis = -1} @layer0/softmax
  %s2 : f32[4,4] = Softmax(%a2) {axis = 0} @layer1/softmax
  %d1 : f32[4,4] = Dropout(%s1, %half, %on) @drop0
  %d2 : f32[4,4] = Dropout(%s1, %half, %on) @drop1
  %o1 : f32[4,4] = Add(%d1, %d2) @sum
  %o2 : f32[4,4] = Add(%d1, %d2) @sum_again
  %o3 : f32[4,4] = Mul(%o1, %s2) @out
  output %o2
  output %o3
})";
  auto ref = parseGraph(text), g = parseGraph(text);
  ASSERT_TRUE(createCsePass()->run(*g));
  verify(*g);
  auto count = [&](const std::string& op) {
    int k = 0;
    for (const auto& n : g->nodes()) k += n->op() == op;
    return k;
  };
  EXPECT_EQ(count("Where"), 1);    // %neg2 became %neg, so the second Where repeats the first
  EXPECT_EQ(count("Softmax"), 2);  // other axis
  EXPECT_EQ(count("Dropout"), 2);  // each draws its own stream
  EXPECT_EQ(count("Add"), 3);      // one mask add, %sum, and %sum_again (a graph output)
  EXPECT_EQ(g->lookup("neg2"), nullptr);
  EXPECT_FALSE(createCsePass()->run(*g));
  ExecOptions eo;
  eo.seed = 3;
  const auto [want, got] = evaluateBoth(*ref, *g, [](const Value* v, int64_t i) { return v->type().dtype == DType::boolean ? (i * 5 % 7 < 4) : 0.3 * (i % 9) - 1.1; }, eo);
  ASSERT_EQ(want.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
}
