// The device training-step kernels against the CPU backend's train-step ops, on fresh random
// parameter and gradient lists (sizes that straddle chunk boundaries): unscale + finite check +
// global norm, clip fused into SGD (Nesterov) and AdamW, the step counter, a cosine schedule and
// the dynamic scaler; and an overflow step that leaves every parameter and state bitwise as it was.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "compiler/ir/text.h"
#include "kernels/cuda/train.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

const std::vector<int64_t> kSizes = {1, 7, 16384 + 3, 100000};

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  cudaMalloc(&d, sizeof(T) * v.size() + 16);
  cudaMemcpy(d, v.data(), sizeof(T) * v.size(), cudaMemcpyHostToDevice);
  return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), d, sizeof(T) * n, cudaMemcpyDeviceToHost);
  return v;
}

std::vector<float> randomVec(std::mt19937& rng, int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng) * scale;
  return v;
}

enum class Opt { Sgd, AdamW, Lamb };

// The CPU step graph for the same tensors.
std::string cpuGraph(Opt opt) {
  const bool adam = opt != Opt::Sgd;
  std::ostringstream s;
  s << "graph \"t\" opset 17 {\n  domain \"ampc\" 1\n";
  for (size_t i = 0; i < kSizes.size(); ++i) {
    s << "  param %p" << i << " : f32[" << kSizes[i] << "]\n  param %g" << i << " : f32[" << kSizes[i] << "]\n";
    s << "  param %a" << i << " : f32[" << kSizes[i] << "]\n  param %b" << i << " : f32[" << kSizes[i] << "]\n";
  }
  s << "  param %scale : f32[]\n  param %growth : i64[]\n  param %hyst : i64[]\n  param %step : i64[]\n";
  s << "  %inv : f32[] = Reciprocal(%scale)\n  ";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "%u" << i << " : f32[" << kSizes[i] << "], ";
  s << "%found : bool[] = ampc::UnscaleCheck(%inv";
  for (size_t i = 0; i < kSizes.size(); ++i) s << ", %g" << i;
  s << ")\n  ";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "%c" << i << " : f32[" << kSizes[i] << "], ";
  s << "%norm : f32[] = ampc::ClipByGlobalNorm(%found";
  for (size_t i = 0; i < kSizes.size(); ++i) s << ", %u" << i;
  s << ") {max_norm = 50.0}\n";
  s << "  %s2 : i64[] = ampc::StepIncrement(%step, %found)\n";
  s << "  %lr : f32[] = ampc::LearningRate(%s2) {lr = 0.01, schedule = \"cosine\", total = 10, warmup = 2}\n";
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const std::string t = "f32[" + std::to_string(kSizes[i]) + "]";
    if (adam)
      s << "  %q" << i << " : " << t << ", %x" << i << " : " << t << ", %y" << i << " : " << t << " = ampc::Adam(%p" << i << ", %c" << i
        << ", %a" << i << ", %b" << i << ", %lr, %s2, %found) {"
        << (opt == Opt::Lamb ? "lamb = 1" : "decoupled = 1") << ", weight_decay = 0.01}\n";
    else
      s << "  %q" << i << " : " << t << ", %x" << i << " : " << t << " = ampc::SGD(%p" << i << ", %c" << i << ", %a" << i
        << ", %lr, %found) {momentum = 0.9, nesterov = 1, weight_decay = 0.001}\n";
  }
  s << "  %sc : f32[], %gr : i64[], %hy : i64[] = ampc::ScalerUpdate(%scale, %growth, %hyst, %found) {growth_interval = 2, hysteresis = 1}\n";
  s << "  output %norm\n  output %sc\n  output %s2\n  output %lr\n";
  for (size_t i = 0; i < kSizes.size(); ++i) s << "  output %q" << i << "\n  output %x" << i << "\n" << (adam ? "  output %y" + std::to_string(i) + "\n" : "");
  s << "}\n";
  return s.str();
}

