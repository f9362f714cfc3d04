// Data movement (byte copies, so every dtype), casts, and the shape ops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compiler/target.h"
#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {

// The data offset each GatherElements result element reads (indices checked first).
std::vector<int64_t> gatherElementsOffsets(KernelCtx& c, const std::vector<int64_t>& xs, const Tensor& ind, int64_t ax) {
  const auto is = ind.type.shape;
  const auto xst = stridesOf(xs);
  auto idx = ind.toInts();
  std::vector<int64_t> off(idx.size());
  Odometer o(is);
  for (size_t i = 0; i < idx.size(); ++i, o.next()) {
    int64_t k = idx[i];
    if (k < -xs[ax] || k >= xs[ax]) c.fail("index " + std::to_string(k) + " is out of range for axis length " + std::to_string(xs[ax]));
    if (k < 0) k += xs[ax];
    int64_t at = 0;
    for (size_t d = 0; d < is.size(); ++d) at += (static_cast<int64_t>(d) == ax ? k : o.idx[d]) * xst[d];
    off[i] = at;
  }
  return off;
}

// GatherND's slices: for each index tuple, the element offset of its slice in data (checked), and
// the slice's length in elements.
std::vector<int64_t> gatherNDOffsets(KernelCtx& c, const std::vector<int64_t>& xs, const Tensor& ind, int64_t b, int64_t& slice) {
  const auto& is = ind.type.shape;
  const int64_t k = is.back();
  const auto xst = stridesOf(xs);
  slice = 1;
  for (size_t d = b + k; d < xs.size(); ++d) slice *= xs[d];
  int64_t batch = 1;
  for (int64_t d = 0; d < b; ++d) batch *= is[d];
  const int64_t tuples = k ? ind.numel() / k : 0;
  const int64_t perBatch = batch ? tuples / batch : 0;
  auto idx = ind.toInts();
  std::vector<int64_t> off(tuples);
  for (int64_t t = 0; t < tuples; ++t) {
    // The batch position's offset: its multi-index over the first b dims.
    int64_t bi = t / std::max<int64_t>(perBatch, 1), at = 0;
    for (int64_t d = b; d-- > 0;) {
      at += (bi % is[d]) * xst[d];
      bi /= is[d];
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t dim = xs[b + j];
      int64_t v = idx[t * k + j];
      if (v < -dim || v >= dim) c.fail("index " + std::to_string(v) + " is out of range for dim length " + std::to_string(dim));
      if (v < 0) v += dim;
      at += v * xst[b + j];
    }
    off[t] = at;
  }
  return off;
}

namespace {

// memcpy that accepts empty ranges (an empty vector's data() may be null, which memcpy forbids).
void copyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

// Reshape, Flatten, Squeeze, Unsqueeze, Identity: same bytes, new type.
void copyKernel(KernelCtx& c) { copyBytes(c.out(0).data.data(), c.in(0).data.data(), c.in(0).data.size()); }


// Output element i takes input element src(idx) for each output multi-index.
template <typename F>
void gatherElements(KernelCtx& c, const Tensor& in, F src) {
  Tensor& out = c.out(0);
  const size_t e = dtypeSize(out.type.dtype);
  Odometer o(out.type.shape);
  for (int64_t i = 0; i < out.numel(); ++i, o.next()) {
    const int64_t j = src(o.idx);
    if (j >= 0) std::memcpy(out.data.data() + i * e, in.data.data() + j * e, e);
  }
}

void transposeKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const int64_t r = x.type.rank();
  std::vector<int64_t> dflt(r);
  for (int64_t i = 0; i < r; ++i) dflt[i] = r - 1 - i;
  const auto perm = c.node.getInts("perm", dflt);
  const auto st = stridesOf(x.type.shape);
  gatherElements(c, x, [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (int64_t d = 0; d < r; ++d) off += idx[d] * st[perm[d]];
    return off;
  });
}

void concatKernel(KernelCtx& c) {
  Tensor& out = c.out(0);
  const int64_t ax = normalizeAxis(c.node.getInt("axis", 0), out.type.rank());
  const size_t e = dtypeSize(out.type.dtype);
  int64_t outer = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= out.type.shape[d];
  const int64_t outRow = out.numel() / std::max<int64_t>(outer, 1);
  int64_t offset = 0;
  for (size_t k = 0; k < c.numInputs(); ++k) {
    const Tensor& t = c.in(k);
    const int64_t row = outer ? t.numel() / outer : 0;
    for (int64_t o = 0; o < outer; ++o)
      copyBytes(out.data.data() + (o * outRow + offset) * e, t.data.data() + o * row * e, static_cast<size_t>(row) * e);
    offset += row;
  }
}

void splitKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const int64_t ax = normalizeAxis(c.node.getInt("axis", 0), x.type.rank());
  const size_t e = dtypeSize(x.type.dtype);
  int64_t outer = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= x.type.shape[d];
  const int64_t inRow = outer ? x.numel() / outer : 0;
  int64_t offset = 0;
  for (size_t k = 0; k < c.numOutputs(); ++k) {
    Tensor& t = c.out(k);
    const int64_t row = outer ? t.numel() / outer : 0;
    for (int64_t o = 0; o < outer; ++o)
      copyBytes(t.data.data() + o * row * e, x.data.data() + (o * inRow + offset) * e, static_cast<size_t>(row) * e);
    offset += row;
  }
}

void sliceKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  auto ints = [&](size_t i) { return c.has(i) ? c.in(i).toInts() : std::vector<int64_t>{}; };
  SliceSpec s;
  try {
    s = sliceSpecOf(x.type.shape, ints(1), ints(2), ints(3), ints(4));
  } catch (const Error& e) {
    c.fail(e.what());
  }
  const auto st = stridesOf(x.type.shape);
  gatherElements(c, x, [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += (s.start[d] + idx[d] * s.step[d]) * st[d];
    return off;
  });
}

void gatherKernel(KernelCtx& c) {
  const Tensor &x = c.in(0), &ind = c.in(1);
  const auto& xs = x.type.shape;
  const int64_t ax = normalizeAxis(c.node.getInt("axis", 0), x.type.rank());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= xs[d];
  for (size_t d = ax + 1; d < xs.size(); ++d) inner *= xs[d];
  const int64_t n = ind.numel(), dim = xs[ax];
  const size_t e = dtypeSize(x.type.dtype);
  auto idx = ind.toInts();
  for (auto& k : idx) {
    if (k < -dim || k >= dim) c.fail("index " + std::to_string(k) + " is out of range for axis length " + std::to_string(dim));
    if (k < 0) k += dim;
  }
  Tensor& out = c.out(0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < n; ++j)
      copyBytes(out.data.data() + (o * n + j) * inner * e, x.data.data() + (o * dim + idx[j]) * inner * e,
                  static_cast<size_t>(inner) * e);
}

void gatherElementsKernel(KernelCtx& c) {
  const Tensor &x = c.in(0), &ind = c.in(1);
  const int64_t ax = normalizeAxis(c.node.getInt("axis", 0), x.type.rank());
  const auto off = gatherElementsOffsets(c, x.type.shape, ind, ax);
  const size_t e = dtypeSize(x.type.dtype);
  Tensor& out = c.out(0);
  for (size_t i = 0; i < off.size(); ++i) std::memcpy(out.data.data() + i * e, x.data.data() + off[i] * e, e);
}

void gatherNDKernel(KernelCtx& c) {
  const Tensor &x = c.in(0), &ind = c.in(1);
  int64_t slice = 1;
  const auto off = gatherNDOffsets(c, x.type.shape, ind, c.node.getInt("batch_dims", 0), slice);
  const size_t e = dtypeSize(x.type.dtype);
  Tensor& out = c.out(0);
  for (size_t t = 0; t < off.size(); ++t) copyBytes(out.data.data() + t * slice * e, x.data.data() + off[t] * e, static_cast<size_t>(slice) * e);
}

// ScatterElements / ScatterND: data copied, then each update written, added (in the dtype, in
// index order), or kept where larger (max) or smaller (min; a NaN on either side wins, as
// numpy's maximum and minimum) at its offset.
void scatterWrite(KernelCtx& c, const std::vector<int64_t>& off, int64_t slice) {
  const Tensor &x = c.in(0), &upd = c.in(2);
  Tensor& out = c.out(0);
  copyBytes(out.data.data(), x.data.data(), x.data.size());
  const size_t e = dtypeSize(x.type.dtype);
  const std::string r = c.node.getString("reduction", "none");
  if (r == "none") {
    for (size_t t = 0; t < off.size(); ++t) copyBytes(out.data.data() + off[t] * e, upd.data.data() + t * slice * e, static_cast<size_t>(slice) * e);
    return;
  }
  const bool fl = isFloat(x.type.dtype), add = r == "add", max = r == "max";
  for (size_t t = 0; t < off.size(); ++t)
    for (int64_t i = 0; i < slice; ++i) {
      const int64_t at = off[t] + i, from = static_cast<int64_t>(t) * slice + i;
      if (fl) {
        const double a = out.getDouble(at), b = upd.getDouble(from);
        out.setDouble(at, add ? a + b : std::isnan(a) || std::isnan(b) ? a + b : max ? std::max(a, b) : std::min(a, b));
      } else {
        const int64_t a = out.getInt(at), b = upd.getInt(from);
        out.setInt(at, add ? a + b : max ? std::max(a, b) : std::min(a, b));
      }
    }
}
void scatterElementsKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  scatterWrite(c, gatherElementsOffsets(c, x.type.shape, c.in(1), normalizeAxis(c.node.getInt("axis", 0), x.type.rank())), 1);
}
void scatterNDKernel(KernelCtx& c) {
  int64_t slice = 1;
  const auto off = gatherNDOffsets(c, c.in(0).type.shape, c.in(1), 0, slice);
  scatterWrite(c, off, slice);
}

void expandKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out(0);
  const size_t e = dtypeSize(x.type.dtype);
  BroadcastIter it(out.type.shape, x.type.shape);
  for (int64_t i = 0; i < out.numel(); ++i, it.next())
    std::memcpy(out.data.data() + i * e, x.data.data() + it.offset() * e, e);
}

void tileKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  const auto st = stridesOf(x.type.shape);
  gatherElements(c, x, [&](const std::vector<int64_t>& idx) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += (idx[d] % x.type.shape[d]) * st[d];
    return off;
  });
}

void padKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out(0);
  const auto& xs = x.type.shape;
  const int64_t r = x.type.rank();
  const auto pads = c.in(1).toInts();
  std::vector<int64_t> axes;
  if (c.has(3)) axes = c.in(3).toInts();
  else for (int64_t i = 0; i < r; ++i) axes.push_back(i);
  std::vector<int64_t> begin(r, 0);
  for (size_t i = 0; i < axes.size(); ++i) begin[normalizeAxis(axes[i], r)] = pads[i];
  const std::string mode = c.node.getString("mode", "constant");
  const size_t e = dtypeSize(x.type.dtype);
  std::vector<uint8_t> fill(e, 0);
  if (c.has(2)) std::memcpy(fill.data(), c.in(2).data.data(), e);
  const auto st = stridesOf(xs);
  Odometer o(out.type.shape);
  for (int64_t i = 0; i < out.numel(); ++i, o.next()) {
    int64_t off = 0;
    bool constant = false;
    for (int64_t d = 0; d < r; ++d) {
      int64_t k = o.idx[d] - begin[d];
      const int64_t n = xs[d];
      if (k < 0 || k >= n) {
        if (mode == "constant" || n == 0) {
          constant = true;
          break;
        } else if (mode == "edge") {
          k = std::clamp<int64_t>(k, 0, n - 1);
        } else if (mode == "wrap") {
          k = ((k % n) + n) % n;
        } else if (n == 1) {  // reflect
          k = 0;
        } else {
          const int64_t period = 2 * (n - 1);
          k = ((k % period) + period) % period;
          if (k >= n) k = period - k;
        }
      }
      off += k * st[d];
    }
    std::memcpy(out.data.data() + i * e, constant ? fill.data() : x.data.data() + off * e, e);
  }
}

void triluKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out(0);
  const bool upper = c.node.getInt("upper", 1) != 0;
  const int64_t k = c.has(1) ? c.in(1).getInt(0) : 0;
  const auto& s = x.type.shape;
  const int64_t R = s[s.size() - 2], Cc = s.back();
  const size_t e = dtypeSize(x.type.dtype);
  copyBytes(out.data.data(), x.data.data(), x.data.size());
  for (int64_t m = 0; m < (R * Cc != 0 ? x.numel() / (R * Cc) : 0); ++m)
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < Cc; ++j) {
        const bool keep = upper ? (j - i >= k) : (j - i <= k);
        if (!keep) std::memset(out.data.data() + ((m * R + i) * Cc + j) * e, 0, e);
      }
}

