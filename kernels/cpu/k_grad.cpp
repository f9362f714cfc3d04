// Kernels of the "ampc" backward ops that are not GEMM-shaped: normalisation and loss gradients,
// and the scatter-adds that undo gathers (MaxPool's indices, Gather, Slice, Pad).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

// ScatterAddFlat(dY, Indices): dX (shape attr) with dX.flat[Indices[i]] += dY[i].
template <typename C>
struct ScatterAddFlatK {
  static void run(KernelCtx& c) {
    auto dy = widen<C>(c.in(0));
    const auto idx = c.in(1).toInts();
    std::vector<C> dx(static_cast<size_t>(c.out(0).numel()), C(0));
    for (size_t i = 0; i < dy.size(); ++i) {
      if (idx[i] < 0 || idx[i] >= static_cast<int64_t>(dx.size())) c.fail("index " + std::to_string(idx[i]) + " is out of range");
      dx[idx[i]] += dy[i];
    }
    narrow(dx, c.out(0));
  }
};

// BatchNormGrad(dY, X, scale, mean, var) -> dX, dScale, dBias; training_mode uses batch statistics.
template <typename C>
struct BatchNormGradK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(1).type.shape;
    const int64_t N = xs[0], Ch = xs[1];
    int64_t S = 1;
    for (size_t i = 2; i < xs.size(); ++i) S *= xs[i];
    const C eps = static_cast<C>(c.node.getFloat("epsilon", 1e-5f));
    const bool training = c.node.getInt("training_mode", 0) != 0;
    auto dy = widen<C>(c.in(0)), x = widen<C>(c.in(1)), scale = widen<C>(c.in(2)), mean = widen<C>(c.in(3)), var = widen<C>(c.in(4));
    std::vector<C> dx(x.size()), dscale(static_cast<size_t>(Ch)), dbias(static_cast<size_t>(Ch));
    const C count = static_cast<C>(N * S);
    for (int64_t ch = 0; ch < Ch; ++ch) {
      auto at = [&](int64_t n, int64_t i) { return (n * Ch + ch) * S + i; };
      C m = mean[ch], v = var[ch];
      if (training) {
        C s = 0, q = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) s += x[at(n, i)];
        m = s / count;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) q += (x[at(n, i)] - m) * (x[at(n, i)] - m);
        v = q / count;
      }
      const C inv = C(1) / std::sqrt(v + eps);
      C sd = 0, sdx = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          sd += dy[at(n, i)];
          sdx += dy[at(n, i)] * (x[at(n, i)] - m) * inv;
        }
      dbias[ch] = sd;
      dscale[ch] = sdx;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t k = at(n, i);
          const C xhat = (x[k] - m) * inv;
          dx[k] = training ? scale[ch] * inv / count * (count * dy[k] - sd - xhat * sdx) : dy[k] * scale[ch] * inv;
        }
    }
    narrow(dx, c.out(0));
    narrow(dscale, c.out(1));
    narrow(dbias, c.out(2));
  }
};

