// The committed and generated models: import, text and ONNX round trips, checker, import time.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <filesystem>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "tests/e2e/model_refs.h"

using namespace ampc;
using test::modelPath;
namespace fs = std::filesystem;

namespace {


class ModelTest : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(ModelTest, ImportTextAndOnnxRoundTrip) {
  std::string path = modelPath(GetParam());
  if (!fs::exists(path)) GTEST_SKIP() << path << " was not generated (python3-torch missing?)";
  auto g = importOnnxFile(path);
  verify(*g);
  ASSERT_EQ(g->outputs().size(), 1u);
  EXPECT_EQ(g->outputs()[0]->type().str(), "f32[]");  // the loss
  EXPECT_GT(g->params().size(), 0u);
  // Text: print(parse(print(g))) == print(g).
  std::string text = printGraph(*g);
  auto parsed = parseGraph(text, path);
  verify(*parsed);
  EXPECT_EQ(printGraph(*parsed), text);
  // ONNX: export passes the checker, and import(export(g)) prints identically.
  onnx::ModelProto m = exportOnnx(*g);
  EXPECT_NO_THROW(onnx::checker::check_model(m));
  auto back = importOnnxModel(m, fs::path(path).parent_path().string(), path);
  EXPECT_EQ(printGraph(*back), text);
  // No shape subgraph survives import.
  for (const auto& n : g->nodes()) {
    EXPECT_NE(n->op(), "Shape") << n->describe();
    EXPECT_NE(n->op(), "Constant") << n->describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelTest, ::testing::Values("mlp", "cnn", "transformer", "resnet18"));

