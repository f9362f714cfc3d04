#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

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
  nlohmann::json annotations = nlohmann::json::object();
  for (const auto& node : g.nodes()) {
    auto* n = gp->add_node();
    n->set_op_type(node->op());
    if (!node->domain().empty()) n->set_domain(node->domain());
    n->set_name(node->name());
    for (const Value* in : node->inputs()) n->add_input(in ? in->name() : "");
    for (size_t i = 0; i < node->numResults(); ++i) n->add_output(node->result(i)->name());
    for (const auto& [k, a] : node->attrs()) {
      // ampc's integer annotations on standard ops (kGradToFirst, kKeepFp32, kNoGradOperands) are no
      // ONNX attributes: in a model for other tools they travel as metadata, by the node's first result.
      if (opts.initializerData && node->domain().empty() && k.rfind("ampc_", 0) == 0 && std::holds_alternative<int64_t>(a)) {
        annotations[node->result(0)->name()][k] = std::get<int64_t>(a);
        continue;
      }
      attrToProto(k, a, n->add_attribute());
    }
    if (!node->def())  // a custom op's result types travel as value_info
      for (size_t i = 0; i < node->numResults(); ++i) valueInfo(node->result(i), gp->add_value_info());
  }
  for (const Value* v : g.outputs()) valueInfo(v, gp->add_output());
  if (!annotations.empty()) {
    auto* e = m.add_metadata_props();
    e->set_key("ampc.node_attributes");
    e->set_value(annotations.dump());
  }
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

int64_t writeOnnxWithWeights(const std::string& source, const std::map<std::string, const Tensor*>& weights, const std::string& path,
                             int64_t inlineBytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(source, ec)) throw Error(source + ": the model the plan was compiled from is not there (--save writes the weights alone)");
  onnx::ModelProto m;
  {
    std::ifstream in(source, std::ios::binary);
    if (!in || !m.ParseFromIstream(&in)) throw Error(source + ": not a valid ONNX model (the protobuf does not parse)");
  }
  const std::string dir = fs::path(source).parent_path().string();
  // Every initializer's data in memory, the trained ones replaced.
  std::vector<Tensor> data;
  int64_t replaced = 0, bytes = 0;
  auto* inits = m.mutable_graph()->mutable_initializer();
  for (int i = 0; i < inits->size(); ++i) {
    onnx::TensorProto& p = (*inits)[i];
    Tensor t = tensorFromOnnx(p, dir, source, "initializer '" + p.name() + "'");
    if (auto it = weights.find(p.name()); it != weights.end()) {
      const Tensor& w = *it->second;
      if (w.type.shape != t.type.shape || !isFloat(t.type.dtype))
        throw Error(source + ": initializer '" + p.name() + "' is " + t.type.str() + ", the trained value " + w.type.str());
      for (int64_t k = 0; k < t.numel(); ++k) t.setDouble(k, w.getDouble(k));
      ++replaced;
    }
    bytes += static_cast<int64_t>(t.data.size());
    data.push_back(std::move(t));
  }
  if (replaced != static_cast<int64_t>(weights.size())) {  // a trained value the file would not carry
    std::set<std::string> have;
    for (const auto& p : *inits) have.insert(p.name());
    for (const auto& [name, w] : weights)
      if (!have.count(name)) throw Error(source + ": '" + name + "' was trained but is no initializer of this model, so its trained value has nowhere to go");
  }
  const bool external = bytes > inlineBytes;
  const std::string dataName = fs::path(path).filename().string() + ".data";
  const std::string dataPath = (fs::path(path).parent_path() / dataName).string();
  auto writeAtomically = [&](const std::string& target, const std::function<bool(std::ofstream&)>& body) {
    const std::string tmp = target + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out || !body(out) || !out.flush()) {
        out.close();
        std::remove(tmp.c_str());
        throw Error(target + ": write failed");
      }
    }
    fs::rename(tmp, target, ec);
    if (ec) {
      std::remove(tmp.c_str());
      throw Error(target + ": rename failed: " + ec.message());
    }
  };
  int64_t offset = 0;
  for (int i = 0; i < inits->size(); ++i) {
    onnx::TensorProto& p = (*inits)[i];
    const Tensor& t = data[static_cast<size_t>(i)];
    p.clear_float_data();
    p.clear_int32_data();
    p.clear_int64_data();
    p.clear_double_data();
    p.clear_uint64_data();
    p.clear_string_data();
    p.clear_raw_data();
    p.clear_external_data();
    p.set_data_location(onnx::TensorProto::DEFAULT);
    if (!external) {
      p.set_raw_data(t.data.data(), t.data.size());
      continue;
    }
    p.set_data_location(onnx::TensorProto::EXTERNAL);
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", dataName}, {"offset", std::to_string(offset)},
                        {"length", std::to_string(t.data.size())}}) {
      auto* e = p.add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    offset += static_cast<int64_t>((t.data.size() + 4095) / 4096 * 4096);  // each tensor 4 KiB aligned, as onnx writes them
  }
  if (external)
    writeAtomically(dataPath, [&](std::ofstream& out) {
      const std::string pad(4096, '\0');
      for (const Tensor& t : data) {
        out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
        out.write(pad.data(), static_cast<std::streamsize>((4096 - t.data.size() % 4096) % 4096));
      }
      return static_cast<bool>(out);
    });
  writeAtomically(path, [&](std::ofstream& out) { return m.SerializeToOstream(&out); });
  return replaced;
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
