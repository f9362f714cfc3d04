// Gradient rules, one per differentiable op, and the "ampc" domain's backward ops (the ones ONNX
// lacks). Every rule gives each input that needs a gradient a tensor of the input's own shape and
// dtype; broadcast inputs are reduced back with reduceTo.
#include <cmath>
#include <numeric>

#include "compiler/ops/families.h"
#include "compiler/ops/geometry.h"
#include "compiler/ops/grad.h"
#include "compiler/target.h"

namespace ampc {
namespace {

using GB = GradBuilder;
using Attrs = std::map<std::string, Attribute>;

DType dt(const Value* v) { return v->type().dtype; }
const std::vector<int64_t>& shapeOf(const Value* v) { return v->type().shape; }

// ---- elementwise

void gradAdd(GB& b) {
  for (size_t i = 0; i < 2; ++i)
    if (b.needs(i)) b.setGrad(i, b.reduceTo(b.dy(0), shapeOf(b.x(i))));
}
void gradSub(GB& b) {
  if (b.needs(0)) b.setGrad(0, b.reduceTo(b.dy(0), shapeOf(b.x(0))));
  if (b.needs(1)) b.setGrad(1, b.reduceTo(b.neg(b.dy(0)), shapeOf(b.x(1))));
}
void gradMul(GB& b) {
  if (b.needs(0)) b.setGrad(0, b.reduceTo(b.mul(b.dy(0), b.x(1)), shapeOf(b.x(0))));
  if (b.needs(1)) b.setGrad(1, b.reduceTo(b.mul(b.dy(0), b.x(0)), shapeOf(b.x(1))));
}
void gradDiv(GB& b) {
  if (b.needs(0)) b.setGrad(0, b.reduceTo(b.div(b.dy(0), b.x(1)), shapeOf(b.x(0))));
  if (b.needs(1)) b.setGrad(1, b.reduceTo(b.neg(b.div(b.mul(b.dy(0), b.y(0)), b.x(1))), shapeOf(b.x(1))));
}
// Mod(a, b) = a - q b with q = trunc(a / b) (fmod = 1, C's fmod) or floor(a / b) (fmod = 0, Python's
// %): PyTorch's fmod and remainder give da = dy and db = -q dy. q is the integer (a - y) / b
// rounded, exact where a / b is: no trunc op is needed.
void gradMod(GB& b) {
  if (b.needs(0)) b.setGrad(0, b.reduceTo(b.dy(0), shapeOf(b.x(0))));
  if (b.needs(1)) {
    Value* q = b.op("Round", {b.div(b.sub(b.x(0), b.y(0)), b.x(1))});
    b.setGrad(1, b.reduceTo(b.neg(b.mul(b.dy(0), q)), shapeOf(b.x(1))));
  }
}
// As PyTorch's pow derivatives: e x^(e-1), 0 where e = 0 (not 0 * inf at x = 0); y log(x), 0 where
// x = 0 and e >= 0 (not 0 * -inf).
void gradPow(GB& b) {
  Value* e = b.cast(b.x(1), dt(b.x(0)));
  Value* zero = b.scalar(0, dt(b.x(0)));
  if (b.needs(0)) {
    Value* d = b.mul(e, b.op("Pow", {b.x(0), b.sub(e, b.scalar(1, dt(e)))}));
    bool zeroExponent = true;  // a constant exponent without a 0 (x^2, x^3 in GELU's tanh form) needs no Where
    if (const Tensor* c = b.x(1)->constData()) {
      zeroExponent = false;
      for (int64_t i = 0; i < c->numel(); ++i) zeroExponent = zeroExponent || c->getDouble(i) == 0.0;
    }
    if (zeroExponent) d = b.where(b.op("Equal", {e, zero}), zero, d);
    b.setGrad(0, b.reduceTo(b.mul(b.dy(0), d), shapeOf(b.x(0))));
  }
  if (b.needs(1)) {
    Value* d = b.mul(b.dy(0), b.mul(b.y(0), b.op("Log", {b.x(0)})));
    Value* flat = b.op("And", {b.op("Equal", {b.x(0), zero}), b.op("GreaterOrEqual", {e, zero})});
    d = b.where(flat, b.scalar(0, dt(d)), d);
    b.setGrad(1, b.cast(b.reduceTo(d, shapeOf(b.x(1))), dt(b.x(1))));
  }
}
void gradSqrt(GB& b) { b.setGrad(0, b.div(b.mul(b.dy(0), b.scalar(0.5, dt(b.x(0)))), b.y(0))); }
void gradReciprocal(GB& b) { b.setGrad(0, b.neg(b.mul(b.dy(0), b.mul(b.y(0), b.y(0))))); }
void gradNeg(GB& b) { b.setGrad(0, b.neg(b.dy(0))); }
void gradAbs(GB& b) {
  Value* z = b.scalar(0, dt(b.x(0)));
  Value* pos = b.where(b.op("Greater", {b.x(0), z}), b.dy(0), b.scalar(0, dt(b.dy(0))));
  b.setGrad(0, b.where(b.op("Less", {b.x(0), z}), b.neg(b.dy(0)), pos));
}
void gradSin(GB& b) { b.setGrad(0, b.mul(b.dy(0), b.op("Cos", {b.x(0)}))); }
void gradCos(GB& b) { b.setGrad(0, b.neg(b.mul(b.dy(0), b.op("Sin", {b.x(0)})))); }
void gradTan(GB& b) {  // 1 + tan^2
  b.setGrad(0, b.mul(b.dy(0), b.add(b.scalar(1, dt(b.x(0))), b.mul(b.y(0), b.y(0)))));
}
// dY / sqrt(1 - x^2), negated for acos.
void gradArcSine(GB& b, bool negate) {
  const DType t = dt(b.x(0));
  Value* r = b.op("Sqrt", {b.sub(b.scalar(1, t), b.mul(b.x(0), b.x(0)))});
  Value* g = b.div(b.dy(0), r);
  b.setGrad(0, negate ? b.neg(g) : g);
}
void gradAsin(GB& b) { gradArcSine(b, false); }
void gradAcos(GB& b) { gradArcSine(b, true); }
void gradAtan(GB& b) { b.setGrad(0, b.div(b.dy(0), b.add(b.scalar(1, dt(b.x(0))), b.mul(b.x(0), b.x(0))))); }
void gradSinh(GB& b) { b.setGrad(0, b.mul(b.dy(0), b.op("Cosh", {b.x(0)}))); }
void gradCosh(GB& b) { b.setGrad(0, b.mul(b.dy(0), b.op("Sinh", {b.x(0)}))); }
void gradAsinh(GB& b) { b.setGrad(0, b.div(b.dy(0), b.op("Sqrt", {b.add(b.mul(b.x(0), b.x(0)), b.scalar(1, dt(b.x(0))))}))); }
void gradAcosh(GB& b) {  // 1 / sqrt((x - 1)(x + 1))
  const DType t = dt(b.x(0));
  b.setGrad(0, b.div(b.dy(0), b.op("Sqrt", {b.mul(b.sub(b.x(0), b.scalar(1, t)), b.add(b.x(0), b.scalar(1, t)))})));
}
void gradAtanh(GB& b) { b.setGrad(0, b.div(b.dy(0), b.sub(b.scalar(1, dt(b.x(0))), b.mul(b.x(0), b.x(0))))); }
// A prefix sum's gradient is the suffix sum of dY (exclusive stays exclusive).
void gradCumSum(GB& b) {
  b.setGrad(0, b.op("CumSum", {b.dy(0), b.x(1)}, {{"exclusive", b.node.getInt("exclusive", 0)}, {"reverse", int64_t{b.node.getInt("reverse", 0) == 0}}}));
}
// dY where the mask holds, else 0.
Value* gated(GB& b, Value* mask, Value* v) { return b.where(mask, v, b.scalar(0, dt(v))); }
void gradHardSigmoid(GB& b) {  // alpha where 0 < alpha x + beta < 1
  const DType t = dt(b.x(0));
  const double a = b.node.getFloat("alpha", 0.2f), be = b.node.getFloat("beta", 0.5f);
  Value* z = b.add(b.mul(b.x(0), b.scalar(a, t)), b.scalar(be, t));
  Value* in = b.op("And", {b.op("Greater", {z, b.scalar(0, t)}), b.op("Less", {z, b.scalar(1, t)})});
  b.setGrad(0, gated(b, in, b.mul(b.dy(0), b.scalar(a, t))));
}
void gradHardSwish(GB& b) {  // 0 below -3, 1 above 3, x/3 + 1/2 between
  const DType t = dt(b.x(0));
  Value* x = b.x(0);
  Value* mid = b.mul(b.dy(0), b.add(b.div(x, b.scalar(3, t)), b.scalar(0.5, t)));
  Value* upper = b.where(b.op("Greater", {x, b.scalar(3, t)}), b.dy(0), mid);
  b.setGrad(0, gated(b, b.op("GreaterOrEqual", {x, b.scalar(-3, t)}), upper));
}
// Elu / Selu / Celu: from the output where x <= 0 (y + alpha for Elu, y + gamma alpha for Selu,
// y / alpha + 1 for Celu), the slope (1 or gamma) above.
void gradExpLinear(GB& b, double slope, Value* below) {
  Value* pos = b.op("Greater", {b.x(0), b.scalar(0, dt(b.x(0)))});
  Value* up = slope == 1 ? b.dy(0) : b.mul(b.dy(0), b.scalar(slope, dt(b.x(0))));
  b.setGrad(0, b.where(pos, up, b.mul(b.dy(0), below)));
}
void gradElu(GB& b) { gradExpLinear(b, 1, b.add(b.y(0), b.scalar(b.node.getFloat("alpha", 1.0f), dt(b.x(0))))); }
void gradSelu(GB& b) {
  const double a = b.node.getFloat("alpha", 1.67326319217681884765625f), g = b.node.getFloat("gamma", 1.05070102214813232421875f);
  gradExpLinear(b, g, b.add(b.y(0), b.scalar(a * g, dt(b.x(0)))));
}
void gradCelu(GB& b) {
  const DType t = dt(b.x(0));
  const double a = b.node.getFloat("alpha", 1.0f);
  gradExpLinear(b, 1, b.add(b.div(b.y(0), b.scalar(a, t)), b.scalar(1, t)));
}
void gradSoftsign(GB& b) {  // 1 / (1 + |x|)^2
  const DType t = dt(b.x(0));
  Value* d = b.add(b.scalar(1, t), b.op("Abs", {b.x(0)}));
  b.setGrad(0, b.div(b.dy(0), b.mul(d, d)));
}
void gradMish(GB& b) {  // tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2), sp = softplus(x)
  const DType t = dt(b.x(0));
  Value* th = b.op("Tanh", {b.op("Softplus", {b.x(0)})});
  Value* sech2 = b.sub(b.scalar(1, t), b.mul(th, th));
  Value* d = b.add(th, b.mul(b.mul(b.x(0), b.op("Sigmoid", {b.x(0)})), sech2));
  b.setGrad(0, b.mul(b.dy(0), d));
}
// As PyTorch's prelu backward: the slope where x is not > 0 (x = 0 included, as LeakyRelu).
void gradPRelu(GB& b) {
  Value* neg = b.op("Not", {b.op("Greater", {b.x(0), b.scalar(0, dt(b.x(0)))})});
  if (b.needs(0)) b.setGrad(0, b.where(neg, b.mul(b.dy(0), b.x(1)), b.dy(0)));
  if (b.needs(1)) b.setGrad(1, b.reduceTo(gated(b, neg, b.mul(b.dy(0), b.x(0))), shapeOf(b.x(1))));
}
void gradExp(GB& b) { b.setGrad(0, b.mul(b.dy(0), b.y(0))); }
void gradLog(GB& b) { b.setGrad(0, b.div(b.dy(0), b.x(0))); }
void gradTanh(GB& b) {
  Value* one = b.scalar(1, dt(b.x(0)));
  b.setGrad(0, b.mul(b.dy(0), b.sub(one, b.mul(b.y(0), b.y(0)))));
}
void gradSigmoid(GB& b) {
  Value* one = b.scalar(1, dt(b.x(0)));
  b.setGrad(0, b.mul(b.dy(0), b.mul(b.y(0), b.sub(one, b.y(0)))));
}
// From the output, as PyTorch does: y > 0 exactly where x > 0 (NaN on neither side), and the
// output is usually saved anyway (the next op's input), so the input need not be.
void gradRelu(GB& b) {
  b.setGrad(0, b.where(b.op("Greater", {b.y(0), b.scalar(0, dt(b.y(0)))}), b.dy(0), b.scalar(0, dt(b.dy(0)))));
}
void gradLeakyRelu(GB& b) {
  const double alpha = b.node.getFloat("alpha", 0.01f);
  Value* pos = b.op("Greater", {b.x(0), b.scalar(0, dt(b.x(0)))});
  b.setGrad(0, b.where(pos, b.dy(0), b.mul(b.dy(0), b.scalar(alpha, dt(b.x(0))))));
}
void gradErf(GB& b) {  // 2/sqrt(pi) exp(-x^2)
  const DType t = dt(b.x(0));
  Value* e = b.op("Exp", {b.neg(b.mul(b.x(0), b.x(0)))});
  b.setGrad(0, b.mul(b.dy(0), b.mul(e, b.scalar(1.1283791670955126, t))));
}
void gradSoftplus(GB& b) { b.setGrad(0, b.mul(b.dy(0), b.op("Sigmoid", {b.x(0)}))); }
// Gelu (ONNX, or ampc.Gelu from fuse-gelu): one backward op, ampc.GeluGrad(dY, X) {approximate}.
void gradGelu(GB& b) {
  const std::string approx = b.node.getString("approximate", "none");
  if (approx != "none" && approx != "tanh") b.fail("unknown approximate '" + approx + "'");
  b.setGrad(0, b.op("GeluGrad", {b.dy(0), b.x(0)}, {{"approximate", approx}}, kGradDomain));
}
void gradRotateHalf(GB& b) { b.setGrad(0, b.op("RotateHalf", {b.dy(0)}, {{"sign", -b.node.getInt("sign", 1)}}, kGradDomain)); }
void gradSilu(GB& b) { b.setGrad(0, b.op("SiluGrad", {b.dy(0), b.x(0)}, {}, kGradDomain)); }
void gradClip(GB& b) {
  Value* x = b.x(0);
  Value* inside = nullptr;
  if (b.x(1)) inside = b.op("GreaterOrEqual", {x, b.x(1)});
  if (b.x(2)) {
    Value* le = b.op("LessOrEqual", {x, b.x(2)});
    inside = inside ? b.op("And", {inside, le}) : le;
  }
  b.setGrad(0, inside ? b.where(inside, b.dy(0), b.scalar(0, dt(b.dy(0)))) : b.dy(0));
  // Trained bounds (a learned clipping threshold): each takes the gradient of the elements whose
  // result it is. y = min(max(x, lo), hi): lo where x < lo <= hi; hi where max(x, lo) > hi.
  Value* zero = b.scalar(0, dt(b.dy(0)));
  if (b.needs(1)) {
    Value* hit = b.op("Less", {x, b.x(1)});
    if (b.x(2)) hit = b.op("And", {hit, b.op("LessOrEqual", {b.x(1), b.x(2)})});
    b.setGrad(1, b.reduceTo(b.where(hit, b.dy(0), zero), shapeOf(b.x(1))));
  }
  if (b.needs(2)) {
    Value* hit = b.op("Greater", {b.x(1) ? b.op("Max", {x, b.x(1)}) : x, b.x(2)});
    b.setGrad(2, b.reduceTo(b.where(hit, b.dy(0), zero), shapeOf(b.x(2))));
  }
}
// Max / Min: the inputs equal to the result take the gradient. Where an input is a constant (a
// clamp's bound: the exporters write clamp_min(x, t) and clamp(x, lo, hi) as Max / Min) the other
// takes all of it at a tie, as clamp's derivative gives x; where every input is computed
// (torch.maximum, minimum), or the node says so (kTiesShared: a constant that was a tensor of the
// forward), the tied inputs share it evenly, as PyTorch's derivative does.
void gradMaxMin(GB& b) {
  const size_t n = b.node.numInputs();
  bool split = n > 1;
  for (size_t i = 0; i < n; ++i) split = split && !b.x(i)->constData();
  split = split || (n > 1 && b.node.getInt(kTiesShared, 0) != 0);
  Value* zero = b.scalar(0, dt(b.dy(0)));
  std::vector<Value*> hits(n);
  for (size_t i = 0; i < n; ++i)
    if (b.needs(i) || split) hits[i] = b.op("Equal", {b.x(i), b.y(0)});
  Value* d = b.dy(0);
  if (split) {  // dy / (the number of inputs at the extreme), at the result's shape
    Value* ties = nullptr;
    for (Value* h : hits) {
      Value* c = b.cast(h, dt(d));
      ties = ties ? b.add(ties, c) : c;
    }
    d = b.where(b.op("Greater", {ties, zero}), b.div(d, ties), zero);
  }
  for (size_t i = 0; i < n; ++i)
    if (b.needs(i)) b.setGrad(i, b.reduceTo(b.where(hits[i], d, zero), shapeOf(b.x(i))));
}
void gradWhere(GB& b) {
  Value* z = b.scalar(0, dt(b.dy(0)));
  if (b.needs(1)) b.setGrad(1, b.reduceTo(b.where(b.x(0), b.dy(0), z), shapeOf(b.x(1))));
  if (b.needs(2)) b.setGrad(2, b.reduceTo(b.where(b.x(0), z, b.dy(0)), shapeOf(b.x(2))));
}
void gradIdentity(GB& b) { b.setGrad(0, b.dy(0)); }
void gradCast(GB& b) {
  if (isFloat(dt(b.x(0)))) b.setGrad(0, b.cast(b.dy(0), dt(b.x(0))));
}
// Dropout reuses its forward mask (the pass gives the node a mask result); the backward op
// applies the same scale, and is the identity wherever the forward was (inference, ratio 0,
// dropout switched off for a run).
void gradDropout(GB& b) {
  if (b.node.numResults() < 2) b.fail("needs the mask result");
  std::vector<Value*> ins{b.dy(0), b.y(1)};
  if (b.x(1)) ins.push_back(b.x(1));
  if (b.x(2)) {
    if (!b.x(1)) b.fail("training_mode without ratio");
    ins.push_back(b.x(2));
  }
  b.setGrad(0, b.op("DropoutGrad", ins, {}, kGradDomain));
}

// Fused attention: one backward op recomputes the probabilities from the saved log-sum-exp. A
// trainable mask (an additive bias) gets its gradient as a fourth result.
void gradAttention(GB& b) {
  if (!b.dy(0)) return;
  std::vector<Value*> ins{b.dy(0), b.x(0), b.x(1), b.x(2), b.y(0), b.y(1)};
  if (b.x(3)) ins.push_back(b.x(3));
  if (b.x(4)) ins.push_back(b.x(4));  // where_masked (after the mask, which it needs)
  const bool maskGrad = b.x(3) && b.needs(3);
  auto r = b.opN("AttentionGrad", ins, b.node.attrs(), kGradDomain, maskGrad ? 4 : 3);
  for (size_t i = 0; i < r.size(); ++i)
    if (b.needs(i)) b.setGrad(i, r[i]);
}

// ---- GEMMs

// Swaps the last two axes.
Value* transposeLast2(GB& b, Value* v) {
  const int64_t r = v->type().rank();
  std::vector<int64_t> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[r - 1], perm[r - 2]);
  return b.op("Transpose", {v}, {{"perm", perm}});
}
void gradMatMul(GB& b) {
  Value *a = b.x(0), *w = b.x(1), *d = b.dy(0);
  // 1-D operands become matrices: a [K] -> [1,K], w [K] -> [K,1]; the gradient follows.
  if (a->type().rank() == 1) a = b.reshape(a, {1, shapeOf(a)[0]});
  if (w->type().rank() == 1) w = b.reshape(w, {shapeOf(w)[0], 1});
  std::vector<int64_t> ds(shapeOf(a).begin(), shapeOf(a).end() - 2);
  {
    std::vector<int64_t> wb(shapeOf(w).begin(), shapeOf(w).end() - 2);
    const size_t r = std::max(ds.size(), wb.size());
    std::vector<int64_t> o(r);
    for (size_t i = 0; i < r; ++i) {
      int64_t x = i < r - ds.size() ? 1 : ds[i - (r - ds.size())], y = i < r - wb.size() ? 1 : wb[i - (r - wb.size())];
      o[i] = std::max(x, y);
    }
    ds = o;
  }
  ds.push_back(shapeOf(a)[shapeOf(a).size() - 2]);
  ds.push_back(shapeOf(w).back());
  d = b.reshape(d, ds);
  if (b.needs(0)) b.setGrad(0, b.reshape(b.reduceTo(b.op("MatMul", {d, transposeLast2(b, w)}), shapeOf(a)), shapeOf(b.x(0))));
  if (!b.needs(1)) return;
  if (shapeOf(w).size() == 2 && shapeOf(a).size() > 2) {
    // A batch of activations times one matrix: dW = A^T dY over the flattened batch, one GEMM
    // (not a batched product and a sum over the batch).
    const int64_t K = shapeOf(a).back(), N = shapeOf(w).back(), rows = a->type().numel() / std::max<int64_t>(K, 1);
    Value* g = b.op("Gemm", {b.reshape(a, {rows, K}), b.reshape(d, {rows, N})}, {{"transA", int64_t{1}}});
    b.setGrad(1, b.reshape(g, shapeOf(b.x(1))));
    return;
  }
  b.setGrad(1, b.reshape(b.reduceTo(b.op("MatMul", {transposeLast2(b, a), d}), shapeOf(w)), shapeOf(b.x(1))));
}
void gradGemm(GB& b) {
  const bool ta = b.node.getInt("transA", 0), tb = b.node.getInt("transB", 0);
  const float alpha = b.node.getFloat("alpha", 1.0f), beta = b.node.getFloat("beta", 1.0f);
  Value *A = b.x(0), *B = b.x(1), *D = b.dy(0);
  auto gemm = [&](Value* p, Value* q, int64_t tp, int64_t tq) {
    return b.op("Gemm", {p, q}, {{"alpha", alpha}, {"transA", tp}, {"transB", tq}});
  };
  if (b.needs(0)) b.setGrad(0, ta ? gemm(B, D, tb ? 1 : 0, 1) : gemm(D, B, 0, tb ? 0 : 1));
  if (b.needs(1)) b.setGrad(1, tb ? gemm(D, A, 1, ta ? 1 : 0) : gemm(A, D, ta ? 0 : 1, 0));
  if (b.x(2) && b.needs(2)) {
    Value* g = beta == 1.0f ? D : b.mul(D, b.scalar(beta, dt(D)));
    b.setGrad(2, b.reduceTo(g, shapeOf(b.x(2))));
  }
}

// ---- convolution, pooling, normalisation, losses: "ampc" backward ops

Attrs copyAttrs(const Node& n) {
  Attrs a(n.attrs().begin(), n.attrs().end());
  return a;
}
void gradConv(GB& b) {
  Attrs a = copyAttrs(b.node);
  auto r = b.opN("ConvGrad", {b.dy(0), b.x(0), b.x(1)}, a, kGradDomain, 2);
  if (b.needs(0)) b.setGrad(0, r[0]);
  if (b.needs(1)) b.setGrad(1, r[1]);
  if (b.x(2) && b.needs(2)) {
    std::vector<int64_t> axes{0};
    for (int64_t i = 2; i < b.dy(0)->type().rank(); ++i) axes.push_back(i);
    b.setGrad(2, b.op("ReduceSum", {b.dy(0), b.ints(axes)}, {{"keepdims", int64_t{0}}}));
  }
}
void gradMaxPool(GB& b) {
  if (b.node.numResults() < 2) b.fail("needs the Indices result");
  Attrs a{{"shape", shapeOf(b.x(0))}};
  b.setGrad(0, b.op("ScatterAddFlat", {b.dy(0), b.y(1)}, a, kGradDomain));
}
void gradAveragePool(GB& b) {
  Attrs a = copyAttrs(b.node);
  b.setGrad(0, b.op("AveragePoolGrad", {b.dy(0), b.x(0)}, a, kGradDomain));
}
void gradGlobalAveragePool(GB& b) {
  const auto& s = shapeOf(b.x(0));
  double n = 1;
  for (size_t i = 2; i < s.size(); ++i) n *= static_cast<double>(s[i]);
  Value* e = b.op("Expand", {b.dy(0), b.ints(s)});
  b.setGrad(0, b.mul(e, b.scalar(1.0 / n, dt(b.x(0)))));
}
// BatchNormalization. In training form Y reads the batch's statistics, not operands 3 and 4 (the
// running statistics, which only the extra results update): they get no gradient. In inference
// form Y = s (X - m) / sqrt(v + eps) + B reads them, and where they are computed from trained
// values they get theirs: the dynamo exporter writes timm's weight standardisation (F.batch_norm
// of a conv weight without running statistics) as the inference form with the weight's own mean
// and variance as m and v. From BatchNormGrad's sums dB = sum(dY) and dS = sum(dY xhat):
// dm = -s inv dB, dv = -s inv^2 dS / 2, with inv = (v + eps)^-1/2.
void gradBatchNorm(GB& b) {
  Attrs a = copyAttrs(b.node);
  auto r = b.opN("BatchNormGrad", {b.dy(0), b.x(0), b.x(1), b.x(3), b.x(4)}, a, kGradDomain, 3);
  for (size_t i = 0; i < 3; ++i)
    if (b.needs(i)) b.setGrad(i, r[i]);
  if (b.node.getInt("training_mode", 0) != 0) {
    b.zeroGrad(3);
    b.zeroGrad(4);
    return;
  }
  if (!b.needs(3) && !b.needs(4)) return;
  const DType t = dt(b.x(3));
  Value* inv = b.op("Reciprocal", {b.op("Sqrt", {b.add(b.cast(b.x(4), t), b.scalar(b.node.getFloat("epsilon", 1e-5f), t))})});
  Value* sInv = b.mul(b.cast(b.x(1), t), inv);
  if (b.needs(3)) b.setGrad(3, b.cast(b.neg(b.mul(sInv, b.cast(r[2], t))), dt(b.x(3))));
  if (b.needs(4)) b.setGrad(4, b.cast(b.mul(b.mul(sInv, inv), b.mul(b.cast(r[1], t), b.scalar(-0.5, t))), dt(b.x(4))));
}
void gradLayerNorm(GB& b) {
  Attrs a = copyAttrs(b.node);
  auto r = b.opN("LayerNormGrad", {b.dy(0), b.x(0), b.x(1)}, a, kGradDomain, 3);
  for (size_t i = 0; i < 3; ++i)
    if (b.x(i) && b.needs(i)) b.setGrad(i, i == 2 ? b.reduceTo(r[2], shapeOf(b.x(2))) : i == 1 ? b.reduceTo(r[1], shapeOf(b.x(1))) : r[0]);
}
// ampc.RmsNorm: LayerNormGrad {rms = 1} (no mean: dX = inv (g - xhat mean(g xhat)) with g = dY scale).
void gradRmsNorm(GB& b) {
  Attrs a = copyAttrs(b.node);
  a["rms"] = Attribute(int64_t{1});
  auto r = b.opN("LayerNormGrad", {b.dy(0), b.x(0), b.x(1)}, a, kGradDomain, 3);
  if (b.needs(0)) b.setGrad(0, r[0]);
  if (b.needs(1)) b.setGrad(1, b.reduceTo(r[1], shapeOf(b.x(1))));
}
void gradSoftmax(GB& b) {  // y * (dy - sum(dy * y))
  const int64_t axis = b.node.getInt("axis", -1);
  Value* s = b.op("ReduceSum", {b.mul(b.dy(0), b.y(0)), b.ints({axis})}, {{"keepdims", int64_t{1}}});
  b.setGrad(0, b.mul(b.y(0), b.sub(b.dy(0), s)));
}
void gradLogSoftmax(GB& b) {  // dy - exp(y) * sum(dy)
  const int64_t axis = b.node.getInt("axis", -1);
  Value* s = b.op("ReduceSum", {b.dy(0), b.ints({axis})}, {{"keepdims", int64_t{1}}});
  b.setGrad(0, b.sub(b.dy(0), b.mul(b.op("Exp", {b.y(0)}), s)));
}
std::vector<int64_t> reduceAxes(GB& b) {
  std::vector<int64_t> axes = b.node.getInts("axes");
  if (b.x(1)) axes = b.x(1)->constData()->toInts();
  const int64_t r = b.x(0)->type().rank();
  if (axes.empty()) {
    if (b.node.getInt("noop_with_empty_axes", 0)) return {};
    axes.resize(r);
    std::iota(axes.begin(), axes.end(), 0);
  }
  for (auto& a : axes) a = normalizeAxis(a, r);
  return axes;
}
// dy reshaped to keepdims form and broadcast back to x's shape.
Value* expandBack(GB& b, Value* d, const std::vector<int64_t>& axes) {
  std::vector<int64_t> keep = shapeOf(b.x(0));
  for (int64_t a : axes) keep[a] = 1;
  return b.op("Expand", {b.reshape(d, keep), b.ints(shapeOf(b.x(0)))});
}
void gradReduceSum(GB& b) { b.setGrad(0, expandBack(b, b.dy(0), reduceAxes(b))); }
void gradReduceMean(GB& b) {
  auto axes = reduceAxes(b);
  double n = 1;
  for (int64_t a : axes) n *= static_cast<double>(shapeOf(b.x(0))[a]);
  b.setGrad(0, b.mul(expandBack(b, b.dy(0), axes), b.scalar(1.0 / n, dt(b.x(0)))));
}
// ReduceMax / ReduceMin, as PyTorch differentiates the reductions that export to them. Ties (equal
// elements at the extreme, common in bf16 and after a ReLU) share the gradient evenly: torch.amax,
// amin and the full max() / min(). A reduction the importer marked kGradToFirst (max(dim) / min(dim),
// written with an ArgMax beside it, and GlobalMaxPool, adaptive_max_pool2d's) gives it all to the
// first extreme element in row-major order over the reduced axes, the index PyTorch returns.
void gradReduceMaxMin(GB& b) {
  auto axes = reduceAxes(b);
  if (axes.empty()) {  // noop_with_empty_axes: the identity
    b.setGrad(0, b.dy(0));
    return;
  }
  Value* x = b.x(0);
  const DType t = dt(b.dy(0));
  Value* hit = b.op("Equal", {x, expandBack(b, b.y(0), axes)});
  Value* zero = b.scalar(0, t);
  if (b.node.getInt(kGradToFirst, 0)) {
    // The count of hits up to each element along the reduced axes (contiguous: merged into one) is 1
    // at the first. CumSum in f32 counts exactly to 2^24 elements.
    std::sort(axes.begin(), axes.end());
    for (size_t i = 1; i < axes.size(); ++i)
      if (axes[i] != axes[i - 1] + 1) b.fail(std::string(kGradToFirst) + " over axes that are not contiguous");
    const auto& s = shapeOf(x);
    std::vector<int64_t> merged(s.begin(), s.begin() + axes.front());
    int64_t n = 1;
    for (int64_t a : axes) n *= s[a];
    merged.push_back(n);
    merged.insert(merged.end(), s.begin() + axes.back() + 1, s.end());
    Value* counts = b.op("CumSum", {b.reshape(b.cast(hit, DType::f32), merged), b.ints({axes.front()})});
    Value* first = b.op("And", {hit, b.op("Equal", {b.reshape(counts, s), b.scalar(1, DType::f32)})});
    b.setGrad(0, b.where(first, expandBack(b, b.dy(0), axes), zero));
    return;
  }
  // The count and the share in f32 at least (exact to 2^24; bf16 would round a count past 256).
  const DType ct = t == DType::f64 ? DType::f64 : DType::f32;
  Value* ties = b.op("ReduceSum", {b.cast(hit, ct), b.ints(axes)}, {{"keepdims", int64_t{1}}});
  Value* share = b.cast(b.div(b.cast(b.reshape(b.dy(0), shapeOf(ties)), ct), ties), t);  // at the kept shape
  b.setGrad(0, b.where(hit, expandBack(b, share, axes), zero));
}
void gradLoss(GB& b, const char* op) {
  if (b.dy(1)) b.fail("a gradient through log_prob is not supported");
  std::vector<Value*> ins{b.dy(0), b.x(0), b.x(1)};
  if (b.x(2)) ins.push_back(b.x(2));
  Attrs a = copyAttrs(b.node);
  b.setGrad(0, b.op(op, ins, a, kGradDomain));
}
void gradSce(GB& b) { gradLoss(b, "SoftmaxCrossEntropyLossGrad"); }
void gradNll(GB& b) { gradLoss(b, "NegativeLogLikelihoodLossGrad"); }

// ---- data movement

void gradReshapeLike(GB& b) { b.setGrad(0, b.reshape(b.dy(0), shapeOf(b.x(0)))); }
void gradTranspose(GB& b) {
  const int64_t r = b.x(0)->type().rank();
  std::vector<int64_t> dflt(r);
  for (int64_t i = 0; i < r; ++i) dflt[i] = r - 1 - i;
  auto perm = b.node.getInts("perm", dflt);
  std::vector<int64_t> inv(r);
  for (int64_t i = 0; i < r; ++i) inv[perm[i]] = i;
  b.setGrad(0, b.op("Transpose", {b.dy(0)}, {{"perm", inv}}));
}
void gradConcat(GB& b) {
  const int64_t r = b.y(0)->type().rank();
  const int64_t axis = normalizeAxis(b.node.getInt("axis", 0), r);
  int64_t off = 0;
  for (size_t i = 0; i < b.node.numInputs(); ++i) {
    const int64_t len = shapeOf(b.x(i))[axis];
    if (b.needs(i)) b.setGrad(i, b.op("Slice", {b.dy(0), b.ints({off}), b.ints({off + len}), b.ints({axis})}));
    off += len;
  }
}
void gradSplit(GB& b) {
  std::vector<Value*> parts;
  for (size_t i = 0; i < b.node.numResults(); ++i) parts.push_back(b.dy(i) ? b.dy(i) : b.zerosLike(b.y(i)));
  b.setGrad(0, b.op("Concat", parts, {{"axis", b.node.getInt("axis", 0)}}));
}
void gradSlice(GB& b) {
  std::vector<Value*> ins{b.dy(0)};
  for (size_t i = 1; i < b.node.numInputs(); ++i) ins.push_back(b.x(i));
  b.setGrad(0, b.op("SliceGrad", ins, {{"shape", shapeOf(b.x(0))}}, kGradDomain));
}
// The embedding table a lookup reads (through the casts autocast puts on parameters), when the
// graph lists it with a padding row (Graph::embeddingPadding): that row, else -1.
int64_t paddingRow(const Node& gather) {
  const Graph* g = gather.graph();
  if (!g || g->embeddingPadding.empty() || gather.getInt("axis", 0) != 0) return -1;
  const Value* v = gather.input(0);
  while (v && v->producer() && v->producer()->domain().empty() && v->producer()->op() == "Cast") v = v->producer()->input(0);
  if (!v || v->kind() != ValueKind::Param) return -1;
  auto it = g->embeddingPadding.find(v->name());
  return it == g->embeddingPadding.end() ? -1 : it->second;
}
void gradGather(GB& b) {
  Value* dy = b.dy(0);
  // nn.Embedding(padding_idx=p): the lookups of row p pass no gradient to the table.
  if (const int64_t p = paddingRow(b.node); p >= 0) {
    Value* idx = b.x(1);
    Value* pad = b.op("Equal", {idx, b.scalar(static_cast<double>(p), idx->type().dtype)});
    pad = b.op("Unsqueeze", {pad, b.ints({-1})});
    dy = b.where(pad, b.scalar(0.0, dy->type().dtype), dy);
  }
  b.setGrad(0, b.op("GatherGrad", {dy, b.x(1)}, {{"axis", b.node.getInt("axis", 0)}, {"shape", shapeOf(b.x(0))}}, kGradDomain));
}
void gradGatherElements(GB& b) {
  b.setGrad(0, b.op("GatherElementsGrad", {b.dy(0), b.x(1)}, {{"axis", b.node.getInt("axis", 0)}, {"shape", shapeOf(b.x(0))}}, kGradDomain));
}
// TopK's values are GatherElements(x, indices) along its axis: their gradient is scattered back
// to the chosen elements.
void gradTopK(GB& b) {
  const int64_t axis = normalizeAxis(b.node.getInt("axis", -1), static_cast<int64_t>(shapeOf(b.x(0)).size()));
  b.setGrad(0, b.op("GatherElementsGrad", {b.dy(0), b.y(1)}, {{"axis", axis}, {"shape", shapeOf(b.x(0))}}, kGradDomain));
}
void gradGridSample(GB& b) {
  auto r = b.opN("GridSampleGrad", {b.dy(0), b.x(0), b.x(1)}, copyAttrs(b.node), kGradDomain, 2);
  for (size_t i = 0; i < 2; ++i)
    if (b.needs(i)) b.setGrad(i, r[i]);
}
// d det(X) / dX is X's cofactor matrix (kernels: ampc.DetGrad).
void gradDet(GB& b) { b.setGrad(0, b.op("DetGrad", {b.dy(0), b.x(0)}, {}, kGradDomain)); }
void gradGatherND(GB& b) {
  b.setGrad(0, b.op("GatherNDGrad", {b.dy(0), b.x(1)}, {{"batch_dims", b.node.getInt("batch_dims", 0)}, {"shape", shapeOf(b.x(0))}}, kGradDomain));
}
// Scatter: the updates' gradient is read back where they were written; the data's gradient is dY
// where the data survived (reduction none: zero where an update overwrote it; add: all of dY).
void gradScatter(GB& b, const char* gather, const std::map<std::string, Attribute>& attrs) {
  const std::string r = b.node.getString("reduction", "none");
  if (r == "max" || r == "min") {
    // PyTorch's scatter_reduce amax/amin (include_self): dY shared evenly by the contributors
    // (data's element and the updates) equal to the result.
    const DType t = dt(b.dy(0));
    Value* y = b.y(0);
    Value* selfWins = b.cast(b.op("Equal", {b.x(0), y}), t);
    Value* srcWins = b.cast(b.op("Equal", {b.x(2), b.op(gather, {y, b.x(1)}, attrs)}), t);
    std::map<std::string, Attribute> addAttrs = b.node.attrs();
    addAttrs["reduction"] = std::string("add");
    Value* count = b.add(selfWins, b.op(b.node.op(), {b.zerosLike(selfWins), b.x(1), srcWins}, addAttrs));
    Value* share = b.div(b.dy(0), count);
    if (b.needs(0)) b.setGrad(0, b.mul(share, selfWins));
    if (b.needs(2)) b.setGrad(2, b.mul(b.op(gather, {share, b.x(1)}, attrs), srcWins));
    return;
  }
  const bool add = r == "add";
  if (b.needs(2)) b.setGrad(2, b.op(gather, {b.dy(0), b.x(1)}, attrs));
  if (b.needs(0)) {
    if (add) b.setGrad(0, b.dy(0));
    else b.setGrad(0, b.op(b.node.op(), {b.dy(0), b.x(1), b.zerosLike(b.x(2))}, b.node.attrs()));
  }
}
void gradScatterElements(GB& b) { gradScatter(b, "GatherElements", {{"axis", b.node.getInt("axis", 0)}}); }
void gradScatterND(GB& b) { gradScatter(b, "GatherND", {}); }
void gradExpand(GB& b) { b.setGrad(0, b.reduceTo(b.dy(0), shapeOf(b.x(0)))); }
void gradTile(GB& b) {
  // dy viewed as [r0, d0, r1, d1, ...] summed over the repeat axes.
  const auto& s = shapeOf(b.x(0));
  const auto reps = b.x(1)->constData()->toInts();
  std::vector<int64_t> view, axes;
  for (size_t i = 0; i < s.size(); ++i) {
    axes.push_back(static_cast<int64_t>(view.size()));
    view.push_back(reps[i]);
    view.push_back(s[i]);
  }
  Value* r = b.op("ReduceSum", {b.reshape(b.dy(0), view), b.ints(axes)}, {{"keepdims", int64_t{0}}});
  b.setGrad(0, r);
}
void gradPad(GB& b) {
  std::vector<Value*> ins{b.dy(0), b.x(1)};
  if (b.x(3)) {
    ins.push_back(b.x(3));
  }
  b.setGrad(0, b.op("PadGrad", ins, {{"mode", b.node.getString("mode", "constant")}, {"shape", shapeOf(b.x(0))}}, kGradDomain));
  if (b.x(2) && b.needs(2)) b.fail("a gradient for Pad's constant_value is not supported");
}
void gradTrilu(GB& b) {
  std::vector<Value*> ins{b.dy(0)};
  if (b.x(1)) ins.push_back(b.x(1));
  b.setGrad(0, b.op("Trilu", ins, {{"upper", b.node.getInt("upper", 1)}}));
}

// ---- shape rules of the "ampc" backward ops

void inferLike(InferContext& c, size_t from) { c.setOut(0, c.in(from)); }
void inferConvGrad(InferContext& c) {  // (dY, X, W) -> dX, dW
  c.setOut(0, c.in(1));
  c.setOut(1, c.in(2));
}
void inferWithShapeAttr(InferContext& c) {  // gradient of an input whose shape is the "shape" attribute
  c.setOut(0, TensorType{c.in(0).dtype, c.node().getInts("shape")});
}
// GatherGrad(dY, indices[, base]): the data's shape (attribute); the scatter-add starts from base
// (any float type, the data's shape) when given (passes/accumulate_gather_grads.cpp).
void inferGatherGrad(InferContext& c) {
  const auto shape = c.node().getInts("shape");
  if (c.numInputs() > 2 && c.hasInput(2)) {
    c.check(isFloat(c.in(2).dtype), "base must be a float tensor");
    c.check(c.in(2).shape == shape, "base must have the data's shape");
  }
  c.setOut(0, TensorType{c.in(0).dtype, shape});
}
void inferAvgPoolGrad(InferContext& c) { inferLike(c, 1); }
void inferBatchNormGrad(InferContext& c) {  // (dY, X, scale, mean, var) -> dX, dScale, dBias
  c.setOut(0, c.in(1));
  c.setOut(1, c.in(2));
  c.setOut(2, c.in(2));
}
void inferLayerNormGrad(InferContext& c) {  // (dY, X, scale) {rms} -> dX, dScale, dBias (normalised dims)
  const int64_t rms = c.node().getInt("rms", 0);
  c.check(rms == 0 || rms == 1, "rms must be 0 or 1, got " + std::to_string(rms));
  c.setOut(0, c.in(1));
  const auto& s = c.in(1).shape;
  const int64_t axis = c.axis(c.node().getInt("axis", -1), c.in(1).rank());
  TensorType t{c.in(2).dtype, std::vector<int64_t>(s.begin() + axis, s.end())};
  c.setOut(1, t);
  c.setOut(2, t);
}
void inferTargetBatchNormGrad(InferContext& c) {  // (dz, X, scale, mean, var, y) {gate}
  inferBatchNormGrad(c);
  c.check(c.node().getInt("gate", 0) == 1, "gate must be 1 (dY is dz where y > 0)");
  c.check(c.in(0) == c.in(1) && c.in(5) == c.in(1), "dz, X and y must have one type, got " + c.in(0).str() + ", " + c.in(1).str() + ", " + c.in(5).str());
}
void inferTargetLayerNormGrad(InferContext& c) {  // (dY, X, scale, r) {residual}: dX + r
  inferLayerNormGrad(c);
  c.check(c.node().getInt("residual", 0) == 1, "residual must be 1 (result 0 is dX + input 3)");
  c.check(c.in(3) == c.in(1), "the residual must have X's type, got " + c.in(3).str());
}
void inferTargetLossGrad(InferContext& c) {  // (dL, scores, labels, stats[, weights])
  c.check(c.in(1).rank() == 2, "scores must be [rows, C], got " + c.in(1).str());
  c.check(c.in(3) == TensorType{DType::f32, {c.in(1).shape[0], 2}}, "the row statistics must be f32 [rows, 2], got " + c.in(3).str());
  c.setOut(0, c.in(1));
}
void inferGridSampleGrad(InferContext& c) {  // (dY, X, grid) -> dX, dGrid
  c.setOut(0, c.in(1));
  c.setOut(1, c.in(2));
}
void inferLossGrad(InferContext& c) { c.setOut(0, c.in(1)); }
void inferDetGrad(InferContext& c) {  // (dY, X) -> dX
  const auto& s = c.in(1).shape;
  c.check(s.size() >= 2 && c.in(0).shape == std::vector<int64_t>(s.begin(), s.end() - 2), "dY must be X's shape less its last two dims, got " + c.in(0).str() + " for " + c.in(1).str());
  c.setOut(0, c.in(1));
}
void inferDropoutGrad(InferContext& c) { c.setOut(0, c.in(0)); }
void inferGeluGrad(InferContext& c) {  // (dY, X) -> dX
  c.check(c.in(0).shape == c.in(1).shape && c.in(0).dtype == c.in(1).dtype, "dY and X must have one type, got " + c.in(0).str() + " and " + c.in(1).str());
  c.setOut(0, c.in(1));
}

}  // namespace

