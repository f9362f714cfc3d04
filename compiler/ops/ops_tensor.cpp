// Data movement and shape ops: Reshape, Transpose, Concat, Split, Slice, Gather, Squeeze,
// Unsqueeze, Expand, Flatten, Pad, Tile, Trilu, Cast, CastLike, and the shape-subgraph ops
// Shape, ConstantOfShape, Constant, Range.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <unordered_map>

#include "compiler/ops/families.h"
#include "compiler/ops/geometry.h"
#include "compiler/target.h"

namespace ampc {
namespace {

// checkedAdd/checkedMul failing with the node named.
int64_t checked(const InferContext& c, int64_t (*op)(int64_t, int64_t), int64_t a, int64_t b) {
  try {
    return op(a, b);
  } catch (const Error& e) {
    c.fail(e.what());
  }
}

// ---- Reshape
void inferReshape(InferContext& c) {
  auto target = c.constInts(1);
  const auto& x = c.in(0).shape;
  bool allowZero = c.node().getInt("allowzero", 0) != 0;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == 0 && !allowZero) {
      c.check(i < x.size(), "shape entry 0 at position " + std::to_string(i) + " has no input dim to copy");
      target[i] = x[i];
    }
    if (target[i] == -1) {
      c.check(infer < 0, "more than one -1 in the target shape");
      infer = static_cast<int64_t>(i);
    } else {
      c.check(target[i] >= 0, "negative dim in the target shape");
      known = checked(c, checkedMul, known, target[i]);
    }
  }
  int64_t n = c.in(0).numel();
  if (infer >= 0) {
    c.check(known != 0 && n % known == 0, "cannot infer -1: " + std::to_string(n) + " elements into " + std::to_string(known));
    target[infer] = n / known;
  } else if (known != n) {
    c.fail("cannot reshape " + c.in(0).str() + " (" + std::to_string(n) + " elements) to " + std::to_string(known) + " elements");
  }
  c.setOut(0, TensorType{c.in(0).dtype, target});
}

// ---- Transpose
std::vector<int64_t> permOf(const InferContext& c) {
  int64_t r = c.in(0).rank();
  std::vector<int64_t> dflt(r);
  for (int64_t i = 0; i < r; ++i) dflt[i] = r - 1 - i;
  auto p = c.node().getInts("perm", dflt);
  std::vector<int64_t> sorted(p);
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(r);
  std::iota(iota.begin(), iota.end(), 0);
  c.check(sorted == iota, "perm is not a permutation of 0.." + std::to_string(r - 1));
  return p;
}
void inferTranspose(InferContext& c) {
  auto p = permOf(c);
  std::vector<int64_t> s;
  for (int64_t a : p) s.push_back(c.in(0).shape[a]);
  c.setOut(0, TensorType{c.in(0).dtype, s});
}

// ---- Concat
void inferConcat(InferContext& c) {
  const auto& first = c.in(0);
  int64_t ax = c.axis(c.node().getInt("axis", 0), first.rank());
  auto s = first.shape;
  for (size_t i = 1; i < c.numInputs(); ++i) {
    const auto& t = c.in(i);
    c.check(t.dtype == first.dtype, "input " + std::to_string(i) + " dtype differs: " + t.str() + " vs " + first.str());
    c.check(t.rank() == first.rank(), "input " + std::to_string(i) + " rank differs: " + t.str() + " vs " + first.str());
    for (int64_t d = 0; d < first.rank(); ++d)
      if (d != ax) c.check(t.shape[d] == s[d], "input " + std::to_string(i) + " " + t.str() + " differs off the concat axis");
    s[ax] = checked(c, checkedAdd, s[ax], t.shape[ax]);
  }
  c.setOut(0, TensorType{first.dtype, s});
}

