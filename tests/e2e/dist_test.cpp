// Data-parallel training on the CPU backend (Gloo), end to end through amprun: a group of 2 and of
// 4 processes against one process with the global batch; an Inf in one rank's gradients skips the
// step on every rank with the weights bitwise equal; a killed or stopped rank ends the others with
// an error; a checkpoint resumes at another world size; the torchrun environment is checked.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <regex>
#include <set>

#include <onnx/onnx_pb.h>

#include "compiler/ir/text.h"
#include "passes/data_parallel.h"
#include "runtime/dist.h"
#include "runtime/evaluator.h"
#include "runtime/npy.h"
#include "runtime/safetensors.h"
#include "tests/common/train_graph.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;
namespace fs = std::filesystem;

namespace {

const std::string kAmpc = AMPC_BIN;
const std::string kAmprun = std::string(AMPC_BINARY_DIR) + "/tools/amprun --device cpu";
const std::string kDigits = std::string(AMPC_SOURCE_DIR) + "/models/digits";
constexpr int kBatch = 16;  // per rank

// The digits model with a symbolic batch, so that one model gives plans of any batch size.
std::string symbolicDigits(const TempDir& d) {
  onnx::ModelProto m;
  std::string bytes = readBytes(kDigits + ".onnx");
  EXPECT_TRUE(m.ParseFromString(bytes));
  for (auto& in : *m.mutable_graph()->mutable_input())
    if (in.name() == "x" || in.name() == "target") in.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(0)->set_dim_param("batch");
  m.mutable_graph()->clear_value_info();
  const std::string p = d.file("digits_any.onnx");
  writeModel(p, m);
  return p;
}

std::string makePlan(const TempDir& d, int batch, const std::string& flags) {
  const std::string p = d.file("digits_b" + std::to_string(batch) + "_" + std::to_string(std::hash<std::string>{}(flags)) + ".ampplan");
  auto r = run(kAmpc + " " + symbolicDigits(d) + " --input-shape x=" + std::to_string(batch) + "x64 --input-shape target=" +
               std::to_string(batch) + " " + flags + " -o " + p);
  EXPECT_EQ(r.code, 0) << r.out;
  return p;
}

struct Step {
  double loss, scale;
  bool skipped;
};
std::vector<Step> readMetrics(const std::string& path) {
  std::vector<Step> r;
  std::istringstream in(readBytes(path));
  const std::regex re(R"("loss": ([^,]+), "loss_scale": ([^,]+), "skipped": (true|false))");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, re)) continue;
    const std::string loss = m[1];
    r.push_back({loss == "\"NaN\"" ? NAN : std::stod(loss), std::stod(m[2]), m[3] == "true"});
  }
  return r;
}

// Largest |a - b| over every tensor, relative to the largest |b|; the tensor sets must be equal.
double weightsDiff(const std::string& a, const std::string& b) {
  auto x = readSafetensors(a), y = readSafetensors(b);
  EXPECT_EQ(x.tensors.size(), y.tensors.size());
  double diff = 0, scale = 0;
  for (const auto& [name, t] : y.tensors) {
    auto it = x.tensors.find(name);
    if (it == x.tensors.end()) {
      ADD_FAILURE() << a << " has no " << name;
      continue;
    }
    EXPECT_EQ(it->second.numel(), t.numel()) << name;
    for (int64_t i = 0; i < t.numel() && i < it->second.numel(); ++i) {
      diff = std::max(diff, std::fabs(it->second.getDouble(i) - t.getDouble(i)));
      scale = std::max(scale, std::fabs(t.getDouble(i)));
    }
  }
  EXPECT_GT(scale, 0.0);
  return diff / std::max(scale, 1e-30);
}

bool sameBits(const std::string& a, const std::string& b) {
  auto x = readSafetensors(a), y = readSafetensors(b);
  if (x.tensors.size() != y.tensors.size() || x.tensors.empty()) return false;
  for (const auto& [name, t] : y.tensors) {
    auto it = x.tensors.find(name);
    if (it == x.tensors.end() || it->second.data.size() != t.data.size() ||
        std::memcmp(it->second.data.data(), t.data.data(), t.data.size()) != 0)
      return false;
  }
  return true;
}

