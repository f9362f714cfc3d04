// IR: graph construction, use lists, replaceAllUsesWith, erase, and the verifier.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/ir/ir.h"
#include "compiler/ir/text.h"

using namespace ampc;

namespace {
TensorType f32(std::vector<int64_t> s) { return TensorType{DType::f32, std::move(s)}; }
}  // namespace

TEST(IR, BuildUseListsAndVerify) {
  Graph g;
  Value* x = g.addInput("x", f32({4, 3}));
  Value* w = g.addParam("w", Tensor(f32({3, 2})));
  Node* mm = g.createNode("MatMul", "", {x, w}, {{"y", f32({4, 2})}});
  Node* relu = g.createNode("Relu", "", {mm->result(0)}, {{"z", f32({4, 2})}});
  g.addOutput(relu->result(0));
  ASSERT_NE(mm->def(), nullptr);
  EXPECT_EQ(x->uses().size(), 1u);
  EXPECT_EQ(mm->result(0)->uses()[0].user, relu);
  EXPECT_NO_THROW(verify(g));

  // A wrong result type is caught against the registry's inference.
  relu->result(0)->setType(f32({4, 3}));
  EXPECT_THROW(verify(g), Error);
  relu->result(0)->setType(f32({4, 2}));

  // RAUW + erase keep the use lists consistent.
  Node* id = g.createNode("Identity", "", {x}, {{"x2", f32({4, 3})}}, mm);
  mm->setInput(0, id->result(0));
  EXPECT_EQ(x->uses().size(), 1u);
  EXPECT_EQ(x->uses()[0].user, id);
  id->result(0)->replaceAllUsesWith(x);
  EXPECT_TRUE(id->result(0)->uses().empty());
  g.eraseNode(id);
  EXPECT_EQ(g.numNodes(), 2u);
  EXPECT_EQ(g.lookup("x2"), nullptr);
  EXPECT_NO_THROW(verify(g));
  EXPECT_THROW(g.eraseNode(mm), Error);  // still used
}

TEST(IR, DuplicateNamesAndUseBeforeDefinition) {
  Graph g;
  g.addInput("x", f32({2}));
  EXPECT_THROW(g.addInput("x", f32({2})), Error);
  Value* x = g.lookup("x");
  Node* a = g.createNode("Relu", "", {x}, {{"a", f32({2})}});
  // b is created before a in the node list but uses a's result: the verifier names the node.
  Node* b = g.createNode("Relu", "", {a->result(0)}, {{"b", f32({2})}}, a);
  b->setName("early");
  g.addOutput(b->result(0));
  try {
    verify(g);
    FAIL() << "verifier accepted a use before definition";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node 'early' (Relu) uses 'a' before it is defined"), std::string::npos) << e.what();
  }
}

TEST(IR, TensorElementAccess) {
  Tensor t = Tensor::fromDoubles(DType::f16, {3}, {1.5, -2.0, 65520.0});
  EXPECT_EQ(t.getDouble(0), 1.5);
  EXPECT_EQ(t.getDouble(1), -2.0);
  EXPECT_TRUE(std::isinf(t.getDouble(2)));
  Tensor i = Tensor::fromInts(DType::i32, {2}, {7, -9});
  EXPECT_EQ(i.toInts(), (std::vector<int64_t>{7, -9}));
  EXPECT_EQ((TensorType{DType::bf16, {2, 3}}.str()), "bf16[2,3]");
}
