// The text form: print/parse round trip on hand-written graphs, attribute kinds, and parse errors.
#include <gtest/gtest.h>

#include "compiler/ir/text.h"

using namespace ampc;

namespace {
const char* kGraph = R"(graph "g" opset 17 {
  domain "com.example" 1
  input %x : f32[2,3]
  input %"odd name" : i64[2]
  param %w : f32[3,4]
  const %shape : i64[2] = [4, -1]
  const %big : f32[100] = ...
  const %h : f16[2] = [0.5, -inf]
  %y : f32[2,4] = MatMul(%x, %w) @/mm
  %z : f32[4,2] = Reshape(%y, %shape) {allowzero = 0}
  %s : f32[4,2] = Clip(%z, _, _)
  %c : f32[4,2] = com.example::MyOp(%s) {alpha = 0.25, dims = [1, 2], empty = [], fl = [1.5, 2.0], mode = "a \"q\"", names = ["p", "q"], t = f32[2] [1.0, 2.5], tf = []f}
  output %c
}
)";
}  // namespace

TEST(Text, RoundTripIsStable) {
  auto g = parseGraph(kGraph);
  std::string once = printGraph(*g);
  EXPECT_EQ(once, kGraph);
  auto g2 = parseGraph(once);
  EXPECT_EQ(printGraph(*g2), once);
  // Attributes kept their kinds.
  const Node* op = g->nodes().back().get();
  EXPECT_EQ(op->domain(), "com.example");
  EXPECT_EQ(op->getFloat("alpha", 0), 0.25f);
  EXPECT_EQ(op->getInts("dims"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(op->getString("mode", ""), "a \"q\"");
  EXPECT_EQ(std::get<Tensor>(*op->attr("t")).getDouble(1), 2.5);
  EXPECT_TRUE(std::holds_alternative<std::vector<float>>(*op->attr("tf")));
  EXPECT_EQ(g->lookup("big")->data(), nullptr);
  EXPECT_EQ(g->lookup("shape")->constData()->toInts(), (std::vector<int64_t>{4, -1}));
  EXPECT_EQ(g->nodes().front()->name(), "/mm");
}

TEST(Text, FloatsRoundTripExactly) {
  std::string t = "graph \"g\" opset 17 {\n  const %c : f32[4] = [0.1, 3.4028235e+38, 1e-45, -0.0]\n"
                  "  const %d : f64[2] = [0.1, 1e-300]\n  const %b : bf16[1] = [0.1]\n  output %c\n}\n";
  auto g = parseGraph(t);
  EXPECT_EQ(g->lookup("c")->data()->getDouble(0), static_cast<double>(0.1f));
  EXPECT_EQ(g->lookup("d")->data()->getDouble(0), 0.1);
  EXPECT_EQ(printGraph(*parseGraph(printGraph(*g))), printGraph(*g));
}

TEST(Text, ErrorsNameLineAndColumn) {
  auto expectError = [](const std::string& text, const std::string& want) {
    try {
      parseGraph(text, "t.ir");
      FAIL() << "parsed: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expectError("graph \"g\" opset 17 {\n  %y : f32[2] = Relu(%x)\n}\n", "t.ir:2:22: use of undefined value %x");
  expectError("graph \"g\" opset 17 {\n  input %x : f33[2]\n}\n", "t.ir:2:14: unknown dtype 'f33'");
  expectError("graph \"g\" opset 17 {\n  input %x : f32[2]\n  input %x : f32[2]\n", "t.ir:3:9: value %x is defined twice");
  expectError("graph \"g\" opset 17 {\n  const %c : i64[2] = [1]\n}\n", "1 elements for i64[2]");
  expectError("graph \"g\" opset 17 {\n  input %x : f32[2]\n", "expected input, param, const, output or a node");
  // A constant declared larger than its text is refused before 1.2 TB is allocated (fuzz_ir_text).
  expectError("graph \"g\" opset 17 {\n  const %c : i64[155555555555] = [2]\n}\n", "the text holds fewer than the 155555555555 elements");
}