double relL2(const std::vector<float>& a, const Tensor& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double y = b.getDouble(static_cast<int64_t>(i));
    num += (a[i] - y) * (a[i] - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

void runCase(Opt opt, bool overflow) {
  const bool adam = opt != Opt::Sgd;
  std::mt19937 rng(std::random_device{}());
  const size_t n = kSizes.size();
  std::vector<std::vector<float>> p, g, a, b;
  for (size_t i = 0; i < n; ++i) {
    p.push_back(randomVec(rng, kSizes[i], 1.0f));
    g.push_back(randomVec(rng, kSizes[i], 256.0f));  // scaled by S = 256
    a.push_back(adam ? randomVec(rng, kSizes[i], 0.01f) : randomVec(rng, kSizes[i], 0.1f));
    std::vector<float> v = randomVec(rng, kSizes[i], 0.01f);
    for (auto& x : v) x = x * x;  // second moments are non-negative
    b.push_back(v);
  }
  if (overflow) g[2][12345] = INFINITY;
  const float scale0 = 256.0f;
  const int64_t step0 = 3;
  // CPU reference.
  auto graph = parseGraph(cpuGraph(opt), "t");
  for (size_t i = 0; i < n; ++i) {
    auto set = [&](const std::string& name, const std::vector<float>& v) {
      Tensor t(TensorType{DType::f32, {kSizes[i]}});
      std::memcpy(t.data.data(), v.data(), t.data.size());
      graph->lookup(name + std::to_string(i))->setData(std::move(t));
    };
    set("p", p[i]);
    set("g", g[i]);
    set("a", a[i]);
    set("b", b[i]);
  }
  graph->lookup("scale")->setData(Tensor::fromDoubles(DType::f32, {}, {scale0}));
  graph->lookup("growth")->setData(Tensor::fromInts(DType::i64, {}, {1}));
  graph->lookup("hyst")->setData(Tensor::fromInts(DType::i64, {}, {1}));
  graph->lookup("step")->setData(Tensor::fromInts(DType::i64, {}, {step0}));
  auto backend = createCpuBackend();
  auto want = evaluate(*graph, {}, *backend);

  // GPU.
  std::vector<float*> dp, dg, da, db;
  for (size_t i = 0; i < n; ++i) {
    dp.push_back(upload(p[i]));
    dg.push_back(upload(g[i]));
    da.push_back(upload(a[i]));
    db.push_back(upload(b[i]));
  }
  float** P = upload(dp);
  float** G = upload(dg);
  float** A = upload(da);
  float** B = upload(db);
  cuda::StepState s{upload(std::vector<float>{scale0}), upload(std::vector<int64_t>{1}), upload(std::vector<int64_t>{1}),
                    upload(std::vector<int64_t>{step0}), upload(std::vector<float>{0}), upload(std::vector<int>{0}),
                    upload(std::vector<double>{0})};
  cuda::TensorList list(kSizes);
  CUDA_OK(cuda::unscaleCheckNorm(list, G, s, nullptr));
  CUDA_OK(cuda::stepAndLr(s, 0.01f, 2, 2, 10, nullptr));
  double* norms = upload(std::vector<double>(2 * n, 0.0));
  if (opt == Opt::AdamW) CUDA_OK(cuda::adamStep(list, P, G, A, B, s, 50.0f, 0.9f, 0.999f, 1e-8f, 0.01f, true, nullptr));
  else if (opt == Opt::Lamb) CUDA_OK(cuda::lambStep(list, P, G, A, B, s, 50.0f, 0.9f, 0.999f, 1e-8f, 0.01f, norms, static_cast<int>(n), nullptr));
  else CUDA_OK(cuda::sgdStep(list, P, G, A, s, 50.0f, 0.9f, 0.001f, true, nullptr));
  CUDA_OK(cuda::scalerUpdate(s, 2.0f, 0.5f, 2, 1, 0.0f, 0.0f, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  const int found = download(s.foundInf, 1)[0];
  EXPECT_EQ(found, overflow ? 1 : 0);
  const double norm = std::sqrt(download(s.normSq, 1)[0]);
  if (!overflow) {
    EXPECT_NEAR(norm, want[0].getDouble(0), 1e-6 * want[0].getDouble(0));
  }
  EXPECT_EQ(download(s.scale, 1)[0], static_cast<float>(want[1].getDouble(0)));
  EXPECT_EQ(download(s.step, 1)[0], want[2].getInt(0));
  EXPECT_FLOAT_EQ(download(s.lr, 1)[0], static_cast<float>(want[3].getDouble(0)));
  const size_t perTensor = adam ? 3 : 2;
  for (size_t i = 0; i < n; ++i) {
    auto gp = download(dp[i], p[i].size()), ga = download(da[i], a[i].size()), gb = download(db[i], b[i].size());
    if (overflow) {  // bitwise unchanged
      EXPECT_EQ(gp, p[i]) << i;
      EXPECT_EQ(ga, a[i]) << i;
      EXPECT_EQ(gb, b[i]) << i;
      continue;
    }
    EXPECT_LE(relL2(gp, want[4 + perTensor * i]), 1e-6) << "param " << i;
    EXPECT_LE(relL2(ga, want[5 + perTensor * i]), 1e-6) << "state " << i;
    if (adam) {
      EXPECT_LE(relL2(gb, want[6 + perTensor * i]), 1e-6) << "second moment " << i;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    cudaFree(dp[i]);
    cudaFree(dg[i]);
    cudaFree(da[i]);
    cudaFree(db[i]);
  }
  cudaFree(norms);
  for (void* x : {static_cast<void*>(P), static_cast<void*>(G), static_cast<void*>(A), static_cast<void*>(B), static_cast<void*>(s.scale),
                  static_cast<void*>(s.growth), static_cast<void*>(s.hysteresis), static_cast<void*>(s.step), static_cast<void*>(s.lr),
                  static_cast<void*>(s.foundInf), static_cast<void*>(s.normSq)})
    cudaFree(x);
}

}  // namespace

TEST(GpuTrainStep, SgdNesterovMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::Sgd, false);
}
TEST(GpuTrainStep, AdamWMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::AdamW, false);
}
TEST(GpuTrainStep, LambMatchesCpu) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  runCase(Opt::Lamb, false);
}
TEST(GpuTrainStep, OverflowSkipsBitwise) {
  if (!haveGpu()) GTEST_SKIP() << "no CUDA GPU";
  for (Opt o : {Opt::Sgd, Opt::AdamW, Opt::Lamb}) runCase(o, true);
}
