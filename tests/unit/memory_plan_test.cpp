// Memory planning: live-overlapping values never share bytes, dead values are reused, and the
// arena of a real training step sits between the peak-live lower bound and no reuse at all.
#include <gtest/gtest.h>

#include <filesystem>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "passes/memory_plan.h"
#include "passes/train_step.h"

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
