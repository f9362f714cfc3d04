// Elementwise kernels: unary math and activations, broadcasting binary ops, comparisons and logic,
// Where, Clip, Dropout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "compiler/ops/pointwise.h"

#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

template <typename C, typename F>
void unaryMap(KernelCtx& c, F f) {
  auto x = widen<C>(c.in(0));
  for (auto& v : x) v = f(v);
  narrow(x, c.out(0));
}

template <typename C, typename F>
void binaryMap(KernelCtx& c, F f) {
  const Tensor &ta = c.in(0), &tb = c.in(1);
  Tensor& out = c.out(0);
  auto a = widen<C>(ta), b = widen<C>(tb);
  std::vector<C> r(static_cast<size_t>(out.numel()));
  if (ta.type.shape == out.type.shape && tb.type.shape == out.type.shape) {
    for (size_t i = 0; i < r.size(); ++i) r[i] = f(a[i], b[i]);
  } else {
    BroadcastIter ia(out.type.shape, ta.type.shape), ib(out.type.shape, tb.type.shape);
    for (size_t i = 0; i < r.size(); ++i, ia.next(), ib.next()) r[i] = f(a[ia.offset()], b[ib.offset()]);
  }
  narrow(r, out);
}

// Unary float ops.
#define AMPC_UNARY_FLOAT(NAME, EXPR)                                    \
  template <typename C>                                                 \
  struct NAME {                                                         \
    static void run(KernelCtx& c) {                                     \
      unaryMap<C>(c, [](C x) -> C { return EXPR; });                    \
    }                                                                   \
  };
AMPC_UNARY_FLOAT(SqrtK, std::sqrt(x))
AMPC_UNARY_FLOAT(ReciprocalK, C(1) / x)
AMPC_UNARY_FLOAT(ExpK, std::exp(x))
AMPC_UNARY_FLOAT(LogK, std::log(x))
AMPC_UNARY_FLOAT(TanhK, std::tanh(x))
AMPC_UNARY_FLOAT(SigmoidK, x >= 0 ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)))
AMPC_UNARY_FLOAT(ErfK, std::erf(x))
AMPC_UNARY_FLOAT(SinK, std::sin(x))
AMPC_UNARY_FLOAT(CosK, std::cos(x))
AMPC_UNARY_FLOAT(TanK, std::tan(x))
AMPC_UNARY_FLOAT(AsinK, std::asin(x))
AMPC_UNARY_FLOAT(AcosK, std::acos(x))
AMPC_UNARY_FLOAT(AtanK, std::atan(x))
AMPC_UNARY_FLOAT(SinhK, std::sinh(x))
AMPC_UNARY_FLOAT(CoshK, std::cosh(x))
AMPC_UNARY_FLOAT(AsinhK, std::asinh(x))
AMPC_UNARY_FLOAT(AcoshK, std::acosh(x))
AMPC_UNARY_FLOAT(AtanhK, std::atanh(x))
AMPC_UNARY_FLOAT(HardSwishK, x * std::max(C(0), std::min(C(1), x / C(6) + C(0.5))))
AMPC_UNARY_FLOAT(MishK, x * std::tanh(x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x))))
AMPC_UNARY_FLOAT(SoftsignK, x / (C(1) + std::abs(x)))
AMPC_UNARY_FLOAT(FloorK, std::floor(x))
AMPC_UNARY_FLOAT(CeilK, std::ceil(x))
AMPC_UNARY_FLOAT(RoundK, std::nearbyint(x))  // halves to even (the default rounding mode)
AMPC_UNARY_FLOAT(SoftplusK, x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)))
#undef AMPC_UNARY_FLOAT

