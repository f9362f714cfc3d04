// The committed models trained 20 steps on the CUDA backend against the CPU plan (same batches,
// same weights, Dropout on with the same Philox masks): loss within 1e-4 relative at fp32 and 2e-2
// at fp16 and bf16; and overflow injection skipping exactly the injected steps with the parameters
// bitwise unchanged, as on the CPU. Skips without a GPU.
#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "passes/data_parallel.h"
#include "runtime/cuda/nccl.h"
#include "runtime/cuda/trainer.h"
#include "runtime/dist.h"
#include "runtime/data.h"
#include "runtime/overflow.h"
#include "tests/common/train_graph.h"
#include "tests/gpu/gpu_util.h"

using namespace ampc;
namespace fs = std::filesystem;

namespace {

// The committed models: $AMPC_MODELS_DIR (where the tests run on another machine), else the source tree's.
fs::path modelsDir() {
  const char* env = std::getenv("AMPC_MODELS_DIR");
  return env && *env ? fs::path(env) : fs::path(AMPC_SOURCE_DIR) / "models";
}

std::unique_ptr<Graph> trainGraph(const std::string& model, DType precision, const std::string& optimizer, float initScale = 0) {
  TrainOptions o;
  o.optimizer = optimizer;
  if (initScale > 0) o.initScale = initScale;
  // resnet_tiny (batch norm over 4 images) is chaotic at the other models' rates: the backends'
  // rounding-order differences grow step by step. Measured on the H200: at SGD lr 0.05 the f16/bf16
  // losses drifted 2.07e-2 / 1.97e-2 apart by step 20; at SGD lr 0.01 and AdamW lr 1e-3 the fp32
  // losses drifted past 1e-4 in 1 of 5 and 3 of 5 runs (fresh data each run), with or without the
  // residual fold. On the CPU, a relative noise of 2e-6 on every parameter after every step moves
  // the 20-step losses by up to 9.7e-4 (SGD 0.01) and 1.1e-3 (AdamW 1e-3) over 8 seeds, against
  // 6.9e-5 at SGD 0.003, 1.3e-5 at SGD 0.001 and 1.4e-5 at AdamW 1e-4. So it trains at SGD lr 0.002
  // and AdamW lr 1e-4. The cnn at SGD lr 0.05 diverges at f16/bf16 (loss 2.74 -> 3.37 over the 20
  // steps, measured on the H200), and its bf16 losses drifted 2.02e-2 apart by step 19 in one run of
  // many; it trains at SGD lr 0.01.
  const float sgd = model == "resnet_tiny" ? 0.002f : model == "cnn" ? 0.01f : 0.05f;
  o.lr = optimizer == "sgd" ? sgd : (model == "resnet_tiny" ? 1e-4f : 1e-3f);
  o.momentum = 0.9f;
  o.clipNorm = 1.0f;
  auto g = ampc::test::trainGraph(modelsDir(), model, precision, o);
  recordFolds(*g);  // as the CUDA lowering records them
  return g;
}

std::map<std::string, std::pair<int64_t, int64_t>> ranges(const std::string& model) {
  if (model == "transformer") return {{"idx", {0, 63}}, {"target", {0, 63}}};
  if (model == "gpt2_tiny") return {{"input_ids", {0, 511}}, {"labels", {0, 511}}};
  return {{"target", {0, 9}}};
}

// `steps` CUDA steps of `g` on synthetic batches drawn from `seed` (the state synced back into g's
// params); the program's launches per step through *launches.
std::vector<Trainer::Metrics> cudaSteps(Graph& g, const cuda::ProgramOptions& po, const std::string& model, uint64_t seed, int steps,
                                        int64_t* launches = nullptr) {
  std::vector<const Value*> ins(g.inputs().begin(), g.inputs().end());
  recordFolds(g);  // again after data-parallel's AllReduce, as amprun does
  cuda::CudaTrainer t(g, po, 1);
  t.begin(0);
  auto data = DataSource::synthetic(ins, seed, ranges(model));
  std::vector<Trainer::Metrics> out;
  for (int s = 0; s < steps; ++s) {
    const auto b = data.next();
    for (const auto& m : t.step(&b)) out.push_back(m);
  }
  t.syncState();
  if (launches) *launches = t.program().stats().launches;
  return out;
}

// Every parameter of `a` has the same bits in `b` (`runs` names the two runs in the message).
void expectSameParams(const Graph& a, const Graph& b, const std::string& runs) {
  int compared = 0;
  for (const Value* p : a.params()) {
    const Value* q = b.lookup(p->name());
    ASSERT_TRUE(q && p->data() && q->data()) << p->name();
    const auto &x = p->data()->data, &y = q->data()->data;
    ASSERT_EQ(x.size(), y.size()) << p->name();
    EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << p->name() << " differs between " << runs;
    ++compared;
  }
  EXPECT_GT(compared, 4);
}

class GpuModels : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(GpuModels, TwentyStepsMatchTheCpuPlan) {
  AMPC_NEED_GPU();
  const auto& [model, prec, opt] = GetParam();
  const DType p = prec == "fp32" ? DType::f32 : prec == "fp16" ? DType::f16 : DType::bf16;
  auto cpuG = trainGraph(model, p, opt), gpuG = trainGraph(model, p, opt);
  const uint64_t seed = gputest::rng()();
  std::vector<const Value*> ins(cpuG->inputs().begin(), cpuG->inputs().end());
  auto data = DataSource::synthetic(ins, seed, ranges(model));
  std::vector<std::map<std::string, Tensor>> batches;
  for (int s = 0; s < 20; ++s) batches.push_back(data.next());
  auto backend = createCpuBackend();
  Trainer cpu(*cpuG, *backend);
  std::vector<Trainer::Metrics> want;
  for (int s = 0; s < 20; ++s) {
    ExecOptions eo;
    eo.seed = seed;
    eo.step = static_cast<uint64_t>(s);
    want.push_back(cpu.step(batches[s], eo));
  }
  cuda::ProgramOptions po;
  po.seed = seed;
  cuda::CudaTrainer gpu(*gpuG, po, 7);  // metrics read every 7 steps
  gpu.begin(0);
  std::vector<Trainer::Metrics> got;
  for (int s = 0; s < 20; ++s)
    for (auto& m : gpu.step(&batches[s])) got.push_back(m);
  for (auto& m : gpu.flush()) got.push_back(m);
  ASSERT_EQ(got.size(), 20u);
  const double tol = p == DType::f32 ? 1e-4 : 2e-2;
  double worst = 0;
  for (int s = 0; s < 20; ++s) {
    const double rel = std::fabs(got[s].loss - want[s].loss) / std::max(std::fabs(want[s].loss), 1e-12);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, tol) << model << " " << prec << " step " << s + 1 << ": cuda " << got[s].loss << ", cpu " << want[s].loss;
    EXPECT_EQ(got[s].skipped, want[s].skipped) << "step " << s + 1;
    EXPECT_EQ(got[s].lossScale, want[s].lossScale) << "step " << s + 1;
    EXPECT_GE(got[s].ms, 0.0);
  }
  // resnet_tiny's f16/bf16 activations are stored channels-last (NHWC convolutions, batch norms,
  // max pool); nothing is at fp32 (cuDNN's FMA convolutions stay NCHW).
  int64_t channelsLast = 0;
  for (const auto& n : gpuG->nodes())
    for (size_t i = 0; i < n->numResults(); ++i) channelsLast += gpu.program().channelsLast(n->result(i));
  if (model == "resnet_tiny" && p != DType::f32) EXPECT_GT(channelsLast, 40);
  else EXPECT_EQ(channelsLast, 0);
  const auto& st = gpu.program().stats();
  EXPECT_TRUE(st.captured);
  EXPECT_EQ(st.replays, 19);
  // On one batch (no uploads), steps never synchronise with the host.
  const int64_t before = gpu.syncsInSteps();
  for (int s = 0; s < 10; ++s) (void)gpu.step(nullptr);
  EXPECT_EQ(gpu.syncsInSteps() - before, 0) << "a step synchronised with the host";
  std::printf("%s %s %s: 20 steps, worst loss relative difference cuda vs cpu %.3g; loss %.5f -> %.5f; arena %lld bytes, %lld launches per step, "
              "%lld values channels-last\n",
              model.c_str(), prec.c_str(), opt.c_str(), worst, got.front().loss, got.back().loss, static_cast<long long>(st.arenaBytes),
              static_cast<long long>(st.launches), static_cast<long long>(channelsLast));
}

