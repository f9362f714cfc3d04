// amprun: runs a training plan step after step.
//
//   amprun PLAN --data DIR --steps N [--metrics run.jsonl] [--checkpoint DIR --checkpoint-every K]
//               [--resume DIR|FILE] [--save final.safetensors] [--eval-data DIR]
//               [--device cpu|cuda[:N]] [--bench] [--fixed-batch] [--no-cuda-graph] [--profile N] [--tune]
//               [--attention auto|kernels|cudnn] [--algos auto|heuristics]
//   amprun PLAN --dump
//   amprun --nproc N PLAN ...    data parallel: N processes on this host (or the torchrun
//                                environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
//
// Exit codes: 0 ok, 1 bad input, 2 bad usage.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "runtime/checkpoint.h"
#include "runtime/data.h"
#include "runtime/dist.h"
#include "runtime/overflow.h"
#include "compiler/onnx/onnx.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "runtime/session.h"
#include "runtime/trainer.h"
#include "passes/data_parallel.h"

namespace fs = std::filesystem;
using namespace ampc;

namespace {

std::string num(double v) {
  if (std::isnan(v)) return "\"NaN\"";  // JSON has no NaN or Infinity: written as strings
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return fmt::format("{:.9g}", v);
}

// Mean loss and accuracy of the forward graph (with the trained state) over `dir`'s full batches;
// `when` says after which step ("" at the end).
void evaluateOn(const std::string& dir, Graph& eval, const Graph& step, Backend& backend, const std::string& when = "") {
  for (Value* p : eval.params())
    if (const Value* s = step.lookup(p->name()); s && s->data()) p->setData(*s->data());
  std::vector<const Value*> ins(eval.inputs().begin(), eval.inputs().end());
  auto data = DataSource::fromDir(dir, ins, false, 0);
  for (const auto& note : data.notes()) fmt::print(stderr, "amprun: note: {}\n", note);
  const Value* logits = nullptr;
  const Value* labels = nullptr;
  for (const auto& n : eval.nodes())
    if (n->def() && n->def()->loss) {
      logits = n->input(0);
      labels = n->input(1);
    }
  // Every sample once: the last batch wraps around, and only its new samples are counted.
  double lossSum = 0;
  int64_t correct = 0, total = 0, fullBatches = 0;
  ExecOptions o;
  o.dropout = false;
  const int64_t n = data.samples(), bs = data.batchSize();
  for (int64_t start = 0; start < n; start += bs) {
    auto batch = data.batchAt(start);
    auto outs = logits ? evaluate(eval, batch, backend, o, {logits, labels}) : evaluate(eval, batch, backend, o);
    if (start + bs <= n) {  // the loss is a batch mean: only full batches count
      lossSum += outs[0].getDouble(0);
      ++fullBatches;
    }
    if (logits && outs[1].type.rank() == 2) {
      const Tensor &lg = outs[1], &lb = outs[2];
      const int64_t c = lg.type.shape[1];
      for (int64_t i = 0; i < std::min(bs, n - start); ++i) {
        int64_t best = 0;
        for (int64_t k = 1; k < c; ++k)
          if (lg.getDouble(i * c + k) > lg.getDouble(i * c + best)) best = k;
        correct += best == lb.getInt(i);
        ++total;
      }
    }
  }
  fmt::print("eval on {}{}: loss {:.6f}", dir, when, lossSum / static_cast<double>(std::max<int64_t>(fullBatches, 1)));
  if (total) fmt::print(", accuracy {:.2f}% ({} of {})", 100.0 * static_cast<double>(correct) / static_cast<double>(total), correct, total);
  fmt::print("\n");
}

std::string mib(int64_t b) { return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20)); }

