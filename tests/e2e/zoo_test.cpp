// The model zoo (models/zoo, made by models/zoo/make_zoo.py with PyTorch 2.11, timm and
// transformers): small configurations of real architectures, each exported by both of PyTorch's
// exporters, checked against PyTorch on the same weights and batch:
//   - the forward loss (ampc --eval) within 1e-4 relative;
//   - every parameter gradient (ampc --grad), and exactly PyTorch's trainable set;
//   - the losses of 3 fp32 SGD steps (a plan run by amprun) within 1e-4 relative, or within twice
//     PyTorch's own f32 error (its f32 run against its f64 run) where that is larger: a model so
//     sensitive that correct f32 runs drift apart (BatchNorm over few values, ReLU6 kinks);
//   - fp16 (dynamic loss scaling) and bf16 plans over 20 SGD steps: the skipped steps within one
//     of PyTorch AMP's (autocast, GradScaler at fp16), and every loss within 5% of PyTorch AMP's up
//     to the step where PyTorch's own AMP run leaves its fp32 run by more than 5% (past that, the
//     trajectory is too sensitive for two AMP runs to agree), and up to the step where PyTorch's CPU
//     autocast leaves its CUDA autocast by more than 5% (two implementations of the same AMP); the
//     test prints that horizon. These 20 steps run at ref.json's amp_lr where make_zoo.py --amp-lr
//     chose one: the largest learning rate at which PyTorch's own AMP runs agree to 2% (one batch
//     at a large rate is chaotic on small BatchNorm nets);
//   - the first step's bf16 gradients as accurate, against the exact ones, as PyTorch AMP's.
// The plans run on the CPU backend; AMPC_ZOO_DEVICE=cuda runs them on the GPU (amprun --device), and
// AMPC_ZOO_BIN names the folder of ampc and amprun where the build folder is not at hand;
// AMPC_ZOO_AMPC_FLAGS adds flags to the ampc runs that compile plans and gradients (--target cpu:
// the plans of the CPU target, which fuses what the CUDA target does not yet).
// The families are found on disk: a new folder with a ref.json is a new case.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "runtime/npy.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string envOr(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}
const std::string kBin = envOr("AMPC_ZOO_BIN", "");
const std::string kAmpc = kBin.empty() ? AMPC_BIN : kBin + "/ampc";
const std::string kAmprun = (kBin.empty() ? std::string(AMPC_BINARY_DIR) + "/tools/amprun" : kBin + "/amprun") + " --device " +
                            envOr("AMPC_ZOO_DEVICE", "cpu");
const fs::path kZoo = envOr("AMPC_ZOO_DIR", (fs::path(AMPC_SOURCE_DIR) / "models" / "zoo").string());
const std::string kAmpcFlags = envOr("AMPC_ZOO_AMPC_FLAGS", "").empty() ? "" : " " + envOr("AMPC_ZOO_AMPC_FLAGS", "");

struct Case {
  std::string family, exporter;
  fs::path dir() const { return kZoo / family; }
  std::string model() const { return (dir() / (family + "." + exporter + ".onnx")).string(); }
};

// gtest prints a parameter with this (ctest lists the tests by it).
void PrintTo(const Case& c, std::ostream* os) { *os << c.family << "." << c.exporter; }

std::vector<Case> cases() {
  std::vector<Case> r;
  if (!fs::exists(kZoo)) return r;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kZoo))
    if (e.is_directory() && fs::exists(e.path() / "ref.json")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& d : dirs)
    for (const char* ex : {"dynamo", "torchscript"})
      if (fs::exists(d / (d.filename().string() + "." + ex + ".onnx"))) r.push_back({d.filename().string(), ex});
  return r;
}

