// Fused attention (ampc.Attention, ampc.AttentionGrad; passes/fuse_attention.cpp). The reference
// of the CUDA kernels: scores and softmax in the compute type (f32 for f16/bf16), the
// probabilities rounded to the storage type before the product with V, and in the backward the
// probabilities and the score gradients rounded likewise (what a tensor-core kernel feeds its
// products). Dropout draws the Dropout op's Philox stream at the scores' flat index.
#include <cmath>
#include <cstring>

#include "compiler/ops/geometry.h"
#include "compiler/target.h"
#include "kernels/cpu/compute.h"
#include "kernels/cpu/families.h"
#include "kernels/cuda/limits.h"

namespace ampc::cpu {
namespace {

struct AttnDims {
  int64_t N = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
  AttentionMaskMap mask;  // which mask slice each batch-head reads (compiler/ops/geometry.h)
  bool zeroEmpty = false;  // zero_empty_rows: rows with every score -inf get probabilities 0
  double floor = -INFINITY;  // score_floor: scores are max(s, floor) (-inf: none)
  double tie = 1.0;          // the gradient's factor on a score equal to the floor (floor_tie)
  bool whereCausal = false;  // where_causal: scores above the diagonal get no gradient (a Where's)
  // The factor on the gradient of a score s (before the floor): 1 above the floor, `tie` at it, 0 below.
  template <typename C>
  C floorGrad(C s) const {
    if (floor == -INFINITY || s > static_cast<C>(floor)) return C(1);
    return s == static_cast<C>(floor) ? static_cast<C>(tie) : C(0);
  }
  // Offset of mask element (i, j) for batch-head n (a row's entries are consecutive in j).
  int64_t maskAt(int64_t n, int64_t i, int64_t j) const {
    const int64_t slice = (n / mask.div) % mask.mod;
    return mask.rows ? (slice * Tq + i) * Tk + j : slice * Tk + j;
  }
};
AttnDims attnDims(const KernelCtx& c, const Tensor& q, const Tensor& kt, const Tensor& v, const Tensor* mask) {
  AttnDims d;
  const auto& qs = q.type.shape;
  const size_t r = qs.size();
  for (size_t i = 0; i + 2 < r; ++i) d.N *= qs[i];
  d.Tq = qs[r - 2];
  d.D = qs[r - 1];
  d.Tk = kt.type.shape[r - 1];
  d.Dv = v.type.shape[r - 1];
  std::string why;
  if (mask && !attentionMaskMap(std::vector<int64_t>(qs.begin(), qs.end() - 2), d.Tq, d.Tk, mask->type.shape, d.mask, &why))
    c.fail("the mask does not broadcast to the scores: " + why);
  d.zeroEmpty = c.node.getInt("zero_empty_rows", 0) != 0;
  d.floor = c.node.getFloat("score_floor", -INFINITY);
  if (!(d.floor <= -1e6)) c.fail("score_floor must be at most -1e6 (or -inf: none), got " + std::to_string(d.floor));
  d.tie = c.node.getFloat("floor_tie", 1.0f);
  if (!(d.tie >= 0.0 && d.tie <= 1.0)) c.fail("floor_tie must be in [0, 1], got " + std::to_string(d.tie));
  const int64_t wc = c.node.getInt("where_causal", 0);
  if (wc != 0 && wc != 1) c.fail("where_causal must be 0 or 1, got " + std::to_string(wc));
  d.whereCausal = wc == 1;
  return d;
}

// x rounded to storage type t (f16/bf16), as a product's operand is.
template <typename C>
C roundTo(DType t, C x) {
  if constexpr (std::is_same_v<C, float>) {
    if (t == DType::f16) return halfToFloat(floatToHalf(x));
    if (t == DType::bf16) return bf16ToFloat(floatToBf16(x));
  }
  return x;
}

struct Dropout {
  float ratio = 0.0f, scale = 1.0f;
  uint64_t seed = 0, step = 0;
  uint32_t key = 0, thr = 0;
  bool on = false;
  Dropout(const KernelCtx& c) {
    ratio = c.node.getFloat("dropout_ratio", 0.0f);
    on = ratio > 0.0f && c.opts.dropout;
    if (ratio < 0.0f || ratio >= 1.0f) c.fail("dropout_ratio must be in [0, 1), got " + std::to_string(ratio));
    scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(ratio)));
    thr = dropoutThreshold(ratio);
    seed = randomSeed(c.node, c.opts.seed);
    step = c.opts.step;
    key = static_cast<uint32_t>(c.node.getInt("dropout_key", 0));
  }
  // The factor on probability element e of the scores: 0 (dropped), 1/(1-ratio), or 1 (off).
  float factor(int64_t e) const {
    if (!on) return 1.0f;
    return dropoutDraw(seed, step, key, static_cast<uint64_t>(e)) >= thr ? scale : 0.0f;
  }
};

