// Index geometry that shape rules and kernels share: strides, numpy broadcasting, sliding
// windows (Conv and pooling), and Slice. Functions throw Error with a message that names no node;
// callers add the node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

std::vector<int64_t> stridesOf(const std::vector<int64_t>& shape);  // row-major, in elements

// int64 arithmetic of shape rules and geometry: an overflow throws Error ("... overflows int64")
// instead of wrapping to a wrong shape.
int64_t checkedAdd(int64_t a, int64_t b);
int64_t checkedMul(int64_t a, int64_t b);

// The numpy broadcast of two shapes; nullopt where they do not broadcast.
std::optional<std::vector<int64_t>> broadcastShapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// Index of the input element that output element `i` reads under numpy broadcasting.
int64_t broadcastIndex(int64_t i, const std::vector<int64_t>& outShape, const std::vector<int64_t>& inShape);

// Walks the elements of `outShape` in order and yields the offset into a broadcast input, in
// O(1) amortised per step.
class BroadcastIter {
 public:
  BroadcastIter(const std::vector<int64_t>& outShape, const std::vector<int64_t>& inShape);
  int64_t offset() const { return offset_; }
  void next();

 private:
  std::vector<int64_t> dims_, strides_, coord_;
  int64_t offset_ = 0;
};

// Sliding-window geometry of Conv / MaxPool / AveragePool over the spatial dims.
struct Window {
  std::vector<int64_t> kernel, strides, dilations, padBegin, padEnd, out;
};
// From the node's kernel_shape/strides/dilations/pads/auto_pad attributes; `spatialIn` is the
// input's spatial dims, `kernel` the window size per spatial dim.
Window windowOf(const Node& n, const std::vector<int64_t>& spatialIn, const std::vector<int64_t>& kernel, bool ceilMode);

// Slice: per input dim, the first index and the step; `out` gets the output shape.
struct SliceSpec {
  std::vector<int64_t> start, step, out;
};
SliceSpec sliceSpecOf(const std::vector<int64_t>& shape, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
                      std::vector<int64_t> axes, std::vector<int64_t> steps);

// The mask of fused attention (ampc.Attention) against scores [lead.., Tq, Tk]: its last dim is
// Tk, the one before it Tq or 1 (one row for every query: a padding mask), and its leading dims
// (right-aligned, missing ones 1) are 1 or the scores' own, those that are not 1 one contiguous run
// (a mask per batch [B, 1, ..], per head [1, H, ..], per both, or shared). Scores slice n (over the
// flattened leading dims) reads mask slice (n / div) % mod, of rows x Tk elements (rows: Tq, or 1).
// Else a periodic mask: leading dims [1.., P, 1..] (one dim P, after leading 1s, before t trailing
// 1s) where the scores' last t leading dims multiply to div and P divides the rest: mod = P, slice
// (n / div) % P. It is what a broadcast over a finer view of the scores leaves (Swin's window mask
// plus its bias: [1, nW H] over [B nW, H], one slice per window and head, read by every image;
// fuse-attention writes it, passes/fuse_attention.cpp refinedMasks).
struct AttentionMaskMap {
  int64_t div = 1, mod = 1;
  bool rows = true;  // false: one row of Tk for every query
};
// False, with `why`, when the mask does not have that form.
bool attentionMaskMap(const std::vector<int64_t>& lead, int64_t tq, int64_t tk, const std::vector<int64_t>& mask, AttentionMaskMap& map,
                      std::string* why = nullptr);

// Fused attention's operands where they lie (cuda::Attention, cuda::AttentionGrad: the CUDA
// target's attention-in-place rewrite, passes/attention_in_place.cpp). The logical operands are
// [B, H, rows, cols] (attribute dims = [B, H, Tq, Tk, D, Dv]); element (n = b H + h, row, col) of
// one lies at offset + b sB + (h / group) sH + row sRow + col of the value the node reads or writes
// there (elements). Slot names: q, k, v, o, do (reads; o also Attention's result), dq, dk, dv
// (AttentionGrad's results). k and dk are KT [D, Tk] rows d, or with keyRows K [Tk, D] rows j. A
// slot without its attribute (<slot>_layout = [offset, heads, sB, sH, sRow, group, keyRows]) is the
// contiguous logical tensor.
struct AttentionLayout {
  int64_t offset = 0, heads = 1, sB = 0, sH = 0, sRow = 0, group = 1;
  bool keyRows = false;
  std::vector<int64_t> toInts() const { return {offset, heads, sB, sH, sRow, group, keyRows ? 1 : 0}; }
};
struct AttentionDims {
  int64_t B = 1, H = 1, Tq = 0, Tk = 0, D = 0, Dv = 0;
};
// The node's dims attribute; Error unless six positive ints.
AttentionDims attentionDims(const Node& n);
// A slot's rows and columns as laid out (k/dk by keyRows).
void attentionSlotExtent(const AttentionDims& d, const std::string& slot, bool keyRows, int64_t& rows, int64_t& cols);
// The slot's logical shape [B, H, rows, cols] (KT's for k and dk).
std::vector<int64_t> attentionLogicalShape(const AttentionDims& d, const std::string& slot);
// The slot of Attention's (grad: AttentionGrad's) operand i, null for one without a layout (the
// mask, LSE); of AttentionGrad's gradient r (0 dq, 1 dk, 2 dv).
const char* attentionOperandSlot(bool grad, size_t i);
const char* attentionGradSlot(size_t r);
// The slot's layout: its attribute, or the contiguous [B H, rows, cols]. Error on a malformed attribute.
AttentionLayout attentionLayout(const Node& n, const AttentionDims& d, const std::string& slot);
// One past the last element the layout touches; Error unless its heads are H, group divides H and
// every stride is non-negative.
int64_t attentionLayoutEnd(const AttentionLayout& l, const AttentionDims& d, int64_t rows, int64_t cols);

// A Transpose that moves one group of adjacent input dims past another: [batch, R, C] -> [batch,
// C, R] once adjacent dims are merged and size-1 dims dropped (the CUDA target's tiled kernel).
// Fills batch, R, C.
bool tiledTranspose(const Node& t, int64_t& batch, int64_t& R, int64_t& C);

// Normalises a possibly negative axis against rank r; Error if out of range.
int64_t normalizeAxis(int64_t a, int64_t r);

// Attribute-derived values that shape rules and kernels share.
Tensor constantNodeValue(const Node& n);     // a Constant node's value (value, value_float, value_ints, ...)
Tensor constantOfShapeValue(const Node& n);  // ConstantOfShape's fill value (default f32 0)
void shapeRangeOf(const Node& n, int64_t rank, int64_t& begin, int64_t& end);  // Shape's start/end

}  // namespace ampc
