// Elementwise, data-movement, reduction and random kernels of the CUDA backend (kernels/cuda/ops.h).
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/convert.h"
#include "kernels/cuda/device.cuh"

namespace ampc::cuda {

int dtSize(DT t) {
  switch (t) {
    case DT::f32: case DT::i32: return 4;
    case DT::f16: case DT::bf16: return 2;
    case DT::i64: return 8;
    default: return 1;
  }
}

namespace {

// ---- elementwise ----

template <typename C>
__device__ __forceinline__ C applyOp(Ew op, C a, C b, C c, const EwArgs& g) {
  switch (op) {
    case Ew::Add: return a + b;
    case Ew::Sub: return a - b;
    case Ew::Mul: return a * b;
    case Ew::Div:
      if constexpr (std::is_integral_v<C>) return (b == 0 || (b == -1 && a == INT64_MIN)) ? 0 : a / b;
      else return a / b;
    case Ew::Pow:
      if constexpr (!std::is_integral_v<C>) {
        if (b == 2.0f) return a * a;  // GELU's and norms' x^2, x^3 without pow()
        if (b == 3.0f) return a * a * a;
      }
      return static_cast<C>(pow(static_cast<double>(a), static_cast<double>(b)));
    case Ew::Max: return (a != a || a > b) ? a : b;
    case Ew::Min: return (a != a || a < b) ? a : b;
    case Ew::Equal: return a == b;
    case Ew::Less: return a < b;
    case Ew::LessEq: return a <= b;
    case Ew::Greater: return a > b;
    case Ew::GreaterEq: return a >= b;
    case Ew::And: return a && b;
    case Ew::Or: return a || b;
    case Ew::Clip: {  // min(max(a, lo), hi): hi everywhere when lo > hi, as numpy and PyTorch
      const C t = a < b ? b : a;
      return t > c ? c : t;
    }
    case Ew::Sign: return a > 0 ? C(1) : a < 0 ? C(-1) : a;
    case Ew::PRelu: return a < 0 ? b * a : a;
    case Ew::Mod:
      if constexpr (std::is_integral_v<C>) {
        if (b == 0 || b == -1) return 0;
        C r = a % b;
        if (!g.fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
        return r;
      } else {
        return fmodf(a, b);
      }
    case Ew::Copy: return a;
    case Ew::Neg: return -a;
    case Ew::Abs: return a < 0 ? -a : a;
    case Ew::Not: return a == 0;
    default: break;
  }
  if constexpr (!std::is_integral_v<C>) {
    switch (op) {
      case Ew::Sqrt: return sqrtf(a);
      case Ew::Reciprocal: return 1.0f / a;
      case Ew::Exp: return expf(a);
      case Ew::Log: return logf(a);
      case Ew::Tanh: return tanhf(a);
      case Ew::Sigmoid: return a >= 0 ? 1.0f / (1.0f + expf(-a)) : expf(a) / (1.0f + expf(a));
      case Ew::Erf: return erff(a);
      case Ew::Gelu: return 0.5f * a * (1.0f + erff(a * 0.70710678118654752f));
      case Ew::GeluTanh: return 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)));
      case Ew::GeluGrad:
        return a * (0.5f * (1.0f + erff(b * 0.70710678118654752f)) + b * 0.3989422804014327f * expf(-0.5f * b * b));
      case Ew::GeluTanhGrad: {
        const float k = 0.7978845608028654f, c3 = 0.044715f, t = tanhf(k * (b + c3 * b * b * b));
        return a * (0.5f * (1.0f + t) + 0.5f * b * (1.0f - t * t) * k * (1.0f + 3.0f * c3 * b * b));
      }
      case Ew::Silu: return a * (a >= 0 ? 1.0f / (1.0f + expf(-a)) : expf(a) / (1.0f + expf(a)));
      case Ew::SiluGrad: {
        const float s = b >= 0 ? 1.0f / (1.0f + expf(-b)) : expf(b) / (1.0f + expf(b));
        return a * s * (1.0f + b * (1.0f - s));
      }
      case Ew::Softplus: return a > 0 ? a + log1pf(expf(-a)) : log1pf(expf(a));
      case Ew::LeakyRelu: return a >= 0 ? a : g.alpha * a;
      case Ew::Relu: return a > 0 ? a : (a != a ? a : 0.0f);
      case Ew::IsNaN: return a != a;
      case Ew::IsInf: return isinf(a) && ((a > 0 && g.detectPos) || (a < 0 && g.detectNeg));
      case Ew::Sin: return sinf(a);
      case Ew::Cos: return cosf(a);
      case Ew::HardSigmoid: return fmaxf(0.0f, fminf(1.0f, g.alpha * a + g.beta));
      case Ew::HardSwish: return a * fmaxf(0.0f, fminf(1.0f, a / 6.0f + 0.5f));
      case Ew::Elu: return a > 0 ? a : g.alpha * expm1f(a);
      case Ew::Selu: return a > 0 ? g.beta * a : g.beta * g.alpha * expm1f(a);
      case Ew::Celu: return a > 0 ? a : g.alpha * expm1f(a / g.alpha);
      case Ew::Mish: return a * tanhf(a > 0 ? a + log1pf(expf(-a)) : log1pf(expf(a)));
      case Ew::Floor: return floorf(a);
      case Ew::Ceil: return ceilf(a);
      case Ew::Round: return rintf(a);
      default: break;
    }
  }
  return a;
}

__device__ __forceinline__ int64_t operandOffset(const EwArgs& g, int k, int64_t i) {
  if (g.access[k] == Access::Same) return i;
  if (g.access[k] == Access::Scalar) return 0;
  if (g.access[k] == Access::Block) return (i / g.div[k]) % g.mod[k];
  int64_t off = 0, rest = i;
  for (int d = g.rank - 1; d >= 0; --d) {
    const int64_t q = rest / g.shape[d];
    off += (rest - q * g.shape[d]) * g.stride[k][d];
    rest = q;
  }
  return off;
}

template <typename C>
__device__ __forceinline__ C loadC(const void* p, DT t, int64_t i) {
  if constexpr (std::is_integral_v<C>) return loadI(p, t, i);
  else return loadF(p, t, i);
}

__device__ __forceinline__ bool compare(Ew cmp, float a, float b) {
  switch (cmp) {
    case Ew::Greater: return a > b;
    case Ew::GreaterEq: return a >= b;
    case Ew::Less: return a < b;
    case Ew::LessEq: return a <= b;
    default: return a == b;  // Equal: fusableComparison's only other one
  }
}
template <typename C>
__global__ void ewKernel(EwArgs g) {
  AMPC_GRID_LOOP(i, g.n) {
    if (g.op == Ew::Where || g.op == Ew::WhereCmp) {
      const int first = g.op == Ew::Where ? 1 : 2;
      const bool cond = g.op == Ew::Where ? loadI(g.in[0], g.inType[0], operandOffset(g, 0, i)) != 0
                                          : applyOp<float>(g.cmp, loadF(g.in[0], g.inType[0], operandOffset(g, 0, i)),
                                                           loadF(g.in[1], g.inType[1], operandOffset(g, 1, i)), 0.0f, g) != 0.0f;
      const int k = cond ? first : first + 1;
      const int64_t j = operandOffset(g, k, i);
      if constexpr (std::is_integral_v<C>) storeI(g.out, g.outType, i, loadI(g.in[k], g.inType[k], j));
      else storeF(g.out, g.outType, i, loadF(g.in[k], g.inType[k], j));
      continue;
    }
    C a = loadC<C>(g.in[0], g.inType[0], operandOffset(g, 0, i)), b = 0, c = 0;
    if (g.nin > 1) b = loadC<C>(g.in[1], g.inType[1], operandOffset(g, 1, i));
    if (g.nin > 2) c = loadC<C>(g.in[2], g.inType[2], operandOffset(g, 2, i));
    C r = applyOp<C>(g.op, a, b, c, g);
    if constexpr (std::is_integral_v<C>) {
      storeI(g.out, g.outType, i, r);
    } else {
      storeF(g.out, g.outType, i, r);
    }
  }
}

// Float ops whose operands are each either the output's shape and type or one element, on 16-byte
// aligned buffers: one 16-byte load per operand for V elements (8 for f16/bf16, 4 for f32).
// The operand loops are unrolled over kMaxOperands with a guard, so every array is indexed
// statically and stays in registers (a loop bound of g.nin put them in local memory); operands stay
// packed until each element is widened. OP >= 0 fixes the op at compile time (the hot ones: Add,
// Sub, Mul, Relu, WhereCmp, and the GELUs and their gradients), so the op switch folds away and the kernel stays small enough for full
// occupancy; OP < 0 switches on g.op. WhereCmp's comparison runs here too (ReLU's gradient:
// Where(Greater(y, 0), dy, 0)).
template <int OP>
__device__ __forceinline__ float ewVecApply(const EwArgs& g, float a, float b, float c, float d) {
  const Ew op = OP < 0 ? g.op : static_cast<Ew>(OP);
  if (op == Ew::WhereCmp) return compare(g.cmp, a, b) ? c : d;
  return applyOp<float>(op, a, b, c, g);
}
template <typename T, int OP>
__global__ void __launch_bounds__(256, 4) ewVec(EwArgs g) {
  constexpr int V = 16 / sizeof(T);
  const int64_t nv = g.n / V;
  float sc[kMaxOperands] = {0, 0, 0, 0};  // the one-element operands
  bool packed[kMaxOperands];
#pragma unroll
  for (int k = 0; k < kMaxOperands; ++k) {
    packed[k] = k < g.nin && g.access[k] != Access::Scalar;
    if (k < g.nin && !packed[k]) sc[k] = loadF(g.in[k], g.inType[k], 0);
  }
  AMPC_GRID_LOOP(v, nv) {
    uint4 raw[kMaxOperands];
#pragma unroll
    for (int k = 0; k < kMaxOperands; ++k)
      if (packed[k]) raw[k] = reinterpret_cast<const uint4*>(g.in[k])[v];
    uint4 ro;
    T* o = reinterpret_cast<T*>(&ro);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float x[kMaxOperands];
#pragma unroll
      for (int k = 0; k < kMaxOperands; ++k) x[k] = packed[k] ? toF(reinterpret_cast<const T*>(&raw[k])[e]) : sc[k];
      o[e] = fromF<T>(ewVecApply<OP>(g, x[0], x[1], x[2], x[3]));
    }
    reinterpret_cast<uint4*>(g.out)[v] = ro;
  }
  AMPC_GRID_LOOP(j, g.n - nv * V) {
    const int64_t i = nv * V + j;
    float x[kMaxOperands];
#pragma unroll
    for (int k = 0; k < kMaxOperands; ++k) x[k] = k >= g.nin ? 0.0f : g.access[k] == Access::Scalar ? sc[k] : loadF(g.in[k], g.inType[k], i);
    storeF(g.out, g.outType, i, ewVecApply<OP>(g, x[0], x[1], x[2], x[3]));
  }
}