// Cast: float->float rounds once (RNE); float->int truncates toward zero (NaN -> 0, saturating
// at the i64 range first); ->bool is x != 0; int->int wraps.
void castTo(const Tensor& x, Tensor& out) {
  const DType from = x.type.dtype, to = out.type.dtype;
  if (from == to) {
    out.data = x.data;
  } else if (isFloat(from) && isFloat(to)) {
    convert(x.data.data(), from, out.data.data(), to, static_cast<size_t>(x.numel()));
  } else if (isFloat(to)) {
    narrow(widen<double>(x), out);
  } else if (isFloat(from)) {
    auto v = widen<double>(x);
    if (to == DType::boolean) {
      narrow(v, out);
      return;
    }
    std::vector<int64_t> iv(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double d = std::trunc(v[i]);
      iv[i] = d != d ? 0 : d >= 9.2233720368547758e18 ? std::numeric_limits<int64_t>::max()
                                : d <= -9.2233720368547758e18 ? std::numeric_limits<int64_t>::min()
                                                               : static_cast<int64_t>(d);
    }
    narrow(iv, out);
  } else {
    narrow(widen<int64_t>(x), out);
  }
}
void castKernel(KernelCtx& c) { castTo(c.in(0), c.out(0)); }
// cuda.MultiCast (passes/fuse_param_casts.cpp): each operand as its own Cast.
void multiCastKernel(KernelCtx& c) {
  for (size_t i = 0; i < c.numInputs(); ++i) castTo(c.in(i), c.out(i));
}

void shapeKernel(KernelCtx& c) {
  // Reads only the input's type (the node's), so it also runs when the data is not at hand.
  const auto& s = c.node.input(0)->type().shape;
  int64_t b, e;
  shapeRangeOf(c.node, static_cast<int64_t>(s.size()), b, e);
  for (int64_t i = b; i < e; ++i) c.out(0).setInt(i - b, s[i]);
}

void constantOfShapeKernel(KernelCtx& c) {
  const Tensor v = constantOfShapeValue(c.node);
  Tensor& out = c.out(0);
  const size_t e = dtypeSize(out.type.dtype);
  for (int64_t i = 0; i < out.numel(); ++i) std::memcpy(out.data.data() + i * e, v.data.data(), e);
}

void constantKernel(KernelCtx& c) { c.out(0) = constantNodeValue(c.node); }

void rangeKernel(KernelCtx& c) {
  Tensor& out = c.out(0);
  if (isFloat(out.type.dtype)) {
    const double s = c.in(0).getDouble(0), d = c.in(2).getDouble(0);
    for (int64_t i = 0; i < out.numel(); ++i) out.setDouble(i, s + d * static_cast<double>(i));
  } else {
    const int64_t s = c.in(0).getInt(0), d = c.in(2).getInt(0);
    for (int64_t i = 0; i < out.numel(); ++i) out.setInt(i, s + d * i);
  }
}

}  // namespace

Tensor castTensor(const Tensor& x, DType to) {
  Tensor out(TensorType{to, x.type.shape});
  castTo(x, out);
  return out;
}

// ampc::RotateHalf {sign}: y = sign * [-x2, x1] over the halves of the last axis; the negations flip
// the sign bit (the last byte's top bit, little-endian), exactly as Neg does.
void rotateHalfKernel(KernelCtx& c) {
  const Tensor& x = c.in(0);
  Tensor& out = c.out(0);
  const size_t e = dtypeSize(x.type.dtype);
  const int64_t d = x.type.shape.back(), h = d / 2, rows = d ? x.numel() / d : 0;
  const bool negFirst = c.node.getInt("sign", 1) > 0;  // sign 1: the first half is -x2; sign -1: the second is -x1
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = x.data.data() + r * d * e;
    uint8_t* dst = out.data.data() + r * d * e;
    std::memcpy(dst, src + h * e, static_cast<size_t>(h) * e);
    std::memcpy(dst + h * e, src, static_cast<size_t>(h) * e);
    for (int64_t j = negFirst ? 0 : h; j < (negFirst ? h : d); ++j) dst[j * e + e - 1] ^= 0x80;
  }
}

void registerTensorKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"Reshape", copyKernel}, {"Flatten", copyKernel}, {"Squeeze", copyKernel}, {"Unsqueeze", copyKernel},
      {"Identity", copyKernel}, {"Transpose", transposeKernel}, {"Concat", concatKernel}, {"Split", splitKernel},
      {"Slice", sliceKernel}, {"Gather", gatherKernel}, {"GatherElements", gatherElementsKernel}, {"GatherND", gatherNDKernel},
      {"ScatterElements", scatterElementsKernel}, {"ScatterND", scatterNDKernel}, {"Expand", expandKernel}, {"Tile", tileKernel},
      {"Pad", padKernel}, {"Trilu", triluKernel}, {"Cast", castKernel}, {"CastLike", castKernel}, {"MultiCast", multiCastKernel, kCudaDomain},
      {"Shape", shapeKernel}, {"ConstantOfShape", constantOfShapeKernel}, {"Constant", constantKernel},
      {"Range", rangeKernel}, {"RotateHalf", rotateHalfKernel, "ampc"},
  });
}

}  // namespace ampc::cpu
