// The CUDA target's lowering rewrites (runtime/lower.cpp), which make explicit target nodes: each
// pattern's forms and near misses, and the rewritten graph against the unfused one on the CPU
// reference, which runs the target nodes too.
// fuse-bias-grad (passes/fuse_bias_grad.cpp): ReduceSum(dY, axes [0]) beside its weight gradient's
// Gemm becomes one cuda::Gemm whose second result is the bias gradient.
// fuse-param-casts (passes/fuse_param_casts.cpp): the parameter casts become cuda::MultiCast nodes.
// fuse-norm-epilogue, fuse-relu-grad, fuse-dropout-residual: a batch norm's residual and Relu, a
// LayerNormGrad's residual, a ReLU gradient under BatchNormGrad and a Dropout's residual sum.
// fold-casts (passes/fold_casts.cpp): the casts done inside their neighbours, recorded on the Casts.
#include <gtest/gtest.h>

#include <random>

#include "compiler/ir/text.h"
#include "compiler/target.h"
#include "passes/fold_casts.h"
#include "passes/fold_comparisons.h"
#include "passes/group_optimizers.h"
#include "passes/pass.h"
#include "passes/pitch_loss_scores.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"
#include "tests/common/pitched_graph.h"

using namespace ampc;

namespace {

std::unique_ptr<Graph> load(const std::string& text) {
  auto g = parseGraph(text, "case");
  g->bindOps();
  verify(*g);
  return g;
}

std::map<std::string, Tensor> randomInputs(const Graph& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::map<std::string, Tensor> in;
  for (const Value* v : g.inputs()) {
    Tensor t(v->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, normal(rng));
    in.emplace(v->name(), std::move(t));
  }
  return in;
}

std::string edit(std::string t, const std::string& from, const std::string& to) {
  const size_t at = t.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? t : t.replace(at, from.size(), to);
}

// X^T dY, as GPT-2's Conv1D weight gradient; TYPE is replaced.
const std::string kBase = R"(graph "b" opset 17 {
  input %x : TYPE[64,32]
  input %dy : TYPE[64,48]
  const %ax : i64[1] = [0]
  %dw : TYPE[32,48] = Gemm(%x, %dy) {transA = 1}
  %db : TYPE[1,48] = ReduceSum(%dy, %ax) {keepdims = 1}
  output %dw
  output %db
}
)";

std::string typed(std::string t, const std::string& type) {
  for (size_t at; (at = t.find("TYPE")) != std::string::npos;) t.replace(at, 4, type);
  return t;
}

// Runs the pass on `text`: whether it fused, and then the fused node's result 1 is db and no
// ReduceSum or ONNX Gemm is left; the fused graph's outputs are bitwise the unfused graph's on the
// CPU, on fresh random data.
bool fuses(const std::string& text) {
  auto ref = load(text), g = load(text);
  const bool changed = createFuseBiasGradPass()->run(*g);
  verify(*g);
  const Node* f = g->lookup("db")->producer();
  if (changed) {
    EXPECT_EQ(f->domain(), "cuda");
    EXPECT_EQ(f->op(), "Gemm");
    EXPECT_EQ(f->result(1), g->lookup("db"));
    EXPECT_EQ(f->result(0), g->lookup("dw"));
    EXPECT_EQ(g->numNodes(), 1u);
    EXPECT_EQ(g->consts().size(), 0u) << "the axes constant is left behind";
  } else {
    EXPECT_EQ(printGraph(*g), printGraph(*ref));
  }
  auto cpu = createCpuBackend();
  const auto inputs = randomInputs(*ref, 11);
  const auto want = evaluate(*ref, inputs, *cpu), got = evaluate(*g, inputs, *cpu);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    EXPECT_EQ(got[i].type, want[i].type) << "output " << i;
    EXPECT_TRUE(got[i].data == want[i].data) << "output " << i << " differs";
    double sum = 0;
    for (int64_t k = 0; k < got[i].numel(); ++k) sum += std::fabs(got[i].getDouble(k));
    EXPECT_GT(sum, 0.0) << "output " << i << " is all zeros";
  }
  return changed;
}

}  // namespace

TEST(FuseBiasGrad, TheEpilogueFormsFuseAndComputeWhatTheyDid) {
  for (const char* t : {"f32", "f16", "bf16"}) {
    SCOPED_TRACE(t);
    const std::string base = typed(kBase, t), T = t;
    EXPECT_TRUE(fuses(base));
    // dY^T X, as torch.nn.Linear's weight gradient (stored [out, in]).
    EXPECT_TRUE(fuses(edit(base, "%dw : " + T + "[32,48] = Gemm(%x, %dy) {transA = 1}", "%dw : " + T + "[48,32] = Gemm(%dy, %x) {transA = 1}")));
    // keepdims = 0: the sums as [N].
    EXPECT_TRUE(fuses(edit(base, "%db : " + T + "[1,48] = ReduceSum(%dy, %ax) {keepdims = 1}", "%db : " + T + "[48] = ReduceSum(%dy, %ax) {keepdims = 0}")));
  }
}

