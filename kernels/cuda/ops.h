// The CUDA backend's own kernels (everything that is not a cuBLASLt GEMM or a cuDNN convolution),
// launched by runtime/cuda/program.cpp. Each launcher takes raw device pointers and a small
// descriptor that the program builds once, when the plan loads, so a step only launches.
// Semantics equal the CPU reference kernels (kernels/cpu): f16/bf16 are widened to f32, computed in
// f32 and rounded once (round to nearest even) to the storage type.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace ampc::cuda {

inline constexpr int kMaxRank = 8;

// Storage types on the device (the IR's DType without f64).
enum class DT : int { f32, f16, bf16, i64, i32, i8, u8, boolean };
int dtSize(DT t);

// ---- elementwise ----------------------------------------------------------------------------
enum class Ew : int {
  // binary
  Add, Sub, Mul, Div, Pow, Max, Min, Equal, Less, LessEq, Greater, GreaterEq, And, Or,
  GeluGrad, GeluTanhGrad,  // (dY, X) -> dY * Gelu'(X)
  // ternary
  Where, Clip,
  // (in0 `cmp` in1) ? in2 : in3, the comparison fused into its Where (ReLU's gradient)
  WhereCmp,
  // unary
  Copy, Sqrt, Reciprocal, Exp, Log, Tanh, Sigmoid, Erf, Gelu, GeluTanh, Softplus, LeakyRelu, Relu, Neg, Abs, Not, IsNaN, IsInf,
  Sin, Cos, HardSigmoid, HardSwish, Elu, Selu, Celu, Mish, Floor, Ceil, Round, Sign,
  // binary, late additions
  PRelu, Mod,
  // SiLU x * sigmoid(x) (unary) and its gradient (dY, X) -> dY * SiLU'(X), each rounded once
  Silu, SiluGrad,
};
// How an operand is read for output element i: at i (same shape), at 0 (one element), at
// (i / div) % mod (its non-1 dims are one block of the output's dims: a row, a column, a mask over
// the last dims), or through broadcast strides.
enum class Access : int { Same, Scalar, Block, Strided };
inline constexpr int kMaxOperands = 4;
struct EwArgs {
  Ew op = Ew::Copy;
  Ew cmp = Ew::Greater;  // WhereCmp's comparison
  int nin = 1, rank = 0;
  int64_t n = 0;
  int64_t shape[kMaxRank] = {};
  const void* in[kMaxOperands] = {};
  DT inType[kMaxOperands] = {};
  Access access[kMaxOperands] = {};
  int64_t stride[kMaxOperands][kMaxRank] = {};
  int64_t div[kMaxOperands] = {1, 1, 1, 1}, mod[kMaxOperands] = {1, 1, 1, 1};  // Access::Block
  void* out = nullptr;
  DT outType = DT::f32;
  float alpha = 0.01f;               // LeakyRelu, HardSigmoid, Elu, Selu, Celu
  float beta = 0.0f;                 // HardSigmoid's beta, Selu's gamma
  int fmod = 0;                      // Mod
  int detectNeg = 1, detectPos = 1;  // IsInf
  bool intMath = false;              // compute in int64 (integer operands), else in f32
};
cudaError_t elementwise(const EwArgs& a, cudaStream_t st);