template <typename T>
void launchVec(const EwArgs& a, cudaStream_t st) {
  const int grid = gridFor(a.n / (16 / sizeof(T)) + 1);
  switch (a.op) {
    case Ew::Add: ewVec<T, static_cast<int>(Ew::Add)><<<grid, 256, 0, st>>>(a); break;
    case Ew::Sub: ewVec<T, static_cast<int>(Ew::Sub)><<<grid, 256, 0, st>>>(a); break;
    case Ew::Mul: ewVec<T, static_cast<int>(Ew::Mul)><<<grid, 256, 0, st>>>(a); break;
    case Ew::Relu: ewVec<T, static_cast<int>(Ew::Relu)><<<grid, 256, 0, st>>>(a); break;
    case Ew::WhereCmp: ewVec<T, static_cast<int>(Ew::WhereCmp)><<<grid, 256, 0, st>>>(a); break;
    case Ew::Gelu: ewVec<T, static_cast<int>(Ew::Gelu)><<<grid, 256, 0, st>>>(a); break;
    case Ew::GeluGrad: ewVec<T, static_cast<int>(Ew::GeluGrad)><<<grid, 256, 0, st>>>(a); break;
    case Ew::GeluTanh: ewVec<T, static_cast<int>(Ew::GeluTanh)><<<grid, 256, 0, st>>>(a); break;
    case Ew::GeluTanhGrad: ewVec<T, static_cast<int>(Ew::GeluTanhGrad)><<<grid, 256, 0, st>>>(a); break;
    case Ew::Silu: ewVec<T, static_cast<int>(Ew::Silu)><<<grid, 256, 0, st>>>(a); break;
    case Ew::SiluGrad: ewVec<T, static_cast<int>(Ew::SiluGrad)><<<grid, 256, 0, st>>>(a); break;
    default: ewVec<T, -1><<<grid, 256, 0, st>>>(a); break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t elementwise(const EwArgs& a, cudaStream_t st) {
  if (a.n == 0) return cudaSuccess;
  const bool floatOut = a.outType == DT::f32 || a.outType == DT::f16 || a.outType == DT::bf16;
  // f32 <-> f16/bf16 casts of same-shape tensors: the vectorised conversions.
  if (a.op == Ew::Copy && a.access[0] == Access::Same && a.inType[0] != a.outType) {
    const size_t n = static_cast<size_t>(a.n);
    const float* f = static_cast<const float*>(a.in[0]);
    if (a.inType[0] == DT::f32 && a.outType == DT::f16) return f32ToF16(f, static_cast<uint16_t*>(a.out), n, st);
    if (a.inType[0] == DT::f32 && a.outType == DT::bf16) return f32ToBf16(f, static_cast<uint16_t*>(a.out), n, st);
    if (a.inType[0] == DT::f16 && a.outType == DT::f32) return f16ToF32(static_cast<const uint16_t*>(a.in[0]), static_cast<float*>(a.out), n, st);
    if (a.inType[0] == DT::bf16 && a.outType == DT::f32) return bf16ToF32(static_cast<const uint16_t*>(a.in[0]), static_cast<float*>(a.out), n, st);
  }
  bool vec = floatOut && !a.intMath && a.op != Ew::Where && aligned16(a.out);
  for (int k = 0; k < a.nin && vec; ++k)
    vec = a.access[k] == Access::Scalar || (a.access[k] == Access::Same && a.inType[k] == a.outType && aligned16(a.in[k]));
  if (vec) {
    switch (a.outType) {
      case DT::f16: launchVec<__half>(a, st); break;
      case DT::bf16: launchVec<__nv_bfloat16>(a, st); break;
      default: launchVec<float>(a, st); break;
    }
  } else if (a.intMath) ewKernel<int64_t><<<gridFor(a.n), 256, 0, st>>>(a);
  else ewKernel<float><<<gridFor(a.n), 256, 0, st>>>(a);
  return cudaGetLastError();
}

// ---- data movement ----

namespace {
template <typename E>
__global__ void copyKernel(const E* src, E* dst, CopyArgs a) {
  AMPC_GRID_LOOP(i, a.n) {
    int64_t s = a.srcOffset, d = a.dstOffset, rest = i;
    for (int k = a.rank - 1; k >= 0; --k) {
      const int64_t q = rest / a.shape[k], c = rest - q * a.shape[k];
      s += c * a.srcStride[k];
      d += c * a.dstStride[k];
      rest = q;
    }
    dst[d] = src[s];
  }
}
__global__ void fillKernel(void* p, DT t, int64_t n, double v) {
  AMPC_GRID_LOOP(i, n) {
    if (t == DT::i64 || t == DT::i32 || t == DT::i8 || t == DT::u8 || t == DT::boolean) storeI(p, t, i, static_cast<int64_t>(v));
    else storeF(p, t, i, static_cast<float>(v));
  }
}
}  // namespace

// When the innermost dim is contiguous on both sides (a transpose that keeps the last dim, a slice of
// whole rows, concat, split), copy it 16 bytes at a time: the same copy over 16-byte elements.
bool widenTo16(CopyArgs& a, const void* src, void* dst) {
  if (a.rank == 0 || a.srcStride[a.rank - 1] != 1 || a.dstStride[a.rank - 1] != 1) return false;
  const int64_t k = 16 / a.elemBytes;
  if (a.elemBytes >= 16 || a.shape[a.rank - 1] % k != 0 || a.srcOffset % k != 0 || a.dstOffset % k != 0) return false;
  if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) return false;
  for (int d = 0; d < a.rank - 1; ++d)
    if (a.srcStride[d] % k != 0 || a.dstStride[d] % k != 0) return false;
  for (int d = 0; d < a.rank - 1; ++d) {
    a.srcStride[d] /= k;
    a.dstStride[d] /= k;
  }
  a.shape[a.rank - 1] /= k;
  a.n /= k;
  a.srcOffset /= k;
  a.dstOffset /= k;
  a.elemBytes = 16;
  return true;
}

cudaError_t stridedCopy(const void* src, void* dst, const CopyArgs& args, cudaStream_t st) {
  if (args.n == 0) return cudaSuccess;
  CopyArgs a = args;
  if (widenTo16(a, src, dst)) {
    copyKernel<uint4><<<gridFor(a.n), 256, 0, st>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), a);
    return cudaGetLastError();
  }
  switch (a.elemBytes) {
    case 1: copyKernel<uint8_t><<<gridFor(a.n), 256, 0, st>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), a); break;
    case 2: copyKernel<uint16_t><<<gridFor(a.n), 256, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), a); break;
    case 4: copyKernel<uint32_t><<<gridFor(a.n), 256, 0, st>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), a); break;
    default: copyKernel<uint64_t><<<gridFor(a.n), 256, 0, st>>>(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), a); break;
  }
  return cudaGetLastError();
}

namespace {
// Through 32 x 32 tiles; Out is In (a raw copy of 2- or 4-byte elements) or f32 (f16/bf16 widened).
template <typename In, typename Out>
__global__ void transpose2dKernel(const In* in, Out* out, int64_t R, int64_t C) {
  __shared__ Out tile[32][33];
  const int64_t b = blockIdx.z, r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  const In* src = in + b * R * C;
  Out* dst = out + b * R * C;
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < R && c < C) {
      if constexpr (std::is_same_v<In, Out>) tile[k][threadIdx.x] = src[r * C + c];
      else tile[k][threadIdx.x] = toF(src[r * C + c]);
    }
  }
  __syncthreads();
  for (int k = threadIdx.y; k < 32; k += blockDim.y) {
    const int64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < R && c < C) dst[c * R + r] = tile[threadIdx.x][k];
  }
}
}  // namespace

namespace {
template <typename E>
__global__ void padChannelsLastKernel(const E* in, E* out, int64_t C, int64_t P, int64_t Cp, int64_t n) {
  AMPC_GRID_LOOP(i, n) {  // i over out [batch][P][Cp]
    const int64_t c = i % Cp, t = i / Cp, p = t % P, b = t / P;
    out[i] = c < C ? in[(b * C + c) * P + p] : E(0);
  }
}
template <typename E>
__global__ void unpadChannelsLastKernel(const E* in, E* out, int64_t C, int64_t P, int64_t Cp, int64_t n) {
  AMPC_GRID_LOOP(i, n) {  // i over out [batch][C][P]
    const int64_t p = i % P, t = i / P, c = t % C, b = t / C;
    out[i] = in[(b * P + p) * Cp + c];
  }
}
}  // namespace

cudaError_t padChannelsLast(const void* src, void* dst, int64_t batch, int64_t C, int64_t P, int64_t Cp, int elemBytes, cudaStream_t st) {
  const int64_t n = batch * P * Cp;
  if (n == 0) return cudaSuccess;
  if (elemBytes == 2) padChannelsLastKernel<<<gridFor(n), 256, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), C, P, Cp, n);
  else if (elemBytes == 4) padChannelsLastKernel<<<gridFor(n), 256, 0, st>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), C, P, Cp, n);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}
