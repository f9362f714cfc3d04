// GPU casts agree bit for bit with the CPU reference conversions: all 65536 f16/bf16 patterns
// widen identically, and millions of random floats (plus edge cases) narrow identically.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "compiler/ir/dtype.h"
#include "kernels/cpu/convert.h"
#include "kernels/cuda/convert.h"

using namespace ampc;

namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

template <typename T>
struct DeviceBuf {
  T* p = nullptr;
  explicit DeviceBuf(size_t n) { cudaMalloc(&p, n * sizeof(T) + 16); }
  ~DeviceBuf() { cudaFree(p); }
};

bool isNaNBits16(uint16_t v, bool bf) { return bf ? ((v & 0x7f80) == 0x7f80 && (v & 0x7f)) : ((v & 0x7c00) == 0x7c00 && (v & 0x3ff)); }

}  // namespace

TEST(GpuConvert, WideningAllBitPatterns) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  DeviceBuf<uint16_t> d(all.size());
  DeviceBuf<float> f(all.size());
  CUDA_OK(cudaMemcpy(d.p, all.data(), all.size() * 2, cudaMemcpyHostToDevice));
  for (bool bf : {false, true}) {
    CUDA_OK(bf ? cuda::bf16ToF32(d.p, f.p, all.size(), nullptr) : cuda::f16ToF32(d.p, f.p, all.size(), nullptr));
    std::vector<float> got(all.size()), want(all.size());
    CUDA_OK(cudaMemcpy(got.data(), f.p, got.size() * 4, cudaMemcpyDeviceToHost));
    cpu::convert(all.data(), bf ? DType::bf16 : DType::f16, want.data(), DType::f32, all.size());
    for (size_t i = 0; i < all.size(); ++i) {
      if (std::isnan(want[i])) ASSERT_TRUE(std::isnan(got[i])) << i;
      else ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << (bf ? "bf16 " : "f16 ") << i;
    }
  }
}

TEST(GpuConvert, NarrowingMatchesCpuOnRandomAndEdgeFloats) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  std::mt19937 rng(std::random_device{}());
  const size_t n = 8'000'000 + 3;  // odd length: exercises the vector path's tail
  std::vector<float> src(n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> e(-30, 17);
  for (size_t i = 0; i < n; ++i) src[i] = (i % 2) ? std::bit_cast<float>(static_cast<uint32_t>(rng())) : std::ldexp(u(rng), e(rng));
  const float edges[] = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 5.9604645e-08f, 2.9802322e-08f, 1.00390625f,
                         1.01171875f, 3.4028235e38f, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < std::size(edges); ++i) src[i] = edges[i];
  DeviceBuf<float> ds(n);
  DeviceBuf<uint16_t> dd(n);
  for (int offset : {0, 1}) {  // aligned (vector loads) and misaligned (scalar path)
    CUDA_OK(cudaMemcpy(ds.p + offset, src.data(), n * 4, cudaMemcpyHostToDevice));
    for (bool bf : {false, true}) {
      CUDA_OK(bf ? cuda::f32ToBf16(ds.p + offset, dd.p, n, nullptr) : cuda::f32ToF16(ds.p + offset, dd.p, n, nullptr));
      std::vector<uint16_t> got(n), want(n);
      CUDA_OK(cudaMemcpy(got.data(), dd.p, n * 2, cudaMemcpyDeviceToHost));
      cpu::convert(src.data(), DType::f32, want.data(), bf ? DType::bf16 : DType::f16, n);
      size_t mismatches = 0;
      for (size_t i = 0; i < n; ++i) {
        bool ok = isNaNBits16(want[i], bf) ? isNaNBits16(got[i], bf) : got[i] == want[i];
        if (!ok && mismatches++ < 5)
          ADD_FAILURE() << (bf ? "bf16" : "f16") << " offset " << offset << " x=" << src[i] << " gpu=" << std::hex << got[i]
                        << " cpu=" << want[i];
      }
      EXPECT_EQ(mismatches, 0u);
    }
  }
}
