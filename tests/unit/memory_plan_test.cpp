// Memory planning: live-overlapping values never share bytes, dead values are reused, and the
// arena of a real training step sits between the peak-live lower bound and no reuse at all.
#include <gtest/gtest.h>

#include <filesystem>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "compiler/target.h"
#include "passes/memory_plan.h"
#include "passes/pass.h"
#include "passes/train_step.h"
#include "runtime/folds.h"
#include "runtime/plan.h"

using namespace ampc;

TEST(MemoryPlan, ChainReusesDeadBuffers) {
  // a -> b -> c -> d, each 4 KiB, through Transpose (not elementwise, so no in-place): a is dead
  // once b exists, so c can take a's bytes.
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[32,32]
  %a : f32[32,32] = Transpose(%x)
  %b : f32[32,32] = Transpose(%a)
  %c : f32[32,32] = Transpose(%b)
  %d : f32[32,32] = Transpose(%c)
  output %d
}
)");
  MemoryPlan p = planMemory(*g);
  checkMemoryPlan(p);
  EXPECT_EQ(p.inPlace, 0);
  EXPECT_EQ(p.totalBytes, 4 * 4096);
  EXPECT_EQ(p.peakLiveBytes, 2 * 4096);
  EXPECT_EQ(p.arenaBytes, 2 * 4096);
  EXPECT_EQ(p.slots.at(g->lookup("a")).offset, p.slots.at(g->lookup("c")).offset);
  EXPECT_NE(p.slots.at(g->lookup("a")).offset, p.slots.at(g->lookup("b")).offset);
  // The peak: the first position where two values are live (b's Transpose reads a, writes b).
  EXPECT_EQ(p.peakAt, 1);
  const auto live = liveAt(p, p.peakAt);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_EQ(live[0].first->name(), "a");
  EXPECT_EQ(live[1].first->name(), "b");
  EXPECT_EQ(liveAt(p, 3).size(), 2u);  // c read, d written
  EXPECT_EQ(liveAt(p, 4).size(), 1u);  // after the step: d alone (an output)
  const std::string why = explainPeak(p, 5);
  EXPECT_NE(why.find("peak of live values 0.0 MiB at position 1 (2 values live)"), std::string::npos) << why;
  EXPECT_NE(why.find("2x Transpose"), std::string::npos) << why;
  EXPECT_NE(why.find("'b' f32[32,32] from"), std::string::npos) << why;
}

TEST(MemoryPlan, ElementwiseChainsRunInPlace) {
  // Relu -> Neg -> Abs each overwrite their input: one buffer. The Add reads %a after %b exists,
  // so %b cannot take %a's bytes; the graph output keeps its own.
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[1024]
  %t : f32[1024] = Transpose(%x)
  %r : f32[1024] = Relu(%t)
  %n : f32[1024] = Neg(%r)
  %s : f32[1024] = Abs(%n)
  %a : f32[1024] = Transpose(%s)
  %b : f32[1024] = Exp(%a)
  %c : f32[1024] = Add(%a, %b)
  output %c
}
)");
  MemoryPlan p = planMemory(*g);
  checkMemoryPlan(p);
  const auto off = [&](const char* n) { return p.slots.at(g->lookup(n)).offset; };
  EXPECT_EQ(off("t"), off("r"));
  EXPECT_EQ(off("r"), off("n"));
  EXPECT_EQ(off("n"), off("s"));
  EXPECT_NE(off("a"), off("b"));
  EXPECT_GE(p.inPlace, 3);
  EXPECT_LE(p.arenaBytes, 3 * 4096);
}

TEST(MemoryPlan, PositionsKeepOperandsAliveUntilTheWorkRuns) {
  // Without positions %c (born after %a's last use) takes %a's bytes. When node 1 (%b) runs at
  // node 2's position, as a fused launch or a computation inside its consumer does, %a is read
  // there, so %c must not share its bytes; %b itself is born there.
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[32,32]
  %a : f32[32,32] = Transpose(%x)
  %b : f32[32,32] = Transpose(%a)
  %c : f32[32,32] = Transpose(%x)
  %d : f32[32,32] = Sub(%b, %c)
  output %d
}
)");
  MemoryPlan plain = planMemory(*g);
  checkMemoryPlan(plain);
  EXPECT_EQ(plain.slots.at(g->lookup("a")).offset, plain.slots.at(g->lookup("c")).offset);
  MemoryPlan moved = planMemory(*g, {0, 2, 2, 3});
  checkMemoryPlan(moved);
  EXPECT_EQ(moved.slots.at(g->lookup("a")).last, 2);
  EXPECT_EQ(moved.slots.at(g->lookup("b")).first, 2);
  EXPECT_NE(moved.slots.at(g->lookup("a")).offset, moved.slots.at(g->lookup("c")).offset);
  EXPECT_THROW(planMemory(*g, {0, 1}), Error);  // one position per node
}