// The memory plan against the kernels (ProgramOptions::checkPlan): two steps with every value's bytes
// poisoned (NaN) as soon as its last reader is done, and no node may write a NaN. A kernel reading
// a value the plan no longer keeps (the step's 1/scale read by a folded optimizer, once) turns the
// parameters NaN. (The transformer's mask holds -inf: infinities are not counted.)
TEST_P(GpuModels, PlanHoldsUnderPoison) {
  AMPC_NEED_GPU();
  const auto& [model, prec, opt] = GetParam();
  // fp16 steps may overflow at the scaler's first scales (inf - inf in an overflowed step is NaN).
  if (prec == "fp16") GTEST_SKIP() << "fp16: the loss scaler's overflow steps may write NaN gradients";
  const DType p = prec == "fp32" ? DType::f32 : DType::bf16;
  auto g = trainGraph(model, p, opt);
  std::vector<const Value*> ins(g->inputs().begin(), g->inputs().end());
  auto data = DataSource::synthetic(ins, gputest::rng()(), ranges(model));
  cuda::ProgramOptions po;
  po.checkPlan = true;
  cuda::CudaTrainer gpu(*g, po, 1);
  gpu.begin(0);
  for (int s = 0; s < 2; ++s) {
    auto batch = data.next();
    (void)gpu.step(&batch);
  }
  (void)gpu.flush();
  const auto bad = gpu.program().nanWriters();
  EXPECT_TRUE(bad.empty()) << model << " " << prec << " " << opt << ": " << bad.size() << " nodes wrote NaNs, the first "
                           << (bad.empty() ? "" : bad.front().first);
}

