#include <onnx/defs/schema.h>
#include <onnx/onnx_pb.h>
#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <regex>
#include <cctype>
#include <cmath>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "compiler/onnx/onnx.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/geometry.h"
#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"
#include "passes/pass.h"

namespace fs = std::filesystem;

namespace ampc {
namespace {

// Whether s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool validUtf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (!len || i + len > n) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}
// s with every byte outside printable ASCII written \xNN (for messages about bad names).
std::string escapedName(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) r += static_cast<char>(c);
    else {
      char b[5];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      r += b;
    }
  }
  return r;
}

std::string nodeLabel(const onnx::NodeProto& n) {
  return "node '" + n.name() + "' (" + (n.domain().empty() || n.domain() == "ai.onnx" ? "" : n.domain() + ".") + n.op_type() + ")";
}

// Reads TensorProtos (inline or external data) for one model file.
class TensorReader {
 public:
  // `owner` keeps the parsed model alive: when set, inline raw data is viewed in place, not copied.
  TensorReader(std::string dir, std::string file, std::shared_ptr<const void> owner = nullptr)
      : dir_(std::move(dir)), file_(std::move(file)), owner_(std::move(owner)) {}


  // `inModel`: p is part of the model that `owner` keeps alive (an initializer), so its inline data
  // may be viewed in place; protos copied out of the model (inlined nodes) are always copied.
  Tensor tensorFromProto(const onnx::TensorProto& p, const std::string& what, bool inModel = false) {
    auto dt = dtypeFromOnnx(p.data_type());
    if (!dt) fail(what + " has ONNX element type " + std::to_string(p.data_type()) + ", which ampc does not support");
    TensorType type{*dt, {}};
    for (int64_t d : p.dims()) {
      if (d < 0) fail(what + " has a negative dimension");
      type.shape.push_back(d);
    }
    if (!type.sizeFits()) fail(what + " has shape " + type.str() + ", which is too large");
    const size_t bytes = type.bytes();
    const int64_t n = type.numel();
    auto sizeError = [&](size_t got) {
      fail(what + " holds " + std::to_string(got) + " bytes of data; " + type.str() + " needs " + std::to_string(bytes));
    };
    auto count = [&](int64_t got) {
      if (got != n) fail(what + " holds " + std::to_string(got) + " elements; " + type.str() + " needs " + std::to_string(n));
    };
    // Sizes are checked against the data before anything is allocated.
    if (p.data_location() == onnx::TensorProto::EXTERNAL) return readExternal(p, what, type);
    if (inModel && !p.has_raw_data() && rawViews_) {
      if (auto it = rawViews_->find(p.name()); it != rawViews_->end()) {  // raw data left in the mapped file
        if (it->second.size() != bytes) sizeError(it->second.size());
        Tensor t;
        t.type = type;
        t.data = it->second;
        return t;
      }
    }
    if (p.has_raw_data()) {
      if (p.raw_data().size() != bytes) sizeError(p.raw_data().size());
      Tensor t;
      t.type = type;
      const auto* raw = reinterpret_cast<const uint8_t*>(p.raw_data().data());
      if (owner_ && inModel) {
        t.data = Bytes::view(owner_, raw, bytes);
      } else {
        t.data = Bytes(bytes);
        if (bytes) std::memcpy(t.data.data(), raw, bytes);
      }
      return t;
    }
    switch (*dt) {
      case DType::f32: count(p.float_data_size()); break;
      case DType::f64: count(p.double_data_size()); break;
      case DType::i64: count(p.int64_data_size()); break;
      default: count(p.int32_data_size()); break;  // f16/bf16 bit patterns, i32 i8 u8 bool
    }
    Tensor t(type);
    for (int64_t i = 0; i < n; ++i) {
      switch (*dt) {
        case DType::f32: t.setDouble(i, p.float_data(i)); break;
        case DType::f64: t.setDouble(i, p.double_data(i)); break;
        case DType::i64: t.setInt(i, p.int64_data(i)); break;
        case DType::f16:
        case DType::bf16: {
          uint16_t bits = static_cast<uint16_t>(p.int32_data(i));
          std::memcpy(t.data.data() + 2 * i, &bits, 2);
          break;
        }
        default: t.setInt(i, p.int32_data(i)); break;
      }
    }
    return t;
  }

  // External data: the location must be relative and stay inside the model's folder.
  Tensor readExternal(const onnx::TensorProto& p, const std::string& what, const TensorType& type) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (const auto& kv : p.external_data()) {
      try {
        if (kv.key() == "location") location = kv.value();
        else if (kv.key() == "offset") offset = std::stoll(kv.value());
        else if (kv.key() == "length") length = std::stoll(kv.value());
      } catch (const std::exception&) {
        fail(what + ": external data '" + kv.key() + "' is not a number: '" + kv.value() + "'");
      }
    }
    if (location.empty()) fail(what + ": external data has no location");
    fs::path loc(location);
    if (loc.is_absolute()) fail(what + ": external data location '" + location + "' is absolute; it must be relative to the model's folder");
    std::error_code ec;
    fs::path base = fs::weakly_canonical(fs::path(dir_.empty() ? "." : dir_), ec);
    fs::path full = fs::weakly_canonical(base / loc, ec);
    auto rel = full.lexically_relative(base);
    if (ec || rel.empty() || *rel.begin() == "..")
      fail(what + ": external data location '" + location + "' escapes the model's folder");
    if (!fs::is_regular_file(full, ec)) fail(what + ": external data file '" + location + "' is missing");
    const size_t bytes = type.bytes();
    if (length >= 0 && static_cast<size_t>(length) != bytes)
      fail(what + ": external data length " + std::to_string(length) + " does not match " + type.str() + " (" + std::to_string(bytes) + " bytes)");
    if (offset < 0) fail(what + ": negative external data offset");
    auto fileSize = fs::file_size(full, ec);
    if (ec || fileSize < static_cast<uintmax_t>(offset) + bytes)
      fail(what + ": external data file '" + location + "' is too short (" + std::to_string(fileSize) + " bytes; need " +
           std::to_string(offset + bytes) + ")");
    // The file is mapped once, and every tensor in it is a view: nothing is read until it is used,
    // and a model larger than memory's free part still imports.
    auto it = mapped_.find(full.string());
    if (it == mapped_.end()) {
      try {
        it = mapped_.emplace(full.string(), Bytes::mapFile(full.string())).first;
      } catch (const std::exception& e) {
        fail(what + ": could not map external data file '" + location + "': " + e.what());
      }
    }
    if (it->second.size() < static_cast<size_t>(offset) + bytes)
      fail(what + ": external data file '" + location + "' changed while it was read");
    Tensor t;
    t.type = type;
    t.data = it->second.slice(static_cast<size_t>(offset), bytes);
    return t;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const { throw Error(file_ + ": " + msg); }
  std::string dir_, file_;
  std::shared_ptr<const void> owner_;
  std::map<std::string, Bytes> mapped_;  // external data files, by canonical path

 public:
  // Initializers' raw data that stayed in the mapped model file (importOnnxFile), by name.
  const std::map<std::string, Bytes>* rawViews_ = nullptr;
};

class Importer {
 public:
  Importer(const onnx::ModelProto& m, std::string dir, std::string file, const ImportOptions& o,
           std::shared_ptr<const void> owner = nullptr, const std::map<std::string, Bytes>* rawViews = nullptr)
      : m_(m), file_(file), opts_(o), tensors_(std::move(dir), std::move(file), std::move(owner)) {
    tensors_.rawViews_ = rawViews;
  }

