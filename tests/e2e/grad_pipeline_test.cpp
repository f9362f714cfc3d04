// The gradients `ampc --grad` writes (the whole compile pipeline: import, CSE, the fusions, the
// target's shape rewrites, autodiff, f32 CPU kernels) against the plain gradients of the same
// imported graph in f64 (autodiff alone), and those against central differences of its f64 loss,
// on fresh random data, for the shapes of blocks that the model libraries
// build and that no single-op test sees together: timm's weight-standardised convolutions as
// PyTorch's dynamo exporter writes them, ResNeSt's split attention (a BatchNorm over pooled
// [N, C, 1, 1]), a RegNet block at a 4 x 4 map (grouped stride-2 convolution, squeeze-excitation,
// a strided shortcut), DPN's dual paths (channel slices and concatenation, pre-activation).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/evaluator.h"
#include "runtime/npy.h"
#include "tests/e2e/model_refs.h"
#include "tests/unit/test_util.h"

using namespace ampc;
namespace fs = std::filesystem;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    uint64_t seed = std::random_device{}();
    std::printf("grad_pipeline_test seed %llu\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return r;
}

struct Case {
  const char* name;
  const char* body;  // inputs, params (random; those named v* positive: running variances), consts and nodes, ending in %y
};

// The two weight standardisations' shared lines: two standardised weights (with and without a
// gain), each around its BatchNorm (written in the form the case names), and the convolutions.
#define WS_PREFIX \
  "input %x : f32[2,4,6,6]\n" \
  "param %w1 : f32[8,4,1,1]\n param %g1 : f32[8,1,1,1]\n param %w2 : f32[8,2,3,3]\n" \
  "const %s1 : i64[3] = [1, 8, -1]\n const %ax : i64[2] = [0, 2]\n const %flat : i64[1] = [-1]\n" \
  "const %half : f32[] = [0.5]\n const %z8 : f32[8] = [0, 0, 0, 0, 0, 0, 0, 0]\n const %one8 : f32[8] = [1, 1, 1, 1, 1, 1, 1, 1]\n" \
  "%w1r : f32[1,8,4] = Reshape(%w1, %s1)\n" \
  "%w1m : f32[1,8,1] = ReduceMean(%w1r, %ax)\n %w1mean : f32[8] = Squeeze(%w1m, %ax)\n" \
  "%w1d : f32[1,8,4] = Sub(%w1r, %w1m)\n %w1s : f32[1,8,4] = Mul(%w1d, %w1d)\n" \
  "%w1v : f32[1,8,1] = ReduceMean(%w1s, %ax)\n %w1var : f32[8] = Squeeze(%w1v, %ax)\n" \
  "%g1s : f32[8,1,1,1] = Mul(%g1, %half)\n %g1v : f32[8] = Reshape(%g1s, %flat)\n"
#define WS_MIDDLE \
  "const %ws1 : i64[4] = [8, 4, 1, 1]\n %w1std : f32[8,4,1,1] = Reshape(%w1n, %ws1)\n" \
  "%y1 : f32[2,8,3,3] = Conv(%x, %w1std) {kernel_shape = [1, 1], strides = [2, 2]}\n" \
  "%w2r : f32[1,8,18] = Reshape(%w2, %s1)\n" \
  "%w2m : f32[1,8,1] = ReduceMean(%w2r, %ax)\n %w2mean : f32[8] = Squeeze(%w2m, %ax)\n" \
  "%w2d : f32[1,8,18] = Sub(%w2r, %w2m)\n %w2s : f32[1,8,18] = Mul(%w2d, %w2d)\n" \
  "%w2v : f32[1,8,1] = ReduceMean(%w2s, %ax)\n %w2var : f32[8] = Squeeze(%w2v, %ax)\n"
#define WS_SUFFIX \
  "const %ws2 : i64[4] = [8, 2, 3, 3]\n %w2std : f32[8,2,3,3] = Reshape(%w2n, %ws2)\n" \
  "%a1 : f32[2,8,3,3] = Relu(%y1)\n" \
  "%y : f32[2,8,3,3] = Conv(%a1, %w2std) {group = 4, kernel_shape = [3, 3], pads = [1, 1, 1, 1]}\n"

