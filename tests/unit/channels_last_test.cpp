// The channels-last placement (passes/channels_last.h): which 4-d values the CUDA backend stores
// NHWC. Pure IR: runs without a GPU (tests/gpu checks the numbers on the device).
#include <filesystem>

#include <gtest/gtest.h>

#include "compiler/ir/text.h"
#include "passes/channels_last.h"
#include "tests/common/train_graph.h"

using namespace ampc;

namespace {

std::unique_ptr<Graph> trainGraph(const std::string& model, DType precision) {
  return ampc::test::trainGraph(std::filesystem::path(AMPC_SOURCE_DIR) / "models", model, precision, TrainOptions{});
}

// resnet_tiny at f16: every convolution's result and every gradient a ConvGrad reads or writes in
// the network (channels multiples of 8) is channels-last; nothing the step exchanges with the host
// (inputs, params, outputs) is; the image (3 channels) is not a candidate.
TEST(ChannelsLast, ResNetActivationsAndGradients) {
  auto g = trainGraph("resnet_tiny", DType::f16);
  const auto nhwc = placeChannelsLast(*g);
  int convs = 0, grads = 0;
  for (const auto& n : g->nodes()) {
    if (n->domain().empty() && n->op() == "Conv") {
      ++convs;
      EXPECT_TRUE(nhwc.count(n->result(0))) << n->describe();
      EXPECT_TRUE(nhwcConv(*n)) << n->describe();
    }
    if (n->domain() == "ampc" && n->op() == "ConvGrad") {
      ++grads;
      EXPECT_TRUE(nhwc.count(n->inputs()[0])) << n->describe() << ": dY";
      if (layoutCandidate(n->inputs()[1])) EXPECT_TRUE(nhwc.count(n->inputs()[1])) << n->describe() << ": X";
      EXPECT_FALSE(nhwc.count(n->result(1))) << n->describe() << ": dW keeps the weights' layout";
    }
    if (n->domain().empty() && (n->op() == "BatchNormalization" || n->op() == "MaxPool")) EXPECT_TRUE(nhwc.count(n->inputs()[0])) << n->describe();
  }
  EXPECT_EQ(convs, 9);
  EXPECT_EQ(grads, 9);
  for (const auto* list : {&g->inputs(), &g->params(), &g->outputs()})
    for (const Value* v : *list) EXPECT_FALSE(nhwc.count(v)) << v->name();
  EXPECT_FALSE(layoutCandidate(g->lookup("x")));
  EXPECT_GT(nhwc.size(), 40u);
}

// Nothing at f32 (cuDNN's FMA convolutions stay NCHW), and nothing in the small CNN: its
// convolutions add a bias (a broadcast operand pins their results, and with them the component).
TEST(ChannelsLast, NoneAtF32OrWithConvolutionBiases) {
  EXPECT_TRUE(placeChannelsLast(*trainGraph("resnet_tiny", DType::f32)).empty());
  EXPECT_TRUE(placeChannelsLast(*trainGraph("cnn", DType::f16)).empty());
}

// One op without an NHWC form pins its whole component: a Reshape of the batch norm's result keeps
// the convolution's output, the batch norm and the Relu NCHW; a second convolution whose result
// only reaches a graph output through elementwise ops stays NCHW too (the output pins it).
TEST(ChannelsLast, PinnedComponents) {
  auto g = parseGraph(R"(graph "p" opset 17 {
  input %x : f16[2,8,6,6]
  input %w : f16[8,8,3,3]
  input %s : f32[8]
  input %b : f32[8]
  input %m : f32[8]
  input %v : f32[8]
  const %shape : i64[2] = [2, 288]
  %y : f16[2,8,6,6] = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %n : f16[2,8,6,6] = BatchNormalization(%y, %s, %b, %m, %v) {training_mode = 1}
  %r : f16[2,8,6,6] = Relu(%n)
  %f : f16[2,288] = Reshape(%r, %shape)
  %y2 : f16[2,8,6,6] = Conv(%r, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %z : f16[2,8,6,6] = Relu(%y2)
  %y3 : f16[2,8,6,6] = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %a : f16[2,8,6,6] = Add(%y3, %x)
  %z3 : f16[2,8,6,6] = Relu(%a)
  %y4 : f16[2,8,6,6] = Conv(%z3, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  output %f
  output %z
  output %y4
}
)");
  const auto nhwc = placeChannelsLast(*g);
  for (const char* v : {"y", "n", "r", "y2", "z", "x"}) EXPECT_FALSE(nhwc.count(g->lookup(v))) << v;
  // y3's component (Add with the graph input x) is pinned by x; nothing is left channels-last.
  for (const char* v : {"y3", "a", "z3", "y4"}) EXPECT_FALSE(nhwc.count(g->lookup(v))) << v;
  EXPECT_TRUE(nhwc.empty());
}

// A chain with no boundary: the convolution's result, its batch norm and Relu, into a second
// convolution, are channels-last; the second convolution's result is a graph output (NCHW).
TEST(ChannelsLast, InnerChainIsChannelsLast) {
  auto g = parseGraph(R"(graph "c" opset 17 {
  input %x : f16[2,3,12,12]
  input %w1 : f16[16,3,3,3]
  input %w2 : f16[8,16,3,3]
  input %s : f32[16]
  input %b : f32[16]
  input %m : f32[16]
  input %v : f32[16]
  %y : f16[2,16,12,12] = Conv(%x, %w1) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %n : f16[2,16,12,12] = BatchNormalization(%y, %s, %b, %m, %v) {training_mode = 1}
  %r : f16[2,16,12,12] = Relu(%n)
  %p : f16[2,16,6,6] = MaxPool(%r) {kernel_shape = [2, 2], strides = [2, 2]}
  %y2 : f16[2,8,6,6] = Conv(%p, %w2) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  output %y2
}
)");
  const auto nhwc = placeChannelsLast(*g);
  for (const char* v : {"y", "n", "r", "p"}) EXPECT_TRUE(nhwc.count(g->lookup(v))) << v;
  for (const char* v : {"x", "y2", "w1"}) EXPECT_FALSE(nhwc.count(g->lookup(v))) << v;
}

}  // namespace