INSTANTIATE_TEST_SUITE_P(Committed, GpuModels,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "transformer", "gpt2_tiny", "resnet_tiny"),
                                            ::testing::Values("fp32", "fp16", "bf16"),
                                            ::testing::Values("sgd", "adamw")));

// Inf in the data at chosen steps: exactly those steps are skipped and leave every parameter
// bitwise unchanged; the scaler follows the same schedule as on the CPU.
TEST(GpuOverflow, InjectedStepsAreSkippedBitwise) {
  AMPC_NEED_GPU();
  auto cpuG = trainGraph("mlp", DType::f16, "adamw"), gpuG = trainGraph("mlp", DType::f16, "adamw");
  std::vector<const Value*> ins(cpuG->inputs().begin(), cpuG->inputs().end());
  auto data = DataSource::synthetic(ins, 5, ranges("mlp"));
  const auto clean = data.next();
  auto poisoned = clean;
  poisoned.at("x").setDouble(7, INFINITY);
  const std::set<int> bad = {2, 3, 4, 9, 10};
  auto backend = createCpuBackend();
  Trainer cpu(*cpuG, *backend);
  cuda::CudaTrainer gpu(*gpuG, {}, 1);  // metrics every step
  gpu.begin(0);
  for (int s = 0; s < 14; ++s) {
    const auto& b = bad.count(s) ? poisoned : clean;
    const auto want = cpu.step(b, ExecOptions{});
    std::map<std::string, std::vector<uint8_t>> before;
    gpu.syncState();
    auto bytesOf = [](const Value* p) { return std::vector<uint8_t>(p->data()->data.begin(), p->data()->data.end()); };
    for (const Value* p : gpuG->params()) before[p->name()] = bytesOf(p);
    const auto got = gpu.step(&b);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].skipped, bad.count(s) == 1) << "step " << s;
    EXPECT_EQ(got[0].lossScale, want.lossScale) << "step " << s;
    gpu.syncState();
    for (const Value* p : gpuG->params()) {
      if (p->name().rfind("ampc.", 0) == 0 && p->name() != "ampc.step") continue;  // the scaler's state moves on
      if (got[0].skipped) {
        EXPECT_EQ(bytesOf(p), before[p->name()]) << p->name() << " changed on skipped step " << s;
      }
    }
    if (!got[0].skipped) {
      EXPECT_NE(bytesOf(gpuG->lookup("model.fc1.weight")), before["model.fc1.weight"]) << "step " << s;
    }
  }
}

