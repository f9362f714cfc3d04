// GEMM-shaped kernels: MatMul, Gemm, Conv (im2col + GEMM, any spatial rank, groups, strides, pads,
// dilations), and the pools. Accumulation is in the compute type (f32 for f16/bf16 operands).
#include <algorithm>
#include <cmath>

#include "compiler/target.h"
#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

// out[M,N] += A[M,K] * B[K,N], all row-major and contiguous. Blocked over K so a panel of B stays
// in cache; rows of the output are split across threads.
template <typename C>
void gemmAcc(int64_t M, int64_t N, int64_t K, const C* A, const C* B, C* out) {
  constexpr int64_t kBlock = 256;
  const bool parallel = M * N * K > (1 << 16);
  for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
    const int64_t k1 = std::min(K, k0 + kBlock);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t i = 0; i < M; ++i) {
      C* o = out + i * N;
      for (int64_t k = k0; k < k1; ++k) {
        const C a = A[i * K + k];
        if (a == C(0)) continue;
        const C* b = B + k * N;
        for (int64_t j = 0; j < N; ++j) o[j] += a * b[j];
      }
    }
  }
}

// Copies a row-major [R, S] matrix to [S, R].
template <typename C>
std::vector<C> transposed(const C* a, int64_t r, int64_t s) {
  std::vector<C> t(static_cast<size_t>(r * s));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < s; ++j) t[j * r + i] = a[i * s + j];
  return t;
}

template <typename C>
struct MatMulK {
  static void run(KernelCtx& c) {
    auto as = c.in(0).type.shape, bs = c.in(1).type.shape;
    if (as.size() == 1) as.insert(as.begin(), 1);
    if (bs.size() == 1) bs.push_back(1);
    const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
    std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    const size_t r = std::max(ab.size(), bb.size());
    std::vector<int64_t> ob(r);
    for (size_t i = 0; i < r; ++i) {
      int64_t da = i < r - ab.size() ? 1 : ab[i - (r - ab.size())], db = i < r - bb.size() ? 1 : bb[i - (r - bb.size())];
      ob[i] = std::max(da, db);
    }
    int64_t batches = 1;
    for (int64_t d : ob) batches *= d;
    auto a = widen<C>(c.in(0)), b = widen<C>(c.in(1));
    std::vector<C> out(static_cast<size_t>(batches * M * N), C(0));
    BroadcastIter ia(ob, ab), ib(ob, bb);
    for (int64_t t = 0; t < batches; ++t, ia.next(), ib.next())
      gemmAcc<C>(M, N, K, a.data() + ia.offset() * M * K, b.data() + ib.offset() * K * N, out.data() + t * M * N);
    narrow(out, c.out(0));
  }
};

template <typename C>
struct GemmK {
  static void run(KernelCtx& c) {
    const auto &as = c.in(0).type.shape, &bs = c.in(1).type.shape;
    const bool ta = c.node.getInt("transA", 0) != 0, tb = c.node.getInt("transB", 0) != 0;
    const C alpha = static_cast<C>(c.node.getFloat("alpha", 1.0f)), beta = static_cast<C>(c.node.getFloat("beta", 1.0f));
    const int64_t M = ta ? as[1] : as[0], K = ta ? as[0] : as[1], N = tb ? bs[0] : bs[1];
    auto a = widen<C>(c.in(0)), b = widen<C>(c.in(1));
    if (ta) a = transposed(a.data(), as[0], as[1]);
    if (tb) b = transposed(b.data(), bs[0], bs[1]);
    std::vector<C> out(static_cast<size_t>(M * N), C(0));
    gemmAcc<C>(M, N, K, a.data(), b.data(), out.data());
    for (auto& v : out) v *= alpha;
    if (c.has(2)) {
      auto bias = widen<C>(c.in(2));
      BroadcastIter it({M, N}, c.in(2).type.shape);
      for (size_t i = 0; i < out.size(); ++i, it.next()) out[i] += beta * bias[it.offset()];
    }
    narrow(out, c.out(0));
  }
};

