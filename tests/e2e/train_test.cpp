// The training step: 20 steps of SGD with momentum and of AdamW against PyTorch's optimizers on
// the same batch and initial weights (fp32), and the dynamic loss scaler's semantics with Inf
// injected into the gradients at chosen steps.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "compiler/onnx/onnx.h"
#include "passes/autocast.h"
#include "passes/train_step.h"
#include "runtime/npy.h"
#include "runtime/trainer.h"
#include "tests/e2e/model_refs.h"

using namespace ampc;
using test::refDir;
namespace fs = std::filesystem;

namespace {


std::map<std::string, Tensor> batchOf(const Graph& g, const std::string& m) {
  std::map<std::string, Tensor> b;
  for (const Value* v : g.inputs()) b.emplace(v->name(), readNpy((refDir(m) / "inputs" / (v->name() + ".npy")).string()));
  return b;
}


class TrainVsTorch : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

}  // namespace

TEST_P(TrainVsTorch, TwentyStepsMatch) {
  const auto& [m, opt] = GetParam();
  auto g = importOnnxFile((fs::path(AMPC_SOURCE_DIR) / "models" / (m + ".onnx")).string());
  TrainOptions o;
  o.optimizer = opt;
  if (opt == "sgd") {
    o.lr = 0.05f;
    o.momentum = 0.9f;
    o.weightDecay = 1e-4f;
  } else {
    o.lr = 1e-3f;
    o.weightDecay = 0.01f;
  }
  // The transformer's causal mask is a float initializer, so ampc would train it; in PyTorch it is
  // a buffer. --freeze keeps it fixed, as PyTorch does.
  if (m == "transformer") o.autodiff.freeze = "model\\.mask";
  createTrainStepPass(o)->run(*g);
  verify(*g);
  auto backend = createCpuBackend();
  Trainer trainer(*g, *backend);
  const auto batch = batchOf(*g, m);
  ExecOptions eo;
  eo.dropout = false;  // PyTorch's reference ran with dropout p = 0
  for (int s = 0; s < 20; ++s) {
    auto mt = trainer.step(batch, eo);
    ASSERT_FALSE(mt.skipped);
    ASSERT_EQ(mt.lossScale, 1.0);  // fp32: no loss scaling
  }
  // Elements whose gradient is zero in exact arithmetic (the cnn's conv biases, which feed
  // BatchNorm; the key third of each attention in_proj_bias, which softmax cancels) get rounding
  // noise for a gradient on both sides; Adam normalises that noise into full-size steps in
  // arbitrary directions, so those elements cannot match and are left out. torch.autograd's f64
  // gradient tells which they are (|g| below 1e-12 of the model's largest).
  std::map<std::string, Tensor> exact;
  double gmax = 0;
  for (const auto& e : fs::directory_iterator(refDir(m) / "grads64")) {
    Tensor t = readNpy(e.path().string());
    for (int64_t i = 0; i < t.numel(); ++i) gmax = std::max(gmax, std::fabs(t.getDouble(i)));
    exact.emplace(e.path().stem().string(), std::move(t));
  }
  double worst = 0;
  int n = 0;
  int64_t noise = 0;
  for (const auto& e : fs::directory_iterator(refDir(m) / ("train_" + opt))) {
    const Value* p = g->lookup(e.path().stem().string());
    ASSERT_NE(p, nullptr) << e.path();
    const Tensor want = readNpy(e.path().string());
    const Tensor& ex = exact.at(p->name());
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      if (opt != "sgd" && std::fabs(ex.getDouble(i)) < 1e-12 * gmax) {  // SGD keeps noise small: no exclusion
        ++noise;
        continue;
      }
      const double x = p->data()->getDouble(i), y = want.getDouble(i);
      num += (x - y) * (x - y);
      den += y * y;
    }
    if (den == 0) continue;
    const double err = std::sqrt(num / den);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4) << p->name();
    ++n;
  }
  std::printf("%s %s: %d parameters after 20 steps vs PyTorch, worst relative L2 %.3g (%lld elements with a zero exact gradient left out)\n",
              m.c_str(), opt.c_str(), n, worst, static_cast<long long>(noise));
  EXPECT_GT(n, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, TrainVsTorch,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "transformer"), ::testing::Values("sgd", "adamw")));

TEST(TrainStep, DynamicLossScalerSkipsAndAdapts) {
  auto g = importOnnxFile((fs::path(AMPC_SOURCE_DIR) / "models" / "mlp.onnx").string());
  PassManager pm;
  pm.add(createAutocastPass(AutocastOptions{}));
  pm.add(createCastCleanupPass());
  pm.run(*g);
  TrainOptions o;
  o.optimizer = "adamw";
  o.precision = DType::f16;  // auto -> dynamic
  o.initScale = 1024;
  o.growthInterval = 3;
  o.hysteresis = 2;
  o.minScale = 128;
  o.maxScale = 4096;
  createTrainStepPass(o)->run(*g);
  auto backend = createCpuBackend();
  Trainer trainer(*g, *backend);
  const auto clean = batchOf(*g, "mlp");
  auto poisoned = clean;
  poisoned.at("x").setDouble(7, INFINITY);  // Inf in the data: every gradient becomes non-finite
  auto snapshot = [&] {
    std::map<std::string, std::vector<uint8_t>> s;
    for (const Value* p : g->params()) { const Bytes& b = p->data()->data; s[p->name()].assign(b.begin(), b.end()); }
    return s;
  };
  // Steps with Inf injected, and the scale each step must use.
  const std::set<int> bad = {2, 3, 4, 9, 10, 11, 12, 13};
  std::vector<double> scales;
  for (int s = 0; s < 16; ++s) {
    auto before = snapshot();
    auto m = trainer.step(bad.count(s) ? poisoned : clean, ExecOptions{});
    scales.push_back(m.lossScale);
    EXPECT_EQ(m.skipped, bad.count(s) == 1) << "step " << s;
    auto after = snapshot();
    if (m.skipped) {
      for (const auto& [name, bytes] : before) {
        if (name.rfind("ampc.", 0) == 0) continue;  // scaler state moves on
        EXPECT_EQ(after[name], bytes) << name << " changed on skipped step " << s;
      }
      EXPECT_EQ(after["ampc.step"], before["ampc.step"]) << "the optimizer's step count moved on a skipped step";
    } else {
      EXPECT_NE(after["model.fc1.weight"], before["model.fc1.weight"]) << "step " << s;
    }
  }
  // 0,1 clean (tracker 1, 2); 2 bad: hysteresis 2 -> 1, no backoff; 3 bad: backoff to 512; 4 bad:
  // 256; 5,6,7 clean: growth after 3 -> 512 at step 8; 8 clean; 9 bad: budget refilled, no backoff;
  // 10..13 bad: 256, 128, then the floor 128; 14, 15 clean.
  const std::vector<double> want = {1024, 1024, 1024, 1024, 512, 256, 256, 256, 512, 512, 512, 256, 128, 128, 128, 128};
  EXPECT_EQ(scales, want);
}