// The step graph `g` (the data-parallel pass applied, run as a group of one) against `plain` on one
// random batch: every output, bit for bit.
void expectSameStep(const Graph& g, const Graph& plain, unsigned seed) {
  std::map<std::string, Tensor> batch;
  std::mt19937 rng(seed);
  for (const Value* in : g.inputs()) {
    Tensor t(in->type());
    for (int64_t i = 0; i < t.numel(); ++i) isFloat(t.type.dtype) ? t.setDouble(i, std::normal_distribution<double>()(rng)) : t.setInt(i, rng() % 4);
    batch.emplace(in->name(), std::move(t));
  }
  auto backend = createCpuBackend();
  auto a = evaluate(g, batch, *backend), b = evaluate(plain, batch, *backend);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].data.size(), b[i].data.size()) << i;
    EXPECT_EQ(std::memcmp(a[i].data.data(), b[i].data.data(), a[i].data.size()), 0) << g.outputs()[i]->name();
  }
}

}  // namespace

// The pass on a BatchNorm net's bf16 train step: one AllReduce before UnscaleCheck takes the loss,
// every gradient UnscaleCheck read and every running statistic the step writes back, and the graph
// reads the averages. In a group of one the step computes what it computed before, bit for bit.
TEST(DataParallelPass, AveragesLossGradientsAndRunningStatistics) {
  auto g = trainGraph(fs::path(AMPC_SOURCE_DIR) / "models", "resnet_tiny", DType::bf16, TrainOptions{});
  auto plain = trainGraph(fs::path(AMPC_SOURCE_DIR) / "models", "resnet_tiny", DType::bf16, TrainOptions{});
  const Node* unscale = nullptr;
  for (const auto& n : g->nodes())
    if (n->op() == "UnscaleCheck") unscale = n.get();
  ASSERT_NE(unscale, nullptr);
  const std::vector<Value*> grads(unscale->inputs().begin() + 1, unscale->inputs().end());
  Value* loss = g->outputs()[0];
  size_t stats = 0;
  for (const Value* o : g->outputs())
    if (o->name().find("running_") != std::string::npos || o->name().find(".running") != std::string::npos) ++stats;
  ASSERT_GT(stats, 0u) << "resnet_tiny has BatchNorm";
  ASSERT_TRUE(createDataParallelPass()->run(*g));
  verify(*g);
  const Node* ar = nullptr;
  for (const auto& n : g->nodes())
    if (n->op() == "AllReduce") {
      EXPECT_EQ(ar, nullptr) << "one AllReduce";
      ar = n.get();
    }
  ASSERT_NE(ar, nullptr);
  ASSERT_EQ(ar->numInputs(), 1 + grads.size() + stats);
  EXPECT_EQ(ar->input(0), loss);
  EXPECT_EQ(g->outputs()[0], ar->result(0));
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(ar->input(1 + i), grads[i]);
    EXPECT_EQ(unscale->input(1 + i), ar->result(1 + i));
  }
  for (size_t i = 1 + grads.size(); i < ar->numInputs(); ++i) {
    ASSERT_EQ(ar->result(i)->uses().size(), 1u);
    const Node* writer = ar->result(i)->uses()[0].user;
    EXPECT_EQ(writer->op(), "Identity");
    EXPECT_TRUE(g->isOutput(writer->result(0))) << writer->result(0)->name();
  }
  // AllReduce precedes UnscaleCheck in the node order.
  bool seenAr = false;
  for (const auto& n : g->nodes()) {
    if (n.get() == ar) seenAr = true;
    if (n.get() == unscale) EXPECT_TRUE(seenAr);
  }
  EXPECT_THROW(createDataParallelPass()->run(*g), Error);
  // A group of one: the same outputs as the step without the pass.
  expectSameStep(*g, *plain, 7);
}

