// fuse-elementwise (passes/fuse_elementwise.cpp), the CPU backend's ampc.Fused kernel and the NVPTX
// code generator (compiler/codegen/nvptx.h), on the groups of tests/common/fused_cases.h.
#include <gtest/gtest.h>

#include <mutex>
#include <random>

#include "compiler/codegen/nvptx.h"
#include "compiler/ir/text.h"
#include "compiler/ops/pointwise.h"
#include "passes/pass.h"
#include "runtime/backend.h"
#include "runtime/evaluator.h"
#include "runtime/plan.h"
#include "tests/common/fused_cases.h"

using namespace ampc;

namespace {

std::unique_ptr<Graph> load(const std::string& text) {
  auto g = parseGraph(text);
  g->bindOps();
  verify(*g);
  return g;
}

int countOp(const Graph& g, const std::string& op) {
  int k = 0;
  for (const auto& n : g.nodes()) k += n->op() == op;
  return k;
}

std::map<std::string, Tensor> randomInputs(const Graph& g, bool positive, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.5);
  std::map<std::string, Tensor> in;
  for (const Value* v : g.inputs()) {
    Tensor t(v->type());
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double x = normal(rng);
      t.setDouble(i, v->type().dtype == DType::boolean ? (x > 0) : positive ? std::fabs(x) + 0.05 : x);
    }
    in.emplace(v->name(), std::move(t));
  }
  return in;
}

}  // namespace

// The fused graph computes exactly what its ops did: the CPU runs a group's body with its own kernels.
TEST(FuseElementwise, FusedGraphEqualsItsOpsBitwiseOnTheCpu) {
  auto cpu = createCpuBackend();
  int groups = 0;
  for (const auto& c : fusedcases::cases())
    for (const char* t : {"f32", "f16", "bf16"}) {
      SCOPED_TRACE(c.name + " " + t);
      const std::string text = fusedcases::instantiate(c.text, t);
      auto ref = load(text), fused = load(text);
      ASSERT_TRUE(createFuseElementwisePass()->run(*fused));
      verify(*fused);
      const int n = countOp(*fused, "Fused");
      EXPECT_GE(n, 1);
      EXPECT_LT(fused->numNodes(), ref->numNodes());
      groups += n;
      const auto inputs = randomInputs(*ref, c.positiveInputs, 7);
      const auto want = evaluate(*ref, inputs, *cpu), got = evaluate(*fused, inputs, *cpu);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got[i].type, want[i].type);
        EXPECT_TRUE(got[i].data == want[i].data) << "output " << i << " differs";
      }
      // expandFused is the inverse: the same ops again.
      expandFused(*fused, /*onlyWithoutKernel=*/false);
      verify(*fused);
      EXPECT_EQ(countOp(*fused, "Fused"), 0);
      EXPECT_EQ(fused->numNodes(), ref->numNodes());
      const auto again = evaluate(*fused, inputs, *cpu);
      for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(again[i].data == want[i].data);
    }
  EXPECT_GE(groups, 21);
}

// b reads a through a MatMul: a group {a, b} would be a cycle (a -> MatMul -> b), so b starts its own.
TEST(FuseElementwise, NoGroupThroughAnOutsideNode) {
  auto g = load(fusedcases::instantiate(
      "input %x : f32[8,8]\ninput %y : f32[8,8]\ninput %w : f32[8,8]\n%a : f32[8,8] = Add(%x, %y)\n%e : f32[8,8] = Exp(%a)\n"
      "%m : f32[8,8] = MatMul(%e, %w)\n%b : f32[8,8] = Mul(%a, %m)\n%c : f32[8,8] = Relu(%b)\noutput %c",
      "f32"));
  ASSERT_TRUE(createFuseElementwisePass()->run(*g));
  verify(*g);
  EXPECT_EQ(countOp(*g, "Fused"), 2);  // {a, e} and {b, c}
  EXPECT_EQ(countOp(*g, "MatMul"), 1);
  std::vector<std::string> order;
  for (const auto& n : g->nodes()) order.push_back(n->op());
  EXPECT_EQ(order, (std::vector<std::string>{"Fused", "MatMul", "Fused"}));
}

