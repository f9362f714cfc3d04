// Neural-network ops: GEMMs, convolution and pooling, normalisation, reductions and losses.
#include <algorithm>
#include <cmath>

#include "compiler/ops/families.h"
#include "compiler/ops/geometry.h"
#include "compiler/ops/grad.h"
#include "compiler/target.h"

namespace ampc {
namespace {

void requireFloat(InferContext& c, size_t i) {
  if (!isFloat(c.in(i).dtype)) c.fail("input " + std::to_string(i) + " must be a float tensor, got " + c.in(i).str());
}
void requireSameDType(InferContext& c, size_t a, size_t b) {
  if (c.in(a).dtype != c.in(b).dtype)
    c.fail("inputs " + std::to_string(a) + " and " + std::to_string(b) + " must have the same dtype, got " +
           c.in(a).str() + " and " + c.in(b).str());
}

void inferMatMul(InferContext& c) {
  requireSameDType(c, 0, 1);
  auto a = c.in(0).shape, b = c.in(1).shape;
  c.check(!a.empty() && !b.empty(), "MatMul operands must have rank >= 1");
  bool va = a.size() == 1, vb = b.size() == 1;
  if (va) a.insert(a.begin(), 1);
  if (vb) b.push_back(1);
  int64_t k1 = a.back(), k2 = b[b.size() - 2];
  if (k1 != k2) c.fail("inner dimensions differ: " + c.in(0).str() + " x " + c.in(1).str());
  std::vector<int64_t> ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  auto out = broadcastShapes(c, ba, bb);
  if (!va) out.push_back(a[a.size() - 2]);
  if (!vb) out.push_back(b.back());
  c.setOut(0, TensorType{c.in(0).dtype, out});
}

void inferGemm(InferContext& c) {
  requireSameDType(c, 0, 1);
  const auto &a = c.in(0).shape, &b = c.in(1).shape;
  c.check(a.size() == 2 && b.size() == 2, "A and B must be 2-D");
  bool ta = c.node().getInt("transA", 0), tb = c.node().getInt("transB", 0);
  int64_t m = ta ? a[1] : a[0], k = ta ? a[0] : a[1];
  int64_t k2 = tb ? b[1] : b[0], n = tb ? b[0] : b[1];
  if (k != k2) c.fail("inner dimensions differ: " + c.in(0).str() + " x " + c.in(1).str());
  if (c.hasInput(2)) {
    requireSameDType(c, 0, 2);
    auto s = broadcastShapes(c, {m, n}, c.in(2).shape);
    c.check(s == std::vector<int64_t>{m, n}, "C " + c.in(2).str() + " does not broadcast to the output");
  }
  c.setOut(0, TensorType{c.in(0).dtype, {m, n}});
}

// cuda.Gemm (passes/fuse_bias_grad.cpp): a Gemm whose result 1, when present, is the bias gradient
// its epilogue sums: operand bias_grad's column sums ([N], or [1, N] with keepdims), of its type.
void inferTargetGemm(InferContext& c) {
  inferGemm(c);
  if (c.numOutputs() < 2) return;
  const int64_t k = c.node().getInt("bias_grad", -1);
  c.check(k == 0 || k == 1, "bias_grad must be 0 or 1 (the operand whose column sums are result 1)");
  const TensorType& x = c.in(static_cast<size_t>(k));
  c.check(x.rank() == 2, "the summed operand must be 2-D");
  if (c.node().getInt("keepdims", 1) != 0) c.setOut(1, TensorType{x.dtype, {1, x.shape[1]}});
  else c.setOut(1, TensorType{x.dtype, {x.shape[1]}});
}

// Spatial output dims of Conv and the pools, from the shared window geometry.
std::vector<int64_t> spatialOut(InferContext& c, const std::vector<int64_t>& x, const std::vector<int64_t>& kernel,
                                bool ceilMode) {
  try {
    return windowOf(c.node(), std::vector<int64_t>(x.begin() + 2, x.end()), kernel, ceilMode).out;
  } catch (const Error& e) {
    c.fail(e.what());
  }
}

void inferConv(InferContext& c) {
  requireFloat(c, 0);
  requireSameDType(c, 0, 1);
  const auto &x = c.in(0).shape, &w = c.in(1).shape;
  c.check(x.size() >= 3 && x.size() <= 5, "X must be N x C x spatial (1-D to 3-D), got " + c.in(0).str());
  c.check(w.size() == x.size(), "W rank must equal X rank, got " + c.in(1).str());
  int64_t group = c.node().getInt("group", 1);
  c.check(group >= 1 && x[1] % group == 0 && w[0] % group == 0, "group does not divide the channels");
  if (w[1] * group != x[1])
    c.fail("W " + c.in(1).str() + " expects " + std::to_string(w[1] * group) + " input channels, X has " +
           std::to_string(x[1]));
  std::vector<int64_t> kernel(w.begin() + 2, w.end());
  auto ks = c.node().getInts("kernel_shape", kernel);
  c.check(ks == kernel, "kernel_shape does not match W");
  if (c.hasInput(2)) {
    requireSameDType(c, 0, 2);
    c.check(c.in(2).shape == std::vector<int64_t>{w[0]}, "B must have shape [M]");
  }
  std::vector<int64_t> out{x[0], w[0]};
  for (int64_t d : spatialOut(c, x, kernel, false)) out.push_back(d);
  c.setOut(0, TensorType{c.in(0).dtype, out});
}

// Pool output shape (and MaxPool's optional Indices).
void inferPoolShape(InferContext& c) {
  const auto& x = c.in(0).shape;
  c.check(x.size() >= 3, "X must be N x C x spatial, got " + c.in(0).str());
  auto kernel = c.node().getInts("kernel_shape");
  c.check(!kernel.empty(), "kernel_shape is required");
  std::vector<int64_t> out{x[0], x[1]};
  for (int64_t d : spatialOut(c, x, kernel, c.node().getInt("ceil_mode", 0) != 0)) out.push_back(d);
  c.setOut(0, TensorType{c.in(0).dtype, out});
  if (c.numOutputs() > 1) c.setOut(1, TensorType{DType::i64, out});
}
void inferAveragePool(InferContext& c) {
  requireFloat(c, 0);
  inferPoolShape(c);
}
void inferMaxPool(InferContext& c) {  // MaxPool also takes i8/u8 data
  if (c.in(0).dtype != DType::i8 && c.in(0).dtype != DType::u8) requireFloat(c, 0);
  inferPoolShape(c);
}

void inferGlobalPool(InferContext& c) {
  requireFloat(c, 0);
  auto s = c.in(0).shape;
  c.check(s.size() >= 3, "X must be N x C x spatial, got " + c.in(0).str());
  std::fill(s.begin() + 2, s.end(), 1);
  c.setOut(0, TensorType{c.in(0).dtype, s});
}

void inferBatchNorm(InferContext& c) {
  requireFloat(c, 0);
  const auto& x = c.in(0).shape;
  c.check(x.size() >= 2, "X must be N x C x ..., got " + c.in(0).str());
  for (size_t i = 1; i < 5; ++i) {
    requireFloat(c, i);
    if (c.in(i).shape != std::vector<int64_t>{x[1]})
      c.fail("input " + std::to_string(i) + " must have shape [" + std::to_string(x[1]) + "], got " + c.in(i).str());
  }
  bool training = c.node().getInt("training_mode", 0) != 0;
  c.check(training || c.numOutputs() == 1, "running_mean/running_var outputs need training_mode=1");
  c.setOut(0, c.in(0));
  if (c.numOutputs() > 1) c.setOut(1, c.in(3));
  if (c.numOutputs() > 2) c.setOut(2, c.in(4));
}

void inferTargetBatchNorm(InferContext& c) {
  inferBatchNorm(c);
  const bool residual = c.node().getInt("residual", 0) != 0;
  c.check(residual == c.hasInput(5), "residual = 1 takes the residual as input 5, and only then");
  if (residual) c.check(c.in(5) == c.in(0), "the residual must have X's type, got " + c.in(5).str());
}

void inferLayerNorm(InferContext& c) {
  requireFloat(c, 0);
  const auto& x = c.in(0).shape;
  int64_t axis = c.axis(c.node().getInt("axis", -1), c.in(0).rank());
  std::vector<int64_t> norm(x.begin() + axis, x.end());
  auto bcast = [&](size_t i) {
    auto s = broadcastShapes(c, norm, c.in(i).shape);
    c.check(s == norm, "input " + std::to_string(i) + " " + c.in(i).str() + " does not broadcast to the normalised dims");
  };
  bcast(1);
  if (c.hasInput(2)) bcast(2);
  c.setOut(0, c.in(0));
  auto stash = dtypeFromOnnx(static_cast<int>(c.node().getInt("stash_type", 1)));
  c.check(stash && isFloat(*stash), "stash_type must be a float type");
  std::vector<int64_t> stat(x);
  std::fill(stat.begin() + axis, stat.end(), 1);
  for (size_t i = 1; i < c.numOutputs(); ++i) c.setOut(i, TensorType{*stash, stat});
}

// Reduce*: axes from the attribute (older opsets) or from input 1 (ReduceSum >= 13, others >= 18).
void inferReduce(InferContext& c) {
  const auto& x = c.in(0).shape;
  std::vector<int64_t> axes = c.node().getInts("axes");
  if (c.hasInput(1)) {
    c.check(!c.node().hasAttr("axes"), "axes given both as attribute and input");
    axes = c.constInts(1);
  }
  bool keep = c.node().getInt("keepdims", 1) != 0;
  if (axes.empty() && c.node().getInt("noop_with_empty_axes", 0)) {
    c.setOut(0, c.in(0));
    return;
  }
  std::vector<bool> red(x.size(), axes.empty());
  for (int64_t a : axes) {
    int64_t ax = c.axis(a, c.in(0).rank());
    c.check(!red[ax] || axes.empty(), "axis " + std::to_string(a) + " is repeated");
    red[ax] = true;
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!red[i]) out.push_back(x[i]);
    else if (keep) out.push_back(1);
  }
  c.setOut(0, TensorType{c.in(0).dtype, out});
}

// CumSum(x, axis) {exclusive, reverse}: x's type; the axis is a scalar constant.
void inferCumSum(InferContext& c) {
  c.check(c.in(1).rank() <= 1 && c.in(1).numel() == 1 && isInteger(c.in(1).dtype), "axis must be an integer scalar, got " + c.in(1).str());
  if (c.constIn(1)) c.axis(c.constIn(1)->getInt(0), c.in(0).rank());
  else c.fail("axis must be a compile-time constant");
  c.check(c.in(0).dtype != DType::boolean, "x must be numeric, got " + c.in(0).str());
  c.setOut(0, c.in(0));
}

// Det: X [*, M, M] -> [*].
void inferDet(InferContext& c) {
  requireFloat(c, 0);
  const auto& s = c.in(0).shape;
  c.check(s.size() >= 2 && s[s.size() - 1] == s[s.size() - 2], "X must be [*, M, M] (square matrices), got " + c.in(0).str());
  c.setOut(0, TensorType{c.in(0).dtype, std::vector<int64_t>(s.begin(), s.end() - 2)});
}

void inferArgMax(InferContext& c) {
  auto s = c.in(0).shape;
  int64_t ax = c.axis(c.node().getInt("axis", 0), c.in(0).rank());
  if (c.node().getInt("keepdims", 1)) s[ax] = 1;
  else s.erase(s.begin() + ax);
  c.setOut(0, TensorType{DType::i64, s});
}

// GridSample(X [N, C, H, W], grid [N, Ho, Wo, 2]) -> [N, C, Ho, Wo]: 2-d only, modes bilinear
// (opset 20: linear) and nearest, any padding mode. Cubic and volumes are refused, naming the node.
void inferGridSample(InferContext& c) {
  requireFloat(c, 0);
  requireFloat(c, 1);
  const auto &x = c.in(0).shape, &g = c.in(1).shape;
  c.check(x.size() == 4, "X must be [N, C, H, W] (only 2-d sampling is supported), got " + c.in(0).str());
  c.check(g.size() == 4 && g[0] == x[0] && g[3] == 2, "grid must be [N, Ho, Wo, 2] with X's N, got " + c.in(1).str());
  const std::string mode = c.node().getString("mode", "bilinear");
  c.check(mode == "bilinear" || mode == "linear" || mode == "nearest", "mode '" + mode + "' is not supported (bilinear/linear and nearest are)");
  const std::string pad = c.node().getString("padding_mode", "zeros");
  c.check(pad == "zeros" || pad == "border" || pad == "reflection", "padding_mode '" + pad + "' is not zeros, border or reflection");
  c.setOut(0, TensorType{c.in(0).dtype, {x[0], x[1], g[1], g[2]}});
}

// TopK(x, K) {axis, largest, sorted}: the K largest (or smallest) along axis, and their indices.
// K is a compile-time constant (static shapes); the results are always sorted (which sorted = 0
// allows), ties in index order.
void inferTopK(InferContext& c) {
  c.check(c.in(0).dtype != DType::boolean, "x must be numeric, got " + c.in(0).str());
  c.check(c.in(1).rank() <= 1 && c.in(1).numel() == 1 && c.in(1).dtype == DType::i64, "K must be a one-element i64 tensor, got " + c.in(1).str());
  if (!c.constIn(1)) c.fail("K must be a compile-time constant");
  const int64_t ax = c.axis(c.node().getInt("axis", -1), c.in(0).rank());
  const int64_t k = c.constIn(1)->getInt(0);
  c.check(k >= 0 && k <= c.in(0).shape[static_cast<size_t>(ax)],
          "K " + std::to_string(k) + " must be in [0, " + std::to_string(c.in(0).shape[static_cast<size_t>(ax)]) + "] (the axis' size)");
  auto s = c.in(0).shape;
  s[static_cast<size_t>(ax)] = k;
  c.setOut(0, TensorType{c.in(0).dtype, s});
  c.setOut(1, TensorType{DType::i64, s});
}

// SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss: scores (N, C, d...), labels (N, d...).
void inferLoss(InferContext& c) {
  requireFloat(c, 0);
  const auto &x = c.in(0).shape, &y = c.in(1).shape;
  c.check(x.size() >= 2, "scores must be N x C x ..., got " + c.in(0).str());
  if (c.in(1).dtype != DType::i64 && c.in(1).dtype != DType::i32) c.fail("labels must be i32 or i64, got " + c.in(1).str());
  std::vector<int64_t> expect(x);
  expect.erase(expect.begin() + 1);
  if (y != expect) c.fail("labels " + c.in(1).str() + " do not match scores " + c.in(0).str());
  if (c.hasInput(2)) {
    requireSameDType(c, 0, 2);
    c.check(c.in(2).shape == std::vector<int64_t>{x[1]}, "weights must have shape [C]");
  }
  std::string red = c.node().getString("reduction", "mean");
  if (red != "mean" && red != "sum" && red != "none") c.fail("unknown reduction '" + red + "'");
  c.setOut(0, TensorType{c.in(0).dtype, red == "none" ? expect : std::vector<int64_t>{}});
  if (c.numOutputs() > 1) c.setOut(1, c.in(0));
}

// cuda::SoftmaxCrossEntropyLoss (passes/keep_loss_stats.cpp): the loss, and each row's max and sum
// of exp(x - max) as result 1, f32 [rows, 2].
void inferTargetLoss(InferContext& c) {
  c.check(c.in(0).rank() == 2, "scores must be [rows, C], got " + c.in(0).str());
  inferLoss(c);
  c.setOut(1, TensorType{DType::f32, {c.in(0).shape[0], 2}});
}

// FLOPs: 2 per multiply-add.
double matmulFlops(const Node& n) {
  const auto& a = n.input(0)->type().shape;
  return 2.0 * static_cast<double>(n.result(0)->type().numel()) * static_cast<double>(a.empty() ? 1 : a.back());
}
double gemmFlops(const Node& n) {
  const auto& a = n.input(0)->type().shape;
  const int64_t k = n.getInt("transA", 0) ? a[0] : a[1];
  return 2.0 * static_cast<double>(n.result(0)->type().numel()) * static_cast<double>(k);
}
double convFlops(const Node& n) {
  const auto& w = n.input(1)->type().shape;  // M x C/group x k...
  double perOut = 1;
  for (size_t i = 1; i < w.size(); ++i) perOut *= static_cast<double>(w[i]);
  return 2.0 * static_cast<double>(n.result(0)->type().numel()) * perOut;
}

// Fused attention (passes/fuse_attention.cpp), "ampc" domain:
//   Attention(Q [.., Tq, D], KT [.., D, Tk], V [.., Tk, Dv], mask?, where_masked?) {scale, softcap, dropout_ratio, dropout_key,
//             zero_empty_rows, score_floor, floor_tie, where_causal}
//     -> O [.., Tq, Dv] (Q's dtype), LSE f32 [.., Tq]
//   O = Dropout(Softmax(S + mask)) V with S = scale * Q KT, or with softcap c > 0 (Gemma 2's logit
//   soft-capping) S = c tanh(scale * Q KT / c); LSE = the rows' log-sum-exp (what the backward reads).
// Q, KT and V share dtype and leading dims; the mask broadcasts to the scores (attentionMaskMap:
// [.., Tq or 1, Tk], per batch, per head, both or shared). The mask may be trainable (an additive
// bias: T5's relative positions, Swin's relative position table): AttentionGrad's fourth result
// is then its gradient, the score gradients summed over the dims it broadcasts along.
// zero_empty_rows = 1: a row whose every score is -inf gets probabilities 0 (O = 0, LSE = +inf, no
// gradient), as the exporters' IsNaN/Where after the softmax makes them; 0 (the default): NaN
// there, as Softmax gives.
// score_floor = f (at most -1e6; -inf, the default: none): the masked scores are max(S + mask, f)
// before the softmax (XGLM's and OPT's clamp at the lowest float; a Where's finite fill), so that a
// row masked everywhere is uniform. A score below f gets no gradient; one equal to f the share
// floor_tie of it (1, the default: a clamp's; 1/2: torch.maximum's ties; 0: a Where's fill).
// where_causal = 1: the scores above the diagonal (key j > query i) were masked by a Where (a
// constant causal condition with a finite fill, summed into the mask with others): they get no
// gradient (the mask's own gradient, where it is trained, still takes them). It matters only in
// rows masked everywhere, where such entries hold the fill and take probability (elsewhere it is 0).
// where_masked (bool, the mask's shape; with the mask): the same for any Where's condition: its
// nonzero entries were masked by a Where, and get no gradient in rows masked everywhere.
void checkWhereMasked(InferContext& c, size_t mask, size_t whereMasked) {
  if (whereMasked >= c.numInputs() || !c.hasInput(whereMasked)) return;
  c.check(mask < c.numInputs() && c.hasInput(mask), "where_masked needs the mask (without one no row is masked everywhere)");
  c.check(c.in(whereMasked).dtype == DType::boolean && c.in(whereMasked).shape == c.in(mask).shape,
          "where_masked must be bool with the mask's shape " + c.in(mask).str() + ", got " + c.in(whereMasked).str());
}
void checkAttentionOperands(InferContext& c, size_t q, size_t kt, size_t v, size_t mask, size_t whereMasked) {
  const float softcap = c.node().getFloat("softcap", 0.0f);
  c.check(softcap >= 0.0f && std::isfinite(softcap), "softcap must be 0 (none) or positive, got " + std::to_string(softcap));
  const float floor = c.node().getFloat("score_floor", -INFINITY);
  c.check(floor <= -1e6f && !std::isnan(floor), "score_floor must be at most -1e6 (or -inf: none), got " + std::to_string(floor));
  const float tie = c.node().getFloat("floor_tie", 1.0f);
  c.check(tie >= 0.0f && tie <= 1.0f, "floor_tie must be in [0, 1], got " + std::to_string(tie));
  const int64_t whereCausal = c.node().getInt("where_causal", 0);
  c.check(whereCausal == 0 || whereCausal == 1, "where_causal must be 0 or 1, got " + std::to_string(whereCausal));
  requireFloat(c, q);
  requireSameDType(c, q, kt);
  requireSameDType(c, q, v);
  const auto &qs = c.in(q).shape, &ks = c.in(kt).shape, &vs = c.in(v).shape;
  c.check(qs.size() >= 2 && ks.size() == qs.size() && vs.size() == qs.size(), "Q, KT and V must have one rank >= 2");
  const size_t r = qs.size();
  c.check(std::equal(qs.begin(), qs.end() - 2, ks.begin()) && std::equal(qs.begin(), qs.end() - 2, vs.begin()),
          "Q, KT and V must have the same leading dims, got " + c.in(q).str() + ", " + c.in(kt).str() + ", " + c.in(v).str());
  c.check(ks[r - 2] == qs[r - 1], "KT must be [.., D, Tk] with Q's D, got " + c.in(kt).str());
  c.check(vs[r - 2] == ks[r - 1], "V must be [.., Tk, Dv] with KT's Tk, got " + c.in(v).str());
  if (mask < c.numInputs() && c.hasInput(mask)) {
    requireFloat(c, mask);
    AttentionMaskMap map;
    std::string why;
    const bool ok = attentionMaskMap(std::vector<int64_t>(qs.begin(), qs.end() - 2), qs[r - 2], ks[r - 1], c.in(mask).shape, map, &why);
    c.check(ok, "the mask must broadcast to the scores [.., Tq, Tk] as compiler/ops/geometry.h's attentionMaskMap says, got " +
                    c.in(mask).str() + ": " + why);
  }
  checkWhereMasked(c, mask, whereMasked);
}
void inferAttention(InferContext& c) {
  checkAttentionOperands(c, 0, 1, 2, 3, 4);
  auto o = c.in(0).shape;
  o.back() = c.in(2).shape.back();
  c.setOut(0, TensorType{c.in(0).dtype, o});
  c.setOut(1, TensorType{DType::f32, std::vector<int64_t>(c.in(0).shape.begin(), c.in(0).shape.end() - 1)});
}
// AttentionGrad(dO, Q, KT, V, O, LSE, mask?, where_masked?) -> dQ, dKT, dV, dMask? (the mask's type and shape)
void inferAttentionGrad(InferContext& c) {
  checkAttentionOperands(c, 1, 2, 3, 6, 7);
  c.check(c.in(0).shape == c.in(4).shape && c.in(0).dtype == c.in(1).dtype, "dO and O must have O's type, got " + c.in(0).str());
  c.check(c.in(5).dtype == DType::f32, "LSE must be f32, got " + c.in(5).str());
  for (size_t i = 0; i < 3; ++i) c.setOut(i, c.in(1 + i));
  if (c.numOutputs() > 3) {
    c.check(c.numInputs() > 6 && c.hasInput(6), "the mask's gradient (result 3) needs the mask (operand 6)");
    c.setOut(3, c.in(6));
  }
}
// cuda::Attention(Q, KT, V, mask?, where_masked?) and cuda::AttentionGrad(dO, Q, KT, V, O, LSE, mask?, where_masked?)
// (passes/attention_in_place.cpp): ampc's attention ops over rank-4 operands [B, H, .., ..] that
// may lie in the bytes of other values (compiler/ops/geometry.h, AttentionLayout). Each operand with
// a layout must hold every element the layout touches; one without is the logical tensor itself. A
// result written with a layout is token-major, [B, T, H, cols] (the head Transpose's value it
// stands for; a gradient whose layout is packed [B, H, rows, cols] is that), or with packed_grads = 1 AttentionGrad's one result [B, Tq, row] holds dQ, dK and dV
// side by side in each row (the Concat of the QKV projection's gradient).
TensorType attentionLogical(DType t, const AttentionDims& d, const std::string& slot) { return TensorType{t, attentionLogicalShape(d, slot)}; }
TensorType attentionTokenMajor(DType t, const AttentionDims& d, const std::string& slot) {
  int64_t rows = 0, cols = 0;
  attentionSlotExtent(d, slot, true, rows, cols);
  return TensorType{t, {d.B, rows, d.H, cols}};
}
// The geometry's errors (a malformed attribute, an overflow), naming the node.
template <typename F>
auto named(const InferContext& c, F f) {
  try {
    return f();
  } catch (const Error& e) {
    c.fail(e.what());
  }
}
int64_t laidEnd(const InferContext& c, const AttentionDims& d, const std::string& slot, AttentionLayout* out = nullptr) {
  return named(c, [&] {
    const AttentionLayout l = attentionLayout(c.node(), d, slot);
    int64_t rows = 0, cols = 0;
    attentionSlotExtent(d, slot, l.keyRows, rows, cols);
    if (out) *out = l;
    return attentionLayoutEnd(l, d, rows, cols);
  });
}
// Checks operand i in its slot: the logical tensor, or a value holding what its layout addresses.
void checkLaidOperand(InferContext& c, const AttentionDims& d, size_t i, const std::string& slot, DType t) {
  c.check(c.in(i).dtype == t, "operand " + std::to_string(i) + " (" + slot + ") must have Q's type, got " + c.in(i).str());
  const std::string attr = slot + "_layout";
  if (!c.node().hasAttr(attr)) {
    c.check(c.in(i) == attentionLogical(t, d, slot), "operand " + std::to_string(i) + " (" + slot + ") must be " +
                                                          attentionLogical(t, d, slot).str() + " without " + attr + ", got " + c.in(i).str());
    return;
  }
  c.check(laidEnd(c, d, slot) <= c.in(i).numel(),
          "operand " + std::to_string(i) + " (" + slot + ") " + c.in(i).str() + " does not hold what " + attr + " addresses");
}
void checkLaidResult(InferContext& c, const AttentionDims& d, const std::string& slot, const TensorType& t) {
  c.check(laidEnd(c, d, slot) <= t.numel(), "result " + slot + " " + t.str() + " does not hold what " + slot + "_layout addresses");
}
// A gradient written with a layout: token-major, or heads-major [B, H, rows, cols] where the layout
// is that packed tensor (dK as rows under the Transpose (0, 1, 3, 2) of a K [B, H, T, D] read as is).
TensorType laidGradType(const InferContext& c, const AttentionDims& d, const std::string& slot, DType t) {
  AttentionLayout l;
  laidEnd(c, d, slot, &l);
  int64_t rows = 0, cols = 0;
  attentionSlotExtent(d, slot, l.keyRows, rows, cols);
  if (d.H > 1 && l.offset == 0 && l.group == 1 && l.sRow == cols && l.sH == rows * cols && l.sB == d.H * rows * cols)
    return TensorType{t, {d.B, d.H, rows, cols}};
  return attentionTokenMajor(t, d, slot);
}
void checkTargetMask(InferContext& c, const AttentionDims& d, size_t mask) {
  if (mask >= c.numInputs() || !c.hasInput(mask)) return;
  requireFloat(c, mask);
  AttentionMaskMap map;
  std::string why;
  c.check(attentionMaskMap({d.B, d.H}, d.Tq, d.Tk, c.in(mask).shape, map, &why), "the mask does not broadcast to the scores: " + why);
}

void inferTargetAttention(InferContext& c) {
  const AttentionDims d = named(c, [&] { return attentionDims(c.node()); });
  requireFloat(c, 0);
  const DType t = c.in(0).dtype;
  for (size_t i = 0; i < 3; ++i) checkLaidOperand(c, d, i, attentionOperandSlot(false, i), t);
  checkTargetMask(c, d, 3);
  checkWhereMasked(c, 3, 4);
  const bool laid = c.node().hasAttr("o_layout");
  const TensorType o = laid ? attentionTokenMajor(t, d, "o") : attentionLogical(t, d, "o");
  if (laid) checkLaidResult(c, d, "o", o);
  c.setOut(0, o);
  c.setOut(1, TensorType{DType::f32, {d.B, d.H, d.Tq}});
}

void inferTargetAttentionGrad(InferContext& c) {
  const AttentionDims d = named(c, [&] { return attentionDims(c.node()); });
  requireFloat(c, 1);
  const DType t = c.in(1).dtype;
  for (size_t i = 0; i < 5; ++i) checkLaidOperand(c, d, i, attentionOperandSlot(true, i), t);
  c.check(c.in(5) == TensorType{DType::f32, {d.B, d.H, d.Tq}}, "LSE must be f32[B, H, Tq], got " + c.in(5).str());
  checkTargetMask(c, d, 6);
  checkWhereMasked(c, 6, 7);
  size_t next = 3;
  if (c.node().getInt("packed_grads", 0) != 0) {
    for (const char* s : {"dq", "dk", "dv"}) c.check(c.node().hasAttr(std::string(s) + "_layout"), "packed_grads = 1 needs dq_layout, dk_layout and dv_layout");
    AttentionLayout dq;
    laidEnd(c, d, "dq", &dq);
    const TensorType p{t, {d.B, d.Tq, dq.sRow}};
    for (const char* s : {"dq", "dk", "dv"}) checkLaidResult(c, d, s, p);
    c.setOut(0, p);
    next = 1;
  } else {
    size_t r = 0;
    for (size_t g = 0; g < 3; ++g) {
      const char* s = attentionGradSlot(g);
      const bool laid = c.node().hasAttr(std::string(s) + "_layout");
      const TensorType rt = laid ? laidGradType(c, d, s, t) : attentionLogical(t, d, s);
      if (laid) checkLaidResult(c, d, s, rt);
      c.setOut(r++, rt);
    }
  }
  if (c.numOutputs() > next) {
    c.check(c.numInputs() > 6 && c.hasInput(6), "the mask's gradient needs the mask (operand 6)");
    c.setOut(next, c.in(6));
  }
}

double attentionFlops(const Node& n) {  // the two products, every score counted
  const auto &q = n.input(0)->type().shape, &v = n.input(2)->type().shape;
  const double scores = static_cast<double>(n.result(1)->type().numel()) * static_cast<double>(v[v.size() - 2]);
  return 2.0 * scores * static_cast<double>(q.back() + v.back());
}

double targetAttentionFlops(const Node& n) {
  const AttentionDims d = attentionDims(n);
  return 2.0 * static_cast<double>(d.B * d.H) * static_cast<double>(d.Tq) * static_cast<double>(d.Tk) * static_cast<double>(d.D + d.Dv);
}

constexpr auto A = AmpCategory::Allow;
constexpr auto D = AmpCategory::Deny;
constexpr auto I = AmpCategory::Infer;
constexpr auto C = AmpCategory::Clear;
constexpr int L = kMinOpset, H = kMaxOpset;

}  // namespace

