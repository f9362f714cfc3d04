// Every CUDA kernel and every cuBLASLt / cuDNN call form against the CPU reference backend, on
// fresh random data, at f32, f16 and bf16 (tolerances: gpu_util.h). One single-op graph per case;
// $T is replaced by the dtype under test. Skips without a GPU.
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <regex>
#include <set>

#include "compiler/target.h"
#include "kernels/cuda/ops.h"
#include "passes/fold_casts.h"
#include "passes/pass.h"
#include "runtime/cuda/libs.h"
#include "tests/common/pitched_graph.h"
#include "tests/gpu/gpu_util.h"

using namespace ampc;
using namespace ampc::gputest;

namespace {

struct Spec {
  double scale = 1.0;
  int64_t lo = 0, hi = 1;
  bool positive = false;
};
struct Case {
  Case(std::string n, std::string t, std::map<std::string, Spec> in = {}, bool fo = true, double ts = 1.0)
      : name(std::move(n)), text(std::move(t)), inputs(std::move(in)), floatOnly(fo), tolScale(ts) {}
  std::string name, text;
  std::map<std::string, Spec> inputs;  // how to draw each input (default: N(0, 1) floats)
  bool floatOnly;                      // run at f32, f16, bf16 ($T); else once
  double tolScale;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  auto unary = [&](const std::string& op, const std::string& attrs = "", bool positive = false) {
    c.push_back({op, "input %x : $T[7,33]\n%y : $T[7,33] = " + op + "(%x)" + attrs + "\noutput %y", {{"x", {2.0, 0, 1, positive}}}});
  };
  for (const char* op : {"Exp", "Tanh", "Sigmoid", "Erf", "Gelu", "Softplus", "Relu", "Neg", "Abs", "Reciprocal", "Sin", "Cos", "HardSwish", "Selu", "Mish", "Floor", "Ceil", "Round", "Sign"}) unary(op);
  unary("HardSigmoid", " {alpha = 0.3, beta = 0.4}");
  unary("Elu", " {alpha = 0.7}");
  unary("Celu", " {alpha = 2.0}");
  // (The trigonometric and hyperbolic family has no kernel of its own: only generated ones, which
  // the lowering makes even for a lone node; GpuFused's "trig" group checks them.)
  c.push_back({"Random", "input %x : $T[9,33]\n%u : $T[9,33] = RandomUniformLike(%x) {high = 3.0, low = -1.0}\n"
                         "%n : $T[9,33] = RandomNormalLike(%x)\n%b : $T[9,33] = Bernoulli(%x)\noutput %u\noutput %n\noutput %b",
               {{"x", {0.3, 0, 1, true}}}});
  c.push_back({"PRelu", "input %x : $T[3,4,5]\ninput %s : $T[4,1]\n%y : $T[3,4,5] = PRelu(%x, %s)\noutput %y"});
  c.push_back({"Mod_fmod", "input %a : $T[6,7]\ninput %b : $T[7]\n%y : $T[6,7] = Mod(%a, %b) {fmod = 1}\noutput %y", {{"b", {1.0, 0, 1, true}}}});
  c.push_back({"Mod_i64", "input %a : i64[40]\ninput %b : i64[40]\n%y : i64[40] = Mod(%a, %b)\noutput %y", {{"a", {1, -20, 20}}, {"b", {1, 1, 6}}}, false});
  unary("Sqrt", "", true);
  unary("Log", "", true);
  unary("LeakyRelu", " {alpha = 0.2}");
  unary("Gelu", " {approximate = \"tanh\"}");
  unary("Identity");
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"}) {
    c.push_back({std::string(op) + "_same", "input %a : $T[16,40]\ninput %b : $T[16,40]\n%y : $T[16,40] = " + std::string(op) + "(%a, %b)\noutput %y"});
    c.push_back({std::string(op) + "_broadcast",
                 "input %a : $T[3,1,5,6]\ninput %b : $T[4,1,6]\n%y : $T[3,4,5,6] = " + std::string(op) + "(%a, %b)\noutput %y"});
  }
  // Broadcasts read as one block of the output's dims: trailing (a mask), a column, a middle block.
  c.push_back({"Add_trailing", "input %a : $T[3,4,5,6]\ninput %b : $T[1,1,5,6]\n%y : $T[3,4,5,6] = Add(%a, %b)\noutput %y"});
  c.push_back({"Sub_column", "input %a : $T[3,4,5,6]\ninput %b : $T[3,4,5,1]\n%y : $T[3,4,5,6] = Sub(%a, %b)\noutput %y"});
  c.push_back({"Mul_middle", "input %a : $T[3,4,5,6]\ninput %b : $T[4,5,1]\n%y : $T[3,4,5,6] = Mul(%b, %a)\noutput %y"});
  c.push_back({"Add_scalar", "input %a : $T[5,9]\ninput %b : $T[]\n%y : $T[5,9] = Add(%a, %b)\noutput %y"});
  c.push_back({"Pow", "input %a : $T[6,7]\ninput %b : f32[]\n%y : $T[6,7] = Pow(%a, %b)\noutput %y", {{"a", {1.0, 0, 1, true}}}});
  c.push_back({"Max_variadic", "input %a : $T[4,5]\ninput %b : $T[5]\ninput %d : $T[4,1]\n%y : $T[4,5] = Max(%a, %b, %d)\noutput %y"});
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})
    c.push_back({op, "input %a : $T[8,9]\ninput %b : $T[9]\n%y : bool[8,9] = " + std::string(op) + "(%a, %b)\noutput %y"});
  c.push_back({"Equal_i64", "input %a : i64[50]\ninput %b : i64[50]\n%y : bool[50] = Equal(%a, %b)\noutput %y", {{"a", {1, 0, 3}}, {"b", {1, 0, 3}}}, false});
  c.push_back({"Logic", "input %a : bool[30]\ninput %b : bool[30]\n%p : bool[30] = And(%a, %b)\n%q : bool[30] = Or(%a, %b)\n%r : bool[30] = Not(%a)\noutput %p\noutput %q\noutput %r", {}, false});
  c.push_back({"Where", "input %c : bool[6,1]\ninput %a : $T[6,8]\ninput %b : $T[8]\n%y : $T[6,8] = Where(%c, %a, %b)\noutput %y"});
  // A comparison fused into its Where (ReLU's gradient); the comparison's operand %e dies there in
  // the graph, and %t, made in between, must not take its bytes.
  c.push_back({"Where_fused_comparison", "input %x : $T[64,33]\ninput %dy : $T[64,33]\nconst %z : $T[] = [0.0]\nconst %one : $T[] = [1.0]\n"
                                         "%e : $T[64,33] = Exp(%x)\n%g : bool[64,33] = Greater(%e, %one)\n%t : $T[64,33] = Neg(%dy)\n%y : $T[64,33] = Where(%g, %t, %z)\noutput %y",
               {{"x", {3.0}}}});
  c.push_back({"Where_fused_less", "input %x : $T[8,9]\ninput %b : $T[9]\ninput %u : $T[8,9]\n%g : bool[8,9] = Less(%x, %b)\n"
                                   "%y : $T[8,9] = Where(%g, %u, %x)\noutput %y"});
  // Casts folded into elementwise ops: a widening cast read through by Add, a narrowing cast written
  // by Mul; %w's cast has two uses and stays.
  c.push_back({"Cast_folding", "input %x : $T[33,40]\ninput %y : f32[33,40]\ninput %v : $T[40]\n"
                               "%xf : f32[33,40] = Cast(%x) {to = 1}\n%s : f32[33,40] = Add(%xf, %y)\n"
                               "%vf : f32[40] = Cast(%v) {to = 1}\n%m : f32[33,40] = Mul(%s, %vf)\n%ml : $T[33,40] = Cast(%m) {to = $TO}\n"
                               "%w : f32[33,40] = Exp(%xf)\n%u : f32[33,40] = Sub(%w, %s)\n%ul : $T[33,40] = Cast(%u) {to = $TO}\n"
                               "%q : f32[33,40] = Neg(%w)\noutput %ml\noutput %ul\noutput %q"});
  c.push_back({"Clip", "input %x : $T[10,10]\nconst %lo : $T[] = [-0.5]\nconst %hi : $T[] = [0.75]\n%y : $T[10,10] = Clip(%x, %lo, %hi)\noutput %y"});
  c.push_back({"IsNaN_IsInf", "input %x : $T[40]\n%a : bool[40] = IsNaN(%x)\n%b : bool[40] = IsInf(%x)\noutput %a\noutput %b"});
  c.push_back({"Cast_to_f32", "input %x : $T[33,5]\n%y : f32[33,5] = Cast(%x) {to = 1}\noutput %y"});
  c.push_back({"Cast_from_f32", "input %x : f32[33,5]\n%y : $T[33,5] = Cast(%x) {to = $TO}\noutput %y"});
  c.push_back({"Cast_to_i64", "input %x : $T[64]\n%y : i64[64] = Cast(%x) {to = 7}\noutput %y", {{"x", {20.0}}}});
  c.push_back({"Cast_from_i64", "input %x : i64[64]\n%y : $T[64] = Cast(%x) {to = $TO}\noutput %y", {{"x", {1, -1000, 1000}}}});
  // Vectorised path: same-shape f16/bf16, length not a multiple of 8.
  c.push_back({"Mul_long", "input %a : $T[100003]\ninput %b : $T[100003]\n%y : $T[100003] = Mul(%a, %b)\noutput %y"});
  // Data movement.
  c.push_back({"Reshape", "input %x : $T[4,6]\nconst %s : i64[2] = [3, 8]\n%y : $T[3,8] = Reshape(%x, %s)\noutput %y"});
  c.push_back({"Transpose", "input %x : $T[2,3,4,5]\n%y : $T[5,2,4,3] = Transpose(%x) {perm = [3, 0, 2, 1]}\noutput %y"});
  // Innermost dim contiguous on both sides: copied 16 bytes at a time.
  c.push_back({"Transpose_keep_last", "input %x : $T[2,5,3,16]\n%y : $T[2,3,5,16] = Transpose(%x) {perm = [0, 2, 1, 3]}\noutput %y"});
  // Transposes that move the innermost dim run as tiled [batch, R, C] -> [batch, C, R]: K to K^T in
  // attention, a plain 2-d one, one with unit dims between.
  c.push_back({"Transpose_to_KT", "input %x : $T[2,37,3,16]\n%y : $T[2,3,16,37] = Transpose(%x) {perm = [0, 2, 3, 1]}\noutput %y"});
  c.push_back({"Transpose_2d", "input %x : $T[70,33]\n%y : $T[33,70] = Transpose(%x) {perm = [1, 0]}\noutput %y"});
  c.push_back({"Transpose_unit_dims", "input %x : $T[1,40,1,36]\n%y : $T[36,1,40,1] = Transpose(%x) {perm = [3, 0, 1, 2]}\noutput %y"});
  c.push_back({"Concat_rows", "input %a : $T[4,2,32]\ninput %b : $T[4,3,32]\n%y : $T[4,5,32] = Concat(%a, %b) {axis = 1}\noutput %y"});
  c.push_back({"Slice", "input %x : $T[10,12]\nconst %st : i64[2] = [1, -2]\nconst %en : i64[2] = [9, 0]\nconst %ax : i64[2] = [0, 1]\n"
                        "const %sp : i64[2] = [3, -4]\n%y : $T[3,3] = Slice(%x, %st, %en, %ax, %sp)\noutput %y"});
  c.push_back({"Expand", "input %x : $T[3,1]\nconst %s : i64[3] = [2, 3, 4]\n%y : $T[2,3,4] = Expand(%x, %s)\noutput %y"});
  c.push_back({"Concat", "input %a : $T[2,3,4]\ninput %b : $T[2,1,4]\n%y : $T[2,4,4] = Concat(%a, %b) {axis = 1}\noutput %y"});
  c.push_back({"Split", "input %x : $T[5,6]\nconst %s : i64[2] = [2, 4]\n%a : $T[5,2], %b : $T[5,4] = Split(%x, %s) {axis = -1}\noutput %a\noutput %b"});
  c.push_back({"Pad", "input %x : $T[3,4]\nconst %p : i64[4] = [1, 0, 2, 3]\nconst %v : $T[] = [1.5]\n%y : $T[6,7] = Pad(%x, %p, %v)\noutput %y"});
  // Reflect, edge and wrap: each output element reads its source through an index made on the device;
  // the gradient adds each dY element back to it (atomics, or the ordered scatter).
  c.push_back({"Pad_modes", "input %x : $T[2,3,4,5]\nconst %p : i64[8] = [0, 0, 2, 1, 0, 0, 1, 3]\n"
                            "%r : $T[2,3,7,9] = Pad(%x, %p) {mode = \"reflect\"}\n%e : $T[2,3,7,9] = Pad(%x, %p) {mode = \"edge\"}\n"
                            "const %q : i64[2] = [3, 2]\nconst %ax : i64[1] = [3]\n%w : $T[2,3,4,10] = Pad(%x, %q, _, %ax) {mode = \"wrap\"}\n"
                            "output %r\noutput %e\noutput %w"});
  c.push_back({"Clip_i64", "input %x : i64[64]\nconst %lo : i64[] = [0]\nconst %hi : i64[] = [49]\n%y : i64[64] = Clip(%x, %lo, %hi)\n"
                           "%z : i64[64] = Clip(%x, %lo)\noutput %y\noutput %z",
               {{"x", {1, -30, 80}}}, false});
  c.push_back({"Gather", "input %x : $T[20,6]\ninput %i : i64[3,5]\n%y : $T[3,5,6] = Gather(%x, %i) {axis = 0}\noutput %y", {{"i", {1, -20, 19}}}});
  c.push_back({"GatherElements", "input %x : $T[5,9,3]\ninput %i : i64[5,4,3]\n%y : $T[5,4,3] = GatherElements(%x, %i) {axis = 1}\noutput %y",
               {{"i", {1, -9, 8}}}});
  c.push_back({"ScatterElements_add", "input %x : $T[5,9,3]\ninput %u : $T[5,4,3]\ninput %i : i64[5,4,3]\n"
                                      "%y : $T[5,9,3] = ScatterElements(%x, %i, %u) {axis = 1, reduction = \"add\"}\noutput %y",
               {{"i", {1, -9, 8}}}});
  c.push_back({"ScatterElements", "input %x : $T[3,4]\ninput %u : $T[2,4]\nconst %i : i64[2,4] = [0, 1, 2, 0, 2, 0, 1, 1]\n"
                                  "%y : $T[3,4] = ScatterElements(%x, %i, %u)\noutput %y"});
  c.push_back({"ScatterND", "input %x : $T[6,5]\ninput %u : $T[2,5]\nconst %i : i64[2,1] = [4, -6]\n%y : $T[6,5] = ScatterND(%x, %i, %u)\n"
                            "input %v : $T[7,5]\ninput %j : i64[7,1]\n%z : $T[6,5] = ScatterND(%x, %j, %v) {reduction = \"add\"}\noutput %y\noutput %z",
               {{"j", {1, -6, 5}}}});
  c.push_back({"GatherND", "input %x : $T[4,6,5]\ninput %i : i64[3,2]\n%y : $T[3,5] = GatherND(%x, %i)\noutput %y", {{"i", {1, -4, 3}}}});
  c.push_back({"GatherND_batch", "input %x : $T[4,6,5]\ninput %i : i64[4,3,1]\n%y : $T[4,3,5] = GatherND(%x, %i) {batch_dims = 1}\noutput %y",
               {{"i", {1, 0, 5}}}});
  c.push_back({"GatherND_i64", "input %x : i64[3,7]\ninput %i : i64[5,2]\n%y : i64[5] = GatherND(%x, %i)\noutput %y",
               {{"x", {1, -50, 50}}, {"i", {1, 0, 2}}}, false});
  c.push_back({"Trilu", "input %x : $T[3,5,7]\nconst %k : i64[] = [1]\n%u : $T[3,5,7] = Trilu(%x, %k)\n%l : $T[3,5,7] = Trilu(%x) {upper = 0}\n"
                        "output %u\noutput %l"});
  c.push_back({"CumSum", "input %x : $T[4,37,3]\nconst %a : i64[] = [1]\n%y : $T[4,37,3] = CumSum(%x, %a)\n"
                         "%z : $T[4,37,3] = CumSum(%x, %a) {exclusive = 1, reverse = 1}\noutput %y\noutput %z"});
  // TopK: the values' bits and the indices; f16/bf16 draws hold ties, which both backends break in index order.
  c.push_back({"TopK", "input %x : $T[4,37,3]\nconst %k : i64[1] = [5]\n%v : $T[4,5,3], %i : i64[4,5,3] = TopK(%x, %k) {axis = 1}\n"
                       "const %k1 : i64[1] = [1]\n%w : $T[4,37,1], %j : i64[4,37,1] = TopK(%x, %k1) {largest = 0}\n"
                       "output %v\noutput %i\noutput %w\noutput %j"});
  c.push_back({"Tile", "input %x : $T[3,1,5]\nconst %r : i64[3] = [2, 4, 3]\n%y : $T[6,4,15] = Tile(%x, %r)\noutput %y"});
  c.push_back({"ArgMax", "input %x : $T[4,37,3]\n%i : i64[4,1,3] = ArgMax(%x) {axis = 1}\n%j : i64[37,3] = ArgMax(%x) {keepdims = 0}\n"
                         "output %i\noutput %j"});
  c.push_back({"TopK_i64", "input %x : i64[6,40]\nconst %k : i64[1] = [7]\n%v : i64[6,7], %i : i64[6,7] = TopK(%x, %k)\noutput %v\noutput %i",
               {{"x", {1, 0, 3}}}, false});
  // Det and its cofactor gradient (one block a matrix, f64 inside): small matrices, and one of 70 whose
  // [X | I] spans many passes of the block's threads.
  c.push_back({"Det", "domain \"ampc\" 1\ninput %x : $T[3,2,9,9]\ninput %dy : $T[3,2]\n%d : $T[3,2] = Det(%x)\n"
                      "%g : $T[3,2,9,9] = ampc::DetGrad(%dy, %x)\noutput %d\noutput %g"});
  c.push_back({"Det_70", "domain \"ampc\" 1\ninput %x : $T[2,70,70]\ninput %dy : $T[2]\n%d : $T[2] = Det(%x)\n"
                         "%g : $T[2,70,70] = ampc::DetGrad(%dy, %x)\noutput %d\noutput %g",
               {{"x", {0.2}}}});
  c.push_back({"CumSum_i64", "input %x : i64[2,50]\nconst %a : i64[] = [-1]\n%y : i64[2,50] = CumSum(%x, %a)\noutput %y", {{"x", {1, 0, 2}}}, false});
  c.push_back({"Gather_axis1", "input %x : $T[4,9,3]\ninput %i : i32[2]\n%y : $T[4,2,3] = Gather(%x, %i) {axis = 1}\noutput %y", {{"i", {1, 0, 8}}}});
  // Reductions.
  c.push_back({"ReduceSum", "input %x : $T[6,70,5]\nconst %a : i64[2] = [0, 2]\n%y : $T[1,70,1] = ReduceSum(%x, %a)\noutput %y"});
  c.push_back({"ReduceSum_leading", "input %x : $T[3,50,40]\nconst %a : i64[2] = [0, 1]\n%y : $T[1,1,40] = ReduceSum(%x, %a)\noutput %y"});
  // A bias gradient's size: many row slices, and a last column tile that is partial (772 = 3 x 256 + 4).
  c.push_back({"ReduceSum_bias_grad", "input %x : $T[4100,772]\nconst %a : i64[1] = [0]\n%y : $T[772] = ReduceSum(%x, %a) {keepdims = 0}\noutput %y"});
  c.push_back({"ReduceMean_leading", "input %x : $T[300,1,33]\n%y : $T[33] = ReduceMean(%x) {axes = [0, 1], keepdims = 0}\noutput %y"});
  c.push_back({"ReduceSum_all", "input %x : $T[33,65]\n%y : $T[] = ReduceSum(%x) {keepdims = 0}\noutput %y"});
  c.push_back({"ReduceMean", "input %x : $T[4,300]\n%y : $T[4] = ReduceMean(%x) {axes = [1], keepdims = 0}\noutput %y"});
  // Per-channel sums of NCHW values ([A, K, B] in memory: rows of B read by slices of A), with B
  // below and above a block's 256 threads, and a large whole sum ([A, 1, 1]).
  c.push_back({"ReduceSum_channels", "input %x : $T[9,40,17,19]\nconst %a : i64[3] = [0, 2, 3]\n%y : $T[1,40,1,1] = ReduceSum(%x, %a)\noutput %y"});
  c.push_back({"ReduceMean_channels_small_rows", "input %x : $T[33,24,7,7]\n%y : $T[24] = ReduceMean(%x) {axes = [0, 2, 3], keepdims = 0}\noutput %y"});
  // grouped-query attention's Expand gradient: a short middle axis between kept ones (reduceStrided)
  c.push_back({"ReduceSum_middle_short", "input %x : $T[2,4,3,33,16]\nconst %a : i64[1] = [2]\n%y : $T[2,4,33,16] = ReduceSum(%x, %a) {keepdims = 0}\noutput %y"});
  c.push_back({"ReduceSum_all_large", "input %x : $T[300,1001]\n%y : $T[] = ReduceSum(%x) {keepdims = 0}\noutput %y"});
  c.push_back({"ReduceMax", "input %x : $T[5,6,7]\n%y : $T[5,1,7] = ReduceMax(%x) {axes = [1]}\noutput %y"});
  c.push_back({"ReduceMin", "input %x : $T[5,6,7]\n%y : $T[1,6,1] = ReduceMin(%x) {axes = [0, 2]}\noutput %y"});
  c.push_back({"GlobalAveragePool", "input %x : $T[2,3,5,7]\n%y : $T[2,3,1,1] = GlobalAveragePool(%x)\noutput %y"});
  // GEMMs (cuBLASLt).
  c.push_back({"MatMul_2d", "input %a : $T[33,70]\ninput %b : $T[70,17]\n%y : $T[33,17] = MatMul(%a, %b)\noutput %y"});
  c.push_back({"MatMul_batched", "input %a : $T[2,3,16,24]\ninput %b : $T[2,3,24,8]\n%y : $T[2,3,16,8] = MatMul(%a, %b)\noutput %y"});
  c.push_back({"MatMul_broadcast", "input %a : $T[4,16,24]\ninput %b : $T[24,40]\n%y : $T[4,16,40] = MatMul(%a, %b)\noutput %y"});
  c.push_back({"MatMul_vector", "input %a : $T[24]\ninput %b : $T[3,24,8]\n%y : $T[3,8] = MatMul(%a, %b)\noutput %y"});
  // Shapes the kernels take only through target-shapes (run in runCase, as ampc does for --target
  // cuda): an operand broadcast over part of the batch (expanded), and a Pad that crops (a Slice).
  c.push_back({"MatMul_partial_batch", "input %a : $T[2,3,16,24]\ninput %b : $T[1,3,24,8]\ninput %c : $T[2,1,8,5]\n"
                                       "%y : $T[2,3,16,8] = MatMul(%a, %b)\n%z : $T[2,3,16,5] = MatMul(%y, %c)\noutput %z"});
  c.push_back({"Pad_crop", "input %x : $T[3,9,8]\nconst %p : i64[6] = [0, -2, 1, 1, 1, -3]\n%y : $T[4,8,6] = Pad(%x, %p)\noutput %y"});
  c.push_back({"Gemm_bias", "input %a : $T[64,32]\ninput %w : $T[48,32]\ninput %c : $T[48]\n%y : $T[64,48] = Gemm(%a, %w, %c) {transB = 1}\noutput %y"});
  c.push_back({"Gemm_transA_beta", "input %a : $T[32,64]\ninput %w : $T[32,48]\ninput %c : $T[64,1]\n"
                                   "%y : $T[64,48] = Gemm(%a, %w, %c) {alpha = 0.5, beta = 2.0, transA = 1}\noutput %y"});
  // GEMMs big enough (>= 2^30 multiply-adds) to run on stride-padded copies, since a row stride is not a
  // multiple of 16 bytes: B and D (and MatMul's batches folded into rows), A and D under transA,
  // and an odd contraction dim (A).
  c.push_back({"MatMul_padded_B_D", "input %a : $T[2,512,1024]\ninput %b : $T[1024,1025]\n%y : $T[2,512,1025] = MatMul(%a, %b)\noutput %y"});
  c.push_back({"Gemm_padded_transA_D", "input %a : $T[1024,1027]\ninput %w : $T[1025,1024]\n"
                                       "%y : $T[1027,1025] = Gemm(%a, %w) {transA = 1, transB = 1}\noutput %y"});
  c.push_back({"MatMul_padded_odd_K", "input %a : $T[1024,1025]\ninput %b : $T[1025,1024]\n%y : $T[1024,1024] = MatMul(%a, %b)\noutput %y"});
  c.push_back({"Gemm_nobias", "input %a : $T[40,24]\ninput %w : $T[24,56]\n%y : $T[40,56] = Gemm(%a, %w) {transA = 0, transB = 0}\noutput %y"});
  // Convolutions (cuDNN) and pooling.
  c.push_back({"Conv", "input %x : $T[2,4,9,9]\ninput %w : $T[6,4,3,3]\ninput %b : $T[6]\n"
                       "%y : $T[2,6,5,5] = Conv(%x, %w, %b) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %y"});
  c.push_back({"Conv_group_dilated", "input %x : $T[2,4,10,10]\ninput %w : $T[8,2,3,3]\n"
                                     "%y : $T[2,8,6,6] = Conv(%x, %w) {dilations = [2, 2], group = 2}\noutput %y"});
  // Depthwise (the direct kernels): ConvNeXt's 7 x 7 with a bias, a strided dilated 3 x 3, a 1-d
  // one, and their gradients.
  c.push_back({"Conv_depthwise", "input %x : $T[3,16,13,11]\ninput %w : $T[16,1,7,7]\ninput %b : $T[16]\n"
                                 "%y : $T[3,16,13,11] = Conv(%x, %w, %b) {group = 16, kernel_shape = [7, 7], pads = [3, 3, 3, 3]}\noutput %y"});
  c.push_back({"Conv_depthwise_strided", "input %x : $T[2,24,15,15]\ninput %w : $T[24,1,3,3]\n"
                                         "%y : $T[2,24,7,7] = Conv(%x, %w) {group = 24, dilations = [2, 2], pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %y"});
  // The register-window kernels at stride 2 (5 x 5, EfficientNet's and MobileNetV3's) with widths
  // that are not a multiple of the 4 outputs a thread computes, and their gradients.
  c.push_back({"Conv_depthwise_5x5_s2", "input %x : $T[2,12,17,19]\ninput %w : $T[12,1,5,5]\ninput %b : $T[12]\n"
                                        "%y : $T[2,12,9,10] = Conv(%x, %w, %b) {group = 12, kernel_shape = [5, 5], pads = [2, 2, 2, 2], strides = [2, 2]}\noutput %y"});
  c.push_back({"ConvGrad_depthwise_3x3_s2", "domain \"ampc\" 1\ninput %dy : $T[3,8,9,7]\ninput %x : $T[3,8,18,13]\ninput %w : $T[8,1,3,3]\n"
                                            "%dx : $T[3,8,18,13], %dw : $T[8,1,3,3] = ampc::ConvGrad(%dy, %x, %w) {group = 8, kernel_shape = [3, 3], "
                                            "pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %dx\noutput %dw"});
  c.push_back({"Conv1d_depthwise", "input %x : $T[2,8,30]\ninput %w : $T[8,1,5]\n%y : $T[2,8,30] = Conv(%x, %w) {group = 8, pads = [2, 2]}\noutput %y"});
  c.push_back({"ConvGrad_depthwise", "domain \"ampc\" 1\ninput %dy : $T[3,16,13,11]\ninput %x : $T[3,16,13,11]\ninput %w : $T[16,1,7,7]\n"
                                     "%dx : $T[3,16,13,11], %dw : $T[16,1,7,7] = ampc::ConvGrad(%dy, %x, %w) {group = 16, kernel_shape = [7, 7], pads = [3, 3, 3, 3]}\n"
                                     "output %dx\noutput %dw"});
  c.push_back({"ConvGrad_depthwise_strided", "domain \"ampc\" 1\ninput %dy : $T[2,24,7,7]\ninput %x : $T[2,24,15,15]\ninput %w : $T[24,1,3,3]\n"
                                             "%dx : $T[2,24,15,15], %dw : $T[24,1,3,3] = ampc::ConvGrad(%dy, %x, %w) {group = 24, dilations = [2, 2], "
                                             "pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %dx\noutput %dw"});
  // 3-D (video networks: r3d_18's Conv3d), forward with a bias and the gradient, strided over the
  // frame's two spatial dims only; a 3-D max pool.
  c.push_back({"Conv3d", "input %x : $T[2,4,5,9,9]\ninput %w : $T[6,4,3,3,3]\ninput %b : $T[6]\n"
                         "%y : $T[2,6,5,5,5] = Conv(%x, %w, %b) {pads = [1, 1, 1, 1, 1, 1], strides = [1, 2, 2]}\noutput %y"});
  c.push_back({"ConvGrad3d", "domain \"ampc\" 1\ninput %dy : $T[2,6,5,5,5]\ninput %x : $T[2,4,5,9,9]\ninput %w : $T[6,4,3,3,3]\n"
                             "%dx : $T[2,4,5,9,9], %dw : $T[6,4,3,3,3] = ampc::ConvGrad(%dy, %x, %w) {kernel_shape = [3, 3, 3], "
                             "pads = [1, 1, 1, 1, 1, 1], strides = [1, 2, 2]}\noutput %dx\noutput %dw"});
  c.push_back({"MaxPool3d", "input %x : $T[2,3,5,9,9]\n%y : $T[2,3,2,4,4] = MaxPool(%x) {kernel_shape = [3, 3, 3], strides = [2, 2, 2]}\noutput %y"});
  c.push_back({"Conv1d", "input %x : $T[3,4,20]\ninput %w : $T[5,4,5]\n%y : $T[3,5,20] = Conv(%x, %w) {pads = [2, 2]}\noutput %y"});
  c.push_back({"ConvGrad", "domain \"ampc\" 1\ninput %dy : $T[2,6,5,5]\ninput %x : $T[2,4,9,9]\ninput %w : $T[6,4,3,3]\n"
                           "%dx : $T[2,4,9,9], %dw : $T[6,4,3,3] = ampc::ConvGrad(%dy, %x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\n"
                           "output %dx\noutput %dw"});
  // dX unread (the first convolution's): only dW is computed, with cuDNN's 7 x 7 / 2 filter gradient.
  c.push_back({"ConvGrad_dw_only", "domain \"ampc\" 1\ninput %dy : $T[2,8,6,6]\ninput %x : $T[2,3,12,12]\ninput %w : $T[8,3,7,7]\n"
                                   "%dx : $T[2,3,12,12], %dw : $T[8,3,7,7] = ampc::ConvGrad(%dy, %x, %w) {kernel_shape = [7, 7], pads = [3, 3, 3, 3], strides = [2, 2]}\n"
                                   "output %dw"});
  c.push_back({"MaxPool", "input %x : $T[2,3,9,9]\n%y : $T[2,3,4,4], %i : i64[2,3,4,4] = MaxPool(%x) {kernel_shape = [3, 3], pads = [1, 1, 0, 0], strides = [2, 2]}\n"
                          "output %y\noutput %i"});
  c.push_back({"AveragePool", "input %x : $T[2,3,8,8]\n%y : $T[2,3,4,4] = AveragePool(%x) {count_include_pad = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %y"});
  c.push_back({"AveragePoolGrad", "domain \"ampc\" 1\ninput %dy : $T[2,3,4,4]\ninput %x : $T[2,3,8,8]\n"
                                  "%dx : $T[2,3,8,8] = ampc::AveragePoolGrad(%dy, %x) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}\noutput %dx"});
  c.push_back({"ScatterAddFlat", "domain \"ampc\" 1\ninput %dy : $T[3,50]\ninput %i : i64[3,50]\n%dx : $T[4,10] = ampc::ScatterAddFlat(%dy, %i) {shape = [4, 10]}\noutput %dx",
               {{"i", {1, 0, 39}}}});
  // Normalisation, softmax, losses.
  c.push_back({"Softmax", "input %x : $T[12,333]\n%y : $T[12,333] = Softmax(%x) {axis = -1}\noutput %y", {{"x", {3.0}}}});
  c.push_back({"Softmax_inner", "input %x : $T[3,7,5]\n%y : $T[3,7,5] = Softmax(%x) {axis = 1}\noutput %y"});
  c.push_back({"LogSoftmax", "input %x : $T[9,40]\n%y : $T[9,40] = LogSoftmax(%x) {axis = 1}\noutput %y"});
  c.push_back({"LayerNorm", "input %x : $T[6,5,96]\ninput %s : $T[96]\ninput %b : $T[96]\n"
                            "%y : $T[6,5,96], %m : f32[6,5,1], %r : f32[6,5,1] = LayerNormalization(%x, %s, %b) {axis = -1}\noutput %y\noutput %m\noutput %r"});
  c.push_back({"LayerNormGrad", "domain \"ampc\" 1\ninput %dy : $T[10,64]\ninput %x : $T[10,64]\ninput %s : $T[64]\n"
                                "%dx : $T[10,64], %ds : $T[64], %db : $T[64] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1}\noutput %dx\noutput %ds\noutput %db"});
  // The warp-per-row kernels (D % 4 == 0, D <= 1024) at GPT-2's width and at a partial last chunk
  // (520: five of six chunks), with more rows than the backward's warps (several rows per warp, the
  // per-block partial sums); D = 1030 and D = 6 take the block-per-row kernels.
  c.push_back({"LayerNorm_warp_rows", "input %x : $T[300,768]\ninput %s : $T[768]\ninput %b : $T[768]\n"
                                      "%y : $T[300,768] = LayerNormalization(%x, %s, %b) {axis = -1}\noutput %y"});
  c.push_back({"LayerNormGrad_warp_rows", "domain \"ampc\" 1\ninput %dy : $T[2100,520]\ninput %x : $T[2100,520]\ninput %s : $T[520]\n"
                                          "%dx : $T[2100,520], %ds : $T[520], %db : $T[520] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1}\n"
                                          "output %dx\noutput %ds\noutput %db"});
  for (const char* d : {"1030", "6"}) {
    const std::string D = d;
    c.push_back({"LayerNorm_block_rows_" + D, "domain \"ampc\" 1\ninput %x : $T[7," + D + "]\ninput %s : $T[" + D + "]\ninput %b : $T[" + D +
                                                 "]\ninput %dy : $T[7," + D + "]\n%y : $T[7," + D + "] = LayerNormalization(%x, %s, %b) {axis = -1}\n"
                                                 "%dx : $T[7," + D + "], %ds : $T[" + D + "], %db : $T[" + D + "] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1}\n"
                                                 "output %y\noutput %dx\noutput %ds\noutput %db"});
  }
  // ampc.RmsNorm and its gradient, LayerNormGrad {rms = 1} (the same kernels with the mean taken as
  // 0): the warp-per-row kernels, the block-per-row ones (1030, 6), and the casts autocast leaves
  // around them; the residual-stream gradient further down.
  for (const char* shape : {"300,768", "2100,520", "7,1030", "7,6"}) {
    const std::string x = shape, D = x.substr(x.find(',') + 1);
    c.push_back({"RmsNorm_" + x, "domain \"ampc\" 1\ninput %x : $T[" + x + "]\ninput %s : $T[" + D + "]\ninput %dy : $T[" + x + "]\n"
                                 "%y : $T[" + x + "] = ampc::RmsNorm(%x, %s) {axis = -1, epsilon = 1e-06}\n"
                                 "%dx : $T[" + x + "], %ds : $T[" + D + "], %db : $T[" + D + "] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1, epsilon = 1e-06, rms = 1}\n"
                                 "output %y\noutput %dx\noutput %ds"});
  }
  c.push_back({"RmsNorm_cast_folding", "domain \"ampc\" 1\ninput %x : f32[12,96]\ninput %s : f32[96]\ninput %dyl : $T[12,96]\n"
                                       "%y : f32[12,96] = ampc::RmsNorm(%x, %s) {axis = -1, epsilon = 1e-05}\n%yl : $T[12,96] = Cast(%y) {to = $TO}\n"
                                       "%dy : f32[12,96] = Cast(%dyl) {to = 1}\n"
                                       "%dx : f32[12,96], %ds : f32[96], %db : f32[96] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1, epsilon = 1e-05, rms = 1}\n"
                                       "output %yl\noutput %dx\noutput %ds"});
  // A residual-stream gradient: the Add after dX is written by LayerNormGrad (cuda::LayerNormGrad,
  // passes/fuse_norm_epilogue.cpp, which runCase applies), on both kernels; and RmsNorm's (rms = 1).
  for (const char* shape : {"64,768", "5,6"})
    for (const char* rms : {"0", "1"}) {
      const std::string x = shape, D = x.substr(x.find(',') + 1), R = rms;
      c.push_back({(R == "1" ? "RmsNormGrad_residual_" : "LayerNormGrad_residual_") + x,
                   "domain \"ampc\" 1\ninput %dy : $T[" + x + "]\ninput %x : $T[" + x + "]\ninput %s : $T[" + D + "]\ninput %r : $T[" + x +
                       "]\n%dx : $T[" + x + "], %ds : $T[" + D + "], %db : $T[" + D + "] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1, rms = " + R +
                       "}\n%sum : $T[" + x + "] = Add(%r, %dx)\noutput %sum\noutput %ds\noutput %db"});
    }
  // As autocast leaves them in a transformer: an f32 LayerNorm whose result is cast down for a
  // GEMM (written through), and its gradient from a low dY cast up (read through).
  c.push_back({"LayerNorm_cast_folding", "domain \"ampc\" 1\ninput %x : f32[12,96]\ninput %s : f32[96]\ninput %b : f32[96]\ninput %dyl : $T[12,96]\n"
                                         "%y : f32[12,96] = LayerNormalization(%x, %s, %b) {axis = -1}\n%yl : $T[12,96] = Cast(%y) {to = $TO}\n"
                                         "%dy : f32[12,96] = Cast(%dyl) {to = 1}\n"
                                         "%dx : f32[12,96], %ds : f32[96], %db : f32[96] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1}\n"
                                         "output %yl\noutput %dx\noutput %ds\noutput %db"});
  c.push_back({"BatchNorm_training", "input %x : $T[4,3,5,5]\ninput %s : $T[3]\ninput %b : $T[3]\ninput %m : $T[3]\ninput %v : $T[3]\n"
                                     "%y : $T[4,3,5,5], %rm : $T[3], %rv : $T[3] = BatchNormalization(%x, %s, %b, %m, %v) {momentum = 0.8, training_mode = 1}\n"
                                     "output %y\noutput %rm\noutput %rv",
               {{"v", {1.0, 0, 1, true}}}});
  c.push_back({"BatchNorm_inference", "input %x : $T[4,3,6]\ninput %s : $T[3]\ninput %b : $T[3]\ninput %m : $T[3]\ninput %v : $T[3]\n"
                                      "%y : $T[4,3,6] = BatchNormalization(%x, %s, %b, %m, %v)\noutput %y",
               {{"v", {1.0, 0, 1, true}}}});
  c.push_back({"BatchNormGrad", "domain \"ampc\" 1\ninput %dy : $T[4,3,5,5]\ninput %x : $T[4,3,5,5]\ninput %s : $T[3]\ninput %m : $T[3]\ninput %v : $T[3]\n"
                                "%dx : $T[4,3,5,5], %ds : $T[3], %db : $T[3] = ampc::BatchNormGrad(%dy, %x, %s, %m, %v) {training_mode = 1}\n"
                                "output %dx\noutput %ds\noutput %db",
               {{"v", {1.0, 0, 1, true}}}, true, 2.0});
  // The typed batch-norm passes at each load width: planes of 64 (16-byte loads at f16/bf16), 12
  // (8-byte) and 7 (one element) elements, over enough of the batch for several blocks per channel.
  for (const char* shape : {"80,3,8,8", "96,5,12", "160,4,7"}) {
    const std::string x = shape, ch = x.substr(x.find(',') + 1, x.find(',', x.find(',') + 1) - x.find(',') - 1);
    const std::string gradParams = "input %sc : f32[" + ch + "]\ninput %m : f32[" + ch + "]\ninput %v : f32[" + ch + "]\n";
    const std::string params = gradParams + "input %b : f32[" + ch + "]\n";
    c.push_back({"BatchNorm_width_" + x, "input %x : $T[" + x + "]\n" + params + "%y : $T[" + x + "], %rm : f32[" + ch + "], %rv : f32[" + ch +
                 "] = BatchNormalization(%x, %sc, %b, %m, %v) {training_mode = 1}\noutput %y\noutput %rm\noutput %rv",
                 {{"x", {2.0}}, {"v", {1.0, 0, 1, true}}}});
    c.push_back({"BatchNormGrad_width_" + x, "domain \"ampc\" 1\ninput %dy : $T[" + x + "]\ninput %x : $T[" + x + "]\n" + gradParams + "%dx : $T[" + x +
                 "], %ds : f32[" + ch + "], %db : f32[" + ch + "] = ampc::BatchNormGrad(%dy, %x, %sc, %m, %v) {training_mode = 1}\n"
                 "output %dx\noutput %ds\noutput %db",
                 {{"v", {1.0, 0, 1, true}}}, true, 2.0});
  }
  // A Relu written by the BatchNormalization before it (cuda::BatchNormalization), a Relu after an
  // Add, and a Relu's gradient (from its output y, as autodiff writes it) read through by the
  // BatchNormGrad after it (cuda::BatchNormGrad: dz gated by y).
  c.push_back({"BatchNorm_relu_folded", "input %x : $T[6,4,5,8]\ninput %s : f32[4]\ninput %b : f32[4]\ninput %m : f32[4]\ninput %v : f32[4]\n"
                                        "%n : $T[6,4,5,8] = BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}\n%y : $T[6,4,5,8] = Relu(%n)\noutput %y",
               {{"v", {1.0, 0, 1, true}}}});
  // A residual Add (and its Relu) written by the batch norm before it: a graph input as the
  // residual, and a bottleneck's two batch norms, where the later one writes the sum.
  c.push_back({"BatchNorm_residual_relu", "input %x : $T[6,8,5,4]\ninput %r : $T[6,8,5,4]\ninput %s : f32[8]\ninput %b : f32[8]\ninput %m : f32[8]\ninput %v : f32[8]\n"
                                          "%n : $T[6,8,5,4] = BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}\n"
                                          "%a : $T[6,8,5,4] = Add(%n, %r)\n%y : $T[6,8,5,4] = Relu(%a)\noutput %y",
               {{"v", {1.0, 0, 1, true}}}});
  c.push_back({"BatchNorm_pair_residual", "input %x : $T[4,16,3,3]\ninput %x2 : $T[4,16,3,3]\ninput %s : f32[16]\ninput %b : f32[16]\ninput %m : f32[16]\ninput %v : f32[16]\n"
                                          "%n : $T[4,16,3,3] = BatchNormalization(%x, %s, %b, %m, %v) {training_mode = 1}\n"
                                          "%n2 : $T[4,16,3,3] = BatchNormalization(%x2, %s, %b, %m, %v) {training_mode = 1}\n"
                                          "%a : $T[4,16,3,3] = Add(%n, %n2)\noutput %a",
               {{"v", {1.0, 0, 1, true}}}});
  c.push_back({"Add_relu_folded", "input %a : $T[9,40]\ninput %b : $T[9,40]\n%s : $T[9,40] = Add(%a, %b)\n%y : $T[9,40] = Relu(%s)\noutput %y"});
  c.push_back({"Add_relu_folded_broadcast", "input %a : $T[3,4,7]\ninput %b : $T[4,1]\n%s : $T[3,4,7] = Add(%a, %b)\n%y : $T[3,4,7] = Relu(%s)\noutput %y"});
  c.push_back({"BatchNormGrad_gated", "domain \"ampc\" 1\ninput %dz : $T[8,3,4,4]\ninput %y : $T[8,3,4,4]\ninput %x : $T[8,3,4,4]\n"
                                      "input %s : f32[3]\ninput %m : f32[3]\ninput %v : f32[3]\nconst %z : $T[] = [0.0]\n"
                                      "%p : bool[8,3,4,4] = Greater(%y, %z)\n%dy : $T[8,3,4,4] = Where(%p, %dz, %z)\n"
                                      "%dx : $T[8,3,4,4], %ds : f32[3], %db : f32[3] = ampc::BatchNormGrad(%dy, %x, %s, %m, %v) {training_mode = 1}\n"
                                      "output %dx\noutput %ds\noutput %db",
               {{"v", {1.0, 0, 1, true}}}, true, 2.0});
  // ReLU's gradient through the 16-byte path with a tail (7 x 33 elements).
  c.push_back({"Where_fused_comparison_tail", "input %y : $T[7,33]\ninput %dz : $T[7,33]\nconst %z : $T[] = [0.0]\n"
                                              "%g : bool[7,33] = Greater(%y, %z)\n%dy : $T[7,33] = Where(%g, %dz, %z)\noutput %dy"});
  // The ReLU gradient of a sum (a generated kernel in a plan; here op by op).
  c.push_back({"Where_gate_sum", "input %y : $T[6,40]\ninput %a : $T[6,40]\ninput %b : $T[6,40]\nconst %z : $T[] = [0.0]\n"
                                 "%s : $T[6,40] = Add(%a, %b)\n%g : bool[6,40] = Greater(%y, %z)\n%d : $T[6,40] = Where(%g, %s, %z)\noutput %d"});
  c.push_back({"MaxPool_dilated_padded", "input %x : $T[3,5,13,11]\n%y : $T[3,5,7,5], %i : i64[3,5,7,5] = MaxPool(%x) "
                                         "{dilations = [1, 2], kernel_shape = [3, 2], pads = [1, 0, 1, 1], strides = [2, 2]}\noutput %y\noutput %i"});
  c.push_back({"SCE_mean", "input %x : $T[16,10]\ninput %l : i64[16]\n%y : $T[], %lp : $T[16,10] = SoftmaxCrossEntropyLoss(%x, %l)\noutput %y\noutput %lp",
               {{"l", {1, 0, 9}}}});
  c.push_back({"SCE_weighted_ignore", "input %x : $T[6,5,3]\ninput %l : i64[6,3]\ninput %w : $T[5]\n"
                                      "%y : $T[] = SoftmaxCrossEntropyLoss(%x, %l, %w) {ignore_index = 2}\noutput %y",
               {{"l", {1, 0, 4}}, {"w", {1.0, 0, 1, true}}}});
  c.push_back({"SCE_none", "input %x : $T[8,7]\ninput %l : i32[8]\n%y : $T[8] = SoftmaxCrossEntropyLoss(%x, %l) {reduction = \"none\"}\noutput %y",
               {{"l", {1, 0, 6}}}});
  c.push_back({"SCE_grad", "domain \"ampc\" 1\ninput %d : $T[]\ninput %x : $T[16,10]\ninput %l : i64[16]\n"
                           "%dx : $T[16,10] = ampc::SoftmaxCrossEntropyLossGrad(%d, %x, %l) {ignore_index = 3, reduction = \"mean\"}\noutput %dx",
               {{"l", {1, 0, 9}}}});
  // The loss as GPT-2 exports it, logits cast to f32 first: the loss and its gradient read the
  // narrow logits through the Cast, and the gradient writes the narrow result through the Cast after it.
  c.push_back({"SCE_folded_casts", "domain \"ampc\" 1\ninput %x : $T[48,1001]\ninput %l : i64[48]\ninput %d : f32[]\n"
                                   "%xf : f32[48,1001] = Cast(%x) {to = 1}\n"
                                   "%y : f32[] = SoftmaxCrossEntropyLoss(%xf, %l) {ignore_index = 5}\n"
                                   "%g : f32[48,1001] = ampc::SoftmaxCrossEntropyLossGrad(%d, %xf, %l) {ignore_index = 5, reduction = \"mean\"}\n"
                                   "%gl : $T[48,1001] = Cast(%g) {to = $TO}\noutput %y\noutput %gl",
               {{"x", {4.0}}, {"l", {1, 0, 9}}}});
  // GridSample and its gradient: a grid of N(0, 0.8) coordinates, some outside [-1, 1], in each
  // padding mode, bilinear and nearest, both align_corners.
  c.push_back({"GridSample", "input %x : $T[2,3,5,6]\ninput %g : $T[2,4,7,2]\n%a : $T[2,3,4,7] = GridSample(%x, %g)\n"
                             "%b : $T[2,3,4,7] = GridSample(%x, %g) {align_corners = 1, mode = \"nearest\", padding_mode = \"border\"}\n"
                             "%c : $T[2,3,4,7] = GridSample(%x, %g) {padding_mode = \"reflection\"}\noutput %a\noutput %b\noutput %c",
               {{"g", {0.8}}}});
  for (const auto& [name, attrs] : std::vector<std::pair<std::string, std::string>>{
           {"zeros", ""}, {"border_align", "{align_corners = 1, padding_mode = \"border\"}"}, {"reflection", "{padding_mode = \"reflection\"}"},
           {"nearest", "{mode = \"nearest\"}"}})
    c.push_back({"GridSampleGrad_" + name,
                 "domain \"ampc\" 1\ninput %dy : $T[2,3,4,7]\ninput %x : $T[2,3,5,6]\ninput %g : $T[2,4,7,2]\n"
                 "%dx : $T[2,3,5,6], %dg : $T[2,4,7,2] = ampc::GridSampleGrad(%dy, %x, %g) " + attrs + "\noutput %dx\noutput %dg",
                 {{"g", {0.8}}}});
  c.push_back({"GatherElementsGrad", "domain \"ampc\" 1\ninput %dy : $T[5,4,3]\ninput %i : i64[5,4,3]\n"
                                     "%dx : $T[5,9,3] = ampc::GatherElementsGrad(%dy, %i) {axis = 1, shape = [5, 9, 3]}\noutput %dx",
               {{"i", {1, 0, 8}}}});
  c.push_back({"GatherNDGrad", "domain \"ampc\" 1\ninput %dy : $T[4,3,5]\ninput %i : i64[4,3,1]\n"
                               "%dx : $T[4,6,5] = ampc::GatherNDGrad(%dy, %i) {batch_dims = 1, shape = [4, 6, 5]}\noutput %dx",
               {{"i", {1, 0, 5}}}});
  c.push_back({"GatherGrad", "domain \"ampc\" 1\ninput %dy : $T[3,5,6]\ninput %i : i64[3,5]\n"
                             "%dx : $T[20,6] = ampc::GatherGrad(%dy, %i) {axis = 0, shape = [20, 6]}\noutput %dx",
               {{"i", {1, -20, 19}}}});
  // The sum started from a base (passes/accumulate_gather_grads.cpp): of the same type, and a
  // $T base under an f32 sum (a tied embedding's other gradient, read through its widening Cast).
  c.push_back({"GatherGrad_base", "domain \"ampc\" 1\ninput %dy : $T[3,5,6]\ninput %i : i64[3,5]\ninput %b : $T[20,6]\n"
                                  "%dx : $T[20,6] = ampc::GatherGrad(%dy, %i, %b) {axis = 0, shape = [20, 6]}\noutput %dx",
               {{"i", {1, -20, 19}}}});
  c.push_back({"GatherGrad_widened_base", "domain \"ampc\" 1\ninput %dy : f32[40,6]\ninput %i : i64[40]\ninput %b : $T[20,6]\n"
                                          "%dx : f32[20,6] = ampc::GatherGrad(%dy, %i, %b) {axis = 0, shape = [20, 6]}\noutput %dx",
               {{"i", {1, 0, 19}}}});
  c.push_back({"RotateHalf", "domain \"ampc\" 1\ninput %x : $T[3,5,8]\n%y : $T[3,5,8] = ampc::RotateHalf(%x) {sign = 1}\n"
                             "%z : $T[3,5,8] = ampc::RotateHalf(%x) {sign = -1}\noutput %y\noutput %z"});
  c.push_back({"SliceGrad", "domain \"ampc\" 1\ninput %dy : $T[3,3]\nconst %st : i64[2] = [1, -2]\nconst %en : i64[2] = [9, 0]\n"
                            "const %ax : i64[2] = [0, 1]\nconst %sp : i64[2] = [3, -4]\n"
                            "%dx : $T[10,12] = ampc::SliceGrad(%dy, %st, %en, %ax, %sp) {shape = [10, 12]}\noutput %dx"});
  for (const char* approx : {"none", "tanh"})
    c.push_back({std::string("Gelu_fused_") + approx, std::string("domain \"ampc\" 1\ninput %x : $T[33,70]\ninput %dy : $T[33,70]\n") +
                 "%y : $T[33,70] = ampc::Gelu(%x) {approximate = \"" + approx + "\"}\n"
                 "%dx : $T[33,70] = ampc::GeluGrad(%dy, %x) {approximate = \"" + approx + "\"}\noutput %y\noutput %dx",
                 {{"x", {2.5}}}});
  c.push_back({"Silu_fused", "domain \"ampc\" 1\ninput %x : $T[33,70]\ninput %dy : $T[33,70]\n%y : $T[33,70] = ampc::Silu(%x)\n"
                            "%dx : $T[33,70] = ampc::SiluGrad(%dy, %x)\noutput %y\noutput %dx",
               {{"x", {6.0}}}});
  // A tiled Transpose reading f16/bf16 through the widening Cast in front (GPT-2's tied embedding
  // gradient), 2-d and batched; at f32 the Cast is not a widening one and both run.
  c.push_back({"Transpose_widened", "input %x : $T[70,130]\n%c : f32[70,130] = Cast(%x) {to = 1}\n%y : f32[130,70] = Transpose(%c) {perm = [1, 0]}\noutput %y"});
  c.push_back({"Transpose_widened_batched", "input %x : $T[3,40,50]\n%c : f32[3,40,50] = Cast(%x) {to = 1}\n"
                                            "%y : f32[3,50,40] = Transpose(%c) {perm = [0, 2, 1]}\noutput %y"});
  for (const char* mode : {"reflect", "edge", "wrap"})
    c.push_back({std::string("PadGrad_") + mode, "domain \"ampc\" 1\ninput %dy : $T[2,3,7,9]\nconst %p : i64[8] = [0, 0, 2, 1, 0, 0, 1, 3]\n"
                 "%dx : $T[2,3,4,5] = ampc::PadGrad(%dy, %p) {mode = \"" + std::string(mode) + "\", shape = [2, 3, 4, 5]}\noutput %dx"});
  c.push_back({"PadGrad", "domain \"ampc\" 1\ninput %dy : $T[6,7]\nconst %p : i64[4] = [1, 0, 2, 3]\n"
                          "%dx : $T[3,4] = ampc::PadGrad(%dy, %p) {shape = [3, 4]}\noutput %dx"});
  return c;
}

