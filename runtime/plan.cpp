#include "runtime/plan.h"

#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>

#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "compiler/target.h"
#include "passes/memory_plan.h"
#include "runtime/plan.pb.h"  // generated from runtime/plan.proto
#if __has_include(<google/protobuf/stubs/logging.h>)
#include <google/protobuf/stubs/logging.h>
#define AMPC_PROTOBUF_SILENCER 1
#endif
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "runtime/hash.h"
#include "runtime/safetensors.h"

namespace ampc {
namespace {

const char* kStepOps[] = {"SGD", "Adam"};

plan::Role roleOf(const Value* v, const std::set<const Value*>& trained, const std::set<const Value*>& stateful) {
  if (v->kind() == ValueKind::Input) return plan::INPUT;
  const std::string& n = v->name();
  if (n == "ampc.step") return plan::STEP;
  if (n.rfind("ampc.", 0) == 0) return plan::SCALER_STATE;
  if (trained.count(v)) return plan::PARAM;
  if (stateful.count(v)) {
    for (const char* s : {".momentum", ".adam_m", ".adam_v", ".grad_accum", ".ema"})
      if (n.size() > std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0) return plan::OPTIMIZER_STATE;
    return plan::BUFFER;
  }
  return plan::CONSTANT;
}

// A graph without its initializers' data (that goes to the weights file).
std::string serialize(const Graph& g) {
  std::string bytes;
  if (!exportOnnx(g, ExportOptions{.initializerData = false}).SerializeToString(&bytes))
    throw Error("plan: cannot serialize the graph");
  return bytes;
}

// The data of every initializer of `g`, shared (not copied), for ImportOptions::initializerData.
std::map<std::string, Tensor> initializersOf(const Graph& g) {
  std::map<std::string, Tensor> r;
  for (const Value* v : g.params())
    if (v->data()) r.emplace(v->name(), *v->data());
  return r;
}

bool allZero(const Tensor& t) {
  if (t.data.knownZero()) return !t.data.empty();
  const uint8_t* p = t.data.data();
  const size_t n = t.data.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w) return false;
  }
  for (; i < n; ++i)
    if (p[i]) return false;
  return n > 0;
}

std::string weightsPathOf(const std::string& planPath, const std::string& file) {
  return (std::filesystem::path(planPath).parent_path() / file).string();
}

// Plan.checksum: XXH3-64 of the bytes before it, and its field as the file's last 9 bytes.
uint64_t planHash(std::string_view bytes) { return hash64(bytes.data(), bytes.size()); }
constexpr unsigned char kChecksumTag = (15 << 3) | 1;  // field 15, wire type fixed64
std::string checksumField(uint64_t h) {
  std::string f(1, static_cast<char>(kChecksumTag));
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  return f;
}

// The plan at `path`, checked: a plan, in a format this reads, its checksum intact.
plan::Plan readChecked(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(path + ": cannot read the plan");
  plan::Plan p;
#ifdef AMPC_PROTOBUF_SILENCER
  const google::protobuf::LogSilencer quiet;  // a file that is no plan gets our error alone, not protobuf's log line
#endif
  if (!p.ParseFromString(bytes) || p.format_version() == 0 || p.step_model().empty())
    throw Error(path + ": not an ampc plan (truncated, or not written by ampc)");
  if (p.format_version() > kPlanFormatVersion)
    throw Error(path + ": plan format version " + std::to_string(p.format_version()) + " is newer than this amprun reads (" +
                std::to_string(kPlanFormatVersion) + "); recompile the model with this ampc or update amprun");
  if (p.format_version() < kOldestPlanFormat)
    throw Error(path + ": plan format version " + std::to_string(p.format_version()) + " is older than this amprun reads (" +
                std::to_string(kOldestPlanFormat) + " to " + std::to_string(kPlanFormatVersion) + "); compile the model again");
  {
    const size_t body = bytes.size() >= 9 ? bytes.size() - 9 : 0;
    if (bytes.size() < 9 || bytes.compare(body, 9, checksumField(p.checksum())) != 0 ||
        planHash(std::string_view(bytes).substr(0, body)) != p.checksum())
      throw Error(path + ": the plan is truncated or altered (its checksum does not match); compile the model again");
  }
  return p;
}