// LayerNormGrad(dY, X, scale) {rms} -> dX, dScale, dBias (over the normalised dims). rms = 1: the
// gradient of ampc.RmsNorm (no mean taken out, so neither it nor its term in dX).
template <typename C>
struct LayerNormGradK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(1).type.shape;
    const int64_t axis = normalizeAxis(c.node.getInt("axis", -1), static_cast<int64_t>(xs.size()));
    const std::vector<int64_t> norm(xs.begin() + axis, xs.end());
    int64_t outer = 1, D = 1;
    for (int64_t i = 0; i < static_cast<int64_t>(xs.size()); ++i) (i < axis ? outer : D) *= xs[i];
    const C eps = static_cast<C>(c.node.getFloat("epsilon", 1e-5f));
    auto dy = widen<C>(c.in(0)), x = widen<C>(c.in(1)), raw = widen<C>(c.in(2));
    std::vector<C> scale(static_cast<size_t>(D));
    BroadcastIter it(norm, c.in(2).type.shape);
    for (int64_t k = 0; k < D; ++k, it.next()) scale[k] = raw[it.offset()];
    std::vector<C> dx(x.size()), dscale(static_cast<size_t>(D), C(0)), dbias(static_cast<size_t>(D), C(0)), xhat(static_cast<size_t>(D));
    const bool rms = c.node.getInt("rms", 0) != 0;
    for (int64_t o = 0; o < outer; ++o) {
      const C* row = x.data() + o * D;
      const C* drow = dy.data() + o * D;
      C m = 0, v = 0;
      for (int64_t k = 0; k < D && !rms; ++k) m += row[k];
      m /= static_cast<C>(D);
      for (int64_t k = 0; k < D; ++k) v += (row[k] - m) * (row[k] - m);
      const C inv = C(1) / std::sqrt(v / static_cast<C>(D) + eps);
      C a = 0, b = 0;  // mean of g and of g * xhat, with g = dy * scale
      for (int64_t k = 0; k < D; ++k) {
        xhat[k] = (row[k] - m) * inv;
        const C g = drow[k] * scale[k];
        a += g;
        b += g * xhat[k];
        dscale[k] += drow[k] * xhat[k];
        dbias[k] += drow[k];
      }
      a = rms ? C(0) : a / static_cast<C>(D);
      b /= static_cast<C>(D);
      for (int64_t k = 0; k < D; ++k) dx[o * D + k] = inv * (drow[k] * scale[k] - a - xhat[k] * b);
    }
    narrow(dx, c.out(0));
    narrow(dscale, c.out(1));
    narrow(dbias, c.out(2));
  }
};

// Loss gradients: (dLoss, scores or log-probabilities, labels, weights?) -> dScores.
template <typename C, bool kSoftmax>
struct LossGradK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(1).type.shape;
    const AxisSplit s(xs, 1);
    auto x = widen<C>(c.in(1));
    const auto labels = c.in(2).toInts();
    std::vector<C> weights;
    if (c.has(3)) weights = widen<C>(c.in(3));
    auto dl = widen<C>(c.in(0));
    const bool hasIgnore = c.node.hasAttr("ignore_index");
    const int64_t ignore = c.node.getInt("ignore_index", 0);
    const std::string red = c.node.getString("reduction", "mean");
    // Everything an index or a size reads is checked first (a plan's graph is not trusted).
    if (static_cast<int64_t>(labels.size()) != s.outer * s.inner)
      c.fail("labels hold " + std::to_string(labels.size()) + " entries for " + std::to_string(s.outer * s.inner) + " positions");
    if (!weights.empty() && static_cast<int64_t>(weights.size()) != s.axis)
      c.fail("weights hold " + std::to_string(weights.size()) + " entries for " + std::to_string(s.axis) + " classes");
    if (dl.size() != (red == "none" ? labels.size() : size_t{1}))
      c.fail("the loss gradient holds " + std::to_string(dl.size()) + " elements; reduction '" + red + "' needs " +
             std::to_string(red == "none" ? labels.size() : size_t{1}));
    for (int64_t y : labels)
      if (!(hasIgnore && y == ignore) && (y < 0 || y >= s.axis))
        c.fail("label " + std::to_string(y) + " is outside [0, " + std::to_string(s.axis) + ")");
    C wsum = 0;
    for (size_t k = 0; k < labels.size(); ++k)
      if (!(hasIgnore && labels[k] == ignore)) wsum += weights.empty() ? C(1) : weights[labels[k]];
    std::vector<C> dx(x.size(), C(0));
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        const size_t k = static_cast<size_t>(o * s.inner + i);
        const int64_t y = labels[k];
        if (hasIgnore && y == ignore) continue;
        const C w = weights.empty() ? C(1) : weights[y];
        const C g = (red == "none" ? dl[k] : red == "sum" ? dl[0] : dl[0] / wsum) * w;
        if (kSoftmax) {
          C mx = -std::numeric_limits<C>::infinity(), sum = 0;
          for (int64_t a = 0; a < s.axis; ++a) mx = std::max(mx, x[(o * s.axis + a) * s.inner + i]);
          for (int64_t a = 0; a < s.axis; ++a) sum += std::exp(x[(o * s.axis + a) * s.inner + i] - mx);
          for (int64_t a = 0; a < s.axis; ++a) {
            const size_t j = static_cast<size_t>((o * s.axis + a) * s.inner + i);
            dx[j] = g * (std::exp(x[j] - mx) / sum - (a == y ? C(1) : C(0)));
          }
        } else {
          dx[static_cast<size_t>((o * s.axis + y) * s.inner + i)] = -g;
        }
      }
    narrow(dx, c.out(0));
  }
};
template <typename C>
using SceGradK = LossGradK<C, true>;
template <typename C>
using NllGradK = LossGradK<C, false>;