TEST(FuseBiasGrad, NearMissesStayAsTheyAre) {
  const std::string base = typed(kBase, "bf16");
  // Sums over the other axis.
  EXPECT_FALSE(fuses(edit(edit(base, "[1] = [0]", "[1] = [1]"), "%db : bf16[1,48]", "%db : bf16[64,1]")));
  // The product reads dY transposed (transB): its contraction is not over dY's rows.
  EXPECT_FALSE(fuses(edit(edit(base, "%x : bf16[64,32]", "%x : bf16[48,32]"), "%dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1}",
                          "%dw : bf16[32,64] = Gemm(%x, %dy) {transA = 1, transB = 1}")));
  // A second ReduceSum of dY.
  EXPECT_FALSE(fuses(edit(base, "output %db", "output %db\n  %db2 : bf16[48] = ReduceSum(%dy, %ax) {keepdims = 0}\n  output %db2")));
  // The Gemm after the ReduceSum.
  EXPECT_FALSE(fuses(edit(edit(base, "  %dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1}\n", ""), "output %dw",
                          "%dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1}\n  output %dw")));
  // A scaled product.
  EXPECT_FALSE(fuses(edit(base, "%dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1}", "%dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1, alpha = 0.5}")));
  // dY1^T dY2 with a ReduceSum of each: the Gemm sums one of them, the other stays a ReduceSum.
  {
    const std::string two = R"(graph "b" opset 17 {
  input %x : bf16[64,32]
  input %dy : bf16[64,48]
  const %ax : i64[1] = [0]
  const %ax2 : i64[1] = [0]
  %dw : bf16[32,48] = Gemm(%x, %dy) {transA = 1}
  %db : bf16[1,48] = ReduceSum(%dy, %ax) {keepdims = 1}
  %dx : bf16[32] = ReduceSum(%x, %ax2) {keepdims = 0}
  output %dw
  output %db
  output %dx
}
)";
    auto ref = load(two), g = load(two);
    ASSERT_TRUE(createFuseBiasGradPass()->run(*g));
    verify(*g);
    EXPECT_EQ(g->numNodes(), 2u);
    EXPECT_EQ(g->lookup("dw")->producer()->domain(), "cuda");
    auto cpu = createCpuBackend();
    const auto inputs = randomInputs(*ref, 3);
    const auto want = evaluate(*ref, inputs, *cpu), got = evaluate(*g, inputs, *cpu);
    ASSERT_EQ(got.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(got[i].data == want[i].data) << i;
  }
  // A product with C.
  EXPECT_FALSE(fuses(edit(edit(base, "input %x : bf16[64,32]", "input %x : bf16[64,32]\n  input %c : bf16[48]"), "Gemm(%x, %dy)",
                          "Gemm(%x, %dy, %c)")));
}

// The shape rule of cuda::Gemm refuses a bias_grad that names no operand, naming the node.
TEST(FuseBiasGrad, TargetGemmChecksItsAttributes) {
  const std::string text = R"(graph "b" opset 17 {
  domain "cuda" 1
  input %x : f32[8,4]
  input %dy : f32[8,6]
  %dw : f32[4,6], %db : f32[6] = cuda::Gemm(%x, %dy) {transA = 1, bias_grad = 2, keepdims = 0} @g
  output %dw
  output %db
}
)";
  try {
    load(text);
    FAIL() << "bias_grad = 2 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias_grad must be 0 or 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda.Gemm"), std::string::npos) << e.what();
  }
}

// Two weights cast for the forward form one group at the first cast; the recasts of both, further
// on, another (the second joins the first, within kRecastWindow nodes); a cast of an input is left
// alone. Bitwise the casts on the CPU.
TEST(FuseParamCasts, FirstCastsGroupAndRecastsStartTheirOwn) {
  std::string text = R"(graph "pc" opset 17 {
  input %x : bf16[8,16]
  input %xf : f32[8,16]
  param %w1 : f32[16,16]
  param %w2 : f32[16]
  %c1 : bf16[16,16] = Cast(%w1) {to = 16} @cast_w1
  %h : bf16[8,16] = MatMul(%x, %c1) @mm
  %c2 : bf16[16] = Cast(%w2) {to = 16} @cast_w2
  %y : bf16[8,16] = Add(%h, %c2) @bias
  %xc : bf16[8,16] = Cast(%xf) {to = 16} @cast_input
)";
  for (int i = 0; i < 70; ++i) text += "  %n" + std::to_string(i + 1) + " : bf16[8,16] = Neg(%" + (i ? "n" + std::to_string(i) : std::string("y")) + ")\n";
  text += R"(  %r1 : bf16[16,16] = Cast(%w1) {to = 16} @recast_w1
  %z : bf16[8,16] = MatMul(%n70, %r1) @mm2
  %r2 : bf16[16] = Cast(%w2) {to = 16} @recast_w2
  %z2 : bf16[8,16] = Add(%z, %r2) @bias2
  %s : bf16[8,16] = Add(%z2, %xc) @sum
  output %s
}
)";
  auto ref = load(text), g = load(text);
  for (Value* p : {ref->lookup("w1"), ref->lookup("w2"), g->lookup("w1"), g->lookup("w2")}) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, 0.01 * static_cast<double>((i * 37) % 101) - 0.5);
    p->setData(std::move(t));
  }
  ASSERT_TRUE(createFuseParamCastsPass()->run(*g));
  verify(*g);
  std::vector<const Node*> multi;
  for (const auto& n : g->nodes())
    if (n->domain() == "cuda" && n->op() == "MultiCast") multi.push_back(n.get());
  ASSERT_EQ(multi.size(), 2u);
  EXPECT_EQ(multi[0]->numResults(), 2u);
  EXPECT_EQ(multi[0]->result(0), g->lookup("c1"));
  EXPECT_EQ(multi[0]->result(1), g->lookup("c2"));
  EXPECT_EQ(multi[1]->numResults(), 2u);
  EXPECT_EQ(multi[1]->result(0), g->lookup("r1"));
  EXPECT_EQ(multi[1]->result(1), g->lookup("r2"));
  EXPECT_EQ(g->lookup("xc")->producer()->op(), "Cast");  // an input's cast stays
  auto cpu = createCpuBackend();
  const auto inputs = randomInputs(*ref, 5);
  const auto want = evaluate(*ref, inputs, *cpu), got = evaluate(*g, inputs, *cpu);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].data == want[0].data);
}

// ---- fuse-norm-epilogue, fuse-relu-grad, fuse-dropout-residual ----
namespace {

int countOps(const Graph& g, const std::string& domain, const std::string& op) {
  int k = 0;
  for (const auto& n : g.nodes()) k += n->domain() == domain && n->op() == op;
  return k;
}

// The rewritten graph's outputs are bitwise the unfused graph's on the CPU, on fresh random data
// (variances made positive), and none is all zeros.
void expectSameOnCpu(const Graph& ref, const Graph& g, uint64_t seed, const ExecOptions& eo = {}) {
  auto cpu = createCpuBackend();
  auto inputs = randomInputs(ref, seed);
  for (auto& [name, t] : inputs)
    if (name.rfind("v", 0) == 0)
      for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, std::fabs(t.getDouble(i)) + 0.1);
  const auto want = evaluate(ref, inputs, *cpu, eo), got = evaluate(g, inputs, *cpu, eo);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].type, want[i].type) << "output " << i;
    EXPECT_TRUE(got[i].data == want[i].data) << "output " << i << " (" << ref.outputs()[i]->name() << ") differs";
    double sum = 0;
    for (int64_t k = 0; k < got[i].numel(); ++k) sum += std::fabs(got[i].getDouble(k));
    EXPECT_GT(sum, 0.0) << "output " << i << " is all zeros";
  }
}