// Scores of row i of batch-head n: s_j = scale * q_i . k_j + mask_ij, or with softcap c > 0
// s_j = c tanh(scale * q_i . k_j / c) + mask_ij (and th_j = that tanh, where th is given), then
// max(s_j, score_floor) (raw_j: s_j before it, where raw is given); returns the log-sum-exp.
template <typename C>
C scoresRow(const AttnDims& d, const std::vector<C>& q, const std::vector<C>& kt, const std::vector<C>* mask, C scale, C softcap,
            int64_t n, int64_t i, std::vector<C>& s, std::vector<C>* th = nullptr, std::vector<C>* raw = nullptr) {
  const C* qi = q.data() + (n * d.Tq + i) * d.D;
  const C* k = kt.data() + n * d.D * d.Tk;
  const C* mi = mask ? mask->data() + d.maskAt(n, i, 0) : nullptr;  // the row's mask entries
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t j = 0; j < d.Tk; ++j) {
    C acc = 0;
    for (int64_t x = 0; x < d.D; ++x) acc += qi[x] * k[x * d.Tk + j];
    C x = acc * scale;
    if (softcap > C(0)) {
      const C t = std::tanh(x / softcap);
      if (th) (*th)[j] = t;
      x = softcap * t;
    }
    s[j] = x + (mi ? mi[j] : C(0));
    if (raw) (*raw)[j] = s[j];
    s[j] = std::max(s[j], static_cast<C>(d.floor));
    m = std::max(m, s[j]);
  }
  // zero_empty_rows: no key to attend to, LSE +inf makes every exp(s - LSE) 0 (here and in the
  // backward)
  if (d.zeroEmpty && m == -std::numeric_limits<C>::infinity()) return std::numeric_limits<C>::infinity();
  C l = 0;
  for (int64_t j = 0; j < d.Tk; ++j) l += std::exp(s[j] - m);
  return m + std::log(l);
}

// The factor on exp(s - LSE) that makes row probabilities sum to 1: 1, except in a row whose LSE is
// below cuda::kAttentionFillLse (kernels/cuda/limits.h): a mask's finite fill covers every score
// and the LSE has lost log(l).
template <typename C>
C fillRowNorm(const std::vector<C>& s, C L) {
  if (!(L < static_cast<C>(cuda::kAttentionFillLse)) || L == -std::numeric_limits<C>::infinity()) return C(1);
  C l = 0;
  for (const C v : s) l += std::exp(v - L);
  return C(1) / l;
}

// Attention(Q, KT, V, mask?) -> O, LSE
template <typename C>
struct AttentionK {
  static void run(KernelCtx& c) {
    const Tensor* maskT = c.has(3) ? &c.in(3) : nullptr;
    const AttnDims d = attnDims(c, c.in(0), c.in(1), c.in(2), maskT);
    const DType t = c.in(0).type.dtype;
    const C scale = static_cast<C>(c.node.getFloat("scale", 1.0f)), softcap = static_cast<C>(c.node.getFloat("softcap", 0.0f));
    const Dropout drop(c);
    const auto q = widen<C>(c.in(0)), kt = widen<C>(c.in(1)), v = widen<C>(c.in(2));
    std::vector<C> mask;
    if (maskT) mask = widen<C>(*maskT);
    std::vector<C> o(static_cast<size_t>(d.N * d.Tq * d.Dv), C(0)), lse(static_cast<size_t>(d.N * d.Tq));
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < d.N * d.Tq; ++row) {
      const int64_t n = row / d.Tq, i = row % d.Tq;
      std::vector<C> s(static_cast<size_t>(d.Tk));
      const C L = scoresRow(d, q, kt, maskT ? &mask : nullptr, scale, softcap, n, i, s);
      const C norm = fillRowNorm(s, L);
      lse[row] = L;
      C* oi = o.data() + row * d.Dv;
      const C* vn = v.data() + n * d.Tk * d.Dv;
      for (int64_t j = 0; j < d.Tk; ++j) {
        const C p = roundTo(t, std::exp(s[j] - L) * norm * static_cast<C>(drop.factor(row * d.Tk + j)));
        if (p == C(0)) continue;
        for (int64_t x = 0; x < d.Dv; ++x) oi[x] += p * vn[j * d.Dv + x];
      }
    }
    narrow(o, c.out(0));
    narrow(lse, c.out(1));
  }
};