// ---- data movement --------------------------------------------------------------------------
// dst[dstOffset + sum_d idx_d dstStride_d] = src[srcOffset + sum_d idx_d srcStride_d] over `shape`
// (element strides; 0 broadcasts). Transpose, Slice, Expand, Concat, Split, Pad, SliceGrad.
struct CopyArgs {
  int rank = 0;
  int64_t n = 0;
  int64_t shape[kMaxRank] = {};
  int64_t srcStride[kMaxRank] = {}, dstStride[kMaxRank] = {};
  int64_t srcOffset = 0, dstOffset = 0;
  int elemBytes = 4;
};
cudaError_t stridedCopy(const void* src, void* dst, const CopyArgs& a, cudaStream_t st);
// out[b, c, r] = in[b, r, c] for b < batch, r < R, c < C (elements of 2 or 4 bytes): a transpose
// that moves the innermost dim, through 32 x 32 tiles in shared memory (both sides coalesced).
cudaError_t transpose2d(const void* src, void* dst, int64_t batch, int64_t R, int64_t C, int elemBytes, cudaStream_t st);
// The same from f16/bf16 (`from`) to f32: a widening Cast in front read through.
cudaError_t transpose2dWiden(const void* src, DT from, float* dst, int64_t batch, int64_t R, int64_t C, cudaStream_t st);
// out[b, p, c] = c < C ? in[b, c, p] : 0 for c < Cp (NCHW -> NHWC with the channels padded with
// zeros to Cp), and back: out[b, c, p] = in[b, p, c] for c < C. Elements of 2 or 4 bytes.
cudaError_t padChannelsLast(const void* src, void* dst, int64_t batch, int64_t C, int64_t P, int64_t Cp, int elemBytes, cudaStream_t st);
cudaError_t unpadChannelsLast(const void* src, void* dst, int64_t batch, int64_t C, int64_t P, int64_t Cp, int elemBytes, cudaStream_t st);
// Fills n elements of type t with v.
cudaError_t fill(void* dst, DT t, int64_t n, double v, cudaStream_t st);

// Deterministic scatter-adds (ProgramOptions::deterministic): instead of atomics, each item's target
// (or the sentinel `targets` where it has none) is sorted stably with the item's index (CUB's radix
// sort), and one thread per target sums its items in item order, so the sums' order is fixed by the
// indices alone. orderScratch(items) bytes (0: more than 2^31 - 1 items, not supported); the
// launchers below take that scratch as `order` (null: atomics).
struct OrderBuffers {
  uint32_t *keys = nullptr, *items = nullptr, *sortedKeys = nullptr, *sortedItems = nullptr;
  void* temp = nullptr;
  size_t tempBytes = 0;
  int64_t n = 0;
};
size_t orderScratch(int64_t items);
OrderBuffers orderBuffers(void* scratch, int64_t items);
cudaError_t sortOrder(const OrderBuffers& b, uint32_t targets, cudaStream_t st);

// Gather along an axis: out[o, j, i] = x[o, idx[j], i] (negative indices wrap; out of range: 0).
cudaError_t gather(const void* x, const void* idx, DT idxType, void* out, int elemBytes, int64_t outer, int64_t dim, int64_t n,
                   int64_t inner, cudaStream_t st);
// GatherGrad: acc (f32) [outer, dim, inner] = base (of type baseT, widened; zeros when null), then
// += dy[o, j, i] at idx[j]; then out (type t) = acc, unless out is null (acc is the result: t f32).
cudaError_t gatherGrad(const void* dy, DT t, const void* idx, DT idxType, const void* base, DT baseT, float* acc, void* out, int64_t outer,
                       int64_t dim, int64_t n, int64_t inner, void* order, cudaStream_t st);
// ScatterAddFlat: acc (f32, zeroed here) [outN] += dy[i] at idx[i] (i64); then out = acc.
cudaError_t scatterAddFlat(const void* dy, DT t, const int64_t* idx, int64_t n, float* acc, void* out, int64_t outN, void* order, cudaStream_t st);

// GatherElements and GatherND: output element i reads data at an offset built from the indices
// (negative indices wrap; out of range reads 0). Elements: i walks the indices' shape (ishape),
// and the axis dim of its multi-index is replaced by the index. ND: index tuples of k entries,
// the first b dims batch dims (tuples per batch: perBatch), each tuple a slice of `slice` elements.
enum class IndexMode : int { Elements, ND };
struct IndexGeom {
  IndexMode mode = IndexMode::Elements;
  int rank = 0;  // the data's rank
  int64_t n = 0;  // output elements
  int64_t xstride[kMaxRank] = {}, xshape[kMaxRank] = {}, ishape[kMaxRank] = {};
  int axis = 0;                       // Elements
  int b = 0, k = 1;                   // ND
  int64_t slice = 1, perBatch = 1;    // ND
};
cudaError_t indexGather(const void* x, int elemBytes, const void* idx, DT idxType, void* out, const IndexGeom& g, cudaStream_t st);
// Their gradients: acc (f32, zeroed here) of outN elements += dy[i] at i's data offset; then out = acc.
cudaError_t indexGatherGrad(const void* dy, DT t, const void* idx, DT idxType, float* acc, void* out, int64_t outN, const IndexGeom& g,
                            void* order, cudaStream_t st);
