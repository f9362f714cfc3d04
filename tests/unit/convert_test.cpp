// cpu::convert: buffer conversions between float dtypes, including f64 -> f16/bf16 rounded once.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/convert.h"

using namespace ampc;

TEST(CpuConvert, F32ToLowMatchesScalar) {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> src(100000);
  for (auto& f : src) f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  std::vector<uint16_t> h(src.size()), b(src.size());
  cpu::convert(src.data(), DType::f32, h.data(), DType::f16, src.size());
  cpu::convert(src.data(), DType::f32, b.data(), DType::bf16, src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i], floatToHalf(src[i]));
    ASSERT_EQ(b[i], floatToBf16(src[i]));
  }
}

TEST(CpuConvert, F64ToHalfRoundsOnce) {
  // 1 + 2^-11 + 2^-40 lies just above the halfway point between half(1) and half(1+2^-10):
  // rounding straight from f64 goes up; rounding through f32 first would tie to even (down).
  double d = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  uint16_t h;
  cpu::convert(&d, DType::f64, &h, DType::f16, 1);
  EXPECT_EQ(h, 0x3c01);
  // Random doubles: the f16 result is the nearest half (ties impossible at this precision).
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(-60000.0, 60000.0);
  for (int i = 0; i < 100000; ++i) {
    double x = u(rng);
    uint16_t r;
    cpu::convert(&x, DType::f64, &r, DType::f16, 1);
    double got = halfToFloat(r);
    double below = halfToFloat(static_cast<uint16_t>(r - 1)), above = halfToFloat(static_cast<uint16_t>(r + 1));
    ASSERT_LE(std::fabs(got - x), std::fabs(below - x)) << x;
    ASSERT_LE(std::fabs(got - x), std::fabs(above - x)) << x;
  }
}

TEST(CpuConvert, LowToF32IsExact) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(all.size());
  cpu::convert(all.data(), DType::bf16, out.data(), DType::f32, all.size());
  for (uint32_t i = 0; i < 65536; ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(bf16ToFloat(all[i])));
}
