// Helpers the CPU kernels share: widening tensors to a compute type, narrowing results once to the
// storage type, and dtype dispatch. Compute types: double for f64, float for f32/f16/bf16,
// int64_t for integers and bool.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/ops/geometry.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/kernel.h"

namespace ampc::cpu {

template <typename C>
std::vector<C> widen(const Tensor& t) {
  const int64_t n = t.numel();
  std::vector<C> v(static_cast<size_t>(n));
  const uint8_t* p = t.data.data();
  switch (t.type.dtype) {
    case DType::f32: for (int64_t i = 0; i < n; ++i) { float x; std::memcpy(&x, p + 4 * i, 4); v[i] = static_cast<C>(x); } break;
    case DType::f64: for (int64_t i = 0; i < n; ++i) { double x; std::memcpy(&x, p + 8 * i, 8); v[i] = static_cast<C>(x); } break;
    case DType::f16: for (int64_t i = 0; i < n; ++i) { uint16_t x; std::memcpy(&x, p + 2 * i, 2); v[i] = static_cast<C>(halfToFloat(x)); } break;
    case DType::bf16: for (int64_t i = 0; i < n; ++i) { uint16_t x; std::memcpy(&x, p + 2 * i, 2); v[i] = static_cast<C>(bf16ToFloat(x)); } break;
    case DType::i64: for (int64_t i = 0; i < n; ++i) { int64_t x; std::memcpy(&x, p + 8 * i, 8); v[i] = static_cast<C>(x); } break;
    case DType::i32: for (int64_t i = 0; i < n; ++i) { int32_t x; std::memcpy(&x, p + 4 * i, 4); v[i] = static_cast<C>(x); } break;
    case DType::i8: for (int64_t i = 0; i < n; ++i) v[i] = static_cast<C>(static_cast<int8_t>(p[i])); break;
    case DType::u8: for (int64_t i = 0; i < n; ++i) v[i] = static_cast<C>(p[i]); break;
    case DType::boolean: for (int64_t i = 0; i < n; ++i) v[i] = static_cast<C>(p[i] != 0); break;
  }
  return v;
}

// Writes v into `out` (already sized), rounding once to out's dtype.
template <typename C>
void narrow(const std::vector<C>& v, Tensor& out) {
  const int64_t n = out.numel();
  uint8_t* p = out.data.data();
  switch (out.type.dtype) {
    case DType::f32: for (int64_t i = 0; i < n; ++i) { float x = static_cast<float>(v[i]); std::memcpy(p + 4 * i, &x, 4); } break;
    case DType::f64: for (int64_t i = 0; i < n; ++i) { double x = static_cast<double>(v[i]); std::memcpy(p + 8 * i, &x, 8); } break;
    case DType::f16:
    case DType::bf16:
      if constexpr (std::is_same_v<C, double>) {
        convert(v.data(), DType::f64, p, out.type.dtype, static_cast<size_t>(n));  // rounds once
      } else {
        for (int64_t i = 0; i < n; ++i) {
          float f = static_cast<float>(v[i]);
          uint16_t x = out.type.dtype == DType::f16 ? floatToHalf(f) : floatToBf16(f);
          std::memcpy(p + 2 * i, &x, 2);
        }
      }
      break;
    case DType::i64: for (int64_t i = 0; i < n; ++i) { int64_t x = static_cast<int64_t>(v[i]); std::memcpy(p + 8 * i, &x, 8); } break;
    case DType::i32: for (int64_t i = 0; i < n; ++i) { int32_t x = static_cast<int32_t>(static_cast<int64_t>(v[i])); std::memcpy(p + 4 * i, &x, 4); } break;
    case DType::i8: for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int64_t>(v[i]))); break;
    case DType::u8: for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(static_cast<int64_t>(v[i])); break;
    case DType::boolean: for (int64_t i = 0; i < n; ++i) p[i] = v[i] != C(0); break;
  }
}

// GatherElements: the data offset each result element reads (indices checked; k_tensor.cpp).
std::vector<int64_t> gatherElementsOffsets(KernelCtx& c, const std::vector<int64_t>& xs, const Tensor& ind, int64_t ax);
// GatherND: each index tuple's slice offset in data (indices checked) and the slice length.
std::vector<int64_t> gatherNDOffsets(KernelCtx& c, const std::vector<int64_t>& xs, const Tensor& ind, int64_t b, int64_t& slice);

// Calls F<C>(ctx) with the compute type of dtype `t`: float kernels (F over float/double).
template <template <typename> class F>
void dispatchFloat(KernelCtx& c, DType t) {
  if (t == DType::f64) F<double>::run(c);
  else if (isFloat(t)) F<float>::run(c);
  else c.fail("no kernel for dtype " + std::string(dtypeName(t)));
}
// Numeric kernels: floats as above, integers and bool in int64_t.
template <template <typename> class F>
void dispatchNumeric(KernelCtx& c, DType t) {
  if (isFloat(t)) dispatchFloat<F>(c, t);
  else F<int64_t>::run(c);
}

// Kernels that sum (GEMM, convolution, pools, norms, reductions, softmax, attention, losses and the
// scatter-adds of gradients): f32 computes in f64 and rounds once, so the reference's f32 is at least
// as accurate as any f32 implementation (PyTorch's CPU kernels also sum float in double); f16 and
// bf16 compute in f32, as a GPU does.
template <template <typename> class F>
void dispatchSumming(KernelCtx& c, DType t) {
  if (t == DType::f32) F<double>::run(c);
  else dispatchFloat<F>(c, t);
}
template <template <typename> class F>
void dispatchSummingNumeric(KernelCtx& c, DType t) {
  if (t == DType::f32) F<double>::run(c);
  else dispatchNumeric<F>(c, t);
}
// The same, as kernel-table entries reading the dtype of input 0 (or 1: the gradients whose input
// 0 is dY, which a cast fold may leave in another dtype).
template <template <typename> class F>
void summingOp(KernelCtx& c) { dispatchSumming<F>(c, c.in(0).type.dtype); }
template <template <typename> class F>
void summingOn1(KernelCtx& c) { dispatchSumming<F>(c, c.in(1).type.dtype); }
template <template <typename> class F>
void summingNumericOp(KernelCtx& c) { dispatchSummingNumeric<F>(c, c.in(0).type.dtype); }

// A multi-index walking a shape in row-major order.
struct Odometer {
  std::vector<int64_t> dims, idx;
  explicit Odometer(std::vector<int64_t> d) : dims(std::move(d)), idx(dims.size(), 0) {}
  void next() {
    for (size_t k = dims.size(); k-- > 0;) {
      if (++idx[k] < dims[k]) return;
      idx[k] = 0;
    }
  }
};

// Outer x axis x inner decomposition of a shape around `axis` (softmax, reductions over one axis).
struct AxisSplit {
  int64_t outer = 1, axis = 1, inner = 1;
  AxisSplit(const std::vector<int64_t>& s, int64_t ax) {
    for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) (i < ax ? outer : i == ax ? axis : inner) *= s[i];
  }
};

}  // namespace ampc::cpu
