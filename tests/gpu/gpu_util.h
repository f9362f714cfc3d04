// Helpers of the GPU tests: the same graph on the CPU reference backend and on the CUDA backend,
// fresh random inputs each time, and the comparison (relative L2 for floats, exact for the rest).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/ir/text.h"
#include "runtime/plan.h"
#include "runtime/cuda/program.h"
#include "runtime/evaluator.h"

namespace ampc::gputest {

inline bool haveGpu() { return cuda::gpuPresent(); }

#define AMPC_NEED_GPU() \
  if (!::ampc::gputest::haveGpu()) GTEST_SKIP() << "no CUDA device"

// Fresh data each run; the seed is printed, and AMPC_GPU_TEST_SEED=N runs a failure's data again
// (inline: one generator for the whole binary).
inline std::mt19937_64& rng() {
  static std::mt19937_64 r([] {
    const char* env = std::getenv("AMPC_GPU_TEST_SEED");
    const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::printf("gpu_tests seed %llu (AMPC_GPU_TEST_SEED)\n", static_cast<unsigned long long>(seed));
    return seed;
  }());
  return r;
}

// Floats ~ N(0, scale) (never all zeros); integers uniform in [lo, hi]; bools fair coins.
inline Tensor randomTensor(const TensorType& t, double scale = 1.0, int64_t lo = 0, int64_t hi = 1) {
  Tensor x(t);
  std::normal_distribution<double> nd(0.0, scale);
  std::uniform_int_distribution<int64_t> ud(lo, hi);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (isFloat(t.dtype)) x.setDouble(i, nd(rng()));
    else x.setInt(i, ud(rng()));
  }
  return x;
}

inline double relL2(const Tensor& got, const Tensor& want, bool& nanMismatch) {
  double num = 0, den = 0;
  nanMismatch = false;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double a = got.getDouble(i), b = want.getDouble(i);
    if (std::isnan(a) != std::isnan(b) || (std::isinf(b) && a != b)) nanMismatch = true;
    if (!std::isfinite(b)) continue;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Relative L2 bound of the GPU against the CPU backend for results stored as `t`: both compute in
// f32 and round once, so only summation order differs (f32), plus one rounding step of the storage
// type where an order difference crosses a rounding boundary (f16, bf16).
inline double tolerance(DType t) { return t == DType::bf16 ? 8e-3 : t == DType::f16 ? 1e-3 : 2e-5; }

// Runs g's outputs on the CPU and on the GPU (outputs poisoned with NaN bytes first) with the same
// inputs and compares them. Integer/bool outputs must be equal. With AMPC_GPU_TEST_DETAIL set, a
// float output over its bound also prints its first elements that differ by more than 5%.
inline void expectSameOnGpu(Graph& g, const std::map<std::string, Tensor>& inputs, const std::string& what, double tolScale = 1.0,
                            const ExecOptions& eo = {}, bool deterministic = false,
                            cuda::ProgramOptions::Attention attention = cuda::ProgramOptions::Attention::automatic,
                            std::vector<std::pair<std::string, std::string>>* attentionPicks = nullptr) {
  auto cpu = createCpuBackend();
  const auto want = evaluate(g, inputs, *cpu, eo);
  recordFolds(g);  // the folds as the CUDA lowering records them
  cuda::ProgramOptions po;
  po.seed = eo.seed;
  po.dropout = eo.dropout;
  po.deterministic = deterministic;
  po.attention = attention;
  cuda::Program prog(g, po);
  for (const Value* v : g.inputs()) prog.upload(v, inputs.at(v->name()));
  for (const Value* v : g.outputs()) {
    if (v->kind() != ValueKind::Param && v->kind() != ValueKind::Const && v->kind() != ValueKind::Input) {
      ASSERT_EQ(cudaMemset(prog.ptr(v), 0xff, v->type().bytes()), cudaSuccess);
    }
  }
  prog.setStep(eo.step);
  prog.run();
  if (attentionPicks) *attentionPicks = prog.attentionPicks();
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const Value* v = g.outputs()[i];
    const Tensor got = prog.download(v);
    if (isFloat(v->type().dtype)) {
      bool nan = false;
      const double err = relL2(got, want[i], nan);
      EXPECT_FALSE(nan) << what << ": output '" << v->name() << "': NaN/Inf where the CPU has none (or the reverse)";
      EXPECT_LE(err, tolerance(v->type().dtype) * tolScale) << what << ": output '" << v->name() << "' (" << v->type().str() << ")";
      if (std::getenv("AMPC_GPU_TEST_DETAIL") && err > tolerance(v->type().dtype) * tolScale) {
        int shown = 0;
        for (int64_t k = 0; k < want[i].numel() && shown < 12; ++k)
          if (std::fabs(got.getDouble(k) - want[i].getDouble(k)) > 0.05 * (std::fabs(want[i].getDouble(k)) + 0.05)) {
            std::printf("  [%lld] got %g want %g\n", static_cast<long long>(k), got.getDouble(k), want[i].getDouble(k));
            ++shown;
          }
      }
    } else {
      int64_t diff = 0;
      for (int64_t k = 0; k < want[i].numel(); ++k) diff += got.getInt(k) != want[i].getInt(k);
      EXPECT_EQ(diff, 0) << what << ": output '" << v->name() << "' (" << v->type().str() << "): " << diff << " elements differ";
    }
  }
}

}  // namespace ampc::gputest