// A bottleneck's last batch norm: + the shortcut, then ReLU; its running statistics are outputs.
const std::string kBnBlock = R"(graph "bn" opset 17 {
  input %x : TYPE[4,8,5,3]
  input %r : TYPE[4,8,5,3]
  input %s : f32[8]
  input %b : f32[8]
  input %m : f32[8]
  input %v : f32[8]
  %y : TYPE[4,8,5,3], %rm : f32[8], %rv : f32[8] = BatchNormalization(%x, %s, %b, %m, %v) {momentum = 0.9, training_mode = 1}
  %a : TYPE[4,8,5,3] = Add(%y, %r)
  %z : TYPE[4,8,5,3] = Relu(%a)
  output %z
  output %rm
  output %rv
}
)";

}  // namespace

TEST(FuseNormEpilogue, BatchNormWritesItsResidualAndRelu) {
  for (const char* t : {"f32", "f16", "bf16"}) {
    SCOPED_TRACE(t);
    const std::string base = typed(kBnBlock, t), T = t;
    const std::string noAdd = edit(edit(base, "  %a : " + T + "[4,8,5,3] = Add(%y, %r)\n", ""), "Relu(%a)", "Relu(%y)");
    const std::string noRelu = edit(edit(base, "  %z : " + T + "[4,8,5,3] = Relu(%a)\n", ""), "output %z", "output %a");
    struct Form {
      std::string text;
      int64_t residual, relu;
    };
    for (const Form& f : {Form{base, 1, 1}, Form{noAdd, 0, 1}, Form{noRelu, 1, 0}}) {
      auto ref = load(f.text), g = load(f.text);
      ASSERT_TRUE(createFuseNormEpiloguePass()->run(*g));
      verify(*g);
      ASSERT_EQ(g->numNodes(), 1u) << printGraph(*g);
      const Node& n = *g->nodes().front();
      EXPECT_EQ(n.domain(), "cuda");
      EXPECT_EQ(n.op(), "BatchNormalization");
      EXPECT_EQ(n.getInt("residual", -1), f.residual);
      EXPECT_EQ(n.getInt("relu", -1), f.relu);
      EXPECT_EQ(n.numInputs(), f.residual ? 6u : 5u);
      EXPECT_EQ(n.getFloat("momentum", 0), 0.9f);  // the batch norm's attributes kept
      EXPECT_EQ(g->outputs()[0]->name(), f.relu ? "z" : "a");
      expectSameOnCpu(*ref, *g, 21);
    }
  }
}

TEST(FuseNormEpilogue, NearMissesStayAsTheyAre) {
  const std::string base = typed(kBnBlock, "bf16");
  for (const std::string& text : {
           // y read twice: the Add's second reader needs y itself.
           edit(base, "  output %z\n", "  output %z\n  output %y\n"),
           // The residual made after the batch norm: the fused node would run before it.
           edit(base, "  %a : bf16[4,8,5,3] = Add(%y, %r)\n", "  %r2 : bf16[4,8,5,3] = Neg(%r)\n  %a : bf16[4,8,5,3] = Add(%y, %r2)\n"),
       }) {
    auto g = load(text);
    createFuseNormEpiloguePass()->run(*g);
    verify(*g);
    EXPECT_EQ(countOps(*g, "", "Add"), 1) << printGraph(*g);
  }
  // A broadcast residual keeps its Add, and so its Relu (which reads the Add, not the batch norm).
  auto b = load(edit(base, "input %r : bf16[4,8,5,3]", "input %r : bf16[8,5,3]"));
  createFuseNormEpiloguePass()->run(*b);
  EXPECT_EQ(countOps(*b, "", "Add"), 1);
  EXPECT_EQ(countOps(*b, "", "Relu"), 1);
  // A sum read twice: the batch norm writes the sum, and the Relu stays.
  auto twice = load(edit(base, "  output %z\n", "  output %z\n  output %a\n"));
  ASSERT_TRUE(createFuseNormEpiloguePass()->run(*twice));
  EXPECT_EQ(countOps(*twice, "", "Relu"), 1);
  EXPECT_EQ(twice->lookup("a")->producer()->domain(), "cuda");
}

TEST(FuseNormEpilogue, LayerNormGradWritesTheResidualStreamsGradient) {
  for (const char* t : {"f32", "bf16"}) {
    SCOPED_TRACE(t);
    const std::string text = typed(R"(graph "ln" opset 17 {
  domain "ampc" 1
  input %dy : TYPE[6,32]
  input %x : TYPE[6,32]
  input %s : f32[32]
  input %g : TYPE[6,32]
  %dx : TYPE[6,32], %ds : f32[32], %db : f32[32] = ampc::LayerNormGrad(%dy, %x, %s) {axis = -1, epsilon = 0.00001}
  %sum : TYPE[6,32] = Add(%g, %dx)
  output %sum
  output %ds
  output %db
}
)", t);
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createFuseNormEpiloguePass()->run(*g));
    verify(*g);
    ASSERT_EQ(g->numNodes(), 1u);
    const Node& n = *g->nodes().front();
    EXPECT_EQ(n.domain(), "cuda");
    EXPECT_EQ(n.op(), "LayerNormGrad");
    EXPECT_EQ(n.input(3), g->lookup("g"));
    EXPECT_EQ(n.result(0), g->lookup("sum"));
    expectSameOnCpu(*ref, *g, 22);
  }
}