void registerGradOps(std::vector<OpDef>& t) {
  auto row = [&](std::string_view name, int minIn, int maxIn, int outs, ShapeFn f) {
    t.push_back(OpDef{name, kGradDomain, 1, 1, minIn, maxIn, outs, outs, AmpCategory::Infer, false, f});
  };
  row("ConvGrad", 3, 3, 2, inferConvGrad);
  row("ScatterAddFlat", 2, 2, 1, inferWithShapeAttr);
  row("AveragePoolGrad", 2, 2, 1, inferAvgPoolGrad);
  row("BatchNormGrad", 5, 5, 3, inferBatchNormGrad);
  row("LayerNormGrad", 3, 3, 3, inferLayerNormGrad);
  // The CUDA target's epilogues (passes/fuse_relu_grad.cpp, passes/fuse_norm_epilogue.cpp).
  t.push_back(OpDef{"BatchNormGrad", kCudaDomain, 1, 1, 6, 6, 3, 3, AmpCategory::Infer, false, inferTargetBatchNormGrad});
  t.push_back(OpDef{"LayerNormGrad", kCudaDomain, 1, 1, 4, 4, 3, 3, AmpCategory::Infer, false, inferTargetLayerNormGrad});
  // passes/keep_loss_stats.cpp: the loss gradient reading the loss's row statistics (input 3).
  t.push_back(OpDef{"SoftmaxCrossEntropyLossGrad", kCudaDomain, 1, 1, 4, 5, 1, 1, AmpCategory::Infer, false, inferTargetLossGrad});
  row("GridSampleGrad", 3, 3, 2, inferGridSampleGrad);
  row("DetGrad", 2, 2, 1, inferDetGrad);
  row("SoftmaxCrossEntropyLossGrad", 3, 4, 1, inferLossGrad);
  row("NegativeLogLikelihoodLossGrad", 3, 4, 1, inferLossGrad);
  row("SliceGrad", 3, 5, 1, inferWithShapeAttr);
  row("GatherGrad", 2, 3, 1, inferGatherGrad);
  row("GatherElementsGrad", 2, 2, 1, inferWithShapeAttr);
  row("GatherNDGrad", 2, 2, 1, inferWithShapeAttr);
  row("PadGrad", 2, 3, 1, inferWithShapeAttr);
  row("DropoutGrad", 2, 4, 1, inferDropoutGrad);
  row("GeluGrad", 2, 2, 1, inferGeluGrad);
  t.back().inplace = true;
  row("SiluGrad", 2, 2, 1, inferGeluGrad);
  t.back().inplace = true;
  // ampc.Gelu: ONNX's Gelu (opset 20) for graphs of older opsets (fuse-gelu makes it).
  t.push_back(OpDef{"Gelu", kGradDomain, 1, 1, 1, 1, 1, 1, AmpCategory::Infer, true, [](InferContext& c) {
                      c.check(isFloat(c.in(0).dtype), "X must be a float tensor, got " + c.in(0).str());
                      c.setOut(0, c.in(0));
                    }});
  t.back().inplace = true;
  // ampc.RotateHalf {sign}: rotary embeddings' rotate_half, y = sign * [-x2, x1] over the halves of
  // the last axis (fuse-rotate-half makes it); its gradient is itself with the sign flipped.
  t.push_back(OpDef{"RotateHalf", kGradDomain, 1, 1, 1, 1, 1, 1, AmpCategory::Infer, true, [](InferContext& c) {
                      c.check(isFloat(c.in(0).dtype), "X must be a float tensor, got " + c.in(0).str());
                      c.check(c.in(0).rank() >= 1 && c.in(0).shape.back() % 2 == 0, "the last axis must have an even length, got " + c.in(0).str());
                      const int64_t sign = c.node().getInt("sign", 1);
                      c.check(sign == 1 || sign == -1, "sign must be 1 or -1, got " + std::to_string(sign));
                      c.setOut(0, c.in(0));
                    }});
  // ampc.RmsNorm(X, scale) {axis, epsilon}: X / sqrt(mean(X^2 over the dims from axis) + epsilon) *
  // scale, ONNX's RMSNormalization (opset 23) for graphs of any opset (fuse-rms-norm makes it of
  // the exporters' op-by-op form). FP32, as LayerNormalization; its gradient is LayerNormGrad {rms}.
  t.push_back(OpDef{"RmsNorm", kGradDomain, 1, 1, 2, 2, 1, 1, AmpCategory::Deny, true, [](InferContext& c) {
                      c.check(isFloat(c.in(0).dtype) && isFloat(c.in(1).dtype), "X and scale must be float tensors, got " + c.in(0).str() + " and " +
                                                                                      c.in(1).str());
                      const auto& x = c.in(0).shape;
                      const int64_t axis = c.axis(c.node().getInt("axis", -1), c.in(0).rank());
                      const std::vector<int64_t> norm(x.begin() + axis, x.end());
                      c.check(c.in(1).rank() <= static_cast<int64_t>(norm.size()) && broadcastShapes(c, norm, c.in(1).shape) == norm,
                              "scale " + c.in(1).str() + " does not broadcast to the normalised dims");
                      c.setOut(0, c.in(0));
                    }});
  // ampc.Silu: x * sigmoid(x) in one op, rounded once (fuse-gelu makes it of x * Sigmoid(x)).
  t.push_back(OpDef{"Silu", kGradDomain, 1, 1, 1, 1, 1, 1, AmpCategory::Infer, true, [](InferContext& c) {
                      c.check(isFloat(c.in(0).dtype), "X must be a float tensor, got " + c.in(0).str());
                      c.setOut(0, c.in(0));
                    }});
  t.back().inplace = true;
}

