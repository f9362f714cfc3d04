// fuse-gelu: the GELU formulas exporters write out op by op become one ampc.Gelu node (ONNX's Gelu,
// which is opset 20, for graphs of any opset), whose backward is one ampc.GeluGrad:
//
//   tanh form (GPT-2's NewGELU):  x * 0.5 * (1 + Tanh(0.7978845608 * (x + 0.044715 * Pow(x, 3))))
//   erf form (nn.GELU):           x * 0.5 * (1 + Erf(x / 1.4142135))   (or x * 0.70710678)
//
// with the 0.5 on x or on the product, and either operand order of each Mul and Add. Every
// intermediate value must have its one use inside the pattern. Eight forward nodes (and about
// fifteen backward ones) become one each way, so the [tokens, 4 x width] activations are read and
// written once instead of a dozen times.
//
// SiLU (swish), x * Sigmoid(x) in either operand order with the Sigmoid used only there, becomes one
// ampc.Silu, whose backward is one ampc.SiluGrad: PyTorch's silu is one kernel each way, so a bf16
// SiLU is rounded once, not after the Sigmoid and again after the Mul (and its gradient once, not
// through the Sigmoid's and the Mul's separate gradients summed at low precision).
#include <cmath>
#include <vector>

#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

bool near(double a, double b) { return std::fabs(a - b) <= 1e-4 * std::fabs(b); }
bool scalarIs(const Value* v, double want) {
  const Tensor* t = v ? v->constData() : nullptr;
  return t && t->numel() == 1 && isFloat(t->type.dtype) && near(t->getDouble(0), want);
}

struct Matcher {
  const Graph& g;
  std::vector<Node*> nodes;  // matched, root first

  // v = op(other, c) (or op(c, other) for Mul/Add) with scalar constant c ~ want, v used once;
  // returns other.
  Value* constOperand(Value* v, const char* op, double want) {
    Node* n = v ? v->producer() : nullptr;
    if (!n || !n->domain().empty() || n->op() != op || n->numInputs() != 2 || !singleUse(g, v)) return nullptr;
    const bool commutes = std::string(op) == "Mul" || std::string(op) == "Add";
    for (int i = commutes ? 0 : 1; i < 2; ++i)
      if (scalarIs(n->input(i), want) && n->input(1 - i)->type().shape == v->type().shape) {
        nodes.push_back(n);
        return n->input(1 - i);
      }
    return nullptr;
  }
  Node* unary(Value* v, const char* op) {
    Node* n = v ? v->producer() : nullptr;
    if (!n || !n->domain().empty() || n->op() != op || !singleUse(g, v)) return nullptr;
    nodes.push_back(n);
    return n;
  }
  // G = 1 + Tanh(k (x + c x^3)) or 1 + Erf(x / sqrt 2): the form ("tanh" / "none"), or "" when not.
  std::string inner(Value* gv, Value* x) {
    Value* t = constOperand(gv, "Add", 1.0);
    if (!t) return "";
    if (Node* th = unary(t, "Tanh")) {
      Value* a0 = constOperand(th->input(0), "Mul", 0.7978845608028654);
      Node* add = a0 ? a0->producer() : nullptr;
      if (!add || !add->domain().empty() || add->op() != "Add" || !singleUse(g, a0)) return "";
      nodes.push_back(add);
      for (int i = 0; i < 2; ++i) {
        if (add->input(i) != x) continue;
        Value* p = constOperand(add->input(1 - i), "Mul", 0.044715);
        if (p && constOperand(p, "Pow", 3.0) == x) return "tanh";
      }
      return "";
    }
    if (Node* erf = unary(t, "Erf")) {
      const size_t mark = nodes.size();
      if (constOperand(erf->input(0), "Div", 1.4142135623730951) == x) return "none";
      nodes.resize(mark);
      if (constOperand(erf->input(0), "Mul", 0.7071067811865476) == x) return "none";
    }
    return "";
  }
  // Root r = Mul(Mul(x, 0.5), G) or Mul(Mul(x, G), 0.5) (any operand order): x and the form.
  bool match(Node* r, Value*& x, std::string& form) {
    if (!r->domain().empty() || r->op() != "Mul" || r->numInputs() != 2) return false;
    nodes = {r};
    // Mul(Mul(x, G), 0.5)
    for (int j = 0; j < 2; ++j) {
      if (!scalarIs(r->input(j), 0.5)) continue;
      Value* m = r->input(1 - j);
      Node* mm = m->producer();
      if (mm && mm->domain().empty() && mm->op() == "Mul" && singleUse(g, m)) {
        nodes.push_back(mm);
        for (int i = 0; i < 2; ++i) {
          const size_t mark = nodes.size();
          x = mm->input(i);
          form = inner(mm->input(1 - i), x);
          if (!form.empty()) return true;
          nodes.resize(mark);
        }
        nodes = {r};
      }
    }
    // Mul(Mul(x, 0.5), G)
    nodes = {r};
    for (int i = 0; i < 2; ++i) {
      const size_t mark = nodes.size();
      x = constOperand(r->input(i), "Mul", 0.5);
      if (x) {
        form = inner(r->input(1 - i), x);
        if (!form.empty()) return true;
      }
      nodes.resize(mark);
    }
    return false;
  }
};

