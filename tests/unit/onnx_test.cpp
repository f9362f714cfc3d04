// ONNX import and export: bad inputs each give one clear error naming the file and the node,
// external data stays inside the model's folder, shape subgraphs fold, and export round-trips.
#include <gtest/gtest.h>
#include <onnx/checker.h>
#include <onnx/defs/schema.h>

#include <complex>
#include <cstdlib>
#include <numbers>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/autocast.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/evaluator.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;

namespace {

// Imports and expects an Error whose message contains every string in `want`.
void expectImportError(const std::string& path, const std::vector<std::string>& want, const ImportOptions& opts = {}) {
  try {
    importOnnxFile(path, opts);
    FAIL() << "import of " << path << " succeeded";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind(path, 0), 0u) << "message does not start with the file: " << msg;
    for (const auto& w : want) EXPECT_NE(msg.find(w), std::string::npos) << "missing '" << w << "' in: " << msg;
  }
}

onnx::ModelProto reluModel() {
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 3});
  addNode(g, "Relu", {"x"}, {"y"}, "relu0");
  addOutput(g, "y");
  return m;
}

}  // namespace

TEST(OnnxImport, MissingFile) {
  TempDir d;
  expectImportError(d.file("nope.onnx"), {"no such file"});
}

TEST(OnnxImport, TruncatedFilesNeverCrash) {
  TempDir d;
  std::string bytes = readBytes(std::string(AMPC_SOURCE_DIR) + "/models/cnn.onnx");
  ASSERT_GT(bytes.size(), 1000u);
  int errors = 0;
  for (size_t cut : {bytes.size() / 7, bytes.size() / 3, bytes.size() / 2, bytes.size() - 100, bytes.size() - 1}) {
    std::string p = d.file("cut" + std::to_string(cut) + ".onnx");
    writeBytes(p, bytes.substr(0, cut));
    try {
      importOnnxFile(p);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p, 0), 0u) << e.what();
      ++errors;
    }
  }
  EXPECT_EQ(errors, 5);
  expectImportError(d.file("cut" + std::to_string(bytes.size() / 2) + ".onnx"), {"truncated or not ONNX"});
}

TEST(OnnxImport, RandomBytesNeverCrash) {
  TempDir d;
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 200; ++i) {
    std::string b(1 + rng() % 4096, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    std::string p = d.file("r.onnx");
    writeBytes(p, b);
    EXPECT_THROW(importOnnxFile(p), Error);
  }
  writeBytes(d.file("empty.onnx"), "");
  expectImportError(d.file("empty.onnx"), {"has no graph"});
}

// Mutated real models (bytes flipped, cut, duplicated): import either succeeds or throws Error;
// nothing else escapes and nothing crashes. AMPC_FUZZ_ITERS raises the count (e.g. under ASan).
TEST(OnnxImport, MutatedModelsNeverCrash) {
  TempDir d;
  std::mt19937 rng(std::random_device{}());
  const char* env = std::getenv("AMPC_FUZZ_ITERS");
  const int iters = env ? std::atoi(env) : 300;
  int errors = 0;
  for (const char* name : {"cnn", "transformer"}) {
    const std::string orig = readBytes(std::string(AMPC_SOURCE_DIR) + "/models/" + name + ".onnx");
    for (int i = 0; i < iters; ++i) {
      std::string b = orig;
      int edits = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < edits; ++k) {
        size_t at = rng() % b.size();
        switch (rng() % 4) {
          case 0: b[at] = static_cast<char>(rng()); break;
          case 1: b[at] ^= static_cast<char>(1 << (rng() % 8)); break;
          case 2: b.insert(at, b.substr(rng() % b.size(), 1 + rng() % 16)); break;
          default: b.erase(at, 1 + rng() % 4); break;
        }
        if (b.empty()) b = "x";
      }
      std::string p = d.file("m.onnx");
      writeBytes(p, b);
      try {
        auto g = importOnnxFile(p);
        verify(*g);
      } catch (const Error& e) {
        ASSERT_EQ(std::string(e.what()).rfind(p, 0), 0u) << e.what();
        ++errors;
      }
    }
  }
  EXPECT_GT(errors, 0);
}

// A name that is not UTF-8 (an invalid byte, an overlong form, a surrogate) is refused at import,
// naming the file and showing the bytes, instead of making a plan that amprun cannot read.
TEST(OnnxImport, NamesMustBeUtf8) {
  TempDir d;
  for (const std::string bad : {std::string("relu\xff"), std::string("a\xc0\xaf"), std::string("s\xed\xa0\x80")}) {
    auto m = reluModel();
    m.mutable_graph()->mutable_node(0)->set_name(bad);
    writeModel(d.file("bad.onnx"), m);
    expectImportError(d.file("bad.onnx"), {"bad.onnx", "node 0's name", "is not valid UTF-8"});
  }
  auto m = reluModel();
  m.mutable_graph()->mutable_node(0)->set_name("r\xc3\xa9lu \xe2\x9c\x93");  // UTF-8: accepted
  writeModel(d.file("ok.onnx"), m);
  EXPECT_NO_THROW(importOnnxFile(d.file("ok.onnx")));
  auto e = reluModel();
  e.mutable_graph()->mutable_node(0)->set_name("relu\xff");
  writeModel(d.file("esc.onnx"), e);
  expectImportError(d.file("esc.onnx"), {"'relu\\xff'"});
}

TEST(OnnxImport, CycleNamesTheNode) {
  TempDir d;
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addNode(g, "Add", {"x", "b"}, {"a"}, "first");
  addNode(g, "Relu", {"a"}, {"b"}, "second");
  addOutput(g, "b");
  writeModel(d.file("cycle.onnx"), m);
  expectImportError(d.file("cycle.onnx"), {"node 'first' (Add)", "cycle"});
}

TEST(OnnxImport, UnsortedNodesAreSorted) {
  TempDir d;
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addNode(g, "Relu", {"a"}, {"b"}, "second");
  addNode(g, "Neg", {"x"}, {"a"}, "first");
  addOutput(g, "b");
  writeModel(d.file("unsorted.onnx"), m);
  auto graph = importOnnxFile(d.file("unsorted.onnx"));
  ASSERT_EQ(graph->numNodes(), 2u);
  EXPECT_EQ(graph->nodes().front()->name(), "first");
  EXPECT_EQ(graph->nodes().back()->name(), "second");
}

TEST(OnnxImport, DanglingInputNamesTheNode) {
  TempDir d;
  auto m = reluModel();
  addNode(m.mutable_graph(), "Add", {"y", "ghost"}, {"z"}, "adder");
  writeModel(d.file("dangling.onnx"), m);
  expectImportError(d.file("dangling.onnx"), {"node 'adder' (Add)", "'ghost'", "dangling"});
}

TEST(OnnxImport, WrongDTypeNamesTheNode) {
  TempDir d;
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addTensorInput(g, "k", onnx::TensorProto::INT64, {2});
  addNode(g, "Add", {"x", "k"}, {"y"}, "mixed");
  addOutput(g, "y");
  writeModel(d.file("dtype.onnx"), m);
  expectImportError(d.file("dtype.onnx"), {"node 'mixed' (Add)", "same dtype", "f32[2]", "i64[2]"});

  // A declared output dtype that the graph does not compute.
  auto m2 = reluModel();
  m2.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  writeModel(d.file("outdtype.onnx"), m2);
  expectImportError(d.file("outdtype.onnx"), {"graph output 'y'", "wrong dtype"});

  // An input of a dtype the IR does not have.
  auto m3 = reluModel();
  m3.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::STRING);
  writeModel(d.file("strin.onnx"), m3);
  expectImportError(d.file("strin.onnx"), {"input 'x'", "does not support"});
}

TEST(OnnxImport, UnsupportedOpsAreListedTogether) {
  TempDir d;
  auto m = reluModel();
  auto* g = m.mutable_graph();
  addNode(g, "Foo", {"y"}, {"f"}, "foo_node");
  addNode(g, "Bar", {"f"}, {"b"}, "bar_node", "com.example");
  addNode(g, "TfIdfVectorizer", {"b"}, {"l"}, "tfidf_node");
  auto* o = m.add_opset_import();
  o->set_domain("com.example");
  o->set_version(1);
  writeModel(d.file("unsup.onnx"), m);
  expectImportError(d.file("unsup.onnx"), {"3 node(s)", "node 'foo_node' (Foo) domain 'ai.onnx'",
                                           "node 'bar_node' (com.example.Bar) domain 'com.example'", "node 'tfidf_node' (TfIdfVectorizer)"});
}

// An attribute of a standard op that ampc does not read would be computed as if it were absent:
// a silently wrong answer. Import lists every such attribute in one error, naming node and op,
// for registry ops and for the ops import lowers alike; a custom op's attributes are its own.
TEST(OnnxImport, UnreadAttributesAreListedTogether) {
  TempDir d;
  auto m = reluModel();
  auto* g = m.mutable_graph();
  auto* relu = g->mutable_node(0);
  auto* a = relu->add_attribute();  // not an attribute of Relu
  a->set_name("alpha");
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(0.1f);
  auto* c = addNode(g, "Constant", {}, {"s"}, "text");  // a string constant ampc cannot hold
  a = c->add_attribute();
  a->set_name("value_string");
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s("hello");
  auto* lrn = addNode(g, "LRN", {"x"}, {"n"}, "lrn0");  // an op import lowers
  a = lrn->add_attribute();
  a->set_name("size");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(3);
  a = lrn->add_attribute();
  a->set_name("sharpness");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(2);
  writeModel(d.file("attrs.onnx"), m);
  expectImportError(d.file("attrs.onnx"), {"3 attribute(s)", "node 'relu0' (Relu) attribute 'alpha' (Relu takes none)",
                                           "node 'text' (Constant) attribute 'value_string'",
                                           "node 'lrn0' (LRN) attribute 'sharpness' (LRN takes alpha beta bias size)"});
  // The attributes each op reads are taken, with any value its rules reproduce.
  auto ok = reluModel();
  auto* sm = addNode(ok.mutable_graph(), "Softmax", {"y"}, {"p"}, "softmax0");
  a = sm->add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(0);
  addOutput(ok.mutable_graph(), "p");
  writeModel(d.file("ok.onnx"), ok);
  EXPECT_EQ(importOnnxFile(d.file("ok.onnx"))->outputs().size(), 2u);
}

// Each attribute that ONNX's schemas (opsets 13 to 17, what the linked onnx library holds) give a
// registry op or an op import lowers is one ampc reads, or one it refuses; and each name ampc says
// it reads is one of the op's attributes, or came in a later opset (listed here).
TEST(OnnxImport, AttributeListsFollowTheSchemas) {
  const std::set<std::string> refused = {"Constant.sparse_value", "Constant.value_string", "Constant.value_strings"};
  const std::set<std::string> later = {"ReduceMean.noop_with_empty_axes", "ReduceMax.noop_with_empty_axes", "ReduceMin.noop_with_empty_axes",
                                       "ReduceL1.noop_with_empty_axes", "ReduceL2.noop_with_empty_axes", "ReduceSumSquare.noop_with_empty_axes",
                                       "ReduceLogSum.noop_with_empty_axes", "ReduceLogSumExp.noop_with_empty_axes", "ReduceProd.noop_with_empty_axes",
                                       "Split.num_outputs", "Cast.saturate", "CastLike.saturate", "AveragePool.dilations",
                                       "Resize.antialias", "Resize.axes", "Resize.keep_aspect_ratio_policy", "LpPool.ceil_mode", "LpPool.dilations",
                                       "QuantizeLinear.saturate", "QuantizeLinear.block_size", "QuantizeLinear.output_dtype",
                                       "QuantizeLinear.precision", "DequantizeLinear.block_size", "DequantizeLinear.output_dtype"};
  std::map<std::string, std::string_view> ops;
  for (const OpDef& d : allOps())
    if (d.domain.empty()) ops[std::string(d.name)] = d.attrs;
  for (const auto& s : onnx::OpSchemaRegistry::get_all_schemas_with_history())
    if (s.domain().empty() && importLowersOp(s.Name())) ops[s.Name()] = *importLoweredAttributes(s.Name());
  int checked = 0;
  for (const auto& [op, attrs] : ops) {
    std::set<std::string> known;
    bool anySchema = false;
    for (int v = 13; v <= 17; ++v) {
      const auto* s = onnx::OpSchemaRegistry::Schema(op, v, "");
      if (!s) continue;
      anySchema = true;
      for (const auto& [name, a] : s->attributes()) {
        known.insert(name);
        EXPECT_TRUE(attributeTaken(attrs, name) != (refused.count(op + "." + name) != 0))
            << op << "-" << s->SinceVersion() << " attribute " << name << (attributeTaken(attrs, name) ? " is listed as refused" : " is neither read nor refused");
        ++checked;
      }
    }
    if (!anySchema) continue;  // an op newer than the library (Gelu, Attention, ...)
    std::string_view rest = attrs;
    while (!rest.empty()) {
      const size_t end = std::min(rest.find(' '), rest.size());
      const std::string name(rest.substr(0, end));
      rest.remove_prefix(std::min(end + 1, rest.size()));
      EXPECT_TRUE(known.count(name) || later.count(op + "." + name)) << op << " lists '" << name << "', which none of its schemas has";
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(OnnxImport, OpsetOutOfRange) {
  TempDir d;
  auto m = reluModel();
  m.mutable_opset_import(0)->set_version(11);  // Relu changed at opset 13 (bf16)
  writeModel(d.file("old.onnx"), m);
  expectImportError(d.file("old.onnx"), {"uses opset 11", "13 to 24", "changed since opset 11: Relu"});
  m.mutable_opset_import(0)->set_version(25);
  writeModel(d.file("new.onnx"), m);
  expectImportError(d.file("new.onnx"), {"uses opset 25", "13 to 24"});
  // An opset-11 model whose ops did not change since (Conv) is read at opset 13.
  auto conv = newModel(11);
  auto* g = conv.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {1, 1, 4, 4});
  addFloatInit(g, "w", {1, 1, 3, 3}, std::vector<float>(9, 1.0f));
  addNode(g, "Conv", {"x", "w"}, {"y"}, "conv");
  addOutput(g, "y");
  writeModel(d.file("conv11.onnx"), conv);
  auto graph = importOnnxFile(d.file("conv11.onnx"));
  EXPECT_EQ(graph->opset, 13);
  EXPECT_EQ(graph->outputs()[0]->type().str(), "f32[1,1,2,2]");
}

TEST(OnnxImport, ExternalDataStaysInTheModelFolder) {
  TempDir d;
  std::filesystem::create_directories(d.path / "m");
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 4.0f};
  {
    std::string bytes(8, 'x');  // offset 8
    bytes.append(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    writeBytes(d.file("m/w.bin"), bytes);
    writeBytes(d.file("m/short.bin"), std::string(10, 'x'));
    writeBytes(d.file("outside.bin"), bytes);
  }
  auto model = [&](const std::string& location, const std::string& length) {
    auto m = newModel();
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4});
    addExternalInit(g, "w", {4}, location, "8", length);
    addNode(g, "Mul", {"x", "w"}, {"y"}, "scale");
    addOutput(g, "y");
    writeModel(d.file("m/model.onnx"), m);
    return d.file("m/model.onnx");
  };
  auto g = importOnnxFile(model("w.bin", "16"));
  const Tensor* t = g->lookup("w")->data();
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t->getDouble(i), w[i]);

  expectImportError(model("../outside.bin", ""), {"initializer 'w'", "'../outside.bin' escapes the model's folder"});
  expectImportError(model("sub/../../outside.bin", ""), {"escapes the model's folder"});
  expectImportError(model((d.path / "m/w.bin").string(), ""), {"is absolute"});
  expectImportError(model("missing.bin", ""), {"'missing.bin' is missing"});
  expectImportError(model("short.bin", ""), {"'short.bin' is too short"});
  expectImportError(model("w.bin", "12"), {"length 12 does not match"});
  std::filesystem::create_symlink(d.path / "outside.bin", d.path / "m" / "link.bin");
  expectImportError(model("link.bin", ""), {"escapes the model's folder"});
}

// A model over protobuf's 2 GiB keeps its weights as external data: offsets past 2^31 (and 2^32)
// work, the file is mapped rather than read (a sparse 5 GiB file costs nothing), and the graph's
// tensors are views of the mapping until something writes them (then that tensor alone is copied).
TEST(OnnxImport, ExternalDataPastTwoGiBIsMappedNotRead) {
  TempDir d;
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 4.0f};
  const int64_t offset = (int64_t{1} << 32) + 4096;  // past 4 GiB
  {
    std::ofstream out(d.file("big.bin"), std::ios::binary);
    out.seekp(offset);
    out.write(reinterpret_cast<const char*>(w.data()), 16);
    out.seekp((int64_t{5} << 30) - 1);
    out.put('\0');
  }
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4});
  addExternalInit(g, "w", {4}, "big.bin", std::to_string(offset), "16");
  addNode(g, "Mul", {"x", "w"}, {"y"}, "scale");
  addOutput(g, "y");
  writeModel(d.file("model.onnx"), m);
  auto graph = importOnnxFile(d.file("model.onnx"));
  Value* v = graph->lookup("w");
  ASSERT_NE(v->data(), nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(v->data()->getDouble(i), w[i]);
  EXPECT_TRUE(v->data()->data.shared()) << "the initializer was copied, not viewed";
  Tensor copy = *v->data();
  copy.setDouble(0, 7.0);  // copy on write: the graph's tensor (and the file) keep their value
  EXPECT_FALSE(copy.data.shared());
  EXPECT_EQ(copy.getDouble(0), 7.0);
  EXPECT_EQ(v->data()->getDouble(0), 1.5);
  EXPECT_EQ(copy.getDouble(1), -2.0);
  // Inline data (raw_data) of a model read from its file is viewed in place too: large tensors in
  // the mapped file (the rest of the model is parsed without them), small ones in the parsed model.
  std::vector<float> big(3000), small = {0.5f, 1.5f};
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.25f - 7.0f;
  auto inl = newModel();
  addTensorInput(inl.mutable_graph(), "x", onnx::TensorProto::FLOAT, {3000});
  for (auto [name, v] : {std::pair{"w", &big}, std::pair{"s", &small}}) {
    auto* wt = addFloatInit(inl.mutable_graph(), name, {static_cast<int64_t>(v->size())}, *v);
    wt->clear_float_data();
    wt->set_raw_data(v->data(), v->size() * 4);
  }
  addNode(inl.mutable_graph(), "Mul", {"x", "w"}, {"y"}, "scale");
  addNode(inl.mutable_graph(), "ReduceSum", {"s"}, {"z"}, "sum");
  addOutput(inl.mutable_graph(), "y");
  addOutput(inl.mutable_graph(), "z");
  writeModel(d.file("inline.onnx"), inl);
  auto gi = importOnnxFile(d.file("inline.onnx"));
  for (const char* name : {"w", "s"}) EXPECT_TRUE(gi->lookup(name)->data()->data.shared()) << name;
  for (size_t i = 0; i < big.size(); ++i) ASSERT_EQ(gi->lookup("w")->data()->getDouble(static_cast<int64_t>(i)), big[i]) << i;
  EXPECT_EQ(gi->lookup("s")->data()->getDouble(1), 1.5);
  // The same bytes cut short: the stripped parse fails and the ordinary one names the file.
  const std::string bytes = readBytes(d.file("inline.onnx"));
  writeBytes(d.file("cut.onnx"), bytes.substr(0, bytes.size() - 100));
  expectImportError(d.file("cut.onnx"), {"cut.onnx", "not a valid ONNX model"});
}

TEST(OnnxImport, SymbolicDimsAndShapeSubgraphFolding) {
  TempDir d;
  // x: [N, 4, 6] -> Reshape to [N, 24] through Shape -> Gather -> Unsqueeze -> Concat, as exporters emit.
  auto m = newModel();
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {0, 4, 6}, {"N"});
  addInt64Init(g, "zero", {0});
  addInt64Init(g, "minus1", {-1});
  auto* c = addNode(g, "Constant", {}, {"idx"}, "const_idx");
  auto* a = c->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  a->mutable_t()->add_int64_data(0);  // scalar 0
  addNode(g, "Shape", {"x"}, {"s"}, "shape");
  addNode(g, "Gather", {"s", "idx"}, {"n"}, "gather");
  addNode(g, "Unsqueeze", {"n", "zero"}, {"n1"}, "unsq");
  addNode(g, "Concat", {"n1", "minus1"}, {"target"}, "concat")->add_attribute()->CopyFrom([] {
    onnx::AttributeProto p;
    p.set_name("axis");
    p.set_type(onnx::AttributeProto::INT);
    p.set_i(0);
    return p;
  }());
  addNode(g, "Reshape", {"x", "target"}, {"y"}, "reshape");
  addOutput(g, "y", onnx::TensorProto::FLOAT);
  writeModel(d.file("sym.onnx"), m);

  expectImportError(d.file("sym.onnx"), {"input 'x' dim 0 is symbolic ('N')", "--input-shape x="});
  ImportOptions opts;
  opts.inputShapes["x"] = {5, 4, 6};
  auto graph = importOnnxFile(d.file("sym.onnx"), opts);
  ASSERT_EQ(graph->numNodes(), 1u);
  const Node& r = *graph->nodes().front();
  EXPECT_EQ(r.op(), "Reshape");
  EXPECT_EQ(r.input(1)->constData()->toInts(), (std::vector<int64_t>{5, -1}));
  EXPECT_EQ(graph->outputs()[0]->type().str(), "f32[5,24]");

  opts.inputShapes["x"] = {5, 4, 7};
  expectImportError(d.file("sym.onnx"), {"sets dim 2 to 7", "fixes it to 6"}, opts);
  opts.inputShapes = {{"nosuch", {1}}};
  expectImportError(d.file("sym.onnx"), {"'nosuch', which is not a graph input"}, opts);
}

TEST(OnnxExport, PassesCheckerAndReimportsIdentically) {
  TempDir d;
  auto g = parseGraph(R"(graph "g" opset 17 {
  input %x : f32[4,3]
  input %t : i64[4]
  input %xh : f16[2]
  param %w : f32[5,3]
  param %b : f32[5]
  const %s : i64[2] = [2, -1]
  const %h : f16[2] = [0.5, -2.0]
  %y : f32[4,5] = Gemm(%x, %w, %b) {transB = 1} @fc
  %r : f32[4,5] = Relu(%y) @relu
  %l : f32[], %lp : f32[4,5] = SoftmaxCrossEntropyLoss(%r, %t) {reduction = "mean"} @loss
  %z : f32[2,10] = Reshape(%r, %s) @reshape
  %m : f16[2] = Mul(%xh, %h) {ampc_fp32 = 1} @mul
  output %l
  output %z
  output %m
}
)");
  verify(*g);
  for (Value* p : g->params()) {
    Tensor t(p->type());
    for (int64_t i = 0; i < t.numel(); ++i) t.setDouble(i, 0.25 * static_cast<double>(i));
    p->setData(std::move(t));
  }
  onnx::ModelProto m = exportOnnx(*g);
  EXPECT_NO_THROW(onnx::checker::check_model(m));  // ampc's annotation (ampc_fp32) travels as metadata
  writeModel(d.file("out.onnx"), m);
  auto back = importOnnxFile(d.file("out.onnx"));
  EXPECT_EQ(printGraph(*back), printGraph(*g));
  EXPECT_EQ(back->lookup("m")->producer()->getInt(kKeepFp32, 0), 1);
  EXPECT_EQ(back->lookup("w")->data()->getDouble(7), 1.75);

  // exportOnnxFile writes atomically: no temp file is left behind.
  exportOnnxFile(*g, d.file("atomic.onnx"));
  EXPECT_TRUE(std::filesystem::exists(d.file("atomic.onnx")));
  EXPECT_FALSE(std::filesystem::exists(d.file("atomic.onnx.tmp")));
}

TEST(OnnxImport, ParseShapeSpec) {
  EXPECT_EQ(parseShapeSpec("2x3x32x32"), (std::vector<int64_t>{2, 3, 32, 32}));
  EXPECT_EQ(parseShapeSpec("7"), (std::vector<int64_t>{7}));
  EXPECT_THROW(parseShapeSpec("2x"), Error);
  EXPECT_THROW(parseShapeSpec("2,3"), Error);
  EXPECT_THROW(parseShapeSpec(""), Error);
}

// ---- what the dynamo exporter writes, and the ops import rewrites into registry ops

namespace {

onnx::AttributeProto* intAttr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
  return a;
}
void floatAttr(onnx::NodeProto* n, const std::string& name, float v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
void stringAttr(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}
void stringsAttr(onnx::NodeProto* n, const std::string& name, const std::vector<std::string>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRINGS);
  for (const auto& x : v) a->add_strings(x);
}
void intsAttr(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}
std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.7f * static_cast<float>(i) + 0.3f);
  return v;
}
Tensor evalOne(const Graph& g, const std::map<std::string, Tensor>& feeds) {
  auto backend = createCpuBackend();
  return evaluate(g, feeds, *backend)[0];
}

}  // namespace

