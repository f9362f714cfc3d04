#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "compiler/onnx/onnx.h"

namespace ampc {
namespace {

void tensorToProto(const Tensor& t, const std::string& name, onnx::TensorProto* p, bool withData = true) {
  p->set_name(name);
  p->set_data_type(dtypeToOnnx(t.type.dtype));
  for (int64_t d : t.type.shape) p->add_dims(d);
  if (withData) p->set_raw_data(t.data.data(), t.data.size());
}

void valueInfo(const Value* v, onnx::ValueInfoProto* vi) {
  vi->set_name(v->name());
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(dtypeToOnnx(v->type().dtype));
  auto* shape = tt->mutable_shape();
  for (int64_t d : v->type().shape) shape->add_dim()->set_dim_value(d);
}

void attrToProto(const std::string& name, const Attribute& a, onnx::AttributeProto* p) {
  p->set_name(name);
  struct V {
    onnx::AttributeProto* p;
    void operator()(int64_t v) const { p->set_type(onnx::AttributeProto::INT); p->set_i(v); }
    void operator()(float v) const { p->set_type(onnx::AttributeProto::FLOAT); p->set_f(v); }
    void operator()(const std::string& v) const { p->set_type(onnx::AttributeProto::STRING); p->set_s(v); }
    void operator()(const std::vector<int64_t>& v) const {
      p->set_type(onnx::AttributeProto::INTS);
      for (auto x : v) p->add_ints(x);
    }
    void operator()(const std::vector<float>& v) const {
      p->set_type(onnx::AttributeProto::FLOATS);
      for (auto x : v) p->add_floats(x);
    }
    void operator()(const std::vector<std::string>& v) const {
      p->set_type(onnx::AttributeProto::STRINGS);
      for (const auto& x : v) p->add_strings(x);
    }
    void operator()(const Tensor& t) const {
      p->set_type(onnx::AttributeProto::TENSOR);
      tensorToProto(t, "", p->mutable_t());
    }
  };
  std::visit(V{p}, a);
}

// The ONNX IR version that goes with an opset (ONNX's versioning table).
int64_t irVersionFor(int opset) {
  if (opset <= 17) return 8;
  if (opset <= 19) return 9;
  return 10;
}

}  // namespace

onnx::ModelProto exportOnnx(const Graph& g, const ExportOptions& opts) {
  onnx::ModelProto m;
  m.set_ir_version(irVersionFor(g.opset));
  m.set_producer_name("ampc");
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(g.opset);
  for (const auto& [d, v] : g.domainOpsets) {
    auto* o = m.add_opset_import();
    o->set_domain(d);
    o->set_version(v);
  }
  // The training semantics no ONNX op holds travel as the metadata the import reads: the trainable
  // set and the embeddings' padding rows (so a plan's step graph, built from the exported forward,
  // trains what the model says).
  if (g.declaredTrainable) {
    auto* e = m.add_metadata_props();
    e->set_key("ampc.trainable");
    e->set_value(nlohmann::json(*g.declaredTrainable).dump());
  }
  if (!g.embeddingPadding.empty()) {
    auto* e = m.add_metadata_props();
    e->set_key("ampc.embedding_padding");
    e->set_value(nlohmann::json(g.embeddingPadding).dump());
  }
  if (!g.frozenBatchNorms.empty()) {
    auto* e = m.add_metadata_props();
    e->set_key("ampc.frozen_batchnorms");
    e->set_value(nlohmann::json(g.frozenBatchNorms).dump());
  }
  auto* gp = m.mutable_graph();
  gp->set_name(g.name);
  for (const Value* v : g.inputs()) valueInfo(v, gp->add_input());
  for (const Value* v : g.params()) {
    if (!v->data()) throw Error("cannot export: param '" + v->name() + "' has no data");
    tensorToProto(*v->data(), v->name(), gp->add_initializer(), opts.initializerData);
  }
  // Constants become Constant nodes, in order, ahead of the graph's nodes.
  for (const Value* v : g.consts()) {
    if (!v->data()) throw Error("cannot export: const '" + v->name() + "' has no data (elided in the text form)");
    auto* n = gp->add_node();
    n->set_op_type("Constant");
    n->set_name(v->name());
    n->add_output(v->name());
    attrToProto("value", *v->data(), n->add_attribute());
  }
  for (const auto& node : g.nodes()) {
    auto* n = gp->add_node();
    n->set_op_type(node->op());
    if (!node->domain().empty()) n->set_domain(node->domain());
    n->set_name(node->name());
    for (const Value* in : node->inputs()) n->add_input(in ? in->name() : "");
    for (size_t i = 0; i < node->numResults(); ++i) n->add_output(node->result(i)->name());
    for (const auto& [k, a] : node->attrs()) attrToProto(k, a, n->add_attribute());
    if (!node->def())  // a custom op's result types travel as value_info
      for (size_t i = 0; i < node->numResults(); ++i) valueInfo(node->result(i), gp->add_value_info());
  }
  for (const Value* v : g.outputs()) valueInfo(v, gp->add_output());
  // The checker knows opsets up to the ONNX library's own; newer graphs are exported unchecked.
  const int checkerMax = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map().at("").second;
  if (g.opset > checkerMax || !opts.initializerData) return m;
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw Error(std::string("exported model fails onnx::checker: ") + e.what());
  }
  return m;
}

void exportOnnxFile(const Graph& g, const std::string& path) {
  onnx::ModelProto m = exportOnnx(g);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(path + ": cannot open for writing");
    if (!m.SerializeToOstream(&out) || !out.flush()) {
      out.close();
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw Error(path + ": rename failed: " + ec.message());
  }
}

}  // namespace ampc
