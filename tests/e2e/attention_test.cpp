// Fused attention, GELU and SiLU (passes/fuse_attention.cpp, passes/fuse_gelu.cpp, kernels/cpu) on the CPU
// reference: the passes find the attention and the GELU of transformers' GPT-2 (models/gpt2_tiny.onnx, exported by
// tools/bench/export_models.py --gpt2-tiny) and of PyTorch's MultiheadAttention
// (models/transformer.onnx); training the fused graph gives the losses and weights of the graph it
// replaced, dropout on (the fused op draws the Dropout node's Philox stream), at fp32; at bf16 the
// fused graph stays as close to the fp32 run as the unfused one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/autodiff.h"
#include "passes/autocast.h"
#include "passes/pass.h"
#include "passes/train_step.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"
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
    createFuseAttentionPass()->run(*g);
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
  // unfused graph (which rounds the scores to bf16), up to a margin for its own rounding. Each error
  // is one draw of the rounding noise (one batch's ratio has read up to 1.28), so the errors are
  // summed over three batches, this one and two more fresh ones, before they are compared.
  double ef = 0, eu = 0;
  for (int k = 0; k < 3; ++k) {
    const auto bk = k == 0 ? batch : batchFor(*g, rng);
    const TrainRun ref = k == 0 ? b : train(c, false, DType::f32, bk);
    const TrainRun fb = train(c, true, DType::bf16, bk), ub = train(c, false, DType::bf16, bk);
    const double f = worstParam(fb, ref), u = worstParam(ub, ref);
    std::printf("%s bf16 vs fp32 worst param rel L2, batch %d: fused %.2e, unfused %.2e\n", c.model.c_str(), k, f, u);
    EXPECT_GT(f, 0.0);
    ef += f, eu += u;
  }
  EXPECT_LE(ef, 1.25 * eu + 3e-4) << "(data seed " << seed << ")";
}

INSTANTIATE_TEST_SUITE_P(Models, FusedAttention,
                         ::testing::Values(Case{"gpt2_tiny", "causal_mask", 2}, Case{"transformer", "model\\.mask", 2}),
                         [](const auto& i) { return i.param.model; });

namespace {
// The head of a one-layer attention graph as PyTorch exports it: input %x [2, T, 16], weights
// %wq/%wk/%wv [16, H D], and Q [2, H, T, D], KT [2, H, D, T], V [2, H, T, D] as %q, %kt, %v.
std::string attentionInputs(int64_t t, int64_t h, int64_t d) {
  auto dims = [](std::initializer_list<int64_t> v) {
    std::string s;
    for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return "f32[" + s + "]";
  };
  const std::string w = dims({16, h * d}), flat = dims({2, t, h * d}), split = dims({2, t, h, d}), heads = dims({2, h, t, d});
  std::string s = "  input %x : " + dims({2, t, 16}) + "\n";
  for (const char* p : {"q", "k", "v"}) s += "  param %w" + std::string(p) + " : " + w + "\n";
  s += "  const %shape : i64[4] = [2, " + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(d) + "]\n";
  for (const char* p : {"q", "k", "v"}) s += "  %" + std::string(p) + "0 : " + flat + " = MatMul(%x, %w" + p + ") @" + p + "\n";
  for (const char* p : {"q", "k", "v"}) s += "  %" + std::string(p) + "1 : " + split + " = Reshape(%" + p + "0, %shape) @" + p + "r\n";
  s += "  %q : " + heads + " = Transpose(%q1) {perm = [0, 2, 1, 3]} @qt\n";
  s += "  %kt : " + dims({2, h, d, t}) + " = Transpose(%k1) {perm = [0, 2, 3, 1]} @kt\n";
  s += "  %v : " + heads + " = Transpose(%v1) {perm = [0, 2, 1, 3]} @vt\n";
  return s;
}

// `text` (input %x of shape xs, a scalar loss) fused for the cpu target holds one ampc.Attention
// and no Softmax or scalar Mul left, and its loss and weight gradients are the unfused graph's on
// the same weights and input (and the graph's other inputs, `more`).
void expectFusedLikePlain(const std::string& text, const std::vector<int64_t>& xs, std::map<std::string, Tensor> more = {}) {
  std::mt19937 rng(3);
  auto fill = [&](Graph& g) {
    for (Value* p : g.params()) {
      Tensor t(p->type());
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, std::normal_distribution<double>(0, 0.3)(rng));
      p->setData(std::move(t));
    }
  };
  auto fused = parseGraph(text, "a"), plain = parseGraph(text, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*fused));
  EXPECT_EQ(count(*fused, "Attention"), 1);
  EXPECT_EQ(count(*fused, "Softmax"), 0);
  for (const auto& n : fused->nodes()) EXPECT_FALSE(n->op() == "Mul" && n->name().rfind("attn/", 0) == 0) << n->name() << " left unfused";
  fill(*plain);
  for (Value* p : fused->params()) p->setData(*plain->lookup(p->name())->data());
  createAutodiffPass()->run(*fused);
  createAutodiffPass()->run(*plain);
  Tensor x(TensorType{DType::f32, xs});
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::normal_distribution<double>()(rng));
  auto backend = createCpuBackend();
  more.emplace("x", x);
  auto a = evaluate(*fused, more, *backend), b = evaluate(*plain, more, *backend);
  ASSERT_EQ(a.size(), 1 + fused->params().size());  // the loss and every parameter's gradient
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> u, w;
    for (int64_t k = 0; k < a[i].numel(); ++k) u.push_back(a[i].getDouble(k)), w.push_back(b[i].getDouble(k));
    EXPECT_LE(relL2(u, w), 1e-5) << fused->outputs()[i]->name();
    EXPECT_GT(std::fabs(w[0]) + std::fabs(w.back()), 0.0) << fused->outputs()[i]->name();
  }
}
}  // namespace

// A trainable additive bias on the scores (T5's relative-position bias, Swin's relative position
// table, a learned ALiBi): the attention fuses and the bias gets its gradient, the score gradients
// summed over the dims it broadcasts along (per head [1, H, Tq, Tk], per batch and key [B, 1, 1, Tk],
// shared [Tq, Tk]); loss and every gradient, the bias's among them, are the unfused graph's.
TEST(FusedAttentionPass, TrainableBiasGetsItsGradient) {
  for (const std::string bias : {"1,2,5,5", "2,1,1,5", "5,5"}) {
    SCOPED_TRACE("bias [" + bias + "]");
    const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + "  param %bias : f32[" + bias + R"(]
  const %s : f32[] = [0.35]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sb : f32[2,2,5,5] = Add(%ss, %bias) @attn/bias
  %p : f32[2,2,5,5] = Softmax(%sb) {axis = -1} @attn/softmax
  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
    expectFusedLikePlain(text, {2, 5, 16});
  }
}

// A mask subtracted rather than added, behind a no-op Cast (Funnel's and XLNet's
// (S + P + T).float() - 1e30 (1 - mask)), with a trained term added before the Cast: it fuses with
// the Neg of the subtracted mask as (part of) the fused op's mask, nothing of the chain is left, and
// the loss and every gradient (the trained term's among them) are the unfused graph's. Batch 1's
// last two keys are masked.
TEST(FusedAttentionPass, SubtractedMaskBehindANoOpCastFuses) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  input %pad : f32[2,1,1,5]
  param %pos : f32[1,2,5,5]
  const %s : f32[] = [0.35]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sp : f32[2,2,5,5] = Add(%ss, %pos) @attn/pos
  %sf : f32[2,2,5,5] = Cast(%sp) {to = 1} @attn/float
  %sm : f32[2,2,5,5] = Sub(%sf, %pad) @attn/mask
  %p : f32[2,2,5,5] = Softmax(%sm) {axis = -1} @attn/softmax
  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  Tensor pad(TensorType{DType::f32, {2, 1, 1, 5}});
  for (int64_t e = 0; e < 10; ++e) pad.setDouble(e, e >= 8 ? 1e30 : 0.0);
  expectFusedLikePlain(text, {2, 5, 16}, {{"pad", pad}});
  auto g = parseGraph(text, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
  EXPECT_EQ(count(*g, "Neg"), 1);
  EXPECT_EQ(count(*g, "Sub"), 0);
  EXPECT_EQ(count(*g, "Cast"), 0);
  // The same mask subtracted with no trained term, S - M alone: also fused.
  std::string plain = text;
  plain.replace(plain.find("  %sp : f32"), plain.find("  %sm : f32") - plain.find("  %sp : f32"), "");
  plain.replace(plain.find("Sub(%sf"), 7, "Sub(%ss");
  plain.replace(plain.find("  param %pos"), plain.find("  const %s :") - plain.find("  param %pos"), "");
  expectFusedLikePlain(plain, {2, 5, 16}, {{"pad", pad}});
}