// The dynamo exporter writes a train()-mode BatchNorm as BatchNormalization with training_mode 0
// and one result. Read as written, it normalises with the running statistics (the wrong losses
// of issue 18); ampc gives it training semantics, and --batchnorm as-exported keeps it.
TEST(OnnxImport, InferenceFormBatchNormTrainsWithBatchStatistics) {
  TempDir d;
  auto m = newModel(18);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 3, 2, 2});
  addFloatInit(g, "s", {3}, {1, 2, 3});
  addFloatInit(g, "b", {3}, {0, 0.5, -1});
  addFloatInit(g, "rm", {3}, {0, 0, 0});
  addFloatInit(g, "rv", {3}, {1, 1, 1});
  floatAttr(addNode(g, "BatchNormalization", {"x", "s", "b", "rm", "rv"}, {"y"}, "bn"), "momentum", 0.9f);
  addOutput(g, "y");
  writeModel(d.file("bn.onnx"), m);
  auto trained = importOnnxFile(d.file("bn.onnx"));
  const Node& bn = *trained->nodes().front();
  EXPECT_EQ(bn.getInt("training_mode", 0), 1);
  EXPECT_EQ(bn.numResults(), 3u);  // the running statistics' updates, which the train step writes back
  ASSERT_EQ(trained->importNotes.size(), 1u);
  EXPECT_NE(trained->importNotes[0].find("1 BatchNormalization"), std::string::npos);
  // Batch statistics: every channel of the result has mean b[c] and variance s[c]^2 (eps aside).
  Tensor x(TensorType{DType::f32, {4, 3, 2, 2}});
  auto v = ramp(48, 5.0f);
  for (int64_t i = 0; i < 48; ++i) x.setDouble(i, v[i] + 3.0);
  Tensor y = evalOne(*trained, {{"x", x}});
  const double bias[3] = {0, 0.5, -1};
  for (int64_t c = 0; c < 3; ++c) {
    double mean = 0;
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t k = 0; k < 4; ++k) mean += y.getDouble((n * 3 + c) * 4 + k) / 16;
    EXPECT_NEAR(mean, bias[c], 1e-5) << c;
  }
  ImportOptions asExported;
  asExported.batchNormAsExported = true;
  auto frozen = importOnnxFile(d.file("bn.onnx"), asExported);
  EXPECT_EQ(frozen->nodes().front()->getInt("training_mode", 0), 0);
  EXPECT_TRUE(frozen->importNotes.empty());
  Tensor yf = evalOne(*frozen, {{"x", x}});
  EXPECT_NEAR(yf.getDouble(0), (x.getDouble(0) - 0) / std::sqrt(1 + 1e-5) * 1 + 0, 1e-4);  // running statistics
  // The choice travels with the graph (ampc.frozen_batchnorms): a plan's step graph, imported again
  // from the exported forward without the option, keeps the BatchNorm frozen (it once trained it).
  EXPECT_EQ(frozen->frozenBatchNorms, std::set<std::string>{"y"});
  writeModel(d.file("bn_round.onnx"), exportOnnx(*frozen));
  auto again = importOnnxFile(d.file("bn_round.onnx"));
  EXPECT_EQ(again->nodes().front()->getInt("training_mode", 0), 0);
  EXPECT_EQ(again->nodes().front()->numResults(), 1u);
  EXPECT_TRUE(again->importNotes.empty());
  // And a trained one stays trained.
  writeModel(d.file("bn_trained_round.onnx"), exportOnnx(*trained));
  EXPECT_EQ(importOnnxFile(d.file("bn_trained_round.onnx"))->nodes().front()->getInt("training_mode", 0), 1);
}

// A frozen BatchNorm (a module left in eval()) beside a trained one, as the dynamo exporter writes
// them: both in inference form, told apart by the ATen op each node is named after
// (_native_batch_norm_legit_no_training / _functional), or by ampc_export.py's
// "ampc.frozen_batchnorms". Read as one kind, the frozen one trained with batch statistics (the
// sweep's frozen_bn_mixed under the dynamo exporter: every gradient wrong).
TEST(OnnxImport, DynamoFrozenBatchNormBesideATrainedOneStaysFrozen) {
  TempDir d;
  auto model = [&](const std::string& file, const std::string& frozenName, const std::string& trainedName, bool metadata) {
    auto m = newModel(18);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 3, 2, 2});
    for (const char* p : {"a", "b"}) {
      addFloatInit(g, std::string(p) + ".s", {3}, {1, 2, 3});
      addFloatInit(g, std::string(p) + ".b", {3}, {0, 0.5, -1});
      addFloatInit(g, std::string(p) + ".rm", {3}, {0.1f, 0.2f, 0.3f});
      addFloatInit(g, std::string(p) + ".rv", {3}, {1, 2, 3});
    }
    addNode(g, "BatchNormalization", {"x", "a.s", "a.b", "a.rm", "a.rv"}, {"ya"}, frozenName);
    addNode(g, "BatchNormalization", {"ya", "b.s", "b.b", "b.rm", "b.rv"}, {"yb"}, trainedName);
    addOutput(g, "yb");
    if (metadata) {
      auto* e = m.add_metadata_props();
      e->set_key("ampc.frozen_batchnorms");
      e->set_value("[\"ya\"]");
    }
    writeModel(d.file(file), m);
    return importOnnxFile(d.file(file));
  };
  auto modes = [](const Graph& g) {
    std::vector<int64_t> m;
    for (const auto& n : g.nodes())
      if (n->op() == "BatchNormalization") m.push_back(n->getInt("training_mode", 0));
    return m;
  };
  auto named = model("named.onnx", "node__native_batch_norm_legit_no_training__0", "node__native_batch_norm_legit_functional__0", false);
  EXPECT_EQ(modes(*named), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(named->frozenBatchNorms, std::set<std::string>{"ya"});
  auto marked = model("marked.onnx", "bn_a", "bn_b", true);
  EXPECT_EQ(modes(*marked), (std::vector<int64_t>{0, 1}));
  auto plain = model("plain.onnx", "bn_a", "bn_b", false);  // nothing tells them apart: both train
  EXPECT_EQ(modes(*plain), (std::vector<int64_t>{1, 1}));
}

// An attribute of the wrong kind that import itself reads (BatchNormalization's training_mode, a
// float here) is an error naming the file, the node and the attribute (the mutation test found it
// reported without the file).
TEST(OnnxImport, WrongAttributeKindNamesTheFile) {
  TempDir d;
  auto m = newModel(18);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 3, 2, 2});
  for (const char* n : {"s", "b", "rm", "rv"}) addFloatInit(g, n, {3}, {1, 1, 1});
  floatAttr(addNode(g, "BatchNormalization", {"x", "s", "b", "rm", "rv"}, {"y"}, "bn"), "training_mode", 1.0f);
  addOutput(g, "y");
  writeModel(d.file("bn.onnx"), m);
  expectImportError(d.file("bn.onnx"), {"node 'bn' (BatchNormalization): attribute 'training_mode' must be an int"});
}

// SplitToSequence / SequenceAt (GPT-2's QKV split), CastLike and a local function, as the dynamo
// exporter writes them, import as registry ops and compute what they say.
TEST(OnnxImport, DynamoSequencesCastLikeAndFunctions) {
  TempDir d;
  auto m = newModel(18);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 7});
  addTensorInput(g, "h", onnx::TensorProto::FLOAT16, {1});
  addInt64Init(g, "chunk", {3});
  g->mutable_initializer(0)->clear_dims();  // a scalar: chunks of 3 (the last one shorter)
  intAttr(addNode(g, "SplitToSequence", {"x", "chunk"}, {"seq"}, "split"), "axis", 1);
  auto* idx = addNode(g, "Constant", {}, {"two"}, "c2");
  auto* a = idx->add_attribute();
  a->set_name("value");
  a->set_type(onnx::AttributeProto::TENSOR);
  a->mutable_t()->set_data_type(onnx::TensorProto::INT64);
  a->mutable_t()->add_int64_data(2);
  addNode(g, "SequenceAt", {"seq", "two"}, {"last"}, "at");
  addNode(g, "CastLike", {"last", "h"}, {"lh"}, "castlike");
  addNode(g, "Twice", {"lh"}, {"y"}, "call", "local");
  addOutput(g, "y");
  auto* f = m.add_functions();
  f->set_name("Twice");
  f->set_domain("local");
  f->add_input("a");
  f->add_output("b");
  auto* fo = f->add_opset_import();
  fo->set_domain("");
  fo->set_version(18);
  auto* add = f->add_node();
  add->set_op_type("Add");
  add->add_input("a");
  add->add_input("a");
  add->add_output("b");
  auto* lo = m.add_opset_import();
  lo->set_domain("local");
  lo->set_version(1);
  writeModel(d.file("seq.onnx"), m);
  auto gr = importOnnxFile(d.file("seq.onnx"));
  std::map<std::string, int> ops;
  for (const auto& n : gr->nodes()) ops[n->op()]++;
  EXPECT_EQ(ops["Split"], 1);
  EXPECT_EQ(ops["Cast"], 1);
  EXPECT_EQ(ops["Add"], 1);
  EXPECT_EQ(ops.count("SplitToSequence") + ops.count("SequenceAt") + ops.count("CastLike") + ops.count("Twice"), 0u);
  ASSERT_EQ(gr->outputs()[0]->type().str(), "f16[2,1]");  // the third chunk of 7 in threes: one column, as h's dtype
  Tensor x(TensorType{DType::f32, {2, 7}});
  for (int64_t i = 0; i < 14; ++i) x.setDouble(i, 0.25 * static_cast<double>(i));
  Tensor h(TensorType{DType::f16, {1}});
  Tensor y = evalOne(*gr, {{"x", x}, {"h", h}});
  EXPECT_EQ(y.getDouble(0), 2 * x.getDouble(6));
  EXPECT_EQ(y.getDouble(1), 2 * x.getDouble(13));
  // A sequence whose split is not a compile-time constant is refused, naming the node.
  g->mutable_initializer()->Clear();
  addTensorInput(g, "chunk", onnx::TensorProto::INT64, {});
  writeModel(d.file("dyn.onnx"), m);
  expectImportError(d.file("dyn.onnx"), {"node 'split' (SplitToSequence)", "split must be a compile-time integer constant"});
}

// ArgMin is the ArgMax of -x: exact for floats and, through f64, for integers up to 32 bits; an
// i64 input (whose negation can overflow and whose f64 can tie) is refused, naming the node.
// (ONNX's node tests check ArgMin and the other small compositions against their reference data.)
// LpNormalization (p 1 and 2, along an axis), GlobalLpPool (p 2 and 3) and LpPool (p 2 with
// asymmetric pads, p 3 with dilations, p 1 with SAME_UPPER) against loops in double; LpPool with
// ceil_mode is refused, naming the node.
TEST(OnnxImport, LpNormsMatchTheirDefinitions) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  std::vector<float> xv(2 * 3 * 4 * 5);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<float>(std::sin(1.7 * static_cast<double>(i)) * 3.0);
  addFloatInit(g, "x", {2, 3, 4, 5}, xv);
  auto* a = addNode(g, "LpNormalization", {"x"}, {"n1"}, "l1");
  intAttr(a, "p", 1);
  intAttr(a, "axis", 0);
  addNode(g, "LpNormalization", {"x"}, {"n2"}, "l2");  // p 2, the last axis
  addNode(g, "GlobalLpPool", {"x"}, {"g2"}, "gp2");
  intAttr(addNode(g, "GlobalLpPool", {"x"}, {"g3"}, "gp3"), "p", 3);
  struct Pool {
    const char* name;
    int64_t p;
    std::vector<int64_t> kernel, strides, pads, dilations;  // pads: top, left, bottom, right (as computed for SAME_UPPER)
    bool sameUpper;
  };
  const std::vector<Pool> pools = {{"lp2", 2, {2, 3}, {1, 2}, {1, 0, 0, 1}, {1, 1}, false},
                                   {"lp3", 3, {2, 2}, {2, 1}, {0, 1, 1, 0}, {1, 2}, false},
                                   {"lp1", 1, {3, 3}, {2, 2}, {0, 1, 1, 1}, {1, 1}, true}};
  for (const auto& q : pools) {
    auto* n = addNode(g, "LpPool", {"x"}, {q.name}, std::string(q.name) + "_pool");
    intsAttr(n, "kernel_shape", q.kernel);
    intsAttr(n, "strides", q.strides);
    if (q.sameUpper) stringAttr(n, "auto_pad", "SAME_UPPER");
    else intsAttr(n, "pads", q.pads);
    intsAttr(n, "dilations", q.dilations);
    if (q.p != 2) intAttr(n, "p", q.p);
  }
  for (const char* o : {"n1", "n2", "g2", "g3", "lp2", "lp3", "lp1"}) addOutput(g, o);
  writeModel(d.file("lp.onnx"), m);
  auto gr = importOnnxFile(d.file("lp.onnx"));
  auto backend = createCpuBackend();
  const auto outs = evaluate(*gr, {}, *backend, {});
  ASSERT_EQ(outs.size(), 7u);
  auto x = [&](int a0, int a1, int a2, int a3) { return static_cast<double>(xv[static_cast<size_t>(((a0 * 3 + a1) * 4 + a2) * 5 + a3)]); };
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 5; ++l) {
          const double n1 = std::abs(x(0, j, k, l)) + std::abs(x(1, j, k, l));
          double n2 = 0;
          for (int q = 0; q < 5; ++q) n2 += x(i, j, k, q) * x(i, j, k, q);
          const int64_t at = ((i * 3 + j) * 4 + k) * 5 + l;
          EXPECT_NEAR(outs[0].getDouble(at), x(i, j, k, l) / n1, 1e-6);
          EXPECT_NEAR(outs[1].getDouble(at), x(i, j, k, l) / std::sqrt(n2), 1e-6);
        }
  EXPECT_EQ(outs[2].type.str(), "f32[2,3,1,1]");
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j) {
      double s2 = 0, s3 = 0;
      for (int k = 0; k < 4; ++k)
        for (int l = 0; l < 5; ++l) {
          s2 += x(i, j, k, l) * x(i, j, k, l);
          s3 += std::pow(std::abs(x(i, j, k, l)), 3);
        }
      EXPECT_NEAR(outs[2].getDouble(i * 3 + j), std::sqrt(s2), 1e-4);
      EXPECT_NEAR(outs[3].getDouble(i * 3 + j), std::cbrt(s3), 1e-4);
    }
  for (size_t c = 0; c < pools.size(); ++c) {
    const Pool& q = pools[c];
    const Tensor& y = outs[4 + c];
    SCOPED_TRACE(q.name);
    const int64_t oh = (4 + q.pads[0] + q.pads[2] - ((q.kernel[0] - 1) * q.dilations[0] + 1)) / q.strides[0] + 1;
    const int64_t ow = (5 + q.pads[1] + q.pads[3] - ((q.kernel[1] - 1) * q.dilations[1] + 1)) / q.strides[1] + 1;
    ASSERT_EQ(y.type.str(), "f32[2,3," + std::to_string(oh) + "," + std::to_string(ow) + "]");
    double largest = 0;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int64_t r = 0; r < oh; ++r)
          for (int64_t col = 0; col < ow; ++col) {
            double sum = 0;
            for (int64_t kh = 0; kh < q.kernel[0]; ++kh)
              for (int64_t kw = 0; kw < q.kernel[1]; ++kw) {
                const int64_t h = r * q.strides[0] - q.pads[0] + kh * q.dilations[0], w = col * q.strides[1] - q.pads[1] + kw * q.dilations[1];
                if (h >= 0 && h < 4 && w >= 0 && w < 5) sum += std::pow(std::abs(x(i, j, static_cast<int>(h), static_cast<int>(w))), static_cast<double>(q.p));
              }
            const double want = std::pow(sum, 1.0 / static_cast<double>(q.p));
            largest = std::max(largest, want);
            EXPECT_NEAR(y.getDouble(((i * 3 + j) * oh + r) * ow + col), want, 1e-4 * std::max(1.0, want)) << r << "," << col;
          }
    EXPECT_GT(largest, 1.0);
  }
  // A last window past the padded edge (ceil_mode) has no sum that the composition gives: refused.
  auto bad = newModel(18);
  addFloatInit(bad.mutable_graph(), "x", {2, 3, 4, 5}, xv);
  auto* n = addNode(bad.mutable_graph(), "LpPool", {"x"}, {"y"}, "ceil_pool");
  intsAttr(n, "kernel_shape", {2, 2});
  intsAttr(n, "strides", {2, 2});
  intAttr(n, "ceil_mode", 1);
  addOutput(bad.mutable_graph(), "y");
  writeModel(d.file("lp_ceil.onnx"), bad);
  expectImportError(d.file("lp_ceil.onnx"), {"node 'ceil_pool' (LpPool)", "ceil_mode = 1 is not supported"});
}

TEST(OnnxImport, ArgMinOfInt64IsRefused) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::INT64, {3, 4});
  addNode(g, "ArgMin", {"x"}, {"y"}, "argmin0");
  addOutput(g, "y");
  writeModel(d.file("argmin.onnx"), m);
  expectImportError(d.file("argmin.onnx"), {"node 'argmin0' (ArgMin)", "i64[3,4] is not supported"});
  m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT32);
  writeModel(d.file("argmin32.onnx"), m);
  auto gr = importOnnxFile(d.file("argmin32.onnx"));
  Tensor x = Tensor::fromInts(DType::i32, {3, 4}, {5, -2147483647 - 1, 7, 1, 2147483647, 3, 3, -1, 0, 0, 9, -9});
  Tensor y = evalOne(*gr, {{"x", x}});
  EXPECT_EQ(y.type.str(), "i64[1,4]");
  EXPECT_EQ(y.toInts(), (std::vector<int64_t>{2, 0, 1, 2}));
}

// Einsum, lowered to Transpose/Reshape/ReduceSum/MatMul (Slice for diagonals, Expand for
// broadcasts), against a naive sum over every letter assignment computed here in double: batch
// matmul, transposes, outer and inner products, summed-out letters, implicit output, three
// operands; ellipses (right-aligned over terms of different ranks, anywhere in a term, summed out,
// first in an implicit output), diagonals and traces, dims of 1 broadcast. Letters that do not
// broadcast and terms that do not fit their inputs are refused, naming the node.
TEST(OnnxImport, EinsumMatchesItsDefinition) {
  struct Case {
    std::string eq;
    std::vector<std::vector<int64_t>> shapes;  // empty: from the letters' sizes below
  };
  const std::map<char, int64_t> dim = {{'a', 2}, {'b', 3}, {'i', 4}, {'j', 5}, {'k', 3}, {'c', 2}, {'d', 4}};
  const std::vector<Case> cases = {
      {"bij,bjk->bik", {}}, {"ij->ji", {}}, {"i,j->ij", {}}, {"i,i->", {}}, {"ij->i", {}}, {"bij,bkj->bki", {}}, {"ij,jk", {}},
      {"ab,bc,cd->ad", {}}, {"aij,jk->ka", {}}, {"ij,ij->ij", {}},
      {"...ii->...i", {{2, 3, 4, 4}}}, {"ii->i", {{4, 4}}}, {"ii", {{4, 4}}}, {"iii->i", {{3, 3, 3}}}, {"iji->ij", {{3, 2, 3}}},
      {"...ij,...jk->...ik", {{2, 1, 4, 5}, {3, 5, 3}}}, {"...,f->...f", {{2, 3}, {4}}}, {"bij,bjk->bik", {{1, 4, 5}, {3, 5, 2}}},
      {"...ij,...jk", {{2, 4, 5}, {2, 5, 3}}}, {"...ij->...", {{2, 3, 4, 5}}}, {"i...j->j...i", {{2, 3, 4, 5}}},
      {"...i->i", {{2, 3, 4}}}, {"b...,b...->b", {{3, 2, 1}, {3, 1, 4}}}, {"ij,j->i", {{4, 1}, {5}}}, {"ij->ij", {}},
      {"abij,abkj->abik", {}}, {"abik,abkd->abid", {}}, {"aibj,ajbk->abik", {}}};
  for (const Case& cs : cases) {
    const std::string& eq = cs.eq;
    SCOPED_TRACE(eq);
    const auto arrow = eq.find("->");
    std::vector<std::string> terms;
    for (size_t p = 0;;) {
      const size_t c = eq.find(',', p);
      terms.push_back(eq.substr(p, std::min(c, arrow) - p));
      if (c == std::string::npos || c > arrow) break;
      p = c + 1;
    }
    std::vector<std::vector<int64_t>> shapes = cs.shapes;
    if (shapes.empty())
      for (auto& t : terms) {
        shapes.emplace_back();
        for (char c : t) shapes.back().push_back(dim.at(c));
      }
    // Ellipses become the capitals A, B, ... (right-aligned); each letter's size broadcasts.
    size_t ell = 0;
    for (size_t t = 0; t < terms.size(); ++t)
      if (terms[t].find("...") != std::string::npos) ell = std::max(ell, shapes[t].size() - (terms[t].size() - 3));
    auto expand = [&](std::string t, size_t dims) {
      const size_t p = t.find("...");
      if (p == std::string::npos) return t;
      std::string caps;
      for (size_t k = ell - dims; k < ell; ++k) caps += static_cast<char>('A' + k);
      return t.replace(p, 3, caps);
    };
    for (size_t t = 0; t < terms.size(); ++t)
      terms[t] = expand(terms[t], terms[t].find("...") == std::string::npos ? 0 : shapes[t].size() - (terms[t].size() - 3));
    std::map<char, int64_t> size;
    std::map<char, int> count;
    for (size_t t = 0; t < terms.size(); ++t)
      for (size_t k = 0; k < terms[t].size(); ++k) {
        ++count[terms[t][k]];
        size[terms[t][k]] = std::max(size[terms[t][k]], shapes[t][k]);
      }
    std::string outT;
    if (arrow != std::string::npos) {
      outT = expand(eq.substr(arrow + 2), ell);
    } else {
      for (size_t k = 0; k < ell; ++k) outT += static_cast<char>('A' + k);
      for (auto [c, k] : count)
        if (k == 1 && std::islower(static_cast<unsigned char>(c))) outT += c;
    }
    std::vector<int64_t> outShape;
    for (char c : outT) outShape.push_back(size.at(c));
    TempDir d;
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    std::vector<std::string> names;
    std::vector<std::vector<float>> vals;
    for (size_t t = 0; t < terms.size(); ++t) {
      names.push_back("x" + std::to_string(t));
      int64_t n = 1;
      for (auto v : shapes[t]) n *= v;
      vals.push_back(ramp(static_cast<size_t>(n) + t, 1.0f + static_cast<float>(t)));
      vals.back().resize(static_cast<size_t>(n));
      addFloatInit(g, names.back(), shapes[t], vals.back());
    }
    auto* n = addNode(g, "Einsum", names, {"y"}, "einsum");
    stringAttr(n, "equation", eq);
    addOutput(g, "y");
    writeModel(d.file("m.onnx"), m);
    auto gr = importOnnxFile(d.file("m.onnx"));
    EXPECT_EQ(gr->outputs()[0]->type().shape, outShape);
    Tensor y = evalOne(*gr, {});
    // Naive: every assignment of every letter; a dim of 1 reads index 0.
    std::string letters;
    for (auto& t : terms)
      for (char c : t)
        if (letters.find(c) == std::string::npos) letters += c;
    std::vector<double> want(static_cast<size_t>(std::max<int64_t>(y.numel(), 1)), 0.0);
    std::map<char, int64_t> at;
    for (char c : letters) at[c] = 0;
    auto offset = [&](const std::string& t, const std::vector<int64_t>& shape) {
      int64_t o = 0;
      for (size_t k = 0; k < t.size(); ++k) o = o * shape[k] + (shape[k] == 1 ? 0 : at[t[k]]);
      return o;
    };
    for (bool more = true; more;) {
      double p = 1;
      for (size_t t = 0; t < terms.size(); ++t) p *= vals[t][static_cast<size_t>(offset(terms[t], shapes[t]))];
      want[static_cast<size_t>(offset(outT, outShape))] += p;
      more = false;
      for (size_t k = letters.size(); k-- > 0;) {
        if (++at[letters[k]] < size.at(letters[k])) {
          more = true;
          break;
        }
        at[letters[k]] = 0;
      }
    }
    ASSERT_EQ(y.numel(), static_cast<int64_t>(want.size()));
    for (int64_t i = 0; i < y.numel(); ++i) EXPECT_NEAR(y.getDouble(i), want[i], 1e-4 * (1 + std::abs(want[i]))) << i;
  }
  struct Bad {
    const char* eq;
    std::vector<std::vector<int64_t>> shapes;
    const char* why;
  };
  for (const Bad& b : {Bad{"ij,jk->ik", {{4, 5}, {6, 3}}, "letter 'j' is 5 and 6, which do not broadcast"},
                       Bad{"ij->i", {{4, 5, 6}}, "term 'ij' has 2 letters for input 0"},
                       Bad{"...ij,...jk->...ik", {{2, 4, 5}, {3, 5, 3}}, "an ellipsis dim is 2 and 3"},
                       Bad{"ii->i", {{1, 4}}, "the diagonal of 'i' is over dims of 1 and 4"},
                       Bad{"i.j->i", {{4, 5}}, "bad equation"}}) {
    SCOPED_TRACE(b.eq);
    TempDir d;
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    std::vector<std::string> names;
    for (size_t t = 0; t < b.shapes.size(); ++t) {
      names.push_back("x" + std::to_string(t));
      int64_t n = 1;
      for (auto v : b.shapes[t]) n *= v;
      addFloatInit(g, names.back(), b.shapes[t], ramp(static_cast<size_t>(n), 1.0f));
    }
    auto* n = addNode(g, "Einsum", names, {"y"}, "einsum_node");
    stringAttr(n, "equation", b.eq);
    addOutput(g, "y");
    writeModel(d.file("m.onnx"), m);
    expectImportError(d.file("m.onnx"), {"node 'einsum_node' (Einsum)", b.why});
  }
}