cudaError_t unpadChannelsLast(const void* src, void* dst, int64_t batch, int64_t C, int64_t P, int64_t Cp, int elemBytes, cudaStream_t st) {
  const int64_t n = batch * C * P;
  if (n == 0) return cudaSuccess;
  if (elemBytes == 2) unpadChannelsLastKernel<<<gridFor(n), 256, 0, st>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), C, P, Cp, n);
  else if (elemBytes == 4) unpadChannelsLastKernel<<<gridFor(n), 256, 0, st>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), C, P, Cp, n);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t transpose2d(const void* src, void* dst, int64_t batch, int64_t R, int64_t C, int elemBytes, cudaStream_t st) {
  if (batch * R * C == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + 31) / 32), static_cast<unsigned>(batch));
  if (elemBytes == 2)
    transpose2dKernel<<<grid, dim3(32, 8), 0, st>>>(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), R, C);
  else if (elemBytes == 4)
    transpose2dKernel<<<grid, dim3(32, 8), 0, st>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), R, C);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t transpose2dWiden(const void* src, DT from, float* dst, int64_t batch, int64_t R, int64_t C, cudaStream_t st) {
  if (batch * R * C == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>((R + 31) / 32), static_cast<unsigned>(batch));
  if (from == DT::f16) transpose2dKernel<<<grid, dim3(32, 8), 0, st>>>(static_cast<const __half*>(src), dst, R, C);
  else if (from == DT::bf16) transpose2dKernel<<<grid, dim3(32, 8), 0, st>>>(static_cast<const __nv_bfloat16*>(src), dst, R, C);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

namespace {
__global__ void nanKernel(const void* x, DT t, int64_t n, unsigned long long* count) {
  unsigned long long c = 0;
  AMPC_GRID_LOOP(i, n) c += isnan(loadF(x, t, i));
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}
}  // namespace

namespace {
__global__ void scanFiniteKernel(const void* x, DT t, int64_t n, unsigned long long* rec) {
  unsigned long long inf = 0, nan = 0;
  float big = 0.0f;
  AMPC_GRID_LOOP(i, n) {
    const float v = loadF(x, t, i);
    if (isnan(v)) ++nan;
    else if (isinf(v)) ++inf;
    else big = fmaxf(big, fabsf(v));
  }
  for (int o = 16; o > 0; o >>= 1) {
    inf += __shfl_xor_sync(0xffffffffu, inf, o);
    nan += __shfl_xor_sync(0xffffffffu, nan, o);
    big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, o));
  }
  if ((threadIdx.x & 31) == 0) {  // counts are integers and max is order-free: the result does not depend on the order
    if (inf) atomicAdd(rec, inf);
    if (nan) atomicAdd(rec + 1, nan);
    atomicMax(rec + 2, static_cast<unsigned long long>(__float_as_uint(big)));
  }
}
}  // namespace

cudaError_t scanFinite(const void* x, DT t, int64_t n, unsigned long long* rec, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  scanFiniteKernel<<<gridFor(n), 256, 0, st>>>(x, t, n, rec);
  return cudaGetLastError();
}

cudaError_t countNaN(const void* x, DT t, int64_t n, unsigned long long* count, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  nanKernel<<<gridFor(n), 256, 0, st>>>(x, t, n, count);
  return cudaGetLastError();
}

cudaError_t fill(void* dst, DT t, int64_t n, double v, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  fillKernel<<<gridFor(n), 256, 0, st>>>(dst, t, n, v);
  return cudaGetLastError();
}

namespace {
template <typename E>
__global__ void gatherKernel(const E* x, const void* idx, DT it, E* out, int64_t outer, int64_t dim, int64_t n, int64_t inner) {
  AMPC_GRID_LOOP(i, outer * n * inner) {
    const int64_t in = i % inner, j = (i / inner) % n, o = i / (inner * n);
    int64_t k = loadI(idx, it, j);
    if (k < 0) k += dim;
    out[i] = (k < 0 || k >= dim) ? E(0) : x[(o * dim + k) * inner + in];
  }
}
__global__ void gatherGradKernel(const void* dy, DT t, const void* idx, DT it, float* acc, int64_t outer, int64_t dim, int64_t n, int64_t inner) {
  AMPC_GRID_LOOP(i, outer * n * inner) {
    const int64_t in = i % inner, j = (i / inner) % n, o = i / (inner * n);
    int64_t k = loadI(idx, it, j);
    if (k < 0) k += dim;
    if (k >= 0 && k < dim) atomicAdd(acc + (o * dim + k) * inner + in, loadF(dy, t, i));
  }
}
__global__ void scatterFlatKernel(const void* dy, DT t, const int64_t* idx, int64_t n, float* acc, int64_t outN) {
  AMPC_GRID_LOOP(i, n) {
    const int64_t k = idx[i];
    if (k >= 0 && k < outN) atomicAdd(acc + k, loadF(dy, t, i));
  }
}
__global__ void narrowKernel(const float* acc, void* out, DT t, int64_t n) {
  AMPC_GRID_LOOP(i, n) storeF(out, t, i, acc[i]);
}
// acc = x (of type t) widened to f32; four at a time with vec (n % 4 == 0, both aligned to 4).
__global__ void widenKernel(const void* x, DT t, float* acc, int64_t n, bool vec) {
  if (vec) {
    AMPC_GRID_LOOP(q, n / 4) {
      float v[4];
      load4(x, t, 4 * q, v);
      store4(acc, DT::f32, 4 * q, v);
    }
    return;
  }
  AMPC_GRID_LOOP(i, n) acc[i] = loadF(x, t, i);
}
}  // namespace

cudaError_t gather(const void* x, const void* idx, DT idxType, void* out, int elemBytes, int64_t outer, int64_t dim, int64_t n,
                   int64_t inner, cudaStream_t st) {
  const int64_t total = outer * n * inner;
  if (total == 0) return cudaSuccess;
  const int g = gridFor(total);
  switch (elemBytes) {
    case 1: gatherKernel<uint8_t><<<g, 256, 0, st>>>(static_cast<const uint8_t*>(x), idx, idxType, static_cast<uint8_t*>(out), outer, dim, n, inner); break;
    case 2: gatherKernel<uint16_t><<<g, 256, 0, st>>>(static_cast<const uint16_t*>(x), idx, idxType, static_cast<uint16_t*>(out), outer, dim, n, inner); break;
    case 4: gatherKernel<uint32_t><<<g, 256, 0, st>>>(static_cast<const uint32_t*>(x), idx, idxType, static_cast<uint32_t*>(out), outer, dim, n, inner); break;
    default: gatherKernel<uint64_t><<<g, 256, 0, st>>>(static_cast<const uint64_t*>(x), idx, idxType, static_cast<uint64_t*>(out), outer, dim, n, inner); break;
  }
  return cudaGetLastError();
}

namespace {
// The ordered scatter-adds (OrderBuffers): each item's target, or `targets` where it has none.
__global__ void gatherKeysKernel(const void* idx, DT it, int64_t n, int64_t dim, uint32_t* keys, uint32_t* items) {
  AMPC_GRID_LOOP(j, n) {
    int64_t k = loadI(idx, it, j);
    if (k < 0) k += dim;
    keys[j] = (k < 0 || k >= dim) ? static_cast<uint32_t>(dim) : static_cast<uint32_t>(k);
    items[j] = static_cast<uint32_t>(j);
  }
}
__global__ void flatKeysKernel(const int64_t* idx, int64_t n, int64_t outN, uint32_t* keys, uint32_t* items) {
  AMPC_GRID_LOOP(i, n) {
    const int64_t k = idx[i];
    keys[i] = (k >= 0 && k < outN) ? static_cast<uint32_t>(k) : static_cast<uint32_t>(outN);
    items[i] = static_cast<uint32_t>(i);
  }
}
// Whether sorted position s starts its target's run (and has a target).
__device__ __forceinline__ bool runHead(const uint32_t* keys, int64_t s, uint32_t targets) {
  const uint32_t k = keys[s];
  return k < targets && (s == 0 || keys[s - 1] != k);
}
// Gather's gradient: a thread per (o, sorted position, i) that heads a run sums dy over the run's
// items in item order.
__global__ void gatherGradOrderedKernel(const void* dy, DT t, OrderBuffers b, float* acc, int64_t outer, int64_t dim, int64_t n, int64_t inner) {
  AMPC_GRID_LOOP(i, outer * n * inner) {
    const int64_t in = i % inner, s = (i / inner) % n, o = i / (inner * n);
    if (!runHead(b.sortedKeys, s, static_cast<uint32_t>(dim))) continue;
    const uint32_t k = b.sortedKeys[s];
    float sum = 0.0f;
    for (int64_t e = s; e < n && b.sortedKeys[e] == k; ++e) sum += loadF(dy, t, (o * n + b.sortedItems[e]) * inner + in);
    acc[(o * dim + k) * inner + in] += sum;  // onto zeros or the base: one run head per target
  }
}
// acc[target] = the sum of dy over the target's items, in item order.
__global__ void orderedSumKernel(const void* dy, DT t, OrderBuffers b, uint32_t targets, float* acc) {
  AMPC_GRID_LOOP(s, b.n) {
    if (!runHead(b.sortedKeys, s, targets)) continue;
    const uint32_t k = b.sortedKeys[s];
    float sum = 0.0f;
    for (int64_t e = s; e < b.n && b.sortedKeys[e] == k; ++e) sum += loadF(dy, t, b.sortedItems[e]);
    acc[k] = sum;
  }
}
}  // namespace

cudaError_t gatherGrad(const void* dy, DT t, const void* idx, DT idxType, const void* base, DT baseT, float* acc, void* out, int64_t outer,
                       int64_t dim, int64_t n, int64_t inner, void* order, cudaStream_t st) {
  const int64_t outN = outer * dim * inner;
  if (!base) {
    if (cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * outN, st); e != cudaSuccess) return e;
  } else if (outN > 0) {
    const bool vec = outN % 4 == 0 && reinterpret_cast<uintptr_t>(base) % (4 * dtSize(baseT)) == 0 && reinterpret_cast<uintptr_t>(acc) % 16 == 0;
    widenKernel<<<gridFor(vec ? outN / 4 : outN), 256, 0, st>>>(base, baseT, acc, outN, vec);
  }
  if (order && outer * n * inner > 0) {
    const OrderBuffers b = orderBuffers(order, n);
    gatherKeysKernel<<<gridFor(n), 256, 0, st>>>(idx, idxType, n, dim, b.keys, b.items);
    if (cudaError_t e = sortOrder(b, static_cast<uint32_t>(dim), st); e != cudaSuccess) return e;
    gatherGradOrderedKernel<<<gridFor(outer * n * inner), 256, 0, st>>>(dy, t, b, acc, outer, dim, n, inner);
  } else if (outer * n * inner > 0) {
    gatherGradKernel<<<gridFor(outer * n * inner), 256, 0, st>>>(dy, t, idx, idxType, acc, outer, dim, n, inner);
  }
  if (out && outN > 0) narrowKernel<<<gridFor(outN), 256, 0, st>>>(acc, out, t, outN);
  return cudaGetLastError();
}