json readJson(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

// Relative L2 error of got against want (f64 sums).
double relL2(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = got.getDouble(i) - want.getDouble(i);
    num += d * d;
    den += want.getDouble(i) * want.getDouble(i);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// One field of every line of a metrics file, in step order.
std::vector<double> metric(const std::string& path, const std::string& field) {
  std::vector<double> r;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) {
      const json v = json::parse(l).at(field);
      r.push_back(v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>());
    }
  return r;
}

// Trains the case's model with amprun (SGD at lrKey's learning rate in ref.json) and returns the
// metrics file's path.
std::string train(const Case& c, const TempDir& t, const std::string& precision, int steps, const std::string& lrKey = "sgd_lr") {
  const json ref = readJson(c.dir() / "ref.json");
  const std::string plan = t.file(precision + ".ampplan"), metrics = t.file(precision + ".jsonl");
  std::ostringstream lr;
  lr << ref.at(lrKey).get<double>();
  auto r = run(kAmpc + " " + c.model() + kAmpcFlags + " --precision " + precision + " --optimizer sgd --lr " + lr.str() + " -o " + plan);
  EXPECT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " " + plan + " --data " + (c.dir() / "inputs").string() + " --steps " + std::to_string(steps) + " --log-every 1 --metrics " + metrics);
  EXPECT_EQ(r.code, 0) << r.out;
  return metrics;
}

