// Autocast on the committed models: the transformer's painting at fp16, the mixed ONNX passes
// the checker and evaluates (CPU backend) close to the FP32 graph at fp16 and bf16, and the
// CLI's report and overrides.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>

#include "ampc/ampc.h"
#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "passes/autocast.h"
#include "runtime/evaluator.h"
#include "runtime/npy.h"
#include "tests/e2e/model_refs.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using test::modelPath;
using test::relL2;
namespace fs = std::filesystem;

namespace {


const Value* lossInput(const Graph& g) {
  for (const auto& n : g.nodes())
    if (n->def() && n->def()->loss) return n->input(0);
  return nullptr;
}


// Loss and logits of a graph on the committed reference inputs, dropout off.
std::pair<Tensor, Tensor> lossAndLogits(const Graph& g, const std::string& model) {
  std::map<std::string, Tensor> feeds;
  for (const Value* v : g.inputs())
    feeds.emplace(v->name(), readNpy((fs::path(AMPC_SOURCE_DIR) / "models" / "ref" / model / "inputs" / (v->name() + ".npy")).string()));
  auto backend = createCpuBackend();
  ExecOptions opts;
  opts.dropout = false;
  auto outs = evaluate(g, feeds, *backend, opts, {lossInput(g)});
  return {cpu::castTensor(outs[0], DType::f64), cpu::castTensor(outs.back(), DType::f64)};
}

// The report row of a node: "precision  rule" with the padding squeezed to one space.
std::string rowOf(const std::string& out, const std::string& node) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ws(line);
    std::string name, op, rest, w;
    ws >> name >> op;
    if (name != node) continue;
    while (ws >> w) rest += (rest.empty() ? "" : " ") + w;
    return rest;
  }
  return "(no row for " + node + ")";
}

class MixedModel : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

}  // namespace

TEST(Autocast, TransformerAtFp16) {
  auto g = importOnnxFile(modelPath("transformer"));
  const int before = countCasts(*g);
  AutocastReport report;
  PassManager pm;
  pm.add(createAutocastPass(AutocastOptions{}, &report));
  pm.run(*g);
  const int painted = countCasts(*g) - before;
  PassManager cleanup;
  cleanup.add(createCastCleanupPass());
  cleanup.run(*g);
  finalizeReport(report, *g, before);
  std::printf("transformer fp16: casts inserted %d, after cleanup %d\n", painted, report.castsAfterCleanup);
  EXPECT_EQ(painted, report.castsInserted);
  EXPECT_LT(report.castsAfterCleanup, painted);
  std::map<const Value*, int> paramCasts;
  for (const auto& n : g->nodes()) {
    const std::string& op = n->op();
    const DType out = n->result(0)->type().dtype;
    if (op == "MatMul" || op == "Gemm") EXPECT_EQ(out, DType::f16) << n->describe();
    if (op == "Softmax" || op == "LayerNormalization" || n->def()->loss) {
      EXPECT_EQ(out, DType::f32) << n->describe();
      EXPECT_EQ(n->input(0)->type().dtype, DType::f32) << n->describe();
    }
    if (op != "Cast") continue;
    const Value* in = n->input(0);
    if (in->kind() == ValueKind::Param) {
      EXPECT_EQ(out, DType::f16) << n->describe();
      EXPECT_EQ(++paramCasts[in], 1) << "parameter " << in->name() << " is cast more than once";
    } else {
      // Into an FP32 island (low -> f32) or back (f32 -> low): never f32 -> f32 or low -> low.
      EXPECT_NE(isLowFloat(in->type().dtype), isLowFloat(out)) << n->describe();
      EXPECT_EQ(in->kind(), ValueKind::Result) << n->describe();
    }
  }
  EXPECT_GT(paramCasts.size(), 0u);
}

TEST_P(MixedModel, OnnxPassesCheckerAndEvaluatesNearFp32) {
  const auto& [model, precision] = GetParam();
  test::TempDir d;
  const std::string mixed = d.file("mixed.onnx");
  auto r = test::run(std::string(AMPC_BIN) + " " + modelPath(model) + " --precision " + precision + " --emit onnx -o " + mixed);
  ASSERT_EQ(r.code, 0) << r.out;
  onnx::ModelProto proto;
  std::ifstream in(mixed, std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&in));
  EXPECT_NO_THROW(onnx::checker::check_model(proto));
  int casts = 0;
  for (const auto& n : proto.graph().node()) casts += n.op_type() == "Cast";
  EXPECT_GT(casts, 0);
  auto ref = lossAndLogits(*importOnnxFile(modelPath(model)), model);
  auto low = lossAndLogits(*importOnnxFile(mixed), model);
  const double lossErr = relL2(low.first, ref.first), logitErr = relL2(low.second, ref.second);
  std::printf("%s %s: loss rel. error %.3g, logits rel. L2 %.3g\n", model.c_str(), precision.c_str(), lossErr, logitErr);
  EXPECT_LE(lossErr, 1e-2);
  EXPECT_LE(logitErr, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Models, MixedModel,
                         ::testing::Combine(::testing::Values("mlp", "cnn", "transformer"), ::testing::Values("fp16", "bf16")));