namespace {
// Data offset of output element i, or -1 where an index is out of range.
__device__ int64_t indexOffset(const IndexGeom& g, const void* idx, DT it, int64_t i) {
  if (g.mode == IndexMode::Elements) {
    int64_t off = 0, rest = i;
    for (int d = g.rank - 1; d >= 0; --d) {
      int64_t m = rest % g.ishape[d];
      rest /= g.ishape[d];
      if (d == g.axis) {
        m = loadI(idx, it, i);
        if (m < 0) m += g.xshape[d];
        if (m < 0 || m >= g.xshape[d]) return -1;
      }
      off += m * g.xstride[d];
    }
    return off;
  }
  const int64_t t = i / g.slice, s = i % g.slice;
  int64_t bi = t / g.perBatch, off = s;
  for (int d = g.b - 1; d >= 0; --d) {
    off += (bi % g.ishape[d]) * g.xstride[d];
    bi /= g.ishape[d];
  }
  for (int j = 0; j < g.k; ++j) {
    int64_t v = loadI(idx, it, t * g.k + j);
    const int64_t dim = g.xshape[g.b + j];
    if (v < 0) v += dim;
    if (v < 0 || v >= dim) return -1;
    off += v * g.xstride[g.b + j];
  }
  return off;
}
template <typename E>
__global__ void indexGatherKernel(const E* x, const void* idx, DT it, E* out, IndexGeom g) {
  AMPC_GRID_LOOP(i, g.n) {
    const int64_t off = indexOffset(g, idx, it, i);
    out[i] = off < 0 ? E(0) : x[off];
  }
}
__global__ void indexGatherGradKernel(const void* dy, DT t, const void* idx, DT it, float* acc, IndexGeom g) {
  AMPC_GRID_LOOP(i, g.n) {
    const int64_t off = indexOffset(g, idx, it, i);
    if (off >= 0) atomicAdd(acc + off, loadF(dy, t, i));
  }
}
template <typename A>
__global__ void cumSumKernel(const void* x, void* out, DT t, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse) {
  AMPC_GRID_LOOP(line, outer * inner) {
    const int64_t o = line / inner, in = line % inner;
    A acc = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = (o * n + (reverse ? n - 1 - j : j)) * inner + in;
      A v;
      if constexpr (std::is_integral_v<A>) v = loadI(x, t, at);
      else v = loadF(x, t, at);
      if (!exclusive) acc += v;
      if constexpr (std::is_integral_v<A>) storeI(out, t, at, acc);
      else storeF(out, t, at, acc);
      if (exclusive) acc += v;
    }
  }
}
// TopK: one thread per row. The j-th pick is the best element ranked after the (j-1)-th (values
// descending for largest, ascending otherwise; equal values in index order; NaN above every number,
// as the CPU kernel ranks them), so a row of n takes k passes over n elements: for the router of a
// mixture of experts (n the experts, k a few) nothing more is needed.
template <typename A>
__device__ bool topKBefore(A va, int64_t a, A vb, int64_t b, bool largest) {
  const bool na = va != va, nb = vb != vb;  // NaN
  if (na || nb) return na && !nb ? largest : (!na && nb ? !largest : a < b);
  if (va != vb) return largest ? va > vb : va < vb;
  return a < b;
}
template <typename A>
__global__ void topKKernel(const void* x, DT t, int elemBytes, void* vals, int64_t* idx, int64_t outer, int64_t n, int64_t inner, int64_t k,
                           bool largest) {
  AMPC_GRID_LOOP(line, outer * inner) {
    const int64_t o = line / inner, in = line % inner;
    int64_t prev = -1;
    A pv = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      A bv = 0;
      for (int64_t a = 0; a < n; ++a) {
        A v;
        if constexpr (std::is_integral_v<A>) v = loadI(x, t, (o * n + a) * inner + in);
        else v = loadF(x, t, (o * n + a) * inner + in);
        if (prev >= 0 && !topKBefore(pv, prev, v, a, largest)) continue;
        if (best < 0 || topKBefore(v, a, bv, best, largest)) {
          best = a;
          bv = v;
        }
      }
      if (best < 0) break;  // k > n: the shape rule refuses it
      const int64_t to = (o * k + j) * inner + in;
      idx[to] = best;
      const auto* src = static_cast<const unsigned char*>(x) + ((o * n + best) * inner + in) * elemBytes;  // the value's own bits
      auto* dst = static_cast<unsigned char*>(vals) + to * elemBytes;
      for (int b = 0; b < elemBytes; ++b) dst[b] = src[b];
      prev = best;
      pv = bv;
    }
  }
}
}  // namespace

namespace {
constexpr int kDetThreads = 256;
constexpr int64_t kDetBlocks = 1024;

// Block-wide Gaussian elimination in f64 of the m x m matrix at a (rows `stride` apart, `cols`
// columns swapped and updated), kernels/cpu's detKernel and detGradKernel step for step: the pivot
// is the first largest in magnitude. jordan: Gauss-Jordan (every other row eliminated, the pivot
// row divided by its pivot), for [X | I]. Every thread returns the determinant; *singular when a
// pivot is zero (the determinant 0). fac: m doubles of scratch.
__device__ double blockEliminate(double* a, int64_t m, int64_t stride, int64_t cols, bool jordan, double* fac, bool* singular) {
  __shared__ double bestV[kDetThreads];
  __shared__ int64_t bestR[kDetThreads];
  const int tid = threadIdx.x;
  double det = 1.0;
  *singular = false;
  for (int64_t k = 0; k < m; ++k) {
    double bv = -1.0;
    int64_t br = -1;
    for (int64_t r = k + tid; r < m; r += kDetThreads) {
      const double v = fabs(a[r * stride + k]);
      if (br < 0 || v > bv) bv = v, br = r;
    }
    bestV[tid] = bv, bestR[tid] = br;
    __syncthreads();
    for (int h = kDetThreads / 2; h > 0; h >>= 1) {
      if (tid < h) {
        const double ov = bestV[tid + h];
        const int64_t orow = bestR[tid + h];
        if (orow >= 0 && (bestR[tid] < 0 || ov > bestV[tid] || (ov == bestV[tid] && orow < bestR[tid]))) bestV[tid] = ov, bestR[tid] = orow;
      }
      __syncthreads();
    }
    const int64_t p = bestR[0];
    const double piv = a[p * stride + k];
    __syncthreads();  // bestR[0] read by all before the next column writes it
    if (piv == 0.0) {
      *singular = true;
      return 0.0;
    }
    if (p != k) {
      for (int64_t j = tid; j < cols; j += kDetThreads) {
        const double t = a[k * stride + j];
        a[k * stride + j] = a[p * stride + j];
        a[p * stride + j] = t;
      }
      det = -det;
    }
    det *= piv;
    __syncthreads();
    if (jordan) {
      for (int64_t j = tid; j < cols; j += kDetThreads) a[k * stride + j] /= piv;
      __syncthreads();
      for (int64_t r = tid; r < m; r += kDetThreads) fac[r] = r == k ? 0.0 : a[r * stride + k];
      __syncthreads();
      for (int64_t e = tid; e < m * cols; e += kDetThreads) {
        const int64_t r = e / cols, j = e - r * cols;
        if (fac[r] != 0.0) a[r * stride + j] -= fac[r] * a[k * stride + j];
      }
    } else {
      for (int64_t r = k + 1 + tid; r < m; r += kDetThreads) fac[r] = a[r * stride + k] / piv;
      __syncthreads();
      const int64_t w = m - k - 1;
      for (int64_t e = tid; e < w * w; e += kDetThreads) {
        const int64_t r = k + 1 + e / w, j = k + 1 + e % w;
        if (fac[r] != 0.0) a[r * stride + j] -= fac[r] * a[k * stride + j];
      }
    }
    __syncthreads();
  }
  return det;
}

__global__ void detKernel(const void* x, DT t, void* y, int64_t batches, int64_t n, double* work) {
  double* a = work + blockIdx.x * (2 * n * n + n);
  double* fac = a + 2 * n * n;
  for (int64_t b = blockIdx.x; b < batches; b += gridDim.x) {
    for (int64_t e = threadIdx.x; e < n * n; e += kDetThreads) a[e] = loadF(x, t, b * n * n + e);
    __syncthreads();
    bool singular;
    const double det = blockEliminate(a, n, n, n, false, fac, &singular);
    if (threadIdx.x == 0) storeF(y, t, b, static_cast<float>(det));
    __syncthreads();
  }
}

// dX = dY * cofactors(X): det * inv(X)^T from Gauss-Jordan on [X | I], or where a pivot is zero each
// cofactor as its minor's determinant.
__global__ void detGradKernel(const void* dy, DT dyT, const void* x, DT t, void* dx, int64_t batches, int64_t n, double* work) {
  double* a = work + blockIdx.x * (2 * n * n + n);
  double* fac = a + 2 * n * n;
  for (int64_t b = blockIdx.x; b < batches; b += gridDim.x) {
    const double g = loadF(dy, dyT, b);
    for (int64_t e = threadIdx.x; e < 2 * n * n; e += kDetThreads) {
      const int64_t i = e / (2 * n), j = e % (2 * n);
      a[e] = j < n ? loadF(x, t, b * n * n + i * n + j) : double(j - n == i);
    }
    __syncthreads();
    bool singular;
    const double det = blockEliminate(a, n, 2 * n, 2 * n, true, fac, &singular);
    if (!singular) {
      for (int64_t e = threadIdx.x; e < n * n; e += kDetThreads) {
        const int64_t i = e / n, j = e % n;
        storeF(dx, t, b * n * n + e, static_cast<float>(g * det * a[j * 2 * n + n + i]));
      }
    } else {
      const int64_t m = n - 1;
      for (int64_t c = 0; c < n * n; ++c) {
        const int64_t i = c / n, j = c % n;
        __syncthreads();
        for (int64_t e = threadIdx.x; e < m * m; e += kDetThreads) {
          const int64_t r = e / m, q = e % m;
          a[e] = loadF(x, t, b * n * n + (r + (r >= i)) * n + q + (q >= j));
        }
        __syncthreads();
        bool s2;
        const double minor = blockEliminate(a, m, m, m, false, fac, &s2);
        if (threadIdx.x == 0) storeF(dx, t, b * n * n + c, static_cast<float>(g * ((i + j) % 2 ? -minor : minor)));
      }
    }
    __syncthreads();
  }
}
}  // namespace

size_t detWorkBytes(int64_t batches, int64_t n) { return sizeof(double) * static_cast<size_t>(std::min(batches, kDetBlocks) * (2 * n * n + n)); }

cudaError_t det(const void* x, DT t, void* y, int64_t batches, int64_t n, double* work, cudaStream_t st) {
  if (batches == 0) return cudaSuccess;
  detKernel<<<static_cast<int>(std::min(batches, kDetBlocks)), kDetThreads, 0, st>>>(x, t, y, batches, n, work);
  return cudaGetLastError();
}