TEST(FuseReluGrad, BatchNormGradReadsTheGatedGradient) {
  const std::string base = R"(graph "g" opset 17 {
  domain "ampc" 1
  input %dz : TYPE[4,8,5,3]
  input %y : TYPE[4,8,5,3]
  input %x : TYPE[4,8,5,3]
  input %s : f32[8]
  input %m : f32[8]
  input %v : f32[8]
  const %z : TYPE[] = [0.0]
  %p : bool[4,8,5,3] = Greater(%y, %z)
  %dy : TYPE[4,8,5,3] = Where(%p, %dz, %z)
  %dx : TYPE[4,8,5,3], %ds : f32[8], %db : f32[8] = ampc::BatchNormGrad(%dy, %x, %s, %m, %v) {training_mode = 1}
  output %dx
  output %ds
  output %db
}
)";
  for (const char* t : {"f32", "f16", "bf16"}) {
    SCOPED_TRACE(t);
    const std::string text = typed(base, t);
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createFuseReluGradPass()->run(*g));
    verify(*g);
    ASSERT_EQ(g->numNodes(), 1u);
    const Node& n = *g->nodes().front();
    EXPECT_EQ(n.domain(), "cuda");
    EXPECT_EQ(n.op(), "BatchNormGrad");
    EXPECT_EQ(n.input(0), g->lookup("dz"));
    EXPECT_EQ(n.input(5), g->lookup("y"));
    EXPECT_EQ(g->consts().size(), 0u) << "the zero is left behind";
    expectSameOnCpu(*ref, *g, 23);
  }
  // The gated gradient read elsewhere too (a shortcut's), a gate other than y > 0, or a Where
  // whose other branch is not 0: left as they are.
  const std::string bf = typed(base, "bf16");
  for (const std::string& text : {edit(bf, "  output %dx\n", "  output %dx\n  output %dy\n"),
                                  edit(bf, "Greater(%y, %z)", "Less(%y, %z)"),
                                  edit(edit(bf, "Where(%p, %dz, %z)", "Where(%p, %dz, %one)"), "  const %z : bf16[] = [0.0]\n",
                                       "  const %z : bf16[] = [0.0]\n  const %one : bf16[] = [1.0]\n")}) {
    auto g = load(text);
    EXPECT_FALSE(createFuseReluGradPass()->run(*g));
  }
}

TEST(FuseDropoutResidual, DropoutWritesTheResidualSumOnItsOwnStream) {
  const std::string base = R"(graph "d" opset 17 {
  input %x : TYPE[3,1001]
  input %r : f32[3,1001]
  const %ra : f32[] = [0.3]
  const %tr : bool[] = [1]
  %y : TYPE[3,1001], %m : bool[3,1001] = Dropout(%x, %ra, %tr)
  %w : f32[3,1001] = Cast(%y) {to = 1}
  %s : f32[3,1001] = Add(%r, %w)
  output %s
  output %m
}
)";
  ExecOptions eo;
  eo.seed = 0x5eed;
  eo.step = 7;
  for (const char* t : {"f16", "bf16"}) {
    SCOPED_TRACE(t);
    const std::string text = typed(base, t);
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createFuseDropoutResidualPass()->run(*g));
    verify(*g);
    ASSERT_EQ(g->numNodes(), 1u);
    const Node& n = *g->nodes().front();
    EXPECT_EQ(n.domain(), "cuda");
    EXPECT_EQ(n.op(), "Dropout");
    EXPECT_EQ(n.getString("stream", ""), "y");  // the unfused Dropout's stream
    EXPECT_EQ(n.input(3), g->lookup("r"));
    expectSameOnCpu(*ref, *g, 24, eo);
    eo.dropout = false;  // off: every element kept
    expectSameOnCpu(*ref, *g, 25, eo);
    eo.dropout = true;
  }
  // A Dropout without ratio and training_mode (inference: the identity) keeps them absent.
  {
    const std::string text = edit(typed(base, "bf16"), "Dropout(%x, %ra, %tr)", "Dropout(%x)");
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createFuseDropoutResidualPass()->run(*g));
    verify(*g);
    EXPECT_EQ(g->nodes().front()->input(1), nullptr);
    expectSameOnCpu(*ref, *g, 26, eo);
  }
  // f32 (no Cast), the residual made after the Dropout, or the narrow result read elsewhere too.
  const std::string bf = typed(base, "bf16");
  for (const std::string& text : {edit(edit(typed(base, "f32"), "  %w : f32[3,1001] = Cast(%y) {to = 1}\n", ""), "Add(%r, %w)", "Add(%r, %y)"),
                                  edit(edit(bf, "input %r : f32[3,1001]", "input %r0 : f32[3,1001]"), "  %w : f32[3,1001] = Cast(%y) {to = 1}\n",
                                       "  %r : f32[3,1001] = Neg(%r0)\n  %w : f32[3,1001] = Cast(%y) {to = 1}\n"),
                                  edit(bf, "  output %m\n", "  output %m\n  output %y\n")}) {
    auto g = load(text);
    EXPECT_FALSE(createFuseDropoutResidualPass()->run(*g)) << text;
  }
}

// keep-loss-stats: the loss keeps its rows' max and sum (result 1) for the gradients over the same
// scores, read directly or through a widening Cast of one source; the loss and the gradient are
// the unfused ones bit for bit, and the statistics are each row's max and sum of exp(x - max).
TEST(KeepLossStats, TheLossHandsItsRowStatisticsToItsGradient) {
  const std::string base = R"(graph "l" opset 17 {
  domain "ampc" 1
  input %x : bf16[12,37]
  input %l : i64[12]
  input %d : f32[]
  %xf : f32[12,37] = Cast(%x) {to = 1}
  %loss : f32[] = SoftmaxCrossEntropyLoss(%xf, %l) {ignore_index = 3}
  %xg : f32[12,37] = Cast(%x) {to = 1}
  %g : f32[12,37] = ampc::SoftmaxCrossEntropyLossGrad(%d, %xg, %l) {ignore_index = 3, reduction = "mean"}
  output %loss
  output %g
}
)";
  auto ref = load(base), g = load(base);
  ASSERT_TRUE(createKeepLossStatsPass()->run(*g));
  verify(*g);
  const Node* loss = g->lookup("loss")->producer();
  const Node* grad = g->lookup("g")->producer();
  EXPECT_EQ(loss->domain(), "cuda");
  EXPECT_EQ(grad->domain(), "cuda");
  ASSERT_EQ(loss->numResults(), 2u);
  EXPECT_EQ(loss->result(1)->type(), (TensorType{DType::f32, {12, 2}}));
  EXPECT_EQ(grad->input(3), loss->result(1));
  EXPECT_EQ(grad->numInputs(), 4u);  // no weights
  std::map<std::string, Tensor> in;
  Tensor x(TensorType{DType::bf16, {12, 37}});
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, 0.1 * static_cast<double>((i * 29) % 53) - 2.0);
  Tensor l(TensorType{DType::i64, {12}});
  for (int64_t i = 0; i < 12; ++i) l.setInt(i, (i * 7) % 37);
  Tensor d(TensorType{DType::f32, {}});
  d.setDouble(0, 1.0);
  in = {{"x", x}, {"l", l}, {"d", d}};
  auto cpu = createCpuBackend();
  const auto want = evaluate(*ref, in, *cpu);
  const auto got = evaluate(*g, in, *cpu, {}, {loss->result(1)});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].data == want[0].data);
  EXPECT_TRUE(got[1].data == want[1].data);
  for (int64_t r = 0; r < 12; ++r) {
    double m = -1e30, s = 0;
    for (int64_t k = 0; k < 37; ++k) m = std::max(m, x.getDouble(r * 37 + k));
    for (int64_t k = 0; k < 37; ++k) s += std::exp(x.getDouble(r * 37 + k) - m);
    EXPECT_EQ(got[2].getDouble(2 * r), static_cast<float>(m)) << r;
    EXPECT_NEAR(got[2].getDouble(2 * r + 1), s, 1e-5 * s) << r;
  }
  // No gradient over these scores, or log-probs asked for: the loss stays ONNX's.
  for (const std::string& text : {edit(base, "ampc::SoftmaxCrossEntropyLossGrad(%d, %xg, %l)", "ampc::SoftmaxCrossEntropyLossGrad(%d, %xg2, %l)"),
                                  edit(base, "%loss : f32[] = SoftmaxCrossEntropyLoss(%xf, %l)", "%loss : f32[], %lp : f32[12,37] = SoftmaxCrossEntropyLoss(%xf, %l)")}) {
    std::string t = text;
    if (t.find("%xg2") != std::string::npos) t = edit(t, "  %xg : f32[12,37] = Cast(%x) {to = 1}\n", "  %xg2 : f32[12,37] = Neg(%xf)\n");
    auto h = load(t);
    EXPECT_FALSE(createKeepLossStatsPass()->run(*h)) << t;
  }
}