// Soft-capped scores, cap * tanh(S / cap) (Gemma 2's eager attention, and ampc's import of ONNX's
// Attention with softcap): with the scale before the cap (Div) or folded into it (Mul by scale /
// cap), no scale at all, and a trainable bias after the cap (its gradient). For the cpu target the
// attention fuses with the softcap attribute and the loss and gradients are the unfused graph's;
// the cuda target, whose kernels do not take it yet, leaves it as written.
TEST(FusedAttentionPass, SoftcappedScoresFuse) {
  const struct {
    const char* name;
    std::string scores;  // from %sc = MatMul(%q, %kt) to %sb, the Softmax's operand
  } cases[] = {
      {"scale_then_div", "  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale\n  %sd : f32[2,2,5,5] = Div(%ss, %cap) @attn/capdiv\n"
                         "  %st : f32[2,2,5,5] = Tanh(%sd) @attn/tanh\n  %sb : f32[2,2,5,5] = Mul(%st, %cap) @attn/capmul\n"},
      {"folded_factor", "  const %f : f32[] = [0.05]\n  %sd : f32[2,2,5,5] = Mul(%f, %sc) @attn/capdiv\n"
                        "  %st : f32[2,2,5,5] = Tanh(%sd) @attn/tanh\n  %sb : f32[2,2,5,5] = Mul(%cap, %st) @attn/capmul\n"},
      {"no_scale", "  %st : f32[2,2,5,5] = Tanh(%sc) @attn/tanh\n  %sb : f32[2,2,5,5] = Mul(%st, %cap) @attn/capmul\n"},
      {"bias_after_cap", "  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale\n  %sd : f32[2,2,5,5] = Div(%ss, %cap) @attn/capdiv\n"
                         "  %st : f32[2,2,5,5] = Tanh(%sd) @attn/tanh\n  %sm : f32[2,2,5,5] = Mul(%st, %cap) @attn/capmul\n"
                         "  %sb : f32[2,2,5,5] = Add(%sm, %bias) @attn/bias\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    // A small cap (2) so that the tanh bends the scores: the gradient through it matters.
    const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) +
                             "  param %bias : f32[1,2,5,5]\n  const %s : f32[] = [0.35]\n  const %cap : f32[] = [2]\n"
                             "  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk\n" + c.scores +
                             "  %p : f32[2,2,5,5] = Softmax(%sb) {axis = -1} @attn/softmax\n  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv\n"
                             "  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq\n  %b2 : f32[1,2,5,5] = Mul(%bias, %bias) @b2\n"
                             "  %l1 : f32[] = ReduceMean(%sq) {keepdims = 0} @l1\n  %l2 : f32[] = ReduceMean(%b2) {keepdims = 0} @l2\n"
                             "  %loss : f32[] = Add(%l1, %l2) @loss\n  output %loss\n}";
    auto cuda = parseGraph(text, "a");
    EXPECT_FALSE(createFuseAttentionPass(findTarget("cuda"), DType::bf16)->run(*cuda));
    auto cpu = parseGraph(text, "a");
    ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*cpu));
    EXPECT_EQ(count(*cpu, "Tanh"), 0);
    for (const auto& n : cpu->nodes())
      if (n->op() == "Attention") EXPECT_FLOAT_EQ(n->getFloat("softcap", 0.0f), 2.0f);
    expectFusedLikePlain(text, {2, 5, 16});
  }
}

// Which head dims fuse is the target's to say (compiler/target.h), not the pass's: at head dim 128
// in f32 the cuda target (f32 kernels of at most 64) keeps the attention as written, the cpu target
// fuses it, and the fused graph's loss and gradients are the unfused graph's.
TEST(FusedAttentionPass, HeadDimLimitComesFromTheTarget) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(6, 2, 128) + R"(  const %s : f32[] = [0.0883883]
  %sc : f32[2,2,6,6] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,6,6] = Mul(%sc, %s) @attn/scale
  %p : f32[2,2,6,6] = Softmax(%ss) {axis = -1} @attn/softmax
  %o : f32[2,2,6,128] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,6,128] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  auto cuda = parseGraph(text, "a");
  EXPECT_FALSE(createFuseAttentionPass(findTarget("cuda"))->run(*cuda));
  EXPECT_EQ(count(*cuda, "Attention"), 0);
  // The same f32 graph in a bf16 plan: autocast will run the fused node at bf16, so it fuses.
  auto planned = parseGraph(text, "a");
  EXPECT_TRUE(createFuseAttentionPass(findTarget("cuda"), DType::bf16)->run(*planned));
  EXPECT_EQ(count(*planned, "Attention"), 1);
  expectFusedLikePlain(text, {2, 6, 16});
  EXPECT_THROW(findTarget("tpu"), Error);
  // At bf16 the cuda target's tensor-core kernels take head dims that are multiples of 8 up to 128
  // (kernels/cuda/limits.h): the attention fuses at 128 and 96 and stays as written at 100; with
  // dropout, only where Tk is a multiple of 4 (6 keys: not) or the head dims are at most 64. At 256
  // (cuDNN's fused SDPA only) it fuses without dropout (and without a mask: CudnnOnlyHeadDims...).
  for (const int64_t d : {128, 96, 256, 100, 64})
    for (const bool dropout : {false, true}) {
      const std::string D = std::to_string(d), lead = "bf16[2,2,";
      std::string t = "graph \"b\" opset 17 {\n  input %q : " + lead + "6," + D + "]\n  input %kt : " + lead + D + ",6]\n  input %v : " + lead +
                      "6," + D + "]\n  const %r : f32[] = [0.1]\n  const %on : bool[] = [1]\n";
      t += "  %sc : bf16[2,2,6,6] = MatMul(%q, %kt) @attn/qk\n  %p : bf16[2,2,6,6] = Softmax(%sc) {axis = -1} @attn/softmax\n";
      if (dropout) t += "  %pd : bf16[2,2,6,6] = Dropout(%p, %r, %on) @attn/drop\n";
      t += "  %o : bf16[2,2,6," + D + "] = MatMul(%" + std::string(dropout ? "pd" : "p") + ", %v) @attn/pv\n  output %o\n}\n";
      auto g = parseGraph(t, "b");
      const bool fuses = d % 8 == 0 && d <= (dropout ? 64 : 256);
      EXPECT_EQ(createFuseAttentionPass(findTarget("cuda"))->run(*g), fuses) << "head dim " << d << (dropout ? " with dropout" : "");
      EXPECT_EQ(count(*g, "Attention"), fuses ? 1 : 0);
    }
}

// Head dims only cuDNN's fused SDPA takes on CUDA (256: kernels/cuda/limits.h) fuse for the cuda
// target where cuDNN reads the mask (AttentionShape::maskForCudnn): none, or one made from no
// parameter: the causal one as a constant, computed from constants or as masked_fill's condition, a
// padding mask from an input (also with the exporters' NaN guard after the softmax: the node's
// zero_empty_rows), another constant, a bool buffer (an initializer, but no parameter). A mask computed from a parameter (it may need a gradient,
// which cuDNN's graphs do not give) keeps the attention as written. The fused node is then a target
// node (cuda::Attention), and the plan computes what the graph did.
TEST(FusedAttentionPass, CudnnOnlyHeadDimsNeedAMaskCudnnReads) {
  struct C {
    std::string name, mask;
    bool fuses;
  };
  const std::vector<C> cases = {{"causal_const", "const", true},   {"causal_computed", "computed", true}, {"masked_fill", "where", true},
                                {"padding_input", "input", true},  {"shifted_const", "shifted", true},    {"from_param", "param", false},
                                {"nan_guard", "guard", true},      {"bool_buffer", "buffer", true}};
  for (const C& c : cases) {
    std::string t = "graph \"a\" opset 17 {\n  input %q : bf16[2,2,6,256]\n  input %kt : bf16[2,2,256,6]\n  input %v : bf16[2,2,6,256]\n";
    std::string causal = "[", shifted = "[", cond = "[";
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j) {
        const std::string sep = i || j ? ", " : "";
        causal += sep + (j > i ? "-inf" : "0.0");
        shifted += sep + (j > i + 1 ? "-inf" : "0.0");
        cond += sep + (j > i ? "1" : "0");
      }
    causal += "]", shifted += "]", cond += "]";
    if (c.mask == "where") t += "  const %c : bool[6,6] = " + cond + "\n  const %fill : bf16[] = [-inf]\n";
    else if (c.mask == "buffer") t += "  param %c : bool[6,6]\n  const %fill : bf16[] = [-inf]\n";  // a model's bool buffer
    else if (c.mask == "input" || c.mask == "guard") t += "  input %m : bf16[2,1,1,6]\n";
    else if (c.mask == "param") t += "  param %m : bf16[6,6]\n";
    else if (c.mask == "shifted") t += "  const %m : bf16[6,6] = " + shifted + "\n";
    else if (c.mask == "const") t += "  const %m : bf16[6,6] = " + causal + "\n";
    else t += "  const %m0 : bf16[6,6] = " + causal + "\n  const %z : bf16[] = [0.0]\n  %m : bf16[6,6] = Add(%m0, %z)\n";
    t += "  %sc : bf16[2,2,6,6] = MatMul(%q, %kt) @attn/qk\n";
    t += c.mask == "where" || c.mask == "buffer" ? "  %sm : bf16[2,2,6,6] = Where(%c, %fill, %sc) @attn/where\n"
                                                 : "  %sm : bf16[2,2,6,6] = Add(%sc, %m) @attn/mask\n";
    t += "  %p : bf16[2,2,6,6] = Softmax(%sm) {axis = -1} @attn/softmax\n";
    if (c.mask == "guard")
      t += "  const %zero : bf16[] = [0.0]\n  %nan : bool[2,2,6,6] = IsNaN(%p) @attn/isnan\n  %pz : bf16[2,2,6,6] = Where(%nan, %zero, %p) @attn/where\n";
    t += "  %o : bf16[2,2,6,256] = MatMul(" + std::string(c.mask == "guard" ? "%pz" : "%p") + ", %v) @attn/pv\n  output %o\n}\n";
    auto g = parseGraph(t, c.name), ref = parseGraph(t, c.name);
    if (c.mask == "param") {
      Tensor w(g->lookup("m")->type());
      g->lookup("m")->setData(w);
      ref->lookup("m")->setData(w);
    }
    if (c.mask == "buffer") {  // masked above the diagonal, as GPT-2's causal buffer
      Tensor b(g->lookup("c")->type());
      for (int64_t e = 0; e < b.numel(); ++e) b.setDouble(e, e % 6 > e / 6 ? 1.0 : 0.0);
      g->lookup("c")->setData(b);
      ref->lookup("c")->setData(b);
    }
    EXPECT_EQ(createFuseAttentionPass(findTarget("cuda"))->run(*g), c.fuses) << c.name;
    EXPECT_EQ(count(*g, "Attention"), c.fuses ? 1 : 0) << c.name;
    if (!c.fuses) continue;
    ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g)) << c.name;
    const Node* a = g->lookup("o")->producer();
    EXPECT_EQ(a->domain(), kCudaDomain) << c.name;  // (KT an input here: the CUDA lowering copies K to rows for cuDNN)
    EXPECT_EQ(a->getInt("zero_empty_rows", 0), c.mask == "guard" ? 1 : 0) << c.name;
    // The plan on the CPU reference against the graph as written
    std::map<std::string, Tensor> in;
    std::mt19937 rng(7);
    std::normal_distribution<double> nd;
    for (const Value* v : ref->inputs()) {
      Tensor x(v->type());
      // Q and KT at 1/4 (scores of about unit size over 256 dims, as a scaled product gives); the
      // padding mask -inf on keys 2 and 4 of the second sequence
      for (int64_t e = 0; e < x.numel(); ++e)
        x.setDouble(e, v->name() == "m" ? (e >= 6 && (e % 6 == 2 || e % 6 == 4) ? -INFINITY : 0.0) : v->name() == "v" ? nd(rng) : 0.25 * nd(rng));
      in.emplace(v->name(), std::move(x));
    }
    auto cpu = createCpuBackend();
    const auto want = evaluate(*ref, in, *cpu), got = evaluate(*g, in, *cpu);
    double err = 0;
    for (int64_t e = 0; e < want[0].numel(); ++e) err = std::max(err, std::fabs(got[0].getDouble(e) - want[0].getDouble(e)));
    EXPECT_LT(err, 0.05) << c.name;
    if (c.mask == "input") {  // the mask is read: without it the output differs
      in.at("m") = Tensor(in.at("m").type);
      const auto unmasked = evaluate(*g, in, *cpu);
      double d = 0;
      for (int64_t e = 0; e < want[0].numel(); ++e) d = std::max(d, std::fabs(unmasked[0].getDouble(e) - want[0].getDouble(e)));
      EXPECT_GT(d, 0.2) << c.name;
    }
  }
}