// The --bench report: step time (median after the warm-up), memory, host synchronisations.
void printBench(const std::string& device, const SessionReport& r, double wallMs, const std::vector<double>& stepMs, int64_t steps,
                int64_t logEvery, double readS, double openS) {
  const size_t warm = std::min<size_t>(stepMs.size() / 5, 5);
  std::vector<double> t(stepMs.begin() + static_cast<std::ptrdiff_t>(warm), stepMs.end());
  std::sort(t.begin(), t.end());
  const double median = t.empty() ? 0 : t[t.size() / 2];
  fmt::print("bench: device {}, {} steps ({} warm-up steps left out of the median)\n", device, steps, warm);
  fmt::print("  step time: median {:.3f} ms, min {:.3f} ms, max {:.3f} ms ({}); wall {:.1f} ms for all steps\n", median,
             t.empty() ? 0 : t.front(), t.empty() ? 0 : t.back(), r.device ? "device time, CUDA events" : "wall time", wallMs);
  fmt::print("  memory: arena (planned) {}", mib(r.arenaBytes));
  if (r.device)
    fmt::print(", planned in all {} (arena + params/state/inputs + workspaces), peak device memory (measured) {}\n", mib(r.plannedBytes),
               mib(r.peakBytes));
  else
    fmt::print("\n");
  if (r.device)
    fmt::print("  host synchronisations inside steps: {} ({:.2f} per step); metrics read every {} steps; CUDA graph replays: {}; launches "
               "per step: {}\n",
               r.syncsInSteps, steps > 0 ? static_cast<double>(r.syncsInSteps) / static_cast<double>(steps) : 0.0, logEvery, r.replays,
               r.launches);
  for (const auto& a : r.attention) fmt::print("  fused attention {}\n", a);
  if (r.algosMeasured + r.algosStored > 0)
    fmt::print("  GEMM and convolution algorithms: {} key{} timed at load, {} stored in the plan\n", r.algosMeasured,
               r.algosMeasured == 1 ? "" : "s", r.algosStored);
  if (!r.tuningNote.empty()) fmt::print("  tuning: {}\n", r.tuningNote);
  fmt::print("  load: plan read in {:.2f} s, session opened in {:.2f} s", readS, openS);
  for (size_t i = 0; i < r.loadSeconds.size(); ++i)
    fmt::print("{}{} {:.2f} s", i == 0 ? " (" : ", ", r.loadSeconds[i].first, r.loadSeconds[i].second);
  fmt::print("{}\n", r.loadSeconds.empty() ? "" : "; convolutions, GEMMs and their timing are part of the lowering)");
}

