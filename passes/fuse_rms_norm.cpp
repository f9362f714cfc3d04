// fuse-rms-norm: RMS normalisation as the exporters write it out op by op becomes one ampc.RmsNorm
// (ONNX's RMSNormalization, opset 23, for graphs of any opset), whose backward is one
// LayerNormGrad {rms = 1}:
//
//   y = x * R(ReduceMean(Q(x)) + eps) [* w]      or      y = x / Sqrt(ReduceMean(Q(x)) + eps) [* w]
//
// with Q(x) = Pow(x, 2) or Mul(x, x); R(a) = Reciprocal(Sqrt(a)), Div(1, Sqrt(a)) or Pow(a, -0.5);
// the mean over trailing axes with keepdims; eps a scalar constant; and the weight w any float value
// (a parameter, Gemma's 1 + w) with one element per normalised element; either operand order
// of each Mul and Add. Every intermediate value must have its one use inside the pattern. So write
// Hugging Face's Llama, Mistral, Qwen, Gemma and T5 norms (hidden * rsqrt(hidden.pow(2).mean(-1,
// keepdim=True) + eps), then weight * hidden), torch.nn.RMSNorm's decomposition, and ampc's own
// import of ONNX's RMSNormalization. About eight nodes become one each way, and the mean of squares
// and the weight's gradient stop being separate reductions.
//
// Only for a target whose kernels run it (Target::rmsNorm); without a weight the scale is ones. The
// epsilon is a float attribute: an f64 norm whose eps a float does not hold exactly is left alone.
#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/pass.h"

namespace ampc {
namespace {

// v's producer when it is the ONNX op `op` and v has its one use inside the pattern; else null.
Node* inner(const Graph& g, Value* v, std::string_view op) {
  Node* n = v ? v->producer() : nullptr;
  return isOnnxOp(n, op) && singleUse(g, v) ? n : nullptr;
}
// A scalar (one-element) numeric constant's value.
bool scalarConst(const Value* v, double& out) {
  const Tensor* t = v ? v->constData() : nullptr;
  if (!t || t->numel() != 1 || t->type.dtype == DType::boolean) return false;
  out = t->getDouble(0);
  return true;
}
bool scalarIs(const Value* v, double want) {
  double d;
  return scalarConst(v, d) && d == want;
}

struct Match {
  Value* x = nullptr;
  Value* weight = nullptr;  // null: none
  double eps = 0;
  int64_t axis = 0;
  Node* root = nullptr;      // the node whose result the fused node stands for
  std::vector<Node*> nodes;  // matched, root first (each node's one user comes before it)
};

class Matcher {
 public:
  explicit Matcher(const Graph& g) : g_(g) {}

  // n = Mul(x, R(A)) or Div(x, Sqrt(A)), A = ReduceMean(Q(x)) + eps.
  bool normalized(Node* n, Match& m) {
    m = Match{};
    if (n->numInputs() != 2 || !isFloat(n->result(0)->type().dtype)) return false;
    if (isOnnxOp(n, "Div")) {
      m.nodes = {n};
      Node* s = inner(g_, n->input(1), "Sqrt");
      if (!s) return false;
      m.nodes.push_back(s);
      m.x = n->input(0);
      return n->result(0)->type() == m.x->type() && meanSquarePlusEps(s->input(0), m);
    }
    if (!isOnnxOp(n, "Mul")) return false;
    for (int i = 0; i < 2; ++i) {
      m.nodes = {n};
      m.x = n->input(i);
      if (n->result(0)->type() != m.x->type()) continue;
      if (Value* a = rsqrtOf(n->input(1 - i), m); a && meanSquarePlusEps(a, m)) return true;
    }
    return false;
  }

  // The weight after the normalisation: the one reader of n's result (through a Cast to its own
  // type: Llama's hidden.to(input_dtype) in an f32 export) a Mul by a value of the normalised dims
  // only. Sets m.weight and m.root.
  void weight(Node* n, Match& m) {
    m.root = n;
    Value* y = n->result(0);
    if (!singleUse(g_, y)) return;
    Node* u = y->uses()[0].user;
    Node* cast = nullptr;
    if (isOnnxOp(u, "Cast") && u->result(0)->type() == y->type() && singleUse(g_, u->result(0))) {
      cast = u;
      y = u->result(0);
      u = y->uses()[0].user;
    }
    if (!isOnnxOp(u, "Mul") || u->numInputs() != 2 || u->input(0) == u->input(1)) return;
    Value* w = u->input(0) == y ? u->input(1) : u->input(0);
    if (w == m.x) return;
    const auto& xs = m.x->type().shape;
    const std::vector<int64_t> norm(xs.begin() + m.axis, xs.end());
    const auto& ws = w->type().shape;
    int64_t D = 1;
    for (int64_t d : norm) D *= d;
    // One weight per normalised element, aligned from the right: the kernels' scale covers the
    // normalised dims.
    if (!isFloat(w->type().dtype) || w->type().numel() != D || ws.size() > norm.size() || u->result(0)->type() != y->type()) return;
    for (size_t k = 0; k < ws.size(); ++k)
      if (ws[k] != norm[norm.size() - ws.size() + k]) return;
    m.weight = w;
    m.root = u;
    if (cast) m.nodes.insert(m.nodes.begin(), cast);
    m.nodes.insert(m.nodes.begin(), u);
  }

