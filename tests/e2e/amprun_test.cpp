// ampc plans and amprun end to end: digits trained at fp32, fp16 and bf16; a stopped and resumed
// run equal to an uninterrupted one; a truncated checkpoint refused; bad data refused before the
// first step; a newer plan refused; the dynamic scaler in the metrics file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <regex>

#include <onnx/onnx_pb.h>

#include "compiler/onnx/onnx.h"
#include "runtime/npy.h"
#include "runtime/plan.h"
#include "runtime/hash.h"
#include "runtime/plan.pb.h"
#include "runtime/safetensors.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;
namespace fs = std::filesystem;

namespace {

const std::string kAmpc = AMPC_BIN;
const std::string kAmprunBin = std::string(AMPC_BINARY_DIR) + "/tools/amprun";
// These tests check the CPU reference's behaviour (bitwise resume, exact scaler schedules): pinned to
// --device cpu, also where a GPU would make cuda the default.
const std::string kAmprun = kAmprunBin + " --device cpu";

bool gpuPresent() { return std::system("nvidia-smi -L > /dev/null 2>&1") == 0; }
const std::string kDigits = std::string(AMPC_SOURCE_DIR) + "/models/digits";

std::string makePlan(const TempDir& d, const std::string& precision, const std::string& flags = "--optimizer sgd --lr 0.1 --momentum 0.9") {
  const std::string p = d.file("digits_" + precision + ".ampplan");
  auto r = run(kAmpc + " " + kDigits + ".onnx --precision " + precision + " " + flags + " -o " + p);
  EXPECT_EQ(r.code, 0) << r.out;
  return p;
}

// d/data: the digits' training targets with these inputs x.
void writeDigitsWith(const TempDir& d, const Tensor& x) {
  fs::create_directories(d.path / "data");
  writeNpy(d.file("data/x.npy"), x);
  fs::copy(kDigits + "/train/target.npy", d.file("data/target.npy"), fs::copy_options::overwrite_existing);
}

double accuracy(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(R"(accuracy ([0-9.]+)%)"))) return -1;
  return std::stod(m[1]);
}

// The metrics lines without step_ms (timing differs between runs).
std::vector<std::string> metricsWithoutTime(const std::string& path) {
  std::vector<std::string> r;
  std::istringstream in(readBytes(path));
  for (std::string l; std::getline(in, l);) r.push_back(std::regex_replace(l, std::regex(R"(, "step_ms": [0-9.]+)"), ""));
  return r;
}

}  // namespace

TEST(Amprun, DigitsAmpMatchesFp32) {
  TempDir d;
  std::map<std::string, double> acc;
  for (const char* p : {"fp32", "fp16", "bf16"}) {
    auto r = run(kAmprun + " " + makePlan(d, p) + " --data " + kDigits + "/train --shuffle --seed 1 --steps 400 --eval-data " + kDigits + "/test");
    ASSERT_EQ(r.code, 0) << r.out;
    acc[p] = accuracy(r.out);
    std::printf("digits %s: test accuracy %.2f%%\n", p, acc[p]);
  }
  EXPECT_GT(acc["fp32"], 90.0);
  EXPECT_LE(std::fabs(acc["fp16"] - acc["fp32"]), 0.5);
  EXPECT_LE(std::fabs(acc["bf16"] - acc["fp32"]), 0.5);
}

namespace {

// A two-layer classifier of the digits exported without its loss (x [batch, 64] -> logits [batch, 10],
// as torch.onnx.export(model, x) writes it), its weights drawn with a fixed seed, at d/name.
std::string classifierWithoutLoss(const TempDir& d, const std::string& name, int64_t batch) {
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {batch, 64});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto weights = [&](const std::string& w, std::vector<int64_t> dims, float scale) {
    std::vector<float> v(static_cast<size_t>(dims[0] * (dims.size() > 1 ? dims[1] : 1)));
    for (float& e : v) e = normal(rng) * scale;
    addFloatInit(g, w, dims, v);
  };
  weights("w1", {48, 64}, 0.125f);
  weights("b1", {48}, 0.0f);
  weights("w2", {10, 48}, 0.144f);
  weights("b2", {10}, 0.0f);
  auto* fc1 = addNode(g, "Gemm", {"x", "w1", "b1"}, {"h"}, "fc1");
  auto* t1 = fc1->add_attribute();
  t1->set_name("transB");
  t1->set_type(onnx::AttributeProto::INT);
  t1->set_i(1);
  addNode(g, "Relu", {"h"}, {"r"}, "relu");
  auto* fc2 = addNode(g, "Gemm", {"r", "w2", "b2"}, {"logits"}, "fc2");
  fc2->add_attribute()->CopyFrom(*t1);
  addOutput(g, "logits");
  const std::string path = d.file(name);
  writeModel(path, m);
  return path;
}

}  // namespace

// A classifier exported without its loss (x -> logits, as torch.onnx.export(model, x) writes it):
// `ampc --loss cross-entropy` attaches F.cross_entropy against a new input `target`, and the plan
// trains on the digits to the accuracy the exported-with-loss model reaches; `ampc` without --loss
// names the problem. The same model at bf16 trains as well.
TEST(Amprun, ModelWithoutItsLossTrainsWithAttachedCrossEntropy) {
  TempDir d;
  const std::string model = classifierWithoutLoss(d, "noloss.onnx", 64);
  auto r = run(kAmpc + " " + model + " -o " + d.file("plain.ampplan"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("must be a scalar float loss"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.file("plain.ampplan")));
  r = run(kAmpc + " " + model + " --loss hinge -o " + d.file("bad.ampplan"));
  EXPECT_EQ(r.code, 2) << r.out;
  for (const char* p : {"fp32", "bf16"}) {
    const std::string plan = d.file(std::string("ce_") + p + ".ampplan");
    r = run(kAmpc + " " + model + " --loss cross-entropy --precision " + p + " --optimizer sgd --lr 0.1 --momentum 0.9 -o " + plan);
    ASSERT_EQ(r.code, 0) << r.out;
    r = run(kAmprun + " " + plan + " --data " + kDigits + "/train --shuffle --seed 1 --steps 400 --eval-data " + kDigits + "/test");
    ASSERT_EQ(r.code, 0) << r.out;
    std::printf("digits without a loss, %s, cross-entropy attached: test accuracy %.2f%%\n", p, accuracy(r.out));
    EXPECT_GT(accuracy(r.out), 90.0) << r.out;
  }
}

namespace {

// The numbers of a metrics line: loss, loss_scale, grad_norm, and whether the step was skipped.
struct StepMetrics {
  double loss = 0, scale = 0, norm = 0;
  bool skipped = false;
};
std::vector<StepMetrics> readMetrics(const std::string& path) {
  std::vector<StepMetrics> r;
  std::istringstream in(readBytes(path));
  const std::regex re(R"re("loss": ([^,]+), "loss_scale": ([^,]+), "skipped": (true|false), "grad_norm": ([^,]+),)re");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (!std::regex_search(l, m, re)) {
      ADD_FAILURE() << "not a metrics line: " << l;
      continue;
    }
    auto num = [](const std::string& v) { return v.front() == '"' ? (v.find("Infinity") != std::string::npos ? (v[1] == '-' ? -INFINITY : INFINITY) : NAN) : std::stod(v); };
    r.push_back({num(m[1]), num(m[2]), num(m[4]), m[3] == "true"});
  }
  return r;
}

}  // namespace

