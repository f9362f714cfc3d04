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
#include "passes/memory_plan.h"
#include "runtime/plan.pb.h"  // generated from runtime/plan.proto
#include <cstring>
#include <set>

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
    for (const char* s : {".momentum", ".adam_m", ".adam_v"})
      if (n.size() > std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0) return plan::OPTIMIZER_STATE;
    return plan::BUFFER;
  }
  return plan::CONSTANT;
}

std::string serialize(const Graph& g) {
  std::string bytes;
  if (!exportOnnx(g).SerializeToString(&bytes)) throw Error("plan: cannot serialize the graph");
  return bytes;
}

// Plan.checksum: FNV-1a 64 of the bytes before it, and its field as the file's last 9 bytes.
uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}
constexpr unsigned char kChecksumTag = (15 << 3) | 1;  // field 15, wire type fixed64
std::string checksumField(uint64_t h) {
  std::string f(1, static_cast<char>(kChecksumTag));
  for (int i = 0; i < 8; ++i) f.push_back(static_cast<char>((h >> (8 * i)) & 0xff));
  return f;
}
}  // namespace

void writePlan(const std::string& path, const Graph& forward, const TrainOptions& o, const std::string& source) {
  plan::Plan p;
  p.set_format_version(kPlanFormatVersion);
  p.set_producer("ampc");
  p.set_source(source);
  const std::string evalBytes = serialize(forward);
  p.set_eval_model(evalBytes);
  onnx::ModelProto copy;
  copy.ParseFromString(evalBytes);
  auto step = importOnnxModel(copy, "", source);
  createTrainStepPass(o)->run(*step);
  p.set_step_model(serialize(*step));

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
  c->set_batch_size(forward.inputs().empty() || forward.inputs()[0]->type().rank() == 0 ? 1 : forward.inputs()[0]->type().shape[0]);

  std::string bytes;
  if (!p.SerializeToString(&bytes)) throw Error(path + ": cannot serialize the plan");
  bytes += checksumField(fnv1a64(bytes));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !out.flush()) {
      std::remove(tmp.c_str());
      throw Error(path + ": cannot write the plan");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": rename failed: " + ec.message());
}

LoadedPlan readPlan(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(path + ": cannot read the plan");
  plan::Plan p;
  if (!p.ParseFromString(bytes) || p.format_version() == 0 || p.step_model().empty())
    throw Error(path + ": not an ampc plan (truncated, or not written by ampc)");
  if (p.format_version() > kPlanFormatVersion)
    throw Error(path + ": plan format version " + std::to_string(p.format_version()) + " is newer than this amprun reads (" +
                std::to_string(kPlanFormatVersion) + "); recompile the model with this ampc or update amprun");
  if (p.format_version() >= 2) {
    const size_t body = bytes.size() >= 9 ? bytes.size() - 9 : 0;
    if (bytes.size() < 9 || bytes.compare(body, 9, checksumField(p.checksum())) != 0 ||
        fnv1a64(std::string_view(bytes).substr(0, body)) != p.checksum())
      throw Error(path + ": the plan is truncated or altered (its checksum does not match); compile the model again");
  }
  LoadedPlan r;
  onnx::ModelProto m;
  if (!m.ParseFromString(p.step_model())) throw Error(path + ": the step graph does not parse");
  r.step = importOnnxModel(m, "", path);
  if (!p.eval_model().empty()) {
    onnx::ModelProto e;
    if (!e.ParseFromString(p.eval_model())) throw Error(path + ": the eval graph does not parse");
    r.eval = importOnnxModel(e, "", path);
  }
  const auto& c = p.config();
  auto& o = r.options;
  o.precision = dtypeFromName(c.precision()).value_or(DType::f32);
  o.optimizer = c.optimizer();
  o.lr = c.lr();
  o.schedule = c.schedule();
  o.lossScale = c.loss_scale();
  r.batchSize = c.batch_size();
  r.source = p.source();
  std::ostringstream d;
  d << "plan " << path << ": format " << p.format_version() << ", from " << p.source() << "\n"
    << "config: precision " << c.precision() << ", optimizer " << c.optimizer() << ", lr " << c.lr() << " (" << c.schedule()
    << ", warmup " << c.warmup() << ", total " << c.total() << "), momentum " << c.momentum() << (c.nesterov() ? " nesterov" : "")
    << ", weight decay " << c.weight_decay() << ", betas " << c.beta1() << "/" << c.beta2() << ", eps " << c.eps()
    << ", clip-norm " << c.clip_norm() << "\n"
    << "loss scale: " << c.loss_scale() << " (init " << c.init_scale() << ", growth x" << c.growth_factor() << " every "
    << c.growth_interval() << ", backoff x" << c.backoff_factor() << ", hysteresis " << c.hysteresis() << ", min " << c.min_scale()
    << ", max " << c.max_scale() << "), batch " << c.batch_size() << "\n"
    << "arena: " << p.arena_bytes() << " bytes of activations\n"
    << "tensors:\n";
  for (const auto& t : p.tensors()) {
    d << "  " << plan::Role_Name(t.role()) << " " << t.name() << " : " << t.dtype() << "[";
    for (int i = 0; i < t.shape_size(); ++i) d << (i ? "," : "") << t.shape(i);
    d << "]";
    if (t.role() == plan::ACTIVATION) d << " @" << t.offset();
    d << "\n";
  }
  d << "steps: " << p.steps_size() << "\n";
  for (int i = 0; i < p.steps_size(); ++i)
    d << "  " << i << ": " << p.steps(i).op() << " " << p.steps(i).node() << "  <- " << p.steps(i).source_node() << "\n";
  r.dump = d.str();
  return r;
}

}  // namespace ampc