std::string onnxType(const std::string& t) { return t == "f32" ? "1" : t == "f16" ? "10" : "16"; }

void runCase(const Case& k, const std::string& t, bool deterministic = false) {
  std::string text = std::regex_replace(k.text, std::regex("\\$TO"), onnxType(t));
  text = std::regex_replace(text, std::regex("\\$T"), t);
  // Lines become a graph: domains first, then the rest.
  std::string body, header;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) (line.rfind("domain", 0) == 0 ? header : body) += "  " + line + "\n";
  auto g = parseGraph("graph \"case\" opset 17 {\n" + header + body + "}\n", k.name);
  // The CUDA lowering's epilogue rewrites (runtime/lower.cpp), as a plan for --target cuda has them:
  // the batch norm, ReLU-gradient, residual and loss-with-gradient cases become cuda:: nodes (their CPU kernels compute
  // exactly what the unfused nodes did: tests/unit/target_passes_test.cpp).
  createFuseNormEpiloguePass()->run(*g);
  createFuseReluGradPass()->run(*g);
  createKeepLossStatsPass()->run(*g);
  createTargetShapesPass(findTarget("cuda"))->run(*g);
  std::map<std::string, Tensor> inputs;
  for (const Value* v : g->inputs()) {
    Spec s;
    if (auto it = k.inputs.find(v->name()); it != k.inputs.end()) s = it->second;
    Tensor x = randomTensor(v->type(), s.scale, s.lo, s.hi);
    if (s.positive)
      for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::fabs(x.getDouble(i)) + 0.05);
    inputs.emplace(v->name(), std::move(x));
  }
  expectSameOnGpu(*g, inputs, k.name + " at " + t, k.tolScale, {}, deterministic);
}

