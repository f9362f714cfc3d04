#include "compiler/ops/geometry.h"

#include <algorithm>
#include <numeric>

namespace ampc {

std::vector<int64_t> stridesOf(const std::vector<int64_t>& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

std::optional<std::vector<int64_t>> broadcastShapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t broadcastIndex(int64_t i, const std::vector<int64_t>& out, const std::vector<int64_t>& in) {
  int64_t idx = 0, stride = 1;
  size_t off = out.size() - in.size();
  for (size_t k = out.size(); k-- > 0;) {
    int64_t coord = i % out[k];
    i /= out[k];
    if (k >= off) {
      int64_t d = in[k - off];
      if (d != 1) idx += coord * stride;
      stride *= d;
    }
  }
  return idx;
}

BroadcastIter::BroadcastIter(const std::vector<int64_t>& out, const std::vector<int64_t>& in)
    : dims_(out), strides_(out.size(), 0), coord_(out.size(), 0) {
  size_t off = out.size() - in.size();
  auto inStrides = stridesOf(in);
  for (size_t k = off; k < out.size(); ++k) strides_[k] = in[k - off] == 1 ? 0 : inStrides[k - off];
}

void BroadcastIter::next() {
  for (size_t k = dims_.size(); k-- > 0;) {
    offset_ += strides_[k];
    if (++coord_[k] < dims_[k]) return;
    offset_ -= strides_[k] * coord_[k];
    coord_[k] = 0;
  }
}

int64_t checkedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Error(std::to_string(a) + " + " + std::to_string(b) + " overflows int64");
  return r;
}
int64_t checkedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::to_string(a) + " x " + std::to_string(b) + " overflows int64");
  return r;
}

int64_t normalizeAxis(int64_t a, int64_t r) {
  if (a < -r || a >= std::max<int64_t>(r, 1))
    throw Error("axis " + std::to_string(a) + " is out of range for rank " + std::to_string(r));
  return a < 0 ? a + r : a;
}

Window windowOf(const Node& n, const std::vector<int64_t>& in, const std::vector<int64_t>& kernel, bool ceilMode) {
  size_t sp = in.size();
  if (kernel.size() != sp)
    throw Error("kernel rank " + std::to_string(kernel.size()) + " does not match the spatial rank " + std::to_string(sp));
  Window w;
  w.kernel = kernel;
  w.strides = n.getInts("strides", std::vector<int64_t>(sp, 1));
  w.dilations = n.getInts("dilations", std::vector<int64_t>(sp, 1));
  auto pads = n.getInts("pads", std::vector<int64_t>(2 * sp, 0));
  if (w.strides.size() != sp || w.dilations.size() != sp || pads.size() != 2 * sp)
    throw Error("strides/dilations/pads lengths do not match the spatial rank " + std::to_string(sp));
  std::string autoPad = n.getString("auto_pad", "NOTSET");
  for (size_t i = 0; i < sp; ++i) {
    int64_t k = kernel[i], s = w.strides[i], d = w.dilations[i];
    if (s <= 0 || d <= 0 || k <= 0) throw Error("strides, dilations and kernel must be positive");
    int64_t pb = pads[i], pe = pads[i + sp];
    if (pb < 0 || pe < 0) throw Error("pads must be non-negative");
    int64_t ext = checkedAdd(checkedMul(k - 1, d), 1), out;
    if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
      out = in[i] / s + (in[i] % s != 0);
      int64_t total = std::max<int64_t>(0, checkedAdd(checkedMul(out - 1, s), ext) - in[i]);
      pb = autoPad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else {
      if (autoPad == "VALID") pb = pe = 0;
      else if (autoPad != "NOTSET") throw Error("unknown auto_pad '" + autoPad + "'");
      const int64_t padded = checkedAdd(checkedAdd(in[i], pb), pe), span = padded - ext;
      if (span < 0 && !(ceilMode && -span < s))
        throw Error("the window (" + std::to_string(ext) + ") is larger than the padded input (" + std::to_string(padded) + ")");
      if (span < 0) {
        // ceil_mode with a window past the padded input (PyTorch's AvgPool2d(k, ceil_mode=True) on
        // a smaller map): one window, whose taps past the padded input count for nothing, so the
        // kernel stops at the padded input's end.
        w.kernel[i] = (padded - 1) / d + 1;
        out = 1;
      } else {
        out = (ceilMode ? span / s + (span % s != 0) : span / s) + 1;
      }
      if (ceilMode && (out - 1) * s >= in[i] + pb) --out;  // the last window would start in the padding
    }
    w.padBegin.push_back(pb);
    w.padEnd.push_back(pe);
    w.out.push_back(out);
  }
  return w;
}