  // Every error names the file: one that an inner step throws without it (an attribute of the
  // wrong kind, say) gets the file in front here.
  std::unique_ptr<Graph> run() {
    try {
      return runUnchecked();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind(file_ + ": ", 0) == 0) throw;
      fail(what);
    }
  }

 private:
  std::unique_ptr<Graph> runUnchecked() {
    if (!m_.has_graph()) fail("has no graph (not an ONNX model?)");
    if (m_.ir_version() <= 0) fail("has no ir_version (not an ONNX model?)");
    auto g = std::make_unique<Graph>();
    g_ = g.get();
    const auto& gp = m_.graph();
    g->name = gp.name().empty() ? "main" : gp.name();
    inlineFunctions();
    checkNames(gp);
    readOpsets();
    readMetadata();
    checkOps();

    std::unordered_set<std::string> initNames;
    for (const auto& t : gp.initializer()) initNames.insert(t.name());
    std::set<std::string> inputNames;
    for (const auto& vi : gp.input()) inputNames.insert(vi.name());
    for (const auto& [name, shape] : opts_.inputShapes)
      if (!inputNames.count(name) || initNames.count(name)) fail("--input-shape names '" + name + "', which is not a graph input");
    for (const auto& [name, t] : opts_.constInputs)
      if (!inputNames.count(name) || initNames.count(name)) fail("--bind names '" + name + "', which is not a graph input");
    for (const auto& vi : gp.input()) {
      if (vi.name().empty()) fail("a graph input has no name");
      if (initNames.count(vi.name())) continue;  // older exporters list initializers as inputs too
      auto bound = opts_.constInputs.find(vi.name());
      if (bound == opts_.constInputs.end()) {
        g->addInput(vi.name(), inputType(vi));
        continue;
      }
      // A bound input is a compile-time constant: its dtype must match and its dims must fit.
      const TensorType& t = bound->second.type;
      auto declared = vi.type().has_tensor_type() ? dtypeFromOnnx(vi.type().tensor_type().elem_type()) : std::nullopt;
      if (!declared || *declared != t.dtype) fail("--bind " + vi.name() + ": the value is " + t.str() + ", the input's dtype differs");
      if (vi.type().tensor_type().has_shape()) {
        const auto& dims = vi.type().tensor_type().shape().dim();
        bool ok = dims.size() == static_cast<int>(t.shape.size());
        for (int i = 0; ok && i < dims.size(); ++i) ok = !dims[i].has_dim_value() || dims[i].dim_value() == t.shape[i];
        if (!ok) fail("--bind " + vi.name() + ": the value is " + t.str() + ", which does not fit the input's shape");
      }
      g->addConst(vi.name(), bound->second);
    }
    for (const auto& t : gp.initializer()) {
      if (t.name().empty()) fail("an initializer has no name");
      if (g->lookup(t.name())) fail("initializer '" + t.name() + "' is defined twice");
      if (liftedConstant(t.name())) g->addConst(t.name(), initializer(t));
      else g->addParam(t.name(), initializer(t));
    }
    for (const auto& [name, row] : opts_.embeddingPadding) g->embeddingPadding[name] = row;
    checkPadding();
    // BatchNorm modules the exporter wrote in training form (TorchScript's train()): their running
    // statistics are initializers. A training-form BatchNorm whose statistics operands are computed
    // is a function's, not a module's: timm's weight standardisation (F.batch_norm of a conv weight,
    // no running statistics, which the dynamo exporter writes with the weight's own mean and
    // variance) says nothing of how the model's BatchNorm modules were exported.
    std::set<std::string> initializers;
    for (const auto& t : gp.initializer()) initializers.insert(t.name());
    for (const auto& np : nodes_)
      if (np.op_type() == "BatchNormalization" && (np.domain().empty() || np.domain() == "ai.onnx")) {
        bool training = np.output_size() > 1 && std::any_of(np.output().begin() + 1, np.output().end(), [](const auto& o) { return !o.empty(); });
        for (const auto& a : np.attribute()) training = training || (a.name() == "training_mode" && a.i() != 0);
        const bool module = np.input_size() >= 5 && initializers.count(np.input(3)) && initializers.count(np.input(4));
        trainingFormBatchNorms_ += (training || namedTraining(np.name())) && module;
      }
    for (const auto& n : nodes_)
      for (const auto& in : n.input()) readers_[in].push_back(n.op_type());
    for (int i : topoOrder()) addNode(nodes_[i]);
    applyNodeAttributes(*g);
    markIndexSelectingReductions(*g);
    markSharedTies(*g);
    markStraightThrough(*g);
    checkScattersWriteOnce(*g);
    notePaddingLikeRows();
    if (frozenBatchNorms_)
      g->importNotes.push_back(std::to_string(frozenBatchNorms_) + " BatchNormalization node(s) in inference form beside " +
                               std::to_string(trainingFormBatchNorms_) +
                               " in training form keep their running statistics, as a submodule in eval() mode does (a frozen "
                               "BatchNorm); --batchnorm train gives them batch statistics");
    if (trainingBatchNorms_)
      g->importNotes.push_back(std::to_string(trainingBatchNorms_) +
                               " BatchNormalization node(s) written in inference form (training_mode 0, as PyTorch's dynamo exporter "
                               "writes a train()-mode BatchNorm) train with batch statistics and update their running statistics, "
                               "as in PyTorch; --batchnorm as-exported keeps the running statistics" +
                               (gp.name() == "torch_jit" ? std::string(" (this graph is the TorchScript exporter's, which writes a train()-mode "
                                                                       "BatchNorm in training form: these were exported in eval() mode, "
                                                                       "frozen or by an export without training=TRAINING)")
                                                         : std::string()));
    for (const auto& vi : gp.output()) {
      Value* v = g->lookup(vi.name());
      if (!v) fail("graph output '" + vi.name() + "' is not produced by any node, input or initializer");
      if (auto p = padded_.find(v); p != padded_.end())
        fail("graph output '" + vi.name() + "' holds rows that " + selections_[p->second.sel].node +
             " selects at run time: a data-dependent shape, which a plan's outputs cannot have (ampc takes such a selection only into a "
             "reduction over the rows or a loss)");
      g->addOutput(v);
    }
    if (g->outputs().empty()) fail("graph has no outputs");

    try {
      PassManager pm(false);
      pm.add(createFoldConstantsPass());
      pm.add(createDcePass());  // the folded shape subgraphs leave dead constants
      pm.run(*g);
      verify(*g);
    } catch (const Error& e) {
      fail(e.what());
    }
    // Declared output dtypes must agree with what the graph computes.
    for (int i = 0; i < gp.output_size(); ++i) {
      const auto& vi = gp.output(i);
      if (!vi.type().has_tensor_type() || vi.type().tensor_type().elem_type() == 0) continue;
      auto dt = dtypeFromOnnx(vi.type().tensor_type().elem_type());
      const Value* v = g->outputs()[i];
      if (!dt || *dt != v->type().dtype)
        fail("graph output '" + vi.name() + "' is declared as ONNX type " + std::to_string(vi.type().tensor_type().elem_type()) +
             " but computes " + v->type().str() + " (wrong dtype)");
      // And a fully static declared shape must be the computed one (symbolic dims are not checked).
      if (!vi.type().tensor_type().has_shape()) continue;
      const auto& ds = vi.type().tensor_type().shape();
      std::vector<int64_t> shape;
      bool known = true;
      for (const auto& d : ds.dim()) {
        known = known && d.has_dim_value();
        shape.push_back(d.dim_value());
      }
      if (known && shape != v->type().shape) {
        std::string want;
        for (size_t k = 0; k < shape.size(); ++k) want += (k ? "," : "") + std::to_string(shape[k]);
        fail("graph output '" + vi.name() + "' is declared with shape [" + want + "] but computes " + v->type().str() + " (wrong shape)");
      }
    }
    return g;
  }

  [[noreturn]] void fail(const std::string& msg) const { throw Error(file_ + ": " + msg); }

  void readOpsets() {
    bool found = false;
    for (const auto& o : m_.opset_import()) {
      if (o.domain().empty() || o.domain() == "ai.onnx") {
        g_->opset = static_cast<int>(o.version());
        found = true;
      } else {
        g_->domainOpsets[o.domain()] = static_cast<int>(o.version());
      }
    }
    if (!found) fail("does not import the default ONNX opset");
    if (g_->opset > kMaxOpset)
      fail("uses opset " + std::to_string(g_->opset) + "; ampc supports opsets " + std::to_string(kMinOpset) + " to " +
           std::to_string(kMaxOpset));
    if (g_->opset < kMinOpset) upgradeOpset();
  }

  // An older model is read at opset kMinOpset when none of its ops changed in between (ONNX's
  // schema registry knows each op's versions); otherwise it is an error naming the ops.
  void upgradeOpset() {
    std::set<std::string> changed;
    for (const auto& n : nodes_) {
      if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
      const auto* old = onnx::OpSchemaRegistry::Schema(n.op_type(), g_->opset, "");
      const auto* cur = onnx::OpSchemaRegistry::Schema(n.op_type(), kMinOpset, "");
      if (!old || !cur || old->SinceVersion() != cur->SinceVersion()) changed.insert(n.op_type());
    }
    if (!changed.empty()) {
      std::string list;
      for (const auto& op : changed) list += (list.empty() ? "" : ", ") + op;
      fail("uses opset " + std::to_string(g_->opset) + "; ampc supports opsets " + std::to_string(kMinOpset) + " to " +
           std::to_string(kMaxOpset) + ", and these ops changed since opset " + std::to_string(g_->opset) + ": " + list +
           " (convert the model with onnx.version_converter)");
    }
    g_->opset = kMinOpset;
  }

  int domainVersion(const std::string& d) const {
    if (d.empty() || d == "ai.onnx") return g_->opset;
    auto it = g_->domainOpsets.find(d);
    return it == g_->domainOpsets.end() ? 1 : it->second;
  }

  // Every unsupported op, in one error. Ops of other (custom) domains are accepted when the model
  // gives the type and static shape of each of their outputs (value_info or graph outputs): the
  // compiler then treats them as opaque FP32 ops.
  void checkOps() {
    for (const auto* list : {&m_.graph().value_info(), &m_.graph().output()})
      for (const auto& vi : *list) declared_[vi.name()] = &vi;
    std::string bad;
    int count = 0;
    for (const auto& n : nodes_) {
      if (lookupOp(n.domain(), n.op_type(), domainVersion(n.domain()))) continue;
      if ((n.domain().empty() || n.domain() == "ai.onnx") && kImportLowered.count(n.op_type())) continue;
      if (isStopGradient(n)) continue;
      const bool custom = !n.domain().empty() && n.domain() != "ai.onnx";
      if (custom && std::all_of(n.output().begin(), n.output().end(), [&](const std::string& o) { return o.empty() || declaredType(o); }))
        continue;
      ++count;
      bad += "\n  " + nodeLabel(n) + " domain '" + (n.domain().empty() ? "ai.onnx" : n.domain()) + "'" +
             (custom ? " (a custom op needs its outputs' types and shapes in value_info)" : "");
    }
    if (count) fail(std::to_string(count) + " node(s) use ops ampc does not support at opset " + std::to_string(g_->opset) + ":" + bad);
    checkAttributes();
  }

  // Every attribute of a standard op that ampc does not read, in one error: computing the op as
  // if it were absent would be a silently wrong answer. (Custom ops' attributes are theirs.)
  // An If's taken branch is checked when import reaches it (lowerIf).
  void checkAttributes() const {
    std::string bad;
    int count = 0;
    for (const auto& n : nodes_) count += unreadAttributes(n, bad);
    if (count) fail(std::to_string(count) + " attribute(s) that ampc does not read, and will not ignore:" + bad);
  }
  // How many of the node's attributes its op does not read; a line each is added to `bad`.
  int unreadAttributes(const onnx::NodeProto& n, std::string& bad) const {
    if (opts_.ampcGraph || (!n.domain().empty() && n.domain() != "ai.onnx")) return 0;
    std::string_view attrs;
    if (auto it = kImportLowered.find(n.op_type()); it != kImportLowered.end()) attrs = it->second;
    else if (const OpDef* d = lookupOp("", n.op_type(), g_->opset)) attrs = d->attrs;
    else return 0;
    int count = 0;
    for (const auto& a : n.attribute()) {
      if (attributeTaken(attrs, a.name())) continue;
      ++count;
      bad += "\n  " + nodeLabel(n) + " attribute '" + a.name() + "' (" + n.op_type() + " takes " +
             (attrs.empty() ? std::string("none") : std::string(attrs)) + ")";
    }
    return count;
  }

  // The static type the model declares for a value, if complete.
  std::optional<TensorType> declaredType(const std::string& name) const {
    auto it = declared_.find(name);
    if (it == declared_.end() || !it->second->type().has_tensor_type()) return std::nullopt;
    const auto& tt = it->second->type().tensor_type();
    auto dt = dtypeFromOnnx(tt.elem_type());
    if (!dt || !tt.has_shape()) return std::nullopt;
    TensorType t{*dt, {}};
    for (const auto& d : tt.shape().dim()) {
      if (!d.has_dim_value() || d.dim_value() < 0) return std::nullopt;
      t.shape.push_back(d.dim_value());
    }
    if (!t.sizeFits()) return std::nullopt;
    return t;
  }

  TensorType inputType(const onnx::ValueInfoProto& vi) {
    if (!vi.type().has_tensor_type()) fail("input '" + vi.name() + "' is not a tensor");
    const auto& tt = vi.type().tensor_type();
    auto dt = dtypeFromOnnx(tt.elem_type());
    if (!dt) fail("input '" + vi.name() + "' has ONNX element type " + std::to_string(tt.elem_type()) + ", which ampc does not support");
    TensorType t{*dt, {}};
    auto over = opts_.inputShapes.find(vi.name());
    if (!tt.has_shape()) {
      if (over == opts_.inputShapes.end()) fail("input '" + vi.name() + "' has no shape; give one with --input-shape " + vi.name() + "=...");
      t.shape = over->second;
      if (!t.sizeFits()) fail("input '" + vi.name() + "' has shape " + t.str() + ", which is too large");
      return t;
    }
    const auto& dims = tt.shape().dim();
    if (over != opts_.inputShapes.end() && static_cast<int>(over->second.size()) != dims.size())
      fail("--input-shape " + vi.name() + " has rank " + std::to_string(over->second.size()) + ", the input has rank " + std::to_string(dims.size()));
    for (int i = 0; i < dims.size(); ++i) {
      const auto& d = dims[i];
      if (over != opts_.inputShapes.end()) {
        if (d.has_dim_value() && d.dim_value() != over->second[i])
          fail("--input-shape " + vi.name() + " sets dim " + std::to_string(i) + " to " + std::to_string(over->second[i]) +
               ", but the model fixes it to " + std::to_string(d.dim_value()));
        t.shape.push_back(over->second[i]);
      } else if (d.has_dim_value() && d.dim_value() >= 0) {
        t.shape.push_back(d.dim_value());
      } else {
        fail("input '" + vi.name() + "' dim " + std::to_string(i) + " is symbolic ('" + d.dim_param() +
             "'); fix it with --input-shape " + vi.name() + "=AxBx...");
      }
    }
    if (!t.sizeFits()) fail("input '" + vi.name() + "' has shape " + t.str() + ", which is too large");
    return t;
  }

  // ---- nodes

  // Node indices in a topological order; cycles and dangling inputs are errors naming the node.
  // A node's operands by name: its inputs, and for a node with subgraphs (If) every outer value its
  // subgraphs read.
  static std::vector<std::string> operandNames(const onnx::NodeProto& np) {
    std::vector<std::string> names(np.input().begin(), np.input().end());
    for (const auto& a : np.attribute()) {
      if (a.type() != onnx::AttributeProto::GRAPH) continue;
      std::set<std::string> inside;
      for (const auto& t : a.g().initializer()) inside.insert(t.name());
      for (const auto& vi : a.g().input()) inside.insert(vi.name());
      for (const auto& n : a.g().node()) {
        for (const auto& in : operandNames(n))
          if (!inside.count(in)) names.push_back(in);
        for (const auto& o : n.output()) inside.insert(o);
      }
      for (const auto& o : a.g().output())
        if (!inside.count(o.name())) names.push_back(o.name());
    }
    return names;
  }

  std::vector<int> topoOrder() {
    const int count = static_cast<int>(nodes_.size());
    std::unordered_map<std::string, int> producer;
    for (int i = 0; i < count; ++i)
      for (const auto& o : nodes_[i].output()) {
        if (o.empty()) continue;
        if (g_->lookup(o) || !producer.emplace(o, i).second)
          fail(nodeLabel(nodes_[i]) + ": output '" + o + "' is defined twice");
      }
    std::vector<int> pending(count, 0);
    std::vector<std::vector<int>> users(count);
    for (int i = 0; i < count; ++i)
      for (const auto& in : operandNames(nodes_[i])) {
        if (in.empty() || g_->lookup(in)) continue;
        auto it = producer.find(in);
        if (it == producer.end())
          fail(nodeLabel(nodes_[i]) + ": input '" + in + "' is not produced by any node, graph input or initializer (dangling input)");
        ++pending[i];
        users[it->second].push_back(i);
      }
    // Kahn's algorithm; among ready nodes the earliest in the file goes first, so an already
    // sorted graph keeps its order.
    std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
    for (int i = 0; i < count; ++i)
      if (!pending[i]) ready.push(i);
    std::vector<int> order;
    while (!ready.empty()) {
      int i = ready.top();
      ready.pop();
      order.push_back(i);
      for (int u : users[i])
        if (--pending[u] == 0) ready.push(u);
    }
    if (static_cast<int>(order.size()) != count) {
      for (int i = 0; i < count; ++i)
        if (pending[i]) fail(nodeLabel(nodes_[i]) + " is part of a cycle: the graph is not a DAG");
    }
    return order;
  }

  Attribute attrFromProto(const onnx::AttributeProto& a, const onnx::NodeProto& n) {
    const std::string what = nodeLabel(n) + " attribute '" + a.name() + "'";
    switch (a.type()) {
      case onnx::AttributeProto::INT: return static_cast<int64_t>(a.i());
      case onnx::AttributeProto::FLOAT: return a.f();
      case onnx::AttributeProto::STRING: return a.s();
      case onnx::AttributeProto::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
      case onnx::AttributeProto::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
      case onnx::AttributeProto::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
      case onnx::AttributeProto::TENSOR: return tensorFromProto(a.t(), what);
      default: fail(what + " has a kind ampc does not support (graphs, sparse tensors, type protos)");
    }
  }

  // Every name is UTF-8 (names travel into plans, reports and JSON): one that is not is refused
  // here, where the model can still be fixed, not by amprun later.
  void checkNames(const onnx::GraphProto& gp) {
    auto check = [&](const std::string& name, const std::string& what) {
      if (!validUtf8(name)) fail(what + " '" + escapedName(name) + "' is not valid UTF-8");
    };
    check(gp.name(), "the graph's name");
    for (const auto& v : gp.input()) check(v.name(), "graph input");
    for (const auto& v : gp.output()) check(v.name(), "graph output");
    for (const auto& t : gp.initializer()) check(t.name(), "initializer");
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const auto& n = nodes_[i];
      const std::string where = "node " + std::to_string(i);
      check(n.name(), where + "'s name");
      check(n.op_type(), where + "'s op");
      check(n.domain(), where + "'s domain");
      for (const auto& v : n.input()) check(v, where + "'s input");
      for (const auto& v : n.output()) check(v, where + "'s output");
    }
  }

  static bool isStopGradient(const onnx::NodeProto& n) { return n.domain() == kGradDomain && n.op_type() == kStopGradientOp; }

  void addNode(const onnx::NodeProto& np) {
    if (readsPadded(np)) return paddedNode(np);
    addNodeAsIs(np);
  }
  // self + Scatter(zeros, indices, updates) with reduction none, the scatter read by that Add alone:
  // how PyTorch's TorchScript exporter writes scatter_add, index_add and index_put(accumulate) below
  // opset 16 (and index_add at every opset). Over repeated indices the sum is meant, where ONNX leaves
  // a scatter without reduction undefined: such a scatter adds (the same where indices do not repeat).
  bool scatterMeantToAdd(const onnx::NodeProto& np) const {
    if (!(np.domain().empty() || np.domain() == "ai.onnx") || (np.op_type() != "ScatterElements" && np.op_type() != "ScatterND") ||
        np.input_size() != 3 || np.output_size() != 1)
      return false;
    for (const auto& a : np.attribute())
      if (a.name() == "reduction" && a.s() != "none") return false;
    const Value* data = g_->lookup(np.input(0));
    const Tensor* z = data ? data->constData() : nullptr;
    bool zeros = z && isFloat(z->type.dtype);
    for (int64_t i = 0; zeros && i < z->numel(); ++i) zeros = z->getDouble(i) == 0.0;
    auto it = readers_.find(np.output(0));
    return zeros && it != readers_.end() && it->second == std::vector<std::string>{"Add"};
  }
  static onnx::NodeProto withReductionAdd(const onnx::NodeProto& np) {
    onnx::NodeProto add = np;
    for (int k = add.attribute_size() - 1; k >= 0; --k)
      if (add.attribute(k).name() == "reduction") add.mutable_attribute()->DeleteSubrange(k, 1);
    auto* a = add.add_attribute();
    a->set_name("reduction");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s("add");
    return add;
  }
  void addNodeAsIs(const onnx::NodeProto& np) {
    if (scatterMeantToAdd(np)) return addNodeAsIs(withReductionAdd(np));
    if ((np.domain().empty() || np.domain() == "ai.onnx") && kImportLowered.count(np.op_type())) {
      lowerAtImport(np);
      return;
    }
    if (isStopGradient(np)) return lowerStopGradient(np);
    if ((np.domain().empty() || np.domain() == "ai.onnx") && np.op_type() == "SoftmaxCrossEntropyLoss" && np.input_size() > 1) {
      const Value* labels = g_->lookup(np.input(1));
      if (labels && isFloat(labels->type().dtype)) return lowerSoftTargetCe(np);
    }
    for (const auto& in : np.input())
      if (sequences_.count(in)) fail(nodeLabel(np) + ": input '" + in + "' is a sequence; ampc lowers sequences only into SequenceAt, ConcatFromSequence and SequenceLength");
    std::vector<Value*> ins;
    for (const auto& in : np.input()) ins.push_back(in.empty() ? nullptr : g_->lookup(in));
    // Trailing omitted optional inputs carry no meaning.
    while (!ins.empty() && !ins.back()) ins.pop_back();
    // A convolution's bias known to be zeros is no bias. PyTorch 2.11's dynamo exporter writes a
    // Conv3d without one as a bias Expand-ed from 0 to a shape of rank 2, which ONNX's Conv does not
    // take (B is [M]); adding zeros of any shape changes nothing, so the operand goes. (A constant
    // only: a bias initializer that starts at zero is a parameter.)
    if ((np.domain().empty() || np.domain() == "ai.onnx") && (np.op_type() == "Conv" || np.op_type() == "ConvTranspose") &&
        ins.size() == 3 && ins[2]->kind() == ValueKind::Const && ins[2]->data() && isFloat(ins[2]->type().dtype)) {
      const Tensor& b = *ins[2]->data();
      bool zeros = true;
      for (int64_t i = 0; i < b.numel() && zeros; ++i) zeros = b.getDouble(i) == 0.0;
      if (zeros) ins.pop_back();
    }
    std::vector<std::pair<std::string, TensorType>> results;
    int trailing = np.output_size();
    while (trailing > 0 && np.output(trailing - 1).empty()) --trailing;
    for (int i = 0; i < trailing; ++i) {
      std::string name = np.output(i);
      if (name.empty()) name = g_->uniqueName(np.name() + ".unused" + std::to_string(i));
      // Registry ops get their types from shape inference; custom ops keep the declared ones.
      results.emplace_back(name, declaredType(name).value_or(TensorType{}));
    }
    Node* n = g_->createNode(np.op_type(), np.domain() == "ai.onnx" ? "" : np.domain(), ins, results);
    n->setName(np.name());
    for (const auto& a : np.attribute()) {
      if (!a.ref_attr_name().empty()) fail(nodeLabel(np) + " attribute '" + a.name() + "' refers to a function attribute");
      n->setAttr(a.name(), attrFromProto(a, np));
    }
    if (n->domain().empty() && n->op() == "BatchNormalization") trainingBatchNorm(n);
    inferNode(n);
  }

  // Types (and constant folding) node by node, so that the import-time lowerings below see their
  // operands' types and constant data.
  void inferNode(Node* n) {
    try {
      inferAndFoldNode(*g_, n);
    } catch (const Error& e) {
      fail(e.what());
    }
  }

  // The dynamo exporter names a train()-mode BatchNorm's node after the ATen op it came from,
  // _native_batch_norm_legit_functional (an eval()-mode one: _native_batch_norm_legit_no_training),
  // and writes both in inference form: a node so named counts as one in training form.
  static bool namedTraining(const std::string& node) { return node.find("_native_batch_norm_legit_functional") != std::string::npos; }

  // The dynamo exporter writes a train()-mode BatchNorm as the inference form; see ImportOptions.
  void trainingBatchNorm(Node* n) {
    if (n->getInt("training_mode", 0) != 0 || n->numResults() != 1) return;
    for (size_t i : {3, 4})
      if (!n->input(i) || n->input(i)->kind() != ValueKind::Param) return;
    const std::string& y = n->result(0)->name();
    // As written where asked, and so again on re-import (and where ampc_export.py's
    // "ampc.frozen_batchnorms" names it: a BatchNorm module left in eval()).
    if (opts_.batchNormAsExported || g_->frozenBatchNorms.count(y)) {
      g_->frozenBatchNorms.insert(y);
      return;
    }
    if (trainingFormBatchNorms_ > 0 && !opts_.batchNormTrainAll && !namedTraining(n->name())) {  // frozen beside trained ones: as written
      g_->frozenBatchNorms.insert(y);
      ++frozenBatchNorms_;
      return;
    }
    n->setAttr("training_mode", int64_t{1});
    for (const char* s : {".running_mean", ".running_var"}) g_->addResult(n, g_->uniqueName(n->result(0)->name() + s), TensorType{});
    ++trainingBatchNorms_;
  }

  // ---- ops that import rewrites into registry ops

  // CastLike becomes the Cast it is (the target dtype is known); sequences of static length
  // become the tensors they hold (SplitToSequence -> Split, SequenceAt -> Identity, ...).
  // Ops that are compositions of registry ops (norms over groups or instances, the reductions
  // built on sums) become those compositions, so they get every registry op's shape rule,
  // gradient, CPU and CUDA kernel. Each starts with a Cast of its input to its own dtype: autocast
  // keeps a model's Casts, so the composition keeps the op's precision (f32 under autocast)
  // instead of squaring or exponentiating in f16.
  // Each with the attributes its lowering reads (OpDef::attrs says what that means). Notes:
  // GroupNormalization's statistics come from LayerNormalization, f32 or wider whatever stash_type
  // says; Resize's extrapolation_value and Attention's qk_matmul_output_mode shape only what the
  // lowering refuses (tf_crop_and_resize, the fourth result); Attention's softmax runs in f32 or
  // wider whatever softmax_precision says.
  static inline const std::map<std::string, std::string_view> kImportLowered = {
      {"CastLike", "saturate"},
      {"SplitToSequence", "axis keepdims"},
      {"SequenceAt", ""},
      {"SequenceConstruct", ""},
      {"SequenceLength", ""},
      {"ConcatFromSequence", "axis new_axis"},
      {"SequenceInsert", ""},
      {"SequenceErase", ""},
      {"SequenceEmpty", "dtype"},
      {"InstanceNormalization", "epsilon"},
      {"GroupNormalization", "epsilon num_groups stash_type"},
      {"RMSNormalization", "axis epsilon stash_type"},
      {"ReduceL1", "axes keepdims noop_with_empty_axes"},
      {"ReduceL2", "axes keepdims noop_with_empty_axes"},
      {"ReduceSumSquare", "axes keepdims noop_with_empty_axes"},
      {"ReduceLogSum", "axes keepdims noop_with_empty_axes"},
      {"ReduceLogSumExp", "axes keepdims noop_with_empty_axes"},
      {"ReduceProd", "axes keepdims noop_with_empty_axes"},
      {"Einsum", "equation"},
      {"RotaryEmbedding", "interleaved num_heads rotary_embedding_dim"},
      {"Attention", "is_causal kv_num_heads q_num_heads qk_matmul_output_mode scale softcap softmax_precision"},
      {"ConvTranspose", "auto_pad dilations group kernel_shape output_padding output_shape pads strides"},
      {"Col2Im", "dilations pads strides"},
      {"Resize", "antialias axes coordinate_transformation_mode cubic_coeff_a exclude_outside extrapolation_value "
                 "keep_aspect_ratio_policy mode nearest_mode"},
      {"DepthToSpace", "blocksize mode"},
      {"SpaceToDepth", "blocksize"},
      {"LSTM", "activation_alpha activation_beta activations clip direction hidden_size input_forget layout"},
      {"GRU", "activation_alpha activation_beta activations clip direction hidden_size layout linear_before_reset"},
      {"RNN", "activation_alpha activation_beta activations clip direction hidden_size layout"},
      {"LRN", "alpha beta bias size"},
      {"If", "else_branch then_branch"},
      {"Loop", "body"},
      {"Scan", "body num_scan_inputs scan_input_axes scan_input_directions scan_output_axes scan_output_directions"},
      {"OneHot", "axis"},
      {"RandomNormal", "dtype mean scale seed shape"},
      {"RandomUniform", "dtype high low seed shape"},
      {"GlobalMaxPool", ""},
      {"Sum", ""},
      {"Mean", ""},
      {"Size", ""},
      {"EyeLike", "dtype k"},
      {"ThresholdedRelu", "alpha"},
      {"Shrink", "bias lambd"},
      {"ArgMin", "axis keepdims select_last_index"},
      {"Xor", ""},
      {"MeanVarianceNormalization", "axes"},
      {"Hardmax", "axis"},
      {"LpNormalization", "axis p"},
      {"GlobalLpPool", "p"},
      {"LpPool", "auto_pad ceil_mode dilations kernel_shape p pads strides"},
      {"AffineGrid", "align_corners"},
      {"ReverseSequence", "batch_axis time_axis"},
      {"Compress", "axis"},
      {"NonZero", ""},
      {"Unique", "axis sorted"},
      {"CenterCropPad", "axes"},
      {"MaxUnpool", "kernel_shape pads strides"},
      {"Swish", "alpha"},
      {"HannWindow", "output_datatype periodic"},
      {"HammingWindow", "output_datatype periodic"},
      {"BlackmanWindow", "output_datatype periodic"},
      {"DFT", "axis inverse onesided"},
      {"STFT", "onesided"},
      {"QuantizeLinear", "axis block_size output_dtype precision saturate"},
      {"DequantizeLinear", "axis block_size output_dtype"}};

 public:
  static bool lowersOp(const std::string& op) { return kImportLowered.count(op) != 0; }
  static std::optional<std::string_view> loweredAttributes(const std::string& op) {
    auto it = kImportLowered.find(op);
    if (it == kImportLowered.end()) return std::nullopt;
    return it->second;
  }

 private:
  Value* operand(const onnx::NodeProto& np, int i) {
    if (i >= np.input_size() || np.input(i).empty()) return nullptr;
    Value* v = g_->lookup(np.input(i));
    if (!v) fail(nodeLabel(np) + ": input '" + np.input(i) + "' is a sequence where a tensor is expected");
    return v;
  }
  const std::vector<Value*>& sequence(const onnx::NodeProto& np, int i) {
    auto it = i < np.input_size() ? sequences_.find(np.input(i)) : sequences_.end();
    if (it == sequences_.end()) fail(nodeLabel(np) + ": input " + std::to_string(i) + " must be a sequence of static length");
    return it->second;
  }
  std::vector<int64_t> constIntsOf(const onnx::NodeProto& np, int i, const std::string& what) {
    Value* v = operand(np, i);
    const Tensor* t = v ? v->constData() : nullptr;
    if (!t || !isInteger(t->type.dtype)) fail(nodeLabel(np) + ": " + what + " must be a compile-time integer constant");
    std::vector<int64_t> r;
    for (int64_t k = 0; k < t->numel(); ++k) r.push_back(t->getInt(k));
    return r;
  }
  // The node's attribute `name` (null if absent); one of another kind than `type` is an error.
  const onnx::AttributeProto* findAttr(const onnx::NodeProto& np, const std::string& name, onnx::AttributeProto::AttributeType type,
                                       const char* kind) {
    for (const auto& a : np.attribute())
      if (a.name() == name) {
        if (a.type() != type) fail(nodeLabel(np) + " attribute '" + name + "' must be " + kind);
        return &a;
      }
    return nullptr;
  }
  int64_t attrInt(const onnx::NodeProto& np, const std::string& name, int64_t dflt) {
    const auto* a = findAttr(np, name, onnx::AttributeProto::INT, "an int");
    return a ? a->i() : dflt;
  }
  // A node of a registry op, created, typed and folded; returns its results.
  std::vector<Value*> emit(const onnx::NodeProto& np, const std::string& op, const std::vector<Value*>& ins,
                           const std::vector<std::string>& outs, std::map<std::string, Attribute> attrs = {}) {
    std::vector<std::pair<std::string, TensorType>> res;
    for (const auto& o : outs) res.emplace_back(o, TensorType{});
    Node* n = g_->createNode(op, "", ins, res);
    n->setName(np.name().empty() ? outs[0] : np.name());
    for (auto& [k, a] : attrs) n->setAttr(k, std::move(a));
    if (!n->def()) fail(nodeLabel(np) + ": ampc writes it with " + op + ", which opset " + std::to_string(g_->opset) + " lacks");
    inferNode(n);  // n may be folded away: look its results up by name
    std::vector<Value*> r;
    for (const auto& o : outs) r.push_back(g_->lookup(o));
    return r;
  }
  std::string fresh(const onnx::NodeProto& np, const std::string& what) {
    return g_->uniqueName((np.output_size() && !np.output(0).empty() ? np.output(0) : np.name()) + "." + what);
  }
  int64_t seqIndex(const onnx::NodeProto& np, int i, size_t size, bool insert) {
    if (i >= np.input_size() || np.input(i).empty()) return insert ? static_cast<int64_t>(size) : static_cast<int64_t>(size) - 1;
    auto v = constIntsOf(np, i, "the position");
    if (v.size() != 1) fail(nodeLabel(np) + ": the position must be a scalar");
    const int64_t n = static_cast<int64_t>(size) + (insert ? 1 : 0);
    int64_t k = v[0] < 0 ? v[0] + static_cast<int64_t>(size) : v[0];
    if (k < 0 || k >= n) fail(nodeLabel(np) + ": position " + std::to_string(v[0]) + " is outside the sequence of " + std::to_string(size));
    return k;
  }

  float attrFloat(const onnx::NodeProto& np, const std::string& name, float dflt) {
    const auto* a = findAttr(np, name, onnx::AttributeProto::FLOAT, "a float");
    return a ? a->f() : dflt;
  }
  std::optional<std::vector<int64_t>> attrInts(const onnx::NodeProto& np, const std::string& name) {
    const auto* a = findAttr(np, name, onnx::AttributeProto::INTS, "a list of ints");
    if (!a) return std::nullopt;
    return std::vector<int64_t>(a->ints().begin(), a->ints().end());
  }
  Value* constI64(const onnx::NodeProto& np, const std::string& what, const std::vector<int64_t>& v) {
    return g_->addConst(fresh(np, what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
  }
  Value* scalarOf(const onnx::NodeProto& np, const std::string& what, double v, DType t) {
    return g_->addConst(fresh(np, what), Tensor::fromDoubles(t, {}, {v}));
  }
  // s^(1/p) of a sum of |x|^p (a p-norm), with the gradient PyTorch's norms give: 0 where the norm
  // is 0 (torch.linalg.vector_norm's backward masks it), not the root's 0 * inf = NaN. F.normalize
  // of an all-zero row (Swin V2's cosine attention over a window's zero padding, whose keys have no
  // bias) reaches it: NaN there made every step an overflow. So Where(s == 0, 0, root(Where(s == 0,
  // 1, s))), whose gradient passes neither branch's NaN; a NaN or inf sum stays NaN or inf.
  Value* normRoot(const onnx::NodeProto& np, Value* s, double p) {
    const DType t = s->type().dtype;
    Value* zero = scalarOf(np, "zero", 0.0, t);
    Value* dead = step(np, "Equal", {s, zero});
    Value* safe = step(np, "Where", {dead, scalarOf(np, "one", 1.0, t), s});
    Value* root = p == 2 ? step(np, "Sqrt", {safe}) : step(np, "Pow", {safe, scalarOf(np, "inv_p", 1.0 / p, t)});
    return step(np, "Where", {dead, zero, root});
  }

  // One registry node of the composition, named after the node it stands for.
  Value* step(const onnx::NodeProto& np, const std::string& op, const std::vector<Value*>& ins, std::map<std::string, Attribute> attrs = {},
              const std::string& out = {}) {
    return emit(np, op, ins, {out.empty() ? fresh(np, op) : out}, std::move(attrs))[0];
  }
  Value* castTo(const onnx::NodeProto& np, Value* x, DType t, const std::string& out = {}) {
    return step(np, "Cast", {x}, {{"to", static_cast<int64_t>(dtypeToOnnx(t))}}, out);
  }
  Value* floatOperand(const onnx::NodeProto& np, int i) {
    Value* v = operand(np, i);
    if (!v) fail(nodeLabel(np) + ": input " + std::to_string(i) + " is missing");
    if (!isFloat(v->type().dtype)) fail(nodeLabel(np) + ": input " + std::to_string(i) + " must be a float tensor, got " + v->type().str());
    return v;
  }

  // Scatters with reduction 'none' whose indices are known ahead (constants, or computed from them:
  // an Expand of an index buffer, too large for fold-constants, evaluated here within a budget):
  // refused where two updates write one element and the updates are not one constant value
  // (ops_tensor.cpp scatterWritesTwice).
  void checkScattersWriteOnce(Graph& g) {
    std::map<const Value*, Tensor> memo;
    int64_t budget = int64_t{1} << 22;  // elements evaluated, over the whole graph
    for (const auto& n : g.nodes()) {
      if (!n->domain().empty() || (n->op() != "ScatterElements" && n->op() != "ScatterND") || n->numInputs() < 3 ||
          n->getString("reduction", "none") != "none")
        continue;
      const Tensor* idx = constantValue(n->input(1), memo, budget);
      if (!idx) continue;
      auto twice = scatterWritesTwice(*n, n->input(0)->type(), *idx);
      if (!twice) continue;
      // One constant value written twice is one value whichever lands (the exporter's own zeros).
      const Tensor* u = constantValue(n->input(2), memo, budget);
      bool one = u != nullptr;
      for (int64_t e = 1; one && e < u->numel(); ++e) one = u->getDouble(e) == u->getDouble(0);
      if (!one) fail("node '" + n->name() + "' (" + n->op() + "): " + scatterWritesTwiceMessage(*twice));
    }
  }
  // v's value where it is computed from constants alone (integer initializers are constants) by ops
  // with CPU kernels, evaluated within `budget` elements; null otherwise.
  static const Tensor* constantValue(const Value* v, std::map<const Value*, Tensor>& memo, int64_t& budget) {
    if (!v) return nullptr;
    if (const Tensor* t = v->constData()) return t;
    if (auto it = memo.find(v); it != memo.end()) return &it->second;
    const Node* p = v->producer();
    if (!p || !evaluableAhead(*p)) return nullptr;
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < p->numInputs(); ++i) {
      const Tensor* t = p->input(i) ? constantValue(p->input(i), memo, budget) : nullptr;
      if (p->input(i) && !t && !p->def()->readsOnlyTypes) return nullptr;
      ins.push_back(t);
    }
    for (size_t i = 0; i < p->numResults(); ++i) budget -= p->result(i)->type().numel();
    if (budget < 0) return nullptr;
    std::vector<Tensor> outs;
    try {
      outs = cpu::runNode(*p, ins);
    } catch (const Error&) {  // not evaluable ahead (a kernel's own check): nothing concluded
      return nullptr;
    }
    for (size_t i = 0; i < outs.size(); ++i) memo.emplace(p->result(i), std::move(outs[i]));
    auto it = memo.find(v);
    return it == memo.end() ? nullptr : &it->second;
  }

  // a + (b - a) is written for one thing only: the straight-through estimator a + (b - a).detach()
  // (VQ-VAE's quantiser, hard Gumbel-softmax, learned quantisation), b's value with a's gradient.
  // Neither exporter keeps detach(), and ampc_export.py's marker (kStopGradientOp) would stand
  // between the Sub and the Add. Unmarked, the sum is differentiated as written (b's gradient, a
  // silently different training): each is named in a note, and --straight-through reads them as
  // the estimator. The importer's own (fake quantization's) carry kNoGradOperands already.
  void markStraightThrough(Graph& g) {
    std::string named;
    int count = 0;
    for (const auto& n : g.nodes()) {
      if (!isOnnxOp(n.get(), "Add") || n->numInputs() != 2 || noGradOperands(*n)) continue;
      for (size_t i = 0; i < 2; ++i) {
        Value* a = n->input(i);
        Value* d = n->input(1 - i);
        const Node* sub = d ? d->producer() : nullptr;
        if (!a || !isOnnxOp(sub, "Sub") || sub->input(1) != a || sub->input(0) == a || noGradOperands(*sub) || a->constData() ||
            !isFloat(a->type().dtype))
          continue;
        if (opts_.straightThrough) n->setAttr(kNoGradOperands, int64_t{1} << (1 - i));
        if (++count <= 5) named += std::string(named.empty() ? "" : ", ") + "'" + (n->name().empty() ? n->result(0)->name() : n->name()) + "'";
        break;
      }
    }
    if (!count) return;
    if (count > 5) named += " and " + std::to_string(count - 5) + " more";
    g.importNotes.push_back(
        std::to_string(count) + " Add node(s) (" + named + ") add a and b - a, the straight-through estimator's form " +
        "(z + (zq - z).detach()) with no stop-gradient marker: no exporter keeps detach(), so " +
        (opts_.straightThrough ? std::string("--straight-through gives each b's value and a's gradient, as the estimator does")
                               : std::string("ampc differentiates each as written (b's gradient, not a's). Export through "
                                             "tools/export/ampc_export.py, which marks every detach(), or pass --straight-through "
                                             "to read each as the estimator")));
  }

  // PyTorch's max(dim) / min(dim) reach ONNX as a ReduceMax / ReduceMin over one axis beside an
  // ArgMax (ArgMin: an ArgMax of the negation, as this importer writes it) over the same input and
  // axis with the same keepdims, read or not; their gradient goes to the index, the first extreme
  // element, where amax's is shared among ties (compiler/ops/grad_rules.cpp, gradReduceMaxMin). An
  // amax over the same input, axis and keepdims in the same graph is taken for one too. Run before
  // dead-code removal.
  // Max and Min over a tensor the forward created (a lifted constant, through Identity or Cast: its
  // clone or .to()): torch.maximum's ties, not a clamp's (kTiesShared). Read from the model's nodes,
  // since the import has folded such a clone into a constant of another name by now.
  void markSharedTies(Graph& g) const {
    std::map<std::string, const onnx::NodeProto*> producers;
    for (const auto& np : nodes_)
      for (const auto& o : np.output()) producers[o] = &np;
    std::set<std::string> inits;
    for (const auto& t : m_.graph().initializer()) inits.insert(t.name());
    auto lifted = [&](std::string name) {
      for (auto it = producers.find(name); it != producers.end() && (it->second->domain().empty() || it->second->domain() == "ai.onnx") &&
                                           (it->second->op_type() == "Identity" || it->second->op_type() == "Cast") &&
                                           it->second->input_size() > 0;
           it = producers.find(name))
        name = it->second->input(0);
      return inits.count(name) && liftedConstant(name);
    };
    std::set<std::string> marked;  // the Max / Min nodes' first results
    for (const auto& np : nodes_) {
      if (!(np.domain().empty() || np.domain() == "ai.onnx") || (np.op_type() != "Max" && np.op_type() != "Min") || np.input_size() < 2 ||
          np.output_size() < 1)
        continue;
      for (const auto& in : np.input())
        if (!in.empty() && lifted(in)) marked.insert(np.output(0));
    }
    if (marked.empty()) return;
    for (const auto& up : g.nodes())
      if (up->domain().empty() && (up->op() == "Max" || up->op() == "Min") && up->numResults() && marked.count(up->result(0)->name()))
        up->setAttr(kTiesShared, int64_t{1});
  }
  static void markIndexSelectingReductions(Graph& g) {
    auto singleAxis = [](const Node& n, int64_t rank) -> std::optional<int64_t> {
      std::vector<int64_t> axes = n.getInts("axes");
      if (n.input(1)) {
        const Tensor* t = n.input(1)->constData();
        if (!t) return std::nullopt;
        axes = t->toInts();
      }
      if (axes.size() != 1) return std::nullopt;
      return normalizeAxis(axes[0], rank);
    };
    for (const auto& up : g.nodes()) {
      Node& n = *up;
      if (!n.domain().empty() || (n.op() != "ReduceMax" && n.op() != "ReduceMin")) continue;
      Value* x = n.input(0);
      const int64_t rank = x->type().rank();
      const auto axis = singleAxis(n, rank);
      if (!axis) continue;
      std::vector<Value*> argInputs;  // what an ArgMax beside it reads: x, or for ReduceMin x's negations
      if (n.op() == "ReduceMax") argInputs.push_back(x);
      else
        for (const Use& u : x->uses())
          if (u.user->op() == "Neg" && u.user->domain().empty()) argInputs.push_back(u.user->result(0));
      bool beside = false;
      for (Value* v : argInputs)
        for (const Use& u : v->uses()) {
          const Node& a = *u.user;
          beside = beside || (a.op() == "ArgMax" && a.domain().empty() && a.getInt("select_last_index", 0) == 0 &&
                              normalizeAxis(a.getInt("axis", 0), rank) == *axis && a.getInt("keepdims", 1) == n.getInt("keepdims", 1));
        }
      if (beside) n.setAttr(kGradToFirst, int64_t{1});
    }
  }

  // A Reduce* node over constant axes (none: all): axes as an input where the opset has it (ReduceSum
  // from 13, the others from 18), else as the attribute.
  Value* reduceNode(const onnx::NodeProto& np, const std::string& red, Value* v, const std::optional<std::vector<int64_t>>& axes,
                    int64_t keepdims, int64_t noop = 0) {
    std::map<std::string, Attribute> attrs{{"keepdims", keepdims}};
    if (noop) attrs["noop_with_empty_axes"] = noop;
    std::vector<Value*> ins{v};
    if (axes && (red == "ReduceSum" || g_->opset >= 18)) ins.push_back(constI64(np, "axes", *axes));
    else if (axes) attrs["axes"] = *axes;
    return step(np, red, ins, attrs);
  }

  // InstanceNormalization and GroupNormalization: x viewed as [N, G, rest] is normalised over its
  // last axis (LayerNormalization with unit scale), then scaled per channel (per group for
  // GroupNormalization before opset 21, whose scale and bias are [num_groups]).
  void lowerGroupNorm(const onnx::NodeProto& np, bool instance, const std::string& out) {
    Value* x = floatOperand(np, 0);
    Value* scale = floatOperand(np, 1);
    Value* bias = floatOperand(np, 2);
    const auto& xs = x->type().shape;
    if (xs.size() < 2) fail(nodeLabel(np) + ": X must be N x C x ..., got " + x->type().str());
    const int64_t n = xs[0], c = xs[1];
    const int64_t groups = instance ? c : attrInt(np, "num_groups", 0);
    if (groups <= 0 || c % groups) fail(nodeLabel(np) + ": num_groups " + std::to_string(groups) + " must divide the " + std::to_string(c) + " channels");
    const bool perGroup = !instance && g_->opset < 21;
    const int64_t params = perGroup ? groups : c;
    for (Value* p : {scale, bias})
      if (p->type().shape != std::vector<int64_t>{params})
        fail(nodeLabel(np) + ": scale and bias must be [" + std::to_string(params) + "] at opset " + std::to_string(g_->opset) + ", got " + p->type().str());
    const float eps = attrFloat(np, "epsilon", 1e-5f);
    const DType t = x->type().dtype;
    Value* xr = step(np, "Reshape", {castTo(np, x, t), constI64(np, "groups", {n, groups, -1})});
    Value* norm;
    if (lookupOp("", "LayerNormalization", g_->opset)) {
      // Unit scale over the whole normalised row (not a broadcast [1]: backends take a row-sized scale).
      const int64_t row = x->type().numel() / std::max<int64_t>(n * groups, 1);
      Value* one = g_->addConst(fresh(np, "one"), Tensor::fromDoubles(t, {row}, std::vector<double>(static_cast<size_t>(row), 1.0)));
      norm = step(np, "LayerNormalization", {xr, one}, {{"axis", int64_t{-1}}, {"epsilon", eps}});
    } else {  // before opset 17: (x - mean) / sqrt(var + eps) written out
      Value* d = step(np, "Sub", {xr, reduceNode(np, "ReduceMean", xr, std::vector<int64_t>{2}, 1)});
      Value* var = reduceNode(np, "ReduceMean", step(np, "Mul", {d, d}), std::vector<int64_t>{2}, 1);
      norm = step(np, "Div", {d, step(np, "Sqrt", {step(np, "Add", {var, scalarOf(np, "eps", eps, t)})})});
    }
    std::vector<int64_t> pshape(xs.size(), 1);
    if (perGroup) {  // scale [G] over [N, G, rest]
      Value* sc = step(np, "Reshape", {scale, constI64(np, "gshape", {groups, 1})});
      Value* bi = step(np, "Reshape", {bias, constI64(np, "gshape", {groups, 1})});
      Value* y = step(np, "Add", {step(np, "Mul", {norm, sc}), bi});
      step(np, "Reshape", {y, constI64(np, "xshape", xs)}, {}, out);
      return;
    }
    pshape.pop_back();
    pshape[0] = c;  // [C, 1, ...]: broadcasts over N and the spatial dims
    Value* y = step(np, "Reshape", {norm, constI64(np, "xshape", xs)});
    Value* sc = step(np, "Reshape", {scale, constI64(np, "cshape", pshape)});
    Value* bi = step(np, "Reshape", {bias, constI64(np, "cshape", pshape)});
    step(np, "Add", {step(np, "Mul", {y, sc}), bi}, {}, out);
  }

  // RMSNormalization (opset 23): X / sqrt(mean(X^2 over the dims from axis) + epsilon) * scale,
  // computed in stash_type (f32 by default).
  void lowerRmsNorm(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    Value* scale = floatOperand(np, 1);
    const int64_t r = x->type().rank();
    int64_t axis = attrInt(np, "axis", -1);
    if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is out of range");
    if (axis < 0) axis += r;
    auto stash = dtypeFromOnnx(static_cast<int>(attrInt(np, "stash_type", 1)));
    if (!stash || !isFloat(*stash)) fail(nodeLabel(np) + ": stash_type must be a float type");
    std::vector<int64_t> axes;
    for (int64_t d = axis; d < r; ++d) axes.push_back(d);
    Value* xs = castTo(np, x, *stash);
    Value* ms = reduceNode(np, "ReduceMean", step(np, "Mul", {xs, xs}), axes, 1);
    Value* rms = step(np, "Sqrt", {step(np, "Add", {ms, scalarOf(np, "eps", attrFloat(np, "epsilon", 1e-5f), *stash)})});
    Value* y = castTo(np, step(np, "Div", {xs, rms}), x->type().dtype);
    step(np, "Mul", {y, scale}, {}, out);
  }

  // ReduceL1 / L2 / SumSquare / LogSum / LogSumExp over ReduceSum (and ReduceMax), axes from the
  // attribute (before opset 18) or input 1.
  void lowerReduce(const onnx::NodeProto& np, const std::string& op, const std::string& out) {
    Value* x = operand(np, 0);
    if (!x) fail(nodeLabel(np) + " needs an input");
    const int64_t keep = attrInt(np, "keepdims", 1);
    std::optional<std::vector<int64_t>> axes;
    if (np.input_size() > 1 && !np.input(1).empty()) axes = constIntsOf(np, 1, "axes");
    else axes = attrInts(np, "axes");
    const int64_t noop = attrInt(np, "noop_with_empty_axes", 0);
    if (axes && axes->empty() && !noop) axes.reset();  // an empty list reduces over every axis
    auto reduce = [&](const std::string& red, Value* v, int64_t keepdims) { return reduceNode(np, red, v, axes, keepdims, noop); };
    if (op == "ReduceProd" && x->constData()) return foldReduceProd(np, x, axes, keep, noop, out);
    Value* xc = isFloat(x->type().dtype) ? castTo(np, x, x->type().dtype) : x;
    if (op == "ReduceProd") {
      // Of a computed float tensor, from its nonzero factors: P = sign * exp(sum log |x|) over them
      // (the sign from the count of negative factors), and Z, the count of zero factors. The
      // product is P where Z = 0, else 0:
      //   y = P [Z = 0] + P [Z = 1] sum(x [x = 0])
      // whose second term is 0 and gives, as PyTorch's prod backward does, a lone zero factor the
      // product of the others (P) and every other factor 0; P's own derivative is P / x_i, and
      // [Z = 0] leaves it only where no factor is 0. (The product written as sign * exp(sum log |x|)
      // over every factor gave a lone zero factor the gradient 0: silently wrong.)
      if (!isFloat(x->type().dtype)) fail(nodeLabel(np) + ": ReduceProd of a computed integer tensor is not supported");
      const DType t = x->type().dtype;
      Value* zero = scalarOf(np, "zero", 0.0, t);
      Value* one = scalarOf(np, "one", 1.0, t);
      Value* isZero = step(np, "Equal", {xc, zero});
      Value* nonzero = step(np, "Where", {isZero, one, xc});
      Value* mag = step(np, "Exp", {reduce("ReduceSum", step(np, "Log", {step(np, "Abs", {nonzero})}), keep)});
      Value* negatives = reduce("ReduceSum", castTo(np, step(np, "Less", {xc, zero}), t), keep);
      Value* odd = step(np, "Mod", {negatives, scalarOf(np, "two", 2.0, t)}, {{"fmod", int64_t{1}}});
      Value* sign = step(np, "Sub", {one, step(np, "Mul", {odd, scalarOf(np, "two", 2.0, t)})});
      Value* p = step(np, "Mul", {sign, mag});
      Value* zeros = reduce("ReduceSum", castTo(np, isZero, t), keep);
      Value* none = castTo(np, step(np, "Equal", {zeros, zero}), t);
      Value* lone = castTo(np, step(np, "Equal", {zeros, one}), t);
      Value* atZero = reduce("ReduceSum", step(np, "Mul", {xc, castTo(np, isZero, t)}), keep);  // 0, with a gradient at the zeros
      step(np, "Mul", {p, step(np, "Add", {none, step(np, "Mul", {lone, atZero})})}, {}, out);
      return;
    }
    if (op == "ReduceL1") {
      step(np, "Identity", {reduce("ReduceSum", step(np, "Abs", {xc}), keep)}, {}, out);
    } else if (op == "ReduceSumSquare") {
      step(np, "Identity", {reduce("ReduceSum", step(np, "Mul", {xc, xc}), keep)}, {}, out);
    } else if (op == "ReduceL2") {
      step(np, "Identity", {normRoot(np, reduce("ReduceSum", step(np, "Mul", {xc, xc}), keep), 2)}, {}, out);
    } else if (op == "ReduceLogSum") {
      step(np, "Log", {reduce("ReduceSum", xc, keep)}, {}, out);
    } else {  // LogSumExp, shifted by the max so that exp cannot overflow
      Value* m = reduce("ReduceMax", xc, 1);
      Value* s = reduce("ReduceSum", step(np, "Exp", {step(np, "Sub", {xc, m})}), keep);
      Value* mo = keep ? m : reduce("ReduceMax", xc, 0);
      step(np, "Add", {step(np, "Log", {s}), mo}, {}, out);
    }
  }

  // ReduceProd of a compile-time constant, folded here exactly: exporters use it on shape paths
  // (PyTorch's var/std count their elements as the product of the reduced dims). Integer products
  // are checked (an overflow is an error naming the node).
  void foldReduceProd(const onnx::NodeProto& np, Value* x, const std::optional<std::vector<int64_t>>& axes, int64_t keep, int64_t noop,
                      const std::string& out) {
    const Tensor* t = x->constData();
    const auto& s = t->type.shape;
    const int64_t r = static_cast<int64_t>(s.size());
    std::vector<bool> reduced(s.size(), !axes && !noop);
    for (int64_t a : axes.value_or(std::vector<int64_t>{})) {
      if (a < -r || a >= r) fail(nodeLabel(np) + ": axis " + std::to_string(a) + " is out of range for " + t->type.str());
      reduced[static_cast<size_t>(a < 0 ? a + r : a)] = true;
    }
    std::vector<int64_t> outShape, kept;
    for (size_t d = 0; d < s.size(); ++d) {
      if (!reduced[d]) outShape.push_back(s[d]), kept.push_back(static_cast<int64_t>(d));
      else if (keep) outShape.push_back(1);
    }
    TensorType ot{t->type.dtype, outShape};
    if (!ot.sizeFits()) fail(nodeLabel(np) + ": the result " + ot.str() + " is too large");
    const int64_t n = ot.numel();
    std::vector<double> fp(static_cast<size_t>(n), 1.0);
    std::vector<int64_t> ip(static_cast<size_t>(n), 1);
    const bool integer = isInteger(t->type.dtype);
    std::vector<int64_t> idx(s.size(), 0);
    for (int64_t i = 0; i < t->numel(); ++i) {
      int64_t o = 0;
      for (int64_t d : kept) o = o * s[static_cast<size_t>(d)] + idx[static_cast<size_t>(d)];
      if (integer) {
        if (__builtin_mul_overflow(ip[static_cast<size_t>(o)], t->getInt(i), &ip[static_cast<size_t>(o)]))
          fail(nodeLabel(np) + ": the product overflows int64");
      } else {
        fp[static_cast<size_t>(o)] *= t->getDouble(i);
      }
      for (int64_t d = r - 1; d >= 0 && ++idx[static_cast<size_t>(d)] == s[static_cast<size_t>(d)]; --d) idx[static_cast<size_t>(d)] = 0;
    }
    g_->addConst(out, integer ? Tensor::fromInts(ot.dtype, ot.shape, ip) : Tensor::fromDoubles(ot.dtype, ot.shape, fp));
  }

  // Einsum as Transpose, Reshape, ReduceSum and batched MatMul: operands are contracted left to
  // right, each pair as one [batch, M, K] x [batch, K, N] MatMul, letters no later term needs summed
  // away first. Diagonals (a letter twice in one term), ellipses and broadcast dims are refused.
  struct Term {
    Value* v;
    std::string letters;  // one per dim of v
  };
  Term einsumTranspose(const onnx::NodeProto& np, Term t, const std::string& order) {
    if (order == t.letters) return t;
    std::vector<int64_t> perm;
    for (char c : order) perm.push_back(static_cast<int64_t>(t.letters.find(c)));
    return {step(np, "Transpose", {t.v}, {{"perm", perm}}), order};
  }
  Term einsumKeep(const onnx::NodeProto& np, Term t, const std::string& keep) {
    std::vector<int64_t> axes;
    std::string left;
    for (size_t d = 0; d < t.letters.size(); ++d) {
      if (keep.find(t.letters[d]) == std::string::npos) axes.push_back(static_cast<int64_t>(d));
      else left += t.letters[d];
    }
    if (axes.empty()) return t;
    return {reduceNode(np, "ReduceSum", t.v, axes, 0), left};
  }
  // Einsum as numpy and PyTorch read it: an ellipsis stands for the dims its term's letters leave
  // over, right-aligned across the terms (and first in an implicit output); a letter repeated in a
  // term takes the diagonal; a dim of 1 broadcasts against the letter's size elsewhere. Ellipsis
  // dims are named internally by the characters 1, 2, ... (never letters).
  void lowerEinsum(const onnx::NodeProto& np, const std::string& out) {
    const auto* eq = findAttr(np, "equation", onnx::AttributeProto::STRING, "a string");
    if (!eq) fail(nodeLabel(np) + " needs an equation");
    const std::string bad = nodeLabel(np) + ": bad equation '" + eq->s() + "'";
    std::string e;
    for (char c : eq->s())
      if (c != ' ') e += c;
    const auto arrow = e.find("->");
    const std::string lhs = e.substr(0, arrow);
    std::vector<std::string> written;  // each term as written
    for (size_t pos = 0;;) {
      const size_t comma = lhs.find(',', pos);
      written.push_back(lhs.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    if (static_cast<int>(written.size()) != np.input_size())
      fail(nodeLabel(np) + ": the equation has " + std::to_string(written.size()) + " terms for " + std::to_string(np.input_size()) + " inputs");
    // A term's letters and whether it has an ellipsis ("..." once, nothing else that is not a letter).
    auto split = [&](const std::string& t, std::string& letters) {
      const size_t dots = t.find("...");
      letters = dots == std::string::npos ? t : t.substr(0, dots) + t.substr(dots + 3);
      for (char c : letters)
        if (!std::isalpha(static_cast<unsigned char>(c))) fail(bad);
      return dots;
    };
    int64_t ellipsis = 0;  // the dims an ellipsis stands for: the most any term leaves over
    std::vector<Value*> operands;
    std::vector<int64_t> leftOver;  // each term's: the dims its ellipsis stands for
    for (size_t i = 0; i < written.size(); ++i) {
      Value* v = operand(np, static_cast<int>(i));
      if (!v) fail(nodeLabel(np) + ": input " + std::to_string(i) + " is missing");
      std::string letters;
      const bool dots = split(written[i], letters) != std::string::npos;
      const int64_t left = v->type().rank() - static_cast<int64_t>(letters.size());
      if (left < 0 || (!dots && left != 0))
        fail(nodeLabel(np) + ": term '" + written[i] + "' has " + std::to_string(letters.size()) + " letters for input " + std::to_string(i) + " " +
             v->type().str());
      ellipsis = std::max(ellipsis, left);
      operands.push_back(v);
      leftOver.push_back(left);
    }
    if (ellipsis > 32) fail(nodeLabel(np) + ": the ellipsis stands for more than 32 dims");
    auto expand = [&](const std::string& t, int64_t dims) {  // the ellipsis as the last `dims` of its characters
      std::string letters;
      const size_t dots = split(t, letters);
      if (dots == std::string::npos) return letters;
      std::string names;
      for (int64_t k = ellipsis - dims; k < ellipsis; ++k) names += static_cast<char>(1 + k);
      return letters.substr(0, dots) + names + letters.substr(dots);
    };
    std::vector<Term> terms;
    std::map<char, int64_t> size;
    std::map<char, int> count;  // occurrences over the terms (an implicit output's letters occur once)
    for (size_t i = 0; i < written.size(); ++i) {
      const std::string letters = expand(written[i], leftOver[i]);
      for (size_t d = 0; d < letters.size(); ++d) {
        const char c = letters[d];
        ++count[c];
        const int64_t n = operands[i]->type().shape[d];
        auto it = size.find(c);
        if (it == size.end() || it->second == 1) size[c] = n;
        else if (n != 1 && n != it->second)
          fail(nodeLabel(np) + ": " + (std::isalpha(static_cast<unsigned char>(c)) ? "letter '" + std::string(1, c) + "'" : std::string("an ellipsis dim")) +
               " is " + std::to_string(it->second) + " and " + std::to_string(n) + ", which do not broadcast");
      }
      terms.push_back({operands[i], letters});
    }
    std::string result;
    if (arrow != std::string::npos) {
      result = expand(e.substr(arrow + 2), ellipsis);
      for (size_t d = 0; d < result.size(); ++d)
        if (!size.count(result[d]) || result.find(result[d]) != d) fail(nodeLabel(np) + ": bad output term '" + e.substr(arrow + 2) + "'");
    } else {  // implicit: the ellipsis, then the letters that occur once, in alphabetical order
      for (int64_t k = 0; k < ellipsis; ++k) result += static_cast<char>(1 + k);
      for (auto [c, k] : count)
        if (k == 1 && std::isalpha(static_cast<unsigned char>(c))) result += c;
    }
    for (Term& t : terms) {
      // A repeated letter: the pair's dims last, flattened, every (n + 1)-th element (the diagonal).
      for (size_t d = 0; d < t.letters.size(); ++d) {
        const size_t again = t.letters.find(t.letters[d], d + 1);
        if (again == std::string::npos) continue;
        const char c = t.letters[d];
        const int64_t n = t.v->type().shape[d], m = t.v->type().shape[again];
        if (n != m) fail(nodeLabel(np) + ": the diagonal of '" + std::string(1, c) + "' is over dims of " + std::to_string(n) + " and " + std::to_string(m));
        std::string rest = t.letters;
        rest.erase(again, 1);
        rest.erase(d, 1);
        std::string order = rest + c;
        order += c;
        std::vector<int64_t> perm;
        for (size_t k = 0; k < t.letters.size(); ++k)
          if (k != d && k != again) perm.push_back(static_cast<int64_t>(k));
        perm.push_back(static_cast<int64_t>(d));
        perm.push_back(static_cast<int64_t>(again));
        Value* x = step(np, "Transpose", {t.v}, {{"perm", perm}});
        std::vector<int64_t> flat(x->type().shape.begin(), x->type().shape.end() - 2);
        flat.push_back(n * n);
        t = {sliceLast(np, reshapeTo(np, x, flat), 0, n * n, n + 1), rest + c};
        d = static_cast<size_t>(-1);  // again from the start: the letters moved
      }
      // A dim of 1 where the letter is larger elsewhere: expanded to it.
      std::vector<int64_t> full;
      for (char c : t.letters) full.push_back(size[c]);
      if (full != t.v->type().shape) t.v = step(np, "Expand", {t.v, constI64(np, "shape", full)});
    }
    Term cur = terms[0];
    for (size_t k = 1; k < terms.size(); ++k) {
      std::string need = result;  // letters the result or a later term still needs
      for (size_t j = k + 1; j < terms.size(); ++j) need += terms[j].letters;
      Term a = einsumKeep(np, cur, need + terms[k].letters), b = einsumKeep(np, terms[k], need + cur.letters);
      std::string batch, am, con, bn;
      for (char c : a.letters) {
        const bool inB = b.letters.find(c) != std::string::npos, needed = need.find(c) != std::string::npos;
        (inB ? (needed ? batch : con) : am) += c;
      }
      for (char c : b.letters)
        if (a.letters.find(c) == std::string::npos) bn += c;
      auto prod = [&](const std::string& ls) {
        int64_t p = 1;
        for (char c : ls) p *= size[c];
        return p;
      };
      a = einsumTranspose(np, a, batch + am + con);
      b = einsumTranspose(np, b, batch + con + bn);
      // The batch letters stay dims of their own (MatMul broadcasts over any number), so that a
      // product over single letters, as attention's "bhqd,bhkd->bhqk", is the plain MatMul the
      // passes know, with no Reshape around it.
      auto batched = [&](int64_t rows, int64_t cols) {
        std::vector<int64_t> s;
        for (char c : batch) s.push_back(size[c]);
        s.push_back(rows);
        s.push_back(cols);
        return s;
      };
      Value* av = reshapeTo(np, a.v, batched(prod(am), prod(con)));
      Value* bv = reshapeTo(np, b.v, batched(prod(con), prod(bn)));
      std::vector<int64_t> shape;
      for (char c : batch + am + bn) shape.push_back(size[c]);
      cur = {reshapeTo(np, step(np, "MatMul", {av, bv}), shape), batch + am + bn};
    }
    cur = einsumTranspose(np, einsumKeep(np, cur, result), result);
    // The last node made here gets the output's name (no Identity after it, which would stand
    // between a product and what fuse-attention looks for); an operand passed through as it is
    // ("ij->ij") gets an Identity.
    if (!out.empty() && std::find(operands.begin(), operands.end(), cur.v) == operands.end() && cur.v->producer()) g_->renameValue(cur.v, out);
    else step(np, "Identity", {cur.v}, {}, out);
  }

  // x[b:e:step] along `axis`.
  Value* sliceAxis(const onnx::NodeProto& np, Value* x, int64_t axis, int64_t b, int64_t e, int64_t step = 1) {
    std::vector<Value*> ins{x, constI64(np, "starts", {b}), constI64(np, "ends", {e}), constI64(np, "axes", {axis})};
    if (step != 1) ins.push_back(constI64(np, "steps", {step}));
    return this->step(np, "Slice", ins);
  }
  Value* sliceLast(const onnx::NodeProto& np, Value* x, int64_t b, int64_t e, int64_t step = 1) { return sliceAxis(np, x, -1, b, e, step); }
  Value* reshapeTo(const onnx::NodeProto& np, Value* v, const std::vector<int64_t>& shape) {
    return v->type().shape == shape ? v : step(np, "Reshape", {v, constI64(np, "shape", shape)});
  }

  // DepthToSpace (modes DCR, the default, and CRD; PyTorch's PixelShuffle exports as CRD) and
  // SpaceToDepth on [N, C, H, W]: a Reshape to six dims, a Transpose and a Reshape back, so they get
  // those ops' gradients and kernels on every backend.
  void lowerDepthSpace(const onnx::NodeProto& np, bool toDepth, const std::string& out) {
    Value* x = operand(np, 0);
    if (!x) fail(nodeLabel(np) + " needs an input");
    const auto& s = x->type().shape;
    if (s.size() != 4) fail(nodeLabel(np) + ": the input must be [N, C, H, W], got " + x->type().str());
    const int64_t b = attrInt(np, "blocksize", 0);
    if (b <= 0) fail(nodeLabel(np) + ": blocksize must be a positive int, got " + std::to_string(b));
    const int64_t n = s[0], c = s[1], h = s[2], w = s[3];
    if (toDepth) {
      if (h % b || w % b) fail(nodeLabel(np) + ": H and W of " + x->type().str() + " must be multiples of blocksize " + std::to_string(b));
      Value* t = step(np, "Transpose", {reshapeTo(np, x, {n, c, h / b, b, w / b, b})}, {{"perm", std::vector<int64_t>{0, 3, 5, 1, 2, 4}}});
      step(np, "Reshape", {t, constI64(np, "shape", {n, c * b * b, h / b, w / b})}, {}, out);
    } else {
      const std::string mode = [&] {
        const auto* a = findAttr(np, "mode", onnx::AttributeProto::STRING, "a string");
        return a ? a->s() : std::string("DCR");
      }();
      if (mode != "DCR" && mode != "CRD") fail(nodeLabel(np) + ": mode '" + mode + "' is not DCR or CRD");
      if (c % (b * b)) fail(nodeLabel(np) + ": C of " + x->type().str() + " must be a multiple of blocksize^2 = " + std::to_string(b * b));
      const int64_t cb = c / (b * b);
      Value* t = mode == "DCR"
                     ? step(np, "Transpose", {reshapeTo(np, x, {n, b, b, cb, h, w})}, {{"perm", std::vector<int64_t>{0, 3, 4, 1, 5, 2}}})
                     : step(np, "Transpose", {reshapeTo(np, x, {n, cb, b, b, h, w})}, {{"perm", std::vector<int64_t>{0, 1, 4, 2, 5, 3}}});
      step(np, "Reshape", {t, constI64(np, "shape", {n, cb, h * b, w * b})}, {}, out);
    }
  }

  // SoftmaxCrossEntropyLoss with class probabilities as its labels (float, the scores' shape):
  // PyTorch's F.cross_entropy with soft targets exports so, although ONNX's op takes class indices.
  // loss = -sum_c w_c p_c log_softmax(x)_c per sample, then the reduction; PyTorch's mean divides
  // by the number of samples (N d1 ..), weights or not, and ignore_index means nothing here.
  void lowerSoftTargetCe(const onnx::NodeProto& np) {
    Value* x = floatOperand(np, 0);
    Value* p = floatOperand(np, 1);
    Value* w = operand(np, 2);
    const auto& xs = x->type().shape;
    if (xs.size() < 2 || p->type().shape != xs)
      fail(nodeLabel(np) + ": probability labels " + p->type().str() + " must have the scores' shape " + x->type().str() + " (N x C x ...)");
    if (w && w->type().shape != std::vector<int64_t>{xs[1]}) fail(nodeLabel(np) + ": weights " + w->type().str() + " must be [C]");
    const std::string red = [&] {
      const auto* a = findAttr(np, "reduction", onnx::AttributeProto::STRING, "a string");
      return a ? a->s() : std::string("mean");
    }();
    if (red != "mean" && red != "sum" && red != "none") fail(nodeLabel(np) + ": reduction '" + red + "' is not mean, sum or none");
    if (np.output_size() < 1 || np.output(0).empty()) fail(nodeLabel(np) + " has no output");
    if (p->type().dtype != x->type().dtype) p = castTo(np, p, x->type().dtype);
    const bool wantLogProb = np.output_size() > 1 && !np.output(1).empty();
    Value* lp = step(np, "LogSoftmax", {x}, {{"axis", int64_t{1}}}, wantLogProb ? np.output(1) : std::string());
    Value* prod = step(np, "Mul", {lp, p});
    if (w) {
      std::vector<int64_t> ws(xs.size() - 1, 1);
      ws[0] = xs[1];
      Value* wc = w->type().dtype == x->type().dtype ? w : castTo(np, w, x->type().dtype);
      prod = step(np, "Mul", {prod, reshapeTo(np, wc, ws)});
    }
    Value* per = step(np, "Neg", {reduceNode(np, "ReduceSum", prod, std::vector<int64_t>{1}, 0)});
    if (red == "none") step(np, "Identity", {per}, {}, np.output(0));
    else step(np, "Identity", {reduceNode(np, red == "sum" ? "ReduceSum" : "ReduceMean", per, std::nullopt, 0)}, {}, np.output(0));
  }

  // RandomNormal and RandomUniform (torch.randn(shape) and torch.rand(shape) in a forward): their
  // *Like forms over a zero tensor of the shape, so the draws are keyed as Dropout's are.
  void lowerRandom(const onnx::NodeProto& np, bool normal, const std::string& out) {
    const auto shape = attrInts(np, "shape");
    if (!shape) fail(nodeLabel(np) + ": the shape attribute is missing");
    int64_t numel = 1;
    for (int64_t d : *shape) {
      if (d < 0 || d > (int64_t{1} << 40)) fail(nodeLabel(np) + ": shape has a dim " + std::to_string(d));
      numel *= std::max<int64_t>(d, 1);
      // The draw's shape is held as a zero constant (saved with the plan): a bound that a crafted
      // model cannot turn into gigabytes.
      if (numel > (int64_t{1} << 26)) fail(nodeLabel(np) + ": a shape of over 2^26 elements is not supported");
    }
    const auto dt = dtypeFromOnnx(static_cast<int>(attrInt(np, "dtype", onnx::TensorProto::FLOAT)));
    if (!dt || !isFloat(*dt)) fail(nodeLabel(np) + ": dtype must be a float type");
    std::map<std::string, Attribute> attrs;
    const std::vector<std::string> names = normal ? std::vector<std::string>{"mean", "scale", "seed"} : std::vector<std::string>{"low", "high", "seed"};
    for (const std::string& a : names)
      if (findAttr(np, a, onnx::AttributeProto::FLOAT, "a float")) attrs[a] = attrFloat(np, a, 0.0f);
    Value* like = g_->addConst(fresh(np, "like"), Tensor(TensorType{*dt, *shape}));
    step(np, normal ? "RandomNormalLike" : "RandomUniformLike", {like}, std::move(attrs), out);
  }

  // OneHot (F.one_hot exports as it): Where(Unsqueeze(indices, axis) == arange(depth), on, off), the
  // arange laid along the new axis. Negative indices count from depth, as ONNX says; an index
  // outside [-depth, depth) matches nothing (all off). depth must be a compile-time constant.
  void lowerOneHot(const onnx::NodeProto& np, const std::string& out) {
    Value* ind = operand(np, 0);
    Value* depthV = operand(np, 1);
    Value* values = operand(np, 2);
    if (!ind || !depthV || !values) fail(nodeLabel(np) + " needs indices, depth and values");
    const Tensor* dt = depthV->constData();
    if (!dt || dt->numel() != 1) fail(nodeLabel(np) + ": depth must be a compile-time constant of one element");
    const double dd = dt->getDouble(0);
    if (!(dd >= 1 && dd <= double{1 << 24})) fail(nodeLabel(np) + ": depth " + std::to_string(dd) + " is not a count from 1 to 2^24");
    const auto depth = static_cast<int64_t>(dd);
    if (values->type().shape != std::vector<int64_t>{2})
      fail(nodeLabel(np) + ": values must be [off_value, on_value], got " + values->type().str());
    const int64_t rank = static_cast<int64_t>(ind->type().shape.size()) + 1;
    int64_t axis = attrInt(np, "axis", -1);
    if (axis < -rank || axis >= rank) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is outside the result's rank " + std::to_string(rank));
    if (axis < 0) axis += rank;
    if (ind->type().dtype != DType::i64) ind = castTo(np, ind, DType::i64);  // ONNX: non-integer indices are cast to int64
    Value* depthK = g_->addConst(fresh(np, "depth"), Tensor::fromInts(DType::i64, {}, {depth}));
    Value* zero = g_->addConst(fresh(np, "zero"), Tensor::fromInts(DType::i64, {}, {0}));
    ind = step(np, "Where", {step(np, "Less", {ind, zero}), step(np, "Add", {ind, depthK}), ind});
    Value* hit = step(np, "Equal", {step(np, "Unsqueeze", {ind, constI64(np, "axes", {axis})}), arangeAlong(np, rank, axis, depth)});
    auto pick = [&](int64_t i) {
      return step(np, "Gather", {values, g_->addConst(fresh(np, "index"), Tensor::fromInts(DType::i64, {}, {i}))}, {{"axis", int64_t{0}}});
    };
    step(np, "Where", {hit, pick(1), pick(0)}, {}, out);
  }

  // If with a compile-time constant condition: the TorchScript exporter writes Python conditionals
  // on shapes and ranks (F.local_response_norm's, for one) as If, and with static shapes their
  // conditions fold. The taken branch's initializers and nodes are imported in the If's place, and
  // its outputs name the If's. A condition computed at run time is refused, naming the node.
  void lowerIf(const onnx::NodeProto& np) {
    Value* c = operand(np, 0);
    if (!c) fail(nodeLabel(np) + " needs a condition");
    const Tensor* t = c->constData();
    if (!t || t->numel() != 1)
      fail(nodeLabel(np) + ": its condition is computed at run time; ampc takes an If only where the condition is a compile-time constant "
                           "(with static shapes, a condition on shapes is)");
    const char* name = t->getDouble(0) != 0 ? "then_branch" : "else_branch";
    const auto* a = findAttr(np, name, onnx::AttributeProto::GRAPH, "a graph");
    if (!a) fail(nodeLabel(np) + " has no " + name);
    const onnx::GraphProto& b = a->g();
    if (b.output_size() != np.output_size())
      fail(nodeLabel(np) + ": its " + name + " has " + std::to_string(b.output_size()) + " outputs, the If " + std::to_string(np.output_size()));
    importBody(np, b, name);
    for (int i = 0; i < np.output_size(); ++i) {
      if (np.output(i).empty()) continue;
      if (auto seq = sequences_.find(b.output(i).name()); seq != sequences_.end()) {  // a sequence of static length
        sequences_[np.output(i)] = seq->second;
        continue;
      }
      Value* v = g_->lookup(b.output(i).name());
      if (!v) fail(nodeLabel(np) + ": " + name + " output '" + b.output(i).name() + "' is not produced in it or before it");
      step(np, "Identity", {v}, {}, np.output(i));
    }
  }

  // A subgraph's initializers and nodes (an If's taken branch, one iteration of a Loop or a Scan)
  // imported in place of `np`, each node's op and attributes checked as checkOps checks the main
  // graph's. `what` names the subgraph in errors.
  void importBody(const onnx::NodeProto& np, const onnx::GraphProto& b, const std::string& what) {
    for (const auto& init : b.initializer()) {
      if (init.name().empty() || g_->lookup(init.name())) fail(nodeLabel(np) + ": " + what + " initializer '" + init.name() + "' is unnamed or defined twice");
      g_->addConst(init.name(), initializer(init));
    }
    for (const auto& n : b.node()) {  // a subgraph's nodes are in order (ONNX requires it)
      const bool known = lookupOp(n.domain(), n.op_type(), domainVersion(n.domain())) ||
                         ((n.domain().empty() || n.domain() == "ai.onnx") && kImportLowered.count(n.op_type()));
      if (!known) fail(nodeLabel(n) + " (in " + nodeLabel(np) + "'s " + what + ") uses an op ampc does not support at opset " + std::to_string(g_->opset));
      std::string bad;
      if (int k = unreadAttributes(n, bad))
        fail(std::to_string(k) + " attribute(s) in " + nodeLabel(np) + "'s " + what + " that ampc does not read, and will not ignore:" + bad);
      for (const auto& o : n.output())
        if (!o.empty() && (g_->lookup(o) || sequences_.count(o))) fail(nodeLabel(n) + ": output '" + o + "' is defined twice");
      addNode(n);
    }
  }

  // Renames, in a copy of a loop body, every name the body defines (its initializers, its nodes'
  // outputs and names, and those of graphs nested in it) by appending `suffix`, and every read of
  // such a name, or of a name in `names` (the body's inputs, bound to outer values), to match. One
  // copy per iteration, so that each iteration's values are distinct. `inputs`: whether the graph's
  // own inputs are defined here (a nested graph's) rather than bound in `names` (the body's).
  static void renameBody(onnx::GraphProto& b, std::map<std::string, std::string> names, const std::string& suffix, bool inputs) {
    auto define = [&](std::string* s) {
      if (s->empty()) return;
      names[*s] = *s + suffix;
      *s += suffix;
    };
    auto read = [&](std::string* s) {
      if (auto it = names.find(*s); it != names.end()) *s = it->second;
    };
    if (inputs)
      for (auto& vi : *b.mutable_input()) define(vi.mutable_name());
    for (auto& t : *b.mutable_initializer()) define(t.mutable_name());
    for (auto& n : *b.mutable_node()) {
      for (auto& in : *n.mutable_input()) read(&in);
      for (auto& a : *n.mutable_attribute()) {
        if (a.type() == onnx::AttributeProto::GRAPH) renameBody(*a.mutable_g(), names, suffix, true);
        for (auto& g : *a.mutable_graphs()) renameBody(g, names, suffix, true);
      }
      for (auto& o : *n.mutable_output()) define(&o);
      if (!n.name().empty()) n.set_name(n.name() + suffix);
    }
    for (auto& o : *b.mutable_output()) read(o.mutable_name());
  }

  // The most loop iterations, and body nodes over all of them, that import unrolls.
  static constexpr int64_t kMaxIterations = 1 << 16, kMaxUnrolledNodes = 1 << 18;
  void checkUnroll(const onnx::NodeProto& np, int64_t iterations, int bodyNodes) {
    if (iterations > kMaxIterations || iterations * std::max(bodyNodes, 1) > kMaxUnrolledNodes)
      fail(nodeLabel(np) + ": unrolling it writes " + std::to_string(iterations) + " iterations of " + std::to_string(bodyNodes) +
           " nodes; ampc unrolls at most " + std::to_string(kMaxIterations) + " iterations and " + std::to_string(kMaxUnrolledNodes) + " nodes");
  }
  // A loop body's initializers, imported once for every iteration (bound in `names` under new
  // names) and dropped from the body that is copied per iteration.
  onnx::GraphProto sharedInitializers(const onnx::NodeProto& np, const onnx::GraphProto& body, const std::string& label,
                                      std::map<std::string, std::string>& names) {
    onnx::GraphProto b = body;
    for (const auto& init : b.initializer()) {
      if (init.name().empty()) fail(nodeLabel(np) + ": its body has an unnamed initializer");
      const std::string name = g_->uniqueName(init.name() + "@" + label);
      g_->addConst(name, initializer(init));
      names[init.name()] = name;
    }
    b.clear_initializer();
    return b;
  }
  // A value the loop carries, by name: a tensor, or a sequence of static length.
  std::string carriedName(const onnx::NodeProto& np, const std::string& name, const std::string& what) {
    if (name.empty() || (!g_->lookup(name) && !sequences_.count(name)))
      fail(nodeLabel(np) + ": " + what + " '" + name + "' is not produced in the body or before it");
    return name;
  }
  void bindCarried(const onnx::NodeProto& np, const std::string& from, const std::string& out) {
    if (out.empty()) return;
    if (auto seq = sequences_.find(from); seq != sequences_.end()) {
      sequences_[out] = seq->second;
      return;
    }
    step(np, "Identity", {g_->lookup(from)}, {}, out);
  }
  // A scan output: the iterations' tensors stacked along `axis` (Unsqueeze, then Concat).
  void stackScanned(const onnx::NodeProto& np, const std::vector<std::string>& parts, int64_t axis, const std::string& out) {
    std::vector<Value*> items;
    for (const auto& p : parts) {
      Value* v = g_->lookup(p);
      if (!v) fail(nodeLabel(np) + ": scan output '" + p + "' is a sequence or is not produced in the body");
      const int64_t r = v->type().rank() + 1;
      if (axis < -r || axis >= r) fail(nodeLabel(np) + ": scan output axis " + std::to_string(axis) + " is outside rank " + std::to_string(r));
      items.push_back(step(np, "Unsqueeze", {v, constI64(np, "axes", {axis < 0 ? axis + r : axis})}));
    }
    if (items.size() == 1) step(np, "Identity", {items[0]}, {}, out);
    else emit(np, "Concat", items, {out}, {{"axis", axis}});
  }

  // Loop whose trip count and condition are compile-time constants (a Python for loop over a range
  // or a static shape, as the TorchScript exporter writes a scripted module's loop) is unrolled: the
  // body imported once per iteration, reading the iteration number as a constant and the carried
  // values of the iteration before. Its scan outputs are the iterations' values stacked on a new
  // first axis. With a condition given, the body's condition must fold too; a loop that depends on
  // data is refused, naming the node.
  void lowerLoop(const onnx::NodeProto& np) {
    const auto* a = findAttr(np, "body", onnx::AttributeProto::GRAPH, "a graph");
    if (!a) fail(nodeLabel(np) + " has no body");
    const onnx::GraphProto& body = a->g();
    const int carried = np.input_size() - 2;
    if (carried < 0) fail(nodeLabel(np) + " needs its trip count and condition inputs (either may be empty)");
    if (body.input_size() != carried + 2)
      fail(nodeLabel(np) + ": its body has " + std::to_string(body.input_size()) + " inputs, not the iteration number, the condition and " +
           std::to_string(carried) + " carried values");
    const int scans = body.output_size() - 1 - carried;
    if (scans < 0) fail(nodeLabel(np) + ": its body has " + std::to_string(body.output_size()) + " outputs, fewer than the condition and the carried values");
    if (np.output_size() > carried + scans) fail(nodeLabel(np) + " has more outputs than its body's carried values and scan outputs");
    std::optional<int64_t> trips;
    if (!np.input(0).empty()) {
      auto m = constIntsOf(np, 0, "its trip count");
      if (m.size() != 1) fail(nodeLabel(np) + ": its trip count must be a scalar");
      trips = std::max<int64_t>(m[0], 0);
    }
    const bool hasCond = !np.input(1).empty();
    bool cond = true;
    auto constCond = [&](const std::string& name, const std::string& what) {
      Value* c = g_->lookup(name);
      const Tensor* t = c ? c->constData() : nullptr;
      if (!t || t->numel() != 1)
        fail(nodeLabel(np) + ": " + what + " is computed at run time; ampc unrolls a Loop only where the trip count and the condition are "
                             "compile-time constants (with static shapes, conditions on shapes are)");
      return t->getDouble(0) != 0;
    };
    if (hasCond) cond = constCond(np.input(1), "its condition");
    if (!trips && !hasCond) fail(nodeLabel(np) + " has neither a trip count nor a condition, so it never ends");
    std::vector<std::string> state;
    for (int k = 0; k < carried; ++k) state.push_back(carriedName(np, np.input(k + 2), "carried value"));
    std::vector<std::vector<std::string>> scanned(static_cast<size_t>(scans));
    const std::string label = np.name().empty() ? (np.output_size() ? np.output(0) : std::string("loop")) : np.name();
    if (trips && !hasCond) checkUnroll(np, *trips, body.node_size());
    std::map<std::string, std::string> shared;
    const onnx::GraphProto proto = sharedInitializers(np, body, label, shared);
    int64_t i = 0;
    for (; (!trips || i < *trips) && cond; ++i) {
      checkUnroll(np, i + 1, body.node_size());
      std::map<std::string, std::string> names = shared;
      names[body.input(0).name()] = g_->addConst(fresh(np, "iteration" + std::to_string(i)), Tensor::fromInts(DType::i64, {}, {i}))->name();
      names[body.input(1).name()] = g_->addConst(fresh(np, "condition" + std::to_string(i)), Tensor::fromInts(DType::boolean, {}, {1}))->name();
      for (int k = 0; k < carried; ++k) names[body.input(k + 2).name()] = state[static_cast<size_t>(k)];
      onnx::GraphProto b = proto;
      renameBody(b, names, "@" + label + "#" + std::to_string(i), false);
      const std::string what = "body (iteration " + std::to_string(i) + ")";
      importBody(np, b, what);
      if (hasCond) cond = constCond(b.output(0).name(), "the condition its " + what + " computes");
      for (int k = 0; k < carried; ++k) state[static_cast<size_t>(k)] = carriedName(np, b.output(k + 1).name(), "body output");
      for (int s = 0; s < scans; ++s) scanned[static_cast<size_t>(s)].push_back(b.output(1 + carried + s).name());
    }
    for (int k = 0; k < carried && k < np.output_size(); ++k) bindCarried(np, state[static_cast<size_t>(k)], np.output(k));
    for (int s = 0; carried + s < np.output_size(); ++s) {
      const std::string& out = np.output(carried + s);
      if (out.empty()) continue;
      if (i == 0) fail(nodeLabel(np) + " runs zero times, so its scan output '" + out + "' is empty and of no shape ampc knows");
      stackScanned(np, scanned[static_cast<size_t>(s)], 0, out);
    }
  }

  // Scan (opset 9 and later) is unrolled over its sequence axis: iteration t reads slice t (or
  // L - 1 - t, reversed) of each scan input along its axis, and the carried states of the one
  // before; each scan output stacks the iterations' values along its axis (in reverse where its
  // direction says).
  void lowerScan(const onnx::NodeProto& np) {
    if (g_->opset < 9) fail(nodeLabel(np) + ": Scan before opset 9 (batched, with sequence_lens) is not supported");
    const auto* a = findAttr(np, "body", onnx::AttributeProto::GRAPH, "a graph");
    if (!a) fail(nodeLabel(np) + " has no body");
    const onnx::GraphProto& body = a->g();
    const int64_t m = attrInt(np, "num_scan_inputs", 0);
    if (m < 1 || m > np.input_size()) fail(nodeLabel(np) + ": num_scan_inputs " + std::to_string(m) + " must be 1 to its " + std::to_string(np.input_size()) + " inputs");
    const int n = np.input_size() - static_cast<int>(m);
    if (body.input_size() != np.input_size())
      fail(nodeLabel(np) + ": its body has " + std::to_string(body.input_size()) + " inputs, the Scan " + std::to_string(np.input_size()));
    const int k = body.output_size() - n;
    if (k < 0) fail(nodeLabel(np) + ": its body has fewer outputs than the " + std::to_string(n) + " states");
    if (np.output_size() > n + k) fail(nodeLabel(np) + " has more outputs than its body");
    auto list = [&](const char* name, int64_t count) {
      auto v = attrInts(np, name).value_or(std::vector<int64_t>(static_cast<size_t>(count), 0));
      if (static_cast<int64_t>(v.size()) != count) fail(nodeLabel(np) + ": " + name + " has " + std::to_string(v.size()) + " entries, not " + std::to_string(count));
      return v;
    };
    const auto inAxes = list("scan_input_axes", m), inDirs = list("scan_input_directions", m);
    const auto outAxes = list("scan_output_axes", k), outDirs = list("scan_output_directions", k);
    std::vector<Value*> xs;
    std::vector<int64_t> axes;
    int64_t len = -1;
    for (int64_t j = 0; j < m; ++j) {
      Value* x = operand(np, n + static_cast<int>(j));
      if (!x) fail(nodeLabel(np) + ": scan input " + std::to_string(j) + " is missing");
      const int64_t r = x->type().rank();
      int64_t ax = inAxes[static_cast<size_t>(j)];
      if (ax < -r || ax >= r) fail(nodeLabel(np) + ": scan input axis " + std::to_string(ax) + " is outside " + x->type().str());
      if (ax < 0) ax += r;
      if (len >= 0 && x->type().shape[ax] != len) fail(nodeLabel(np) + ": its scan inputs have different lengths (" + std::to_string(len) + " and " + std::to_string(x->type().shape[ax]) + ")");
      len = x->type().shape[ax];
      xs.push_back(x);
      axes.push_back(ax);
    }
    if (len == 0) fail(nodeLabel(np) + ": its scan inputs are empty, so its outputs are of no shape ampc knows");
    checkUnroll(np, len, body.node_size());
    std::vector<std::string> state;
    for (int s = 0; s < n; ++s) state.push_back(carriedName(np, np.input(s), "state"));
    std::vector<std::vector<std::string>> scanned(static_cast<size_t>(k));
    const std::string label = np.name().empty() ? (np.output_size() ? np.output(0) : std::string("scan")) : np.name();
    std::map<std::string, std::string> shared;
    const onnx::GraphProto proto = sharedInitializers(np, body, label, shared);
    for (int64_t t = 0; t < len; ++t) {
      std::map<std::string, std::string> names = shared;
      for (int s = 0; s < n; ++s) names[body.input(s).name()] = state[static_cast<size_t>(s)];
      for (int64_t j = 0; j < m; ++j) {
        const int64_t at = inDirs[static_cast<size_t>(j)] ? len - 1 - t : t;
        Value* idx = g_->addConst(fresh(np, "at" + std::to_string(at)), Tensor::fromInts(DType::i64, {}, {at}));
        names[body.input(n + static_cast<int>(j)).name()] = step(np, "Gather", {xs[static_cast<size_t>(j)], idx}, {{"axis", axes[static_cast<size_t>(j)]}})->name();
      }
      onnx::GraphProto b = proto;
      renameBody(b, names, "@" + label + "#" + std::to_string(t), false);
      importBody(np, b, "body (iteration " + std::to_string(t) + ")");
      for (int s = 0; s < n; ++s) state[static_cast<size_t>(s)] = carriedName(np, b.output(s).name(), "body output");
      for (int o = 0; o < k; ++o) scanned[static_cast<size_t>(o)].push_back(b.output(n + o).name());
    }
    for (int s = 0; s < n && s < np.output_size(); ++s) bindCarried(np, state[static_cast<size_t>(s)], np.output(s));
    for (int o = 0; n + o < np.output_size(); ++o) {
      if (np.output(n + o).empty()) continue;
      auto parts = scanned[static_cast<size_t>(o)];
      if (outDirs[static_cast<size_t>(o)]) std::reverse(parts.begin(), parts.end());
      stackScanned(np, parts, outAxes[static_cast<size_t>(o)], np.output(n + o));
    }
  }

  // LRN (local response normalisation, AlexNet's and GoogLeNet's) on [N, C, D...]:
  // y = x / (bias + alpha / size * sum of x^2 over the channels [c - floor((size - 1) / 2),
  // c + ceil((size - 1) / 2)])^beta. The window sum is an AveragePool of size x 1 over the squares
  // with the channels zero-padded on each side, so alpha / size * sum is alpha * that average.
  // Ops that are a few registry ops each, as ONNX defines them (several by a function body).
  static inline const std::set<std::string> kSmallCompositions = {
      "GlobalMaxPool", "Sum", "Mean", "Size", "EyeLike", "ThresholdedRelu", "Shrink", "ArgMin", "Xor", "MeanVarianceNormalization",
      "Hardmax", "LpNormalization", "GlobalLpPool", "LpPool", "AffineGrid", "ReverseSequence", "Compress", "NonZero", "CenterCropPad", "MaxUnpool", "Swish"};
  void lowerSmall(const onnx::NodeProto& np, const std::string& out) {
    const std::string& op = np.op_type();
    std::vector<Value*> xs;
    for (int i = 0; i < np.input_size(); ++i)
      if (Value* v = operand(np, i)) xs.push_back(v);
    if (xs.empty()) fail(nodeLabel(np) + " needs an input");
    Value* x = xs[0];
    if (op == "Size") {  // static shapes: a constant
      g_->addConst(out, Tensor::fromInts(DType::i64, {}, {x->type().numel()}));
    } else if (op == "Sum" || op == "Mean") {  // a chain of broadcasting Adds (over n for Mean)
      Value* acc = x;
      for (size_t i = 1; i < xs.size(); ++i) acc = step(np, "Add", {acc, xs[i]});
      if (op == "Mean") acc = step(np, "Div", {acc, scalarOf(np, "count", static_cast<double>(xs.size()), x->type().dtype)});
      step(np, "Identity", {acc}, {}, out);
    } else if (op == "GlobalMaxPool") {  // the max over every spatial dim, kept
      if (x->type().rank() < 3) fail(nodeLabel(np) + ": X must be N x C x spatial, got " + x->type().str());
      std::vector<int64_t> axes;
      for (int64_t d = 2; d < x->type().rank(); ++d) axes.push_back(d);
      // adaptive_max_pool2d's gradient goes to the first largest element (its index), not shared
      Value* m = reduceNode(np, "ReduceMax", x, axes, 1);
      m->producer()->setAttr(kGradToFirst, int64_t{1});
      step(np, "Identity", {m}, {}, out);
    } else if (op == "EyeLike") {  // static shapes: a constant
      if (x->type().rank() != 2) fail(nodeLabel(np) + ": the input must be 2-D, got " + x->type().str());
      const DType t = dtypeOr(np, x->type().dtype);
      const int64_t rows = x->type().shape[0], cols = x->type().shape[1], k = attrInt(np, "k", 0);
      std::vector<double> v(static_cast<size_t>(rows * cols), 0.0);
      for (int64_t r = 0; r < rows; ++r)
        if (r + k >= 0 && r + k < cols) v[static_cast<size_t>(r * cols + r + k)] = 1.0;
      g_->addConst(out, Tensor::fromDoubles(t, {rows, cols}, v));
    } else if (op == "ThresholdedRelu") {  // x where x > alpha, else 0
      const DType t = floatOperand(np, 0)->type().dtype;
      Value* above = step(np, "Greater", {x, scalarOf(np, "alpha", attrFloat(np, "alpha", 1.0f), t)});
      step(np, "Where", {above, x, scalarOf(np, "zero", 0, t)}, {}, out);
    } else if (op == "Shrink") {  // x + bias below -lambd, x - bias above lambd, else 0 (floats: an
      // integer x would compare with lambd and subtract bias as floats, which the casts here would not)
      const DType t = floatOperand(np, 0)->type().dtype;
      const double lambd = attrFloat(np, "lambd", 0.5f), bias = attrFloat(np, "bias", 0.0f);
      Value* b = scalarOf(np, "bias", bias, t);
      Value* hi = step(np, "Where", {step(np, "Greater", {x, scalarOf(np, "lambd", lambd, t)}), step(np, "Sub", {x, b}), scalarOf(np, "zero", 0, t)});
      step(np, "Where", {step(np, "Less", {x, scalarOf(np, "neg_lambd", -lambd, t)}), step(np, "Add", {x, b}), hi}, {}, out);
    } else if (op == "ArgMin") {  // the ArgMax of -x: exact for floats, and for integers through f64
      Value* v = x;
      const DType t = x->type().dtype;
      if (t == DType::i64 || t == DType::boolean)
        fail(nodeLabel(np) + ": ArgMin of " + x->type().str() + " is not supported (floats and integers up to 32 bits are)");
      if (!isFloat(t)) v = castTo(np, v, DType::f64);
      step(np, "ArgMax", {step(np, "Neg", {v})},
           {{"axis", attrInt(np, "axis", 0)}, {"keepdims", attrInt(np, "keepdims", 1)}, {"select_last_index", attrInt(np, "select_last_index", 0)}}, out);
    } else if (op == "Swish") {  // opset 24: x sigmoid(alpha x), ONNX's function body
      Value* f = floatOperand(np, 0);
      const double alpha = attrFloat(np, "alpha", 1.0f);
      Value* arg = alpha == 1.0 ? f : step(np, "Mul", {f, scalarOf(np, "alpha", alpha, f->type().dtype)});
      step(np, "Mul", {f, step(np, "Sigmoid", {arg})}, {}, out);
    } else if (op == "AffineGrid") {  // opset 20 (F.affine_grid): theta [N, k, k + 1] times each output position's (x, y[, z], 1)
      Value* theta = floatOperand(np, 0);
      const auto size = constIntsOf(np, 1, "size");
      const bool align = attrInt(np, "align_corners", 0) != 0;
      const int64_t sp = static_cast<int64_t>(size.size()) - 2;
      const auto ts = theta->type().shape;
      if ((sp != 2 && sp != 3) || ts.size() != 3 || ts[0] != size[0] || ts[1] != sp || ts[2] != sp + 1)
        fail(nodeLabel(np) + ": theta " + theta->type().str() + " does not fit size of " + std::to_string(size.size()) + " entries (N, C and 2 or 3 spatial dims)");
      const std::vector<int64_t> dims(size.begin() + 2, size.end());
      int64_t points = 1;
      for (int64_t l : dims) {
        if (l <= 0) fail(nodeLabel(np) + ": size's spatial dims must be positive");
        // ONNX's reference puts a single position at -1, PyTorch at 0: refused rather than guessed.
        if (align && l == 1) fail(nodeLabel(np) + ": a spatial dim of 1 with align_corners is defined differently by ONNX and PyTorch");
        points *= l;
      }
      std::vector<double> base;
      base.reserve(static_cast<size_t>(points * (sp + 1)));
      for (int64_t p = 0; p < points; ++p) {
        std::vector<int64_t> at(static_cast<size_t>(sp));
        for (int64_t i = sp - 1, rest = p; i >= 0; --i) at[static_cast<size_t>(i)] = rest % dims[static_cast<size_t>(i)], rest /= dims[static_cast<size_t>(i)];
        for (int64_t i = sp - 1; i >= 0; --i) {  // x (the last dim) first
          const double l = static_cast<double>(dims[static_cast<size_t>(i)]), k = static_cast<double>(at[static_cast<size_t>(i)]);
          base.push_back(align ? -1.0 + 2.0 * k / (l - 1.0) : (2.0 * k + 1.0) / l - 1.0);
        }
        base.push_back(1.0);
      }
      // grid[n, p, o] = sum over k of theta[n, o, k] base[p, k], as a product and a sum rather than a
      // MatMul: autocast would run a MatMul in f16/bf16, and grid coordinates there are off by up to
      // a pixel at 224 px. These ops keep theta's precision (Cast to its own dtype, as elsewhere).
      const DType t = theta->type().dtype;
      Value* b = g_->addConst(fresh(np, "base_grid"), Tensor::fromDoubles(t, {1, points, 1, sp + 1}, base));
      Value* th = step(np, "Unsqueeze", {castTo(np, theta, t), constI64(np, "axes", {1})});  // [N, 1, sp, sp + 1]
      Value* grid = reduceNode(np, "ReduceSum", step(np, "Mul", {th, b}), std::vector<int64_t>{3}, 0);  // [N, points, sp]
      std::vector<int64_t> shape{size[0]};
      shape.insert(shape.end(), dims.begin(), dims.end());
      shape.push_back(sp);
      step(np, "Reshape", {grid, constI64(np, "shape", shape)}, {}, out);
    } else if (op == "ReverseSequence") {  // each batch entry's first len[b] steps reversed: GatherElements along time
      const int64_t r = x->type().rank();
      if (r < 2 || xs.size() != 2) fail(nodeLabel(np) + " needs an input of rank 2 or more and sequence_lens");
      const int64_t tAxis = attrInt(np, "time_axis", 0), bAxis = attrInt(np, "batch_axis", 1);
      if ((tAxis != 0 && tAxis != 1) || bAxis != 1 - tAxis) fail(nodeLabel(np) + ": time_axis and batch_axis must be 0 and 1, one each");
      const int64_t steps = x->type().shape[tAxis], batch = x->type().shape[bAxis];
      Value* lens = xs[1];
      if (lens->type().shape != std::vector<int64_t>{batch}) fail(nodeLabel(np) + ": sequence_lens " + lens->type().str() + " is not one length per batch entry (" + std::to_string(batch) + ")");
      if (const Tensor* t = lens->constData())
        for (int64_t b = 0; b < batch; ++b)
          if (t->getInt(b) < 0 || t->getInt(b) > steps) fail(nodeLabel(np) + ": sequence length " + std::to_string(t->getInt(b)) + " is outside 0 to " + std::to_string(steps));
      if (lens->type().dtype != DType::i64) lens = castTo(np, lens, DType::i64);
      std::vector<int64_t> along(static_cast<size_t>(r), 1);
      along[static_cast<size_t>(bAxis)] = batch;
      // A length past the steps (data at run time) is read as all of them.
      lens = step(np, "Min", {reshapeTo(np, lens, along), g_->addConst(fresh(np, "steps"), Tensor::fromInts(DType::i64, {}, {steps}))});
      Value* t = arangeAlong(np, r, tAxis, steps);
      Value* back = step(np, "Sub", {step(np, "Sub", {lens, g_->addConst(fresh(np, "one"), Tensor::fromInts(DType::i64, {}, {1}))}), t});
      Value* idx = step(np, "Where", {step(np, "Less", {t, lens}), back, t});
      idx = step(np, "Expand", {idx, constI64(np, "shape", x->type().shape)});
      step(np, "GatherElements", {x, idx}, {{"axis", tAxis}}, out);
    } else if (op == "Compress") {  // a condition known at compile time: a Gather of the positions it keeps
      if (xs.size() != 2) fail(nodeLabel(np) + " needs an input and a condition");
      const Tensor* c = xs[1]->constData();
      if (!c || xs[1]->type().rank() != 1)
        fail(nodeLabel(np) + ": its condition is computed at run time, so its output's shape is not static; ampc takes Compress only with a constant 1-D condition");
      const auto* axisAttr = findAttr(np, "axis", onnx::AttributeProto::INT, "an int");
      Value* v = axisAttr ? x : reshapeTo(np, x, {x->type().numel()});
      const int64_t r = v->type().rank();
      int64_t axis = axisAttr ? axisAttr->i() : 0;
      if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is outside " + x->type().str());
      if (axis < 0) axis += r;
      std::vector<int64_t> keep;
      for (int64_t i = 0; i < c->numel(); ++i) {
        if (c->getDouble(i) == 0) continue;
        if (i >= v->type().shape[axis]) fail(nodeLabel(np) + ": its condition selects position " + std::to_string(i) + ", past the axis's " + std::to_string(v->type().shape[axis]));
        keep.push_back(i);
      }
      if (keep.empty()) fail(nodeLabel(np) + ": its condition selects nothing; ampc has no empty tensors");
      step(np, "Gather", {v, constI64(np, "kept", keep)}, {{"axis", axis}}, out);
    } else if (op == "NonZero") {  // of a constant: a constant [rank, count]
      const Tensor* c = x->constData();
      if (!c) return lowerNonZeroPadded(np, x, out);
      const auto& shape = x->type().shape;
      const int64_t r = std::max<int64_t>(x->type().rank(), 1);
      std::vector<int64_t> at;
      for (int64_t i = 0; i < c->numel(); ++i)
        if (c->getDouble(i) != 0) at.push_back(i);
      if (at.empty()) fail(nodeLabel(np) + ": its constant input has no nonzero element; ampc has no empty tensors");
      const int64_t count = static_cast<int64_t>(at.size());
      std::vector<int64_t> v(static_cast<size_t>(r * count), 0);
      for (int64_t k = 0; k < count; ++k)
        for (int64_t d = x->type().rank() - 1, rest = at[static_cast<size_t>(k)]; d >= 0; --d) {
          v[static_cast<size_t>(d * count + k)] = rest % shape[static_cast<size_t>(d)];
          rest /= shape[static_cast<size_t>(d)];
        }
      g_->addConst(out, Tensor::fromInts(DType::i64, {r, count}, v));
    } else if (op == "MaxUnpool") {  // X scattered into zeros at MaxPool's Indices (flat over the whole output)
      if (xs.size() < 2) fail(nodeLabel(np) + " needs X and I");
      const auto& shapeX = x->type().shape;
      const int64_t sp = static_cast<int64_t>(shapeX.size()) - 2;
      if (sp < 1) fail(nodeLabel(np) + ": X must be N x C x spatial, got " + x->type().str());
      if (xs[1]->type().shape != shapeX || !isInteger(xs[1]->type().dtype))
        fail(nodeLabel(np) + ": I " + xs[1]->type().str() + " must be integer indices of X's shape " + x->type().str());
      std::vector<int64_t> shape;
      if (np.input_size() > 2 && !np.input(2).empty()) {
        shape = constIntsOf(np, 2, "output_shape");
      } else {
        const auto kernel = attrInts(np, "kernel_shape");
        if (!kernel || static_cast<int64_t>(kernel->size()) != sp) fail(nodeLabel(np) + ": kernel_shape must have one entry per spatial dim");
        const auto strides = attrInts(np, "strides").value_or(std::vector<int64_t>(static_cast<size_t>(sp), 1));
        const auto pads = attrInts(np, "pads").value_or(std::vector<int64_t>(static_cast<size_t>(2 * sp), 0));
        if (static_cast<int64_t>(strides.size()) != sp || static_cast<int64_t>(pads.size()) != 2 * sp) fail(nodeLabel(np) + ": strides and pads must have one entry per spatial dim (pads two)");
        shape = {shapeX[0], shapeX[1]};
        for (int64_t i = 0; i < sp; ++i) shape.push_back((shapeX[static_cast<size_t>(2 + i)] - 1) * strides[static_cast<size_t>(i)] + (*kernel)[static_cast<size_t>(i)] - pads[static_cast<size_t>(i)] - pads[static_cast<size_t>(sp + i)]);
      }
      int64_t total = 1;
      for (int64_t d : shape) {
        if (d <= 0) fail(nodeLabel(np) + ": the output shape has a dim of " + std::to_string(d));
        total *= d;
      }
      if (static_cast<int64_t>(shape.size()) != sp + 2 || shape[0] != shapeX[0] || shape[1] != shapeX[1])
        fail(nodeLabel(np) + ": output_shape must be N x C x spatial like X " + x->type().str());
      if (const Tensor* it = xs[1]->constData())
        for (int64_t k = 0; k < it->numel(); ++k)
          if (it->getInt(k) < 0 || it->getInt(k) >= total) fail(nodeLabel(np) + ": index " + std::to_string(it->getInt(k)) + " is outside the output's " + std::to_string(total) + " elements");
      Value* idx = xs[1]->type().dtype == DType::i64 ? xs[1] : castTo(np, xs[1], DType::i64);
      Value* zeros = step(np, "Expand", {scalarOf(np, "zero", 0.0, x->type().dtype), constI64(np, "size", {total})});
      Value* flat = step(np, "ScatterElements", {zeros, reshapeTo(np, idx, {x->type().numel()}), reshapeTo(np, x, {x->type().numel()})},
                         {{"axis", int64_t{0}}});
      step(np, "Reshape", {flat, constI64(np, "shape", shape)}, {}, out);
    } else if (op == "CenterCropPad") {  // per axis a centred crop (start floor(d / 2)) or zero padding (floor(d / 2) before)
      if (xs.size() != 2) fail(nodeLabel(np) + " needs an input and a shape");
      const auto target = constIntsOf(np, 1, "shape");
      const int64_t r = x->type().rank();
      std::vector<int64_t> axes = attrInts(np, "axes").value_or(std::vector<int64_t>{});
      if (axes.empty())
        for (int64_t a = 0; a < r; ++a) axes.push_back(a);
      if (axes.size() != target.size()) fail(nodeLabel(np) + ": shape has " + std::to_string(target.size()) + " entries for " + std::to_string(axes.size()) + " axes");
      Value* v = x;
      for (size_t i = 0; i < axes.size(); ++i) {
        int64_t a = axes[i];
        if (a < -r || a >= r) fail(nodeLabel(np) + ": axis " + std::to_string(a) + " is outside " + x->type().str());
        if (a < 0) a += r;
        if (target[i] <= 0) fail(nodeLabel(np) + ": shape entries must be positive");
        const int64_t diff = target[i] - x->type().shape[static_cast<size_t>(a)];
        const int64_t before = diff >= 0 ? diff / 2 : -((-diff) / 2);
        v = padAxis(np, v, a, before, diff - before);
      }
      step(np, "Identity", {v}, {}, out);
    } else if (op == "Xor") {  // (a and not b) or (not a and b)
      if (xs.size() != 2) fail(nodeLabel(np) + " needs two inputs");
      Value* a = xs[0];
      Value* b = xs[1];
      step(np, "Or", {step(np, "And", {a, step(np, "Not", {b})}), step(np, "And", {step(np, "Not", {a}), b})}, {}, out);
    } else if (op == "MeanVarianceNormalization") {  // (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9), ONNX's body
      const DType t = floatOperand(np, 0)->type().dtype;
      x = castTo(np, x, t);  // as the other compositions: the op's own precision under autocast
      const auto axes = attrInts(np, "axes").value_or(std::vector<int64_t>{0, 2, 3});
      Value* mean = reduceNode(np, "ReduceMean", x, axes, 1);
      Value* meanSq = reduceNode(np, "ReduceMean", step(np, "Mul", {x, x}), axes, 1);
      Value* var = step(np, "Sub", {meanSq, step(np, "Mul", {mean, mean})});
      Value* den = step(np, "Add", {step(np, "Sqrt", {var}), scalarOf(np, "eps", 1e-9, t)});
      step(np, "Div", {step(np, "Sub", {x, mean}), den}, {}, out);
    } else if (op == "Hardmax") {  // 1 at the first largest along axis, else 0 (no gradient, as ArgMax)
      const DType t = floatOperand(np, 0)->type().dtype;
      const int64_t r = x->type().rank();
      int64_t axis = attrInt(np, "axis", -1);
      if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is out of range for " + x->type().str());
      if (axis < 0) axis += r;
      Value* idx = step(np, "ArgMax", {x}, {{"axis", axis}, {"keepdims", int64_t{1}}});
      Value* hit = step(np, "Equal", {idx, arangeAlong(np, r, axis, x->type().shape[static_cast<size_t>(axis)])});
      castTo(np, hit, t, out);
    } else if (op == "LpNormalization" || op == "GlobalLpPool") {
      // x / ||x||_p along axis (p 1 or 2, no epsilon, as ONNX's reference), or ||x||_p over the
      // spatial dims (any p >= 1), kept.
      const DType t = floatOperand(np, 0)->type().dtype;
      x = castTo(np, x, t);  // as the other compositions: the op's own precision under autocast
      const int64_t r = x->type().rank(), p = attrInt(np, "p", 2);
      std::vector<int64_t> axes;
      if (op == "GlobalLpPool") {
        if (r < 3) fail(nodeLabel(np) + ": X must be N x C x spatial, got " + x->type().str());
        if (p < 1) fail(nodeLabel(np) + ": p must be at least 1, got " + std::to_string(p));
        for (int64_t d = 2; d < r; ++d) axes.push_back(d);
      } else {
        int64_t axis = attrInt(np, "axis", -1);
        if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is out of range for " + x->type().str());
        if (p != 1 && p != 2) fail(nodeLabel(np) + ": p must be 1 or 2, got " + std::to_string(p));
        axes.push_back(axis < 0 ? axis + r : axis);
      }
      Value* norm;
      if (p == 1) {
        norm = reduceNode(np, "ReduceSum", step(np, "Abs", {x}), axes, 1);
      } else if (p == 2) {
        norm = normRoot(np, reduceNode(np, "ReduceSum", step(np, "Mul", {x, x}), axes, 1), 2);
      } else {
        Value* s = reduceNode(np, "ReduceSum", step(np, "Pow", {step(np, "Abs", {x}), scalarOf(np, "p", static_cast<double>(p), t)}), axes, 1);
        norm = normRoot(np, s, static_cast<double>(p));
      }
      if (op == "GlobalLpPool") step(np, "Identity", {norm}, {}, out);
      else step(np, "Div", {x, norm}, {}, out);
    } else if (op == "LpPool") {
      // (sum over each window of |x|^p)^(1/p), pads adding 0: an AveragePool of |x|^p that counts
      // the pads, times the window's size. With ceil_mode a last window may pass the padded edge,
      // where the average's divisor is not the window's size: refused.
      const DType t = floatOperand(np, 0)->type().dtype;
      x = castTo(np, x, t);  // as the other compositions: the op's own precision under autocast
      const int64_t p = attrInt(np, "p", 2);
      if (p < 1) fail(nodeLabel(np) + ": p must be at least 1, got " + std::to_string(p));
      if (attrInt(np, "ceil_mode", 0) != 0)
        fail(nodeLabel(np) + ": ceil_mode = 1 is not supported (a last window past the padded edge has no sum ampc's pooling gives)");
      const auto kernel = attrInts(np, "kernel_shape");
      if (!kernel || kernel->empty()) fail(nodeLabel(np) + ": kernel_shape is required");
      double volume = 1;
      for (int64_t k : *kernel) volume *= static_cast<double>(k);
      std::map<std::string, Attribute> pool = {{"kernel_shape", *kernel}, {"count_include_pad", int64_t{1}}};
      for (const char* name : {"strides", "pads", "dilations"})
        if (auto v = attrInts(np, name)) pool[name] = *v;
      if (const auto* a = findAttr(np, "auto_pad", onnx::AttributeProto::STRING, "a string")) pool["auto_pad"] = a->s();
      Value* powed = p == 1 ? step(np, "Abs", {x})
                     : p == 2 ? step(np, "Mul", {x, x})
                              : step(np, "Pow", {step(np, "Abs", {x}), scalarOf(np, "p", static_cast<double>(p), t)});
      Value* sum = step(np, "Mul", {step(np, "AveragePool", {powed}, pool), scalarOf(np, "window", volume, t)});
      if (p == 1) step(np, "Identity", {sum}, {}, out);
      else if (p == 2) step(np, "Sqrt", {sum}, {}, out);
      else step(np, "Pow", {sum, scalarOf(np, "inv_p", 1.0 / static_cast<double>(p), t)}, {}, out);
    }
  }
  // 0, 1, ..., n - 1 (i64) along `axis` of a rank-`rank` shape of ones (a broadcast operand).
  Value* arangeAlong(const onnx::NodeProto& np, int64_t rank, int64_t axis, int64_t n) {
    std::vector<int64_t> along(static_cast<size_t>(rank), 1), range(static_cast<size_t>(n));
    along[static_cast<size_t>(axis)] = n;
    for (int64_t i = 0; i < n; ++i) range[static_cast<size_t>(i)] = i;
    return g_->addConst(fresh(np, "arange"), Tensor::fromInts(DType::i64, along, range));
  }
  DType dtypeOr(const onnx::NodeProto& np, DType dflt) {
    const auto* a = findAttr(np, "dtype", onnx::AttributeProto::INT, "an int");
    if (!a) return dflt;
    auto t = dtypeFromOnnx(static_cast<int>(a->i()));
    if (!t) fail(nodeLabel(np) + ": dtype " + std::to_string(a->i()) + " is not one ampc supports");
    return *t;
  }
  void lowerLrn(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    const auto& s = x->type().shape;
    if (s.size() < 3) fail(nodeLabel(np) + ": the input must be [N, C, D...], got " + x->type().str());
    const int64_t size = attrInt(np, "size", 0);
    if (size <= 0) fail(nodeLabel(np) + ": size must be a positive int, got " + std::to_string(size));
    const DType t = x->type().dtype;
    int64_t rest = 1;
    for (size_t d = 2; d < s.size(); ++d) rest *= s[d];
    Value* xs = castTo(np, x, t);
    Value* sq = reshapeTo(np, step(np, "Mul", {xs, xs}), {s[0], 1, s[1], rest});
    const int64_t before = (size - 1) / 2, after = size - 1 - before;
    Value* padded = step(np, "Pad", {sq, constI64(np, "pads", {0, 0, before, 0, 0, 0, after, 0})});
    Value* avg = step(np, "AveragePool", {padded}, {{"kernel_shape", std::vector<int64_t>{size, 1}}});
    Value* base = step(np, "Add", {scalarOf(np, "bias", attrFloat(np, "bias", 1.0f), t),
                                   step(np, "Mul", {scalarOf(np, "alpha", attrFloat(np, "alpha", 1e-4f), t), reshapeTo(np, avg, s)})});
    Value* den = step(np, "Pow", {base, scalarOf(np, "beta", attrFloat(np, "beta", 0.75f), t)});
    step(np, "Div", {xs, den}, {}, out);
  }

  // LSTM and GRU of a static sequence length, unrolled over time into MatMul, Sigmoid, Tanh and
  // elementwise ops (so they get every backend's kernels and gradients; the input projection is one
  // MatMul over all steps). ONNX's equations, gate orders i, o, f, c (LSTM) and z, r, h (GRU, either
  // linear_before_reset; PyTorch exports 1); directions forward, reverse and bidirectional; both
  // layouts; optional biases and initial states. What it does not reproduce is refused, naming the
  // node: other activations, clip, input_forget, peepholes, and sequence_lens other than full length.
  // LSTM, GRU and RNN (Elman), unrolled over the sequence into MatMuls and pointwise gates.
  enum class Cell { Lstm, Gru, Rnn };
  void lowerRecurrent(const onnx::NodeProto& np, Cell cell) {
    const std::string what = nodeLabel(np);
    const bool lstm = cell == Cell::Lstm;
    for (const char* a : {"activation_alpha", "activation_beta", "clip"})
      if (std::any_of(np.attribute().begin(), np.attribute().end(), [&](const auto& x) { return x.name() == a; }))
        fail(what + ": attribute '" + a + "' is not supported (activations without parameters, no clip)");
    if (lstm && attrInt(np, "input_forget", 0) != 0) fail(what + ": input_forget=1 is not supported");
    if (lstm && operand(np, 7)) fail(what + ": peephole weights (P) are not supported");
    Value* x = operand(np, 0);
    Value* w = operand(np, 1);
    Value* r = operand(np, 2);
    if (!x || !w || !r) fail(what + " needs X, W and R");
    const int64_t layout = attrInt(np, "layout", 0);
    if (layout != 0 && layout != 1) fail(what + ": layout must be 0 or 1");
    const std::string dir = [&] {
      const auto* a = findAttr(np, "direction", onnx::AttributeProto::STRING, "a string");
      return a ? a->s() : std::string("forward");
    }();
    if (dir != "forward" && dir != "reverse" && dir != "bidirectional") fail(what + ": direction '" + dir + "' is not forward, reverse or bidirectional");
    const int64_t dirs = dir == "bidirectional" ? 2 : 1, gates = lstm ? 4 : cell == Cell::Gru ? 3 : 1;
    // The activations, per direction: LSTM and GRU only their defaults (f = Sigmoid, g = h = Tanh),
    // written or not; RNN's one function Tanh (its default), Relu or Sigmoid, as torch.nn.RNN's
    // nonlinearity exports.
    std::vector<std::string> acts;
    {
      const size_t per = lstm ? 3 : cell == Cell::Gru ? 2 : 1;
      std::vector<std::string> defaults = lstm ? std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"}
                                               : cell == Cell::Gru ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                                                   : std::vector<std::string>{"Tanh"};
      for (int64_t d = 0; d < dirs; ++d) acts.insert(acts.end(), defaults.begin(), defaults.end());
      if (const auto* a = findAttr(np, "activations", onnx::AttributeProto::STRINGS, "a list of strings")) {
        if (static_cast<size_t>(a->strings_size()) != per * static_cast<size_t>(dirs))
          fail(what + ": activations lists " + std::to_string(a->strings_size()) + " functions; " + std::to_string(per * dirs) +
               " are wanted (" + std::to_string(per) + " per direction)");
        for (int i = 0; i < a->strings_size(); ++i) {
          const std::string& f = a->strings(i);
          const bool ok = cell == Cell::Rnn ? (f == "Tanh" || f == "Relu" || f == "Sigmoid") : f == acts[static_cast<size_t>(i)];
          if (!ok)
            fail(what + ": activation '" + f + "' is not supported" +
                 (cell == Cell::Rnn ? std::string(" (Tanh, Relu or Sigmoid)") : " (only the defaults Sigmoid, Tanh" + std::string(lstm ? ", Tanh)" : ")")));
          acts[static_cast<size_t>(i)] = f;
        }
      }
    }
    const int64_t H = attrInt(np, "hidden_size", 0);
    const auto &xs = x->type().shape, &ws = w->type().shape, &rs = r->type().shape;
    if (xs.size() != 3) fail(what + ": X must have rank 3, got " + x->type().str());
    const int64_t T = xs[layout ? 1 : 0], batch = xs[layout ? 0 : 1], in = xs[2];
    if (H <= 0 || ws != std::vector<int64_t>{dirs, gates * H, in} || rs != std::vector<int64_t>{dirs, gates * H, H})
      fail(what + ": W " + w->type().str() + " and R " + r->type().str() + " do not fit hidden_size " + std::to_string(H) + ", " +
           std::to_string(dirs) + " direction(s) and " + std::to_string(in) + " inputs");
    if (T <= 0) fail(what + ": the sequence is empty");
    // Unrolled, each step is about 15 nodes per direction: a longer sequence would be a graph no
    // one can compile in reasonable time (and a crafted model must not hang the importer).
    constexpr int64_t kMaxSteps = 16384;
    if (T * dirs > kMaxSteps)
      fail(what + ": " + std::to_string(T) + " steps x " + std::to_string(dirs) + " direction(s) is past the " + std::to_string(kMaxSteps) +
           " that ampc unrolls");
    // sequence_lens (PyTorch's pack_padded_sequence): sample b runs steps t < lens[b] only. Each step
    // keeps the state where t >= lens[b] and writes 0 to Y there, as ONNX defines it (and
    // pad_packed_sequence pads); the reverse direction so starts at lens[b] - 1 from the initial
    // state. A constant lens must lie in [0, T]; lens computed at run time are read as they come.
    Value* lens = operand(np, 4);
    if (lens) {
      if (lens->type().shape != std::vector<int64_t>{batch} || !isInteger(lens->type().dtype))
        fail(what + ": sequence_lens must be an integer [" + std::to_string(batch) + "], got " + lens->type().str());
      if (const Tensor* t = lens->constData()) {
        bool full = true;
        for (int64_t i = 0; i < t->numel(); ++i) {
          if (t->getInt(i) < 0 || t->getInt(i) > T)
            fail(what + ": sequence_lens[" + std::to_string(i) + "] = " + std::to_string(t->getInt(i)) + " is outside [0, " + std::to_string(T) + "]");
          full &= t->getInt(i) == T;
        }
        if (full) lens = nullptr;  // every sample runs every step: no masks
      }
    }
    const DType dt = x->type().dtype;
    auto pick = [&](Value* v, int64_t i) {  // v[i] along axis 0, that axis dropped
      return step(np, "Gather", {v, g_->addConst(fresh(np, "index"), Tensor::fromInts(DType::i64, {}, {i}))}, {{"axis", int64_t{0}}});
    };
    auto unsqueeze = [&](Value* v, int64_t axis) { return step(np, "Unsqueeze", {v, constI64(np, "axes", {axis})}); };
    auto concat = [&](const std::vector<Value*>& vs, int64_t axis, const std::string& out = {}) {
      return vs.size() == 1 && out.empty() ? vs[0] : step(np, "Concat", vs, {{"axis", axis}}, out);
    };
    // Time-major [T, B, I]; initial states [dirs, B, H].
    Value* xt = layout ? step(np, "Transpose", {x}, {{"perm", std::vector<int64_t>{1, 0, 2}}}) : x;
    auto state = [&](int i) -> Value* {
      Value* s = operand(np, i);
      if (!s) return nullptr;
      const std::vector<int64_t> want = layout ? std::vector<int64_t>{batch, dirs, H} : std::vector<int64_t>{dirs, batch, H};
      if (s->type().shape != want) fail(what + ": initial state " + s->type().str() + " does not fit");
      return layout ? step(np, "Transpose", {s}, {{"perm", std::vector<int64_t>{1, 0, 2}}}) : s;
    };
    Value* h0 = state(5);
    Value* c0 = lstm ? state(6) : nullptr;
    Value* bias = operand(np, 3);
    if (bias && bias->type().shape != std::vector<int64_t>{dirs, 2 * gates * H}) fail(what + ": B " + bias->type().str() + " does not fit");
    const bool lbr = !lstm && attrInt(np, "linear_before_reset", 0) != 0;
    std::vector<Value*> ys(static_cast<size_t>(dirs)), hs, cs;
    // With sequence_lens: whether step t ran for each sample ([B, 1], shared by the directions), and Y's 0.
    std::vector<Value*> ranAt(static_cast<size_t>(T), nullptr);
    Value* const yPad = lens ? scalarOf(np, "zero", 0.0, dt) : nullptr;
    for (int64_t d = 0; d < dirs; ++d) {
      const bool reverse = dir == "reverse" || d == 1;
      Value* wt = step(np, "Transpose", {pick(w, d)}, {{"perm", std::vector<int64_t>{1, 0}}});  // [I, G H]
      Value* rt = step(np, "Transpose", {pick(r, d)}, {{"perm", std::vector<int64_t>{1, 0}}});  // [H, G H]
      Value* xw = step(np, "MatMul", {xt, wt});                                                  // [T, B, G H]
      Value* rb = nullptr;
      if (bias) {
        Value* bd = pick(bias, d);
        xw = step(np, "Add", {xw, sliceAxis(np, bd, 0, 0, gates * H)});
        rb = sliceAxis(np, bd, 0, gates * H, 2 * gates * H);
      }
      // GRU without linear_before_reset: the h gate's recurrent product comes after the reset.
      const bool split = cell == Cell::Gru && !lbr;
      Value* rtZr = split ? sliceAxis(np, rt, 1, 0, 2 * H) : rt;
      Value* rtH = split ? sliceAxis(np, rt, 1, 2 * H, 3 * H) : nullptr;
      Value* rbZr = rb && split ? sliceAxis(np, rb, 0, 0, 2 * H) : rb;
      Value* rbH = rb && split ? sliceAxis(np, rb, 0, 2 * H, 3 * H) : nullptr;
      Value* h = h0 ? pick(h0, d) : g_->addConst(fresh(np, "h0"), Tensor(TensorType{dt, {batch, H}}));
      Value* c = lstm ? (c0 ? pick(c0, d) : g_->addConst(fresh(np, "c0"), Tensor(TensorType{dt, {batch, H}}))) : nullptr;
      std::vector<Value*> out(static_cast<size_t>(T));
      for (int64_t k = 0; k < T; ++k) {
        const int64_t t = reverse ? T - 1 - k : k;
        Value* const hPrev = h;
        Value* const cPrev = c;
        Value* xg = pick(xw, t);                        // [B, G H]
        Value* hg = step(np, "MatMul", {h, rtZr});      // [B, G H] (GRU without lbr: [B, 2 H])
        if (rbZr) hg = step(np, "Add", {hg, rbZr});
        auto gate = [&](Value* v, int64_t i) { return sliceAxis(np, v, 1, i * H, (i + 1) * H); };
        if (cell == Cell::Rnn) {
          h = step(np, acts[static_cast<size_t>(d)], {step(np, "Add", {xg, hg})});
        } else if (lstm) {
          Value* s = step(np, "Add", {xg, hg});
          Value* i = step(np, "Sigmoid", {gate(s, 0)});
          Value* o = step(np, "Sigmoid", {gate(s, 1)});
          Value* f = step(np, "Sigmoid", {gate(s, 2)});
          Value* cc = step(np, "Tanh", {gate(s, 3)});
          c = step(np, "Add", {step(np, "Mul", {f, c}), step(np, "Mul", {i, cc})});
          h = step(np, "Mul", {o, step(np, "Tanh", {c})});
        } else {
          Value* z = step(np, "Sigmoid", {step(np, "Add", {gate(xg, 0), gate(hg, 0)})});
          Value* rr = step(np, "Sigmoid", {step(np, "Add", {gate(xg, 1), gate(hg, 1)})});
          Value* hh = nullptr;
          if (lbr) {
            hh = step(np, "Mul", {rr, gate(hg, 2)});
          } else {
            hh = step(np, "MatMul", {step(np, "Mul", {rr, h}), rtH});
            if (rbH) hh = step(np, "Add", {hh, rbH});
          }
          Value* cand = step(np, "Tanh", {step(np, "Add", {gate(xg, 2), hh})});
          h = step(np, "Add", {cand, step(np, "Mul", {z, step(np, "Sub", {h, cand})})});  // (1 - z) cand + z h
        }
        if (lens) {  // t < lens[b]: this step ran for sample b
          Value*& ran = ranAt[static_cast<size_t>(t)];
          if (!ran) ran = unsqueeze(step(np, "Less", {g_->addConst(fresh(np, "t"), Tensor::fromInts(lens->type().dtype, {}, {t})), lens}), 1);
          out[static_cast<size_t>(t)] = unsqueeze(step(np, "Where", {ran, h, yPad}), 0);
          h = step(np, "Where", {ran, h, hPrev});
          if (lstm) c = step(np, "Where", {ran, c, cPrev});
        } else {
          out[static_cast<size_t>(t)] = unsqueeze(h, 0);
        }
      }
      ys[static_cast<size_t>(d)] = unsqueeze(concat(out, 0), 1);  // [T, 1, B, H]
      hs.push_back(unsqueeze(h, 0));
      if (lstm) cs.push_back(unsqueeze(c, 0));
    }
    auto output = [&](int i, const std::vector<Value*>& parts, int64_t axis, const std::vector<int64_t>& batchFirst) {
      if (i >= np.output_size() || np.output(i).empty()) return;
      if (!layout) {
        if (parts.size() == 1) step(np, "Identity", {parts[0]}, {}, np.output(i));
        else concat(parts, axis, np.output(i));
        return;
      }
      step(np, "Transpose", {concat(parts, axis)}, {{"perm", batchFirst}}, np.output(i));
    };
    output(0, ys, 1, {2, 0, 1, 3});  // Y: [T, dirs, B, H] (layout 1: [B, T, dirs, H])
    output(1, hs, 0, {1, 0, 2});     // Y_h: [dirs, B, H] (layout 1: [B, dirs, H])
    if (lstm) output(2, cs, 0, {1, 0, 2});
  }

  // RotaryEmbedding (opset 23): X [B, H, S, D] (or [B, S, H*D] with num_heads) rotated in its first
  // rotary_embedding_dim channels by the cos/sin caches (picked by position_ids, else [B, S, rot/2]),
  // as halves or interleaved pairs: (x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2).
  void lowerRotary(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    Value* cosc = floatOperand(np, 1);
    Value* sinc = floatOperand(np, 2);
    Value* pos = operand(np, 3);
    const auto xs = x->type().shape;
    const int64_t heads = attrInt(np, "num_heads", 0);
    const bool interleaved = attrInt(np, "interleaved", 0) != 0;
    if (xs.size() != 3 && xs.size() != 4) fail(nodeLabel(np) + ": X must be 3-D or 4-D, got " + x->type().str());
    if (xs.size() == 3 && (heads <= 0 || xs[2] % heads)) fail(nodeLabel(np) + ": a 3-D X needs num_heads dividing its last dim");
    // Work in [B, S, H, D] (3-D input) or [B, H, S, D] (4-D): the caches broadcast over H.
    Value* v = xs.size() == 3 ? reshapeTo(np, x, {xs[0], xs[1], heads, xs[2] / heads}) : x;
    const int64_t D = v->type().shape[3], B = xs[0], S = xs.size() == 3 ? xs[1] : xs[2];
    int64_t rot = attrInt(np, "rotary_embedding_dim", 0);
    if (rot == 0) rot = D;
    if (rot <= 0 || rot > D || rot % 2) fail(nodeLabel(np) + ": rotary_embedding_dim " + std::to_string(rot) + " must be even and at most " + std::to_string(D));
    Value* c = pos ? step(np, "Gather", {cosc, pos}) : cosc;
    Value* sn = pos ? step(np, "Gather", {sinc, pos}) : sinc;
    const std::vector<int64_t> want{B, S, rot / 2};
    if (c->type().shape != want || sn->type().shape != want)
      fail(nodeLabel(np) + ": the caches give " + c->type().str() + " and " + sn->type().str() + "; X needs " + TensorType{x->type().dtype, want}.str());
    const int64_t hAxis = xs.size() == 3 ? 2 : 1;
    c = step(np, "Unsqueeze", {c, constI64(np, "axes", {hAxis})});
    sn = step(np, "Unsqueeze", {sn, constI64(np, "axes", {hAxis})});
    Value* xr = rot == D ? v : sliceLast(np, v, 0, rot);
    Value* x1 = interleaved ? sliceLast(np, xr, 0, rot, 2) : sliceLast(np, xr, 0, rot / 2);
    Value* x2 = interleaved ? sliceLast(np, xr, 1, rot, 2) : sliceLast(np, xr, rot / 2, rot);
    Value* re = step(np, "Sub", {step(np, "Mul", {c, x1}), step(np, "Mul", {sn, x2})});
    Value* im = step(np, "Add", {step(np, "Mul", {sn, x1}), step(np, "Mul", {c, x2})});
    Value* y;
    if (interleaved) {  // (re_0, im_0, re_1, im_1, ...)
      Value* last = constI64(np, "axes", {-1});
      auto shape = xr->type().shape;
      y = reshapeTo(np, step(np, "Concat", {step(np, "Unsqueeze", {re, last}), step(np, "Unsqueeze", {im, last})}, {{"axis", int64_t{-1}}}), shape);
    } else {
      y = step(np, "Concat", {re, im}, {{"axis", int64_t{-1}}});
    }
    if (rot < D) y = step(np, "Concat", {y, sliceLast(np, v, rot, D)}, {{"axis", int64_t{-1}}});
    step(np, "Reshape", {y, constI64(np, "shape", xs)}, {}, out);
  }

  // Attention (opset 23): softmax(scale * Q K^T (softcapped) + mask + causal) V over [B, H, S, D]
  // (3-D inputs with q_num_heads / kv_num_heads), K/V heads repeated for grouped-query attention,
  // past_key / past_value concatenated (present_key / present_value are the results). The
  // qk_matmul_output result is refused.
  void lowerAttention(const onnx::NodeProto& np) {
    Value* q = floatOperand(np, 0);
    Value* k = floatOperand(np, 1);
    Value* v = floatOperand(np, 2);
    Value* mask = operand(np, 3);
    Value* pastK = operand(np, 4);
    Value* pastV = operand(np, 5);
    if (np.input_size() > 6 && !np.input(6).empty()) fail(nodeLabel(np) + ": nonpad_kv_seqlen is not supported");
    // Opset 24 reworked the KV cache for in-place updates (TensorScatter, nonpad_kv_seqlen); a
    // training graph has no cache, and ampc reads past_key / past_value only as opset 23 defines them.
    if (g_->opset >= 24 && (pastK || pastV)) fail(nodeLabel(np) + ": past_key and past_value at opset 24 (its in-place KV cache) are not supported");
    if (np.output_size() > 3 && !np.output(3).empty()) fail(nodeLabel(np) + ": the qk_matmul_output result is not supported");
    const int64_t rank = q->type().rank();
    if (rank != 3 && rank != 4) fail(nodeLabel(np) + ": Q must be 3-D or 4-D, got " + q->type().str());
    if (k->type().rank() != rank || v->type().rank() != rank) fail(nodeLabel(np) + ": Q, K and V must have the same rank");
    const int64_t B = q->type().shape[0];
    auto heads = [&](Value* t, int64_t n) {  // [B, S, n*d] -> [B, n, S, d]
      const auto& s = t->type().shape;
      if (n <= 0 || s[2] % n) fail(nodeLabel(np) + ": 3-D inputs need q_num_heads and kv_num_heads dividing their last dims");
      return step(np, "Transpose", {reshapeTo(np, t, {s[0], s[1], n, s[2] / n})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    };
    if (rank == 3) {
      q = heads(q, attrInt(np, "q_num_heads", 0));
      k = heads(k, attrInt(np, "kv_num_heads", 0));
      v = heads(v, attrInt(np, "kv_num_heads", 0));
    }
    if (pastK) k = step(np, "Concat", {pastK, k}, {{"axis", int64_t{2}}});
    if (pastV) v = step(np, "Concat", {pastV, v}, {{"axis", int64_t{2}}});
    if (np.output_size() > 1 && !np.output(1).empty()) step(np, "Identity", {k}, {}, np.output(1));
    if (np.output_size() > 2 && !np.output(2).empty()) step(np, "Identity", {v}, {}, np.output(2));
    const auto qs = q->type().shape, ks = k->type().shape, vs = v->type().shape;
    const int64_t Hq = qs[1], Hk = ks[1], Sq = qs[2], Sk = ks[2], D = qs[3];
    if (ks[0] != B || vs[0] != B || ks[3] != D || vs[1] != Hk || vs[2] != Sk)
      fail(nodeLabel(np) + ": Q " + q->type().str() + ", K " + k->type().str() + " and V " + v->type().str() + " do not fit together");
    if (Hq % Hk) fail(nodeLabel(np) + ": " + std::to_string(Hq) + " query heads are not a multiple of " + std::to_string(Hk) + " KV heads");
    auto repeat = [&](Value* t) {  // [B, Hk, S, d] -> [B, Hq, S, d], each KV head repeated in place
      if (Hq == Hk) return t;
      const auto s = t->type().shape;
      Value* u = step(np, "Unsqueeze", {t, constI64(np, "axes", {2})});
      Value* e = step(np, "Expand", {u, constI64(np, "shape", {s[0], s[1], Hq / Hk, s[2], s[3]})});
      return reshapeTo(np, e, {s[0], Hq, s[2], s[3]});
    };
    k = repeat(k);
    v = repeat(v);
    const DType dt = q->type().dtype;
    float scale = attrFloat(np, "scale", 0.0f);
    if (scale == 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(D));
    Value* kt = step(np, "Transpose", {k}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}});
    Value* sc = step(np, "Mul", {step(np, "MatMul", {q, kt}), scalarOf(np, "scale", scale, dt)});
    const float softcap = attrFloat(np, "softcap", 0.0f);
    if (softcap > 0) {
      Value* cap = scalarOf(np, "softcap", softcap, dt);
      sc = step(np, "Mul", {step(np, "Tanh", {step(np, "Div", {sc, cap})}), cap});
    }
    if (mask) {
      const auto& ms = mask->type().shape;
      if (ms.empty() || ms.back() != Sk) fail(nodeLabel(np) + ": attn_mask " + mask->type().str() + " must end in the key length " + std::to_string(Sk));
      if (mask->type().dtype == DType::boolean) {
        mask = step(np, "Where", {mask, scalarOf(np, "zero", 0.0, dt), scalarOf(np, "neg_inf", -INFINITY, dt)});
      } else if (!isFloat(mask->type().dtype)) {
        fail(nodeLabel(np) + ": attn_mask must be bool or float, got " + mask->type().str());
      }
    }
    if (attrInt(np, "is_causal", 0)) {  // key j is visible to query i when j <= i + past length
      const int64_t past = pastK ? pastK->type().shape[2] : 0;
      std::vector<double> bias(static_cast<size_t>(Sq * Sk));
      for (int64_t i = 0; i < Sq; ++i)
        for (int64_t j = 0; j < Sk; ++j) bias[i * Sk + j] = j <= i + past ? 0.0 : -INFINITY;
      Value* causal = g_->addConst(fresh(np, "causal"), Tensor::fromDoubles(dt, {Sq, Sk}, bias));
      // One mask: (s + m) + c and s + (m + c) are the same numbers when c is 0 or -inf, and the
      // scores then take one Add, the form fuse-attention takes.
      mask = mask ? step(np, "Add", {mask, causal}) : causal;
    }
    if (mask) sc = step(np, "Add", {sc, mask});
    Value* y = step(np, "MatMul", {step(np, "Softmax", {sc}, {{"axis", int64_t{-1}}}), v});
    const std::string out = np.output(0);
    if (rank == 3) {
      Value* t = step(np, "Transpose", {y}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
      step(np, "Reshape", {t, constI64(np, "shape", {B, Sq, Hq * vs[3]})}, {}, out);
    } else {
      step(np, "Identity", {y}, {}, out);
    }
  }

  // Pads axis `a` of v by `before` / `after` zeros; a negative amount crops.
  Value* padAxis(const onnx::NodeProto& np, Value* v, int64_t a, int64_t before, int64_t after) {
    const int64_t r = v->type().rank(), len = v->type().shape[a];
    if (before < 0 || after < 0) {
      const int64_t b = std::max<int64_t>(0, -before), e = len - std::max<int64_t>(0, -after);
      if (e <= b) fail(nodeLabel(np) + ": its padding crops away the whole axis");
      v = sliceAxis(np, v, a, b, e);
      before = std::max<int64_t>(before, 0), after = std::max<int64_t>(after, 0);
    }
    if (before == 0 && after == 0) return v;
    std::vector<int64_t> pads(2 * r, 0);
    pads[a] = before, pads[r + a] = after;
    return step(np, "Pad", {v, constI64(np, "pads", pads)});
  }

  // ConvTranspose as a Conv: the input's spatial dims get stride - 1 zeros between elements, are
  // padded by (k - 1) * dilation - pad at each end (plus output_padding at the end; negative
  // amounts crop), and are convolved at stride 1 with the kernel flipped and its channel dims
  // swapped per group. Every step is differentiable, so the kernel trains as it does in PyTorch.
  // Col2Im (opset 18; PyTorch's nn.Fold and F.fold): the columns [N, C * K, L] (K = prod(block),
  // column c * K + k holding block offset k, row-major, of channel c at each of the L block
  // positions) summed back into the image [N, C, image...]. That is a ConvTranspose of the columns
  // laid out as [N, C * K, blocks...] in C groups, with a constant one-hot weight [C * K, 1, block...]
  // that sends input channel c * K + k to offset k; output_padding makes up the image's tail that no
  // block reaches.
  void lowerCol2Im(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    const auto image = constIntsOf(np, 1, "image_shape"), block = constIntsOf(np, 2, "block_shape");
    const int64_t sp = static_cast<int64_t>(image.size());
    if (sp < 1 || sp > 3 || static_cast<int64_t>(block.size()) != sp)
      fail(nodeLabel(np) + ": image_shape and block_shape must have 1 to 3 entries alike, got " + std::to_string(sp) + " and " + std::to_string(block.size()));
    const auto xs = x->type().shape;
    if (xs.size() != 3) fail(nodeLabel(np) + ": the input must be [N, C * prod(block_shape), L], got " + x->type().str());
    int64_t k = 1;
    for (int64_t b : block) {
      if (b <= 0) fail(nodeLabel(np) + ": block_shape entries must be positive");
      k *= b;
    }
    if (xs[1] % k) fail(nodeLabel(np) + ": the input's " + std::to_string(xs[1]) + " rows are not a multiple of the block's " + std::to_string(k) + " elements");
    auto ints = [&](const char* name, int64_t dflt, int64_t n) {
      auto v = attrInts(np, name).value_or(std::vector<int64_t>(static_cast<size_t>(n), dflt));
      if (static_cast<int64_t>(v.size()) != n) fail(nodeLabel(np) + ": " + name + " must have " + std::to_string(n) + " entries");
      return v;
    };
    const auto strides = ints("strides", 1, sp), dil = ints("dilations", 1, sp), pads = ints("pads", 0, 2 * sp);
    std::vector<int64_t> shape{xs[0], xs[1]}, outPad;
    int64_t blocks = 1;
    for (int64_t i = 0; i < sp; ++i) {
      if (strides[i] <= 0 || dil[i] <= 0 || pads[i] < 0 || pads[sp + i] < 0) fail(nodeLabel(np) + ": strides and dilations must be positive, pads not negative");
      const int64_t span = image[i] + pads[i] + pads[sp + i] - ((block[i] - 1) * dil[i] + 1);
      if (image[i] <= 0 || span < 0) fail(nodeLabel(np) + ": the block does not fit the padded image in dim " + std::to_string(i));
      shape.push_back(span / strides[i] + 1);
      outPad.push_back(span % strides[i]);
      blocks *= shape.back();
    }
    if (blocks != xs[2])
      fail(nodeLabel(np) + ": the input has " + std::to_string(xs[2]) + " blocks; image_shape, block_shape and the attributes make " + std::to_string(blocks));
    const int64_t c = xs[1] / k;
    std::vector<int64_t> wshape{xs[1], 1};
    wshape.insert(wshape.end(), block.begin(), block.end());
    std::vector<double> w(static_cast<size_t>(xs[1] * k), 0.0);
    for (int64_t ch = 0; ch < xs[1]; ++ch) w[static_cast<size_t>(ch * k + ch % k)] = 1.0;
    Value* cols = reshapeTo(np, x, shape);
    Value* wv = g_->addConst(fresh(np, "one_hot"), Tensor::fromDoubles(x->type().dtype, wshape, w));
    onnx::NodeProto t;
    t.set_name(np.name());
    t.set_op_type("ConvTranspose");
    t.add_input(cols->name());
    t.add_input(wv->name());
    t.add_output(out);
    auto attr = [&](const char* name, const std::vector<int64_t>& v) {
      auto* a = t.add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::INTS);
      for (int64_t e : v) a->add_ints(e);
    };
    attr("strides", strides);
    attr("dilations", dil);
    attr("pads", pads);
    attr("output_padding", outPad);
    auto* g = t.add_attribute();
    g->set_name("group");
    g->set_type(onnx::AttributeProto::INT);
    g->set_i(c);
    lowerConvTranspose(t, out);
  }

  void lowerConvTranspose(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    Value* w = floatOperand(np, 1);
    Value* bias = operand(np, 2);
    const auto xs = x->type().shape, ws = w->type().shape;
    const int64_t r = x->type().rank(), sp = r - 2;
    if (r < 3 || r > 5 || w->type().rank() != r) fail(nodeLabel(np) + ": X " + x->type().str() + " and W " + w->type().str() + " must be 3-D to 5-D alike");
    const int64_t group = attrInt(np, "group", 1);
    if (group <= 0 || xs[1] != ws[0] || ws[0] % group)
      fail(nodeLabel(np) + ": W " + w->type().str() + " does not fit X " + x->type().str() + " with group " + std::to_string(group));
    auto ints = [&](const char* name, int64_t dflt, size_t n) {
      auto v = attrInts(np, name).value_or(std::vector<int64_t>(n, dflt));
      if (v.size() != n) fail(nodeLabel(np) + ": " + name + " must have " + std::to_string(n) + " entries");
      return v;
    };
    const auto strides = ints("strides", 1, sp), dil = ints("dilations", 1, sp), outPad = ints("output_padding", 0, sp);
    auto pads = ints("pads", 0, 2 * sp);
    if (auto ks = attrInts(np, "kernel_shape"); ks && *ks != std::vector<int64_t>(ws.begin() + 2, ws.end()))
      fail(nodeLabel(np) + ": kernel_shape differs from W's spatial dims");
    std::string autoPad = "NOTSET";
    if (const auto* a = findAttr(np, "auto_pad", onnx::AttributeProto::STRING, "a string")) autoPad = a->s();
    const auto outShape = attrInts(np, "output_shape");
    for (int64_t i = 0; i < sp; ++i) {
      const int64_t k = (ws[2 + i] - 1) * dil[i] + 1, full = strides[i] * (xs[2 + i] - 1) + outPad[i] + k;
      if (strides[i] <= 0 || dil[i] <= 0) fail(nodeLabel(np) + ": strides and dilations must be positive");
      int64_t want = -1;
      if (outShape) {
        if (static_cast<int64_t>(outShape->size()) != sp) fail(nodeLabel(np) + ": output_shape must have one entry per spatial dim");
        want = (*outShape)[i];
      } else if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
        want = xs[2 + i] * strides[i];
      } else if (autoPad == "VALID") {
        pads[i] = pads[sp + i] = 0;
      } else if (autoPad != "NOTSET") {
        fail(nodeLabel(np) + ": auto_pad '" + autoPad + "' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID");
      }
      if (want >= 0) {
        const int64_t total = full - want;  // negative: the output grows past the last input's reach (zeros and bias)
        const bool upper = autoPad == "SAME_UPPER";
        const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);  // floor(total / 2), as ONNX's reference
        pads[i] = upper ? half : total - half;
        pads[sp + i] = upper ? total - half : half;
      }
    }
    // Zeros between the input's elements: [.., L, ..] -> [.., L, s, ..] -> [.., L * s, ..] -> the first (L - 1) * s + 1.
    Value* u = x;
    for (int64_t i = 0; i < sp; ++i) {
      if (strides[i] == 1) continue;
      const int64_t a = 2 + i, L = u->type().shape[a];
      Value* e = step(np, "Unsqueeze", {u, constI64(np, "axes", {a + 1})});
      e = padAxis(np, e, a + 1, 0, strides[i] - 1);
      auto shape = u->type().shape;
      shape[a] = L * strides[i];
      u = padAxis(np, reshapeTo(np, e, shape), a, 0, -(strides[i] - 1));
    }
    for (int64_t i = 0; i < sp; ++i) {
      const int64_t edge = (ws[2 + i] - 1) * dil[i];
      u = padAxis(np, u, 2 + i, edge - pads[i], edge - pads[sp + i] + outPad[i]);
    }
    // W [Cin, Cout/g, k...] -> [Cout, Cin/g, k...], flipped in k.
    const int64_t cin = ws[0], coutG = ws[1];
    std::vector<int64_t> grouped{group, cin / group, coutG};
    grouped.insert(grouped.end(), ws.begin() + 2, ws.end());
    std::vector<int64_t> perm{0, 2, 1};
    for (int64_t i = 0; i < sp; ++i) perm.push_back(3 + i);
    Value* wt = step(np, "Transpose", {reshapeTo(np, w, grouped)}, {{"perm", perm}});
    std::vector<int64_t> convW{group * coutG, cin / group};
    convW.insert(convW.end(), ws.begin() + 2, ws.end());
    wt = reshapeTo(np, wt, convW);
    std::vector<int64_t> axes, starts(sp, -1), ends(sp, std::numeric_limits<int64_t>::min()), steps(sp, -1);
    for (int64_t i = 0; i < sp; ++i) axes.push_back(2 + i);
    wt = step(np, "Slice", {wt, constI64(np, "starts", starts), constI64(np, "ends", ends), constI64(np, "axes", axes), constI64(np, "steps", steps)});
    std::vector<Value*> ins{u, wt};
    if (bias) ins.push_back(bias);
    std::map<std::string, Attribute> attrs{{"group", group}, {"dilations", dil}, {"strides", std::vector<int64_t>(sp, 1)},
                                           {"pads", std::vector<int64_t>(2 * sp, 0)}};
    step(np, "Conv", ins, attrs, out);
  }

  // Resize, nearest, linear and cubic: per resized axis, the source coordinate of each output index
  // (by coordinate_transformation_mode) becomes constant index tables, and the axis is resampled
  // with Gather (nearest), two Gathers blended by constant weights (linear), or four weighted
  // Gathers (cubic: cubic_coeff_a, exclude_outside; edge taps otherwise), axes in turn, which is
  // separable interpolation. Antialias, tf_crop_and_resize and aspect-ratio policies are refused.
  std::string attrString(const onnx::NodeProto& np, const std::string& name, const std::string& dflt) {
    const auto* a = findAttr(np, name, onnx::AttributeProto::STRING, "a string");
    return a ? a->s() : dflt;
  }
  void lowerResize(const onnx::NodeProto& np, const std::string& out) {
    Value* x = operand(np, 0);
    if (!x) fail(nodeLabel(np) + " needs an input");
    const auto xs = x->type().shape;
    const int64_t r = x->type().rank();
    const std::string mode = attrString(np, "mode", "nearest");
    const std::string ctm = attrString(np, "coordinate_transformation_mode", "half_pixel");
    const std::string nearest = attrString(np, "nearest_mode", "round_prefer_floor");
    if (mode != "nearest" && mode != "linear" && mode != "cubic") fail(nodeLabel(np) + ": mode '" + mode + "' is not supported (nearest, linear and cubic are)");
    const double cubicA = attrFloat(np, "cubic_coeff_a", -0.75f);
    const bool excludeOutside = attrInt(np, "exclude_outside", 0) != 0;
    if (ctm != "half_pixel" && ctm != "pytorch_half_pixel" && ctm != "align_corners" && ctm != "asymmetric")
      fail(nodeLabel(np) + ": coordinate_transformation_mode '" + ctm + "' is not supported");
    if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" && nearest != "ceil")
      fail(nodeLabel(np) + ": nearest_mode '" + nearest + "' is not supported");
    if (attrInt(np, "antialias", 0)) fail(nodeLabel(np) + ": antialias is not supported");
    if (mode != "nearest" && !isFloat(x->type().dtype)) fail(nodeLabel(np) + ": " + mode + " resizing needs a float tensor");
    std::vector<int64_t> axes;
    if (auto a = attrInts(np, "axes")) {
      for (int64_t v : *a) axes.push_back(v < 0 ? v + r : v);
    } else {
      for (int64_t d = 0; d < r; ++d) axes.push_back(d);
    }
    for (int64_t a : axes)
      if (a < 0 || a >= r) fail(nodeLabel(np) + ": axes are out of range");
    std::vector<double> scale(r, 1.0);
    std::vector<int64_t> outLen = xs;
    auto constOf = [&](int i) -> const Tensor* {
      Value* v = operand(np, i);
      if (!v) return nullptr;
      const Tensor* t = v->constData();
      if (!t) fail(nodeLabel(np) + ": input " + std::to_string(i) + " must be a compile-time constant");
      return t->numel() ? t : nullptr;
    };
    const Tensor* sc = constOf(2);
    const Tensor* sz = np.input_size() > 3 ? constOf(3) : nullptr;
    if (!sc == !sz) fail(nodeLabel(np) + ": exactly one of scales and sizes must be given");
    const Tensor* given = sc ? sc : sz;
    if (given->numel() != static_cast<int64_t>(axes.size())) fail(nodeLabel(np) + ": scales/sizes need one entry per axis");
    if (sz && attrString(np, "keep_aspect_ratio_policy", "stretch") != "stretch")
      fail(nodeLabel(np) + ": keep_aspect_ratio_policy other than stretch is not supported");
    for (size_t k = 0; k < axes.size(); ++k) {
      const int64_t a = axes[k];
      if (sc) {
        scale[a] = sc->getDouble(static_cast<int64_t>(k));
        if (!(scale[a] > 0)) fail(nodeLabel(np) + ": scales must be positive");
        outLen[a] = static_cast<int64_t>(std::floor(static_cast<double>(xs[a]) * scale[a]));
      } else {
        outLen[a] = sz->getInt(static_cast<int64_t>(k));
        if (outLen[a] <= 0) fail(nodeLabel(np) + ": sizes must be positive");
        scale[a] = static_cast<double>(outLen[a]) / static_cast<double>(xs[a]);
      }
    }
    Value* v = x;
    for (int64_t a = 0; a < r; ++a) {
      const int64_t in = xs[a], n = outLen[a];
      if (n == in && scale[a] == 1.0) continue;
      std::vector<int64_t> i0(n), i1(n);
      std::vector<double> w(n);
      std::vector<std::vector<int64_t>> taps(4, std::vector<int64_t>(n));  // cubic: four taps and their weights
      std::vector<std::vector<double>> tapW(4, std::vector<double>(n));
      for (int64_t o = 0; o < n; ++o) {
        const double s = scale[a];
        double src;
        if (ctm == "asymmetric") src = o / s;
        else if (ctm == "align_corners") {  // the resized length is in * scale, unrounded, when scales are given
          const double len = sc ? static_cast<double>(in) * s : static_cast<double>(n);
          src = len == 1.0 ? 0.0 : static_cast<double>(o) * (in - 1) / (len - 1);
        }
        else if (ctm == "pytorch_half_pixel") src = n > 1 ? (o + 0.5) / s - 0.5 : 0.0;
        else src = (o + 0.5) / s - 0.5;
        if (mode == "nearest") {
          double k;
          if (nearest == "floor") k = std::floor(src);
          else if (nearest == "ceil") k = std::ceil(src);
          else if (nearest == "round_prefer_ceil") k = std::floor(src + 0.5);
          else k = std::ceil(src - 0.5);
          i0[o] = std::clamp<int64_t>(static_cast<int64_t>(k), 0, in - 1);
        } else if (mode == "cubic") {
          // Keys' cubic convolution with coefficient A over the taps floor(src) - 1 .. + 2; a tap
          // outside the input reads the edge, or (exclude_outside) weighs 0 and the rest renormalise.
          const double f = std::floor(src), t = src - f, A = cubicA;
          auto kernel = [&](double d) {
            d = std::fabs(d);
            return d <= 1 ? ((A + 2) * d - (A + 3)) * d * d + 1 : d < 2 ? ((A * d - 5 * A) * d + 8 * A) * d - 4 * A : 0.0;
          };
          double sum = 0;
          for (int k = 0; k < 4; ++k) {
            const int64_t at = static_cast<int64_t>(f) - 1 + k;
            double wk = kernel(t + 1 - k);
            if (excludeOutside && (at < 0 || at >= in)) wk = 0;
            taps[k][o] = std::clamp<int64_t>(at, 0, in - 1);
            tapW[k][o] = wk;
            sum += wk;
          }
          if (excludeOutside && sum != 0)
            for (int k = 0; k < 4; ++k) tapW[k][o] /= sum;
        } else {
          src = std::clamp(src, 0.0, static_cast<double>(in - 1));
          i0[o] = static_cast<int64_t>(std::floor(src));
          i1[o] = std::min<int64_t>(i0[o] + 1, in - 1);
          w[o] = src - static_cast<double>(i0[o]);
        }
      }
      auto gather = [&](const std::vector<int64_t>& idx) {
        return step(np, "Gather", {v, constI64(np, "index", idx)}, {{"axis", a}});
      };
      if (mode == "nearest") {
        v = gather(i0);
        continue;
      }
      std::vector<int64_t> wshape(r, 1);
      wshape[a] = n;
      if (mode == "cubic") {
        Value* sum = nullptr;
        for (int k = 0; k < 4; ++k) {
          Value* term = step(np, "Mul", {gather(taps[k]), g_->addConst(fresh(np, "weight"), Tensor::fromDoubles(x->type().dtype, wshape, tapW[k]))});
          sum = sum ? step(np, "Add", {sum, term}) : term;
        }
        v = sum;
        continue;
      }
      Value* lo = gather(i0);
      Value* hi = gather(i1);
      Value* wt = g_->addConst(fresh(np, "weight"), Tensor::fromDoubles(x->type().dtype, wshape, w));
      v = step(np, "Add", {lo, step(np, "Mul", {step(np, "Sub", {hi, lo}), wt})});
    }
    step(np, "Identity", {v}, {}, out);
  }

  // The signal ops of opset 17 (and DFT's opset-20 form), as ONNX defines them.
  // HannWindow, HammingWindow and BlackmanWindow: constants, a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)
  // for n < size, N = size (periodic, the default) or size - 1, with ONNX's coefficients (Hamming's
  // a0 is 25/46, not PyTorch's 0.54: an exporter that means PyTorch's window writes its values).
  void lowerWindow(const onnx::NodeProto& np, const std::string& out) {
    const auto size = constIntsOf(np, 0, "size");
    if (size.size() != 1 || size[0] < 1 || size[0] > (int64_t{1} << 24))
      fail(nodeLabel(np) + ": size must be one positive integer up to 2^24");
    const bool periodic = attrInt(np, "periodic", 1) != 0;
    const int64_t n = size[0], period = periodic ? n : n - 1;
    // ONNX's function body divides by size - 1: NaN for a symmetric window of one sample.
    if (period == 0) fail(nodeLabel(np) + ": a symmetric window of size 1 is 0 / 0 in ONNX's definition");
    const std::string& op = np.op_type();
    const double a0 = op == "HannWindow" ? 0.5 : op == "HammingWindow" ? 25.0 / 46.0 : 0.42;
    const double a1 = op == "BlackmanWindow" ? 0.5 : 1.0 - a0, a2 = op == "BlackmanWindow" ? 0.08 : 0.0;
    const auto t = dtypeFromOnnx(static_cast<int>(attrInt(np, "output_datatype", 1)));
    if (!t || !isFloat(*t)) fail(nodeLabel(np) + ": output_datatype must be a float type ampc supports");
    std::vector<double> w(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double phase = 2.0 * std::numbers::pi * static_cast<double>(i) / static_cast<double>(period);
      w[static_cast<size_t>(i)] = a0 - a1 * std::cos(phase) + a2 * std::cos(2.0 * phase);
    }
    g_->addConst(out, Tensor::fromDoubles(*t, {n}, w));
  }

  // A Fourier matrix [rows, 2 columns] is O(L^2): bounded at 2^25 entries (n_fft 4096 onesided
  // takes 2^24), so a long transform is an error, not a matrix of gigabytes.
  void checkFourierSize(const onnx::NodeProto& np, int64_t rows, int64_t columns, const std::string& what) {
    if (rows * columns * 2 > (int64_t{1} << 25))
      fail(nodeLabel(np) + ": " + what + " needs a Fourier matrix of more than 2^25 entries, past what ampc builds");
  }

  // Entry (n * c + ci, 2 * k + o) of the matrix that takes a length-L signal's samples n < rows
  // (c = 1: real, c = 2: real and imaginary parts interleaved) to its transform's bins k < bins
  // (o = 0: real part, o = 1: imaginary): e^(-i theta) forward, e^(i theta) / L inverse, with
  // theta = 2 pi (k n mod L) / L (the reduction keeps the angle exact in double for long signals).
  std::vector<double> fourierMatrix(const onnx::NodeProto& np, int64_t rows, int64_t c, int64_t bins, int64_t length, bool inverse) {
    checkFourierSize(np, rows * c, bins, "a transform of " + std::to_string(rows) + " samples into " + std::to_string(bins) + " bins");
    std::vector<double> w(static_cast<size_t>(rows * c * bins * 2));
    const double scale = inverse ? 1.0 / static_cast<double>(length) : 1.0, sign = inverse ? 1.0 : -1.0;
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < bins; ++k) {
        const double theta = 2.0 * std::numbers::pi * static_cast<double>((k * n) % length) / static_cast<double>(length);
        const double cs = std::cos(theta) * scale, sn = sign * std::sin(theta) * scale;  // e^(sign i theta) = cs + i sn
        // (xr + i xi)(cs + i sn) = (xr cs - xi sn) + i (xr sn + xi cs)
        auto at = [&](int64_t ci, int64_t o) -> double& { return w[static_cast<size_t>(((n * c + ci) * bins + k) * 2 + o)]; };
        at(0, 0) = cs;
        at(0, 1) = sn;
        if (c == 2) {
          at(1, 0) = -sn;
          at(1, 1) = cs;
        }
      }
    return w;
  }
  void keepFp32(Value* v) {
    if (Node* p = v->producer()) p->setAttr(kKeepFp32, int64_t{1});
  }

  // DFT (opset 17: axis an attribute, default 1; opset 20: an input, default -2) over one axis of
  // [..., c] (c = 1 real, 2 complex): a product of the signal with the Fourier matrix (exact to the
  // dtype's rounding, its gradient the transposed product; O(L^2) work where an FFT is O(L log L),
  // run on the GEMM kernels in FP32, kKeepFp32). dft_length L crops the axis or zero-pads it
  // (the padded samples contribute nothing: rows past the axis are left out).
  void lowerDft(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    const auto& s = x->type().shape;
    const int64_t r = x->type().rank();
    if (r < 2 || (s[r - 1] != 1 && s[r - 1] != 2))
      fail(nodeLabel(np) + ": the input must be [..., 1] (real) or [..., 2] (complex), got " + x->type().str());
    const int64_t c = s[r - 1];
    int64_t axis = attrInt(np, "axis", 1);
    if (g_->opset >= 20) {
      axis = -2;
      if (operand(np, 2)) {
        auto a = constIntsOf(np, 2, "axis");
        if (a.size() != 1) fail(nodeLabel(np) + ": axis must be a scalar");
        axis = a[0];
      }
    }
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r - 2) fail(nodeLabel(np) + ": axis is out of range for " + x->type().str() + " (the last dim holds the parts)");
    int64_t length = s[axis];
    if (operand(np, 1)) {
      auto l = constIntsOf(np, 1, "dft_length");
      if (l.size() != 1) fail(nodeLabel(np) + ": dft_length must be a scalar");
      length = l[0];
    }
    if (length < 1 || length > (int64_t{1} << 16)) fail(nodeLabel(np) + ": the DFT length must be 1 to 65536, got " + std::to_string(length));
    const bool inverse = attrInt(np, "inverse", 0) != 0, onesided = attrInt(np, "onesided", 0) != 0;
    if (onesided && c == 2 && !inverse) fail(nodeLabel(np) + ": a onesided forward DFT of a complex input is not defined");
    // An inverse onesided DFT of a complex input is the complex-to-real one (torch.fft.irfft, as the
    // dynamo exporter writes it, and as onnxruntime computes it): the input is the half spectrum
    // X[0 .. L/2] of a Hermitian signal, the output its L real samples (imaginary parts 0).
    const bool hermitian = onesided && c == 2;
    if (hermitian) {
      if (s[axis] > length / 2 + 1)
        x = step(np, "Slice", {x, constI64(np, "starts", {0}), constI64(np, "ends", {length / 2 + 1}), constI64(np, "axes", {axis})});
      const int64_t rows = std::min(s[axis], length / 2 + 1);
      return lowerDftProduct(np, x, axis, rows, length, hermitianMatrix(np, rows, length), out);
    }
    const int64_t bins = onesided ? length / 2 + 1 : length;
    if (s[axis] > length) x = step(np, "Slice", {x, constI64(np, "starts", {0}), constI64(np, "ends", {length}), constI64(np, "axes", {axis})});
    const int64_t rows = std::min(s[axis], length);
    lowerDftProduct(np, x, axis, rows, bins, fourierMatrix(np, rows, c, bins, length, inverse), out);
  }
  // Entry (2 k + ci, 2 n + o) of the complex-to-real inverse: x[n] = (1/L) sum over k <= L/2 of
  // w_k Re(X[k] e^(i theta)), theta = 2 pi (k n mod L) / L, w_k 2 except for k = 0 and the Nyquist
  // bin of an even L (their conjugates are themselves), so their imaginary parts count for nothing,
  // as in PyTorch's irfft. Column o = 1 (the imaginary part) is 0.
  std::vector<double> hermitianMatrix(const onnx::NodeProto& np, int64_t rows, int64_t length) {
    checkFourierSize(np, rows * 2, length, "an inverse transform of " + std::to_string(rows) + " bins into " + std::to_string(length) + " samples");
    std::vector<double> w(static_cast<size_t>(rows * 2 * length * 2), 0.0);
    for (int64_t k = 0; k < rows; ++k) {
      const double weight = (k == 0 || 2 * k == length) ? 1.0 : 2.0;
      for (int64_t n = 0; n < length; ++n) {
        const double theta = 2.0 * std::numbers::pi * static_cast<double>((k * n) % length) / static_cast<double>(length);
        w[static_cast<size_t>(((2 * k) * length + n) * 2)] = weight * std::cos(theta) / static_cast<double>(length);
        w[static_cast<size_t>(((2 * k + 1) * length + n) * 2)] = -weight * std::sin(theta) / static_cast<double>(length);
      }
    }
    return w;
  }
  // y = x's `rows` entries along `axis` (parts last, c of them) times the matrix [rows c, 2 bins],
  // the bins back at `axis`: [..., bins, 2].
  void lowerDftProduct(const onnx::NodeProto& np, Value* x, int64_t axis, int64_t rows, int64_t bins, const std::vector<double>& matrix,
                       const std::string& out) {
    const auto& s = x->type().shape;
    const int64_t r = x->type().rank(), c = s[r - 1];
    // The axis next to the parts, the other dims as one: [M, rows * c] times [rows * c, 2 bins].
    std::vector<int64_t> perm, others;
    for (int64_t i = 0; i < r - 1; ++i)
      if (i != axis) perm.push_back(i), others.push_back(s[i]);
    perm.push_back(axis);
    perm.push_back(r - 1);
    int64_t m = 1;
    for (int64_t d : others) m *= d;
    Value* xt = axis == r - 2 ? x : step(np, "Transpose", {x}, {{"perm", perm}});
    Value* flat = step(np, "Reshape", {xt, constI64(np, "rows", {m, rows * c})});
    Value* w = g_->addConst(fresh(np, "fourier"), Tensor::fromDoubles(x->type().dtype, {rows * c, 2 * bins}, matrix));
    Value* y = step(np, "MatMul", {flat, w});
    keepFp32(y);
    std::vector<int64_t> shape = others;
    shape.push_back(bins);
    shape.push_back(2);
    if (axis == r - 2) {
      step(np, "Reshape", {y, constI64(np, "shape", shape)}, {}, out);
      return;
    }
    std::vector<int64_t> back;  // the bins back at `axis`
    for (int64_t j = 0; j < r - 1; ++j) back.push_back(j == axis ? r - 2 : j < axis ? j : j - 1);
    back.push_back(r - 1);
    step(np, "Transpose", {step(np, "Reshape", {y, constI64(np, "shape", shape)})}, {{"perm", back}}, out);
  }

  // STFT (opset 17): signal [B, T] or [B, T, c], frames of frame_length F every frame_step samples,
  // each times the window and transformed: [B, frames, bins, 2]. A strided Conv1d whose kernels
  // are the window times the Fourier matrix's columns (a window computed in the graph multiplies
  // them there, and gets its gradient), in FP32 (kKeepFp32).
  void lowerStft(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    const auto& s = x->type().shape;
    const int64_t r = x->type().rank();
    if ((r != 2 && r != 3) || (r == 3 && s[2] != 1 && s[2] != 2))
      fail(nodeLabel(np) + ": the signal must be [batch, length] or [batch, length, 1 or 2], got " + x->type().str());
    const int64_t c = r == 3 ? s[2] : 1, batch = s[0], len = s[1];
    const auto stepv = constIntsOf(np, 1, "frame_step");
    if (stepv.size() != 1 || stepv[0] < 1) fail(nodeLabel(np) + ": frame_step must be one positive integer");
    Value* window = operand(np, 2);
    int64_t frame = -1;
    if (operand(np, 3)) {
      auto f = constIntsOf(np, 3, "frame_length");
      if (f.size() != 1) fail(nodeLabel(np) + ": frame_length must be a scalar");
      frame = f[0];
    }
    if (window) {
      if (!isFloat(window->type().dtype) || window->type().rank() != 1) fail(nodeLabel(np) + ": the window must be a 1-D float tensor, got " + window->type().str());
      if (frame >= 0 && window->type().shape[0] != frame)
        fail(nodeLabel(np) + ": the window's " + std::to_string(window->type().shape[0]) + " samples differ from frame_length " + std::to_string(frame));
      frame = window->type().shape[0];
    }
    if (frame < 1 || frame > (int64_t{1} << 16)) fail(nodeLabel(np) + ": the frame length (frame_length or the window's) must be 1 to 65536");
    if (len < frame) fail(nodeLabel(np) + ": the signal's " + std::to_string(len) + " samples are fewer than a frame of " + std::to_string(frame));
    const bool onesided = attrInt(np, "onesided", 1) != 0;
    if (onesided && c == 2) fail(nodeLabel(np) + ": a onesided STFT of a complex signal is not defined");
    const int64_t bins = onesided ? frame / 2 + 1 : frame, frames = (len - frame) / stepv[0] + 1;
    // Conv weight [2 bins, c, F]: entry (2k + o, ci, n) is the Fourier matrix's (n c + ci, 2k + o).
    const auto f = fourierMatrix(np, frame, c, bins, frame, false);
    const Tensor* wconst = window ? window->constData() : nullptr;
    std::vector<double> kw(static_cast<size_t>(2 * bins * c * frame));
    for (int64_t n = 0; n < frame; ++n)
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t j = 0; j < 2 * bins; ++j)
          kw[static_cast<size_t>((j * c + ci) * frame + n)] = f[static_cast<size_t>((n * c + ci) * 2 * bins + j)] * (wconst ? wconst->getDouble(n) : 1.0);
    const DType t = x->type().dtype;
    Value* weight = g_->addConst(fresh(np, "fourier"), Tensor::fromDoubles(t, {2 * bins, c, frame}, kw));
    if (window && !wconst) {
      Value* wv = window->type().dtype == t ? window : castTo(np, window, t);
      weight = step(np, "Mul", {weight, step(np, "Reshape", {wv, constI64(np, "window_shape", {1, 1, frame})})});
    }
    Value* xs = r == 2 ? step(np, "Unsqueeze", {x, constI64(np, "axes", {1})}) : step(np, "Transpose", {x}, {{"perm", std::vector<int64_t>{0, 2, 1}}});
    Value* y = step(np, "Conv", {xs, weight},
                    {{"strides", std::vector<int64_t>{stepv[0]}}, {"kernel_shape", std::vector<int64_t>{frame}}, {"pads", std::vector<int64_t>{0, 0}},
                     {"dilations", std::vector<int64_t>{1}}, {"group", int64_t{1}}});
    keepFp32(y);
    y = step(np, "Reshape", {y, constI64(np, "shape", {batch, bins, 2, frames})});
    step(np, "Transpose", {y}, {{"perm", std::vector<int64_t>{0, 3, 1, 2}}}, out);
  }

  // Quantization-aware training's fake quantization, as both exporters write PyTorch's
  // fake_quantize_per_tensor_affine / per_channel_affine (and torch.ao's FakeQuantize): a
  // QuantizeLinear whose 8-bit result only DequantizeLinear nodes with the same scale and zero
  // point read. Forward as ONNX defines them: q = saturate(round_half_even(x / scale) + zp),
  // y = (q - zp) scale (in FP32 under autocast; the integer tensor is real). The gradient is
  // PyTorch's straight-through estimate: dy where round(x / scale) + zp is inside the type's
  // range, else 0 (fake_quantize's cachemask), written y' = xm + (y - xm) with xm = x inside the
  // range, 0 outside, and no gradient through the second operand (kNoGradOperands). The sum is y
  // exactly: y - xm is exact where |y - x| <= scale / 2 (Sterbenz), and 0 + y is y. Scale and zero
  // point get no gradient (PyTorch's are buffers; its learnable fake quantization is another op).
  // A scale or zero point of [C] along `axis` broadcasts per channel; blocked quantization,
  // 16- and 4-bit and float8 types are refused.
  Value* quantOperand(const onnx::NodeProto& np, Value* v, const Value* x, int64_t axis, const char* what) {
    const int64_t r = x->type().rank();
    if (v->type().numel() == 1) return v->type().rank() == 0 ? v : step(np, "Reshape", {v, constI64(np, "scalar", {})});
    if (v->type().rank() != 1 || axis < 0 || axis >= r || v->type().shape[0] != x->type().shape[axis])
      fail(nodeLabel(np) + ": " + what + " " + v->type().str() + " is neither a scalar nor one per channel along axis " + std::to_string(axis) +
           " of " + x->type().str() + " (blocked quantization is not supported)");
    std::vector<int64_t> shape(static_cast<size_t>(r), 1);
    shape[static_cast<size_t>(axis)] = x->type().shape[axis];
    return step(np, "Reshape", {v, constI64(np, "channel_shape", shape)});
  }
  int64_t quantAxis(const onnx::NodeProto& np, const Value* x) {
    if (attrInt(np, "block_size", 0) != 0) fail(nodeLabel(np) + ": blocked quantization (block_size) is not supported");
    int64_t axis = attrInt(np, "axis", 1);
    if (axis < 0) axis += x->type().rank();
    return axis;
  }
  // The quantized type: the zero point's, else output_dtype's, else uint8; 8-bit only.
  DType quantType(const onnx::NodeProto& np, Value* zp) {
    DType t = DType::u8;
    if (zp) t = zp->type().dtype;
    else if (const int64_t o = attrInt(np, "output_dtype", 0)) t = dtypeFromOnnx(static_cast<int>(o)).value_or(DType::boolean);
    if (t != DType::u8 && t != DType::i8) fail(nodeLabel(np) + ": only int8 and uint8 quantization is supported");
    return t;
  }
  void lowerQuantize(const onnx::NodeProto& np, const std::string& out) {
    Value* x = floatOperand(np, 0);
    Value* zp = operand(np, 2);
    const DType qt = quantType(np, zp);
    if (zp && attrInt(np, "output_dtype", 0) && dtypeFromOnnx(static_cast<int>(attrInt(np, "output_dtype", 0))) != qt)
      fail(nodeLabel(np) + ": output_dtype differs from the zero point's type");
    if (attrInt(np, "precision", 0) != 0) fail(nodeLabel(np) + ": a precision attribute other than the input's is not supported");
    // Training needs the dequantized value: every reader must be a DequantizeLinear of the same scale and zero point.
    for (const auto& n : nodes_)
      for (const auto& in : n.input())
        if (in == out && (n.op_type() != "DequantizeLinear" || n.input_size() < 2 || n.input(1) != np.input(1) ||
                          (n.input_size() > 2 ? n.input(2) : std::string()) != (np.input_size() > 2 ? np.input(2) : std::string())))
          fail(nodeLabel(np) + ": its 8-bit result is read by " + nodeLabel(n) +
               ", not by a DequantizeLinear of the same scale and zero point; ampc trains fake quantization (quantize-dequantize pairs) only");
    const int64_t axis = quantAxis(np, x);
    const DType t = x->type().dtype;
    Value* scale = quantOperand(np, floatOperand(np, 1), x, axis, "y_scale");
    if (scale->type().dtype != t) scale = castTo(np, scale, t);
    const double lo = qt == DType::u8 ? 0 : -128, hi = qt == DType::u8 ? 255 : 127;
    Value* ratio = step(np, "Div", {x, scale});
    keepFp32(ratio);
    Value* r = step(np, "Round", {ratio});
    keepFp32(r);
    if (zp) {
      r = step(np, "Add", {r, castTo(np, quantOperand(np, zp, x, axis, "y_zero_point"), t)});
      keepFp32(r);
    }
    Value* q = step(np, "Clip", {r, scalarOf(np, "qmin", lo, t), scalarOf(np, "qmax", hi, t)});
    keepFp32(q);
    castTo(np, q, qt, out);
    Value* inRange = step(np, "And", {step(np, "GreaterOrEqual", {r, scalarOf(np, "qmin", lo, t)}), step(np, "LessOrEqual", {r, scalarOf(np, "qmax", hi, t)})});
    quantized_[out] = Quantized{x, inRange};  // its readers' scale and zero point are this node's (checked above)
  }
  void lowerDequantize(const onnx::NodeProto& np, const std::string& out) {
    Value* q = operand(np, 0);
    if (!q) fail(nodeLabel(np) + " needs an input");
    const DType it = q->type().dtype;
    if (it != DType::u8 && it != DType::i8 && it != DType::i32) fail(nodeLabel(np) + ": the input must be int8, uint8 or int32, got " + q->type().str());
    if (attrInt(np, "output_dtype", 0) != 0 && dtypeFromOnnx(static_cast<int>(attrInt(np, "output_dtype", 0))) != floatOperand(np, 1)->type().dtype)
      fail(nodeLabel(np) + ": output_dtype differs from the scale's type");
    const int64_t axis = quantAxis(np, q);
    Value* scale = quantOperand(np, floatOperand(np, 1), q, axis, "x_scale");
    const DType t = scale->type().dtype;
    Value* zp = operand(np, 2);
    if (zp && zp->type().dtype != it) fail(nodeLabel(np) + ": the zero point's type differs from the input's");
    Value* v = castTo(np, q, t);
    if (zp) {
      v = step(np, "Sub", {v, castTo(np, quantOperand(np, zp, q, axis, "x_zero_point"), t)});
      keepFp32(v);
    }
    auto it2 = quantized_.find(np.input(0));
    const bool pair = it2 != quantized_.end() && it2->second.x->type().dtype == t;
    Value* y = step(np, "Mul", {v, scale}, {}, pair ? std::string() : out);
    keepFp32(y);
    if (!pair) return;
    const Quantized& qz = it2->second;  // the straight-through gradient
    Value* xm = step(np, "Where", {qz.inRange, qz.x, scalarOf(np, "zero", 0.0, t)});
    keepFp32(xm);
    Value* d = step(np, "Sub", {y, xm});
    keepFp32(d);
    Value* ste = step(np, "Add", {xm, d}, {}, out);
    if (Node* p = ste->producer()) {
      p->setAttr(kNoGradOperands, int64_t{2});
      p->setAttr(kKeepFp32, int64_t{1});
    }
  }

  // detach() as ampc_export.py marks it (grad.h kStopGradientOp): its operand's value, no gradient.
  void lowerStopGradient(const onnx::NodeProto& np) {
    if (np.input_size() != 1 || np.output_size() != 1 || np.input(0).empty() || np.output(0).empty())
      fail(nodeLabel(np) + ": takes one input and one output, got " + std::to_string(np.input_size()) + " and " + std::to_string(np.output_size()));
    if (np.attribute_size()) fail(nodeLabel(np) + ": takes no attributes, got '" + np.attribute(0).name() + "'");
    // The attribute goes on before inference, which folds a constant operand's Identity away (a
    // constant has no gradient to stop: XGLM's export, a marker on a value of constants alone).
    emit(np, "Identity", {operand(np, 0)}, {np.output(0)}, {{std::string(kNoGradOperands), Attribute(int64_t{1})}});
  }

  // ---- Rows a mask selects at run time (x[mask]: NonZero of a computed mask) ---------------------
  // Such a selection has a data-dependent length, which a static-shape plan cannot hold. ampc pads
  // it to its bound, the mask's element count: the selected positions first, in NonZero's order,
  // then copies of the first selected one, with a run-time flag per row (valid) and the count. That
  // is exact where every path from the selection is row-wise (elementwise ops; products, softmaxes
  // and gathers over the other axes; views that keep the rows apart) and ends in a reduction over
  // the rows or a loss, where the padding rows are masked out: a sum's 0, a max's -inf, the mean's
  // count, a loss's ignore_index. Any other reader of a padded value, and a graph output that holds
  // one, is refused by name. The padding rows copy a selected row, so they are finite where the
  // selection is, and the gradient they send back is exactly 0.
  struct Selection {
    Value* valid;  // bool [bound]: row k < count
    Value* count;  // i64 scalar
    int64_t bound;
    std::string node;  // the NonZero's label
  };
  struct Padded {
    int64_t axis;
    size_t sel;
  };
  std::vector<Selection> selections_;
  std::unordered_map<const Value*, Padded> padded_;
  std::vector<std::pair<const Value*, Value*>> nonZeroOf_;  // a mask and its padded NonZero
  // An i64 value computed from a padded value's Shape (the dynamo exporter broadcasts index tensors
  // by Shape and Expand): each element a constant or a selection's count. Read as a number it is
  // the run-time value; read as a shape (Expand, Reshape, ConstantOfShape) the count is the bound,
  // and the result holds padded rows there.
  struct SymDim {
    int64_t value = 0;
    std::optional<size_t> count;  // the selection whose count this is
  };
  std::unordered_map<const Value*, std::vector<SymDim>> symShape_;

  const Padded* paddedOf(const std::string& name) const {
    if (padded_.empty() || name.empty()) return nullptr;
    const Value* v = g_->lookup(name);
    auto it = v ? padded_.find(v) : padded_.end();
    return it == padded_.end() ? nullptr : &it->second;
  }
  const std::vector<SymDim>* symOf(const std::string& name) const {
    if (symShape_.empty() || name.empty()) return nullptr;
    const Value* v = g_->lookup(name);
    auto it = v ? symShape_.find(v) : symShape_.end();
    return it == symShape_.end() ? nullptr : &it->second;
  }
  bool readsPadded(const onnx::NodeProto& np) const {
    return std::any_of(np.input().begin(), np.input().end(), [&](const std::string& in) { return paddedOf(in) || symOf(in); });
  }
  [[noreturn]] void refusePadded(const onnx::NodeProto& np, const std::string& in, const std::string& why) const {
    const Selection& s = selections_[paddedOf(in)->sel];
    fail(nodeLabel(np) + ": input '" + in + "' holds rows that " + s.node + " selects at run time (a data-dependent length, padded to " +
         std::to_string(s.bound) + " rows); ampc takes such a selection only through row-wise ops into a reduction over the rows or a loss, and " +
         why);
  }

  // The inclusive running count of f (i64 [M] of 0 and 1), in two levels where M is large (the CUDA
  // CumSum is serial along its axis): running counts within rows of a divisor of M near its square
  // root, plus the counts of the rows before.
  Value* runningCount(const onnx::NodeProto& np, Value* f, int64_t M) {
    auto axis = [&](int64_t a) { return scalarOf(np, "axis", static_cast<double>(a), DType::i64); };
    int64_t s = 1;
    for (int64_t d = static_cast<int64_t>(std::sqrt(static_cast<double>(M))); d >= 2 && M > 1024; --d)
      if (M % d == 0) {
        s = d;
        break;
      }
    if (s == 1) return step(np, "CumSum", {f, axis(0)});
    const int64_t rows = M / s;
    Value* within = step(np, "CumSum", {reshapeTo(np, f, {rows, s}), axis(1)});
    Value* totals = step(np, "Slice", {within, constI64(np, "last", {s - 1}), constI64(np, "end", {s}), constI64(np, "axes", {1})});
    Value* before = step(np, "CumSum", {totals, axis(0)}, {{"exclusive", int64_t{1}}});
    return reshapeTo(np, step(np, "Add", {within, before}), {M});
  }

  // NonZero of a value computed at run time: [rank, bound] indices, padded (see above).
  void lowerNonZeroPadded(const onnx::NodeProto& np, Value* x, const std::string& out) {
    const auto& shape = x->type().shape;
    const int64_t r = x->type().rank(), M = x->type().numel();
    if (r == 0 || M == 0) fail(nodeLabel(np) + ": NonZero of a computed " + x->type().str() + " is not supported (rank 1 or more, not empty)");
    // One selection per mask: TorchScript writes a NonZero per use of a mask, the dynamo exporter
    // one per use of mask-making code (pred[m(o)] - value[m(o)]), each its own nodes.
    for (const auto& [mask, indices] : nonZeroOf_)
      if (sameValue(mask, x, 24)) {
        step(np, "Identity", {indices}, {}, out);
        padded_[g_->lookup(out)] = padded_.at(indices);
        return;
      }
    const DType i64 = DType::i64;
    Value* nz = x->type().dtype == DType::boolean ? x : step(np, "Not", {step(np, "Equal", {x, scalarOf(np, "zero", 0.0, x->type().dtype)})});
    Value* flat = reshapeTo(np, nz, {M});
    Value* c = runningCount(np, castTo(np, flat, i64), M);
    Value* count = step(np, "Gather", {c, scalarOf(np, "last", static_cast<double>(M - 1), i64)}, {{"axis", int64_t{0}}});
    Value* pos = arangeAlong(np, 1, 0, M);
    Value* one = scalarOf(np, "one", static_cast<double>(1), i64);
    // A selected position goes to its rank among the selected, the others after them in order: a
    // permutation of [0, M), so the scatter writes each element once.
    Value* slot = step(np, "Where", {flat, step(np, "Sub", {c, one}), step(np, "Sub", {step(np, "Add", {count, pos}), c})});
    Value* perm = step(np, "ScatterElements", {g_->addConst(fresh(np, "zeros"), Tensor::fromInts(i64, {M}, std::vector<int64_t>(M, 0))), slot, pos},
                       {{"axis", int64_t{0}}});
    selections_.push_back({step(np, "Less", {pos, count}), count, M, nodeLabel(np)});
    Value* sel = fromRow0(np, selections_.size() - 1, perm, 0);
    std::vector<Value*> rows;
    int64_t stride = M;
    for (int64_t d = 0; d < r; ++d) {
      stride /= shape[static_cast<size_t>(d)];
      Value* q = sel;
      if (stride > 1) q = step(np, "Div", {q, scalarOf(np, "stride", static_cast<double>(stride), i64)});
      if (d > 0) q = step(np, "Mod", {q, scalarOf(np, "dim", static_cast<double>(shape[static_cast<size_t>(d)]), i64)});
      rows.push_back(q);
    }
    if (r == 1) step(np, "Unsqueeze", {rows[0], constI64(np, "axes", {0})}, {}, out);
    else {
      for (auto& q : rows) q = step(np, "Unsqueeze", {q, constI64(np, "axes", {0})});
      step(np, "Concat", rows, {{"axis", int64_t{0}}}, out);
    }
    padded_.erase(sel);  // the flat positions are internal; the indices hold the rows along axis 1
    padded_[g_->lookup(out)] = {1, selections_.size() - 1};
    nonZeroOf_.emplace_back(x, g_->lookup(out));
  }

  // Whether a and b are one value: the same, or the same deterministic op with the same attributes
  // on operands that are (within `depth` producers), or constants of the same data.
  static bool sameValue(const Value* a, const Value* b, int depth) {
    int64_t budget = 4096;  // comparisons: two long equal chains that share nothing are not searched exhaustively
    return sameValue(a, b, depth, budget);
  }
  static bool sameValue(const Value* a, const Value* b, int depth, int64_t& budget) {
    if (a == b) return true;
    if (!a || !b || a->type() != b->type() || depth == 0 || --budget < 0) return false;
    if (a->constData() && b->constData()) return *a->constData() == *b->constData();
    const Node *p = a->producer(), *q = b->producer();
    if (!p || !q || p->op() != q->op() || p->domain() != q->domain() || p->numInputs() != q->numInputs() || p->attrs() != q->attrs() ||
        !p->def() || p->def()->random)
      return false;
    size_t k = 0;
    while (k < p->numResults() && p->result(k) != a) ++k;
    if (k == p->numResults() || k >= q->numResults() || q->result(k) != b) return false;
    for (size_t i = 0; i < p->numInputs(); ++i)
      if (!sameValue(p->input(i), q->input(i), depth - 1, budget)) return false;
    return true;
  }

  // Unique of the flattened input (torch.unique; the dynamo exporter's embedding max_norm renorm):
  // Y, the first index of each, the inverse indices and the counts. A constant folds. A computed one
  // is a selection (above) of its distinct values, padded to the element count n: each element
  // compared with every other (first occurrences, and each value's rank among the distinct ones,
  // ascending where `sorted`, else in order of first occurrence), so quadratic, refused past
  // kUniqueMax elements. The inverse indices are static ([n]) and index the padded Y's real rows.
  static constexpr int64_t kUniqueMax = 16384;
  void lowerUnique(const onnx::NodeProto& np) {
    Value* x = operand(np, 0);
    if (!x) fail(nodeLabel(np) + " needs an input");
    if (findAttr(np, "axis", onnx::AttributeProto::INT, "an int"))
      fail(nodeLabel(np) + ": Unique along an axis (distinct slices) is not supported; ampc takes the flattened form (no axis)");
    const bool sorted = attrInt(np, "sorted", 1) != 0;
    const int64_t n = x->type().numel();
    const DType t = x->type().dtype, i64 = DType::i64;
    if (n == 0) fail(nodeLabel(np) + ": its input is empty; ampc has no empty tensors");
    auto name = [&](int k) { return k < np.output_size() ? np.output(k) : std::string(); };
    if (const Tensor* c = x->constData()) {  // folded: distinct values by first occurrence, or ascending
      const bool ints = isInteger(t) || t == DType::boolean;
      auto less = [&](int64_t a, int64_t b) { return ints ? c->getInt(a) < c->getInt(b) : c->getDouble(a) < c->getDouble(b); };
      auto same = [&](int64_t a, int64_t b) { return ints ? c->getInt(a) == c->getInt(b) : c->getDouble(a) == c->getDouble(b); };
      std::vector<int64_t> firsts;  // first occurrence of each distinct value
      std::vector<int64_t> inverse(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        auto it = std::find_if(firsts.begin(), firsts.end(), [&](int64_t f) { return same(f, i); });
        if (it == firsts.end()) firsts.push_back(i);
      }
      if (sorted) std::stable_sort(firsts.begin(), firsts.end(), less);
      std::vector<int64_t> counts(firsts.size(), 0);
      for (int64_t i = 0; i < n; ++i)
        for (size_t k = 0; k < firsts.size(); ++k)
          if (same(firsts[k], i)) {
            inverse[static_cast<size_t>(i)] = static_cast<int64_t>(k);
            ++counts[k];
            break;
          }
      const int64_t m = static_cast<int64_t>(firsts.size());
      std::vector<int64_t> yi;
      std::vector<double> yd;
      for (int64_t f : firsts) ints ? yi.push_back(c->getInt(f)) : yd.push_back(c->getDouble(f));
      if (!name(0).empty()) g_->addConst(name(0), ints ? Tensor::fromInts(t, {m}, yi) : Tensor::fromDoubles(t, {m}, yd));
      if (!name(1).empty()) g_->addConst(name(1), Tensor::fromInts(i64, {m}, firsts));
      if (!name(2).empty()) g_->addConst(name(2), Tensor::fromInts(i64, {n}, inverse));
      if (!name(3).empty()) g_->addConst(name(3), Tensor::fromInts(i64, {m}, counts));
      return;
    }
    if (isFloat(t))  // NaNs are each distinct and sort last in torch.unique: not reproduced by the comparisons below
      fail(nodeLabel(np) + ": Unique of a computed " + x->type().str() + " is not supported (a float input's NaNs); ampc takes integer and bool inputs at run time");
    if (n > kUniqueMax)
      fail(nodeLabel(np) + ": Unique of " + std::to_string(n) + " elements computed at run time; ampc finds distinct values by comparing every pair, up to " +
           std::to_string(kUniqueMax) + " elements");
    Value* f = reshapeTo(np, x, {n});
    Value* fi = reshapeTo(np, f, {n, 1});
    Value* fj = reshapeTo(np, f, {1, n});
    Value* pos = arangeAlong(np, 1, 0, n);
    Value* posI = reshapeTo(np, pos, {n, 1});
    Value* posJ = reshapeTo(np, pos, {1, n});
    auto sumRows = [&](Value* b) {  // [n, n] bool -> [n] i64: how many j per i
      return castTo(np, reduceNode(np, "ReduceSum", castTo(np, b, DType::f32), std::vector<int64_t>{1}, 0), i64);
    };
    Value* eq = step(np, "Equal", {fi, fj});  // f[i] == f[j]
    Value* first = step(np, "Equal", {sumRows(step(np, "And", {eq, step(np, "Less", {posJ, posI})})),
                                      scalarOf(np, "none", static_cast<double>(0), i64)});
    Value* firstI = castTo(np, first, i64);
    Value* c = runningCount(np, firstI, n);  // first occurrences at or before i
    Value* count = step(np, "Gather", {c, scalarOf(np, "last", static_cast<double>(n - 1), i64)}, {{"axis", int64_t{0}}});
    Value* inverse;  // each element's value's rank among the distinct values
    if (sorted) {
      inverse = sumRows(step(np, "And", {step(np, "Less", {fj, fi}), reshapeTo(np, first, {1, n})}));
    } else {
      Value* firstAt = step(np, "ArgMax", {castTo(np, eq, DType::f32)}, {{"axis", int64_t{1}}, {"keepdims", int64_t{0}}});
      inverse = step(np, "Gather", {step(np, "Sub", {c, firstI}), firstAt}, {{"axis", int64_t{0}}});
    }
    Value* one = scalarOf(np, "one", static_cast<double>(1), i64);
    // First occurrences go to their value's rank, the repeats after them in order: a permutation.
    Value* repeatsBefore = step(np, "Sub", {step(np, "Add", {pos, one}), c});
    Value* slot = step(np, "Where", {first, inverse, step(np, "Sub", {step(np, "Add", {count, repeatsBefore}), one})});
    Value* valid = step(np, "Less", {pos, count});
    selections_.push_back({valid, count, n, nodeLabel(np)});
    const size_t sel = selections_.size() - 1;
    auto placed = [&](Value* v, const std::string& out) {  // v[i] at slot[i]; the padding copies slot 0
      if (out.empty()) return;
      std::vector<int64_t> zi(static_cast<size_t>(n), 0);
      Value* zeros = g_->addConst(fresh(np, "zeros"), isFloat(v->type().dtype) ? Tensor::fromDoubles(v->type().dtype, {n}, std::vector<double>(zi.size(), 0.0))
                                                                             : Tensor::fromInts(v->type().dtype, {n}, zi));
      fromRow0(np, sel, step(np, "ScatterElements", {zeros, slot, v}, {{"axis", int64_t{0}}}), 0, out);
    };
    placed(f, name(0));
    placed(pos, name(1));
    if (!name(2).empty()) step(np, "Identity", {inverse}, {}, name(2));
    if (!name(3).empty()) {  // counts[k]: the elements of rank k, already in rank order
      fromRow0(np, sel, sumRows(step(np, "Equal", {reshapeTo(np, inverse, {1, n}), posI})), 0, name(3));
    }
  }

  // valid viewed along axis `axis` of a rank-r value (bound there, 1 elsewhere).
  Value* validAlong(const onnx::NodeProto& np, const Selection& s, int64_t r, int64_t axis) {
    std::vector<int64_t> along(static_cast<size_t>(r), 1);
    along[static_cast<size_t>(axis)] = s.bound;
    return reshapeTo(np, s.valid, along);
  }
  // v (padded along axis by selection sel) with its padding rows made copies of row 0, as every
  // padded value keeps them (finite wherever the real rows are), written as `out` and so tagged.
  Value* fromRow0(const onnx::NodeProto& np, size_t sel, Value* v, int64_t axis, const std::string& out = {}) {
    Value* row0 = step(np, "Gather", {v, constI64(np, "row0", {0})}, {{"axis", axis}});
    Value* r = step(np, "Where", {validAlong(np, selections_[sel], v->type().rank(), axis), v, row0}, {}, out);
    padded_[r] = {axis, sel};
    return r;
  }

  // v where `ok` (broadcast to v), NaN elsewhere, as `out`: a value PyTorch raises on rather than
  // computes (an index past the selected rows), not silently a padding row. Integers pass as they are.
  Value* nanWhereNot(const onnx::NodeProto& np, Value* v, Value* ok, const std::string& out) {
    const DType t = v->type().dtype;
    if (!isFloat(t)) return step(np, "Identity", {v}, {}, out);
    Value* poison = step(np, "Where", {ok, scalarOf(np, "zero", 0.0, t), scalarOf(np, "nan", std::nan(""), t)});
    return step(np, "Add", {v, poison}, {}, out);
  }

  std::optional<std::vector<int64_t>> axesOf(const onnx::NodeProto& np, int input) {
    if (np.input_size() > input && !np.input(input).empty()) return constIntsOf(np, input, "axes");
    return attrInts(np, "axes");
  }

  // A node that reads a padded value: the output's padded axis, or a rewrite (reductions over the
  // rows, losses), or a refusal.
  void paddedNode(const onnx::NodeProto& np) {
    const std::string& op = np.op_type();
    const bool onnxDomain = np.domain().empty() || np.domain() == "ai.onnx";
    std::string first;  // a padded input's name
    std::optional<size_t> sel;
    for (const auto& in : np.input())
      if (const Padded* p = paddedOf(in)) {
        if (first.empty()) first = in;
        if (sel && *sel != p->sel) refusePadded(np, in, "it meets another selection's rows here");
        sel = p->sel;
      }
    if (symNode(np, sel)) return;
    if (!sel) return addNodeAsIs(np);  // a shape with a count, read as numbers: its run-time value
    const Selection& S = selections_[*sel];
    auto tagOf = [&](int i) -> const Padded* { return i < np.input_size() ? paddedOf(np.input(i)) : nullptr; };
    auto rankOf = [&](int i) { return operand(np, i)->type().rank(); };
    auto normAxis = [&](int64_t a, int64_t r) { return a < 0 ? a + r : a; };
    auto finish = [&](int64_t axis, int results) {  // the node as written, its results padded along axis
      if (isStopGradient(np)) lowerStopGradient(np);
      else addNodeAsIs(np);
      for (int k = 0; k < results && k < np.output_size(); ++k) {
        if (np.output(k).empty()) continue;
        Value* v = g_->lookup(np.output(k));
        if (!v || axis < 0 || axis >= v->type().rank() || v->type().shape[static_cast<size_t>(axis)] != S.bound)
          refusePadded(np, first, "its result " + (v ? v->type().str() : std::string("?")) + " does not keep the rows on one axis");
        padded_[v] = {axis, *sel};
      }
    };
    const Padded* p0 = tagOf(0);
    if (isStopGradient(np)) return finish(p0->axis, 1);
    if (!onnxDomain) refusePadded(np, first, "a custom op is not row-wise");
    if (op == "CastLike") return p0 ? finish(p0->axis, 1) : addNodeAsIs(np);  // input 1 gives only the dtype
    const OpDef* def = lookupOp("", op, g_->opset);
    static const std::set<std::string> kRowWise = {"Where", "Cast", "CastLike", "Identity", "Dropout", "Not", "And", "Or", "Xor", "Equal",
                                                    "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "IsNaN", "IsInf", "Sign", "Mod",
                                                    "BitShift", "Clip"};
    if ((def && def->pointwise) || kRowWise.count(op)) {  // broadcasting elementwise: one padded axis of the result
      int64_t R = 0;
      for (int i = 0; i < np.input_size(); ++i)
        if (operand(np, i)) R = std::max(R, rankOf(i));
      if (op == "Clip")  // bounds are scalars
        R = rankOf(0);
      int64_t axis = -1;
      for (int i = 0; i < np.input_size(); ++i)
        if (const Padded* p = tagOf(i)) {
          const int64_t a = p->axis + R - rankOf(i);
          if (axis >= 0 && a != axis) refusePadded(np, np.input(i), "its operands hold the rows on different axes");
          axis = a;
        }
      for (int i = 0; i < np.input_size(); ++i) {
        Value* v = operand(np, i);
        if (!v || tagOf(i)) continue;
        const int64_t k = axis - (R - v->type().rank());
        if (k >= 0 && v->type().shape[static_cast<size_t>(k)] != 1)
          refusePadded(np, first, "operand '" + np.input(i) + "' " + v->type().str() + " is not broadcast along the rows");
      }
      return finish(axis, np.output_size());
    }
    const int64_t r0 = p0 ? rankOf(0) : 0;
    if (op == "Transpose" && p0) {
      auto perm = attrInts(np, "perm");
      std::vector<int64_t> pm = perm.value_or(std::vector<int64_t>{});
      if (pm.empty())
        for (int64_t d = r0 - 1; d >= 0; --d) pm.push_back(d);
      for (size_t k = 0; k < pm.size(); ++k)
        if (normAxis(pm[k], r0) == p0->axis) return finish(static_cast<int64_t>(k), 1);
    }
    if ((op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") && p0 && g_->opset >= 13 && normAxis(attrInt(np, "axis", -1), r0) != p0->axis)
      return finish(p0->axis, 1);
    // Over the rows (a softmax over the classes torch.unique found, an argmax among selected rows):
    // the padding entries at the type's lowest (or highest) finite value, so that exp gives them 0
    // and log-probabilities stay finite (no 0 * inf in a gradient); the result keeps the padding.
    const bool overRows = p0 && g_->opset >= 13 && isFloat(operand(np, 0)->type().dtype) &&
                          normAxis(attrInt(np, "axis", (op == "ArgMax" || op == "ArgMin") ? 0 : -1), r0) == p0->axis;
    if (overRows && (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax" || op == "ArgMax" || op == "ArgMin")) {
      Value* x = operand(np, 0);
      const DType t = x->type().dtype;
      const double big = largestFinite(t);
      Value* masked = step(np, "Where", {validAlong(np, S, r0, p0->axis), x, scalarOf(np, "fill", op == "ArgMin" ? big : -big, t)});
      onnx::NodeProto as = np;
      as.set_input(0, masked->name());
      if (op == "ArgMax" || op == "ArgMin") return addNodeAsIs(as);  // indices among the real rows
      addNodeAsIs(as);
      padded_[g_->lookup(np.output(0))] = {p0->axis, *sel};
      return;
    }
    if ((op == "LayerNormalization" || op == "RMSNormalization") && p0 && !tagOf(1) && !tagOf(2) && p0->axis < normAxis(attrInt(np, "axis", -1), r0))
      return finish(p0->axis, np.output_size());
    if (op == "MatMul" && p0 && !tagOf(1) && r0 >= 2 && p0->axis != r0 - 1) {
      const int64_t R = std::max(r0, rankOf(1));
      if (p0->axis < r0 - 2 && rankOf(1) > 2) refusePadded(np, first, "the rows are a batch axis that B would have to share");
      return finish(p0->axis + R - r0, 1);
    }
    if (op == "Gemm" && p0 && !tagOf(1) && !tagOf(2) && p0->axis == 0 && attrInt(np, "transA", 0) == 0) {
      if (Value* c = operand(np, 2); c && c->type().rank() == 2 && c->type().shape[0] != 1) refusePadded(np, first, "C is not broadcast along the rows");
      return finish(0, 1);
    }
    if (op == "Gather") {
      const int64_t axis = normAxis(attrInt(np, "axis", 0), r0 ? r0 : rankOf(0));
      const int64_t ri = rankOf(1);
      if (p0 && !tagOf(1) && p0->axis != axis) return finish(p0->axis < axis ? p0->axis : p0->axis + ri - 1, 1);
      if (!p0 && tagOf(1)) return finish(axis + tagOf(1)->axis, 1);
      // Constant indices along the rows: i counts from the first selected row, -i from the count
      // (x[:, -1], the last selected row). Past the selected rows PyTorch raises; here the values
      // are NaN (floats).
      if (p0 && !tagOf(1) && p0->axis == axis && operand(np, 1)->constData()) {
        const Tensor& c = *operand(np, 1)->constData();
        std::vector<int64_t> ix(static_cast<size_t>(c.numel())), neg(ix.size());
        for (int64_t e = 0; e < c.numel(); ++e) ix[static_cast<size_t>(e)] = c.getInt(e), neg[static_cast<size_t>(e)] = c.getInt(e) < 0;
        Value* fixed = g_->addConst(fresh(np, "index"), Tensor::fromInts(DType::i64, c.type.shape, ix));
        Value* isNeg = g_->addConst(fresh(np, "negative"), Tensor::fromInts(DType::boolean, c.type.shape, neg));
        Value* at = step(np, "Where", {isNeg, step(np, "Add", {fixed, S.count}), fixed});
        std::vector<int64_t> along(static_cast<size_t>(r0 - 1 + c.type.rank()), 1);  // the index's dims in the result
        std::copy(c.type.shape.begin(), c.type.shape.end(), along.begin() + axis);
        Value* real = step(np, "And", {step(np, "GreaterOrEqual", {at, scalarOf(np, "zero", 0.0, DType::i64)}), step(np, "Less", {at, S.count})});
        onnx::NodeProto as = np;
        as.set_input(1, at->name());
        as.set_output(0, fresh(np, "picked"));
        addNodeAsIs(as);
        nanWhereNot(np, g_->lookup(as.output(0)), reshapeTo(np, real, along), np.output(0));
        return;
      }
    }
    if (op == "GatherND" && !p0 && tagOf(1) && attrInt(np, "batch_dims", 0) == 0 && tagOf(1)->axis < rankOf(1) - 1) return finish(tagOf(1)->axis, 1);
    if (op == "GatherElements" && p0 && tagOf(1) && p0->axis == tagOf(1)->axis && normAxis(attrInt(np, "axis", 0), r0) != p0->axis)
      return finish(p0->axis, 1);
    if ((op == "ArgMax" || op == "ArgMin") && p0) {
      const int64_t axis = normAxis(attrInt(np, "axis", 0), r0);
      if (axis != p0->axis) return finish(attrInt(np, "keepdims", 1) == 0 && axis < p0->axis ? p0->axis - 1 : p0->axis, 1);
    }
    if ((op == "Slice" || op == "Split") && p0 && std::none_of(np.input().begin() + 1, np.input().end(), [&](const std::string& in) { return paddedOf(in); })) {
      std::vector<int64_t> axes;
      if (op == "Split") axes = {normAxis(attrInt(np, "axis", 0), r0)};
      else if (auto a = np.input_size() > 3 && !np.input(3).empty() ? std::optional(constIntsOf(np, 3, "axes")) : std::nullopt) axes = *a;
      else for (int64_t d = 0; d < static_cast<int64_t>(constIntsOf(np, 1, "starts").size()); ++d) axes.push_back(d);
      if (std::none_of(axes.begin(), axes.end(), [&](int64_t a) { return normAxis(a, r0) == p0->axis; })) return finish(p0->axis, np.output_size());
      if (op == "Slice") {  // the whole of the rows' axis (TorchScript's index_add slices its operand [0:INT_MAX])
        const auto starts = constIntsOf(np, 1, "starts"), ends = constIntsOf(np, 2, "ends");
        const auto steps = np.input_size() > 4 && !np.input(4).empty() ? constIntsOf(np, 4, "steps") : std::vector<int64_t>(axes.size(), 1);
        bool whole = true, head = true;  // all of the rows, or the first (a real row wherever any is selected)
        for (size_t k = 0; k < axes.size() && k < starts.size() && k < ends.size() && k < steps.size(); ++k)
          if (normAxis(axes[k], r0) == p0->axis) {
            whole = whole && (starts[k] == 0 || starts[k] <= -S.bound) && ends[k] >= S.bound && steps[k] == 1;
            head = head && starts[k] == 0 && ends[k] == 1 && steps[k] == 1;
          }
        if (whole) return finish(p0->axis, 1);
        if (head) return addNodeAsIs(np);
        // [-1:] along the rows (the last selected row, kept as an axis of one)
        bool last = true;
        for (size_t k = 0; k < axes.size() && k < starts.size() && k < ends.size() && k < steps.size(); ++k)
          if (normAxis(axes[k], r0) == p0->axis) last = last && starts[k] == -1 && ends[k] >= S.bound && steps[k] == 1 && axes.size() == 1;
        if (last) {  // (of no selected row PyTorch's slice is empty; here NaN, for floats)
          Value* at = reshapeTo(np, step(np, "Sub", {S.count, scalarOf(np, "one", 1.0, DType::i64)}), {1});
          Value* picked = step(np, "Gather", {operand(np, 0), at}, {{"axis", p0->axis}});
          nanWhereNot(np, picked, step(np, "Greater", {S.count, scalarOf(np, "zero", 0.0, DType::i64)}), np.output(0));
          return;
        }
      }
    }
    if ((op == "Squeeze" || op == "Unsqueeze") && p0) {
      std::vector<int64_t> axes = axesOf(np, 1).value_or(std::vector<int64_t>{});
      if (op == "Squeeze") {
        if (axes.empty()) refusePadded(np, first, "a Squeeze without axes may drop the rows' axis when one row is selected");
        int64_t axis = p0->axis;
        for (int64_t a : axes) {
          if (normAxis(a, r0) == p0->axis) refusePadded(np, first, "it squeezes the rows' axis");
          axis -= normAxis(a, r0) < p0->axis;
        }
        return finish(axis, 1);
      }
      const int64_t R = r0 + static_cast<int64_t>(axes.size());
      std::vector<bool> added(static_cast<size_t>(R), false);
      for (int64_t a : axes) added[static_cast<size_t>(normAxis(a, R))] = true;
      for (int64_t d = 0, k = 0; d < R; ++d)
        if (!added[static_cast<size_t>(d)] && k++ == p0->axis) return finish(d, 1);
    }
    if (op == "Expand" && p0 && !tagOf(1)) {  // a constant shape that keeps the rows (1 or the bound there)
      const int64_t R = std::max(r0, static_cast<int64_t>(constIntsOf(np, 1, "shape").size()));
      return finish(p0->axis + R - r0, 1);
    }
    if ((op == "Reshape" || op == "Flatten") && p0) {
      const auto& in = operand(np, 0)->type().shape;
      int64_t before = 1;
      for (int64_t d = 0; d < p0->axis; ++d) before *= in[static_cast<size_t>(d)];
      onnx::NodeProto as = np;
      as.set_output(0, fresh(np, "view"));
      addNodeAsIs(as);
      Value* v = g_->lookup(as.output(0));
      int64_t prefix = 1;
      // The rows' axis kept whole, at the same place in memory order
      for (int64_t d = 0; v && d < v->type().rank(); prefix *= v->type().shape[static_cast<size_t>(d)], ++d)
        if (prefix == before && v->type().shape[static_cast<size_t>(d)] == S.bound) {
          padded_[step(np, "Identity", {v}, {}, np.output(0))] = {d, *sel};
          return;
        }
      // Or split into [G, rest] (BART's and T5's heads: hidden[eos_mask].view(B, -1, H)): the count
      // rows, row-major, are G groups of count / G, so group g holds rows g k .. g k + k - 1 (k =
      // count / G), padded along the new second axis to bound / G with copies of its row 0. Where G
      // does not divide the count (PyTorch's view raises), the values are NaN.
      prefix = 1;
      for (int64_t d = 0; v && op == "Reshape" && d + 1 < v->type().rank(); prefix *= v->type().shape[static_cast<size_t>(d)], ++d) {
        const auto& os = v->type().shape;
        const int64_t G = os[static_cast<size_t>(d)], X = os[static_cast<size_t>(d) + 1];
        // (the other dims as they were: the gather below leaves them)
        const bool others = d == p0->axis && std::equal(os.begin(), os.begin() + d, in.begin()) &&
                            std::equal(os.begin() + d + 2, os.end(), in.begin() + d + 1, in.end());
        if (prefix != before || !others || G < 1 || G * X != S.bound || !isFloat(v->type().dtype)) continue;
        const DType i64 = DType::i64;
        Value* g = scalarOf(np, "groups", static_cast<double>(G), i64);
        Value* k = step(np, "Div", {S.count, g});
        Value* t = arangeAlong(np, 2, 1, X);  // [1, X]
        Value* base = step(np, "Mul", {arangeAlong(np, 2, 0, G), k});  // [G, 1]: g k
        Value* inGroup = step(np, "Less", {t, k});
        Value* idx = step(np, "Where", {inGroup, step(np, "Add", {base, t}), base});
        Value* rows = step(np, "Gather", {operand(np, 0), idx}, {{"axis", p0->axis}});
        Value* whole = step(np, "Equal", {step(np, "Mod", {S.count, g}), scalarOf(np, "zero", 0.0, i64)});
        selections_.push_back({reshapeTo(np, inGroup, {X}), k, X, S.node + " viewed as " + std::to_string(G) + " groups"});
        padded_[nanWhereNot(np, rows, whole, np.output(0))] = {d + 1, selections_.size() - 1};
        return;
      }
      refusePadded(np, first, "it merges the rows' axis with another");
    }
    if (op == "Concat" && p0) {
      const int64_t axis = normAxis(attrInt(np, "axis", 0), r0);
      bool all = true;
      for (int i = 0; i < np.input_size(); ++i) all = all && tagOf(i) && tagOf(i)->axis == p0->axis;
      if (all && axis != p0->axis) return finish(p0->axis, 1);
    }
    if (op == "Shape" && p0) {  // the run-time shape, the count on the rows' axis (start and end as ONNX clamps them)
      const auto& shape = operand(np, 0)->type().shape;
      auto clampTo = [&](int64_t v) { return std::clamp(v < 0 ? v + r0 : v, int64_t{0}, r0); };
      const int64_t b = clampTo(attrInt(np, "start", 0)), e = clampTo(attrInt(np, "end", r0));
      if (b >= e) refusePadded(np, first, "an empty Shape is not supported");
      std::vector<Value*> parts;
      std::vector<SymDim> sym;
      for (int64_t d = b; d < e; ++d) {
        const bool rows = d == p0->axis;
        parts.push_back(rows ? reshapeTo(np, S.count, {1}) : constI64(np, "dim", {shape[static_cast<size_t>(d)]}));
        sym.push_back(rows ? SymDim{0, *sel} : SymDim{shape[static_cast<size_t>(d)], std::nullopt});
      }
      step(np, "Concat", parts, {{"axis", int64_t{0}}}, np.output(0));
      symShape_[g_->lookup(np.output(0))] = sym;
      return;
    }
    if ((op == "ScatterND" || op == "ScatterElements") && !p0 && tagOf(1)) {
      // index_add, index_put over selected rows: the padded rows write into one extra slice of the
      // data (along axis 0, or ScatterElements' axis), which is cut off afterwards, so they write
      // nothing whatever the reduction.
      Value* data = operand(np, 0);
      Value* idx = operand(np, 1);
      const Padded pi = *tagOf(1);
      const int64_t rd = data->type().rank(), ri = idx->type().rank();
      const int64_t A = op == "ScatterElements" ? normAxis(attrInt(np, "axis", 0), rd) : 0;
      if (op == "ScatterND" && pi.axis >= ri - 1) refusePadded(np, first, "its index tuples, not its rows, are padded");
      if (tagOf(2) && tagOf(2)->axis != pi.axis) refusePadded(np, first, "its indices and updates hold the rows on different axes");
      const int64_t D = data->type().shape[static_cast<size_t>(A)];
      std::vector<int64_t> sliceShape = data->type().shape;
      sliceShape[static_cast<size_t>(A)] = 1;
      int64_t sliceN = 1;
      for (int64_t e : sliceShape) sliceN *= e;
      Value* extra = g_->addConst(fresh(np, "spare"), Tensor::fromDoubles(data->type().dtype, sliceShape, std::vector<double>(static_cast<size_t>(sliceN), 0.0)));
      Value* wide = step(np, "Concat", {data, extra}, {{"axis", A}});
      std::vector<int64_t> spare{D};
      if (op == "ScatterND") spare.resize(static_cast<size_t>(idx->type().shape.back()), 0);
      Value* at = g_->addConst(fresh(np, "spare_at"), Tensor::fromInts(idx->type().dtype, {static_cast<int64_t>(spare.size())}, spare));
      if (op == "ScatterElements") at = reshapeTo(np, at, {});
      Value* idx2 = step(np, "Where", {validAlong(np, S, ri, pi.axis), idx, at});
      onnx::NodeProto as = scatterMeantToAdd(np) ? withReductionAdd(np) : np;
      as.set_input(0, wide->name());
      as.set_input(1, idx2->name());
      as.set_output(0, fresh(np, "wide_out"));
      addNodeAsIs(as);
      step(np, "Slice", {g_->lookup(as.output(0)), constI64(np, "start", {0}), constI64(np, "end", {D}), constI64(np, "axes", {A})}, {}, np.output(0));
      return;
    }
    if (op == "Size" && p0) {
      step(np, "Mul", {S.count, scalarOf(np, "rest", static_cast<double>(operand(np, 0)->type().numel() / S.bound), DType::i64)}, {},
           np.output(0));
      return;
    }
    if (op.rfind("Reduce", 0) == 0 && p0 && !tagOf(1)) return paddedReduce(np, *p0, S);
    if ((op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") && p0 && p0->axis == 1 && !tagOf(1) && !tagOf(2) &&
        isFloat(operand(np, 0)->type().dtype) && !isFloat(operand(np, 1)->type().dtype)) {
      // The classes are the padded rows (a prototypical network's classes from torch.unique): the
      // padding classes' scores at the lowest finite value (no probability, a finite log), the
      // targets index real classes. The log-probabilities keep the padding.
      Value* x = operand(np, 0);
      const DType t = x->type().dtype;
      if (op == "NegativeLogLikelihoodLoss") refusePadded(np, first, "log-probabilities over padded classes cannot be renormalised here");
      const double big = largestFinite(t);
      Value* masked = step(np, "Where", {validAlong(np, S, r0, 1), x, scalarOf(np, "fill", -big, t)});
      onnx::NodeProto as = np;
      as.set_input(0, masked->name());
      addNodeAsIs(as);
      if (np.output_size() > 1 && !np.output(1).empty()) padded_[g_->lookup(np.output(1))] = {1, *sel};
      return;
    }
    if ((op == "ScatterND" || op == "ScatterElements") && p0 && !tagOf(1) && !tagOf(2) &&
        (op == "ScatterND" ? p0->axis == 0 : normAxis(attrInt(np, "axis", 0), r0) == p0->axis)) {
      // Writes into padded rows along their axis (index_add of each class's sum over torch.unique's
      // classes): the rows stay, and the padding rows become copies of row 0 again, as every padded
      // value keeps them (finite wherever the real rows are: a class's mean is not 0 / 0 there).
      onnx::NodeProto as = scatterMeantToAdd(np) ? withReductionAdd(np) : np;
      as.set_output(0, fresh(np, "written"));
      addNodeAsIs(as);
      fromRow0(np, *sel, g_->lookup(as.output(0)), p0->axis, np.output(0));
      return;
    }
    if ((op == "SoftmaxCrossEntropyLoss" || op == "NegativeLogLikelihoodLoss") && p0 && tagOf(1) && p0->axis == 0 && tagOf(1)->axis == 0 &&
        !tagOf(2) && !isFloat(operand(np, 1)->type().dtype))
      return paddedLoss(np, S, *sel);
    refusePadded(np, first, op + " is not such an op here");
  }

  // Nodes that read a shape holding a count (symShape_): true where handled here.
  bool symNode(const onnx::NodeProto& np, std::optional<size_t> sel) {
    const std::string& op = np.op_type();
    const auto* s0 = symOf(np.input_size() ? np.input(0) : std::string());
    const auto* s1 = np.input_size() > 1 ? symOf(np.input(1)) : nullptr;
    if (!s0 && !s1) return false;
    auto ints = [&](int i) -> std::optional<std::vector<int64_t>> {
      Value* v = operand(np, i);
      const Tensor* t = v ? v->constData() : nullptr;
      if (!t || !isInteger(t->type.dtype)) return std::nullopt;
      std::vector<int64_t> r;
      for (int64_t k = 0; k < t->numel(); ++k) r.push_back(t->getInt(k));
      return r;
    };
    auto keep = [&](std::vector<SymDim> d) {  // the node as written (its run-time value), and its elements
      addNodeAsIs(np);
      if (Value* v = g_->lookup(np.output(0))) symShape_[v] = std::move(d);
      return true;
    };
    // Elements through the shape arithmetic exporters write.
    if (op == "Reshape" && s0 && !s1) return keep(*s0);  // a count's scalar as [1], or back
    if ((op == "Identity" || op == "Unsqueeze" || op == "Squeeze" || (op == "Cast" && isInteger(dtypeFromOnnx(static_cast<int>(attrInt(np, "to", 0))).value_or(DType::f32)))) && s0)
      return keep(*s0);
    if (op == "Concat" && !sel) {
      std::vector<SymDim> all;
      for (int i = 0; i < np.input_size(); ++i) {
        if (const auto* s = symOf(np.input(i))) {
          all.insert(all.end(), s->begin(), s->end());
        } else if (auto c = ints(i)) {
          for (int64_t v : *c) all.push_back({v, std::nullopt});
        } else {
          return false;
        }
      }
      return keep(all);
    }
    if (op == "Gather" && s0 && !sel && attrInt(np, "axis", 0) == 0) {
      auto idx = ints(1);
      if (!idx) return false;
      std::vector<SymDim> picked;
      for (int64_t k : *idx) {
        const int64_t n = static_cast<int64_t>(s0->size()), at = k < 0 ? k + n : k;
        if (at < 0 || at >= n) return false;
        picked.push_back((*s0)[static_cast<size_t>(at)]);
      }
      return keep(picked);
    }
    if (op == "Slice" && s0 && !sel) {
      auto b = ints(1), e = ints(2);
      if (!b || !e || b->size() != 1 || e->size() != 1 || (np.input_size() > 4 && !np.input(4).empty() && ints(4) != std::vector<int64_t>{1}))
        return false;
      const int64_t n = static_cast<int64_t>(s0->size());
      auto clampTo = [&](int64_t v) { return std::clamp(v < 0 ? v + n : v, int64_t{0}, n); };
      return keep(std::vector<SymDim>(s0->begin() + clampTo((*b)[0]), s0->begin() + std::max(clampTo((*b)[0]), clampTo((*e)[0]))));
    }
    // Read as a shape: the count becomes the bound, and the result holds padded rows on its axis.
    const std::vector<SymDim>* shape = op == "ConstantOfShape" ? s0 : (op == "Expand" || op == "Reshape") ? s1 : nullptr;
    if (!shape) return false;
    const int shapeInput = op == "ConstantOfShape" ? 0 : 1;
    std::vector<int64_t> dims;
    std::optional<size_t> countSel;
    int64_t countAt = -1;
    for (size_t k = 0; k < shape->size(); ++k) {
      const SymDim& d = (*shape)[k];
      if (!d.count) {
        dims.push_back(d.value);
        continue;
      }
      if (countAt >= 0 || (sel && *sel != *d.count)) fail(nodeLabel(np) + ": its shape holds the counts of two selections made at run time");
      countSel = d.count;
      countAt = static_cast<int64_t>(k);
      dims.push_back(selections_[*d.count].bound);
    }
    onnx::NodeProto as = np;
    as.set_input(shapeInput, constI64(np, "shape", dims)->name());
    addNodeAsIs(as);
    Value* out = g_->lookup(np.output(0));
    if (!countSel) {  // no count left: an ordinary shape, which must keep the padded input's rows, if any
      if (sel) {
        const Padded p = *paddedOf(np.input(0));
        const auto& in = operand(np, 0)->type().shape;
        const int64_t bound = selections_[*sel].bound, R = out->type().rank();
        std::optional<int64_t> axis;
        if (op == "Expand" && out->type().shape[static_cast<size_t>(p.axis + R - static_cast<int64_t>(in.size()))] == bound)
          axis = p.axis + R - static_cast<int64_t>(in.size());
        if (op == "Reshape") {  // the rows' axis whole, at the same place in memory order
          int64_t before = 1, prefix = 1;
          for (int64_t d = 0; d < p.axis; ++d) before *= in[static_cast<size_t>(d)];
          for (int64_t d = 0; d < R && !axis; prefix *= out->type().shape[static_cast<size_t>(d)], ++d)
            if (prefix == before && out->type().shape[static_cast<size_t>(d)] == bound) axis = d;
        }
        if (!axis) fail(nodeLabel(np) + ": its input holds rows selected at run time, and its shape does not keep them");
        padded_[out] = {*axis, *sel};
      }
      return true;
    }
    const int64_t axis = countAt + out->type().rank() - static_cast<int64_t>(dims.size());  // Expand aligns the shape right
    if (sel) {  // the input's rows must land on the count's axis
      const Padded p = *paddedOf(np.input(0));
      const int64_t inRank = operand(np, 0)->type().rank();
      bool ok = op == "Expand" ? p.axis + out->type().rank() - inRank == axis : false;
      if (op == "Reshape") {
        int64_t before = 1, prefix = 1;
        for (int64_t d = 0; d < p.axis; ++d) before *= operand(np, 0)->type().shape[static_cast<size_t>(d)];
        for (int64_t d = 0; d < axis; ++d) prefix *= out->type().shape[static_cast<size_t>(d)];
        ok = before == prefix;
      }
      if (!ok) fail(nodeLabel(np) + ": its input's rows, selected at run time, do not land on its shape's count");
    }
    padded_[out] = {axis, *countSel};
    return true;
  }

  // A reduction over a padded value: where it reduces the rows, the padding rows are first set to the
  // reduction's identity (the node then runs as written on that), and a mean divides by the count.
  void paddedReduce(const onnx::NodeProto& np, const Padded& p, const Selection& S) {
    const std::string& op = np.op_type();
    Value* x = operand(np, 0);
    const int64_t r = x->type().rank(), keep = attrInt(np, "keepdims", 1);
    const int64_t noop = attrInt(np, "noop_with_empty_axes", 0);
    const bool axesInput = op == "ReduceSum" || g_->opset >= 18;
    std::optional<std::vector<int64_t>> axes = axesInput ? axesOf(np, 1) : attrInts(np, "axes");
    if (axes && axes->empty() && !noop) axes.reset();
    if (axes && axes->empty()) return finishPadded(np, p.axis, S);  // noop
    std::vector<bool> reduced(static_cast<size_t>(r), !axes);
    if (axes)
      for (int64_t a : *axes) reduced[static_cast<size_t>(a < 0 ? a + r : a)] = true;
    if (!reduced[static_cast<size_t>(p.axis)]) {
      int64_t axis = p.axis;
      if (!keep)
        for (int64_t d = 0; d < p.axis; ++d) axis -= reduced[static_cast<size_t>(d)];
      return finishPadded(np, axis, S);
    }
    const DType t = x->type().dtype;
    if (!isFloat(t)) fail(nodeLabel(np) + ": a reduction over rows selected at run time takes floats, got " + x->type().str());
    const double fill = op == "ReduceMax" || op == "ReduceLogSumExp" ? -INFINITY : op == "ReduceMin" ? INFINITY : op == "ReduceProd" ? 1.0 : 0.0;
    Value* masked = step(np, "Where", {validAlong(np, S, r, p.axis), x, scalarOf(np, "fill", fill, t)});
    if (op != "ReduceMean") {
      onnx::NodeProto as = np;
      as.set_input(0, masked->name());
      return addNodeAsIs(as);
    }
    int64_t others = 1;  // the other reduced axes' extent
    for (int64_t d = 0; d < r; ++d)
      if (reduced[static_cast<size_t>(d)] && d != p.axis) others *= x->type().shape[static_cast<size_t>(d)];
    Value* n = step(np, "Mul", {castTo(np, S.count, t), scalarOf(np, "others", static_cast<double>(others), t)});
    step(np, "Div", {reduceNode(np, "ReduceSum", masked, axes, keep), n}, {}, np.output(0));
  }
  void finishPadded(const onnx::NodeProto& np, int64_t axis, const Selection& S) {
    addNodeAsIs(np);
    Value* v = g_->lookup(np.output(0));
    if (!v || v->type().shape.at(static_cast<size_t>(axis)) != S.bound) fail(nodeLabel(np) + ": lost the selected rows' axis (internal)");
    padded_[v] = {axis, static_cast<size_t>(&S - selections_.data())};
  }

  // A loss over padded rows: the padding rows' targets become the ignore_index, which takes them
  // out of the sum and of the mean's count (its weight), as ONNX defines both losses.
  void paddedLoss(const onnx::NodeProto& np, const Selection& S, size_t sel) {
    Value* target = operand(np, 1);
    const auto* ia = findAttr(np, "ignore_index", onnx::AttributeProto::INT, "an int");
    const int64_t ignore = ia ? ia->i() : -100;
    Value* t = step(np, "Where", {validAlong(np, S, target->type().rank(), 0), target,
                                  g_->addConst(fresh(np, "ignore"), Tensor::fromInts(target->type().dtype, {}, {ignore}))});
    onnx::NodeProto as = np;
    as.set_input(1, t->name());
    if (!ia) {
      auto* a = as.add_attribute();
      a->set_name("ignore_index");
      a->set_type(onnx::AttributeProto::INT);
      a->set_i(ignore);
    }
    addNodeAsIs(as);
    const auto* ra = findAttr(np, "reduction", onnx::AttributeProto::STRING, "a string");
    const bool none = ra && ra->s() == "none";
    for (int k = none ? 0 : 1; k < np.output_size(); ++k)
      if (Value* v = np.output(k).empty() ? nullptr : g_->lookup(np.output(k))) padded_[v] = {0, sel};
  }


  void lowerAtImport(const onnx::NodeProto& np) {
    const std::string& op = np.op_type();
    if (op == "LSTM" || op == "GRU" || op == "RNN")  // every output is optional
      return lowerRecurrent(np, op == "LSTM" ? Cell::Lstm : op == "GRU" ? Cell::Gru : Cell::Rnn);
    if (op == "If") return lowerIf(np);
    if (op == "Loop") return lowerLoop(np);
    if (op == "Scan") return lowerScan(np);
    const std::string out = np.output_size() ? np.output(0) : std::string();
    if (out.empty()) fail(nodeLabel(np) + " has no output");
    if (op == "InstanceNormalization" || op == "GroupNormalization") return lowerGroupNorm(np, op == "InstanceNormalization", out);
    if (op == "RMSNormalization") return lowerRmsNorm(np, out);
    if (op == "Einsum") return lowerEinsum(np, out);
    if (op == "ConvTranspose") return lowerConvTranspose(np, out);
    if (op == "Col2Im") return lowerCol2Im(np, out);
    if (op == "Resize") return lowerResize(np, out);
    if (op == "DepthToSpace" || op == "SpaceToDepth") return lowerDepthSpace(np, op == "SpaceToDepth", out);
    if (op == "OneHot") return lowerOneHot(np, out);
    if (op == "RandomNormal" || op == "RandomUniform") return lowerRandom(np, op == "RandomNormal", out);
    if (op == "LRN") return lowerLrn(np, out);
    if (op == "RotaryEmbedding") return lowerRotary(np, out);
    if (op == "Attention") return lowerAttention(np);
    if (op == "HannWindow" || op == "HammingWindow" || op == "BlackmanWindow") return lowerWindow(np, out);
    if (op == "DFT") return lowerDft(np, out);
    if (op == "STFT") return lowerStft(np, out);
    if (op == "QuantizeLinear") return lowerQuantize(np, out);
    if (op == "DequantizeLinear") return lowerDequantize(np, out);
    if (op == "Unique") return lowerUnique(np);
    if (kSmallCompositions.count(op)) return lowerSmall(np, out);
    if (op.rfind("Reduce", 0) == 0) return lowerReduce(np, op, out);
    if (op == "CastLike") {
      Value* x = operand(np, 0);
      Value* like = operand(np, 1);
      if (!x || !like) fail(nodeLabel(np) + " needs two inputs");
      emit(np, "Cast", {x}, {out}, {{"to", static_cast<int64_t>(dtypeToOnnx(like->type().dtype))}});
    } else if (op == "SplitToSequence") {
      Value* x = operand(np, 0);
      if (!x) fail(nodeLabel(np) + " needs an input");
      const int64_t r = x->type().rank();
      int64_t axis = attrInt(np, "axis", 0);
      if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is out of range for " + x->type().str());
      if (axis < 0) axis += r;
      const int64_t dim = x->type().shape[axis];
      std::vector<int64_t> sizes;
      bool keep = true;
      if (np.input_size() < 2 || np.input(1).empty()) {
        sizes.assign(dim, 1);
        keep = attrInt(np, "keepdims", 1) != 0;
      } else {
        Value* s = operand(np, 1);
        auto v = constIntsOf(np, 1, "split");
        if (s->type().rank() == 0) {
          if (v[0] <= 0) fail(nodeLabel(np) + ": split must be positive");
          for (int64_t left = dim; left > 0; left -= v[0]) sizes.push_back(std::min(left, v[0]));
        } else {
          sizes = v;
        }
      }
      if (sizes.empty()) fail(nodeLabel(np) + ": splitting an empty axis gives an empty sequence");
      std::vector<std::string> names;
      for (size_t k = 0; k < sizes.size(); ++k) names.push_back(fresh(np, std::to_string(k)));
      Value* split = g_->addConst(fresh(np, "split"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(sizes.size())}, sizes));
      auto parts = emit(np, "Split", {x, split}, names, {{"axis", axis}});
      if (!keep) {
        Value* ax = g_->addConst(fresh(np, "axes"), Tensor::fromInts(DType::i64, {1}, {axis}));
        for (auto& p : parts) p = emit(np, "Squeeze", {p, ax}, {fresh(np, "squeezed")})[0];
      }
      sequences_[out] = parts;
    } else if (op == "SequenceConstruct") {
      std::vector<Value*> items;
      for (int i = 0; i < np.input_size(); ++i) items.push_back(operand(np, i));
      sequences_[out] = items;
    } else if (op == "SequenceEmpty") {
      sequences_[out] = {};
    } else if (op == "SequenceInsert") {
      auto items = sequence(np, 0);
      items.insert(items.begin() + seqIndex(np, 2, items.size(), true), operand(np, 1));
      sequences_[out] = items;
    } else if (op == "SequenceErase") {
      auto items = sequence(np, 0);
      if (items.empty()) fail(nodeLabel(np) + ": erasing from an empty sequence");
      items.erase(items.begin() + seqIndex(np, 1, items.size(), false));
      sequences_[out] = items;
    } else if (op == "SequenceAt") {
      const auto& items = sequence(np, 0);
      if (items.empty()) fail(nodeLabel(np) + ": the sequence is empty");
      int64_t k = seqIndex(np, 1, items.size(), false);
      emit(np, "Identity", {items[k]}, {out});
    } else if (op == "SequenceLength") {
      g_->addConst(out, Tensor::fromInts(DType::i64, {}, {static_cast<int64_t>(sequence(np, 0).size())}));
    } else if (op == "ConcatFromSequence") {
      auto items = sequence(np, 0);
      if (items.empty()) fail(nodeLabel(np) + ": the sequence is empty");
      int64_t axis = attrInt(np, "axis", 0);
      if (attrInt(np, "new_axis", 0) != 0) {
        const int64_t r = items[0]->type().rank() + 1;
        if (axis < -r || axis >= r) fail(nodeLabel(np) + ": axis " + std::to_string(axis) + " is out of range");
        Value* ax = g_->addConst(fresh(np, "axes"), Tensor::fromInts(DType::i64, {1}, {axis < 0 ? axis + r : axis}));
        for (auto& it : items) it = emit(np, "Unsqueeze", {it, ax}, {fresh(np, "unsqueezed")})[0];
        axis = axis < 0 ? axis + r : axis;
      }
      emit(np, "Concat", items, {out}, {{"axis", axis}});
    }
  }

  // ---- ONNX local functions (opset 18's exporters may emit them): each call is replaced by the
  // function's body, its values renamed under the calling node's outputs, its attribute
  // references resolved from the call's attributes.
  void inlineFunctions() {
    std::map<std::pair<std::string, std::string>, const onnx::FunctionProto*> fns;
    for (const auto& f : m_.functions()) fns[{f.domain(), f.name()}] = &f;
    int counter = 0;
    std::function<void(const onnx::NodeProto&, int)> add = [&](const onnx::NodeProto& n, int depth) {
      auto it = fns.find({n.domain(), n.op_type()});
      if (it == fns.end()) {
        nodes_.push_back(n);
        return;
      }
      if (depth > 64) fail(nodeLabel(n) + ": functions nest more than 64 deep (recursive?)");
      const onnx::FunctionProto& f = *it->second;
      const std::string prefix = (n.name().empty() ? f.name() : n.name()) + "/" + std::to_string(counter++) + "/";
      std::unordered_map<std::string, std::string> rename;
      for (int i = 0; i < f.input_size(); ++i) rename[f.input(i)] = i < n.input_size() ? n.input(i) : std::string();
      for (int i = 0; i < f.output_size(); ++i) rename[f.output(i)] = i < n.output_size() ? n.output(i) : std::string();
      std::unordered_map<std::string, const onnx::AttributeProto*> given;
      for (const auto& a : n.attribute()) given[a.name()] = &a;
      auto name = [&](const std::string& v) -> std::string {
        if (v.empty()) return v;
        auto r = rename.find(v);
        if (r != rename.end()) return r->second;
        return rename[v] = prefix + v;
      };
      for (const auto& body : f.node()) {
        onnx::NodeProto c = body;
        c.set_name(prefix + body.name());
        for (int i = 0; i < c.input_size(); ++i) c.set_input(i, name(body.input(i)));
        for (int i = 0; i < c.output_size(); ++i) c.set_output(i, name(body.output(i)));
        c.clear_attribute();
        for (const auto& a : body.attribute()) {
          if (a.ref_attr_name().empty()) {
            *c.add_attribute() = a;
            continue;
          }
          auto g = given.find(a.ref_attr_name());
          if (g == given.end()) continue;  // an unset optional attribute: the op's default
          onnx::AttributeProto* na = c.add_attribute();
          *na = *g->second;
          na->set_name(a.name());
        }
        add(c, depth + 1);
      }
    };
    for (const auto& n : m_.graph().node()) add(n, 0);
  }

  // A tensor the module's forward creates (torch.tensor(torch.finfo(dtype).min), a Python tensor
  // attribute), which torch.export lifts into the program as a constant input and the dynamo exporter
  // then writes as an initializer named after it: `lifted_tensor_N` (torch.fx: `_tensor_constantN`)
  // as the last component of the module path. Neither a parameter nor a buffer, so never trained
  // (unless the model's ampc.trainable list names it): a constant, which folds, and which the
  // matchers read as one (transformers' mask fill, GPT-Neo's, lifted this way, is a scalar).
  bool liftedConstant(const std::string& name) const {
    if (g_->declaredTrainable &&
        std::find(g_->declaredTrainable->begin(), g_->declaredTrainable->end(), name) != g_->declaredTrainable->end())
      return false;
    static const std::regex lifted(R"((.*\.)?(lifted_tensor_|_tensor_constant)[0-9]+)");
    return std::regex_match(name, lifted);
  }

  void readMetadata() {
    for (const auto& p : m_.metadata_props()) {
      if (p.key() == "ampc.trainable") g_->declaredTrainable = parseNameList(p.value(), p.key());
      if (p.key() == "ampc.embedding_padding") readPadding(p.value());
      if (p.key() == "ampc.node_attributes") readNodeAttributes(p.value());
      if (p.key() == "ampc.frozen_batchnorms") {
        const auto names = parseNameList(p.value(), p.key());
        g_->frozenBatchNorms.insert(names.begin(), names.end());
      }
      // Written by ampc_export.py where the dynamo exporter failed with its stop-gradient markers.
      if (p.key() == "ampc.unmarked_stop_gradients" && p.value() != "0")
        g_->importNotes.push_back("the model's forward stops the gradient at " + p.value() +
                                  " value(s) (detach(), torch.no_grad()) that the export could not mark (ampc.StopGradient): "
                                  "ampc's gradients flow through them, where PyTorch's stop");
      // Written by tools/export/ampc_export.py: the torch.autograd.Function subclasses (outside
      // torch) that the model's forward calls. Their backward is their own code, which no exporter
      // keeps: ampc differentiates the forward they export, and PyTorch runs something else.
      if (p.key() == "ampc.custom_autograd") {
        const auto names = parseNameList(p.value(), p.key());
        std::string list;
        for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
        if (!names.empty())
          g_->importNotes.push_back("the model's forward calls torch.autograd.Function subclasses with a backward of their own (" + list +
                                    "): no exporter keeps that backward, so ampc's gradients through them are the exported forward's "
                                    "derivative, and they differ from PyTorch's where that backward is not the derivative (a "
                                    "straight-through estimator, a surrogate gradient)");
      }
    }
  }
  // ampc's annotations of standard ops in a model it exported ({"first result": {"ampc_...": int}}):
  // set on the nodes that import makes with those results.
  void readNodeAttributes(const std::string& s) {
    auto j = nlohmann::json::parse(s, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("metadata 'ampc.node_attributes' is not a JSON object of result: {attribute: int}");
    for (const auto& [value, attrs] : j.items()) {
      if (!attrs.is_object()) fail("metadata 'ampc.node_attributes': '" + value + "' is not given an object");
      for (const auto& [k, v] : attrs.items()) {
        if (k.rfind("ampc_", 0) != 0 || !v.is_number_integer())
          fail("metadata 'ampc.node_attributes': '" + value + "' has '" + k + "', not an ampc_ attribute with an integer value");
        nodeAttributes_[value][k] = v.get<int64_t>();
      }
    }
  }
  void applyNodeAttributes(Graph& g) const {
    if (nodeAttributes_.empty()) return;
    for (const auto& n : g.nodes()) {
      if (!n->numResults()) continue;
      auto it = nodeAttributes_.find(n->result(0)->name());
      if (it == nodeAttributes_.end()) continue;
      for (const auto& [k, v] : it->second) n->setAttr(k, v);
    }
  }
  // {"initializer": row, ...}; checked against the initializers once they are read.
  void readPadding(const std::string& s) {
    auto j = nlohmann::json::parse(s, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("metadata 'ampc.embedding_padding' is not a JSON object of initializer: row");
    for (const auto& [name, row] : j.items()) {
      if (!row.is_number_integer()) fail("metadata 'ampc.embedding_padding': '" + name + "' is not given an integer row");
      g_->embeddingPadding[name] = row.get<int64_t>();
    }
  }
  void checkPadding() {
    for (const auto& [name, row] : g_->embeddingPadding) {
      const Value* v = g_->lookup(name);
      const std::string from = opts_.embeddingPadding.count(name) ? "--embedding-padding" : "metadata 'ampc.embedding_padding'";
      if (!v || v->kind() != ValueKind::Param) fail(from + " names '" + name + "', which is not an initializer");
      if (v->type().rank() != 2 || row < 0 || row >= v->type().shape[0])
        fail(from + ": row " + std::to_string(row) + " of '" + name + "' " + v->type().str() + " is not a row of a 2-D table");
    }
  }
  // nn.Embedding(padding_idx=R) starts with row R all zeros and never trains it; ONNX keeps no
  // padding_idx, so without the metadata (or --embedding-padding) that row would train. A looked-up
  // table (Gather on axis 0) with exactly one all-zero row and no padding declared gets a note that
  // names both ways to say so.
  void notePaddingLikeRows() {
    std::set<const Value*> seen;
    for (const auto& n : g_->nodes()) {
      if (n->op() != "Gather" || n->numInputs() < 1 || n->getInt("axis", 0) != 0) continue;
      const Value* t = n->input(0);
      if (t->kind() != ValueKind::Param || t->type().rank() != 2 || !isFloat(t->type().dtype) || !t->data() ||
          g_->embeddingPadding.count(t->name()) || !seen.insert(t).second)
        continue;
      const int64_t rows = t->type().shape[0], cols = t->type().shape[1];
      if (rows < 2 || cols < 1) continue;
      int64_t zeroRow = -1, zeros = 0;
      for (int64_t r = 0; r < rows && zeros < 2; ++r) {
        bool zero = true;
        for (int64_t c = 0; zero && c < cols; ++c) zero = t->data()->getDouble(r * cols + c) == 0.0;
        if (zero) zeroRow = r, ++zeros;
      }
      if (zeros != 1) continue;
      g_->importNotes.push_back("embedding table '" + t->name() + "' has one all-zero row, " + std::to_string(zeroRow) +
                                ", as nn.Embedding(padding_idx=" + std::to_string(zeroRow) +
                                ") starts; ONNX keeps no padding_idx, so here that row trains. If it is a padding row, say "
                                "--embedding-padding " + t->name() + "=" + std::to_string(zeroRow) +
                                " (or export with tools/export/ampc_export.py, which records it)");
    }
  }
  static void appendUtf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // A JSON list of strings, as the export helper writes it.
  std::vector<std::string> parseNameList(const std::string& s, const std::string& key) {
    std::vector<std::string> r;
    size_t i = 0;
    auto bad = [&]() { fail("metadata '" + key + "' is not a JSON list of names"); };
    auto ws = [&]() { while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i; };
    ws();
    if (i >= s.size() || s[i++] != '[') bad();
    ws();
    if (i < s.size() && s[i] == ']') return r;
    while (true) {
      ws();
      if (i >= s.size() || s[i++] != '"') bad();
      std::string name;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\') {
          if (++i >= s.size()) bad();
          char e = s[i];
          if (e == 'u') {
            auto hex4 = [&](size_t at) -> unsigned {
              if (at + 4 > s.size() || s.substr(at, 4).find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) bad();
              return static_cast<unsigned>(std::stoul(s.substr(at, 4), nullptr, 16));
            };
            unsigned cp = hex4(i + 1);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair
              if (i + 2 >= s.size() || s[i + 1] != '\\' || s[i + 2] != 'u') bad();
              unsigned lo = hex4(i + 3);
              if (lo < 0xDC00 || lo >= 0xE000) bad();
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              i += 6;
            }
            appendUtf8(name, cp);
          } else {
            name += e == 'n' ? '\n' : e == 't' ? '\t' : e;
          }
        } else {
          name += s[i];
        }
        ++i;
      }
      if (i >= s.size()) bad();
      ++i;
      r.push_back(name);
      ws();
      if (i < s.size() && s[i] == ',') { ++i; continue; }
      if (i < s.size() && s[i] == ']') break;
      bad();
    }
    return r;
  }

  Tensor tensorFromProto(const onnx::TensorProto& p, const std::string& what) { return tensors_.tensorFromProto(p, what); }

  // An initializer's data: from the proto, or (ImportOptions::initializerData) from the caller,
  // for a proto that declares the tensor's type and holds no data of its own.
  Tensor initializer(const onnx::TensorProto& t) {
    const std::string what = "initializer '" + t.name() + "'";
    auto it = opts_.initializerData.find(t.name());
    if (it == opts_.initializerData.end()) return tensors_.tensorFromProto(t, what, /*inModel=*/true);
    const bool hasData = t.has_raw_data() || t.float_data_size() || t.double_data_size() || t.int64_data_size() ||
                         t.int32_data_size() || t.data_location() == onnx::TensorProto::EXTERNAL;
    if (hasData) fail(what + " holds data and is also supplied from outside the model");
    TensorType type{dtypeFromOnnx(t.data_type()).value_or(DType::f32), {t.dims().begin(), t.dims().end()}};
    if (!dtypeFromOnnx(t.data_type()) || it->second.type != type)
      fail(what + " is declared " + type.str() + " but its supplied data is " + it->second.type.str());
    return it->second;
  }

  const onnx::ModelProto& m_;
  std::string file_;
  const ImportOptions& opts_;
  TensorReader tensors_;
  std::unordered_map<std::string, const onnx::ValueInfoProto*> declared_;
  std::vector<onnx::NodeProto> nodes_;  // the graph's nodes, local functions inlined
  std::unordered_map<std::string, std::vector<std::string>> readers_;  // value -> the ops of the nodes that read it
  std::unordered_map<std::string, std::vector<Value*>> sequences_;  // sequence values of static length
  // QuantizeLinear results (by name) that a DequantizeLinear with the same scale and zero point
  // turns into fake quantization with a straight-through gradient.
  struct Quantized {
    Value* x;        // the float input
    Value* inRange;  // round(x / scale) + zero_point within the integer type's range
  };
  std::unordered_map<std::string, Quantized> quantized_;
  std::map<std::string, std::map<std::string, int64_t>> nodeAttributes_;  // metadata 'ampc.node_attributes'

  int trainingBatchNorms_ = 0, trainingFormBatchNorms_ = 0, frozenBatchNorms_ = 0;
  Graph* g_ = nullptr;
};

}  // namespace