class GpuOps : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuOps, MatchTheCpuBackend) {
  AMPC_NEED_GPU();
  const std::string t = GetParam();
  int ran = 0;
  for (const Case& k : cases()) {
    if (!k.floatOnly && t != "f32") continue;
    SCOPED_TRACE(k.name);
    runCase(k, t);
    ++ran;
  }
  EXPECT_GT(ran, 60);
}
// The same cases under ProgramOptions::deterministic (ordered scatter-adds, the gathered AveragePool
// gradient, deterministic cuDNN algorithms): the same answers, within the same tolerances.
TEST_P(GpuOps, DeterministicMatchTheCpuBackend) {
  AMPC_NEED_GPU();
  const std::string t = GetParam();
  int ran = 0;
  for (const Case& k : cases()) {
    if (!k.floatOnly && t != "f32") continue;
    SCOPED_TRACE(k.name);
    runCase(k, t, true);
    ++ran;
  }
  EXPECT_GT(ran, 60);
}
INSTANTIATE_TEST_SUITE_P(Dtypes, GpuOps, ::testing::Values("f32", "f16", "bf16"));

// Dropout: the mask is bit-identical to the CPU's (same Philox stream), at several steps; the
// gradient reuses it.
TEST(GpuDropout, MasksAreBitIdenticalToTheCpu) {
  AMPC_NEED_GPU();
  for (const char* t : {"f32", "f16", "bf16"})
    for (uint64_t step : {0ull, 7ull, 123456789ull}) {
      const std::string T = t;
      auto g = parseGraph("graph \"d\" opset 17 {\n  domain \"ampc\" 1\n  input %x : " + T + "[3,1001]\n  input %dy : " + T +
                          "[3,1001]\n  const %r : f32[] = [0.3]\n  const %tr : bool[] = [1]\n  %y : " + T +
                          "[3,1001], %m : bool[3,1001] = Dropout(%x, %r, %tr)\n  %dx : " + T +
                          "[3,1001] = ampc::DropoutGrad(%dy, %m, %r, %tr)\n  output %y\n  output %m\n  output %dx\n}\n");
      std::map<std::string, Tensor> in{{"x", randomTensor(g->inputs()[0]->type())}, {"dy", randomTensor(g->inputs()[1]->type())}};
      ExecOptions eo;
      eo.seed = 0x1234567890abcdefull;
      eo.step = step;
      expectSameOnGpu(*g, in, "dropout " + T + " step " + std::to_string(step), 1e-9, eo);
    }
}