// ScatterElements / ScatterND after out = data: update i goes to its data offset (IndexGeom as for
// the gather that reads it back; out of range: skipped). add: atomic adds (f32, f16, bf16, i32, i64);
// with `order`, float updates are added to each element in update order instead.
cudaError_t indexScatter(const void* upd, DT t, int elemBytes, const void* idx, DT idxType, void* out, const IndexGeom& g, bool add,
                         void* order, int64_t outN, cudaStream_t st);
// Trilu over [batches, R, C]: keeps element (i, j) where j - i >= k (upper) or j - i <= k (lower), else 0.
cudaError_t trilu(const void* x, void* y, int elemBytes, int64_t batches, int64_t R, int64_t C, int64_t k, bool upper, cudaStream_t st);
// ampc::RotateHalf over rows of 2h float elements (2, 4 or 8 bytes): y = [-x2, x1] (negFirst, sign 1)
// or [x2, -x1] (sign -1); the negations flip the sign bit, as Neg does.
cudaError_t rotateHalf(const void* x, void* y, int elemBytes, int64_t rows, int64_t h, bool negFirst, cudaStream_t st);
// CumSum along one axis of x viewed as [outer, n, inner]: float types sum in f32, integers in int64.
cudaError_t cumSum(const void* x, void* out, DT t, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse, cudaStream_t st);
// TopK over [outer, n, inner] along n: the k largest (smallest) values, sorted, with their int64
// indices; equal values in index order, NaN above every number (the CPU kernel's order).
cudaError_t topK(const void* x, DT t, void* vals, int64_t* idx, int64_t outer, int64_t n, int64_t inner, int64_t k, bool largest, cudaStream_t st);

// Det over `batches` [n, n] matrices, in f64 (kernels/cpu's detKernel), and its gradient dX = dY *
// cofactors(X) (detGradKernel). work: detWorkBytes(batches, n) bytes of scratch.
size_t detWorkBytes(int64_t batches, int64_t n);
cudaError_t det(const void* x, DT t, void* y, int64_t batches, int64_t n, double* work, cudaStream_t st);
cudaError_t detGrad(const void* dy, DT dyT, const void* x, DT t, void* dx, int64_t batches, int64_t n, double* work, cudaStream_t st);

// ---- reductions -----------------------------------------------------------------------------
enum class Red : int { Sum, Mean, Max, Min };
// out[k] = reduce over the `rrank` reduced dims; the input offset of output element k is built from
// the kept dims (kshape, kstride) and the reduced dims (rshape, rstride).
struct ReduceArgs {
  Red op = Red::Sum;
  int krank = 0, rrank = 0;
  int64_t kshape[kMaxRank] = {}, kstride[kMaxRank] = {};
  int64_t rshape[kMaxRank] = {}, rstride[kMaxRank] = {};
  int64_t outN = 0, redN = 0;
  DT t = DT::f32;
};
cudaError_t reduce(const void* x, void* out, const ReduceArgs& a, cudaStream_t st);
// out[k] = scale * sum_r x[r, k] for x [R, K] (float types): a bias gradient, a sum over leading
// dims. Column tiles over slices of the rows, each slice's f32 sums in `part`
// (reduceColumnsScratch(R, K) bytes), then the slices summed in order: deterministic.
size_t reduceColumnsScratch(int64_t R, int64_t K);
cudaError_t reduceColumns(const void* x, DT t, void* out, int64_t R, int64_t K, float scale, float* part, cudaStream_t st);
// out[k] = scale * sum_{a, b} x[a, k, b] for x [A, K, B] (float types): a convolution's bias gradient
// or a per-channel scale's (NCHW, summed over N and H W). Blocks per (k, slice of A) read rows of B
// contiguous elements; the slices' f32 sums (reduceMiddleScratch bytes) are added in order.
size_t reduceMiddleScratch(int64_t A, int64_t K, int64_t B);
// The other way round: x [A, K, B] summed over K (out [A, B]), a thread per output; for a short K
// between kept dims (grouped-query attention's Expand gradient: [B, Hkv, g, T, D] over g).
cudaError_t reduceStrided(const void* x, DT t, void* out, int64_t A, int64_t K, int64_t B, float scale, cudaStream_t st);
cudaError_t reduceMiddle(const void* x, DT t, void* out, int64_t A, int64_t K, int64_t B, float scale, float* part, cudaStream_t st);