// The plan's bytes, its checksum last (Plan.checksum).
std::string sealed(plan::Plan& p, const std::string& path) {
  p.clear_checksum();
  std::string bytes;
  if (!p.SerializeToString(&bytes)) throw Error(path + ": cannot serialize the plan");
  return bytes + checksumField(planHash(bytes));
}

// `bytes` as the file at `path`, whole or not at all (written beside it, then renamed over it).
void writeAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  auto failed = [&](const std::string& why) {
    std::remove(tmp.c_str());
    throw Error(path + ": " + why);
  };
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !out.flush()) failed("cannot write the plan");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) failed("rename failed: " + ec.message());
}
}  // namespace

int writePlan(const std::string& path, const Graph& forward, const TrainOptions& o, const std::string& source,
              const KernelGenerator& generate) {
  plan::Plan p;
  p.set_format_version(kPlanFormatVersion);
  p.set_producer("ampc");
  p.set_source(source);
  const std::string evalBytes = serialize(forward);
  p.set_eval_model(evalBytes);
  onnx::ModelProto copy;
  copy.ParseFromString(evalBytes);
  ImportOptions shared;
  shared.ampcGraph = true;
  shared.initializerData = initializersOf(forward);  // the step graph shares the weights
  auto step = importOnnxModel(copy, "", source, shared);
  createTrainStepPass(o)->run(*step);
  const int withoutKernel = lowerStep(*step, o, generate);
  p.set_step_model(serialize(*step));

  // The weights file: every initializer of the step graph (the forward's are among them) once,
  // except those that start at zero (optimizer state, zero biases), which the reader recreates.
  Safetensors weights;
  std::set<std::string> zeros;
  for (const Value* v : step->params()) {
    if (!v->data()) throw Error(path + ": initializer '" + v->name() + "' has no data");
    if (allZero(*v->data())) zeros.insert(v->name());
    else weights.tensors.emplace(v->name(), *v->data());
  }
  std::random_device rd;
  char id[33];
  std::snprintf(id, sizeof id, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  weights.metadata["ampc.plan"] = id;
  const std::string weightsFile = std::filesystem::path(path).filename().string() + ".safetensors";
  p.set_weights_file(weightsFile);
  p.set_weights_id(id);

  std::set<const Value*> trained, stateful;
  for (const auto& n : step->nodes())
    for (const char* op : kStepOps)
      if (n->op() == op) trained.insert(n->input(0));
  for (const Value* out : step->outputs()) {
    const std::string& n = out->name();
    const std::string suffix = kNextSuffix;
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      if (const Value* s = step->lookup(n.substr(0, n.size() - suffix.size()))) stateful.insert(s);
  }
  for (const auto* list : {&step->inputs(), &step->params()})
    for (const Value* v : *list) {
      auto* t = p.add_tensors();
      t->set_name(v->name());
      t->set_role(roleOf(v, trained, stateful));
      t->set_dtype(std::string(dtypeName(v->type().dtype)));
      for (int64_t d : v->type().shape) t->add_shape(d);
      if (zeros.count(v->name())) t->set_zeros(true);
    }
  const MemoryPlan mem = planMemory(*step);
  checkMemoryPlan(mem);
  p.set_arena_bytes(mem.arenaBytes);
  for (const auto& n : step->nodes())
    for (size_t i = 0; i < n->numResults(); ++i) {
      const Value* v = n->result(i);
      auto* t = p.add_tensors();
      t->set_name(v->name());
      t->set_role(plan::ACTIVATION);
      t->set_dtype(std::string(dtypeName(v->type().dtype)));
      for (int64_t d : v->type().shape) t->add_shape(d);
      t->set_offset(mem.slots.at(v).offset);
    }
  for (const auto& n : step->nodes()) {
    auto* s = p.add_steps();
    s->set_op(n->qualifiedOp());
    s->set_node(n->name());
    const auto k = n->name().find("_grad/");
    s->set_source_node(k == std::string::npos ? n->name() : n->name().substr(0, k));
  }
  auto* c = p.mutable_config();
  c->set_precision(std::string(dtypeName(o.precision)));
  c->set_optimizer(o.optimizer);
  c->set_lr(o.lr);
  c->set_schedule(o.schedule);
  c->set_warmup(o.warmup);
  c->set_total(o.total);
  c->set_momentum(o.momentum);
  c->set_nesterov(o.nesterov);
  c->set_weight_decay(o.weightDecay);
  c->set_beta1(o.beta1);
  c->set_beta2(o.beta2);
  c->set_eps(o.eps);
  c->set_clip_norm(o.clipNorm);
  c->set_loss_scale(o.lossScale == "auto" ? (o.precision == DType::f16 ? "dynamic" : "none") : o.lossScale);
  c->set_init_scale(o.initScale);
  c->set_growth_factor(o.growthFactor);
  c->set_backoff_factor(o.backoffFactor);
  c->set_growth_interval(o.growthInterval);
  c->set_hysteresis(o.hysteresis);
  c->set_min_scale(o.minScale);
  c->set_max_scale(o.maxScale);
  c->set_target(findTarget(o.target).name);
  c->set_accumulate(o.accumulate);
  c->set_no_decay(o.noDecay);
  c->set_batch_size(forward.inputs().empty() || forward.inputs()[0]->type().rank() == 0 ? 1 : forward.inputs()[0]->type().shape[0]);

  const std::string bytes = sealed(p, path);
  // The weights first, then the plan, each atomically; if the plan cannot be written, its new
  // weights file goes too, so a failed compile leaves no output behind.
  const std::string weightsPath = weightsPathOf(path, weightsFile);
  writeSafetensors(weightsPath, weights);
  try {
    writeAtomically(path, bytes);
  } catch (const Error&) {
    std::remove(weightsPath.c_str());
    throw;
  }
  return withoutKernel;
}

LoadedPlan readPlan(const std::string& path) {
  const plan::Plan p = readChecked(path);
  std::error_code ec;
  LoadedPlan r;
  // The initial state: views of the mapped weights file (checked tensor by tensor), and zeros.
  ImportOptions io;
  io.ampcGraph = true;
  {
    const std::string& wf = p.weights_file();
    if (wf.empty() || wf.find('/') != std::string::npos || wf == "." || wf == "..")
      throw Error(path + ": the plan names a bad weights file '" + wf + "'");
    const std::string wpath = weightsPathOf(path, wf);
    if (!std::filesystem::is_regular_file(wpath, ec))
      throw Error(path + ": its weights file '" + wpath + "' is missing (a plan travels with its .safetensors)");
    Safetensors w = readSafetensors(wpath);
    auto id = w.metadata.find("ampc.plan");
    if (id == w.metadata.end() || id->second != p.weights_id())
      throw Error(path + ": '" + wpath + "' holds the weights of another compile (plan id " + p.weights_id() + ", file " +
                  (id == w.metadata.end() ? std::string("none") : id->second) + "); compile the model again");
    for (const auto& t : p.tensors()) {
      if (t.role() == plan::ACTIVATION || t.role() == plan::INPUT) continue;
      auto dt = dtypeFromName(t.dtype());
      if (!dt) throw Error(path + ": tensor '" + t.name() + "' has an unknown dtype '" + t.dtype() + "'");
      TensorType type{*dt, {t.shape().begin(), t.shape().end()}};
      if (!type.sizeFits()) throw Error(path + ": tensor '" + t.name() + "' has a bad shape");
      if (t.zeros()) {
        io.initializerData.emplace(t.name(), Tensor(type));
        continue;
      }
      auto it = w.tensors.find(t.name());
      if (it == w.tensors.end()) throw Error(path + ": '" + wpath + "' has no tensor '" + t.name() + "'");
      if (it->second.type != type)
        throw Error(path + ": tensor '" + t.name() + "' is " + it->second.type.str() + " in '" + wpath + "', the plan says " + type.str());
      io.initializerData.emplace(t.name(), std::move(it->second));
    }
  }
  onnx::ModelProto m;
  if (!m.ParseFromString(p.step_model())) throw Error(path + ": the step graph does not parse");
  r.step = importOnnxModel(m, "", path, io);
  if (!p.eval_model().empty()) {
    onnx::ModelProto e;
    if (!e.ParseFromString(p.eval_model())) throw Error(path + ": the eval graph does not parse");
    r.eval = importOnnxModel(e, "", path, io);
  }
  // The structure the runtime relies on, checked before anything runs: both graphs, and the five
  // metrics (loss, loss_scale, found_inf, grad_norm, lr) as one element each.
  if (!r.eval) throw Error(path + ": the plan has no forward graph (eval_model); compile the model again");
  if (r.step->outputs().size() < 5) throw Error(path + ": the step graph has fewer than the 5 metric outputs");
  for (size_t i = 0; i < 5; ++i)
    if (r.step->outputs()[i]->type().numel() != 1)
      throw Error(path + ": metric output '" + r.step->outputs()[i]->name() + "' is " + r.step->outputs()[i]->type().str() +
                  ", not one element");
  const auto& c = p.config();
  auto& o = r.options;
  o.precision = dtypeFromName(c.precision()).value_or(DType::f32);
  o.optimizer = c.optimizer();
  o.lr = c.lr();
  o.schedule = c.schedule();
  o.lossScale = c.loss_scale();
  o.target = c.target().empty() ? "cuda" : c.target();
  o.accumulate = std::max<int64_t>(c.accumulate(), 1);
  o.noDecay = c.no_decay();
  if (o.accumulate > 1 && !r.step->lookup("ampc.micro_step"))
    throw Error(path + ": the plan says " + std::to_string(o.accumulate) + " micro-batches a step, but its step graph has no micro-step counter");
  try {
    findTarget(o.target);  // a target this amprun does not know is refused, with the known ones
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  r.batchSize = c.batch_size();
  r.source = p.source();
  r.tuning.device = p.tuning().device();
  r.tuning.attention.insert(p.tuning().attention().begin(), p.tuning().attention().end());
  r.tuning.algorithms.insert(p.tuning().algorithms().begin(), p.tuning().algorithms().end());
  std::ostringstream d;
  d << "plan " << path << ": format " << p.format_version() << ", from " << p.source() << "\n"
    << "config: precision " << c.precision() << ", optimizer " << c.optimizer() << ", lr " << c.lr() << " (" << c.schedule()
    << ", warmup " << c.warmup() << ", total " << c.total() << "), momentum " << c.momentum() << (c.nesterov() ? " nesterov" : "")
    << ", weight decay " << c.weight_decay() << (c.no_decay().empty() ? "" : " (none for " + c.no_decay() + ")") << ", betas " << c.beta1() << "/" << c.beta2() << ", eps " << c.eps()
    << ", clip-norm " << c.clip_norm() << "\n"
    << "loss scale: " << c.loss_scale() << " (init " << c.init_scale() << ", growth x" << c.growth_factor() << " every "
    << c.growth_interval() << ", backoff x" << c.backoff_factor() << ", hysteresis " << c.hysteresis() << ", min " << c.min_scale()
    << ", max " << c.max_scale() << "), batch " << c.batch_size()
    << (r.options.accumulate > 1 ? " x " + std::to_string(r.options.accumulate) + " micro-batches a step" : std::string())
    << ", target " << r.options.target << "\n"
    << "arena: " << p.arena_bytes() << " bytes of activations\n"
    << "tensors:\n";
  for (const auto& t : p.tensors()) {
    d << "  " << plan::Role_Name(t.role()) << " " << t.name() << " : " << t.dtype() << "[";
    for (int i = 0; i < t.shape_size(); ++i) d << (i ? "," : "") << t.shape(i);
    d << "]";
    if (t.role() == plan::ACTIVATION) d << " @" << t.offset();
    d << "\n";
  }
  if (!r.tuning.attention.empty() || !r.tuning.algorithms.empty()) {
    d << "tuning (amprun --tune) on " << r.tuning.device << ":\n";
    for (const auto& [shape, choice] : r.tuning.attention) d << "  fused attention " << shape << ": " << choice << "\n";
    for (const auto& [key, choice] : r.tuning.algorithms) d << "  " << key << ": algorithm " << choice << "\n";
  }
  d << "steps: " << p.steps_size() << "\n";
  for (int i = 0; i < p.steps_size(); ++i)
    d << "  " << i << ": " << p.steps(i).op() << " " << p.steps(i).node() << "  <- " << p.steps(i).source_node() << "\n";
  r.dump = d.str();
  return r;
}

void storeTuning(const std::string& path, const Tuning& t) {
  plan::Plan p = readChecked(path);
  auto* pt = p.mutable_tuning();
  pt->Clear();
  pt->set_device(t.device);
  for (const auto& [shape, choice] : t.attention) (*pt->mutable_attention())[shape] = choice;
  for (const auto& [key, choice] : t.algorithms) (*pt->mutable_algorithms())[key] = choice;
  writeAtomically(path, sealed(p, path));
}

}  // namespace ampc
