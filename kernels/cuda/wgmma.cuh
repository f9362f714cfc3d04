// Hopper's warpgroup matrix products (wgmma.mma_async, sm_90a only: built where AMPC_WGMMA is
// defined, see kernels/CMakeLists.txt). A warpgroup (4 consecutive warps, 128 threads) computes
// C (64 x N, f32) += A (64 x 16, f16/bf16, in registers or shared memory) B (16 x N, in shared
// memory).
//
// Register layouts (PTX ISA, "Register Fragments"): warp w of the warpgroup holds rows 16 w .. 16 w
// + 15; lane (g, t) = (lane / 4, lane % 4) holds C[16 w + g + 8 r][8 i + 2 t + c] in c[i][2 r + c],
// and A the same as mma.sync.m16n8k16's A fragment. So an accumulator reads and converts like eight
// (or sixteen) m16n8 tiles of mma.sync.
//
// Shared memory (B): 128-byte swizzle. A tile is stored in panels of 64 elements (128 bytes) a
// row; a panel of R rows is R x 128 bytes, and its 16-byte chunk c of row r sits at chunk c ^ (r % 8).
// Every panel starts on 1024 bytes. Stored [n][k] (K-major, trans 0): a k-step of 16 starts 32 bytes
// further within the panel, 8-row groups 1024 bytes apart (SBO). Stored [k][n] (N-major, trans 1):
// a k-step of 16 rows starts 2048 bytes further, 8-row groups 1024 apart (SBO), panels of 64 n
// apart by LBO.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ampc::cuda::wg {

__device__ __forceinline__ uint64_t desc(uint32_t smem, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16 |
         static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;  // 62: 128-byte swizzle
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Shared memory written through the generic proxy (st.shared, cp.async) that wgmma reads next:
// each writing thread, before the barrier.
__device__ __forceinline__ void proxyFence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Pins the accumulators around an asynchronous product: the compiler must neither read them before
// the wait nor move writes past the issue.
template <int N>
__device__ __forceinline__ void pin(float (&c)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(c[i][e])::"memory");
}

// The same for A fragments held in registers: they are read until the wait.
template <int N>
__device__ __forceinline__ void pinA(uint32_t (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// The products, A from registers (a) and B from shared memory (descriptor b), f16 or bf16 in and f32
// accumulated; acc 0: C = A B (the accumulators are not read), else C += A B. TransB: B stored N-major.
// The accumulators' operands: c[i][e] for rows 8 n .. 8 n + 7 of c (AMPC_WGMMA_C8), and their
// names %0 .. %31 (AMPC_WGMMA_R32) and %32 .. %63.
#define AMPC_WGMMA_C1(i) "+f"(c[i][0]), "+f"(c[i][1]), "+f"(c[i][2]), "+f"(c[i][3])
#define AMPC_WGMMA_C8(n) \
  AMPC_WGMMA_C1(8 * n), AMPC_WGMMA_C1(8 * n + 1), AMPC_WGMMA_C1(8 * n + 2), AMPC_WGMMA_C1(8 * n + 3), AMPC_WGMMA_C1(8 * n + 4), \
      AMPC_WGMMA_C1(8 * n + 5), AMPC_WGMMA_C1(8 * n + 6), AMPC_WGMMA_C1(8 * n + 7)
#define AMPC_WGMMA_R32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define AMPC_WGMMA_M64N64(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" AMPC_WGMMA_R32 "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n" \
      : AMPC_WGMMA_C8(0) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TransB))

#define AMPC_WGMMA_M64N128(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" AMPC_WGMMA_R32 ", " \
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, " \
      "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
      : AMPC_WGMMA_C8(0), AMPC_WGMMA_C8(1) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TransB))

template <typename T, int TransB>
__device__ __forceinline__ void mma64(float (&c)[8][4], const uint32_t (&a)[4], uint64_t b, int acc) {  // C 64 x 64
  if constexpr (std::is_same_v<T, __half>) AMPC_WGMMA_M64N64("f16");
  else AMPC_WGMMA_M64N64("bf16");
}
template <typename T, int TransB>
__device__ __forceinline__ void mma128(float (&c)[16][4], const uint32_t (&a)[4], uint64_t b, int acc) {  // C 64 x 128
  if constexpr (std::is_same_v<T, __half>) AMPC_WGMMA_M64N128("f16");
  else AMPC_WGMMA_M64N128("bf16");
}

// The 64 x 64 product with A from shared memory too (descriptor a): TransA, A stored M-major ([k][m],
// as a trans-1 B is stored [k][n]; the same descriptor form), else K-major ([m][k]).
#define AMPC_WGMMA_M64N64_SS(TY) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" AMPC_WGMMA_R32 "}, %32, %33, p, 1, 1, %35, %36;\n}\n" \
      : AMPC_WGMMA_C8(0) \
      : "l"(a), "l"(b), "r"(acc), "n"(TransA), "n"(TransB))
template <typename T, int TransA, int TransB>
__device__ __forceinline__ void mma64ss(float (&c)[8][4], uint64_t a, uint64_t b, int acc) {  // C 64 x 64
  if constexpr (std::is_same_v<T, __half>) AMPC_WGMMA_M64N64_SS("f16");
  else AMPC_WGMMA_M64N64_SS("bf16");
}

#undef AMPC_WGMMA_M64N64
#undef AMPC_WGMMA_M64N128
#undef AMPC_WGMMA_M64N64_SS
#undef AMPC_WGMMA_R32
#undef AMPC_WGMMA_C8
#undef AMPC_WGMMA_C1

}  // namespace ampc::cuda::wg