// Scaled dot-product attention as PyTorch's exporters decompose it with the scale split before the
// product: Q and KT each multiplied by sqrt(scale) (timm's ViT, dynamo export). Both factors join the
// fused node's scale, so neither multiply is left to run (nor its gradient).
TEST(FusedAttentionPass, ScalesOnQAndKFold) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  const %c : f32[] = [0.5946036]
  %qs : f32[2,2,5,8] = Mul(%q, %c) @attn/qscale
  %ks : f32[2,2,8,5] = Mul(%c, %kt) @attn/kscale
  %sc : f32[2,2,5,5] = MatMul(%qs, %ks) @attn/qk
  %p : f32[2,2,5,5] = Softmax(%sc) {axis = -1} @attn/softmax
  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  expectFusedLikePlain(text, {2, 5, 16});
  auto g = parseGraph(text, "a");
  createFuseAttentionPass(findTarget("cpu"))->run(*g);
  for (const auto& n : g->nodes())
    if (n->op() == "Attention") EXPECT_NEAR(n->getFloat("scale", 0.0f), 0.5946036 * 0.5946036, 1e-6);
}

// transformers' eager attention, softmax(S + mask, dim=-1, dtype=torch.float32).to(q.dtype), in an
// f32 export: no-op Casts (and an Identity) between the masked scores and the Softmax, and two after
// it (the TorchScript exporter writes softmax's dtype as a Cast after the Softmax, then .to's). They
// fuse with the rest, none is left to run, and the loss and gradients are the unfused graph's.
TEST(FusedAttentionPass, NoOpCastsAroundTheSoftmaxFuse) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  const %s : f32[] = [0.35]
  const %mask : f32[1,1,5,5] = [0, -1e30, -1e30, -1e30, -1e30, 0, 0, -1e30, -1e30, -1e30, 0, 0, 0, -1e30, -1e30, 0, 0, 0, 0, -1e30, 0, 0, 0, 0, 0]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sm : f32[2,2,5,5] = Add(%ss, %mask) @attn/mask
  %c1 : f32[2,2,5,5] = Cast(%sm) {to = 1} @attn/to_f32
  %c2 : f32[2,2,5,5] = Identity(%c1) @attn/clone
  %p : f32[2,2,5,5] = Softmax(%c2) {axis = -1} @attn/softmax
  %p1 : f32[2,2,5,5] = Cast(%p) {to = 1} @attn/softmax_dtype
  %p2 : f32[2,2,5,5] = Cast(%p1) {to = 1} @attn/to_q_dtype
  %o : f32[2,2,5,8] = MatMul(%p2, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  expectFusedLikePlain(text, {2, 5, 16});
  auto g = parseGraph(text, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
  EXPECT_EQ(count(*g, "Cast"), 0);
  EXPECT_EQ(count(*g, "Identity"), 0);
}

// Attention written on [B H, T, D] with its scores viewed as [B, H, T, T] around the softmax: DeBERTa's
// (KT divided by the scale, a trained relative-position term added per [B H] entry, the view, a
// padding mask's masked_fill with the lowest float, the view back) and BLOOM's (baddbmm: ALiBi per
// [B H] entry and key plus the scaled product, the view, a causal additive mask, softmax in f32 with
// no-op Casts, the view back), and a bias shared by all [B H] entries. Each fuses into one
// ampc.Attention over [B, H, T, D] views, and the loss and every gradient (the trained terms'
// among them) are the unfused graph's. Two BLOOM layers share one sum of their masks.
TEST(FusedAttentionPass, ScoresViewedWithHeadsAroundTheSoftmaxFuse) {
  const std::string views = R"(  const %n3 : i64[3] = [4, 5, 8]
  const %n3t : i64[3] = [4, 8, 5]
  const %s3 : i64[3] = [4, 5, 5]
  const %s4 : i64[4] = [2, 2, 5, 5]
  %q3 : f32[4,5,8] = Reshape(%q, %n3) @q3
  %kt3 : f32[4,8,5] = Reshape(%kt, %n3t) @kt3
  %v3 : f32[4,5,8] = Reshape(%v, %n3) @v3
)";
  const std::string tail = R"(  %o3 : f32[4,5,8] = MatMul(%p3, %v3) @attn/pv
  %sq : f32[4,5,8] = Mul(%o3, %o3) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  std::mt19937 rng(11);
  Tensor keep(TensorType{DType::boolean, {2, 1, 1, 5}}), alibi(TensorType{DType::f32, {4, 1, 5}});
  for (int64_t i = 0; i < keep.numel(); ++i) keep.setDouble(i, i % 5 == 0 || rng() % 3 != 0 ? 1.0 : 0.0);
  for (int64_t i = 0; i < alibi.numel(); ++i) alibi.setDouble(i, -0.25 * static_cast<double>(i % 5) * static_cast<double>(1 + i / 5));
  const std::string deberta = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + views + R"(  param %rel : f32[4,5,5]
  input %keep : bool[2,1,1,5]
  const %sc : f32[] = [2.828427]
  %kd : f32[4,8,5] = Div(%kt3, %sc) @attn/kscale
  %sp : f32[4,5,5] = MatMul(%q3, %kd) @attn/qk
  %sr : f32[4,5,5] = Add(%sp, %rel) @attn/rel
  %s : f32[2,2,5,5] = Reshape(%sr, %s4) @attn/view
  %nk : bool[2,1,1,5] = Not(%keep) @attn/not
  const %lowest : f32[] = [-3.4028234663852886e38]
  %sm : f32[2,2,5,5] = Where(%nk, %lowest, %s) @attn/masked_fill
  %p : f32[2,2,5,5] = Softmax(%sm) {axis = -1} @attn/softmax
  %p3 : f32[4,5,5] = Reshape(%p, %s3) @attn/flat
)" + tail;
  expectFusedLikePlain(deberta, {2, 5, 16}, {{"keep", keep}});
  const std::string bloom = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + views + R"(  input %alibi : f32[4,1,5]
  const %beta : f32[] = [1.0]
  const %alpha : f32[] = [0.35355339]
  const %causal : f32[1,1,5,5] = [0, -3.4e38, -3.4e38, -3.4e38, -3.4e38, 0, 0, -3.4e38, -3.4e38, -3.4e38, 0, 0, 0, -3.4e38, -3.4e38, 0, 0, 0, 0, -3.4e38, 0, 0, 0, 0, 0]
  %ab : f32[4,1,5] = Mul(%alibi, %beta) @alibi_beta
  %qk : f32[4,5,5] = MatMul(%q3, %kt3) @attn/qk
  %qa : f32[4,5,5] = Mul(%qk, %alpha) @attn/scale
  %sr : f32[4,5,5] = Add(%ab, %qa) @attn/baddbmm
  %s : f32[2,2,5,5] = Reshape(%sr, %s4) @attn/view
  %sm : f32[2,2,5,5] = Add(%s, %causal) @attn/causal
  %c : f32[2,2,5,5] = Cast(%sm) {to = 1} @attn/to_f32
  %p : f32[2,2,5,5] = Softmax(%c) {axis = -1} @attn/softmax
  %pc : f32[2,2,5,5] = Cast(%p) {to = 1} @attn/to_dtype
  %p3 : f32[4,5,5] = Reshape(%pc, %s3) @attn/flat
)" + tail;
  expectFusedLikePlain(bloom, {2, 5, 16}, {{"alibi", alibi}});
  const std::string shared = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + views + R"(  param %bias : f32[5,5]
  const %alpha : f32[] = [0.35355339]
  %qk : f32[4,5,5] = MatMul(%q3, %kt3) @attn/qk
  %qa : f32[4,5,5] = Mul(%qk, %alpha) @attn/scale
  %sr : f32[4,5,5] = Add(%qa, %bias) @attn/bias
  %s : f32[2,2,5,5] = Reshape(%sr, %s4) @attn/view
  %p : f32[2,2,5,5] = Softmax(%s) {axis = -1} @attn/softmax
  %p3 : f32[4,5,5] = Reshape(%p, %s3) @attn/flat
)" + tail;
  expectFusedLikePlain(shared, {2, 5, 16});
  // Two layers reading the same ALiBi and causal mask share one sum of them (kept for the backward
  // once, not per layer), and compute what the unfused graph does.
  const std::string second = R"(  %qk2 : f32[4,5,5] = MatMul(%q3, %kt3) @attn2/qk
  %qa2 : f32[4,5,5] = Mul(%qk2, %alpha) @attn2/scale
  %sr2 : f32[4,5,5] = Add(%ab, %qa2) @attn2/baddbmm
  %s2 : f32[2,2,5,5] = Reshape(%sr2, %s4) @attn2/view
  %sm2 : f32[2,2,5,5] = Add(%s2, %causal) @attn2/causal
  %pp : f32[2,2,5,5] = Softmax(%sm2) {axis = -1} @attn2/softmax
  %pp3 : f32[4,5,5] = Reshape(%pp, %s3) @attn2/flat
  %oo : f32[4,5,8] = MatMul(%pp3, %o3) @attn2/pv
  %loss : f32[] = ReduceMean(%oo) {keepdims = 0} @loss
  output %loss
})";
  std::string twoLayers = bloom.substr(0, bloom.find("  %sq : f32[4,5,8]")) + second;
  auto two = parseGraph(twoLayers, "a"), twoPlain = parseGraph(twoLayers, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*two));
  EXPECT_EQ(count(*two, "Attention"), 2);
  int sums = 0;
  for (const auto& n : two->nodes()) sums += n->name().find("masks_sum") != std::string::npos;
  EXPECT_EQ(sums, 1);
  {
    std::mt19937 r2(5);
    for (Value* p : twoPlain->params()) {
      Tensor t(p->type());
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, std::normal_distribution<double>(0, 0.3)(r2));
      p->setData(t);
      two->lookup(p->name())->setData(std::move(t));
    }
    Tensor x(TensorType{DType::f32, {2, 5, 16}});
    for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::normal_distribution<double>()(r2));
    auto backend = createCpuBackend();
    const double a = evaluate(*two, {{"x", x}, {"alibi", alibi}}, *backend)[0].getDouble(0);
    const double b = evaluate(*twoPlain, {{"x", x}, {"alibi", alibi}}, *backend)[0].getDouble(0);
    EXPECT_NEAR(a, b, 1e-5 * std::fabs(b));
    EXPECT_NE(b, 0.0);
  }
  // The views left are of Q, KT, V and the result: no Reshape of the scores or probabilities.
  auto g = parseGraph(bloom, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
  for (const auto& n : g->nodes()) {
    EXPECT_NE(n->name(), "attn/view");
    EXPECT_NE(n->name(), "attn/flat");
    if (n->op() == "Attention") EXPECT_EQ(n->input(0)->type().str(), "f32[2,2,5,8]");
  }
}

