// The training step's ops on the CUDA backend against the CPU backend, on fresh random parameter
// and gradient lists (sizes that straddle chunk boundaries): unscale + finite check, global norm and
// clip, the step counter, a cosine schedule, SGD (Nesterov) / AdamW / LAMB nodes fused into one
// multi-tensor launch each, and the dynamic scaler; an overflow step that leaves every parameter
// bitwise as it was; every learning-rate schedule.
#include <cmath>
#include <sstream>

#include "tests/gpu/gpu_util.h"

using namespace ampc;
using gputest::haveGpu;

namespace {

const std::vector<int64_t> kSizes = {1, 7, 16384 + 3, 100000};


enum class Opt { Sgd, AdamW, Lamb };

// The CPU step graph for the same tensors.
std::string cpuGraph(Opt opt) {
  const bool adam = opt != Opt::Sgd;
  std::ostringstream s;
  s << "graph \"t\" opset 17 {\n  domain \"ampc\" 1\n";
  for (size_t i = 0; i < kSizes.size(); ++i) {
    s << "  param %p" << i << " : f32[" << kSizes[i] << "]\n  param %g" << i << " : f32[" << kSizes[i] << "]\n";
    s << "  param %a" << i << " : f32[" << kSizes[i] << "]\n  param %b" << i << " : f32[" << kSizes[i] << "]\n";
  }
  s << "  param %scale : f32[]\n  param %growth : i64[]\n  param %hyst : i64[]\n  param %step : i64[]\n";
  s << "  %inv : f32[] = Reciprocal(%scale)\n  ";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "%u" << i << " : f32[" << kSizes[i] << "], ";
  s << "%found : bool[] = ampc::UnscaleCheck(%inv";
  for (size_t i = 0; i < kSizes.size(); ++i) s << ", %g" << i;
  s << ")\n  ";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "%c" << i << " : f32[" << kSizes[i] << "], ";
  s << "%norm : f32[] = ampc::ClipByGlobalNorm(%found";
  for (size_t i = 0; i < kSizes.size(); ++i) s << ", %u" << i;
  s << ") {max_norm = 50.0}\n";
  s << "  %s2 : i64[] = ampc::StepIncrement(%step, %found)\n";
  s << "  %lr : f32[] = ampc::LearningRate(%s2) {lr = 0.01, schedule = \"cosine\", total = 10, warmup = 2}\n";
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const std::string t = "f32[" + std::to_string(kSizes[i]) + "]";
    if (adam)
      s << "  %q" << i << " : " << t << ", %x" << i << " : " << t << ", %y" << i << " : " << t << " = ampc::Adam(%p" << i << ", %c" << i
        << ", %a" << i << ", %b" << i << ", %lr, %s2, %found) {"
        << (opt == Opt::Lamb ? "lamb = 1" : "decoupled = 1") << ", weight_decay = 0.01}\n";
    else
      s << "  %q" << i << " : " << t << ", %x" << i << " : " << t << " = ampc::SGD(%p" << i << ", %c" << i << ", %a" << i
        << ", %lr, %found) {momentum = 0.9, nesterov = 1, weight_decay = 0.001}\n";
  }
  s << "  %sc : f32[], %gr : i64[], %hy : i64[] = ampc::ScalerUpdate(%scale, %growth, %hyst, %found) {growth_interval = 2, hysteresis = 1}\n";
  s << "  output %norm\n  output %sc\n  output %s2\n  output %lr\n";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "  output %q" << i << "\n  output %x" << i << "\n" << (adam ? "  output %y" + std::to_string(i) + "\n" : "");
  s << "}\n";
  return s.str();
}


void runCase(Opt opt, bool overflow) {
  const bool adam = opt != Opt::Sgd;
  const size_t n = kSizes.size();
  auto graph = parseGraph(cpuGraph(opt), "t");
  std::vector<Tensor> p;
  for (size_t i = 0; i < n; ++i) {
    auto set = [&](const std::string& name, double scale, bool square) {
      Tensor t = gputest::randomTensor(TensorType{DType::f32, {kSizes[i]}}, scale);
      if (square)  // second moments are non-negative
        for (int64_t k = 0; k < t.numel(); ++k) t.setDouble(k, t.getDouble(k) * t.getDouble(k));
      if (name == "g" && overflow && i == 2) t.setDouble(12345, INFINITY);
      if (name == "p") p.push_back(t);
      graph->lookup(name + std::to_string(i))->setData(std::move(t));
    };
    set("p", 1.0, false);
    set("g", 256.0, false);  // scaled by S = 256
    set("a", adam ? 0.01 : 0.1, false);
    set("b", 0.01, true);
  }
  graph->lookup("scale")->setData(Tensor::fromDoubles(DType::f32, {}, {256.0}));
  graph->lookup("growth")->setData(Tensor::fromInts(DType::i64, {}, {1}));
  graph->lookup("hyst")->setData(Tensor::fromInts(DType::i64, {}, {1}));
  graph->lookup("step")->setData(Tensor::fromInts(DType::i64, {}, {3}));
  gputest::expectSameOnGpu(*graph, {}, std::string(adam ? (opt == Opt::Lamb ? "LAMB" : "AdamW") : "SGD") + (overflow ? " overflow" : ""));
  if (overflow) {  // a skipped step writes every parameter back bitwise
    cuda::Program prog(*graph, {});
    prog.run();
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(prog.download(graph->lookup("q" + std::to_string(i))).data, p[i].data) << "param " << i;
    EXPECT_EQ(prog.download(graph->lookup("s2")).getInt(0), 3);
    EXPECT_EQ(prog.download(graph->lookup("sc")).getDouble(0), 128.0);
  }
}

}  // namespace

TEST(GpuTrainStep, SgdNesterovMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::Sgd, false);
}
TEST(GpuTrainStep, AdamWMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::AdamW, false);
}
TEST(GpuTrainStep, LambMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::Lamb, false);
}
TEST(GpuTrainStep, OverflowSkipsBitwise) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  for (Opt o : {Opt::Sgd, Opt::AdamW, Opt::Lamb}) runCase(o, true);
}

// Every learning-rate schedule on CUDA as on the CPU, before, at and after the warmup and the end.
TEST(GpuTrainStep, LearningRateSchedulesMatchCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  for (const std::string schedule : {"constant", "linear-warmup", "cosine", "linear"})
    for (int64_t step : {1, 5, 10, 55, 100, 130}) {
      auto graph = parseGraph("graph \"t\" opset 17 {\n  domain \"ampc\" 1\n  param %s : i64[]\n  %lr : f32[] = ampc::LearningRate(%s) {lr = 0.5, schedule = \"" +
                                  schedule + "\", total = 100, warmup = 10}\n  output %lr\n}\n",
                              "t");
      graph->lookup("s")->setData(Tensor::fromInts(DType::i64, {}, {step}));
      gputest::expectSameOnGpu(*graph, {}, schedule + " at step " + std::to_string(step));
    }
}