// Gradient accumulation (ampc --accumulate N): a step of N micro-batches of B samples trains as one
// step on the N * B samples together (the mean gradient over the window; the reported loss the mean of
// the micro-batches'), for SGD with momentum and for AdamW with clipping: the same losses, norms and
// weights, in f32, as the plan compiled for the whole batch. In fp16 the loss scale moves once a step:
// an Inf in the window's second micro-batch skips the whole step and halves the scale once, and
// --growth-interval counts steps, not micro-batches, as the whole-batch plan does. A run stopped at a
// checkpoint and resumed equals the uninterrupted one.
TEST(Amprun, AccumulatedMicroBatchesTrainAsTheirWholeBatch) {
  TempDir d;
  const std::string micro = classifierWithoutLoss(d, "b32.onnx", 32), whole = classifierWithoutLoss(d, "b64.onnx", 64);
  auto compile = [&](const std::string& model, const std::string& flags, const std::string& plan) {
    auto r = run(kAmpc + " " + model + " --loss cross-entropy " + flags + " -o " + d.file(plan));
    EXPECT_EQ(r.code, 0) << r.out;
    return d.file(plan);
  };
  auto train = [&](const std::string& plan, const std::string& data, const std::string& tag, int steps, const std::string& more = "") {
    auto r = run(kAmprun + " " + plan + " --data " + data + " --steps " + std::to_string(steps) + " --metrics " + d.file(tag + ".jsonl") +
                 " --save " + d.file(tag + ".safetensors") + more);
    EXPECT_EQ(r.code, 0) << r.out;
    return readMetrics(d.file(tag + ".jsonl"));
  };
  int k = 0;
  for (const std::string opt : {"--optimizer sgd --lr 0.1 --momentum 0.9", "--optimizer adamw --lr 0.01 --clip-norm 0.5"}) {
    const std::string tag = std::to_string(k++);
    const std::string a = compile(micro, "--precision fp32 " + opt + " --accumulate 2", "acc" + tag + ".ampplan");
    const std::string b = compile(whole, "--precision fp32 " + opt, "whole" + tag + ".ampplan");
    EXPECT_NE(run(kAmprun + " " + a + " --dump").out.find("batch 32 x 2 micro-batches a step"), std::string::npos);
    const auto ma = train(a, kDigits + "/train", "acc" + tag, 6), mb = train(b, kDigits + "/train", "whole" + tag, 6);
    ASSERT_EQ(ma.size(), 6u);
    ASSERT_EQ(mb.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_NEAR(ma[i].loss, mb[i].loss, 1e-5 * std::fabs(mb[i].loss)) << opt << ", step " << i + 1;
      EXPECT_NEAR(ma[i].norm, mb[i].norm, 1e-5 * std::fabs(mb[i].norm)) << opt << ", step " << i + 1;
      EXPECT_FALSE(ma[i].skipped);
    }
    EXPECT_LT(ma[5].loss, ma[0].loss - 0.1) << opt << ": it trains";
    const Safetensors wa = readSafetensors(d.file("acc" + tag + ".safetensors")), wb = readSafetensors(d.file("whole" + tag + ".safetensors"));
    for (const char* w : {"w1", "b1", "w2", "b2"}) {
      const Tensor &x = wa.tensors.at(w), &y = wb.tensors.at(w);
      double diff = 0, big = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        diff = std::max(diff, std::fabs(x.getDouble(i) - y.getDouble(i)));
        big = std::max(big, std::fabs(y.getDouble(i)));
      }
      EXPECT_LE(diff, 1e-5 * big) << opt << ": " << w;
    }
  }
  // fp16, dynamic scale: an Inf in sample 100, the second micro-batch of step 2 (no shuffle).
  fs::create_directories(d.path / "inf");
  Tensor x = readNpy(kDigits + "/train/x.npy");
  x.setDouble(100 * 64 + 7, INFINITY);
  writeNpy(d.file("inf/x.npy"), x);
  fs::copy(kDigits + "/train/target.npy", d.file("inf/target.npy"));
  const std::string scaler = "--precision fp16 --optimizer sgd --lr 0.1 --init-scale 1024 --growth-interval 2 --max-scale 4096";
  const std::string a = compile(micro, scaler + " --accumulate 2", "acc16.ampplan"), b = compile(whole, scaler, "whole16.ampplan");
  const auto ma = train(a, d.file("inf"), "acc16", 6), mb = train(b, d.file("inf"), "whole16", 6);
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  const std::vector<std::pair<double, bool>> want = {{1024, false}, {1024, true}, {512, false}, {512, false}, {1024, false}, {1024, false}};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(ma[i].scale, want[i].first) << "step " << i + 1;
    EXPECT_EQ(ma[i].skipped, want[i].second) << "step " << i + 1;
    EXPECT_EQ(mb[i].scale, want[i].first) << "step " << i + 1;
    EXPECT_EQ(mb[i].skipped, want[i].second) << "step " << i + 1;
    if (!want[i].second) {
      EXPECT_NEAR(ma[i].loss, mb[i].loss, 2e-3 * std::fabs(mb[i].loss)) << "fp16, step " << i + 1;
    }
  }
  // Stopped at step 2 and resumed: the same metrics and weights as 6 steps in one run.
  const std::string p = d.file("acc1.ampplan");
  train(p, kDigits + "/train", "part", 2, " --checkpoint " + d.file("ckpt") + " --checkpoint-every 2");
  const auto resumed = train(p, kDigits + "/train", "part", 6, " --resume " + d.file("ckpt"));
  const auto whole6 = readMetrics(d.file("acc1.jsonl"));
  ASSERT_EQ(resumed.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(resumed[i].loss, whole6[i].loss) << "step " << i + 1;
  EXPECT_EQ(readBytes(d.file("part.safetensors")), readBytes(d.file("acc1.safetensors")));
  // The counter and accumulators are state: a bad count is refused.
  auto r = run(kAmpc + " " + micro + " --loss cross-entropy --accumulate 0 -o " + d.file("bad.ampplan"));
  EXPECT_NE(r.code, 0);
  EXPECT_FALSE(fs::exists(d.file("bad.ampplan")));
}

// --no-decay: the parameters it names get no weight decay, as PyTorch's parameter groups leave them
// out. One SGD step on the digits' first batch against its definition, from ampc --grad's gradients
// of the same batch: p - lr (g + wd p) for a decayed parameter, p - lr g for the others; "1d" spares
// the biases, a regex what it matches.
TEST(Amprun, NoDecaySparesTheParametersItNames) {
  TempDir d;
  fs::create_directories(d.path / "batch");
  const Tensor x = readNpy(kDigits + "/train/x.npy"), t = readNpy(kDigits + "/train/target.npy");
  auto firstRows = [](const Tensor& all, int64_t rows) {
    TensorType type = all.type;
    type.shape[0] = rows;
    Tensor r(type);
    std::memcpy(r.data.data(), all.data.data(), r.data.size());
    return r;
  };
  writeNpy(d.file("batch/x.npy"), firstRows(x, 64));
  writeNpy(d.file("batch/target.npy"), firstRows(t, 64));
  auto r = run(kAmpc + " " + kDigits + ".onnx --grad --eval --inputs " + d.file("batch") + " --outputs " + d.file("grads"));
  ASSERT_EQ(r.code, 0) << r.out;
  const double lr = 0.1, wd = 0.5;
  for (const std::string spec : {"1d", ".*fc2.*"}) {
    const std::string plan = makePlan(d, "fp32", "--optimizer sgd --lr 0.1 --weight-decay 0.5 --no-decay '" + spec + "'");
    EXPECT_NE(run(kAmprun + " " + plan + " --dump").out.find("weight decay 0.5 (none for " + spec + ")"), std::string::npos);
    ASSERT_EQ(run(kAmprun + " " + plan + " --data " + d.file("batch") + " --steps 0 --save " + d.file("before.safetensors")).code, 0);
    r = run(kAmprun + " " + plan + " --data " + d.file("batch") + " --steps 1 --save " + d.file("after.safetensors"));
    ASSERT_EQ(r.code, 0) << r.out;
    const Safetensors before = readSafetensors(d.file("before.safetensors")), after = readSafetensors(d.file("after.safetensors"));
    int decayed = 0, spared = 0;
    for (const auto& [name, p0] : before.tensors) {
      if (!fs::exists(d.file("grads/" + name + "_grad.npy"))) continue;  // not trained
      const Tensor g = readNpy(d.file("grads/" + name + "_grad.npy"));
      const bool decays = spec == "1d" ? p0.type.rank() >= 2 : name.find("fc2") == std::string::npos;
      ++(decays ? decayed : spared);
      const Tensor& p1 = after.tensors.at(name);
      double err = 0, scale = 0;
      for (int64_t i = 0; i < p0.numel(); ++i) {
        const double want = p0.getDouble(i) - lr * (g.getDouble(i) + (decays ? wd * p0.getDouble(i) : 0.0));
        err = std::max(err, std::fabs(p1.getDouble(i) - want));
        scale = std::max(scale, std::fabs(want));
      }
      EXPECT_LE(err, 1e-6 * scale) << spec << ": " << name << (decays ? " (decays)" : " (spared)");
    }
    EXPECT_EQ(decayed, 2) << spec;
    EXPECT_EQ(spared, 2) << spec;
  }
  r = run(kAmpc + " " + kDigits + ".onnx --weight-decay 0.1 --no-decay '(' -o " + d.file("bad.ampplan"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--no-decay: bad regex"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.file("bad.ampplan")));
}

// --eval-every N: the held-out loss and accuracy after every N steps, each equal to what a run that
// stops there reports at its end; the training itself is unchanged by it.
TEST(Amprun, EvalEveryReportsWhatARunStoppedThereWould) {
  TempDir d;
  const std::string p = makePlan(d, "fp32");
  const std::string common = " --data " + kDigits + "/train --shuffle --seed 2 --eval-data " + kDigits + "/test";
  auto r = run(kAmprun + " " + p + common + " --steps 30 --eval-every 10 --save " + d.file("every.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> lines;
  const std::regex re("eval on [^ ]+ after step ([0-9]+): (loss [0-9.]+, accuracy [0-9.]+%)");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), re), end; it != end; ++it) lines.push_back((*it)[1].str() + " " + (*it)[2].str());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (int s : {10, 20, 30}) {
    auto one = run(kAmprun + " " + p + common + " --steps " + std::to_string(s) + (s == 30 ? " --save " + d.file("once.safetensors") : ""));
    ASSERT_EQ(one.code, 0) << one.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(one.out, m, std::regex("eval on [^ ]+: (loss [0-9.]+, accuracy [0-9.]+%)"))) << one.out;
    EXPECT_EQ(lines[s / 10 - 1], std::to_string(s) + " " + m[1].str());
  }
  EXPECT_NE(lines[0], lines[2]);  // it trains between them
  EXPECT_EQ(readBytes(d.file("every.safetensors")), readBytes(d.file("once.safetensors")));
  EXPECT_EQ(run(kAmprun + " " + p + " --data " + kDigits + "/train --steps 3 --eval-every 2").code, 2);
}