// A transformer block's output Dropout at f16/bf16: the residual Add after its Cast up to the f32
// stream is written by the Dropout (cuda::Dropout, passes/fuse_dropout_residual.cpp), and the
// DropoutGrad reads its f32 gradient through the Cast down (fold-casts, grad_reader). Bit-identical to the
// CPU, training and not (the mask all kept), and the narrow gradient the fold stands in for gets no
// bytes. At f32 there is nothing to fold.
TEST(GpuDropout, ResidualAndGradientCastFoldsAreExact) {
  AMPC_NEED_GPU();
  for (const char* t : {"f32", "f16", "bf16"})
    for (const char* training : {"1", "0"}) {
      const std::string T = t, to = T == "f32" ? "1" : T == "f16" ? "10" : "16";
      auto g = parseGraph("graph \"d\" opset 17 {\n  domain \"ampc\" 1\n  input %x : " + T + "[3,1001]\n  input %r : f32[3,1001]\n"
                          "  input %g : f32[3,1001]\n  const %ra : f32[] = [0.3]\n  const %tr : bool[] = [" + training + "]\n"
                          "  %y : " + T + "[3,1001], %m : bool[3,1001] = Dropout(%x, %ra, %tr)\n  %w : f32[3,1001] = Cast(%y) {to = 1}\n"
                          "  %s : f32[3,1001] = Add(%w, %r)\n  %gl : " + T + "[3,1001] = Cast(%g) {to = " + to + "}\n"
                          "  %dx : " + T + "[3,1001] = ampc::DropoutGrad(%gl, %m, %ra, %tr)\n  output %s\n  output %m\n  output %dx\n}\n");
      std::map<std::string, Tensor> in;
      for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type()));
      ExecOptions eo;
      eo.seed = 0x1234567890abcdefull;
      eo.step = 11;
      const std::string what = "dropout folds " + T + " training " + training;
      const bool folded = T != "f32";
      EXPECT_EQ(createFuseDropoutResidualPass()->run(*g), folded) << what;
      EXPECT_EQ(g->lookup("y") == nullptr, folded) << what;
      expectSameOnGpu(*g, in, what, 1e-9, eo);
      cuda::Program prog(*g, {});
      const MemoryPlan& plan = prog.memoryPlan();
      EXPECT_EQ(plan.slots.at(g->lookup("gl")).bytes == 0, folded) << what;
    }
}

