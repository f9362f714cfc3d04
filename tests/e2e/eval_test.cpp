// `ampc --eval` on the committed models: the f32 loss matches PyTorch's forward on the same inputs
// and weights (reference made now with python3-torch when installed, else the committed
// models/ref), and f16 / bf16 evaluation stays close to f64 on the logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "compiler/onnx/onnx.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"
#include "runtime/evaluator.h"
#include "runtime/npy.h"
#include "tests/e2e/model_refs.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using test::modelPath;
using test::refDir;
using test::relL2;
namespace fs = std::filesystem;

namespace {




class EvalTest : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(EvalTest, LossMatchesPyTorch) {
  const fs::path ref = refDir(GetParam());
  std::printf("reference: %s\n", ref.c_str());
  test::TempDir d;
  auto r = test::run(std::string(AMPC_BIN) + " " + modelPath(GetParam()) + " --eval --no-dropout --inputs " +
                     (ref / "inputs").string() + " --outputs " + d.path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  Tensor got = readNpy(d.file("loss.npy")), want = readNpy((ref / "loss.npy").string());
  ASSERT_EQ(got.type.str(), "f32[]");
  const double g = got.getDouble(0), w = want.getDouble(0);
  std::printf("%s loss: ampc %.9g, PyTorch %.9g, relative %.3g\n", GetParam().c_str(), g, w, std::fabs(g - w) / std::fabs(w));
  EXPECT_LE(std::fabs(g - w), 1e-5 * std::fabs(w));
}

TEST_P(EvalTest, LowPrecisionLogitsNearF64) {
  const fs::path ref = refDir(GetParam());
  std::map<std::string, Tensor> inputs;
  for (const auto& e : fs::directory_iterator(ref / "inputs")) inputs.emplace(e.path().stem().string(), readNpy(e.path().string()));
  auto logitsAt = [&](DType dt) {
    auto g = importOnnxFile(modelPath(GetParam()));
    PassManager pm;
    pm.add(createConvertPrecisionPass(dt));
    pm.run(*g);
    // The logits are what the loss reads.
    const Value* logits = nullptr;
    for (const auto& n : g->nodes())
      if (n->def() && n->def()->name == "SoftmaxCrossEntropyLoss") logits = n->input(0);
    EXPECT_NE(logits, nullptr);
    std::map<std::string, Tensor> feeds;
    for (const Value* v : g->inputs()) feeds.emplace(v->name(), isFloat(v->type().dtype) ? cpu::castTensor(inputs.at(v->name()), dt) : inputs.at(v->name()));
    auto backend = createCpuBackend();
    ExecOptions opts;
    opts.dropout = false;
    auto outs = evaluate(*g, feeds, *backend, opts, {logits});
    return cpu::castTensor(outs.back(), DType::f64);
  };
  const Tensor ref64 = logitsAt(DType::f64);
  // The f32 logits also match PyTorch's.
  const Tensor torchLogits = readNpy((ref / "logits.npy").string());
  EXPECT_LE(relL2(logitsAt(DType::f32), cpu::castTensor(torchLogits, DType::f64)), 1e-5);
  for (DType dt : {DType::f16, DType::bf16}) {
    const double err = relL2(logitsAt(dt), ref64);
    std::printf("%s logits %s vs f64: relative L2 %.3g\n", GetParam().c_str(), std::string(dtypeName(dt)).c_str(), err);
    EXPECT_LE(err, 1e-2) << dtypeName(dt);
  }
}

// `--precision-run f64 --precision-run-except REGEX` (bisecting which op's rounding matters): the
// matched nodes keep their f32 dtypes, so with every node matched each value the f32 run writes
// (--eval-values) comes out f32 and bit for bit the same, while the plain f64 run's differ.
TEST_P(EvalTest, PrecisionRunExceptKeepsTheMatchedNodesInTheirDtype) {
  const fs::path ref = refDir(GetParam());
  const std::string eval = std::string(AMPC_BIN) + " " + modelPath(GetParam()) + " --eval --no-dropout --inputs " + (ref / "inputs").string();
  auto evalInto = [&](const test::TempDir& d, const std::string& flags) {
    auto r = test::run(eval + " --outputs " + d.path.string() + " --eval-values . " + flags);
    EXPECT_EQ(r.code, 0) << r.out;
  };
  test::TempDir f32, kept, f64;
  evalInto(f32, "");
  evalInto(kept, "--precision-run f64 --precision-run-except .");
  evalInto(f64, "--precision-run f64");
  size_t values = 0, differing = 0;
  for (const auto& e : fs::directory_iterator(f32.path)) {
    const std::string name = e.path().filename().string();
    const Tensor a = readNpy(e.path().string());
    if (a.type.dtype != DType::f32) continue;
    ++values;
    ASSERT_TRUE(fs::exists(kept.file(name))) << name;
    const Tensor b = readNpy(kept.file(name));
    EXPECT_TRUE(b == a) << name << ": " << b.type.str() << " against " << a.type.str();
    const Tensor c = readNpy(f64.file(name));
    EXPECT_EQ(c.type.dtype, DType::f64) << name;
    if (relL2(cpu::castTensor(a, DType::f64), c) > 0) ++differing;
  }
  std::printf("%s: %zu f32 values, %zu of them differ in the f64 run\n", GetParam().c_str(), values, differing);
  EXPECT_GE(values, 3u);  // the mlp has four
  EXPECT_GT(differing, 0u);
  // A regex that names no node is an error, not a silent whole-f64 run.
  test::TempDir none;
  const std::string base = eval + " --outputs " + none.path.string();
  auto r = test::run(base + " --precision-run f64 --precision-run-except no_such_node_name");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("no node's name matches 'no_such_node_name'"), std::string::npos) << r.out;
  r = test::run(base + " --precision-run f64 --precision-run-except '('");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--precision-run-except: '(' is not a regex"), std::string::npos) << r.out;
  r = test::run(base + " --eval-values '['");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--eval-values: '[' is not a regex"), std::string::npos) << r.out;
  r = test::run(base + " --precision-run-except .");  // a usage error: nothing to run it in
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--precision-run-except needs --precision-run"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Models, EvalTest, ::testing::Values("mlp", "cnn", "transformer"));