class Zoo : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(Zoo, ForwardLossMatchesPyTorch) {
  const Case& c = GetParam();
  const json ref = readJson(c.dir() / "ref.json");
  TempDir t;
  auto r = run(kAmpc + " " + c.model() + " --eval --no-dropout --inputs " + (c.dir() / "inputs").string() + " --outputs " + t.path.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const double loss = readNpy(t.file("loss.npy")).getDouble(0);
  const double want = ref.at("loss0").get<double>();
  std::printf("%s.%s: loss %.7f, PyTorch %.7f (rel %.2e)\n", c.family.c_str(), c.exporter.c_str(), loss, want, rel(loss, want));
  EXPECT_LT(rel(loss, want), 1e-4);
}

namespace {

// A case's gradients: ampc's (ampc --grad at a precision, evaluated on the CPU backend) and the
// reference, PyTorch's f64 gradients (grads64/) where the folder has them (an ill-conditioned
// model's f32 gradients, PyTorch's too, are off by up to a few percent), else its f32 (grads/).
// PyTorch's are by named_parameters() name, ampc's <initializer>_grad outputs by initializer; both
// exporters name initializers after the parameters, and ref.json's names map a parameter to the
// initializer the exporter made of it (a tied weight is named after one of its uses).
struct Gradients {
  std::map<std::string, Tensor> ampc, ref;  // by initializer
  bool exact = false;                        // ref is f64
};

Gradients gradients(const Case& c, const TempDir& t, const std::string& precision) {
  Gradients r;
  const std::string g = t.file("grad_" + precision + ".onnx");
  const fs::path out = t.path / ("grads_" + precision);
  fs::create_directories(out);
  auto x = run(kAmpc + " " + c.model() + kAmpcFlags + " --grad" + (precision == "fp32" ? "" : " --precision " + precision) + " --emit onnx -o " + g);
  EXPECT_EQ(x.code, 0) << x.out;
  x = run(kAmpc + " " + g + " --eval --no-dropout --inputs " + (c.dir() / "inputs").string() + " --outputs " + out.string());
  EXPECT_EQ(x.code, 0) << x.out;
  const json ref = readJson(c.dir() / "ref.json");
  std::map<std::string, std::string> onnxName;
  if (ref.contains("names") && ref["names"].contains(c.exporter))
    for (const auto& [k, v] : ref["names"][c.exporter].items()) onnxName[k] = v.get<std::string>();
  r.exact = fs::exists(c.dir() / "grads64");
  for (const auto& e : fs::directory_iterator(c.dir() / (r.exact ? "grads64" : "grads"))) {
    const std::string p = e.path().stem().string();
    r.ref.emplace(onnxName.count(p) ? onnxName[p] : p, readNpy(e.path().string()));
  }
  for (const auto& e : fs::directory_iterator(out)) {
    const std::string f = e.path().filename().string();
    if (f.size() > 9 && f.substr(f.size() - 9) == "_grad.npy") r.ampc.emplace(f.substr(0, f.size() - 9), readNpy(e.path().string()));
  }
  return r;
}

double l2(const Tensor& t) {
  double n2 = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n2 += t.getDouble(i) * t.getDouble(i);
  return std::sqrt(n2);
}

// Each parameter's gradient error: |got - ref| / max(|ref|, 1e-2 |largest ref|) in L2. The floor:
// a gradient that is 0 in exact arithmetic (a key bias under softmax, a bias before a norm) is the
// rounding noise of cancelling sums in both. make_zoo.py's grad_error is the median of the same.
std::map<std::string, double> gradErrors(const Gradients& g) {
  double largest = 0;
  for (const auto& [p, r] : g.ref) largest = std::max(largest, l2(r));
  EXPECT_GT(largest, 0.0);
  std::map<std::string, double> e;
  for (const auto& [p, r] : g.ref) {
    auto it = g.ampc.find(p);
    if (it == g.ampc.end()) continue;
    EXPECT_EQ(it->second.type.shape, r.type.shape) << p;
    if (it->second.type.shape != r.type.shape) continue;
    double num = 0;
    for (int64_t i = 0; i < r.numel(); ++i) num += std::pow(it->second.getDouble(i) - r.getDouble(i), 2);
    e[p] = std::sqrt(num) / std::max(l2(r), 1e-2 * largest);
  }
  return e;
}

}  // namespace

TEST_P(Zoo, GradientsAndTrainableSetMatchPyTorch) {
  const Case& c = GetParam();
  TempDir t;
  const Gradients g = gradients(c, t, "fp32");
  ASSERT_FALSE(g.ref.empty());
  std::vector<std::string> extra, missing;
  for (const auto& [p, _] : g.ampc)
    if (!g.ref.count(p)) extra.push_back(p);
  for (const auto& [p, _] : g.ref)
    if (!g.ampc.count(p)) missing.push_back(p);
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += " " + x;
    return s;
  };
  EXPECT_TRUE(extra.empty()) << "ampc trains what PyTorch does not:" << join(extra);
  EXPECT_TRUE(missing.empty()) << "ampc does not train:" << join(missing);
  // Each gradient within 1e-4 (f32's unit roundoff is 6e-8, summed over the batch and the positions).
  double worst = 0;
  std::string worstName;
  for (const auto& [p, e] : gradErrors(g)) {
    if (e > worst) worst = e, worstName = p;
    EXPECT_LT(e, 1e-4) << p << " (relative L2 " << relL2(g.ampc.at(p), g.ref.at(p)) << ")";
  }
  std::printf("%s.%s: %zu gradients against PyTorch's %s, worst error %.2e (%s)\n", c.family.c_str(), c.exporter.c_str(), g.ref.size(),
              g.exact ? "f64" : "f32", worst, worstName.c_str());
}

TEST_P(Zoo, ThreeSgdStepsMatchPyTorch) {
  const Case& c = GetParam();
  const json ref = readJson(c.dir() / "ref.json");
  TempDir t;
  const auto got = metric(train(c, t, "fp32", 3), "loss");
  const auto want = ref.at("sgd_fp32").get<std::vector<double>>();
  const auto exact = ref.at("sgd_fp64").get<std::vector<double>>();
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(exact.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double tol = std::max(1e-4, 2 * rel(want[i], exact[i]));
    std::printf("%s.%s: SGD step %zu loss %.7f, PyTorch %.7f (rel %.2e, tolerance %.1e)\n", c.family.c_str(), c.exporter.c_str(), i + 1,
                got[i], want[i], rel(got[i], want[i]), tol);
    EXPECT_LT(rel(got[i], want[i]), tol) << "step " << i + 1;
  }
}

