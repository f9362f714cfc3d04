// ONNX's own backend node tests (Debian's libonnx-testdata): every case whose ops are all in the
// registry is imported, evaluated on the CPU backend and compared with ONNX's expected outputs
// (rtol 1e-3, atol 1e-7, as ONNX's runner). tests/conformance/expectations.txt lists each case
// that is expected to fail or be skipped, with the reason; a listed case that starts passing is
// a failure too, so the file stays true. AMPC_UPDATE_EXPECTATIONS=1 rewrites it.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compiler/onnx/onnx.h"
#include "compiler/ops/registry.h"
#include "runtime/evaluator.h"

using namespace ampc;
namespace fs = std::filesystem;

namespace {

const fs::path kData = "/usr/share/libonnx-testdata/data/node";
const fs::path kExpectations = fs::path(AMPC_SOURCE_DIR) / "tests" / "conformance" / "expectations.txt";

struct Outcome {
  std::string status;  // pass, fail, skip
  std::string reason;
};

bool readProto(const fs::path& p, google::protobuf::MessageLite& m) {
  std::ifstream in(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return in.good() || in.eof() ? m.ParseFromString(bytes) : false;
}

bool usesOnlyRegistryOps(const onnx::ModelProto& m) {
  for (const auto& n : m.graph().node()) {
    if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
    bool known = false;
    for (const OpDef& d : allOps()) known |= d.name == n.op_type();
    known |= importLowersOp(n.op_type());
    if (!known) return false;
  }
  return true;
}

// "" when equal within tolerance, else what differs.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.type != want.type) return "output is " + got.type.str() + ", expected " + want.type.str();
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (isFloat(want.type.dtype)) {
      const double g = got.getDouble(i), w = want.getDouble(i);
      if (std::isnan(w) || std::isnan(g)) {
        if (std::isnan(w) != std::isnan(g)) return "NaN mismatch at " + std::to_string(i);
        continue;
      }
      if (std::isinf(w) || std::isinf(g)) {
        if (g != w) return "inf mismatch at " + std::to_string(i);
        continue;
      }
      if (std::fabs(g - w) > 1e-7 + 1e-3 * std::fabs(w))
        return "element " + std::to_string(i) + ": " + std::to_string(g) + " vs " + std::to_string(w);
    } else if (got.getInt(i) != want.getInt(i)) {
      return "element " + std::to_string(i) + ": " + std::to_string(got.getInt(i)) + " vs " + std::to_string(want.getInt(i));
    }
  }
  return "";
}

std::string firstLine(const std::string& s) {
  std::string r = s.substr(0, s.find('\n'));
  const std::string dataPrefix = kData.string() + "/";
  if (r.rfind(dataPrefix, 0) == 0) r = r.substr(r.find(':') + 2);  // drop the model path
  return r.size() > 160 ? r.substr(0, 160) : r;
}

// Reads a test tensor. ONNX's generator stores bf16 data as UINT16 TensorProtos; when the graph
// side is bf16 the bits are taken as bf16.
std::optional<Tensor> readTensor(const fs::path& p, const fs::path& dir, std::optional<DType> want) {
  onnx::TensorProto tp;
  if (!readProto(p, tp)) return std::nullopt;
  if (tp.data_type() == onnx::TensorProto::UINT16 && want == DType::bf16) tp.set_data_type(onnx::TensorProto::BFLOAT16);
  return tensorFromOnnx(tp, dir.string(), p.string(), p.filename().string());
}

// Import errors that mean "outside what ampc supports by design", not a defect.
bool unsupportedByDesign(const std::string& msg) {
  for (const char* s : {"ONNX element type", "is not a tensor", "changed since opset", "names a dtype ampc does not support"})
    if (msg.find(s) != std::string::npos) return true;
  return false;
}