// Unary numeric ops (floats and integers).
// Integer results that leave int64 (a shape computation folded at compile time, a crafted model)
// are an error naming the node, never a wrapped value.
template <typename C>
C checkedInt(KernelCtx& c, bool overflowed, C r, const char* what) {
  if (overflowed) c.fail(std::string("integer overflow in ") + what + " (the result leaves int64)");
  return r;
}
template <typename C>
struct NegK {
  static void run(KernelCtx& c) {
    if constexpr (std::is_integral_v<C>)
      unaryMap<C>(c, [&c](C x) -> C { return x == std::numeric_limits<C>::min() ? checkedInt(c, true, x, "Neg") : -x; });
    else
      unaryMap<C>(c, [](C x) -> C { return -x; });
  }
};
template <typename C>
struct AbsK {
  static void run(KernelCtx& c) {
    if constexpr (std::is_integral_v<C>)
      unaryMap<C>(c, [&c](C x) -> C { return x == std::numeric_limits<C>::min() ? checkedInt(c, true, x, "Abs") : (x < 0 ? -x : x); });
    else
      unaryMap<C>(c, [](C x) -> C { return x < 0 ? -x : x; });
  }
};
template <typename C>
struct ReluK {
  static void run(KernelCtx& c) { unaryMap<C>(c, [](C x) -> C { return x > 0 ? x : (x != x ? x : C(0)); }); }
};
// Activations with attributes (ONNX's defaults).
template <typename C>
struct HardSigmoidK {
  static void run(KernelCtx& c) {
    const C a = static_cast<C>(c.node.getFloat("alpha", 0.2f)), b = static_cast<C>(c.node.getFloat("beta", 0.5f));
    unaryMap<C>(c, [a, b](C x) -> C { return std::max(C(0), std::min(C(1), a * x + b)); });
  }
};
template <typename C>
struct EluK {
  static void run(KernelCtx& c) {
    const C a = static_cast<C>(c.node.getFloat("alpha", 1.0f));
    unaryMap<C>(c, [a](C x) -> C { return x > 0 ? x : a * std::expm1(x); });
  }
};
template <typename C>
struct SeluK {
  static void run(KernelCtx& c) {
    const C a = static_cast<C>(c.node.getFloat("alpha", 1.67326319217681884765625f)),
            g = static_cast<C>(c.node.getFloat("gamma", 1.05070102214813232421875f));
    unaryMap<C>(c, [a, g](C x) -> C { return x > 0 ? g * x : g * a * std::expm1(x); });
  }
};
template <typename C>
struct CeluK {
  static void run(KernelCtx& c) {
    const C a = static_cast<C>(c.node.getFloat("alpha", 1.0f));
    if (a == 0) c.fail("alpha must not be 0");
    unaryMap<C>(c, [a](C x) -> C { return x > 0 ? x : a * std::expm1(x / a); });
  }
};
template <typename C>
struct SignK {
  static void run(KernelCtx& c) { unaryMap<C>(c, [](C x) -> C { return x > 0 ? C(1) : x < 0 ? C(-1) : x; }); }
};
template <typename C>
struct PReluK {
  static void run(KernelCtx& c) { binaryMap<C>(c, [](C x, C s) -> C { return x < 0 ? s * x : x; }); }
};
// Mod: fmod = 1 is C's fmod (the dividend's sign); fmod = 0 (integers) takes the divisor's sign.
template <typename C>
struct ModK {
  static void run(KernelCtx& c) {
    const bool fm = c.node.getInt("fmod", 0) != 0;
    binaryMap<C>(c, [fm](C a, C b) -> C {
      if constexpr (std::is_integral_v<C>) {
        if (b == 0) return 0;
        if (b == -1) return 0;  // also INT64_MIN % -1, which would trap
        C r = a % b;
        if (!fm && r != 0 && ((r < 0) != (b < 0))) r += b;
        return r;
      } else {
        return std::fmod(a, b);
      }
    });
  }
};
template <typename C>
struct LeakyReluK {
  static void run(KernelCtx& c) {
    const C alpha = static_cast<C>(c.node.getFloat("alpha", 0.01f));
    unaryMap<C>(c, [alpha](C x) -> C { return x >= 0 ? x : alpha * x; });
  }
};
// GeluGrad(dY, X) {approximate}: dY * Gelu'(X), in the compute type, rounded once.
template <typename C>
struct GeluGradK {
  static void run(KernelCtx& c) {
    const std::string approx = c.node.getString("approximate", "none");
    if (approx != "none" && approx != "tanh") c.fail("unknown approximate '" + approx + "'");
    const bool tanhForm = approx == "tanh";
    auto dy = widen<C>(c.in(0));
    const auto x = widen<C>(c.in(1));
    for (size_t i = 0; i < dy.size(); ++i) {
      const C v = x[i];
      C d;
      if (tanhForm) {
        const C k = static_cast<C>(0.7978845608028654), a = static_cast<C>(0.044715);
        const C t = std::tanh(k * (v + a * v * v * v));
        d = C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3) * a * v * v);
      } else {
        d = C(0.5) * (C(1) + std::erf(v * C(0.7071067811865476))) + v * C(0.3989422804014327) * std::exp(C(-0.5) * v * v);
      }
      dy[i] *= d;
    }
    narrow(dy, c.out(0));
  }
};
// ampc.Silu (fuse-gelu makes it of x * Sigmoid(x)) and its gradient dY * s (1 + x (1 - s)),
// s = sigmoid(x): each computed in the compute type and rounded once.
template <typename C>
C sigmoidOf(C x) {
  return x >= 0 ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x));
}
template <typename C>
struct SiluK {
  static void run(KernelCtx& c) { unaryMap<C>(c, [](C x) -> C { return x * sigmoidOf(x); }); }
};
template <typename C>
struct SiluGradK {
  static void run(KernelCtx& c) {
    auto dy = widen<C>(c.in(0));
    const auto x = widen<C>(c.in(1));
    for (size_t i = 0; i < dy.size(); ++i) {
      const C s = sigmoidOf(x[i]);
      dy[i] = dy[i] * s * (C(1) + x[i] * (C(1) - s));
    }
    narrow(dy, c.out(0));
  }
};