void attachGradRules(std::vector<OpDef>& t) {
  const std::pair<std::string_view, GradFn> rules[] = {
      {"Add", gradAdd}, {"Sub", gradSub}, {"Mul", gradMul}, {"Div", gradDiv}, {"Mod", gradMod}, {"Pow", gradPow},
      {"Sqrt", gradSqrt}, {"Reciprocal", gradReciprocal}, {"Neg", gradNeg}, {"Abs", gradAbs}, {"Exp", gradExp},
      {"Log", gradLog}, {"Tanh", gradTanh}, {"Sigmoid", gradSigmoid}, {"Relu", gradRelu}, {"LeakyRelu", gradLeakyRelu},
      {"Erf", gradErf}, {"Gelu", gradGelu}, {"Softplus", gradSoftplus}, {"Clip", gradClip}, {"Max", gradMaxMin},
      {"Min", gradMaxMin}, {"Where", gradWhere}, {"Identity", gradIdentity}, {"Cast", gradCast}, {"CastLike", gradCast},
      {"Dropout", gradDropout}, {"MatMul", gradMatMul}, {"Gemm", gradGemm}, {"Conv", gradConv},
      {"MaxPool", gradMaxPool}, {"AveragePool", gradAveragePool}, {"GlobalAveragePool", gradGlobalAveragePool},
      {"BatchNormalization", gradBatchNorm}, {"LayerNormalization", gradLayerNorm}, {"Softmax", gradSoftmax},
      {"LogSoftmax", gradLogSoftmax}, {"ReduceSum", gradReduceSum}, {"ReduceMean", gradReduceMean},
      {"ReduceMax", gradReduceMaxMin}, {"ReduceMin", gradReduceMaxMin}, {"SoftmaxCrossEntropyLoss", gradSce},
      {"NegativeLogLikelihoodLoss", gradNll}, {"Reshape", gradReshapeLike}, {"Flatten", gradReshapeLike},
      {"Squeeze", gradReshapeLike}, {"Unsqueeze", gradReshapeLike}, {"Transpose", gradTranspose},
      {"Concat", gradConcat}, {"Split", gradSplit}, {"Slice", gradSlice}, {"Gather", gradGather},
      {"Expand", gradExpand}, {"Tile", gradTile}, {"Pad", gradPad}, {"Trilu", gradTrilu},
      {"Sin", gradSin}, {"Cos", gradCos}, {"Tan", gradTan}, {"Asin", gradAsin}, {"Acos", gradAcos}, {"Atan", gradAtan},
      {"Sinh", gradSinh}, {"Cosh", gradCosh}, {"Asinh", gradAsinh}, {"Acosh", gradAcosh}, {"Atanh", gradAtanh}, {"CumSum", gradCumSum}, {"GatherElements", gradGatherElements}, {"TopK", gradTopK}, {"GridSample", gradGridSample}, {"Det", gradDet},
      {"ScatterElements", gradScatterElements}, {"ScatterND", gradScatterND},
      {"GatherND", gradGatherND}, {"HardSigmoid", gradHardSigmoid}, {"HardSwish", gradHardSwish}, {"Elu", gradElu},
      {"Selu", gradSelu}, {"Celu", gradCelu}, {"Mish", gradMish}, {"Softsign", gradSoftsign}, {"PRelu", gradPRelu},
  };
  for (OpDef& d : t) {
    for (const auto& [name, fn] : rules)
      if (d.domain.empty() && d.name == name) d.grad = fn;
    if (d.domain == kGradDomain && d.name == "Attention") d.grad = gradAttention;
    if (d.domain == kGradDomain && d.name == "Gelu") d.grad = gradGelu;
    if (d.domain == kGradDomain && d.name == "Silu") d.grad = gradSilu;
    if (d.domain == kGradDomain && d.name == "RotateHalf") d.grad = gradRotateHalf;
    if (d.domain == kGradDomain && d.name == "RmsNorm") d.grad = gradRmsNorm;
  }
}

}  // namespace ampc