// cuda.Gemm (passes/fuse_bias_grad.cpp): the product as Gemm computes it, and, with a result 1, the
// column sums of operand bias_grad as ReduceSum(axes = [0]) computes them (the same accumulator
// type, rows in order), so the fused graph is bitwise the unfused one.
template <typename C>
struct TargetGemmK {
  static void run(KernelCtx& c) {
    GemmK<C>::run(c);
    if (c.node.numResults() < 2) return;
    const Tensor& x = c.in(static_cast<size_t>(c.node.getInt("bias_grad", 0)));
    const int64_t R = x.type.shape[0], N = x.type.shape[1];
    const auto v = widen<C>(x);
    std::vector<C> sums(static_cast<size_t>(N), C(0));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t j = 0; j < N; ++j) sums[static_cast<size_t>(j)] += v[static_cast<size_t>(r * N + j)];
    narrow(sums, c.out(1));
  }
};

int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t d : v) p *= d;
  return p;
}

// The im2col table of a convolution: for row r = (channel in the group, kernel position) and
// output position p, the offset of the input element within the group's channels, or -1 where the
// window reads padding. Forward and backward share it.
std::vector<int64_t> im2colOffsets(const Window& w, const std::vector<int64_t>& spatialIn, const std::vector<int64_t>& kernel,
                                   int64_t channels) {
  const size_t sp = spatialIn.size();
  const int64_t KK = product(kernel), P = product(w.out), IS = product(spatialIn), R = channels * KK;
  const auto inStrides = stridesOf(spatialIn);
  std::vector<int64_t> where(static_cast<size_t>(R * P));
#pragma omp parallel for schedule(static) if (R * P > (1 << 14))
  for (int64_t r = 0; r < R; ++r) {
    int64_t krem = r % KK;
    std::vector<int64_t> kpos(sp);
    for (size_t d = sp; d-- > 0;) {
      kpos[d] = krem % kernel[d];
      krem /= kernel[d];
    }
    Odometer o(w.out);
    for (int64_t p = 0; p < P; ++p, o.next()) {
      int64_t off = (r / KK) * IS;
      bool inside = true;
      for (size_t d = 0; d < sp && inside; ++d) {
        const int64_t coord = o.idx[d] * w.strides[d] - w.padBegin[d] + kpos[d] * w.dilations[d];
        inside = coord >= 0 && coord < spatialIn[d];
        off += coord * inStrides[d];
      }
      where[r * P + p] = inside ? off : -1;
    }
  }
  return where;
}

// Shapes of a convolution, from X [N, C, spatial...] and W [M, C/group, kernel...].
struct ConvShape {
  std::vector<int64_t> spatialIn, kernel;
  Window w;
  int64_t N, Cin, M, G, Cg, Mg, KK, P, IS, R;
};
ConvShape convShape(KernelCtx& c, const std::vector<int64_t>& xs, const std::vector<int64_t>& ws) {
  ConvShape s;
  s.spatialIn.assign(xs.begin() + 2, xs.end());
  s.kernel.assign(ws.begin() + 2, ws.end());
  try {
    s.w = windowOf(c.node, s.spatialIn, s.kernel, false);
  } catch (const Error& e) {
    c.fail(e.what());
  }
  s.N = xs[0], s.Cin = xs[1], s.M = ws[0], s.G = c.node.getInt("group", 1);
  s.Cg = s.Cin / s.G, s.Mg = s.M / s.G, s.KK = product(s.kernel), s.P = product(s.w.out), s.IS = product(s.spatialIn);
  s.R = s.Cg * s.KK;
  return s;
}

// The pooling window of a MaxPool / AveragePool node (its kernel_shape and ceil_mode).
Window poolWindow(KernelCtx& c, const std::vector<int64_t>& spatialIn) {
  try {
    return windowOf(c.node, spatialIn, c.node.getInts("kernel_shape"), c.node.getInt("ceil_mode", 0) != 0);
  } catch (const Error& e) {
    c.fail(e.what());
  }
}