// --save-onnx: the source model with the trained parameters in its initializers, for any ONNX runtime.
// Its weights are --save's, bit for bit; compiled again, it evaluates to what the run reported. A
// source whose weights are external data (in its own folder) is written whole elsewhere, the frozen
// initializer's data carried along; a source that is gone is named.
TEST(Amprun, SaveOnnxWritesTheTrainedModel) {
  TempDir d;
  // The digits classifier exported without its loss, its first layer's weights as external data.
  const std::string inline_ = classifierWithoutLoss(d, "noloss.onnx", 64);
  onnx::ModelProto m;
  ASSERT_TRUE(m.ParseFromString(readBytes(inline_)));
  fs::create_directories(d.path / "src");
  for (auto& t : *m.mutable_graph()->mutable_initializer())
    if (t.name() == "w1") {
      writeBytes(d.file("src/w1.bin"), t.raw_data().empty() ? std::string(reinterpret_cast<const char*>(t.float_data().data()),
                                                                           t.float_data().size() * sizeof(float))
                                                            : t.raw_data());
      t.clear_raw_data();
      t.clear_float_data();
      t.set_data_location(onnx::TensorProto::EXTERNAL);
      auto* e = t.add_external_data();
      e->set_key("location");
      e->set_value("w1.bin");
    }
  // A frozen initializer beside them (a scale the graph multiplies the logits by), also external.
  const std::vector<float> one(10, 1.0f);
  writeBytes(d.file("src/scale.bin"), std::string(reinterpret_cast<const char*>(one.data()), one.size() * sizeof(float)));
  addExternalInit(m.mutable_graph(), "scale", {10}, "scale.bin");
  m.mutable_graph()->mutable_output(0)->set_name("logits_raw");
  for (auto& n : *m.mutable_graph()->mutable_node())
    for (auto& o : *n.mutable_output())
      if (o == "logits") o = "logits_raw";
  addNode(m.mutable_graph(), "Mul", {"logits_raw", "scale"}, {"logits"}, "scale_logits");
  m.mutable_graph()->mutable_output(0)->set_name("logits");
  const std::string model = d.file("src/model.onnx");
  writeModel(model, m);
  const std::string plan = d.file("p.ampplan");
  auto r = run(kAmpc + " " + model + " --loss cross-entropy --freeze scale --precision fp32 --optimizer sgd --lr 0.1 -o " + plan);
  ASSERT_EQ(r.code, 0) << r.out;
  fs::create_directories(d.path / "out");
  r = run("cd " + d.file("out") + " && " + kAmprun + " " + plan + " --data " + kDigits + "/train --steps 30 --save w.safetensors --save-onnx trained.onnx --eval-data " +
          kDigits + "/test");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(4 of " + model + "'s initializers trained)"), std::string::npos) << r.out;
  std::smatch ev;
  ASSERT_TRUE(std::regex_search(r.out, ev, std::regex("eval on [^ ]+: (loss [0-9.]+, accuracy [0-9.]+%)"))) << r.out;
  // The weights, bit for bit, and the frozen one as it was.
  auto g = importOnnxFile(d.file("out/trained.onnx"));
  const Safetensors w = readSafetensors(d.file("out/w.safetensors"));
  for (const char* name : {"w1", "b1", "w2", "b2"}) {
    const Value* v = g->lookup(name);
    ASSERT_TRUE(v && v->data()) << name;
    EXPECT_EQ(v->data()->data.size(), w.tensors.at(name).data.size()) << name;
    EXPECT_EQ(std::memcmp(v->data()->data.data(), w.tensors.at(name).data.data(), v->data()->data.size()), 0) << name;
  }
  ASSERT_TRUE(g->lookup("scale") && g->lookup("scale")->data());
  EXPECT_EQ(g->lookup("scale")->data()->getDouble(9), 1.0);
  // Compiled again (with the same loss), it evaluates as the run did at its end.
  r = run(kAmpc + " " + d.file("out/trained.onnx") + " --loss cross-entropy --freeze scale --precision fp32 -o " + d.file("again.ampplan"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " " + d.file("again.ampplan") + " --data " + kDigits + "/train --steps 0 --eval-data " + kDigits + "/test");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(ev[1].str()), std::string::npos) << r.out;
  // A trained value the model has no initializer for is named, not dropped; a shape that differs too.
  const Tensor bogus = Tensor::fromDoubles(DType::f32, {2}, {1, 2});
  try {
    writeOnnxWithWeights(d.file("out/trained.onnx"), {{"w1", w.tensors.count("w1") ? &w.tensors.at("w1") : nullptr}, {"nope", &bogus}}, d.file("x.onnx"));
    ADD_FAILURE() << "no error for a weight the model lacks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope' was trained but is no initializer of this model"), std::string::npos) << e.what();
  }
  try {
    writeOnnxWithWeights(d.file("out/trained.onnx"), {{"b1", &bogus}}, d.file("x.onnx"));
    ADD_FAILURE() << "no error for a shape that differs";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("initializer 'b1' is f32[48], the trained value f32[2]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(d.file("x.onnx")));
  // Past the inline limit (1.5 GiB; here 0 bytes) every initializer goes to PATH.data beside it.
  std::map<std::string, const Tensor*> all;
  for (const auto& [name, t] : w.tensors) all.emplace(name, &t);
  fs::create_directories(d.path / "ext");
  EXPECT_EQ(writeOnnxWithWeights(d.file("out/trained.onnx"), all, d.file("ext/big.onnx"), 0), static_cast<int64_t>(all.size()));
  EXPECT_TRUE(fs::exists(d.file("ext/big.onnx.data")));
  EXPECT_LT(fs::file_size(d.file("ext/big.onnx")), 4096u);  // the structure alone
  auto big = importOnnxFile(d.file("ext/big.onnx"));
  for (const char* name : {"w1", "b1", "w2", "b2", "scale"})
    EXPECT_EQ(big->lookup(name)->data()->data, g->lookup(name)->data()->data) << name;
  // The source gone: named, and nothing written.
  fs::remove_all(d.path / "src");
  r = run(kAmprun + " " + plan + " --data " + kDigits + "/train --steps 1 --save-onnx " + d.file("none.onnx"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model.onnx: the model the plan was compiled from is not there"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.file("none.onnx")));
}

// ampc --ema DECAY: the moving average of the parameters, ema_k = decay ema_(k-1) + (1 - decay) p_k
// from ema_0 = p_0, against the weights of runs stopped at each step (fp32, SGD with momentum, so
// the weights differ every step); --save-ema writes it as safetensors or into the source model; a
// plan without one is refused by name. The live weights are the plan's without --ema.
TEST(Amprun, EmaAveragesTheParametersStepByStep) {
  TempDir d;
  const double decay = 0.75;
  const std::string with = d.file("ema.ampplan"), without = makePlan(d, "fp32", "--optimizer sgd --lr 0.1 --momentum 0.9");
  ASSERT_EQ(run(kAmpc + " " + kDigits + ".onnx --precision fp32 --optimizer sgd --lr 0.1 --momentum 0.9 --ema 0.75 -o " + with).code, 0);
  const std::string data = " --data " + kDigits + "/train --shuffle --seed 4";
  const int steps = 4;
  std::vector<Safetensors> p;
  for (int k = 0; k <= steps; ++k) {
    auto r = run(kAmprun + " " + without + data + " --steps " + std::to_string(k) + " --save " + d.file("p.safetensors"));
    ASSERT_EQ(r.code, 0) << r.out;
    p.push_back(readSafetensors(d.file("p.safetensors")));
  }
  auto r = run(kAmprun + " " + with + data + " --steps " + std::to_string(steps) + " --save " + d.file("live.safetensors") + " --save-ema " +
               d.file("ema.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " " + with + data + " --steps " + std::to_string(steps) + " --save-ema " + d.file("ema.onnx"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(readBytes(d.file("live.safetensors")), readBytes(d.file("p.safetensors")));  // the same training
  const Safetensors ema = readSafetensors(d.file("ema.safetensors"));
  auto g = importOnnxFile(d.file("ema.onnx"));
  int checked = 0;
  for (const auto& [name, t] : p[0].tensors) {
    if (!isFloat(t.type.dtype) || std::equal(t.data.begin(), t.data.end(), p[steps].tensors.at(name).data.begin())) continue;  // not trained
    ++checked;
    double err = 0, scale = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double e = t.getDouble(i);
      for (int k = 1; k <= steps; ++k) e = decay * e + (1 - decay) * p[static_cast<size_t>(k)].tensors.at(name).getDouble(i);
      err = std::max(err, std::fabs(ema.tensors.at(name).getDouble(i) - e));
      scale = std::max(scale, std::fabs(e));
    }
    EXPECT_LE(err, 1e-6 * scale) << name;
    EXPECT_EQ(g->lookup(name)->data()->data, ema.tensors.at(name).data) << name << ": the .onnx holds the same average";
  }
  EXPECT_EQ(checked, 4);
  r = run(kAmprun + " " + without + data + " --steps 1 --save-ema " + d.file("none.safetensors"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--save-ema, but the plan keeps no moving average"), std::string::npos) << r.out;
  EXPECT_EQ(run(kAmpc + " " + kDigits + ".onnx --ema 1.5 -o " + d.file("bad.ampplan")).code, 1);
}

TEST(Amprun, ResumeEqualsAnUninterruptedRun) {
  TempDir d;
  const std::string p = makePlan(d, "fp16", "--optimizer adamw --lr 0.003 --clip-norm 1.0");
  const std::string common = " --data " + kDigits + "/train --shuffle --seed 3";
  auto a = run(kAmprun + " " + p + common + " --steps 20 --metrics " + d.file("a.jsonl") + " --save " + d.file("a.safetensors"));
  ASSERT_EQ(a.code, 0) << a.out;
  auto b1 = run(kAmprun + " " + p + common + " --steps 10 --metrics " + d.file("b.jsonl") + " --checkpoint " + d.file("ckpt") + " --checkpoint-every 5");
  ASSERT_EQ(b1.code, 0) << b1.out;
  EXPECT_TRUE(fs::exists(d.file("ckpt/ckpt-00000005.safetensors")));
  EXPECT_TRUE(fs::exists(d.file("ckpt/ckpt-00000010.safetensors")));
  auto b2 = run(kAmprun + " " + p + common + " --steps 20 --metrics " + d.file("b.jsonl") + " --resume " + d.file("ckpt") + " --save " + d.file("b.safetensors"));
  ASSERT_EQ(b2.code, 0) << b2.out;
  const auto ma = metricsWithoutTime(d.file("a.jsonl")), mb = metricsWithoutTime(d.file("b.jsonl"));
  ASSERT_EQ(ma.size(), 20u);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(readBytes(d.file("a.safetensors")), readBytes(d.file("b.safetensors")));

  // A truncated checkpoint named as a file is refused. The folder's newest one truncated: the run
  // falls back to the previous checkpoint, says so naming both, and still ends where the
  // uninterrupted run ends, its metrics file too.
  const std::string last = d.file("ckpt/ckpt-00000010.safetensors");
  const std::string bytes = readBytes(last);
  writeBytes(last, bytes.substr(0, bytes.size() / 2));
  auto bad = run(kAmprun + " " + p + common + " --steps 20 --resume " + last);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("ckpt-00000010.safetensors"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("truncated"), std::string::npos) << bad.out;
  auto prev = run(kAmprun + " " + p + common + " --steps 20 --metrics " + d.file("b.jsonl") + " --resume " + d.file("ckpt") + " --save " +
                  d.file("c.safetensors"));
  EXPECT_EQ(prev.code, 0) << prev.out;
  EXPECT_NE(prev.out.find("ckpt-00000010.safetensors"), std::string::npos) << prev.out;
  EXPECT_NE(prev.out.find("resuming from the previous checkpoint"), std::string::npos) << prev.out;
  EXPECT_NE(prev.out.find("ckpt-00000005.safetensors"), std::string::npos) << prev.out;
  EXPECT_EQ(readBytes(d.file("c.safetensors")), readBytes(d.file("a.safetensors")));
  EXPECT_EQ(metricsWithoutTime(d.file("b.jsonl")), ma);
  // Nothing to resume from yet says so.
  auto none = run(kAmprun + " " + p + common + " --steps 2 --resume " + d.file("never"));
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find("no checkpoint yet"), std::string::npos) << none.out;
}

// Inf in the data: --check-data names the sample before step 1; without it, the collapse guard
// stops the run after --max-skipped overflow-skipped steps in a row, pointing at both tools.
TEST(Amprun, NonFiniteDataIsNamed) {
  TempDir d;
  Tensor x = readNpy(kDigits + "/train/x.npy");
  x.setDouble(64 * 37 + 5, INFINITY);  // sample 37, element 5
  writeDigitsWith(d, x);
  const std::string p = makePlan(d, "fp16");
  auto r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 5 --check-data");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("input 'x' sample 37 (element 5: inf) is not finite"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
  for (int64_t i = 0; i < x.numel(); i += 64) x.setDouble(i, NAN);  // every sample: every step overflows
  writeNpy(d.file("data/x.npy"), x);
  r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 100 --max-skipped 8 --metrics " + d.file("m.jsonl"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step 8: 8 steps in a row were skipped"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--explain-overflow"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.file("m.jsonl"))) << "a failed run left its metrics file";
  // --min-scale: each step reports the scale it ran with, 65536 at step 1, halved by each skip: 512 at step 8.
  r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 100 --max-skipped 0 --min-scale 1000");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step 8: the loss scale fell to 512, below --min-scale 1000"), std::string::npos) << r.out;
  EXPECT_EQ(run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 12 --max-skipped 0").code, 0);
}

// A resumed run that fails leaves the metrics file with its checkpoint's lines, as it found them.
TEST(Amprun, FailedResumeKeepsTheCheckpointsMetrics) {
  TempDir d;
  writeDigitsWith(d, readNpy(kDigits + "/train/x.npy"));
  const std::string p = makePlan(d, "fp16");
  const std::string common = " --data " + d.file("data") + " --metrics " + d.file("m.jsonl") + " --checkpoint " + d.file("ck") + " --checkpoint-every 4";
  ASSERT_EQ(run(kAmprun + " " + p + common + " --steps 4").code, 0);
  const std::string before = readBytes(d.file("m.jsonl"));
  ASSERT_FALSE(before.empty());
  Tensor x = readNpy(kDigits + "/train/x.npy");
  for (int64_t i = 0; i < x.numel(); i += 64) x.setDouble(i, NAN);
  writeNpy(d.file("data/x.npy"), x);
  auto r = run(kAmprun + " " + p + common + " --steps 40 --max-skipped 3 --resume " + d.file("ck"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("step 7: 3 steps in a row were skipped"), std::string::npos) << r.out;
  EXPECT_EQ(readBytes(d.file("m.jsonl")), before);
}

// A checkpoint's metadata is not trusted: a negative or out-of-range data position, a step that is
// not a whole integer, another run's seed, or a `latest` that leaves the folder is refused before a
// step runs, naming the file (these crashed or resumed wrongly before); a flipped tensor byte fails
// that tensor's hash.
TEST(Amprun, CheckpointMetadataIsRangeChecked) {
  TempDir d;
  const std::string p = makePlan(d, "fp32");
  const std::string common = " --data " + kDigits + "/train --shuffle --seed 3";
  ASSERT_EQ(run(kAmprun + " " + p + common + " --steps 4 --checkpoint " + d.file("ck") + " --checkpoint-every 4").code, 0);
  const std::string good = d.file("ck/ckpt-00000004.safetensors");
  const Safetensors orig = readSafetensors(good);
  auto expectRefused = [&](const std::string& key, const std::string& value, const std::string& want) {
    SCOPED_TRACE(key + " = " + value);
    Safetensors st = orig;
    st.metadata[key] = value;
    writeSafetensors(d.file("bad.safetensors"), st);
    auto r = run(kAmprun + " " + p + common + " --steps 8 --resume " + d.file("bad.safetensors"));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 5"), std::string::npos) << "a step ran: " << r.out;
  };
  expectRefused("data_index", "-300", "data_index = '-300' is not an integer in [0,");
  expectRefused("data_index", "100000", "is outside the data");
  expectRefused("data_epoch", "-1", "data_epoch = '-1'");
  expectRefused("step", "12abc", "step = '12abc'");
  expectRefused("seed", "4", "written by a run with --seed 4; this run has --seed 3");
  writeBytes(d.file("ck/latest"), "../bad.safetensors\n");
  auto r = run(kAmprun + " " + p + common + " --steps 8 --resume " + d.file("ck"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not a checkpoint file in this folder"), std::string::npos) << r.out;
  std::string bytes = readBytes(good);
  bytes[bytes.size() - 3] ^= 0x20;
  writeBytes(d.file("flip.safetensors"), bytes);
  r = run(kAmprun + " " + p + common + " --steps 8 --resume " + d.file("flip.safetensors"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is corrupt"), std::string::npos) << r.out;
  EXPECT_EQ(run(kAmprun + " " + p + common + " --steps 8 --resume " + good).code, 0);  // the original still resumes
}

// The step's counters in a checkpoint are range-checked too (a tensor rewritten with a valid hash):
// ampc.step past the checkpoint's step, a growth tracker at the end of int64 (it would wrap at the
// next clean step), a negative hysteresis budget, a non-finite loss scale.
TEST(Amprun, CheckpointCountersAreRangeChecked) {
  TempDir d;
  const std::string p = makePlan(d, "fp16", "--optimizer sgd --lr 0.1 --growth-interval 100");
  const std::string common = " --data " + kDigits + "/train";
  ASSERT_EQ(run(kAmprun + " " + p + common + " --steps 4 --checkpoint " + d.file("ck") + " --checkpoint-every 4").code, 0);
  const Safetensors orig = readSafetensors(d.file("ck/ckpt-00000004.safetensors"));
  auto expectRefused = [&](const std::string& name, double value, const std::string& want) {
    SCOPED_TRACE(name);
    Safetensors st = orig;
    ASSERT_TRUE(st.tensors.count(name)) << name;
    Tensor& t = st.tensors.at(name);
    if (isFloat(t.type.dtype)) t.setDouble(0, value);
    else t.setInt(0, value >= 9.2e18 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(value));
    writeSafetensors(d.file("bad.safetensors"), st);
    auto r = run(kAmprun + " " + p + common + " --steps 8 --resume " + d.file("bad.safetensors"));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  };
  expectRefused("ampc.step", 5, "tensor 'ampc.step' = 5 is outside [0, 4]");
  expectRefused("ampc.growth_tracker", 9.3e18, "tensor 'ampc.growth_tracker' = 9223372036854775807 is outside [0, 99]");
  expectRefused("ampc.hysteresis_left", -1, "tensor 'ampc.hysteresis_left' = -1 is outside");
  expectRefused("ampc.loss_scale", INFINITY, "'ampc.loss_scale' = inf is not a finite positive scale");
  EXPECT_EQ(run(kAmprun + " " + p + common + " --steps 8 --resume " + d.file("ck")).code, 0);
}

TEST(Amprun, BadDataIsRefusedBeforeTheFirstStep) {
  TempDir d;
  const std::string p = makePlan(d, "fp32");
  fs::create_directories(d.path / "data");
  auto expectBad = [&](const std::string& want) {
    auto r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 5 --metrics " + d.file("m.jsonl"));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "a step ran: " << r.out;
  };
  expectBad("x.npy: missing: graph input 'x' (f32[64,64])");
  Tensor x = readNpy(kDigits + "/train/x.npy"), t = readNpy(kDigits + "/train/target.npy");
  writeNpy(d.file("data/x.npy"), x);
  writeNpy(d.file("data/target.npy"), Tensor::fromDoubles(DType::f32, {2}, {1, 2}));
  expectBad("target.npy: dtype f32, graph input 'target' wants i64; convert the file (e.g. numpy's x.astype(np.int64))");
  writeNpy(d.file("data/target.npy"), t);
  Tensor wide(TensorType{DType::f32, {100, 65}});
  writeNpy(d.file("data/x.npy"), wide);
  expectBad("do not match graph input 'x' f32[64,64] (the trailing dimensions must agree)");
  writeNpy(d.file("data/x.npy"), Tensor(TensorType{DType::f32, {10, 64}}));
  writeNpy(d.file("data/target.npy"), Tensor(TensorType{DType::i64, {10}}));
  expectBad("10 samples, fewer than one batch of 64");
}

// Data as numpy writes it by default (f64 samples, i32 or u8 labels) is read as the graph's types,
// with a note per file: the run equals the one on f32 / i64 files, bit for bit (the values are
// exact in both). f16 samples are widened (exact too).
TEST(Amprun, DataOfAnotherWidthIsConverted) {
  TempDir d;
  const std::string p = makePlan(d, "fp32");
  const Tensor x = readNpy(kDigits + "/train/x.npy"), t = readNpy(kDigits + "/train/target.npy");
  auto convert = [](const Tensor& a, DType to) {
    Tensor r(TensorType{to, a.type.shape});
    for (int64_t i = 0; i < a.numel(); ++i) isFloat(to) ? r.setDouble(i, a.getDouble(i)) : r.setInt(i, a.getInt(i));
    return r;
  };
  auto train = [&](const std::string& tag, const Tensor& xs, const Tensor& ts) {
    fs::create_directories(d.path / tag);
    writeNpy(d.file(tag + "/x.npy"), xs);
    writeNpy(d.file(tag + "/target.npy"), ts);
    auto r = run(kAmprun + " " + p + " --data " + d.file(tag) + " --steps 4 --save " + d.file(tag + ".safetensors"));
    EXPECT_EQ(r.code, 0) << r.out;
    return r.out;
  };
  train("plain", x, t);
  std::string out = train("numpy", convert(x, DType::f64), convert(t, DType::i32));
  EXPECT_NE(out.find("numpy/x.npy: f64 samples read as f32 (rounded to nearest) for graph input 'x'"), std::string::npos) << out;
  EXPECT_NE(out.find("numpy/target.npy: i32 samples read as i64 for graph input 'target'"), std::string::npos) << out;
  EXPECT_EQ(readBytes(d.file("numpy.safetensors")), readBytes(d.file("plain.safetensors")));
  Tensor half = convert(x, DType::f16);
  out = train("half", half, convert(t, DType::u8));
  EXPECT_NE(out.find("half/target.npy: u8 samples read as i64"), std::string::npos) << out;
  train("half_f32", convert(half, DType::f32), t);  // the same values, already f32
  EXPECT_EQ(readBytes(d.file("half.safetensors")), readBytes(d.file("half_f32.safetensors")));
}

TEST(Amprun, PlanVersionDumpAndUsage) {
  TempDir d;
  const std::string p = makePlan(d, "fp16");
  auto dump = run(kAmprun + " " + p + " --dump");
  ASSERT_EQ(dump.code, 0) << dump.out;
  EXPECT_NE(dump.out.find("precision f16, optimizer sgd"), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("loss scale: dynamic"), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("PARAM model.fc1.weight : f32[128,64]"), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("OPTIMIZER_STATE model.fc1.weight.momentum"), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("ampc.SGD"), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("arena: "), std::string::npos) << dump.out;
  EXPECT_NE(dump.out.find("ACTIVATION "), std::string::npos) << dump.out;
  // A plan from a newer format version is refused.
  ampc::plan::Plan pb;
  std::istringstream in(readBytes(p));
  ASSERT_TRUE(pb.ParseFromIstream(&in));
  pb.set_format_version(99);
  writeBytes(d.file("new.ampplan"), pb.SerializeAsString());
  auto r = run(kAmprun + " " + d.file("new.ampplan") + " --dump");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("plan format version 99 is newer"), std::string::npos) << r.out;
  writeBytes(d.file("junk.ampplan"), "not a plan at all");
  r = run(kAmprun + " " + d.file("junk.ampplan") + " --dump");
  EXPECT_EQ(r.code, 1) << r.out;
  if (!gpuPresent()) EXPECT_EQ(run(kAmprunBin + " " + p + " --device cuda --synthetic --steps 1").code, 2);  // no GPU here
  EXPECT_EQ(run(kAmprunBin + " " + p + " --device tpu --synthetic --steps 1").code, 2);
  EXPECT_EQ(run(kAmprun + " " + p + " --steps 1").code, 2);  // neither --data nor --synthetic
}

// A plan ends with a checksum of everything before it: cut short anywhere (at a field boundary too,
// where protobuf alone would parse what is left) or with one bit flipped, it is refused before a
// step runs; a plan of an older format (1 without a checksum, 2 with its weights inside) is refused.
TEST(Amprun, TruncatedOrAlteredPlanIsRefused) {
  TempDir d;
  const std::string p = makePlan(d, "fp16");
  const std::string bytes = readBytes(p);
  ASSERT_GT(bytes.size(), 1000u);
  for (const size_t cut : {size_t{1}, size_t{8}, size_t{9}, size_t{10}, size_t{40}, bytes.size() / 2, bytes.size() - 16}) {
    writeBytes(d.file("cut.ampplan"), bytes.substr(0, bytes.size() - cut));
    auto r = run(kAmprun + " " + d.file("cut.ampplan") + " --synthetic --int-range target=0:9 --steps 1");
    EXPECT_EQ(r.code, 1) << cut << ": " << r.out;
    EXPECT_NE(r.out.find("truncated"), std::string::npos) << cut << ": " << r.out;
    EXPECT_EQ(r.out.find("step 1"), std::string::npos) << cut << ": a step ran: " << r.out;
  }
  std::string flipped = bytes;
  flipped[flipped.size() / 3] ^= 0x10;
  writeBytes(d.file("flip.ampplan"), flipped);
  auto r = run(kAmprun + " " + d.file("flip.ampplan") + " --synthetic --int-range target=0:9 --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("truncated or altered"), std::string::npos) << r.out;
  r = run(kAmprun + " " + p + " --synthetic --int-range target=0:9 --steps 1");
  EXPECT_EQ(r.code, 0) << r.out;
  ampc::plan::Plan pb;
  ASSERT_TRUE(pb.ParseFromString(bytes));
  EXPECT_EQ(pb.format_version(), 3u);
  EXPECT_NE(pb.checksum(), 0u);
  pb.set_format_version(1);
  pb.clear_checksum();
  writeBytes(d.file("v1.ampplan"), pb.SerializeAsString());
  r = run(kAmprun + " " + d.file("v1.ampplan") + " --synthetic --int-range target=0:9 --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("plan format version 1 is older"), std::string::npos) << r.out;
  // A plan whose checksum is right but whose structure is not (no forward graph) is refused too.
  ASSERT_TRUE(pb.ParseFromString(bytes));
  // The plan's bytes with a right checksum (field 15, fixed64, after everything else).
  auto signedPlan = [](ampc::plan::Plan& q) {
    q.clear_checksum();
    std::string body = q.SerializeAsString();
    const uint64_t h = hash64(body.data(), body.size());
    body.push_back(static_cast<char>((15 << 3) | 1));
    for (int i = 0; i < 8; ++i) body.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
    return body;
  };
  pb.clear_eval_model();
  writeBytes(d.file("noeval.ampplan"), signedPlan(pb));
  fs::copy(p + ".safetensors", d.file("noeval.ampplan.safetensors"));
  r = run(kAmprun + " " + d.file("noeval.ampplan") + " --synthetic --int-range target=0:9 --steps 1 --save " + d.file("w.safetensors"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("has no forward graph"), std::string::npos) << r.out;
  // A zero-element loss (it crashed the trainer and the loss gradient's seed before): the step
  // graph's first output declared f32[0], the plan signed again; refused as a wrong shape.
  ASSERT_TRUE(pb.ParseFromString(bytes));
  onnx::ModelProto step;
  ASSERT_TRUE(step.ParseFromString(pb.step_model()));
  ASSERT_GT(step.graph().output_size(), 0);
  auto* shape = step.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
  shape->clear_dim();
  shape->add_dim()->set_dim_value(0);
  pb.set_step_model(step.SerializeAsString());
  writeBytes(d.file("emptyloss.ampplan"), signedPlan(pb));
  fs::copy(p + ".safetensors", d.file("emptyloss.ampplan.safetensors"));
  r = run(kAmprun + " " + d.file("emptyloss.ampplan") + " --synthetic --int-range target=0:9 --steps 1");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("emptyloss.ampplan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is declared with shape [0] but computes f32[] (wrong shape)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << "a step ran: " << r.out;
}

// amprun --tune stores the fused attention's choices in the plan (runtime/plan.h, storeTuning): the
// plan is rewritten whole with a new checksum, its weights untouched, and it trains as before; a
// damaged plan is refused and left as it was; --tune itself needs CUDA and --attention auto. The
// GEMMs' and convolutions' algorithms are stored beside the attention's choices.
TEST(Amprun, TuningIsStoredInThePlan) {
  TempDir d;
  const std::string p = makePlan(d, "bf16");
  const std::string w = readBytes(p + ".safetensors");
  const std::string train = kAmprun + " " + p + " --synthetic --int-range target=0:9 --steps 3 --metrics ";
  ASSERT_EQ(run(train + d.file("before.jsonl")).code, 0);
  Tuning t;
  t.device = "Some GPU (sm_90), cuDNN 91400";
  t.attention = {{"8x12/12x1024x1024 D64/64 causal forward", "cuDNN engine 2"}, {"8x12/12x1024x1024 D64/64 causal backward", "kernels"}};
  t.algorithms = {{"conv backward-filter bf16 NHWC N64 C32 56x56 M64 k3x3 g1 pad 1,1 stride 1,1 dil 1,1", "1"}, {"gemm bf16 M8192 N768 K3072 B^T", "3"}};
  storeTuning(p, t);
  const LoadedPlan lp = readPlan(p);
  EXPECT_EQ(lp.tuning.device, t.device);
  EXPECT_EQ(lp.tuning.attention, t.attention);
  EXPECT_EQ(lp.tuning.algorithms, t.algorithms);
  EXPECT_EQ(readBytes(p + ".safetensors"), w);
  auto dump = run(kAmprun + " " + p + " --dump");
  ASSERT_EQ(dump.code, 0) << dump.out;
  EXPECT_NE(dump.out.find("tuning (amprun --tune) on Some GPU (sm_90), cuDNN 91400:\n  fused attention 8x12/12x1024x1024 D64/64 causal backward: kernels"),
            std::string::npos)
      << dump.out;
  EXPECT_NE(dump.out.find("  conv backward-filter bf16 NHWC N64 C32 56x56 M64 k3x3 g1 pad 1,1 stride 1,1 dil 1,1: algorithm 1\n"),
            std::string::npos)
      << dump.out;
  EXPECT_NE(dump.out.find("  gemm bf16 M8192 N768 K3072 B^T: algorithm 3\n"), std::string::npos) << dump.out;
  auto r = run(train + d.file("after.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(metricsWithoutTime(d.file("after.jsonl")), metricsWithoutTime(d.file("before.jsonl")));
  EXPECT_EQ(metricsWithoutTime(d.file("after.jsonl")).size(), 3u);
  // Stored again: the old choices are replaced, not merged.
  t.attention = {{"2x4/4x64x64 D32/32 forward", "kernels"}};
  t.algorithms.clear();
  storeTuning(p, t);
  EXPECT_EQ(readPlan(p).tuning.attention, t.attention);
  EXPECT_TRUE(readPlan(p).tuning.algorithms.empty());
  // A plan cut short is refused by storeTuning as by readPlan, and keeps its bytes.
  const std::string bytes = readBytes(p);
  writeBytes(d.file("cut.ampplan"), bytes.substr(0, bytes.size() - 5));
  try {
    storeTuning(d.file("cut.ampplan"), t);
    ADD_FAILURE() << "a truncated plan was rewritten";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_EQ(readBytes(d.file("cut.ampplan")), bytes.substr(0, bytes.size() - 5));
  EXPECT_FALSE(fs::exists(d.file("cut.ampplan.tmp")));
  r = run(kAmprun + " " + p + " --synthetic --int-range target=0:9 --steps 1 --tune");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--tune times the fused attention's implementations (and with --algos auto the GEMMs' and convolutions' "
                       "algorithms): it needs --device cuda"),
            std::string::npos)
      << r.out;
}

// The weights live once, in a safetensors file beside the plan, every tensor under its own hash: a
// flipped byte, a missing file, or the weights of another compile are refused before a step runs,
// naming the file (and the tensor). The plan and its weights stay within 1.1x of the weights' bytes
// (the optimizer's zero state is not stored).
TEST(Amprun, PlanWeightsFileIsVerified) {
  TempDir d;
  const std::string p = makePlan(d, "fp16", "--optimizer adamw");
  const std::string w = p + ".safetensors";
  ASSERT_TRUE(fs::exists(w));
  Safetensors st = readSafetensors(w);
  size_t paramBytes = 0;
  for (const auto& [name, t] : st.tensors) {
    EXPECT_EQ(name.find(".adam_"), std::string::npos) << name << ": zero state stored";
    if (name.rfind("model.", 0) == 0) paramBytes += t.data.size();
  }
  EXPECT_GT(paramBytes, 30000u);
  EXPECT_LE(static_cast<double>(fs::file_size(p) + fs::file_size(w)), 1.1 * static_cast<double>(paramBytes) + 65536)
      << fs::file_size(p) << " + " << fs::file_size(w) << " for " << paramBytes << " bytes of weights";
  const std::string bytes = readBytes(w);
  const std::string steps = " --synthetic --int-range target=0:9 --steps 1";
  // One flipped bit in the last tensor's data.
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x04;
  writeBytes(w, flipped);
  auto r = run(kAmprun + " " + p + steps);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is corrupt"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(w), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 1"), std::string::npos) << r.out;
  fs::remove(w);
  r = run(kAmprun + " " + p + steps);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("weights file"), std::string::npos) << r.out;
  // Another compile's weights beside this plan.
  TempDir other;
  const std::string q = makePlan(other, "fp16", "--optimizer adamw");
  writeBytes(w, readBytes(q + ".safetensors"));
  r = run(kAmprun + " " + p + steps);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("another compile"), std::string::npos) << r.out;
  writeBytes(w, bytes);
  EXPECT_EQ(run(kAmprun + " " + p + steps).code, 0);
}

// --explain-overflow names the op that overflowed and why. Inputs 1e5 times too large overflow f16
// in the forward pass (the input's cast into f16, on its way into fc1): the scaler cannot help, and
// the advice (keep fc1 in f32) moves the overflow on. A loss scale of 1e30 overflows the backward's
// first f16 cast: the scaler's business. In range, nothing is printed. (On CUDA:
// tests/gpu GpuOverflow.ExplainNamesTheOverflowingLaunch and tools/bench/gpu_check.sh.)
TEST(Amprun, ExplainOverflowNamesTheOpAndWhy) {
  TempDir d;
  Tensor x = readNpy(kDigits + "/train/x.npy");
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, x.getDouble(i) * 1e5);
  writeDigitsWith(d, x);
  const std::string p = makePlan(d, "fp16");
  auto r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 2 --explain-overflow");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 1: overflow: node 'x/cast_f16' (Cast)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 2: overflow: node 'x/cast_f16'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the forward pass"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ampc --fp32-nodes '/model/fc1/Gemm'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("the backward pass"), std::string::npos) << r.out;
  const std::string kept = d.file("kept.ampplan");
  ASSERT_EQ(run(kAmpc + " " + kDigits + ".onnx --precision fp16 --fp32-nodes '/model/fc1/Gemm' -o " + kept).code, 0);
  r = run(kAmprun + " " + kept + " --data " + d.file("data") + " --steps 1 --explain-overflow");
  EXPECT_EQ(r.out.find("node 'x/cast_f16'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("step 1: overflow: node '/model/Relu_output_0/cast_f16' (Cast)"), std::string::npos) << r.out;

  const std::string huge = d.file("huge_scale.ampplan");
  ASSERT_EQ(run(kAmpc + " " + kDigits + ".onnx --precision fp16 --init-scale 1e30 --max-scale 1e38 -o " + huge).code, 0);
  r = run(kAmprun + " " + huge + " --data " + kDigits + "/train --steps 2 --explain-overflow");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step 1: overflow: node '/model/fc2/Gemm_output_0/cast_f32_grad/Cast' (Cast)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the backward pass, whose values carry the loss scale 1e+30"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the loss scale 5e+29"), std::string::npos) << r.out;  // step 2, after the backoff

  r = run(kAmprun + " " + p + " --data " + kDigits + "/train --steps 3 --explain-overflow");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("overflow"), std::string::npos) << r.out;
}

TEST(Amprun, ScalerInTheMetricsFile) {
  // Inf in the samples of the 3rd and 4th batches (no shuffle): those steps are skipped and the
  // scale halves at each; growth after --growth-interval 2 clean steps; bounded by --max-scale.
  TempDir d;
  const std::string p = makePlan(d, "fp16", "--optimizer sgd --lr 0.1 --momentum 0.9 --init-scale 1024 --growth-interval 2 --max-scale 2048");
  fs::create_directories(d.path / "data");
  Tensor x = readNpy(kDigits + "/train/x.npy");
  x.setDouble(2 * 64 * 64 + 5, INFINITY);
  x.setDouble(3 * 64 * 64 + 9, INFINITY);
  writeNpy(d.file("data/x.npy"), x);
  fs::copy(kDigits + "/train/target.npy", d.file("data/target.npy"));
  auto r = run(kAmprun + " " + p + " --data " + d.file("data") + " --steps 9 --metrics " + d.file("m.jsonl"));
  ASSERT_EQ(r.code, 0) << r.out;
  const auto m = metricsWithoutTime(d.file("m.jsonl"));
  ASSERT_EQ(m.size(), 9u);
  const std::vector<std::pair<double, bool>> want = {{1024, false}, {1024, false}, {2048, true}, {1024, true},
                                                     {512, false},  {512, false},  {1024, false}, {1024, false}, {2048, false}};
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_NE(m[i].find("\"loss_scale\": " + std::to_string(static_cast<int>(want[i].first)) + ","), std::string::npos) << m[i];
    EXPECT_NE(m[i].find(std::string("\"skipped\": ") + (want[i].second ? "true" : "false")), std::string::npos) << m[i];
  }
}

TEST(Amprun, BenchReportsStepTimeAndMemory) {
  TempDir d;
  const std::string p = makePlan(d, "bf16");
  auto r = run(kAmprun + " " + p + " --synthetic --int-range target=0:9 --steps 12 --bench");
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(step time: median ([0-9.]+) ms)"))) << r.out;
  EXPECT_GT(std::stod(m[1]), 0.0);
  EXPECT_NE(r.out.find("bench: device cpu, 12 steps (2 warm-up steps left out of the median)"), std::string::npos) << r.out;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(arena \(planned\) ([0-9.]+) MiB)"))) << r.out;
  EXPECT_GT(std::stod(m[1]), 0.0);
}

// The plan records the target it was compiled for (ampc --target; cuda by default), and a cpu-target
// plan still runs on the CPU. (A cpu-target plan on --device cuda is refused; that needs a GPU to
// show.) An unknown target is a usage error.
TEST(Amprun, PlanRecordsItsTarget) {
  TempDir d;
  const std::string cuda = makePlan(d, "fp32"), cpu = d.file("cpu.ampplan");
  auto r = run(kAmpc + " " + kDigits + ".onnx --precision fp32 --target cpu -o " + cpu);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " " + cuda + " --dump");
  EXPECT_NE(r.out.find(", target cuda\n"), std::string::npos) << r.out;
  r = run(kAmprun + " " + cpu + " --dump");
  EXPECT_NE(r.out.find(", target cpu\n"), std::string::npos) << r.out;
  r = run(kAmprun + " " + cpu + " --data " + kDigits + "/train --steps 3");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run(kAmpc + " " + kDigits + ".onnx --target tpu -o " + d.file("x.ampplan"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("tpu"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.file("x.ampplan")));
}

// The CUDA target's lowering, as `ampc --train --emit text` shows it: resnet_tiny at fp16 has its
// batch norms' Relus and residuals, its ReLU gradients under BatchNormGrad and its loss statistics
// as cuda:: nodes (no Relu node left); for --target cpu the step keeps the ONNX and ampc ops.
TEST(Ampc, EmitTextShowsTheCudaTargetNodes) {
  const std::string model = std::string(AMPC_SOURCE_DIR) + "/models/resnet_tiny.onnx";
  auto count = [](const std::string& text, const std::string& what) {
    size_t k = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++k;
    return k;
  };
  auto r = run(kAmpc + " " + model + " --precision fp16 --train --emit text");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "= cuda::BatchNormalization("), 7u);
  EXPECT_EQ(count(r.out, "= cuda::BatchNormGrad("), 5u);
  EXPECT_EQ(count(r.out, "= cuda::SoftmaxCrossEntropyLoss("), 1u);
  EXPECT_EQ(count(r.out, "= cuda::SoftmaxCrossEntropyLossGrad("), 1u);
  EXPECT_EQ(count(r.out, "= Relu("), 0u);
  r = run(kAmpc + " " + model + " --precision fp16 --train --target cpu --emit text");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "cuda::"), 0u);
  EXPECT_EQ(count(r.out, "= Relu("), 7u);
  // gpt2_tiny at bf16: both blocks' attention reads Q, K and V from the QKV projection and its
  // gradient writes into the projection gradient's Concat (passes/attention_in_place.cpp); no head
  // Transpose, Split or Concat is left.
  const std::string gpt2 = std::string(AMPC_SOURCE_DIR) + "/models/gpt2_tiny.onnx";
  r = run(kAmpc + " " + gpt2 + " --precision bf16 --train --emit text");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "= cuda::Attention("), 2u);
  EXPECT_EQ(count(r.out, "= cuda::AttentionGrad("), 2u);
  EXPECT_EQ(count(r.out, "packed_grads = 1"), 2u);
  EXPECT_EQ(count(r.out, "= ampc::Attention"), 0u);
  EXPECT_EQ(count(r.out, "= Split("), 0u);
  EXPECT_EQ(count(r.out, "= Concat("), 0u);
  r = run(kAmpc + " " + gpt2 + " --precision bf16 --train --target cpu --emit text");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(count(r.out, "= ampc::Attention("), 2u);
  EXPECT_EQ(count(r.out, "= Split("), 2u);
}