// torchvision's Swin: Q scaled, a trained relative-position bias, then the shifted-window mask
// [1, nW, 1, N, N] (finite, -100) added on the scores viewed as [B, nW, H, N, N] and viewed back
// before the softmax. It fuses, and the loss and gradients (the bias's among them) are the unfused
// graph's. The two masks are summed in the views' common refinement [B, nW, H] as [1, nW, H, N, N]
// (refinedMasks), not over every score, and read as the periodic mask [1, nW H, N, N] by the
// attention in the Softmax's view: nothing is expanded over the batch.
TEST(FusedAttentionPass, ShiftedWindowMaskInAFiveDimViewFuses) {
  std::string mask;
  for (int w = 0; w < 2; ++w)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) mask += std::string(mask.empty() ? "" : ", ") + (w == 1 && (i < 2) != (j < 2) ? "-100.0" : "0.0");
  const std::string text = R"(graph "a" opset 17 {
  input %x : f32[4,2,4,8]
  param %wq : f32[8]
  param %wk : f32[8]
  param %wv : f32[8]
  param %rel : f32[1,2,4,4]
  const %c : f32[] = [0.35355339]
  const %s5 : i64[5] = [2, 2, 2, 4, 4]
  const %s4 : i64[4] = [4, 2, 4, 4]
  const %wm : f32[1,2,1,4,4] = [)" + mask + R"(]
  %q : f32[4,2,4,8] = Mul(%x, %wq) @q
  %k : f32[4,2,4,8] = Mul(%x, %wk) @k
  %kt : f32[4,2,8,4] = Transpose(%k) {perm = [0, 1, 3, 2]} @kt
  %v : f32[4,2,4,8] = Mul(%x, %wv) @v
  %qs : f32[4,2,4,8] = Mul(%q, %c) @attn/qscale
  %sc : f32[4,2,4,4] = MatMul(%qs, %kt) @attn/qk
  %sb : f32[4,2,4,4] = Add(%sc, %rel) @attn/rel
  %s5v : f32[2,2,2,4,4] = Reshape(%sb, %s5) @attn/view5
  %sm : f32[2,2,2,4,4] = Add(%s5v, %wm) @attn/shift_mask
  %s4v : f32[4,2,4,4] = Reshape(%sm, %s4) @attn/view4
  %p : f32[4,2,4,4] = Softmax(%s4v) {axis = -1} @attn/softmax
  %o : f32[4,2,4,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[4,2,4,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
  expectFusedLikePlain(text, {4, 2, 4, 8});
  auto g = parseGraph(text, "a");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
  for (const auto& n : g->nodes())
    if (n->op() == "Attention") {
      EXPECT_EQ(n->input(0)->type().str(), "f32[4,2,4,8]");  // Q in the Softmax's view [B nW, H]
      EXPECT_EQ(n->input(3)->type().str(), "f32[1,4,4,4]");  // bias [1, 1, H, ..] + window mask [1, nW, 1, ..], periodic
    }
  EXPECT_EQ(count(*g, "Attention"), 1);
  EXPECT_EQ(count(*g, "Expand"), 0);
}

// XGLM's attention form: the scores [B H, T, T] viewed as [B, H, T, T], the mask [B, 1, T, T]
// added, viewed back before the softmax (and the probabilities viewed as [B, H, T, T] and back after
// it: XGLM keeps that view for output_attentions). It fuses in the view [B, H] (Q viewed there, the mask read
// as it is, not expanded over the heads), and the loss and gradients are the unfused graph's. With
// XGLM's clamp max(., lowest) between (and older OPT's) it fuses too, as the fused op's score_floor:
// query rows masked everywhere (by -inf, by the lowest float, by both) are uniform, and at the
// clamp's ties the scores get all of the gradient where the bound is a constant (clamp's rule) or
// half where the Max shares ties (torch.maximum's, kTiesShared: the importer marks a bound that was a
// tensor of the forward), none below it (-inf entries), as the unfused graph's Max gives them.
TEST(FusedAttentionPass, MaskAloneInAFourDimViewIsReadThere) {
  for (const char* clamp : {"", "clamp", "shared"}) {
    SCOPED_TRACE(*clamp ? clamp : "plain");
    const std::string c = clamp;
    const std::string text = std::string(R"(graph "a" opset 17 {
  input %x : f32[4,4,8]
  input %m : f32[2,1,4,4]
  param %wq : f32[8]
  param %wk : f32[8]
  param %wv : f32[8]
  const %c : f32[] = [0.35355339]
  const %lowest : f32[] = [-3.4028234663852886e38]
  const %s4 : i64[4] = [2, 2, 4, 4]
  const %s3 : i64[3] = [4, 4, 4]
  %q0 : f32[4,4,8] = Mul(%x, %wq) @q
  %q : f32[4,4,8] = Mul(%q0, %c) @qscale
  %k : f32[4,4,8] = Mul(%x, %wk) @k
  %kt : f32[4,8,4] = Transpose(%k) {perm = [0, 2, 1]} @kt
  %v : f32[4,4,8] = Mul(%x, %wv) @v
  %sc : f32[4,4,4] = MatMul(%q, %kt) @attn/qk
  %s4v : f32[2,2,4,4] = Reshape(%sc, %s4) @attn/view4
  %sm : f32[2,2,4,4] = Add(%s4v, %m) @attn/mask
)") + (c == "clamp"    ? "  %cl : f32[2,2,4,4] = Max(%sm, %lowest) @attn/clamp\n  %s3v : f32[4,4,4] = Reshape(%cl, %s3) @attn/view3\n"
           : c == "shared" ? "  %cl : f32[2,2,4,4] = Max(%sm, %lowest) {ampc_ties_shared = 1} @attn/clamp\n  %s3v : f32[4,4,4] = Reshape(%cl, %s3) @attn/view3\n"
                           : "  %s3v : f32[4,4,4] = Reshape(%sm, %s3) @attn/view3\n") + R"(
  %p : f32[4,4,4] = Softmax(%s3v) {axis = -1} @attn/softmax
  %p4 : f32[2,2,4,4] = Reshape(%p, %s4) @attn/weights_view4
  %p3 : f32[4,4,4] = Reshape(%p4, %s3) @attn/weights_view3
  %o : f32[4,4,8] = MatMul(%p3, %v) @attn/pv
  %sq : f32[4,4,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
    // Batch 0 causal by -inf, batch 1 by the lowest value. Clamped, also rows masked everywhere:
    // batch 0's query 1 by -inf, batch 1's query 2 by the lowest value, its query 3 by both.
    const double lowest = std::numeric_limits<float>::lowest(), inf = std::numeric_limits<double>::infinity();
    Tensor m(TensorType{DType::f32, {2, 1, 4, 4}});
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
          double v = j <= i ? 0.0 : b == 0 ? -inf : lowest;
          if (*clamp && b == 0 && i == 1) v = -inf;
          if (*clamp && b == 1 && i == 2) v = lowest;
          if (*clamp && b == 1 && i == 3) v = j % 2 ? lowest : -inf;
          m.setDouble((b * 4 + i) * 4 + j, v);
        }
    expectFusedLikePlain(text, {4, 4, 8}, {{"m", m}});
    auto g = parseGraph(text, "a");
    ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
    for (const auto& n : g->nodes())
      if (n->op() == "Attention") {
        EXPECT_EQ(n->input(0)->type().str(), "f32[2,2,4,8]");  // Q in the view [B, H]
        EXPECT_EQ(n->input(3)->type().str(), "f32[2,1,4,4]");  // the mask as it is
        EXPECT_EQ(n->getFloat("score_floor", -INFINITY), *clamp ? std::numeric_limits<float>::lowest() : -INFINITY);
        EXPECT_EQ(n->getFloat("floor_tie", 1.0f), c == "shared" ? 0.5f : 1.0f);
      }
    EXPECT_EQ(count(*g, "Attention"), 1);
    EXPECT_EQ(count(*g, "Expand"), 0);
    EXPECT_EQ(count(*g, "Max"), 0);
  }
}