template <typename C>
struct ConvK {
  static void run(KernelCtx& c) {
    const ConvShape s = convShape(c, c.in(0).type.shape, c.in(1).type.shape);
    const int64_t N = s.N, Cin = s.Cin, M = s.M, G = s.G, Cg = s.Cg, Mg = s.Mg, P = s.P, IS = s.IS, R = s.R;
    auto x = widen<C>(c.in(0)), wt = widen<C>(c.in(1));
    std::vector<C> out(static_cast<size_t>(N * M * P), C(0));
    std::vector<C> col(static_cast<size_t>(R * P));
    const auto where = im2colOffsets(s.w, s.spatialIn, s.kernel, Cg);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) {
        const C* xg = x.data() + (n * Cin + g * Cg) * IS;
        for (int64_t i = 0; i < R * P; ++i) col[i] = where[i] >= 0 ? xg[where[i]] : C(0);
        gemmAcc<C>(Mg, P, R, wt.data() + g * Mg * R, col.data(), out.data() + (n * M + g * Mg) * P);
      }
    if (c.has(2)) {
      auto bias = widen<C>(c.in(2));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t m = 0; m < M; ++m)
          for (int64_t p = 0; p < P; ++p) out[(n * M + m) * P + p] += bias[m];
    }
    narrow(out, c.out(0));
  }
};

// MaxPool and AveragePool over any spatial rank.
template <typename C, bool kMax>
void pool(KernelCtx& c) {
  const auto& xs = c.in(0).type.shape;
  const size_t sp = xs.size() - 2;
  const std::vector<int64_t> spatialIn(xs.begin() + 2, xs.end());
  const Window w = poolWindow(c, spatialIn);
  const bool includePad = c.node.getInt("count_include_pad", 0) != 0;
  const bool columnMajor = c.node.getInt("storage_order", 0) != 0;  // MaxPool's Indices layout
  const int64_t planes = xs[0] * xs[1], IS = product(spatialIn), P = product(w.out);
  const auto inStrides = stridesOf(spatialIn);
  auto x = widen<C>(c.in(0));
  std::vector<C> out(static_cast<size_t>(planes * P));
  std::vector<int64_t> indices(kMax ? out.size() : 0);
#pragma omp parallel for schedule(static) if (planes * P > 4096)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const C* plane = x.data() + pl * IS;
    Odometer o(w.out);
    for (int64_t p = 0; p < P; ++p, o.next()) {
      C acc = kMax ? -std::numeric_limits<C>::infinity() : C(0);
      int64_t best = -1, count = 0, padded = 0;
      Odometer k(w.kernel);
      for (int64_t kk = 0; kk < product(w.kernel); ++kk, k.next()) {
        int64_t off = 0, colOff = 0, colStride = 1;
        bool inside = true, inPadded = true;
        for (size_t d = 0; d < sp; ++d) {
          int64_t coord = o.idx[d] * w.strides[d] - w.padBegin[d] + k.idx[d] * w.dilations[d];
          inside = inside && coord >= 0 && coord < spatialIn[d];
          inPadded = inPadded && coord >= -w.padBegin[d] && coord < spatialIn[d] + w.padEnd[d];
          off += coord * inStrides[d];
          colOff += coord * colStride;
          colStride *= spatialIn[d];
        }
        padded += inPadded;
        if (!inside) continue;
        const C v = plane[off];
        ++count;
        if constexpr (kMax) {
          if (best < 0 || v > acc || v != v) {
            acc = v;
            best = columnMajor ? colOff : off;
          }
        } else {
          acc += v;
        }
      }
      if constexpr (kMax) {
        out[pl * P + p] = acc;
        indices[pl * P + p] = best < 0 ? -1 : pl * IS + best;
      } else {
        const int64_t div = includePad ? padded : count;
        out[pl * P + p] = div > 0 ? acc / static_cast<C>(div) : C(0);
      }
    }
  }
  narrow(out, c.out(0));
  if (kMax && c.numOutputs() > 1) narrow(indices, c.out(1));
}

template <typename C>
struct MaxPoolK {
  static void run(KernelCtx& c) { pool<C, true>(c); }
};
template <typename C>
struct AveragePoolK {
  static void run(KernelCtx& c) { pool<C, false>(c); }
};
template <typename C>
struct GlobalAveragePoolK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(0).type.shape;
    const int64_t planes = xs[0] * xs[1], IS = product(std::vector<int64_t>(xs.begin() + 2, xs.end()));
    auto x = widen<C>(c.in(0));
    std::vector<C> out(static_cast<size_t>(planes));
    for (int64_t p = 0; p < planes; ++p) {
      C s = 0;
      for (int64_t i = 0; i < IS; ++i) s += x[p * IS + i];
      out[p] = s / static_cast<C>(IS);
    }
    narrow(out, c.out(0));
  }
};