// ---- depthwise convolution (kernels/cuda/depthwise.cu) ----------------------------------------
// group == C input channels == C output channels, NCHW (a 1-d one as 1 x W), f32/f16/bf16; sums in
// f32, rounded once. Square 3/5/7 windows at stride 1 or 2 without dilation run register-window
// kernels; other windows run a thread per output (or input, for the data gradient).
struct DwArgs {
  int64_t N = 0, C = 0, planes = 0;  // planes = N * C
  int H = 0, W = 0, OH = 0, OW = 0;
  int KH = 0, KW = 0, SH = 1, SW = 1, PH = 0, PW = 0, DH = 1, DW = 1;
};
// y = conv(x, w) + bias (bias of type biasT per channel, or null).
cudaError_t depthwiseForward(const DwArgs& a, DT t, const void* x, const void* w, const void* bias, DT biasT, void* y, cudaStream_t st);
cudaError_t depthwiseBackwardData(const DwArgs& a, DT t, const void* dy, const void* w, void* dx, cudaStream_t st);
// dw through f32 partials per slice of (image, row) (depthwiseFilterScratch bytes), added in order.
size_t depthwiseFilterScratch(const DwArgs& a);
cudaError_t depthwiseBackwardFilter(const DwArgs& a, DT t, const void* x, const void* dy, void* dw, float* part, cudaStream_t st);

// ---- random ---------------------------------------------------------------------------------
// Dropout with the CPU backend's Philox stream (kernels/cpu/kernel.h): element i is kept when
// dropoutDraw(seed, *step, nodeKey, i) >= dropoutThreshold(ratio). `step` is a device counter (the step being run), so a
// captured CUDA graph draws fresh masks on every replay. mask may be null. With `sum` (f32), a
// residual Add after the result's widening Cast is folded in: sum = res + widen(y), y not written.
cudaError_t dropout(const void* x, DT t, void* y, bool* mask, const float* res, float* sum, int64_t n, float ratio, uint64_t seed,
                    const uint64_t* step, uint32_t nodeKey, cudaStream_t st);
// DropoutGrad: dx = mask ? dy / (1 - ratio) : 0, dx of type t. dy is read as dyT: f32 when a
// narrowing Cast to t in front is read through (dy rounded to t first, as the Cast does).
cudaError_t dropoutGrad(const void* dy, DT dyT, DT t, const bool* mask, void* dx, int64_t n, float ratio, cudaStream_t st);
cudaError_t addStep(uint64_t* step, cudaStream_t st);
// RandomUniformLike (a + (b - a) u), RandomNormalLike (a + b z, Box-Muller over draws 2i, 2i+1) and
// Bernoulli (u < p[i]) on Dropout's stream: the CPU's numbers.
enum class RandomMode : int { Uniform, Normal, Bernoulli };
cudaError_t randomFill(RandomMode mode, const void* p, DT pt, void* out, DT t, int64_t n, float a, float b, uint64_t seed,
                       const uint64_t* step, uint32_t nodeKey, cudaStream_t st);