// Transformers' attention as both PyTorch exporters write it: a mask that broadcasts over heads
// (per batch [B, 1, Tq, Tk], a padding row [B, 1, 1, Tk]) or over batches ([1, H, Tq, Tk]), -inf
// entries, and Where(IsNaN(P), 0, P) after the softmax. It fuses (zero_empty_rows), and the loss
// and gradients are the unfused graph's. A query row masked everywhere then gives O = 0 (the
// unfused graph's Where makes it 0 too) and finite gradients, where the unfused graph's Softmax
// gradient is NaN (PyTorch's own _safe_softmax gives 0 there, as the fused op does).
TEST(FusedAttentionPass, BroadcastMasksAndTheNaNGuard) {
  const std::vector<std::vector<int64_t>> masks = {{2, 1, 5, 5}, {2, 1, 1, 5}, {1, 2, 5, 5}, {5, 5}};
  for (const auto& ms : masks)
    for (const bool emptyRow : {false, true}) {
      if (emptyRow && ms[ms.size() - 2] == 1) continue;  // a padding row masks keys, not queries
      std::string mdims;
      for (int64_t d : ms) mdims += (mdims.empty() ? "" : ",") + std::to_string(d);
      const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + "  input %m : f32[" + mdims + R"(]
  const %c : f32[] = [0.35355339]
  const %zero : f32[] = [0.0]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %c) @attn/scale
  %sm : f32[2,2,5,5] = Add(%ss, %m) @attn/mask
  %p : f32[2,2,5,5] = Softmax(%sm) {axis = -1} @attn/softmax
  %nan : bool[2,2,5,5] = IsNaN(%p) @attn/isnan
  %pz : f32[2,2,5,5] = Where(%nan, %zero, %p) @attn/where
  %o : f32[2,2,5,8] = MatMul(%pz, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
  output %o
})";
      const std::string what = "mask [" + mdims + "]" + (emptyRow ? " with an empty row" : "");
      std::mt19937 rng(11);
      auto fused = parseGraph(text, "a"), plain = parseGraph(text, "a");
      ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*fused)) << what;
      ASSERT_EQ(count(*fused, "Attention"), 1) << what;
      EXPECT_EQ(count(*fused, "IsNaN") + count(*fused, "Where") + count(*fused, "Softmax"), 0) << what;
      for (const auto& n : fused->nodes())
        if (n->op() == "Attention") EXPECT_EQ(n->getInt("zero_empty_rows", 0), 1) << what;
      for (Value* p : plain->params()) {
        Tensor t(p->type());
        for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, std::normal_distribution<double>(0, 0.3)(rng));
        fused->lookup(p->name())->setData(t);
        p->setData(std::move(t));
      }
      auto forward = parseGraph(text, "a");  // the fused graph's loss and O
      createFuseAttentionPass(findTarget("cpu"))->run(*forward);
      for (Value* p : forward->params()) p->setData(*plain->lookup(p->name())->data());
      createAutodiffPass()->run(*fused);
      createAutodiffPass()->run(*plain);
      Tensor x(TensorType{DType::f32, {2, 5, 16}}), m(TensorType{DType::f32, ms});
      for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::normal_distribution<double>()(rng));
      const int64_t tk = 5, tq = ms[ms.size() - 2];
      for (int64_t e = 0; e < m.numel(); ++e) {
        const int64_t j = e % tk, i = (e / tk) % tq;
        const bool masked = std::uniform_real_distribution<double>()(rng) < 0.3 && j != i % tk;  // every row keeps a key
        m.setDouble(e, masked ? -INFINITY : std::normal_distribution<double>()(rng));
      }
      if (emptyRow)
        for (int64_t j = 0; j < tk; ++j) m.setDouble(m.numel() - tk * 2 + j, -INFINITY);  // the last slice's row tq - 2
      auto backend = createCpuBackend();
      auto a = evaluate(*fused, {{"x", x}, {"m", m}}, *backend), b = evaluate(*plain, {{"x", x}, {"m", m}}, *backend);
      ASSERT_EQ(a.size(), 4u) << what;  // the loss and three weight gradients
      for (size_t i = 0; i < a.size(); ++i) {
        std::vector<double> u, w;
        for (int64_t k = 0; k < a[i].numel(); ++k) u.push_back(a[i].getDouble(k)), w.push_back(b[i].getDouble(k));
        for (double d : u) ASSERT_TRUE(std::isfinite(d)) << what << ": " << fused->outputs()[i]->name();
        if (emptyRow && i >= 1) continue;  // the unfused gradients are NaN
        EXPECT_LE(relL2(u, w), 1e-5) << what << ": " << fused->outputs()[i]->name();
        EXPECT_GT(std::fabs(w[0]) + std::fabs(w.back()), 0.0) << what;
      }
      if (emptyRow) {  // O's rows that read the empty mask row are exactly 0, and only those
        const auto f = evaluate(*forward, {{"x", x}, {"m", m}}, *backend);
        EXPECT_NEAR(f[0].getDouble(0), b[0].getDouble(0), 1e-6 * std::fabs(b[0].getDouble(0))) << what;
        const auto& os = f[1];
        int zeroRows = 0;
        for (int64_t r = 0; r < os.numel() / 8; ++r) {
          bool zero = true;
          for (int64_t d = 0; d < 8; ++d) zero &= os.getDouble(r * 8 + d) == 0.0;
          zeroRows += zero;
        }
        EXPECT_EQ(zeroRows, ms.size() == 2 ? 4 : 2) << what;  // every batch-head, or the two of one batch / head
      }
    }
}

// Rows masked everywhere by a finite fill (kernels/cuda/limits.h, kAttentionFillLse): a sequence
// that is all padding ([2, 1, 1, 5], batch 1), and a causal mask with a left-padded sequence
// ([2, 1, 5, 5], batch 1's first two queries see only padding). f32 rounding makes each score of
// such a row the fill, so the unfused softmax is uniform; the fused op's LSE has lost log(l) there,
// and it must not read exp(s - LSE) = 1 as the probability. The loss reads every row (so the fill
// rows get a gradient): loss and weight gradients are the unfused graph's, for the lowest float (what
// transformers writes) and -1e30. (A fill such as -1e9 leaves such a row's scores apart in steps of
// 64, so which of them is the max turns on the last bit of a dot product: no two summation orders
// agree there, the unfused graph's with itself neither.)
TEST(FusedAttentionPass, RowsMaskedEverywhereByAFillMatchTheUnfusedGraph) {
  for (const std::string mdims : {"2,1,1,5", "2,1,5,5"})
    for (const double fillValue : {static_cast<double>(std::numeric_limits<float>::lowest()), -1e30}) {
      const std::string what = "mask [" + mdims + "] fill " + std::to_string(fillValue);
      const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + "  input %m : f32[" + mdims + R"(]
  const %c : f32[] = [0.35355339]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %c) @attn/scale
  %sm : f32[2,2,5,5] = Add(%ss, %m) @attn/mask
  %p : f32[2,2,5,5] = Softmax(%sm) {axis = -1} @attn/softmax
  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
      SCOPED_TRACE(what);
      const bool rows = mdims == "2,1,5,5";
      Tensor m(TensorType{DType::f32, rows ? std::vector<int64_t>{2, 1, 5, 5} : std::vector<int64_t>{2, 1, 1, 5}});
      for (int64_t e = 0; e < m.numel(); ++e) {
        const int64_t j = e % 5, i = rows ? (e / 5) % 5 : 0, b = e / (rows ? 25 : 5);
        const bool masked = rows ? (j > i || (b == 1 && j < 2)) : b == 1;
        m.setDouble(e, masked ? fillValue : 0.0);
      }
      expectFusedLikePlain(text, {2, 5, 16}, {{"m", m}});
    }
}

// The end of the test graphs below: softmax over the scores `s` ([2, 2, 5, 5]), the product with V
// and a loss.
std::string softmaxToLoss(const std::string& s) {
  return "  %p : f32[2,2,5,5] = Softmax(" + s + ") {axis = -1} @attn/softmax\n  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv\n" +
         "  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq\n  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss\n  output %loss\n}\n";
}

// Where masks as exporters write them: nanoGPT's masked_fill(mask, -inf) (Where(c, fill, S), here
// with a constant causal condition), transformers' eager attention (Where(c, S, finfo.min) under
// the Add of a padding mask, the condition the constant causal one) and a condition input with
// -inf. Each fuses into one Attention with an additive mask, and the loss and gradients are the
// unfused graph's (fresh random data, f32). A fill of -1e4 is left unfused: s + fill is not fill
// there. A window (GPT-Neo's local layers) under the padding fuses with its condition as the
// where_masked operand (WhereUnderAddedMaskMarksTheWhereEntries tests rows masked everywhere).
// `text` parsed twice: once with fuse-attention run, which must fuse its one attention (one
// Attention node, no Softmax left), and once as written.
std::pair<std::unique_ptr<Graph>, std::unique_ptr<Graph>> fusedAndPlain(const std::string& text, const std::string& name) {
  auto fused = parseGraph(text, name), plain = parseGraph(text, name);
  EXPECT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*fused)) << name;
  EXPECT_EQ(count(*fused, "Attention"), 1) << name;
  EXPECT_EQ(count(*fused, "Softmax"), 0) << name;
  return {std::move(fused), std::move(plain)};
}

// `fused` (fuse-attention run) against `plain` (the same graph unfused): both get the same random
// parameters and the backward, then the loss and each gradient (`results` in all) on x of [2, 5, 16]
// and the inputs `more` adds must agree within 1e-5, finite and not all zero.
void expectTrainsLikeUnfused(Graph& fused, Graph& plain, std::mt19937& rng, size_t results, const std::string& name,
                             const std::function<void(std::map<std::string, Tensor>&)>& more) {
  for (Value* p : plain.params()) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, std::normal_distribution<double>(0, 0.5)(rng));
    fused.lookup(p->name())->setData(t);
    p->setData(std::move(t));
  }
  createAutodiffPass()->run(fused);
  createAutodiffPass()->run(plain);
  std::map<std::string, Tensor> in;
  Tensor x(TensorType{DType::f32, {2, 5, 16}});
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::normal_distribution<double>()(rng));
  in.emplace("x", x);
  more(in);
  auto backend = createCpuBackend();
  auto a = evaluate(fused, in, *backend), b = evaluate(plain, in, *backend);
  ASSERT_EQ(a.size(), results) << name;
  for (size_t i = 0; i < a.size(); ++i) {
    std::vector<double> u, v;
    for (int64_t k = 0; k < a[i].numel(); ++k) u.push_back(a[i].getDouble(k)), v.push_back(b[i].getDouble(k));
    for (double d : u) ASSERT_TRUE(std::isfinite(d)) << name;
    EXPECT_LE(relL2(u, v), 1e-5) << name << ": " << fused.outputs()[i]->name();
    double norm = 0;
    for (double d : v) norm += d * d;
    EXPECT_GT(norm, 0.0) << name << ": " << fused.outputs()[i]->name();
  }
}

