#include "passes/attention_mask.h"

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

namespace {
// Whether v [.., Tq, Tk], known from constants, has fits(x, masked) true at every element, masked
// where key j > query i.
template <typename Fits>
bool causalPattern(const Value* v, int64_t Tq, int64_t Tk, int64_t maxElements, Fits fits) {
  const auto& s = v->type().shape;
  if (s.size() < 2 || s[s.size() - 2] != Tq || s[s.size() - 1] != Tk) return false;
  std::map<const Value*, Tensor> memo;
  const Tensor* m = constantValue(v, memo, maxElements);
  if (!m) return false;
  for (int64_t e = 0, n = m->numel(); e < n; ++e) {
    const int64_t j = e % Tk, i = (e / Tk) % Tq;
    if (!fits(m->getDouble(e), j > i)) return false;
  }
  return true;
}
}  // namespace

bool isCausalMask(const Value* mask, int64_t Tq, int64_t Tk, int64_t maxElements) {
  // masked: at most -1e30; kept: exactly 0
  return causalPattern(mask, Tq, Tk, maxElements, [](double x, bool masked) { return masked ? x <= -1e30 : x == 0.0; });
}

bool isCausalCondition(const Value* cond, int64_t Tq, int64_t Tk, bool trueMasks, int64_t maxElements) {
  return causalPattern(cond, Tq, Tk, maxElements, [trueMasks](double x, bool masked) { return ((x != 0.0) == trueMasks) == masked; });
}

}  // namespace ampc