// SliceGrad(dY, starts, ends, axes?, steps?) with the input's shape as attribute.
template <typename C>
struct SliceGradK {
  static void run(KernelCtx& c) {
    const auto shape = c.node.getInts("shape");
    auto ints = [&](size_t i) { return c.has(i) ? c.in(i).toInts() : std::vector<int64_t>{}; };
    SliceSpec s;
    try {
      s = sliceSpecOf(shape, ints(1), ints(2), ints(3), ints(4));
    } catch (const Error& e) {
      c.fail(e.what());
    }
    auto dy = widen<C>(c.in(0));
    std::vector<C> dx(static_cast<size_t>(c.out(0).numel()), C(0));
    const auto st = stridesOf(shape);
    std::vector<int64_t> idx(shape.size(), 0);
    for (size_t i = 0; i < dy.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < shape.size(); ++d) off += (s.start[d] + idx[d] * s.step[d]) * st[d];
      dx[off] += dy[i];
      for (size_t d = shape.size(); d-- > 0;) {
        if (++idx[d] < s.out[d]) break;
        idx[d] = 0;
      }
    }
    narrow(dx, c.out(0));
  }
};

// GatherGrad(dY, indices[, base]) with axis and the data's shape: the scatter-add that undoes Gather,
// starting from base (widened) where given.
template <typename C>
struct GatherGradK {
  static void run(KernelCtx& c) {
    const auto xs = c.node.getInts("shape");
    const int64_t ax = normalizeAxis(c.node.getInt("axis", 0), static_cast<int64_t>(xs.size()));
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < ax; ++d) outer *= xs[d];
    for (size_t d = ax + 1; d < xs.size(); ++d) inner *= xs[d];
    const int64_t dim = xs[ax];
    auto idx = c.in(1).toInts();
    const int64_t n = static_cast<int64_t>(idx.size());
    auto dy = widen<C>(c.in(0));
    std::vector<C> dx = c.has(2) ? widen<C>(c.in(2)) : std::vector<C>(static_cast<size_t>(c.out(0).numel()), C(0));
    for (auto& k : idx) {
      if (k < -dim || k >= dim) c.fail("index " + std::to_string(k) + " is out of range for axis length " + std::to_string(dim));
      if (k < 0) k += dim;
    }
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < inner; ++i) dx[(o * dim + idx[j]) * inner + i] += dy[(o * n + j) * inner + i];
    narrow(dx, c.out(0));
  }
};

// GatherElementsGrad / GatherNDGrad(dY, indices) with the data's shape: scatter-adds (f64 sums).
template <typename C>
struct GatherElementsGradK {
  static void run(KernelCtx& c) {
    const auto xs = c.node.getInts("shape");
    const auto off = gatherElementsOffsets(c, xs, c.in(1), normalizeAxis(c.node.getInt("axis", 0), static_cast<int64_t>(xs.size())));
    const auto dy = widen<double>(c.in(0));
    std::vector<double> dx(static_cast<size_t>(c.out(0).numel()), 0.0);
    for (size_t i = 0; i < off.size(); ++i) dx[off[i]] += dy[i];
    narrow(dx, c.out(0));
  }
};
template <typename C>
struct GatherNDGradK {
  static void run(KernelCtx& c) {
    const auto xs = c.node.getInts("shape");
    int64_t slice = 1;
    const auto off = gatherNDOffsets(c, xs, c.in(1), c.node.getInt("batch_dims", 0), slice);
    const auto dy = widen<double>(c.in(0));
    std::vector<double> dx(static_cast<size_t>(c.out(0).numel()), 0.0);
    for (size_t t = 0; t < off.size(); ++t)
      for (int64_t i = 0; i < slice; ++i) dx[off[t] + i] += dy[t * slice + i];
    narrow(dx, c.out(0));
  }
};