TEST(Autocast, LibraryEntryPoint) {
  onnx::ModelProto proto;
  std::ifstream in(modelPath("cnn"), std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&in));
  AutocastOptions opts;
  opts.low = DType::bf16;
  AutocastResult r = autocastModel(proto, opts);
  EXPECT_NO_THROW(onnx::checker::check_model(r.model));
  int convs = 0;
  for (const auto& row : r.report.rows)
    if (row.op == "Conv") {
      ++convs;
      EXPECT_EQ(row.precision, "bf16");
    }
  EXPECT_EQ(convs, 2);
  EXPECT_GT(r.report.lowFlops / r.report.flops, 0.9);
}

TEST(AutocastCli, ReportAndOverrides) {
  test::TempDir d;
  const std::string ampc = AMPC_BIN, mlp = modelPath("mlp");
  auto r = test::run(ampc + " " + mlp + " --report --report-json " + d.file("r.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("/model/fc1/Gemm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("allow list"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("loss (FP32)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("totals: 3 of 4 float ops run f16"), std::string::npos) << r.out;
  auto j = nlohmann::json::parse(test::readBytes(d.file("r.json")));
  EXPECT_EQ(j["precision"], "f16");
  EXPECT_EQ(j["nodes"].size(), 4u);
  EXPECT_EQ(j["totals"]["low_ops"], 3);
  EXPECT_GT(j["totals"]["casts_after_cleanup"].get<int>(), 0);

  // --fp32-ops and --fp32-nodes.
  r = test::run(ampc + " " + mlp + " --report --fp32-ops Relu --fp32-nodes '/model/fc2/.*'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/Relu"), "f32 deny list") << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/fc2/Gemm"), "f32 user pin") << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/fc1/Gemm"), "f16 allow list") << r.out;

  // --amp-config, and its errors (exit 2, message names the file).
  test::writeBytes(d.file("ok.json"), R"({"precision": "bf16", "deny": ["Gemm"], "nodes": [{"name": "/model/fc1/Gemm", "precision": "fp16"}]})");
  r = test::run(ampc + " " + mlp + " --report --amp-config " + d.file("ok.json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/fc1/Gemm"), "f16 user pin") << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/fc2/Gemm"), "f32 deny list") << r.out;
  EXPECT_EQ(rowOf(r.out, "/model/Relu"), "f16 inferred from inputs") << r.out;  // follows the pinned fc1
  for (const auto& [json, want] : std::vector<std::pair<std::string, std::string>>{
           {R"({"ops": {"Frobnicate": "allow"}})", "unknown op 'Frobnicate'"},
           {R"({"ops": {"Relu": "sometimes"}})", "unknown category 'sometimes'"},
           {R"({"colour": 1})", "unknown key \"colour\""},
           {R"({"nodes": [{"regex": "(", "precision": "fp32"}]})", "bad regex"},
           {R"({"precision": "fp8"})", "unknown precision 'fp8'"},
           {"{not json", "not valid JSON"}}) {
    test::writeBytes(d.file("bad.json"), json);
    r = test::run(ampc + " " + mlp + " --report --amp-config " + d.file("bad.json"));
    EXPECT_EQ(r.code, 2) << json << ": " << r.out;
    EXPECT_NE(r.out.find(d.file("bad.json")), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << json << ": " << r.out;
  }
  r = test::run(ampc + " " + mlp + " --report --fp32-ops NoSuchOp");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unknown op 'NoSuchOp'"), std::string::npos) << r.out;
}

// A rotary embedding's angles, positions x frequencies, run FP32 (HF computes them with autocast
// off): at bf16 an angle near 2000 rad is off by up to 4 rad, a cosine of the wrong sign. The
// MatMul that also feeds a non-angle use stays low. Fresh random frequencies each run.
TEST(Autocast, RotaryAnglesRunFp32) {
  const char* text = R"(graph "rope" opset 18 {
  input %pos : i64[1,2048,1]
  param %inv : f32[1,1,16]
  input %h : f32[2048,16]
  param %w : f32[16,16]
  %p : f32[1,2048,1] = Cast(%pos) {to = 1}
  %f : f32[1,2048,16] = MatMul(%p, %inv)
  %e : f32[1,2048,32] = Concat(%f, %f) {axis = -1}
  %c : f32[1,2048,32] = Cos(%e)
  %s : f32[1,2048,32] = Sin(%e)
  %hw : f32[2048,16] = MatMul(%h, %w)
  %hs : f32[2048,16] = Sin(%hw)
  %o : f32[2048,16] = Add(%hs, %hw)
  output %c
  output %s
  output %o
})";
  auto g = parseGraph(text, "rope");
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.5, 1.0);
  Tensor inv(TensorType{DType::f32, {1, 1, 16}}), w(TensorType{DType::f32, {16, 16}});
  for (int64_t i = 0; i < inv.numel(); ++i) inv.setDouble(i, u(rng) / std::pow(10.0, i / 8.0));  // 1 .. 1e-2 rad per position
  for (int64_t i = 0; i < w.numel(); ++i) w.setDouble(i, u(rng) - 0.75);
  for (Value* p : g->params()) p->setData(p->name() == "inv" ? inv : w);
  AutocastOptions ao;
  ao.low = DType::bf16;
  AutocastReport rep;
  createAutocastPass(ao, &rep)->run(*g);
  std::string angleRule, otherPrecision;
  for (const auto& r : rep.rows)
    if (r.op == "MatMul") (r.ir->result(0)->name() == "f" ? angleRule : otherPrecision) = r.precision + " " + r.rule;
  EXPECT_EQ(angleRule, "f32 angle of Sin/Cos (FP32)");
  EXPECT_EQ(otherPrecision.substr(0, 4), "bf16") << otherPrecision;

  Tensor pos(TensorType{DType::i64, {1, 2048, 1}}), h(TensorType{DType::f32, {2048, 16}});
  for (int64_t i = 0; i < 2048; ++i) pos.setDouble(i, static_cast<double>(i));
  for (int64_t i = 0; i < h.numel(); ++i) h.setDouble(i, u(rng));
  auto backend = createCpuBackend();
  const auto outs = evaluate(*g, {{"pos", pos}, {"h", h}}, *backend);
  double worst = 0;
  for (int64_t t = 0; t < 2048; ++t)
    for (int64_t j = 0; j < 32; ++j) {
      const double angle = static_cast<double>(t) * static_cast<double>(static_cast<float>(inv.getDouble(j % 16)));
      worst = std::max(worst, std::fabs(outs[0].getDouble(t * 32 + j) - std::cos(angle)));
      worst = std::max(worst, std::fabs(outs[1].getDouble(t * 32 + j) - std::sin(angle)));
    }
  EXPECT_LT(worst, 1e-3) << "cos/sin of the positions against f64";
}