template <typename C>
struct GeluK {
  static void run(KernelCtx& c) {
    std::string approx = c.node.getString("approximate", "none");
    if (approx == "tanh") {
      const C k = static_cast<C>(0.7978845608028654);  // sqrt(2/pi)
      unaryMap<C>(c, [k](C x) -> C { return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x))); });
    } else if (approx == "none") {
      unaryMap<C>(c, [](C x) -> C { return C(0.5) * x * (C(1) + std::erf(x * C(0.7071067811865476))); });
    } else {
      c.fail("unknown approximate '" + approx + "'");
    }
  }
};
template <typename C>
struct IsNaNK {
  static void run(KernelCtx& c) { unaryMap<C>(c, [](C x) -> C { return x != x; }); }
};
template <typename C>
struct IsInfK {
  static void run(KernelCtx& c) {
    bool pos = c.node.getInt("detect_positive", 1) != 0, neg = c.node.getInt("detect_negative", 1) != 0;
    unaryMap<C>(c, [pos, neg](C x) -> C { return std::isinf(x) && ((x > 0 && pos) || (x < 0 && neg)); });
  }
};
template <typename C>
struct ClipK {
  static void run(KernelCtx& c) {
    C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
    if (std::numeric_limits<C>::has_infinity) lo = -std::numeric_limits<C>::infinity(), hi = std::numeric_limits<C>::infinity();
    if (c.has(1)) lo = widen<C>(c.in(1))[0];
    if (c.has(2)) hi = widen<C>(c.in(2))[0];
    unaryMap<C>(c, [lo, hi](C x) -> C {  // min(max(x, lo), hi): hi everywhere when lo > hi, as numpy and PyTorch
      const C t = x < lo ? lo : x;
      return t > hi ? hi : t;
    });
  }
};