// ProgramOptions::deterministic (amprun --deterministic): two runs from the same weights and data
// give bitwise-equal metrics and parameters after 6 steps, on models whose gradients go through
// the attention backward, embedding gathers, layer and batch norms and the clip's norm; and the
// deterministic run trains as the default one does (losses within 2e-2: only summation orders
// differ).
TEST(GpuDeterministic, TwoRunsAreBitwiseEqual) {
  AMPC_NEED_GPU();
  for (const std::string model : {"gpt2_tiny", "transformer", "resnet_tiny", "cnn"}) {
    SCOPED_TRACE(model);
    std::vector<std::unique_ptr<Graph>> graphs;
    for (int r = 0; r < 3; ++r) graphs.push_back(trainGraph(model, DType::bf16, "adamw"));
    const uint64_t seed = gputest::rng()();
    std::vector<std::vector<Trainer::Metrics>> metrics(3);
    for (int r = 0; r < 3; ++r) {
      cuda::ProgramOptions po;
      po.deterministic = r < 2;
      po.seed = seed;
      metrics[r] = cudaSteps(*graphs[r], po, model, seed, 6);
    }
    ASSERT_EQ(metrics[0].size(), 6u);
    ASSERT_EQ(metrics[1].size(), 6u);
    ASSERT_EQ(metrics[2].size(), 6u);
    for (size_t s = 0; s < 6; ++s) {
      EXPECT_EQ(metrics[0][s].loss, metrics[1][s].loss) << "step " << s;
      EXPECT_EQ(metrics[0][s].gradNorm, metrics[1][s].gradNorm) << "step " << s;
      EXPECT_TRUE(std::isfinite(metrics[0][s].loss));
      EXPECT_NEAR(metrics[0][s].loss, metrics[2][s].loss, 2e-2 * std::fabs(metrics[2][s].loss)) << "step " << s;
    }
    expectSameParams(*graphs[0], *graphs[1], "two deterministic runs");
  }
}

// Data-parallel on CUDA (runtime/cuda/nccl.h): the step graph with the group's AllReduce
// (passes/data_parallel.h), run in a group of one through NCCL (the only group one GPU holds: NCCL
// takes one rank a device), trains bitwise as the plain graph does: the sum of one rank divided by 1
// is the identity, and --deterministic makes both runs repeatable. Covered: buckets on the group's
// own stream, joined before UnscaleCheck, inside the captured CUDA graph (gpt2_tiny: attention and
// embedding gradients), BatchNorm's running statistics (resnet_tiny), bf16, and fp16
// with a loss scale of 2^20 whose first steps overflow, so that the skip rides the all-reduce too.
TEST(GpuDataParallel, AGroupOfOneThroughNcclIsBitwiseAPlainRun) {
  AMPC_NEED_GPU();
  DistEnv env;
  env.storePort = freeLoopbackPort();
  auto host = ProcessGroup::connect(env, std::chrono::seconds(60));
  cuda::NcclGroup nccl(*host, 0, std::chrono::seconds(60));
  std::printf("%s\n", nccl.version().c_str());
  constexpr int kSteps = 16;
  for (const std::string model : {"gpt2_tiny", "resnet_tiny"})
    for (const DType precision : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(model + " " + std::string(dtypeName(precision)));
      const float scale = precision == DType::f16 ? std::ldexp(1.0f, 20) : 0.0f;
      auto plain = trainGraph(model, precision, "adamw", scale), grouped = trainGraph(model, precision, "adamw", scale);
      // gpt2_tiny in buckets of 4 KiB, averaged on the group's stream while its backward goes on;
      // resnet_tiny in one AllReduce after the backward.
      const bool buckets = model == "gpt2_tiny";
      createDataParallelPass(buckets ? 4096 : 0)->run(*grouped);
      int reduces = 0;
      for (const auto& n : grouped->nodes()) reduces += n->op() == "AllReduce";
      if (buckets) ASSERT_GT(reduces, 2);
      else ASSERT_EQ(reduces, 1);
      const uint64_t seed = gputest::rng()();
      std::vector<Trainer::Metrics> m[2];
      int64_t launches[2] = {};
      for (int r = 0; r < 2; ++r) {
        cuda::ProgramOptions po;
        po.deterministic = true;
        po.seed = seed;
        po.collective = r == 1 ? &nccl : nullptr;
        m[r] = cudaSteps(r == 1 ? *grouped : *plain, po, model, seed, kSteps, &launches[r]);
      }
      EXPECT_GT(launches[1], launches[0]) << "the grouped plan must launch its all-reduce";
      ASSERT_EQ(m[0].size(), size_t(kSteps));
      ASSERT_EQ(m[1].size(), size_t(kSteps));
      int skipped = 0;
      // Bitwise: a skipped step's loss or norm is Inf or NaN in both runs.
      const auto bits = [](float v) { return std::bit_cast<uint32_t>(v); };
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_EQ(bits(m[0][s].loss), bits(m[1][s].loss)) << "step " << s << ": " << m[0][s].loss << " " << m[1][s].loss;
        EXPECT_EQ(bits(m[0][s].gradNorm), bits(m[1][s].gradNorm)) << "step " << s << ": " << m[0][s].gradNorm << " " << m[1][s].gradNorm;
        EXPECT_EQ(m[0][s].skipped, m[1][s].skipped) << "step " << s;
        skipped += m[1][s].skipped;
      }
      if (precision == DType::f16) EXPECT_GT(skipped, 0) << "a scale of 2^20 must overflow";
      EXPECT_LT(skipped, kSteps) << "the scaler must come down to a scale that trains";
      expectSameParams(*plain, *grouped, "the plain and the grouped run");
    }
}

