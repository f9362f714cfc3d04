#include "kernels/cpu/convert.h"

#include <cstdint>
#include <cstring>

#include "compiler/ir/ir.h"

namespace ampc::cpu {
namespace {

// f64 -> f16/bf16 goes through f32 only when that is exact; otherwise double rounding could
// differ from a direct conversion, so the value is first rounded to f32 with round-to-odd.
float toFloatRoundOdd(double d) {
  float f = static_cast<float>(d);  // RNE
  if (static_cast<double>(f) == d || f != f) return f;
  // Truncate towards zero, then set the sticky bit: round-to-odd.
  float t = f;
  if ((d > 0 && static_cast<double>(t) > d) || (d < 0 && static_cast<double>(t) < d)) {
    uint32_t bits;
    std::memcpy(&bits, &t, 4);
    --bits;
    std::memcpy(&t, &bits, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  bits |= 1u;
  std::memcpy(&t, &bits, 4);
  return t;
}

double load(const void* src, DType t, size_t i) {
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::f64: { double v; std::memcpy(&v, p + 8 * i, 8); return v; }
    case DType::f32: { float v; std::memcpy(&v, p + 4 * i, 4); return v; }
    case DType::f16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return halfToFloat(v); }
    case DType::bf16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); return bf16ToFloat(v); }
    default: throw Error("cpu::convert: " + std::string(dtypeName(t)) + " is not a float dtype");
  }
}

void storeTo(void* dst, DType t, size_t i, double v) {
  auto* p = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::f64: std::memcpy(p + 8 * i, &v, 8); break;
    case DType::f32: { float f = static_cast<float>(v); std::memcpy(p + 4 * i, &f, 4); break; }
    case DType::f16: { uint16_t h = floatToHalf(toFloatRoundOdd(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    case DType::bf16: { uint16_t h = floatToBf16(toFloatRoundOdd(v)); std::memcpy(p + 2 * i, &h, 2); break; }
    default: throw Error("cpu::convert: " + std::string(dtypeName(t)) + " is not a float dtype");
  }
}

}  // namespace

void convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == DType::f32 && to == DType::f16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = floatToHalf(s[i]);
    return;
  }
  if (from == DType::f32 && to == DType::bf16) {
    const auto* s = static_cast<const float*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = floatToBf16(s[i]);
    return;
  }
  if ((from == DType::f16 || from == DType::bf16) && to == DType::f32) {  // exact, NaN payloads kept
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = from == DType::f16 ? halfToFloat(s[i]) : bf16ToFloat(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) storeTo(dst, to, i, load(src, from, i));
}

}  // namespace ampc::cpu