cudaError_t detGrad(const void* dy, DT dyT, const void* x, DT t, void* dx, int64_t batches, int64_t n, double* work, cudaStream_t st) {
  if (batches == 0 || n == 0) return cudaSuccess;
  detGradKernel<<<static_cast<int>(std::min(batches, kDetBlocks)), kDetThreads, 0, st>>>(dy, dyT, x, t, dx, batches, n, work);
  return cudaGetLastError();
}

cudaError_t topK(const void* x, DT t, void* vals, int64_t* idx, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest, cudaStream_t st) {
  if (outer * inner * k == 0) return cudaSuccess;
  const bool intType = t == DT::i64 || t == DT::i32 || t == DT::i8 || t == DT::u8;
  if (intType) topKKernel<int64_t><<<gridFor(outer * inner), 256, 0, st>>>(x, t, dtSize(t), vals, idx, outer, n, inner, k, largest);
  else topKKernel<float><<<gridFor(outer * inner), 256, 0, st>>>(x, t, dtSize(t), vals, idx, outer, n, inner, k, largest);
  return cudaGetLastError();
}

cudaError_t indexGather(const void* x, int elemBytes, const void* idx, DT idxType, void* out, const IndexGeom& g, cudaStream_t st) {
  if (g.n == 0) return cudaSuccess;
  const int grid = gridFor(g.n);
  switch (elemBytes) {
    case 1: indexGatherKernel<uint8_t><<<grid, 256, 0, st>>>(static_cast<const uint8_t*>(x), idx, idxType, static_cast<uint8_t*>(out), g); break;
    case 2: indexGatherKernel<uint16_t><<<grid, 256, 0, st>>>(static_cast<const uint16_t*>(x), idx, idxType, static_cast<uint16_t*>(out), g); break;
    case 4: indexGatherKernel<uint32_t><<<grid, 256, 0, st>>>(static_cast<const uint32_t*>(x), idx, idxType, static_cast<uint32_t*>(out), g); break;
    default: indexGatherKernel<uint64_t><<<grid, 256, 0, st>>>(static_cast<const uint64_t*>(x), idx, idxType, static_cast<uint64_t*>(out), g); break;
  }
  return cudaGetLastError();
}

namespace {
__global__ void offsetKeysKernel(const void* idx, DT it, IndexGeom g, int64_t outN, uint32_t* keys, uint32_t* items) {
  AMPC_GRID_LOOP(i, g.n) {
    const int64_t off = indexOffset(g, idx, it, i);
    keys[i] = off < 0 ? static_cast<uint32_t>(outN) : static_cast<uint32_t>(off);
    items[i] = static_cast<uint32_t>(i);
  }
}
// ScatterElements/ScatterND with reduction add, ordered: each element adds its updates in update
// order, rounding to its type after each add (as one atomic add after another would).
template <typename E>
__global__ void orderedScatterKernel(const E* upd, OrderBuffers b, uint32_t targets, E* out) {
  AMPC_GRID_LOOP(s, b.n) {
    if (!runHead(b.sortedKeys, s, targets)) continue;
    const uint32_t k = b.sortedKeys[s];
    E v = out[k];
    for (int64_t e = s; e < b.n && b.sortedKeys[e] == k; ++e) v = fromF<E>(toF(v) + toF(upd[b.sortedItems[e]]));
    out[k] = v;
  }
}
}  // namespace

cudaError_t indexGatherGrad(const void* dy, DT t, const void* idx, DT idxType, float* acc, void* out, int64_t outN, const IndexGeom& g,
                            void* order, cudaStream_t st) {
  if (cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * outN, st); e != cudaSuccess) return e;
  if (order && g.n > 0) {
    const OrderBuffers b = orderBuffers(order, g.n);
    offsetKeysKernel<<<gridFor(g.n), 256, 0, st>>>(idx, idxType, g, outN, b.keys, b.items);
    if (cudaError_t e = sortOrder(b, static_cast<uint32_t>(outN), st); e != cudaSuccess) return e;
    orderedSumKernel<<<gridFor(g.n), 256, 0, st>>>(dy, t, b, static_cast<uint32_t>(outN), acc);
  } else if (g.n > 0) {
    indexGatherGradKernel<<<gridFor(g.n), 256, 0, st>>>(dy, t, idx, idxType, acc, g);
  }
  if (outN > 0) narrowKernel<<<gridFor(outN), 256, 0, st>>>(acc, out, t, outN);
  return cudaGetLastError();
}

namespace {
template <typename E, bool Add>
__global__ void indexScatterKernel(const E* upd, const void* idx, DT it, E* out, IndexGeom g) {
  AMPC_GRID_LOOP(i, g.n) {
    const int64_t off = indexOffset(g, idx, it, i);
    if (off < 0) continue;
    if constexpr (Add) atomicAdd(out + off, upd[i]);
    else out[off] = upd[i];
  }
}
template <typename E, bool Add>
void launchScatter(const void* upd, const void* idx, DT it, void* out, const IndexGeom& g, cudaStream_t st) {
  indexScatterKernel<E, Add><<<gridFor(g.n), 256, 0, st>>>(static_cast<const E*>(upd), idx, it, static_cast<E*>(out), g);
}
}  // namespace