// ---- fused attention (attention.cu) ----------------------------------------------------------
// Q [N, Tq, D], KT [N, D, Tk], V [N, Tk, Dv] of type t (f32/f16/bf16), D and Dv <= 64; mask
// (optional, maskType): slice n reads mask slice (n / maskDiv) % maskMod, of [Tq, Tk] elements
// (maskRows) or one row [1, Tk] for every query (compiler/ops/geometry.h's attentionMaskMap).
// Where an attention operand's elements are: (n, row, col) at (n / heads) sB + (n % heads) sH +
// row sRow + col, n over the N leading slices. Contiguous [N, rows, cols]: heads 1, sB = rows * cols,
// sRow = cols. The WMMA and f32 kernels take contiguous operands only.
struct AttnLayout {
  int64_t heads = 1, sB = 0, sH = 0, sRow = 0;
  int64_t group = 1;  // slice n = b heads + h is stored head h / group (grouped-query attention's K, V)
};
struct AttentionArgs {
  DT t = DT::f32;
  int64_t N = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  AttnLayout q, k, v, o, dO, dq, dk, dv;  // k, dk: [D, Tk] rows d (KT), or with kRows / dkRows [Tk, D] rows j
  bool kRows = false, dkRows = false;
  const void* mask = nullptr;
  DT maskType = DT::f32;
  int64_t maskDiv = 1, maskMod = 1;
  bool maskRows = true;
  bool zeroEmpty = false;  // zero_empty_rows: a row with every score -inf gets O = 0 and LSE +inf
  // score_floor: the scores are max(s, floor), floor <= -1e6 (-inf: none). It changes rows whose
  // every score is at or below it alone, which the fill-row fix-ups recompute (their LSE is below
  // kAttentionFillLse, or -inf): the main kernels leave it to them. floorTie: the gradient's factor
  // on a score equal to the floor (the node's floor_tie: 1, 1/2 or 0); below it, 0.
  float floor = -INFINITY, floorTie = 1.0f;
  // where_causal: the fill-row fix-ups give the scores above the diagonal (key j > query i) no
  // gradient in dQ and dK (a Where's, summed into the mask); the mask's gradient still takes them.
  bool whereCausal = false;
  // where_masked (the backward's operand 7, bool, the mask's shape and map): the same for any Where's
  // entries, nonzero where it masked them.
  const uint8_t* whereMasked = nullptr;
  float scale = 1.0f, ratio = 0.0f;  // ratio 0: no dropout
  uint64_t seed = 0;
  const uint64_t* step = nullptr;    // device step counter (Dropout's)
  uint32_t key = 0;                  // the Dropout node's key
  const uint8_t* flags = nullptr;    // with a mask: its tile flags (attentionMaskTiles)
  uint32_t* keep = nullptr;          // with dropout: the scores' keep bits, drawn by attentionForward and
                                     // read by the backward of the same step (attentionKeepBytes)
  // The backward's dQ without atomics: each key tile stores its dS K into a slice of its own, and
  // the slices are summed in key-tile order (scratch: one f32 dQ per key tile).
  bool deterministic = false;
  // The backward, where the mask is trained (an additive bias): its gradient, f32 with the mask's
  // shape, the unscaled score gradients summed over the dims it broadcasts along (f32 atomics; with
  // `deterministic`, each score's into scratch and then summed in a fixed order). Set it before
  // asking attentionScratch.
  float* dMask = nullptr;
};
// Whether `a` runs the f16/bf16 tensor-core (mma.sync) kernels, the only ones that take strided
// operands (AttnLayout other than contiguous): head dims multiples of 8, and with dropout Tk a
// multiple of 4.
bool attentionTensorCores(const AttentionArgs& a);
// The mask's tile flags (which 64 x 64 tiles are dead, all zero, or read), computed once per mask
// value and step and shared by every node that reads that mask: attentionFlagBytes(a) bytes.
size_t attentionFlagBytes(const AttentionArgs& a);
cudaError_t attentionMaskTiles(const AttentionArgs& a, uint8_t* flags, cudaStream_t st);
// Bytes of the keep bits (AttentionArgs::keep): with dropout on the f16/bf16 tensor-core path the
// forward needs them (attentionForward draws the decisions into them first, then the forward reads
// them), and the backward of the same step reads them instead of drawing the stream again (without
// them it draws); 0 where the kernels for `a` take none (no dropout, or off that path).
size_t attentionKeepBytes(const AttentionArgs& a);
// Blocks of the tensor-core backward that `a` launches resident per SM on the current device (0 off
// that path, -1 on a CUDA error): its registers and shared memory are sized for two (GpuAttention
// checks it, so that a change that grows them cannot halve the occupancy unseen).
int attentionBackwardBlocksPerSm(const AttentionArgs& a);
// Scratch bytes the launches need (the backward's row sums and f32 dQ).
size_t attentionScratch(const AttentionArgs& a, bool backward);
// zero_empty_rows after a forward that leaves a row whose every score is -inf with a log-sum-exp of
// NaN or -inf (cuDNN's fused SDPA): each such row of O [B, H, Tq, Dv] (type t, at sB, sH, sRow
// elements) becomes 0 and its lse [B H Tq] +inf, as the fused op defines it (AttentionArgs::zeroEmpty).
cudaError_t attentionZeroEmptyRows(void* O, DT t, float* lse, int64_t B, int64_t H, int64_t Tq, int64_t Dv, int64_t sB, int64_t sH, int64_t sRow,
                                   cudaStream_t st);