// Two groups that meet at a node become one: a ReLU gradient of a summed gradient,
// Where(Greater(y, 0), Add(a, b), 0), whose Add and Greater start groups of their own, is one
// kernel. Not where an outside node lies between them (the sum -> MatMul -> Exp path below).
TEST(FuseElementwise, GroupsMeetingAtANodeMerge) {
  const std::string text = fusedcases::instantiate(
      "input %a : f16[6,40]\ninput %b : f16[6,40]\ninput %y : f16[6,40]\nconst %z : f16[] = [0.0]\n"
      "%s : f16[6,40] = Add(%a, %b)\n%p : bool[6,40] = Greater(%y, %z)\n%d : f16[6,40] = Where(%p, %s, %z)\noutput %d",
      "f16");
  auto ref = load(text), g = load(text);
  ASSERT_TRUE(createFuseElementwisePass()->run(*g));
  verify(*g);
  ASSERT_EQ(g->numNodes(), 1u);
  EXPECT_EQ(countOp(*g, "Fused"), 1);
  auto cpu = createCpuBackend();
  const auto inputs = randomInputs(*ref, false, 3);
  EXPECT_TRUE(evaluate(*g, inputs, *cpu)[0].data == evaluate(*ref, inputs, *cpu)[0].data);
  auto apart = load(fusedcases::instantiate(
      "input %x : f32[8,8]\ninput %y : f32[8,8]\ninput %w : f32[8,8]\n%s : f32[8,8] = Add(%x, %y)\n%m : f32[8,8] = MatMul(%s, %w)\n"
      "%e : f32[8,8] = Exp(%m)\n%c : f32[8,8] = Mul(%e, %s)\noutput %c",
      "f32"));
  ASSERT_TRUE(createFuseElementwisePass()->run(*apart));
  verify(*apart);
  EXPECT_EQ(countOp(*apart, "Fused"), 1);  // {e, c}; the Add stays alone
  EXPECT_EQ(countOp(*apart, "Add"), 1);
}

// A widening Cast also read outside the group, by readers that read through it, stays for them and
// is recomputed inside: the group reads the bf16 source, and no f32 copy is written for it. (The
// test says a MatMul reads through casts; the CUDA target's Target::readsWidened decides in plans.)
// Where a reader does not read through it, the group writes the f32 result as any other.
TEST(FuseElementwise, WideningCastReadOutsideIsRecomputed) {
  auto g = load(fusedcases::instantiate(
      "input %x : bf16[8,8]\ninput %w : f32[8,8]\n%xf : f32[8,8] = Cast(%x) {to = 1}\n%e : f32[8,8] = Exp(%xf)\n"
      "%y : f32[8,8] = Mul(%e, %xf)\n%m : f32[8,8] = MatMul(%xf, %w)\noutput %y\noutput %m",
      "f32"));
  auto ref = load(printGraph(*g));
  auto plain = load(printGraph(*g));
  const auto matmulReadsThrough = [](const Node& user, size_t) { return user.op() == "MatMul"; };
  ASSERT_TRUE(createFuseElementwisePass()->run(*plain));  // no reader reads through: the f32 is written
  EXPECT_EQ(countOp(*plain, "Cast"), 0);
  ASSERT_TRUE(createFuseElementwisePass({}, matmulReadsThrough)->run(*g));
  verify(*g);
  EXPECT_EQ(countOp(*g, "Cast"), 1);
  EXPECT_EQ(countOp(*g, "Fused"), 1);
  for (const auto& n : g->nodes())
    if (n->op() == "Fused") {
      ASSERT_EQ(n->numInputs(), 1u);
      EXPECT_EQ(n->input(0)->name(), "x");
      EXPECT_EQ(n->numResults(), 1u);
    }
  // The same with the Cast's operand made inside the group: the group writes it (bf16) for the Cast.
  auto h = load(fusedcases::instantiate(
      "input %x : bf16[8,8]\ninput %w : f32[8,8]\n%s : bf16[8,8] = Sigmoid(%x)\n%xf : f32[8,8] = Cast(%s) {to = 1}\n"
      "%e : f32[8,8] = Exp(%xf)\n%m : f32[8,8] = MatMul(%xf, %w)\n%y : f32[8,8] = Mul(%e, %xf)\noutput %y\noutput %m",
      "f32"));
  auto href = load(printGraph(*h));
  ASSERT_TRUE(createFuseElementwisePass({}, matmulReadsThrough)->run(*h));
  verify(*h);
  EXPECT_EQ(countOp(*h, "Cast"), 1);
  for (const auto& n : h->nodes())
    if (n->op() == "Cast") EXPECT_EQ(n->input(0)->type().dtype, DType::bf16);
  auto cpu = createCpuBackend();
  {
    const auto in = randomInputs(*href, false, 4);
    const auto want = evaluate(*href, in, *cpu), got = evaluate(*h, in, *cpu);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].data == want[i].data);
  }
  const auto in = randomInputs(*ref, false, 3);
  const auto want = evaluate(*ref, in, *cpu), got = evaluate(*g, in, *cpu);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].data == want[i].data);
}