// A plan trains exactly the model's "ampc.trainable" list (the export helper's named_parameters()):
// the step graph is built from the exported forward, which now carries the list. Before, plans
// trained every float initializer, buffers too.
TEST(Amprun, PlanTrainsTheDeclaredTrainableSet) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 3});
  addFloatInit(g, "w", {3, 3}, std::vector<float>(9, 0.5f));
  addFloatInit(g, "buf", {3}, {1, 2, 3});
  addNode(g, "MatMul", {"x", "w"}, {"y"}, "mm");
  addNode(g, "Add", {"y", "buf"}, {"z"}, "add");
  addNode(g, "Mul", {"z", "z"}, {"zz"}, "sq");
  auto* keepdims = addNode(g, "ReduceMean", {"zz"}, {"loss"}, "mean")->add_attribute();
  keepdims->set_name("keepdims");
  keepdims->set_type(onnx::AttributeProto::INT);
  keepdims->set_i(0);
  addOutput(g, "loss");
  auto* t = m.add_metadata_props();
  t->set_key("ampc.trainable");
  t->set_value("[\"w\"]");
  writeModel(d.file("m.onnx"), m);
  auto r = run(kAmpc + " " + d.file("m.onnx") + " --precision fp32 --optimizer sgd --lr 0.1 --momentum 0.9 -o " + d.file("m.ampplan"));
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(kAmprun + " " + d.file("m.ampplan") + " --dump");
  EXPECT_NE(r.out.find("OPTIMIZER_STATE w.momentum"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("buf.momentum"), std::string::npos) << r.out;
  fs::create_directories(d.path / "data");
  Tensor x(TensorType{DType::f32, {8, 3}});
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, 0.1 * static_cast<double>(i % 7) - 0.3);
  writeNpy(d.file("data/x.npy"), x);
  r = run(kAmprun + " " + d.file("m.ampplan") + " --data " + d.file("data") + " --steps 4 --save " + d.file("w.safetensors"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto st = readSafetensors(d.file("w.safetensors"));
  const Tensor& buf = st.tensors.at("buf");
  EXPECT_EQ(buf.getDouble(0), 1.0);
  EXPECT_EQ(buf.getDouble(2), 3.0);
  EXPECT_NE(st.tensors.at("w").getDouble(0), 0.5) << "w trains";
}

// A CUDA plan's pointwise groups (ampc.Fused, with their generated kernels) and its recomputed
// activations (passes/rematerialize.cpp) train on the CPU exactly as the same plan without them:
// the CPU runs each group's ops with its own kernels, and a recomputed value has the same bits.
TEST(Amprun, FusedGroupsTrainBitwiseAsTheirOps) {
  struct Case {
    std::string model, flags, data;
    bool remat;  // the plan recomputes a value: a GELU's output, read again by the next layer's weight gradient, or a weight's bf16 cast
  };
  const std::string src = std::string(AMPC_SOURCE_DIR);
  const std::vector<Case> cases = {
      {src + "/models/transformer.onnx", " --precision bf16 --freeze 'model\\.mask' --optimizer adamw --lr 1e-3",
       " --int-range idx=0:63 --int-range target=0:63", true},
      {src + "/models/zoo/convnext/convnext.dynamo.onnx", " --precision bf16 --optimizer sgd --lr 0.01", " --int-range target=0:9", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    TempDir d;
    auto a = run(kAmpc + " " + c.model + c.flags + " -o " + d.file("fused.ampplan"));
    ASSERT_EQ(a.code, 0) << a.out;
    auto b = run(kAmpc + " " + c.model + c.flags + " --no-fuse-elementwise --no-remat -o " + d.file("ops.ampplan"));
    ASSERT_EQ(b.code, 0) << b.out;
    auto dumpA = run(kAmprun + " " + d.file("fused.ampplan") + " --dump"), dumpB = run(kAmprun + " " + d.file("ops.ampplan") + " --dump");
    EXPECT_NE(dumpA.out.find("ampc.Fused"), std::string::npos) << "the plan has no fused groups";
    EXPECT_EQ(dumpA.out.find(".remat") != std::string::npos, c.remat);
    EXPECT_EQ(dumpB.out.find("ampc.Fused"), std::string::npos);
    EXPECT_EQ(dumpB.out.find(".remat"), std::string::npos);
    for (const char* p : {"fused", "ops"}) {
      auto r = run(kAmprun + " " + d.file(std::string(p) + ".ampplan") + " --synthetic" + c.data + " --seed 3 --steps 6 --log-every 1 --metrics " +
                   d.file(std::string(p) + ".jsonl"));
      ASSERT_EQ(r.code, 0) << r.out;
    }
    const auto fused = metricsWithoutTime(d.file("fused.jsonl")), ops = metricsWithoutTime(d.file("ops.jsonl"));
    ASSERT_EQ(fused.size(), 6u);
    EXPECT_EQ(fused, ops);
  }
}