// Rows masked everywhere by a finite fill (kernels/cuda/limits.h, kAttentionFillLse), for a node
// with a mask that may make them (attentionNeedsFillRows; not the exact causal one):
// - attentionFillRowsForward after the forward (the kernels' or cuDNN's): each row whose LSE is
//   below the bound or not finite is recomputed over every key as PyTorch's softmax computes it;
// - attentionFillRowsLse before the backward: the LSE it reads, +inf on fill rows (it leaves them
//   alone; `out` holds N Tq floats);
// - attentionFillRowsBackward after it: those rows' gradients, in a fixed order (a trained mask's
//   with atomics unless `deterministic`).
// A row's scores sit in shared memory up to 24576 keys, in the scratch past that (any length).
bool attentionNeedsFillRows(const AttentionArgs& a);
size_t attentionFillRowsScratch(const AttentionArgs& a, bool backward);  // the forward's or the backward's fix-up's scratch bytes
cudaError_t attentionFillRowsForward(const void* Q, const void* KT, const void* V, void* O, float* lse, void* scratch, const AttentionArgs& a,
                                     cudaStream_t st);
cudaError_t attentionFillRowsLse(const float* lse, float* out, const AttentionArgs& a, cudaStream_t st);
cudaError_t attentionFillRowsBackward(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                                      void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st);
// O [N, Tq, Dv], lse f32 [N, Tq].
cudaError_t attentionForward(const void* Q, const void* KT, const void* V, void* O, float* lse, const AttentionArgs& a, cudaStream_t st);
// dQ, dKT, dV (the inputs' shapes and type) from dO, the inputs, O and lse.
cudaError_t attentionBackward(const void* dO, const void* Q, const void* KT, const void* V, const void* O, const float* lse, void* dQ,
                              void* dKT, void* dV, void* scratch, const AttentionArgs& a, cudaStream_t st);

// Plan checking (ProgramOptions::checkPlan): adds the count of NaN elements of x (n of type t) into
// *count (the poison itself is cudaMemsetAsync to 0xFF bytes: NaN in f32, f16 and bf16).
cudaError_t countNaN(const void* x, DT t, int64_t n, unsigned long long* count, cudaStream_t st);
// Adds x's Inf count to rec[0] and its NaN count to rec[1], and raises rec[2] to the bits of its
// largest finite |x| as an f32 (zero the record first).
cudaError_t scanFinite(const void* x, DT t, int64_t n, unsigned long long* rec, cudaStream_t st);

// ---- normalisation and losses (rows: [outer, axis, inner], a row is one (outer, inner) pair) --
cudaError_t softmax(const void* x, void* y, DT t, int64_t outer, int64_t axis, int64_t inner, bool log, cudaStream_t st);
// LayerNorm over the last D elements of each of `rows` rows; scale/bias have D elements (bias may be
// null); mean/invStd (f32, may be null) get one value per row. x is read as t, y written as yT (a
// narrowing Cast after it folds into the write). rms: RMS normalisation (ampc.RmsNorm), the mean
// taken as 0.
cudaError_t layerNorm(const void* x, const void* scale, const void* bias, void* y, DT t, DT yT, DT st_, int64_t rows, int64_t D, float eps,
                      bool rms, float* mean, float* invStd, cudaStream_t st);