// attention-in-place: GPT-2's attention block as the exporters write it, the QKV projection Split
// and Reshaped into heads, Transposed for attention, O Transposed back, and in the backward dO
// Transposed in and the three gradients Transposed, Reshaped and Concatenated into the QKV
// projection's gradient. With dropout on its Philox stream.
const std::string kAttnBlock = R"(graph "attn" opset 18 {
  domain "ampc" 1
  input %x : bf16[2,16,48]
  input %dot : bf16[2,16,2,8]
  const %sp : i64[3] = [16, 16, 16]
  const %heads : i64[4] = [2, 16, 2, 8]
  const %rows : i64[3] = [2, 16, 16]
  %q0 : bf16[2,16,16], %k0 : bf16[2,16,16], %v0 : bf16[2,16,16] = Split(%x, %sp) {axis = 2}
  %q1 : bf16[2,16,2,8] = Reshape(%q0, %heads)
  %k1 : bf16[2,16,2,8] = Reshape(%k0, %heads)
  %v1 : bf16[2,16,2,8] = Reshape(%v0, %heads)
  %q : bf16[2,2,16,8] = Transpose(%q1) {perm = [0, 2, 1, 3]}
  %kt : bf16[2,2,8,16] = Transpose(%k1) {perm = [0, 2, 3, 1]}
  %v : bf16[2,2,16,8] = Transpose(%v1) {perm = [0, 2, 1, 3]}
  %o : bf16[2,2,16,8], %lse : f32[2,2,16] = ampc::Attention(%q, %kt, %v) {scale = 0.35, dropout_ratio = 0.25, dropout_key = 5} @attn
  %ot : bf16[2,16,2,8] = Transpose(%o) {perm = [0, 2, 1, 3]}
  %do : bf16[2,2,16,8] = Transpose(%dot) {perm = [0, 2, 1, 3]}
  %dq : bf16[2,2,16,8], %dkt : bf16[2,2,8,16], %dv : bf16[2,2,16,8] = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse) {scale = 0.35, dropout_ratio = 0.25, dropout_key = 5} @attn_grad
  %dq1 : bf16[2,16,2,8] = Transpose(%dq) {perm = [0, 2, 1, 3]}
  %dk1 : bf16[2,16,2,8] = Transpose(%dkt) {perm = [0, 3, 1, 2]}
  %dv1 : bf16[2,16,2,8] = Transpose(%dv) {perm = [0, 2, 1, 3]}
  %dq0 : bf16[2,16,16] = Reshape(%dq1, %rows)
  %dk0 : bf16[2,16,16] = Reshape(%dk1, %rows)
  %dv0 : bf16[2,16,16] = Reshape(%dv1, %rows)
  %dx : bf16[2,16,48] = Concat(%dq0, %dk0, %dv0) {axis = 2}
  output %ot
  output %dx
}
)";

// The whole block becomes two target nodes: attention reads Q, K and V from the projection's
// bytes (K as rows), writes O token-major as the Transpose's value and reads it back there, and the
// gradient writes dQ, dK and dV into the Concat's rows. On the CPU the outputs are the unfused
// graph's bit for bit, with dropout on and off.
TEST(AttentionInPlace, TheHeadViewsAroundAttentionGo) {
  auto ref = load(kAttnBlock), g = load(kAttnBlock);
  ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
  verify(*g);
  ASSERT_EQ(g->numNodes(), 2u) << printGraph(*g);
  EXPECT_EQ(g->consts().size(), 0u) << "the Split's and Reshapes' constants are left behind";
  const Node* a = g->lookup("ot")->producer();
  const Node* b = g->lookup("dx")->producer();
  EXPECT_EQ(a->domain(), "cuda");
  EXPECT_EQ(a->op(), "Attention");
  EXPECT_EQ(b->op(), "AttentionGrad");
  EXPECT_EQ(a->getInts("dims"), (std::vector<int64_t>{2, 2, 16, 16, 8, 8}));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a->input(i), g->lookup("x")) << i;
  // Q at column 0, K at 16 (rows j), V at 32: heads 2, 8 apart, rows 48 apart, a batch 16 rows.
  EXPECT_EQ(a->getInts("q_layout"), (std::vector<int64_t>{0, 2, 16 * 48, 8, 48, 1, 0}));
  EXPECT_EQ(a->getInts("k_layout"), (std::vector<int64_t>{16, 2, 16 * 48, 8, 48, 1, 1}));
  EXPECT_EQ(a->getInts("v_layout"), (std::vector<int64_t>{32, 2, 16 * 48, 8, 48, 1, 0}));
  EXPECT_EQ(a->getInts("o_layout"), (std::vector<int64_t>{0, 2, 16 * 16, 8, 16, 1, 0}));
  EXPECT_EQ(b->input(0), g->lookup("dot"));
  EXPECT_EQ(b->input(4), g->lookup("ot"));
  EXPECT_EQ(b->input(5), a->result(1));
  EXPECT_EQ(b->getInt("packed_grads", 0), 1);
  ASSERT_EQ(b->numResults(), 1u);
  EXPECT_EQ(b->getInts("dk_layout"), (std::vector<int64_t>{16, 2, 16 * 48, 8, 48, 1, 1}));
  EXPECT_EQ(a->name(), "attn");
  ExecOptions eo;
  eo.seed = 0x5eed;
  eo.step = 3;
  expectSameOnCpu(*ref, *g, 31, eo);
  eo.dropout = false;
  expectSameOnCpu(*ref, *g, 32, eo);
}