// ---- Split: sizes from input 1 (13+), num_outputs (18+) or equal parts.
void inferSplit(InferContext& c) {
  const auto& x = c.in(0);
  int64_t ax = c.axis(c.node().getInt("axis", 0), x.rank());
  int64_t dim = x.shape[ax], n = static_cast<int64_t>(c.numOutputs());
  std::vector<int64_t> sizes;
  if (c.hasInput(1)) {
    sizes = c.constInts(1);
    c.check(static_cast<int64_t>(sizes.size()) == n, "split has " + std::to_string(sizes.size()) + " entries for " + std::to_string(n) + " outputs");
    int64_t sum = 0;
    for (int64_t v : sizes) {
      c.check(v >= 0, "split sizes must be non-negative");
      sum = checked(c, checkedAdd, sum, v);
    }
    c.check(sum == dim, "split sizes do not sum to the axis length " + std::to_string(dim));
  } else {
    if (c.node().hasAttr("num_outputs")) c.check(c.node().getInt("num_outputs", 0) == n, "num_outputs differs from the number of outputs");
    int64_t chunk = (dim + n - 1) / n;
    c.check(c.node().hasAttr("num_outputs") || dim % n == 0, "axis length " + std::to_string(dim) + " does not split evenly into " + std::to_string(n));
    for (int64_t i = 0; i < n; ++i) sizes.push_back(std::max<int64_t>(0, std::min(chunk, dim - i * chunk)));
  }
  for (int64_t i = 0; i < n; ++i) {
    auto s = x.shape;
    s[ax] = sizes[i];
    c.setOut(i, TensorType{x.dtype, s});
  }
}

// ---- Slice
void inferSlice(InferContext& c) {
  auto starts = c.constInts(1), ends = c.constInts(2);
  auto axes = c.hasInput(3) ? c.constInts(3) : std::vector<int64_t>{};
  auto steps = c.hasInput(4) ? c.constInts(4) : std::vector<int64_t>{};
  try {
    c.setOut(0, TensorType{c.in(0).dtype, sliceSpecOf(c.in(0).shape, starts, ends, axes, steps).out});
  } catch (const Error& e) {
    c.fail(e.what());
  }
}

// ---- Gather
void inferGather(InferContext& c) {
  const auto& x = c.in(0);
  c.check(x.rank() >= 1, "data must have rank >= 1");
  c.check(c.in(1).dtype == DType::i64 || c.in(1).dtype == DType::i32, "indices must be i32 or i64, got " + c.in(1).str());
  int64_t ax = c.axis(c.node().getInt("axis", 0), x.rank());
  std::vector<int64_t> s(x.shape.begin(), x.shape.begin() + ax);
  for (int64_t d : c.in(1).shape) s.push_back(d);
  s.insert(s.end(), x.shape.begin() + ax + 1, x.shape.end());
  if (const Tensor* idx = c.constIn(1))
    for (int64_t i = 0; i < idx->numel(); ++i) {
      int64_t v = idx->getInt(i);
      c.check(v >= -x.shape[ax] && v < x.shape[ax], "index " + std::to_string(v) + " is out of range for axis length " + std::to_string(x.shape[ax]));
    }
  c.setOut(0, TensorType{x.dtype, s});
}

// The indices of GatherElements / ScatterElements {axis} against their data (inputs 0 and 1).
void checkElementsIndices(InferContext& c) {
  const auto& x = c.in(0);
  const auto& ind = c.in(1);
  c.check(x.rank() >= 1, "data must have rank >= 1");
  c.check(ind.dtype == DType::i64 || ind.dtype == DType::i32, "indices must be i32 or i64, got " + ind.str());
  c.check(ind.rank() == x.rank(), "indices " + ind.str() + " must have the data's rank " + std::to_string(x.rank()));
  const int64_t ax = c.axis(c.node().getInt("axis", 0), x.rank());
  for (int64_t d = 0; d < x.rank(); ++d)
    c.check(d == ax || ind.shape[d] <= x.shape[d], "indices " + ind.str() + " are larger than the data " + x.str() + " off the axis");
}

// GatherElements(data, indices) {axis}: the result has the indices' shape.
void inferGatherElements(InferContext& c) {
  checkElementsIndices(c);
  c.setOut(0, TensorType{c.in(0).dtype, c.in(1).shape});
}