// LayerNormGrad -> dx, dscale, dbias; `ws` is scratch of layerNormGradScratch(rows, D) bytes. dy is
// read as dyT and x as t (a widening Cast in front of either folds into the read); dx and `residual`
// are dxT. With a residual (may be dx itself), dx gets dx + residual (a residual Add folded in).
// rms: ampc.RmsNorm's gradient (LayerNormGrad {rms = 1}).
size_t layerNormGradScratch(int64_t rows, int64_t D);
cudaError_t layerNormGrad(const void* dy, DT dyT, const void* x, const void* scale, DT t, DT scaleT, void* dx, DT dxT, const void* residual, void* dscale, void* dbias,
                          DT pT, int64_t rows, int64_t D, float eps, bool rms, float* ws, cudaStream_t st);
// BatchNormalization over [N, C, S]. Training: batch statistics, running stats updated into
// runMeanOut/runVarOut (ONNX: momentum * running + (1 - momentum) * batch, population variance).
// Inference: the given mean/var. `ws` is scratch of 48 * C bytes (f64 sums, f32 statistics).
struct BatchNormArgs {
  int64_t N = 0, C = 0, S = 0;
  float eps = 1e-5f, momentum = 0.9f;
  bool training = false;
  bool relu = false;             // the forward writes max(0, y) (cuda::BatchNormalization {relu})
  const void* residual = nullptr;  // the forward writes y + residual (X's type and shape: cuda::BatchNormalization's input 5), before the Relu
  bool nhwc = false;             // x, y, dy, dx stored [N, S, C] (C a multiple of 8, at most 2048)
  DT t = DT::f32, pT = DT::f32;  // X/Y type (f32, f16 or bf16), scale/bias/mean/var type
};
// Scratch bytes that batchNorm and batchNormGrad need for C channels (with the per-block partial
// sums: NHWC of at most kNhwcSumBlocks blocks, NCHW of C x P blocks, P at most (2048 + C - 1) / C).
inline constexpr int kNhwcSumBlocks = 1024;
inline size_t batchNormScratchBytes(int64_t C, bool nhwc) {
  const size_t c = static_cast<size_t>(C);
  return (4 * sizeof(double) + 6 * sizeof(float)) * c +
         (nhwc ? kNhwcSumBlocks * 4 * sizeof(float) * c : 4 * sizeof(double) * c * static_cast<size_t>((2048 + C - 1) / C));
}
cudaError_t batchNorm(const void* x, const void* scale, const void* bias, const void* mean, const void* var, void* y, void* runMeanOut,
                      void* runVarOut, float* ws, const BatchNormArgs& a, cudaStream_t st);
// BatchNormGrad(dY, X, scale, mean, var) -> dX, dScale, dBias; `ws` as batchNorm's. With `gate`
// (X's type and shape, may be null) dY is read as gate > 0 ? dY : 0: the gradient of a Relu whose
// output is `gate`, folded in.
cudaError_t batchNormGrad(const void* dy, const void* gate, const void* x, const void* scale, const void* mean, const void* var, void* dx, void* dscale,
                          void* dbias, float* ws, const BatchNormArgs& a, cudaStream_t st);
// SoftmaxCrossEntropyLoss / its gradient over scores [outer, C, inner], labels (i64/i32)
// [outer, inner], optional class weights [C]. reduction: 0 none, 1 sum, 2 mean. `ws` f32 scratch of
// 2 * outer * inner + 2.
// The scores are read as `t` and computed in f32 (a Cast to f32 in front folds into the read);
// the gradient is written as `gT` (a Cast after it folds into the write).
struct LossArgs {
  int64_t outer = 0, C = 0, inner = 0;
  int reduction = 2;
  bool hasIgnore = false;
  int64_t ignore = -100;
  DT t = DT::f32, labelT = DT::i64, outT = DT::f32, wT = DT::f32, gT = DT::f32;
  // Row pitches (elements) of the scores and of their gradient where they are stored padded
  // (inner == 1, f16/bf16, no log-probs); 0: C. The gradient's pad columns are written as zeros.
  int64_t pitch = 0, gPitch = 0;
  // Each row's max and sum of exp(x - max) (two floats a row; inner == 1, no log-probs): the loss
  // writes them, its gradient reads them instead of a second pass over the scores. Null: not kept.
  float* rowStats = nullptr;
};
cudaError_t softmaxCrossEntropy(const void* x, const void* labels, const void* weights, void* loss, void* logProb, float* ws,
                                const LossArgs& a, cudaStream_t st);