// fuse-attention on `fused` (for the cpu target) makes one Attention and leaves no Softmax, and its
// one output is `plain`'s (the same model as imported), within 1e-5: that output.
static Tensor fusedLikePlain(Graph& fused, Graph& plain) {
  EXPECT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(fused));
  int attention = 0, softmax = 0;
  for (const auto& n : fused.nodes()) attention += n->op() == "Attention", softmax += n->op() == "Softmax";
  EXPECT_EQ(attention, 1);
  EXPECT_EQ(softmax, 0);
  const Tensor a = evalOne(fused, {}), b = evalOne(plain, {});
  EXPECT_EQ(a.type.str(), b.type.str());
  for (int64_t e = 0; e < a.numel() && e < b.numel(); ++e) EXPECT_NEAR(a.getDouble(e), b.getDouble(e), 1e-5) << e;
  return a;
}

// Attention written with torch.einsum ("bhqd,bhkd->bhqk", then "bhqk,bhkd->bhqd", as XLNet, Funnel
// and hand-written models do): the lowering keeps the batch letters as dims and names its last node,
// so the products are the plain MatMuls fuse-attention takes, and the fused graph gives the same
// values. Before, each product sat between Reshapes and an Identity, and nothing fused.
TEST(OnnxImport, EinsumAttentionFuses) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  for (const char* n : {"q", "k", "v"}) addFloatInit(g, n, {2, 3, 5, 4}, ramp(120, n[0] == 'q' ? 1.0f : n[0] == 'k' ? 0.8f : 1.3f));
  stringAttr(addNode(g, "Einsum", {"q", "k"}, {"s"}, "qk"), "equation", "bhqd,bhkd->bhqk");
  auto* c = addNode(g, "Constant", {}, {"c"}, "half");  // a constant scale (an initializer would be a parameter)
  auto* value = c->add_attribute();
  value->set_name("value");
  value->set_type(onnx::AttributeProto::TENSOR);
  value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  value->mutable_t()->add_float_data(0.5f);
  addNode(g, "Mul", {"s", "c"}, {"ss"}, "scale");
  intAttr(addNode(g, "Softmax", {"ss"}, {"p"}, "softmax"), "axis", -1);
  stringAttr(addNode(g, "Einsum", {"p", "v"}, {"o"}, "pv"), "equation", "bhqk,bhkd->bhqd");
  addOutput(g, "o");
  writeModel(d.file("einsum_attention.onnx"), m);
  auto fused = importOnnxFile(d.file("einsum_attention.onnx")), plain = importOnnxFile(d.file("einsum_attention.onnx"));
  const Tensor a = fusedLikePlain(*fused, *plain);
  ASSERT_EQ(a.type.str(), "f32[2,3,5,4]");
}

// Opset 23's RotaryEmbedding and Attention, lowered at import, against their definitions written
// here in double: halves and interleaved pairs, partial rotation, 3-D inputs, position ids or per-
// batch caches; grouped-query heads, bool and float masks, causal with a past, softcap, 3-D inputs.
namespace {
onnx::TensorProto* addInit(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims, int type,
                           const std::vector<double>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(type);
  for (auto d : dims) t->add_dims(d);
  for (double x : v) {
    if (type == onnx::TensorProto::FLOAT) t->add_float_data(static_cast<float>(x));
    else if (type == onnx::TensorProto::INT64) t->add_int64_data(static_cast<int64_t>(x));
    else t->add_int32_data(static_cast<int32_t>(x));  // BOOL
  }
  return t;
}
std::vector<double> wave(size_t n, double scale, double phase = 0.3) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(scale * std::sin(0.61 * static_cast<double>(i) + phase));
  return v;
}
int64_t prod(const std::vector<int64_t>& s) {
  int64_t p = 1;
  for (auto d : s) p *= d;
  return p;
}
}  // namespace

// A tensor the forward creates (torch.tensor(torch.finfo(dtype).min), GPT-Neo's mask fill), which
// torch.export lifts and the dynamo exporter writes as an initializer `<module path>.lifted_tensor_N`:
// imported as a constant, never a parameter, so the Where mask over it fuses (before, the fill was
// a trainable initializer and the attention stayed unfused) and the fused graph gives the same
// values. One the model's ampc.trainable list names stays a parameter.
TEST(OnnxImport, LiftedTensorConstantsAreConstants) {
  TempDir d;
  auto m = newModel(18);
  auto* g = m.mutable_graph();
  for (const char* n : {"q", "k", "v"}) addFloatInit(g, n, {2, 3, 5, 4}, ramp(120, n[0] == 'q' ? 1.0f : n[0] == 'k' ? 0.8f : 1.3f));
  addFloatInit(g, "h.0.attn.lifted_tensor_3", {}, {-3.4028234663852886e38f});
  addFloatInit(g, "_tensor_constant0", {}, {0.25f});
  std::vector<double> causal;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) causal.push_back(j <= i);
  addInit(g, "causal", {1, 1, 5, 5}, onnx::TensorProto::BOOL, causal);
  stringAttr(addNode(g, "Einsum", {"q", "k"}, {"s"}, "qk"), "equation", "bhqd,bhkd->bhqk");
  addNode(g, "Mul", {"s", "_tensor_constant0"}, {"ss"}, "scale");
  addNode(g, "Identity", {"h.0.attn.lifted_tensor_3"}, {"fill"}, "clone");
  addNode(g, "Where", {"causal", "ss", "fill"}, {"masked"}, "where");
  intAttr(addNode(g, "Softmax", {"masked"}, {"p"}, "softmax"), "axis", -1);
  stringAttr(addNode(g, "Einsum", {"p", "v"}, {"o"}, "pv"), "equation", "bhqk,bhkd->bhqd");
  addOutput(g, "o");
  writeModel(d.file("lifted.onnx"), m);
  auto fused = importOnnxFile(d.file("lifted.onnx")), plain = importOnnxFile(d.file("lifted.onnx"));
  auto params = [](const Graph& g) {
    std::set<std::string> s;
    for (const Value* p : g.params()) s.insert(p->name());
    return s;
  };
  EXPECT_EQ(params(*plain), (std::set<std::string>{"q", "k", "v", "causal"}));  // the lifted ones are constants (folded at import)
  const Tensor a = fusedLikePlain(*fused, *plain);
  ASSERT_EQ(a.type.str(), "f32[2,3,5,4]");
  // Query 0 sees key 0 only (the fill masked the rest): its output is V's row 0.
  const Tensor& v = *plain->lookup("v")->data();
  for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(a.getDouble(c), v.getDouble(c), 1e-6);
  auto* meta = m.add_metadata_props();
  meta->set_key("ampc.trainable");
  meta->set_value("[\"q\", \"_tensor_constant0\"]");
  writeModel(d.file("listed.onnx"), m);
  auto listed = importOnnxFile(d.file("listed.onnx"));
  EXPECT_EQ(params(*listed), (std::set<std::string>{"q", "k", "v", "causal", "_tensor_constant0"}));
  // torch.max(x, torch.tensor(c)) shares a tie's gradient (torch.maximum's rule): a Max over a
  // lifted constant (through its clone) is marked so (ampc_ties_shared); a Max over a plain constant
  // is a clamp's bound, not marked.
  auto mm = newModel(18);
  auto* mg = mm.mutable_graph();
  addTensorInput(mg, "x", onnx::TensorProto::FLOAT, {3});
  addFloatInit(mg, "m.lifted_tensor_0", {}, {0.5f});
  auto* cn = addNode(mg, "Constant", {}, {"c"}, "bound");
  auto* cv = cn->add_attribute();
  cv->set_name("value");
  cv->set_type(onnx::AttributeProto::TENSOR);
  cv->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
  cv->mutable_t()->add_float_data(0.5f);
  addNode(mg, "Identity", {"m.lifted_tensor_0"}, {"t"}, "clone");
  addNode(mg, "Max", {"x", "t"}, {"a"}, "maximum");
  addNode(mg, "Max", {"x", "c"}, {"b"}, "clamp");
  addNode(mg, "Add", {"a", "b"}, {"y"}, "sum");
  addOutput(mg, "y");
  writeModel(d.file("max.onnx"), mm);
  auto maxes = importOnnxFile(d.file("max.onnx"));
  int shared = 0, clamps = 0;
  for (const auto& n : maxes->nodes())
    if (n->op() == "Max") (n->getInt(kTiesShared, 0) ? shared : clamps) += 1;
  EXPECT_EQ(shared, 1);
  EXPECT_EQ(clamps, 1);
}

namespace {
// Imports the single-node opset-23 model and evaluates output 0 against want(i).
void checkNode(onnx::ModelProto& m, const std::function<double(int64_t)>& want, const std::vector<int64_t>& shape) {
  TempDir d;
  addOutput(m.mutable_graph(), "y");
  writeModel(d.file("m.onnx"), m);
  auto g = importOnnxFile(d.file("m.onnx"));
  ASSERT_EQ(g->outputs()[0]->type().shape, shape);
  Tensor y = evalOne(*g, {});
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.getDouble(i), want(i), 2e-5 * (1 + std::abs(want(i)))) << "element " << i;
}
}  // namespace

TEST(OnnxImport, RotaryEmbeddingMatchesItsDefinition) {
  const int64_t B = 2, H = 3, S = 4, P = 6;
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    const bool interleaved = variant == 1, threeD = variant == 2, withPos = variant != 2;
    const int64_t D = variant == 2 ? 6 : 8, rot = variant == 1 ? 4 : D;
    auto m = newModel(23);
    auto* g = m.mutable_graph();
    const std::vector<int64_t> xs = threeD ? std::vector<int64_t>{B, S, H * D} : std::vector<int64_t>{B, H, S, D};
    const auto x = wave(static_cast<size_t>(prod(xs)), 1.0);
    addInit(g, "x", xs, onnx::TensorProto::FLOAT, x);
    const std::vector<int64_t> cs = withPos ? std::vector<int64_t>{P, rot / 2} : std::vector<int64_t>{B, S, rot / 2};
    const auto cosv = wave(static_cast<size_t>(prod(cs)), 1.0, 0.1), sinv = wave(static_cast<size_t>(prod(cs)), 1.0, 1.7);
    addInit(g, "cos", cs, onnx::TensorProto::FLOAT, cosv);
    addInit(g, "sin", cs, onnx::TensorProto::FLOAT, sinv);
    const std::vector<double> pos = {5, 0, 2, 2, 1, 3, 4, 0};
    std::vector<std::string> ins{"x", "cos", "sin"};
    if (withPos) {
      addInit(g, "pos", {B, S}, onnx::TensorProto::INT64, pos);
      ins.push_back("pos");
    }
    auto* n = addNode(g, "RotaryEmbedding", ins, {"y"}, "rope");
    intAttr(n, "interleaved", interleaved);
    if (rot != D) intAttr(n, "rotary_embedding_dim", rot);
    if (threeD) intAttr(n, "num_heads", H);
    checkNode(m, [&](int64_t i) {
      int64_t b, h, t, dd;  // element i as (b, h, s, d)
      if (threeD) b = i / (S * H * D), t = i / (H * D) % S, h = i / D % H, dd = i % D;
      else b = i / (H * S * D), h = i / (S * D) % H, t = i / D % S, dd = i % D;
      auto X = [&](int64_t e) { return threeD ? x[((b * S + t) * H + h) * D + e] : x[((b * H + h) * S + t) * D + e]; };
      if (dd >= rot) return X(dd);
      const int64_t row = withPos ? static_cast<int64_t>(pos[b * S + t]) : b * S + t;
      const int64_t j = interleaved ? dd / 2 : dd % (rot / 2);
      const double c = cosv[row * (rot / 2) + j], sn = sinv[row * (rot / 2) + j];
      const double x1 = interleaved ? X(2 * j) : X(j), x2 = interleaved ? X(2 * j + 1) : X(j + rot / 2);
      const bool first = interleaved ? dd % 2 == 0 : dd < rot / 2;
      return first ? c * x1 - sn * x2 : sn * x1 + c * x2;
    }, xs);
  }
}

TEST(OnnxImport, AttentionMatchesItsDefinition) {
  struct Case {
    int64_t B, Hq, Hk, Sq, Sk, D, past;
    bool threeD, causal;
    int mask;  // 0 none, 1 bool [Sq, Sk], 2 float [B, 1, Sq, Sk]
    float softcap, scale;
  };
  const Case cases[] = {{2, 4, 2, 3, 5, 4, 0, false, false, 1, 0, 0},   {1, 2, 2, 4, 4, 8, 0, false, true, 0, 2.0f, 0},
                        {2, 4, 2, 3, 3, 4, 0, true, true, 2, 0, 0.3f}, {1, 2, 1, 2, 5, 4, 3, false, true, 0, 0, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE("case Hq " + std::to_string(c.Hq) + " Sk " + std::to_string(c.Sk));
    auto m = newModel(23);
    auto* g = m.mutable_graph();
    const int64_t Snew = c.Sk - c.past;
    auto shp = [&](int64_t h, int64_t s) {
      return c.threeD ? std::vector<int64_t>{c.B, s, h * c.D} : std::vector<int64_t>{c.B, h, s, c.D};
    };
    const auto q = wave(static_cast<size_t>(prod(shp(c.Hq, c.Sq))), 1.0, 0.2), k = wave(static_cast<size_t>(prod(shp(c.Hk, Snew))), 1.0, 0.9),
               v = wave(static_cast<size_t>(prod(shp(c.Hk, Snew))), 1.0, 2.1);
    addInit(g, "q", shp(c.Hq, c.Sq), onnx::TensorProto::FLOAT, q);
    addInit(g, "k", shp(c.Hk, Snew), onnx::TensorProto::FLOAT, k);
    addInit(g, "v", shp(c.Hk, Snew), onnx::TensorProto::FLOAT, v);
    std::vector<std::string> ins{"q", "k", "v"};
    std::vector<double> mask;
    if (c.mask == 1) {
      for (int64_t i = 0; i < c.Sq * c.Sk; ++i) mask.push_back((i * 7 % 5) != 1 || i % c.Sk == 0);
      addInit(g, "mask", {c.Sq, c.Sk}, onnx::TensorProto::BOOL, mask);
    } else if (c.mask == 2) {
      mask = wave(static_cast<size_t>(c.B * c.Sq * c.Sk), 0.8, 0.5);
      addInit(g, "mask", {c.B, 1, c.Sq, c.Sk}, onnx::TensorProto::FLOAT, mask);
    }
    ins.push_back(c.mask ? "mask" : "");
    std::vector<double> pk, pv;
    if (c.past) {
      pk = wave(static_cast<size_t>(c.B * c.Hk * c.past * c.D), 1.0, 1.3);
      pv = wave(static_cast<size_t>(c.B * c.Hk * c.past * c.D), 1.0, 0.4);
      addInit(g, "pk", {c.B, c.Hk, c.past, c.D}, onnx::TensorProto::FLOAT, pk);
      addInit(g, "pv", {c.B, c.Hk, c.past, c.D}, onnx::TensorProto::FLOAT, pv);
      ins.push_back("pk");
      ins.push_back("pv");
    }
    auto* n = addNode(g, "Attention", ins, {"y"}, "attn");
    if (c.causal) intAttr(n, "is_causal", 1);
    if (c.threeD) intAttr(n, "q_num_heads", c.Hq), intAttr(n, "kv_num_heads", c.Hk);
    if (c.softcap > 0) floatAttr(n, "softcap", c.softcap);
    if (c.scale > 0) floatAttr(n, "scale", c.scale);
    // The definition: element (b, h, i, d) of Y.
    auto at = [&](const std::vector<double>& t, int64_t H, int64_t S, int64_t b, int64_t h, int64_t s, int64_t d) {
      return c.threeD ? t[((b * S + s) * H + h) * c.D + d] : t[((b * H + h) * S + s) * c.D + d];
    };
    auto K = [&](const std::vector<double>& cur, const std::vector<double>& past, int64_t b, int64_t h, int64_t j, int64_t d) {
      return j < c.past ? past[((b * c.Hk + h) * c.past + j) * c.D + d] : at(cur, c.Hk, Snew, b, h, j - c.past, d);
    };
    const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
    auto want = [&](int64_t idx) {
      int64_t b, h, i, dd;
      if (c.threeD) b = idx / (c.Sq * c.Hq * c.D), i = idx / (c.Hq * c.D) % c.Sq, h = idx / c.D % c.Hq, dd = idx % c.D;
      else b = idx / (c.Hq * c.Sq * c.D), h = idx / (c.Sq * c.D) % c.Hq, i = idx / c.D % c.Sq, dd = idx % c.D;
      const int64_t kh = h / (c.Hq / c.Hk);
      std::vector<double> sc(static_cast<size_t>(c.Sk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < c.Sk; ++j) {
        double s = 0;
        for (int64_t e = 0; e < c.D; ++e) s += at(q, c.Hq, c.Sq, b, h, i, e) * K(k, pk, b, kh, j, e);
        s *= scale;
        if (c.softcap > 0) s = c.softcap * std::tanh(s / c.softcap);
        if (c.mask == 1 && !mask[i * c.Sk + j]) s = -INFINITY;
        if (c.mask == 2) s += mask[(b * c.Sq + i) * c.Sk + j];
        if (c.causal && j > i + c.past) s = -INFINITY;
        sc[j] = s;
        mx = std::max(mx, s);
      }
      double z = 0, y = 0;
      for (int64_t j = 0; j < c.Sk; ++j) z += std::exp(sc[j] - mx);
      for (int64_t j = 0; j < c.Sk; ++j) y += std::exp(sc[j] - mx) / z * K(v, pv, b, kh, j, dd);
      return y;
    };
    checkNode(m, want, shp(c.Hq, c.Sq));
    if (c.softcap == 0) {  // the lowering is the form fuse-attention takes: one ampc.Attention
      TempDir d;
      writeModel(d.file("m.onnx"), m);
      auto imported = importOnnxFile(d.file("m.onnx"));
      EXPECT_TRUE(createFuseAttentionPass(findTarget("cpu"))->run(*imported));
      int fused = 0, softmax = 0;
      for (const auto& n : imported->nodes()) fused += n->op() == "Attention", softmax += n->op() == "Softmax";
      EXPECT_EQ(fused, 1);
      EXPECT_EQ(softmax, 0);
      const Tensor y = evalOne(*imported, {});
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.getDouble(i), want(i), 2e-5 * (1 + std::abs(want(i)))) << "fused, element " << i;
    }
  }
}

// GroupNormalization (scale per group before opset 21, per channel from 21), InstanceNormalization
// and RMSNormalization (opset 23) against their definitions, computed here in double; the import of
// RMSNormalization then fuses back into one ampc.RmsNorm (fuse-rms-norm) with the same results.
TEST(OnnxImport, NormCompositionsMatchTheirDefinitions) {
  const int64_t N = 2, C = 4, S = 3, G = 2;
  Tensor x(TensorType{DType::f32, {N, C, S}});
  auto xv = ramp(N * C * S, 3.0f);
  for (int64_t i = 0; i < x.numel(); ++i) x.setDouble(i, xv[i]);
  auto check = [&](int opset, const std::string& op, int64_t params, auto want) {
    SCOPED_TRACE(op + " at opset " + std::to_string(opset));
    TempDir d;
    auto m = newModel(opset);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {N, C, S});
    addFloatInit(g, "s", {params}, ramp(params, 1.5f));
    std::vector<std::string> ins{"x", "s"};
    if (op != "RMSNormalization") {
      addFloatInit(g, "b", {params}, ramp(params + 3, 0.5f));
      g->mutable_initializer(1)->clear_float_data();
      for (int64_t i = 0; i < params; ++i) g->mutable_initializer(1)->add_float_data(0.1f * static_cast<float>(i) - 0.2f);
      ins.push_back("b");
    }
    auto* n = addNode(g, op, ins, {"y"}, "norm");
    if (op == "GroupNormalization") intAttr(n, "num_groups", G);
    floatAttr(n, "epsilon", 1e-3f);
    addOutput(g, "y");
    writeModel(d.file("m.onnx"), m);
    auto gr = importOnnxFile(d.file("m.onnx"));
    Tensor y = evalOne(*gr, {{"x", x}});
    double worst = 0;
    for (int64_t i = 0; i < y.numel(); ++i) worst = std::max(worst, std::abs(y.getDouble(i) - want(i)));
    EXPECT_LT(worst, 2e-5);
    if (op != "RMSNormalization") return;
    ASSERT_TRUE(createFuseRmsNormPass(findTarget("cpu"))->run(*gr));
    int rms = 0;
    for (const auto& k : gr->nodes()) {  // the RmsNorm and the import's Cast of x to its stash type
      rms += k->op() == "RmsNorm";
      EXPECT_TRUE(k->op() == "RmsNorm" || k->op() == "Cast") << k->describe();
    }
    EXPECT_EQ(rms, 1);
    y = evalOne(*gr, {{"x", x}});
    worst = 0;
    for (int64_t i = 0; i < y.numel(); ++i) worst = std::max(worst, std::abs(y.getDouble(i) - want(i)));
    EXPECT_LT(worst, 2e-5) << "fused";
  };
  auto sc = ramp(C, 1.5f);
  auto stats = [&](int64_t n, int64_t c0, int64_t c1, bool rms) {  // over channels [c0, c1) of sample n, every position
    double s = 0, q = 0, k = 0;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t p = 0; p < S; ++p) {
        const double v = x.getDouble((n * C + c) * S + p);
        s += v, q += v * v, ++k;
      }
    const double mean = rms ? 0 : s / k;
    return std::pair{mean, q / k - mean * mean};
  };
  auto bias = [](int64_t i) { return 0.1 * static_cast<double>(i) - 0.2; };
  auto at = [&](int64_t i, int64_t& n, int64_t& c) { n = i / (C * S), c = (i / S) % C; };
  for (int opset : {18, 21}) {
    const bool perGroup = opset < 21;
    auto gsc = ramp(G, 1.5f);
    check(opset, "GroupNormalization", perGroup ? G : C, [&](int64_t i) {
      int64_t n, c;
      at(i, n, c);
      const int64_t grp = c / (C / G);
      auto [mean, var] = stats(n, grp * (C / G), (grp + 1) * (C / G), false);
      const double z = (x.getDouble(i) - mean) / std::sqrt(var + static_cast<double>(1e-3f));
      return perGroup ? z * gsc[grp] + bias(grp) : z * sc[c] + bias(c);
    });
  }
  check(17, "InstanceNormalization", C, [&](int64_t i) {
    int64_t n, c;
    at(i, n, c);
    auto [mean, var] = stats(n, c, c + 1, false);
    return (x.getDouble(i) - mean) / std::sqrt(var + static_cast<double>(1e-3f)) * sc[c] + bias(c);
  });
  check(13, "InstanceNormalization", C, [&](int64_t i) {  // before LayerNormalization: written out
    int64_t n, c;
    at(i, n, c);
    auto [mean, var] = stats(n, c, c + 1, false);
    return (x.getDouble(i) - mean) / std::sqrt(var + static_cast<double>(1e-3f)) * sc[c] + bias(c);
  });
  auto rsc = ramp(S, 1.5f);
  check(23, "RMSNormalization", S, [&](int64_t i) {  // over the last axis
    double q = 0;
    for (int64_t p = 0; p < S; ++p) q += x.getDouble(i / S * S + p) * x.getDouble(i / S * S + p) / S;
    return x.getDouble(i) / std::sqrt(q + static_cast<double>(1e-3f)) * rsc[i % S];
  });
}

// The trainable set: the model's ampc.trainable list (the export helper writes it from
// named_parameters()), else every float initializer but masks (Inf/NaN) and op state; --trainable
// and --freeze over either.
TEST(OnnxImport, TrainableSetFollowsTheModel) {
  TempDir d;
  auto m = newModel(18);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 2});
  addFloatInit(g, "w", {2, 2}, {1, 2, 3, 4});
  addFloatInit(g, "pos", {2, 2}, {0.5, 0.5, 0.5, 0.5});                       // a registered buffer
  addFloatInit(g, "mask", {2, 2}, {0, -INFINITY, 0, 0});                      // a causal mask
  addNode(g, "MatMul", {"x", "w"}, {"h"}, "mm");
  addNode(g, "Add", {"h", "pos"}, {"h2"}, "addpos");
  addNode(g, "Add", {"h2", "mask"}, {"h3"}, "addmask");
  addNode(g, "ReduceSum", {"h3"}, {"loss"}, "sum");
  intAttr(g->mutable_node(3), "keepdims", 0);
  addOutput(g, "loss");
  auto names = [](const std::vector<Value*>& v) {
    std::string s;
    for (const Value* p : v) s += (s.empty() ? "" : ",") + p->name();
    return s;
  };
  writeModel(d.file("plain.onnx"), m);
  auto plain = importOnnxFile(d.file("plain.onnx"));
  EXPECT_FALSE(plain->declaredTrainable.has_value());
  EXPECT_EQ(names(trainableParams(*plain, {})), "w,pos");  // the mask holds -inf: not a parameter
  auto* meta = m.add_metadata_props();
  meta->set_key("ampc.trainable");
  meta->set_value("[\"w\"]");
  writeModel(d.file("listed.onnx"), m);
  auto listed = importOnnxFile(d.file("listed.onnx"));
  EXPECT_EQ(names(trainableParams(*listed, {})), "w");
  EXPECT_TRUE(listedButUntrained(*listed, {}).empty());
  // Listed, but reaching the loss only through Shape (no gradient), or not an initializer at all:
  // named, as a path the export may have cut.
  {
    auto m2 = newModel(18);
    auto* g2 = m2.mutable_graph();
    addFloatInit(g2, "w", {3}, {1, 2, 3});
    addFloatInit(g2, "picked", {3}, {1, 5, 3});
    addNode(g2, "ArgMax", {"picked"}, {"at"}, "argmax");
    intAttr(g2->mutable_node(0), "keepdims", 0);
    addNode(g2, "Cast", {"at"}, {"atf"}, "cast");
    intAttr(g2->mutable_node(1), "to", onnx::TensorProto::FLOAT);
    addNode(g2, "ReduceSum", {"w"}, {"s"}, "sum");
    intAttr(g2->mutable_node(2), "keepdims", 0);
    addNode(g2, "Add", {"s", "atf"}, {"loss"}, "add");
    addOutput(g2, "loss");
    auto* meta2 = m2.add_metadata_props();
    meta2->set_key("ampc.trainable");
    meta2->set_value("[\"w\", \"picked\", \"gone\"]");
    writeModel(d.file("idle.onnx"), m2);
    auto idle = importOnnxFile(d.file("idle.onnx"));
    EXPECT_EQ(names(trainableParams(*idle, {})), "w");
    EXPECT_EQ(listedButUntrained(*idle, {}), (std::vector<std::string>{"picked", "gone"}));
  }
  AutodiffOptions only;
  only.trainable = "pos|mask";
  EXPECT_EQ(names(trainableParams(*listed, only)), "pos,mask");
  only.freeze = "mask";
  EXPECT_EQ(names(trainableParams(*listed, only)), "pos");
  meta->set_value("[\"w\", broken");
  writeModel(d.file("bad.onnx"), m);
  expectImportError(d.file("bad.onnx"), {"ampc.trainable", "not a JSON list"});
}

