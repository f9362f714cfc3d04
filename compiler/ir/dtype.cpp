#include "compiler/ir/dtype.h"

#include <bit>
#include <cstring>

namespace ampc {

namespace {
struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
  int onnx;  // TensorProto.DataType
};
constexpr DTypeInfo kInfo[] = {
    {DType::f64, "f64", 8, 11}, {DType::f32, "f32", 4, 1},  {DType::f16, "f16", 2, 10},
    {DType::bf16, "bf16", 2, 16}, {DType::i64, "i64", 8, 7}, {DType::i32, "i32", 4, 6},
    {DType::i8, "i8", 1, 3},    {DType::u8, "u8", 1, 2},    {DType::boolean, "bool", 1, 9},
};
const DTypeInfo& info(DType t) { return kInfo[static_cast<int>(t)]; }
}  // namespace

std::string_view dtypeName(DType t) { return info(t).name; }
size_t dtypeSize(DType t) { return info(t).size; }

std::optional<DType> dtypeFromName(std::string_view s) {
  for (const auto& i : kInfo)
    if (s == i.name) return i.type;
  return std::nullopt;
}

bool isFloat(DType t) {
  return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16;
}
bool isLowFloat(DType t) { return t == DType::f16 || t == DType::bf16; }
bool isInteger(DType t) {
  return t == DType::i64 || t == DType::i32 || t == DType::i8 || t == DType::u8;
}

double largestFinite(DType t) {
  switch (t) {
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;
    case DType::f64: return 1.7976931348623157e308;
    default: return 3.4028234663852886e38;
  }
}

std::optional<DType> dtypeFromOnnx(int onnxType) {
  for (const auto& i : kInfo)
    if (i.onnx == onnxType) return i.type;
  return std::nullopt;
}
int dtypeToOnnx(DType t) { return info(t).onnx; }

uint16_t floatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // Inf or NaN
    if (absx == 0x7f800000u) return sign | 0x7c00u;
    return sign | 0x7e00u | static_cast<uint16_t>((absx >> 13) & 0x3ffu);  // quiet, keep payload
  }
  const int exp = static_cast<int>(absx >> 23) - 127;  // unbiased
  if (exp > 15) return sign | 0x7c00u;                 // overflow before rounding
  uint32_t mant = absx & 0x7fffffu;
  if (exp >= -14) {  // normal half (may round up into the next binade or to Inf)
    uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);  // h == 0x7c00 is a correct overflow to Inf
  }
  if (exp < -25) return sign;  // below half the smallest subnormal: rounds to zero
  // Subnormal half: value = m * 2^-24 with m = (1.mant) * 2^(exp+24).
  mant |= 0x800000u;                           // implicit bit
  const int shift = -exp - 14 + 13;            // 14..25 -> bits to drop
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // may carry into the smallest normal
  return sign | static_cast<uint16_t>(h);
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t floatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + lsb) >> 16);  // RNE; overflow carries into Inf
}

float bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

}  // namespace ampc
