#include "passes/train_step.h"

#include <regex>

#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "passes/autocast.h"

namespace ampc {
namespace {

class TrainStepPass : public Pass {
 public:
  explicit TrainStepPass(TrainOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "train-step"; }

  bool run(Graph& g) override {
    const std::string mode = o_.lossScale == "auto" ? (o_.precision == DType::f16 ? "dynamic" : "none") : o_.lossScale;
    double staticScale = 1;
    if (mode != "dynamic" && mode != "none") {
      try {
        staticScale = std::stod(mode);
      } catch (const std::exception&) {
        throw Error("--loss-scale wants dynamic, none or a number, got '" + mode + "'");
      }
      if (!(staticScale > 0)) throw Error("--loss-scale must be positive");
    }
    if (o_.optimizer != "sgd" && o_.optimizer != "adam" && o_.optimizer != "adamw" && o_.optimizer != "lamb")
      throw Error("unknown optimizer '" + o_.optimizer + "' (use sgd, adam, adamw or lamb)");
    g.domainOpsets.emplace(kGradDomain, 1);

    // Scaler and optimizer state.
    Value* scale = g.addParam("ampc.loss_scale", Tensor::fromDoubles(DType::f32, {}, {mode == "dynamic" ? o_.initScale : staticScale}));
    Value* growth = g.addParam("ampc.growth_tracker", Tensor::fromInts(DType::i64, {}, {0}));
    Value* hyst = g.addParam("ampc.hysteresis_left", Tensor::fromInts(DType::i64, {}, {o_.hysteresis}));
    Value* step = g.addParam("ampc.step", Tensor::fromInts(DType::i64, {}, {0}));
    // BatchNorm's running statistics: the state results of ops with state operands.
    std::vector<std::pair<Value*, Value*>> updates;
    for (const auto& n : g.nodes()) {
      const OpDef* d = n->def();
      if (!d || !d->stateOperands) continue;
      size_t r = 1;  // state results follow the op's first result, in operand order
      for (size_t i = 0; i < n->numInputs(); ++i)
        if ((d->stateOperands >> i & 1) && n->input(i) && n->input(i)->kind() == ValueKind::Param && r < n->numResults())
          updates.emplace_back(n->input(i), n->result(r++));
    }

    if (o_.accumulate < 1 || o_.accumulate > (int64_t{1} << 20)) throw Error("--accumulate wants 1 to 2^20 micro-batches per step");
    const int64_t nAcc = o_.accumulate;
    auto scalar = [&](const std::string& base, Tensor t) { return g.addParam(g.uniqueName(base), std::move(t)); };
    auto op = [&](const std::string& name, const std::vector<Value*>& ins, const std::string& base) {
      Node* n = g.createNode(name, "", ins, {{g.uniqueName(base), TensorType{}}});
      n->setName(n->result(0)->name());  // unique, as its result's name
      n->result(0)->setType(inferTypes(*n)[0]);
      return n->result(0);
    };
    // Backward, seeded with S.
    AutodiffOptions ad = o_.autodiff;
    if (mode != "none") ad.seed = scale->name();
    createAutodiffPass(ad)->run(g);
    // The backward's casts (gradients of the forward's) get the same cleanup as the forward's.
    createCastCleanupPass()->run(g);
    // Accumulation: the micro-step counter m in [0, N); this run applies the window when m + 1 == N.
    // The counter is an f32 (exact to 2^24): a Param of an integer type is a compile-time constant
    // to the passes (Value::constData), which would fold the counting away. (Made after the
    // backward, whose clean-up would drop nodes nothing reads yet.)
    Value* apply = nullptr;
    if (nAcc > 1) {
      auto f32 = [](double v) { return Tensor::fromDoubles(DType::f32, {}, {v}); };
      Value* micro = g.addParam("ampc.micro_step", f32(0));
      Value* m1 = op("Add", {micro, scalar("accumulate.one", f32(1))}, "ampc/accumulate/count");
      apply = op("Equal", {m1, scalar("accumulate.n", f32(static_cast<double>(nAcc)))}, "ampc/accumulate/apply");
      updates.emplace_back(micro, op("Where", {apply, scalar("accumulate.restart", f32(0)), m1}, "ampc/accumulate/next"));
    }
    Value* loss = g.outputs()[0];
    std::vector<Value*> params, grads;
    for (size_t i = 1; i < g.outputs().size(); ++i) {
      const std::string& n = g.outputs()[i]->name();
      params.push_back(g.lookup(n.substr(0, n.size() - 5)));  // "<param>_grad"
      grads.push_back(g.outputs()[i]);
    }

    auto node = [&](const std::string& op, const std::vector<Value*>& ins, size_t nOut, const std::string& base,
                    std::map<std::string, Attribute> attrs = {}) {
      std::vector<std::pair<std::string, TensorType>> res;
      for (size_t i = 0; i < nOut; ++i) res.emplace_back(g.uniqueName(base + (nOut > 1 ? "." + std::to_string(i) : "")), TensorType{});
      Node* n = g.createNode(op, kGradDomain, ins, res);
      n->setName(base);
      for (auto& [k, a] : attrs) n->setAttr(k, std::move(a));
      auto types = inferTypes(*n);
      std::vector<Value*> out;
      for (size_t i = 0; i < nOut; ++i) {
        n->result(i)->setType(types[i]);
        out.push_back(n->result(i));
      }
      return out;
    };
    // Accumulation: each gradient is added to its accumulator (the window's sum so far, f32), which
    // the applying run clears; the sum is what the rest of the step reads.
    if (nAcc > 1) {
      Value* zero = scalar("accumulate.zero", Tensor::fromDoubles(DType::f32, {}, {0.0}));
      for (size_t i = 0; i < grads.size(); ++i) {
        if (grads[i]->type().dtype != DType::f32) throw Error("train-step: gradient '" + grads[i]->name() + "' is " + grads[i]->type().str() + ", not f32");
        Value* acc = g.addParam(params[i]->name() + ".grad_accum", Tensor(grads[i]->type()));
        Value* sum = op("Add", {acc, grads[i]}, "ampc/accumulate/" + params[i]->name());
        updates.emplace_back(acc, op("Where", {apply, zero, sum}, "ampc/accumulate/clear/" + params[i]->name()));
        grads[i] = sum;
      }
    }
    Value* inv = g.createNode("Reciprocal", "", {scale}, {{g.uniqueName("ampc.inv_scale"), scale->type()}})->result(0);
    if (nAcc > 1)  // the window's sum unscaled to its mean
      inv = op("Mul", {inv, scalar("accumulate.inv_n", Tensor::fromDoubles(DType::f32, {}, {1.0 / static_cast<double>(nAcc)}))}, "ampc/accumulate/mean");
    std::vector<Value*> ins{inv};
    ins.insert(ins.end(), grads.begin(), grads.end());
    auto unscaled = node("UnscaleCheck", ins, grads.size() + 1, "ampc/unscale");
    Value* found = unscaled.back();
    unscaled.pop_back();
    ins = {found};
    ins.insert(ins.end(), unscaled.begin(), unscaled.end());
    auto clipped = node("ClipByGlobalNorm", ins, grads.size() + 1, "ampc/clip", {{"max_norm", o_.clipNorm}});
    Value* norm = clipped.back();
    clipped.pop_back();
    // What the updates skip on: an overflow, and with accumulation every run but a window's last.
    // found_inf (the metric) stays the check's: on a window's last run, that of the whole window.
    Value* skip = nAcc > 1 ? op("Or", {found, op("Not", {apply}, "ampc/accumulate/hold")}, "ampc/accumulate/skip") : found;
    Value* nextStep = node("StepIncrement", {step, skip}, 1, "ampc/step")[0];
    Value* lr = node("LearningRate", {nextStep}, 1, "ampc/lr",
                     {{"lr", o_.lr}, {"schedule", o_.schedule}, {"warmup", o_.warmup}, {"total", o_.total}})[0];
    updates.emplace_back(step, nextStep);

    std::unique_ptr<std::regex> noDecay;
    if (!o_.noDecay.empty() && o_.noDecay != "1d") try {
        noDecay = std::make_unique<std::regex>(o_.noDecay);
      } catch (const std::regex_error& e) {
        throw Error("--no-decay: bad regex '" + o_.noDecay + "': " + e.what());
      }
    std::vector<std::pair<Value*, Value*>> nextParams;  // each parameter and its updated value
    for (size_t i = 0; i < params.size(); ++i) {
      Value* p = params[i];
      const bool decays = o_.noDecay.empty() || (noDecay ? !std::regex_match(p->name(), *noDecay) : p->type().rank() >= 2);
      const float weightDecay = decays ? o_.weightDecay : 0.0f;
      if (p->type().dtype != DType::f32) throw Error("train-step: parameter '" + p->name() + "' is " + p->type().str() + "; master weights must be f32");
      auto zeros = [&](const std::string& what) { return g.addParam(p->name() + "." + what, Tensor(p->type())); };
      const std::string base = "ampc/opt/" + p->name();
      if (o_.optimizer == "sgd") {
        // A momentum buffer only with momentum, as PyTorch's SGD keeps one.
        Value* buf = o_.momentum != 0.0f ? zeros("momentum") : nullptr;
        auto r = node("SGD", {p, clipped[i], buf, lr, skip}, buf ? 2 : 1, base,
                      {{"momentum", o_.momentum}, {"nesterov", int64_t{o_.nesterov}}, {"weight_decay", weightDecay}});
        updates.emplace_back(p, r[0]);
        nextParams.emplace_back(p, r[0]);
        if (buf) updates.emplace_back(buf, r[1]);
      } else {
        Value* m = zeros("adam_m");
        Value* v = zeros("adam_v");
        auto r = node("Adam", {p, clipped[i], m, v, lr, nextStep, skip}, 3, base,
                      {{"beta1", o_.beta1}, {"beta2", o_.beta2}, {"eps", o_.eps}, {"weight_decay", weightDecay},
                       {"decoupled", int64_t{o_.optimizer == "adamw"}}, {"lamb", int64_t{o_.optimizer == "lamb"}}});
        updates.emplace_back(p, r[0]);
        nextParams.emplace_back(p, r[0]);
        updates.emplace_back(m, r[1]);
        updates.emplace_back(v, r[2]);
      }
    }
    // An exponential moving average of every parameter (timm's ModelEmaV2): from the initial values,
    // ema += (1 - decay) (p' - ema) on every step the optimizer takes (none on a skipped step, nor
    // on a run inside an accumulation window).
    if (o_.ema != 0.0f) {
      if (!(o_.ema > 0.0f && o_.ema < 1.0f)) throw Error("--ema wants a decay in (0, 1), got " + std::to_string(o_.ema));
      Value* rate = scalar("ema.rate", Tensor::fromDoubles(DType::f32, {}, {1.0 - static_cast<double>(o_.ema)}));
      for (auto& [p, next] : nextParams) {
        if (!p->data()) throw Error("train-step: parameter '" + p->name() + "' has no initial value for --ema");
        Value* e = g.addParam(p->name() + ".ema", *p->data());
        Value* moved = op("Add", {e, op("Mul", {op("Sub", {next, e}, "ampc/ema/" + p->name()), rate}, "ampc/ema/" + p->name())},
                          "ampc/ema/" + p->name());
        updates.emplace_back(e, op("Where", {skip, e, moved}, "ampc/ema/" + p->name()));
      }
    }
    if (mode == "dynamic") {
      auto r = node("ScalerUpdate", {scale, growth, hyst, found}, 3, "ampc/scaler",
                    {{"growth_factor", o_.growthFactor}, {"backoff_factor", o_.backoffFactor}, {"growth_interval", o_.growthInterval},
                     {"hysteresis", o_.hysteresis}, {"min_scale", o_.minScale}, {"max_scale", o_.maxScale}});
      if (nAcc > 1)  // the scaler moves once a window, on its last run's check
        for (int i = 0; i < 3; ++i) r[i] = op("Where", {apply, r[i], std::vector<Value*>{scale, growth, hyst}[i]}, "ampc/accumulate/scaler");
      updates.emplace_back(scale, r[0]);
      updates.emplace_back(growth, r[1]);
      updates.emplace_back(hyst, r[2]);
    }

    // Outputs: the metrics, then every state's next value under "<state>.next".
    g.clearOutputs();
    auto output = [&](Value* v, const std::string& name) {
      if (g.lookup(name)) throw Error("train-step: the graph already has a value named '" + name + "'");
      Value* o = g.createNode("Identity", "", {v}, {{name, v->type()}})->result(0);
      g.addOutput(o);
    };
    g.addOutput(loss);
    output(scale, "loss_scale");
    output(found, "found_inf");
    output(norm, "grad_norm");
    output(lr, "lr");
    for (auto& [state, next] : updates) output(next, state->name() + kNextSuffix);
    createDcePass()->run(g);
    return true;
  }

 private:
  TrainOptions o_;
};

}  // namespace

std::unique_ptr<Pass> createTrainStepPass(const TrainOptions& opts) { return std::make_unique<TrainStepPass>(opts); }

}  // namespace ampc