// A node excluded by the caller (a backend's fold) stays out of every group; one alone is not fused.
TEST(FuseElementwise, ExcludedNodesAndSingletonsStay) {
  const std::string text = fusedcases::instantiate(
      "input %x : f32[8,8]\ninput %y : f32[8,8]\n%a : f32[8,8] = Add(%x, %y)\n%r : f32[8,8] = Relu(%a)\n%n : f32[8,8] = Neg(%r)\noutput %n",
      "f32");
  auto g = load(text);
  EXPECT_FALSE(createFuseElementwisePass([](const Node& n) { return n.op() == "Relu"; })->run(*g));
  verify(*g);
  EXPECT_EQ(countOp(*g, "Relu"), 1);
  EXPECT_EQ(countOp(*g, "Fused"), 0);  // {a} and {n} are alone: nothing fused
  EXPECT_EQ(countOp(*g, "Add"), 1);
  auto h = load(text);
  EXPECT_TRUE(createFuseElementwisePass([](const Node& n) { return n.op() == "Neg"; })->run(*h));
  EXPECT_EQ(countOp(*h, "Fused"), 1);
  EXPECT_EQ(countOp(*h, "Neg"), 1);
}

// A body that is not pointwise, or that does not match the node's operands, is an error naming
// the node.
TEST(FuseElementwise, BadBodiesAreErrorsNamingTheNode) {
  auto bad = [](const std::string& body, const std::string& operand) {
    const std::string text = "graph \"g\" opset 17 {\n  domain \"ampc\" 1\n  input %x : " + operand +
                             "\n  %y : f32[4,4] = ampc::Fused(%x) {body = \"" + body + "\"} @fz\n  output %y\n}\n";
    auto g = parseGraph(text);
    g->bindOps();
    try {
      verify(*g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string matmul =
      "graph \\\"b\\\" opset 17 {\\n input %in0 : f32[4,4]\\n %y : f32[4,4] = MatMul(%in0, %in0)\\n output %y\\n}\\n";
  EXPECT_NE(bad(matmul, "f32[4,4]").find("node 'fz' (ampc.Fused)"), std::string::npos);
  EXPECT_NE(bad(matmul, "f32[4,4]").find("no pointwise formula"), std::string::npos);
  const std::string relu = "graph \\\"b\\\" opset 17 {\\n input %in0 : f32[4,4]\\n %y : f32[4,4] = Relu(%in0)\\n output %y\\n}\\n";
  EXPECT_EQ(bad(relu, "f32[4,4]"), "no error");
  EXPECT_NE(bad(relu, "f16[4,4]").find("operand 0 must be f32[4,4]"), std::string::npos);
  EXPECT_NE(bad("graph {", "f32[4,4]").find("bad body"), std::string::npos);
  const std::string passThrough = "graph \\\"b\\\" opset 17 {\\n input %in0 : f32[4,4]\\n output %in0\\n}\\n";
  EXPECT_NE(bad(passThrough, "f32[4,4]").find("must be a node's result"), std::string::npos);
}

// Every group gets a kernel: PTX for sm_90 with its entry, global loads and stores, and libdevice's
// functions inlined (no calls left); without libdevice (no CUDA toolkit) a group that needs it is
// refused naming the node, and the others still compile.
TEST(Codegen, EveryGroupGetsItsKernel) {
  if (!codegen::available()) GTEST_SKIP() << "built without LLVM (llvm-19-dev)";
  const bool libdevice = !codegen::libdevicePath().empty();
  int kernels = 0, refused = 0, vectorKernels = 0;
  for (const auto& c : fusedcases::cases())
    for (const char* t : {"f32", "bf16"}) {
      SCOPED_TRACE(c.name + " " + t);
      auto g = load(fusedcases::instantiate(c.text, t));
      ASSERT_TRUE(createFuseElementwisePass()->run(*g));
      int k = 0;
      for (const auto& n : g->nodes()) {
        if (n->op() != "Fused") continue;
        const std::string name = "k" + std::to_string(k++);
        if (c.needsLibdevice && !libdevice) {
          try {
            codegen::fusedKernel(*n, name);
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(n->describe()), std::string::npos) << e.what();
            ++refused;
          }
          continue;
        }
        const codegen::Kernel kern = codegen::fusedKernel(*n, name);
        EXPECT_NE(kern.ptx.find(".entry " + name), std::string::npos);
        EXPECT_NE(kern.ptx.find(".target sm_90"), std::string::npos);
        EXPECT_NE(kern.ptx.find("ld.global"), std::string::npos);
        EXPECT_NE(kern.ptx.find("st.global"), std::string::npos);
        EXPECT_EQ(kern.ptx.find("call."), std::string::npos) << "a function call is left in the kernel";
        EXPECT_EQ(kern.elements, n->result(0)->type().numel());
        if (kern.vector > 1) {  // the vector entry: whole 16-byte (or narrower) accesses
          EXPECT_EQ(kern.elements % kern.vector, 0);
          EXPECT_NE(kern.ptx.find(".entry " + kern.vectorName), std::string::npos);
          EXPECT_NE(kern.ptx.find("ld.global.nc.v"), std::string::npos);
          EXPECT_NE(kern.ptx.find("st.global.v"), std::string::npos);
          ++vectorKernels;
        }
        ++kernels;
      }
    }
  EXPECT_GE(kernels + refused, 14);
  EXPECT_GE(vectorKernels, 2);
  if (libdevice) EXPECT_EQ(refused, 0);
}

// For the CUDA target a lone node of an op with a formula but no hand-written CUDA kernel (Softsign)
// becomes a group of its own, so a generated kernel runs it; a lone op the CUDA backend has its own
// kernel for (Relu) stays as it is, and the CPU target fuses nothing.
TEST(FuseElementwise, LoneOpWithoutACudaKernelIsAGroup) {
  const std::string text =
      "graph \"g\" opset 22 {\n  input %x : f32[4,8]\n  input %w : f32[8,8]\n  %a : f32[4,8] = Softsign(%x)\n"
      "  %m : f32[4,8] = MatMul(%a, %w)\n  %r : f32[4,8] = Relu(%m)\n  %n : f32[4,8] = MatMul(%r, %w)\n  output %n\n}\n";
  auto g = load(text);
  TrainOptions o;
  o.target = "cuda";
  lowerStep(*g, o);
  verify(*g);
  EXPECT_EQ(countOp(*g, "Fused"), 1);
  EXPECT_EQ(countOp(*g, "Softsign"), 0);
  EXPECT_EQ(countOp(*g, "Relu"), 1);
  EXPECT_EQ(g->lookup("a")->producer()->op(), "Fused");
  auto cpu = load(text);
  o.target = "cpu";
  lowerStep(*cpu, o);
  EXPECT_EQ(countOp(*cpu, "Fused"), 0);
}

// A node the CUDA program has no kernel for (scatter max, ArgMax's last maximum, MaxPool's
// column-major indices, a Tile past rank 4) is refused when the step is lowered for the CUDA target, naming the node
// and the way out; the CPU target takes it.
TEST(FuseElementwise, CudaTargetRefusesWhatItCannotRun) {
  const struct {
    const char* node;
    const char* op;
    std::string body;
  } cases[] = {
      {"scatter_max", "ScatterElements",
       "  input %u : f32[2,4]\n  const %i : i64[2,4] = [0, 1, 2, 0, 0, 1, 2, 2]\n"
       "  %y : f32[3,4] = ScatterElements(%x, %i, %u) {reduction = \"max\"} @scatter_max\n"},
      {"argmax_last", "ArgMax", "  %y : i64[1,4] = ArgMax(%x) {axis = 0, select_last_index = 1} @argmax_last\n"},
      {"pool_columns", "MaxPool",
       "  const %s : i64[4] = [1, 1, 3, 4]\n  %x4 : f32[1,1,3,4] = Reshape(%x, %s)\n"
       "  %y : f32[1,1,2,3], %ix : i64[1,1,2,3] = MaxPool(%x4) {kernel_shape = [2, 2], storage_order = 1} @pool_columns\n"},
      {"tile_5d", "Tile",
       "  const %s : i64[5] = [1, 1, 1, 3, 4]\n  %x5 : f32[1,1,1,3,4] = Reshape(%x, %s)\n  const %r : i64[5] = [2, 1, 1, 1, 1]\n"
       "  %y : f32[2,1,1,3,4] = Tile(%x5, %r) @tile_5d\n"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.node);
    const std::string text = "graph \"g\" opset 18 {\n  input %x : f32[3,4]\n" + c.body + "  output %y\n}\n";
    auto g = load(text);
    TrainOptions o;
    o.target = "cuda";
    try {
      lowerStep(*g, o);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.node), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--target cpu"), std::string::npos) << e.what();
    }
    auto cpu = load(text);
    o.target = "cpu";
    lowerStep(*cpu, o);
    EXPECT_EQ(countOp(*cpu, c.op), 1);
  }
}

// f64 values stay out of groups: a generated kernel holds f32, f16, bf16 and bool (torch.nan_to_num
// exports a Cast to f64 and IsInf between float ops; such a group once crashed the code generator).
// The f32 ops on either side still fuse, the f64 ones stay, and the fused graph computes the same.
TEST(FuseElementwise, DoubleValuesStayOutOfGroups) {
  const std::string text =
      "graph \"g\" opset 17 {\n  input %x : f32[4,8]\n  const %big : f32[] = [5.0]\n"
      "  %l : f32[4,8] = Log(%x)\n  %n : f32[4,8] = Neg(%l)\n  %d : f64[4,8] = Cast(%n) {to = 11}\n  %i : bool[4,8] = IsInf(%d)\n"
      "  %w : f32[4,8] = Where(%i, %big, %n)\n  %r : f32[4,8] = Relu(%w)\n  %s : f32[4,8] = Sqrt(%r)\n  output %s\n}\n";
  auto g = load(text);
  const auto in = randomInputs(*g, false, 7);  // negative inputs give NaN logs; zero ones an Inf
  auto before = load(text);
  ASSERT_TRUE(createFuseElementwisePass()->run(*g));
  verify(*g);
  EXPECT_EQ(countOp(*g, "Cast"), 1);
  EXPECT_EQ(countOp(*g, "IsInf"), 1);
  for (const auto& n : g->nodes()) {
    if (n->op() != "Fused") continue;
    for (size_t i = 0; i < n->numInputs(); ++i) EXPECT_NE(n->input(i)->type().dtype, DType::f64) << n->describe();
    for (size_t r = 0; r < n->numResults(); ++r) EXPECT_NE(n->result(r)->type().dtype, DType::f64) << n->describe();
    if (codegen::available()) EXPECT_NO_THROW(codegen::fusedKernel(*n, "k"));
  }
  auto backend = createCpuBackend();
  const Tensor a = evaluate(*before, in, *backend)[0], b = evaluate(*g, in, *backend)[0];
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t k = 0; k < a.numel(); ++k) {
    const double u = a.getDouble(k), v = b.getDouble(k);
    EXPECT_TRUE((std::isnan(u) && std::isnan(v)) || u == v) << k << ": " << u << " " << v;
  }
}

