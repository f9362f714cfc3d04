// fuse-param-casts (the CUDA target's lowering, runtime/lower.cpp, after fuse-elementwise): the
// step's parameter casts, Cast(p) f32 -> f16/bf16 of a parameter (the weights autocast narrows),
// become multi-tensor casts, cuda::MultiCast(p1, ..., pn) {to} -> (c1, ..., cn): one launch each
// on CUDA, the casts one by one on the CPU reference (each result exactly its Cast's).
//
// The first cast of each parameter to a type joins that type's first group, made at the place of
// the first such cast (every weight's low copy at once, early in the forward). A parameter cast
// again (the backward's recasts, passes/rematerialize.cpp) joins the last recast group of its type
// when that one started at most kRecastWindow nodes before (a layer's backward or two: one launch
// for their weights, born a little early), else starts one where it stands. A cast whose one
// reader is a DropoutGrad's dY stays: DropoutGrad reads its f32 operand and rounds it itself.
#include <map>
#include <set>
#include <vector>

#include "passes/pass.h"
#include "passes/target_node.h"

namespace ampc {
namespace {
constexpr size_t kRecastWindow = 64;

bool paramCast(const Node& n) {
  if (!isOnnxOp(&n, "Cast") || n.numInputs() != 1 || !n.input(0) || n.numResults() != 1) return false;
  if (n.input(0)->kind() != ValueKind::Param || n.input(0)->type().dtype != DType::f32 || !isLowFloat(n.result(0)->type().dtype))
    return false;
  const auto& uses = n.result(0)->uses();
  return !(uses.size() == 1 && uses[0].operand == 0 && uses[0].user->domain() == "ampc" && uses[0].user->op() == "DropoutGrad");
}

class FuseParamCastsPass final : public Pass {
 public:
  std::string name() const override { return "fuse-param-casts"; }
  bool run(Graph& g) override {
    // The groups, in node order: each a list of casts, the first where the group is made.
    std::vector<std::vector<Node*>> groups;
    std::map<DType, size_t> first;                    // per type, its first group
    std::map<DType, std::pair<size_t, size_t>> recast;  // per type, (group, the node index it started at)
    std::set<std::pair<const Value*, DType>> cast;
    size_t i = 0;
    for (const auto& up : g.nodes()) {
      Node* n = up.get();
      if (paramCast(*n)) {
        const DType t = n->result(0)->type().dtype;
        if (cast.emplace(n->input(0), t).second) {
          auto [it, fresh] = first.try_emplace(t, groups.size());
          if (fresh) groups.emplace_back();
          groups[it->second].push_back(n);
        } else {
          auto it = recast.find(t);
          if (it != recast.end() && i - it->second.second <= kRecastWindow) {
            groups[it->second.first].push_back(n);
          } else {
            recast[t] = {groups.size(), i};
            groups.push_back({n});
          }
        }
      }
      ++i;
    }
    for (const auto& group : groups) {
      std::vector<Value*> ins, casts;
      for (Node* c : group) {
        ins.push_back(c->input(0));
        casts.push_back(c->result(0));
      }
      const std::string name = group.front()->name() + (group.size() > 1 ? "/MultiCast" : "");
      Node* m = replaceByTargetNode(g, "MultiCast", *group.front(), ins, casts, group);
      m->setName(name);
      m->setAttr("to", static_cast<int64_t>(dtypeToOnnx(m->result(0)->type().dtype)));
    }
    if (!groups.empty()) g.bindOps();
    return !groups.empty();
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseParamCastsPass() { return std::make_unique<FuseParamCastsPass>(); }

}  // namespace ampc
