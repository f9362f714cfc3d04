// The ampc binary: exit codes (0 ok, 1 bad input, 2 bad usage), messages, and no partial output.
#include <gtest/gtest.h>

#include "tests/unit/test_util.h"

using namespace ampc::test;

namespace {
const std::string kAmpc = AMPC_BIN;
const std::string kModels = std::string(AMPC_SOURCE_DIR) + "/models";
}  // namespace

TEST(Cli, HelpAndUsageErrors) {
  auto r = run(kAmpc + " --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--emit"), std::string::npos);
  EXPECT_NE(r.out.find("--input-shape"), std::string::npos);
  EXPECT_EQ(run(kAmpc).code, 2);
  EXPECT_EQ(run(kAmpc + " " + kModels + "/mlp.onnx --bogus").code, 2);
  EXPECT_EQ(run(kAmpc + " " + kModels + "/mlp.onnx --emit dot").code, 2);
  r = run(kAmpc + " " + kModels + "/mlp.onnx --emit onnx");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("needs -o"), std::string::npos);
  r = run(kAmpc + " " + kModels + "/mlp.onnx --input-shape x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("NAME=2x3x32x32"), std::string::npos);
  r = run(kAmpc + " " + kModels + "/mlp.onnx --passes nosuch");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown pass 'nosuch'"), std::string::npos);
  r = run(kAmpc + " " + kModels + "/mlp.onnx --kernels");  // a plan would fuse the forward graph before autodiff
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--kernels shows the generated kernels: it needs --emit text"), std::string::npos);
  r = run(kAmpc + " " + kModels + "/mlp.onnx --memory");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--memory explains the training step's memory plan: it needs --train"), std::string::npos);
  for (const char* bad : {"w", "w=", "w=x", "w=-1", "=3", "w=2x"}) {
    r = run(kAmpc + " " + kModels + "/mlp.onnx --embedding-padding " + bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE(r.out.find("--embedding-padding wants TABLE=ROW"), std::string::npos) << bad << ": " << r.out;
  }
}

// --train --memory: the CUDA memory plan's peak, its values and their ops, at compile time (what
// amprun allocates); the arena is at least the peak of live values.
TEST(Cli, MemoryExplainsThePlansPeak) {
  auto r = run(kAmpc + " " + kModels + "/cnn.onnx --train --precision bf16 --memory");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("memory plan: arena "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("live at the peak, by the op that made them:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("largest values live at the peak:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(Conv)"), std::string::npos) << r.out;
  r = run(kAmpc + " " + kModels + "/cnn.onnx --train --target cpu --memory");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cuda only"), std::string::npos) << r.out;
}

TEST(Cli, SummaryOfTheSeedsMlp) {
  auto r = run(kAmpc + " " + kModels + "/mlp.onnx --summary");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Gemm                         2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("params: 4 tensors, 2110 elements, 8440 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("input  x : f32[100,10]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output loss : f32[]"), std::string::npos) << r.out;
}

TEST(Cli, BadInputsExitOneWithoutPartialOutput) {
  TempDir d;
  std::string out = d.file("out.onnx");
  auto expectBad = [&](const std::string& model, const std::vector<std::string>& want) {
    auto r = run(kAmpc + " " + model + " --emit onnx -o " + out);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find(model), std::string::npos) << "message does not name the file: " << r.out;
    for (const auto& w : want) EXPECT_NE(r.out.find(w), std::string::npos) << "missing '" << w << "' in: " << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << "partial output left by " << model;
    EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  };
  expectBad(d.file("missing.onnx"), {"no such file"});

  std::string bytes = readBytes(kModels + "/transformer.onnx");
  writeBytes(d.file("trunc.onnx"), bytes.substr(0, bytes.size() / 2));
  expectBad(d.file("trunc.onnx"), {"truncated or not ONNX"});

  std::mt19937 rng(42);
  std::string junk(3000, '\0');
  for (auto& c : junk) c = static_cast<char>(rng());
  writeBytes(d.file("junk.onnx"), junk);
  expectBad(d.file("junk.onnx"), {"error"});

  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addNode(g, "Add", {"x", "b"}, {"a"}, "loop_a");
  addNode(g, "Relu", {"a"}, {"b"}, "loop_b");
  addOutput(g, "b");
  writeModel(d.file("cycle.onnx"), m);
  expectBad(d.file("cycle.onnx"), {"node 'loop_a' (Add)", "cycle"});

  auto m2 = newModel();
  g = m2.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addNode(g, "Relu", {"x", }, {"a"}, "ok");
  addNode(g, "Mul", {"a", "nowhere"}, {"b"}, "dangler");
  addOutput(g, "b");
  writeModel(d.file("dangling.onnx"), m2);
  expectBad(d.file("dangling.onnx"), {"node 'dangler' (Mul)", "'nowhere'"});

  auto m3 = newModel();
  g = m3.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addTensorInput(g, "i", onnx::TensorProto::INT32, {2});
  addNode(g, "Sub", {"x", "i"}, {"y"}, "typo");
  addOutput(g, "y");
  writeModel(d.file("dtype.onnx"), m3);
  expectBad(d.file("dtype.onnx"), {"node 'typo' (Sub)", "same dtype"});

  auto m4 = newModel();
  g = m4.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addNode(g, "Mish", {"x"}, {"y"}, "act");
  addNode(g, "Loss", {"y"}, {"z"}, "custom_loss", "com.seeds");
  addOutput(g, "z");
  writeModel(d.file("unsupported.onnx"), m4);
  expectBad(d.file("unsupported.onnx"), {"node 'act' (Mish)", "node 'custom_loss' (com.seeds.Loss) domain 'com.seeds'"});
}

TEST(Cli, ExternalDataOutsideTheModelFolderExitsOne) {
  TempDir d;
  std::filesystem::create_directories(d.path / "model");
  writeBytes(d.file("secret.bin"), std::string(64, 'x'));
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4});
  auto* kv = addExternalInit(g, "w", {4}, "../secret.bin")->mutable_external_data(0);
  addNode(g, "Add", {"x", "w"}, {"y"}, "add");
  addOutput(g, "y");
  writeModel(d.file("model/m.onnx"), m);
  auto r = run(kAmpc + " " + d.file("model/m.onnx") + " --emit onnx -o " + d.file("out.onnx"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("initializer 'w': external data location '../secret.bin' escapes the model's folder"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(d.file("out.onnx")));
  kv->set_value((d.path / "secret.bin").string());
  writeModel(d.file("model/m.onnx"), m);
  r = run(kAmpc + " " + d.file("model/m.onnx"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is absolute"), std::string::npos) << r.out;
}

TEST(Cli, EmitTextAndOnnxRoundTrip) {
  TempDir d;
  for (const char* name : {"mlp", "cnn", "transformer"}) {
    std::string model = kModels + "/" + name + ".onnx";
    auto a = run(kAmpc + " " + model + " --emit text");
    ASSERT_EQ(a.code, 0) << a.out;
    ASSERT_NE(a.out.find("output %loss"), std::string::npos);
    auto e = run(kAmpc + " " + model + " --emit onnx -o " + d.file("rt.onnx"));
    ASSERT_EQ(e.code, 0) << e.out;
    auto b = run(kAmpc + " " + d.file("rt.onnx") + " --emit text");
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_EQ(a.out, b.out) << name;
    // The text form parses back to the same text.
    writeBytes(d.file("g.ir"), a.out);
    auto c = run(kAmpc + " " + d.file("g.ir") + " --emit text");
    ASSERT_EQ(c.code, 0) << c.out;
    EXPECT_EQ(c.out, a.out) << name;
  }
}

TEST(Cli, EvalErrorsAndBind) {
  TempDir d;
  const std::string mlp = kModels + "/mlp.onnx";
  auto r = run(kAmpc + " " + mlp + " --eval");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--eval needs --inputs"), std::string::npos) << r.out;
  r = run(kAmpc + " " + mlp + " --eval --inputs " + d.path.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(d.file("x.npy") + ": missing: graph input 'x' (f32[100,10])"), std::string::npos) << r.out;
  // A wrong shape names the file and the input; nothing is written.
  std::filesystem::copy(kModels + "/ref/mlp/inputs", d.file("in"));
  auto x = run("/usr/bin/python3 -c \"import numpy as np; np.save('" + d.file("in/x.npy") + "', np.zeros((100, 9), np.float32))\"");
  if (x.code != 0) GTEST_SKIP() << "python3-numpy missing";
  r = run(kAmpc + " " + mlp + " --eval --inputs " + d.file("in") + " --outputs " + d.file("out"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("shape f32[100,9] does not match graph input 'x' f32[100,10]"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(d.file("out/loss.npy")));

  // --bind: a shape input becomes a constant, so the Reshape's output shape is static.
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 6});
  addTensorInput(g, "shape", onnx::TensorProto::INT64, {2});
  addNode(g, "Reshape", {"x", "shape"}, {"y"}, "reshape");
  addOutput(g, "y");
  writeModel(d.file("reshape.onnx"), m);
  r = run(kAmpc + " " + d.file("reshape.onnx"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("must be a compile-time constant"), std::string::npos) << r.out;
  ASSERT_EQ(run("/usr/bin/python3 -c \"import numpy as np; np.save('" + d.file("s.npy") + "', np.array([3, -1]))\"").code, 0);
  r = run(kAmpc + " " + d.file("reshape.onnx") + " --bind shape=" + d.file("s.npy") + " --summary");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("output y : f32[3,4]"), std::string::npos) << r.out;
}