// Binary ops. Add, Sub and Mul: floats as they are; integers through the overflow builtin
// (`overflows(a, b, &r)`), an overflow an error naming the node.
template <typename C, typename F, typename O>
void arithmetic(KernelCtx& c, F f, O overflows, const char* what) {
  if constexpr (std::is_integral_v<C>)
    binaryMap<C>(c, [&](C a, C b) -> C {
      C r;
      const bool over = overflows(a, b, &r);
      return checkedInt(c, over, r, what);
    });
  else
    binaryMap<C>(c, f);
}
template <typename C>
struct AddK {
  static void run(KernelCtx& c) {
    arithmetic<C>(c, [](C a, C b) -> C { return a + b; }, [](auto a, auto b, auto* r) { return __builtin_add_overflow(a, b, r); }, "Add");
  }
};
template <typename C>
struct SubK {
  static void run(KernelCtx& c) {
    arithmetic<C>(c, [](C a, C b) -> C { return a - b; }, [](auto a, auto b, auto* r) { return __builtin_sub_overflow(a, b, r); }, "Sub");
  }
};
template <typename C>
struct MulK {
  static void run(KernelCtx& c) {
    arithmetic<C>(c, [](C a, C b) -> C { return a * b; }, [](auto a, auto b, auto* r) { return __builtin_mul_overflow(a, b, r); }, "Mul");
  }
};
template <typename C>
struct DivK {
  static void run(KernelCtx& c) {
    if constexpr (std::is_integral_v<C>) {
      // Integer division truncates; x/0 and INT64_MIN/-1 (undefined in C++) give 0.
      binaryMap<C>(c, [](C a, C b) -> C { return (b == 0 || (b == -1 && a == std::numeric_limits<C>::min())) ? 0 : a / b; });
    } else {
      binaryMap<C>(c, [](C a, C b) -> C { return a / b; });
    }
  }
};
template <typename C>
struct PowK {
  static void run(KernelCtx& c) {
    binaryMap<C>(c, [](C a, C b) -> C { return static_cast<C>(std::pow(static_cast<double>(a), static_cast<double>(b))); });
  }
};
template <typename C>
struct MaxK {
  static void run(KernelCtx& c) { variadic(c, [](C a, C b) -> C { return (a != a || a > b) ? a : b; }); }
  template <typename F>
  static void variadic(KernelCtx& c, F f) {
    Tensor& out = c.out(0);
    std::vector<C> r(static_cast<size_t>(out.numel()));
    for (size_t k = 0; k < c.numInputs(); ++k) {
      auto v = widen<C>(c.in(k));
      BroadcastIter it(out.type.shape, c.in(k).type.shape);
      for (size_t i = 0; i < r.size(); ++i, it.next()) r[i] = k == 0 ? v[it.offset()] : f(r[i], v[it.offset()]);
    }
    narrow(r, out);
  }
};
template <typename C>
struct MinK {
  static void run(KernelCtx& c) { MaxK<C>::variadic(c, [](C a, C b) -> C { return (a != a || a < b) ? a : b; }); }
};

// Comparisons and logic: computed in the inputs' compute type, stored as bool.
#define AMPC_COMPARE(NAME, OP)                                                   \
  template <typename C>                                                          \
  struct NAME {                                                                  \
    static void run(KernelCtx& c) { binaryMap<C>(c, [](C a, C b) -> C { return a OP b; }); } \
  };
AMPC_COMPARE(EqualK, ==)
AMPC_COMPARE(LessK, <)
AMPC_COMPARE(LessOrEqualK, <=)
AMPC_COMPARE(GreaterK, >)
AMPC_COMPARE(GreaterOrEqualK, >=)
AMPC_COMPARE(AndK, &&)
AMPC_COMPARE(OrK, ||)
#undef AMPC_COMPARE

void notKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  Tensor& y = c.out(0);
  for (int64_t i = 0; i < x.numel(); ++i) y.data[i] = x.data[i] == 0;
}

