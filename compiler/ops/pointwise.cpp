// The elementwise ops' pointwise formulas (compiler/ops/pointwise.h), attached to their registry
// rows. Each mirrors its CPU kernel (kernels/cpu/k_elementwise.cpp) and CUDA kernel operation for
// operation, so a generated kernel rounds as they do.
#include "compiler/ops/pointwise.h"

#include <string_view>
#include <utility>

#include "compiler/ops/registry.h"

namespace ampc {
namespace {

using B = PwBuilder;
using V = PwValue;
using In = std::vector<PwValue>;

V sel(B& b, PwCmp c, V x, V y, V a, V e) { return b.select(b.compare(c, x, y), a, e); }
// std::max / std::min as the CPU kernels call them: max(a, b) = a < b ? b : a.
V stdMax(B& b, V x, V y) { return sel(b, PwCmp::Lt, x, y, y, x); }
V stdMin(B& b, V x, V y) { return sel(b, PwCmp::Lt, y, x, y, x); }
V sigmoid(B& b, V x) {
  const V e = b.math(PwMath::Exp, b.math(PwMath::Neg, x)), ep = b.math(PwMath::Exp, x);
  return sel(b, PwCmp::Ge, x, b.k(0), b.div(b.k(1), b.add(b.k(1), e)), b.div(ep, b.add(b.k(1), ep)));
}
V softplus(B& b, V x) {
  const V pos = b.add(x, b.math(PwMath::Log1p, b.math(PwMath::Exp, b.math(PwMath::Neg, x))));
  return sel(b, PwCmp::Gt, x, b.k(0), pos, b.math(PwMath::Log1p, b.math(PwMath::Exp, x)));
}
V geluErf(B& b, V x) { return b.mul(b.mul(b.k(0.5f), x), b.add(b.k(1), b.math(PwMath::Erf, b.mul(x, b.k(0.70710678118654752f))))); }
V geluTanhInner(B& b, V x) {  // tanh(k (x + 0.044715 x^3))
  const V x3 = b.mul(b.mul(b.mul(b.k(0.044715f), x), x), x);
  return b.math(PwMath::Tanh, b.mul(b.k(0.7978845608028654f), b.add(x, x3)));
}
bool tanhApprox(const Node& n) {
  const std::string a = n.getString("approximate", "none");
  if (a != "none" && a != "tanh") throw Error(n.describe() + ": unknown approximate '" + a + "'");
  return a == "tanh";
}

V gelu(B& b, const Node& n, const In& in) {
  const V x = in[0];
  if (!tanhApprox(n)) return geluErf(b, x);
  return b.mul(b.mul(b.k(0.5f), x), b.add(b.k(1), geluTanhInner(b, x)));
}
V geluGrad(B& b, const Node& n, const In& in) {
  const V dy = in[0], x = in[1];
  if (!tanhApprox(n)) {
    const V cdf = b.mul(b.k(0.5f), b.add(b.k(1), b.math(PwMath::Erf, b.mul(x, b.k(0.70710678118654752f)))));
    const V pdf = b.mul(b.mul(x, b.k(0.3989422804014327f)), b.math(PwMath::Exp, b.mul(b.mul(b.k(-0.5f), x), x)));
    return b.mul(dy, b.add(cdf, pdf));
  }
  const V t = geluTanhInner(b, x);
  const V left = b.mul(b.k(0.5f), b.add(b.k(1), t));
  const V slope = b.add(b.k(1), b.mul(b.mul(b.k(3.0f * 0.044715f), x), x));
  const V right = b.mul(b.mul(b.mul(b.mul(b.k(0.5f), x), b.sub(b.k(1), b.mul(t, t))), b.k(0.7978845608028654f)), slope);
  return b.mul(dy, b.add(left, right));
}
V silu(B& b, const Node&, const In& in) { return b.mul(in[0], sigmoid(b, in[0])); }
V siluGrad(B& b, const Node&, const In& in) {
  const V s = sigmoid(b, in[1]);
  return b.mul(b.mul(in[0], s), b.add(b.k(1), b.mul(in[1], b.sub(b.k(1), s))));
}
V relu(B& b, const Node&, const In& in) {
  const V x = in[0];
  return sel(b, PwCmp::Gt, x, b.k(0), x, sel(b, PwCmp::Unordered, x, x, x, b.k(0)));
}
V leakyRelu(B& b, const Node& n, const In& in) {
  const V x = in[0];
  return sel(b, PwCmp::Ge, x, b.k(0), x, b.mul(b.k(n.getFloat("alpha", 0.01f)), x));
}
V hardSigmoid(B& b, const Node& n, const In& in) {
  const V y = b.add(b.mul(b.k(n.getFloat("alpha", 0.2f)), in[0]), b.k(n.getFloat("beta", 0.5f)));
  return stdMax(b, b.k(0), stdMin(b, b.k(1), y));
}
V hardSwish(B& b, const Node&, const In& in) {
  const V x = in[0];
  return b.mul(x, stdMax(b, b.k(0), stdMin(b, b.k(1), b.add(b.div(x, b.k(6)), b.k(0.5f)))));
}
V elu(B& b, const Node& n, const In& in) {
  const V x = in[0];
  return sel(b, PwCmp::Gt, x, b.k(0), x, b.mul(b.k(n.getFloat("alpha", 1.0f)), b.math(PwMath::Expm1, x)));
}
V mish(B& b, const Node&, const In& in) { return b.mul(in[0], b.math(PwMath::Tanh, softplus(b, in[0]))); }
V clip(B& b, const Node&, const In& in) {  // min(max(x, lo), hi): hi everywhere when lo > hi, as numpy and PyTorch
  const V x = in[0];
  const V lower = in.size() > 1 && in[1].present() ? sel(b, PwCmp::Lt, x, in[1], in[1], x) : x;
  return in.size() > 2 && in[2].present() ? sel(b, PwCmp::Gt, lower, in[2], in[2], lower) : lower;
}
V maxMin(B& b, const Node& n, const In& in, PwCmp better) {
  (void)n;
  V r = in[0];
  for (size_t i = 1; i < in.size(); ++i)  // (r != r || r `better` x) ? r : x
    r = b.select(b.logic(PwLogic::Or, b.compare(PwCmp::Unordered, r, r), b.compare(better, r, in[i])), r, in[i]);
  return r;
}
V cast(B& b, const Node& n, const In& in) {
  const bool fromBool = n.input(0)->type().dtype == DType::boolean, toBool = n.result(0)->type().dtype == DType::boolean;
  if (fromBool && !toBool) return b.fromPredicate(in[0]);
  if (toBool && !fromBool) return b.toPredicate(in[0]);
  return in[0];  // the kernel rounds it to the result's dtype
}

template <PwMath M>
V unary(B& b, const Node&, const In& in) { return b.math(M, in[0]); }
template <PwMath M>
V binary(B& b, const Node&, const In& in) { return b.math(M, in[0], in[1]); }
template <PwCmp C>
V compare(B& b, const Node&, const In& in) { return b.compare(C, in[0], in[1]); }

const std::pair<std::pair<std::string_view, std::string_view>, PointwiseFn> kFormulas[] = {
    {{"", "Add"}, binary<PwMath::Add>},
    {{"", "Sub"}, binary<PwMath::Sub>},
    {{"", "Mul"}, binary<PwMath::Mul>},
    {{"", "Div"}, binary<PwMath::Div>},
    {{"", "Pow"}, binary<PwMath::Pow>},
    {{"", "Neg"}, unary<PwMath::Neg>},
    {{"", "Sqrt"}, unary<PwMath::Sqrt>},
    {{"", "Exp"}, unary<PwMath::Exp>},
    {{"", "Log"}, unary<PwMath::Log>},
    {{"", "Tanh"}, unary<PwMath::Tanh>},
    {{"", "Erf"}, unary<PwMath::Erf>},
    {{"", "Sin"}, unary<PwMath::Sin>},
    {{"", "Cos"}, unary<PwMath::Cos>},
    {{"", "Tan"}, unary<PwMath::Tan>},
    {{"", "Asin"}, unary<PwMath::Asin>},
    {{"", "Acos"}, unary<PwMath::Acos>},
    {{"", "Atan"}, unary<PwMath::Atan>},
    {{"", "Sinh"}, unary<PwMath::Sinh>},
    {{"", "Cosh"}, unary<PwMath::Cosh>},
    {{"", "Asinh"}, unary<PwMath::Asinh>},
    {{"", "Acosh"}, unary<PwMath::Acosh>},
    {{"", "Atanh"}, unary<PwMath::Atanh>},
    {{"", "Floor"}, unary<PwMath::Floor>},
    {{"", "Ceil"}, unary<PwMath::Ceil>},
    {{"", "Round"}, unary<PwMath::Rint>},
    {{"", "Reciprocal"}, [](B& b, const Node&, const In& in) { return b.div(b.k(1), in[0]); }},
    {{"", "Abs"}, [](B& b, const Node&, const In& in) { return sel(b, PwCmp::Lt, in[0], b.k(0), b.math(PwMath::Neg, in[0]), in[0]); }},
    {{"", "Sign"},
     [](B& b, const Node&, const In& in) {
       return sel(b, PwCmp::Gt, in[0], b.k(0), b.k(1), sel(b, PwCmp::Lt, in[0], b.k(0), b.k(-1), in[0]));
     }},
    {{"", "Sigmoid"}, [](B& b, const Node&, const In& in) { return sigmoid(b, in[0]); }},
    {{"", "Softplus"}, [](B& b, const Node&, const In& in) { return softplus(b, in[0]); }},
    {{"", "Relu"}, relu},
    {{"", "LeakyRelu"}, leakyRelu},
    {{"", "HardSigmoid"}, hardSigmoid},
    {{"", "HardSwish"}, hardSwish},
    {{"", "Elu"}, elu},
    {{"", "Mish"}, mish},
    {{"", "PRelu"}, [](B& b, const Node&, const In& in) { return sel(b, PwCmp::Lt, in[0], b.k(0), b.mul(in[1], in[0]), in[0]); }},
    {{"", "Clip"}, clip},
    {{"", "Max"}, [](B& b, const Node& n, const In& in) { return maxMin(b, n, in, PwCmp::Gt); }},
    {{"", "Min"}, [](B& b, const Node& n, const In& in) { return maxMin(b, n, in, PwCmp::Lt); }},
    {{"", "Gelu"}, gelu},
    {{"ampc", "Gelu"}, gelu},
    {{"ampc", "GeluGrad"}, geluGrad},
    {{"ampc", "Silu"}, silu},
    {{"ampc", "SiluGrad"}, siluGrad},
    {{"", "Equal"}, compare<PwCmp::Eq>},
    {{"", "Less"}, compare<PwCmp::Lt>},
    {{"", "LessOrEqual"}, compare<PwCmp::Le>},
    {{"", "Greater"}, compare<PwCmp::Gt>},
    {{"", "GreaterOrEqual"}, compare<PwCmp::Ge>},
    {{"", "IsNaN"}, [](B& b, const Node&, const In& in) { return b.compare(PwCmp::Unordered, in[0], in[0]); }},
    {{"", "And"}, [](B& b, const Node&, const In& in) { return b.logic(PwLogic::And, in[0], in[1]); }},
    {{"", "Or"}, [](B& b, const Node&, const In& in) { return b.logic(PwLogic::Or, in[0], in[1]); }},
    {{"", "Not"}, [](B& b, const Node&, const In& in) { return b.logic(PwLogic::Not, in[0]); }},
    {{"", "Where"}, [](B& b, const Node&, const In& in) { return b.select(in[0], in[1], in[2]); }},
    {{"", "Identity"}, [](B&, const Node&, const In& in) { return in[0]; }},
    {{"", "Cast"}, cast},
    {{"", "CastLike"}, cast},
};

}  // namespace

void attachPointwise(std::vector<OpDef>& t) {
  for (OpDef& d : t)
    for (const auto& [key, fn] : kFormulas)
      if (d.domain == key.first && d.name == key.second) d.pointwise = fn;
  // ampc.Fused: a group of pointwise nodes (fusedBody); its results are its body's outputs.
  t.push_back(OpDef{"Fused", "ampc", 1, 1, 0, -1, 1, -1, AmpCategory::Infer, false, [](InferContext& c) {
                      const auto body = fusedBody(c.node());
                      for (size_t i = 0; i < c.numInputs(); ++i)
                        c.check(c.hasInput(i) && c.in(i) == body->inputs()[i]->type(),
                                "operand " + std::to_string(i) + " must be " + body->inputs()[i]->type().str());
                      c.check(c.numOutputs() == body->outputs().size(), "the body has " + std::to_string(body->outputs().size()) + " outputs");
                      for (size_t i = 0; i < body->outputs().size(); ++i) c.setOut(i, body->outputs()[i]->type());
                    }});
}

PointwiseFn pointwiseFormula(const Node& n) {
  if (!n.def() || !n.def()->pointwise) return nullptr;
  if (n.op() == "Gelu" || n.op() == "GeluGrad") {
    const std::string a = n.getString("approximate", "none");
    if (a != "none" && a != "tanh") return nullptr;
  }
  return n.def()->pointwise;
}

}  // namespace ampc

