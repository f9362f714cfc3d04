#include "runtime/trainer.h"

#include "passes/train_step.h"

namespace ampc {

std::vector<std::pair<Value*, size_t>> stateUpdates(Graph& g) {
  std::vector<std::pair<Value*, size_t>> writeBack;
  const auto& outs = g.outputs();
  const char* metrics[] = {"loss_scale", "found_inf", "grad_norm", "lr"};
  if (outs.size() < 5) throw Error("not a train-step graph: too few outputs");
  for (size_t i = 0; i < 4; ++i)
    if (outs[i + 1]->name() != metrics[i]) throw Error("not a train-step graph: output " + std::to_string(i + 1) + " is '" + outs[i + 1]->name() + "'");
  const std::string suffix = kNextSuffix;
  for (size_t i = 5; i < outs.size(); ++i) {
    const std::string& n = outs[i]->name();
    if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0)
      throw Error("not a train-step graph: output '" + n + "' is not a state update");
    Value* state = g.lookup(n.substr(0, n.size() - suffix.size()));
    if (!state || state->kind() != ValueKind::Param || state->type() != outs[i]->type())
      throw Error("train-step output '" + n + "' does not match a param of its type");
    writeBack.emplace_back(state, i);
  }
  return writeBack;
}

Trainer::Trainer(Graph& g, Backend& backend) : g_(g), backend_(backend), writeBack_(stateUpdates(g)) {}

Trainer::Metrics Trainer::step(const std::map<std::string, Tensor>& batch, ExecOptions opts) {
  auto outs = evaluate(g_, batch, backend_, opts, {}, observe_);
  Metrics m;
  m.loss = outs[0].getDouble(0);
  m.lossScale = outs[1].getDouble(0);
  m.skipped = outs[2].getInt(0) != 0;
  m.gradNorm = outs[3].getDouble(0);
  m.lr = outs[4].getDouble(0);
  for (auto& [state, i] : writeBack_) state->setData(std::move(outs[i]));
  return m;
}

}  // namespace ampc