TEST(FusedAttentionPass, WhereMasksFuse) {
  struct W {
    std::string name, where, extra;
    bool constCond, fuses;
  };
  const std::vector<W> cases = {
      {"masked_fill_const_causal", "Where(%c, %fill, %ss)", "", true, true},
      {"eager_where_then_padding", "Where(%c, %ss, %fill)", "add", true, true},
      {"window_where_then_padding", "Where(%c, %ss, %fill)", "add", true, true},
      {"where_input_cond", "Where(%c, %ss, %fill)", "", false, true},
      {"small_fill_stays", "Where(%c, %ss, %fill)", "", false, false},
  };
  for (const W& w : cases) {
    const bool add = w.extra == "add";
    const double fill = w.name == "small_fill_stays" ? -1e4 : add ? -3.4028234663852886e38 : -INFINITY;
    std::ostringstream fs;
    fs.precision(17);
    fs << fill;
    std::string cond;
    if (w.constCond) {
      cond = "  const %c : bool[5,5] = [";
      const bool masksWhereTrue = w.where.find("%fill, %ss") != std::string::npos;  // masked_fill: true is masked
      const int window = w.name.rfind("window", 0) == 0 ? 2 : 5;  // keys i-window < j <= i kept
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) cond += std::string(i || j ? ", " : "") + ((j <= i && j > i - window) != masksWhereTrue ? "1" : "0");
      cond += "]\n";
    } else {
      cond = "  input %c : bool[2,1,5,5]\n";
    }
    const std::string fillText = std::isinf(fill) ? "-inf" : fs.str();
    std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + cond + (add ? "  input %m : f32[2,1,1,5]\n" : "") +
                       "  const %sc0 : f32[] = [0.35355339]\n  const %fill : f32[] = [" + fillText + "]\n" +
                       "  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk\n  %ss : f32[2,2,5,5] = Mul(%sc, %sc0) @attn/scale\n" +
                       "  %sw : f32[2,2,5,5] = " + w.where + " @attn/where\n";
    text += add ? "  %sm : f32[2,2,5,5] = Add(%sw, %m) @attn/mask\n" : "  %sm : f32[2,2,5,5] = Identity(%sw) @attn/id\n";
    text += R"(  %p : f32[2,2,5,5] = Softmax(%sm) {axis = -1} @attn/softmax
  %o : f32[2,2,5,8] = MatMul(%p, %v) @attn/pv
  %sq : f32[2,2,5,8] = Mul(%o, %o) @sq
  %loss : f32[] = ReduceMean(%sq) {keepdims = 0} @loss
  output %loss
})";
    if (!add) {  // the Softmax reads the Where itself
      text.replace(text.find("  %sm : f32[2,2,5,5] = Identity(%sw) @attn/id\n"), std::string("  %sm : f32[2,2,5,5] = Identity(%sw) @attn/id\n").size(), "");
      text.replace(text.find("Softmax(%sm)"), std::string("Softmax(%sm)").size(), "Softmax(%sw)");
    }
    auto fused = parseGraph(text, w.name), plain = parseGraph(text, w.name);
    EXPECT_EQ(createFuseAttentionPass(findTarget("cpu"))->run(*fused), w.fuses) << w.name;
    EXPECT_EQ(count(*fused, "Attention"), w.fuses ? 1 : 0) << w.name;
    EXPECT_EQ(count(*fused, "Softmax"), w.fuses ? 0 : 1) << w.name;
    if (!w.fuses) continue;
    std::mt19937 rng(5);
    expectTrainsLikeUnfused(*fused, *plain, rng, 4, w.name, [&](std::map<std::string, Tensor>& in) {  // the loss and three weight gradients
      if (!w.constCond) {  // random keys masked, each row keeping its diagonal; the Where keeps where c is 1
        Tensor c(TensorType{DType::boolean, {2, 1, 5, 5}});
        for (int64_t e = 0; e < c.numel(); ++e) {
          const bool keepIt = e % 5 == (e / 5) % 5 || std::uniform_real_distribution<double>()(rng) < 0.6;
          c.setDouble(e, (w.where.find("%fill, %ss") != std::string::npos) != keepIt ? 1.0 : 0.0);
        }
        in.emplace("c", c);
      }
      if (add) {
        Tensor m(TensorType{DType::f32, {2, 1, 1, 5}});
        for (int64_t e = 0; e < m.numel(); ++e) m.setDouble(e, e == 9 ? -3.4028234663852886e38 : 0.0);  // batch 1's last key padded
        in.emplace("m", m);
      }
    });
  }
}

// Masks the exporters add in other orders: T5's TorchScript export adds Where(c, bias, fill) (its
// trained relative-position bias, masked) to the product, MPNet adds its bias and then the padding
// mask (two Adds), MPT masks Where(c, fill, S + ALiBi) (the Add under the Where). Each fuses into one
// Attention with the masks summed, and the loss and every gradient (the trained bias's too) match
// the unfused graph's; CodeGen (and GPT-J) scale after adding the mask, (S + M) / c, which fuses with
// the mask scaled. Before, the Add's Where side was taken for the scores (T5), and one Add (MPNet), an
// Add under the Where (MPT) or a scale under the Softmax (CodeGen) was all the matcher took.
TEST(FusedAttentionPass, MasksAddedInOtherOrdersFuse) {
  struct M {
    std::string name, decl, body;
    bool condMasks;  // the condition is true where a key is masked (else where it is kept)
  };
  const std::string fill = "-3.4028234663852886e+38";
  const std::vector<M> cases = {
      {"t5_where_bias", "  param %b : f32[1,2,5,5]\n  input %c : bool[2,1,5,5]\n",
       "  %bw : f32[2,2,5,5] = Where(%c, %b, %fill) @attn/bias\n  %sm : f32[2,2,5,5] = Add(%ss, %bw) @attn/add\n", false},
      {"mpnet_two_adds", "  param %b : f32[1,2,5,5]\n  input %m : f32[2,1,1,5]\n",
       "  %s1 : f32[2,2,5,5] = Add(%ss, %b) @attn/bias\n  %sm : f32[2,2,5,5] = Add(%s1, %m) @attn/pad\n", false},
      {"mpt_add_under_where", "  param %b : f32[1,2,1,5]\n  input %c : bool[2,1,5,5]\n",
       "  %s1 : f32[2,2,5,5] = Add(%ss, %b) @attn/alibi\n  %sm : f32[2,2,5,5] = Where(%c, %fill, %s1) @attn/where\n", true},
      {"codegen_scale_after_mask", "  param %b : f32[1,2,5,5]\n  input %m : f32[2,1,1,5]\n  const %two : f32[] = [2.0]\n",
       "  %s1 : f32[2,2,5,5] = Add(%ss, %b) @attn/bias\n  %s2 : f32[2,2,5,5] = Add(%s1, %m) @attn/pad\n  %sm : f32[2,2,5,5] = Div(%s2, %two) @attn/scale_after\n",
       false},
  };
  for (const M& c : cases) {
    std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + c.decl + "  const %sc0 : f32[] = [0.35355339]\n  const %fill : f32[] = [" +
                       fill + "]\n  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk\n  %ss : f32[2,2,5,5] = Mul(%sc, %sc0) @attn/scale\n" + c.body +
                       softmaxToLoss("%sm");
    auto [fused, plain] = fusedAndPlain(text, c.name);
    std::mt19937 rng(7);
    expectTrainsLikeUnfused(*fused, *plain, rng, 5, c.name, [&](std::map<std::string, Tensor>& in) {  // + the bias's gradient
      if (plain->lookup("c")) {  // random keys masked, each row keeping its diagonal
        Tensor cond(TensorType{DType::boolean, {2, 1, 5, 5}});
        for (int64_t e = 0; e < cond.numel(); ++e) {
          const bool keepIt = e % 5 == (e / 5) % 5 || std::uniform_real_distribution<double>()(rng) < 0.6;
          cond.setDouble(e, c.condMasks != keepIt ? 1.0 : 0.0);
        }
        in.emplace("c", cond);
      }
      if (plain->lookup("m")) {
        Tensor m(TensorType{DType::f32, {2, 1, 1, 5}});
        for (int64_t e = 0; e < m.numel(); ++e) m.setDouble(e, e == 9 ? -3.4028234663852886e38 : 0.0);  // batch 1's last key padded
        in.emplace("m", m);
      }
    });
  }
}

// Multi-query attention written as Falcon's export writes it: one K and V head [B, 1, T, D] read by
// every query head through the products' broadcast. It fuses with K and V expanded to Q's heads, and
// trains as the unfused graph (the K and V weights' gradients summed over the heads by the Expand's).
TEST(FusedAttentionPass, MultiQueryByBroadcastFuses) {
  const std::string text = R"(graph "mqa" opset 17 {
  input %x : f32[2,5,16]
  param %wq : f32[16,16]
  param %wk : f32[16,8]
  param %wv : f32[16,8]
  const %qs : i64[4] = [2, 5, 2, 8]
  const %ks : i64[4] = [2, 5, 1, 8]
  const %sc0 : f32[] = [0.35355339]
  %q0 : f32[2,5,16] = MatMul(%x, %wq) @q
  %k0 : f32[2,5,8] = MatMul(%x, %wk) @k
  %v0 : f32[2,5,8] = MatMul(%x, %wv) @v
  %q1 : f32[2,5,2,8] = Reshape(%q0, %qs) @qr
  %k1 : f32[2,5,1,8] = Reshape(%k0, %ks) @kr
  %v1 : f32[2,5,1,8] = Reshape(%v0, %ks) @vr
  %q : f32[2,2,5,8] = Transpose(%q1) {perm = [0, 2, 1, 3]} @qt
  %kt : f32[2,1,8,5] = Transpose(%k1) {perm = [0, 2, 3, 1]} @kt
  %v : f32[2,1,5,8] = Transpose(%v1) {perm = [0, 2, 1, 3]} @vt
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %sc0) @attn/scale
)" + softmaxToLoss("%ss");
  auto [fused, plain] = fusedAndPlain(text, "mqa");
  EXPECT_EQ(count(*fused, "Expand"), 2);
  std::mt19937 rng(11);
  expectTrainsLikeUnfused(*fused, *plain, rng, 4, "mqa", [](std::map<std::string, Tensor>&) {});
}