// --nproc N: runs this command line as N processes of one group on this host (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT set for each) and waits for them. When one fails, the
// others end with an error of their own once their collectives find it gone; past the group's
// timeout (and a grace period) they are killed. Exit 0 when every rank succeeded, else 1.
volatile sig_atomic_t gForward = 0;
// One line to stderr in one write: the ranks of a group and their launcher share the stream, and a
// line written in pieces interleaves with theirs.
void sayLine(const std::string& line) {
  std::cerr.flush();
  const std::string l = line + "\n";
  for (size_t done = 0; done < l.size();) {
    const ssize_t w = ::write(2, l.data() + done, l.size() - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
}

int launchGroup(int nproc, int argc, char** argv, double timeoutS) {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::cerr << "amprun: --nproc: cannot find this program's path\n";
    return 1;
  }
  const int port = freeLoopbackPort();
  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::cerr << "amprun: --nproc: fork failed\n";
      for (pid_t p : pids) ::kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher that dies takes its ranks with it
      if (::getppid() != launcher) ::_exit(1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::unsetenv("AMPC_STORE_PORT");
      ::unsetenv("TORCHELASTIC_USE_AGENT_STORE");
      ::setenv("AMPC_LAUNCHED", "1", 1);
      // The ranks share this host's cores (torchrun's habit), unless the user said otherwise.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc))).c_str(), 0);
      std::vector<char*> args(argv, argv + argc);
      args[0] = self;
      args.push_back(nullptr);
      ::execv(self, args.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  // SIGINT/SIGTERM to the launcher go to every rank.
  struct sigaction sa {};
  sa.sa_handler = [](int sig) { gForward = sig; };
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  int failures = 0, running = nproc;
  std::optional<std::chrono::steady_clock::time_point> killAt;
  while (running > 0) {
    int status = 0;
    const pid_t p = ::waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      --running;
      const auto r = std::find(pids.begin(), pids.end(), p) - pids.begin();
      pids[static_cast<size_t>(r)] = -1;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok) {
        ++failures;
        sayLine("amprun: rank " + std::to_string(r) + " " +
                (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                     : "exited with code " + std::to_string(WEXITSTATUS(status))));
        if (!killAt) killAt = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>((timeoutS + 10) * 1000));
      }
      continue;
    }
    if (gForward) {
      for (pid_t q : pids)
        if (q > 0) ::kill(q, gForward);
      gForward = 0;
    }
    if (killAt && std::chrono::steady_clock::now() > *killAt) {
      for (size_t r = 0; r < pids.size(); ++r)
        if (pids[r] > 0) {
          sayLine("amprun: rank " + std::to_string(r) + " did not end after rank failures; killing it");
          ::kill(pids[r], SIGKILL);
        }
      killAt = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"amprun: runs an ampc training plan"};
  std::string planPath, device = "auto", dataDir, metricsPath, savePath, ckptDir, resumeFrom, evalDir, saveOnnx, saveEma;
  int64_t steps = 0, ckptEvery = 0, logEvery = 10, profileTop = 0, maxSkipped = 50, nproc = 1, evalEvery = 0;
  double minScale = 0, distTimeout = 300, bucketMb = 25;
  bool saveEveryRank = false;
  uint64_t seed = 0;
  bool dump = false, shuffle = false, synthetic = false, bench = false, fixedBatch = false, noCudaGraph = false, allowTf32 = false, checkPlan = false,
       explainOverflow = false, checkData = false, deterministic = false, tune = false;
  std::vector<std::string> intRanges;
  std::string attention = "auto", algos = "heuristics";
  app.add_option("plan", planPath, "the .ampplan file ampc wrote")->required();
  app.add_flag("--dump", dump, "print the plan readably and exit");
  app.add_option("--device", device, "cpu, cuda or cuda:N (default: cuda when a GPU is present)");
  app.add_flag("--bench", bench, "time the steps on one fixed batch and report time, memory and host synchronisations");
  app.add_flag("--fixed-batch", fixedBatch, "train on the first batch every step (uploaded once)");
  app.add_flag("--no-cuda-graph", noCudaGraph, "cuda: launch every step's kernels instead of replaying one captured graph");
  app.add_flag("--allow-tf32", allowTf32, "cuda: FP32 GEMMs and convolutions may use TF32");
  app.add_option("--attention", attention,
                 "cuda: the fused attention's implementation: auto (the fastest of ampc's kernels and cuDNN's fused SDPA plans, measured in "
                 "the first step, where cuDNN takes the node: no dropout, no trained mask), kernels, or cudnn (head dims past 128 "
                 "run through cuDNN in every mode)")
      ->check(CLI::IsMember({"auto", "kernels", "cudnn"}));
  app.add_option("--algos", algos,
                 "cuda: the GEMMs' cuBLASLt and the convolutions' cuDNN algorithms: heuristics (the default: the libraries' first "
                 "pick, nothing timed) or auto (each shape timed when the plan loads, unless the plan stores a choice made on this GPU "
                 "and these libraries: cuBLASLt's eight heuristic candidates; cuDNN's heuristics' first six within 256 MiB of "
                 "workspace; the fastest where it beats the first pick by 3%). auto can be slower for a whole step: RegNetY-016 ran "
                 "30% slower with it (README). --deterministic takes the heuristics' first (deterministic) algorithm")
      ->check(CLI::IsMember({"auto", "heuristics"}));
  app.add_flag("--tune", tune,
               "cuda, --attention auto: measure every fused attention shape's implementation (in the first step), "
               "with --algos auto also every GEMM's and convolution's algorithm (at load), afresh and store the choices in the plan "
               "(rewritten atomically), so that later runs on this GPU, cuDNN and cuBLASLt follow them without timing");
  app.add_flag("--deterministic", deterministic,
               "cuda: the same bits every run with the same seed: deterministic cuDNN algorithms, attention and scatter-add gradients "
               "summed in a fixed order instead of with atomics (the CPU backend always is)");
  app.add_flag("--check-plan", checkPlan,
               "cuda: check the memory plan: poison each value's bytes (NaN) when its last reader is done, and name the nodes whose "
               "results held NaNs");
  app.add_flag("--explain-overflow", explainOverflow,
               "for each skipped step, name the first node that made an Inf or NaN from operands without one, and why (cuda: per launch, "
               "after scanning every launch's operands and results; a fused launch names its nodes)");
  app.add_option("--profile", profileTop, "cuda: after the steps, time one more step node by node and print the N costliest ops and nodes");
  app.add_option("--data", dataDir, "folder with one NAME.npy per graph input (leading dimension = samples)");
  app.add_flag("--shuffle", shuffle, "shuffle the samples every epoch (with --seed)");
  app.add_option("--seed", seed, "seed of the shuffle, synthetic data and Dropout (default 0)");
  app.add_flag("--synthetic", synthetic, "train on seeded random inputs instead of --data");
  app.add_option("--int-range", intRanges, "--synthetic: NAME=LO:HI for an integer input (default 0:1)");
  app.add_option("--steps", steps, "how many steps to run (in all, counting a resumed run's)");
  app.add_option("--metrics", metricsPath, "write one JSON line per step");
  app.add_option("--log-every", logEvery, "progress lines every N steps when not on a terminal (10)");
  app.add_option("--save", savePath, "write the final parameters (.safetensors, ONNX initializer names)");
  app.add_option("--checkpoint", ckptDir, "checkpoint folder");
  app.add_option("--checkpoint-every", ckptEvery, "checkpoint every N steps (and at the end)");
  app.add_option("--resume", resumeFrom, "resume from a checkpoint folder (its latest) or file");
  app.add_option("--save-ema", saveEma,
                 "a plan compiled with ampc --ema: the parameters' moving average, with the running statistics as they are: "
                 ".safetensors as --save writes, or the source model with them in its initializers if PATH ends in .onnx");
  app.add_option("--save-onnx", saveOnnx,
                 "write the model the plan was compiled from with the final parameters (and running statistics) in its initializers: a "
                 "trained .onnx for any ONNX runtime");
  app.add_option("--eval-data", evalDir, "after training: loss and accuracy on held-out data");
  app.add_option("--eval-every", evalEvery, "with --eval-data: also evaluate after every N steps (on the CPU backend, as at the end)");
  app.add_flag("--check-data", checkData, "before step 1: scan --data for NaN and Inf and name the first bad sample");
  app.add_option("--max-skipped", maxSkipped,
                 "stop with an error after this many overflow-skipped steps in a row (default 50; 0: never)");
  app.add_option("--min-scale", minScale, "stop with an error when the dynamic loss scale falls below this (default 0: never)");
  app.add_option("--nproc", nproc,
                 "data parallel: run N processes on this host, each on its share of every global batch (N times the plan's batch); "
                 "gradients are averaged (Gloo on the CPU, NCCL on CUDA: rank r on GPU r) before the overflow check, so every rank keeps the same "
                 "loss scale and weights");
  app.add_option("--bucket-mb", bucketMb,
                 "data parallel: gradients are averaged in buckets of about this many MiB (f32), each as soon as the backward "
                 "has made it (25; 0: one all-reduce after the backward)");
  app.add_option("--dist-timeout", distTimeout, "data parallel: seconds a rank waits for the others before it stops with an error (300)");
  app.add_flag("--save-every-rank", saveEveryRank, "data parallel: every rank r > 0 also writes its parameters to SAVE.rank<r>");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  // The group this process belongs to: --nproc launches one; a launcher's environment names ours.
  std::optional<DistEnv> dist;
  try {
    dist = DistEnv::fromEnvironment();
  } catch (const Error& e) {
    std::cerr << "amprun: error: " << e.what() << "\n";
    return 2;
  }
  if (nproc < 1 || nproc > 4096 || !(distTimeout > 0 && distTimeout <= 86400) || !(bucketMb >= 0 && bucketMb <= 1 << 20)) {
    std::cerr << "amprun: --nproc wants 1 to 4096 processes, --dist-timeout 0 to 86400 seconds and --bucket-mb 0 to 1048576\n";
    return 2;
  }
  const int rank = dist ? dist->rank : 0, world = dist ? dist->world : 1;
  const bool lead = rank == 0;  // writes metrics, checkpoints, --save and progress
  const std::string who = world > 1 ? "amprun: rank " + std::to_string(rank) + ": error: " : "amprun: error: ";
  if (device == "auto") device = defaultDevice();
  const bool useCuda = device != "cpu";
  if (const std::string why = deviceUnavailable(device); !why.empty()) {
    std::cerr << "amprun: " << why << "\n";
    return 2;
  }
  if (!useCuda && profileTop > 0) {
    std::cerr << "amprun: --profile times device launches: it needs --device cuda\n";
    return 2;
  }
  if (tune && (!useCuda || attention != "auto" || deterministic)) {
    std::cerr << "amprun: --tune times the fused attention's implementations (and with --algos auto the GEMMs' and convolutions' "
                 "algorithms): it needs --device cuda and --attention auto, without --deterministic\n";
    return 2;
  }
  // A CUDA group: each rank on GPU LOCAL_RANK (torchrun's convention) unless --device names one.
  if (useCuda && dist && device == "cuda") device = "cuda:" + std::to_string(dist->localRank);
  if (nproc > 1 && !std::getenv("AMPC_LAUNCHED")) {
    if (dist) {
      std::cerr << "amprun: --nproc launches a group, but the environment already names one (WORLD_SIZE=" << dist->world
                << "): drop --nproc under an external launcher\n";
      return 2;
    }
    return launchGroup(static_cast<int>(nproc), argc, argv, distTimeout);
  }
  // A failed run leaves the metrics file as it found it: a fresh run's is removed, a resumed run's
  // holds the lines up to its checkpoint again (so the next --resume continues it).
  std::function<void()> undoMetrics;
  try {
    const auto tRead = std::chrono::steady_clock::now();
    LoadedPlan plan = readPlan(planPath);
    const double readS = std::chrono::duration<double>(std::chrono::steady_clock::now() - tRead).count();
    if (dump) {
      std::cout << plan.dump;
      return 0;
    }
    if (dataDir.empty() == !synthetic) {
      std::cerr << "amprun: give --data DIR or --synthetic\n";
      return 2;
    }
    if (evalEvery < 0 || (evalEvery > 0 && evalDir.empty())) {
      std::cerr << "amprun: --eval-every N wants N >= 1 and --eval-data DIR\n";
      return 2;
    }
    if (!findTarget(plan.options.target).runsOn(useCuda ? "cuda" : "cpu"))
      throw Error(planPath + ": compiled with --target " + plan.options.target + ", which --device " + device +
                  " cannot run; compile it again with --target cuda, or run it with --device cpu");
    Graph& g = *plan.step;
    if (!saveEma.empty() && std::none_of(g.params().begin(), g.params().end(), [](const Value* v) {
          return v->name().size() > 4 && v->name().compare(v->name().size() - 4, 4, ".ema") == 0;
        }))
      throw Error(planPath + ": --save-ema, but the plan keeps no moving average (compile it with ampc --ema DECAY)");
    std::vector<const Value*> ins(g.inputs().begin(), g.inputs().end());
    std::map<std::string, std::pair<int64_t, int64_t>> ranges;
    for (const auto& r : intRanges) {
      auto eq = r.find('='), colon = r.find(':');
      if (eq == std::string::npos || colon == std::string::npos || colon < eq) {
        std::cerr << "amprun: --int-range wants NAME=LO:HI, got '" << r << "'\n";
        return 2;
      }
      ranges[r.substr(0, eq)] = {std::stoll(r.substr(eq + 1, colon - eq - 1)), std::stoll(r.substr(colon + 1))};
    }
    DataSource data = synthetic ? DataSource::synthetic(ins, seed, ranges) : DataSource::fromDir(dataDir, ins, shuffle, seed);
    if (lead)
      for (const auto& note : data.notes()) fmt::print(stderr, "amprun: note: {}\n", note);
    // A group: every rank averages its loss, gradients and running statistics with the others'
    // before the overflow check (passes/data_parallel.h), on its own share of the global batch.
    // A group of one (WORLD_SIZE=1) runs through the collective too, as torchrun's DDP does.
    std::unique_ptr<ProcessGroup> group;
    if (dist) {
      try {
        data.shard(rank, world);
      } catch (const Error& e) {
        throw Error((synthetic ? std::string("--synthetic") : dataDir) + ": " + e.what());
      }
      createDataParallelPass(static_cast<int64_t>(bucketMb * (1 << 20)))->run(g);
      // The AllReduce reads the gradients UnscaleCheck read through their casts: fold again.
      if (plan.options.target == "cuda") recordFolds(g);
      group = ProcessGroup::connect(*dist, std::chrono::milliseconds(static_cast<int64_t>(distTimeout * 1000)));
    }
    if (checkData)
      if (const std::string bad = data.firstNonFinite(); !bad.empty()) throw Error(dataDir + ": " + bad + " is not finite (--check-data)");
    int64_t done = 0;
    if (!resumeFrom.empty()) {
      Resumed r = resume(resumeFrom, g, seed);
      done = r.step;
      try {
        data.setPosition(r.pos);
      } catch (const Error& e) {
        throw Error(resumeFrom + ": " + e.what());
      }
    }
    if (tune && steps <= done) throw Error("--tune measures in the first step it runs, and --steps " + std::to_string(steps) + " runs none");
    // The metrics file continues a resumed run: lines past the checkpoint's step are dropped.
    std::vector<std::string> kept;
    if (!metricsPath.empty() && lead && done > 0) {
      std::ifstream in(metricsPath);
      for (std::string line; std::getline(in, line) && static_cast<int64_t>(kept.size()) < done;) kept.push_back(line);
    }
    // A resumed run's file is cut back to the checkpoint by replacing it whole (a temporary file
    // renamed over it), never truncated in place: a kill between a truncation and the rewrite
    // would lose the lines before the checkpoint.
    auto replaceMetrics = [&metricsPath](const std::vector<std::string>& lines) {
      const std::string tmp = metricsPath + ".tmp";
      {
        std::ofstream out(tmp, std::ios::trunc);
        for (const auto& l : lines) out << l << "\n";
        if (!out.flush()) throw Error(metricsPath + ": cannot write");
      }
      std::error_code ec;
      fs::rename(tmp, metricsPath, ec);
      if (ec) throw Error(metricsPath + ": rename failed: " + ec.message());
    };
    std::ofstream metrics;
    if (!metricsPath.empty() && lead) {
      if (done > 0) replaceMetrics(kept);
      metrics.open(metricsPath, done > 0 ? std::ios::app : std::ios::trunc);
      if (!metrics) throw Error(metricsPath + ": cannot write");
      undoMetrics = [&metricsPath, replaceMetrics, kept, resumed = done > 0] {
        std::error_code ec;
        if (!resumed) fs::remove(metricsPath, ec);
        else try {
            replaceMetrics(kept);
          } catch (const Error&) {
          }
      };
    }
    const bool fixed = fixedBatch || bench;  // one batch, uploaded once
    const bool tty = isatty(2) && !bench;
    std::vector<double> stepMs;
    int64_t skippedInARow = 0;
    // One finished step's metrics line and progress.
    auto emit = [&](int64_t s, const Trainer::Metrics& m) {
      const double ms = m.ms;
      stepMs.push_back(ms);
      skippedInARow = m.skipped ? skippedInARow + 1 : 0;
      if (metrics.is_open())
        metrics << fmt::format(R"({{"step": {}, "loss": {}, "loss_scale": {}, "skipped": {}, "grad_norm": {}, "lr": {}, "step_ms": {:.3f}}})",
                               s + 1, num(m.loss), num(m.lossScale), m.skipped ? "true" : "false", num(m.gradNorm), num(m.lr), ms)
                << "\n";
      if (!lead) {
      } else if (tty) {
        const int width = 30, filled = static_cast<int>(width * (s + 1) / std::max<int64_t>(steps, 1));
        fmt::print(stderr, "\r[{:<{}}] {}/{} loss {:.4f} scale {:g}{}", std::string(filled, '#'), width, s + 1, steps, m.loss, m.lossScale,
                   s + 1 == steps ? "\n" : "");
      } else if ((s + 1) % std::max<int64_t>(logEvery, 1) == 0 || s + 1 == steps) {
        fmt::print(stderr, "step {}/{}: loss {:.6f}, loss scale {:g}{}, grad norm {:.4g}, lr {:.4g}, {:.2f} ms\n", s + 1, steps, m.loss,
                   m.lossScale, m.skipped ? " (skipped)" : "", m.gradNorm, m.lr, ms);
      }
      // The collapse guard: a run that only skips is not training (NaN/Inf data, a model that overflows).
      if (minScale > 0 && m.lossScale < minScale)
        throw Error("step " + std::to_string(s + 1) + ": the loss scale fell to " + fmt::format("{:g}", m.lossScale) + ", below --min-scale " +
                    fmt::format("{:g}", minScale) + "; check the data with --check-data, and find the op with --explain-overflow");
      if (maxSkipped > 0 && skippedInARow >= maxSkipped) {
        throw Error("step " + std::to_string(s + 1) + ": " + std::to_string(skippedInARow) +
                    " steps in a row were skipped for Inf/NaN gradients (loss scale now " + fmt::format("{:g}", m.lossScale) +
                    "); check the data with --check-data, and find the op with --explain-overflow (--max-skipped 0 runs on)");
      }
    };
    // A checkpoint carries the metrics up to its step to disk first, so a resumed run continues them.
    auto checkpoint = [&](int64_t step) {
      if (!lead) return;
      if (metrics.is_open() && !metrics.flush()) throw Error(metricsPath + ": write failed");
      writeCheckpoint(ckptDir, g, step, data.position(), seed);
    };
    // One loop for every backend (runtime/session.h).
    std::optional<OverflowWatch> watch;
    if (explainOverflow) {
      expandFused(g, /*onlyWithoutKernel=*/false);  // name the op inside a fused group, as it was written
      watch.emplace(g);
    }
    SessionOptions so;
    so.device = device;
    so.seed = seed + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull;  // each rank its own Dropout masks
    so.collective = group.get();
    so.collectiveTimeout = std::chrono::milliseconds(static_cast<int64_t>(distTimeout * 1000));
    // Gradient accumulation (ampc --accumulate N): each step runs the step graph on N batches in turn;
    // the N-th run applies the window's gradients (passes/train_step.h).
    const int64_t nAcc = std::max<int64_t>(plan.options.accumulate, 1);
    so.logEvery = static_cast<int>(std::max<int64_t>(logEvery, 1) * nAcc);
    so.allowTf32 = allowTf32;
    so.cudaGraph = !noCudaGraph;
    so.checkPlan = checkPlan;
    so.deterministic = deterministic;
    so.attention = attention;
    so.algos = algos;
    if (!tune) so.tuning = plan.tuning;  // --tune measures afresh
    so.watch = watch ? &*watch : nullptr;
    const auto tOpen = std::chrono::steady_clock::now();
    auto session = openTrainSession(g, so);
    const double openS = std::chrono::duration<double>(std::chrono::steady_clock::now() - tOpen).count();
    if (group && lead)
      std::cout << "amprun: a group of " << world << (world == 1 ? " process" : " processes") << "; gradients averaged through "
                << (useCuda ? "NCCL (CUDA)" : "Gloo (CPU)") << "\n";
    session->begin(static_cast<uint64_t>(done * nAcc));  // Dropout counts the graph's runs
    int64_t reported = done;
    int explained = 0;
    constexpr int kMaxExplained = 10;
    // A step's metrics from its runs: the mean loss of its micro-batches, the time of all of them, and
    // the last run's check (of the whole window's gradients), norm and lr.
    std::vector<Trainer::Metrics> window;
    auto drain = [&](const std::vector<Trainer::Metrics>& ms) {
      for (const auto& m : ms) {
        window.push_back(m);
        if (static_cast<int64_t>(window.size()) < nAcc) continue;
        Trainer::Metrics a = window.back();
        a.loss = 0;
        a.ms = 0;
        for (const auto& w : window) {
          a.loss += w.loss;
          a.ms = a.ms < 0 || w.ms < 0 ? -1 : a.ms + w.ms;
        }
        a.loss /= static_cast<double>(nAcc);
        a.lossScale = window.front().lossScale;
        window.clear();
        emit(reported++, a);
      }
    };
    const auto evalBackend = createCpuBackend();
    std::map<std::string, Tensor> batch;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t s = done; s < steps; ++s) {
      for (int64_t k = 0; k < nAcc; ++k) {
        const bool upload = !fixed || (s == done && k == 0);
        if (upload) batch = data.next();
        const double scale = watch ? session->lossScale() : 0.0;  // the scale this step runs with
        const auto ms = session->step(upload ? &batch : nullptr);
        if (watch && k + 1 == nAcc && !ms.empty() && ms.back().skipped && explained < kMaxExplained) {
          session->findOverflow();
          std::cout << watch->explain(s + 1, scale) << (++explained == kMaxExplained ? "  (later overflows are not explained)\n" : "");
          std::cout.flush();
        }
        drain(ms);
      }
      if (!ckptDir.empty() && ckptEvery > 0 && (s + 1) % ckptEvery == 0) {
        drain(session->flush());
        session->syncState();
        checkpoint(s + 1);
      }
      if (evalEvery > 0 && (s + 1) % evalEvery == 0 && s + 1 < steps && lead) {  // the last step's is below
        drain(session->flush());
        session->syncState();
        evaluateOn(evalDir, *plan.eval, g, *evalBackend, fmt::format(" after step {}", s + 1));
        std::cout.flush();
      }
    }
    drain(session->flush());
    if (profileTop > 0) std::cout << session->profile(static_cast<size_t>(profileTop));
    if (checkPlan) std::cout << session->checkPlanReport();
    session->syncState();
    const double wallMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // The last collective is done: no rank leaves while another may still be reading from it, and
    // none waits on rank 0's checkpoint, --save or --eval-data below.
    if (group) group->barrier();
    if (metrics.is_open() && !metrics.flush()) throw Error(metricsPath + ": write failed");
    if (!ckptDir.empty() && (ckptEvery <= 0 || steps % ckptEvery != 0) && steps > done) checkpoint(steps);
    if (!savePath.empty() && (lead || saveEveryRank)) {
      Safetensors st;
      for (const Value* p : plan.eval->params())
        if (const Value* s = g.lookup(p->name()); s && s->data()) st.tensors.emplace(p->name(), *s->data());
      writeSafetensors(lead ? savePath : savePath + ".rank" + std::to_string(rank), st);
    }
    // What the steps wrote into the model: its parameters and running statistics (the states that
    // are the forward graph's params; the optimizer's and scaler's state is not the model's); with
    // `ema`, each parameter's moving average in its place.
    auto modelState = [&](bool ema) {
      std::map<std::string, const Tensor*> r;
      for (const auto& [s, out] : stateUpdates(g)) {
        if (!s->data() || !isFloat(s->data()->type.dtype) || !plan.eval->lookup(s->name())) continue;
        const Value* avg = ema ? g.lookup(s->name() + ".ema") : nullptr;
        r.emplace(s->name(), avg && avg->data() ? avg->data() : s->data());
      }
      return r;
    };
    if (!saveOnnx.empty() && lead) {
      const int64_t n = writeOnnxWithWeights(plan.source, modelState(false), saveOnnx);
      fmt::print("amprun: wrote {} ({} of {}'s initializers trained)\n", saveOnnx, n, plan.source);
    }
    if (!saveEma.empty() && lead) {
      const auto state = modelState(true);
      if (saveEma.size() > 5 && saveEma.compare(saveEma.size() - 5, 5, ".onnx") == 0) {
        writeOnnxWithWeights(plan.source, state, saveEma);
      } else {
        Safetensors st;
        for (const Value* p : plan.eval->params()) {
          const Value* s = g.lookup(p->name());
          if (auto it = state.find(p->name()); it != state.end()) st.tensors.emplace(p->name(), *it->second);
          else if (s && s->data()) st.tensors.emplace(p->name(), *s->data());
        }
        writeSafetensors(saveEma, st);
      }
      fmt::print("amprun: wrote {} (the parameters' moving average)\n", saveEma);
    }
    if (!evalDir.empty() && lead) evaluateOn(evalDir, *plan.eval, g, *evalBackend, evalEvery > 0 ? fmt::format(" after step {}", steps) : "");
    const SessionReport report = session->report();
    if (bench && lead) printBench(device, report, wallMs, stepMs, steps - done, logEvery, readS, openS);
    if (tune && lead) {
      storeTuning(planPath, report.tuning);
      fmt::print("amprun: stored {} fused attention choice{} and {} GEMM and convolution algorithm{} in {} (measured on {})\n",
                 report.tuning.attention.size(), report.tuning.attention.size() == 1 ? "" : "s", report.tuning.algorithms.size(),
                 report.tuning.algorithms.size() == 1 ? "" : "s", planPath, report.tuning.device);
    }
  } catch (const Error& e) {
    if (undoMetrics) undoMetrics();
    sayLine(who + e.what());
    return 1;
  } catch (const std::exception& e) {
    if (undoMetrics) undoMetrics();
    sayLine(who + e.what());
    return 1;
  }
  return 0;
}
