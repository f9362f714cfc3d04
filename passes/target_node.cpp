#include "passes/target_node.h"

#include <set>

#include "compiler/target.h"

namespace ampc {

Node* replaceByTargetNode(Graph& g, const std::string& op, Node& at, const std::vector<Value*>& inputs,
                          const std::vector<Value*>& standsFor, const std::vector<Node*>& erase,
                          const std::vector<std::pair<std::string, TensorType>>& added) {
  g.domainOpsets.emplace(kCudaDomain, 1);
  std::vector<std::pair<std::string, TensorType>> results;
  for (const Value* v : standsFor) results.emplace_back(g.uniqueName(v->name() + ".f"), v->type());
  for (const auto& [name, type] : added) results.emplace_back(g.uniqueName(name), type);
  Node* f = g.createNode(op, kCudaDomain, inputs, results, &at);
  f->setName(at.name());
  for (const auto& [k, a] : at.attrs()) f->setAttr(k, a);
  std::vector<std::string> names;
  for (size_t i = 0; i < standsFor.size(); ++i) {
    names.push_back(standsFor[i]->name());
    standsFor[i]->replaceAllUsesWith(f->result(i));
  }
  std::set<Value*> consts;
  for (Node* n : erase) {
    for (Value* v : n->inputs())
      if (v && v->kind() == ValueKind::Const) consts.insert(v);
    g.eraseNode(n);
  }
  for (Value* c : consts)
    if (c->uses().empty() && !g.isOutput(c)) g.eraseGraphValue(c);
  for (size_t i = 0; i < names.size(); ++i) g.renameValue(f->result(i), names[i]);
  return f;
}

Node* onlyReader(const Graph& g, const Value* v) {
  if (!v || v->uses().size() != 1 || g.isOutput(v)) return nullptr;
  return v->uses()[0].user;
}

}  // namespace ampc