// Near misses keep their views, each one alone: the QKV gradient Concatenated with a fourth piece
// (the Transposes are still written in place, unpacked), K's head Transpose read by another node (K
// read as made; Q and V still in place), O read by a node other than its Transpose (O written as
// the logical tensor), head dims not multiples of 8 (no rewrite), and the CPU target (no rewrite).
TEST(AttentionInPlace, NearMissesKeepTheirViews) {
  {
    const std::string text = edit(edit(edit(kAttnBlock, "input %dot : bf16[2,16,2,8]", "input %dot : bf16[2,16,2,8]\n  input %e : bf16[2,16,8]"),
                                       "Concat(%dq0, %dk0, %dv0)", "Concat(%dq0, %dk0, %dv0, %e)"),
                                  "%dx : bf16[2,16,48]", "%dx : bf16[2,16,56]");
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
    verify(*g);
    const Node* b = g->lookup("dx")->producer()->input(0)->producer()->input(0)->producer();
    EXPECT_EQ(b->op(), "AttentionGrad");
    EXPECT_EQ(b->numResults(), 3u);
    EXPECT_EQ(b->getInt("packed_grads", 0), 0);
    EXPECT_TRUE(b->hasAttr("dq_layout") && b->hasAttr("dk_layout") && b->hasAttr("dv_layout"));
    expectSameOnCpu(*ref, *g, 33);
  }
  {
    const std::string text = edit(kAttnBlock, "  output %dx\n", "  output %dx\n  output %kt\n");
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
    verify(*g);
    const Node* a = g->lookup("ot")->producer();
    EXPECT_EQ(a->input(1), g->lookup("kt"));
    EXPECT_FALSE(a->hasAttr("k_layout"));
    // The Split stays (K's Reshape still reads it), so Q and V are read from their Reshapes' values.
    EXPECT_TRUE(a->hasAttr("q_layout") && a->hasAttr("v_layout"));
    expectSameOnCpu(*ref, *g, 34);
  }
  {
    const std::string text = edit(kAttnBlock, "  output %dx\n", "  output %dx\n  output %o\n");
    auto ref = load(text), g = load(text);
    ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
    verify(*g);
    const Node* a = g->lookup("o")->producer();
    EXPECT_EQ(a->domain(), "cuda");
    EXPECT_FALSE(a->hasAttr("o_layout"));
    EXPECT_EQ(g->lookup("ot")->producer()->op(), "Transpose");
    expectSameOnCpu(*ref, *g, 35);
  }
  {
    auto g = load(kAttnBlock);
    EXPECT_FALSE(createAttentionInPlacePass(findTarget("cpu"))->run(*g));
  }
}

// Grouped-query attention (Hugging Face's repeat_kv: Unsqueeze, Expand, Reshape; K transposed
// after): K and V are read from the stored heads, head h at stored head h / 2, and the copies go. A
// second reader of the repeated K keeps K's copies; V is still read in place.
TEST(AttentionInPlace, GroupedKeysAndValuesReadFromTheStoredHeads) {
  const std::string base = R"(graph "gqa" opset 18 {
  domain "ampc" 1
  input %q : bf16[2,4,16,8]
  input %k : bf16[2,2,16,8]
  input %w : bf16[2,2,16,8]
  const %ax : i64[1] = [2]
  const %s5 : i64[5] = [2, 2, 2, 16, 8]
  const %s4 : i64[4] = [2, 4, 16, 8]
  %ku : bf16[2,2,1,16,8] = Unsqueeze(%k, %ax)
  %ke : bf16[2,2,2,16,8] = Expand(%ku, %s5)
  %kr : bf16[2,4,16,8] = Reshape(%ke, %s4)
  %kt : bf16[2,4,8,16] = Transpose(%kr) {perm = [0, 1, 3, 2]}
  %wu : bf16[2,2,1,16,8] = Unsqueeze(%w, %ax)
  %we : bf16[2,2,2,16,8] = Expand(%wu, %s5)
  %wr : bf16[2,4,16,8] = Reshape(%we, %s4)
  %o : bf16[2,4,16,8], %lse : f32[2,4,16] = ampc::Attention(%q, %kt, %wr) {scale = 0.35}
  output %o
}
)";
  {
    auto ref = load(base), g = load(base);
    ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
    verify(*g);
    ASSERT_EQ(g->numNodes(), 1u) << printGraph(*g);
    const Node* a = g->lookup("o")->producer();
    EXPECT_EQ(a->input(0), g->lookup("q"));
    EXPECT_FALSE(a->hasAttr("q_layout"));
    EXPECT_EQ(a->input(1), g->lookup("k"));
    EXPECT_EQ(a->input(2), g->lookup("w"));
    EXPECT_EQ(a->getInts("k_layout"), (std::vector<int64_t>{0, 4, 2 * 16 * 8, 16 * 8, 8, 2, 1}));
    EXPECT_EQ(a->getInts("v_layout"), (std::vector<int64_t>{0, 4, 2 * 16 * 8, 16 * 8, 8, 2, 0}));
    expectSameOnCpu(*ref, *g, 36);
  }
  const std::string text = edit(base, "  output %o\n", "  output %o\n  output %kr\n");
  auto ref = load(text), g = load(text);
  ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
  verify(*g);
  const Node* a = g->lookup("o")->producer();
  // The repeat is an output, so it stays; K is read from it as rows, past the Transpose.
  EXPECT_EQ(a->input(1), g->lookup("kr"));
  EXPECT_EQ(a->getInts("k_layout"), (std::vector<int64_t>{0, 4, 4 * 16 * 8, 16 * 8, 8, 1, 1}));
  EXPECT_EQ(g->lookup("kt"), nullptr);
  EXPECT_EQ(a->input(2), g->lookup("w"));
  expectSameOnCpu(*ref, *g, 37);
}

