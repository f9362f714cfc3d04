// The CUDA backend's folds and schedule (runtime/folds.h), checked without a GPU on the committed
// models' training steps: the memory plan over the schedule is sound, every value a launching node
// reads (after the folds redirect its reads) is written and alive when the node runs, and every
// value it writes is born then.
#include <filesystem>
#include <set>

#include <gtest/gtest.h>

#include "compiler/ir/text.h"
#include "compiler/target.h"
#include "passes/data_parallel.h"
#include "passes/fold_casts.h"
#include "passes/fuse_grad_chain.h"
#include "passes/memory_plan.h"
#include "passes/pass.h"
#include "runtime/folds.h"
#include "runtime/plan.h"
#include "tests/common/train_graph.h"

using namespace ampc;
using namespace ampc::folds;

namespace {

// `harness`: the settings of tools/bench/harness.py's plans (weight decay, clipping).
std::unique_ptr<Graph> trainGraph(const std::string& model, DType precision, const std::string& optimizer, bool harness = false) {
  TrainOptions o;
  o.optimizer = optimizer;
  if (harness) o.weightDecay = 0.01f, o.clipNorm = 1.0f, o.momentum = 0.9f;
  return ampc::test::trainGraph(std::filesystem::path(AMPC_SOURCE_DIR) / "models", model, precision, o);
}

// A node that launches nothing: its work is done by a neighbour.
bool foldedAway(const Node& n) { return fusedComparison(n) || castFolded(n); }

// The values node n's launches read, as the CUDA lowering reads them.
std::vector<const Value*> reads(const Node& n) {
  std::vector<const Value*> r;
  const Node* narrow = narrowedGradInput(n);
  for (size_t i = 0; i < n.inputs().size(); ++i) {
    const Value* v = n.inputs()[i];
    if (!v) continue;
    if (narrow && i == 0) {  // DropoutGrad's dY: the narrowing Cast's f32 operand
      r.push_back(narrow->inputs()[0]);
      continue;
    }
    if (n.domain() == "ampc" && (n.op() == "SGD" || n.op() == "Adam") && i == 1) {  // through a folded UnscaleCheck (and clip)
      const Node* p = v->producer();
      const Node* u = p && p->op() == "ClipByGlobalNorm" ? p->inputs()[1]->producer() : p;
      const Node* clip = nullptr;
      if (u && fusedGradChain(*u, &clip)) {  // the gradient, 1/scale and the clip's found_inf
        r.push_back(readThrough(u->inputs()[static_cast<size_t>(v->resultIndex()) + 1]));
        r.push_back(u->inputs()[0]);
        if (clip) r.push_back(clip->inputs()[0]);
        continue;
      }
    }
    if (n.domain() == "ampc" && n.op() == "ClipByGlobalNorm" && i > 0) {  // folded: reads only found_inf
      const Node* u = n.inputs()[1]->producer();
      const Node* clip = nullptr;
      if (u && fusedGradChain(*u, &clip) && clip == &n) continue;
    }
    if (isOnnx(n, "Where") && i == 0 && v->producer() && fusedComparison(*v->producer())) {  // the comparison's operands
      for (const Value* a : v->producer()->inputs()) r.push_back(readThrough(a));
      continue;
    }
    r.push_back(readThrough(v));  // a folded widening Cast: every reader reads its narrow operand
  }
  return r;
}

// The values node n's launches write.
std::vector<const Value*> writes(const Graph& g, const Node& n) {
  std::vector<const Value*> w;
  for (size_t i = 0; i < n.numResults(); ++i) w.push_back(n.result(i));
  if (const Node* d = narrowedResult(n)) w[0] = d->result(0);
  if (n.domain() == "ampc" && n.op() == "ConvGrad" && n.result(0)->uses().empty() && !g.isOutput(n.result(0))) w.erase(w.begin());
  // A folded gradient chain: UnscaleCheck writes only found_inf, the clip only its norm.
  const Node* clip = nullptr;
  const size_t k = n.inputs().size() - 1;
  if (fusedGradChain(n, &clip)) w = {n.result(k)};
  if (n.domain() == "ampc" && n.op() == "ClipByGlobalNorm" && n.inputs()[1]->producer() &&
      fusedGradChain(*n.inputs()[1]->producer(), &clip) && clip == &n)
    w = n.numResults() > k ? std::vector<const Value*>{n.result(k)} : std::vector<const Value*>{};
  return w;
}

// Counts of the folds and of the CUDA lowering's target nodes (cuda::BatchNormalization with its
// Relu and residual, cuda::LayerNormGrad with its residual, cuda::BatchNormGrad gated by a ReLU,
// cuda::Dropout with its residual, cuda::Gemm with a bias gradient), and the Relus left.
struct Counts {
  int nodes = 0, foldedAway = 0, relus = 0, residuals = 0, gated = 0, dropped = 0, narrowed = 0, attention = 0, packed = 0, biasGrads = 0,
      reluNodes = 0;
};

Counts check(const std::string& model, DType precision, const std::string& optimizer, bool harness = false) {
  SCOPED_TRACE(model + " " + optimizer + (harness ? " (harness settings)" : ""));
  auto g = trainGraph(model, precision, optimizer, harness);
  // The rewrites, as the CUDA lowering runs them (runtime/lower.cpp).
  createFuseBiasGradPass()->run(*g);
  createFuseNormEpiloguePass()->run(*g);
  createFuseReluGradPass()->run(*g);
  createFuseDropoutResidualPass()->run(*g);
  createKeepLossStatsPass()->run(*g);
  createAttentionInPlacePass(findTarget("cuda"))->run(*g);
  recordFolds(*g);
  EXPECT_NO_THROW(verify(*g));
  const Schedule s = schedule(*g);
  const MemoryPlan plan = planMemory(*g, s.positions, s.unwritten, s.extraReads);
  EXPECT_NO_THROW(checkMemoryPlan(plan));
  Counts c;
  for (const auto& np : g->nodes()) {
    const Node& n = *np;
    ++c.nodes;
    const bool target = n.domain() == "cuda";
    c.relus += target && n.op() == "BatchNormalization" && n.getInt("relu", 0) != 0;
    c.residuals += target && (n.op() == "BatchNormalization" || n.op() == "LayerNormGrad") && n.getInt("residual", 0) != 0;
    c.gated += target && n.op() == "BatchNormGrad";
    c.dropped += target && n.op() == "Dropout";
    c.reluNodes += isOnnx(n, "Relu");
    c.narrowed += narrowedGradInput(n) != nullptr;
    c.attention += target && (n.op() == "Attention" || n.op() == "AttentionGrad");
    c.packed += target && n.getInt("packed_grads", 0) != 0;
    c.biasGrads += n.domain() == "cuda" && n.op() == "Gemm" && n.numResults() == 2;
    if (foldedAway(n)) {
      ++c.foldedAway;
      continue;
    }
    if (allConstInputs(n)) continue;  // computed on the CPU at load
    const int at = s.positions[static_cast<size_t>(s.order.at(&n))];
    for (const Value* v : reads(n)) {
      EXPECT_FALSE(s.unwritten.count(v) && !s.aliases.count(v)) << n.describe() << " reads " << v->name() << ", which nothing writes";
      auto it = plan.slots.find(v);
      if (it == plan.slots.end()) continue;  // an input, param or constant
      EXPECT_LE(it->second.first, at) << n.describe() << " reads " << v->name() << " before it is made";
      EXPECT_GE(it->second.last, at) << n.describe() << " reads " << v->name() << " after its bytes are free";
    }
    for (const Value* v : writes(*g, n)) {
      if (auto al = s.aliases.find(v); al != s.aliases.end()) {  // an optimizer update into its state's bytes
        EXPECT_EQ(al->second->kind(), ValueKind::Param) << v->name();
        for (const Use& u : al->second->uses())
          if (u.user != &n) {
            EXPECT_LT(s.positions[static_cast<size_t>(s.order.at(u.user))], at)
                << u.user->describe() << " reads " << al->second->name() << " after " << n.describe() << " updated it in place";
          }
        continue;
      }
      EXPECT_FALSE(s.unwritten.count(v)) << n.describe() << " writes " << v->name() << ", planned without bytes";
      auto it = plan.slots.find(v);
      if (it != plan.slots.end()) {
        EXPECT_EQ(it->second.first, at) << n.describe() << " writes " << v->name() << " outside its live range";
      }
    }
  }
  return c;
}

TEST(Folds, CommittedModelsPlanSoundly) {
  for (const char* m : {"mlp", "cnn", "transformer", "gpt2_tiny", "resnet_tiny"})
    for (DType p : {DType::f32, DType::f16, DType::bf16})
      for (const char* opt : {"sgd", "adamw"})
        for (const bool harness : {false, true}) check(m, p, opt, harness);
}

// Data-parallel buckets (passes/data_parallel.h) averaged on a stream of their own (the casts folded
// again after the rewrite, as amprun does): each
// AllReduce's operands keep their bytes until the first node that reads one of its results (where
// the CUDA backend's main stream waits for that stream), and no other value shares those bytes in
// that time; its results are born at the AllReduce.
TEST(Folds, AllReduceOperandsLiveUntilTheirStreamJoins) {
  for (const char* m : {"gpt2_tiny", "resnet_tiny"}) {
    SCOPED_TRACE(m);
    auto g = trainGraph(m, DType::bf16, "adamw");
    recordFolds(*g);
    ASSERT_TRUE(createDataParallelPass(4096)->run(*g));
    // The AllReduce now reads gradients that UnscaleCheck read through their widening Casts: those
    // folds are stale until fold-casts runs again (amprun runs it after data-parallel).
    EXPECT_THROW(checkCastFolds(*g, findTarget("cuda")), Error);
    EXPECT_NO_THROW(checkGradChain(*g));  // the AllReduce comes before UnscaleCheck: the chain after it stands
    recordFolds(*g);
    EXPECT_NO_THROW(checkCastFolds(*g, findTarget("cuda")));
    const Schedule s = schedule(*g);
    const MemoryPlan plan = planMemory(*g, s.positions, s.unwritten, s.extraReads);
    EXPECT_NO_THROW(checkMemoryPlan(plan));
    int buckets = 0, overlapping = 0;
    for (const auto& n : g->nodes()) {
      if (n->op() != "AllReduce") continue;
      ++buckets;
      const int at = s.positions[static_cast<size_t>(s.order.at(n.get()))];
      int join = static_cast<int>(s.positions.size());
      for (size_t r = 0; r < n->numResults(); ++r) {
        for (const Use& u : n->result(r)->uses()) join = std::min(join, s.positions[static_cast<size_t>(s.order.at(u.user))]);
        EXPECT_EQ(plan.slots.at(n->result(r)).first, at) << n->result(r)->name();
      }
      overlapping += join > at + 1;
      for (const Value* v : n->inputs()) {
        auto it = plan.slots.find(v);
        if (it == plan.slots.end()) continue;
        EXPECT_GE(it->second.last, join) << v->name() << " is freed before the stream that reads it joins";
        for (const auto& [w, o] : plan.slots) {  // nothing else in its bytes while it is live
          if (w == v || o.bytes == 0 || it->second.bytes == 0 || o.group == it->second.group) continue;
          const bool time = o.first <= it->second.last && it->second.first <= o.last;
          const bool space = o.offset < it->second.offset + it->second.bytes && it->second.offset < o.offset + o.bytes;
          EXPECT_FALSE(time && space) << w->name() << " shares the bytes of " << v->name();
        }
      }
    }
    EXPECT_GT(buckets, 2);
    EXPECT_GT(overlapping, 0) << "some bucket must have nodes to overlap";
  }
}

// resnet_tiny: every Relu is written by the batch norm before it (cuda::BatchNormalization), both
// residual Adds with it, and the five Relus whose gradient one BatchNormGrad reads are read through
// by it (cuda::BatchNormGrad); no Relu node is left.
TEST(Folds, ResNetFolds) {
  for (DType p : {DType::f32, DType::f16}) {
    const Counts c = check("resnet_tiny", p, "sgd");
    EXPECT_EQ(c.relus, 7);
    EXPECT_EQ(c.residuals, 2);
    EXPECT_EQ(c.gated, 5);
    EXPECT_EQ(c.reluNodes, 0);
  }
}

// gpt2_tiny (two blocks, five LayerNorms): the residual stream's gradient sums are written by the
// LayerNormGrad before them (cuda::LayerNormGrad), all four (ln_f's gradient starts the stream: no
// sum after it). At bf16 the four residual Adds after a block's Dropout (attention and MLP
// outputs, cast up to the f32 stream) are written by that Dropout (cuda::Dropout), and the four
// DropoutGrads read their f32 gradient through its Cast down; at f32 there are no casts to fold.
TEST(Folds, TransformerResiduals) {
  for (DType p : {DType::f32, DType::bf16}) {
    const Counts c = check("gpt2_tiny", p, "adamw");
    EXPECT_EQ(c.residuals, 4);
    EXPECT_EQ(c.dropped, p == DType::f32 ? 0 : 4);
    EXPECT_EQ(c.narrowed, p == DType::f32 ? 0 : 4);
    // At bf16 both blocks' attention and its gradient read and write in place
    // (passes/attention_in_place.cpp): cuda:: nodes, the gradients packed into the QKV Concat's value.
    EXPECT_EQ(c.attention, p == DType::f32 ? 0 : 4);
    EXPECT_EQ(c.packed, p == DType::f32 ? 0 : 2);
  }
  // The tied embedding's gradient from lm_head (bf16 GEMM, cast up, transposed): the Transpose
  // reads the bf16 result through the Cast, which launches nothing.
  auto g = trainGraph("gpt2_tiny", DType::bf16, "adamw");
  createFoldCastsPass(findTarget("cuda"))->run(*g);
  const Value* wide = g->lookup("/model/lm_head/MatMul_grad/Gemm.f32");
  ASSERT_NE(wide, nullptr);
  EXPECT_EQ(castFold(*wide->producer()), CastFold::Readers);
  EXPECT_EQ(wide->uses().size(), 1u);
  EXPECT_EQ(wide->uses()[0].user->op(), "Transpose");
}

// The parameter casts of a step run as one launch per target type: fuse-param-casts (as the CUDA
// lowering runs it) makes all of gpt2_tiny's bf16 weight casts one cuda::MultiCast, and no Cast of
// a parameter is left.
TEST(Folds, ParameterCastsInOneLaunch) {
  auto g = trainGraph("gpt2_tiny", DType::bf16, "adamw");
  ASSERT_TRUE(createFuseParamCastsPass()->run(*g));
  verify(*g);
  int groups = 0;
  size_t casts = 0;
  for (const auto& n : g->nodes()) {
    if (n->domain() == "cuda" && n->op() == "MultiCast") ++groups, casts += n->numResults();
    EXPECT_FALSE(n->op() == "Cast" && n->inputs()[0]->kind() == ValueKind::Param) << n->describe();
  }
  EXPECT_EQ(casts, 17u);  // 8 per block (4 weights, 4 biases) and the tied embedding
  EXPECT_EQ(groups, 1);
}

}  // namespace