// Fused attention (kernels/cuda/attention.cu) forward and backward against the CPU reference: odd
// tile edges, head dims below 64 and up to 128, a mask per batch-head, a shared causal mask (key
// tiles skipped, tiles of zeros not read) with one row masked everywhere (no skipping in its query
// tile), no mask, dropout on and off; the WMMA kernels, the mma.sync ones and the wgmma forward; and
// each mask's gradient (as a trained bias), from the same O and LSE.
struct AttnCase {
  std::string name;
  std::vector<int64_t> lead;
  int64_t tq, tk, d, dv;
  std::string mask;  // "", "random" (per batch-head), "causal" (shared [1,1,Tq,Tk]), "zeros", "per_batch", "floored"
                     // ([B,1,Tq,Tk], -inf entries, row 5 of batch 1 empty), "padding" ([B,1,1,Tk]),
                     // "per_head" ([1,H,Tq,Tk], N(0,1): a bias), "where_causal" (per batch-head: the
                     // causal fill plus batch 1's first three keys', with where_causal = 1), "where_window"
                     // (the same with a window of two keys, and the window's entries as where_masked)
  double ratio;
};
std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}
TEST(GpuAttention, ForwardAndBackwardMatchTheCpu) {
  AMPC_NEED_GPU();
  const std::vector<AttnCase> cases = {
      {"random_mask_odd_tiles", {2, 3}, 100, 130, 40, 24, "random", 0.2},
      {"causal_gpt_like", {2, 2}, 192, 192, 64, 64, "causal", 0.1},
      {"no_mask_no_dropout", {3}, 70, 33, 32, 16, "", 0.0},
      // f16/bf16 with head dims multiples of 8 (and with dropout Tk a multiple of 8: a Philox block
      // of 8 keys in one row) take the mma.sync kernels: odd query tiles, partial key tiles, head
      // dims below 64, each mask form, dropout on and off; KT rows that are not 16-byte aligned (Tk
      // 33, 197, 61) load element by element. random_mask_odd_tiles (Tk 130, dropout) and
      // wmma_tk_mult4_causal_dropout (Tk 132: Philox blocks straddle rows) stay on the WMMA kernels.
      {"mma_random_mask", {2, 3}, 100, 136, 40, 24, "random", 0.2},
      {"mma_causal_long", {1, 3}, 320, 320, 64, 64, "causal", 0.0},
      {"mma_no_mask", {3}, 70, 48, 32, 16, "", 0.1},
      {"mma_causal_d16", {1, 1}, 128, 128, 16, 16, "causal", 0.0},
      {"mma_zero_mask", {2, 1}, 128, 136, 16, 16, "zeros", 0.1},  // every tile flagged "mask not read"
      {"mma_random_mask_d64", {1, 2}, 128, 128, 64, 64, "random", 0.0},
      {"mma_vit_tokens", {2, 2}, 197, 197, 64, 64, "", 0.0},
      {"mma_odd_keys_random_mask", {1, 2}, 77, 61, 32, 32, "random", 0.0},
      {"wmma_tk_mult4_causal_dropout", {1, 2}, 90, 132, 64, 48, "causal", 0.15},
      {"mma_tk_mult8_causal_dropout", {1, 2}, 90, 136, 64, 48, "causal", 0.15},
      // Head tile 64 runs two query tiles a block: an odd count of them (the last block's second
      // m-tile has no rows), and a key tile dead for one m-tile only (the causal diagonal).
      {"mma_odd_query_tiles_causal_dropout", {2, 2}, 136, 136, 64, 64, "causal", 0.1},
      // Transformers' masks (zero_empty_rows): per batch, broadcast over heads, with -inf entries
      // and one query row masked everywhere (O = 0 there); a padding row [B, 1, 1, Tk].
      {"mma_per_batch_mask_empty_row", {2, 3}, 100, 136, 64, 64, "per_batch", 0.1},
      {"per_batch_mask_empty_row_tk130", {2, 2}, 70, 130, 32, 32, "per_batch", 0.2},
      {"mma_padding_mask", {2, 2}, 77, 77, 32, 32, "padding", 0.0},
      // XGLM's clamp max(S + M, lowest) as the fused op's score_floor with torch.maximum's ties: rows
      // masked everywhere by the lowest float, by -inf, and by both are uniform, and their scores get
      // half the gradient at the floor and none below it (the fill-row fix-ups, after the kernels).
      {"mma_floored_rows", {2, 3}, 100, 136, 64, 64, "floored", 0.1},
      {"floored_rows_tk130", {2, 2}, 70, 130, 32, 32, "floored", 0.2},
      // A Where's finite fill alone as score_floor with floor_tie 0 (its masked entries -inf, the
      // fill's ties give no gradient): the same mask, the other tie factor.
      {"mma_floored_rows_tie0", {2, 3}, 100, 136, 64, 64, "floored0", 0.1},
      // The form a Where with fill -1e9 and a padding condition fuses to: its masked entries -inf,
      // score_floor -1e9, floor_tie 0 (rows masked everywhere by -inf: uniform at the floor).
      {"mma_where_floor_1e9", {2, 2}, 100, 136, 64, 64, "wherefloor", 0.1},
      // A bias per head shared by 16 images (Swin's window attention, T5's relative positions):
      // its gradient sums 16 scores an element, by atomics, and with `deterministic` stored per
      // score and summed after (maskGradInParts), 16 sharers over a block's 32 lanes.
      {"mma_bias_shared_over_batch", {16, 3}, 49, 49, 32, 32, "per_head", 0.0},
      // Head dims above 64 (f16/bf16 only: the 128-wide head tile of the mma.sync kernels; 96 and
      // 80 zero-padded to it): causal with dropout, a random mask with partial tiles, transformers'
      // per-batch mask with an empty row, odd Tk (KT rows element by element).
      {"mma_d128_causal_dropout", {2, 2}, 200, 200, 128, 128, "causal", 0.1},
      {"mma_d96_dv80_random_mask", {1, 3}, 100, 136, 96, 80, "random", 0.0},
      {"mma_d128_dv64_per_batch", {2, 2}, 77, 130, 128, 64, "per_batch", 0.0},
      {"mma_d128_odd_keys", {1, 2}, 70, 61, 128, 128, "", 0.0},
      // GPT-2's eager form, Where(causal, S, finfo.min) + a padding mask summed into one, with
      // where_causal: batch 1's first three keys padded, so its first three queries are masked
      // everywhere, and the fix-ups give their scores above the diagonal (a Where's) no gradient.
      {"mma_where_causal_padded", {2, 2}, 100, 100, 64, 64, "where_causal", 0.1},
      // where_masked: a window of two keys under the same padding, so batch 1's rows 0-2 are masked
      // everywhere by the two; the fix-ups read the window's entries from the operand
      {"mma_where_window_padded", {2, 2}, 100, 100, 64, 64, "where_window", 0.1},
      // More keys than the fill-row fix-ups keep in shared memory (24576): row 77, masked
      // everywhere by the finite fill, recomputed with its scores in global scratch.
      {"mma_fill_row_long_keys", {1, 1}, 80, 24640, 64, 64, "causal", 0.1},
  };
  // Where the wgmma forward is built (AMPC_WGMMA) it runs by default at both head tiles; the second
  // pass, at bf16, runs the mma.sync forwards (AMPC_ATTENTION_MMA_SYNC=1) with two m-tiles a warp at
  // 64 (AMPC_ATTENTION_FWD_MT2=1); the third, at f16 and bf16, the mma.sync forward at 64 with one
  // (AMPC_ATTENTION_WGMMA64=0).
  struct Unset {
    ~Unset() {
      unsetenv("AMPC_ATTENTION_MMA_SYNC");
      unsetenv("AMPC_ATTENTION_FWD_MT2");
      unsetenv("AMPC_ATTENTION_WGMMA64");
    }
  } unset;
  for (const int pass : {0, 1, 2})
  for (const auto& c : cases)
    for (const char* t : {"f32", "f16", "bf16"}) {
      const std::string T = t;
      if (T == "f32" && (c.d > 64 || c.dv > 64)) continue;  // f32 runs the FMA kernels, head dims up to 64
      if ((pass == 1 && T != "bf16") || (pass == 2 && T == "f32")) continue;
      if (pass == 1) setenv("AMPC_ATTENTION_MMA_SYNC", "1", 1), setenv("AMPC_ATTENTION_FWD_MT2", "1", 1);
      if (pass == 2) unsetenv("AMPC_ATTENTION_MMA_SYNC"), unsetenv("AMPC_ATTENTION_FWD_MT2"), setenv("AMPC_ATTENTION_WGMMA64", "0", 1);
      SCOPED_TRACE(pass == 1 ? "mma.sync forward at head tile 128, two m-tiles a warp at 64"
                   : pass == 2 ? "mma.sync forward at head tile 64, one m-tile a warp"
                               : "default forward (wgmma)");
      auto sh = [&](int64_t a, int64_t b) {
        auto v = c.lead;
        v.push_back(a);
        v.push_back(b);
        return dims(v);
      };
      std::vector<int64_t> lse = c.lead;
      lse.push_back(c.tq);
      const bool floored = c.mask == "floored" || c.mask == "floored0" || c.mask == "wherefloor";
      const bool transformers = c.mask == "per_batch" || c.mask == "padding" || floored;
      const std::string maskShape = c.mask == "causal" || c.mask == "zeros" ? dims({1, 1, c.tq, c.tk})
                                    : transformers ? dims({c.lead[0], 1, c.mask == "padding" ? 1 : c.tq, c.tk})
                                    : c.mask == "per_head" ? dims({1, c.lead[1], c.tq, c.tk})
                                                   : sh(c.tq, c.tk);
      const std::string attrs = " {scale = 0.3, dropout_ratio = " + std::to_string(c.ratio) + ", dropout_key = 987654" +
                                (floored ? std::string(c.mask == "wherefloor" ? ", score_floor = -1e9" : ", score_floor = -3.4028234663852886e38") +
                                               ", floor_tie = " + (c.mask == "floored" ? "0.5" : "0.0")
                                 : transformers ? ", zero_empty_rows = 1"
                                 : c.mask == "where_causal" ? ", where_causal = 1"
                                                : "") +
                                "}";
      const std::string m = c.mask.empty() ? "" : c.mask == "where_window" ? ", %m, %w" : ", %m";
      std::string text = "graph \"a\" opset 17 {\n  domain \"ampc\" 1\n";
      text += "  input %q : " + T + sh(c.tq, c.d) + "\n  input %kt : " + T + sh(c.d, c.tk) + "\n  input %v : " + T + sh(c.tk, c.dv) +
              "\n  input %do : " + T + sh(c.tq, c.dv) + "\n";
      if (!c.mask.empty()) text += "  input %m : f32" + maskShape + "\n";
      if (c.mask == "where_window") text += "  input %w : bool" + maskShape + "\n";
      text += "  %o : " + T + sh(c.tq, c.dv) + ", %lse : f32" + dims(lse) + " = ampc::Attention(%q, %kt, %v" + m + ")" + attrs + "\n";
      const std::string grads = "  %dq : " + T + sh(c.tq, c.d) + ", %dkt : " + T + sh(c.d, c.tk) + ", %dv : " + T + sh(c.tk, c.dv);
      text += grads + " = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse" + m + ")" + attrs + "\n";
      text += "  output %o\n  output %lse\n  output %dq\n  output %dkt\n  output %dv\n}\n";
      auto g = parseGraph(text, c.name);
      std::map<std::string, Tensor> in;
      // where_window: the window's masked entries (key j > query i, or j <= i - 2), batch 1's keys 0-2 padded
      auto windowed = [&](int64_t e) {
        const int64_t j = e % c.tk, i = (e / c.tk) % c.tq;
        return j > i || j <= i - 2;
      };
      auto padded = [&](int64_t e) { return e / (c.tq * c.tk) / c.lead[1] == 1 && e % c.tk < 3; };
      for (const Value* v : g->inputs()) {
        if (v->name() == "w") {
          Tensor w(v->type());
          for (int64_t e = 0; e < w.numel(); ++e) w.setDouble(e, windowed(e) ? 1.0 : 0.0);
          in.emplace("w", std::move(w));
          continue;
        }
        if (v->name() != "m") {
          in.emplace(v->name(), randomTensor(v->type()));
          continue;
        }
        Tensor mk = randomTensor(v->type());
        const float neg = -3.4028234663852886e38f;
        for (int64_t e = 0; e < mk.numel(); ++e) {
          const int64_t j = e % c.tk, i = (e / c.tk) % c.tq;
          if (c.mask == "padding") mk.setDouble(e, e >= c.tk && j >= c.tk - 7 ? -INFINITY : 0.0);  // batch 1's last 7 keys
          else if (c.mask == "per_batch") mk.setDouble(e, (e >= c.tq * c.tk && i == 5) || mk.getDouble(e) < -0.5 ? -INFINITY : mk.getDouble(e));
          else if (c.mask == "wherefloor") {  // -inf where masked (~30%, and rows 7 and 5 of batches 0 and 1), else 0
            const bool b1 = e >= c.tq * c.tk;
            mk.setDouble(e, mk.getDouble(e) < -0.5 || (!b1 && i == 7) || (b1 && i == 5) ? -INFINITY : 0.0);
          } else if (floored) {  // batch 0's row 7 by -inf, batch 1's row 5 by the lowest float, its row 9 by both
            const bool b1 = e >= c.tq * c.tk;
            double x = mk.getDouble(e) < -0.5 ? neg : mk.getDouble(e);
            if (!b1 && i == 7) x = -INFINITY;
            if (b1 && i == 5) x = neg;
            if (b1 && i == 9) x = j % 2 ? neg : -INFINITY;
            mk.setDouble(e, x);
          }
          else if (c.mask == "zeros") mk.setDouble(e, 0.0);
          else if (c.mask == "per_head") continue;  // the bias as drawn
          else if (c.mask == "causal") mk.setDouble(e, j > i || i == 77 ? neg : 0.0);  // row 77: masked everywhere
          else if (c.mask == "where_causal") {  // the causal fill plus batch 1's padding of keys 0-2 (both: -inf)
            const bool b1 = e / (c.tq * c.tk) / c.lead[1] == 1;
            const bool above = j > i, pad = b1 && j < 3;
            mk.setDouble(e, above && pad ? -INFINITY : above || pad ? neg : 0.0);
          } else if (c.mask == "where_window") {
            const bool win = windowed(e), pad = padded(e);
            mk.setDouble(e, win && pad ? -INFINITY : win || pad ? neg : 0.0);
          }
          else if (mk.getDouble(e) < -0.5) mk.setDouble(e, neg);                  // ~30% masked, the rest N(0,1)
        }
        in.emplace("m", std::move(mk));
      }
      ExecOptions eo;
      eo.seed = 42;
      eo.step = 5;
      expectSameOnGpu(*g, in, c.name + " at " + T, 1.0, eo);
      if (c.mask.empty()) continue;
      // The mask taken as trained (a bias): AttentionGrad's fourth result is its gradient, the
      // unscaled score gradients p (dP - D) summed over the dims the mask broadcasts along. Its
      // f32 sums cancel (dP against D = dO . O), so both backends get the same O and LSE (the
      // CPU forward's): the backward alone against the CPU, every result at its type's tolerance.
      std::string bw = "graph \"b\" opset 17 {\n  domain \"ampc\" 1\n";
      for (const Value* v : g->inputs()) bw += "  input %" + v->name() + " : " + v->type().str() + "\n";
      bw += "  input %o : " + T + sh(c.tq, c.dv) + "\n  input %lse : f32" + dims(lse) + "\n";
      bw += grads + ", %dm : f32" + maskShape + " = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse" + m + ")" + attrs + "\n";
      bw += "  output %dq\n  output %dkt\n  output %dv\n  output %dm\n}\n";
      auto gb = parseGraph(bw, c.name + " backward");
      auto cpu = createCpuBackend();
      const auto fw = evaluate(*g, in, *cpu, eo);
      auto bin = in;
      bin.emplace("o", fw[0]);
      bin.emplace("lse", fw[1]);
      expectSameOnGpu(*gb, bin, c.name + " backward with the mask's gradient at " + T, 1.0, eo);
      // --deterministic: each score's gradient stored, then summed per mask element in a fixed order.
      expectSameOnGpu(*gb, bin, c.name + " deterministic backward with the mask's gradient at " + T, 1.0, eo, true);
    }
}

// Attention operands in place (passes/attention_in_place.cpp), as GPT-2 exports them: Q, K and V split from one
// projection [B, T, 3C] and transposed to heads, O transposed back, dO transposed in, and the three
// gradients transposed back and concatenated. Then the same with Q, K, V from separate inputs and
// the gradients not concatenated. Against the CPU (which runs every node), causal mask (row 77 masked
// everywhere, the entries above the diagonal marked where_masked: no gradient there), dropout on,
// partial tiles (T = 136), and T = 99 without dropout (KT's rows, read in place as K rows, are
// then of any length), at head dims 16 and 128; and the views are gone from the graph.
TEST(GpuAttention, OperandsInPlaceMatchTheCpu) {
  AMPC_NEED_GPU();
  for (const int hd : {16, 128})  // head dims: 128 runs the kernels' 128-wide head tile
  for (const int tt : {136, 99})
    for (const char* t : {"f16", "bf16"})
      for (const bool split : {true, false}) {
      const std::string T = t, bthd = T + "[2,136,3,16]", bhtd = T + "[2,3,136,16]", bhdt = T + "[2,3,16,136]";
      std::string text = "graph \"a\" opset 17 {\n  domain \"ampc\" 1\n  input %dy : " + T + "[2,136,48]\n  input %m : f32[1,1,136,136]\n";
      text += "  input %w : bool[1,1,136,136]\n";
      text += "  const %s4 : i64[4] = [2, 136, 3, 16]\n  const %s3 : i64[3] = [2, 136, 48]\n";
      if (split) {
        text += "  input %x : " + T + "[2,136,144]\n  const %sp : i64[3] = [48, 48, 48]\n";
        text += "  %q, %k, %v = Split(%x, %sp) {axis = 2}\n";  // shapes filled in below
        for (const char* w : {"q", "k", "v"}) text += "  %" + std::string(w) + "r : " + bthd + " = Reshape(%" + w + ", %s4)\n";
      } else {
        for (const char* w : {"q", "k", "v"}) text += "  input %" + std::string(w) + "r : " + bthd + "\n";
      }
      text += "  %Q : " + bhtd + " = Transpose(%qr) {perm = [0, 2, 1, 3]}\n  %KT : " + bhdt + " = Transpose(%kr) {perm = [0, 2, 3, 1]}\n";
      text += "  %V : " + bhtd + " = Transpose(%vr) {perm = [0, 2, 1, 3]}\n";
      const std::string attrs = std::string(" {scale = 0.25, dropout_ratio = ") + (tt == 136 ? "0.1" : "0.0") + ", dropout_key = 4242}";
      text += "  %O : " + bhtd + ", %lse : f32[2,3,136] = ampc::Attention(%Q, %KT, %V, %m, %w)" + attrs + "\n";
      text += "  %Ot : " + bthd + " = Transpose(%O) {perm = [0, 2, 1, 3]}\n  %Or : " + T + "[2,136,48] = Reshape(%Ot, %s3)\n";
      text += "  %dyr : " + bthd + " = Reshape(%dy, %s4)\n  %dO : " + bhtd + " = Transpose(%dyr) {perm = [0, 2, 1, 3]}\n";
      text += "  %dQ : " + bhtd + ", %dKT : " + bhdt + ", %dV : " + bhtd + " = ampc::AttentionGrad(%dO, %Q, %KT, %V, %O, %lse, %m, %w)" + attrs + "\n";
      text += "  %dQt : " + bthd + " = Transpose(%dQ) {perm = [0, 2, 1, 3]}\n  %dKt : " + bthd + " = Transpose(%dKT) {perm = [0, 3, 1, 2]}\n";
      text += "  %dVt : " + bthd + " = Transpose(%dV) {perm = [0, 2, 1, 3]}\n";
      if (split) {
        for (const char* w : {"dQ", "dK", "dV"}) text += "  %" + std::string(w) + "r : " + T + "[2,136,48] = Reshape(%" + w + "t, %s3)\n";
        text += "  %dx : " + T + "[2,136,144] = Concat(%dQr, %dKr, %dVr) {axis = 2}\n  output %Or\n  output %dx\n}\n";
      } else {
        text += "  output %Or\n  output %dQt\n  output %dKt\n  output %dVt\n}\n";
      }
      text = std::regex_replace(text, std::regex("%q, %k, %v = "), "%q : " + T + "[2,136,48], %k : " + T + "[2,136,48], %v : " + T + "[2,136,48] = ");
      text = std::regex_replace(text, std::regex("\\b16\\b"), std::to_string(hd));  // the head dim, then 3 and 9 heads' widths
      text = std::regex_replace(text, std::regex("\\b48\\b"), std::to_string(3 * hd));
      text = std::regex_replace(text, std::regex("\\b144\\b"), std::to_string(9 * hd));
      text = std::regex_replace(text, std::regex("136"), std::to_string(tt));  // the sequence length
      auto g = parseGraph(text, "attention in place");
      ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
      std::map<std::string, Tensor> in;
      for (const Value* v : g->inputs()) {
        Tensor x = randomTensor(v->type());
        if (v->name() == "m")  // causal, and row 77 masked everywhere
          for (int64_t e = 0; e < x.numel(); ++e) x.setDouble(e, e % tt > e / tt || e / tt == 77 ? -3.4028234663852886e38 : 0.0);
        if (v->name() == "w")  // where_masked: the entries above the diagonal (row 77's get no gradient)
          for (int64_t e = 0; e < x.numel(); ++e) x.setDouble(e, e % tt > e / tt ? 1.0 : 0.0);
        in.emplace(v->name(), std::move(x));
      }
      ExecOptions eo;
      eo.seed = 77;
      eo.step = 3;
      const std::string what = std::string("attention in place ") + t + (split ? " split/concat" : " transposes") + " T " + std::to_string(tt) +
                               " head dim " + std::to_string(hd);
      expectSameOnGpu(*g, in, what, 1.0, eo);
      // The head views are gone: the two attention nodes read and write through their layouts.
      for (const auto& n : g->nodes()) EXPECT_TRUE(n->op() == "Reshape" || n->domain() == "cuda") << what << ": " << n->describe();
      EXPECT_EQ(g->lookup(split ? "dx" : "dQt")->producer()->op(), "AttentionGrad") << what;
      cuda::Program prog(*g, {});
      EXPECT_GT(prog.memoryPlan().slots.at(g->lookup("Ot")).bytes, 0) << what;
    }
}