Tensor tensorFromOnnx(const onnx::TensorProto& p, const std::string& modelDir, const std::string& file, const std::string& what) {
  return TensorReader(modelDir, file).tensorFromProto(p, what);
}

bool importLowersOp(const std::string& op) { return Importer::lowersOp(op); }
std::optional<std::string_view> importLoweredAttributes(const std::string& op) { return Importer::loweredAttributes(op); }

std::vector<int64_t> parseShapeSpec(const std::string& s) {
  std::vector<int64_t> r;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t x = s.find('x', pos);
    std::string part = s.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    if (part.empty() || part.size() > 15 || part.find_first_not_of("0123456789") != std::string::npos)
      throw Error("bad shape '" + s + "': expected dims like 2x3x32x32");
    r.push_back(std::stoll(part));
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return r;
}

std::unique_ptr<Graph> importOnnxModel(const onnx::ModelProto& model, const std::string& modelDir, const std::string& file,
                                       const ImportOptions& opts) {
  return Importer(model, modelDir, file, opts).run();
}

std::unique_ptr<Graph> importOnnxModel(std::shared_ptr<const onnx::ModelProto> model, const std::string& modelDir,
                                       const std::string& file, const ImportOptions& opts) {
  return Importer(*model, modelDir, file, opts, model).run();
}

