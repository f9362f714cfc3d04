// fuse-elementwise: connected groups of pointwise nodes (ops with a formula in
// compiler/ops/pointwise.cpp) of one result shape become one ampc.Fused node, whose body is the
// group (compiler/ops/pointwise.h). A backend with generated kernels runs each group as one
// launch that reads its operands once and writes only what is read outside the group.
//
// The groups grow greedily in node order: a node joins the group of one of its operands' producers
// when its result has the group's shape, it comes within kJoinWindow nodes of the group's last
// member, and no other operand depends on the group through a node outside it (so the fused graph
// has no cycle); otherwise it starts a group. A node whose operands come from two groups merges
// them when no outside node lies between them. Groups of one node stay
// as they are, unless `alone` asks for them (an op with no other kernel on the backend). One-element constant operands are folded into the body.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ir/text.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/pointwise.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

constexpr size_t kMaxOperands = 24;  // kernel parameters stay few
// A node joins a group only within this many nodes of the group's last member: the group runs at
// its last member's place, so a far node (a backward op reading a forward result, such as ReLU's
// mask) would be computed early and its result held across everything in between.
constexpr size_t kJoinWindow = 16;

// The types a generated kernel holds (compiler/codegen/nvptx.cpp): f64 stays out, and its ops run
// on the backend's own kernels.
bool fusibleType(const TensorType& t) { return t.dtype == DType::boolean || t.dtype == DType::f32 || isLowFloat(t.dtype); }

struct Group {
  std::vector<Node*> members;  // in node order
  size_t first = 0, last = 0;  // the first and the last member's index
  std::vector<int64_t> shape;
};

class FuseElementwisePass final : public Pass {
 public:
  FuseElementwisePass(std::function<bool(const Node&)> excluded, std::function<bool(const Node&, size_t)> readsWidened,
                      std::function<bool(const Node&)> alone)
      : excluded_(std::move(excluded)), readsWidened_(std::move(readsWidened)), alone_(std::move(alone)) {}
  std::string name() const override { return "fuse-elementwise"; }

  bool run(Graph& g) override {
    std::vector<Node*> order;
    std::unordered_map<const Node*, size_t> index;
    for (const auto& n : g.nodes()) {
      index.emplace(n.get(), order.size());
      order.push_back(n.get());
    }
    std::vector<Group> groups;
    std::unordered_map<const Node*, size_t> groupOf;
    for (Node* n : order) {
      if (!candidate(*n)) continue;
      const auto& shape = n->result(0)->type().shape;
      size_t chosen = SIZE_MAX;
      for (const Value* v : n->inputs()) {
        if (!v || !v->producer()) continue;
        auto it = groupOf.find(v->producer());
        if (it == groupOf.end() || it->second == chosen || groups[it->second].shape != shape ||
            index.at(n) > groups[it->second].last + kJoinWindow)
          continue;
        if (mayJoin(*n, groups, groupOf, it->second, index)) {
          chosen = it->second;
          break;
        }
      }
      if (chosen == SIZE_MAX) {
        chosen = groups.size();
        groups.push_back(Group{{}, index.at(n), index.at(n), shape});
      }
      groups[chosen].members.push_back(n);
      groups[chosen].last = index.at(n);
      groupOf.emplace(n, chosen);
      // Another operand's group joins too where nothing outside lies between them (a ReLU gradient
      // Where(Greater(y, 0), Add(a, b), 0): the sum's group and the comparison's meet at the Where).
      for (const Value* v : n->inputs()) {
        if (!v || !v->producer()) continue;
        auto it = groupOf.find(v->producer());
        if (it == groupOf.end() || it->second == chosen) continue;
        const size_t other = it->second;
        if (groups[other].shape != shape || index.at(n) > groups[other].last + kJoinWindow) continue;
        if (!mayMerge(groups, groupOf, chosen, other, index)) continue;
        Group& into = groups[chosen];
        for (Node* m : groups[other].members) {
          into.members.push_back(m);
          groupOf[m] = chosen;
        }
        std::sort(into.members.begin(), into.members.end(), [&](const Node* a, const Node* b) { return index.at(a) < index.at(b); });
        into.first = std::min(into.first, groups[other].first);
        into.last = std::max(into.last, groups[other].last);
        groups[other].members.clear();
      }
    }
    bool changed = false;
    int counter = 0;
    for (Group& grp : groups)
      if (!grp.members.empty() && (grp.members.size() >= 2 || (alone_ && alone_(*grp.members[0]))) && fuse(g, grp, counter)) changed = true;
    if (changed) g.sortNodes();
    return changed;
  }