// nn.Embedding(padding_idx=p) as the export helper records it (metadata "ampc.embedding_padding"):
// the lookups of row p give the table no gradient, its other uses (a tied projection) still do,
// as in PyTorch. The key and "ampc.trainable" survive export and import (a plan's step graph is
// built from the exported forward), and a key naming no 2-D initializer row is refused.
TEST(OnnxImport, EmbeddingPaddingRowGetsNoLookupGradient) {
  TempDir d;
  auto make = [&](const std::string& padding) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "idx", onnx::TensorProto::INT64, {6});
    addFloatInit(g, "table", {4, 3}, std::vector<float>(12, 0.5f));
    addFloatInit(g, "buf", {3}, {1, 2, 3});
    addNode(g, "Gather", {"table", "idx"}, {"e"}, "lookup");
    addNode(g, "Add", {"e", "buf"}, {"eb"}, "add");
    addNode(g, "ReduceSum", {"eb"}, {"s1"}, "sum1");
    addNode(g, "ReduceSum", {"table"}, {"s2"}, "sum2");  // the table's other use: every row gets 1
    addNode(g, "Add", {"s1", "s2"}, {"loss"}, "loss");
    addOutput(g, "loss");
    auto* t = m.add_metadata_props();
    t->set_key("ampc.trainable");
    t->set_value("[\"table\"]");
    if (!padding.empty()) {
      auto* p = m.add_metadata_props();
      p->set_key("ampc.embedding_padding");
      p->set_value(padding);
    }
    const std::string path = d.file("emb" + std::to_string(std::hash<std::string>{}(padding)) + ".onnx");
    writeModel(path, m);
    return path;
  };
  Tensor idx = Tensor::fromInts(DType::i64, {6}, {0, 2, 0, 3, 2, 2});
  auto grads = [&](std::unique_ptr<Graph> g) {
    createAutodiffPass()->run(*g);
    EXPECT_EQ(g->outputs().size(), 2u) << "the loss and table_grad: buf is a buffer";
    auto backend = createCpuBackend();
    return evaluate(*g, {{"idx", idx}}, *backend).back();
  };
  const Tensor plain = grads(importOnnxFile(make(""))), padded = grads(importOnnxFile(make("{\"table\": 0}")));
  const double count[4] = {2, 0, 3, 1};
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      EXPECT_EQ(plain.getDouble(r * 3 + c), count[r] + 1) << r;
      EXPECT_EQ(padded.getDouble(r * 3 + c), r == 0 ? 1.0 : count[r] + 1) << r;  // row 0: the ReduceSum's 1 only
    }
  // Export and import again (what a plan does): the same gradient, the same trainable set.
  auto g = importOnnxFile(make("{\"table\": 0}"));
  writeModel(d.file("round.onnx"), exportOnnx(*g));
  auto again = importOnnxFile(d.file("round.onnx"));
  EXPECT_EQ(again->embeddingPadding, (std::map<std::string, int64_t>{{"table", 0}}));
  ASSERT_TRUE(again->declaredTrainable.has_value());
  EXPECT_EQ(*again->declaredTrainable, std::vector<std::string>{"table"});
  const Tensor round = grads(std::move(again));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(round.getDouble(i), padded.getDouble(i));
  expectImportError(make("{\"table\": 4}"), {"row 4 of 'table'"});
  expectImportError(make("{\"nope\": 0}"), {"'nope', which is not an initializer"});
  expectImportError(make("[0]"), {"'ampc.embedding_padding' is not a JSON object"});
  // Without the metadata, ImportOptions::embeddingPadding (ampc --embedding-padding) says the same.
  ImportOptions opts;
  opts.embeddingPadding["table"] = 0;
  const Tensor byOption = grads(importOnnxFile(make(""), opts));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(byOption.getDouble(i), padded.getDouble(i)) << i;
  opts.embeddingPadding["table"] = 7;
  expectImportError(make(""), {"--embedding-padding: row 7 of 'table'"}, opts);
}

// A looked-up table with exactly one all-zero row (how nn.Embedding(padding_idx=R) starts) and no
// padding declared gets an import note naming the table, the row and --embedding-padding; a table
// with no zero row, or with two, gets none, and neither does one whose padding is declared.
TEST(OnnxImport, PaddingLikeZeroRowIsNoted) {
  TempDir d;
  auto notes = [&](const std::vector<float>& table, const std::string& file, const ImportOptions& opts = {}) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "idx", onnx::TensorProto::INT64, {3});
    addFloatInit(g, "emb", {3, 2}, table);
    addNode(g, "Gather", {"emb", "idx"}, {"e"}, "lookup");
    addNode(g, "ReduceSum", {"e"}, {"loss"}, "sum");
    addOutput(g, "loss");
    writeModel(d.file(file), m);
    return importOnnxFile(d.file(file), opts)->importNotes;
  };
  const auto one = notes({1, 2, 0, 0, 3, 4}, "one.onnx");
  ASSERT_EQ(one.size(), 1u);
  for (const char* want : {"embedding table 'emb'", "all-zero row, 1", "padding_idx=1", "--embedding-padding emb=1"})
    EXPECT_NE(one[0].find(want), std::string::npos) << one[0];
  EXPECT_TRUE(notes({1, 2, 5, 6, 3, 4}, "none.onnx").empty());
  EXPECT_TRUE(notes({0, 0, 0, 0, 3, 4}, "two.onnx").empty());
  ImportOptions opts;
  opts.embeddingPadding["emb"] = 1;
  EXPECT_TRUE(notes({1, 2, 0, 0, 3, 4}, "declared.onnx", opts).empty());
}

// ReduceProd of a constant (PyTorch's var/std count their elements as the product of the reduced
// dims, on a Shape path) folds exactly at import; an int64 product that overflows is an error
// naming the node. (The product of a computed tensor is a composition: ONNX's node tests.)
TEST(OnnxImport, ReduceProdOfAConstantFolds) {
  TempDir d;
  for (const bool overflow : {false, true}) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
    addInt64Init(g, "dims", overflow ? std::vector<int64_t>{int64_t{1} << 40, int64_t{1} << 40} : std::vector<int64_t>{2, 3, 4});
    auto* prod = addNode(g, "ReduceProd", {"dims"}, {"n"}, "count");
    auto* k = prod->add_attribute();
    k->set_name("keepdims");
    k->set_type(onnx::AttributeProto::INT);
    k->set_i(0);
    auto* cast = addNode(g, "Cast", {"n"}, {"nf"}, "cast");
    auto* to = cast->add_attribute();
    to->set_name("to");
    to->set_type(onnx::AttributeProto::INT);
    to->set_i(onnx::TensorProto::FLOAT);
    addNode(g, "Mul", {"x", "nf"}, {"y"}, "mul");
    addOutput(g, "y");
    const std::string p = d.file(overflow ? "over.onnx" : "prod.onnx");
    writeModel(p, m);
    if (overflow) {
      expectImportError(p, {"node 'count' (ReduceProd)", "overflows int64"});
      continue;
    }
    auto graph = importOnnxFile(p);
    for (const auto& n : graph->nodes()) EXPECT_NE(n->op(), "ReduceProd");
    Tensor y = evalOne(*graph, {{"x", Tensor::fromDoubles(DType::f32, {2}, {1.0, -0.5})}});
    EXPECT_EQ(y.getDouble(0), 24.0);
    EXPECT_EQ(y.getDouble(1), -12.0);
  }
}

// If whose condition folds at import (a test on the input's shape, as TorchScript writes Python
// conditionals): the taken branch is imported in its place, reading outer values and its own
// initializer; both conditions are checked against the branch's own arithmetic. A condition that
// depends on data is refused, naming the node.
TEST(OnnxImport, IfOnAConstantConditionTakesItsBranch) {
  TempDir d;
  for (const int64_t rows : {2, 4}) {  // then (x + 1) * 2 for 2 rows, else x - 5
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {rows, 3});
    addNode(g, "Shape", {"x"}, {"s"}, "shape");
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"zero", 0}, {"two", 2}}) {
      addInt64Init(g, name, {v});
      g->mutable_initializer(g->initializer_size() - 1)->clear_dims();  // a scalar
    }
    addNode(g, "Gather", {"s", "zero"}, {"r"}, "rows");
    addNode(g, "Equal", {"r", "two"}, {"c"}, "is2");
    auto* iff = addNode(g, "If", {"c"}, {"y"}, "branch");
    for (const bool then : {true, false}) {
      auto* a = iff->add_attribute();
      a->set_name(then ? "then_branch" : "else_branch");
      a->set_type(onnx::AttributeProto::GRAPH);
      auto* b = a->mutable_g();
      b->set_name(then ? "then" : "else");
      addFloatInit(b, then ? "one" : "five", {}, {then ? 1.0f : 5.0f});
      if (then) {
        addNode(b, "Add", {"x", "one"}, {"t1"}, "then_add");
        addFloatInit(b, "twice", {}, {2.0f});
        addNode(b, "Mul", {"t1", "twice"}, {"t2"}, "then_mul");
        addOutput(b, "t2");
      } else {
        addNode(b, "Sub", {"x", "five"}, {"e1"}, "else_sub");
        addOutput(b, "e1");
      }
    }
    addOutput(g, "y");
    const std::string p = d.file("if" + std::to_string(rows) + ".onnx");
    writeModel(p, m);
    auto graph = importOnnxFile(p);
    for (const auto& n : graph->nodes()) EXPECT_NE(n->op(), "If");
    std::vector<double> x(static_cast<size_t>(rows * 3));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i + 1);
    Tensor y = evalOne(*graph, {{"x", Tensor::fromDoubles(DType::f32, {rows, 3}, x)}});
    for (int64_t i = 0; i < rows * 3; ++i) EXPECT_EQ(y.getDouble(i), rows == 2 ? (i + 2) * 2.0 : i + 1 - 5.0) << i;
  }
  // A condition computed from the data.
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  addTensorInput(g, "c", onnx::TensorProto::BOOL, {});
  auto* iff = addNode(g, "If", {"c"}, {"y"}, "data_branch");
  for (const char* name : {"then_branch", "else_branch"}) {
    auto* a = iff->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    addNode(a->mutable_g(), "Neg", {"x"}, {std::string(name) + "_y"}, name);
    addOutput(a->mutable_g(), std::string(name) + "_y");
  }
  addOutput(g, "y");
  const std::string p = d.file("if_data.onnx");
  writeModel(p, m);
  expectImportError(p, {"node 'data_branch' (If)", "computed at run time"});
  // The taken branch's nodes have their attributes checked too.
  auto c = newModel(17);
  g = c.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2});
  auto* k = g->add_initializer();
  k->set_name("yes");
  k->set_data_type(onnx::TensorProto::BOOL);
  k->add_int32_data(1);
  iff = addNode(g, "If", {"yes"}, {"y"}, "const_branch");
  for (const char* name : {"then_branch", "else_branch"}) {
    auto* a = iff->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* neg = addNode(a->mutable_g(), "Neg", {"x"}, {std::string(name) + "_y"}, std::string(name) + "_neg");
    auto* bad = neg->add_attribute();
    bad->set_name("alpha");
    bad->set_type(onnx::AttributeProto::FLOAT);
    bad->set_f(2.0f);
    addOutput(a->mutable_g(), std::string(name) + "_y");
  }
  addOutput(g, "y");
  const std::string q = d.file("if_attr.onnx");
  writeModel(q, c);
  expectImportError(q, {"in node 'const_branch' (If)'s then_branch", "node 'then_branch_neg' (Neg) attribute 'alpha' (Neg takes none)"});
}

namespace {
// The graph's gradients (autodiff of its scalar output) against central differences in f64, over
// every element of every trainable parameter; returns the relative L2 error.
double gradientError(const Graph& g) {
  auto gg = parseGraph(printGraph(g), "copy");  // the text form drops data: copy it over
  for (Value* p : g.params()) gg->lookup(p->name())->setData(*p->data());
  for (Value* k : g.consts()) gg->lookup(k->name())->setData(*k->data());
  PassManager pm;
  pm.add(createAutodiffPass());
  pm.run(*gg);
  auto backend = createCpuBackend();
  auto outs = evaluate(*gg, {}, *backend);
  auto loss = [&] { return evaluate(g, {}, *backend)[0].getDouble(0); };
  double num = 0, den = 0;
  size_t k = 1;
  for (Value* p : trainableParams(g, {})) {
    EXPECT_EQ(gg->outputs().at(k)->name(), p->name() + "_grad");
    const Tensor& an = outs.at(k++);
    for (int64_t i = 0; i < p->type().numel(); ++i) {
      Tensor base = *p->data(), t = base;
      const double x = base.getDouble(i), h = 1e-6 * std::max(1.0, std::fabs(x));
      t.setDouble(i, x + h);
      p->setData(t);
      const double lp = loss();
      t.setDouble(i, x - h);
      p->setData(t);
      const double lm = loss();
      p->setData(base);
      const double fd = (lp - lm) / (2 * h);
      num += (fd - an.getDouble(i)) * (fd - an.getDouble(i));
      den += fd * fd;
    }
  }
  EXPECT_GT(k, 1u) << "no trainable parameter";
  return std::sqrt(num / std::max(den, 1e-30));
}
}  // namespace

// Loop with a trip count from a static shape (a scripted for loop, as the TorchScript exporter
// writes it) unrolls: an Elman-style recurrence h = tanh(h * w + x[i]) that reads the iteration
// number (to index x, and as a factor of its scan output) and an If nested in its body, checked
// against the recurrence computed here, its gradients against finite differences. A body
// condition that folds (i < 2) stops it after three iterations; one computed from data is refused,
// naming the node, as are a loop with neither trip count nor condition and one of 10^9 iterations.
TEST(OnnxImport, LoopOfConstantTripsUnrolls) {
  TempDir d;
  const int64_t T = 4, H = 3;
  const std::vector<double> xv{0.5, -1.0, 0.25, 1.5, 0.75, -0.5, -0.25, 1.0, 0.5, 0.1, -0.3, 0.8};
  const std::vector<double> wv{0.9, -0.6, 1.1}, h0{0.2, -0.1, 0.4};
  enum Cond { kTrue, kFolds, kData, kNone };
  auto model = [&](Cond cond) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "x", {T, H}, xv);
    addDoubleInit(g, "w", {H}, wv);
    addDoubleInit(g, "h0", {H}, h0);
    addNode(g, "Shape", {"x"}, {"s"}, "shape");
    addNode(g, "Identity", {"x"}, {"xc"}, "xc");  // the body reads it by name
    addInt64Init(g, "zero", {0});
    g->mutable_initializer(g->initializer_size() - 1)->clear_dims();
    addNode(g, "Gather", {"s", "zero"}, {"trips"}, "trips");
    addBoolInit(g, "yes", true);
    auto* loop = addNode(g, "Loop", {cond == kNone ? "" : "trips", cond == kNone ? "" : "yes", "h0"}, {"hT", "hs"}, "recur");
    auto* a = loop->add_attribute();
    a->set_name("body");
    a->set_type(onnx::AttributeProto::GRAPH);
    auto* b = a->mutable_g();
    b->set_name("body");
    addTensorInput(b, "i", onnx::TensorProto::INT64, {});
    addTensorInput(b, "c", onnx::TensorProto::BOOL, {});
    addTensorInput(b, "h", onnx::TensorProto::DOUBLE, {H});
    addNode(b, "Gather", {"xc", "i"}, {"xi"}, "row");
    addNode(b, "Mul", {"h", "w"}, {"hw"}, "hw");
    addNode(b, "Add", {"hw", "xi"}, {"u"}, "u");
    addNode(b, "Tanh", {"u"}, {"hn"}, "tanh");
    intAttr(addNode(b, "Cast", {"i"}, {"fi"}, "fi"), "to", onnx::TensorProto::DOUBLE);
    addDoubleInit(b, "one", {}, {1.0});
    addNode(b, "Add", {"fi", "one"}, {"f"}, "f");
    addBoolInit(b, "always", true);
    auto* iff = addNode(b, "If", {"always"}, {"sc"}, "scale");  // then: hn * (i + 1)
    for (const bool then : {true, false}) {
      auto* ba = iff->add_attribute();
      ba->set_name(then ? "then_branch" : "else_branch");
      ba->set_type(onnx::AttributeProto::GRAPH);
      auto* br = ba->mutable_g();
      addNode(br, then ? "Mul" : "Sub", {"hn", "f"}, {then ? "t_out" : "e_out"}, then ? "times" : "minus");
      addOutput(br, then ? "t_out" : "e_out");
    }
    if (cond == kFolds) {
      addInt64Init(b, "two", {2});
      b->mutable_initializer(b->initializer_size() - 1)->clear_dims();
      addNode(b, "Less", {"i", "two"}, {"c_out"}, "more");
    } else if (cond == kData) {
      addDoubleInit(b, "zf", {}, {0.0});
      addNode(b, "ReduceSum", {"hn"}, {"hsum"}, "hsum");
      addNode(b, "Greater", {"hsum", "zf"}, {"c_out"}, "positive");
    } else {
      addNode(b, "Identity", {"c"}, {"c_out"}, "keep");
    }
    for (const char* o : {"c_out", "hn", "sc"}) addOutput(b, o);
    // loss = sum(hs * R) + sum(hT), R fixed
    std::vector<double> r(static_cast<size_t>(T * H));
    for (size_t k = 0; k < r.size(); ++k) r[k] = std::cos(1.3 * static_cast<double>(k));
    addDoubleInit(g, "R", {T, H}, r);
    addNode(g, "Mul", {"hs", "R"}, {"hr"}, "hr");
    intAttr(addNode(g, "ReduceSum", {"hr"}, {"l1"}, "l1"), "keepdims", 0);
    intAttr(addNode(g, "ReduceSum", {"hT"}, {"l2"}, "l2"), "keepdims", 0);
    addNode(g, "Add", {"l1", "l2"}, {"loss"}, "loss");
    addOutput(g, "loss");
    return m;
  };
  // The recurrence, here: loss over `steps` iterations.
  auto reference = [&](int64_t steps, std::vector<double>& hs) {
    std::vector<double> h = h0;
    hs.clear();
    double loss = 0;
    for (int64_t i = 0; i < steps; ++i) {
      for (int64_t j = 0; j < H; ++j) {
        h[static_cast<size_t>(j)] = std::tanh(h[static_cast<size_t>(j)] * wv[static_cast<size_t>(j)] + xv[static_cast<size_t>(i * H + j)]);
        const double s = h[static_cast<size_t>(j)] * static_cast<double>(i + 1);
        hs.push_back(s);
        loss += s * std::cos(1.3 * static_cast<double>(i * H + j));
      }
    }
    for (double v : h) loss += v;
    return loss;
  };
  for (const Cond c : {kTrue, kFolds}) {
    SCOPED_TRACE(c == kTrue ? "trip count" : "condition that folds");
    const int64_t steps = c == kTrue ? T : 3;
    auto m = model(c);
    if (c == kFolds) {  // fewer iterations: the stacked output has 3 rows, R too
      auto* g = m.mutable_graph();
      for (auto& t : *g->mutable_initializer())
        if (t.name() == "R") {
          t.set_dims(0, 3);
          while (t.double_data_size() > 3 * H) t.mutable_double_data()->RemoveLast();
        }
    }
    const std::string p = d.file(c == kTrue ? "loop.onnx" : "loop_cond.onnx");
    writeModel(p, m);
    auto graph = importOnnxFile(p);
    for (const auto& n : graph->nodes()) EXPECT_NE(n->op(), "Loop");
    std::vector<double> hs;
    const double want = reference(steps, hs);
    auto backend = createCpuBackend();
    EXPECT_NEAR(evaluate(*graph, {}, *backend)[0].getDouble(0), want, 1e-12);
    EXPECT_LE(gradientError(*graph), 1e-6);
  }
  {
    writeModel(d.file("loop_data.onnx"), model(kData));
    expectImportError(d.file("loop_data.onnx"), {"node 'recur' (Loop)", "the condition its body (iteration 0) computes is computed at run time"});
    writeModel(d.file("loop_none.onnx"), model(kNone));
    expectImportError(d.file("loop_none.onnx"), {"node 'recur' (Loop)", "never ends"});
    // A trip count past what import unrolls is refused before any iteration is written.
    auto huge = model(kTrue);
    addInt64Init(huge.mutable_graph(), "billion", {1000000000});
    huge.mutable_graph()->mutable_initializer(huge.mutable_graph()->initializer_size() - 1)->clear_dims();
    for (auto& n : *huge.mutable_graph()->mutable_node())
      if (n.op_type() == "Loop") {
        n.set_input(0, "billion");
        n.set_input(1, "");
      }
    writeModel(d.file("loop_huge.onnx"), huge);
    expectImportError(d.file("loop_huge.onnx"), {"node 'recur' (Loop)", "1000000000 iterations", "unrolls at most"});
  }
}

// A scripted loop that appends to a list (TorchScript: a sequence carried by the Loop, from
// SequenceEmpty, grown by SequenceInsert, stacked by ConcatFromSequence after it) unrolls into the
// tensors the list held.
TEST(OnnxImport, LoopCarriedSequenceUnrolls) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addFloatInit(g, "x", {3, 2}, {1, 2, 3, 4, 5, 6});
  addInt64Init(g, "three", {3});
  g->mutable_initializer(g->initializer_size() - 1)->clear_dims();
  addNode(g, "SequenceEmpty", {}, {"empty"}, "empty");
  auto* loop = addNode(g, "Loop", {"three", "", "empty"}, {"list"}, "append");
  auto* a = loop->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  auto* b = a->mutable_g();
  addTensorInput(b, "i", onnx::TensorProto::INT64, {});
  addTensorInput(b, "c", onnx::TensorProto::BOOL, {});
  b->add_input()->set_name("seq");  // a sequence: no tensor type
  addNode(b, "Gather", {"x", "i"}, {"row"}, "row");
  addNode(b, "Neg", {"row"}, {"neg"}, "neg");
  addNode(b, "SequenceInsert", {"seq", "neg"}, {"seq_out"}, "insert");
  addNode(b, "Identity", {"c"}, {"c_out"}, "keep");
  addOutput(b, "c_out");
  addOutput(b, "seq_out");
  auto* cat = addNode(g, "ConcatFromSequence", {"list"}, {"y"}, "stack");
  intAttr(cat, "axis", 0);
  intAttr(cat, "new_axis", 1);
  addOutput(g, "y");
  writeModel(d.file("list.onnx"), m);
  auto graph = importOnnxFile(d.file("list.onnx"));
  auto backend = createCpuBackend();
  const Tensor y = evaluate(*graph, {}, *backend)[0];
  ASSERT_EQ(y.type.str(), "f32[3,2]");
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(y.getDouble(i), -static_cast<double>(i + 1));
}