SliceSpec sliceSpecOf(const std::vector<int64_t>& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                      std::vector<int64_t> axes, std::vector<int64_t> steps) {
  int64_t r = static_cast<int64_t>(x.size());
  if (axes.empty()) {
    axes.resize(starts.size());
    std::iota(axes.begin(), axes.end(), 0);
  }
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (starts.size() != ends.size() || axes.size() != starts.size() || steps.size() != starts.size())
    throw Error("starts, ends, axes and steps must have equal lengths");
  SliceSpec s{std::vector<int64_t>(r, 0), std::vector<int64_t>(r, 1), x};
  std::vector<bool> seen(r, false);
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t ax = normalizeAxis(axes[i], r);
    if (seen[ax]) throw Error("axis " + std::to_string(axes[i]) + " is repeated");
    seen[ax] = true;
    int64_t dim = x[ax], st = steps[i];
    if (st == 0) throw Error("step must not be 0");
    s.step[ax] = st;
    if (dim == 0) {
      s.out[ax] = 0;
      continue;
    }
    auto clampIdx = [&](int64_t v, int64_t lo, int64_t hi) {
      if (v < 0) v += dim;
      return std::clamp(v, lo, hi);
    };
    int64_t b, e;
    if (st > 0) {
      b = clampIdx(starts[i], 0, dim);
      e = clampIdx(ends[i], 0, dim);
    } else {
      b = clampIdx(starts[i], 0, dim - 1);
      e = ends[i] < -dim ? -1 : clampIdx(ends[i], -1, dim - 1);
    }
    // ceil(span / |step|) without overflow (|step| may be INT64_MIN's magnitude).
    const int64_t span = st > 0 ? e - b : b - e;
    const uint64_t mag = st > 0 ? static_cast<uint64_t>(st) : uint64_t{0} - static_cast<uint64_t>(st);
    s.out[ax] = span <= 0 ? 0 : static_cast<int64_t>((static_cast<uint64_t>(span) - 1) / mag + 1);
    s.start[ax] = b;
    s.step[ax] = st;
  }
  return s;
}

// The tensor a Constant node holds, from whichever value* attribute it has.
Tensor constantNodeValue(const Node& n) {
  if (const Attribute* a = n.attr("value"))
    if (const Tensor* t = std::get_if<Tensor>(a)) return *t;
  if (n.hasAttr("value_float")) return Tensor::fromDoubles(DType::f32, {}, {n.getFloat("value_float", 0)});
  if (n.hasAttr("value_int")) return Tensor::fromInts(DType::i64, {}, {n.getInt("value_int", 0)});
  if (n.hasAttr("value_ints")) {
    auto v = n.getInts("value_ints");
    return Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v);
  }
  if (const Attribute* a = n.attr("value_floats"))
    if (const auto* v = std::get_if<std::vector<float>>(a))
      return Tensor::fromDoubles(DType::f32, {static_cast<int64_t>(v->size())}, std::vector<double>(v->begin(), v->end()));
  throw Error(n.describe() + ": needs a value, value_float, value_int, value_ints or value_floats attribute (tensor)");
}