// K of its own heads (Llama without repeats): KT = Transpose(k, (0, 1, 3, 2)) of k [B, H, T, D] is read
// from k as rows, and dKT's Transpose back to [B, H, T, D] is written as rows; no Transpose stays,
// and the plan computes what the graph did (the CPU gathers and scatters through the layouts).
TEST(AttentionInPlace, KeysOfTheirOwnHeadsReadAndWrittenAsRows) {
  const std::string text = R"(graph "mha" opset 18 {
  domain "ampc" 1
  input %q : bf16[2,4,16,8]
  input %k : bf16[2,4,16,8]
  input %v : bf16[2,4,16,8]
  input %do : bf16[2,4,16,8]
  %kt : bf16[2,4,8,16] = Transpose(%k) {perm = [0, 1, 3, 2]}
  %o : bf16[2,4,16,8], %lse : f32[2,4,16] = ampc::Attention(%q, %kt, %v) {scale = 0.35}
  %dq : bf16[2,4,16,8], %dkt : bf16[2,4,8,16], %dv : bf16[2,4,16,8] = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse) {scale = 0.35}
  %dk : bf16[2,4,16,8] = Transpose(%dkt) {perm = [0, 1, 3, 2]}
  output %o
  output %dq
  output %dk
  output %dv
}
)";
  auto ref = load(text), g = load(text);
  ASSERT_TRUE(createAttentionInPlacePass(findTarget("cuda"))->run(*g));
  verify(*g);
  ASSERT_EQ(g->numNodes(), 2u) << printGraph(*g);
  const Node* a = g->lookup("o")->producer();
  EXPECT_EQ(a->input(1), g->lookup("k"));
  EXPECT_EQ(a->getInts("k_layout"), (std::vector<int64_t>{0, 4, 4 * 16 * 8, 16 * 8, 8, 1, 1}));
  const Node* b = g->lookup("dk")->producer();
  EXPECT_EQ(b->op(), "AttentionGrad");
  EXPECT_EQ(b->getInts("dk_layout"), (std::vector<int64_t>{0, 4, 4 * 16 * 8, 16 * 8, 8, 1, 1}));
  EXPECT_EQ(g->lookup("dk")->type().shape, (std::vector<int64_t>{2, 4, 16, 8}));
  expectSameOnCpu(*ref, *g, 38);
}

// The target nodes check their layouts against the values they address: a layout reaching past
// its operand, or heads that are not H, is refused naming the node.
TEST(AttentionInPlace, TargetAttentionChecksItsLayouts) {
  const std::string base = R"(graph "t" opset 18 {
  domain "cuda" 1
  input %x : bf16[2,16,48]
  %o : bf16[2,2,16,8], %lse : f32[2,2,16] = cuda::Attention(%x, %x, %x) {dims = [2, 2, 16, 16, 8, 8], q_layout = [0, 2, 768, 8, 48, 1, 0], k_layout = [16, 2, 768, 8, 48, 1, 1], v_layout = [32, 2, 768, 8, 48, 1, 0]} @a
  output %o
}
)";
  EXPECT_NO_THROW(load(base));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"v_layout = [32,", "v_layout = [33,"},
                                                                                  {"q_layout = [0, 2,", "q_layout = [0, 3,"},
                                                                                  {"dims = [2, 2, 16, 16, 8, 8]", "dims = [2, 2, 17, 16, 8, 8]"},
                                                                                  {"k_layout = [16, 2, 768, 8, 48, 1, 1]", "k_layout = [16, 2, 768, 8, 48, 1]"}}) {
    try {
      load(edit(base, from, to));
      ADD_FAILURE() << "accepted " << to;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("node 'a' (cuda.Attention)"), std::string::npos) << e.what();
    }
  }
}

// pitch-loss-scores: the loss's scores and their gradient, [1040, 1001] bf16 (rows of 2002 bytes),
// between three products large enough for the padded path. The gradient node records both pitches
// (1008), and the scores, the gradient and the gradient's view are stored with it, the f32 sides of
// the casts not at all; as a graph output, or read by anything else, a value keeps its own layout;
// and the CPU target never pitches.
namespace {
std::map<const Value*, int64_t> pitched(Graph& g, bool keepStats = false) {
  g.bindOps();
  verify(g);
  if (keepStats) EXPECT_TRUE(createKeepLossStatsPass()->run(g));
  createPitchLossScoresPass(findTarget("cuda"))->run(g);
  verify(g);
  return pitchedValues(g);
}
}  // namespace

TEST(PitchLossScores, ScoresAndGradientBetweenPaddedProducts) {
  for (const bool stats : {false, true}) {
    SCOPED_TRACE(stats ? "after keep-loss-stats" : "ampc's loss gradient");
    auto g = parseGraph(test::pitchedLossGraph(), "pitched");
    const auto pitch = pitched(*g, stats);
    EXPECT_EQ(pitch.size(), 3u);
    for (const char* v : {"z", "gb", "gr"}) EXPECT_EQ(pitch.count(g->lookup(v)) ? pitch.at(g->lookup(v)) : 0, 1008) << v;
    const Node* grad = g->lookup("g")->producer();
    EXPECT_EQ(grad->getInt("scores_pitch", 0), 1008);
    EXPECT_EQ(grad->getInt("grad_pitch", 0), 1008);
    auto cpuTarget = parseGraph(test::pitchedLossGraph(), "pitched");
    EXPECT_FALSE(createPitchLossScoresPass(findTarget("cpu"))->run(*cpuTarget));
  }
  // The logits as an output, and the gradient read by an elementwise op: neither is pitched.
  auto g2 = parseGraph(test::pitchedLossGraph("  output %z\n  %n : bf16[1040,1001] = Neg(%gb)\n  output %n\n"), "kept");
  EXPECT_TRUE(pitched(*g2).empty());
  EXPECT_FALSE(g2->lookup("g")->producer()->hasAttr("scores_pitch"));
  // Too small for the padded GEMM path (a hidden width of 64: the rows then stay dense), or rows
  // not a multiple of 8 (1036).
  auto replaced = [](std::string t, const std::vector<std::pair<std::string, std::string>>& subs) {
    for (const auto& [from, to] : subs)
      for (size_t at = t.find(from); at != std::string::npos; at = t.find(from, at + to.size())) t.replace(at, from.size(), to);
    return t;
  };
  const std::string small = replaced(test::pitchedLossGraph(), {{"h : bf16[1040,1040]", "h : bf16[1040,64]"},
                                                                {"w : bf16[1040,1001]", "w : bf16[64,1001]"},
                                                                {"wt : bf16[1001,1040]", "wt : bf16[1001,64]"},
                                                                {"dh : bf16[8,130,1040]", "dh : bf16[8,130,64]"},
                                                                {"dw : bf16[1040,1001]", "dw : bf16[64,1001]"}});
  const std::string odd = replaced(test::pitchedLossGraph(), {{"[8, 130, 1001]", "[4, 259, 1001]"}, {"[8,130,", "[4,259,"}, {"1040", "1036"}});
  for (const std::string& text : {small, odd}) {
    auto g = parseGraph(text, "kept");
    EXPECT_TRUE(pitched(*g).empty()) << text;
  }
}

