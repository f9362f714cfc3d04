// Normalisation, softmax, reductions and losses. Statistics accumulate in the compute type
// (f32 for f16/bf16 data, f64 for f64).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

template <typename C>
struct BatchNormK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t N = xs[0], Ch = xs[1];
    int64_t S = 1;
    for (size_t i = 2; i < xs.size(); ++i) S *= xs[i];
    const C eps = static_cast<C>(c.node.getFloat("epsilon", 1e-5f));
    const C momentum = static_cast<C>(c.node.getFloat("momentum", 0.9f));
    const bool training = c.node.getInt("training_mode", 0) != 0;
    auto x = widen<C>(c.in(0)), scale = widen<C>(c.in(1)), bias = widen<C>(c.in(2));
    auto mean = widen<C>(c.in(3)), var = widen<C>(c.in(4));
    std::vector<C> useMean = mean, useVar = var;
    if (training) {  // batch statistics (population variance), as ONNX's reference computes them
      const C count = static_cast<C>(N * S);
      for (int64_t ch = 0; ch < Ch; ++ch) {
        C s = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) s += x[(n * Ch + ch) * S + i];
        const C m = s / count;
        C v = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) {
            const C d = x[(n * Ch + ch) * S + i] - m;
            v += d * d;
          }
        useMean[ch] = m;
        useVar[ch] = v / count;
      }
    }
    std::vector<C> y(x.size());
    for (int64_t ch = 0; ch < Ch; ++ch) {
      const C inv = C(1) / std::sqrt(useVar[ch] + eps);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t k = (n * Ch + ch) * S + i;
          y[k] = (x[k] - useMean[ch]) * inv * scale[ch] + bias[ch];
        }
    }
    narrow(y, c.out(0));
    if (c.numOutputs() > 1) {
      std::vector<C> rm(Ch), rv(Ch);
      for (int64_t ch = 0; ch < Ch; ++ch) {
        rm[ch] = mean[ch] * momentum + useMean[ch] * (C(1) - momentum);
        rv[ch] = var[ch] * momentum + useVar[ch] * (C(1) - momentum);
      }
      narrow(rm, c.out(1));
      if (c.numOutputs() > 2) narrow(rv, c.out(2));
    }
  }
};

template <typename C>
struct LayerNormK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t axis = normalizeAxis(c.node.getInt("axis", -1), static_cast<int64_t>(xs.size()));
    const std::vector<int64_t> normShape(xs.begin() + axis, xs.end());
    int64_t outer = 1, D = 1;
    for (int64_t i = 0; i < static_cast<int64_t>(xs.size()); ++i) (i < axis ? outer : D) *= xs[i];
    const C eps = static_cast<C>(c.node.getFloat("epsilon", 1e-5f));
    auto x = widen<C>(c.in(0));
    auto expand = [&](size_t i) {  // scale / bias broadcast to the normalised dims
      std::vector<C> v(static_cast<size_t>(D), i == 1 ? C(1) : C(0));
      if (!c.has(i)) return v;
      auto raw = widen<C>(c.in(i));
      BroadcastIter it(normShape, c.in(i).type.shape);
      for (int64_t k = 0; k < D; ++k, it.next()) v[k] = raw[it.offset()];
      return v;
    };
    const auto scale = expand(1), bias = expand(2);
    const bool rms = c.node.op() == "RmsNorm";  // ampc.RmsNorm: no mean taken out
    std::vector<C> y(x.size()), mean(static_cast<size_t>(outer)), inv(static_cast<size_t>(outer));
    for (int64_t o = 0; o < outer; ++o) {
      const C* row = x.data() + o * D;
      C s = 0;
      for (int64_t k = 0; k < D && !rms; ++k) s += row[k];
      const C m = s / static_cast<C>(D);
      C v = 0;
      for (int64_t k = 0; k < D; ++k) v += (row[k] - m) * (row[k] - m);
      const C r = C(1) / std::sqrt(v / static_cast<C>(D) + eps);
      for (int64_t k = 0; k < D; ++k) y[o * D + k] = (row[k] - m) * r * scale[k] + bias[k];
      mean[o] = m;
      inv[o] = r;
    }
    narrow(y, c.out(0));
    if (c.numOutputs() > 1) narrow(mean, c.out(1));
    if (c.numOutputs() > 2) narrow(inv, c.out(2));
  }
};

// Softmax / LogSoftmax along one axis.
template <typename C>
void softmaxRows(std::vector<C>& x, const AxisSplit& s, bool log) {
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      C* base = x.data() + o * s.axis * s.inner + i;
      C mx = -std::numeric_limits<C>::infinity();
      for (int64_t a = 0; a < s.axis; ++a) mx = std::max(mx, base[a * s.inner]);
      if (std::isinf(mx) && mx < 0) mx = 0;  // an all -inf row stays -inf / NaN as the math says
      C sum = 0;
      for (int64_t a = 0; a < s.axis; ++a) sum += std::exp(base[a * s.inner] - mx);
      const C lse = std::log(sum);
      for (int64_t a = 0; a < s.axis; ++a) {
        C& v = base[a * s.inner];
        v = log ? v - mx - lse : std::exp(v - mx) / sum;
      }
    }
}