// Scan unrolls over its sequence axis: two scan inputs (one along axis 1, one read in reverse), a
// carried running sum, and two scan outputs (one stacked along axis 1, one in reverse order),
// checked element by element against the definition.
TEST(OnnxImport, ScanUnrollsAlongItsAxes) {
  TempDir d;
  const int64_t L = 3, W = 2;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  const std::vector<float> av{1, 2, 3, 4, 5, 6};         // [W, L]: scanned along axis 1
  const std::vector<float> bv{10, 20, 30, 40, 50, 60};   // [L, W]: scanned in reverse
  addFloatInit(g, "a", {W, L}, av);
  addFloatInit(g, "b", {L, W}, bv);
  addFloatInit(g, "s0", {W}, {0.5f, -0.5f});
  auto* scan = addNode(g, "Scan", {"s0", "a", "b"}, {"sT", "y1", "y2"}, "running");
  intAttr(scan, "num_scan_inputs", 2);
  intsAttr(scan, "scan_input_axes", {1, 0});
  intsAttr(scan, "scan_input_directions", {0, 1});
  intsAttr(scan, "scan_output_axes", {-1, 0});
  intsAttr(scan, "scan_output_directions", {0, 1});
  auto* a = scan->add_attribute();
  a->set_name("body");
  a->set_type(onnx::AttributeProto::GRAPH);
  auto* b = a->mutable_g();
  addTensorInput(b, "s", onnx::TensorProto::FLOAT, {W});
  addTensorInput(b, "at", onnx::TensorProto::FLOAT, {W});
  addTensorInput(b, "bt", onnx::TensorProto::FLOAT, {W});
  addNode(b, "Add", {"s", "at"}, {"s1"}, "sa");
  addNode(b, "Add", {"s1", "bt"}, {"s2"}, "sb");
  addNode(b, "Mul", {"at", "bt"}, {"p"}, "p");
  for (const char* o : {"s2", "s2", "p"}) addOutput(b, o);
  for (const char* o : {"sT", "y1", "y2"}) addOutput(g, o);
  writeModel(d.file("scan.onnx"), m);
  auto graph = importOnnxFile(d.file("scan.onnx"));
  for (const auto& n : graph->nodes()) EXPECT_NE(n->op(), "Scan");
  auto backend = createCpuBackend();
  const auto outs = evaluate(*graph, {}, *backend);
  ASSERT_EQ(outs.size(), 3u);
  ASSERT_EQ(outs[1].type.str(), "f32[2,3]");  // [W] pieces stacked on the last axis
  ASSERT_EQ(outs[2].type.str(), "f32[3,2]");
  std::vector<double> s{0.5, -0.5};
  for (int64_t t = 0; t < L; ++t)
    for (int64_t w = 0; w < W; ++w) {
      const double at = av[static_cast<size_t>(w * L + t)], bt = bv[static_cast<size_t>((L - 1 - t) * W + w)];
      s[static_cast<size_t>(w)] += at + bt;
      EXPECT_EQ(outs[1].getDouble(w * L + t), s[static_cast<size_t>(w)]) << t << "," << w;
      EXPECT_EQ(outs[2].getDouble((L - 1 - t) * W + w), at * bt) << t << "," << w;  // reverse order
    }
  for (int64_t w = 0; w < W; ++w) EXPECT_EQ(outs[0].getDouble(w), s[static_cast<size_t>(w)]);
}

// Col2Im (nn.Fold) becomes a ConvTranspose with a one-hot weight: checked against the definition
// (each column entry added at its block's offset, outside the padding) with strides, dilations,
// uneven pads and an image tail no block reaches, in 2-D and 1-D; its gradient against finite
// differences. Columns that do not match the blocks are refused, naming the node.
TEST(OnnxImport, Col2ImSumsBlocksBackIntoTheImage) {
  TempDir d;
  struct Case {
    std::vector<int64_t> image, block, strides, dil, pads;
  };
  const std::vector<Case> cases = {{{5, 7}, {2, 3}, {2, 1}, {1, 2}, {1, 0, 0, 1}}, {{9}, {3}, {2}, {2}, {2, 1}}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& q = cases[ci];
    SCOPED_TRACE(ci);
    const size_t sp = q.image.size();
    const int64_t n = 2, c = 2;
    int64_t k = 1, l = 1;
    std::vector<int64_t> blocks;
    for (size_t i = 0; i < sp; ++i) {
      k *= q.block[i];
      blocks.push_back((q.image[i] + q.pads[i] + q.pads[sp + i] - ((q.block[i] - 1) * q.dil[i] + 1)) / q.strides[i] + 1);
      l *= blocks.back();
    }
    std::vector<double> cols(static_cast<size_t>(n * c * k * l));
    for (size_t i = 0; i < cols.size(); ++i) cols[i] = std::sin(0.37 * static_cast<double>(i) + 0.1);
    auto m = newModel(17);
    m.mutable_opset_import(0)->set_version(18);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "cols", {n, c * k, l}, cols);
    addInt64Init(g, "image", q.image);
    addInt64Init(g, "block", q.block);
    auto* f = addNode(g, "Col2Im", {"cols", "image", "block"}, {"y"}, "fold");
    intsAttr(f, "strides", q.strides);
    intsAttr(f, "dilations", q.dil);
    intsAttr(f, "pads", q.pads);
    addOutput(g, "y");
    const std::string p = d.file("fold" + std::to_string(ci) + ".onnx");
    writeModel(p, m);
    auto graph = importOnnxFile(p);
    for (const auto& nd : graph->nodes()) EXPECT_NE(nd->op(), "Col2Im");
    auto backend = createCpuBackend();
    const Tensor y = evaluate(*graph, {}, *backend)[0];
    int64_t pixels = 1;
    for (int64_t e : q.image) pixels *= e;
    std::vector<double> want(static_cast<size_t>(n * c * pixels), 0.0);
    const int64_t w2 = sp == 2 ? q.image[1] : 1, kw = sp == 2 ? q.block[1] : 1, l2 = sp == 2 ? blocks[1] : 1;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t o = 0; o < k; ++o)
          for (int64_t at = 0; at < l; ++at) {
            const int64_t ki = o / kw, kj = o % kw, b1 = at / l2, b2 = at % l2;
            const int64_t h = b1 * q.strides[0] - q.pads[0] + ki * q.dil[0];
            const int64_t w = sp == 2 ? b2 * q.strides[1] - q.pads[1] + kj * q.dil[1] : 0;
            if (h < 0 || h >= q.image[0] || w < 0 || w >= w2) continue;
            want[static_cast<size_t>(((b * c + ch) * q.image[0] + h) * w2 + w)] += cols[static_cast<size_t>(((b * c + ch) * k + o) * l + at)];
          }
    ASSERT_EQ(y.numel(), static_cast<int64_t>(want.size()));
    EXPECT_EQ(y.type.shape[1], c);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y.getDouble(static_cast<int64_t>(i)), want[i], 1e-12) << i;
    // The gradient: a scalar loss of the image against finite differences.
    std::vector<double> r(want.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::cos(0.9 * static_cast<double>(i));
    std::vector<int64_t> yshape{n, c};
    yshape.insert(yshape.end(), q.image.begin(), q.image.end());
    addDoubleInit(g, "R", yshape, r);
    addNode(g, "Mul", {"y", "R"}, {"yr"}, "yr");
    intAttr(addNode(g, "ReduceSum", {"yr"}, {"loss"}, "loss"), "keepdims", 0);
    g->mutable_output(0)->set_name("loss");
    writeModel(p, m);
    auto lossGraph = importOnnxFile(p);
    EXPECT_LE(gradientError(*lossGraph), 1e-6);
    // Columns that are not the blocks the attributes make.
    g->mutable_node(0)->mutable_attribute(0)->set_ints(0, q.strides[0] + 1);
    writeModel(p, m);
    expectImportError(p, {"node 'fold' (Col2Im)", "blocks"});
  }
}

// Ops of opsets 18 to 20 and shape-dependent ops that import writes as registry ops, each against
// its definition: AffineGrid (2-D at both align_corners, 3-D; its gradient to
// theta against finite differences), ReverseSequence (both layouts, lengths known or fed), Compress
// (with and without an axis), NonZero of a constant, and CenterCropPad (ONNX's own crop example, with
// an uneven difference, and an uneven pad). Compress with a condition computed at run time is
// refused, naming the node.
TEST(OnnxImport, LaterAndShapeOpsMatchTheirDefinitions) {
  TempDir d;
  auto backend = createCpuBackend();
  auto build = [&](const std::string& name, const std::function<void(onnx::GraphProto*)>& body) {
    auto m = newModel(17);
    m.mutable_opset_import(0)->set_version(23);
    body(m.mutable_graph());
    const std::string p = d.file(name + ".onnx");
    writeModel(p, m);
    return p;
  };
  const std::vector<float> xv = ramp(24, 2.0f);
  for (const bool align : {false, true})
    for (const int64_t sp : {2, 3}) {  // AffineGrid
      SCOPED_TRACE(std::to_string(sp) + (align ? "-D aligned" : "-D"));
      const int64_t n = 2;
      const std::vector<int64_t> dims = sp == 2 ? std::vector<int64_t>{3, 4} : std::vector<int64_t>{2, 3, 4};
      std::vector<double> theta(static_cast<size_t>(n * sp * (sp + 1)));
      for (size_t i = 0; i < theta.size(); ++i) theta[i] = std::sin(0.8 * static_cast<double>(i) + 0.2);
      std::vector<int64_t> size{n, 5};
      size.insert(size.end(), dims.begin(), dims.end());
      int64_t points = 1;
      for (int64_t l : dims) points *= l;
      std::vector<double> r(static_cast<size_t>(n * points * sp));
      for (size_t i = 0; i < r.size(); ++i) r[i] = std::cos(0.3 * static_cast<double>(i));
      auto p = build("affine" + std::to_string(sp) + (align ? "a" : ""), [&](onnx::GraphProto* g) {
        addDoubleInit(g, "theta", {n, sp, sp + 1}, theta);
        addInt64Init(g, "size", size);
        intAttr(addNode(g, "AffineGrid", {"theta", "size"}, {"grid"}, "grid"), "align_corners", align ? 1 : 0);
        addOutput(g, "grid");
      });
      auto gr = importOnnxFile(p);
      const Tensor grid = evaluate(*gr, {}, *backend)[0];
      std::vector<int64_t> want{n};
      want.insert(want.end(), dims.begin(), dims.end());
      want.push_back(sp);
      ASSERT_EQ(grid.type.shape, want);
      auto coord = [&](int64_t k, int64_t l) { return align ? -1.0 + 2.0 * k / (l - 1) : (2.0 * k + 1) / l - 1; };
      for (int64_t b = 0; b < n; ++b)
        for (int64_t q = 0; q < points; ++q) {
          std::vector<double> h;  // (x, y[, z], 1)
          for (int64_t i = sp - 1, rest = q; i >= 0; --i) {
            h.insert(h.begin(), coord(rest % dims[static_cast<size_t>(i)], dims[static_cast<size_t>(i)]));
            rest /= dims[static_cast<size_t>(i)];
          }
          std::reverse(h.begin(), h.end());
          h.push_back(1.0);
          for (int64_t o = 0; o < sp; ++o) {
            double v = 0;
            for (int64_t k = 0; k <= sp; ++k) v += theta[static_cast<size_t>((b * sp + o) * (sp + 1) + k)] * h[static_cast<size_t>(k)];
            EXPECT_NEAR(grid.getDouble((b * points + q) * sp + o), v, 1e-12) << b << " " << q << " " << o;
          }
        }
      auto lossModel = build("affine_loss", [&](onnx::GraphProto* g) {
        addDoubleInit(g, "theta", {n, sp, sp + 1}, theta);
        addInt64Init(g, "size", size);
        intAttr(addNode(g, "AffineGrid", {"theta", "size"}, {"grid"}, "grid"), "align_corners", align ? 1 : 0);
        addDoubleInit(g, "R", want, r);
        addNode(g, "Mul", {"grid", "R"}, {"gr"}, "gr");
        intAttr(addNode(g, "ReduceSum", {"gr"}, {"loss"}, "loss"), "keepdims", 0);
        addOutput(g, "loss");
      });
      EXPECT_LE(gradientError(*importOnnxFile(lossModel)), 1e-6);
    }
  for (const bool batchFirst : {false, true})
    for (const bool fed : {false, true}) {  // ReverseSequence on [T, B, 2] or [B, T, 2]
      SCOPED_TRACE(std::string(batchFirst ? "batch first" : "time first") + (fed ? ", lengths fed" : ""));
      const int64_t T = 4, B = 3;
      const std::vector<int64_t> lens{4, 1, 2};
      auto p = build("revseq", [&](onnx::GraphProto* g) {
        addFloatInit(g, "x", batchFirst ? std::vector<int64_t>{B, T, 2} : std::vector<int64_t>{T, B, 2}, std::vector<float>(xv.begin(), xv.end()));
        if (fed) addTensorInput(g, "lens", onnx::TensorProto::INT64, {B});
        else addInt64Init(g, "lens", lens);
        auto* n = addNode(g, "ReverseSequence", {"x", "lens"}, {"y"}, "rev");
        intAttr(n, "time_axis", batchFirst ? 1 : 0);
        intAttr(n, "batch_axis", batchFirst ? 0 : 1);
        addOutput(g, "y");
      });
      auto gr = importOnnxFile(p);
      std::map<std::string, Tensor> feeds;
      if (fed) feeds["lens"] = Tensor::fromInts(DType::i64, {B}, lens);
      const Tensor y = evaluate(*gr, feeds, *backend)[0];
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 0; k < 2; ++k) {
            const int64_t src = t < lens[static_cast<size_t>(b)] ? lens[static_cast<size_t>(b)] - 1 - t : t;
            auto at = [&](int64_t tt) { return batchFirst ? (b * T + tt) * 2 + k : (tt * B + b) * 2 + k; };
            EXPECT_EQ(y.getDouble(at(t)), xv[static_cast<size_t>(at(src))]) << b << " " << t;
          }
    }
  {  // Compress, NonZero, CenterCropPad
    auto p = build("shape_ops", [&](onnx::GraphProto* g) {
      addFloatInit(g, "x", {4, 6}, xv);
      auto* c = g->add_initializer();
      c->set_name("keep");
      c->set_data_type(onnx::TensorProto::BOOL);
      c->add_dims(5);
      for (int v : {0, 1, 1, 0, 1}) c->add_int32_data(v);
      intAttr(addNode(g, "Compress", {"x", "keep"}, {"cols"}, "cols"), "axis", 1);
      addNode(g, "Compress", {"x", "keep"}, {"flat"}, "flat");
      auto* sparse = addInt64Init(g, "sparse", {0, 15, 0, -2, 0, 3});  // a constant (a float initializer would be a parameter)
      sparse->clear_dims();
      sparse->add_dims(2);
      sparse->add_dims(3);
      addNode(g, "NonZero", {"sparse"}, {"nz"}, "nz");
      addFloatInit(g, "img", {20, 10, 3}, ramp(600, 1.0f));
      addInt64Init(g, "crop", {10, 7, 3});
      addNode(g, "CenterCropPad", {"img", "crop"}, {"cropped"}, "crop");
      addInt64Init(g, "padded", {10, 13});
      intsAttr(addNode(g, "CenterCropPad", {"img", "padded"}, {"cp"}, "cp"), "axes", {0, 1});
      for (const char* o : {"cols", "flat", "nz", "cropped", "cp"}) addOutput(g, o);
    });
    auto gr = importOnnxFile(p);
    const auto outs = evaluate(*gr, {}, *backend);
    ASSERT_EQ(outs.size(), 5u);
    ASSERT_EQ(outs[0].type.str(), "f32[4,3]");
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(outs[0].getDouble(i * 3 + j), xv[static_cast<size_t>(i * 6 + std::vector<int64_t>{1, 2, 4}[j])]);
    ASSERT_EQ(outs[1].type.str(), "f32[3]");
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(outs[1].getDouble(j), xv[static_cast<size_t>(std::vector<int64_t>{1, 2, 4}[j])]);
    ASSERT_EQ(outs[2].type.str(), "i64[2,3]");
    const std::vector<int64_t> nz{0, 1, 1, 1, 0, 2};
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(outs[2].getInt(i), nz[static_cast<size_t>(i)]);
    const auto img = ramp(600, 1.0f);
    ASSERT_EQ(outs[3].type.str(), "f32[10,7,3]");  // x[5:15, 1:8, :]
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t j = 0; j < 7; ++j)
        for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(outs[3].getDouble((i * 7 + j) * 3 + k), img[static_cast<size_t>(((i + 5) * 10 + j + 1) * 3 + k)]);
    ASSERT_EQ(outs[4].type.str(), "f32[10,13,3]");  // y[:, 1:11] = x[5:15], zeros either side
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t j = 0; j < 13; ++j)
        for (int64_t k = 0; k < 3; ++k)
          EXPECT_EQ(outs[4].getDouble((i * 13 + j) * 3 + k), j >= 1 && j < 11 ? img[static_cast<size_t>(((i + 5) * 10 + j - 1) * 3 + k)] : 0.0f);
  }
  auto p = build("compress_data", [&](onnx::GraphProto* g) {
    addFloatInit(g, "x", {24}, xv);
    addTensorInput(g, "keep", onnx::TensorProto::BOOL, {24});
    addNode(g, "Compress", {"x", "keep"}, {"y"}, "select");
    addOutput(g, "y");
  });
  expectImportError(p, {"node 'select' (Compress)", "computed at run time"});
}

// MaxUnpool after MaxPool's Indices: every window's maximum back where it was, zeros elsewhere,
// at the size the window makes and at a given output_shape (5 x 5 under 2 x 2 windows); the
// gradient through both against finite differences. An index past the output is refused by name.
TEST(OnnxImport, MaxUnpoolPutsTheMaximaBack) {
  TempDir d;
  for (const int64_t size : {4, 5}) {
    SCOPED_TRACE(size);
    std::vector<double> xv(static_cast<size_t>(2 * size * size));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(1.3 * static_cast<double>(i) + 0.4);
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "x", {1, 2, size, size}, xv);
    auto* pool = addNode(g, "MaxPool", {"x"}, {"y", "i"}, "pool");
    intsAttr(pool, "kernel_shape", {2, 2});
    intsAttr(pool, "strides", {2, 2});
    std::vector<std::string> ins{"y", "i"};
    if (size == 5) {
      addInt64Init(g, "shape", {1, 2, 5, 5});
      ins.push_back("shape");
    }
    auto* un = addNode(g, "MaxUnpool", ins, {"u"}, "unpool");
    intsAttr(un, "kernel_shape", {2, 2});
    intsAttr(un, "strides", {2, 2});
    addOutput(g, "u");
    writeModel(d.file("unpool.onnx"), m);
    auto graph = importOnnxFile(d.file("unpool.onnx"));
    auto backend = createCpuBackend();
    const Tensor u = evaluate(*graph, {}, *backend)[0];
    ASSERT_EQ(u.type.str(), "f64[1,2," + std::to_string(size) + "," + std::to_string(size) + "]");
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t h = 0; h < size; ++h)
        for (int64_t w = 0; w < size; ++w) {
          const int64_t at = (c * size + h) * size + w;
          bool isMax = h < 4 && w < 4;  // inside a window (floor mode drops the fifth row and column)
          for (int64_t a = 0; isMax && a < 2; ++a)
            for (int64_t b = 0; b < 2; ++b) {
              const int64_t other = (c * size + (h / 2 * 2 + a)) * size + (w / 2 * 2 + b);
              isMax = isMax && xv[static_cast<size_t>(other)] <= xv[static_cast<size_t>(at)];
            }
          EXPECT_EQ(u.getDouble(at), isMax ? xv[static_cast<size_t>(at)] : 0.0) << c << " " << h << " " << w;
        }
    // The gradient of x through the pooling and the unpooling.
    std::vector<double> r(xv.size());
    for (size_t k = 0; k < r.size(); ++k) r[k] = std::cos(0.7 * static_cast<double>(k));
    addDoubleInit(g, "R", {1, 2, size, size}, r);
    addNode(g, "Mul", {"u", "R"}, {"ur"}, "ur");
    intAttr(addNode(g, "ReduceSum", {"ur"}, {"loss"}, "loss"), "keepdims", 0);
    g->mutable_output(0)->set_name("loss");
    writeModel(d.file("unpool_loss.onnx"), m);
    EXPECT_LE(gradientError(*importOnnxFile(d.file("unpool_loss.onnx"))), 1e-6);
  }
  // An index past the output.
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addFloatInit(g, "x", {1, 1, 2, 2}, {1, 2, 3, 4});
  auto* i = addInt64Init(g, "i", {0, 5, 10, 16});
  i->clear_dims();
  for (int64_t dim : {1, 1, 2, 2}) i->add_dims(dim);
  auto* un = addNode(g, "MaxUnpool", {"x", "i"}, {"u"}, "unpool");
  intsAttr(un, "kernel_shape", {2, 2});
  intsAttr(un, "strides", {2, 2});
  addOutput(g, "u");
  writeModel(d.file("unpool_bad.onnx"), m);
  expectImportError(d.file("unpool_bad.onnx"), {"node 'unpool' (MaxUnpool)", "index 16 is outside the output's 16 elements"});
}

// Opset 24: Swish (x sigmoid(alpha x), at the default alpha and another) against its definition,
// beside ops whose opset-24 versions only added types (Reshape, TopK); Attention with a past key at
// opset 24 (its in-place KV cache) is refused by name.
TEST(OnnxImport, OpsetTwentyFour) {
  TempDir d;
  const std::vector<float> xv = ramp(12, 3.0f);
  auto m = newModel(17);
  m.mutable_opset_import(0)->set_version(24);
  auto* g = m.mutable_graph();
  addFloatInit(g, "x", {12}, xv);
  addNode(g, "Swish", {"x"}, {"s1"}, "swish1");
  floatAttr(addNode(g, "Swish", {"x"}, {"s2"}, "swish2"), "alpha", 0.5f);
  addInt64Init(g, "shape", {3, 4});
  addNode(g, "Reshape", {"s1", "shape"}, {"r"}, "reshape");
  addInt64Init(g, "k", {2});
  addNode(g, "TopK", {"r", "k"}, {"top", "idx"}, "topk");
  for (const char* o : {"s1", "s2", "top"}) addOutput(g, o);
  writeModel(d.file("o24.onnx"), m);
  auto graph = importOnnxFile(d.file("o24.onnx"));
  EXPECT_EQ(graph->opset, 24);
  auto backend = createCpuBackend();
  const auto outs = evaluate(*graph, {}, *backend);
  for (int64_t i = 0; i < 12; ++i) {
    const double x = xv[static_cast<size_t>(i)];
    EXPECT_NEAR(outs[0].getDouble(i), x / (1 + std::exp(-x)), 1e-6);
    EXPECT_NEAR(outs[1].getDouble(i), x / (1 + std::exp(-0.5 * x)), 1e-6);
  }
  for (int64_t row = 0; row < 3; ++row) {  // the two largest of each row, descending
    std::vector<double> v;
    for (int64_t j = 0; j < 4; ++j) v.push_back(outs[0].getDouble(row * 4 + j));
    std::sort(v.rbegin(), v.rend());
    EXPECT_EQ(outs[2].getDouble(row * 2), v[0]);
    EXPECT_EQ(outs[2].getDouble(row * 2 + 1), v[1]);
  }
  auto a = newModel(17);
  a.mutable_opset_import(0)->set_version(24);
  g = a.mutable_graph();
  for (const char* n : {"q", "k", "v", "pk", "pv"}) addTensorInput(g, n, onnx::TensorProto::FLOAT, {1, 2, 3, 4});
  addNode(g, "Attention", {"q", "k", "v", "", "pk", "pv"}, {"o", "present_k", "present_v"}, "attn");
  addOutput(g, "o");
  writeModel(d.file("attn24.onnx"), a);
  expectImportError(d.file("attn24.onnx"), {"node 'attn' (Attention)", "past_key and past_value at opset 24"});
}