// GatherND(data, indices) {batch_dims}: indices [B..., M..., k] pick slices of data [B..., D...]:
// the result is [B..., M..., D[k:]...].
void inferGatherND(InferContext& c) {
  const auto& x = c.in(0);
  const auto& ind = c.in(1);
  c.check(ind.dtype == DType::i64, "indices must be i64, got " + ind.str());
  const int64_t b = c.node().getInt("batch_dims", 0);
  c.check(x.rank() >= 1 && ind.rank() >= 1, "data and indices must have rank >= 1");
  c.check(b >= 0 && b < std::min(x.rank(), ind.rank()), "batch_dims " + std::to_string(b) + " must be below both ranks");
  const int64_t k = ind.shape.back();
  c.check(k >= 1 && k <= x.rank() - b, "the indices' last dim " + std::to_string(k) + " must be in [1, data rank - batch_dims]");
  for (int64_t d = 0; d < b; ++d) c.check(x.shape[d] == ind.shape[d], "the batch dims of data and indices differ");
  std::vector<int64_t> s(ind.shape.begin(), ind.shape.end() - 1);
  s.insert(s.end(), x.shape.begin() + b + k, x.shape.end());
  c.setOut(0, TensorType{x.dtype, s});
}

// ScatterElements / ScatterND(data, indices, updates) {reduction}: the result is data with the
// updates written, added, or taken where larger (max) or smaller (min), where the indices say.
// Reduction mul is refused.
void checkScatterReduction(InferContext& c) {
  const std::string r = c.node().getString("reduction", "none");
  c.check(r == "none" || r == "add" || r == "max" || r == "min", "reduction '" + r + "' is not supported (none, add, max and min are)");
  c.check(c.in(2).dtype == c.in(0).dtype, "updates " + c.in(2).str() + " must have the data's dtype " + c.in(0).str());
}
// With reduction 'none', ONNX leaves undefined which update lands where two write one element, and
// so the gradient (which of them gets it). registry.h scatterWritesTwice finds such a pair; the
// importer refuses it where the indices are known ahead and the updates are not one constant value
// (the exporter's own zeros). PyTorch's dynamo exporter writes scatter_reduce(reduce="mean") so, and its
// TorchScript exporter index_put(accumulate=True) (a ScatterND into zeros, then an Add) and index_add
// over repeated indices: each would otherwise compute another function silently.
}  // namespace