// Grouped-query attention read in place (passes/attention_in_place.cpp): 6 query heads over 2 stored K/V heads,
// repeated as Hugging Face's repeat_kv exports it (Unsqueeze, Expand, Reshape; K transposed after).
// Forward and backward against the CPU (which gathers through the same layouts); the copies go.
TEST(GpuAttention, GroupedKeysAndValuesMatchTheCpu) {
  AMPC_NEED_GPU();
  for (const int hd : {16, 128})
    for (const char* t : {"f16", "bf16"})
      for (const int tt : {136, 99}) {
        const std::string T = t;
        std::string text = R"(graph "gqa" opset 18 {
  domain "ampc" 1
  input %q : T[2,6,136,16]
  input %k : T[2,2,136,16]
  input %v : T[2,2,136,16]
  input %dO : T[2,6,136,16]
  const %ax : i64[1] = [2]
  const %s5 : i64[5] = [2, 2, 3, 136, 16]
  const %s4 : i64[4] = [2, 6, 136, 16]
  %ku : T[2,2,1,136,16] = Unsqueeze(%k, %ax)
  %ke : T[2,2,3,136,16] = Expand(%ku, %s5)
  %kr : T[2,6,136,16] = Reshape(%ke, %s4)
  %KT : T[2,6,16,136] = Transpose(%kr) {perm = [0, 1, 3, 2]}
  %vu : T[2,2,1,136,16] = Unsqueeze(%v, %ax)
  %ve : T[2,2,3,136,16] = Expand(%vu, %s5)
  %V : T[2,6,136,16] = Reshape(%ve, %s4)
  %O : T[2,6,136,16], %lse : f32[2,6,136] = ampc::Attention(%q, %KT, %V) ATTRS
  %dQ : T[2,6,136,16], %dKT : T[2,6,16,136], %dV : T[2,6,136,16] = ampc::AttentionGrad(%dO, %q, %KT, %V, %O, %lse) ATTRS
  output %O
  output %dQ
  output %dKT
  output %dV
}
)";
        const std::string attrs = std::string("{scale = 0.25, dropout_ratio = ") + (tt == 136 ? "0.1" : "0.0") + ", dropout_key = 99}";
        text = std::regex_replace(text, std::regex("ATTRS"), attrs);
        text = std::regex_replace(text, std::regex("\\bT\\["), T + "[");
        text = std::regex_replace(text, std::regex("\\b16\\b"), std::to_string(hd));
        text = std::regex_replace(text, std::regex("136"), std::to_string(tt));
        auto g = parseGraph(text, "grouped attention");
        ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
        std::map<std::string, Tensor> in;
        for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type()));
        ExecOptions eo;
        eo.seed = 5;
        eo.step = 2;
        const std::string what = "grouped attention " + T + " T " + std::to_string(tt) + " head dim " + std::to_string(hd);
        expectSameOnGpu(*g, in, what, 1.0, eo);
        EXPECT_EQ(g->numNodes(), 2u) << what << ": the repeats are made";
      }
}

// Grouped K/V of cuDNN attention tests, as Hugging Face's repeat_kv exports it: %KT and %V from
// %k and %v, 2 K/V heads each repeated over 3 of the 6 query heads (T and 16 set by the caller).
const char* const kRepeatedKv = R"(  const %ax : i64[1] = [2]
  const %s5 : i64[5] = [2, 2, 3, 128, 16]
  const %s4 : i64[4] = [2, 6, 128, 16]
  %ku : T[2,2,1,128,16] = Unsqueeze(%k, %ax)
  %ke : T[2,2,3,128,16] = Expand(%ku, %s5)
  %kr : T[2,6,128,16] = Reshape(%ke, %s4)
  %KT : T[2,6,16,128] = Transpose(%kr) {perm = [0, 1, 3, 2]}
  %vu : T[2,2,1,128,16] = Unsqueeze(%v, %ax)
  %ve : T[2,2,3,128,16] = Expand(%vu, %s5)
  %V : T[2,6,128,16] = Reshape(%ve, %s4)
)";

// A graph of cuDNN attention tests: its constant %m [1, 1, 128, 128] becomes the causal mask as the
// exporters leave it (-3.4e38 above the diagonal), its operands are read in place as the CUDA
// lowering reads them, and `in` gets random values for its inputs.
static void prepareCausalAttention(Graph& g, std::map<std::string, Tensor>& in) {
  Tensor mask(g.lookup("m")->type());
  for (int64_t e = 0; e < mask.numel(); ++e) mask.setDouble(e, e % 128 > e / 128 ? -3.4028234663852886e38 : 0.0);
  g.lookup("m")->setData(mask);
  ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(g));
  for (const Value* v : g.inputs()) in.emplace(v->name(), randomTensor(v->type()));
}

// cuDNN's fused SDPA (runtime/cuda/cudnn_sdpa.h) in place of the kernels (ProgramOptions::attention
// cudnn): no mask and the causal one (a constant, or computed from constants in the step), one K/V
// head per query head (K read through its
// Transpose as rows) and grouped (6 over 2, as Hugging Face's repeat_kv exports it), dK written
// through its Transpose back, head dims 64, 128 and 256 (cuDNN only; also with KT itself an input,
// copied to rows and dK back), f16 and bf16. Forward and backward against the CPU, and cuDNN ran
// both nodes (no fallback to the kernels).
TEST(GpuAttention, CudnnMatchesTheCpu) {
  AMPC_NEED_GPU();
  for (const int hd : {64, 128, 256})
    for (const char* t : {"f16", "bf16"})
      for (const bool causal : {false, true}) {
        const bool grouped = causal;  // the two features in separate cases and together
        const std::string T = t;
        std::string text = R"(graph "sdpa" opset 18 {
  domain "ampc" 1
  input %q : T[2,6,128,16]
  input %k : T[2,KH,128,16]
  input %v : T[2,KH,128,16]
  input %dO : T[2,6,128,16]
  const %m : f32[1,1,128,128] = ...
)";
        if (grouped)
          text += kRepeatedKv;
        else if (hd != 256)
          text += "  %KT : T[2,6,16,128] = Transpose(%k) {perm = [0, 1, 3, 2]}\n";  // Llama's K without repeats
        // Head dim 256 (cuDNN only) without repeats: KT itself an input, so that K and dK pass through
        // scratch as rows
        const bool ktInput = hd == 256 && !grouped;
        if (ktInput) text = std::regex_replace(text, std::regex("input %k : T\\[2,KH,128,16\\]"), "input %KT : T[2,6,16,128]");
        // f16 at head dim 128: the causal mask computed in the step from constants only (as a long
        // sequence's is: fold-constants folds small values only), else the constant itself
        const bool computed = causal && hd == 128 && T == "f16";
        if (computed) text += "  const %zero : f32[] = [0.0]\n  %mc : f32[1,1,128,128] = Add(%m, %zero)\n";
        const std::string m = causal ? (computed ? ", %mc" : ", %m") : "", V = grouped ? "%V" : "%v";
        text += "  %O : T[2,6,128,16], %lse : f32[2,6,128] = ampc::Attention(%q, %KT, " + V + m + ") ATTRS\n";
        text += "  %dQ : T[2,6,128,16], %dKT : T[2,6,16,128], %dV : T[2,6,128,16] = ampc::AttentionGrad(%dO, %q, %KT, " + V + ", %O, %lse" + m +
                ") ATTRS\n";
        if (!ktInput) text += "  %dK : T[2,6,128,16] = Transpose(%dKT) {perm = [0, 1, 3, 2]}\n";
        text += std::string("  output %O\n  output %dQ\n  output ") + (ktInput ? "%dKT" : "%dK") + "\n  output %dV\n}\n";
        text = std::regex_replace(text, std::regex("ATTRS"), "{scale = 0.125, dropout_ratio = 0.0, dropout_key = 3}");
        text = std::regex_replace(text, std::regex("\\bT\\["), T + "[");
        text = std::regex_replace(text, std::regex("\\bKH\\b"), grouped ? "2" : "6");
        text = std::regex_replace(text, std::regex("\\b16\\b"), std::to_string(hd));
        auto g = parseGraph(text, "cudnn attention");
        std::map<std::string, Tensor> in;
        ASSERT_NO_FATAL_FAILURE(prepareCausalAttention(*g, in));
        const std::string what = "cuDNN attention " + T + " head dim " + std::to_string(hd) + (causal ? " causal" : "") + (grouped ? " grouped" : "") +
                                 (computed ? " (mask computed)" : "") + (ktInput ? " (KT an input)" : "");
        std::vector<std::pair<std::string, std::string>> picks;
        // (at 256, only cuDNN runs the nodes: the automatic choice has nothing else to take)
        expectSameOnGpu(*g, in, what, 1.0, {}, false, hd == 256 ? cuda::ProgramOptions::Attention::automatic : cuda::ProgramOptions::Attention::cudnn,
                        &picks);
        ASSERT_EQ(picks.size(), 2u) << what << ": a forward and a backward shape";
        for (const auto& [shape, pick] : picks) EXPECT_EQ(pick.rfind("cuDNN", 0), 0u) << what << ": " << shape << ": " << pick;
      }
}

// cuDNN's fused SDPA with an additive mask read as a bias (ProgramOptions::attention cudnn): the
// forms models export, each an input of random values: a padding mask [B, 1, 1, Tk] (the lowest
// float on padded keys, batch 1 all padding: its rows are masked everywhere by that finite fill,
// which cuDNN's LSE cannot hold, so they are recomputed; attentionFillRows*), a bias per head [1, H, Tq, Tk] (ALiBi's, T5's when not
// trained), a sliding window [1, 1, Tq, Tk] of -inf with one query masked everywhere under
// zero_empty_rows (its O row 0, as the exporters' NaN guard makes it), one per batch and head, and
// a causal LM's padding mask computed in the step (batch 1 left-padded: its first queries see only
// the fill, which PyTorch's softmax spreads over every key, above the diagonal too);
// MHA and GQA 6/2, head dims 64 and 256 (cuDNN only), f16 and bf16. Forward and backward against the
// CPU, and cuDNN ran both nodes.
TEST(GpuAttention, CudnnTakesAdditiveMasks) {
  AMPC_NEED_GPU();
  const char* shapes[] = {"[2,1,1,128]", "[1,6,128,128]", "[1,1,128,128]", "[2,6,128,128]", "[2,1,128,128]"};
  for (const int hd : {64, 256})
    for (const char* t : {"f16", "bf16"})
      for (int form = 0; form < 5; ++form) {
        const bool grouped = form % 2 == 1;
        std::string text = R"(graph "sdpa" opset 18 {
  domain "ampc" 1
  input %q : T[2,6,128,16]
  input %k : T[2,KH,128,16]
  input %v : T[2,KH,128,16]
  input %dO : T[2,6,128,16]
  input %m : f32MSHAPE
)";
        if (grouped)
          text += kRepeatedKv;
        else
          text += "  %KT : T[2,6,16,128] = Transpose(%k) {perm = [0, 1, 3, 2]}\n";
        const std::string V = grouped ? "%V" : "%v";
        text += "  %O : T[2,6,128,16], %lse : f32[2,6,128] = ampc::Attention(%q, %KT, " + V + ", %m) ATTRS\n";
        text += "  %dQ : T[2,6,128,16], %dKT : T[2,6,16,128], %dV : T[2,6,128,16] = ampc::AttentionGrad(%dO, %q, %KT, " + V +
                ", %O, %lse, %m) ATTRS\n";
        text += "  %dK : T[2,6,128,16] = Transpose(%dKT) {perm = [0, 1, 3, 2]}\n  output %O\n  output %dQ\n  output %dK\n  output %dV\n}\n";
        text = std::regex_replace(text, std::regex("ATTRS"), std::string("{scale = 0.125, dropout_ratio = 0.0, dropout_key = 3") +
                                                                 (form == 2 ? ", zero_empty_rows = 1}" : "}"));
        text = std::regex_replace(text, std::regex("MSHAPE"), shapes[form]);
        text = std::regex_replace(text, std::regex("\\bT\\["), std::string(t) + "[");
        text = std::regex_replace(text, std::regex("\\bKH\\b"), grouped ? "2" : "6");
        text = std::regex_replace(text, std::regex("\\b16\\b"), std::to_string(hd));
        // form 4: a causal LM's padding mask computed in the step from the input %am, as transformers'
        // sdpa masks export it: cuDNN's causal graph with the mask as a bias (containsCausalMask)
        const std::string computed = R"(  input %am : i64[2,128]
  const %r0 : i64[] = [0]
  const %r1 : i64[] = [1]
  const %rT : i64[] = [128]
  const %skv : i64[4] = [1, 1, 1, 128]
  const %sq : i64[4] = [1, 1, 128, 1]
  const %sp : i64[4] = [2, 1, 1, 128]
  const %sm : i64[4] = [2, 1, 128, 128]
  const %zero : f32[] = [0.0]
  const %low : f32[] = [-3.4028235e+38]
  %pos : i64[128] = Range(%r0, %rT, %r1)
  %kv : i64[1,1,1,128] = Reshape(%pos, %skv)
  %qp : i64[1,1,128,1] = Reshape(%pos, %sq)
  %le : bool[1,1,128,128] = LessOrEqual(%kv, %qp)
  %pb : bool[2,128] = Cast(%am) {to = 9}
  %pad : bool[2,1,1,128] = Reshape(%pb, %sp)
  %c : bool[2,1,128,128] = And(%le, %pad)
  %ce : bool[2,1,128,128] = Expand(%c, %sm)
  %m : f32[2,1,128,128] = Where(%ce, %zero, %low)
)";
        const std::string declared = "  input %m : f32[2,1,128,128]\n";
        if (form == 4) text.replace(text.find(declared), declared.size(), computed);
        auto g = parseGraph(text, "cudnn attention with a mask");
        ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
        std::map<std::string, Tensor> in;
        for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type()));
        std::mt19937 rng(form);
        if (form == 4) {
          Tensor& am = in.at("am");
          for (int64_t e = 0; e < am.numel(); ++e) am.setDouble(e, e < 128 ? (e == 0 || rng() % 4 != 0 ? 1.0 : 0.0) : e % 128 >= 16);
        }
        Tensor& m = form < 4 ? in.at("m") : in.at("am");
        const float lowest = std::numeric_limits<float>::lowest();
        for (int64_t e = 0; e < m.numel() && form < 4; ++e) {
          const int64_t key = e % 128, query = (e / 128) % 128;
          if (form == 0) m.setDouble(e, e >= 128 || (key != 0 && rng() % 4 == 0) ? lowest : 0.0);  // padding
          else if (form == 2) m.setDouble(e, key > query || query - key > 40 || query == 7 ? -INFINITY : 0.0);  // a causal window of 41 keys
          else m.setDouble(e, 2.0 * (static_cast<double>(rng() % 1000) / 1000.0 - 0.5));  // a bias
        }
        const std::string what = std::string("cuDNN attention ") + t + " head dim " + std::to_string(hd) + " mask " + shapes[form] +
                                 (grouped ? " grouped" : "");
        std::vector<std::pair<std::string, std::string>> picks;
        expectSameOnGpu(*g, in, what, 1.0, {}, false, hd == 256 ? cuda::ProgramOptions::Attention::automatic : cuda::ProgramOptions::Attention::cudnn,
                        &picks);
        ASSERT_EQ(picks.size(), 2u) << what << ": a forward and a backward shape";
        for (const auto& [shape, pick] : picks) {
          EXPECT_EQ(pick.rfind("cuDNN", 0), 0u) << what << ": " << shape << ": " << pick;
          EXPECT_EQ(shape.find("causal, masked") != std::string::npos, form == 4) << what << ": " << shape;
        }
      }
}

