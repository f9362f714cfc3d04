// f16/bf16 conversions: exhaustive over all 65536 bit patterns, and against independent reference
// conversions on millions of random floats plus the edge cases.
#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compiler/ir/dtype.h"

using namespace ampc;

namespace {

bool halfIsNaN(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
bool bf16IsNaN(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu); }

// Reference float -> f16: the compiler's own _Float16 conversion (libgcc's soft-float, RNE).
uint16_t refHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// Reference float -> bf16 by exact arithmetic in double: scale to an integer number of bf16 ulps,
// round with nearbyint (round-half-even), scale back; then read the bits of the result.
uint16_t refBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  double x = f;
  double ax = std::fabs(x);
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (ax == 0) return sign;
  if (std::isinf(ax)) return sign | 0x7f80;
  int e = std::max(std::ilogb(ax), -126);
  double ulp = std::ldexp(1.0, e - 7);
  double r = std::nearbyint(ax / ulp) * ulp;
  if (r >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  float rf = static_cast<float>(r);  // exact: r has at most 8 significant bits
  return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(rf) >> 16);
}

std::vector<float> edgeCases() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 65536.0f,
                          6.103515625e-05f /* min normal half */, 5.9604645e-08f /* min subnormal */,
                          2.9802322e-08f /* half of it: ties to 0 */, 2.9802326e-08f, 8.940697e-08f,
                          6.097555e-05f, 3.0517578e-05f, 1e-10f, -1e-10f,
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest(),
                          std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          3.3961776e38f, 3.3895314e38f, 1.0039062f, 1.0117188f, 1.00048828125f, 1.00146484375f};
  // Exact halfway points between neighbouring halfs and bf16s, and one float either side.
  for (uint32_t h = 0; h < 0x7c00; h += 37) {
    float a = halfToFloat(static_cast<uint16_t>(h)), b = halfToFloat(static_cast<uint16_t>(h + 1));
    float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
    v.insert(v.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f), -mid});
  }
  for (uint32_t b = 0; b < 0x7f80; b += 41) {
    float lo = bf16ToFloat(static_cast<uint16_t>(b)), hi = bf16ToFloat(static_cast<uint16_t>(b + 1));
    float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    v.insert(v.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e38f), -mid});
  }
  return v;
}

}  // namespace

TEST(DType, HalfRoundTripsAllBitPatterns) {
  int nans = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t h = static_cast<uint16_t>(i);
    float f = halfToFloat(h);
    uint16_t back = floatToHalf(f);
    if (halfIsNaN(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(back, h | 0x200u) << std::hex << i;  // quieted, payload and sign kept
      ++nans;
    } else {
      ASSERT_EQ(back, h) << std::hex << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(static_cast<float>(std::bit_cast<_Float16>(h)))) << std::hex << i;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(DType, Bf16RoundTripsAllBitPatterns) {
  for (uint32_t i = 0; i < 65536; ++i) {
    uint16_t b = static_cast<uint16_t>(i);
    float f = bf16ToFloat(b);
    uint16_t back = floatToBf16(f);
    if (bf16IsNaN(b)) {
      ASSERT_TRUE(std::isnan(f));
      ASSERT_EQ(back, b | 0x40u) << std::hex << i;
    } else {
      ASSERT_EQ(back, b) << std::hex << i;
    }
  }
}

TEST(DType, HalfSpecialValues) {
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65519.99f), 0x7bff);  // below the rounding threshold
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);   // ties to even: overflows to Inf
  EXPECT_EQ(floatToHalf(5.9604645e-08f), 0x0001);
  EXPECT_EQ(floatToHalf(2.9802322e-08f), 0x0000);  // exactly half the smallest subnormal
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(halfIsNaN(floatToHalf(std::nanf(""))));
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0x0001), 5.9604645e-08f);
  EXPECT_EQ(floatToBf16(1.00390625f), 0x3f80);  // tie to even (down)
  EXPECT_EQ(floatToBf16(1.01171875f), 0x3f82);  // tie to even (up)
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(bf16IsNaN(floatToBf16(std::nanf(""))));
}

TEST(DType, FloatToHalfMatchesReferenceOnRandomFloats) {
  std::fesetround(FE_TONEAREST);
  std::mt19937 rng(std::random_device{}());
  auto check = [](float f) {
    uint16_t got = floatToHalf(f), want = refHalf(f);
    if (std::isnan(f)) ASSERT_TRUE(halfIsNaN(got));
    else ASSERT_EQ(got, want) << "f=" << f << " bits=" << std::hex << std::bit_cast<uint32_t>(f);
  };
  for (float f : edgeCases()) check(f);
  // 4M random bit patterns (all exponents) and 4M floats in half's range, where rounding matters.
  std::uniform_real_distribution<float> inRange(-70000.0f, 70000.0f);
  std::uniform_int_distribution<int> expo(-30, 17);
  for (int i = 0; i < 4'000'000; ++i) {
    check(std::bit_cast<float>(static_cast<uint32_t>(rng())));
    float f = std::ldexp(inRange(rng) / 70000.0f, expo(rng));
    check(f);
  }
}

TEST(DType, FloatToBf16MatchesReferenceOnRandomFloats) {
  std::mt19937 rng(std::random_device{}());
  auto check = [](float f) {
    uint16_t got = floatToBf16(f), want = refBf16(f);
    if (std::isnan(f)) ASSERT_TRUE(bf16IsNaN(got));
    else ASSERT_EQ(got, want) << "f=" << f << " bits=" << std::hex << std::bit_cast<uint32_t>(f);
  };
  for (float f : edgeCases()) check(f);
  for (int i = 0; i < 4'000'000; ++i) check(std::bit_cast<float>(static_cast<uint32_t>(rng())));
}

TEST(DType, NamesAndOnnxTypes) {
  for (DType t : kAllDTypes) {
    EXPECT_EQ(dtypeFromName(dtypeName(t)), t);
    EXPECT_EQ(dtypeFromOnnx(dtypeToOnnx(t)), t);
  }
  EXPECT_FALSE(dtypeFromOnnx(8).has_value());  // ONNX STRING
  EXPECT_EQ(dtypeSize(DType::bf16), 2u);
  EXPECT_TRUE(isLowFloat(DType::f16));
  EXPECT_FALSE(isFloat(DType::i64));
}