// Groups whose bodies differ only in their names (an unrolled recurrence's steps, repeated layers)
// share one generated kernel: the generator runs once for them, and both carry the first one's PTX
// and entry. A group with another body gets its own. (An unrolled 1,000-node RNN's 261 groups were
// 32 kernels: its plan compiled in 0.5 s instead of 3.9.)
TEST(FuseElementwise, GroupsThatDifferOnlyInNamesShareAKernel) {
  if (!codegen::available()) GTEST_SKIP() << "built without LLVM (llvm-19-dev)";
  const std::string text =
      "graph \"g\" opset 22 {\n  input %x : f32[4,8]\n  input %w : f32[8,8]\n"
      "  %a1 : f32[4,8] = Softsign(%x)\n  %b1 : f32[4,8] = Neg(%a1)\n  %m1 : f32[4,8] = MatMul(%b1, %w)\n"
      "  %a2 : f32[4,8] = Softsign(%m1)\n  %b2 : f32[4,8] = Neg(%a2)\n  %m2 : f32[4,8] = MatMul(%b2, %w)\n"
      "  %a3 : f32[4,8] = Softsign(%m2)\n  %b3 : f32[4,8] = Abs(%a3)\n  %m3 : f32[4,8] = MatMul(%b3, %w)\n  output %m3\n}\n";
  auto g = load(text);
  TrainOptions o;
  o.target = "cuda";
  int generated = 0;
  std::mutex mu;
  lowerStep(*g, o, [&](const Node& fused, const std::string& name) {
    std::lock_guard<std::mutex> lock(mu);
    ++generated;
    return codegen::fusedKernel(fused, name);
  });
  verify(*g);
  auto groupOf = [&](const char* v) { return g->lookup(v)->producer(); };
  const Node *first = groupOf("b1"), *second = groupOf("b2"), *third = groupOf("b3");
  for (const Node* n : {first, second, third}) ASSERT_EQ(n->op(), "Fused") << n->describe();
  EXPECT_EQ(generated, 2);
  EXPECT_FALSE(first->getString("ptx", "").empty());
  EXPECT_EQ(second->getString("ptx", ""), first->getString("ptx", ""));
  EXPECT_EQ(second->getString("entry", ""), first->getString("entry", ""));
  EXPECT_NE(third->getString("entry", ""), first->getString("entry", ""));
  EXPECT_NE(third->getString("ptx", ""), first->getString("ptx", ""));
}