std::optional<std::pair<int64_t, int64_t>> scatterWritesTwice(const Node& n, const TensorType& data, const Tensor& idx) {
  if (n.getString("reduction", "none") != "none") return std::nullopt;
  const auto& xs = data.shape;
  const auto& is = idx.type.shape;
  const bool nd = n.op() == "ScatterND";
  const int64_t k = nd ? is.back() : 0;
  const int64_t count = nd ? idx.numel() / std::max<int64_t>(k, 1) : idx.numel();
  const int64_t ax = nd ? 0 : (n.getInt("axis", 0) < 0 ? n.getInt("axis", 0) + data.rank() : n.getInt("axis", 0));
  std::unordered_map<int64_t, int64_t> first;
  std::vector<int64_t> at(is.size());
  for (int64_t i = 0; i < count; ++i) {
    int64_t flat = 0;
    if (nd) {
      for (int64_t d = 0; d < k; ++d) {
        const int64_t v = idx.getInt(i * k + d);
        flat = flat * xs[d] + (v < 0 ? v + xs[d] : v);
      }
    } else {
      int64_t rest = i;
      for (int64_t d = static_cast<int64_t>(is.size()) - 1; d >= 0; --d) at[d] = rest % is[d], rest /= is[d];
      const int64_t v = idx.getInt(i);
      at[ax] = v < 0 ? v + xs[ax] : v;
      for (size_t d = 0; d < xs.size(); ++d) flat = flat * xs[d] + at[d];
    }
    auto [it, fresh] = first.emplace(flat, i);
    if (!fresh) return std::make_pair(it->second, i);
  }
  return std::nullopt;
}
std::string scatterWritesTwiceMessage(std::pair<int64_t, int64_t> p) {
  return "updates " + std::to_string(p.first) + " and " + std::to_string(p.second) +
         " write the same element, and with reduction 'none' ONNX leaves undefined which lands (and which gets the gradient); "
         "PyTorch's exporters write so a function ampc cannot know: scatter_reduce(reduce='mean') (dynamo), index_put(accumulate=True) "
         "and index_add over repeated indices (TorchScript), whose sums such a graph loses";
}
namespace {

void inferScatterElements(InferContext& c) {
  checkElementsIndices(c);
  c.check(c.in(2).shape == c.in(1).shape, "updates " + c.in(2).str() + " must have the indices' shape " + c.in(1).str());
  checkScatterReduction(c);
  c.setOut(0, c.in(0));
}
void inferScatterND(InferContext& c) {
  const auto& x = c.in(0);
  const auto& ind = c.in(1);
  c.check(ind.dtype == DType::i64, "indices must be i64, got " + ind.str());
  c.check(x.rank() >= 1 && ind.rank() >= 1, "data and indices must have rank >= 1");
  const int64_t k = ind.shape.back();
  c.check(k >= 1 && k <= x.rank(), "the indices' last dim " + std::to_string(k) + " must be in [1, data rank]");
  std::vector<int64_t> want(ind.shape.begin(), ind.shape.end() - 1);
  want.insert(want.end(), x.shape.begin() + k, x.shape.end());
  c.check(c.in(2).shape == want, "updates " + c.in(2).str() + " must have shape " + TensorType{x.dtype, want}.str());
  checkScatterReduction(c);
  c.setOut(0, x);
}

// ---- Squeeze / Unsqueeze: axes from input 1 (13+).
void inferSqueeze(InferContext& c) {
  const auto& x = c.in(0);
  std::vector<bool> drop(x.shape.size(), false);
  if (c.hasInput(1)) {
    for (int64_t a : c.constInts(1)) {
      int64_t ax = c.axis(a, x.rank());
      c.check(x.shape[ax] == 1, "cannot squeeze axis " + std::to_string(a) + " of length " + std::to_string(x.shape[ax]));
      drop[ax] = true;
    }
  } else {
    for (size_t i = 0; i < drop.size(); ++i) drop[i] = x.shape[i] == 1;
  }
  std::vector<int64_t> s;
  for (size_t i = 0; i < drop.size(); ++i)
    if (!drop[i]) s.push_back(x.shape[i]);
  c.setOut(0, TensorType{x.dtype, s});
}
void inferUnsqueeze(InferContext& c) {
  const auto& x = c.in(0);
  auto axes = c.constInts(1);
  int64_t r = x.rank() + static_cast<int64_t>(axes.size());
  std::vector<bool> ins(r, false);
  for (int64_t a : axes) {
    int64_t ax = c.axis(a, r);
    c.check(!ins[ax], "axis " + std::to_string(a) + " is repeated");
    ins[ax] = true;
  }
  std::vector<int64_t> s;
  size_t k = 0;
  for (int64_t i = 0; i < r; ++i) s.push_back(ins[i] ? 1 : x.shape[k++]);
  c.setOut(0, TensorType{x.dtype, s});
}

// ---- Expand / Tile
void inferExpand(InferContext& c) {
  c.setOut(0, TensorType{c.in(0).dtype, broadcastShapes(c, c.in(0).shape, c.constInts(1))});
}
void inferTile(InferContext& c) {
  auto rep = c.constInts(1);
  c.check(static_cast<int64_t>(rep.size()) == c.in(0).rank(), "repeats must have one entry per input dim");
  auto s = c.in(0).shape;
  for (size_t i = 0; i < s.size(); ++i) {
    c.check(rep[i] >= 0, "repeats must be non-negative");
    s[i] = checked(c, checkedMul, s[i], rep[i]);
  }
  c.setOut(0, TensorType{c.in(0).dtype, s});
}

// ---- Flatten
void inferFlatten(InferContext& c) {
  const auto& x = c.in(0);
  int64_t a = c.node().getInt("axis", 1);
  c.check(a >= -x.rank() && a <= x.rank(), "axis " + std::to_string(a) + " is out of range for rank " + std::to_string(x.rank()));
  if (a < 0) a += x.rank();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < x.rank(); ++i) (i < a ? outer : inner) = checked(c, checkedMul, i < a ? outer : inner, x.shape[i]);
  c.setOut(0, TensorType{x.dtype, {outer, inner}});
}