// Where selects bytes, so it serves every dtype.
void whereKernel(KernelCtx& c) {
  const Tensor &cond = c.in(0), &a = c.in(1), &b = c.in(2);
  Tensor& out = c.out(0);
  const size_t e = dtypeSize(out.type.dtype);
  BroadcastIter ic(out.type.shape, cond.type.shape), ia(out.type.shape, a.type.shape), ib(out.type.shape, b.type.shape);
  for (int64_t i = 0; i < out.numel(); ++i, ic.next(), ia.next(), ib.next()) {
    const Tensor& src = cond.data[ic.offset()] ? a : b;
    const int64_t j = cond.data[ic.offset()] ? ia.offset() : ib.offset();
    std::memcpy(out.data.data() + i * e, src.data.data() + j * e, e);
  }
}

// Dropout: Y = X * mask / (1 - ratio) in training mode, with the Philox mask keyed by (seed, step,
// node); the identity (and an all-true mask) otherwise.
template <typename C>
struct DropoutK {
  static void run(KernelCtx& c) {
    const float ratio = c.has(1) ? static_cast<float>(c.in(1).getDouble(0)) : 0.5f;
    const bool training = c.has(2) && c.in(2).getInt(0) != 0;
    if (ratio < 0.0f || ratio >= 1.0f) {
      if (training) c.fail("ratio must be in [0, 1), got " + std::to_string(ratio));
    }
    auto x = widen<C>(c.in(0));
    std::vector<uint8_t> keep(x.size(), 1);
    if (training && c.opts.dropout && ratio > 0.0f) {
      const uint64_t seed = randomSeed(c.node, c.opts.seed);
      const uint32_t key = dropoutNodeKey(c.node);
      const C scale = static_cast<C>(1.0 / (1.0 - static_cast<double>(ratio)));
      const uint32_t thr = dropoutThreshold(ratio);
      uint32_t d[8];
      for (size_t i = 0; i < x.size(); ++i) {
        if (i % 8 == 0) dropoutDraws8(seed, c.opts.step, key, i / 8, d);
        keep[i] = d[i % 8] >= thr;
        x[i] = keep[i] ? x[i] * scale : C(0);
      }
    }
    narrow(x, c.out(0));
    if (c.numOutputs() > 1) std::memcpy(c.out(1).data.data(), keep.data(), keep.size());
  }
};