// The bf16 gradients of the first step, against the exact ones, are as accurate as PyTorch AMP's on
// CUDA (ref.json's amp_grad_err, made by make_zoo.py --amp-refs with the same measure): the median
// over parameters of each gradient's error within twice PyTorch's (issue 18's bound for the CPU
// reference's f32 error). A single step is not chaotic, unlike a trajectory: an op that ampc rounds
// where PyTorch does not, or a wrong mixed-precision gradient, shows here.
TEST_P(Zoo, MixedPrecisionGradientsAsAccurateAsPyTorchAmp) {
  const Case& c = GetParam();
  const json ref = readJson(c.dir() / "ref.json");
  ASSERT_TRUE(ref.contains("amp_grad_err") && ref["amp_grad_err"].contains("bf16"))
      << "ref.json has no amp_grad_err: python3 models/zoo/make_zoo.py --amp-refs models/zoo " << c.family << " (on the GPU machine)";
  TempDir t;
  const Gradients g = gradients(c, t, "bf16");
  // make_zoo.py's grad_error: over the parameters whose exact gradient is at least 1e-2 of the
  // largest, the median of |got - exact| / |exact| (a gradient that is 0 in exact arithmetic is
  // rounding noise in any precision).
  double largest = 0;
  for (const auto& [p, r] : g.ref) largest = std::max(largest, l2(r));
  std::vector<double> v;
  for (const auto& [p, r] : g.ref) {
    auto it = g.ampc.find(p);
    ASSERT_TRUE(it != g.ampc.end()) << "ampc's bf16 gradients lack " << p;
    ASSERT_EQ(it->second.type.shape, r.type.shape) << p;
    if (l2(r) >= 1e-2 * largest) v.push_back(relL2(it->second, r));
  }
  ASSERT_FALSE(v.empty());
  std::sort(v.begin(), v.end());
  const double median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  const double theirs = ref["amp_grad_err"]["bf16"].get<double>();
  std::printf("%s.%s bf16: median gradient error %.3e over %zu parameters, PyTorch AMP (%s) %.3e, ratio %.2f; PyTorch fp32 %.3e\n",
              c.family.c_str(), c.exporter.c_str(), median, v.size(), ref["amp_grad_err"].value("device", "?").c_str(), theirs,
              median / theirs, ref["amp_grad_err"].value("fp32", 0.0));
  EXPECT_LE(median, 2 * theirs);
  EXPECT_GT(median, 1e-5) << "bf16 gradients as exact as f32 ones: the graph did not run at bf16";
}

// models/zoo/expectations.txt: "FAMILY.EXPORTER PRECISION[@DEVICE] reason" for each mixed-precision
// run known to miss the criterion (@cpu or @cuda: on that backend only); a listed run that starts to
// pass fails the test (remove its line).
std::map<std::string, std::string> ampExpectations() {
  std::map<std::string, std::string> r;
  std::ifstream in(kZoo / "expectations.txt");
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#') continue;
    std::istringstream ss(l);
    std::string name, prec, reason;
    ss >> name >> prec;
    std::getline(ss, reason);
    r[name + " " + prec] = reason;
  }
  return r;
}