const Case kCases[] = {
    // StdConv2d / ScaledStdConv2d: F.batch_norm(w.reshape(1, O, -1), None, None, weight=gain * scale,
    // training=True) in BatchNormalization's training form, its statistics operands the weight's own
    // mean and variance; a 1x1 stride-2 convolution (the shortcut) and a grouped 3x3 one.
    {"weight_standardisation",
     WS_PREFIX
     "%w1n : f32[1,8,4], %w1rm : f32[8], %w1rv : f32[8] = BatchNormalization(%w1r, %g1v, %z8, %w1mean, %w1var) "
     "{epsilon = 1e-06, momentum = 0.0, training_mode = 1}\n"
     WS_MIDDLE
     "%w2n : f32[1,8,18], %w2rm : f32[8], %w2rv : f32[8] = BatchNormalization(%w2r, %one8, %z8, %w2mean, %w2var) "
     "{epsilon = 1e-08, momentum = 0.0, training_mode = 1}\n"
     WS_SUFFIX},
    // The same in the inference form with the weight's own statistics as operands, as PyTorch
    // 2.11's dynamo exporter writes F.batch_norm without running statistics (stop 50's sweep: timm's
    // nf_regnet_b0 and resnetv2_50x1_bit got their conv weights' gradients wrong, the statistics'
    // share missing, while the loss and the training steps, invariant to it, matched).
    {"weight_standardisation_inference_form",
     WS_PREFIX
     "%w1n : f32[1,8,4] = BatchNormalization(%w1r, %g1v, %z8, %w1mean, %w1var) {epsilon = 1e-06}\n"
     WS_MIDDLE
     "%w2n : f32[1,8,18] = BatchNormalization(%w2r, %one8, %z8, %w2mean, %w2var) {epsilon = 1e-08}\n"
     WS_SUFFIX},
    // The same written out (var_mean, rsqrt, the gain as a product): the centred weight times
    // rsqrt(mean of its squares + eps), which reads as an RMS norm over the last axis.
    {"weight_standardisation_written_out",
     "input %x : f32[2,4,6,6]\n param %w1 : f32[8,4,3,3]\n param %g1 : f32[8,1,1,1]\n"
     "const %s1 : i64[3] = [1, 8, -1]\n const %ax : i64[2] = [0, 2]\n const %eps : f32[] = [1e-06]\n const %s3 : i64[3] = [1, 8, 1]\n"
     "%w1r : f32[1,8,36] = Reshape(%w1, %s1)\n %m : f32[1,8,1] = ReduceMean(%w1r, %ax)\n"
     "%d : f32[1,8,36] = Sub(%w1r, %m)\n %sq : f32[1,8,36] = Mul(%d, %d)\n %v : f32[1,8,1] = ReduceMean(%sq, %ax)\n"
     "%ve : f32[1,8,1] = Add(%v, %eps)\n %rs : f32[1,8,1] = Sqrt(%ve)\n %ri : f32[1,8,1] = Reciprocal(%rs)\n"
     "%n : f32[1,8,36] = Mul(%d, %ri)\n %gr : f32[1,8,1] = Reshape(%g1, %s3)\n %ng : f32[1,8,36] = Mul(%n, %gr)\n"
     "const %ws : i64[4] = [8, 4, 3, 3]\n %wstd : f32[8,4,3,3] = Reshape(%ng, %ws)\n"
     "%y : f32[2,8,3,3] = Conv(%x, %wstd) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"},
    // ResNeSt's SplitAttn (radix 2): a grouped convolution, BatchNorm and ReLU, the radix sum pooled to
    // [N, C, 1, 1], a 1x1 convolution, a BatchNorm over the pooled map (the dynamo exporter's
    // inference form, trained with batch statistics), the radix softmax, the weighted sum.
    {"split_attention",
     "input %x : f32[4,4,5,5]\n param %wc : f32[8,2,3,3]\n"
     "param %s0 : f32[8]\n param %b0 : f32[8]\n param %m0 : f32[8]\n param %v0 : f32[8]\n"
     "param %wf1 : f32[6,4,1,1]\n param %bf1 : f32[6]\n param %s1 : f32[6]\n param %b1 : f32[6]\n param %m1 : f32[6]\n param %v1 : f32[6]\n"
     "param %wf2 : f32[8,6,1,1]\n param %bf2 : f32[8]\n"
     "%h : f32[4,8,5,5] = Conv(%x, %wc) {group = 2, kernel_shape = [3, 3], pads = [1, 1, 1, 1]}\n"
     "%hb : f32[4,8,5,5] = BatchNormalization(%h, %s0, %b0, %m0, %v0)\n %hr : f32[4,8,5,5] = Relu(%hb)\n"
     "const %sp : i64[5] = [4, 2, 4, 5, 5]\n %h5 : f32[4,2,4,5,5] = Reshape(%hr, %sp)\n"
     "const %a1 : i64[1] = [1]\n %gs : f32[4,4,5,5] = ReduceSum(%h5, %a1) {keepdims = 0}\n"
     "const %a23 : i64[2] = [2, 3]\n %gap : f32[4,4,1,1] = ReduceMean(%gs, %a23)\n"
     "%f1 : f32[4,6,1,1] = Conv(%gap, %wf1, %bf1) {kernel_shape = [1, 1]}\n"
     "%f1b : f32[4,6,1,1] = BatchNormalization(%f1, %s1, %b1, %m1, %v1)\n %f1r : f32[4,6,1,1] = Relu(%f1b)\n"
     "%f2 : f32[4,8,1,1] = Conv(%f1r, %wf2, %bf2) {kernel_shape = [1, 1]}\n"
     "const %rs : i64[4] = [4, 1, 2, 4]\n %f2r : f32[4,1,2,4] = Reshape(%f2, %rs)\n"
     "%f2t : f32[4,2,1,4] = Transpose(%f2r) {perm = [0, 2, 1, 3]}\n %att : f32[4,2,1,4] = Softmax(%f2t) {axis = 1}\n"
     "const %as : i64[5] = [4, 2, 4, 1, 1]\n %att5 : f32[4,2,4,1,1] = Reshape(%att, %as)\n"
     "%o5 : f32[4,2,4,5,5] = Mul(%h5, %att5)\n %y : f32[4,4,5,5] = ReduceSum(%o5, %a1) {keepdims = 0}\n"},
    // A RegNetY block entering a stage at a 4 x 4 map: 1x1 conv, BN, ReLU; grouped 3x3 stride 2, BN,
    // ReLU; squeeze-excitation; 1x1 conv, BN; a 1x1 stride-2 shortcut with its BN; the sum's ReLU;
    // global pooling and a linear head.
    {"regnet_block",
     "input %x0 : f32[2,8,4,4]\n param %w0 : f32[8,8,3,3]\n param %s0 : f32[8]\n param %b0 : f32[8]\n param %m0 : f32[8]\n param %v0 : f32[8]\n"
     "%c0 : f32[2,8,4,4] = Conv(%x0, %w0) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}\n"
     "%n0 : f32[2,8,4,4] = BatchNormalization(%c0, %s0, %b0, %m0, %v0)\n %x : f32[2,8,4,4] = Relu(%n0)\n"
     "param %wa : f32[16,8,1,1]\n param %sa : f32[16]\n param %ba : f32[16]\n param %ma : f32[16]\n param %va : f32[16]\n"
     "param %wb : f32[16,4,3,3]\n param %sb : f32[16]\n param %bb : f32[16]\n param %mb : f32[16]\n param %vb : f32[16]\n"
     "param %we1 : f32[2,16,1,1]\n param %be1 : f32[2]\n param %we2 : f32[16,2,1,1]\n param %be2 : f32[16]\n"
     "param %wc : f32[16,16,1,1]\n param %sc : f32[16]\n param %bc : f32[16]\n param %mc : f32[16]\n param %vc : f32[16]\n"
     "param %wd : f32[16,8,1,1]\n param %sd : f32[16]\n param %bd : f32[16]\n param %md : f32[16]\n param %vd : f32[16]\n"
     "param %wl : f32[5,16]\n param %bl : f32[5]\n"
     "%a : f32[2,16,4,4] = Conv(%x, %wa) {kernel_shape = [1, 1]}\n"
     "%an : f32[2,16,4,4] = BatchNormalization(%a, %sa, %ba, %ma, %va)\n %ar : f32[2,16,4,4] = Relu(%an)\n"
     "%b : f32[2,16,2,2] = Conv(%ar, %wb) {group = 4, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
     "%bn : f32[2,16,2,2] = BatchNormalization(%b, %sb, %bb, %mb, %vb)\n %br : f32[2,16,2,2] = Relu(%bn)\n"
     "%sq : f32[2,16,1,1] = GlobalAveragePool(%br)\n"
     "%e1 : f32[2,2,1,1] = Conv(%sq, %we1, %be1) {kernel_shape = [1, 1]}\n %e1r : f32[2,2,1,1] = Relu(%e1)\n"
     "%e2 : f32[2,16,1,1] = Conv(%e1r, %we2, %be2) {kernel_shape = [1, 1]}\n %e2s : f32[2,16,1,1] = Sigmoid(%e2)\n"
     "%se : f32[2,16,2,2] = Mul(%br, %e2s)\n"
     "%c : f32[2,16,2,2] = Conv(%se, %wc) {kernel_shape = [1, 1]}\n %cn : f32[2,16,2,2] = BatchNormalization(%c, %sc, %bc, %mc, %vc)\n"
     "%d : f32[2,16,2,2] = Conv(%x, %wd) {kernel_shape = [1, 1], strides = [2, 2]}\n"
     "%dn : f32[2,16,2,2] = BatchNormalization(%d, %sd, %bd, %md, %vd)\n"
     "%s : f32[2,16,2,2] = Add(%cn, %dn)\n %sr : f32[2,16,2,2] = Relu(%s)\n"
     "%p : f32[2,16,1,1] = GlobalAveragePool(%sr)\n %pf : f32[2,16] = Flatten(%p)\n"
     "%y : f32[2,5] = Gemm(%pf, %wl, %bl) {transB = 1}\n"},
    {"regnet_block_wide",
     "input %x0 : f32[2,1024,4,4]\n param %w0 : f32[1024,1024,1,1]\n param %s0 : f32[1024]\n param %b0 : f32[1024]\n param %m0 : f32[1024]\n param %v0 : f32[1024]\n"
     "%c0 : f32[2,1024,4,4] = Conv(%x0, %w0) {kernel_shape = [1, 1]}\n"
     "%n0 : f32[2,1024,4,4] = BatchNormalization(%c0, %s0, %b0, %m0, %v0)\n %x : f32[2,1024,4,4] = Relu(%n0)\n"
     "param %wa : f32[2048,1024,1,1]\n param %sa : f32[2048]\n param %ba : f32[2048]\n param %ma : f32[2048]\n param %va : f32[2048]\n"
     "param %wb : f32[2048,64,3,3]\n param %sb : f32[2048]\n param %bb : f32[2048]\n param %mb : f32[2048]\n param %vb : f32[2048]\n"
     "param %we1 : f32[256,2048,1,1]\n param %be1 : f32[256]\n param %we2 : f32[2048,256,1,1]\n param %be2 : f32[2048]\n"
     "param %wc : f32[2048,2048,1,1]\n param %sc : f32[2048]\n param %bc : f32[2048]\n param %mc : f32[2048]\n param %vc : f32[2048]\n"
     "param %wd : f32[2048,1024,1,1]\n param %sd : f32[2048]\n param %bd : f32[2048]\n param %md : f32[2048]\n param %vd : f32[2048]\n"
     "param %wl : f32[5,2048]\n param %bl : f32[5]\n"
     "%a : f32[2,2048,4,4] = Conv(%x, %wa) {kernel_shape = [1, 1]}\n"
     "%an : f32[2,2048,4,4] = BatchNormalization(%a, %sa, %ba, %ma, %va)\n %ar : f32[2,2048,4,4] = Relu(%an)\n"
     "%b : f32[2,2048,2,2] = Conv(%ar, %wb) {group = 32, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
     "%bn : f32[2,2048,2,2] = BatchNormalization(%b, %sb, %bb, %mb, %vb)\n %br : f32[2,2048,2,2] = Relu(%bn)\n"
     "%sq : f32[2,2048,1,1] = GlobalAveragePool(%br)\n"
     "%e1 : f32[2,256,1,1] = Conv(%sq, %we1, %be1) {kernel_shape = [1, 1]}\n %e1r : f32[2,256,1,1] = Relu(%e1)\n"
     "%e2 : f32[2,2048,1,1] = Conv(%e1r, %we2, %be2) {kernel_shape = [1, 1]}\n %e2s : f32[2,2048,1,1] = Sigmoid(%e2)\n"
     "%se : f32[2,2048,2,2] = Mul(%br, %e2s)\n"
     "%c : f32[2,2048,2,2] = Conv(%se, %wc) {kernel_shape = [1, 1]}\n %cn : f32[2,2048,2,2] = BatchNormalization(%c, %sc, %bc, %mc, %vc)\n"
     "%d : f32[2,2048,2,2] = Conv(%x, %wd) {kernel_shape = [1, 1], strides = [2, 2]}\n"
     "%dn : f32[2,2048,2,2] = BatchNormalization(%d, %sd, %bd, %md, %vd)\n"
     "%s : f32[2,2048,2,2] = Add(%cn, %dn)\n %sr : f32[2,2048,2,2] = Relu(%s)\n"
     "%p : f32[2,2048,1,1] = GlobalAveragePool(%sr)\n %pf : f32[2,2048] = Flatten(%p)\n"
     "%y : f32[2,5] = Gemm(%pf, %wl, %bl) {transB = 1}\n"},
    // ResNet-D / ResNeSt / NF-net shortcuts and ResNeSt's avd: AvgPool2d(2, 2, ceil_mode=True,
    // count_include_pad=False) then a 1x1 convolution, on an odd map; AvgPool2d(3, 2, padding=1).
    {"average_pool_shortcuts",
     "input %x0 : f32[2,4,5,5]\n param %w0 : f32[6,4,3,3]\n param %wd : f32[8,6,1,1]\n param %wm : f32[8,6,3,3]\n"
     "%x : f32[2,6,5,5] = Conv(%x0, %w0) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}\n"
     "%p : f32[2,6,3,3] = AveragePool(%x) {ceil_mode = 1, kernel_shape = [2, 2], strides = [2, 2]}\n"
     "%d : f32[2,8,3,3] = Conv(%p, %wd) {kernel_shape = [1, 1]}\n"
     "%m : f32[2,8,5,5] = Conv(%x, %wm) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}\n %mr : f32[2,8,5,5] = Relu(%m)\n"
     "%a : f32[2,8,3,3] = AveragePool(%mr) {count_include_pad = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
     "%y : f32[2,8,3,3] = Add(%a, %d)\n"},
    // A DPN block: pre-activation (BN, ReLU, conv) 1x1, a grouped 3x3 stride 2, a 1x1 whose output is
    // sliced into the residual part (added to the shortcut's) and the dense part (concatenated).
    {"dual_path",
     "input %x : f32[2,12,4,4]\n"
     "param %sa : f32[12]\n param %ba : f32[12]\n param %ma : f32[12]\n param %va : f32[12]\n param %wa : f32[8,12,1,1]\n"
     "param %sb : f32[8]\n param %bb : f32[8]\n param %mb : f32[8]\n param %vb : f32[8]\n param %wb : f32[8,2,3,3]\n"
     "param %sc : f32[8]\n param %bc : f32[8]\n param %mc : f32[8]\n param %vc : f32[8]\n param %wc : f32[12,8,1,1]\n"
     "param %ws : f32[14,12,1,1]\n"
     "%an : f32[2,12,4,4] = BatchNormalization(%x, %sa, %ba, %ma, %va)\n %ar : f32[2,12,4,4] = Relu(%an)\n"
     "%a : f32[2,8,4,4] = Conv(%ar, %wa) {kernel_shape = [1, 1]}\n"
     "%bn : f32[2,8,4,4] = BatchNormalization(%a, %sb, %bb, %mb, %vb)\n %br : f32[2,8,4,4] = Relu(%bn)\n"
     "%b : f32[2,8,2,2] = Conv(%br, %wb) {group = 4, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
     "%cn : f32[2,8,2,2] = BatchNormalization(%b, %sc, %bc, %mc, %vc)\n %cr : f32[2,8,2,2] = Relu(%cn)\n"
     "%c : f32[2,12,2,2] = Conv(%cr, %wc) {kernel_shape = [1, 1]}\n"
     "%s : f32[2,14,2,2] = Conv(%ar, %ws) {kernel_shape = [1, 1], strides = [2, 2]}\n"
     "const %st0 : i64[1] = [0]\n const %en8 : i64[1] = [8]\n const %en12 : i64[1] = [12]\n const %en14 : i64[1] = [14]\n"
     "const %ax1 : i64[1] = [1]\n"
     "%cres : f32[2,8,2,2] = Slice(%c, %st0, %en8, %ax1)\n %cden : f32[2,4,2,2] = Slice(%c, %en8, %en12, %ax1)\n"
     "%sres : f32[2,8,2,2] = Slice(%s, %st0, %en8, %ax1)\n %sden : f32[2,6,2,2] = Slice(%s, %en8, %en14, %ax1)\n"
     "%res : f32[2,8,2,2] = Add(%sres, %cres)\n"
     "%y : f32[2,18,2,2] = Concat(%res, %sden, %cden) {axis = 1}\n"},
};