cudaError_t indexScatter(const void* upd, DT t, int elemBytes, const void* idx, DT idxType, void* out, const IndexGeom& g, bool add,
                         void* order, int64_t outN, cudaStream_t st) {
  if (g.n == 0) return cudaSuccess;
  if (add && order && (t == DT::f32 || t == DT::f16 || t == DT::bf16)) {
    const OrderBuffers b = orderBuffers(order, g.n);
    offsetKeysKernel<<<gridFor(g.n), 256, 0, st>>>(idx, idxType, g, outN, b.keys, b.items);
    if (cudaError_t e = sortOrder(b, static_cast<uint32_t>(outN), st); e != cudaSuccess) return e;
    const uint32_t targets = static_cast<uint32_t>(outN);
    if (t == DT::f32) orderedScatterKernel<<<gridFor(g.n), 256, 0, st>>>(static_cast<const float*>(upd), b, targets, static_cast<float*>(out));
    else if (t == DT::f16) orderedScatterKernel<<<gridFor(g.n), 256, 0, st>>>(static_cast<const __half*>(upd), b, targets, static_cast<__half*>(out));
    else orderedScatterKernel<<<gridFor(g.n), 256, 0, st>>>(static_cast<const __nv_bfloat16*>(upd), b, targets, static_cast<__nv_bfloat16*>(out));
    return cudaGetLastError();
  }
  if (!add) {
    switch (elemBytes) {
      case 1: launchScatter<uint8_t, false>(upd, idx, idxType, out, g, st); break;
      case 2: launchScatter<uint16_t, false>(upd, idx, idxType, out, g, st); break;
      case 4: launchScatter<uint32_t, false>(upd, idx, idxType, out, g, st); break;
      default: launchScatter<uint64_t, false>(upd, idx, idxType, out, g, st); break;
    }
    return cudaGetLastError();
  }
  switch (t) {
    case DT::f32: launchScatter<float, true>(upd, idx, idxType, out, g, st); break;
    case DT::f16: launchScatter<__half, true>(upd, idx, idxType, out, g, st); break;
    case DT::bf16: launchScatter<__nv_bfloat16, true>(upd, idx, idxType, out, g, st); break;
    case DT::i32: launchScatter<int, true>(upd, idx, idxType, out, g, st); break;
    case DT::i64: launchScatter<unsigned long long, true>(upd, idx, idxType, out, g, st); break;  // two's complement adds alike
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

namespace {
template <typename E>
__global__ void triluKernel(const E* x, E* y, int64_t n, int64_t R, int64_t C, int64_t k, bool upper) {
  AMPC_GRID_LOOP(i, n) {
    const int64_t j = i % C, r = (i / C) % R;
    const bool keep = upper ? (j - r >= k) : (j - r <= k);
    y[i] = keep ? x[i] : E(0);
  }
}
}  // namespace

cudaError_t trilu(const void* x, void* y, int elemBytes, int64_t batches, int64_t R, int64_t C, int64_t k, bool upper, cudaStream_t st) {
  const int64_t n = batches * R * C;
  if (n == 0) return cudaSuccess;
  const int g = gridFor(n);
  switch (elemBytes) {
    case 1: triluKernel<uint8_t><<<g, 256, 0, st>>>(static_cast<const uint8_t*>(x), static_cast<uint8_t*>(y), n, R, C, k, upper); break;
    case 2: triluKernel<uint16_t><<<g, 256, 0, st>>>(static_cast<const uint16_t*>(x), static_cast<uint16_t*>(y), n, R, C, k, upper); break;
    case 4: triluKernel<uint32_t><<<g, 256, 0, st>>>(static_cast<const uint32_t*>(x), static_cast<uint32_t*>(y), n, R, C, k, upper); break;
    default: triluKernel<uint64_t><<<g, 256, 0, st>>>(static_cast<const uint64_t*>(x), static_cast<uint64_t*>(y), n, R, C, k, upper); break;
  }
  return cudaGetLastError();
}

namespace {
// A thread per (row, k < h): y[k] = x[k + h] and y[k + h] = x[k], the half `negFirst` picks with its
// sign bit flipped. I: the index type (32-bit where rows * h fits).
template <typename E, typename I>
__global__ void rotateHalfKernel(const E* x, E* y, I pairs, I h, bool negFirst, E signBit) {
  for (I i = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; i < pairs; i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I r = i / h, k = i - r * h, base = r * 2 * h;
    const E lo = x[base + k], hi = x[base + k + h];
    y[base + k] = negFirst ? hi ^ signBit : hi;
    y[base + k + h] = negFirst ? lo : lo ^ signBit;
  }
}
template <typename E>
void launchRotateHalf(const void* x, void* y, int64_t rows, int64_t h, bool negFirst, cudaStream_t st) {
  const E bit = static_cast<E>(E{1} << (8 * sizeof(E) - 1));
  const int64_t pairs = rows * h;
  if (pairs < (int64_t{1} << 31))
    rotateHalfKernel<E, uint32_t><<<gridFor(pairs), 256, 0, st>>>(static_cast<const E*>(x), static_cast<E*>(y), static_cast<uint32_t>(pairs),
                                                                   static_cast<uint32_t>(h), negFirst, bit);
  else
    rotateHalfKernel<E, int64_t><<<gridFor(pairs), 256, 0, st>>>(static_cast<const E*>(x), static_cast<E*>(y), pairs, h, negFirst, bit);
}
}  // namespace

cudaError_t rotateHalf(const void* x, void* y, int elemBytes, int64_t rows, int64_t h, bool negFirst, cudaStream_t st) {
  if (rows * h == 0) return cudaSuccess;
  switch (elemBytes) {
    case 2: launchRotateHalf<uint16_t>(x, y, rows, h, negFirst, st); break;
    case 4: launchRotateHalf<uint32_t>(x, y, rows, h, negFirst, st); break;
    case 8: launchRotateHalf<uint64_t>(x, y, rows, h, negFirst, st); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t cumSum(const void* x, void* out, DT t, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, cudaStream_t st) {
  if (outer * inner == 0 || n == 0) return cudaSuccess;
  const bool intType = t == DT::i64 || t == DT::i32 || t == DT::i8 || t == DT::u8;
  if (intType) cumSumKernel<int64_t><<<gridFor(outer * inner), 256, 0, st>>>(x, out, t, outer, n, inner, exclusive, reverse);
  else cumSumKernel<float><<<gridFor(outer * inner), 256, 0, st>>>(x, out, t, outer, n, inner, exclusive, reverse);
  return cudaGetLastError();
}

cudaError_t scatterAddFlat(const void* dy, DT t, const int64_t* idx, int64_t n, float* acc, void* out, int64_t outN, void* order, cudaStream_t st) {
  if (cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * outN, st); e != cudaSuccess) return e;
  if (order && n > 0) {
    const OrderBuffers b = orderBuffers(order, n);
    flatKeysKernel<<<gridFor(n), 256, 0, st>>>(idx, n, outN, b.keys, b.items);
    if (cudaError_t e = sortOrder(b, static_cast<uint32_t>(outN), st); e != cudaSuccess) return e;
    orderedSumKernel<<<gridFor(n), 256, 0, st>>>(dy, t, b, static_cast<uint32_t>(outN), acc);
  } else if (n > 0) {
    scatterFlatKernel<<<gridFor(n), 256, 0, st>>>(dy, t, idx, n, acc, outN);
  }
  narrowKernel<<<gridFor(outN), 256, 0, st>>>(acc, out, t, outN);
  return cudaGetLastError();
}

// ---- reductions ----

namespace {
// One warp per output element: lanes stride over the reduced elements.
template <bool kInt>
__global__ void reduceKernel(const void* x, void* out, ReduceArgs a) {
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5; k < a.outN; k += warps) {
    int64_t base = 0, rest = k;
    for (int d = a.krank - 1; d >= 0; --d) {
      const int64_t q = rest / a.kshape[d];
      base += (rest - q * a.kshape[d]) * a.kstride[d];
      rest = q;
    }
    using Acc = std::conditional_t<kInt, int64_t, float>;
    Acc acc = a.op == Red::Max ? (kInt ? Acc(INT64_MIN) : Acc(-INFINITY)) : a.op == Red::Min ? (kInt ? Acc(INT64_MAX) : Acc(INFINITY)) : Acc(0);
    bool nan = false;
    for (int64_t r = lane; r < a.redN; r += 32) {
      int64_t off = base, rr = r;
      for (int d = a.rrank - 1; d >= 0; --d) {
        const int64_t q = rr / a.rshape[d];
        off += (rr - q * a.rshape[d]) * a.rstride[d];
        rr = q;
      }
      Acc v;
      if constexpr (kInt) v = loadI(x, a.t, off);
      else v = loadF(x, a.t, off);
      if constexpr (!kInt) nan |= v != v;
      acc = a.op == Red::Max ? (v > acc ? v : acc) : a.op == Red::Min ? (v < acc ? v : acc) : acc + v;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const Acc other = __shfl_xor_sync(0xffffffffu, acc, o);
      acc = a.op == Red::Max ? (other > acc ? other : acc) : a.op == Red::Min ? (other < acc ? other : acc) : acc + other;
    }
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) {
      if constexpr (kInt) {
        storeI(out, a.t, k, a.op == Red::Mean ? acc / (a.redN > 0 ? a.redN : 1) : acc);
      } else {
        float r = a.op == Red::Mean ? acc / static_cast<float>(a.redN) : acc;
        if (nan && (a.op == Red::Max || a.op == Red::Min)) r = NAN;
        storeF(out, a.t, k, r);
      }
    }
  }
}
}  // namespace

cudaError_t reduce(const void* x, void* out, const ReduceArgs& a, cudaStream_t st) {
  if (a.outN == 0) return cudaSuccess;
  const bool isInt = a.t != DT::f32 && a.t != DT::f16 && a.t != DT::bf16;
  const int g = gridFor(a.outN * 32);
  if (isInt) reduceKernel<true><<<g, 256, 0, st>>>(x, out, a);
  else reduceKernel<false><<<g, 256, 0, st>>>(x, out, a);
  return cudaGetLastError();
}

namespace {
// Column sums over slices of the rows: block (32, 8) covers 32 * kColVec columns of one slice, each
// thread kColVec consecutive columns (vec: 16 bytes or two 16-byte loads) over rows ty, ty + 8, ...
// of the slice; the block's 8 row groups are added in order and the slice's sums go to
// part[slice][K]. No atomics: with columnTotal, the order of every sum is fixed by (R, K) alone.
constexpr int kColVec = 8, kColSliceRows = 64, kColMaxSlices = 256;
__global__ void columnPartial(const void* x, DT t, int64_t R, int64_t K, int64_t rowsPerSlice, bool vec, float* part) {
  __shared__ float sums[8][32 * kColVec + 1];
  const int64_t k0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * kColVec;
  const int64_t r0 = blockIdx.y * rowsPerSlice, r1 = min(R, r0 + rowsPerSlice);
  float s[kColVec] = {};
  for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
    if (vec && k0 + kColVec <= K) {
      float a[4], b[4];
      load4(x, t, r * K + k0, a);
      load4(x, t, r * K + k0 + 4, b);
      for (int e = 0; e < 4; ++e) s[e] += a[e], s[4 + e] += b[e];
    } else {
      for (int e = 0; e < kColVec; ++e)
        if (k0 + e < K) s[e] += loadF(x, t, r * K + k0 + e);
    }
  }
  for (int e = 0; e < kColVec; ++e) sums[threadIdx.y][threadIdx.x * kColVec + e] = s[e];
  __syncthreads();
  if (threadIdx.y != 0) return;
  for (int e = 0; e < kColVec; ++e) {
    const int c = threadIdx.x + 32 * e;  // coalesced over the block's columns
    const int64_t k = static_cast<int64_t>(blockIdx.x) * 32 * kColVec + c;
    if (k >= K) continue;
    float v = 0;
    for (int y = 0; y < 8; ++y) v += sums[y][c];
    part[blockIdx.y * K + k] = v;
  }
}
// out[k] = scale * the slices' partials summed in order (block (32, 16), as layerNormGradPartials).
__global__ void columnTotal(const float* part, int slices, void* out, DT t, int64_t K, float scale) {
  __shared__ float sums[16][33];
  const int64_t k = blockIdx.x * 32 + threadIdx.x;
  float v = 0;
  if (k < K)
    for (int sl = threadIdx.y; sl < slices; sl += 16) v += part[sl * K + k];
  sums[threadIdx.y][threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.y != 0 || k >= K) return;
  for (int y = 1; y < 16; ++y) v += sums[y][threadIdx.x];
  storeF(out, t, k, v * scale);
}
int64_t columnSlices(int64_t R, int64_t K) {
  const int64_t colBlocks = (K + 32 * kColVec - 1) / (32 * kColVec);
  return std::max<int64_t>(1, std::min<int64_t>({(R + kColSliceRows - 1) / kColSliceRows, kColMaxSlices, (1024 + colBlocks - 1) / colBlocks}));
}
}  // namespace

size_t reduceColumnsScratch(int64_t R, int64_t K) { return sizeof(float) * static_cast<size_t>(columnSlices(R, K) * K); }

cudaError_t reduceColumns(const void* x, DT t, void* out, int64_t R, int64_t K, float scale, float* part, cudaStream_t st) {
  if (K == 0) return cudaSuccess;
  const int64_t slices = columnSlices(R, K), per = (R + slices - 1) / slices;
  const int64_t colBlocks = (K + 32 * kColVec - 1) / (32 * kColVec);
  const bool vec = (t == DT::f32 || t == DT::f16 || t == DT::bf16) && K % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  if (R > 0) {
    columnPartial<<<dim3(static_cast<unsigned>(colBlocks), static_cast<unsigned>(slices)), dim3(32, 8), 0, st>>>(x, t, R, K, per, vec, part);
  } else if (cudaError_t e = cudaMemsetAsync(part, 0, sizeof(float) * K, st); e != cudaSuccess) {
    return e;
  }
  columnTotal<<<static_cast<unsigned>((K + 31) / 32), dim3(32, 16), 0, st>>>(part, R > 0 ? static_cast<int>(slices) : 1, out, t, K, scale);
  return cudaGetLastError();
}

namespace {
// x [A, K, B] summed over A and B: block (k, slice) sums rows a of its slice (B contiguous elements
// each) into part[slice][k]; middleTotal adds the slices in order.
__global__ void middlePartial(const void* x, DT t, int64_t A, int64_t K, int64_t B, int64_t perSlice, float* part) {
  const int64_t k = blockIdx.x, a0 = blockIdx.y * perSlice, a1 = min(A, a0 + perSlice);
  float s = 0.0f;
  const int64_t n = a0 < a1 ? (a1 - a0) * B : 0;
  // (a, b) of element j, stepped by blockDim.x (no division per element).
  int64_t a = a0 + threadIdx.x / B, b = threadIdx.x % B;
  const int64_t da = blockDim.x / B, db = blockDim.x % B;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    s += loadF(x, t, (a * K + k) * B + b);
    a += da;
    b += db;
    if (b >= B) {
      b -= B;
      ++a;
    }
  }
  s = blockSum(s);
  if (threadIdx.x == 0) part[blockIdx.y * K + k] = s;
}
__global__ void middleTotal(const float* part, int slices, void* out, DT t, int64_t K, float scale) {
  AMPC_GRID_LOOP(k, K) {
    float s = 0.0f;
    for (int i = 0; i < slices; ++i) s += part[i * K + k];
    storeF(out, t, k, s * scale);
  }
}
// Slices of A per output: about 2048 blocks in all, each of at least 4096 elements.
int64_t middleSlices(int64_t A, int64_t K, int64_t B) {
  return std::max<int64_t>(1, std::min<int64_t>({A, (2048 + K - 1) / std::max<int64_t>(K, 1), (A * B + 4095) / 4096, 65535}));
}
}  // namespace