// ConvGrad(dY, X, W) -> (dX, dW): per image and group, dW += dY col^T and dX = col2im(W^T dY).
template <typename C>
struct ConvGradK {
  static void run(KernelCtx& c) {
    const ConvShape s = convShape(c, c.in(1).type.shape, c.in(2).type.shape);
    const int64_t N = s.N, Cin = s.Cin, M = s.M, G = s.G, Cg = s.Cg, Mg = s.Mg, P = s.P, IS = s.IS, R = s.R;
    auto dy = widen<C>(c.in(0)), x = widen<C>(c.in(1)), wt = widen<C>(c.in(2));
    std::vector<C> dx(x.size(), C(0)), dw(wt.size(), C(0)), col(static_cast<size_t>(R * P)), dcol(static_cast<size_t>(R * P));
    const auto where = im2colOffsets(s.w, s.spatialIn, s.kernel, Cg);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < G; ++g) {
        const C* xg = x.data() + (n * Cin + g * Cg) * IS;
        for (int64_t i = 0; i < R * P; ++i) col[i] = where[i] >= 0 ? xg[where[i]] : C(0);
        const C* dyg = dy.data() + (n * M + g * Mg) * P;
        // dW_g [Mg, R] += dY_g [Mg, P] * col^T [P, R]
        auto colT = transposed(col.data(), R, P);
        gemmAcc<C>(Mg, R, P, dyg, colT.data(), dw.data() + g * Mg * R);
        // dcol [R, P] = W_g^T [R, Mg] * dY_g [Mg, P]
        auto wT = transposed(wt.data() + g * Mg * R, Mg, R);
        std::fill(dcol.begin(), dcol.end(), C(0));
        gemmAcc<C>(R, P, Mg, wT.data(), dyg, dcol.data());
        C* dxg = dx.data() + (n * Cin + g * Cg) * IS;
        for (int64_t i = 0; i < R * P; ++i)
          if (where[i] >= 0) dxg[where[i]] += dcol[i];
      }
    narrow(dx, c.out(0));
    narrow(dw, c.out(1));
  }
};

// AveragePoolGrad(dY, X): each output's gradient spread evenly over its window.
template <typename C>
struct AveragePoolGradK {
  static void run(KernelCtx& c) {
    const auto& xs = c.in(1).type.shape;
    const size_t sp = xs.size() - 2;
    const std::vector<int64_t> spatialIn(xs.begin() + 2, xs.end());
    const Window w = poolWindow(c, spatialIn);
    const bool includePad = c.node.getInt("count_include_pad", 0) != 0;
    const int64_t planes = xs[0] * xs[1], IS = product(spatialIn), P = product(w.out), KK = product(w.kernel);
    const auto inStrides = stridesOf(spatialIn);
    auto dy = widen<C>(c.in(0));
    std::vector<C> dx(static_cast<size_t>(planes * IS), C(0));
    for (int64_t pl = 0; pl < planes; ++pl) {
      Odometer o(w.out);
      for (int64_t p = 0; p < P; ++p, o.next()) {
        std::vector<int64_t> offs;
        int64_t padded = 0;
        Odometer k(w.kernel);
        for (int64_t kk = 0; kk < KK; ++kk, k.next()) {
          int64_t off = 0;
          bool inside = true, inPadded = true;
          for (size_t d = 0; d < sp; ++d) {
            const int64_t coord = o.idx[d] * w.strides[d] - w.padBegin[d] + k.idx[d] * w.dilations[d];
            inside = inside && coord >= 0 && coord < spatialIn[d];
            inPadded = inPadded && coord >= -w.padBegin[d] && coord < spatialIn[d] + w.padEnd[d];
            off += coord * inStrides[d];
          }
          padded += inPadded;
          if (inside) offs.push_back(off);
        }
        const int64_t div = includePad ? padded : static_cast<int64_t>(offs.size());
        if (div == 0) continue;
        const C g = dy[pl * P + p] / static_cast<C>(div);
        for (int64_t off : offs) dx[pl * IS + off] += g;
      }
    }
    narrow(dx, c.out(0));
  }
};

template <template <typename> class F>
void floatOp(KernelCtx& c) { dispatchFloat<F>(c, c.in(0).type.dtype); }
// MaxPool also takes u8/i8 (ONNX allows them).
template <typename C>
struct MaxPoolAnyK {
  static void run(KernelCtx& c) {
    if constexpr (std::is_integral_v<C>) {
      MaxPoolK<double>::run(c);  // exact for 8-bit values
    } else {
      MaxPoolK<C>::run(c);
    }
  }
};

