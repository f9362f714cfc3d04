// Fused attention and GELU (passes/fuse_attention.cpp, passes/fuse_gelu.cpp, kernels/cpu) on the CPU
// reference: the passes find the attention and the GELU of transformers' GPT-2 (models/gpt2_tiny.onnx, exported by
// tools/bench/export_models.py --gpt2-tiny) and of PyTorch's MultiheadAttention
// (models/transformer.onnx); training the fused graph gives the losses and weights of the graph it
// replaced, dropout on (the fused op draws the Dropout node's Philox stream), at fp32; at bf16 the
// fused graph stays as close to the fp32 run as the unfused one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "compiler/onnx/onnx.h"
#include "compiler/ops/registry.h"
#include "passes/autocast.h"
#include "passes/pass.h"
#include "passes/train_step.h"
#include "runtime/backend.h"
#include "runtime/trainer.h"

using namespace ampc;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string model, freeze;
  int fused;  // attention blocks in the model
};

std::unique_ptr<Graph> load(const Case& c) {
  return importOnnxFile((fs::path(AMPC_SOURCE_DIR) / "models" / (c.model + ".onnx")).string());
}
int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& nd : g.nodes()) n += nd->op() == op;
  return n;
}

// Random token ids and targets (below 10: inside both models' vocabularies), fresh each run.
std::map<std::string, Tensor> batchFor(const Graph& g, std::mt19937_64& rng) {
  std::map<std::string, Tensor> b;
  for (const Value* v : g.inputs()) {
    std::vector<double> ids(static_cast<size_t>(v->type().numel()));
    std::uniform_int_distribution<int64_t> tok(0, 9);
    for (auto& x : ids) x = static_cast<double>(tok(rng));
    b.emplace(v->name(), Tensor::fromDoubles(v->type().dtype, v->type().shape, ids));
  }
  return b;
}

struct TrainRun {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
};
TrainRun train(const Case& c, bool fuse, DType precision, const std::map<std::string, Tensor>& batch, int* fusedOut = nullptr) {
  auto g = load(c);
  if (fuse) {
    AutodiffOptions ad;
    ad.freeze = c.freeze;
    createFuseAttentionPass(ad)->run(*g);
    createFuseGeluPass()->run(*g);
    EXPECT_EQ(count(*g, "Gelu"), c.fused) << "one GELU per block (tanh form in GPT-2, erf form in the transformer)";
    EXPECT_EQ(count(*g, "Tanh") + count(*g, "Erf") + count(*g, "Pow"), 0);
  }
  if (fusedOut) *fusedOut = count(*g, "Attention");
  TrainOptions o;
  o.optimizer = "sgd";
  o.lr = 0.05f;
  o.momentum = 0.9f;
  o.precision = precision;
  o.autodiff.freeze = c.freeze;
  if (precision != DType::f32) {
    AutocastOptions ao;
    ao.low = precision;
    createAutocastPass(ao)->run(*g);
  }
  createTrainStepPass(o)->run(*g);
  verify(*g);
  auto backend = createCpuBackend();
  Trainer t(*g, *backend);
  TrainRun r;
  for (int s = 0; s < 5; ++s) {
    ExecOptions eo;
    eo.seed = 7;  // dropout on: the fused op must draw the same masks
    r.losses.push_back(t.step(batch, eo).loss);
  }
  for (const Value* p : g->params())
    if (isFloat(p->type().dtype)) {
      std::vector<double> v(static_cast<size_t>(p->type().numel()));
      for (int64_t i = 0; i < p->type().numel(); ++i) v[i] = p->data()->getDouble(i);
      r.params[p->name()] = std::move(v);
    }
  return r;
}
double relL2(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
// Worst relative L2 over the parameters the run trains (every float param), against `ref`.
double worstParam(const TrainRun& r, const TrainRun& ref) {
  double w = 0;
  for (const auto& [name, v] : ref.params) w = std::max(w, relL2(r.params.at(name), v));
  return w;
}

class FusedAttention : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(FusedAttention, TrainsLikeTheUnfusedGraph) {
  const Case c = GetParam();
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  auto g = load(c);
  const auto batch = batchFor(*g, rng);
  int fused = 0;
  const TrainRun a = train(c, true, DType::f32, batch, &fused);
  ASSERT_EQ(fused, c.fused) << "the pass must fuse every attention block";
  const TrainRun b = train(c, false, DType::f32, batch);
  for (size_t s = 0; s < a.losses.size(); ++s) {
    ASSERT_TRUE(std::isfinite(a.losses[s]));
    EXPECT_NEAR(a.losses[s], b.losses[s], 1e-5 * std::fabs(b.losses[s])) << "step " << s << " (data seed " << seed << ")";
  }
  EXPECT_GT(std::fabs(a.losses.front() - a.losses.back()), 1e-4) << "the weights must move";
  const double w = worstParam(a, b);
  std::printf("%s fp32 fused vs unfused: losses %.6f -> %.6f, worst param rel L2 %.2e\n", c.model.c_str(), a.losses.front(),
              a.losses.back(), w);
  EXPECT_LE(w, 1e-5);

  // bf16: the fused op keeps the scores in FP32, so it is no further from the fp32 run than the
  // unfused graph (which rounds the scores to bf16), up to a margin for its own rounding.
  const TrainRun fb = train(c, true, DType::bf16, batch), ub = train(c, false, DType::bf16, batch);
  const double ef = worstParam(fb, b), eu = worstParam(ub, b);
  std::printf("%s bf16 vs fp32 worst param rel L2: fused %.2e, unfused %.2e\n", c.model.c_str(), ef, eu);
  EXPECT_GT(ef, 0.0);
  EXPECT_LE(ef, 1.25 * eu + 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, FusedAttention,
                         ::testing::Values(Case{"gpt2_tiny", "causal_mask", 2}, Case{"transformer", "model\\.mask", 2}),
                         [](const auto& i) { return i.param.model; });

// A mask computed from a trained parameter needs its gradient: that attention stays unfused.
TEST(FusedAttentionPass, TrainedMaskIsNotFused) {
  auto g = load({"gpt2_tiny", "", 0});
  EXPECT_FALSE(createFuseAttentionPass(AutodiffOptions{})->run(*g));
  EXPECT_EQ(count(*g, "Attention"), 0);
  EXPECT_EQ(count(*g, "Softmax"), 2);
}

// The fused graph no longer holds any [.., T, T] tensor in the forward or the backward.
TEST(FusedAttentionPass, NoScoreTensorsRemain) {
  auto g = load({"gpt2_tiny", "causal_mask", 2});
  TrainOptions o;
  o.autodiff.freeze = "causal_mask";
  createFuseAttentionPass(o.autodiff)->run(*g);
  createTrainStepPass(o)->run(*g);
  int scores = 0;
  for (const auto& n : g->nodes())
    for (size_t i = 0; i < n->numResults(); ++i) {
      const auto& s = n->result(i)->type().shape;
      scores += s.size() == 4 && s[2] == 64 && s[3] == 64;
    }
  EXPECT_EQ(scores, 0);
  EXPECT_EQ(count(*g, "AttentionGrad"), 2);
}