// AffineGrid (F.affine_grid) imports as a product and a sum, not a MatMul, so that autocast leaves
// the grid's coordinates in FP32 (at bf16 they would be off by up to a pixel at 224 px, and
// PyTorch's AMP computes them in the input's precision): no value of the painted graph is bf16, and
// the grid equals the f32 graph's.
TEST(Autocast, AffineGridStaysFp32) {
  test::TempDir d;
  auto m = test::newModel(17);
  m.mutable_opset_import(0)->set_version(20);
  auto* g = m.mutable_graph();
  test::addTensorInput(g, "theta", onnx::TensorProto::FLOAT, {2, 2, 3});
  test::addInt64Init(g, "size", {2, 3, 224, 224});
  test::addNode(g, "AffineGrid", {"theta", "size"}, {"grid"}, "grid");
  test::addOutput(g, "grid");
  test::writeModel(d.file("affine.onnx"), m);
  auto plain = importOnnxFile(d.file("affine.onnx"));
  auto painted = importOnnxFile(d.file("affine.onnx"));
  AutocastOptions ao;
  ao.low = DType::bf16;
  createAutocastPass(ao)->run(*painted);
  for (const auto& n : painted->nodes())
    for (size_t i = 0; i < n->numResults(); ++i) EXPECT_NE(n->result(i)->type().dtype, DType::bf16) << n->describe();
  Tensor theta(TensorType{DType::f32, {2, 2, 3}});
  for (int64_t i = 0; i < theta.numel(); ++i) theta.setDouble(i, std::sin(1.7 * static_cast<double>(i)));
  auto backend = createCpuBackend();
  const Tensor a = evaluate(*plain, {{"theta", theta}}, *backend)[0], b = evaluate(*painted, {{"theta", theta}}, *backend)[0];
  ASSERT_EQ(a.type, b.type);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.getDouble(i), b.getDouble(i)) << i;
}