namespace {

// The protobuf wire format, just enough to find the initializers' raw data in a mapped .onnx file:
// ModelProto.graph (7) -> GraphProto.initializer (5) -> TensorProto.name (8), raw_data (9).
struct Wire {
  const uint8_t* p;
  const uint8_t* end;
  bool varint(uint64_t& v) {
    v = 0;
    for (int shift = 0; shift < 64 && p < end; shift += 7) {
      const uint8_t b = *p++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // One field: its number, wire type and [begin, end) of the whole field (tag included) and, for a
  // length-delimited field, of its payload.
  bool field(uint32_t& number, int& type, const uint8_t*& begin, const uint8_t*& payload, const uint8_t*& stop) {
    begin = p;
    uint64_t tag, n = 0;
    if (!varint(tag)) return false;
    number = static_cast<uint32_t>(tag >> 3);
    type = static_cast<int>(tag & 7);
    payload = p;
    switch (type) {
      case 0: if (!varint(n)) return false; break;
      case 1: if (end - p < 8) return false; p += 8; break;
      case 5: if (end - p < 4) return false; p += 4; break;
      case 2:
        if (!varint(n) || n > static_cast<uint64_t>(end - p)) return false;
        payload = p;
        p += n;
        break;
      default: return false;  // groups: not in ONNX
    }
    stop = p;
    return true;
  }
};

void putVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void putLen(std::string& out, uint32_t number, const std::string& payload) {
  putVarint(out, (static_cast<uint64_t>(number) << 3) | 2);
  putVarint(out, payload.size());
  out += payload;
}

// The model's bytes without the raw data of its large initializers, which become views of `file`;
// false if the bytes are not a well-formed message (the caller then parses normally, for its error).
bool stripRawData(const Bytes& file, std::string& model, std::map<std::string, Bytes>& views) {
  constexpr size_t kMinView = 4096;  // small tensors stay inline
  const uint8_t* base = file.data();
  auto tensor = [&](const uint8_t* b, const uint8_t* e, std::string& out) {
    Wire w{b, e};
    std::string name;
    const uint8_t *raw = nullptr, *rawEnd = nullptr;
    const uint8_t *fb, *pl, *st;
    uint32_t num;
    int type;
    while (w.p < w.end) {
      if (!w.field(num, type, fb, pl, st)) return false;
      if (num == 8 && type == 2) name.assign(reinterpret_cast<const char*>(pl), st - pl);
      if (num == 9 && type == 2) raw = pl, rawEnd = st;
    }
    if (!raw || static_cast<size_t>(rawEnd - raw) < kMinView || name.empty() || views.count(name)) {
      out.assign(reinterpret_cast<const char*>(b), e - b);
      return true;
    }
    w = Wire{b, e};
    while (w.p < w.end) {
      w.field(num, type, fb, pl, st);
      if (!(num == 9 && type == 2)) out.append(reinterpret_cast<const char*>(fb), st - fb);
    }
    views.emplace(name, file.slice(static_cast<size_t>(raw - base), static_cast<size_t>(rawEnd - raw)));
    return true;
  };
  // Copies the fields of the message [b, e) to out, the length-delimited field `number` rewritten
  // by `inner` (its payload in, its new payload out).
  auto rewrite = [](const uint8_t* b, const uint8_t* e, std::string& out, uint32_t number, const auto& inner) {
    Wire w{b, e};
    const uint8_t *fb, *pl, *st;
    uint32_t num;
    int type;
    while (w.p < w.end) {
      if (!w.field(num, type, fb, pl, st)) return false;
      if (num != number || type != 2) {
        out.append(reinterpret_cast<const char*>(fb), st - fb);
        continue;
      }
      std::string payload;
      if (!inner(pl, st, payload)) return false;
      putLen(out, number, payload);
    }
    return true;
  };
  auto graph = [&](const uint8_t* b, const uint8_t* e, std::string& out) { return rewrite(b, e, out, 5, tensor); };
  return rewrite(base, base + file.size(), model, 7, graph);
}

}  // namespace

std::unique_ptr<Graph> importOnnxFile(const std::string& path, const ImportOptions& opts) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(path + ": no such file");
  const auto size = fs::file_size(path, ec);
  if (ec) throw Error(path + ": could not read the file");
  if (size > static_cast<uintmax_t>(std::numeric_limits<int>::max()))
    throw Error(path + ": larger than 2 GiB; store the weights as external data");
  std::string dir = fs::path(path).parent_path().string();
  // The file is mapped, and the initializers' inline raw data stays there: the graph's tensors view
  // it, and only the rest of the model (its structure) is parsed. So a TorchScript export's weights
  // are neither copied into protobuf strings nor read before they are used.
  auto views = std::make_shared<std::map<std::string, Bytes>>();
  try {
    Bytes file = Bytes::mapFile(path);
    std::string stripped;
    if (stripRawData(file, stripped, *views)) {
      auto model = std::make_shared<onnx::ModelProto>();
      if (model->ParseFromString(stripped)) {
        std::shared_ptr<const onnx::ModelProto> m(std::move(model));
        return Importer(*m, dir, path, opts, m, views.get()).run();
      }
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    // not mappable: parse from the stream below
  }
  // Otherwise parsed from the file in chunks, so the model is in memory once (not also as a byte
  // string), and its initializers' inline data is viewed in place by the graph's tensors.
  auto model = std::make_shared<onnx::ModelProto>();
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": could not read the file");
    google::protobuf::io::FileInputStream in(fd);
    in.SetCloseOnDelete(true);
    const bool ok = model->ParseFromZeroCopyStream(&in) && in.GetErrno() == 0;
    if (!ok) throw Error(path + ": not a valid ONNX model (the protobuf does not parse: truncated or not ONNX)");
  }
  return importOnnxModel(std::shared_ptr<const onnx::ModelProto>(std::move(model)), dir, path, opts);
}

}  // namespace ampc