// AttentionGrad(dO, Q, KT, V, O, LSE, mask?) -> dQ, dKT, dV, dMask? (a trainable mask: the
// unrounded score gradients p (dP f - D), summed over the dims the mask broadcasts along, in a fixed
// order: batch-head by batch-head after the parallel loop)
template <typename C>
struct AttentionGradK {
  static void run(KernelCtx& c) {
    const Tensor* maskT = c.has(6) ? &c.in(6) : nullptr;
    const AttnDims d = attnDims(c, c.in(1), c.in(2), c.in(3), maskT);
    // where_masked (the mask's shape): entries a Where masked, with no gradient (as where_causal's)
    const Tensor* whereT = c.has(7) ? &c.in(7) : nullptr;
    if (whereT && (!maskT || whereT->type.shape != maskT->type.shape)) c.fail("where_masked must have the mask's shape");
    const DType t = c.in(1).type.dtype;
    const C scale = static_cast<C>(c.node.getFloat("scale", 1.0f)), softcap = static_cast<C>(c.node.getFloat("softcap", 0.0f));
    const Dropout drop(c);
    const auto dO = widen<C>(c.in(0)), q = widen<C>(c.in(1)), kt = widen<C>(c.in(2)), v = widen<C>(c.in(3)), o = widen<C>(c.in(4));
    const auto lse = widen<C>(c.in(5));
    std::vector<C> mask;
    if (maskT) mask = widen<C>(*maskT);
    std::vector<C> dq(q.size(), C(0)), dkt(kt.size(), C(0)), dv(v.size(), C(0));
    const bool maskGrad = c.numOutputs() > 3;
    if (maskGrad && !maskT) c.fail("the mask's gradient needs the mask");
    std::vector<C> dS(maskGrad ? static_cast<size_t>(d.N * d.Tq * d.Tk) : 0, C(0));  // per score, unscaled
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < d.N; ++n) {
      std::vector<C> s(static_cast<size_t>(d.Tk)), th(softcap > C(0) ? static_cast<size_t>(d.Tk) : 0), raw(static_cast<size_t>(d.Tk));
      const C* k = kt.data() + n * d.D * d.Tk;
      const C* vn = v.data() + n * d.Tk * d.Dv;
      C* dk = dkt.data() + n * d.D * d.Tk;
      C* dvn = dv.data() + n * d.Tk * d.Dv;
      for (int64_t i = 0; i < d.Tq; ++i) {
        const int64_t row = n * d.Tq + i;
        scoresRow(d, q, kt, maskT ? &mask : nullptr, scale, softcap, n, i, s, &th, &raw);
        const C L = lse[row], norm = fillRowNorm(s, L);
        const C* doi = dO.data() + row * d.Dv;
        const C* oi = o.data() + row * d.Dv;
        const C* qi = q.data() + row * d.D;
        C* dqi = dq.data() + row * d.D;
        C Di = 0;  // sum_j P_ij dP_ij = dO_i . O_i
        for (int64_t x = 0; x < d.Dv; ++x) Di += doi[x] * oi[x];
        for (int64_t j = 0; j < d.Tk; ++j) {
          const C p = std::exp(s[j] - L) * norm;
          if (p == C(0)) continue;
          const C f = static_cast<C>(drop.factor(row * d.Tk + j));
          const C pd = roundTo(t, p * f);
          C dpd = 0;  // dL/d(dropped P)
          for (int64_t x = 0; x < d.Dv; ++x) dpd += doi[x] * vn[j * d.Dv + x];
          const C ds = p * (dpd * f - Di) * d.floorGrad(raw[j]);  // (through the floor: its clamp's derivative)
          if (maskGrad) dS[static_cast<size_t>(row * d.Tk + j)] = ds;
          // through the soft-capping: d(c tanh(x / c)) / dx = 1 - tanh^2; none above the diagonal
          // under where_causal, nor where where_masked holds (the mask's gradient takes ds all the same)
          const C dsq = (d.whereCausal && j > i) || (whereT && whereT->getInt(d.maskAt(n, i, j)) != 0) ? C(0) : ds;
          const C g = roundTo(t, scale * dsq * (softcap > C(0) ? C(1) - th[j] * th[j] : C(1)));
          for (int64_t x = 0; x < d.Dv; ++x) dvn[j * d.Dv + x] += pd * doi[x];
          for (int64_t x = 0; x < d.D; ++x) {
            dqi[x] += g * k[x * d.Tk + j];
            dk[x * d.Tk + j] += g * qi[x];
          }
        }
      }
    }
    narrow(dq, c.out(0));
    narrow(dkt, c.out(1));
    narrow(dv, c.out(2));
    if (maskGrad) {
      std::vector<C> dm(mask.size(), C(0));
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t i = 0; i < d.Tq; ++i) {
          C* row = dm.data() + d.maskAt(n, i, 0);
          const C* src = dS.data() + (n * d.Tq + i) * d.Tk;
          for (int64_t j = 0; j < d.Tk; ++j) row[j] += src[j];
        }
      narrow(dm, c.out(3));
    }
  }
};

template <template <typename> class F>
void floatOp(KernelCtx& c) { dispatchFloat<F>(c, c.in(0).type.dtype); }

