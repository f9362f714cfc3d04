// cse: common subexpression elimination. A node that computes the same op, with the same
// attributes and result types, on the same operands as an earlier node gives the same results: its
// readers read the earlier node's results instead and it goes. Constants of the same type and bytes
// become one first, so that work built on equal constants merges too. Exporters repeat work per
// layer: the dynamo exporter's transformers turn the one boolean attention mask into an additive
// [B, 1, T, T] f32 mask again in every layer (8 layers: 8 copies live for the backward), and the
// small ones fold into 8 equal constants. Nodes that draw random numbers (each Dropout its own
// stream) and ops outside the registry stay. A node whose result is a graph output stays (the
// output keeps its name).
#include <functional>
#include <unordered_map>

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

size_t constKey(const Tensor& t) {
  size_t h = std::hash<std::string>()(t.type.str());
  const uint8_t* p = t.data.data();
  const size_t n = t.data.size(), step = n > 64 ? n / 64 : 1;  // a sample of the bytes; equality decides
  for (size_t i = 0; i < n; i += step) h = mix(h, p[i]);
  return h;
}

size_t nodeKey(const Node& n) {
  size_t h = mix(std::hash<std::string>()(n.op()), std::hash<std::string>()(n.domain()));
  for (const Value* v : n.inputs()) h = mix(h, std::hash<const Value*>()(v));
  return mix(h, n.numResults());
}

bool sameNode(const Node& a, const Node& b) {
  if (a.op() != b.op() || a.domain() != b.domain() || a.inputs() != b.inputs() || a.numResults() != b.numResults() || a.attrs() != b.attrs())
    return false;
  for (size_t i = 0; i < a.numResults(); ++i)
    if (a.result(i)->type() != b.result(i)->type()) return false;
  return true;
}

class CsePass final : public Pass {
 public:
  std::string name() const override { return "cse"; }
  bool run(Graph& g) override {
    bool changed = false;
    std::unordered_multimap<size_t, Value*> consts;
    for (Value* c : std::vector<Value*>(g.consts())) {
      if (!c->data() || g.isOutput(c)) continue;
      const size_t k = constKey(*c->data());
      Value* same = nullptr;
      for (auto [it, end] = consts.equal_range(k); it != end && !same; ++it)
        if (*it->second->data() == *c->data()) same = it->second;
      if (!same) {
        consts.emplace(k, c);
        continue;
      }
      c->replaceAllUsesWith(same);
      g.eraseGraphValue(c);
      changed = true;
    }
    std::unordered_multimap<size_t, Node*> seen;
    std::vector<Node*> order;
    for (const auto& n : g.nodes()) order.push_back(n.get());
    for (Node* n : order) {
      const OpDef* d = n->def();
      if (!d || d->random) continue;
      const size_t k = nodeKey(*n);
      Node* same = nullptr;
      for (auto [it, end] = seen.equal_range(k); it != end && !same; ++it)
        if (sameNode(*it->second, *n)) same = it->second;
      if (!same) {
        seen.emplace(k, n);
        continue;
      }
      bool output = false;
      for (size_t i = 0; i < n->numResults(); ++i) output |= g.isOutput(n->result(i));
      if (output) continue;
      for (size_t i = 0; i < n->numResults(); ++i) n->result(i)->replaceAllUsesWith(same->result(i));
      g.eraseNode(n);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createCsePass() { return std::make_unique<CsePass>(); }

}  // namespace ampc
