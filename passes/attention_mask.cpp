#include "passes/attention_mask.h"

#include <set>
#include <vector>

#include "compiler/ops/registry.h"
#include "kernels/cpu/kernel.h"

namespace ampc {

const Tensor* constantValue(const Value* v, std::map<const Value*, Tensor>& memo, int64_t& budget) {
  if (const Tensor* t = v->constData()) return t;
  if (auto it = memo.find(v); it != memo.end()) return &it->second;
  const Node* n = v->producer();
  if (!n || !n->def() || n->def()->random) return nullptr;
  std::vector<const Tensor*> ins;
  for (const Value* x : n->inputs()) {
    const Tensor* t = x ? constantValue(x, memo, budget) : nullptr;
    if (x && !t) return nullptr;
    ins.push_back(t);
  }
  for (size_t r = 0; r < n->numResults(); ++r) budget -= n->result(r)->type().numel();
  if (budget < 0) return nullptr;
  try {
    auto out = cpu::runNode(*n, ins);
    for (size_t r = 0; r < out.size(); ++r) memo.emplace(n->result(r), std::move(out[r]));
  } catch (const Error&) {
    return nullptr;  // no CPU kernel for it
  }
  return &memo.at(v);
}

bool isCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements) {
  const auto& s = mask->type().shape;
  if (s.size() < 2 || s[s.size() - 2] != Tq || s[s.size() - 1] != Tk) return false;
  std::map<const Value*, Tensor> memo;
  const Tensor* m = constantValue(mask, memo, maxElements);
  if (!m) return false;
  // masked (key j > query i): at most -1e30; kept: exactly 0
  for (int64_t e = 0, n = m->numel(); e < n; ++e) {
    const int64_t j = e % Tk, i = (e / Tk) % Tq;
    const double x = m->getDouble(e);
    if (j > i ? !(x <= -1e30) : x != 0.0) return false;
  }
  return true;
}

bool dependsOnParams(const Value* v) {
  std::vector<const Value*> todo{v};
  std::set<const Value*> seen{v};
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x->kind() == ValueKind::Param) return true;
    if (const Node* n = x->producer())
      for (const Value* in : n->inputs())
        if (in && seen.insert(in).second) todo.push_back(in);
  }
  return false;
}

}  // namespace ampc