template <typename C, bool kLog>
struct SoftmaxK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t axis = normalizeAxis(c.node.getInt("axis", -1), static_cast<int64_t>(xs.size()));
    auto x = widen<C>(c.in(0));
    softmaxRows(x, AxisSplit(xs, axis), kLog);
    narrow(x, c.out(0));
  }
};
template <typename C>
using SoftmaxPlain = SoftmaxK<C, false>;
template <typename C>
using LogSoftmaxK = SoftmaxK<C, true>;

// Reductions: axes from the attribute or input 1; keepdims and noop_with_empty_axes.
enum class Red { Sum, Mean, Max, Min };
template <typename C, Red kOp>
struct ReduceK {
  static void run(KernelCtx& c) {
    const Tensor& xt = c.in(0);
    const auto& xs = xt.type.shape;
    std::vector<int64_t> axes = c.node.getInts("axes");
    if (c.has(1)) axes = c.in(1).toInts();
    auto x = widen<C>(xt);
    if (axes.empty() && c.node.getInt("noop_with_empty_axes", 0)) {
      narrow(x, c.out(0));
      return;
    }
    std::vector<int64_t> keep = xs;  // the output shape with reduced dims kept as 1
    std::vector<bool> red(xs.size(), axes.empty());
    for (int64_t a : axes) red[normalizeAxis(a, static_cast<int64_t>(xs.size()))] = true;
    for (size_t i = 0; i < xs.size(); ++i)
      if (red[i]) keep[i] = 1;
    int64_t outN = 1;
    for (int64_t d : keep) outN *= d;
    const C init = kOp == Red::Max   ? (std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::lowest())
                   : kOp == Red::Min ? (std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity() : std::numeric_limits<C>::max())
                                     : C(0);
    std::vector<C> out(static_cast<size_t>(outN), init);
    BroadcastIter it(xs, keep);
    for (size_t i = 0; i < x.size(); ++i, it.next()) {
      C& o = out[it.offset()];
      const C v = x[i];
      if constexpr ((kOp == Red::Sum || kOp == Red::Mean) && std::is_integral_v<C>) {
        if (__builtin_add_overflow(o, v, &o)) c.fail("integer overflow in the sum (the result leaves int64)");
      } else if constexpr (kOp == Red::Sum || kOp == Red::Mean) o += v;
      else if constexpr (kOp == Red::Max) o = (v > o || v != v) ? v : o;
      else o = (v < o || v != v) ? v : o;
    }
    if constexpr (kOp == Red::Mean) {
      const C n = static_cast<C>(outN ? static_cast<int64_t>(x.size()) / outN : 0);
      if (std::is_integral_v<C> && n == 0) c.fail("the mean of an empty integer tensor");
      for (auto& o : out) o /= n;
    }
    narrow(out, c.out(0));
  }
};
template <typename C>
using ReduceSumK = ReduceK<C, Red::Sum>;
template <typename C>
using ReduceMeanK = ReduceK<C, Red::Mean>;
template <typename C>
using ReduceMaxK = ReduceK<C, Red::Max>;
template <typename C>
using ReduceMinK = ReduceK<C, Red::Min>;

// ArgMax: the first maximum (the last with select_last_index); NaN above every number.
template <typename C>
struct ArgMaxK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t axis = normalizeAxis(c.node.getInt("axis", 0), static_cast<int64_t>(xs.size()));
    const bool last = c.node.getInt("select_last_index", 0) != 0;
    const AxisSplit s(xs, axis);
    auto x = widen<C>(c.in(0));
    std::vector<int64_t> out(static_cast<size_t>(s.outer * s.inner));
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        int64_t best = 0;
        for (int64_t a = 1; a < s.axis; ++a) {
          const C v = x[(o * s.axis + a) * s.inner + i], b = x[(o * s.axis + best) * s.inner + i];
          if (b != b) break;  // the first NaN is the maximum (as PyTorch's argmax and TopK pick)
          if (v != v || v > b || (last && v == b)) best = a;
        }
        out[o * s.inner + i] = best;
      }
    narrow(out, c.out(0));
  }
};