// Buckets (--bucket-mb): the averaged values cut in the order the backward makes them, one
// AllReduce per bucket right after its last value's producer. Each value is averaged exactly once,
// each AllReduce follows its operands' producers and precedes UnscaleCheck, at least one runs while
// the backward still has nodes to run, and a group of one computes what the plain step does, bit
// for bit (gpt2_tiny: attention, embeddings, LayerNorm; resnet_tiny: BatchNorm statistics).
TEST(DataParallelPass, BucketsFollowTheBackward) {
  for (const std::string model : {"gpt2_tiny", "resnet_tiny"}) {
    SCOPED_TRACE(model);
    auto g = trainGraph(fs::path(AMPC_SOURCE_DIR) / "models", model, DType::bf16, TrainOptions{});
    auto plain = trainGraph(fs::path(AMPC_SOURCE_DIR) / "models", model, DType::bf16, TrainOptions{});
    const size_t averaged = [&] {
      for (const auto& n : plain->nodes())
        if (n->op() == "UnscaleCheck") return n->numInputs();  // the loss and the gradients
      return size_t{0};
    }();
    ASSERT_GT(averaged, 4u);
    ASSERT_TRUE(createDataParallelPass(4096)->run(*g));
    verify(*g);
    std::map<const Node*, size_t> at;
    size_t k = 0, reduces = 0, operands = 0, first = SIZE_MAX, lastMade = 0;
    const Node* unscale = nullptr;
    for (const auto& n : g->nodes()) {
      at[n.get()] = k++;
      if (n->op() == "UnscaleCheck") unscale = n.get();
    }
    ASSERT_NE(unscale, nullptr);
    std::set<const Value*> seen;
    for (const auto& n : g->nodes()) {
      if (n->op() != "AllReduce") continue;
      ++reduces;
      operands += n->numInputs();
      EXPECT_LT(at[n.get()], at[unscale]);
      for (const Value* v : n->inputs()) {
        EXPECT_TRUE(seen.insert(v).second) << v->name() << " is averaged twice";
        if (v->producer()) EXPECT_LT(at[v->producer()], at[n.get()]) << v->name();
      }
      first = std::min(first, at[n.get()]);
      for (const Value* v : n->inputs())
        if (v->producer()) lastMade = std::max(lastMade, at[v->producer()]);
    }
    EXPECT_GT(reduces, 2u);
    EXPECT_GE(operands, averaged);
    EXPECT_LT(first, lastMade) << "the first AllReduce must run while the backward still makes gradients";
    expectSameStep(*g, *plain, 9);
  }
}

// 2 and 4 processes of batch 16 train as one process of batch 32 and 64 does: the same samples in
// the same order (shuffled), the same losses and the same final weights, within 1e-6.
TEST(Dist, GroupEqualsOneProcessWithTheGlobalBatch) {
  TempDir d;
  // SGD with buckets of about 2 KiB (several all-reduces a step), AdamW with the default (one).
  for (const std::string opt : {"--optimizer sgd --lr 0.1 --momentum 0.9", "--optimizer adamw --lr 0.003 --clip-norm 1.0"}) {
    const std::string buckets = opt.find("sgd") != std::string::npos ? " --bucket-mb 0.002" : "";
    const std::string flags = "--precision fp32 " + opt;
    const std::string perRank = makePlan(d, kBatch, flags);
    for (int n : {2, 4}) {
      const std::string whole = makePlan(d, kBatch * n, flags);
      const std::string common = " --data " + kDigits + "/train --shuffle --seed 5 --steps 40 ";
      auto one = run(kAmprun + " " + whole + common + "--metrics " + d.file("one.jsonl") + " --save " + d.file("one.safetensors"));
      ASSERT_EQ(one.code, 0) << one.out;
      auto group = run(kAmprun + " --nproc " + std::to_string(n) + buckets + " " + perRank + common + "--metrics " + d.file("group.jsonl") + " --save " +
                       d.file("group.safetensors"));
      ASSERT_EQ(group.code, 0) << group.out;
      auto a = readMetrics(d.file("one.jsonl")), b = readMetrics(d.file("group.jsonl"));
      ASSERT_EQ(a.size(), 40u);
      ASSERT_EQ(b.size(), 40u);  // rank 0 alone writes the metrics
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i].loss - b[i].loss) / std::fabs(a[i].loss));
      EXPECT_LE(worst, 1e-6) << opt << ", " << n << " processes";
      EXPECT_LT(a.back().loss, 0.5 * a.front().loss) << "the runs must train";
      const double w = weightsDiff(d.file("group.safetensors"), d.file("one.safetensors"));
      EXPECT_LE(w, 1e-6) << opt << ", " << n << " processes";
      std::printf("%s, %d processes: losses within %.2e, weights within %.2e of one process\n", opt.c_str(), n, worst, w);
    }
  }
}

