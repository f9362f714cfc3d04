// Helpers for tests: small ONNX models built in code, temp folders, running the ampc binary.
#pragma once

#include <onnx/onnx_pb.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <sys/wait.h>
#include <vector>

namespace ampc::test {

inline void addTensorInput(onnx::GraphProto* g, const std::string& name, int elemType, const std::vector<int64_t>& dims,
                           const std::vector<std::string>& symbolic = {}) {
  auto* vi = g->add_input();
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(elemType);
  auto* shape = tt->mutable_shape();
  for (size_t i = 0; i < dims.size(); ++i) {
    auto* d = shape->add_dim();
    if (i < symbolic.size() && !symbolic[i].empty()) d->set_dim_param(symbolic[i]);
    else d->set_dim_value(dims[i]);
  }
}

inline void addOutput(onnx::GraphProto* g, const std::string& name, int elemType = 0) {
  auto* vi = g->add_output();
  vi->set_name(name);
  if (elemType) vi->mutable_type()->mutable_tensor_type()->set_elem_type(elemType);
}

inline onnx::NodeProto* addNode(onnx::GraphProto* g, const std::string& op, const std::vector<std::string>& ins,
                                const std::vector<std::string>& outs, const std::string& name, const std::string& domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  if (!domain.empty()) n->set_domain(domain);
  for (const auto& i : ins) n->add_input(i);
  for (const auto& o : outs) n->add_output(o);
  return n;
}

inline onnx::TensorProto* addFloatInit(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims,
                                       const std::vector<float>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  for (float x : v) t->add_float_data(x);
  return t;
}

inline onnx::TensorProto* addDoubleInit(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims,
                                        const std::vector<double>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::DOUBLE);
  for (auto d : dims) t->add_dims(d);
  for (double x : v) t->add_double_data(x);
  return t;
}

// A scalar bool initializer (a constant condition).
inline onnx::TensorProto* addBoolInit(onnx::GraphProto* g, const std::string& name, bool v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::BOOL);
  t->add_int32_data(v ? 1 : 0);
  return t;
}

inline onnx::TensorProto* addInt64Init(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(static_cast<int64_t>(v.size()));
  for (auto x : v) t->add_int64_data(x);
  return t;
}

// A float initializer whose data lives in an external file; empty offset/length are left out.
inline onnx::TensorProto* addExternalInit(onnx::GraphProto* g, const std::string& name, const std::vector<int64_t>& dims,
                                          const std::string& location, const std::string& offset = "",
                                          const std::string& length = "") {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::FLOAT);
  for (auto d : dims) t->add_dims(d);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto kv = [&](const char* k, const std::string& v) {
    if (v.empty()) return;
    auto* e = t->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", location);
  kv("offset", offset);
  kv("length", length);
  return t;
}

inline onnx::ModelProto newModel(int opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* o = m.add_opset_import();
  o->set_domain("");
  o->set_version(opset);
  m.mutable_graph()->set_name("t");
  return m;
}

// A fresh folder under the system temp dir, removed when the object dies.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() / ("ampc_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

inline void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
inline void writeModel(const std::string& path, const onnx::ModelProto& m) { writeBytes(path, m.SerializeAsString()); }
inline std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

struct RunResult {
  int code;
  std::string out;  // stdout and stderr together
};
// Runs a shell command line and returns its exit code and output.
inline RunResult run(const std::string& cmd) {
  RunResult r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace ampc::test