// PadGrad(dY, pads, axes?) with mode and the input's shape: each output element's gradient goes
// back to the input element it was read from (none for constant fill).
template <typename C>
struct PadGradK {
  static void run(KernelCtx& c) {
    const auto xs = c.node.getInts("shape");
    const int64_t r = static_cast<int64_t>(xs.size());
    const auto pads = c.in(1).toInts();
    std::vector<int64_t> axes;
    if (c.has(2)) axes = c.in(2).toInts();
    else for (int64_t i = 0; i < r; ++i) axes.push_back(i);
    std::vector<int64_t> begin(r, 0);
    for (size_t i = 0; i < axes.size(); ++i) begin[normalizeAxis(axes[i], r)] = pads[i];
    const std::string mode = c.node.getString("mode", "constant");
    auto dy = widen<C>(c.in(0));
    std::vector<C> dx(static_cast<size_t>(c.out(0).numel()), C(0));
    const auto st = stridesOf(xs);
    const auto& os = c.in(0).type.shape;
    std::vector<int64_t> o(r, 0);
    for (size_t i = 0; i < dy.size(); ++i) {
      int64_t off = 0;
      bool constant = false;
      for (int64_t d = 0; d < r && !constant; ++d) {
        int64_t k = o[d] - begin[d];
        const int64_t n = xs[d];
        if (k < 0 || k >= n) {
          if (mode == "constant" || n == 0) constant = true;
          else if (mode == "edge") k = std::clamp<int64_t>(k, 0, n - 1);
          else if (mode == "wrap") k = ((k % n) + n) % n;
          else if (n == 1) k = 0;
          else {
            const int64_t period = 2 * (n - 1);
            k = ((k % period) + period) % period;
            if (k >= n) k = period - k;
          }
        }
        off += k * st[d];
      }
      if (!constant) dx[off] += dy[i];
      for (int64_t d = r; d-- > 0;) {
        if (++o[d] < os[d]) break;
        o[d] = 0;
      }
    }
    narrow(dx, c.out(0));
  }
};

// DropoutGrad(dY, mask, ratio?, training_mode?): dY * mask / (1 - ratio) where the forward
// dropped, dY itself where it did not (the same conditions as the Dropout kernel).
template <typename C>
struct DropoutGradK {
  static void run(KernelCtx& c) {
    const float ratio = c.has(2) ? static_cast<float>(c.in(2).getDouble(0)) : 0.5f;
    const bool training = c.has(3) && c.in(3).getInt(0) != 0;
    auto dy = widen<C>(c.in(0));
    if (training && c.opts.dropout && ratio > 0.0f) {
      const C scale = static_cast<C>(1.0 / (1.0 - static_cast<double>(ratio)));
      const Tensor& mask = c.in(1);
      for (size_t i = 0; i < dy.size(); ++i) dy[i] = mask.data[i] ? dy[i] * scale : C(0);
    }
    narrow(dy, c.out(0));
  }
};

template <template <typename> class F>
void floatOp(KernelCtx& c) { dispatchFloat<F>(c, c.in(0).type.dtype); }
template <template <typename> class F>
void floatOn1(KernelCtx& c) { dispatchFloat<F>(c, c.in(1).type.dtype); }

}  // namespace

void registerGradKernels(std::vector<KernelRow>& t) {
  registerLinearGradKernels(t);
  t.insert(t.end(), {
      {"ScatterAddFlat", summingOp<ScatterAddFlatK>, "ampc"},
      {"BatchNormGrad", summingOn1<BatchNormGradK>, "ampc"},
      {"LayerNormGrad", summingOn1<LayerNormGradK>, "ampc"},
      {"SoftmaxCrossEntropyLossGrad", summingOn1<SceGradK>, "ampc"},
      {"NegativeLogLikelihoodLossGrad", summingOn1<NllGradK>, "ampc"},
      {"SliceGrad", summingOp<SliceGradK>, "ampc"},
      {"GatherGrad", summingOp<GatherGradK>, "ampc"}, {"GatherElementsGrad", floatOp<GatherElementsGradK>, "ampc"},
      {"GatherNDGrad", floatOp<GatherNDGradK>, "ampc"},
      {"PadGrad", summingOp<PadGradK>, "ampc"},
      {"DropoutGrad", floatOp<DropoutGradK>, "ampc"},
  });
}

}  // namespace ampc::cpu