TEST(MemoryPlan, ViewsShareTheirInputsBytes) {
  // %v and %f are Reshape/Flatten views of %a: one buffer, live until the last of them is read.
  // Neither Relu(%a) nor Neg(%f) may overwrite that buffer: the Add reads %v after both.
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[32,32]
  const %s : i64[1] = [1024]
  %a : f32[32,32] = Transpose(%x)
  %v : f32[1024] = Reshape(%a, %s)
  %f : f32[32,32] = Flatten(%a)
  %r : f32[32,32] = Relu(%a)
  %n : f32[32,32] = Neg(%f)
  %w : f32[1024] = Reshape(%r, %s)
  %y : f32[1024] = Add(%v, %w)
  %z : f32[32,32] = Transpose(%n)
  output %y
  output %z
}
)");
  MemoryPlan p = planMemory(*g);
  checkMemoryPlan(p);
  const auto off = [&](const char* n) { return p.slots.at(g->lookup(n)).offset; };
  EXPECT_EQ(p.views, 3);
  EXPECT_EQ(off("a"), off("v"));
  EXPECT_EQ(off("a"), off("f"));
  EXPECT_EQ(off("r"), off("w"));
  EXPECT_NE(off("r"), off("a"));  // %v is read after the Relu
  EXPECT_EQ(p.slots.at(g->lookup("a")).group, p.slots.at(g->lookup("v")).group);
  EXPECT_NE(off("n"), off("f"));
  EXPECT_EQ(p.inPlace, 1);  // the Add overwrites %w (and so %r), read by nothing after it
  EXPECT_EQ(off("y"), off("r"));
}

TEST(MemoryPlan, InPlaceThroughAViewWhenTheGroupDies) {
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[32,32]
  const %s : i64[1] = [1024]
  %a : f32[32,32] = Transpose(%x)
  %v : f32[1024] = Reshape(%a, %s)
  %r : f32[1024] = Relu(%v)
  output %r
}
)");
  MemoryPlan p = planMemory(*g);
  checkMemoryPlan(p);
  EXPECT_EQ(p.views, 1);
  EXPECT_EQ(p.inPlace, 1);
  EXPECT_EQ(p.slots.at(g->lookup("a")).offset, p.slots.at(g->lookup("r")).offset);
  EXPECT_EQ(p.arenaBytes, 4096);
}

TEST(MemoryPlan, TrainingStepsOfTheModels) {
  for (const char* m : {"mlp", "cnn", "transformer"}) {
    auto g = importOnnxFile((std::filesystem::path(AMPC_SOURCE_DIR) / "models" / (std::string(m) + ".onnx")).string());
    createTrainStepPass(TrainOptions{})->run(*g);
    MemoryPlan p = planMemory(*g);
    EXPECT_NO_THROW(checkMemoryPlan(p)) << m;
    EXPECT_GE(p.arenaBytes, p.peakLiveBytes) << m;
    EXPECT_LT(p.arenaBytes, p.totalBytes) << m;
    std::printf("%s training step: %zu activations (%d in place), arena %lld bytes, peak live %lld, without reuse %lld\n", m,
                p.slots.size(), p.inPlace, static_cast<long long>(p.arenaBytes), static_cast<long long>(p.peakLiveBytes),
                static_cast<long long>(p.totalBytes));
  }
}