// Gradient accumulation in a group (ampc --accumulate 2, 2 processes of 16 samples): each step
// averages 2 micro-batches of 2 x 16 samples, the 64 samples one process takes in one batch: the same
// losses and weights, for SGD with momentum and for AdamW with clipping (20 steps, inside one epoch
// of the shuffled digits, so that both see the same samples a step).
TEST(Dist, AccumulationInAGroupEqualsOneProcessWithTheWholeWindow) {
  TempDir d;
  for (const std::string opt : {"--optimizer sgd --lr 0.1 --momentum 0.9", "--optimizer adamw --lr 0.003 --clip-norm 1.0"}) {
    const std::string flags = "--precision fp32 " + opt;
    const std::string perRank = makePlan(d, kBatch, flags + " --accumulate 2"), whole = makePlan(d, kBatch * 4, flags);
    const std::string common = " --data " + kDigits + "/train --shuffle --seed 5 --steps 20 ";
    auto one = run(kAmprun + " " + whole + common + "--metrics " + d.file("one.jsonl") + " --save " + d.file("one.safetensors"));
    ASSERT_EQ(one.code, 0) << one.out;
    auto group = run(kAmprun + " --nproc 2 " + perRank + common + "--metrics " + d.file("group.jsonl") + " --save " + d.file("group.safetensors"));
    ASSERT_EQ(group.code, 0) << group.out;
    auto a = readMetrics(d.file("one.jsonl")), b = readMetrics(d.file("group.jsonl"));
    ASSERT_EQ(a.size(), 20u);
    ASSERT_EQ(b.size(), 20u);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i].loss - b[i].loss) / std::fabs(a[i].loss));
    EXPECT_LE(worst, 1e-6) << opt;
    EXPECT_LT(a.back().loss, 0.7 * a.front().loss) << "the runs must train";
    const double w = weightsDiff(d.file("group.safetensors"), d.file("one.safetensors"));
    EXPECT_LE(w, 1e-6) << opt;
    std::printf("%s, 2 processes x 2 micro-batches: losses within %.2e, weights within %.2e of one process\n", opt.c_str(), worst, w);
  }
}

// A group of one, named by the torchrun environment (WORLD_SIZE=1, as torchrun --nproc-per-node 1
// gives): it runs through the group's all-reduce, and trains bitwise as a plain run does.
TEST(Dist, AGroupOfOneIsBitwiseAPlainRun) {
  TempDir d;
  const std::string plan = makePlan(d, kBatch, "--precision fp16 --optimizer adamw --lr 0.003");
  const std::string common = " --data " + kDigits + "/train --shuffle --seed 3 --steps 12 ";
  auto plain = run(kAmprun + " " + plan + common + "--metrics " + d.file("plain.jsonl") + " --save " + d.file("plain.safetensors"));
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("a group of"), std::string::npos) << plain.out;
  const std::string env = "WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(freeLoopbackPort());
  auto one = run(env + " " + kAmprun + " " + plan + common + "--metrics " + d.file("one.jsonl") + " --save " + d.file("one.safetensors"));
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_NE(one.out.find("amprun: a group of 1 process; gradients averaged through Gloo (CPU)"), std::string::npos) << one.out;
  const auto a = readMetrics(d.file("plain.jsonl")), b = readMetrics(d.file("one.jsonl"));
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << i + 1;
    EXPECT_EQ(a[i].scale, b[i].scale) << "step " << i + 1;
  }
  EXPECT_LT(a.back().loss, a.front().loss) << "the run must train";
  EXPECT_TRUE(sameBits(d.file("one.safetensors"), d.file("plain.safetensors")));
}

