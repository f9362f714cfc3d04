#include "passes/channels_last.h"

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "compiler/target.h"

namespace ampc {

bool layoutCandidate(const Value* v) {
  if (!v || v->type().shape.size() != 4) return false;
  const auto& s = v->type().shape;
  return s[2] * s[3] > 1 && s[1] % 8 == 0 && s[1] <= 2048 && s[0] > 0;
}
bool nhwcConv(const Node& n) {
  const bool fwd = n.domain().empty() && n.op() == "Conv", bwd = n.domain() == "ampc" && n.op() == "ConvGrad";
  if (!fwd && !bwd) return false;
  const Value *x = n.inputs()[fwd ? 0 : 1], *w = n.inputs()[fwd ? 1 : 2];
  const DType t = x->type().dtype;
  if ((t != DType::f16 && t != DType::bf16) || x->type().shape.size() != 4 || w->type().shape.size() != 4) return false;
  if (n.getInt("group", 1) != 1 || (fwd && n.inputs().size() > 2 && n.inputs()[2])) return false;
  return w->type().shape[0] % 8 == 0;  // input channels not a multiple of 8 are padded (runtime/cuda/program.cpp)
}
std::set<const Value*> placeChannelsLast(const Graph& g) {
  std::map<const Value*, const Value*> parent;
  std::function<const Value*(const Value*)> find = [&](const Value* v) -> const Value* {
    auto it = parent.find(v);
    if (it == parent.end()) return parent[v] = v;
    if (it->second == v) return v;
    return it->second = find(it->second);
  };
  std::set<const Value*> pinned, anchored;
  auto join = [&](const Value* a, const Value* b) {
    if (layoutCandidate(a) && layoutCandidate(b)) parent[find(a)] = find(b);
    else if (layoutCandidate(a)) pinned.insert(a);
    else if (layoutCandidate(b)) pinned.insert(b);
  };
  // Elementwise ops the CUDA backend runs on flat memory: any layout, the same for all operands.
  static const std::set<std::string> kElementwise = {"Add", "Sub", "Mul", "Div", "Where", "Relu", "Cast", "Greater", "Less",
                                                     "GreaterOrEqual", "LessOrEqual", "Equal", "Neg", "Abs", "Identity",
                                                     "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip"};
  static const std::set<std::string> kAmpcElementwise = {"Silu", "SiluGrad", "Gelu", "GeluGrad"};
  for (const auto& np : g.nodes()) {
    const Node& n = *np;
    const std::string& op = n.op();
    const bool onnx = n.domain().empty(), ampc = n.domain() == "ampc";
    std::vector<const Value*> touched;
    for (const Value* v : n.inputs()) touched.push_back(v);
    for (size_t i = 0; i < n.numResults(); ++i) touched.push_back(n.result(i));
    auto pinAll = [&] {
      for (const Value* v : touched)
        if (layoutCandidate(v)) pinned.insert(v);
    };
    if ((onnx && op == "Conv") || (ampc && op == "ConvGrad")) {
      // Its activations may have either layout (the CUDA backend converts); the weights never move.
      const bool fwd = onnx;
      for (const Value* v : fwd ? std::vector<const Value*>{n.inputs()[0], n.result(0)}
                                : std::vector<const Value*>{n.inputs()[0], n.inputs()[1], n.result(0)})
        if (layoutCandidate(v) && nhwcConv(n)) anchored.insert(v);
      if (fwd && n.inputs().size() > 2 && n.inputs()[2]) pinned.insert(n.result(0));  // a bias: added NCHW
      continue;
    }
    // A fused group (ampc.Fused) too: its generated kernel indexes every operand as the result.
    if ((onnx && kElementwise.count(op)) || (ampc && (kAmpcElementwise.count(op) || op == "Fused"))) {
      const Value* r = n.result(0);
      bool full = layoutCandidate(r);
      for (const Value* v : n.inputs())
        if (v && v->type().numel() != 1 && v->type().shape != r->type().shape) full = false;
      if (!full) {
        pinAll();
        continue;
      }
      for (const Value* v : n.inputs())
        if (v && v->type().numel() != 1) join(v, r);
      for (size_t i = 1; i < n.numResults(); ++i) join(n.result(i), r);
      continue;
    }
    // The CUDA target's batch norms too (cuda::BatchNormalization's residual, input 5, and
    // cuda::BatchNormGrad's gate y, input 5, are read as X is).
    const bool target = n.domain() == kCudaDomain;
    if ((onnx || target) && op == "BatchNormalization") {
      join(n.inputs()[0], n.result(0));
      if (n.input(5)) join(n.input(5), n.result(0));
      continue;
    }
    if ((ampc || target) && op == "BatchNormGrad") {
      join(n.inputs()[0], n.inputs()[1]);
      join(n.inputs()[1], n.result(0));
      if (n.input(5)) join(n.input(5), n.inputs()[1]);
      continue;
    }
    if (onnx && op == "MaxPool" && n.inputs()[0]->type().shape.size() == 4 && n.getInt("storage_order", 0) == 0) {
      for (size_t i = 0; i < n.numResults(); ++i) join(n.inputs()[0], n.result(i));
      continue;
    }
    if (ampc && op == "ScatterAddFlat" && n.result(0)->type().shape.size() == 4) {
      join(n.inputs()[0], n.inputs()[1]);
      join(n.inputs()[1], n.result(0));
      continue;
    }
    if (onnx && op == "GlobalAveragePool") continue;  // reads either layout; [N, C, 1, 1] has none
    if (onnx && op == "Expand" && n.inputs()[0]->type().shape.size() == 4 && n.inputs()[0]->type().shape[2] * n.inputs()[0]->type().shape[3] == 1)
      continue;  // a broadcast of [N, C, 1, 1] writes either layout
    pinAll();
  }
  for (const auto* list : {&g.inputs(), &g.params(), &g.consts(), &g.outputs()})
    for (const Value* v : *list)
      if (layoutCandidate(v)) pinned.insert(v);
  std::set<const Value*> badRoots, goodRoots, out;
  for (const Value* v : pinned) badRoots.insert(find(v));
  for (const Value* v : anchored) goodRoots.insert(find(v));
  for (const auto& [v, unused] : parent) {
    const Value* r = find(v);
    if (goodRoots.count(r) && !badRoots.count(r)) out.insert(v);
  }
  return out;
}

}  // namespace ampc