// GridSample (ONNX GridSample, PyTorch's grid_sample), 2-d: a normalised grid coordinate g in
// [-1, 1] to a pixel coordinate along one axis of `size` pixels (align_corners: -1 and 1 are the
// centres of the end pixels, else their outer edges), then the padding mode's clip (border) or
// reflection and clip (reflection); zeros leaves it, and corners outside read 0. Also d(pixel)/dg.
struct GridAxis {
  int64_t size;
  bool align;
  int pad;  // 0 zeros, 1 border, 2 reflection
  template <typename C>
  C map(C g, C* dpdg) const {
    const C n = static_cast<C>(size);
    C x = align ? (g + 1) / 2 * (n - 1) : ((g + 1) * n - 1) / 2;
    C d = align ? (n - 1) / 2 : n / 2;
    if (pad == 2) {
      const C lo2 = align ? 0 : -1, hi2 = align ? 2 * (n - 1) : 2 * n - 1;
      if (lo2 == hi2) {
        x = 0;
        d = 0;
      } else {
        const C mn = lo2 / 2, span = (hi2 - lo2) / 2;
        C in = x - mn, sign = 1;
        if (in < 0) {
          sign = -1;
          in = -in;
        }
        const C extra = std::fmod(in, span), flips = std::floor(in / span);
        const bool even = std::fmod(flips, C(2)) == 0;
        x = even ? extra + mn : span - extra + mn;
        d *= even ? sign : -sign;
      }
    }
    if (pad != 0) {
      if (x <= 0) {
        x = 0;
        d = 0;
      } else if (x >= n - 1) {
        x = n - 1;
        d = 0;
      }
    }
    *dpdg = d;
    return x;
  }
};
struct GridGeom {
  int64_t N, Ch, H, W, Ho, Wo;
  GridAxis ax, ay;
  bool nearest;
  explicit GridGeom(KernelCtx& c) {
    const auto &xs = c.in(c.numInputs() == 3 ? 1 : 0).type.shape, &gs = c.in(c.numInputs() == 3 ? 2 : 1).type.shape;
    N = xs[0], Ch = xs[1], H = xs[2], W = xs[3], Ho = gs[1], Wo = gs[2];
    const bool align = c.node.getInt("align_corners", 0) != 0;
    const std::string pad = c.node.getString("padding_mode", "zeros");
    const int p = pad == "border" ? 1 : pad == "reflection" ? 2 : 0;
    ax = {W, align, p};
    ay = {H, align, p};
    nearest = c.node.getString("mode", "bilinear") == "nearest";
  }
};

template <typename C>
struct GridSampleK {
  static void run(KernelCtx& c) {
    const GridGeom q(c);
    const auto x = widen<C>(c.in(0)), g = widen<C>(c.in(1));
    std::vector<C> out(static_cast<size_t>(q.N * q.Ch * q.Ho * q.Wo), C(0));
    for (int64_t n = 0; n < q.N; ++n)
      for (int64_t p = 0; p < q.Ho * q.Wo; ++p) {
        C d;
        const C px = q.ax.map(g[static_cast<size_t>((n * q.Ho * q.Wo + p) * 2)], &d);
        const C py = q.ay.map(g[static_cast<size_t>((n * q.Ho * q.Wo + p) * 2 + 1)], &d);
        for (int64_t ch = 0; ch < q.Ch; ++ch) {
          const C* plane = x.data() + (n * q.Ch + ch) * q.H * q.W;
          auto at = [&](int64_t yi, int64_t xi) { return yi >= 0 && yi < q.H && xi >= 0 && xi < q.W ? plane[yi * q.W + xi] : C(0); };
          C v;
          if (q.nearest) {
            v = at(static_cast<int64_t>(std::nearbyint(py)), static_cast<int64_t>(std::nearbyint(px)));
          } else {
            const int64_t x0 = static_cast<int64_t>(std::floor(px)), y0 = static_cast<int64_t>(std::floor(py));
            const C wx1 = px - static_cast<C>(x0), wy1 = py - static_cast<C>(y0), wx0 = 1 - wx1, wy0 = 1 - wy1;
            v = at(y0, x0) * wy0 * wx0 + at(y0, x0 + 1) * wy0 * wx1 + at(y0 + 1, x0) * wy1 * wx0 + at(y0 + 1, x0 + 1) * wy1 * wx1;
          }
          out[static_cast<size_t>((n * q.Ch + ch) * q.Ho * q.Wo + p)] = v;
        }
      }
    narrow(out, c.out(0));
  }
};