// An Inf in one sample of rank 1's share at step 5 (fp16, dynamic loss scale): rank 1's gradients
// are not finite, so the averaged ones are not either: every rank skips step 5 and halves the
// scale, and all ranks end with the same bits.
TEST(Dist, InfInOneRankSkipsTheStepOnEveryRank) {
  TempDir d;
  const int n = 2;
  const std::string plan = makePlan(d, kBatch, "--precision fp16 --optimizer sgd --lr 0.1 --momentum 0.9");
  Tensor x = readNpy(kDigits + "/train/x.npy");
  const int64_t row = x.numel() / x.type.shape[0];
  const int64_t sample = 4 * kBatch * n + kBatch + 3;  // step 5 (no shuffle), rank 1's 4th sample
  x.setDouble(sample * row + 10, INFINITY);
  fs::create_directories(d.path / "data");
  writeNpy(d.file("data/x.npy"), x);
  fs::copy(kDigits + "/train/target.npy", d.file("data/target.npy"));
  auto r = run(kAmprun + " --nproc 2 " + plan + " --data " + d.file("data") + " --steps 12 --metrics " + d.file("m.jsonl") + " --save " +
               d.file("w.safetensors") + " --save-every-rank");
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = readMetrics(d.file("m.jsonl"));
  ASSERT_EQ(m.size(), 12u);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i].skipped, i == 4) << "step " << i + 1;
  EXPECT_EQ(m[5].scale, m[3].scale / 2) << "the scale backs off once";
  EXPECT_TRUE(std::isfinite(m.back().loss));
  EXPECT_TRUE(sameBits(d.file("w.safetensors"), d.file("w.safetensors.rank1"))) << "the ranks' weights differ";
  // And the same run with the Inf moved to rank 0's share skips the same way (no rank is special).
  x = readNpy(kDigits + "/train/x.npy");
  x.setDouble((4 * kBatch * n + 3) * row + 10, -INFINITY);
  writeNpy(d.file("data/x.npy"), x);
  r = run(kAmprun + " --nproc 2 " + plan + " --data " + d.file("data") + " --steps 8 --metrics " + d.file("m0.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  m = readMetrics(d.file("m0.jsonl"));
  ASSERT_EQ(m.size(), 8u);
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i].skipped, i == 4) << "step " << i + 1;
}

// Runs a bash script that starts a group, waits until `log` shows step 10, signals one process
// (`killCmd`), then waits for the process `waitFor`: its exit code and how long it took to end.
// Every process the script started is killed at the end.
struct Ended {
  int code = -1, seconds = -1;
};
Ended signalAndWait(const TempDir& d, const std::string& start, const std::string& log, const std::string& killCmd, const std::string& waitFor) {
  const std::string script = "cd " + d.path.string() + "; " + start + "; for i in $(seq 600); do grep -q \"step 10/\" " + log +
                             " 2>/dev/null && break; sleep 0.1; done; " + killCmd + "; s=$(date +%s); wait " + waitFor +
                             "; rc=$?; e=$(date +%s); kill -KILL $(jobs -p) 2>/dev/null; echo rc=$rc seconds=$((e - s))";
  const auto r = run("bash -c '" + script + "'");
  std::smatch m;
  Ended e;
  if (std::regex_search(r.out, m, std::regex(R"(rc=(\d+) seconds=(\d+))"))) e = {std::stoi(m[1]), std::stoi(m[2])};
  else ADD_FAILURE() << r.out;
  return e;
}