void shapeRangeOf(const Node& n, int64_t r, int64_t& b, int64_t& e) {
  b = n.getInt("start", 0);
  e = n.getInt("end", r);
  if (b < 0) b += r;
  if (e < 0) e += r;
  b = std::clamp<int64_t>(b, 0, r);
  e = std::clamp<int64_t>(e, 0, r);
}

Tensor constantOfShapeValue(const Node& n) {
  if (const Attribute* a = n.attr("value")) {
    if (const Tensor* t = std::get_if<Tensor>(a)) return *t;
  }
  return Tensor::fromDoubles(DType::f32, {1}, {0.0});
}

bool attentionMaskMap(const std::vector<int64_t>& lead, int64_t tq, int64_t tk, const std::vector<int64_t>& mask, AttentionMaskMap& map,
                      std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  const size_t L = lead.size();
  if (mask.size() < 2 || mask.size() > L + 2) return no("rank " + std::to_string(mask.size()) + " (the scores have " + std::to_string(L + 2) + ")");
  if (mask.back() != tk) return no("its last dim is not Tk = " + std::to_string(tk));
  const int64_t mq = mask[mask.size() - 2];
  if (mq != tq && mq != 1) return no("its second last dim is neither Tq = " + std::to_string(tq) + " nor 1");
  std::vector<int64_t> ml(L, 1);  // the mask's leading dims, right-aligned
  std::copy(mask.begin(), mask.end() - 2, ml.end() - static_cast<std::ptrdiff_t>(mask.size() - 2));
  size_t first = L, last = 0;  // the run of dims the mask does not broadcast over
  std::string broadcast;       // why it does not broadcast, if it does not
  for (size_t k = 0; k < L; ++k) {
    if (ml[k] != 1 && ml[k] != lead[k] && broadcast.empty()) broadcast = "leading dim " + std::to_string(k) + " is neither 1 nor " + std::to_string(lead[k]);
    if (ml[k] != 1) first = std::min(first, k), last = k + 1;
  }
  map = AttentionMaskMap{};
  map.rows = mq == tq;
  for (size_t k = first; k < last && broadcast.empty(); ++k) {
    if (ml[k] != lead[k]) broadcast = "the dims it does not broadcast over are not one run";
    map.mod *= lead[k];
  }
  for (size_t k = last; k < L && first < last; ++k) map.div *= lead[k];
  if (broadcast.empty()) return true;
  // The periodic form: one dim P != 1 (at `first`), the t = L - last dims after it 1.
  if (last != first + 1) return no(broadcast);
  int64_t n = 1;
  for (int64_t x : lead) n *= x;
  map.mod = ml[first];
  if (map.div <= 0 || n % map.div != 0 || (n / map.div) % map.mod != 0)
    return no(broadcast + ", and " + std::to_string(map.mod) + " slices do not repeat over the scores' " + std::to_string(n) + " in steps of " +
              std::to_string(map.div));
  return true;
}

AttentionDims attentionDims(const Node& n) {
  const auto v = n.getInts("dims");
  if (v.size() != 6) throw Error("attribute dims must be [B, H, Tq, Tk, D, Dv]");
  for (int64_t x : v)
    if (x <= 0) throw Error("attribute dims must be positive");
  return {v[0], v[1], v[2], v[3], v[4], v[5]};
}

void attentionSlotExtent(const AttentionDims& d, const std::string& slot, bool keyRows, int64_t& rows, int64_t& cols) {
  if (slot == "q" || slot == "dq") rows = d.Tq, cols = d.D;
  else if (slot == "k" || slot == "dk") rows = keyRows ? d.Tk : d.D, cols = keyRows ? d.D : d.Tk;
  else if (slot == "v" || slot == "dv") rows = d.Tk, cols = d.Dv;
  else if (slot == "o" || slot == "do") rows = d.Tq, cols = d.Dv;
  else throw Error("no attention operand slot '" + slot + "'");
}