// cuDNN's softmax statistics are ampc's LSE (the natural log-sum-exp of each row's scores), so that
// either backward follows either forward and the fill-row check (kAttentionFillLse) reads them: the
// forward's LSE against the CPU's, with a bias per head and with the causal mask cuDNN generates,
// f16 and bf16, head dims 64 and 256.
TEST(GpuAttention, CudnnStatisticsAreTheLse) {
  AMPC_NEED_GPU();
  for (const int hd : {64, 256})
    for (const char* t : {"f16", "bf16"})
      for (const bool causal : {false, true}) {
        std::string text = R"(graph "sdpa" opset 18 {
  domain "ampc" 1
  input %q : T[2,6,128,16]
  input %k : T[2,6,128,16]
  input %v : T[2,6,128,16]
  MASK
  %KT : T[2,6,16,128] = Transpose(%k) {perm = [0, 1, 3, 2]}
  %O : T[2,6,128,16], %lse : f32[2,6,128] = ampc::Attention(%q, %KT, %v, %m) {scale = 0.125, dropout_ratio = 0.0, dropout_key = 3}
  output %O
  output %lse
}
)";
        text = std::regex_replace(text, std::regex("MASK"), causal ? "const %m : f32[1,1,128,128] = ..." : "input %m : f32[1,6,128,128]");
        text = std::regex_replace(text, std::regex("\\bT\\["), std::string(t) + "[");
        text = std::regex_replace(text, std::regex("\\b16\\b"), std::to_string(hd));
        auto g = parseGraph(text, "cudnn statistics");
        std::map<std::string, Tensor> in;
        if (causal) {
          ASSERT_NO_FATAL_FAILURE(prepareCausalAttention(*g, in));
        } else {
          ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
          for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type()));
        }
        const std::string what = std::string("cuDNN statistics ") + t + " head dim " + std::to_string(hd) + (causal ? " causal" : " bias");
        std::vector<std::pair<std::string, std::string>> picks;
        expectSameOnGpu(*g, in, what, 1.0, {}, false, hd == 256 ? cuda::ProgramOptions::Attention::automatic : cuda::ProgramOptions::Attention::cudnn,
                        &picks);
        ASSERT_EQ(picks.size(), 1u) << what;
        EXPECT_EQ(picks[0].second.rfind("cuDNN", 0), 0u) << what << ": " << picks[0].first << ": " << picks[0].second;
      }
}

// Choices stored in the plan (ProgramOptions::attentionChoices, written by amprun --tune) are followed
// without timing on the machine that measured them, and where cuDNN runs the mask's readers the
// kernels' mask tile flags are not computed (one launch fewer). A choice measured on another machine,
// or one not offered here, is measured again. Every run matches the CPU.
TEST(GpuAttention, StoredChoicesAreFollowed) {
  AMPC_NEED_GPU();
  auto g = parseGraph(R"(graph "sdpa" opset 18 {
  domain "ampc" 1
  input %q : bf16[2,6,128,64]
  input %k : bf16[2,6,128,64]
  input %v : bf16[2,6,128,64]
  input %dO : bf16[2,6,128,64]
  const %m : f32[1,1,128,128] = ...
  %KT : bf16[2,6,64,128] = Transpose(%k) {perm = [0, 1, 3, 2]}
  %O : bf16[2,6,128,64], %lse : f32[2,6,128] = ampc::Attention(%q, %KT, %v, %m) {scale = 0.125, dropout_ratio = 0.0, dropout_key = 3}
  %dQ : bf16[2,6,128,64], %dKT : bf16[2,6,64,128], %dV : bf16[2,6,128,64] = ampc::AttentionGrad(%dO, %q, %KT, %v, %O, %lse, %m) {scale = 0.125, dropout_ratio = 0.0, dropout_key = 3}
  %dK : bf16[2,6,128,64] = Transpose(%dKT) {perm = [0, 1, 3, 2]}
  output %O
  output %dQ
  output %dK
  output %dV
}
)",
                      "stored attention choices");
  std::map<std::string, Tensor> in;
  ASSERT_NO_FATAL_FAILURE(prepareCausalAttention(*g, in));
  auto cpu = createCpuBackend();
  const auto want = evaluate(*g, in, *cpu);
  recordFolds(*g);
  struct Ran {
    std::vector<std::pair<std::string, std::string>> picks;
    std::map<std::string, std::string> choices;
    std::string identity, note;
    int64_t launches = 0;
  };
  auto runWith = [&](const cuda::ProgramOptions& po, const std::string& what) {
    cuda::Program prog(*g, po);
    for (const Value* v : g->inputs()) prog.upload(v, in.at(v->name()));
    prog.run();
    Ran r{prog.attentionPicks(), prog.attentionChoices(), prog.tuningIdentity(), prog.tuningNote(), prog.stats().launches};
    for (size_t i = 0; i < g->outputs().size(); ++i) {
      bool nan = false;
      EXPECT_LE(relL2(prog.download(g->outputs()[i]), want[i], nan), tolerance(DType::bf16)) << what << ": output " << i;
      EXPECT_FALSE(nan) << what;
    }
    return r;
  };
  cuda::ProgramOptions po;
  po.attention = cuda::ProgramOptions::Attention::cudnn;
  const Ran dnn = runWith(po, "cudnn");
  ASSERT_EQ(dnn.choices.size(), 2u) << "cuDNN takes the forward and the backward";
  for (const auto& [shape, c] : dnn.choices) ASSERT_EQ(c.rfind("cuDNN", 0), 0u) << shape << ": " << c;
  po.attention = cuda::ProgramOptions::Attention::automatic;
  po.tunedOn = dnn.identity;
  // Stored: the kernels for both shapes, then cuDNN for both.
  for (auto& [shape, c] : po.attentionChoices = dnn.choices) c = "kernels";
  const Ran kernels = runWith(po, "stored kernels");
  po.attentionChoices = dnn.choices;
  const Ran stored = runWith(po, "stored cuDNN");
  ASSERT_EQ(kernels.picks.size(), 2u);
  ASSERT_EQ(stored.picks.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(kernels.picks[i].second, "kernels (stored in the plan)") << kernels.picks[i].first;
    EXPECT_EQ(stored.picks[i].second, dnn.choices.at(stored.picks[i].first) + " (stored in the plan)") << stored.picks[i].first;
  }
  EXPECT_EQ(stored.launches, kernels.launches - 1) << "the mask's tile flags are computed only for the kernels";
  EXPECT_TRUE(kernels.note.empty() && stored.note.empty());
  // Measured on another machine: measured here (the first run times the candidates), and said why.
  po.tunedOn = "another GPU (sm_80), cuDNN 90100";
  const Ran other = runWith(po, "stored elsewhere");
  EXPECT_NE(other.note.find("measured on another GPU (sm_80), cuDNN 90100"), std::string::npos) << other.note;
  for (const auto& [shape, pick] : other.picks) EXPECT_EQ(pick.find("stored"), std::string::npos) << shape << ": " << pick;
  EXPECT_EQ(other.choices.size(), 2u);
  // A choice this cuDNN does not offer: measured too.
  po.tunedOn = dnn.identity;
  for (auto& [shape, c] : po.attentionChoices) c = "cuDNN engine 999";
  const Ran gone = runWith(po, "choice not offered");
  for (const auto& [shape, pick] : gone.picks) EXPECT_EQ(pick.find("stored"), std::string::npos) << shape << ": " << pick;
  EXPECT_TRUE(gone.note.empty());
}

// The tensor-core backward's registers and shared memory are sized for two blocks per SM at both
// head tiles (at 128: two cp.async stages, dS^T over the used dO tile); before stop 34 the 128 tile
// took 152 KB and ran one block of four warps per SM. A change that grows either fails here.
TEST(GpuAttention, BackwardHoldsTwoBlocksPerSm) {
  AMPC_NEED_GPU();
  for (const cuda::DT t : {cuda::DT::f16, cuda::DT::bf16})
    for (const int64_t d : {64, 128})
      for (const bool kRows : {false, true})
        for (const bool trainedMask : {false, true}) {
          cuda::AttentionArgs a;
          a.t = t;
          a.N = 4;
          a.Tq = a.Tk = 256;
          a.D = a.Dv = d;
          a.kRows = kRows;
          float dummy = 0.0f;
          if (trainedMask) a.dMask = &dummy;  // picks the instance with the mask gradient; nothing launches
          EXPECT_GE(cuda::attentionBackwardBlocksPerSm(a), 2)
              << (t == cuda::DT::f16 ? "f16" : "bf16") << " head dim " << d << (kRows ? " K rows" : " KT") << (trainedMask ? " trained mask" : "");
        }
}

// An op without a CUDA lowering is refused when the plan loads, naming the node and the op
// (NegativeLogLikelihoodLoss: ampc's plans lower it first, passes/lower_nll.cpp).
TEST(GpuProgram, UnsupportedOpIsAnErrorNamingTheNode) {
  AMPC_NEED_GPU();
  auto g = parseGraph(
      "graph \"u\" opset 17 {\n  input %x : f32[4,5]\n  input %t : i64[4]\n"
      "  %y : f32[] = NegativeLogLikelihoodLoss(%x, %t) @my_loss\n  output %y\n}\n");
  try {
    cuda::Program p(*g, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my_loss"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NegativeLogLikelihoodLoss"), std::string::npos) << e.what();
  }
}

// A fused attention with soft-capped scores (the cpu target's; the CUDA kernels do not have it) is
// refused when the plan loads, naming the node and the attribute, not run without its cap.
TEST(GpuProgram, SoftcappedAttentionIsRefusedByName) {
  AMPC_NEED_GPU();
  auto g = parseGraph(
      "graph \"s\" opset 17 {\n  domain \"ampc\" 1\n  input %q : bf16[2,2,16,64]\n  input %kt : bf16[2,2,64,16]\n  input %v : bf16[2,2,16,64]\n"
      "  %o : bf16[2,2,16,64], %lse : f32[2,2,16] = ampc::Attention(%q, %kt, %v) {scale = 0.125, softcap = 50.0} @capped\n  output %o\n}\n");
  try {
    cuda::Program p(*g, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capped"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("softcap"), std::string::npos) << e.what();
  }
}

// Scatter max and min run on the CPU backend only: the CUDA program refuses them by name.
TEST(GpuProgram, ScatterMaxIsRefusedByName) {
  AMPC_NEED_GPU();
  auto g = parseGraph(
      "graph \"s\" opset 18 {\n  input %x : f32[3,4]\n  input %u : f32[2,4]\n  const %i : i64[2,4] = [0, 1, 2, 0, 0, 1, 2, 2]\n"
      "  %y : f32[3,4] = ScatterElements(%x, %i, %u) {reduction = \"max\"} @scatter_max\n  output %y\n}\n");
  try {
    cuda::Program p(*g, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scatter_max"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("reduction 'max'"), std::string::npos) << e.what();
  }
}

// Views and folded casts take no bytes of their own: the Reshape shares its input's bytes, and
// neither f32 side of the casts around the loss is ever written, so the arena holds the bf16
// logits, their bf16 gradient and the loss, not the two f32 copies (4 x 48 x 1001 bytes each).
TEST(GpuProgram, ViewsAndFoldedCastsTakeNoBytes) {
  AMPC_NEED_GPU();
  auto g = parseGraph(R"(graph "v" opset 17 {
  domain "ampc" 1
  input %x : bf16[48,1001]
  input %l : i64[48]
  input %d : f32[]
  const %s : i64[3] = [4, 12, 1001]
  %e : bf16[48,1001] = Neg(%x)
  %xf : f32[48,1001] = Cast(%e) {to = 1}
  %y : f32[] = SoftmaxCrossEntropyLoss(%xf, %l)
  %g : f32[48,1001] = ampc::SoftmaxCrossEntropyLossGrad(%d, %xf, %l) {reduction = "mean"}
  %gl : bf16[48,1001] = Cast(%g) {to = 16}
  %r : bf16[4,12,1001] = Reshape(%gl, %s)
  output %y
  output %r
}
)");
  ASSERT_TRUE(createFoldCastsPass(findTarget("cuda"))->run(*g));
  EXPECT_EQ(castFold(*g->lookup("xf")->producer()), CastFold::Readers);
  EXPECT_EQ(castFold(*g->lookup("gl")->producer()), CastFold::Producer);
  cuda::Program p(*g, {});
  const MemoryPlan& m = p.memoryPlan();
  EXPECT_EQ(m.slots.at(g->lookup("xf")).bytes, 0);
  EXPECT_EQ(m.slots.at(g->lookup("g")).bytes, 0);
  EXPECT_EQ(m.slots.at(g->lookup("r")).offset, m.slots.at(g->lookup("gl")).offset);
  EXPECT_EQ(m.views, 1);
  EXPECT_LT(m.arenaBytes, 2 * 4 * 48 * 1001);
  std::map<std::string, Tensor> in{{"x", randomTensor(g->lookup("x")->type(), 4.0)}, {"l", randomTensor(g->lookup("l")->type(), 1, 0, 1000)},
                                   {"d", randomTensor(g->lookup("d")->type())}};
  expectSameOnGpu(*g, in, "views and folded casts", 1.0);
}

// GPT-2's lm_head in small (tests/common/pitched_graph.h): the scores and their gradient are stored
// with a row pitch of 1008 (pitch-loss-scores), no padded copies of them, and the results are
// the CPU's, which stores them densely.
TEST(GpuProgram, PitchedLossScoresMatchTheCpu) {
  AMPC_NEED_GPU();
  for (const bool stats : {false, true}) {
    SCOPED_TRACE(stats ? "with the row statistics" : "without");
    auto g = parseGraph(test::pitchedLossGraph(), "pitched");
    // The loss keeping its row statistics for the gradient (keep-loss-stats, as the CUDA lowering
    // runs it), and not.
    if (stats) ASSERT_TRUE(createKeepLossStatsPass()->run(*g));
    ASSERT_TRUE(createPitchLossScoresPass(findTarget("cuda"))->run(*g));
    createFoldCastsPass(findTarget("cuda"))->run(*g);
    cuda::Program p(*g, {});
    const MemoryPlan& m = p.memoryPlan();
    for (const char* v : {"z", "gb"}) EXPECT_EQ(m.slots.at(g->lookup(v)).bytes, 1040 * 1008 * 2) << v;
    EXPECT_EQ(m.slots.at(g->lookup("gr")).offset, m.slots.at(g->lookup("gb")).offset);
    Tensor labels = randomTensor(g->lookup("l")->type(), 1, 0, 1000);
    for (int64_t r = 0; r < 1040; r += 37) labels.setDouble(r, 3);  // some rows ignored: their gradient rows are 0
    std::map<std::string, Tensor> in{{"h", randomTensor(g->lookup("h")->type())},
                                     {"w", randomTensor(g->lookup("w")->type(), 0.1)},
                                     {"wt", randomTensor(g->lookup("wt")->type())},
                                     {"l", std::move(labels)},
                                     {"d", randomTensor(g->lookup("d")->type())}};
    expectSameOnGpu(*g, in, "pitched loss scores", 1.0);
    // Downloading a pitched value gives its rows without the pad: the gradient gb (pitched, read by
    // the last two nodes, so nothing written after its last read takes its bytes) against the CPU's.
    // (The logits z cannot serve: their bytes go to gb and the products once the loss has read them.)
    const Value* gb = g->lookup("gb");
    const MemoryPlan::Slot& sg = m.slots.at(gb);
    for (const auto& [v, s] : m.slots) {
      if (s.bytes > 0 && s.first > sg.last) {
        EXPECT_TRUE(s.offset + s.bytes <= sg.offset || sg.offset + sg.bytes <= s.offset) << v->name() << " takes gb's bytes";
      }
    }
    auto ref = parseGraph(test::pitchedLossGraph("  output %gb\n"), "pitched-ref");
    auto cpu = createCpuBackend();
    const auto want = evaluate(*ref, in, *cpu, {});
    ASSERT_EQ(want.size(), 4u);
    for (const Value* v : g->inputs()) p.upload(v, in.at(v->name()));
    p.run();
    bool nan = false;
    EXPECT_LE(relL2(p.download(gb), want[3], nan), tolerance(DType::bf16)) << "pitched download";
    EXPECT_FALSE(nan);
  }
}

// Bias gradients summed by the weight gradients' GEMMs (passes/fuse_bias_grad.cpp makes the pair one
// cuda::Gemm, as the CUDA lowering does): X^T dY (GPT-2's Conv1D) and dY^T X (torch.nn.Linear),
// against the CPU reference. With 16-byte rows at f16 and bf16 cuBLASLt's BGRADA / BGRADB epilogue
// does it (one launch); at 50 columns, or where cuBLASLt has no such algorithm, the node sums them
// itself right after the product.
TEST(GpuProgram, BiasGradientsInTheirGemms) {
  AMPC_NEED_GPU();
  for (const char* t : {"f32", "f16", "bf16"})
    for (const bool linear : {false, true})
      for (const int out : {96, 50}) {
        const std::string T = t, O = std::to_string(out);
        const std::string dw = linear ? "%dw : " + T + "[" + O + ",64] = Gemm(%dy, %x) {transA = 1}"
                                      : "%dw : " + T + "[64," + O + "] = Gemm(%x, %dy) {transA = 1}";
        const std::string text = "graph \"b\" opset 17 {\n  input %x : " + T + "[256,64]\n  input %dy : " + T + "[256," + O +
                                 "]\n  const %ax : i64[1] = [0]\n  " + dw + "\n  %db : " + T + "[1," + O +
                                 "] = ReduceSum(%dy, %ax) {keepdims = 1}\n  output %dw\n  output %db\n}\n";
        const std::string what = T + (linear ? " dY^T X" : " X^T dY") + " out " + O;
        auto g = parseGraph(text, "b");
        g->bindOps();
        ASSERT_TRUE(createFuseBiasGradPass()->run(*g)) << what;
        {
          cuda::Program p(*g, {});
          std::printf("%s: %lld launch(es)\n", what.c_str(), static_cast<long long>(p.stats().launches));
          if (T != "f32" && out == 96) {
            EXPECT_EQ(p.stats().launches, 1) << what << ": the GEMM's epilogue sums the bias gradient";
          }
          EXPECT_LE(p.stats().launches, 2) << what;
        }
        std::map<std::string, Tensor> in{{"x", randomTensor(g->lookup("x")->type())}, {"dy", randomTensor(g->lookup("dy")->type())}};
        expectSameOnGpu(*g, in, what, 1.0);
      }
}

// A stem as ResNet's, at f16 and bf16: the first convolution's output (3 input channels, padded to 8
// for cuDNN's NHWC kernels), its batch norm and Relu are stored channels-last; the second
// convolution converts its result back to NCHW for the graph output.
TEST(GpuProgram, ChannelsLastStemMatchesTheCpu) {
  AMPC_NEED_GPU();
  for (const char* t : {"f16", "bf16"}) {
    std::string text = R"(graph "stem" opset 17 {
  input %x : $T[2,3,20,20]
  input %w1 : $T[16,3,7,7]
  input %s : f32[16]
  input %b : f32[16]
  input %m : f32[16]
  input %v : f32[16]
  input %w2 : $T[8,16,3,3]
  %y1 : $T[2,16,10,10] = Conv(%x, %w1) {kernel_shape = [7, 7], pads = [3, 3, 3, 3], strides = [2, 2]}
  %n : $T[2,16,10,10] = BatchNormalization(%y1, %s, %b, %m, %v) {training_mode = 1}
  %r : $T[2,16,10,10] = Relu(%n)
  %y2 : $T[2,8,10,10] = Conv(%r, %w2) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  output %y2
}
)";
    text = std::regex_replace(text, std::regex("\\$T"), t);
    auto g = parseGraph(text);
    {
      cuda::Program p(*g, {});
      EXPECT_TRUE(p.channelsLast(g->lookup("y1"))) << t;
      EXPECT_TRUE(p.channelsLast(g->lookup("r"))) << t;
      EXPECT_FALSE(p.channelsLast(g->lookup("y2"))) << t;  // a graph output
      EXPECT_FALSE(p.channelsLast(g->lookup("x"))) << t;   // a graph input
    }
    std::map<std::string, Tensor> in;
    for (const Value* v : g->inputs()) {
      Tensor x = randomTensor(v->type(), v->name() == "w1" ? 0.2 : 1.0);
      if (v->name() == "v")
        for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, std::fabs(x.getDouble(i)) + 0.05);
      in.emplace(v->name(), std::move(x));
    }
    expectSameOnGpu(*g, in, std::string("channels-last stem at ") + t, 1.0);
  }
}