// Two ranks started by hand in the torchrun environment; rank 1 is killed with SIGKILL, or
// stopped with SIGSTOP (a hang). Rank 0 ends with an error naming itself within 60 s (the hang:
// within its --dist-timeout of 3 s).
TEST(Dist, KilledOrHungRankEndsTheOthers) {
  TempDir d;
  const std::string plan = makePlan(d, kBatch, "--precision fp32 --optimizer sgd --lr 0.1");
  for (const std::string sig : {"KILL", "STOP"}) {
    const std::string env = "WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(freeLoopbackPort());
    const std::string cmd = kAmprun + " " + plan + " --data " + kDigits + "/train --steps 100000000 --log-every 10 --dist-timeout 3";
    const Ended e = signalAndWait(d, env + " RANK=1 " + cmd + " > r1.log 2>&1 & r1=$!; " + env + " RANK=0 " + cmd + " > r0.log 2>&1 & r0=$!",
                                  "r0.log", "kill -" + sig + " $r1", "$r0");
    const std::string log = readBytes(d.file("r0.log"));
    EXPECT_EQ(e.code, 1) << sig << ": " << log;
    EXPECT_LE(e.seconds, 60) << sig;
    EXPECT_NE(log.find("amprun: rank 0: error: "), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0 of 2"), std::string::npos) << log;
    std::printf("SIG%s to rank 1: rank 0 ended in %d s: %s", sig.c_str(), e.seconds, log.substr(log.rfind("amprun:")).c_str());
  }
}

// --nproc: a rank killed under the launcher ends the group; the launcher names it and exits 1.
TEST(Dist, LauncherReportsAKilledRank) {
  TempDir d;
  const std::string plan = makePlan(d, kBatch, "--precision fp32 --optimizer sgd --lr 0.1");
  const Ended e = signalAndWait(d, kAmprun + " --nproc 3 " + plan + " --data " + kDigits + "/train --steps 100000000 --log-every 10 > l.log 2>&1 & l=$!",
                                "l.log", "kill -KILL $(pgrep -P $l | sed -n 2p)", "$l");
  const std::string log = readBytes(d.file("l.log"));
  EXPECT_EQ(e.code, 1) << log;
  EXPECT_LE(e.seconds, 60);
  EXPECT_NE(log.find("amprun: rank 1 was killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(log.find("amprun: rank 0: error: "), std::string::npos) << log;
  EXPECT_NE(log.find("amprun: rank 2: error: "), std::string::npos) << log;
}

// A checkpoint of a 2-process group resumes as 2 processes bitwise equal to the uninterrupted
// run, and as 1 process with the global batch (or 4 with half of it) within 1e-6.
TEST(Dist, CheckpointResumesAtAnyWorldSize) {
  TempDir d;
  const std::string flags = "--precision fp32 --optimizer adamw --lr 0.003";
  const std::string half = makePlan(d, kBatch / 2, flags), per = makePlan(d, kBatch, flags), whole = makePlan(d, 2 * kBatch, flags);
  const std::string common = " --data " + kDigits + "/train --shuffle --seed 2 --steps 20 ";
  auto r = run(kAmprun + " --nproc 2 " + per + common + "--metrics " + d.file("full.jsonl") + " --save " + d.file("full.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " --nproc 2 " + per + " --data " + kDigits + "/train --shuffle --seed 2 --steps 8 --checkpoint " + d.file("ck") +
          " --metrics " + d.file("part.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(d.file("ck/latest")));
  const auto full = readMetrics(d.file("full.jsonl"));
  ASSERT_EQ(full.size(), 20u);
  struct Case {
    std::string launch, plan, tag;
    double tol;
  };
  for (const Case& c : {Case{"--nproc 2 ", per, "2", 0.0}, Case{"", whole, "1", 1e-6}, Case{"--nproc 4 ", half, "4", 1e-6}}) {
    fs::copy(d.file("part.jsonl"), d.file("m" + c.tag + ".jsonl"), fs::copy_options::overwrite_existing);
    r = run(kAmprun + " " + c.launch + c.plan + common + "--resume " + d.file("ck") + " --metrics " + d.file("m" + c.tag + ".jsonl") + " --save " +
            d.file("w" + c.tag + ".safetensors"));
    ASSERT_EQ(r.code, 0) << c.tag << ": " << r.out;
    const auto m = readMetrics(d.file("m" + c.tag + ".jsonl"));
    ASSERT_EQ(m.size(), 20u) << c.tag;
    for (size_t i = 0; i < m.size(); ++i) EXPECT_LE(std::fabs(m[i].loss - full[i].loss), c.tol * std::fabs(full[i].loss)) << c.tag << " step " << i + 1;
    if (c.tol == 0) EXPECT_TRUE(sameBits(d.file("w2.safetensors"), d.file("full.safetensors")));
    else EXPECT_LE(weightsDiff(d.file("w" + c.tag + ".safetensors"), d.file("full.safetensors")), c.tol) << c.tag;
  }
}

// The torchrun environment is checked before anything runs: bad values are named, exit 2.
TEST(Dist, EnvironmentIsChecked) {
  TempDir d;
  const std::string plan = makePlan(d, kBatch, "--precision fp32");
  const std::string cmd = kAmprun + " " + plan + " --data " + kDigits + "/train --steps 1";
  auto r = run("WORLD_SIZE=2 RANK=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " + cmd);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("RANK='2' is not an integer in [0, 1]"), std::string::npos) << r.out;
  r = run("WORLD_SIZE=2 RANK=0 MASTER_PORT=29500 " + cmd);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("not MASTER_ADDR"), std::string::npos) << r.out;
  r = run("WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=99999 " + cmd);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("MASTER_PORT='99999'"), std::string::npos) << r.out;
  r = run("WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 " + kAmprun + " --nproc 2 " + plan + " --data " + kDigits + "/train --steps 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("drop --nproc"), std::string::npos) << r.out;
  // A rank alone: the others never come, and it says so within its timeout.
  r = run("WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(freeLoopbackPort()) + " " + cmd + " --dist-timeout 2");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("rank 1: no rendezvous store at 127.0.0.1:"), std::string::npos) << r.out;
  // More ranks than a global batch fits into the data: named before any step.
  r = run(kAmprun + " --nproc 2 " + makePlan(d, 1000, "--precision fp32") + " --data " + kDigits + "/train --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("fewer than one global batch of 2000"), std::string::npos) << r.out;
}