size_t reduceMiddleScratch(int64_t A, int64_t K, int64_t B) { return sizeof(float) * static_cast<size_t>(middleSlices(A, K, B) * K); }

namespace {
// out[a, b] = scale * sum_k x[a, k, b]: a thread per output, the k in order (deterministic), loads
// coalesced over b.
__global__ void stridedSumKernel(const void* x, DT t, void* out, int64_t A, int64_t K, int64_t B, float scale) {
  AMPC_GRID_LOOP(o, A * B) {
    const int64_t a = o / B, b = o - a * B;
    const int64_t base = a * K * B + b;
    float s = 0.0f;
    for (int64_t k = 0; k < K; ++k) s += loadF(x, t, base + k * B);
    storeF(out, t, o, s * scale);
  }
}
}  // namespace

cudaError_t reduceStrided(const void* x, DT t, void* out, int64_t A, int64_t K, int64_t B, float scale, cudaStream_t st) {
  if (A * B == 0) return cudaSuccess;
  stridedSumKernel<<<gridFor(A * B), 256, 0, st>>>(x, t, out, A, K, B, scale);
  return cudaGetLastError();
}

cudaError_t reduceMiddle(const void* x, DT t, void* out, int64_t A, int64_t K, int64_t B, float scale, float* part, cudaStream_t st) {
  if (K == 0) return cudaSuccess;
  const int64_t slices = middleSlices(A, K, B), per = (A + slices - 1) / slices;
  if (K > 2147483647) return cudaErrorInvalidValue;
  middlePartial<<<dim3(static_cast<unsigned>(K), static_cast<unsigned>(slices)), 256, 0, st>>>(x, t, A, K, B, per, part);
  middleTotal<<<gridFor(K), 256, 0, st>>>(part, static_cast<int>(slices), out, t, K, scale);
  return cudaGetLastError();
}

// ---- random ----

namespace {
// One thread per block of 8 elements (one Philox call), as kernels/cpu's dropoutDraw; whole blocks
// move as two 4-element loads and stores (vec: every buffer aligned to 8 elements), the mask as one
// 64-bit store. With `sum`, a residual Add after the Dropout's widening Cast is folded in: sum =
// res + widen(y) (f32), and y is not written.
__global__ void dropoutKernel(const void* x, DT t, void* y, bool* mask, const float* res, float* sum, int64_t n, float ratio, float scale,
                              uint64_t seed, const uint64_t* stepp, uint32_t key, bool vec) {
  const uint64_t step = *stepp;
  const uint32_t thr = dropoutThreshold(ratio);
  AMPC_GRID_LOOP(b, (n + 7) / 8) {
    uint32_t w[4];
    streamBlock(seed, step, key, static_cast<uint64_t>(b), w);
    bool keep[8];
    for (int k = 0; k < 4; ++k) keep[2 * k] = keptLow(w[k], thr), keep[2 * k + 1] = keptHigh(w[k], thr);
    const int64_t i0 = b * 8;
    if (vec && i0 + 8 <= n) {
      for (int hf = 0; hf < 2; ++hf) {
        const int64_t i4 = i0 + 4 * hf;
        float v[4];
        load4(x, t, i4, v);
        for (int k = 0; k < 4; ++k) v[k] = keep[4 * hf + k] ? v[k] * scale : 0.0f;
        if (sum) {
          float r[4];
          load4(res, DT::f32, i4, r);
          for (int k = 0; k < 4; ++k) v[k] = r[k] + roundTo(t, v[k]);
          store4(sum, DT::f32, i4, v);
        } else {
          store4(y, t, i4, v);
        }
      }
      if (mask) {
        uint64_t m = 0;
        for (int k = 0; k < 8; ++k) m |= static_cast<uint64_t>(keep[k]) << (8 * k);
        *reinterpret_cast<uint64_t*>(mask + i0) = m;
      }
      continue;
    }
    for (int k = 0; k < 8; ++k) {
      const int64_t i = i0 + k;
      if (i >= n) break;
      const float v = keep[k] ? loadF(x, t, i) * scale : 0.0f;
      if (sum) sum[i] = res[i] + roundTo(t, v);
      else storeF(y, t, i, v);
      if (mask) mask[i] = keep[k];
    }
  }
}
// dx = mask ? round_t(dy) * scale : 0; dy is read as dyT (f32 when a narrowing Cast in front is read
// through: rounded to t first, as the Cast would), four elements at a time where aligned.
__global__ void dropoutGradKernel(const void* dy, DT dyT, DT t, const bool* mask, void* dx, int64_t n, float scale, bool vec) {
  AMPC_GRID_LOOP(b, (n + 3) / 4) {
    const int64_t i0 = b * 4;
    if (vec && i0 + 4 <= n) {
      float g[4];
      load4(dy, dyT, i0, g);
      const uint32_t m = *reinterpret_cast<const uint32_t*>(mask + i0);
      for (int k = 0; k < 4; ++k) g[k] = (m >> (8 * k)) & 0xffu ? roundTo(t, g[k]) * scale : 0.0f;
      store4(dx, t, i0, g);
      continue;
    }
    for (int64_t i = i0; i < i0 + 4 && i < n; ++i) storeF(dx, t, i, mask[i] ? roundTo(t, loadF(dy, dyT, i)) * scale : 0.0f);
  }
}
// Whether every buffer is aligned to `elems` of its elements (size: the element's bytes).
bool alignedTo(int elems, std::initializer_list<std::pair<const void*, int>> bufs) {
  for (const auto& [p, size] : bufs)
    if (p && reinterpret_cast<uintptr_t>(p) % (static_cast<uintptr_t>(elems) * size) != 0) return false;
  return true;
}
__global__ void addStepKernel(uint64_t* s) { *s += 1; }
}  // namespace

cudaError_t dropout(const void* x, DT t, void* y, bool* mask, const float* res, float* sum, int64_t n, float ratio, uint64_t seed,
                    const uint64_t* step, uint32_t nodeKey, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const float scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(ratio)));
  const bool vec = alignedTo(8, {{x, dtSize(t)}, {y, dtSize(t)}, {mask, 1}, {res, 4}, {sum, 4}});
  dropoutKernel<<<gridFor((n + 7) / 8), 256, 0, st>>>(x, t, y, mask, res, sum, n, ratio, scale, seed, step, nodeKey, vec);
  return cudaGetLastError();
}