// A max pool between convolutions is stored channels-last with its indices, and its gradient is the
// gather kernel (maxPoolGradChannelsLast): windows that overlap (3 x 3, stride 2), dilated and
// unevenly padded ones, at f16 and bf16, against the CPU's pool and scatter.
TEST(GpuProgram, ChannelsLastMaxPoolAndGradientMatchTheCpu) {
  AMPC_NEED_GPU();
  const std::vector<std::pair<std::string, std::string>> pools = {
      {"kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]", "[2,16,5,5]"},
      {"dilations = [2, 1], kernel_shape = [3, 2], pads = [2, 0, 1, 1], strides = [2, 2]", "[2,16,5,5]"}};
  for (const char* t : {"f16", "bf16"})
    for (const auto& [attrs, pooled] : pools) {
      std::string text = R"(graph "pool" opset 17 {
  domain "ampc" 1
  input %x : $T[2,16,10,10]
  input %w1 : $T[16,16,3,3]
  input %w2 : $T[8,16,1,1]
  %y1 : $T[2,16,10,10] = Conv(%x, %w1) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %p : $T$P, %i : i64$P = MaxPool(%y1) {$A}
  %dy : $T$P = Mul(%p, %p)
  %dx : $T[2,16,10,10] = ampc::ScatterAddFlat(%dy, %i) {shape = [2, 16, 10, 10]}
  %z : $T[2,8,10,10] = Conv(%dx, %w2) {kernel_shape = [1, 1]}
  output %z
}
)";
      text = std::regex_replace(std::regex_replace(std::regex_replace(text, std::regex("\\$T"), t), std::regex("\\$P"), pooled), std::regex("\\$A"), attrs);
      auto g = parseGraph(text);
      {
        cuda::Program p(*g, {});
        for (const char* v : {"y1", "p", "i", "dy", "dx"}) EXPECT_TRUE(p.channelsLast(g->lookup(v))) << t << " " << attrs << ": " << v;
      }
      std::map<std::string, Tensor> in;
      for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type(), v->name() == "x" ? 1.0 : 0.2));
      expectSameOnGpu(*g, in, std::string("channels-last max pool at ") + t + ", " + attrs, 1.0);
    }
}

// The keys stored algorithm choices go by (runtime/cuda/libs.h, convKey, gemmKey) tell apart every
// field the choice depends on: a key that dropped one would give a shape another shape's algorithm.
// Runs without a GPU (no cuDNN or cuBLASLt call).
TEST(AlgorithmKeys, NameEveryFieldTheChoiceDependsOn) {
  cuda::ConvDesc c;
  c.t = cuda::DT::bf16;
  c.nsp = 2;
  c.N = 8, c.C = 32, c.M = 64, c.groups = 1;
  c.in[0] = 28, c.in[1] = 28, c.k[0] = 3, c.k[1] = 3, c.out[0] = 28, c.out[1] = 28;
  c.pad[0] = 1, c.pad[1] = 1;
  const std::string base = cuda::convKey(c, cuda::ConvDir::forward);
  EXPECT_EQ(base, cuda::convKey(c, cuda::ConvDir::forward));
  std::set<std::string> keys{base};
  auto differs = [&](const std::string& k, const std::string& what) { EXPECT_TRUE(keys.insert(k).second) << what << ": " << k; };
  differs(cuda::convKey(c, cuda::ConvDir::backwardData), "direction");
  differs(cuda::convKey(c, cuda::ConvDir::backwardFilter), "direction");
  const std::vector<std::pair<std::string, std::function<void(cuda::ConvDesc&)>>> convEdits = {
      {"type", [](cuda::ConvDesc& d) { d.t = cuda::DT::f16; }},
      {"f32", [](cuda::ConvDesc& d) { d.t = cuda::DT::f32; }},
      {"tf32", [](cuda::ConvDesc& d) { d.t = cuda::DT::f32, d.allowTf32 = true; }},
      {"layout", [](cuda::ConvDesc& d) { d.nhwc = true; }},
      {"batch", [](cuda::ConvDesc& d) { d.N = 16; }},
      {"channels", [](cuda::ConvDesc& d) { d.C = 40; }},
      {"height", [](cuda::ConvDesc& d) { d.in[0] = 27; }},
      {"width", [](cuda::ConvDesc& d) { d.in[1] = 27; }},
      {"filters", [](cuda::ConvDesc& d) { d.M = 48; }},
      {"kernel", [](cuda::ConvDesc& d) { d.k[1] = 1; }},
      {"groups", [](cuda::ConvDesc& d) { d.groups = 4; }},
      {"pad", [](cuda::ConvDesc& d) { d.pad[0] = 0; }},
      {"stride", [](cuda::ConvDesc& d) { d.stride[1] = 2; }},
      {"dilation", [](cuda::ConvDesc& d) { d.dil[0] = 2; }},
      {"3-d", [](cuda::ConvDesc& d) { d.nsp = 3; }},
  };
  for (const auto& [what, edit] : convEdits) {
    cuda::ConvDesc d = c;
    edit(d);
    differs(cuda::convKey(d, cuda::ConvDir::forward), what);
  }
  cuda::GemmDesc g;
  g.t = cuda::DT::bf16;
  g.M = 256, g.N = 512, g.K = 384;
  keys = {cuda::gemmKey(g)};
  EXPECT_EQ(cuda::gemmKey(g), cuda::gemmKey(g));
  const std::vector<std::pair<std::string, std::function<void(cuda::GemmDesc&)>>> gemmEdits = {
      {"type", [](cuda::GemmDesc& d) { d.t = cuda::DT::f16; }},
      {"f32", [](cuda::GemmDesc& d) { d.t = cuda::DT::f32; }},
      {"tf32", [](cuda::GemmDesc& d) { d.t = cuda::DT::f32, d.allowTf32 = true; }},
      {"M", [](cuda::GemmDesc& d) { d.M = 255; }},
      {"N", [](cuda::GemmDesc& d) { d.N = 511; }},
      {"K", [](cuda::GemmDesc& d) { d.K = 383; }},
      {"transA", [](cuda::GemmDesc& d) { d.transA = true; }},
      {"transB", [](cuda::GemmDesc& d) { d.transB = true; }},
      {"batch", [](cuda::GemmDesc& d) { d.batch = 4, d.strideA = d.M * d.K, d.strideB = d.K * d.N, d.strideD = d.M * d.N; }},
      {"a shared B", [](cuda::GemmDesc& d) { d.batch = 4, d.strideA = d.M * d.K, d.strideB = 0, d.strideD = d.M * d.N; }},
      {"alpha", [](cuda::GemmDesc& d) { d.alpha = 0.5f; }},
      {"beta", [](cuda::GemmDesc& d) { d.beta = 1.0f; }},
      {"bias", [](cuda::GemmDesc& d) { d.bias = true; }},
      {"bias gradient of A", [](cuda::GemmDesc& d) { d.biasGrad = cuda::GemmDesc::BiasGrad::ofA; }},
      {"bias gradient of B", [](cuda::GemmDesc& d) { d.biasGrad = cuda::GemmDesc::BiasGrad::ofB; }},
  };
  for (const auto& [what, edit] : gemmEdits) {
    cuda::GemmDesc d = g;
    edit(d);
    differs(cuda::gemmKey(d), what);
  }
}

// Convolution and GEMM algorithms measured when the plan loads (ProgramOptions::algos measured: each
// key, a convolution's shape and direction or a GEMM's shape, timed once however many nodes share
// it), stored choices followed without timing on the machine that measured them, and measured again
// where they came from another machine or name an algorithm these libraries do not offer. Every run
// matches the CPU.
TEST(GpuProgram, AlgorithmsMeasuredStoredAndFollowed) {
  AMPC_NEED_GPU();
  auto g = parseGraph(R"(graph "convs" opset 17 {
  domain "ampc" 1
  input %x : bf16[8,32,28,28]
  input %w : bf16[64,32,3,3]
  input %x2 : bf16[8,32,28,28]
  input %w2 : bf16[64,32,3,3]
  input %wg : bf16[64,8,3,3]
  input %dy : bf16[8,64,28,28]
  input %a : bf16[256,384]
  input %b : bf16[384,512]
  input %a2 : bf16[256,384]
  %z : bf16[256,512] = MatMul(%a, %b)
  %z2 : bf16[256,512] = MatMul(%a2, %b)
  %y : bf16[8,64,28,28] = Conv(%x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %y2 : bf16[8,64,28,28] = Conv(%x2, %w2) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  %yg : bf16[8,64,14,14] = Conv(%x, %wg) {group = 4, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]}
  %dx : bf16[8,32,28,28], %dw : bf16[64,32,3,3] = ampc::ConvGrad(%dy, %x, %w) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]}
  output %y
  output %y2
  output %yg
  output %dx
  output %dw
  output %z
  output %z2
}
)",
                      "algorithms");
  std::map<std::string, Tensor> in;
  for (const Value* v : g->inputs()) in.emplace(v->name(), randomTensor(v->type(), v->name()[0] == 'w' || v->name()[0] == 'b' ? 0.2 : 1.0));
  auto cpu = createCpuBackend();
  const auto want = evaluate(*g, in, *cpu);
  recordFolds(*g);
  struct Ran {
    std::map<std::string, std::string> choices;
    std::pair<int, int> counts;
    std::string identity, note;
  };
  auto runWith = [&](const cuda::ProgramOptions& po, const std::string& what) {
    cuda::Program prog(*g, po);
    for (const Value* v : g->inputs()) prog.upload(v, in.at(v->name()));
    for (const Value* v : g->outputs()) EXPECT_EQ(cudaMemset(prog.ptr(v), 0xff, v->type().bytes()), cudaSuccess);
    prog.run();
    for (size_t i = 0; i < g->outputs().size(); ++i) {
      bool nan = false;
      EXPECT_LE(relL2(prog.download(g->outputs()[i]), want[i], nan), tolerance(DType::bf16)) << what << ": output " << g->outputs()[i]->name();
      EXPECT_FALSE(nan) << what << ": output " << g->outputs()[i]->name();
    }
    return Ran{prog.algoChoices(), prog.algoCounts(), prog.tuningIdentity(), prog.tuningNote()};
  };
  cuda::ProgramOptions po;
  const int64_t asked = cuda::Conv::heuristicQueries();
  const Ran heuristic = runWith(po, "heuristics");
  EXPECT_TRUE(heuristic.choices.empty());
  EXPECT_EQ(heuristic.counts, std::make_pair(0, 0));
  // cuDNN's heuristics asked once per convolution key (the plain forward's two nodes share one):
  // four, not one or two per node and direction (five of those here; before stop 64 two each, ten).
  // cuDNN 9 takes up to a second a query for grouped convolutions: RegNetY's load spent 86 s in them.
  EXPECT_EQ(cuda::Conv::heuristicQueries() - asked, 4);
  // Five keys: the plain convolution's forward (two nodes), backward-data and backward-filter, the
  // grouped forward, and the GEMM (two nodes).
  po.algos = cuda::ProgramOptions::Algos::measured;
  const Ran measured = runWith(po, "measured");
  ASSERT_EQ(measured.choices.size(), 5u);
  EXPECT_EQ(measured.counts, std::make_pair(5, 0));
  int directions[3] = {}, gemms = 0;
  for (const auto& [key, algo] : measured.choices) {
    for (int d = 0; d < 3; ++d) directions[d] += key.rfind(std::string("conv ") + cuda::convDirName(static_cast<cuda::ConvDir>(d)) + " ", 0) == 0;
    gemms += key.rfind("gemm bf16 M256 N512 K384", 0) == 0;
    EXPECT_NE(key.find("bf16"), std::string::npos) << key;
    EXPECT_GE(std::stoi(algo), 0) << key;
  }
  EXPECT_EQ(directions[0], 2);
  EXPECT_EQ(directions[1], 1);
  EXPECT_EQ(directions[2], 1);
  EXPECT_EQ(gemms, 1);
  // Stored on this machine: followed, nothing timed.
  po.algoChoices = measured.choices;
  po.tunedOn = measured.identity;
  const Ran stored = runWith(po, "stored");
  EXPECT_EQ(stored.counts, std::make_pair(0, 5));
  EXPECT_EQ(stored.choices, measured.choices);
  EXPECT_TRUE(stored.note.empty()) << stored.note;
  // An algorithm this cuDNN does not offer: measured again.
  for (auto& [key, algo] : po.algoChoices) algo = "999";
  const Ran gone = runWith(po, "choice not offered");
  EXPECT_EQ(gone.counts, std::make_pair(5, 0));
  // Stored on another machine: measured again, and said why.
  po.algoChoices = measured.choices;
  po.tunedOn = "another GPU (sm_80), cuDNN 90100";
  const Ran other = runWith(po, "stored elsewhere");
  EXPECT_EQ(other.counts, std::make_pair(5, 0));
  EXPECT_NE(other.note.find("measured on another GPU (sm_80), cuDNN 90100"), std::string::npos) << other.note;
  // With `deterministic`, neither measured nor stored ones: the heuristics' (deterministic) first.
  po.tunedOn = measured.identity;
  po.deterministic = true;
  const Ran det = runWith(po, "deterministic");
  EXPECT_EQ(det.counts, std::make_pair(0, 0));
}

}  // namespace