// RNN (Elman) unrolls with its activation per direction: Relu here, forward and reverse, checked
// against the recurrence by hand. LSTM and GRU take only their default activations, written or
// not; any other function (or one RNN lacks) is refused, naming the node.
TEST(OnnxImport, RecurrentActivations) {
  TempDir d;
  const int64_t T = 3, B = 2, I = 2, H = 2;
  const std::vector<float> w{0.5f, -1.0f, 1.5f, 0.25f, -0.5f, 1.0f, 0.75f, -1.25f};  // [2 dirs, H, I]
  const std::vector<float> r{0.5f, 0.25f, -0.75f, 1.0f, 1.0f, -0.5f, 0.25f, 0.5f};   // [2 dirs, H, H]
  const std::vector<float> bias{0.1f, -0.2f, 0.3f, 0.0f, -0.1f, 0.2f, 0.05f, 0.4f};  // [2 dirs, Wb H + Rb H]
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {T, B, I});
  addFloatInit(g, "w", {2, H, I}, w);
  addFloatInit(g, "r", {2, H, H}, r);
  addFloatInit(g, "b", {2, 2 * H}, bias);
  auto* rnn = addNode(g, "RNN", {"x", "w", "r", "b"}, {"y"}, "elman");
  stringsAttr(rnn, "activations", {"Relu", "Relu"});
  intAttr(rnn, "hidden_size", H);
  stringAttr(rnn, "direction", "bidirectional");
  addOutput(g, "y");
  const std::string p = d.file("rnn.onnx");
  writeModel(p, m);
  auto graph = importOnnxFile(p);
  std::vector<double> x(static_cast<size_t>(T * B * I));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.7 * static_cast<double>(i)) * 2;
  Tensor y = evalOne(*graph, {{"x", Tensor::fromDoubles(DType::f32, {T, B, I}, x)}});
  ASSERT_EQ(y.type.shape, (std::vector<int64_t>{T, 2, B, H}));
  // One step of direction dd for sample b at time t: relu(W x + R h + biases).
  auto cell = [&](int64_t dd, int64_t b, int64_t t, const std::vector<double>& h) {
    std::vector<double> next(H);
    for (int64_t j = 0; j < H; ++j) {
      double s = bias[static_cast<size_t>(dd * 2 * H + j)] + bias[static_cast<size_t>(dd * 2 * H + H + j)];
      for (int64_t i = 0; i < I; ++i) s += w[static_cast<size_t>((dd * H + j) * I + i)] * x[static_cast<size_t>((t * B + b) * I + i)];
      for (int64_t i = 0; i < H; ++i) s += r[static_cast<size_t>((dd * H + j) * H + i)] * h[static_cast<size_t>(i)];
      next[static_cast<size_t>(j)] = std::max(s, 0.0);
    }
    return next;
  };
  for (int64_t dd = 0; dd < 2; ++dd)
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> h(H, 0.0);
      for (int64_t k = 0; k < T; ++k) {
        const int64_t t = dd ? T - 1 - k : k;
        h = cell(dd, b, t, h);
        for (int64_t j = 0; j < H; ++j)
          EXPECT_NEAR(y.getDouble(((t * 2 + dd) * B + b) * H + j), h[static_cast<size_t>(j)], 1e-5) << "t " << t << " dir " << dd << " b " << b;
      }
    }
  // sequence_lens (pack_padded_sequence): sample 1 runs 1 step of 3. Forward: Y past it is 0 and Y_h
  // the state after it; reverse: it starts at its last step from the initial state. Refused: a
  // length past T.
  for (const int64_t len1 : {int64_t{1}, int64_t{4}}) {
    auto ml = newModel(17);
    auto* gl = ml.mutable_graph();
    addTensorInput(gl, "x", onnx::TensorProto::FLOAT, {T, B, I});
    addFloatInit(gl, "w", {2, H, I}, w);
    addFloatInit(gl, "r", {2, H, H}, r);
    addFloatInit(gl, "b", {2, 2 * H}, bias);
    auto* lens = addInt64Init(gl, "lens", {T, len1});
    lens->set_data_type(onnx::TensorProto::INT32);
    lens->clear_int64_data();
    lens->add_int32_data(static_cast<int32_t>(T));
    lens->add_int32_data(static_cast<int32_t>(len1));
    auto* n = addNode(gl, "RNN", {"x", "w", "r", "b", "lens"}, {"y", "yh"}, "packed");
    stringsAttr(n, "activations", {"Relu", "Relu"});
    intAttr(n, "hidden_size", H);
    stringAttr(n, "direction", "bidirectional");
    addOutput(gl, "y");
    addOutput(gl, "yh");
    const std::string pl = d.file("packed" + std::to_string(len1) + ".onnx");
    writeModel(pl, ml);
    if (len1 > T) {
      expectImportError(pl, {"node 'packed' (RNN)", "sequence_lens[1] = 4 is outside [0, 3]"});
      continue;
    }
    auto gp = importOnnxFile(pl);
    auto backend = createCpuBackend();
    const auto outs = evaluate(*gp, {{"x", Tensor::fromDoubles(DType::f32, {T, B, I}, x)}}, *backend);
    ASSERT_EQ(outs.size(), 2u);
    for (int64_t dd = 0; dd < 2; ++dd)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t L = b == 0 ? T : len1;
        std::vector<double> h(H, 0.0);
        for (int64_t k = 0; k < T; ++k) {
          const int64_t t = dd ? T - 1 - k : k;
          if (t < L) h = cell(dd, b, t, h);
          for (int64_t j = 0; j < H; ++j)
            EXPECT_NEAR(outs[0].getDouble(((t * 2 + dd) * B + b) * H + j), t < L ? h[static_cast<size_t>(j)] : 0.0, 1e-5)
                << "t " << t << " dir " << dd << " b " << b;
        }
        for (int64_t j = 0; j < H; ++j) EXPECT_NEAR(outs[1].getDouble((dd * B + b) * H + j), h[static_cast<size_t>(j)], 1e-5) << "Y_h dir " << dd << " b " << b;
      }
  }
  // Refusals: RNN's LeakyRelu, an LSTM activation other than its default, a list of the wrong length.
  const struct {
    const char* op;
    std::vector<std::string> acts;
    const char* says;
  } bad[] = {{"RNN", {"LeakyRelu", "Relu"}, "activation 'LeakyRelu' is not supported"},
             {"RNN", {"Relu"}, "2 are wanted"},
             {"LSTM", {"Sigmoid", "Relu", "Tanh", "Sigmoid", "Tanh", "Tanh"}, "activation 'Relu' is not supported"}};
  for (const auto& c : bad) {
    const int64_t gates = std::string(c.op) == "LSTM" ? 4 : 1;
    auto mb = newModel(17);
    auto* gb = mb.mutable_graph();
    addTensorInput(gb, "x", onnx::TensorProto::FLOAT, {T, B, I});
    addFloatInit(gb, "w", {2, gates * H, I}, std::vector<float>(static_cast<size_t>(2 * gates * H * I), 0.5f));
    addFloatInit(gb, "r", {2, gates * H, H}, std::vector<float>(static_cast<size_t>(2 * gates * H * H), 0.5f));
    auto* n = addNode(gb, c.op, {"x", "w", "r"}, {"y"}, "cell");
    stringsAttr(n, "activations", c.acts);
    intAttr(n, "hidden_size", H);
    stringAttr(n, "direction", "bidirectional");
    addOutput(gb, "y");
    const std::string pb = d.file(std::string("bad_") + c.op + std::to_string(c.acts.size()) + ".onnx");
    writeModel(pb, mb);
    expectImportError(pb, {std::string("node 'cell' (") + c.op + ")", c.says});
  }
}

// F.cross_entropy with class probabilities exports as SoftmaxCrossEntropyLoss over float labels,
// and F.one_hot as OneHot: both against their definitions. The loss with class weights, mean over
// [N, C] and sum over [N, C, d]; OneHot with a negative index, one out of range, and axis 0.
TEST(OnnxImport, SoftTargetCrossEntropyAndOneHot) {
  TempDir d;
  const std::vector<float> x{0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.5f, 0.0f, 1.0f};  // [2, 4] or [2, 2, 2]
  const std::vector<float> p{0.1f, 0.2f, 0.3f, 0.4f, 0.7f, 0.1f, 0.1f, 0.1f};
  const std::vector<float> w{0.5f, 1.0f, 1.5f, 2.0f};
  for (const bool spatial : {false, true}) {
    const std::vector<int64_t> shape = spatial ? std::vector<int64_t>{2, 2, 2} : std::vector<int64_t>{2, 4};
    const int64_t C = shape[1], D = spatial ? 2 : 1;
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, shape);
    addFloatInit(g, "p", shape, p);
    std::vector<std::string> ins{"x", "p"};
    if (!spatial) {
      addFloatInit(g, "w", {C}, w);
      ins.push_back("w");
    }
    stringAttr(addNode(g, "SoftmaxCrossEntropyLoss", ins, {"loss"}, "soft_ce"), "reduction", spatial ? "sum" : "mean");
    addOutput(g, "loss");
    const std::string path = d.file(spatial ? "soft_ce3.onnx" : "soft_ce.onnx");
    writeModel(path, m);
    auto graph = importOnnxFile(path);
    std::vector<double> xd(x.begin(), x.end());
    Tensor got = evalOne(*graph, {{"x", Tensor::fromDoubles(DType::f32, shape, xd)}});
    double want = 0;
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t k = 0; k < D; ++k) {
        auto at = [&](int64_t c) { return static_cast<size_t>((i * C + c) * D + k); };
        double mx = -1e30, z = 0;
        for (int64_t c = 0; c < C; ++c) mx = std::max(mx, double{x[at(c)]});
        for (int64_t c = 0; c < C; ++c) z += std::exp(x[at(c)] - mx);
        for (int64_t c = 0; c < C; ++c) want -= (spatial ? 1.0 : w[static_cast<size_t>(c)]) * p[at(c)] * (x[at(c)] - mx - std::log(z));
      }
    if (!spatial) want /= 2;  // mean over the samples, whatever the weights
    EXPECT_NEAR(got.getDouble(0), want, 1e-5) << (spatial ? "sum over [N, C, d]" : "weighted mean");
  }
  // OneHot: indices [3] = {1, -1, 7} with depth 4 along axis 0, values {off 0.5, on 2}.
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "i", onnx::TensorProto::INT64, {3});
  addInt64Init(g, "depth", {4});
  addFloatInit(g, "values", {2}, {0.5f, 2.0f});
  intAttr(addNode(g, "OneHot", {"i", "depth", "values"}, {"y"}, "one_hot"), "axis", 0);
  addOutput(g, "y");
  const std::string path = d.file("one_hot.onnx");
  writeModel(path, m);
  auto graph = importOnnxFile(path);
  Tensor y = evalOne(*graph, {{"i", Tensor::fromInts(DType::i64, {3}, {1, -1, 7})}});
  ASSERT_EQ(y.type.shape, (std::vector<int64_t>{4, 3}));
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t j = 0; j < 3; ++j) {
      const int64_t hot = j == 0 ? 1 : j == 1 ? 3 : -1;  // -1 counts from depth; 7 is out of range
      EXPECT_EQ(y.getDouble(c * 3 + j), c == hot ? 2.0 : 0.5) << "class " << c << " index " << j;
    }
  // A depth computed at run time is refused, naming the node.
  auto mb = newModel(17);
  auto* gb = mb.mutable_graph();
  addTensorInput(gb, "i", onnx::TensorProto::INT64, {3});
  addTensorInput(gb, "depth", onnx::TensorProto::INT64, {1});
  addFloatInit(gb, "values", {2}, {0.0f, 1.0f});
  addNode(gb, "OneHot", {"i", "depth", "values"}, {"y"}, "dyn_one_hot");
  addOutput(gb, "y");
  const std::string pb = d.file("one_hot_dyn.onnx");
  writeModel(pb, mb);
  expectImportError(pb, {"node 'dyn_one_hot' (OneHot)", "depth must be a compile-time constant"});
}

// RandomNormal and RandomUniform (torch.randn(shape), torch.rand(shape) in a forward) import as their
// *Like forms, keyed like Dropout: the shape, dtype and parameters hold, and the draws have the
// asked mean and spread.
TEST(OnnxImport, RandomNormalAndUniformDrawAsAsked) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  for (const bool normal : {true, false}) {
    auto* n = addNode(g, normal ? "RandomNormal" : "RandomUniform", {}, {normal ? "n" : "u"}, normal ? "randn" : "rand");
    intsAttr(n, "shape", {64, 64});
    for (const auto& [name, v] : normal ? std::vector<std::pair<const char*, float>>{{"mean", 3.0f}, {"scale", 0.5f}}
                                        : std::vector<std::pair<const char*, float>>{{"low", -2.0f}, {"high", 6.0f}})
      floatAttr(n, name, v);
    addOutput(g, normal ? "n" : "u");
  }
  writeModel(d.file("rand.onnx"), m);
  auto graph = importOnnxFile(d.file("rand.onnx"));
  auto backend = createCpuBackend();
  ExecOptions o;
  o.seed = 11;
  const auto outs = evaluate(*graph, {}, *backend, o);
  ASSERT_EQ(outs.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_EQ(outs[k].type, (TensorType{DType::f32, {64, 64}}));
    double sum = 0, sq = 0, lo = 1e30, hi = -1e30;
    for (int64_t i = 0; i < 4096; ++i) {
      const double v = outs[k].getDouble(i);
      sum += v, sq += v * v, lo = std::min(lo, v), hi = std::max(hi, v);
    }
    const double mean = sum / 4096, sd = std::sqrt(sq / 4096 - mean * mean);
    if (k == 0) {  // N(3, 0.5^2): the mean within 5 standard errors, the spread within 5%
      EXPECT_NEAR(mean, 3.0, 5 * 0.5 / 64);
      EXPECT_NEAR(sd, 0.5, 0.025);
    } else {  // U(-2, 6): mean 2, sd 8 / sqrt(12), every draw inside
      EXPECT_NEAR(mean, 2.0, 5 * 8 / std::sqrt(12.0) / 64);
      EXPECT_NEAR(sd, 8 / std::sqrt(12.0), 0.05 * 8 / std::sqrt(12.0));
      EXPECT_GE(lo, -2.0);
      EXPECT_LT(hi, 6.0);
    }
  }
}

// A BatchNorm in inference form beside one in training form (the TorchScript exporter's train()
// with a submodule left in eval(): a frozen BatchNorm) keeps its running statistics, with a note;
// ImportOptions::batchNormTrainAll (--batchnorm train) gives it batch statistics too.
TEST(OnnxImport, InferenceFormBatchNormBesideATrainingOneStaysFrozen) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 3, 2, 2});
  for (const char* p : {"a", "b"}) {
    addFloatInit(g, std::string(p) + "_s", {3}, {1, 2, 3});
    addFloatInit(g, std::string(p) + "_b", {3}, {0, 0.5, -1});
    addFloatInit(g, std::string(p) + "_rm", {3}, {0.25, -0.5, 1});
    addFloatInit(g, std::string(p) + "_rv", {3}, {1, 2, 0.5});
  }
  intAttr(addNode(g, "BatchNormalization", {"x", "a_s", "a_b", "a_rm", "a_rv"}, {"y", "a_rm_new", "a_rv_new"}, "trained_bn"), "training_mode", 1);
  addNode(g, "BatchNormalization", {"y", "b_s", "b_b", "b_rm", "b_rv"}, {"z"}, "frozen_bn");
  addOutput(g, "z");
  writeModel(d.file("mixed.onnx"), m);
  auto mixed = importOnnxFile(d.file("mixed.onnx"));
  const Node* frozen = nullptr;
  for (const auto& n : mixed->nodes())
    if (n->name() == "frozen_bn") frozen = n.get();
  ASSERT_NE(frozen, nullptr);
  EXPECT_EQ(frozen->getInt("training_mode", 0), 0);
  EXPECT_EQ(frozen->numResults(), 1u);
  ASSERT_EQ(mixed->importNotes.size(), 1u);
  EXPECT_NE(mixed->importNotes[0].find("1 BatchNormalization node(s) in inference form beside 1 in training form"), std::string::npos)
      << mixed->importNotes[0];
  ImportOptions all;
  all.batchNormTrainAll = true;
  auto trainedAll = importOnnxFile(d.file("mixed.onnx"), all);
  for (const auto& n : trainedAll->nodes())
    if (n->name() == "frozen_bn") EXPECT_EQ(n->getInt("training_mode", 0), 1);

  // A training-form BatchNorm whose statistics operands are computed (timm's weight standardisation,
  // as the dynamo exporter writes it: the weight's own mean and variance) is no module's: the
  // inference-form one beside it is a dynamo export's train()-mode BatchNorm, and trains.
  auto w = newModel(17);
  auto* wg = w.mutable_graph();
  addTensorInput(wg, "x", onnx::TensorProto::FLOAT, {4, 3, 2, 2});
  addFloatInit(wg, "w", {1, 3, 4}, {1, 2, 3, 4, -1, 0, 1, 2, 5, 3, 1, 0});
  addInt64Init(wg, "axes", {0, 2});
  addNode(wg, "ReduceMean", {"w", "axes"}, {"wm"}, "w_mean");
  addNode(wg, "Squeeze", {"wm", "axes"}, {"wm1"}, "w_mean1");
  addNode(wg, "Sub", {"w", "wm"}, {"wd"}, "w_dev");
  addNode(wg, "Mul", {"wd", "wd"}, {"wsq"}, "w_sq");
  addNode(wg, "ReduceMean", {"wsq", "axes"}, {"wv"}, "w_var");
  addNode(wg, "Squeeze", {"wv", "axes"}, {"wv1"}, "w_var1");
  intAttr(addNode(wg, "BatchNormalization", {"w", "a_s", "a_b", "wm1", "wv1"}, {"ws", "ws_rm", "ws_rv"}, "standardise"), "training_mode", 1);
  for (const char* p : {"a", "b"}) {
    addFloatInit(wg, std::string(p) + "_s", {3}, {1, 2, 3});
    addFloatInit(wg, std::string(p) + "_b", {3}, {0, 0.5, -1});
  }
  addFloatInit(wg, "b_rm", {3}, {0.25, -0.5, 1});
  addFloatInit(wg, "b_rv", {3}, {1, 2, 0.5});
  addNode(wg, "BatchNormalization", {"x", "b_s", "b_b", "b_rm", "b_rv"}, {"y"}, "module_bn");
  addNode(wg, "ReduceSum", {"ws"}, {"wsum"}, "w_sum");
  addNode(wg, "Add", {"y", "wsum"}, {"z"}, "out");
  addOutput(wg, "z");
  writeModel(d.file("standardised.onnx"), w);
  auto standardised = importOnnxFile(d.file("standardised.onnx"));
  bool seen = false;
  for (const auto& n : standardised->nodes())
    if (n->name() == "module_bn") {
      seen = true;
      EXPECT_EQ(n->getInt("training_mode", 0), 1);
    }
  EXPECT_TRUE(seen);
  EXPECT_TRUE(standardised->frozenBatchNorms.empty());
}

// F.normalize of a row that is all zero (Swin V2's cosine attention over a window's zero padding:
// its keys have no bias): x W / max(||x W||, eps), plus the norms themselves. PyTorch's norm
// backward gives such a row 0; the sqrt's own derivative there (0 * inf) made every gradient of W
// NaN, so every step of a plan was skipped as an overflow. The gradients are finite and match
// central differences (which see no change from that row); p 2 through ReduceL2 and
// LpNormalization's composition, p 3 through GlobalLpPool.
TEST(OnnxImport, NormsOfAZeroRowHaveZeroGradient) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addDoubleInit(g, "x", {3, 4}, {0.5, -1.0, 0.25, 1.5, 0, 0, 0, 0, -0.25, 1.0, 0.5, 0.1});
  addDoubleInit(g, "w", {4, 5}, {0.9, -0.6, 1.1, 0.3, -0.2, 0.4, 0.8, -1.2, 0.5, 0.7, -0.3, 0.2, 0.6, -0.9, 1.0, 0.1, -0.4, 0.3, 0.8, -0.5});
  addDoubleInit(g, "eps", {1}, {1e-3});
  addDoubleInit(g, "c", {3, 5}, {1, -2, 0.5, 3, -1, 0.25, 2, -1, 1, 0.5, -0.5, 1, 2, -3, 0.75});
  addNode(g, "MatMul", {"x", "w"}, {"xw"}, "proj");
  intsAttr(addNode(g, "ReduceL2", {"xw"}, {"n"}, "norm"), "axes", {-1});
  addNode(g, "Max", {"n", "eps"}, {"nc"}, "clamp_min");
  addNode(g, "Div", {"xw", "nc"}, {"y"}, "normalize");
  addNode(g, "Mul", {"y", "c"}, {"yc"}, "weigh");
  addNode(g, "ReduceSum", {"yc"}, {"l1"}, "sum_y");
  addNode(g, "ReduceSum", {"n"}, {"l2"}, "sum_n");
  addNode(g, "Unsqueeze", {"xw", "axes01"}, {"xw4"}, "as_image");  // [1, 1, 3, 5]: a zero row in the map
  addInt64Init(g, "axes01", {0, 1});
  intAttr(addNode(g, "GlobalLpPool", {"xw4"}, {"p3"}, "lp3"), "p", 3);
  addNode(g, "ReduceSum", {"p3"}, {"l3"}, "sum_p3");
  addNode(g, "Add", {"l1", "l2"}, {"l12"}, "add12");
  addNode(g, "Add", {"l12", "l3"}, {"loss"}, "loss");
  addOutput(g, "loss");
  writeModel(d.file("normalize.onnx"), m);
  auto graph = importOnnxFile(d.file("normalize.onnx"));
  // Finite everywhere, and what the definition gives away from the kink.
  auto gg = importOnnxFile(d.file("normalize.onnx"));
  createAutodiffPass()->run(*gg);
  auto backend = createCpuBackend();
  const auto outs = evaluate(*gg, {}, *backend);
  ASSERT_GE(outs.size(), 3u);
  for (size_t i = 1; i < outs.size(); ++i)
    for (int64_t k = 0; k < outs[i].numel(); ++k) ASSERT_TRUE(std::isfinite(outs[i].getDouble(k))) << gg->outputs()[i]->name() << " " << k;
  EXPECT_LE(gradientError(*graph), 1e-6);
  // The norm itself: 0 of the zero row, positive elsewhere.
  const auto fwd = evaluate(*graph, {}, *backend, {}, {graph->lookup("n")});
  EXPECT_EQ(fwd.back().getDouble(1), 0.0);
  EXPECT_GT(fwd.back().getDouble(0), 0.0);
}

// The export helper's "ampc.custom_autograd" (the model's own torch.autograd.Function subclasses)
// becomes an import note naming them; an empty list, none; a value that is no list of names, an error.
TEST(OnnxImport, CustomAutogradFunctionsAreNoted) {
  TempDir d;
  auto make = [&](const std::string& value, const std::string& file) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addFloatInit(g, "w", {2}, {1, 2});
    addNode(g, "Round", {"w"}, {"q"}, "quantize");
    addNode(g, "ReduceSum", {"q"}, {"loss"}, "sum");
    addOutput(g, "loss");
    auto* e = m.add_metadata_props();
    e->set_key("ampc.custom_autograd");
    e->set_value(value);
    writeModel(d.file(file), m);
    return d.file(file);
  };
  const auto notes = importOnnxFile(make(R"(["qat.RoundSTE", "transformers.models.yoso.modeling_yoso.YosoCumulation"])", "two.onnx"))->importNotes;
  ASSERT_EQ(notes.size(), 1u);
  for (const char* want : {"torch.autograd.Function", "(qat.RoundSTE, transformers.models.yoso.modeling_yoso.YosoCumulation)", "straight-through"})
    EXPECT_NE(notes[0].find(want), std::string::npos) << notes[0];
  EXPECT_TRUE(importOnnxFile(make("[]", "none.onnx"))->importNotes.empty());
  expectImportError(make("{\"a\": 1}", "bad.onnx"), {"ampc.custom_autograd"});
}

// The reductions whose gradient goes to one index (compiler/ops/grad.h, kGradToFirst): PyTorch's
// max(dim) / min(dim), which both exporters write as a ReduceMax / ReduceMin beside an ArgMax /
// ArgMin over the same input, axis and keepdims (the indices read or not), and GlobalMaxPool. A
// ReduceMax alone is amax's, whose gradient ties share; an ArgMax over another axis, or with other
// keepdims, says nothing of it.
TEST(OnnxImport, MaxOverADimBesideItsArgMaxGivesTheGradientToTheIndex) {
  TempDir d;
  auto marked = [&](const std::string& op, const std::string& argOp, int64_t argAxis, bool global = false, int64_t argKeep = 0) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 3, 4, 4});
    auto intAttr = [](onnx::NodeProto* n, const std::string& name, int64_t v) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(v);
    };
    if (global) {
      addNode(g, "GlobalMaxPool", {"x"}, {"y"}, "gmp");
    } else {
      auto* r = addNode(g, op, {"x"}, {"y"}, "red");
      auto* a = r->add_attribute();
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      a->add_ints(1);
      intAttr(r, "keepdims", 0);
    }
    if (!argOp.empty()) {
      auto* am = addNode(g, argOp, {"x"}, {"i"}, "arg");
      intAttr(am, "axis", argAxis);
      intAttr(am, "keepdims", argKeep);
    }
    addOutput(g, "y");
    const std::string f = d.file(op + argOp + std::to_string(argAxis) + (global ? "g" : "") + std::to_string(argKeep) + ".onnx");
    writeModel(f, m);
    auto gr = importOnnxFile(f);
    int found = 0;
    for (const auto& n : gr->nodes())
      if (n->op() == "ReduceMax" || n->op() == "ReduceMin") found += 1 + (n->getInt(kGradToFirst, 0) != 0);
    EXPECT_GE(found, 1) << op << " " << argOp;
    return found == 2;
  };
  EXPECT_TRUE(marked("ReduceMax", "ArgMax", 1));
  EXPECT_TRUE(marked("ReduceMax", "ArgMax", -3));  // the same axis of a rank-4 input
  EXPECT_TRUE(marked("ReduceMin", "ArgMin", 1));
  EXPECT_TRUE(marked("GlobalMaxPool", "", 0, true));
  EXPECT_FALSE(marked("ReduceMax", "", 0));
  EXPECT_FALSE(marked("ReduceMax", "ArgMax", 2));
  EXPECT_FALSE(marked("ReduceMin", "ArgMax", 1));  // ArgMax is not ReduceMin's index
  EXPECT_FALSE(marked("ReduceMax", "ArgMax", 1, false, 1));  // keepdims differ: not one max(dim)
}

// ReduceProd of a computed tensor with zero factors: the product, and PyTorch's prod gradient (a
// lone zero factor gets the product of the others, every other factor of that row 0; two zeros give
// 0 everywhere), against central differences. Written as sign * exp(sum log |x|) over every factor,
// the lone zero got 0.
TEST(OnnxImport, ProductOfFactorsWithZerosHasFiniteGradients) {
  TempDir d;
  auto m = newModel(17);
  auto* g = m.mutable_graph();
  addDoubleInit(g, "x", {4, 4}, {2, -3, 0.5, 1, 0, 2, -1, 4, 0, 0, 3, 1, -1, -2, -0.5, 3});
  addDoubleInit(g, "c", {4}, {1, -2, 0.5, 3});
  addDoubleInit(g, "s", {1}, {1.5});
  addNode(g, "Mul", {"x", "s"}, {"xs"}, "scale");  // computed, not a constant: no folding
  auto* prod = addNode(g, "ReduceProd", {"xs"}, {"p"}, "prod");
  intAttr(prod, "keepdims", 0);
  intsAttr(prod, "axes", {1});
  addNode(g, "Mul", {"p", "c"}, {"pc"}, "weigh");
  addNode(g, "ReduceSum", {"pc"}, {"loss"}, "sum");
  addOutput(g, "loss");
  writeModel(d.file("prod.onnx"), m);
  auto graph = importOnnxFile(d.file("prod.onnx"));
  auto backend = createCpuBackend();
  const auto p = evaluate(*graph, {}, *backend, {}, {graph->lookup("p")}).back();
  const double want[] = {-15.1875, 0.0, 0.0, -15.1875};  // 1.5^4 (2 * -3 * 0.5 * 1), zeros, 1.5^4 (-1 * -2 * -0.5 * 3)
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p.getDouble(i), want[i], 1e-12) << i;
  auto gg = importOnnxFile(d.file("prod.onnx"));
  createAutodiffPass()->run(*gg);
  const auto outs = evaluate(*gg, {}, *backend);
  ASSERT_EQ(outs.size(), 4u);  // the loss, x's, c's and s's gradients
  for (int64_t k = 0; k < outs[1].numel(); ++k) ASSERT_TRUE(std::isfinite(outs[1].getDouble(k))) << k;
  // The lone zero (row 1, element 0) gets c times the others, 1.5^3 (2 * -1 * 4), times d xs / dx = 1.5.
  EXPECT_NEAR(outs[1].getDouble(4), -2 * 3.375 * -8 * 1.5, 1e-9);
  EXPECT_EQ(outs[1].getDouble(5), 0.0);
  EXPECT_LE(gradientError(*graph), 1e-6);
}