// ---- Pad: pads from input 1, constant value input 2, axes input 3 (18+).
void inferPad(InferContext& c) {
  const auto& x = c.in(0);
  auto pads = c.constInts(1);
  std::vector<int64_t> axes;
  if (c.hasInput(3)) axes = c.constInts(3);
  else for (int64_t i = 0; i < x.rank(); ++i) axes.push_back(i);
  c.check(pads.size() == 2 * axes.size(), "pads must have 2 entries per padded axis");
  std::string mode = c.node().getString("mode", "constant");
  c.check(mode == "constant" || mode == "reflect" || mode == "edge" || mode == "wrap", "unknown mode '" + mode + "'");
  if (c.hasInput(2)) c.check(c.in(2).dtype == x.dtype, "constant_value dtype must match the data");
  auto s = x.shape;
  size_t n = axes.size();
  for (size_t i = 0; i < n; ++i) {
    int64_t ax = c.axis(axes[i], x.rank());
    s[ax] = checked(c, checkedAdd, s[ax], checked(c, checkedAdd, pads[i], pads[i + n]));
    c.check(s[ax] >= 0, "pads shrink axis " + std::to_string(ax) + " below zero");
  }
  c.setOut(0, TensorType{x.dtype, s});
}

// ---- Shape (start/end since 15)
void inferShape(InferContext& c) {
  int64_t b, e;
  shapeRangeOf(c.node(), c.in(0).rank(), b, e);
  c.setOut(0, TensorType{DType::i64, {std::max<int64_t>(0, e - b)}});
}

// ---- ConstantOfShape / Constant / Range
void inferConstantOfShape(InferContext& c) {
  auto s = c.constInts(0);
  Tensor v = constantOfShapeValue(c.node());
  c.check(v.numel() == 1, "value must hold one element");
  for (int64_t d : s) c.check(d >= 0, "negative dim in the shape");
  c.setOut(0, TensorType{v.type.dtype, s});
}

void inferConstant(InferContext& c) { c.setOut(0, constantNodeValue(c.node()).type); }

void inferRange(InferContext& c) {
  for (size_t i = 0; i < 3; ++i) {
    c.check(c.in(i).rank() == 0, "start, limit and delta must be scalars");
    c.check(c.in(i).dtype == c.in(0).dtype, "start, limit and delta must share a dtype");
    if (!c.constIn(i)) c.fail("input " + std::to_string(i) + " must be a compile-time constant (static shapes)");
  }
  double s = c.constIn(0)->getDouble(0), l = c.constIn(1)->getDouble(0), d = c.constIn(2)->getDouble(0);
  c.check(d != 0, "delta must not be 0");
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((l - s) / d)));
  c.setOut(0, TensorType{c.in(0).dtype, {n}});
}

