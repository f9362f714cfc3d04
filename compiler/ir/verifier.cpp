#include <algorithm>
#include <unordered_set>

#include "compiler/ir/ir.h"
#include "compiler/ops/registry.h"

namespace ampc {

void verify(const Graph& g, bool checkTypes) {
  std::unordered_set<const Value*> defined;
  auto define = [&](const Value* v) {
    if (g.lookup(v->name()) != v) throw Error("verifier: value '" + v->name() + "' is not registered under its name");
    defined.insert(v);
  };
  for (const Value* v : g.inputs()) define(v);
  for (const Value* v : g.params()) define(v);
  for (const Value* v : g.consts()) {
    if (v->data() && v->data()->type != v->type()) throw Error("verifier: const '" + v->name() + "' data type differs from its declared type");
    define(v);
  }
  for (const auto& n : g.nodes()) {
    for (size_t i = 0; i < n->numInputs(); ++i) {
      const Value* v = n->input(i);
      if (!v) continue;
      if (!defined.count(v))
        throw Error("verifier: " + n->describe() + " uses '" + v->name() + "' before it is defined");
      const auto& u = v->uses();
      if (std::find(u.begin(), u.end(), Use{n.get(), static_cast<int>(i)}) == u.end())
        throw Error("verifier: use list of '" + v->name() + "' misses " + n->describe());
    }
    for (size_t i = 0; i < n->numResults(); ++i) {
      const Value* r = n->result(i);
      if (r->producer() != n.get() || r->resultIndex() != static_cast<int>(i))
        throw Error("verifier: result '" + r->name() + "' of " + n->describe() + " has a wrong producer");
      define(r);
    }
    if (checkTypes && n->def()) {
      auto types = inferTypes(*n);
      for (size_t i = 0; i < n->numResults(); ++i)
        if (types[i] != n->result(i)->type())
          throw Error("verifier: " + n->describe() + " result '" + n->result(i)->name() + "' is " +
                      n->result(i)->type().str() + ", the registry infers " + types[i].str());
    }
  }
  // Every use recorded on a value must be a real operand.
  auto checkUses = [&](const Value* v) {
    for (const Use& u : v->uses())
      if (u.user->input(u.operand) != v) throw Error("verifier: stale use of '" + v->name() + "' in " + u.user->describe());
  };
  for (const Value* v : defined) checkUses(v);
  for (const Value* v : g.outputs())
    if (!v || !defined.count(v)) throw Error("verifier: a graph output is not defined");
}

}  // namespace ampc