// A scale per head that is a tensor (Swin V2's trained logit scale on its cosine scores, [H, 1, 1])
// moves onto Q: the attention fuses, and the scale's own gradient matches the unfused graph's.
TEST(FusedAttentionPass, ScalePerHeadMovesOntoQ) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  param %ls : f32[2,1,1]
  %t : f32[2,1,1] = Exp(%ls) @attn/logit_scale
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %t) @attn/scale
)" + softmaxToLoss("%ss");
  auto [fused, plain] = fusedAndPlain(text, "per-head scale");
  std::mt19937 rng(13);
  expectTrainsLikeUnfused(*fused, *plain, rng, 5, "per-head scale", [](std::map<std::string, Tensor>&) {});  // + the scale's gradient
}

// Layers that mask with one condition share one additive mask: one Where for two attentions. The
// second layer's probabilities pass through Identity nodes (torch.export's clone) on the way to V.
TEST(FusedAttentionPass, WhereMasksShareTheirAdditiveForm) {
  std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + "  input %c : bool[1,1,5,5]\n  const %fill : f32[] = [-inf]\n";
  for (const char* l : {"1", "2"}) {
    const std::string L = l;
    text += "  %sc" + L + " : f32[2,2,5,5] = MatMul(%q, %kt) @l" + L + "/qk\n";
    text += "  %sw" + L + " : f32[2,2,5,5] = Where(%c, %fill, %sc" + L + ") @l" + L + "/where\n";
    text += "  %p" + L + " : f32[2,2,5,5] = Softmax(%sw" + L + ") {axis = -1} @l" + L + "/softmax\n";
    const std::string pv = L == "2" ? "%pc2" : "%p1";
    if (L == "2") text += "  %pi2 : f32[2,2,5,5] = Identity(%p2) @l2/clone\n  %pc2 : f32[2,2,5,5] = Identity(%pi2) @l2/clone2\n";
    text += "  %o" + L + " : f32[2,2,5,8] = MatMul(" + pv + ", %v) @l" + L + "/pv\n";
  }
  text += "  %o : f32[2,2,5,8] = Add(%o1, %o2) @sum\n  output %o\n}\n";
  auto g = parseGraph(text, "two layers");
  ASSERT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*g));
  EXPECT_EQ(count(*g, "Attention"), 2);
  EXPECT_EQ(count(*g, "Where"), 1);
  EXPECT_EQ(count(*g, "Identity") + count(*g, "Softmax"), 0);
  const Value* mask = nullptr;
  for (const auto& n : g->nodes())
    if (n->op() == "Attention") {
      ASSERT_EQ(n->numInputs(), 4u);
      if (mask) {
        EXPECT_EQ(n->input(3), mask);
      }
      mask = n->input(3);
    }
}

// A mask computed from a trained parameter (GPT-2's causal mask buffer, trained when nobody
// freezes it) fuses too, and the backward gives it its gradient: AttentionGrad's fourth result.
TEST(FusedAttentionPass, TrainedMaskGetsItsGradient) {
  auto g = load({"gpt2_tiny", "", 0});
  EXPECT_TRUE(createFuseAttentionPass()->run(*g));
  EXPECT_EQ(count(*g, "Attention"), 2);
  EXPECT_EQ(count(*g, "Softmax"), 0);
  createTrainStepPass(TrainOptions{})->run(*g);
  int withMaskGrad = 0;
  for (const auto& n : g->nodes()) withMaskGrad += n->op() == "AttentionGrad" && n->numResults() == 4;
  EXPECT_EQ(withMaskGrad, 2);
}

// The fused graph no longer holds any [.., T, T] tensor in the forward or the backward.
TEST(FusedAttentionPass, NoScoreTensorsRemain) {
  auto g = load({"gpt2_tiny", "causal_mask", 2});
  TrainOptions o;
  o.autodiff.freeze = "causal_mask";
  createFuseAttentionPass()->run(*g);
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

// transformers' eager attention in GPT-2's form, Where(causal, S, finfo.min) + a padding mask, with
// batch 1 left-padded by three keys: its first three queries see only padding, and their rows hold
// three kinds of masked entries. Keys j <= i are padding (s + pad, which is the fill, with a
// gradient); keys above the diagonal masked by the Where alone (the fill, no gradient to s); both
// (-inf). In f32 the first two give the same value, so the row is uniform over them. The loss reads
// every row. The fused op sums the Where's additive form and the padding into one mask, which
// cannot tell the first two kinds apart. where_causal = 1 (the Where's condition is the constant
// causal one) lets the fill-row fix-ups give the scores above the diagonal no gradient. dQ and dK
// are the unfused graph's again (before: the scores above the diagonal took the gradient).
TEST(FusedAttentionPass, CausalWhereUnderAPaddingMaskGivesRowsMaskedEverywhereTheirGradient) {
  const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  input %pad : f32[2,1,1,5]
  const %c : bool[1,1,5,5] = [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
  const %s : f32[] = [0.35355339]
  const %fill : f32[] = [-3.4028234663852886e38]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sw : f32[2,2,5,5] = Where(%c, %ss, %fill) @attn/where
  %sa : f32[2,2,5,5] = Add(%sw, %pad) @attn/pad
)" + softmaxToLoss("%sa");
  Tensor pad(TensorType{DType::f32, {2, 1, 1, 5}});
  for (int64_t e = 0; e < 10; ++e) pad.setDouble(e, e >= 5 && e < 8 ? static_cast<double>(std::numeric_limits<float>::lowest()) : 0.0);
  expectFusedLikePlain(text, {2, 5, 16}, {{"pad", pad}});
  auto g = parseGraph(text, "a");
  createFuseAttentionPass(findTarget("cpu"))->run(*g);
  int64_t marked = -1;
  for (const auto& n : g->nodes())
    if (n->op() == "Attention") marked = n->getInt("where_causal", 0);
  EXPECT_EQ(marked, 1);
}

// The same Where(c, S, finfo.min) + padding under conditions other than the causal one: a window of
// two keys (a constant: GPT-Neo's local layers) and one the step is given (here the causal pattern,
// not known ahead). Batch 1's first three keys are padding, so its rows 0-2 are masked everywhere
// under the window (and 0-2 under the causal pattern), by the two together. There the Where's
// entries must get no gradient and the padding's theirs: the fused op takes the condition as its
// where_masked operand, and every gradient is the unfused graph's; the CUDA target fuses them alike
// (its kernels' side: GpuAttention's mma_where_window_padded). A causal condition computed in the graph (Not of the upper triangle) is known ahead of the step:
// fused and marked where_causal, no operand, on both targets.
TEST(FusedAttentionPass, WhereUnderAddedMaskMarksTheWhereEntries) {
  const std::string head = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  input %pad : f32[2,1,1,5]
  input %given : bool[1,1,5,5]
  const %window : bool[1,1,5,5] = [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1]
  const %upper : bool[1,1,5,5] = [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
  %causal : bool[1,1,5,5] = Not(%upper)
  const %s : f32[] = [0.35355339]
  const %fill : f32[] = [-3.4028234663852886e38]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
)";
  auto text = [&](const std::string& c) {
    return head + "  %sw : f32[2,2,5,5] = Where(" + c + ", %ss, %fill) @attn/where\n  %sa : f32[2,2,5,5] = Add(%sw, %pad) @attn/pad\n" +
           softmaxToLoss("%sa");
  };
  Tensor pad(TensorType{DType::f32, {2, 1, 1, 5}});
  for (int64_t e = 0; e < 10; ++e) pad.setDouble(e, e >= 5 && e < 8 ? static_cast<double>(std::numeric_limits<float>::lowest()) : 0.0);
  Tensor given(TensorType{DType::boolean, {1, 1, 5, 5}});
  for (int64_t e = 0; e < 25; ++e) given.setDouble(e, e % 5 <= e / 5);
  auto attention = [](const Graph& g) -> const Node* {
    for (const auto& n : g.nodes())
      if (n->op() == "Attention") return n.get();
    return nullptr;
  };
  for (const char* c : {"%window", "%given", "%causal"}) {
    SCOPED_TRACE(c);
    expectFusedLikePlain(text(c), {2, 5, 16}, {{"pad", pad}, {"given", given}});
    auto g = parseGraph(text(c), "a");
    createFuseAttentionPass(findTarget("cpu"))->run(*g);
    const Node* a = attention(*g);
    ASSERT_TRUE(a);
    const bool causal = std::string(c) == "%causal";
    EXPECT_EQ(a->numInputs(), causal ? 4u : 5u);
    EXPECT_EQ(a->getInt("where_causal", 0), causal ? 1 : 0);
    auto onCuda = parseGraph(text(c), "a");
    createFuseAttentionPass(findTarget("cuda"))->run(*onCuda);
    const Node* b = attention(*onCuda);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->numInputs(), a->numInputs());
    EXPECT_EQ(b->getInt("where_causal", 0), causal ? 1 : 0);
  }
}