Outcome runCase(const fs::path& dir, const onnx::ModelProto& m, Backend& backend) {
  const std::string modelPath = (dir / "model.onnx").string();
  std::set<std::string> inits;
  for (const auto& t : m.graph().initializer()) inits.insert(t.name());
  std::vector<const onnx::ValueInfoProto*> ins;
  for (const auto& vi : m.graph().input()) {
    if (inits.count(vi.name())) continue;
    if (!vi.type().has_tensor_type()) return {"skip", "input '" + vi.name() + "' is a sequence or optional, not a tensor"};
    ins.push_back(&vi);
  }
  int sets = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory() || e.path().filename().string().rfind("test_data_set_", 0) != 0) continue;
    ++sets;
    try {
      std::vector<Tensor> values;
      for (size_t i = 0; i < ins.size(); ++i) {
        std::optional<DType> want;
        if (ins[i]->type().has_tensor_type()) want = dtypeFromOnnx(ins[i]->type().tensor_type().elem_type());
        auto t = readTensor(e.path() / ("input_" + std::to_string(i) + ".pb"), dir, want);
        if (!t) return {"skip", "input " + std::to_string(i) + " is not a tensor (sequence or optional)"};
        values.push_back(std::move(*t));
      }
      // Import; shape-determining inputs (Reshape's shape, Slice's starts, ...) that the static-shape
      // compiler needs as constants are bound from the test data, as `ampc --bind` does.
      std::unique_ptr<Graph> g;
      ImportOptions opts;
      try {
        g = importOnnxModel(m, dir.string(), modelPath, opts);
      } catch (const Error& err) {
        if (unsupportedByDesign(err.what())) return {"skip", firstLine(err.what())};
        if (std::string(err.what()).find("compile-time") == std::string::npos) return {"fail", "import: " + firstLine(err.what())};
        for (size_t i = 0; i < ins.size(); ++i)
          if (!isFloat(values[i].type.dtype) || values[i].type.rank() == 0 || (values[i].type.rank() == 1 && values[i].numel() <= 8))
            opts.constInputs[ins[i]->name()] = values[i];  // short float vectors: Resize's scales
        try {
          g = importOnnxModel(m, dir.string(), modelPath, opts);
        } catch (const Error& err2) {
          return {"fail", "import: " + firstLine(err2.what())};
        }
      }
      std::map<std::string, Tensor> feeds;
      for (size_t i = 0; i < ins.size(); ++i)
        if (!opts.constInputs.count(ins[i]->name())) feeds.emplace(ins[i]->name(), values[i]);
      auto outs = evaluate(*g, feeds, backend);
      for (size_t i = 0; i < outs.size(); ++i) {
        auto want = readTensor(e.path() / ("output_" + std::to_string(i) + ".pb"), dir, outs[i].type.dtype);
        if (!want) return {"skip", "output " + std::to_string(i) + " is not a tensor"};
        std::string diff = compare(outs[i], *want);
        if (!diff.empty()) return {"fail", "output " + std::to_string(i) + ": " + diff};
      }
    } catch (const Error& err) {
      if (unsupportedByDesign(err.what())) return {"skip", firstLine(err.what())};
      return {"fail", "run: " + firstLine(err.what())};
    }
  }
  if (sets == 0) return {"skip", "no test data sets"};
  return {"pass", ""};
}

std::map<std::string, Outcome> readExpectations() {
  std::map<std::string, Outcome> r;
  std::ifstream in(kExpectations);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string name, status, reason;
    ss >> name >> status;
    std::getline(ss, reason);
    reason.erase(0, reason.find_first_not_of(' '));
    r[name] = {status, reason};
  }
  return r;
}

}  // namespace

TEST(Conformance, OnnxNodeTests) {
  if (!fs::exists(kData)) GTEST_SKIP() << kData << " is missing (install libonnx-testdata)";
  auto expected = readExpectations();
  auto backend = createCpuBackend();
  std::map<std::string, Outcome> actual;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(kData)) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  int total = 0;
  for (const auto& dir : dirs) {
    onnx::ModelProto m;
    if (!readProto(dir / "model.onnx", m) || !usesOnlyRegistryOps(m)) continue;
    ++total;
    actual[dir.filename().string()] = runCase(dir, m, *backend);
  }
  int counts[3] = {0, 0, 0};
  for (const auto& [name, o] : actual) {
    counts[o.status == "pass" ? 0 : o.status == "fail" ? 1 : 2]++;
    auto it = expected.find(name);
    const std::string want = it == expected.end() ? "pass" : it->second.status;
    EXPECT_EQ(o.status, want) << name << ": " << o.reason << (it == expected.end() ? "" : " (listed: " + it->second.reason + ")");
  }
  for (const auto& [name, o] : expected)
    EXPECT_TRUE(actual.count(name)) << "expectations.txt lists " << name << ", which is not a registry-op case";
  std::printf("ONNX node conformance: %d registry-op cases: %d passed, %d failed, %d skipped (%.1f%% pass)\n", total,
              counts[0], counts[1], counts[2], total ? 100.0 * counts[0] / total : 0.0);
  EXPECT_GE(counts[0], 0.9 * total);
  if (std::getenv("AMPC_UPDATE_EXPECTATIONS")) {
    std::ofstream out(kExpectations);
    out << "# ONNX node test cases (libonnx-testdata) that use only registry ops and do not pass.\n"
           "# One line each: case, status (fail or skip), reason. Unlisted cases must pass.\n";
    for (const auto& [name, o] : actual)
      if (o.status != "pass") {
        auto it = expected.find(name);
        const std::string reason = it != expected.end() && it->second.status == o.status ? it->second.reason : o.reason;
        out << name << " " << o.status << " " << reason << "\n";
      }
  }
}