// GridSampleGrad(dY, X, grid) -> dX (the samples' weights scattered back), dGrid (the
// interpolation's slope along each axis times d(pixel)/dg; 0 for nearest).
template <typename C>
struct GridSampleGradK {
  static void run(KernelCtx& c) {
    const GridGeom q(c);
    const auto dy = widen<C>(c.in(0)), x = widen<C>(c.in(1)), g = widen<C>(c.in(2));
    std::vector<C> dx(x.size(), C(0)), dg(g.size(), C(0));
    for (int64_t n = 0; n < q.N; ++n)
      for (int64_t p = 0; p < q.Ho * q.Wo; ++p) {
        const size_t gi = static_cast<size_t>((n * q.Ho * q.Wo + p) * 2);
        C dxdg, dydg;
        const C px = q.ax.map(g[gi], &dxdg), py = q.ay.map(g[gi + 1], &dydg);
        C sx = 0, sy = 0;
        for (int64_t ch = 0; ch < q.Ch; ++ch) {
          const int64_t base = (n * q.Ch + ch) * q.H * q.W;
          const C go = dy[static_cast<size_t>((n * q.Ch + ch) * q.Ho * q.Wo + p)];
          auto in = [&](int64_t yi, int64_t xi) { return yi >= 0 && yi < q.H && xi >= 0 && xi < q.W; };
          auto val = [&](int64_t yi, int64_t xi) { return in(yi, xi) ? x[static_cast<size_t>(base + yi * q.W + xi)] : C(0); };
          auto put = [&](int64_t yi, int64_t xi, C w) {
            if (in(yi, xi)) dx[static_cast<size_t>(base + yi * q.W + xi)] += w * go;
          };
          if (q.nearest) {
            put(static_cast<int64_t>(std::nearbyint(py)), static_cast<int64_t>(std::nearbyint(px)), C(1));
            continue;
          }
          const int64_t x0 = static_cast<int64_t>(std::floor(px)), y0 = static_cast<int64_t>(std::floor(py));
          const C wx1 = px - static_cast<C>(x0), wy1 = py - static_cast<C>(y0), wx0 = 1 - wx1, wy0 = 1 - wy1;
          put(y0, x0, wy0 * wx0);
          put(y0, x0 + 1, wy0 * wx1);
          put(y0 + 1, x0, wy1 * wx0);
          put(y0 + 1, x0 + 1, wy1 * wx1);
          const C v00 = val(y0, x0), v01 = val(y0, x0 + 1), v10 = val(y0 + 1, x0), v11 = val(y0 + 1, x0 + 1);
          sx += go * ((v01 - v00) * wy0 + (v11 - v10) * wy1);
          sy += go * ((v10 - v00) * wx0 + (v11 - v01) * wx1);
        }
        dg[gi] = sx * dxdg;
        dg[gi + 1] = sy * dydg;
      }
    narrow(dx, c.out(0));
    narrow(dg, c.out(1));
  }
};

// Det and its gradient, in f64 over each trailing [n, n] matrix. The determinant is Gaussian
// elimination's pivot product (partial pivoting, the first largest pivot); the gradient is dY times
// the cofactor matrix, det * inv(X)^T by Gauss-Jordan where no pivot is zero, else each cofactor
// as the determinant of its minor (a singular matrix of rank n - 1 still has one: PyTorch's too).

// The determinant of the m x m matrix a (rows `stride` apart), which it overwrites.
double eliminateDet(double* a, int64_t m, int64_t stride) {
  double det = 1.0;
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;
    for (int64_t r = k + 1; r < m; ++r)
      if (std::fabs(a[r * stride + k]) > std::fabs(a[p * stride + k])) p = r;
    const double piv = a[p * stride + k];
    if (piv == 0.0) return 0.0;
    if (p != k) {
      for (int64_t j = k; j < m; ++j) std::swap(a[k * stride + j], a[p * stride + j]);
      det = -det;
    }
    det *= piv;
    for (int64_t r = k + 1; r < m; ++r) {
      const double f = a[r * stride + k] / piv;
      if (f != 0.0)
        for (int64_t j = k + 1; j < m; ++j) a[r * stride + j] -= f * a[k * stride + j];
    }
  }
  return det;
}