void registerNNOps(std::vector<OpDef>& t) {
  auto row = [&](std::string_view name, int since, int minIn, int maxIn, int minOut, int maxOut, AmpCategory amp,
                 bool diff, ShapeFn f) { t.push_back(OpDef{name, "", since, H, minIn, maxIn, minOut, maxOut, amp, diff, f}); };
  row("MatMul", L, 2, 2, 1, 1, A, true, inferMatMul);
  t.back().flops = matmulFlops;
  row("Gemm", L, 2, 3, 1, 1, A, true, inferGemm);
  t.back().flops = gemmFlops;
  // The CUDA target's lowered nodes (runtime/lower.cpp), after autodiff and autocast.
  t.push_back(OpDef{"Gemm", kCudaDomain, 1, 1, 2, 2, 1, 2, I, false, inferTargetGemm});
  t.back().flops = gemmFlops;
  // cuda::BatchNormalization (passes/fuse_norm_epilogue.cpp): + a residual, then a Relu, on the way out.
  t.push_back(OpDef{"BatchNormalization", kCudaDomain, 1, 1, 5, 6, 1, 3, I, false, inferTargetBatchNorm});
  t.back().stateOperands = 0b11000;  // running mean, running var
  row("Conv", L, 2, 3, 1, 1, A, true, inferConv);
  t.back().flops = convFlops;
  row("MaxPool", L, 1, 1, 1, 2, C, true, inferMaxPool);
  t.back().gradResults = 2;  // Indices
  row("AveragePool", L, 1, 1, 1, 1, I, true, inferAveragePool);
  row("GlobalAveragePool", L, 1, 1, 1, 1, I, true, inferGlobalPool);
  row("BatchNormalization", L, 5, 5, 1, 3, I, true, inferBatchNorm);
  t.back().fp32Operands = 0b11110;  // scale, bias, mean, var
  t.back().stateOperands = 0b11000;  // running mean, running var
  row("LayerNormalization", 17, 2, 3, 1, 3, D, true, inferLayerNorm);
  row("ReduceSum", L, 1, 2, 1, 1, D, true, inferReduce);
  row("ReduceMean", L, 1, 2, 1, 1, D, true, inferReduce);
  row("ReduceMax", L, 1, 2, 1, 1, I, true, inferReduce);
  row("ReduceMin", L, 1, 2, 1, 1, I, true, inferReduce);
  row("ArgMax", L, 1, 1, 1, 1, C, false, inferArgMax);
  row("TopK", L, 2, 2, 2, 2, C, true, inferTopK);
  // FP32, as PyTorch's autocast runs grid_sampler.
  row("GridSample", 16, 2, 2, 1, 1, D, true, inferGridSample);
  row("CumSum", L, 2, 2, 1, 1, D, true, inferCumSum);
  // FP32 (in f64 inside), as PyTorch's autocast runs the linear-algebra ops.
  row("Det", 11, 1, 1, 1, 1, D, true, inferDet);
  row("SoftmaxCrossEntropyLoss", L, 2, 3, 1, 2, D, true, inferLoss);
  t.back().loss = true;
  t.back().noGradOperands = 0b100;  // class weights
  // cuda::SoftmaxCrossEntropyLoss (passes/keep_loss_stats.cpp): + each row's statistics as result 1.
  t.push_back(OpDef{"SoftmaxCrossEntropyLoss", kCudaDomain, 1, 1, 2, 3, 2, 2, D, false, inferTargetLoss});
  row("NegativeLogLikelihoodLoss", L, 2, 3, 1, 1, D, true, inferLoss);
  t.back().loss = true;
  t.back().noGradOperands = 0b100;
  // Fused attention: low precision in, FP32 softmax inside; the mask stays FP32 (and a trainable
  // one gets its gradient as AttentionGrad's fourth result).
  t.push_back(OpDef{"Attention", kGradDomain, 1, 1, 3, 5, 2, 2, A, true, inferAttention});
  t.back().flops = attentionFlops;
  t.back().fp32Operands = 0b1000;
  t.back().noGradOperands = 0b10000;  // where_masked
  t.back().random = true;  // dropout inside
  t.push_back(OpDef{"AttentionGrad", kGradDomain, 1, 1, 6, 8, 3, 4, I, false, inferAttentionGrad});
  t.back().random = true;
  // The CUDA target's attention over operands in place (passes/attention_in_place.cpp).
  t.push_back(OpDef{"Attention", kCudaDomain, 1, 1, 3, 5, 2, 2, I, false, inferTargetAttention});
  t.back().flops = targetAttentionFlops;
  t.back().random = true;
  t.push_back(OpDef{"AttentionGrad", kCudaDomain, 1, 1, 6, 8, 1, 4, I, false, inferTargetAttentionGrad});
  t.back().random = true;
}

}  // namespace ampc