 private:
  std::function<bool(const Node&)> excluded_;
  std::function<bool(const Node&, size_t)> readsWidened_;
  std::function<bool(const Node&)> alone_;

  bool candidate(const Node& n) const {
    if (n.numResults() != 1 || !pointwiseFormula(n) || (n.def() && n.def()->random)) return false;
    if (!fusibleType(n.result(0)->type())) return false;
    for (const Value* v : n.inputs())
      if (v && !fusibleType(v->type())) return false;
    return !excluded_ || !excluded_(n);
  }

  // Whether n may join group `gid`: every operand of n made outside the group must not depend on
  // the group (a path group -> outside node -> n would be a cycle once the group is one node).
  // Another group is one node too once fused: reaching a member of one reaches every member's
  // operands. Nodes before the group's first member cannot depend on it, which bounds the search.
  static bool mayJoin(const Node& n, const std::vector<Group>& groups, const std::unordered_map<const Node*, size_t>& groupOf, size_t gid,
                      const std::unordered_map<const Node*, size_t>& index) {
    const Group& grp = groups[gid];
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack;
    for (const Value* v : n.inputs())
      if (v && v->producer()) {
        auto it = groupOf.find(v->producer());
        if (it == groupOf.end() || it->second != gid) stack.push_back(v->producer());
      }
    while (!stack.empty()) {
      const Node* p = stack.back();
      stack.pop_back();
      if (index.at(p) < grp.first || !seen.insert(p).second) continue;
      auto it = groupOf.find(p);
      if (it != groupOf.end() && it->second == gid) return false;
      if (it != groupOf.end()) {
        for (const Node* m : groups[it->second].members)
          for (const Value* v : m->inputs())
            if (v && v->producer()) stack.push_back(v->producer());
        continue;
      }
      for (const Value* v : p->inputs())
        if (v && v->producer()) stack.push_back(v->producer());
    }
    return true;
  }

  // Whether groups a and b may become one: no path from one to the other through a node outside
  // both (each other group counted as one node, as in mayJoin).
  static bool mayMerge(const std::vector<Group>& groups, const std::unordered_map<const Node*, size_t>& groupOf, size_t a, size_t b,
                       const std::unordered_map<const Node*, size_t>& index) {
    auto inside = [&](const Node* p) {
      auto it = groupOf.find(p);
      return it != groupOf.end() && (it->second == a || it->second == b);
    };
    const size_t first = std::min(groups[a].first, groups[b].first);
    std::unordered_set<const Node*> seen;
    std::vector<const Node*> stack;
    for (size_t gid : {a, b})
      for (const Node* m : groups[gid].members)
        for (const Value* v : m->inputs())
          if (v && v->producer() && !inside(v->producer())) stack.push_back(v->producer());
    while (!stack.empty()) {
      const Node* p = stack.back();
      stack.pop_back();
      if (index.at(p) < first || !seen.insert(p).second) continue;
      if (inside(p)) return false;
      auto it = groupOf.find(p);
      std::vector<const Node*> from = {p};
      if (it != groupOf.end()) from.assign(groups[it->second].members.begin(), groups[it->second].members.end());
      for (const Node* m : from)
        for (const Value* v : m->inputs())
          if (v && v->producer()) stack.push_back(v->producer());
    }
    return true;
  }

  static bool widening(const Node& n) {
    if (!n.domain().empty() || n.op() != "Cast" || !n.input(0)) return false;
    return isLowFloat(n.input(0)->type().dtype) && n.result(0)->type().dtype == DType::f32;
  }