// fuse-gelu's SiLU: x * Sigmoid(x), in either operand order, becomes one ampc.Silu; a Sigmoid with
// another use stays. The fused graph computes the same values (f64, fresh random data), and at
// bf16 each output is the f32 SiLU of the bf16 input rounded once (PyTorch's silu), where the
// unfused pair rounds after the Sigmoid and again after the Mul.
TEST(FuseSilu, OneRoundingAtBf16) {
  const char* text = R"(graph "silu" opset 17 {
  input %x : f32[4,64]
  %s : f32[4,64] = Sigmoid(%x)
  %a : f32[4,64] = Mul(%x, %s)
  %t : f32[4,64] = Sigmoid(%a)
  %b : f32[4,64] = Mul(%t, %a)
  %u : f32[4,64] = Sigmoid(%b)
  %c : f32[4,64] = Mul(%b, %u)
  %d : f32[4,64] = Add(%c, %u)
  output %d
})";
  auto fused = parseGraph(text, "silu"), plain = parseGraph(text, "silu");
  EXPECT_TRUE(createFuseGeluPass()->run(*fused));
  EXPECT_EQ(count(*fused, "Silu"), 2) << "x*Sigmoid(x) and Sigmoid(a)*a";
  EXPECT_EQ(count(*fused, "Sigmoid"), 1) << "the Sigmoid that the Add also reads is not fused";
  verify(*fused);
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(-8, 8);
  Tensor x(TensorType{DType::f32, {4, 64}});
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, u(rng));
  auto backend = createCpuBackend();
  const Tensor want = evaluate(*plain, {{"x", x}}, *backend)[0], got = evaluate(*fused, {{"x", x}}, *backend)[0];
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_NEAR(got.getDouble(i), want.getDouble(i), 1e-5 * (1 + std::fabs(want.getDouble(i)))) << i;

  // At bf16 (an activation the model made bf16, as a Conv's output under autocast): one Silu is
  // bf16(x * sigmoid(x)) exactly.
  auto one = parseGraph(R"(graph "one" opset 17 {
  input %x : f32[256]
  %h : bf16[256] = Cast(%x) {to = 16}
  %s : bf16[256] = Sigmoid(%h)
  %y : bf16[256] = Mul(%s, %h)
  output %y
})", "one");
  createFuseGeluPass()->run(*one);
  ASSERT_EQ(count(*one, "Silu"), 1);
  AutocastOptions ao;
  ao.low = DType::bf16;
  createAutocastPass(ao)->run(*one);
  createCastCleanupPass()->run(*one);
  Tensor xs(TensorType{DType::f32, {256}});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.setDouble(i, u(rng));
  const Tensor y = evaluate(*one, {{"x", xs}}, *backend)[0];
  int rounded = 0;
  for (int64_t i = 0; i < xs.numel(); ++i) {
    const float xb = bf16ToFloat(floatToBf16(static_cast<float>(xs.getDouble(i))));
    const float sig = xb >= 0 ? 1.0f / (1.0f + std::exp(-xb)) : std::exp(xb) / (1.0f + std::exp(xb));
    const float exact = xb * sig;
    ASSERT_EQ(static_cast<float>(y.getDouble(i)), bf16ToFloat(floatToBf16(exact))) << "element " << i << " of x = " << xb;
    rounded += static_cast<float>(y.getDouble(i)) != exact;
  }
  EXPECT_GT(rounded, 0) << "the output was not rounded to bf16: autocast did not paint the Silu";
}

// Rows masked everywhere by a Where's finite fill alone (masked_fill(~mask, finfo.min) with a padding
// condition: batch 1's first two queries see nothing): the unfused graph makes them uniform and
// gives the scores no gradient there (Where's), which the additive form (s + fill is fill) did not:
// dQ and dK were off by a quarter (stop 65). The fused op now takes the fill as score_floor with
// floor_tie 0 and the masked entries as -inf, and the loss (which reads every row) and every
// gradient are the unfused graph's. A constant causal condition masks no row everywhere: its
// attention keeps the additive form, with no floor. A fill of -1e9 (the Annotated Transformer's
// masked_fill(mask == 0, -1e9), where s + fill is not fill) fuses only this way, also under the
// causal condition, and stays unfused under an added mask.
TEST(FusedAttentionPass, RowsMaskedEverywhereByAWhereGiveTheScoresNoGradient) {
  for (const std::string fill : {"-3.4028234663852886e38", "-1e9"}) {
    SCOPED_TRACE("fill " + fill);
    const bool lowest = fill != "-1e9";
    const std::string text = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  input %c : bool[2,1,5,5]
  const %s : f32[] = [0.35355339]
  const %fill : f32[] = [)" + fill + R"(]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sw : f32[2,2,5,5] = Where(%c, %ss, %fill) @attn/where
)" + softmaxToLoss("%sw");
    Tensor c(TensorType{DType::boolean, {2, 1, 5, 5}});
    for (int64_t e = 0; e < 50; ++e) {
      const int64_t j = e % 5, i = (e / 5) % 5, b = e / 25;
      c.setDouble(e, (j <= i && !(b == 1 && i < 2)) ? 1.0 : 0.0);
    }
    expectFusedLikePlain(text, {2, 5, 16}, {{"c", c}});
    auto floorOf = [](const std::string& t) {
      auto g = parseGraph(t, "a");
      createFuseAttentionPass(findTarget("cpu"))->run(*g);
      for (const auto& n : g->nodes())
        if (n->op() == "Attention") return std::make_pair(n->getFloat("score_floor", -INFINITY), n->getFloat("floor_tie", 1.0f));
      return std::make_pair(0.0f, -1.0f);  // not fused
    };
    const float f = lowest ? std::numeric_limits<float>::lowest() : -1e9f;
    EXPECT_EQ(floorOf(text), std::make_pair(f, 0.0f));
    // A constant causal condition masks no row everywhere: with the lowest float its attention keeps
    // the additive form; -1e9 (s + fill is not fill) takes the floor form all the same.
    std::string causal = text;
    causal.replace(causal.find("  input %c : bool[2,1,5,5]"), 26,
                   "  const %c : bool[1,1,5,5] = [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]");
    EXPECT_EQ(floorOf(causal), lowest ? std::make_pair(-INFINITY, 1.0f) : std::make_pair(f, 0.0f));
    if (!lowest) expectFusedLikePlain(causal, {2, 5, 16});
    // Under an added mask: with -1e9 it stays unfused (s + fill is not fill, and no floor stands for
    // both); with the lowest float the condition (not known to be causal) becomes the where_masked
    // operand, and batch 1's rows 0 and 1, masked everywhere by the Where, get no gradient.
    std::string added = text;
    added.replace(added.find("  const %s :"), 0, "  input %pad : f32[2,1,1,5]\n");
    added.replace(added.find("Softmax(%sw)"), 12, "Softmax(%sa)");
    added.replace(added.find("  %p : f32"), 0, "  %sa : f32[2,2,5,5] = Add(%sw, %pad) @attn/pad\n");
    EXPECT_EQ(floorOf(added), lowest ? std::make_pair(-INFINITY, 1.0f) : std::make_pair(0.0f, -1.0f));
    if (lowest) expectFusedLikePlain(added, {2, 5, 16}, {{"c", c}, {"pad", Tensor(TensorType{DType::f32, {2, 1, 1, 5}})}});
  }
}

// Masks added under the Where (MPT's order: Where(c, fill, S + M)) with a fill of finfo.min: here a
// padding mask (batch 1's first three keys) and a trained bias, under a constant causal condition
// and under a window. Batch 1's rows 0-2 have every key the Where allows padded, so they hold the
// fill throughout: PyTorch's softmax is uniform over all five keys there, and only the allowed
// entries give the scores and the bias a gradient. Summed as the Where's additive form, the padded
// entries the Where also masked became fill + fill = -inf: the loss was 4.9-5.4% off and the
// gradients 0.16-1.55 (relative L2) before stop 70. The fused op's mask is s + Where(c, M, fill) instead, marked where_causal (causal)
// or with the where_masked operand (window); loss and every gradient are the unfused graph's. With
// a padding mask added over the Where too, the same.
TEST(FusedAttentionPass, MasksUnderTheWhereTakeItsFill) {
  const std::string head = "graph \"a\" opset 17 {\n" + attentionInputs(5, 2, 8) + R"(  input %pad : f32[2,1,1,5]
  param %bias : f32[1,2,5,5]
  const %upper : bool[1,1,5,5] = [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
  const %outside : bool[1,1,5,5] = [0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0]
  const %s : f32[] = [0.35355339]
  const %fill : f32[] = [-3.4028234663852886e38]
  %sc : f32[2,2,5,5] = MatMul(%q, %kt) @attn/qk
  %ss : f32[2,2,5,5] = Mul(%sc, %s) @attn/scale
  %sb : f32[2,2,5,5] = Add(%ss, %bias) @attn/bias
  %sa : f32[2,2,5,5] = Add(%sb, %pad) @attn/pad
)";
  Tensor pad(TensorType{DType::f32, {2, 1, 1, 5}});
  for (int64_t e = 0; e < 10; ++e) pad.setDouble(e, e >= 5 && e < 8 ? static_cast<double>(std::numeric_limits<float>::lowest()) : 0.0);
  for (const char* c : {"%upper", "%outside"})
    for (const bool overToo : {false, true}) {
      const bool causal = std::string(c) == "%upper";
      SCOPED_TRACE(std::string(c) + (overToo ? " with padding over the Where too" : ""));
      std::string text = head + "  %sw : f32[2,2,5,5] = Where(" + c + ", %fill, %sa) @attn/where\n";
      if (overToo) text += "  %so : f32[2,2,5,5] = Add(%sw, %pad) @attn/pad_over\n";
      text += softmaxToLoss(overToo ? "%so" : "%sw");
      expectFusedLikePlain(text, {2, 5, 16}, {{"pad", pad}});
      for (const char* target : {"cpu", "cuda"}) {
        auto g = parseGraph(text, "a");
        createFuseAttentionPass(findTarget(target))->run(*g);
        const Node* a = nullptr;
        for (const auto& n : g->nodes())
          if (n->op() == "Attention") a = n.get();
        ASSERT_TRUE(a) << target;
        EXPECT_EQ(a->getInt("where_causal", 0), causal ? 1 : 0) << target;
        EXPECT_EQ(a->numInputs(), causal ? 4u : 5u) << target;
      }
    }
}