namespace {
__device__ __forceinline__ float streamUniform(uint64_t seed, uint64_t step, uint32_t key, uint64_t i) {
  float u[4];
  randomUniform4(seed, step, key, i >> 2, u);
  return u[i & 3];
}
__global__ void randomKernel(RandomMode mode, const void* p, DT pt, void* out, DT t, int64_t n, float a, float b, uint64_t seed,
                             const uint64_t* stepp, uint32_t key) {
  const uint64_t step = *stepp;
  AMPC_GRID_LOOP(i, n) {
    float v;
    if (mode == RandomMode::Uniform) {
      v = a + (b - a) * streamUniform(seed, step, key, i);
    } else if (mode == RandomMode::Normal) {
      const double u1 = 1.0 - streamUniform(seed, step, key, 2 * i), u2 = streamUniform(seed, step, key, 2 * i + 1);
      v = static_cast<float>(a + b * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    } else {
      v = streamUniform(seed, step, key, i) < loadF(p, pt, i) ? 1.0f : 0.0f;
    }
    storeF(out, t, i, v);
  }
}
}  // namespace

cudaError_t randomFill(RandomMode mode, const void* p, DT pt, void* out, DT t, int64_t n, float a, float b, uint64_t seed,
                       const uint64_t* step, uint32_t nodeKey, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  randomKernel<<<gridFor(n), 256, 0, st>>>(mode, p, pt, out, t, n, a, b, seed, step, nodeKey);
  return cudaGetLastError();
}

cudaError_t dropoutGrad(const void* dy, DT dyT, DT t, const bool* mask, void* dx, int64_t n, float ratio, cudaStream_t st) {
  if (n == 0) return cudaSuccess;
  const bool vec = alignedTo(4, {{dy, dtSize(dyT)}, {dx, dtSize(t)}, {mask, 1}});
  dropoutGradKernel<<<gridFor((n + 3) / 4), 256, 0, st>>>(dy, dyT, t, mask, dx, n, static_cast<float>(1.0 / (1.0 - static_cast<double>(ratio))),
                                                          vec);
  return cudaGetLastError();
}

cudaError_t addStep(uint64_t* step, cudaStream_t st) {
  addStepKernel<<<1, 1, 0, st>>>(step);
  return cudaGetLastError();
}

// ---------------------------------------------------------------- Pad's other modes

namespace {
__global__ void padSourceKernel(int64_t* idx, PadMap m) {
  AMPC_GRID_LOOP(i, m.n) {
    int64_t rest = i, off = 0, stride = 1;
    for (int d = m.rank - 1; d >= 0; --d) {
      const int64_t o = rest % m.outShape[d], n = m.inShape[d];
      rest /= m.outShape[d];
      int64_t k = o - m.begin[d];
      if (k < 0 || k >= n) {
        if (m.mode == 1) k = k < 0 ? 0 : n - 1;
        else if (m.mode == 2) k = ((k % n) + n) % n;
        else if (n == 1) k = 0;
        else {
          const int64_t period = 2 * (n - 1);
          k = ((k % period) + period) % period;
          if (k >= n) k = period - k;
        }
      }
      off += k * stride;
      stride *= n;
    }
    idx[i] = off;
  }
}
}  // namespace

cudaError_t padSourceIndex(int64_t* idx, const PadMap& m, cudaStream_t st) {
  if (m.n == 0) return cudaSuccess;
  padSourceKernel<<<gridFor(m.n), 256, 0, st>>>(idx, m);
  return cudaGetLastError();
}

// ---------------------------------------------------------------- GridSample

namespace {
// A normalised grid coordinate to a pixel coordinate along an axis of n pixels, with the padding
// mode's reflection and clip; *d gets d(pixel)/dg (0 where clipped). The CPU kernel's GridAxis::map.
__device__ float gridMap(float g, int64_t size, bool align, int pad, float* d) {
  const float n = static_cast<float>(size);
  float x = align ? (g + 1) / 2 * (n - 1) : ((g + 1) * n - 1) / 2;
  float dd = align ? (n - 1) / 2 : n / 2;
  if (pad == 2) {
    const float lo2 = align ? 0 : -1, hi2 = align ? 2 * (n - 1) : 2 * n - 1;
    if (lo2 == hi2) {
      x = 0;
      dd = 0;
    } else {
      const float mn = lo2 / 2, span = (hi2 - lo2) / 2;
      float in = x - mn, sign = 1;
      if (in < 0) {
        sign = -1;
        in = -in;
      }
      const float extra = fmodf(in, span), flips = floorf(in / span);
      const bool even = fmodf(flips, 2.0f) == 0;
      x = even ? extra + mn : span - extra + mn;
      dd *= even ? sign : -sign;
    }
  }
  if (pad != 0) {
    if (x <= 0) {
      x = 0;
      dd = 0;
    } else if (x >= n - 1) {
      x = n - 1;
      dd = 0;
    }
  }
  *d = dd;
  return x;
}
// Sample p of image n: its pixel coordinates and slopes.
struct GridPoint {
  float px, py, dxdg, dydg;
};
__device__ GridPoint gridPoint(const void* grid, DT gt, const GridArgs& a, int64_t n, int64_t p) {
  GridPoint q;
  const int64_t gi = (n * a.Ho * a.Wo + p) * 2;
  q.px = gridMap(loadF(grid, gt, gi), a.W, a.align, a.pad, &q.dxdg);
  q.py = gridMap(loadF(grid, gt, gi + 1), a.H, a.align, a.pad, &q.dydg);
  return q;
}
// The (up to 4) pixels a sample reads and their weights; a pixel outside the image gets index -1.
__device__ int gridTaps(const GridArgs& a, const GridPoint& q, int64_t* pix, float* w) {
  auto at = [&](int64_t yi, int64_t xi) { return yi >= 0 && yi < a.H && xi >= 0 && xi < a.W ? yi * a.W + xi : int64_t{-1}; };
  if (a.nearest) {
    pix[0] = at(static_cast<int64_t>(nearbyintf(q.py)), static_cast<int64_t>(nearbyintf(q.px)));
    w[0] = 1;
    return 1;
  }
  const int64_t x0 = static_cast<int64_t>(floorf(q.px)), y0 = static_cast<int64_t>(floorf(q.py));
  const float wx1 = q.px - static_cast<float>(x0), wy1 = q.py - static_cast<float>(y0), wx0 = 1 - wx1, wy0 = 1 - wy1;
  pix[0] = at(y0, x0), w[0] = wy0 * wx0;
  pix[1] = at(y0, x0 + 1), w[1] = wy0 * wx1;
  pix[2] = at(y0 + 1, x0), w[2] = wy1 * wx0;
  pix[3] = at(y0 + 1, x0 + 1), w[3] = wy1 * wx1;
  return 4;
}
__global__ void gridSampleKernel(const void* x, DT t, const void* grid, DT gt, void* y, GridArgs a) {
  AMPC_GRID_LOOP(i, a.N * a.C * a.Ho * a.Wo) {
    const int64_t p = i % (a.Ho * a.Wo), ch = (i / (a.Ho * a.Wo)) % a.C, n = i / (a.Ho * a.Wo * a.C);
    const GridPoint q = gridPoint(grid, gt, a, n, p);
    int64_t pix[4];
    float w[4];
    const int taps = gridTaps(a, q, pix, w);
    const int64_t plane = (n * a.C + ch) * a.H * a.W;
    float v = 0;
    for (int k = 0; k < taps; ++k)
      if (pix[k] >= 0) v += loadF(x, t, plane + pix[k]) * w[k];
    storeF(y, t, i, v);
  }
}
// dGrid: per sample, the interpolation's slope along each axis summed over the channels.
__global__ void gridGradKernel(const void* dy, DT t, const void* x, const void* grid, DT gt, void* dgrid, GridArgs a) {
  AMPC_GRID_LOOP(i, a.N * a.Ho * a.Wo) {
    const int64_t p = i % (a.Ho * a.Wo), n = i / (a.Ho * a.Wo);
    const GridPoint q = gridPoint(grid, gt, a, n, p);
    float sx = 0, sy = 0;
    if (!a.nearest) {
      const int64_t x0 = static_cast<int64_t>(floorf(q.px)), y0 = static_cast<int64_t>(floorf(q.py));
      const float wx1 = q.px - static_cast<float>(x0), wy1 = q.py - static_cast<float>(y0), wx0 = 1 - wx1, wy0 = 1 - wy1;
      for (int64_t ch = 0; ch < a.C; ++ch) {
        const int64_t plane = (n * a.C + ch) * a.H * a.W;
        auto val = [&](int64_t yi, int64_t xi) { return yi >= 0 && yi < a.H && xi >= 0 && xi < a.W ? loadF(x, t, plane + yi * a.W + xi) : 0.0f; };
        const float go = loadF(dy, t, (n * a.C + ch) * a.Ho * a.Wo + p);
        const float v00 = val(y0, x0), v01 = val(y0, x0 + 1), v10 = val(y0 + 1, x0), v11 = val(y0 + 1, x0 + 1);
        sx += go * ((v01 - v00) * wy0 + (v11 - v10) * wy1);
        sy += go * ((v10 - v00) * wx0 + (v11 - v01) * wx1);
      }
    }
    storeF(dgrid, gt, i * 2, sx * q.dxdg);
    storeF(dgrid, gt, i * 2 + 1, sy * q.dydg);
  }
}
// dX with atomics: a thread per (image, channel, sample) adds its weighted dY to its taps.
__global__ void gridScatterKernel(const void* dy, DT t, const void* grid, DT gt, float* acc, GridArgs a) {
  AMPC_GRID_LOOP(i, a.N * a.C * a.Ho * a.Wo) {
    const int64_t p = i % (a.Ho * a.Wo), nc = i / (a.Ho * a.Wo), n = nc / a.C;
    const GridPoint q = gridPoint(grid, gt, a, n, p);
    int64_t pix[4];
    float w[4];
    const int taps = gridTaps(a, q, pix, w);
    const float go = loadF(dy, t, i);
    for (int k = 0; k < taps; ++k)
      if (pix[k] >= 0) atomicAdd(acc + nc * a.H * a.W + pix[k], w[k] * go);
  }
}
// The deterministic path: item (n Ho Wo + p) * 4 + k is sample p's tap k, keyed by its pixel
// n H W + pixel (or the sentinel N H W outside the image).
__global__ void gridKeysKernel(const void* grid, DT gt, GridArgs a, uint32_t* keys, uint32_t* items) {
  AMPC_GRID_LOOP(i, a.N * a.Ho * a.Wo) {
    const int64_t p = i % (a.Ho * a.Wo), n = i / (a.Ho * a.Wo);
    const GridPoint q = gridPoint(grid, gt, a, n, p);
    int64_t pix[4];
    float w[4];
    const int taps = gridTaps(a, q, pix, w);
    for (int k = 0; k < 4; ++k) {
      const bool hit = k < taps && pix[k] >= 0;
      keys[i * 4 + k] = hit ? static_cast<uint32_t>(n * a.H * a.W + pix[k]) : static_cast<uint32_t>(a.N * a.H * a.W);
      items[i * 4 + k] = static_cast<uint32_t>(i * 4 + k);
    }
  }
}
// A thread per (run head, channel) sums its pixel's taps in item order.
__global__ void gridOrderedKernel(const void* dy, DT t, const void* grid, DT gt, OrderBuffers b, float* acc, GridArgs a) {
  const uint32_t targets = static_cast<uint32_t>(a.N * a.H * a.W);
  AMPC_GRID_LOOP(i, b.n * a.C) {
    const int64_t s = i / a.C, ch = i % a.C;
    if (!runHead(b.sortedKeys, s, targets)) continue;
    const uint32_t key = b.sortedKeys[s];
    const int64_t n = key / (a.H * a.W), pixel = key % (a.H * a.W);
    float sum = 0;
    for (int64_t e = s; e < b.n && b.sortedKeys[e] == key; ++e) {
      const int64_t item = b.sortedItems[e], sample = item / 4, k = item % 4, p = sample % (a.Ho * a.Wo);
      const GridPoint q = gridPoint(grid, gt, a, n, p);
      int64_t pix[4];
      float w[4];
      gridTaps(a, q, pix, w);
      sum += w[k] * loadF(dy, t, (n * a.C + ch) * a.Ho * a.Wo + p);
    }
    acc[(n * a.C + ch) * a.H * a.W + pixel] = sum;
  }
}
}  // namespace

cudaError_t gridSample(const void* x, DT t, const void* grid, DT gt, void* y, const GridArgs& a, cudaStream_t st) {
  const int64_t n = a.N * a.C * a.Ho * a.Wo;
  if (n == 0) return cudaSuccess;
  gridSampleKernel<<<gridFor(n), 256, 0, st>>>(x, t, grid, gt, y, a);
  return cudaGetLastError();
}

cudaError_t gridSampleGrad(const void* dy, DT t, const void* x, const void* grid, DT gt, float* acc, void* dx, void* dgrid, const GridArgs& a,
                           void* order, cudaStream_t st) {
  const int64_t xN = a.N * a.C * a.H * a.W, samples = a.N * a.Ho * a.Wo;
  if (cudaError_t e = cudaMemsetAsync(acc, 0, sizeof(float) * static_cast<size_t>(xN), st); e != cudaSuccess) return e;
  if (samples > 0) {
    gridGradKernel<<<gridFor(samples), 256, 0, st>>>(dy, t, x, grid, gt, dgrid, a);
    if (order) {
      const OrderBuffers b = orderBuffers(order, samples * 4);
      gridKeysKernel<<<gridFor(samples), 256, 0, st>>>(grid, gt, a, b.keys, b.items);
      if (cudaError_t e = sortOrder(b, static_cast<uint32_t>(a.N * a.H * a.W), st); e != cudaSuccess) return e;
      gridOrderedKernel<<<gridFor(b.n * a.C), 256, 0, st>>>(dy, t, grid, gt, b, acc, a);
    } else if (a.C > 0) {
      gridScatterKernel<<<gridFor(samples * a.C), 256, 0, st>>>(dy, t, grid, gt, acc, a);
    }
  }
  if (static_cast<void*>(acc) != dx && xN > 0) narrowKernel<<<gridFor(xN), 256, 0, st>>>(acc, dx, t, xN);
  return cudaGetLastError();
}

}  // namespace ampc::cuda