// ---- Cast / CastLike / Trilu
void inferCast(InferContext& c) {
  auto to = dtypeFromOnnx(static_cast<int>(c.node().getInt("to", 0)));
  c.check(to.has_value(), "'to' names a dtype ampc does not support (ONNX type " + std::to_string(c.node().getInt("to", 0)) + ")");
  c.setOut(0, TensorType{*to, c.in(0).shape});
}
// cuda.MultiCast (passes/fuse_param_casts.cpp): result i is operand i cast to 'to' (f16 or bf16).
void inferMultiCast(InferContext& c) {
  auto to = dtypeFromOnnx(static_cast<int>(c.node().getInt("to", 0)));
  c.check(to.has_value() && isLowFloat(*to), "'to' must name f16 or bf16");
  c.check(c.numInputs() == c.numOutputs(), "one result per operand");
  for (size_t i = 0; i < c.numInputs(); ++i) {
    c.check(c.in(i).dtype == DType::f32, "operand " + std::to_string(i) + " must be f32, got " + c.in(i).str());
    c.setOut(i, TensorType{*to, c.in(i).shape});
  }
}
void inferCastLike(InferContext& c) { c.setOut(0, TensorType{c.in(1).dtype, c.in(0).shape}); }
void inferTrilu(InferContext& c) {
  c.check(c.in(0).rank() >= 2, "input must have rank >= 2");
  if (c.hasInput(1)) c.check(c.in(1).rank() == 0 && c.in(1).dtype == DType::i64, "k must be an i64 scalar");
  c.setOut(0, c.in(0));
}

constexpr auto C = AmpCategory::Clear;
constexpr int L = kMinOpset, H = kMaxOpset;

}  // namespace

void registerTensorOps(std::vector<OpDef>& t) {
  auto row = [&](std::string_view name, int since, int minIn, int maxIn, int minOut, int maxOut, bool diff, ShapeFn f) {
    t.push_back(OpDef{name, "", since, H, minIn, maxIn, minOut, maxOut, C, diff, f});
  };
  row("Reshape", L, 2, 2, 1, 1, true, inferReshape);
  row("Transpose", L, 1, 1, 1, 1, true, inferTranspose);
  row("Concat", L, 1, -1, 1, 1, true, inferConcat);
  row("Split", L, 1, 2, 1, 1 << 16, true, inferSplit);
  row("Slice", L, 3, 5, 1, 1, true, inferSlice);
  row("Gather", L, 2, 2, 1, 1, true, inferGather);
  row("GatherElements", L, 2, 2, 1, 1, true, inferGatherElements);
  row("GatherND", L, 2, 2, 1, 1, true, inferGatherND);
  row("ScatterElements", L, 3, 3, 1, 1, true, inferScatterElements);
  row("ScatterND", L, 3, 3, 1, 1, true, inferScatterND);
  row("Squeeze", L, 1, 2, 1, 1, true, inferSqueeze);
  row("Unsqueeze", L, 2, 2, 1, 1, true, inferUnsqueeze);
  row("Expand", L, 2, 2, 1, 1, true, inferExpand);
  row("Tile", L, 2, 2, 1, 1, true, inferTile);
  row("Flatten", L, 1, 1, 1, 1, true, inferFlatten);
  for (OpDef& d : t)
    if (d.domain.empty() && (d.name == "Reshape" || d.name == "Squeeze" || d.name == "Unsqueeze" || d.name == "Flatten")) d.view = true;
  row("Pad", L, 2, 4, 1, 1, true, inferPad);
  row("Trilu", L, 1, 2, 1, 1, true, inferTrilu);
  row("Cast", L, 1, 1, 1, 1, true, inferCast);
  t.back().dtypeAttr = "to";
  t.back().explicitCast = true;
  row("CastLike", L, 2, 2, 1, 1, true, inferCastLike);
  t.back().explicitCast = true;
  // The CUDA target's multi-tensor parameter cast (runtime/lower.cpp), after autodiff and autocast.
  t.push_back(OpDef{"MultiCast", kCudaDomain, 1, 1, 1, -1, 1, -1, C, false, inferMultiCast});
  row("Shape", L, 1, 1, 1, 1, false, inferShape);
  t.back().readsOnlyTypes = true;
  row("ConstantOfShape", L, 1, 1, 1, 1, false, inferConstantOfShape);
  row("Constant", L, 0, 0, 1, 1, false, inferConstant);
  row("Range", L, 3, 3, 1, 1, false, inferRange);
}

}  // namespace ampc
