// The CPU reference of the CUDA target's epilogue nodes (the lowering rewrites of runtime/lower.cpp:
// fuse-norm-epilogue, fuse-relu-grad, fuse-dropout-residual, keep-loss-stats): each runs the unfused op's kernel and
// then the ops the rewrite took in, with their roundings, so that a fused graph computes exactly
// what the unfused one did (tests/unit/target_passes_test.cpp checks bit equality).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "compiler/target.h"
#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

Kernel base(const KernelCtx& c, const char* op, const char* domain) {
  Kernel k = findKernel(op, domain);
  if (!k) c.fail(std::string("no kernel for ") + op);
  return k;
}

// Runs kernel k on inputs `ins` into the node's first `results` results.
void runOn(KernelCtx& c, Kernel k, const std::vector<const Tensor*>& ins, size_t results) {
  std::vector<Tensor> outs;
  for (size_t r = 0; r < results; ++r) outs.push_back(std::move(c.out(r)));
  KernelCtx inner(c.node, ins, outs, c.opts);
  k(inner);
  for (size_t r = 0; r < results; ++r) c.out(r) = std::move(outs[r]);
}

// y = relu(round(y + r)) in place, as Add (f32 arithmetic for f32/f16/bf16, f64 for f64) and then
// Relu would compute it; either step may be absent.
template <typename C>
void epilogue(Tensor& y, const Tensor* r, bool relu) {
  auto v = widen<C>(y);
  if (r) {
    const auto rv = widen<C>(*r);
    for (size_t i = 0; i < v.size(); ++i) v[i] += rv[i];
    narrow(v, y);
    if (!relu) return;
    v = widen<C>(y);
  }
  if (relu)
    for (C& x : v) x = x > 0 ? x : (x != x ? x : C(0));
  narrow(v, y);
}
void epilogue(Tensor& y, const Tensor* r, bool relu) {
  if (y.type.dtype == DType::f64) epilogue<double>(y, r, relu);
  else epilogue<float>(y, r, relu);
}

// cuda::BatchNormalization(X, scale, B, mean, var[, r]) {residual, relu}.
void batchNormKernel(KernelCtx& c) {
  base(c, "BatchNormalization", "")(c);
  const bool residual = c.node.getInt("residual", 0) != 0;
  if (residual && !c.has(5)) c.fail("residual = 1 needs input 5");
  epilogue(c.out(0), residual ? &c.in(5) : nullptr, c.node.getInt("relu", 0) != 0);
}

// cuda::LayerNormGrad(dY, X, scale, r) {residual}: dX + r.
void layerNormGradKernel(KernelCtx& c) {
  base(c, "LayerNormGrad", "ampc")(c);
  if (c.node.getInt("residual", 0) != 0) epilogue(c.out(0), &c.in(3), false);
}

// cuda::BatchNormGrad(dz, X, scale, mean, var, y) {gate}: BatchNormGrad of Where(y > 0, dz, 0).
void batchNormGradKernel(KernelCtx& c) {
  Kernel k = base(c, "BatchNormGrad", "ampc");
  if (c.node.getInt("gate", 0) == 0) return k(c);
  const Tensor& dz = c.in(0);
  const Tensor& y = c.in(5);
  Tensor dy = dz;
  const size_t e = dtypeSize(dz.type.dtype);
  uint8_t* p = dy.data.data();
  for (int64_t i = 0; i < dy.numel(); ++i)
    if (!(y.getDouble(i) > 0.0)) std::memset(p + i * e, 0, e);
  runOn(c, k, {&dy, &c.in(1), &c.in(2), &c.in(3), &c.in(4)}, c.numOutputs());
}

// cuda::Dropout(X, ratio, training_mode, r) {stream}: r + widen(Dropout(X)) (f32), and the mask.
void dropoutKernel(KernelCtx& c) {
  const Tensor& r = c.in(3);
  std::vector<const Tensor*> ins = {&c.in(0), c.has(1) ? &c.in(1) : nullptr, c.has(2) ? &c.in(2) : nullptr};
  while (!ins.empty() && !ins.back()) ins.pop_back();
  std::vector<Tensor> outs = {Tensor(TensorType{c.in(0).type.dtype, c.in(0).type.shape})};
  if (c.numOutputs() > 1) outs.push_back(std::move(c.out(1)));
  KernelCtx inner(c.node, ins, outs, c.opts);
  base(c, "Dropout", "")(inner);
  if (c.numOutputs() > 1) c.out(1) = std::move(outs[1]);
  const auto y = widen<float>(outs[0]);  // the Cast to f32: exact
  auto s = widen<float>(r);
  for (size_t i = 0; i < s.size(); ++i) s[i] += y[i];
  narrow(s, c.out(0));
}


// cuda::SoftmaxCrossEntropyLoss(scores [rows, C], labels[, weights]): the loss, and each row's max
// and sum of exp(x - max) as result 1 (0 for a row of -inf), which only the CUDA gradient reads.
void lossKernel(KernelCtx& c) {
  runOn(c, base(c, "SoftmaxCrossEntropyLoss", ""), {&c.in(0), &c.in(1), c.has(2) ? &c.in(2) : nullptr}, 1);
  const Tensor& x = c.in(0);
  const int64_t rows = x.type.shape[0], C = x.type.shape[1];
  const auto v = widen<double>(x);
  Tensor& stats = c.out(1);
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t k = 0; k < C; ++k) m = std::max(m, v[static_cast<size_t>(r * C + k)]);
    if (m != -INFINITY)
      for (int64_t k = 0; k < C; ++k) s += std::exp(v[static_cast<size_t>(r * C + k)] - m);
    stats.setDouble(2 * r, m);
    stats.setDouble(2 * r + 1, s);
  }
}

// cuda::SoftmaxCrossEntropyLossGrad(dL, scores, labels, stats[, weights]): the gradient, from the
// scores as before (the statistics save the CUDA kernel a pass).
void lossGradKernel(KernelCtx& c) {
  runOn(c, base(c, "SoftmaxCrossEntropyLossGrad", "ampc"), {&c.in(0), &c.in(1), &c.in(2), c.has(4) ? &c.in(4) : nullptr}, 1);
}

}  // namespace

void registerTargetKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"BatchNormalization", batchNormKernel, kCudaDomain},
      {"BatchNormGrad", batchNormGradKernel, kCudaDomain},
      {"LayerNormGrad", layerNormGradKernel, kCudaDomain},
      {"Dropout", dropoutKernel, kCudaDomain},
      {"SoftmaxCrossEntropyLoss", lossKernel, kCudaDomain},
      {"SoftmaxCrossEntropyLossGrad", lossGradKernel, kCudaDomain},
  });
}

}  // namespace ampc::cpu