// The signal ops (opset 17; DFT's opset-20 form), lowered at import to a product with the Fourier
// matrix (DFT) or a strided convolution with the windowed matrix (STFT): against the transforms
// summed here in complex f64, the windows against values of their definitions, the gradients
// (through a trained window too) against central differences, and autocast keeps the products FP32.
TEST(OnnxImport, SignalOpsMatchTheirDefinitions) {
  using C = std::complex<double>;
  TempDir d;
  int id = 0;
  // The model: one node over initializers (x a computed value, so nothing folds), output y.
  auto build = [&](int opset, const std::function<void(onnx::GraphProto*)>& body, bool loss = false) {
    auto m = newModel(opset);
    auto* g = m.mutable_graph();
    body(g);
    if (loss) {
      addNode(g, "ReduceSumSquare", {"y"}, {"l"}, "square");  // a nonlinear loss: every entry's gradient differs
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addOutput(g, "l");
    } else {
      addOutput(g, "y");
    }
    const std::string f = d.file("sig" + std::to_string(id++) + ".onnx");
    writeModel(f, m);
    return importOnnxFile(f);
  };
  auto input = [&](onnx::GraphProto* g, const std::vector<int64_t>& dims) {
    std::vector<double> v = wave(static_cast<size_t>(prod(dims)), 1.0);
    addDoubleInit(g, "x0", dims, v);
    addDoubleInit(g, "one", {}, {1.0});
    addNode(g, "Mul", {"x0", "one"}, {"x"}, "computed");
    return v;
  };
  auto expectNear = [](const Tensor& y, const std::vector<C>& want) {
    ASSERT_EQ(y.numel(), static_cast<int64_t>(2 * want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(y.getDouble(static_cast<int64_t>(2 * i)), want[i].real(), 1e-12) << "bin " << i;
      ASSERT_NEAR(y.getDouble(static_cast<int64_t>(2 * i + 1)), want[i].imag(), 1e-12) << "bin " << i;
    }
  };
  const double tau = 2 * std::numbers::pi;

  // Real [2, 7, 1] along axis 1 (opset 17's default), zero-padded to 10, onesided: 6 bins.
  {
    std::vector<double> x;
    auto g = build(17, [&](onnx::GraphProto* gp) {
      x = input(gp, {2, 7, 1});
      addInt64Init(gp, "len", {10});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      intAttr(addNode(gp, "DFT", {"x", "len"}, {"y"}, "dft"), "onesided", 1);
    });
    ASSERT_EQ(g->outputs()[0]->type().shape, (std::vector<int64_t>{2, 6, 2}));
    std::vector<C> want;
    for (int b = 0; b < 2; ++b)
      for (int k = 0; k < 6; ++k) {
        C s = 0;
        for (int n = 0; n < 7; ++n) s += x[static_cast<size_t>(b * 7 + n)] * std::polar(1.0, -tau * k * n / 10);
        want.push_back(s);
      }
    expectNear(evalOne(*g, {}), want);
  }
  // Complex [5, 3, 2], inverse along axis 0 cropped to 4 samples; and its gradient.
  for (bool loss : {false, true}) {
    std::vector<double> x;
    auto g = build(17, [&](onnx::GraphProto* gp) {
      x = input(gp, {5, 3, 2});
      addInt64Init(gp, "len", {4});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      auto* n = addNode(gp, "DFT", {"x", "len"}, {"y"}, "idft");
      intAttr(n, "inverse", 1);
      intAttr(n, "axis", 0);
    }, loss);
    if (loss) {
      EXPECT_LE(gradientError(*g), 1e-6);
      continue;
    }
    std::vector<C> want;
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 3; ++j) {
        C s = 0;
        for (int n = 0; n < 4; ++n) s += C(x[static_cast<size_t>((n * 3 + j) * 2)], x[static_cast<size_t>((n * 3 + j) * 2 + 1)]) * std::polar(1.0, tau * k * n / 4);
        want.push_back(s / 4.0);
      }
    expectNear(evalOne(*g, {}), want);
  }
  // Opset 20: the axis an input (1 of [2, 3, 6, 2]), the full complex transform.
  {
    std::vector<double> x;
    auto g = build(20, [&](onnx::GraphProto* gp) {
      x = input(gp, {2, 3, 6, 2});
      addInt64Init(gp, "axis", {1});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      addNode(gp, "DFT", {"x", "", "axis"}, {"y"}, "dft");
    });
    ASSERT_EQ(g->outputs()[0]->type().shape, (std::vector<int64_t>{2, 3, 6, 2}));
    std::vector<C> want;
    for (int b = 0; b < 2; ++b)
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 6; ++j) {
          C s = 0;
          for (int n = 0; n < 3; ++n) {
            const size_t at = static_cast<size_t>(((b * 3 + n) * 6 + j) * 2);
            s += C(x[at], x[at + 1]) * std::polar(1.0, -tau * k * n / 3);
          }
          want.push_back(s);
        }
    expectNear(evalOne(*g, {}), want);
  }
  // STFT of [2, 40] with a periodic Hann window of 8 every 3 samples: [2, 11, 5, 2]; then with a
  // trained window (a parameter: it multiplies the kernels in the graph), against central differences.
  for (bool trained : {false, true}) {
    std::vector<double> x;
    auto g = build(17, [&](onnx::GraphProto* gp) {
      x = input(gp, {2, 40});
      addInt64Init(gp, "step", {3});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      if (trained) {
        addDoubleInit(gp, "w", {8}, wave(8, 1.0, 1.1));
      } else {
        addInt64Init(gp, "size", {8});
        gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
        addNode(gp, "HannWindow", {"size"}, {"w"}, "hann");
      }
      addNode(gp, "STFT", {"x", "step", "w"}, {"y"}, "stft");
    }, trained);
    if (trained) {
      EXPECT_LE(gradientError(*g), 1e-6);
      continue;
    }
    ASSERT_EQ(g->outputs()[0]->type().shape, (std::vector<int64_t>{2, 11, 5, 2}));
    std::vector<C> want;
    for (int b = 0; b < 2; ++b)
      for (int f = 0; f < 11; ++f)
        for (int k = 0; k < 5; ++k) {
          C s = 0;
          for (int n = 0; n < 8; ++n) {  // HannWindow's output_datatype is float by default
            const double w = static_cast<float>(0.5 - 0.5 * std::cos(tau * n / 8));
            s += x[static_cast<size_t>(b * 40 + f * 3 + n)] * w * std::polar(1.0, -tau * k * n / 8);
          }
          want.push_back(s);
        }
    expectNear(evalOne(*g, {}), want);
  }
  // The windows, at sizes where their definitions give round values.
  auto window = [&](const std::string& op, int64_t size, int64_t periodic) {
    auto g = build(17, [&](onnx::GraphProto* gp) {
      addInt64Init(gp, "size", {size});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      intAttr(addNode(gp, op, {"size"}, {"y"}, "w"), "periodic", periodic);
    });
    Tensor y = evalOne(*g, {});
    std::vector<double> v;
    for (int64_t i = 0; i < y.numel(); ++i) v.push_back(y.getDouble(i));
    return v;
  };
  auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  };
  near(window("HannWindow", 4, 1), {0, 0.5, 1, 0.5});
  near(window("HannWindow", 5, 0), {0, 0.5, 1, 0.5, 0});
  near(window("HammingWindow", 4, 1), {4.0 / 46, 25.0 / 46, 1, 25.0 / 46});  // ONNX's a0 = 25/46, a1 = 21/46
  near(window("BlackmanWindow", 5, 0), {0, 0.34, 1, 0.34, 0});
  // Under bf16 autocast the Fourier product stays FP32; the model's own MatMul goes low.
  {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {4, 8, 1});
    addFloatInit(g, "w", {6, 3}, std::vector<float>(18, 0.1f));
    addNode(g, "DFT", {"x"}, {"y"}, "dft");  // [4, 8, 2]
    addInt64Init(g, "shape", {4, 16});
    addNode(g, "Reshape", {"y", "shape"}, {"flat"}, "flatten");
    addNode(g, "Slice", {"flat", "s0", "s1", "s2"}, {"part"}, "part");
    addInt64Init(g, "s0", {0});
    addInt64Init(g, "s1", {6});
    addInt64Init(g, "s2", {1});
    addNode(g, "MatMul", {"part", "w"}, {"z"}, "linear");
    addOutput(g, "z");
    writeModel(d.file("amp.onnx"), m);
    auto gr = importOnnxFile(d.file("amp.onnx"));
    AutocastOptions ao;
    ao.low = DType::bf16;
    createAutocastPass(ao)->run(*gr);
    int fourier = 0, low = 0;
    for (const auto& n : gr->nodes()) {
      if (n->op() != "MatMul") continue;
      if (n->getInt(kKeepFp32, 0)) fourier += n->result(0)->type().dtype == DType::f32;
      else low += n->result(0)->type().dtype == DType::bf16;
    }
    EXPECT_EQ(fourier, 1);
    EXPECT_EQ(low, 1);
  }
  // What ONNX leaves undefined is refused, naming the node.
  {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {2, 8, 2});
    intAttr(addNode(g, "DFT", {"x"}, {"y"}, "complex_onesided"), "onesided", 1);
    addOutput(g, "y");
    writeModel(d.file("bad.onnx"), m);
    expectImportError(d.file("bad.onnx"), {"complex_onesided", "onesided forward DFT of a complex input"});
  }
  // Inverse and onesided over a complex input: the complex-to-real transform (torch.fft.irfft as the
  // dynamo exporter writes it, opset 20, dft_length L): x[n] = (1/L) sum over the full Hermitian
  // spectrum, whose bins past L/2 are the conjugates of the given ones. The DC and (even L) Nyquist
  // bins' imaginary parts count for nothing, as in PyTorch; input bins past L/2 are ignored.
  for (int64_t length : {8, 7}) {
    SCOPED_TRACE("irfft of length " + std::to_string(length));
    std::vector<double> x;
    auto g = build(20, [&](onnx::GraphProto* gp) {
      x = input(gp, {2, 6, 2});  // 6 bins: 5 are used for L = 8 and 4 for L = 7
      addInt64Init(gp, "len", {length});
      gp->mutable_initializer(gp->initializer_size() - 1)->clear_dims();
      auto* n = addNode(gp, "DFT", {"x", "len"}, {"y"}, "irfft");
      intAttr(n, "inverse", 1);
      intAttr(n, "onesided", 1);
    });
    ASSERT_EQ(g->outputs()[0]->type().shape, (std::vector<int64_t>{2, length, 2}));
    std::vector<C> want;
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<C> full(static_cast<size_t>(length));
      for (int64_t k = 0; k < length; ++k) {
        const int64_t j = k <= length / 2 ? k : length - k;
        const C bin(x[static_cast<size_t>((b * 6 + j) * 2)], x[static_cast<size_t>((b * 6 + j) * 2 + 1)]);
        full[static_cast<size_t>(k)] = k <= length / 2 ? bin : std::conj(bin);
      }
      full[0] = full[0].real();
      if (length % 2 == 0) full[static_cast<size_t>(length / 2)] = full[static_cast<size_t>(length / 2)].real();
      for (int64_t n = 0; n < length; ++n) {
        C sum = 0;
        for (int64_t k = 0; k < length; ++k) sum += full[static_cast<size_t>(k)] * std::polar(1.0, tau * static_cast<double>(k * n) / static_cast<double>(length));
        want.push_back(sum / static_cast<double>(length));
        ASSERT_NEAR(want.back().imag(), 0.0, 1e-12);  // a Hermitian spectrum's signal is real
      }
    }
    expectNear(evalOne(*g, {}), want);
  }
}

// Fake quantization (a QuantizeLinear read only by DequantizeLinear nodes of the same scale and
// zero point, as both exporters write PyTorch's fake_quantize_*): forward as ONNX defines the pair
// (round half to even, saturate), the gradient PyTorch's straight-through mask (dy where
// round(x / scale) + zero_point is inside the type's range), per tensor (uint8) and per channel
// (int8, axis 0); a quantized tensor read by anything else is refused, naming both nodes.
TEST(OnnxImport, FakeQuantizationPassesTheGradientInsideTheRange) {
  TempDir d;
  const std::vector<double> xv{-0.26, 0.04, 0.05, 0.15, 0.25, 1.0, 12.6, 30.0};  // 2 x 4
  auto model = [&](bool perChannel, bool badReader) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addFloatInit(g, "x", {2, 4}, std::vector<float>(xv.begin(), xv.end()));
    if (perChannel) {
      addFloatInit(g, "scale", {2}, {0.1f, 0.002f});
      auto* zp = addInit(g, "zp", {2}, onnx::TensorProto::INT8, {0, 0});
      zp->clear_int32_data();
      zp->add_int32_data(2);
      zp->add_int32_data(-3);
    } else {
      addFloatInit(g, "scale", {}, {0.1f});
      auto* zp = addInit(g, "zp", {}, onnx::TensorProto::UINT8, {});
      zp->add_int32_data(3);
    }
    intAttr(addNode(g, "QuantizeLinear", {"x", "scale", "zp"}, {"q"}, "quant"), "axis", 0);
    intAttr(addNode(g, "DequantizeLinear", {"q", "scale", "zp"}, {"y"}, "dequant"), "axis", 0);
    if (badReader) intAttr(addNode(g, "Cast", {"q"}, {"qi"}, "reads_q"), "to", 7);
    addFloatInit(g, "c", {2, 4}, {1, -2, 3, 0.5f, 2, 1, -1, 0.25f});
    addNode(g, "Mul", {"y", "c"}, {"yc"}, "weigh");
    addNode(g, "ReduceSum", {"yc"}, {"loss"}, "sum");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addOutput(g, "loss");
    const std::string f = d.file(std::string("fq") + (perChannel ? "c" : "t") + (badReader ? "b" : "") + ".onnx");
    writeModel(f, m);
    return f;
  };
  for (bool perChannel : {false, true}) {
    SCOPED_TRACE(perChannel ? "per channel" : "per tensor");
    auto g = importOnnxFile(model(perChannel, false));
    // q = clamp(round_half_even(x / s) + zp, lo, hi); y = (q - zp) s; dy/dx = [lo <= round(x / s) + zp <= hi].
    std::vector<double> y, mask;
    for (size_t i = 0; i < xv.size(); ++i) {
      const bool row1 = perChannel && i >= 4;
      const double s = row1 ? static_cast<double>(0.002f) : static_cast<double>(0.1f), zp = perChannel ? (row1 ? -3 : 2) : 3;
      const double lo = perChannel ? -128 : 0, hi = perChannel ? 127 : 255;
      const double r = std::nearbyint(static_cast<double>(static_cast<float>(static_cast<float>(xv[i]) / static_cast<float>(s)))) + zp;
      y.push_back((std::clamp(r, lo, hi) - zp) * s);
      mask.push_back(r >= lo && r <= hi ? 1.0 : 0.0);
    }
    auto backend = createCpuBackend();
    const Tensor got = evaluate(*g, {}, *backend, {}, {g->lookup("y")}).back();
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(got.getDouble(static_cast<int64_t>(i)), y[i], 1e-6) << i;
    createAutodiffPass()->run(*g);
    const auto outs = evaluate(*g, {}, *backend);
    ASSERT_EQ(outs.size(), 3u);  // the loss, x's and c's gradients (scale and zero point get none)
    const double c[] = {1, -2, 3, 0.5, 2, 1, -1, 0.25};
    int inside = 0;
    for (size_t i = 0; i < xv.size(); ++i) {
      EXPECT_EQ(outs[1].getDouble(static_cast<int64_t>(i)), c[i] * mask[i]) << i;
      inside += mask[i] != 0;
    }
    EXPECT_GT(inside, 0);
    EXPECT_LT(inside, 8);  // both sides of the range are exercised
  }
  expectImportError(model(false, true), {"'quant' (QuantizeLinear)", "reads_q", "quantize-dequantize pairs"});
}

// ampc_export.py writes detach() as an ampc.StopGradient node (no exporter keeps detach): its
// operand's value, and no gradient through it. VQ-VAE's straight-through estimator and codebook
// losses: loss = sum(c * (z + sg(q - z))) + sum((q - sg(z))^2), so dz = c and dq = 2 (q - z). As a
// plain Identity (what the exporters write without the marker) the loss is sum(c q) + sum((q - z)^2):
// dz = -2 (q - z) and dq = c + 2 (q - z).
// PyTorch 2.11's dynamo exporter writes a Conv3d without bias with B = Expand(0, [1, M]), a shape
// ONNX's Conv does not take: a bias of constant zeros is dropped (no bias), where a zero bias
// initializer (a parameter) stays and trains.
TEST(OnnxImport, ZeroConstantConvBiasIsNoBias) {
  TempDir d;
  auto model = [&](bool constantBias) {
    auto m = newModel(18);
    auto* g = m.mutable_graph();
    addTensorInput(g, "x", onnx::TensorProto::FLOAT, {1, 2, 3, 4, 4});
    addFloatInit(g, "w", {3, 2, 1, 1, 1}, {1, 2, 3, 4, 5, 6});
    if (constantBias) {
      auto* z = addNode(g, "Constant", {}, {"zero"}, "zero");
      auto* a = z->add_attribute();
      a->set_name("value");
      a->set_type(onnx::AttributeProto::TENSOR);
      a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
      a->mutable_t()->add_float_data(0.0f);
      addInt64Init(g, "bshape", {1, 3});
      addNode(g, "Expand", {"zero", "bshape"}, {"b"}, "bias");
    } else {
      addFloatInit(g, "b", {3}, {0, 0, 0});
    }
    addNode(g, "Conv", {"x", "w", "b"}, {"y"}, "conv3d");
    addNode(g, "ReduceSum", {"y"}, {"loss"}, "sum");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addOutput(g, "loss");
    const std::string f = d.file(constantBias ? "expanded.onnx" : "param.onnx");
    writeModel(f, m);
    return f;
  };
  auto convInputs = [](const Graph& g) {
    for (const auto& n : g.nodes())
      if (n->op() == "Conv") return n->numInputs();
    return size_t{0};
  };
  auto expanded = importOnnxFile(model(true));
  EXPECT_EQ(convInputs(*expanded), 2u);
  auto param = importOnnxFile(model(false));
  EXPECT_EQ(convInputs(*param), 3u);
  EXPECT_EQ(trainableParams(*param, {}).size(), 2u);  // w and b
}

TEST(OnnxImport, StopGradientMarkerStopsTheGradient) {
  TempDir d;
  const std::vector<float> zv{0.5f, -1.25f, 2.0f, 0.75f}, qv{0.25f, -1.0f, 3.0f, 0.0f}, cv{1.0f, -2.0f, 0.5f, 3.0f};
  auto model = [&](const std::string& name, bool marker, int inputs) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addFloatInit(g, "z", {4}, zv);
    addFloatInit(g, "q", {4}, qv);
    addFloatInit(g, "c", {4}, cv);
    addNode(g, "Sub", {"q", "z"}, {"diff"}, "diff");
    auto stop = [&](const std::string& in, const std::string& out, const std::string& n) {
      if (inputs == 0) return in;  // no node at all, as the exporters write detach()
      std::vector<std::string> ins(static_cast<size_t>(inputs), in);
      auto* node = addNode(g, marker ? "StopGradient" : "Identity", ins, {out}, n);
      if (marker) node->set_domain("ampc");
      return out;
    };
    addNode(g, "Add", {"z", stop("diff", "diff_sg", "detach_diff")}, {"zst"}, "straight_through");
    addNode(g, "Mul", {"zst", "c"}, {"zc"}, "weigh");
    addNode(g, "Sub", {"q", stop("z", "z_sg", "detach_z")}, {"e"}, "commit");
    addNode(g, "Mul", {"e", "e"}, {"e2"}, "square");
    addNode(g, "Add", {"zc", "e2"}, {"terms"}, "terms");
    addNode(g, "ReduceSum", {"terms"}, {"loss"}, "sum");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addOutput(g, "loss");
    const std::string f = d.file(name + ".onnx");
    writeModel(f, m);
    return f;
  };
  auto backend = createCpuBackend();
  auto gradients = [&](const std::string& f, ImportOptions opts = {}, std::vector<std::string>* notes = nullptr) {
    auto g = importOnnxFile(f, opts);
    if (notes) *notes = g->importNotes;
    createAutodiffPass()->run(*g);
    return evaluate(*g, {}, *backend);  // the loss, then z's, q's and c's gradients
  };
  const auto marked = gradients(model("marked", true, 1));
  const auto plain = gradients(model("plain", false, 1));
  ASSERT_EQ(marked.size(), 4u);
  ASSERT_EQ(plain.size(), 4u);
  double loss = 0;
  for (size_t i = 0; i < 4; ++i) loss += double(cv[i]) * qv[i] + double(qv[i] - zv[i]) * (qv[i] - zv[i]);
  EXPECT_NEAR(marked[0].getDouble(0), loss, 1e-5);
  EXPECT_EQ(marked[0].getDouble(0), plain[0].getDouble(0));  // the marker is its operand's value
  for (int64_t i = 0; i < 4; ++i) {
    const double two = 2.0 * (qv[i] - zv[i]);
    EXPECT_NEAR(marked[1].getDouble(i), cv[i], 1e-6) << i;  // dz: the straight-through gradient only
    EXPECT_NEAR(marked[2].getDouble(i), two, 1e-6) << i;    // dq: the commitment term only
    EXPECT_NEAR(plain[1].getDouble(i), -two, 1e-6) << i;     // what ampc gave a detach() before
    EXPECT_NEAR(plain[2].getDouble(i), cv[i] + two, 1e-6) << i;
  }
  expectImportError(model("two", true, 2), {"'detach_diff' (ampc.StopGradient)", "one input"});

  // With no marker at all, z + (q - z) is named in a note; --straight-through reads it as the
  // estimator (dz = c, dq = 0 from that term), the commitment term still as written.
  std::vector<std::string> notes;
  const auto written = gradients(model("bare", false, 0), {}, &notes);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("'straight_through'"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("--straight-through"), std::string::npos) << notes[0];
  ImportOptions ste;
  ste.straightThrough = true;
  const auto estimated = gradients(model("bare", false, 0), ste);
  ASSERT_EQ(written.size(), 4u);
  ASSERT_EQ(estimated.size(), 4u);
  for (int64_t i = 0; i < 4; ++i) {
    const double two = 2.0 * (qv[i] - zv[i]);
    EXPECT_NEAR(written[1].getDouble(i), -two, 1e-6) << i;
    EXPECT_NEAR(written[2].getDouble(i), cv[i] + two, 1e-6) << i;
    EXPECT_NEAR(estimated[1].getDouble(i), cv[i] - two, 1e-6) << i;
    EXPECT_NEAR(estimated[2].getDouble(i), two, 1e-6) << i;
  }
  // The marked model has no such Add: the marker stands between the Sub and it.
  std::vector<std::string> markedNotes;
  gradients(model("marked", true, 1), {}, &markedNotes);
  EXPECT_TRUE(markedNotes.empty());

  // A marker on a constant (a value computed under no_grad() from constants alone: the XGLM export's
  // scalars) folds with it: the import goes on, and the constant weighs z's gradient.
  {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addFloatInit(g, "z", {4}, zv);
    auto* k = addNode(g, "Constant", {}, {"k"}, "three");
    auto* a = k->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    a->mutable_t()->add_float_data(3.0f);
    addNode(g, "StopGradient", {"k"}, {"k_sg"}, "detach_k")->set_domain("ampc");
    addNode(g, "Mul", {"z", "k_sg"}, {"zk"}, "weigh");
    addNode(g, "ReduceSum", {"zk"}, {"loss"}, "sum");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addOutput(g, "loss");
    writeModel(d.file("const.onnx"), m);
    const auto r = gradients(d.file("const.onnx"));
    ASSERT_EQ(r.size(), 2u);
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(r[1].getDouble(i), 3.0) << i;
  }
}

// ScatterElements / ScatterND with reduction 'none' where two updates write one element: ONNX leaves
// which lands undefined, and PyTorch's dynamo exporter writes scatter_reduce(reduce="mean") so (the
// sweep's gnn_scatter: a different loss, silently). Refused by name where the indices are known ahead,
// folded or computed from constants (an Expand of an index buffer past fold-constants' size); accepted
// where the updates are one constant value (the exporter's own zeros) or the reduction is add.
TEST(OnnxImport, ScatterThatWritesAnElementTwiceIsRefused) {
  TempDir d;
  auto model = [&](const std::string& name, const std::string& op, int64_t width, bool constantUpdates, const std::string& reduction) {
    auto m = newModel(18);
    auto* g = m.mutable_graph();
    const bool nd = op == "ScatterND";
    addTensorInput(g, "u", onnx::TensorProto::FLOAT, {3, width});
    addFloatInit(g, "data", {4, width}, std::vector<float>(static_cast<size_t>(4 * width), 0.5f));
    auto* rows = addInt64Init(g, "rows", {0, 2, 0});
    rows->clear_dims();
    rows->add_dims(3);
    rows->add_dims(1);
    addInt64Init(g, "shape", {3, nd ? 1 : width});
    addNode(g, "Expand", {"rows", "shape"}, {"idx"}, "expand");  // [3, width] (ScatterND: [3, 1]) rows 0, 2, 0
    std::string updates = "u";
    if (constantUpdates) {  // ConstantOfShape's zeros, as the exporter writes them (folded at width 4 only)
      addInt64Init(g, "ushape", {3, width});
      addNode(g, "ConstantOfShape", {"ushape"}, {"zeros"}, "zeros");
      updates = "zeros";
    }
    auto* n = addNode(g, op, {"data", "idx", updates}, {"y"}, "scatter");
    if (!nd) intAttr(n, "axis", 0);
    if (!reduction.empty()) stringAttr(n, "reduction", reduction);
    addNode(g, "ReduceSum", {"y"}, {"s"}, "sum");
    addOutput(g, "s");
    const std::string f = d.file(name + ".onnx");
    writeModel(f, m);
    return f;
  };
  for (const char* op : {"ScatterElements", "ScatterND"})
    for (int64_t width : {4, 2048}) {  // 3 x 4 indices fold; 3 x 2048 do not (ScatterND's [3, 1] always do)
      SCOPED_TRACE(std::string(op) + " width " + std::to_string(width));
      expectImportError(model("twice", op, width, false, ""), {"'scatter'", "updates 0 and ", "write the same element", "scatter_reduce"});
      EXPECT_NO_THROW(importOnnxFile(model("zeros", op, width, true, "")));
      EXPECT_NO_THROW(importOnnxFile(model("add", op, width, false, "add")));
    }
}