TEST_P(Zoo, MixedPrecisionTracksPyTorchAmp) {
  const Case& c = GetParam();
  const json ref = readJson(c.dir() / "ref.json");
  const auto expected = ampExpectations();
  TempDir t;
  int checked = 0;
  for (const char* p : {"fp16", "bf16"}) {
    const std::string key = std::string("amp_") + p;
    if (!ref.contains(key) || !ref[key].contains("loss")) continue;  // made without a GPU: no fp16 reference
    ++checked;
    const auto want = ref[key]["loss"].get<std::vector<double>>();
    const auto wantSkipped = ref[key]["skipped"].get<std::vector<int>>();
    const auto fp32 = ref.at("fp32_20").get<std::vector<double>>();
    ASSERT_EQ(fp32.size(), want.size());
    // The horizon: the steps before PyTorch's AMP leaves PyTorch's fp32 by more than 5% (a step
    // PyTorch's scaler skipped repeats the loss before it and is compared with that).
    // It ends too where PyTorch's CPU autocast (a second implementation of the same semantics,
    // amp_fp16_cpu/amp_bf16_cpu) leaves its CUDA autocast by more than 5%: past that step no third
    // implementation can be held to 5% of either.
    std::vector<double> other;
    if (ref.contains(key + "_cpu") && ref[key + "_cpu"].contains("loss")) other = ref[key + "_cpu"]["loss"].get<std::vector<double>>();
    size_t horizon = 0;
    for (size_t i = 0, done = 0; i < want.size(); ++i) {
      done += i > 0 && wantSkipped[i - 1] == 0;
      if (rel(want[i], fp32[std::min(done, fp32.size() - 1)]) > 0.05) break;
      if (i < other.size() && rel(other[i], want[i]) > 0.05) break;
      horizon = i + 1;
    }
    // The AMP references run at amp_lr where make_zoo.py --amp-lr chose one (a learning rate at
    // which PyTorch's own AMP runs agree to 2%), else at the 3-step test's.
    const std::string m = train(c, t, p, static_cast<int>(want.size()), ref.contains("amp_lr") ? "amp_lr" : "sgd_lr");
    const auto got = metric(m, "loss"), skipped = metric(m, "skipped");
    ASSERT_EQ(got.size(), want.size()) << p;
    std::string why;
    double worst = 0;
    for (size_t i = 0; i < horizon; ++i) {
      worst = std::max(worst, rel(got[i], want[i]));
      if (rel(got[i], want[i]) >= 0.05 && why.empty())
        why = "step " + std::to_string(i + 1) + ": " + std::to_string(got[i]) + " vs PyTorch AMP " + std::to_string(want[i]);
    }
    if (horizon < 3) why += (why.empty() ? "" : "; ") + std::string("PyTorch's own AMP leaves its fp32 run, or its CPU autocast, within 2 steps");
    int ours = 0, theirs = 0;
    for (double x : skipped) ours += x != 0;
    for (int x : wantSkipped) theirs += x != 0;
    if (std::abs(ours - theirs) > 1) why += (why.empty() ? "" : "; ") + ("skipped " + std::to_string(ours) + " steps, PyTorch " + std::to_string(theirs));
    double after = 0;
    for (size_t i = horizon; i < want.size(); ++i) after = std::max(after, rel(got[i], want[i]));
    std::printf("%s.%s %s (lr %g): steps 1-%zu of %zu within %.2e of PyTorch AMP (after: %.2e), skipped %d (PyTorch %d)%s\n",
                c.family.c_str(), c.exporter.c_str(), p, ref.value("amp_lr", ref.at("sgd_lr").get<double>()), horizon, want.size(), worst,
                after, ours, theirs, why.empty() ? "" : (": " + why).c_str());
    const std::string name = c.family + "." + c.exporter + " " + p;
    auto listed = expected.find(name + "@" + envOr("AMPC_ZOO_DEVICE", "cpu"));
    if (listed == expected.end()) listed = expected.find(name);
    if (listed == expected.end()) EXPECT_TRUE(why.empty()) << p << ": " << why;
    else EXPECT_FALSE(why.empty()) << p << " passes but models/zoo/expectations.txt lists it (" << listed->second << "): remove the line";
  }
  EXPECT_GT(checked, 0) << "ref.json has no AMP reference";
}

INSTANTIATE_TEST_SUITE_P(Models, Zoo, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.family + "_" + i.param.exporter; });

TEST(ZooSuite, HasEveryFamily) {
  // The suite is found on disk; a lost folder must not pass silently.
  std::set<std::string> families;
  for (const auto& c : cases()) families.insert(c.family);
  for (const char* f : {"bert", "convnext", "distilbert", "efficientnet", "gemma", "gpt2", "llama", "qwen2", "resnet_timm", "resnet_tv", "t5"})
    EXPECT_TRUE(families.count(f)) << "models/zoo/" << f << " is missing";
}