// r = Mul(x, Sigmoid(x)) (either order), the Sigmoid's result used only by r: the Sigmoid.
Node* siluSigmoid(const Graph& g, const Node& r) {
  if (!r.domain().empty() || r.op() != "Mul" || r.numInputs() != 2) return nullptr;
  for (int i = 0; i < 2; ++i) {
    Node* s = r.input(i) ? r.input(i)->producer() : nullptr;
    if (s && s->domain().empty() && s->op() == "Sigmoid" && s->input(0) == r.input(1 - i) && singleUse(g, r.input(i)) &&
        isFloat(r.input(1 - i)->type().dtype) && r.input(1 - i)->type().shape == r.result(0)->type().shape)
      return s;
  }
  return nullptr;
}

class FuseGeluPass final : public Pass {
 public:
  std::string name() const override { return "fuse-gelu"; }
  bool run(Graph& g) override {
    std::vector<Node*> muls;
    for (const auto& n : g.nodes())
      if (n->domain().empty() && n->op() == "Mul") muls.push_back(n.get());
    std::vector<Node*> erased;
    bool changed = false;
    for (Node* r : muls) {
      if (std::find(erased.begin(), erased.end(), r) != erased.end()) continue;
      if (Node* s = siluSigmoid(g, *r)) {
        g.domainOpsets.emplace(kGradDomain, 1);
        Value* old = r->result(0);
        const std::string oldName = old->name();
        Node* silu = g.createNode("Silu", kGradDomain, {s->input(0)}, {{g.uniqueName(oldName + ".silu"), old->type()}}, r);
        silu->setName(r->name() + "/Silu");
        old->replaceAllUsesWith(silu->result(0));
        g.eraseNode(r);
        g.eraseNode(s);
        erased.push_back(r);
        g.renameValue(silu->result(0), oldName);
        changed = true;
        continue;
      }
      Matcher m{g, {}};
      Value* x = nullptr;
      std::string form;
      if (!m.match(r, x, form) || !isFloat(x->type().dtype) || x->type().shape != r->result(0)->type().shape) continue;
      g.domainOpsets.emplace(kGradDomain, 1);
      Value* old = r->result(0);
      const std::string oldName = old->name();
      Node* gelu = g.createNode("Gelu", kGradDomain, {x}, {{g.uniqueName(oldName + ".gelu"), old->type()}}, r);
      gelu->setName(r->name() + "/Gelu");
      gelu->setAttr("approximate", form);
      old->replaceAllUsesWith(gelu->result(0));
      for (Node* n : m.nodes) {  // root first: each node's one user is gone before it
        g.eraseNode(n);
        erased.push_back(n);
      }
      g.renameValue(gelu->result(0), oldName);
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> createFuseGeluPass() { return std::make_unique<FuseGeluPass>(); }

}  // namespace ampc