// x[mask] with the mask computed at run time (NonZero, then GatherND: PyTorch's boolean indexing):
// the rows are padded to the mask's element count, and every reduction over them and the loss see
// only the selected rows. The loss against a reference computed here from the selection itself, its
// gradients against central differences (both in f64), a mean over an empty selection NaN (as
// PyTorch's), and the refusals: the rows as a graph output, merged by a Reshape, or mixed with
// another mask's.
TEST(OnnxImport, RowsSelectedAtRunTimeArePaddedToTheirBound) {
  TempDir d;
  const std::vector<double> xv = {0.3, -1.2, 0.8, 1.5, 0.1, -0.4, 0.9, 0.7, -0.6, -1.1, 0.2, 0.5, 1.3, -0.8, 0.4,
                                  0.6, -0.3, 1.0, -0.9, 0.35, 0.75, 1.1, -0.2, -0.65, 0.05, 0.45, -1.4, 0.85, -0.15, 0.25};
  const std::vector<double> wv = {0.5, -0.3, 0.2, 0.1, -0.4, 0.6, 0.3, -0.2, 0.7, 0.1, -0.5, 0.4};
  const std::vector<int64_t> labels = {1, 3, 0, 2, 1, 0, 3, 3, 2, 1};
  enum Use { kLosses, kOutput, kMerged, kTwoMasks, kScatter };
  auto model = [&](const std::string& name, const std::vector<double>& mp, Use use) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "x", {2, 5, 3}, xv);
    addDoubleInit(g, "w", {3, 4}, wv);
    addDoubleInit(g, "mp", {2, 5}, mp);  // a parameter: the mask is computed at run time
    auto* lb = addInt64Init(g, "labels", labels);
    lb->clear_dims();
    lb->add_dims(2);
    lb->add_dims(5);
    addDoubleInit(g, "zero", {}, {0.0});
    addNode(g, "Greater", {"mp", "zero"}, {"mask"}, "mask");
    addNode(g, "NonZero", {"mask"}, {"nz"}, "nz");
    intsAttr(addNode(g, "Transpose", {"nz"}, {"idx"}, "idx"), "perm", {1, 0});
    addNode(g, "GatherND", {"x", "idx"}, {"rows"}, "rows");  // [count, 3]
    addNode(g, "MatMul", {"rows", "w"}, {"logits"}, "logits");  // [count, 4]
    if (use == kScatter) {  // the dynamo exporter's form of x[b, t] and index_add: columns, Shape, Expand, ScatterND(add)
      addInt64Init(g, "c0", {0});
      addInt64Init(g, "c1", {1});
      addInt64Init(g, "c2", {2});
      addNode(g, "Slice", {"nz", "c0", "c1", "c0"}, {"b2"}, "b2");  // [1, count]
      addNode(g, "Slice", {"nz", "c1", "c2", "c0"}, {"t2"}, "t2");
      addNode(g, "Squeeze", {"b2", "c0"}, {"b"}, "b");
      addNode(g, "Squeeze", {"t2", "c0"}, {"t"}, "t");
      intAttr(addNode(g, "Shape", {"b"}, {"bshape"}, "bshape"), "start", 0);
      addInt64Init(g, "zero_at", {0});
      addNode(g, "Gather", {"bshape", "zero_at"}, {"count1"}, "count1");  // [1]: the count, as sym_size_int
      addNode(g, "Squeeze", {"count1"}, {"count"}, "count");
      addNode(g, "Reshape", {"count", "c1"}, {"count_again"}, "count_again");  // [1] again
      addNode(g, "Expand", {"t", "count_again"}, {"tb"}, "tb");
      addInt64Init(g, "last", {-1});
      addNode(g, "Unsqueeze", {"b", "last"}, {"bu"}, "bu");
      addNode(g, "Unsqueeze", {"tb", "last"}, {"tu"}, "tu");
      intAttr(addNode(g, "Concat", {"bu", "tu"}, {"pairs"}, "pairs"), "axis", -1);
      std::vector<double> zeros(40, 0.0), posw(40);
      for (size_t k = 0; k < 40; ++k) posw[k] = 0.1 * static_cast<double>(k % 7) - 0.25;
      addDoubleInit(g, "zeros", {2, 5, 4}, zeros);
      addDoubleInit(g, "posw", {2, 5, 4}, posw);
      stringAttr(addNode(g, "ScatterND", {"zeros", "pairs", "logits"}, {"placed"}, "placed"), "reduction", "add");
      addNode(g, "Mul", {"placed", "posw"}, {"weighted"}, "weighted");
      addNode(g, "ReduceSum", {"weighted"}, {"loss"}, "sum");
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addOutput(g, "loss");
    } else if (use == kOutput) {
      addOutput(g, "logits");
    } else if (use == kMerged) {
      addInt64Init(g, "flat", {-1});
      addNode(g, "Reshape", {"logits", "flat"}, {"merged"}, "merged");
      addNode(g, "ReduceSum", {"merged"}, {"loss"}, "sum");
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addOutput(g, "loss");
    } else if (use == kTwoMasks) {
      addNode(g, "Less", {"mp", "zero"}, {"other"}, "other");
      addNode(g, "NonZero", {"other"}, {"nz2"}, "nz2");
      intsAttr(addNode(g, "Transpose", {"nz2"}, {"idx2"}, "idx2"), "perm", {1, 0});
      addNode(g, "GatherND", {"x", "idx2"}, {"rows2"}, "rows2");
      addNode(g, "Add", {"rows", "rows2"}, {"mixed"}, "mixed");
      addNode(g, "ReduceSum", {"mixed"}, {"loss"}, "sum");
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addOutput(g, "loss");
    } else {
      // The labels through a mask made again by its own nodes (the dynamo exporter's pred[m(o)] - value[m(o)]).
      addNode(g, "Greater", {"mp", "zero"}, {"mask_again"}, "mask_again");
      addNode(g, "NonZero", {"mask_again"}, {"nz_again"}, "nz_again");
      intsAttr(addNode(g, "Transpose", {"nz_again"}, {"idx_again"}, "idx_again"), "perm", {1, 0});
      addNode(g, "GatherND", {"labels", "idx_again"}, {"picked"}, "picked");
      addNode(g, "SoftmaxCrossEntropyLoss", {"logits", "picked"}, {"ce"}, "ce");
      addNode(g, "Mul", {"logits", "logits"}, {"sq"}, "sq");
      addNode(g, "ReduceMean", {"sq"}, {"msq"}, "msq");  // over every axis, the rows among them
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addNode(g, "ReduceMax", {"logits"}, {"colmax"}, "colmax");  // [4]: each column's max over the rows
      intsAttr(g->mutable_node(g->node_size() - 1), "axes", {0});
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addNode(g, "ReduceSum", {"colmax"}, {"smax"}, "smax");
      intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
      addNode(g, "Add", {"ce", "msq"}, {"l2"}, "l2");
      auto* eps = addNode(g, "Constant", {}, {"eps"}, "eps")->add_attribute();
      eps->set_name("value");
      eps->set_type(onnx::AttributeProto::TENSOR);
      eps->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
      eps->mutable_t()->add_float_data(0.0f);
      addNode(g, "CastLike", {"eps", "logits"}, {"zero_like"}, "zero_like");  // the rows give only a dtype (F.normalize's eps)
      addNode(g, "Add", {"l2", "zero_like"}, {"l3"}, "l3");
      addNode(g, "Add", {"l3", "smax"}, {"loss"}, "loss");
      addOutput(g, "loss");
    }
    const std::string f = d.file(name + ".onnx");
    writeModel(f, m);
    return f;
  };
  // The reference: the selected rows in row-major order of the mask.
  auto reference = [&](const std::vector<double>& mp) {
    std::vector<std::vector<double>> logit;
    std::vector<int64_t> lab;
    for (size_t k = 0; k < mp.size(); ++k) {
      if (mp[k] <= 0) continue;
      std::vector<double> row(4, 0.0);
      for (int c = 0; c < 4; ++c)
        for (int e = 0; e < 3; ++e) row[c] += xv[k * 3 + e] * wv[e * 4 + c];
      logit.push_back(row);
      lab.push_back(labels[k]);
    }
    double ce = 0, sq = 0, smax = 0;
    for (size_t r = 0; r < logit.size(); ++r) {
      double mx = -INFINITY, s = 0;
      for (double v : logit[r]) mx = std::max(mx, v);
      for (double v : logit[r]) s += std::exp(v - mx), sq += v * v;
      ce += mx + std::log(s) - logit[r][static_cast<size_t>(lab[r])];
    }
    for (int c = 0; c < 4; ++c) {
      double mx = -INFINITY;
      for (const auto& row : logit) mx = std::max(mx, row[c]);
      smax += mx;
    }
    const double n = static_cast<double>(logit.size());
    return ce / n + sq / (4 * n) + smax;
  };
  auto backend = createCpuBackend();
  // Four of ten selected, the last first in neither row; then all ten; then one.
  for (const auto& mp : {std::vector<double>{0.5, -1, 2, -1, -1, -1, 1, -1, 3, -1}, std::vector<double>(10, 1.0),
                         std::vector<double>{-1, -1, -1, -1, -1, -1, -1, 2, -1, -1}}) {
    auto g = importOnnxFile(model("losses", mp, kLosses));
    EXPECT_NEAR(evaluate(*g, {}, *backend)[0].getDouble(0), reference(mp), 1e-12);
    EXPECT_LT(gradientError(*g), 1e-6);
    const auto trained = trainableParams(*g, {});
    EXPECT_EQ(trained.size(), 2u);  // x and w; the mask's parameter has no differentiable path
  }
  for (const auto& mp : {std::vector<double>{0.5, -1, 2, -1, -1, -1, 1, -1, 3, -1}, std::vector<double>(10, 1.0)}) {
    auto g = importOnnxFile(model("scatter", mp, kScatter));
    double want = 0;  // each selected row's logits, placed back at its position, weighted there
    for (size_t k = 0; k < mp.size(); ++k)
      for (size_t c = 0; mp[k] > 0 && c < 4; ++c) {
        double v = 0;
        for (size_t e = 0; e < 3; ++e) v += xv[k * 3 + e] * wv[e * 4 + c];
        want += v * (0.1 * static_cast<double>((k * 4 + c) % 7) - 0.25);
      }
    EXPECT_NEAR(evaluate(*g, {}, *backend)[0].getDouble(0), want, 1e-12);
    EXPECT_LT(gradientError(*g), 1e-6);
  }
  {  // an empty selection: the mean over no rows is NaN, as torch.mean of an empty tensor
    auto g = importOnnxFile(model("empty", std::vector<double>(10, -1.0), kLosses));
    EXPECT_TRUE(std::isnan(evaluate(*g, {}, *backend)[0].getDouble(0)));
  }
  const std::vector<double> some = {0.5, -1, 2, -1, -1, -1, 1, -1, 3, -1};
  expectImportError(model("output", some, kOutput), {"graph output 'logits'", "node 'nz' (NonZero) selects at run time"});
  expectImportError(model("merged", some, kMerged), {"node 'merged' (Reshape)", "padded to 10 rows", "merges the rows' axis"});
  expectImportError(model("two", some, kTwoMasks), {"node 'mixed' (Add)", "another selection's rows"});
}

// Selected rows viewed as groups (BART's and T5's classification heads: hidden[eos_mask].view(B, -1,
// H)[:, -1, :]): a Reshape of [count, 3] to [2, -1, 3] splits the rows row-major into two groups of
// count / 2, and the last (Gather -1, or Slice [-1:]) or first (Gather 0) row of each group is read.
// Against a reference for two masks (2 + 2 selected, and 3 + 1: groups across the mask's rows, as a
// view makes them), with the gradient against central differences; 3 selected (no view in
// PyTorch) and none (no last row) give NaN.
TEST(OnnxImport, SelectedRowsViewedAsGroups) {
  TempDir d;
  const std::vector<double> xv = {0.3, -1.2, 0.8, 1.5, 0.1, -0.4, 0.9, 0.7, -0.6, -1.1, 0.2, 0.5, 1.3, -0.8, 0.4,
                                  0.6, -0.3, 1.0, -0.9, 0.35, 0.75, 1.1, -0.2, -0.65, 0.05, 0.45, -1.4, 0.85, -0.15, 0.25};
  const std::vector<double> wt = {0.5, -0.3, 0.2, 0.1, -0.4, 0.6};  // [2, 3]: each group's weights
  enum Read { kGatherLast, kSliceLast, kGatherFirst };
  auto model = [&](const std::string& name, const std::vector<double>& mp, Read read) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "x", {2, 5, 3}, xv);
    addDoubleInit(g, "mp", {2, 5}, mp);
    addDoubleInit(g, "zero", {}, {0.0});
    addNode(g, "Greater", {"mp", "zero"}, {"mask"}, "mask");
    addNode(g, "NonZero", {"mask"}, {"nz"}, "nz");
    intsAttr(addNode(g, "Transpose", {"nz"}, {"idx"}, "idx"), "perm", {1, 0});
    addNode(g, "GatherND", {"x", "idx"}, {"rows"}, "rows");  // [count, 3]
    addInt64Init(g, "groups", {2, -1, 3});
    addNode(g, "Reshape", {"rows", "groups"}, {"grouped"}, "grouped");  // [2, count / 2, 3]
    if (read == kSliceLast) {
      addInt64Init(g, "s", {-1});
      addInt64Init(g, "e", {std::numeric_limits<int64_t>::max()});
      addInt64Init(g, "a", {1});
      addNode(g, "Slice", {"grouped", "s", "e", "a"}, {"last1"}, "last");  // [2, 1, 3]
      addInt64Init(g, "sq", {1});
      addNode(g, "Squeeze", {"last1", "sq"}, {"picked"}, "squeeze");
    } else {
      auto* at = addInt64Init(g, "at", {read == kGatherLast ? -1 : 0});
      at->clear_dims();  // a scalar index: the axis goes
      intAttr(addNode(g, "Gather", {"grouped", "at"}, {"picked"}, "pick"), "axis", 1);  // [2, 3]
    }
    addDoubleInit(g, "wt", {2, 3}, wt);
    addNode(g, "Mul", {"picked", "wt"}, {"weighted"}, "weighted");
    addNode(g, "ReduceSum", {"weighted"}, {"loss"}, "sum");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addOutput(g, "loss");
    const std::string f = d.file(name + ".onnx");
    writeModel(f, m);
    return f;
  };
  auto reference = [&](const std::vector<double>& mp, bool last) {
    std::vector<size_t> sel;
    for (size_t k = 0; k < mp.size(); ++k)
      if (mp[k] > 0) sel.push_back(k);
    const size_t per = sel.size() / 2;
    double loss = 0;
    for (size_t grp = 0; grp < 2; ++grp) {
      const size_t row = sel[grp * per + (last ? per - 1 : 0)];
      for (size_t c = 0; c < 3; ++c) loss += wt[grp * 3 + c] * xv[row * 3 + c];
    }
    return loss;
  };
  auto backend = createCpuBackend();
  const std::vector<double> even = {0.5, -1, 2, -1, -1, -1, 1, -1, 3, -1}, across = {0.5, 1, -1, 2, -1, -1, -1, -1, 3, -1};
  for (const auto& mp : {even, across})
    for (const Read read : {kGatherLast, kSliceLast, kGatherFirst}) {
      SCOPED_TRACE(std::to_string(static_cast<int>(read)) + (mp == even ? " two a row" : " across rows"));
      auto g = importOnnxFile(model("grouped", mp, read));
      EXPECT_NEAR(evaluate(*g, {}, *backend)[0].getDouble(0), reference(mp, read != kGatherFirst), 1e-12);
      EXPECT_LT(gradientError(*g), 1e-6);
    }
  auto odd = importOnnxFile(model("odd", {0.5, -1, 2, -1, -1, -1, 1, -1, -3, -1}, kGatherLast));
  EXPECT_TRUE(std::isnan(evaluate(*odd, {}, *backend)[0].getDouble(0)));
  // No row selected: [:, -1] raises in PyTorch, and [:, -1:] is empty (its squeeze and product
  // raise too); not a padding row.
  for (const Read read : {kGatherLast, kSliceLast, kGatherFirst}) {
    auto none = importOnnxFile(model("none", std::vector<double>(10, -1.0), read));
    EXPECT_TRUE(std::isnan(evaluate(*none, {}, *backend)[0].getDouble(0))) << static_cast<int>(read);
  }
}

// Unique of a value computed at run time (torch.unique; the dynamo exporter's embedding renorm): the
// distinct values a padded selection, found by comparing every pair; a constant folds. The loss
// over the distinct rows of a table, the counts and the first indices, against a reference, with
// its gradient against central differences; the inverse indices against the ranks, sorted and in
// order of first occurrence.
TEST(OnnxImport, UniqueOfAComputedValueIsAPaddedSelection) {
  TempDir d;
  const std::vector<int64_t> ids = {3, 1, 3, 7, 1, 1, 9, 3, 7, 0, 2, 9};
  std::vector<double> table(30);
  for (size_t k = 0; k < table.size(); ++k) table[k] = 0.1 * static_cast<double>(k % 7) - 0.3 + 0.01 * static_cast<double>(k);
  auto model = [&](const std::string& name, bool sorted, bool constant) {
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "table", {10, 3}, table);
    if (constant) {
      auto* c = addInt64Init(g, "ids", ids);
      c->clear_dims();
      c->add_dims(2);
      c->add_dims(6);
    } else {  // ids computed from a parameter (floor(ids + 0.5)): a value of the run
      std::vector<double> p;
      for (int64_t v : ids) p.push_back(static_cast<double>(v) + 0.5);
      addDoubleInit(g, "idsp", {2, 6}, p);
      addNode(g, "Floor", {"idsp"}, {"idsf"}, "idsf");
      intAttr(addNode(g, "Cast", {"idsf"}, {"ids"}, "ids"), "to", onnx::TensorProto::INT64);
    }
    intAttr(addNode(g, "Unique", {"ids"}, {"y", "first", "inverse", "counts"}, "unique"), "sorted", sorted ? 1 : 0);
    intAttr(addNode(g, "Gather", {"table", "y"}, {"rows"}, "rows"), "axis", 0);  // the distinct rows
    addNode(g, "Mul", {"rows", "rows"}, {"sq"}, "sq");
    addNode(g, "ReduceSum", {"sq"}, {"l1"}, "l1");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    intAttr(addNode(g, "Cast", {"counts"}, {"cf"}, "cf"), "to", onnx::TensorProto::DOUBLE);
    intAttr(addNode(g, "Cast", {"y"}, {"yf"}, "yf"), "to", onnx::TensorProto::DOUBLE);
    addNode(g, "Mul", {"cf", "yf"}, {"cy"}, "cy");
    addNode(g, "ReduceSum", {"cy"}, {"l2"}, "l2");  // sum of count * value = the sum of the ids
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addInt64Init(g, "flat", {-1});
    addNode(g, "Reshape", {"ids", "flat"}, {"idsflat"}, "idsflat");
    intAttr(addNode(g, "Gather", {"idsflat", "first"}, {"atfirst"}, "atfirst"), "axis", 0);
    addNode(g, "Sub", {"atfirst", "y"}, {"diff"}, "diff");  // 0: each value at its first index
    intAttr(addNode(g, "Cast", {"diff"}, {"difff"}, "difff"), "to", onnx::TensorProto::DOUBLE);
    addNode(g, "Abs", {"difff"}, {"absd"}, "absd");
    addNode(g, "ReduceSum", {"absd"}, {"l3"}, "l3");
    intAttr(g->mutable_node(g->node_size() - 1), "keepdims", 0);
    addDoubleInit(g, "half", {}, {0.5});
    addNode(g, "Mul", {"l2", "half"}, {"l2h"}, "l2h");
    addNode(g, "Add", {"l1", "l2h"}, {"l12"}, "l12");
    addNode(g, "Add", {"l12", "l3"}, {"loss"}, "loss");
    addOutput(g, "loss");
    addOutput(g, "inverse");
    const std::string f = d.file(name + ".onnx");
    writeModel(f, m);
    return f;
  };
  double want = 0, idsum = 0;
  for (int64_t v : {0, 1, 2, 3, 7, 9})
    for (int c = 0; c < 3; ++c) want += table[static_cast<size_t>(v * 3 + c)] * table[static_cast<size_t>(v * 3 + c)];
  for (int64_t v : ids) idsum += static_cast<double>(v);
  want += 0.5 * idsum;
  const std::map<int64_t, int64_t> rankSorted = {{0, 0}, {1, 1}, {2, 2}, {3, 3}, {7, 4}, {9, 5}};
  const std::map<int64_t, int64_t> rankFirst = {{3, 0}, {1, 1}, {7, 2}, {9, 3}, {0, 4}, {2, 5}};
  auto backend = createCpuBackend();
  for (bool constant : {false, true})
    for (bool sorted : {true, false}) {
      auto g = importOnnxFile(model(std::string(constant ? "const" : "run") + (sorted ? "_sorted" : "_first"), sorted, constant));
      const auto outs = evaluate(*g, {}, *backend);
      EXPECT_NEAR(outs[0].getDouble(0), want, 1e-12) << constant << sorted;
      ASSERT_EQ(outs[1].type.str(), "i64[12]");
      for (size_t i = 0; i < ids.size(); ++i)
        EXPECT_EQ(outs[1].getInt(static_cast<int64_t>(i)), (sorted ? rankSorted : rankFirst).at(ids[i])) << i << " " << constant << sorted;
      if (!constant) EXPECT_LT(gradientError(*g), 1e-6);
    }
  {  // a computed float input: refused by name (torch.unique's NaNs are each distinct and sort last)
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "v", {4}, {1, 2, 2, 3});
    addNode(g, "Unique", {"v"}, {"y"}, "float_unique");
    addNode(g, "ReduceSum", {"y"}, {"s"}, "s");
    addOutput(g, "s");
    writeModel(d.file("float.onnx"), m);
    expectImportError(d.file("float.onnx"), {"node 'float_unique' (Unique)", "f64[4]", "integer and bool inputs"});
  }
}

// self + Scatter(zeros, indices, updates) without reduction, the scatter read by that Add alone, is
// how PyTorch's TorchScript exporter writes index_add and index_put(accumulate): over indices that
// repeat at run time (no constant to check), the updates are summed, as PyTorch does.
TEST(OnnxImport, ScatterIntoZerosThenAddSumsRepeatedIndices) {
  TempDir d;
  for (const char* op : {"ScatterElements", "ScatterND"}) {
    SCOPED_TRACE(op);
    const bool nd = std::string(op) == "ScatterND";
    auto m = newModel(17);
    auto* g = m.mutable_graph();
    addDoubleInit(g, "base", {4}, {10, 20, 30, 40});
    addDoubleInit(g, "upd", {3}, {1.5, 2, 3});
    addDoubleInit(g, "idxp", nd ? std::vector<int64_t>{3, 1} : std::vector<int64_t>{3}, {0.5, 2.5, 0.5});  // rows 0, 2, 0 at run time
    addNode(g, "Floor", {"idxp"}, {"idxf"}, "idxf");
    intAttr(addNode(g, "Cast", {"idxf"}, {"idx"}, "idx"), "to", onnx::TensorProto::INT64);
    auto* zt = addNode(g, "Constant", {}, {"zeros"}, "zeros_const")->add_attribute();  // a constant (an initializer is a parameter)
    zt->set_name("value");
    zt->set_type(onnx::AttributeProto::TENSOR);
    zt->mutable_t()->set_data_type(onnx::TensorProto::DOUBLE);
    zt->mutable_t()->add_dims(4);
    for (int k = 0; k < 4; ++k) zt->mutable_t()->add_double_data(0.0);
    auto* s = addNode(g, op, {"zeros", "idx", "upd"}, {"scattered"}, "scatter");
    if (!nd) intAttr(s, "axis", 0);
    addNode(g, "Add", {"base", "scattered"}, {"y"}, "y");
    addOutput(g, "y");
    const std::string f = d.file(std::string(op) + ".onnx");
    writeModel(f, m);
    auto gr = importOnnxFile(f);
    auto backend = createCpuBackend();
    const Tensor y = evaluate(*gr, {}, *backend)[0];
    const std::vector<double> want = {14.5, 20, 32, 40};
    for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(y.getDouble(k), want[static_cast<size_t>(k)]) << k;
  }
}