// The CUDA plan stores each optimizer result that the step writes back (STATE.next) in its state's
// own bytes, as PyTorch updates in place: the results and their .next names get no arena bytes,
// so the parameters and moments are not held twice at the step's end. A state that a node reads
// after the optimizer keeps its result apart.
TEST(MemoryPlan, OptimizerUpdatesTheStateInPlace) {
  for (const char* opt : {"sgd", "adamw"}) {
    auto g = importOnnxFile((std::filesystem::path(AMPC_SOURCE_DIR) / "models" / "cnn.onnx").string());
    TrainOptions o;
    o.optimizer = opt;
    o.momentum = 0.9f;
    createTrainStepPass(o)->run(*g);
    folds::Schedule s;
    const MemoryPlan p = planCudaMemory(*g, &s);
    int updates = 0;
    for (const Value* out : g->outputs()) {
      const std::string& n = out->name();
      if (n.size() < 5 || n.compare(n.size() - 5, 5, ".next") != 0 || !out->producer()) continue;
      const Value* state = g->lookup(n.substr(0, n.size() - 5));
      const Value* result = out->producer()->op() == "Identity" ? out->producer()->inputs()[0] : out;
      const Node* m = result->producer();
      if (!m || (m->op() != "SGD" && m->op() != "Adam")) continue;
      ++updates;
      ASSERT_TRUE(s.aliases.count(out)) << opt << ": " << n;
      EXPECT_EQ(s.aliases.at(out), state) << opt << ": " << n;
      EXPECT_EQ(s.aliases.at(result), state) << opt << ": " << n;
      EXPECT_EQ(p.slots.at(out).bytes, 0) << opt << ": " << n;
      EXPECT_EQ(p.slots.at(result).bytes, 0) << opt << ": " << n;
    }
    EXPECT_GE(updates, std::string(opt) == "sgd" ? 8 : 12) << opt;  // cnn: 4 params, each with its moment(s)
  }
  // A state read after the optimizer node: no alias.
  auto g = parseGraph(R"(graph "s" opset 17 {
  domain "ampc" 1
  param %p : f32[64]
  param %g : f32[64]
  param %b : f32[64]
  param %lr : f32[]
  param %found : bool[]
  %q : f32[64], %c : f32[64] = ampc::SGD(%p, %g, %b, %lr, %found) {momentum = 0.9}
  %late : f32[64] = Add(%p, %q)
  %p.next : f32[64] = Identity(%q)
  %b.next : f32[64] = Identity(%c)
  output %late
  output %p.next
  output %b.next
})");
  folds::Schedule s;
  planCudaMemory(*g, &s);
  EXPECT_FALSE(s.aliases.count(g->lookup("q")));
  EXPECT_FALSE(s.aliases.count(g->lookup("p.next")));
  EXPECT_EQ(s.aliases.count(g->lookup("c")), 1u);
  EXPECT_EQ(s.aliases.at(g->lookup("b.next")), g->lookup("b"));
}

// The cross-entropy gradient writes over its scores (runtime/folds.h, Schedule::inPlace): the
// logits, often the step's largest value, and their gradient share one buffer when nothing reads
// the logits afterwards. Here through both casts folded (the loss reads bf16 logits widened, the
// gradient is written narrowed), as an LM's head runs. Logits that are a graph output keep theirs.
TEST(MemoryPlan, LossGradientTakesTheLogitsBytes) {
  const std::string text = R"(graph "l" opset 17 {
  domain "ampc" 1
  input %a : bf16[64,32]
  input %w : bf16[32,1000]
  input %wt : bf16[1000,32]
  input %y : i64[64]
  const %seed : f32[] = [1.0]
  %x : bf16[64,1000] = MatMul(%a, %w)
  %xf : f32[64,1000] = Cast(%x) {to = 1}
  %loss : f32[] = SoftmaxCrossEntropyLoss(%xf, %y) {reduction = "mean"}
  %g : f32[64,1000] = ampc::SoftmaxCrossEntropyLossGrad(%seed, %xf, %y) {reduction = "mean"}
  %gb : bf16[64,1000] = Cast(%g) {to = 16}
  %da : bf16[64,32] = MatMul(%gb, %wt)
  output %loss
  output %da
})";
  for (bool logitsOut : {false, true}) {
    SCOPED_TRACE(logitsOut ? "logits an output" : "logits read by the loss only");
    auto g = parseGraph(logitsOut ? std::string(text).replace(text.find("  output %da"), 0, "  output %x\n") : text);
    g->bindOps();
    verify(*g);
    createFoldCastsPass(findTarget("cuda"))->run(*g);  // the casts as the CUDA lowering folds them
    folds::Schedule s;
    const MemoryPlan p = planCudaMemory(*g, &s);
    const Value *x = g->lookup("x"), *gb = g->lookup("gb");
    ASSERT_TRUE(s.inPlace.count(gb));
    EXPECT_EQ(s.inPlace.at(gb), x);
    EXPECT_EQ(p.slots.at(g->lookup("g")).bytes, 0) << "the f32 gradient is written narrowed";
    EXPECT_EQ(p.slots.at(gb).bytes, p.slots.at(x).bytes);
    EXPECT_NO_THROW(checkMemoryPlan(p));
    if (!logitsOut) {
      EXPECT_EQ(p.slots.at(gb).group, p.slots.at(x).group);
      EXPECT_EQ(p.slots.at(gb).offset, p.slots.at(x).offset);
      EXPECT_LT(p.peakLiveBytes, 2 * p.slots.at(x).bytes) << "never both buffers";
    } else {
      EXPECT_NE(p.slots.at(gb).group, p.slots.at(x).group);
      EXPECT_GE(p.peakLiveBytes, 2 * p.slots.at(x).bytes);
    }
  }
}