  static bool oneElementConst(const Value* v) {
    return v->kind() == ValueKind::Const && v->data() && v->type().numel() == 1;
  }

  // Replaces the group by one ampc.Fused node. Returns false (nothing changed) when the group would
  // take too many operands.
  bool fuse(Graph& g, const Group& grp, int& counter) {
    std::set<const Node*> members(grp.members.begin(), grp.members.end());
    std::vector<Value*> operands;
    std::vector<Value*> results;
    std::map<const Value*, size_t> operandIndex;
    for (Node* n : grp.members)
      for (Value* v : n->inputs()) {
        if (!v || (v->producer() && members.count(v->producer())) || oneElementConst(v) || operandIndex.count(v)) continue;
        operandIndex.emplace(v, operands.size());
        operands.push_back(v);
      }
    // A widening Cast also read outside the group, where every outside reader reads through it (the
    // backend's readsWidened), stays for those readers and is recomputed in the body: its f32 result
    // is never written (the group writes its narrow operand instead, when a member makes it).
    std::set<const Node*> kept;
    for (Node* n : grp.members) {
      Value* r = n->result(0);
      bool outside = g.isOutput(r), throughCast = widening(*n) && readsWidened_ && !g.isOutput(r);
      for (const Use& u : r->uses())
        if (!members.count(u.user)) {
          outside = true;
          throughCast = throughCast && readsWidened_(*u.user, u.operand);
        }
      if (!outside) continue;
      if (throughCast) kept.insert(n);
      else results.push_back(r);
    }
    // A kept Cast of a member's result reads that (narrow) result from the group.
    for (const Node* k : kept) {
      Value* src = k->input(0);
      if (src->producer() && members.count(src->producer()) && std::find(results.begin(), results.end(), src) == results.end())
        results.push_back(src);
    }
    if (operands.size() + results.size() > kMaxOperands || results.empty()) return false;

    // The body: the members in order, reading body inputs for the operands.
    Graph body;
    body.name = "fused";
    body.opset = g.opset;
    body.domainOpsets = g.domainOpsets;
    std::map<const Value*, Value*> map;
    for (size_t i = 0; i < operands.size(); ++i) map[operands[i]] = body.addInput("in" + std::to_string(i), operands[i]->type());
    for (Node* n : grp.members) {
      std::vector<Value*> ins;
      for (Value* v : n->inputs()) {
        if (!v) {
          ins.push_back(nullptr);
          continue;
        }
        auto it = map.find(v);
        if (it == map.end()) it = map.emplace(v, body.addConst(v->name(), *v->data())).first;
        ins.push_back(it->second);
      }
      Node* c = body.copyNode(*n, ins, {{n->result(0)->name(), n->result(0)->type()}});
      map[n->result(0)] = c->result(0);
    }
    for (Value* r : results) body.addOutput(map.at(r));
    body.bindOps();

    g.domainOpsets.emplace(kGradDomain, 1);
    std::vector<std::pair<std::string, TensorType>> types;
    for (Value* r : results) types.emplace_back(g.uniqueName(r->name() + ".fused"), r->type());
    Node* last = grp.members.back();
    Node* fused = g.createNode("Fused", kGradDomain, operands, types, g.nodeAfter(last));
    fused->setName("fused_" + std::to_string(counter++) + "/" + grp.members.front()->name());
    fused->setAttr("body", printGraph(body));
    std::vector<std::string> names;
    for (size_t i = 0; i < results.size(); ++i) {
      names.push_back(results[i]->name());
      results[i]->replaceAllUsesWith(fused->result(i));
    }
    for (auto it = grp.members.rbegin(); it != grp.members.rend(); ++it)
      if (!kept.count(*it)) g.eraseNode(*it);
    for (size_t i = 0; i < results.size(); ++i) g.renameValue(fused->result(i), names[i]);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseElementwisePass(std::function<bool(const Node&)> excluded,
                                                std::function<bool(const Node&, size_t)> readsWidened,
                                                std::function<bool(const Node&)> alone) {
  return std::make_unique<FuseElementwisePass>(std::move(excluded), std::move(readsWidened), std::move(alone));
}

}  // namespace ampc
