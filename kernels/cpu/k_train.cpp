// Kernels of the training step's ops. Every update is predicated on found_inf: a skipped step
// copies its inputs through bitwise.
#include <cmath>
#include <cstring>

#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"

namespace ampc::cpu {
namespace {

bool foundInf(const Tensor& t) { return t.data[0] != 0; }

// UnscaleCheck(inv_scale, g1..gn) -> g_i * inv_scale, found_inf (any Inf/NaN among the results).
void unscaleCheck(KernelCtx& c) {
  const float inv = static_cast<float>(c.in(0).getDouble(0));
  bool bad = false;
  for (size_t i = 1; i < c.numInputs(); ++i) {
    auto g = widen<float>(c.in(i));
    for (auto& v : g) {
      v *= inv;
      bad |= !std::isfinite(v);
    }
    narrow(g, c.out(i - 1));
  }
  c.out(c.numInputs() - 1).data[0] = bad;
}

// ClipByGlobalNorm(found_inf, g1..gn) {max_norm}: the global L2 norm of the gradients, and the
// gradients scaled by max_norm / (norm + 1e-6) when that is below 1 (PyTorch's clip_grad_norm_).
void clipByGlobalNorm(KernelCtx& c) {
  const double maxNorm = c.node.getFloat("max_norm", 0.0f);
  double sq = 0;
  std::vector<std::vector<float>> g;
  for (size_t i = 1; i < c.numInputs(); ++i) {
    g.push_back(widen<float>(c.in(i)));
    for (float v : g.back()) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double coef = maxNorm > 0 && !foundInf(c.in(0)) ? std::min(1.0, maxNorm / (norm + 1e-6)) : 1.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (coef < 1.0)
      for (auto& v : g[i]) v = static_cast<float>(v * coef);
    narrow(g[i], c.out(i));
  }
  c.out(g.size()).setDouble(0, norm);
}

// The counters never wrap: a step count or growth tracker at the end of int64 is an error naming
// the node (a checkpoint's counters are range-checked before they load: runtime/checkpoint.cpp).
void stepIncrement(KernelCtx& c) {
  int64_t next = 0;
  if (__builtin_add_overflow(c.in(0).getInt(0), foundInf(c.in(1)) ? 0 : 1, &next)) c.fail("the step count leaves int64");
  c.out(0).setInt(0, next);
}

// LearningRate(step) for the 1-based step about to be taken: constant; linear-warmup (lr * step /
// warmup until warmup, then lr); cosine (the warmup, then lr/2 (1 + cos(pi (step - warmup) /
// (total - warmup))), reaching 0 at total); linear (the warmup, then lr (total - step) / (total -
// warmup), reaching 0 at total: transformers' default schedule).
void learningRate(KernelCtx& c) {
  const double lr = c.node.getFloat("lr", 0.01f);
  const std::string s = c.node.getString("schedule", "constant");
  const double warmup = static_cast<double>(c.node.getInt("warmup", 0)), total = static_cast<double>(c.node.getInt("total", 0));
  const double t = static_cast<double>(std::max<int64_t>(c.in(0).getInt(0), 1));
  double r = lr;
  if (s != "constant" && warmup > 0 && t < warmup) r = lr * t / warmup;
  else if (s == "cosine" && total > warmup) r = 0.5 * lr * (1 + std::cos(M_PI * std::min(1.0, (t - warmup) / (total - warmup))));
  else if (s == "linear" && total > warmup) r = lr * std::max(0.0, (total - t) / (total - warmup));
  c.out(0).setDouble(0, r);
}

// Copies inputs [0, n) to outputs [0, n) (a skipped step).
void passThrough(KernelCtx& c, size_t n) {
  for (size_t i = 0; i < n; ++i) c.out(i).data = c.in(i == 0 ? 0 : i + 1).data;
}

// SGD (PyTorch's): d = g + wd p; buf = momentum buf + d; d = nesterov ? d + momentum buf : buf
// (momentum 0: d); p -= lr d.
void sgd(KernelCtx& c) {
  const bool hasBuf = c.has(2);  // without momentum there is no buffer (and one result)
  if (foundInf(c.in(4))) return passThrough(c, hasBuf ? 2 : 1);
  const float mom = c.node.getFloat("momentum", 0.0f), wd = c.node.getFloat("weight_decay", 0.0f);
  const bool nesterov = c.node.getInt("nesterov", 0) != 0;
  const float lr = static_cast<float>(c.in(3).getDouble(0));
  auto p = widen<float>(c.in(0)), g = widen<float>(c.in(1));
  std::vector<float> buf = hasBuf ? widen<float>(c.in(2)) : std::vector<float>();
  if (mom != 0.0f && !hasBuf) c.fail("momentum needs a momentum buffer");  // a graph not run through the shape rules
  for (size_t i = 0; i < p.size(); ++i) {
    float d = g[i] + wd * p[i];
    if (mom != 0.0f) {
      buf[i] = mom * buf[i] + d;
      d = nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
  narrow(p, c.out(0));
  if (hasBuf) narrow(buf, c.out(1));
}

// Adam / AdamW (PyTorch's), and LAMB with attribute lamb = 1: decoupled ? p *= 1 - lr wd : g += wd p; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
void adam(KernelCtx& c) {
  if (foundInf(c.in(6))) return passThrough(c, 3);
  const float b1 = c.node.getFloat("beta1", 0.9f), b2 = c.node.getFloat("beta2", 0.999f), eps = c.node.getFloat("eps", 1e-8f);
  const float wd = c.node.getFloat("weight_decay", 0.0f);
  const bool decoupled = c.node.getInt("decoupled", 0) != 0;
  const float lr = static_cast<float>(c.in(4).getDouble(0));
  const double t = static_cast<double>(c.in(5).getInt(0));
  const float bc1 = static_cast<float>(1 - std::pow(static_cast<double>(b1), t));
  const float bc2 = static_cast<float>(1 - std::pow(static_cast<double>(b2), t));
  const float stepSize = lr / bc1, bc2Sqrt = std::sqrt(bc2);
  auto p = widen<float>(c.in(0)), g = widen<float>(c.in(1)), m = widen<float>(c.in(2)), v = widen<float>(c.in(3));
  if (c.node.getInt("lamb", 0)) {
    // LAMB (You et al. 2020): u = m^ / (sqrt(v^) + eps) + wd p; p -= lr * (||p|| / ||u||) u, the
    // trust ratio from the unscaled gradients' moments (1 when either norm is 0).
    std::vector<float> u(p.size());
    double pn = 0, un = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      u[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * p[i];
      pn += static_cast<double>(p[i]) * p[i];
      un += static_cast<double>(u[i]) * u[i];
    }
    const float trust = pn > 0 && un > 0 ? static_cast<float>(std::sqrt(pn) / std::sqrt(un)) : 1.0f;
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * trust * u[i];
  } else {
    for (size_t i = 0; i < p.size(); ++i) {
      float gi = g[i];
      if (decoupled) p[i] *= 1 - lr * wd;
      else gi += wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] -= stepSize * m[i] / (std::sqrt(v[i]) / bc2Sqrt + eps);
    }
  }
  narrow(p, c.out(0));
  narrow(m, c.out(1));
  narrow(v, c.out(2));
}

// ScalerUpdate (PyTorch's GradScaler, plus hysteresis and bounds): on a finite step the growth
// tracker counts up and the scale grows by growth_factor every growth_interval steps, and the
// hysteresis budget refills; on an overflow the tracker resets and the budget drops by one, and
// the scale backs off once the budget is spent. The scale stays within [min_scale, max_scale].
void scalerUpdate(KernelCtx& c) {
  const double growth = c.node.getFloat("growth_factor", 2.0f), backoff = c.node.getFloat("backoff_factor", 0.5f);
  const int64_t interval = c.node.getInt("growth_interval", 2000), hysteresis = c.node.getInt("hysteresis", 1);
  const double lo = c.node.getFloat("min_scale", 0.0f), hi = c.node.getFloat("max_scale", 0.0f);
  double scale = c.in(0).getDouble(0);
  int64_t tracker = c.in(1).getInt(0), left = c.in(2).getInt(0);
  if (foundInf(c.in(3))) {
    tracker = 0;
    left = std::max<int64_t>(left - 1, 0);
    if (left == 0) scale *= backoff;
  } else {
    left = hysteresis;
    if (__builtin_add_overflow(tracker, 1, &tracker)) c.fail("the growth tracker leaves int64");
    if (tracker >= interval) {
      scale *= growth;
      tracker = 0;
    }
  }
  if (lo > 0) scale = std::max(scale, lo);
  if (hi > 0) scale = std::min(scale, hi);
  c.out(0).setDouble(0, scale);
  c.out(1).setInt(0, tracker);
  c.out(2).setInt(0, left);
}

// AllReduce(x1..xn) {reduction: mean}: the inputs packed into one buffer, summed across the group
// in one collective (so the loss, the gradients and the overflow they carry travel together), then
// divided by the group's size. A group of one (or none) copies its inputs through.
void allReduce(KernelCtx& c) {
  Collective* group = c.opts.collective;
  if (!group || group->world() == 1) {
    for (size_t i = 0; i < c.numInputs(); ++i) c.out(i) = c.in(i);
    return;
  }
  std::vector<float> buf;
  std::vector<size_t> at;
  for (size_t i = 0; i < c.numInputs(); ++i) {
    at.push_back(buf.size());
    auto x = widen<float>(c.in(i));
    buf.insert(buf.end(), x.begin(), x.end());
  }
  try {
    group->allReduceSum(buf.data(), buf.size());
  } catch (const Error& e) {
    c.fail(e.what());
  }
  const auto n = static_cast<float>(group->world());
  for (auto& v : buf) v /= n;
  for (size_t i = 0; i < c.numInputs(); ++i) {
    const auto first = buf.begin() + static_cast<std::ptrdiff_t>(at[i]);
    narrow(std::vector<float>(first, first + c.in(i).numel()), c.out(i));
  }
}

}  // namespace

void registerTrainKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"UnscaleCheck", unscaleCheck, "ampc"}, {"ClipByGlobalNorm", clipByGlobalNorm, "ampc"},
      {"StepIncrement", stepIncrement, "ampc"}, {"LearningRate", learningRate, "ampc"},
      {"SGD", sgd, "ampc"}, {"Adam", adam, "ampc"}, {"ScalerUpdate", scalerUpdate, "ampc"},
      {"AllReduce", allReduce, "ampc"},
  });
}

}  // namespace ampc::cpu