#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "compiler/ir/text.h"

namespace ampc {

std::shared_ptr<const Graph> fusedBody(const Node& fused) {
  const Attribute* attr = fused.attr("body");
  const std::string* text = attr ? std::get_if<std::string>(attr) : nullptr;
  if (!text) throw Error(fused.describe() + ": ampc.Fused needs a string attribute 'body'");
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Graph>> cache;
  std::shared_ptr<const Graph> body;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(*text);
    if (it != cache.end()) body = it->second;
  }
  if (!body) {
    std::shared_ptr<Graph> g;
    try {
      g = parseGraph(*text, fused.name() + ".body");
      g->bindOps();
      verify(*g);
    } catch (const Error& e) {
      throw Error(fused.describe() + ": bad body: " + e.what());
    }
    if (g->outputs().empty()) throw Error(fused.describe() + ": the body has no outputs");
    std::set<const Value*> outs;
    for (const Value* v : g->outputs())
      if (!v->producer() || !outs.insert(v).second)
        throw Error(fused.describe() + ": body output '" + v->name() + "' must be a node's result, once");
    for (const auto& n : g->nodes()) {
      for (const Value* v : n->inputs())
        if (v && v->type().dtype != DType::boolean && !isFloat(v->type().dtype))
          throw Error(fused.describe() + ": body node " + n->describe() + " reads a " + v->type().str() + " (only float and bool fuse)");
      if (n->numResults() != 1 || !pointwiseFormula(*n))
        throw Error(fused.describe() + ": body node " + n->describe() + " has no pointwise formula");
    }
    for (const Value* v : g->params()) throw Error(fused.describe() + ": the body declares a parameter '" + v->name() + "'");
    // One domain: every node's result has the first output's shape, every input broadcasts to it.
    const auto& domain = g->outputs()[0]->type().shape;
    for (const auto& n : g->nodes())
      if (n->result(0)->type().shape != domain)
        throw Error(fused.describe() + ": body node " + n->describe() + " is " + n->result(0)->type().str() + ", not the group's shape");
    for (const auto* list : {&g->inputs(), &g->consts()})
      for (const Value* v : *list) {
        const auto& s = v->type().shape;
        bool ok = s.size() <= domain.size();
        for (size_t k = 0; ok && k < s.size(); ++k) ok = s[k] == 1 || s[k] == domain[domain.size() - s.size() + k];
        if (!ok) throw Error(fused.describe() + ": body operand '" + v->name() + "' " + v->type().str() + " does not broadcast to the group's shape");
      }
    std::lock_guard<std::mutex> lock(mu);
    body = cache.emplace(*text, std::move(g)).first->second;
  }
  if (body->inputs().size() != fused.numInputs())
    throw Error(fused.describe() + ": " + std::to_string(fused.numInputs()) + " operands for a body of " + std::to_string(body->inputs().size()) + " inputs");
  return body;
}

}  // namespace ampc