// The step's UnscaleCheck and ClipByGlobalNorm fold into SGD / AdamW (one chain per step): neither
// the unscaled nor the clipped gradients get bytes. LAMB reads its gradients twice, so it keeps
// them.
TEST(Folds, GradChainFoldsIntoTheOptimizer) {
  for (const char* m : {"mlp", "gpt2_tiny", "resnet_tiny"})
    for (const char* opt : {"sgd", "adamw", "lamb"}) {
      SCOPED_TRACE(std::string(m) + " " + opt);
      auto g = trainGraph(m, DType::bf16, opt);
      EXPECT_EQ(createFuseGradChainPass()->run(*g), std::string(opt) != "lamb");
      const Schedule s = schedule(*g);
      int chains = 0;
      for (const auto& n : g->nodes()) {
        const Node* clip = nullptr;
        if (!fusedGradChain(*n, &clip)) continue;
        ++chains;
        ASSERT_NE(clip, nullptr);  // the plans always have the clip (its norm is a metric)
        for (size_t i = 0; i + 1 < n->inputs().size(); ++i) {
          EXPECT_TRUE(s.unwritten.count(n->result(i))) << n->result(i)->name();
          EXPECT_TRUE(s.unwritten.count(clip->result(i))) << clip->result(i)->name();
        }
      }
      EXPECT_EQ(chains, std::string(opt) == "lamb" ? 0 : 1);
    }
}

// Bias gradients summed by their weight gradients' GEMMs: GPT-2's four Conv1D layers a block (X^T dY)
// and the MLP's two Linear layers (dY^T X), at each precision; not where the sum is over another
// axis, the product reads dY transposed, dY has a second ReduceSum, or the Gemm comes later.
// Bias gradients summed by their weight gradients' GEMMs: fuse-bias-grad makes them cuda::Gemm
// nodes on the models (tests/unit/target_passes_test.cpp checks the pattern and its CPU results).
TEST(Folds, BiasGradientsInTheirGemms) {
  for (DType p : {DType::f32, DType::bf16}) {
    EXPECT_EQ(check("gpt2_tiny", p, "adamw").biasGrads, 8);
    EXPECT_EQ(check("mlp", p, "sgd").biasGrads, 2);
  }
}