// cuda::Attention and cuda::AttentionGrad (passes/attention_in_place.cpp): the operands gathered
// from where their layouts put them, ampc's kernel on the logical tensors, the results scattered
// back. Element (row, col) of slice n of a slot's logical tensor, with its laid-out address.
template <typename F>
void eachElement(const AttentionLayout& l, const AttentionDims& d, const std::string& slot, F f) {
  int64_t rows = 0, cols = 0;
  attentionSlotExtent(d, slot, false, rows, cols);  // the logical tensor's (KT for k and dk)
  for (int64_t n = 0, e = 0; n < d.B * d.H; ++n) {
    const int64_t b = n / l.heads, h = n % l.heads;
    const int64_t base = l.offset + b * l.sB + (h / l.group) * l.sH;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t x = 0; x < cols; ++x, ++e) f(e, l.keyRows ? base + x * l.sRow + r : base + r * l.sRow + x);
  }
}
Tensor gatherSlot(const Tensor& t, const AttentionLayout& l, const AttentionDims& d, const std::string& slot) {
  Tensor o(TensorType{t.type.dtype, attentionLogicalShape(d, slot)});
  const size_t es = dtypeSize(t.type.dtype);
  eachElement(l, d, slot, [&](int64_t e, int64_t at) { std::memcpy(o.data.data() + e * es, t.data.data() + at * es, es); });
  return o;
}
void scatterSlot(const Tensor& o, Tensor& t, const AttentionLayout& l, const AttentionDims& d, const std::string& slot) {
  const size_t es = dtypeSize(t.type.dtype);
  eachElement(l, d, slot, [&](int64_t e, int64_t at) { std::memcpy(t.data.data() + at * es, o.data.data() + e * es, es); });
}

void targetAttention(KernelCtx& c) {
  const bool grad = c.node.op() == "AttentionGrad";
  AttentionDims d;
  try {
    d = attentionDims(c.node);
  } catch (const Error& e) {
    c.fail(e.what());
  }
  auto laid = [&](const std::string& slot) { return c.node.hasAttr(slot + "_layout"); };
  auto layout = [&](const std::string& slot) {
    try {
      return attentionLayout(c.node, d, slot);
    } catch (const Error& e) {
      c.fail(e.what());
    }
  };
  std::vector<Tensor> gathered(c.numInputs());
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < c.numInputs(); ++i) {
    const char* slot = attentionOperandSlot(grad, i);
    if (slot && laid(slot)) {
      gathered[i] = gatherSlot(c.in(i), layout(slot), d, slot);
      ins.push_back(&gathered[i]);
    } else {
      ins.push_back(c.has(i) ? &c.in(i) : nullptr);
    }
  }
  const DType t = c.in(grad ? 1 : 0).type.dtype;
  auto logical = [&](const std::string& slot) { return Tensor(TensorType{t, attentionLogicalShape(d, slot)}); };
  const bool packed = c.node.getInt("packed_grads", 0) != 0;
  std::vector<Tensor> outs;
  if (!grad) {
    outs.push_back(laid("o") ? logical("o") : std::move(c.out(0)));
    outs.push_back(std::move(c.out(1)));
  } else {
    for (size_t r = 0; r < 3; ++r) outs.push_back(laid(attentionGradSlot(r)) ? logical(attentionGradSlot(r)) : std::move(c.out(r)));
    const size_t mask = packed ? 1 : 3;
    if (c.numOutputs() > mask) outs.push_back(std::move(c.out(mask)));
  }
  KernelCtx inner(c.node, ins, outs, c.opts);
  Kernel k = findKernel(c.node.op(), "ampc");
  if (!k) c.fail("no kernel for ampc::" + c.node.op());
  k(inner);
  if (!grad) {
    if (laid("o")) scatterSlot(outs[0], c.out(0), layout("o"), d, "o");
    else c.out(0) = std::move(outs[0]);
    c.out(1) = std::move(outs[1]);
    return;
  }
  for (size_t r = 0; r < 3; ++r) {
    Tensor& dst = c.out(packed ? 0 : r);
    const char* slot = attentionGradSlot(r);
    if (laid(slot)) scatterSlot(outs[r], dst, layout(slot), d, slot);
    else dst = std::move(outs[r]);
  }
  if (outs.size() > 3) c.out(packed ? 1 : 3) = std::move(outs[3]);
}

}  // namespace

void registerAttentionKernels(std::vector<KernelRow>& t) {
  t.insert(t.end(), {
      {"Attention", summingOp<AttentionK>, "ampc"},
      {"AttentionGrad", summingOp<AttentionGradK>, "ampc"},
      {"Attention", targetAttention, kCudaDomain},
      {"AttentionGrad", targetAttention, kCudaDomain},
  });
}

}  // namespace ampc::cpu