void detKernel(KernelCtx& c) {
  const int64_t n = c.in(0).type.shape.back(), batches = c.out(0).numel();
  const auto x = widen<double>(c.in(0));
  std::vector<double> r(static_cast<size_t>(batches)), a(static_cast<size_t>(n * n));
  for (int64_t b = 0; b < batches; ++b) {
    std::copy(x.begin() + b * n * n, x.begin() + (b + 1) * n * n, a.begin());
    r[b] = eliminateDet(a.data(), n, n);
  }
  narrow(r, c.out(0));
}

// DetGrad(dY, X) -> dX = dY * cofactors(X).
void detGradKernel(KernelCtx& c) {
  const int64_t n = c.in(1).type.shape.back(), batches = c.in(0).numel();
  const auto dy = widen<double>(c.in(0));
  const auto x = widen<double>(c.in(1));
  std::vector<double> dx(x.size()), w(static_cast<size_t>(2 * n * n));
  for (int64_t b = 0; b < batches; ++b) {
    const double* xb = x.data() + b * n * n;
    double* g = dx.data() + b * n * n;
    // Gauss-Jordan on [X | I]: X^-1 in the right half, det the pivots' product.
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < 2 * n; ++j) w[i * 2 * n + j] = j < n ? xb[i * n + j] : double(j - n == i);
    double det = 1.0;
    bool singular = false;
    for (int64_t k = 0; k < n && !singular; ++k) {
      int64_t p = k;
      for (int64_t r = k + 1; r < n; ++r)
        if (std::fabs(w[r * 2 * n + k]) > std::fabs(w[p * 2 * n + k])) p = r;
      const double piv = w[p * 2 * n + k];
      if (piv == 0.0) {
        singular = true;
        break;
      }
      if (p != k) {
        for (int64_t j = 0; j < 2 * n; ++j) std::swap(w[k * 2 * n + j], w[p * 2 * n + j]);
        det = -det;
      }
      det *= piv;
      for (int64_t j = 0; j < 2 * n; ++j) w[k * 2 * n + j] /= piv;
      for (int64_t r = 0; r < n; ++r) {
        const double f = w[r * 2 * n + k];
        if (r == k || f == 0.0) continue;
        for (int64_t j = 0; j < 2 * n; ++j) w[r * 2 * n + j] -= f * w[k * 2 * n + j];
      }
    }
    if (!singular) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) g[i * n + j] = dy[b] * det * w[j * 2 * n + n + i];  // det * inv^T
      continue;
    }
    const int64_t m = n - 1;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t r = 0, rr = 0; r < n; ++r) {
          if (r == i) continue;
          for (int64_t q = 0, qq = 0; q < n; ++q)
            if (q != j) w[rr * m + qq++] = xb[r * n + q];
          ++rr;
        }
        const double minor = eliminateDet(w.data(), m, m);
        g[i * n + j] = dy[b] * ((i + j) % 2 ? -minor : minor);
      }
  }
  narrow(dx, c.out(0));
}

}  // namespace

void registerLinearGradKernels(std::vector<KernelRow>& t) {
  t.push_back({"DetGrad", detGradKernel, "ampc"});
  t.push_back({"ConvGrad", summingOp<ConvGradK>, "ampc"});
  t.push_back({"AveragePoolGrad", summingOp<AveragePoolGradK>, "ampc"});
  t.push_back({"GridSampleGrad", summingOn1<GridSampleGradK>, "ampc"});
}

void registerLinearKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"MatMul", summingNumericOp<MatMulK>},
      {"Gemm", summingNumericOp<GemmK>},
      {"Gemm", summingNumericOp<TargetGemmK>, kCudaDomain},
      {"Conv", summingOp<ConvK>},
      {"MaxPool", [](KernelCtx& c) { dispatchNumeric<MaxPoolAnyK>(c, c.in(0).type.dtype); }},
      {"AveragePool", summingOp<AveragePoolK>},
      {"GridSample", summingOp<GridSampleK>},
      {"GlobalAveragePool", summingOp<GlobalAveragePoolK>},
      {"Det", detKernel},
  });
}

}  // namespace ampc::cpu