// --explain-overflow on CUDA (ProgramOptions::watchFinite): the scans around each launch find the
// overflow the CPU reference's per-node watch finds, in the same pass. Inputs 1e5 times too large
// overflow f16 in the forward (the input's Cast, or the launch it is fused into); a loss scale of
// 1e30 overflows the backward. On the clean step nothing is found.
TEST(GpuOverflow, ExplainNamesTheOverflowingLaunch) {
  AMPC_NEED_GPU();
  for (const bool scaled : {false, true}) {
    SCOPED_TRACE(scaled ? "loss scale 1e30" : "inputs x 1e5");
    TrainOptions o;
    o.optimizer = "sgd";
    o.lr = 0.05f;
    if (scaled) o.initScale = 1e30f;
    auto cpuG = ampc::test::trainGraph(modelsDir(), "mlp", DType::f16, o), gpuG = ampc::test::trainGraph(modelsDir(), "mlp", DType::f16, o);
    std::vector<const Value*> ins(cpuG->inputs().begin(), cpuG->inputs().end());
    auto data = DataSource::synthetic(ins, 11, ranges("mlp"));
    const auto clean = data.next();
    auto bad = clean;
    if (!scaled)
      for (int64_t i = 0; i < bad.at("x").numel(); ++i) bad.at("x").setDouble(i, bad.at("x").getDouble(i) * 1e5);
    auto backend = createCpuBackend();
    Trainer cpu(*cpuG, *backend);
    OverflowWatch cpuWatch(*cpuG), gpuWatch(*gpuG);
    cpu.setObserver([&](const Node& n, const std::vector<const Tensor*>& in, const std::vector<Tensor>& out) { cpuWatch.observe(n, in, out); });
    cuda::ProgramOptions po;
    po.watchFinite = true;
    cuda::CudaTrainer gpu(*gpuG, po, 1);
    gpu.begin(0);
    cpuWatch.startStep();
    const auto want = cpu.step(bad, ExecOptions{});
    const auto got = gpu.step(&bad);
    ASSERT_EQ(got.size(), 1u);
    ASSERT_TRUE(want.skipped);
    ASSERT_TRUE(got[0].skipped);
    ASSERT_TRUE(cpuWatch.found());
    gpuWatch.startStep();
    gpu.program().findOverflow(gpuWatch);
    ASSERT_TRUE(gpuWatch.found()) << gpuWatch.explain(1, 0);
    const OverflowFinding &c = cpuWatch.finding(), &d = gpuWatch.finding();
    bool same = d.node == c.node;
    for (const auto& f : d.fusedWith) same |= f.find("'" + c.node + "'") != std::string::npos;
    EXPECT_TRUE(same) << "cpu: " << cpuWatch.explain(1, 0) << "cuda: " << gpuWatch.explain(1, 0);
    EXPECT_EQ(d.scaled, c.scaled) << gpuWatch.explain(1, 0);
    EXPECT_EQ(d.scaled, scaled);
    EXPECT_GT(d.inf + d.nan, 0);
    if (!scaled) {  // the next step runs clean data: nothing to find
      const auto ok = gpu.step(&clean);
      ASSERT_EQ(ok.size(), 1u);
      EXPECT_FALSE(ok[0].skipped);
      gpuWatch.startStep();
      gpu.program().findOverflow(gpuWatch);
      EXPECT_FALSE(gpuWatch.found()) << gpuWatch.explain(2, 0);
    }
  }
}

}  // namespace
