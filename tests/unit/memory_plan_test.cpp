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
  // a -> b -> c -> d, each 4 KiB: a is dead once b exists, so c can take a's bytes.
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[1024]
  %a : f32[1024] = Relu(%x)
  %b : f32[1024] = Neg(%a)
  %c : f32[1024] = Abs(%b)
  %d : f32[1024] = Neg(%c)
  output %d
}
)");
  MemoryPlan p = planMemory(*g);
  checkMemoryPlan(p);
  EXPECT_EQ(p.totalBytes, 4 * 4096);
  EXPECT_EQ(p.peakLiveBytes, 2 * 4096);
  EXPECT_EQ(p.arenaBytes, 2 * 4096);
  EXPECT_EQ(p.slots.at(g->lookup("a")).offset, p.slots.at(g->lookup("c")).offset);
  EXPECT_NE(p.slots.at(g->lookup("a")).offset, p.slots.at(g->lookup("b")).offset);
}

TEST(MemoryPlan, TrainingStepsOfTheModels) {
  for (const char* m : {"mlp", "cnn", "transformer"}) {
    auto g = importOnnxFile((std::filesystem::path(AMPC_SOURCE_DIR) / "models" / (std::string(m) + ".onnx")).string());
    createTrainStepPass(TrainOptions{})->run(*g);
    MemoryPlan p = planMemory(*g);
    EXPECT_NO_THROW(checkMemoryPlan(p)) << m;
    EXPECT_GE(p.arenaBytes, p.peakLiveBytes) << m;
    EXPECT_LT(p.arenaBytes, p.totalBytes) << m;
    std::printf("%s training step: %zu activations, arena %lld bytes, peak live %lld, without reuse %lld\n", m, p.slots.size(),
                static_cast<long long>(p.arenaBytes), static_cast<long long>(p.peakLiveBytes), static_cast<long long>(p.totalBytes));
  }
}