#undef WS_PREFIX
#undef WS_MIDDLE
#undef WS_SUFFIX

}  // namespace

TEST(GradPipeline, LibraryBlocksMatchPlainAutodiffInF64) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    std::uniform_real_distribution<double> u(-1, 1), pos(0.5, 1.5);
    auto g = parseGraph(std::string("graph \"") + c.name + "\" opset 20 {\n" + c.body + "\n}\n", c.name);
    // The loss: sum(y * R), R random.
    Value* y = g->lookup("y");
    ASSERT_NE(y, nullptr);
    Tensor r(y->type());
    for (int64_t i = 0; i < r.numel(); ++i) r.setDouble(i, u(rng()));
    Value* rv = g->addConst("R", std::move(r));
    Value* m = g->createNode("Mul", "", {y, rv}, {{"yR", y->type()}})->result(0);
    Node* s = g->createNode("ReduceSum", "", {m}, {{"loss", TensorType{DType::f32, {}}}});
    s->setAttr("keepdims", int64_t{0});
    g->clearOutputs();
    g->addOutput(s->result(0));
    for (Value* p : g->params()) {
      Tensor t(p->type());
      const bool variance = p->name().size() > 1 && p->name()[0] == 'v';  // BatchNorm running variances
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, variance ? pos(rng()) : u(rng()));
      p->setData(std::move(t));
    }
    verify(*g);
    test::TempDir d;
    fs::create_directories(d.path / "inputs");
    for (Value* in : g->inputs()) {
      Tensor t(in->type());
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, u(rng()));
      writeNpy(d.file("inputs/" + in->name() + ".npy"), t);
    }
    const std::string model = d.file("m.onnx");
    exportOnnxFile(*g, model);
    // ampc --grad: the whole pipeline, f32.
    const auto r1 = test::run(std::string(AMPC_BIN) + " " + model + " --grad --eval --inputs " + d.file("inputs") + " --outputs " + d.file("g"));
    ASSERT_EQ(r1.code, 0) << r1.out;
    // The reference: the imported graph in f64, autodiff alone.
    auto ref = importOnnxFile(model);
    PassManager pm;
    pm.add(createConvertPrecisionPass(DType::f64));
    pm.add(createAutodiffPass());
    pm.run(*ref);
    std::map<std::string, Tensor> feeds;
    for (Value* in : ref->inputs()) feeds.emplace(in->name(), cpu::castTensor(readNpy(d.file("inputs/" + in->name() + ".npy")), DType::f64));
    auto backend = createCpuBackend();
    const auto outs = evaluate(*ref, feeds, *backend, ExecOptions{});
    // A gradient that is zero in exact arithmetic (a convolution bias that a BatchNorm follows) is
    // rounding noise: where the reference's norm is under 1e-6 of the largest, ours must be as small.
    double largest = 0;
    for (size_t i = 1; i < outs.size(); ++i) largest = std::max(largest, test::relL2(outs[i], Tensor(outs[i].type)));
    int compared = 0;
    double worst = 0;
    for (size_t i = 1; i < outs.size(); ++i) {
      const std::string& name = ref->outputs()[i]->name();
      const fs::path f = d.path / "g" / (name + ".npy");
      ASSERT_TRUE(fs::exists(f)) << "ampc --grad wrote no " << name;
      const Tensor ours = readNpy(f.string());
      ASSERT_EQ(ours.type.shape, outs[i].type.shape) << name;
      if (test::relL2(outs[i], Tensor(outs[i].type)) < 1e-6 * largest) {
        EXPECT_LT(test::relL2(ours, Tensor(ours.type)), 1e-5 * largest) << name << ": zero in exact arithmetic, ours is not";
        continue;
      }
      const double err = test::relL2(ours, outs[i]);
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-4) << name;
      ++compared;
    }
    // The reference itself against central differences of the f64 loss, on two elements of each
    // parameter: the gradient rules of the blocks' ops as the exporters combine them.
    auto f = importOnnxFile(model);
    PassManager convert;
    convert.add(createConvertPrecisionPass(DType::f64));
    convert.run(*f);
    auto lossAt = [&] { return evaluate(*f, feeds, *backend, ExecOptions{})[0].getDouble(0); };
    double fdNum = 0, fdDen = 0;
    for (size_t i = 1; i < outs.size(); ++i) {
      const std::string& name = ref->outputs()[i]->name();
      Value* p = f->lookup(name.substr(0, name.size() - 5));  // drop "_grad"
      ASSERT_NE(p, nullptr) << name;
      const Tensor base = *p->data();
      for (int k = 0; k < 2; ++k) {
        const int64_t e = static_cast<int64_t>(rng()() % static_cast<uint64_t>(base.numel()));
        // A small step: a ReLU kink inside it would bias the difference (f64 rounding stays ~1e-8).
        const double x = base.getDouble(e), h = 1e-7 * std::max(1.0, std::abs(x));
        Tensor t = base;
        t.setDouble(e, x + h);
        p->setData(t);
        const double lp = lossAt();
        t.setDouble(e, x - h);
        p->setData(t);
        const double lm = lossAt();
        p->setData(base);
        const double fd = (lp - lm) / (2 * h), a = outs[i].getDouble(e);
        fdNum += (fd - a) * (fd - a);
        fdDen += fd * fd;
      }
    }
    EXPECT_LE(std::sqrt(fdNum / std::max(fdDen, 1e-300)), 1e-5) << "the f64 gradients against finite differences";
    const double loss = readNpy(d.file("g/loss.npy")).getDouble(0), loss64 = outs[0].getDouble(0);
    EXPECT_NEAR(loss, loss64, 1e-5 * std::max(1.0, std::abs(loss64)));
    std::printf("%s: %d gradients, worst relative L2 against f64 %.3g\n", c.name, compared, worst);
    EXPECT_GE(compared, 2);
  }
}