cudaError_t softmaxCrossEntropyGrad(const void* dloss, DT dlT, const void* x, const void* labels, const void* weights, void* dx, float* ws,
                                    const LossArgs& a, cudaStream_t st);

// ---- pooling (NC + spatial, up to 3 spatial dims) -------------------------------------------
struct PoolArgs {
  int nsp = 2;
  int64_t N = 0, C = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1}, pad[3] = {0, 0, 0}, padEnd[3] = {0, 0, 0};
  bool includePad = false;
  bool nhwc = false;  // x, y and the indices stored [N, H, W, C] (2 spatial dims; the indices are offsets in that order)
  DT t = DT::f32;
};
// MaxPool; indices (i64, may be null) are flat offsets into x, row-major.
cudaError_t maxPool(const void* x, void* y, int64_t* indices, const PoolArgs& a, cudaStream_t st);
cudaError_t averagePool(const void* x, void* y, const PoolArgs& a, cudaStream_t st);
// MaxPool's gradient for a channels-last pool (a.nhwc): dx = the sum of dy over the windows whose
// index chose each element (ScatterAddFlat's sums, gathered).
cudaError_t maxPoolGradChannelsLast(const void* dy, const int64_t* indices, void* dx, const PoolArgs& a, cudaStream_t st);
// GlobalAveragePool of x stored [N, P, C] (channels-last): y [N, C] the means over P.
cudaError_t globalAveragePoolChannelsLast(const void* x, void* y, DT t, int64_t N, int64_t P, int64_t C, cudaStream_t st);
// y [N, P, C] = x [N, C] broadcast over P (an Expand of [N, C, 1, 1] into a channels-last result).
cudaError_t broadcastChannelsLast(const void* x, void* y, int64_t N, int64_t P, int64_t C, int elemBytes, cudaStream_t st);
// AveragePoolGrad: `acc` f32 scratch of the input's size.
// AveragePool's gradient: scattered through the f32 buffer `acc` with atomics, or with acc null
// gathered per input element in a fixed order (deterministic).
cudaError_t averagePoolGrad(const void* dy, void* dx, float* acc, const PoolArgs& a, cudaStream_t st);

// Pad's reflect, edge and wrap modes: idx[i] = the flat offset in the input [inShape] that output
// element i (of outShape, the input placed at `begin`) reads, as the CPU kernels map it. Pad's
// forward is then a flat gather, its gradient scatterAddFlat.
struct PadMap {
  int rank = 0;
  int mode = 0;  // 0 reflect, 1 edge, 2 wrap
  int64_t n = 0;
  int64_t outShape[kMaxRank] = {}, inShape[kMaxRank] = {}, begin[kMaxRank] = {};
};
cudaError_t padSourceIndex(int64_t* idx, const PadMap& m, cudaStream_t st);

// GridSample, 2-d (X [N, C, H, W], grid [N, Ho, Wo, 2] of normalised (x, y)): what the CPU kernel
// computes (kernels/cpu/k_linear.cpp), in f32 arithmetic. pad: 0 zeros, 1 border, 2 reflection.
struct GridArgs {
  int64_t N = 0, C = 0, H = 0, W = 0, Ho = 0, Wo = 0;
  bool align = false, nearest = false;
  int pad = 0;
};
cudaError_t gridSample(const void* x, DT t, const void* grid, DT gt, void* y, const GridArgs& a, cudaStream_t st);
// GridSampleGrad: dGrid (type gt) per sample, and dX (type t) = the samples' weights times dY
// scattered back, summed in the f32 buffer acc (zeroed here; dX itself when t is f32) with atomics,
// or, with `order` (orderScratch(N Ho Wo 4) bytes), one thread per input pixel and channel in
// sample order (deterministic).
cudaError_t gridSampleGrad(const void* dy, DT t, const void* x, const void* grid, DT gt, float* acc, void* dx, void* dgrid, const GridArgs& a,
                           void* order, cudaStream_t st);

}  // namespace ampc::cuda