 private:
  // r = Reciprocal(Sqrt(a)), Div(1, Sqrt(a)) or Pow(a, -0.5): a (null when not).
  Value* rsqrtOf(Value* r, Match& m) {
    const size_t mark = m.nodes.size();
    if (Node* rc = inner(g_, r, "Reciprocal")) {
      if (Node* s = inner(g_, rc->input(0), "Sqrt")) {
        m.nodes.insert(m.nodes.end(), {rc, s});
        return s->input(0);
      }
    }
    if (Node* d = inner(g_, r, "Div"); d && scalarIs(d->input(0), 1.0)) {
      if (Node* s = inner(g_, d->input(1), "Sqrt")) {
        m.nodes.insert(m.nodes.end(), {d, s});
        return s->input(0);
      }
    }
    if (Node* p = inner(g_, r, "Pow"); p && scalarIs(p->input(1), -0.5)) {
      m.nodes.push_back(p);
      return p->input(0);
    }
    m.nodes.resize(mark);
    return nullptr;
  }

  // a = Add(ReduceMean(Q(m.x)) over trailing axes, eps): sets eps and axis.
  bool meanSquarePlusEps(Value* a, Match& m) {
    const Value* x = m.x;
    const TensorType& xt = x->type();
    if (!isFloat(xt.dtype) || xt.rank() == 0) return false;
    Node* add = inner(g_, a, "Add");
    if (!add || add->numInputs() != 2) return false;
    for (int i = 0; i < 2; ++i) {
      Node* mean = inner(g_, add->input(i), "ReduceMean");
      if (!mean || !scalarConst(add->input(1 - i), m.eps) || !(m.eps >= 0) || mean->getInt("keepdims", 1) != 1) continue;
      // The op's epsilon is a float attribute (as LayerNormalization's): an f64 norm whose eps a
      // float does not hold exactly stays as written.
      if (xt.dtype == DType::f64 && static_cast<double>(static_cast<float>(m.eps)) != m.eps) continue;
      if (!trailingAxes(*mean, xt.rank(), m.axis)) continue;
      Node* q = mean->numInputs() >= 1 ? mean->input(0)->producer() : nullptr;
      if (!q || !singleUse(g_, mean->input(0)) || q->result(0)->type() != xt) continue;
      const bool square = (isOnnxOp(q, "Pow") && q->input(0) == x && scalarIs(q->input(1), 2.0)) ||
                          (isOnnxOp(q, "Mul") && q->input(0) == x && q->input(1) == x);
      if (!square || add->result(0)->type().dtype != xt.dtype) continue;
      m.nodes.insert(m.nodes.end(), {add, mean, q});
      return true;
    }
    return false;
  }

  // The ReduceMean's axes (attribute, or constant input 1) are axis .. rank - 1.
  static bool trailingAxes(const Node& mean, int64_t rank, int64_t& axis) {
    std::vector<int64_t> axes;
    if (mean.numInputs() >= 2 && mean.input(1)) {
      const Tensor* t = mean.input(1)->constData();
      if (!t) return false;
      axes = t->toInts();
    } else if (mean.hasAttr("axes")) {
      axes = mean.getInts("axes");
    }
    if (axes.empty()) return false;
    for (int64_t& a : axes) {
      if (a < -rank || a >= rank) return false;
      if (a < 0) a += rank;
    }
    std::sort(axes.begin(), axes.end());
    for (size_t k = 0; k < axes.size(); ++k)
      if (axes[k] != rank - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(k)) return false;
    axis = axes.front();
    return true;
  }

  const Graph& g_;
};

class FuseRmsNormPass final : public Pass {
 public:
  explicit FuseRmsNormPass(const Target& t) : target_(t) {}
  std::string name() const override { return "fuse-rms-norm"; }
  bool run(Graph& g) override {
    if (!target_.rmsNorm) return false;
    std::vector<Node*> candidates;
    for (const auto& n : g.nodes())
      if (isOnnxOp(n.get(), "Mul") || isOnnxOp(n.get(), "Div")) candidates.push_back(n.get());
    std::set<const Node*> erased;
    Matcher matcher(g);
    bool changed = false;
    for (Node* n : candidates) {
      Match m;
      if (erased.count(n) || !matcher.normalized(n, m)) continue;
      if (std::any_of(m.nodes.begin(), m.nodes.end(), [&](const Node* k) { return erased.count(k) != 0; })) continue;
      matcher.weight(n, m);
      if (erased.count(m.root)) continue;
      rewrite(g, m);
      for (Node* k : m.nodes) erased.insert(k);
      changed = true;
    }
    return changed;
  }

 private:
  static void rewrite(Graph& g, const Match& m) {
    g.domainOpsets.emplace(kGradDomain, 1);
    Value* scale = m.weight;
    if (!scale) {  // ones over the normalised dims, in x's type
      const auto& xs = m.x->type().shape;
      Tensor ones(TensorType{m.x->type().dtype, std::vector<int64_t>(xs.begin() + m.axis, xs.end())});
      for (int64_t k = 0; k < ones.numel(); ++k) ones.setDouble(k, 1.0);
      scale = g.addConst(g.uniqueName(m.root->result(0)->name() + ".rms_scale"), std::move(ones));
    }
    Value* old = m.root->result(0);
    const std::string oldName = old->name();
    Node* f = g.createNode("RmsNorm", kGradDomain, {m.x, scale}, {{g.uniqueName(oldName + ".rms"), old->type()}}, m.root);
    f->setName(m.root->name() + "/RmsNorm");
    f->setAttr("axis", m.axis);
    f->setAttr("epsilon", static_cast<float>(m.eps));
    old->replaceAllUsesWith(f->result(0));
    for (Node* k : m.nodes) g.eraseNode(k);  // root first: each node's one user is gone before it
    g.renameValue(f->result(0), oldName);
  }

  const Target& target_;
};

}  // namespace

std::unique_ptr<Pass> createFuseRmsNormPass(const Target& t) { return std::make_unique<FuseRmsNormPass>(t); }

}  // namespace ampc
