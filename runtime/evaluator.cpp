#include "runtime/evaluator.h"

#include <unordered_map>

namespace ampc {

std::vector<Tensor> evaluate(const Graph& g, const std::map<std::string, Tensor>& inputs, Backend& backend,
                             const ExecOptions& opts, const std::vector<const Value*>& extra, const NodeObserver& observe) {
  std::unordered_map<const Value*, Tensor> live;          // node results still needed
  std::unordered_map<const Value*, const Tensor*> fixed;  // inputs, params, consts
  for (const Value* v : g.inputs()) {
    auto it = inputs.find(v->name());
    if (it == inputs.end()) throw Error("input '" + v->name() + "' (" + v->type().str() + ") was not given");
    if (it->second.type != v->type())
      throw Error("input '" + v->name() + "' is " + it->second.type.str() + "; the graph wants " + v->type().str());
    fixed[v] = &it->second;
  }
  for (const auto* list : {&g.params(), &g.consts()})
    for (const Value* v : *list) {
      if (!v->data()) throw Error("'" + v->name() + "' has no data to evaluate with");
      fixed[v] = v->data();
    }
  // Last node that reads each value; graph outputs and `extra` live to the end.
  std::unordered_map<const Value*, const Node*> lastUse;
  for (const auto& n : g.nodes())
    for (const Value* in : n->inputs())
      if (in) lastUse[in] = n.get();
  for (const Value* v : g.outputs()) lastUse[v] = nullptr;
  for (const Value* v : extra) lastUse[v] = nullptr;

  auto lookup = [&](const Value* v) -> const Tensor* {
    if (auto f = fixed.find(v); f != fixed.end()) return f->second;
    if (auto l = live.find(v); l != live.end()) return &l->second;
    throw Error("internal: value '" + v->name() + "' is not computed");
  };
  for (const auto& n : g.nodes()) {
    std::vector<const Tensor*> ins;
    for (const Value* in : n->inputs()) ins.push_back(in ? lookup(in) : nullptr);
    auto outs = backend.run(*n, ins, opts);
    if (observe) observe(*n, ins, outs);
    for (const Value* in : n->inputs())
      if (in && lastUse.count(in) && lastUse[in] == n.get()) live.erase(in);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Value* r = n->result(i);
      if (lastUse.count(r)) live[r] = std::move(outs[i]);
    }
  }
  std::vector<Tensor> result;
  for (const Value* v : g.outputs()) result.push_back(*lookup(v));
  for (const Value* v : extra) result.push_back(*lookup(v));
  return result;
}

}  // namespace ampc