// RandomUniformLike {low, high}, RandomNormalLike {mean, scale} (Box-Muller over stream elements
// 2i and 2i+1), Bernoulli (1 where the draw is below the input's probability): Dropout's stream.
void randomKernel(KernelCtx& c) {
  const uint64_t seed = randomSeed(c.node, c.opts.seed);
  const uint32_t key = dropoutNodeKey(c.node);
  Tensor& out = c.out(0);
  const int64_t n = out.numel();
  std::vector<double> v(static_cast<size_t>(n));
  const std::string& op = c.node.op();
  if (op == "RandomUniformLike") {
    const double lo = c.node.getFloat("low", 0.0f), hi = c.node.getFloat("high", 1.0f);
    for (int64_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * randomUniform(seed, c.opts.step, key, i);
  } else if (op == "RandomNormalLike") {
    const double mean = c.node.getFloat("mean", 0.0f), scale = c.node.getFloat("scale", 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      const double u1 = 1.0 - randomUniform(seed, c.opts.step, key, 2 * i), u2 = randomUniform(seed, c.opts.step, key, 2 * i + 1);
      v[i] = mean + scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
  } else {
    const auto p = widen<double>(c.in(0));
    for (int64_t i = 0; i < n; ++i) v[i] = randomUniform(seed, c.opts.step, key, i) < p[i] ? 1.0 : 0.0;
  }
  narrow(v, out);
}

// ampc.Fused: its body's nodes, one after another, with these kernels (compiler/ops/pointwise.h):
// exactly what the group computed before it was fused.
void fusedKernel(KernelCtx& c) {
  const auto body = fusedBody(c.node);
  std::map<const Value*, Tensor> vals;
  std::map<const Value*, const Tensor*> at;
  for (size_t i = 0; i < body->inputs().size(); ++i) at[body->inputs()[i]] = &c.in(i);
  for (const Value* k : body->consts()) at[k] = k->data();
  for (const auto& n : body->nodes()) {
    std::vector<const Tensor*> in;
    for (const Value* v : n->inputs()) in.push_back(v ? at.at(v) : nullptr);
    auto out = runNode(*n, in, c.opts);
    for (size_t r = 0; r < out.size(); ++r) at[n->result(r)] = &(vals[n->result(r)] = std::move(out[r]));
  }
  for (size_t i = 0; i < body->outputs().size(); ++i) c.out(i) = *at.at(body->outputs()[i]);
}

template <template <typename> class F>
void floatOp(KernelCtx& c) { dispatchFloat<F>(c, c.in(0).type.dtype); }
template <template <typename> class F>
void numericOp(KernelCtx& c) { dispatchNumeric<F>(c, c.in(0).type.dtype); }

}  // namespace

void registerElementwiseKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"Sqrt", floatOp<SqrtK>}, {"Reciprocal", floatOp<ReciprocalK>}, {"Exp", floatOp<ExpK>},
      {"Log", floatOp<LogK>}, {"Tanh", floatOp<TanhK>}, {"Sigmoid", floatOp<SigmoidK>},
      {"Erf", floatOp<ErfK>}, {"Sin", floatOp<SinK>}, {"Cos", floatOp<CosK>},
      {"Tan", floatOp<TanK>}, {"Asin", floatOp<AsinK>}, {"Acos", floatOp<AcosK>}, {"Atan", floatOp<AtanK>}, {"Sinh", floatOp<SinhK>},
      {"Cosh", floatOp<CoshK>}, {"Asinh", floatOp<AsinhK>}, {"Acosh", floatOp<AcoshK>}, {"Atanh", floatOp<AtanhK>},
      {"HardSigmoid", floatOp<HardSigmoidK>}, {"HardSwish", floatOp<HardSwishK>}, {"Elu", floatOp<EluK>}, {"Selu", floatOp<SeluK>},
      {"Celu", floatOp<CeluK>}, {"Mish", floatOp<MishK>}, {"Softsign", floatOp<SoftsignK>}, {"Floor", floatOp<FloorK>}, {"Ceil", floatOp<CeilK>},
      {"Round", floatOp<RoundK>}, {"Sign", numericOp<SignK>}, {"PRelu", floatOp<PReluK>}, {"Mod", numericOp<ModK>}, {"Gelu", floatOp<GeluK>}, {"Gelu", floatOp<GeluK>, "ampc"}, {"GeluGrad", floatOp<GeluGradK>, "ampc"}, {"Silu", floatOp<SiluK>, "ampc"}, {"SiluGrad", floatOp<SiluGradK>, "ampc"}, {"Softplus", floatOp<SoftplusK>},
      {"LeakyRelu", floatOp<LeakyReluK>}, {"Relu", numericOp<ReluK>}, {"Neg", numericOp<NegK>},
      {"Abs", numericOp<AbsK>}, {"Clip", numericOp<ClipK>}, {"IsNaN", floatOp<IsNaNK>}, {"IsInf", floatOp<IsInfK>},
      {"Add", numericOp<AddK>}, {"Sub", numericOp<SubK>}, {"Mul", numericOp<MulK>}, {"Div", numericOp<DivK>},
      {"Pow", numericOp<PowK>}, {"Max", numericOp<MaxK>}, {"Min", numericOp<MinK>},
      {"Equal", numericOp<EqualK>}, {"Less", numericOp<LessK>}, {"LessOrEqual", numericOp<LessOrEqualK>},
      {"Greater", numericOp<GreaterK>}, {"GreaterOrEqual", numericOp<GreaterOrEqualK>},
      {"And", numericOp<AndK>}, {"Or", numericOp<OrK>}, {"Not", notKernel}, {"Where", whereKernel},
      {"Dropout", floatOp<DropoutK>}, {"RandomUniformLike", randomKernel}, {"RandomNormalLike", randomKernel},
      {"Bernoulli", randomKernel}, {"Fused", fusedKernel, "ampc"},
  });
}

}  // namespace ampc::cpu