std::vector<int64_t> attentionLogicalShape(const AttentionDims& d, const std::string& slot) {
  int64_t rows = 0, cols = 0;
  attentionSlotExtent(d, slot, false, rows, cols);
  return {d.B, d.H, rows, cols};
}

const char* attentionOperandSlot(bool grad, size_t i) {
  static const char* const kFwd[] = {"q", "k", "v"};
  static const char* const kBwd[] = {"do", "q", "k", "v", "o"};
  return grad ? (i < 5 ? kBwd[i] : nullptr) : (i < 3 ? kFwd[i] : nullptr);
}

const char* attentionGradSlot(size_t r) {
  static const char* const kGrad[] = {"dq", "dk", "dv"};
  return r < 3 ? kGrad[r] : nullptr;
}

AttentionLayout attentionLayout(const Node& n, const AttentionDims& d, const std::string& slot) {
  AttentionLayout l;
  const std::string name = slot + "_layout";
  if (!n.hasAttr(name)) {
    int64_t rows = 0, cols = 0;
    attentionSlotExtent(d, slot, false, rows, cols);
    l.sRow = cols;
    l.sB = checkedMul(rows, cols);
    return l;
  }
  const auto v = n.getInts(name);
  if (v.size() != 7 || (v[6] != 0 && v[6] != 1)) throw Error("attribute " + name + " must be [offset, heads, sB, sH, sRow, group, keyRows]");
  l = {v[0], v[1], v[2], v[3], v[4], v[5], v[6] != 0};
  if (l.keyRows && slot != "k" && slot != "dk") throw Error("attribute " + name + ": only k and dk take keyRows");
  return l;
}

int64_t attentionLayoutEnd(const AttentionLayout& l, const AttentionDims& d, int64_t rows, int64_t cols) {
  const bool contiguous = l.heads == 1 && l.group == 1;
  if (!contiguous && (l.heads != d.H || l.group < 1 || d.H % l.group != 0))
    throw Error("a laid-out operand must have heads H = " + std::to_string(d.H) + " and a group dividing it");
  if (l.offset < 0 || l.sB < 0 || l.sH < 0 || l.sRow < cols || (rows > 1 && l.sRow <= 0))
    throw Error("an attention operand's strides must be non-negative and its rows " + std::to_string(cols) + " elements or more apart");
  const int64_t slices = contiguous ? checkedMul(d.B, d.H) : d.B, heads = contiguous ? 1 : d.H / l.group;
  int64_t end = checkedAdd(l.offset, checkedMul(slices - 1, l.sB));
  end = checkedAdd(end, checkedMul(heads - 1, l.sH));
  end = checkedAdd(end, checkedMul(rows - 1, l.sRow));
  return checkedAdd(end, cols);
}

bool tiledTranspose(const Node& t, int64_t& batch, int64_t& R, int64_t& C) {
  if (!t.domain().empty() || t.op() != "Transpose" || !t.inputs()[0]) return false;
  const auto& xs = t.inputs()[0]->type().shape;
  const int64_t r = static_cast<int64_t>(xs.size());
  std::vector<int64_t> perm = t.getInts("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  std::vector<std::vector<int64_t>> groups;  // output order; input dims of each group
  for (int64_t d = 0; d < r; ++d) {
    if (xs[perm[d]] == 1) continue;
    if (!groups.empty() && groups.back().back() + 1 == perm[d]) groups.back().push_back(perm[d]);
    else groups.push_back({perm[d]});
  }
  auto size = [&](const std::vector<int64_t>& grp) {
    int64_t p = 1;
    for (int64_t d : grp) p *= xs[d];
    return p;
  };
  const size_t gn = groups.size();
  if (gn < 2 || gn > 3 || groups[gn - 1].front() > groups[gn - 2].front() || (gn == 3 && groups[0].front() > groups[2].front())) return false;
  batch = gn == 3 ? size(groups[0]) : 1;
  R = size(groups[gn - 1]);
  C = size(groups[gn - 2]);
  return true;
}

}  // namespace ampc