// fold-casts (passes/fold_casts.cpp): the casts a neighbour's kernel does are decided once and
// recorded on the Cast (the golden fold_casts.ir shows the three forms and their near misses).
// A target without such kernels folds none; the pass is idempotent; a reader added afterwards that
// cannot widen makes the recorded fold stale, which checkCastFolds refuses, naming the Cast, until
// fold-casts runs again and clears it; an unknown fold value is refused.
TEST(FoldCasts, RecordedOnceCheckedAndDecidedAgainAfterARewrite) {
  const std::string text = R"(graph "c" opset 17 {
  input %x : bf16[8,64]
  input %y : f32[8,64]
  input %w : f32[64,64]
  %xf : f32[8,64] = Cast(%x) {to = 1}
  %a : f32[8,64] = Add(%xf, %y)
  %ab : bf16[8,64] = Cast(%a) {to = 16}
  output %ab
})";
  auto cpu = load(text);
  EXPECT_FALSE(createFoldCastsPass(findTarget("cpu"))->run(*cpu));
  auto g = load(text);
  const Target& cuda = findTarget("cuda");
  ASSERT_TRUE(createFoldCastsPass(cuda)->run(*g));
  Node* xf = g->lookup("xf")->producer();
  EXPECT_EQ(castFold(*xf), CastFold::Readers);
  EXPECT_EQ(castFold(*g->lookup("ab")->producer()), CastFold::Producer);
  const std::string once = printGraph(*g);
  createFoldCastsPass(cuda)->run(*g);
  EXPECT_EQ(printGraph(*g), once);
  EXPECT_NO_THROW(checkCastFolds(*g, cuda));
  // A MatMul now reads the f32 value too: it has no bytes while the fold stands.
  Value* p = g->createNode("MatMul", "", {g->lookup("xf"), g->lookup("w")}, {{"p", TensorType{DType::f32, {8, 64}}}})->result(0);
  g->addOutput(p);
  g->bindOps();
  try {
    checkCastFolds(*g, cuda);
    ADD_FAILURE() << "a stale fold passed the check";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("xf"), std::string::npos) << e.what();
  }
  createFoldCastsPass(cuda)->run(*g);
  EXPECT_EQ(castFold(*xf), CastFold::None);
  EXPECT_NO_THROW(checkCastFolds(*g, cuda));
  xf->setAttr("fold", std::string("sideways"));
  EXPECT_THROW(castFold(*xf), Error);
}

// fold-comparisons (passes/fold_comparisons.cpp): recorded on the comparison, refused by the check
// once another node reads the bool tensor, cleared when the pass runs again.
TEST(FoldComparisons, RecordedCheckedAndDecidedAgain) {
  auto g = load(R"(graph "c" opset 17 {
  input %x : f16[8,32]
  input %y : f16[8,32]
  const %z : f16[] = [0.0]
  %g : bool[8,32] = Greater(%x, %z)
  %r : f16[8,32] = Where(%g, %y, %z)
  output %r
})");
  ASSERT_TRUE(createFoldComparisonsPass()->run(*g));
  Node* cmp = g->lookup("g")->producer();
  EXPECT_EQ(cmp->getString("fold", ""), "where");
  EXPECT_NO_THROW(checkComparisonFolds(*g));
  g->addOutput(g->createNode("Not", "", {g->lookup("g")}, {{"n", TensorType{DType::boolean, {8, 32}}}})->result(0));
  g->bindOps();
  EXPECT_THROW(checkComparisonFolds(*g), Error);
  createFoldComparisonsPass()->run(*g);
  EXPECT_FALSE(cmp->hasAttr("fold"));
  EXPECT_NO_THROW(checkComparisonFolds(*g));
}

// group-optimizers (passes/group_optimizers.cpp): consecutive optimizer nodes sharing op, attributes
// and lr/found are one recorded group; a member changed afterwards is refused by the check.
TEST(GroupOptimizers, RecordedAndChecked) {
  auto g = load(R"(graph "o" opset 17 {
  domain "ampc" 1
  input %g1 : f32[64]
  input %g2 : f32[32]
  param %w1 : f32[64]
  param %w2 : f32[32]
  param %lr : f32[]
  param %found : bool[]
  %u1 : f32[64] = ampc::SGD(%w1, %g1, _, %lr, %found) {momentum = 0.0, nesterov = 0, weight_decay = 0.0}
  %u2 : f32[32] = ampc::SGD(%w2, %g2, _, %lr, %found) {momentum = 0.0, nesterov = 0, weight_decay = 0.0}
  output %u1
  output %u2
})");
  EXPECT_TRUE(recordedOptimizerGroups(*g) == std::vector<size_t>({0, 1}));  // nothing recorded: each alone
  ASSERT_TRUE(createGroupOptimizersPass()->run(*g));
  EXPECT_TRUE(recordedOptimizerGroups(*g) == std::vector<size_t>({0, 0}));
  EXPECT_NO_THROW(checkOptimizerGroups(*g));
  g->lookup("u2")->producer()->setAttr("weight_decay", 0.01f);
  EXPECT_THROW(checkOptimizerGroups(*g), Error);
  createGroupOptimizersPass()->run(*g);
  EXPECT_TRUE(recordedOptimizerGroups(*g) == std::vector<size_t>({0, 1}));
}