// TopK(x, K) {axis, largest}: per row along the axis, the K largest (smallest) values in
// descending (ascending) order and their indices; equal values in index order, NaN above every
// number (as PyTorch's topk orders them).
template <typename C>
struct TopKK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t axis = normalizeAxis(c.node.getInt("axis", -1), static_cast<int64_t>(xs.size()));
    const bool largest = c.node.getInt("largest", 1) != 0;
    const int64_t k = c.in(1).getInt(0);
    const AxisSplit s(xs, axis);
    auto x = widen<C>(c.in(0));
    std::vector<C> vals(static_cast<size_t>(s.outer * k * s.inner));
    std::vector<int64_t> idx(vals.size());
    std::vector<int64_t> order(static_cast<size_t>(s.axis));
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        auto at = [&](int64_t a) { return x[static_cast<size_t>((o * s.axis + a) * s.inner + i)]; };
        auto before = [&](int64_t a, int64_t b) {  // a ranks before b
          const C va = at(a), vb = at(b);
          const bool na = va != va, nb = vb != vb;  // NaN
          if (na || nb) return na && !nb ? largest : (!na && nb ? !largest : a < b);
          if (va != vb) return largest ? va > vb : va < vb;
          return a < b;
        };
        for (int64_t a = 0; a < s.axis; ++a) order[static_cast<size_t>(a)] = a;
        std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          const size_t to = static_cast<size_t>((o * k + j) * s.inner + i);
          idx[to] = order[static_cast<size_t>(j)];
          vals[to] = at(idx[to]);
        }
      }
    narrow(vals, c.out(0));
    narrow(idx, c.out(1));
  }
};

// SoftmaxCrossEntropyLoss (kFromScores) and NegativeLogLikelihoodLoss: scores (N, C, d...),
// labels (N, d...), optional class weights, ignore_index, reduction none/sum/mean.
template <typename C, bool kFromScores>
struct LossK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const AxisSplit s(xs, 1);
    auto logp = widen<C>(c.in(0));
    if (kFromScores) softmaxRows(logp, s, true);
    const auto labels = c.in(1).toInts();
    std::vector<C> weights;
    if (c.has(2)) weights = widen<C>(c.in(2));
    const bool hasIgnore = c.node.hasAttr("ignore_index");
    const int64_t ignore = c.node.getInt("ignore_index", 0);
    const std::string red = c.node.getString("reduction", "mean");
    std::vector<C> loss(labels.size());
    C sum = 0, wsum = 0;
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        const size_t k = static_cast<size_t>(o * s.inner + i);
        const int64_t y = labels[k];
        if (hasIgnore && y == ignore) {
          loss[k] = 0;
          continue;
        }
        if (y < 0 || y >= s.axis)
          c.fail("label " + std::to_string(y) + " at position " + std::to_string(k) + " is outside [0, " + std::to_string(s.axis) + ")");
        const C w = weights.empty() ? C(1) : weights[y];
        loss[k] = -logp[(o * s.axis + y) * s.inner + i] * w;
        sum += loss[k];
        wsum += w;
      }
    if (red == "none") narrow(loss, c.out(0));
    else narrow(std::vector<C>{red == "sum" ? sum : sum / wsum}, c.out(0));
    if (kFromScores && c.numOutputs() > 1) narrow(logp, c.out(1));
  }
};
template <typename C>
using SceLossK = LossK<C, true>;
template <typename C>
using NllLossK = LossK<C, false>;

// CumSum(x, axis) {exclusive, reverse}: float sums in f64 (rounded once), integers in int64.
template <typename A>
void cumSumIn(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const auto& s = x.type.shape;
  const int64_t ax = normalizeAxis(c.in(1).getInt(0), x.type.rank());
  const bool exclusive = c.node.getInt("exclusive", 0) != 0, reverse = c.node.getInt("reverse", 0) != 0;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= s[d];
  for (size_t d = ax + 1; d < s.size(); ++d) inner *= s[d];
  const int64_t n = s.empty() ? 1 : s[ax];
  auto v = widen<A>(x);
  std::vector<A> r(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      A acc = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = reverse ? n - 1 - j : j;
        const size_t at = static_cast<size_t>((o * n + k) * inner + i);
        if (exclusive) {
          r[at] = acc;
          acc += v[at];
        } else {
          acc += v[at];
          r[at] = acc;
        }
      }
    }
  narrow(r, c.out(0));
}
void cumSumKernel(KernelCtx& c) {
  if (isFloat(c.in(0).type.dtype)) cumSumIn<double>(c);
  else cumSumIn<int64_t>(c);
}

template <template <typename> class F>
void floatOp(KernelCtx& c) { dispatchFloat<F>(c, c.in(0).type.dtype); }
template <template <typename> class F>
void numericOp(KernelCtx& c) { dispatchNumeric<F>(c, c.in(0).type.dtype); }

}  // namespace

void registerNormKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"BatchNormalization", summingOp<BatchNormK>}, {"LayerNormalization", summingOp<LayerNormK>},
      {"RmsNorm", summingOp<LayerNormK>, "ampc"},
      {"Softmax", summingOp<SoftmaxPlain>}, {"LogSoftmax", summingOp<LogSoftmaxK>},
      {"ReduceSum", summingNumericOp<ReduceSumK>}, {"ReduceMean", summingNumericOp<ReduceMeanK>},
      {"ReduceMax", numericOp<ReduceMaxK>}, {"ReduceMin", numericOp<ReduceMinK>}, {"ArgMax", numericOp<ArgMaxK>}, {"TopK", numericOp<TopKK>},
      {"CumSum", cumSumKernel},
      {"SoftmaxCrossEntropyLoss", summingOp<SceLossK>}, {"NegativeLogLikelihoodLoss", summingOp<NllLossK>},
  });
}

}  // namespace ampc::cpu
