#include "runtime/cuda/program.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>

#include "compiler/ops/geometry.h"
#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "kernels/cpu/kernel.h"
#include "kernels/cuda/limits.h"
#include "kernels/cuda/train.h"
#include "passes/channels_last.h"
#include "passes/attention_mask.h"
#include "runtime/cuda/cudnn_sdpa.h"
#include "runtime/cuda/libs.h"
#include "runtime/cuda/nccl.h"
#include "runtime/folds.h"
#include "runtime/plan.h"

namespace ampc::cuda {

using namespace ampc::folds;  // the fold decisions the lowering follows (runtime/folds.h)

namespace {
std::atomic<int64_t> gSyncs{0};
constexpr size_t kGemmWorkspace = size_t{32} << 20;
constexpr size_t kAlign = 256;
size_t alignUp(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// Element strides of the dims N, C, H, W of a value stored N, H, W, C.
std::vector<int64_t> nhwcStrides(const std::vector<int64_t>& s) { return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}; }

// Times launches that write the same results, candidates[first..], on the stream outside capture:
// a warm-up run each (a candidate that fails it is out), then three timed rounds over them; `pick`
// the one with the least device time in all (`first` inside a capture, or where all failed but it).
cudaError_t pickFastest(const std::vector<std::function<cudaError_t(cudaStream_t)>>& candidates, size_t first, int& pick, cudaStream_t st) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(st, &cs); e != cudaSuccess) return e;
  pick = static_cast<int>(first);
  if (cs != cudaStreamCaptureStatusNone) return cudaSuccess;  // no timing inside a capture
  std::vector<size_t> live;
  for (size_t i = first; i < candidates.size(); ++i) {
    if (candidates[i](st) == cudaSuccess) live.push_back(i);
    else if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || i == first) return e != cudaSuccess ? e : cudaErrorUnknown;
  }
  if (live.size() < 2) return live.empty() ? cudaSuccess : (pick = static_cast<int>(live[0]), cudaSuccess);
  std::vector<cudaEvent_t> ev(3 * live.size() + 1);
  for (auto& e : ev) cudaEventCreate(&e);
  cudaEventRecord(ev[0], st);
  for (size_t r = 0, k = 1; r < 3; ++r)
    for (size_t i : live) {
      candidates[i](st);
      cudaEventRecord(ev[k++], st);
    }
  cudaError_t e = cudaEventSynchronize(ev.back());
  ++gSyncs;
  std::vector<float> total(live.size(), 0.0f);
  for (size_t r = 0, k = 1; r < 3 && e == cudaSuccess; ++r)
    for (size_t c = 0; c < live.size(); ++c, ++k) {
      float ms = 0;
      cudaEventElapsedTime(&ms, ev[k - 1], ev[k]);
      total[c] += ms;
    }
  for (auto& x : ev) cudaEventDestroy(x);
  if (e == cudaSuccess) pick = static_cast<int>(live[std::min_element(total.begin(), total.end()) - total.begin()]);
  return e;
}

}  // namespace

int64_t hostSyncs() { return gSyncs.load(); }

std::vector<std::pair<std::string, std::string>> Program::attentionPicks() const {
  std::vector<std::pair<std::string, std::string>> r;
  for (const auto& [k, v] : attentionPick_)
    r.emplace_back(k, *v.pick < 0 ? "not measured" : v.names.at(static_cast<size_t>(*v.pick)) + (v.stored ? " (stored in the plan)" : ""));
  return r;
}

std::map<std::string, std::string> Program::algoChoices() const {
  std::map<std::string, std::string> r;
  for (const auto& [k, v] : algoPick_)
    if (v.measured || v.stored) r.emplace(k, std::to_string(v.algo));
  return r;
}

std::pair<int, int> Program::algoCounts() const {
  std::pair<int, int> r{0, 0};
  for (const auto& [k, v] : algoPick_) {
    r.first += v.measured;
    r.second += v.stored;
  }
  return r;
}

// Largest workspace a measured convolution algorithm may take (the shared scratch holds the
// largest of every node's): past it the algorithm is not timed.
constexpr size_t kConvWorkspaceLimit = size_t{256} << 20;

namespace {
// Seconds since `t0` (LoadTimes).
double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int Program::storedAlgo(const std::string& key) const {
  auto s = opts_.algoChoices.find(key);
  if (s == opts_.algoChoices.end()) return -1;
  try {
    return std::stoi(s->second);
  } catch (const std::exception&) {
    return -1;
  }
}

void Program::chooseConvAlgos(Conv& c, bool forward, bool backwardData, bool backwardFilter) {
  const std::pair<ConvDir, bool> dirs[] = {{ConvDir::forward, forward}, {ConvDir::backwardData, backwardData}, {ConvDir::backwardFilter, backwardFilter}};
  for (const auto& [dir, wanted] : dirs) {
    if (!wanted) continue;
    const std::string key = "conv " + c.key(dir);
    if (auto it = algoPick_.find(key); it != algoPick_.end()) {  // an earlier node of this shape: its choice, no queries
      c.adopt(dir, it->second.algo, it->second.workspace);
      continue;
    }
    c.chooseHeuristic(dir);
    AlgoPick pick;
    // With `deterministic`, the heuristics' first deterministic algorithm, nothing stored or timed.
    if (!opts_.deterministic) {
      if (const int a = storedAlgo(key); a >= 0 && c.use(dir, a)) pick = {a, false, true};  // else (not offered by this cuDNN): as if not stored
      if (!pick.stored && opts_.algos == ProgramOptions::Algos::measured) {
        if (!tuneBuffers_) tuneBuffers_ = std::make_unique<TuneBuffers>();
        const auto t0 = std::chrono::steady_clock::now();
        const int a = c.measure(dir, *tuneBuffers_, kConvWorkspaceLimit);
        load_.measuring += since(t0);
        if (a >= 0 && c.use(dir, a)) pick = {a, true, false};
      }
    }
    pick.algo = c.algo(dir);
    pick.workspace = c.workspaceBytes(dir);
    algoPick_.emplace(key, pick);
  }
}

void Program::chooseGemmAlgo(Gemm& g) {
  // With `deterministic`, the heuristics' first, as before any measuring: a measured candidate may
  // split the contraction in ways whose order is not the first's.
  if (opts_.deterministic || g.candidates() < 2) return;
  const std::string key = "gemm " + g.key();
  if (auto it = algoPick_.find(key); it != algoPick_.end()) {  // an earlier node of this key
    g.use(it->second.algo);
    return;
  }
  AlgoPick pick;
  if (const int a = storedAlgo(key); a >= 0 && g.use(a)) pick = {a, false, true};
  if (!pick.stored && opts_.algos == ProgramOptions::Algos::measured) {
    if (!tuneBuffers_) tuneBuffers_ = std::make_unique<TuneBuffers>();
    const auto t0 = std::chrono::steady_clock::now();
    const int a = g.measure(*tuneBuffers_, stream_);
    load_.measuring += since(t0);
    if (a >= 0 && g.use(a)) pick = {a, true, false};
  }
  if (pick.algo < 0) pick.algo = g.rank();
  algoPick_.emplace(key, pick);
}

std::map<std::string, std::string> Program::attentionChoices() const {
  std::map<std::string, std::string> r;
  for (const auto& [k, v] : attentionPick_)
    if (v.names.size() > 1 && *v.pick >= 0) r.emplace(k, v.names.at(static_cast<size_t>(*v.pick)));
  return r;
}

namespace {
std::mutex gWaiterLock;
std::function<void(cudaStream_t, const char*)> gWaiter;

void waitFor(cudaStream_t st, const char* why) {
  std::function<void(cudaStream_t, const char*)> w;
  {
    std::lock_guard<std::mutex> l(gWaiterLock);
    w = gWaiter;
  }
  if (w) w(st, why);
  else check(cudaStreamSynchronize(st), why);
}
}  // namespace

void setStreamWaiter(std::function<void(cudaStream_t, const char*)> w) {
  std::lock_guard<std::mutex> l(gWaiterLock);
  gWaiter = std::move(w);
}

void hostSync(cudaStream_t st, const char* why) {
  ++gSyncs;
  waitFor(st, why);
}

bool gpuPresent() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

int64_t deviceMemoryUsed(int device) {
  int cur = 0;
  cudaGetDevice(&cur);
  if (cur != device) cudaSetDevice(device);
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
  return static_cast<int64_t>(total - free);
}

int parseDevice(const std::string& spec) {
  if (spec == "cuda") return 0;
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5 && spec.find_first_not_of("0123456789", 5) == std::string::npos)
    return std::stoi(spec.substr(5));
  throw Error("unknown device '" + spec + "' (cpu, cuda or cuda:N)");
}

DT deviceType(DType t, const std::string& where) {
  switch (t) {
    case DType::f32: return DT::f32;
    case DType::f16: return DT::f16;
    case DType::bf16: return DT::bf16;
    case DType::i64: return DT::i64;
    case DType::i32: return DT::i32;
    case DType::i8: return DT::i8;
    case DType::u8: return DT::u8;
    case DType::boolean: return DT::boolean;
    case DType::f64: break;
  }
  throw Error(where + ": f64 tensors have no CUDA kernels (compile at fp32, fp16 or bf16)");
}

// ---------------------------------------------------------------------------------------------
// Lowering: one node to its launches.

struct Program::Lowering {
  Program& p;
  const Node& n;

  [[noreturn]] void fail(const std::string& msg) const { throw Error(n.describe() + ": CUDA backend: " + msg); }
  const Value* in(size_t i) const { return i < n.inputs().size() ? n.inputs()[i] : nullptr; }
  bool has(size_t i) const { return in(i) != nullptr; }
  const Value* out(size_t i) const { return n.result(i); }
  void* P(const Value* v) const { return v ? p.ptr(v) : nullptr; }
  DT dt(const Value* v) const { return deviceType(v->type().dtype, n.describe()); }
  const std::vector<int64_t>& shape(const Value* v) const { return v->type().shape; }
  std::vector<int64_t> constInts(size_t i) const {
    const Tensor* t = in(i) ? in(i)->constData() : nullptr;
    if (!t) fail("operand " + std::to_string(i) + " must be a constant");
    return t->toInts();
  }
  // The fused attention's operands (compiler/ops/ops_nn.cpp has the shape rules).
  // lead: the scores' leading dims; Q's type is the operands' (the target nodes' operands are laid
  // out: compiler/ops/geometry.h, AttentionLayout).
  // kernels: whether ampc's kernels take the node (set where given; else an error where they do not).
  AttentionArgs attentionArgs(const std::vector<int64_t>& lead, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, const Value* q,
                              const Value* mask, bool* kernels = nullptr) const {
    AttentionArgs a;
    a.deterministic = p.opts_.deterministic;
    a.t = dt(q);
    if (a.t != DT::f32 && a.t != DT::f16 && a.t != DT::bf16) fail("Q, KT and V must be f32, f16 or bf16");
    a.N = 1;
    for (int64_t x : lead) a.N *= x;
    a.Tq = Tq;
    a.D = D;
    a.Tk = Tk;
    a.Dv = Dv;
    if (mask) {
      a.mask = P(mask);
      a.maskType = dt(mask);
      if (a.maskType != DT::f32 && a.maskType != DT::f16 && a.maskType != DT::bf16) fail("the mask must be a float tensor");
      AttentionMaskMap map;
      std::string why;
      if (!attentionMaskMap(lead, a.Tq, a.Tk, mask->type().shape, map, &why))
        fail("the mask does not broadcast to the scores: " + why);
      a.maskDiv = map.div;
      a.maskMod = map.mod;
      a.maskRows = map.rows;
    }
    a.zeroEmpty = n.getInt("zero_empty_rows", 0) != 0;
    a.floor = n.getFloat("score_floor", -INFINITY);
    a.floorTie = n.getFloat("floor_tie", 1.0f);
    if (!(a.floorTie >= 0.0f && a.floorTie <= 1.0f)) fail("floor_tie must be in [0, 1]");
    if (!(a.floor <= -1e6f)) fail("score_floor must be at most -1e6 (or -inf: none): rows it changes must fall to the fill-row fix-ups");
    if (a.floor > -INFINITY && !mask) fail("score_floor needs a mask (without one no row is masked everywhere)");
    const int64_t whereCausal = n.getInt("where_causal", 0);
    if (whereCausal != 0 && whereCausal != 1) fail("where_causal must be 0 or 1");
    if (whereCausal && !mask) fail("where_causal needs a mask (without one no row is masked everywhere)");
    a.whereCausal = whereCausal == 1;
    if (const size_t w = n.op() == "AttentionGrad" ? 7 : 4; has(w)) {  // where_masked: read by the backward's fill-row fix-ups
      if (!mask || dt(in(w)) != DT::boolean || shape(in(w)) != mask->type().shape) fail("where_masked must be bool with the mask's shape");
      a.whereMasked = static_cast<const uint8_t*>(P(in(w)));
    }
    a.scale = n.getFloat("scale", 1.0f);
    if (n.getFloat("softcap", 0.0f) != 0.0f)  // (the cuda target does not fuse it: compiler/target.cpp)
      fail("soft-capped scores (softcap) are not in the CUDA attention kernels; compile the plan with ampc --no-fuse, or for --target cpu");
    const float ratio = n.getFloat("dropout_ratio", 0.0f);
    if (ratio < 0.0f || ratio >= 1.0f) fail("dropout_ratio must be in [0, 1)");
    a.ratio = p.opts_.dropout ? ratio : 0.0f;
    a.seed = cpu::randomSeed(n, p.opts_.seed);
    a.step = p.step_;
    a.key = static_cast<uint32_t>(n.getInt("dropout_key", 0));
    const bool fits = attentionFits(a.t != DT::f32, a.D, a.Dv, a.Tk, a.ratio > 0.0f);
    if (kernels) *kernels = fits;
    else if (!fits)
      fail("no fused CUDA kernel takes head dims D " + std::to_string(a.D) + ", Dv " + std::to_string(a.Dv) + " here (f16/bf16 with head dims multiples of 8 up to " +
           std::to_string(kAttentionMaxHeadDimMma) + " and, with dropout, Tk a multiple of 4; otherwise up to " + std::to_string(kAttentionMaxHeadDim) + ")");
    return a;
  }
  double constScalar(size_t i, double dflt) const {
    if (!has(i)) return dflt;
    const Tensor* t = in(i)->constData();
    if (!t) fail("operand " + std::to_string(i) + " must be a constant");
    return t->getDouble(0);
  }
  // Scratch of a node's launches: one region that every node shares (launches run one after another
  // on the stream), sized for the largest request and allocated after lowering; launches read its
  // address through the handle.
  struct Scratch {
    void* const* base;
    float* f() const { return static_cast<float*>(*base); }
    void* at(size_t offset) const { return static_cast<char*>(*base) + offset; }
  };
  // ProgramOptions::deterministic: the scratch bytes an ordered scatter-add of `items` items into
  // `targets` elements needs (kernels/cuda/ops.h, OrderBuffers); 0 when not deterministic.
  size_t orderBytes(int64_t items, int64_t targets) {
    if (!p.opts_.deterministic || items == 0) return 0;
    const size_t b = orderScratch(items);
    if (b == 0 || targets >= static_cast<int64_t>(UINT32_MAX))
      fail("--deterministic: the ordered scatter-add takes fewer than 2^31 items into fewer than 2^32 - 1 elements; this one has " +
           std::to_string(items) + " into " + std::to_string(targets));
    return b;
  }
  Scratch scratch(size_t bytes) {
    p.scratchBytes_ = std::max(p.scratchBytes_, alignUp(bytes));
    return Scratch{&p.scratch_};
  }
  void add(Launch l) { p.launches_.push_back({n.describe(), n.qualifiedOp(), std::move(l)}); }

  // Broadcast strides of `v` against the output shape.
  void operand(EwArgs& a, int k, const Value* v, const std::vector<int64_t>& os) const {
    a.in[k] = P(v);
    a.inType[k] = dt(v);
    const auto& s = shape(v);
    // The operand's dims right-aligned against the output's; a block when its non-1 dims are
    // consecutive and equal the output's there.
    std::vector<int64_t> pad(os.size() - s.size(), 1);
    pad.insert(pad.end(), s.begin(), s.end());
    int64_t lo = -1, hi = -1;
    bool block = true;
    for (size_t d = 0; d < os.size(); ++d)
      if (pad[d] != 1) {
        if (lo < 0) lo = static_cast<int64_t>(d);
        else if (hi != static_cast<int64_t>(d) - 1) block = false;
        hi = static_cast<int64_t>(d);
        block = block && pad[d] == os[d];
      }
    if (s == os) a.access[k] = Access::Same;
    else if (v->type().numel() == 1) a.access[k] = Access::Scalar;
    else if (block && lo >= 0) {
      a.access[k] = Access::Block;
      a.div[k] = 1;
      for (size_t d = static_cast<size_t>(hi) + 1; d < os.size(); ++d) a.div[k] *= os[d];
      a.mod[k] = v->type().numel();
    } else {
      a.access[k] = Access::Strided;
      const auto st = stridesOf(s);
      const size_t off = os.size() - s.size();
      for (size_t d = 0; d < os.size(); ++d) {
        const bool present = d >= off;
        a.stride[k][d] = present && s[d - off] != 1 ? st[d - off] : 0;
      }
    }
  }
  // Operands are read through the widening Casts folded into their readers.
  EwArgs ewArgs(Ew op, const std::vector<const Value*>& ins, const Value* o) const {
    const auto& os = shape(o);
    if (os.size() > static_cast<size_t>(kMaxRank)) fail("rank above " + std::to_string(kMaxRank));
    EwArgs a;
    a.op = op;
    a.nin = static_cast<int>(ins.size());
    a.rank = static_cast<int>(os.size());
    a.n = o->type().numel();
    for (size_t d = 0; d < os.size(); ++d) a.shape[d] = os[d];
    for (size_t k = 0; k < ins.size(); ++k) {
      operand(a, static_cast<int>(k), readThrough(ins[k]), os);
    }
    const Node* d = o == n.result(0) ? narrowedResult(n) : nullptr;
    a.out = P(d ? d->result(0) : o);
    a.outType = dt(d ? d->result(0) : o);
    return a;
  }
  static bool isInt(DT t) { return t == DT::i64 || t == DT::i32 || t == DT::i8 || t == DT::u8 || t == DT::boolean; }
  void elementwise(Ew op, const std::vector<const Value*>& ins) {
    EwArgs a = ewArgs(op, ins, out(0));
    a.intMath = true;
    for (const Value* v : ins) a.intMath = a.intMath && isInt(dt(v));
    if (op == Ew::Where) a.intMath = isInt(dt(out(0)));
    if (!a.intMath && isInt(dt(out(0))) && op != Ew::Copy && op != Ew::Equal && op != Ew::Less && op != Ew::LessEq && op != Ew::Greater &&
        op != Ew::GreaterEq && op != Ew::And && op != Ew::Or && op != Ew::Not && op != Ew::IsNaN && op != Ew::IsInf && op != Ew::Sign)
      fail("mixed integer and float operands");
    if (n.op() == "LeakyRelu") a.alpha = n.getFloat("alpha", 0.01f);
    if (n.op() == "HardSigmoid") a.alpha = n.getFloat("alpha", 0.2f), a.beta = n.getFloat("beta", 0.5f);
    if (n.op() == "Elu" || n.op() == "Celu") a.alpha = n.getFloat("alpha", 1.0f);
    if (n.op() == "Selu") a.alpha = n.getFloat("alpha", 1.67326319217681884765625f), a.beta = n.getFloat("gamma", 1.05070102214813232421875f);
    if (n.op() == "Mod") a.fmod = static_cast<int>(n.getInt("fmod", 0));
    if (n.op() == "IsInf") {
      a.detectNeg = static_cast<int>(n.getInt("detect_negative", 1));
      a.detectPos = static_cast<int>(n.getInt("detect_positive", 1));
    }
    add([a](cudaStream_t st) { return cuda::elementwise(a, st); });
  }
  void copyValue(const Value* src, const Value* dst) {
    void *s = P(src), *d = P(dst);
    const size_t bytes = dst->type().bytes();
    if (s == d || bytes == 0) return;
    add([s, d, bytes](cudaStream_t st) { return cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, st); });
  }
  void strided(const Value* src, const Value* dst, CopyArgs a) {
    a.elemBytes = dtSize(dt(src));
    const void* s = P(src);
    void* d = P(dst);
    add([s, d, a](cudaStream_t st) { return stridedCopy(s, d, a, st); });
  }
  void zero(const Value* v) {
    void* d = P(v);
    const size_t bytes = v->type().bytes();
    add([d, bytes](cudaStream_t st) { return cudaMemsetAsync(d, 0, bytes, st); });
  }

  // GatherElements / GatherND (and their gradients) over data of shape xs: the node's index geometry.
  IndexGeom indexGeom(const Node& n, const std::vector<int64_t>& xs) const {
    IndexGeom g;
    const bool nd = n.op() == "GatherND" || n.op() == "GatherNDGrad" || n.op() == "ScatterND";
    const auto& is = n.input(1)->type().shape;
    if (xs.size() > static_cast<size_t>(kMaxRank) || is.size() > static_cast<size_t>(kMaxRank))
      throw Error(n.describe() + ": rank above " + std::to_string(kMaxRank) + " is not supported on CUDA");
    g.mode = nd ? IndexMode::ND : IndexMode::Elements;
    g.rank = static_cast<int>(xs.size());
    const auto st = stridesOf(xs);
    for (size_t d = 0; d < xs.size(); ++d) g.xshape[d] = xs[d], g.xstride[d] = st[d];
    for (size_t d = 0; d < is.size(); ++d) g.ishape[d] = is[d];
    if (!nd) {
      g.axis = static_cast<int>(normalizeAxis(n.getInt("axis", 0), static_cast<int64_t>(xs.size())));
      g.n = n.input(1)->type().numel();
      return g;
    }
    g.b = static_cast<int>(n.getInt("batch_dims", 0));
    g.k = static_cast<int>(is.back());
    for (size_t d = g.b + g.k; d < xs.size(); ++d) g.slice *= xs[d];
    int64_t batch = 1;
    for (int d = 0; d < g.b; ++d) batch *= is[d];
    const int64_t tuples = g.k ? n.input(1)->type().numel() / g.k : 0;
    g.perBatch = std::max<int64_t>(batch ? tuples / batch : 0, 1);
    g.n = tuples * g.slice;
    return g;
  }

  // [outer, dim, inner] around `axis` of shape s.
  static void split(const std::vector<int64_t>& s, int64_t axis, int64_t& outer, int64_t& dim, int64_t& inner) {
    outer = inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= s[d];
    for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
    dim = s[axis];
  }
  // Rows x D of a normalisation over the dims from `axis` on.
  static void rowsOf(const std::vector<int64_t>& s, int64_t axis, int64_t& rows, int64_t& D) {
    rows = D = 1;
    for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) (d < axis ? rows : D) *= s[d];
  }
  // A value's row pitch in elements where pitch-loss-scores stores it padded (pitchedValues), else 0.
  int64_t pitchOf(const Value* v) const {
    auto it = p.pitch_.find(v);
    return it == p.pitch_.end() ? 0 : it->second;
  }
  LossArgs lossArgs(const Value* scores, const Value* labels) const {
    LossArgs a;
    const auto& xs = shape(scores);
    split(xs, 1, a.outer, a.C, a.inner);
    const std::string red = n.getString("reduction", "mean");
    a.reduction = red == "none" ? 0 : red == "sum" ? 1 : 2;
    a.hasIgnore = n.hasAttr("ignore_index");
    a.ignore = n.getInt("ignore_index", 0);
    a.t = dt(scores);
    a.labelT = dt(labels);
    // The weights: the loss's input 2, the gradient's 3 (4 after the target's row statistics).
    const size_t weights = !isLossGrad(n) ? 2 : n.domain() == kCudaDomain ? 4 : 3;
    if (has(weights)) a.wT = dt(in(weights));
    return a;
  }
  BatchNormArgs bnArgs(const Value* x, const Value* scale) const {
    BatchNormArgs a;
    const auto& xs = shape(x);
    a.N = xs[0];
    a.C = xs.size() > 1 ? xs[1] : 1;
    a.S = 1;
    for (size_t d = 2; d < xs.size(); ++d) a.S *= xs[d];
    a.eps = n.getFloat("epsilon", 1e-5f);
    a.momentum = n.getFloat("momentum", 0.9f);
    a.training = n.getInt("training_mode", 0) != 0;
    a.t = dt(x);
    a.pT = dt(scale);
    return a;
  }

  // The comparison fused into its Where (folds::fusedComparison) as a kernel op, or null.
  static const Ew* fusableComparison(const Node& c) {
    static const std::map<std::string, Ew> kCmp = {{"Greater", Ew::Greater}, {"Less", Ew::Less}, {"GreaterOrEqual", Ew::GreaterEq},
                                                  {"LessOrEqual", Ew::LessEq}, {"Equal", Ew::Equal}};
    if (!folds::fusedComparison(c)) return nullptr;
    return &kCmp.at(c.op());
  }

  void lower();
  // One member per row of table(): the lowerings of the default domain (onnx*) and of ampc's ops (ampc*).
  using Rule = void (Lowering::*)();
  static const std::map<std::pair<std::string, std::string>, Rule>& table();
  void onnxGelu() { return elementwise(n.getString("approximate", "none") == "tanh" ? Ew::GeluTanh : Ew::Gelu, {in(0)}); }
  void onnxMaxMin();
  void onnxClip();
  void onnxView() { return copyValue(in(0), out(0)); }
  void onnxTranspose();
  void onnxSlice();
  void onnxExpand();
  void onnxConcatSplit();
  void onnxPad();
  void onnxGather();
  void onnxGatherElements();
  void onnxScatterElements();
  void onnxTrilu();
  void ampcRotateHalf();
  void onnxCumSum();
  void onnxMatMul() { return gemm(true); }
  void onnxGemm() { return gemm(false); }
  void cudaMultiCast();
  void onnxConv() { return conv(false); }
  void onnxMaxPool() { return pool(true, false); }
  void onnxAveragePool() { return pool(false, false); }
  void onnxGlobalAveragePool() { return reduce(Red::Mean); }
  void onnxReduceSum() { return reduce(Red::Sum); }
  void onnxReduceMean() { return reduce(Red::Mean); }
  void onnxReduceMax() { return reduce(Red::Max); }
  void onnxReduceMin() { return reduce(Red::Min); }
  void onnxSoftmax();
  void onnxLayerNormalization();
  void onnxBatchNormalization();
  void onnxSoftmaxCrossEntropyLoss();
  void onnxDropout();
  void onnxRandom();
  void onnxShape();
  void onnxConstantOfShape();
  void ampcFused();
  void ampcGelu();
  void ampcSilu() { return elementwise(Ew::Silu, {in(0)}); }
  void ampcSiluGrad() { return elementwise(Ew::SiluGrad, {in(0), in(1)}); }
  void ampcConvGrad() { return conv(true); }
  void ampcAveragePoolGrad() { return pool(false, true); }
  void ampcScatterAddFlat();
  void ampcGatherGrad();
  void ampcAllReduce();
  void onnxTopK();
  void onnxDet();
  void ampcDetGrad();
  void onnxGridSample();
  std::vector<int64_t> padBegin(int64_t rank, int padsAt, int axesAt);
  PadMap padMap(const std::vector<int64_t>& xs, const std::vector<int64_t>& os, const std::vector<int64_t>& begin);
  void ampcGridSampleGrad();
  void onnxTile();
  void onnxArgMax();
  void ampcGatherElementsGrad();
  void ampcSliceGrad();
  void ampcPadGrad();
  void ampcBatchNormGrad();
  void ampcLayerNormGrad();
  void ampcSoftmaxCrossEntropyLossGrad();
  void ampcAttention();
  // What cuDNN's runs need around them: K and dK through scratch as rows (transposed from and to
  // KT); zeroEmpty: rows masked everywhere set to 0 after the forward (attentionZeroEmptyRows; O at o).
  struct CudnnStaging {
    bool copyK = false, copyDK = false, zeroEmpty = false;
    SdpaStrides o;
  };
  std::shared_ptr<CudnnSdpa> cudnnAttention(const AttentionArgs& a, const AttentionDims& d, bool grad, const Value* mask, std::string& key, bool only,
                                            CudnnStaging& staging);
  bool fillRows(const AttentionArgs& a, const Value* mask, const AttentionDims& d);
  void attentionLaunch(Launch ours, const std::shared_ptr<CudnnSdpa>& dnn, const std::string& key, std::function<cudnnStatus_t(size_t, cudaStream_t)> theirs);
  struct ShapePick {
    std::shared_ptr<int> pick;  // Program::attentionPick_'s, shared by the shape's nodes
    size_t from = 0;            // the first candidate that may run: 1 where the kernels do not
    bool kernelsMayRun = true;  // not decided for cuDNN before the first run
  };
  ShapePick attentionPick(const std::shared_ptr<CudnnSdpa>& dnn, const std::string& key, bool kernels);
  void ampcDropoutGrad();
  void ampcTrainStep() { return train(); }
  void gemm(bool isMatMul);
  void conv(bool grad);
  PoolArgs poolArgs(const Node& m, const Value* x) const;
  void pool(bool isMax, bool grad);
  void reduce(Red op);
  void train();
};

void Program::Lowering::gemm(bool isMatMul) {
  const Value *a = in(0), *b = in(1), *y = out(0);
  const DT t = dt(y);
  if (dt(a) != t || dt(b) != t || (t != DT::f32 && t != DT::f16 && t != DT::bf16)) fail("operands must share one float type");
  GemmDesc d;
  d.t = t;
  d.allowTf32 = p.opts_.allowTf32;
  const void* bias = nullptr;
  if (!isMatMul) {
    d.transA = n.getInt("transA", 0) != 0;
    d.transB = n.getInt("transB", 0) != 0;
    d.alpha = n.getFloat("alpha", 1.0f);
    const auto &as = shape(a), &bs = shape(b);
    d.M = d.transA ? as[1] : as[0];
    d.K = d.transA ? as[0] : as[1];
    d.N = d.transB ? bs[0] : bs[1];
    if (has(2) && in(2)->type().numel() > 0) {
      const Value* c = in(2);
      const float beta = n.getFloat("beta", 1.0f);
      if (c->type().numel() == d.N && beta == 1.0f && dt(c) == t && (c->type().rank() == 1 || shape(c)[0] == 1)) {
        d.bias = true;
        bias = P(c);
      } else {  // C broadcast into D first, then D = alpha AB + beta D
        EwArgs e = ewArgs(Ew::Copy, {c}, y);
        add([e](cudaStream_t st) { return cuda::elementwise(e, st); });
        d.beta = beta;
      }
    }
  } else {
    auto as = shape(a), bs = shape(b);
    const bool aVec = as.size() == 1, bVec = bs.size() == 1;
    if (aVec) as.insert(as.begin(), 1);
    if (bVec) bs.push_back(1);
    d.M = as[as.size() - 2];
    d.K = as.back();
    d.N = bs.back();
    const std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
    const size_t r = std::max(ab.size(), bb.size());
    std::vector<int64_t> batch(r, 1);
    for (size_t i = 0; i < r; ++i) {
      const int64_t x = i + ab.size() >= r ? ab[i + ab.size() - r] : 1, z = i + bb.size() >= r ? bb[i + bb.size() - r] : 1;
      batch[i] = std::max(x, z);
    }
    int64_t count = 1, ca = 1, cb = 1;
    for (int64_t v : batch) count *= v;
    for (int64_t v : ab) ca *= v;
    for (int64_t v : bb) cb *= v;
    auto fits = [&](const std::vector<int64_t>& s, int64_t c) {  // the operand's batch is all of it or one matrix
      if (c == 1) return true;
      std::vector<int64_t> padded(r - s.size(), 1);
      padded.insert(padded.end(), s.begin(), s.end());
      return padded == batch;
    };
    if (!fits(ab, ca) || !fits(bb, cb)) fail("MatMul batch broadcasting of partial dims is not supported on CUDA");
    d.batch = count;
    d.strideA = ca == 1 ? 0 : d.M * d.K;
    d.strideB = cb == 1 ? 0 : d.K * d.N;
    d.strideD = d.M * d.N;
    if (d.batch > 1 && cb == 1 && ca == count) {  // one B for every batch: the batches of A are rows of one GEMM
      d.M *= d.batch;
      d.batch = 1;
      d.strideA = d.strideD = 0;
    }
  }
  // cuBLASLt's fast kernels need every row stride to be a multiple of 16 bytes. A large GEMM with
  // another stride (GPT-2's vocabulary of 50257 words) runs 5 to 7 times slower, so it runs on
  // copies padded to dims that are multiples of 16 bytes (as torch.compile pads shapes): the padded
  // part of the contraction dim is zero, the padded rows and columns of the result are dropped.
  const int64_t eb = dtSize(t), unit = 16 / eb;
  const auto up = [unit](int64_t x) { return (x + unit - 1) / unit * unit; };
  const bool padded = d.batch == 1 && !d.bias && d.beta == 0.0f && cuda::gemmRunsPadded(d.M, d.N, d.K, d.transA, eb);
  struct Staged {
    const Value* v;
    int64_t rows, cols, prows, pcols;
    bool zeroRows, zeroCols;  // the padded rows / columns are the contraction's: zeros
    size_t offset = 0;
  };
  std::vector<Staged> staged;  // A, B, then D
  size_t scratchBytes = kGemmWorkspace;
  GemmDesc pd = d;
  if (padded) {
    pd.M = up(d.M), pd.N = up(d.N), pd.K = up(d.K);
    const bool zk = pd.K != d.K;
    staged.push_back(d.transA ? Staged{a, d.K, d.M, pd.K, pd.M, zk, false} : Staged{a, d.M, d.K, pd.M, pd.K, false, zk});
    staged.push_back(d.transB ? Staged{b, d.N, d.K, pd.N, pd.K, false, zk} : Staged{b, d.K, d.N, pd.K, pd.N, zk, false});
    staged.push_back(Staged{y, d.M, d.N, pd.M, pd.N, false, false});
    if (p.pitch_.count(y) && pd.N != d.N) {  // D kept padded (pitched): its pad columns from zero columns of B
      if (d.transB) staged[1].zeroRows = true;
      else staged[1].zeroCols = true;
    }
    for (Staged& q : staged) {
      // In place (offset 0): already of the padded dims, or stored with the padded row pitch
      // (pitch-loss-scores; its rows are a multiple of the unit there).
      if (auto it = p.pitch_.find(q.v); it != p.pitch_.end()) {
        if (it->second != q.pcols || q.rows != q.prows) fail("internal: a pitched operand off its GEMM's padded dims");
        q.pcols = q.cols;
      }
      q.offset = (q.rows == q.prows && q.cols == q.pcols) ? 0 : scratchBytes;  // 0: used in place
      if (q.offset) scratchBytes += alignUp(static_cast<size_t>(q.prows * q.pcols * eb));
    }
  }
  // cuda::Gemm's bias gradient (passes/fuse_bias_grad.cpp), result 1: the column sums of operand
  // bias_grad, by cuBLASLt's epilogue or right after the product.
  const bool sums = !isMatMul && n.domain() == kCudaDomain && n.numResults() > 1;
  if (sums && (padded || !d.transA || d.transB)) fail("a bias gradient's epilogue needs transA = 1, transB = 0 and no padded copies");
  const bool sumsA = sums && n.getInt("bias_grad", 0) == 0;  // dY^T X (else X^T dY)
  if (sums) pd.biasGrad = sumsA ? GemmDesc::BiasGrad::ofA : GemmDesc::BiasGrad::ofB;
  const auto t0 = std::chrono::steady_clock::now();
  auto g = std::make_shared<Gemm>(static_cast<cublasLtHandle_t>(p.cublas_), pd, kGemmWorkspace);
  p.chooseGemmAlgo(*g);
  p.load_.gemms += since(t0);
  p.keep_.push_back(g);
  if (sums) bias = P(out(1));
  const Scratch ws = scratch(scratchBytes);
  void* const* base = ws.base;
  const void *A = P(a), *B = P(b);
  void* D = P(y);
  for (size_t i = 0; i + 1 < staged.size(); ++i) {
    const Staged q = staged[i];
    if (!q.offset) continue;
    const void* src = P(q.v);
    add([base, src, q, eb](cudaStream_t st) {
      char* dst = static_cast<char*>(*base) + q.offset;
      const size_t w = static_cast<size_t>(q.cols * eb), pitch = static_cast<size_t>(q.pcols * eb);
      cudaError_t e = cudaMemcpy2DAsync(dst, pitch, src, w, w, static_cast<size_t>(q.rows), cudaMemcpyDeviceToDevice, st);
      if (e == cudaSuccess && q.zeroCols) e = cudaMemset2DAsync(dst + w, pitch, 0, pitch - w, static_cast<size_t>(q.rows), st);
      if (e == cudaSuccess && q.zeroRows) e = cudaMemsetAsync(dst + q.rows * pitch, 0, (q.prows - q.rows) * pitch, st);
      return e;
    });
  }
  const size_t offA = padded ? staged[0].offset : 0, offB = padded ? staged[1].offset : 0, offD = padded ? staged[2].offset : 0;
  add([g, A, B, bias, D, ws, offA, offB, offD](cudaStream_t st) {
    char* s = static_cast<char*>(*ws.base);
    return g->run(offA ? s + offA : A, offB ? s + offB : B, bias, offD ? s + offD : D, ws.f(), st) == CUBLAS_STATUS_SUCCESS
               ? cudaSuccess
               : cudaErrorUnknown;
  });
  if (sums && !g->biasGrad()) {
    const void* X = sumsA ? A : B;
    void* Y = P(out(1));
    const DT t = d.t;
    const int64_t R = d.K, K = sumsA ? d.M : d.N;
    const Scratch acc = scratch(reduceColumnsScratch(R, K));
    add([X, Y, t, R, K, acc](cudaStream_t st) { return reduceColumns(X, t, Y, R, K, 1.0f, acc.f(), st); });
  }
  if (offD) {
    const Staged q = staged[2];
    add([base, D, q, eb](cudaStream_t st) {
      const size_t w = static_cast<size_t>(q.cols * eb), pitch = static_cast<size_t>(q.pcols * eb);
      return cudaMemcpy2DAsync(D, w, static_cast<char*>(*base) + q.offset, pitch, w, static_cast<size_t>(q.rows), cudaMemcpyDeviceToDevice, st);
    });
  }
}

void Program::Lowering::conv(bool grad) {
  // Conv(X, W, B?) -> Y; ConvGrad(dY, X, W) -> dX, dW.
  const Value *x = grad ? in(1) : in(0), *w = grad ? in(2) : in(1);
  const DT t = dt(x);
  if (dt(w) != t || (t != DT::f32 && t != DT::f16 && t != DT::bf16)) fail("operands must share one float type");
  const auto &xs = shape(x), &ws = shape(w);
  const int nsp = static_cast<int>(xs.size()) - 2;
  if (nsp < 1 || nsp > 3) fail("convolutions over 1 to 3 spatial dims only");
  const std::vector<int64_t> spatialIn(xs.begin() + 2, xs.end()), kernel(ws.begin() + 2, ws.end());
  const Window win = windowOf(n, spatialIn, n.getInts("kernel_shape", kernel), false);
  ConvDesc d;
  d.t = t;
  d.allowTf32 = p.opts_.allowTf32;
  d.deterministic = p.opts_.deterministic;
  d.N = xs[0];
  d.C = xs[1];
  d.M = ws[0];
  d.groups = n.getInt("group", 1);
  // cuDNN wants 2 or 3 spatial dims: a 1-d convolution runs as 1 x W.
  d.nsp = std::max(nsp, 2);
  for (int i = 0; i < nsp; ++i) {
    const int j = nsp == 1 ? 1 : i;
    if (win.padBegin[i] != win.padEnd[i]) fail("asymmetric padding is not supported on CUDA");
    d.in[j] = spatialIn[i];
    d.k[j] = kernel[i];
    d.out[j] = win.out[i];
    d.pad[j] = static_cast<int>(win.padBegin[i]);
    d.stride[j] = static_cast<int>(win.strides[i]);
    d.dil[j] = static_cast<int>(win.dilations[i]);
  }
  // A gradient nobody reads is not computed (the first convolution's dX: the image's gradient).
  auto read = [&](size_t i) { return n.numResults() > i && (!out(i)->uses().empty() || p.g_.isOutput(out(i))); };
  const bool needDx = grad && read(0), needDw = grad && read(1);
  // NHWC on cuDNN when an activation is stored channels-last; an activation in the other layout,
  // the weights (KCRS <-> KRSC) and dW go through scratch, transposed on the way.
  const Value* acts[3] = {x, grad ? in(0) : out(0), needDx ? out(0) : nullptr};  // x, y or dy, dx
  bool anyNhwc = false;
  for (const Value* v : acts) anyNhwc = anyNhwc || (v && p.nhwc_.count(v));
  if (!anyNhwc && nsp <= 2 && d.groups == d.C && d.M == d.C && ws[1] == 1) {
    // Depthwise on NCHW planes: kernels/cuda/depthwise.cu (cuDNN's depthwise gradients run far
    // below memory speed). The bias is added before the one rounding, as on the CPU.
    DwArgs a;
    a.N = d.N;
    a.C = d.C;
    a.planes = d.N * d.C;
    a.H = static_cast<int>(d.in[0]);
    a.W = static_cast<int>(d.in[1]);
    a.OH = static_cast<int>(d.out[0]);
    a.OW = static_cast<int>(d.out[1]);
    a.KH = static_cast<int>(d.k[0]);
    a.KW = static_cast<int>(d.k[1]);
    a.SH = d.stride[0];
    a.SW = d.stride[1];
    a.PH = d.pad[0];
    a.PW = d.pad[1];
    a.DH = d.dil[0];
    a.DW = d.dil[1];
    if (!grad) {
      const void *X = P(x), *W = P(w), *B = has(2) ? P(in(2)) : nullptr;
      const DT bt = has(2) ? dt(in(2)) : DT::f32;
      void* Y = P(out(0));
      add([=](cudaStream_t st) { return depthwiseForward(a, t, X, W, B, bt, Y, st); });
      return;
    }
    const void *dY = P(in(0)), *X = P(x), *W = P(w);
    if (needDx) {
      void* dX = P(out(0));
      add([=](cudaStream_t st) { return depthwiseBackwardData(a, t, dY, W, dX, st); });
    }
    if (needDw) {
      void* dW = P(out(1));
      const Scratch part = scratch(depthwiseFilterScratch(a));
      add([=](cudaStream_t st) { return depthwiseBackwardFilter(a, t, X, dY, dW, part.f(), st); });
    }
    return;
  }
  d.nhwc = anyNhwc && nhwcConv(n);
  // NHWC with input channels not a multiple of 8 (the image's 3): cuDNN sees C rounded up to 8, the
  // extra channels of x and the filter zero (so they add nothing); x, dX and dW lose them again.
  const int64_t C0 = d.C;
  if (d.nhwc) d.C = (d.C + 7) / 8 * 8;
  const bool padded = d.C != C0;
  const auto t0 = std::chrono::steady_clock::now();
  auto c = std::make_shared<Conv>(static_cast<cudnnHandle_t>(p.cudnn_), d);
  p.chooseConvAlgos(*c, !grad, needDx, needDw);
  p.load_.convolutions += since(t0);
  p.keep_.push_back(c);
  const size_t wsBytes = c->workspaceBytes(), eb = static_cast<size_t>(dtSize(t));
  size_t total = alignUp(wsBytes);
  // A scratch copy at `off`, made on the way in (graph -> cuDNN) or out: a transpose2d(batch, R, C),
  // or, for padded channels, [batch][C][P] <-> [batch][P][Cp].
  enum class How { none, transpose, pad, unpad };
  struct Moved {
    How how = How::none;
    size_t off = 0;
    int64_t batch = 0, R = 0, C = 0, Cp = 0;
  };
  auto take = [&](size_t elems) {
    const size_t o = total;
    total += alignUp(elems * eb);
    return o;
  };
  auto shape4 = [&](const Value* v, bool result) {
    Moved m;
    if (!v || (p.nhwc_.count(v) != 0) == d.nhwc) return m;
    const auto& s = shape(v);
    const int64_t hw = s[2] * s[3];
    if (padded && s[1] == C0) {  // x or dX of the padded convolution (NCHW in the graph)
      m = {result ? How::unpad : How::pad, take(static_cast<size_t>(s[0] * hw * d.C)), s[0], 0, C0, d.C};
      m.R = hw;
      return m;
    }
    // An input goes graph -> scratch; a result scratch -> graph.
    const bool fromNchw = result ? !d.nhwc : d.nhwc;
    m = {How::transpose, take(static_cast<size_t>(v->type().numel())), s[0], fromNchw ? s[1] : hw, fromNchw ? hw : s[1], 0};
    return m;
  };
  Moved mx = shape4(x, false), my = shape4(acts[1], !grad), mdx = shape4(acts[2], true), mw, mdw;
  if (d.nhwc) {  // the weights: KCRS in the graph, KRSC (channels padded) for cuDNN
    const auto& s = shape(w);
    const int64_t rs = s[2] * s[3];
    const size_t elems = static_cast<size_t>(s[0] * rs * d.C);
    mw = padded ? Moved{How::pad, take(elems), s[0], rs, C0, d.C} : Moved{How::transpose, take(elems), s[0], s[1], rs, 0};
    if (needDw) mdw = padded ? Moved{How::unpad, take(elems), s[0], rs, C0, d.C} : Moved{How::transpose, take(elems), s[0], rs, s[1], 0};
  }
  const Scratch work = scratch(total);
  const int e = static_cast<int>(eb);
  // Operand pointers at launch: the scratch copy when moved, else the graph's bytes.
  auto at = [](const Moved& m, void* base, const void* graph) -> void* {
    return m.how != How::none ? static_cast<char*>(base) + m.off : const_cast<void*>(graph);
  };
  auto move = [e](const Moved& m, const void* src, void* dst, cudaStream_t st) {
    switch (m.how) {
      case How::transpose: return transpose2d(src, dst, m.batch, m.R, m.C, e, st);
      case How::pad: return padChannelsLast(src, dst, m.batch, m.C, m.R, m.Cp, e, st);
      case How::unpad: return unpadChannelsLast(src, dst, m.batch, m.C, m.R, m.Cp, e, st);
      default: return cudaSuccess;
    }
  };
  if (!grad) {
    const void *X = P(x), *W = P(w);
    void* Y = P(out(0));
    add([=](cudaStream_t st) {
      void* base = *work.base;
      void *xs = at(mx, base, X), *ws = at(mw, base, W), *ys = at(my, base, Y);
      cudaError_t r = move(mx, X, xs, st);
      if (r == cudaSuccess) r = move(mw, W, ws, st);
      if (r != cudaSuccess) return r;
      if (c->forward(xs, ws, ys, base, wsBytes) != CUDNN_STATUS_SUCCESS) return cudaErrorUnknown;
      return move(my, ys, Y, st);
    });
    if (has(2)) {  // + bias per output channel (the output is NCHW: placeChannelsLast pins it)
      std::vector<int64_t> bshape(shape(out(0)).size(), 1);
      bshape[1] = d.M;
      EwArgs ew = ewArgs(Ew::Add, {out(0)}, out(0));
      ew.nin = 2;
      ew.in[1] = P(in(2));
      ew.inType[1] = dt(in(2));
      ew.access[1] = Access::Strided;
      const auto st = stridesOf(bshape);
      for (size_t k = 0; k < bshape.size(); ++k) ew.stride[1][k] = bshape[k] == 1 ? 0 : st[k];
      add([ew](cudaStream_t s) { return cuda::elementwise(ew, s); });
    }
    return;
  }
  const void *dY = P(in(0)), *X = P(x), *W = P(w);
  void* dX = needDx ? P(out(0)) : nullptr;
  void* dW = needDw ? P(out(1)) : nullptr;
  add([=](cudaStream_t st) {
    void* base = *work.base;
    void *dys = at(my, base, dY), *xs = at(mx, base, X), *ws = at(mw, base, W), *dxs = at(mdx, base, dX), *dws = at(mdw, base, dW);
    cudaError_t r = move(my, dY, dys, st);
    if (r == cudaSuccess && dW) r = move(mx, X, xs, st);
    if (r == cudaSuccess && dX) r = move(mw, W, ws, st);
    if (r != cudaSuccess) return r;
    if (dX && c->backwardData(dys, ws, dxs, base, wsBytes) != CUDNN_STATUS_SUCCESS) return cudaErrorUnknown;
    if (dX && (r = move(mdx, dxs, dX, st)) != cudaSuccess) return r;
    if (dW && c->backwardFilter(xs, dys, dws, base, wsBytes) != CUDNN_STATUS_SUCCESS) return cudaErrorUnknown;
    if (dW) return move(mdw, dws, dW, st);
    return cudaSuccess;
  });
}

// The window of pooling node m over x (m's attributes).
PoolArgs Program::Lowering::poolArgs(const Node& m, const Value* x) const {
  const auto& xs = shape(x);
  const int nsp = static_cast<int>(xs.size()) - 2;
  if (nsp < 1 || nsp > 3) fail("pooling over 1 to 3 spatial dims only");
  if (m.getInt("storage_order", 0) != 0) fail("storage_order = 1 is not supported on CUDA");
  const std::vector<int64_t> spatialIn(xs.begin() + 2, xs.end());
  const Window w = windowOf(m, spatialIn, m.getInts("kernel_shape"), m.getInt("ceil_mode", 0) != 0);
  PoolArgs a;
  a.nhwc = p.nhwc_.count(x) != 0;
  a.nsp = nsp;
  a.N = xs[0];
  a.C = xs[1];
  a.t = dt(x);
  a.includePad = m.getInt("count_include_pad", 0) != 0;
  for (int i = 0; i < nsp; ++i) {
    a.in[i] = spatialIn[i];
    a.out[i] = w.out[i];
    a.k[i] = w.kernel[i];
    a.s[i] = w.strides[i];
    a.d[i] = w.dilations[i];
    a.pad[i] = w.padBegin[i];
    a.padEnd[i] = w.padEnd[i];
  }
  return a;
}

void Program::Lowering::pool(bool isMax, bool grad) {
  const Value* x = grad ? in(1) : in(0);
  const PoolArgs a = poolArgs(n, x);
  if (grad) {
    const bool gathered = p.opts_.deterministic;
    const Scratch acc = scratch(gathered ? 0 : sizeof(float) * x->type().numel());
    const void* dy = P(in(0));
    void* dx = P(out(0));
    add([dy, dx, acc, a, gathered](cudaStream_t st) { return averagePoolGrad(dy, dx, gathered ? nullptr : acc.f(), a, st); });
    return;
  }
  const void* X = P(x);
  void* Y = P(out(0));
  if (isMax) {
    int64_t* idx = n.numResults() > 1 ? static_cast<int64_t*>(P(out(1))) : nullptr;
    if (idx && dt(out(1)) != DT::i64) fail("Indices must be i64");
    add([X, Y, idx, a](cudaStream_t st) { return maxPool(X, Y, idx, a, st); });
  } else {
    add([X, Y, a](cudaStream_t st) { return averagePool(X, Y, a, st); });
  }
}

void Program::Lowering::reduce(Red op) {
  const Value* x = in(0);
  const auto& xs = shape(x);
  const int64_t r = static_cast<int64_t>(xs.size());
  std::vector<int64_t> axes;
  if (n.op() == "GlobalAveragePool") {
    if (p.nhwc_.count(x) && r == 4 && dt(out(0)) == dt(x)) {  // channels-last: a mean over the rows of [N, H * W, C]
      const void* X = P(x);
      void* Y = P(out(0));
      const DT t = dt(x);
      const int64_t N = xs[0], C = xs[1], HW = xs[2] * xs[3];
      add([=](cudaStream_t st) { return globalAveragePoolChannelsLast(X, Y, t, N, HW, C, st); });
      return;
    }
    for (int64_t d = 2; d < r; ++d) axes.push_back(d);
  } else {
    axes = n.getInts("axes");
    if (has(1)) axes = constInts(1);
    if (axes.empty() && n.getInt("noop_with_empty_axes", 0)) return copyValue(x, out(0));
  }
  std::vector<bool> red(static_cast<size_t>(r), axes.empty());
  for (int64_t a : axes) red[static_cast<size_t>(normalizeAxis(a, r))] = true;
  if (r > kMaxRank) fail("rank above " + std::to_string(kMaxRank));
  ReduceArgs a;
  a.op = op;
  a.t = dt(x);
  if (dt(out(0)) != a.t) fail("the result type differs from the input's");
  const auto st = p.nhwc_.count(x) ? nhwcStrides(xs) : stridesOf(xs);  // GlobalAveragePool reads either layout
  a.outN = out(0)->type().numel();
  a.redN = 1;
  for (int64_t d = 0; d < r; ++d) {
    if (red[d]) {
      a.rshape[a.rrank] = xs[d];
      a.rstride[a.rrank++] = st[d];
      a.redN *= xs[d];
    } else {
      a.kshape[a.krank] = xs[d];
      a.kstride[a.krank++] = st[d];
    }
  }
  const void* X = P(x);
  void* Y = P(out(0));
  // Float sums and means whose kept dims form one block in memory (x's layout, channels-last
  // included): [R, K] (bias gradients over leading dims) as column tiles, [A, K, B] (per-channel
  // sums of NCHW values) and whole sums ([A, 1, 1]) as row slices, coalesced either way.
  if ((op == Red::Sum || op == Red::Mean) && !isInt(a.t) && a.redN > 0) {
    std::vector<int64_t> byMemory;  // x's non-1 dims, outermost first
    for (int64_t d = 0; d < r; ++d)
      if (xs[d] != 1) byMemory.push_back(d);
    std::stable_sort(byMemory.begin(), byMemory.end(), [&](int64_t i, int64_t j) { return st[i] > st[j]; });
    std::vector<std::pair<bool, int64_t>> blocks;  // (reduced, elements), adjacent dims of one kind merged
    int64_t lastKept = -1;
    bool keptInOrder = true;  // the kept dims lie in memory in the output's order
    for (int64_t d : byMemory) {
      if (!red[d]) {
        keptInOrder = keptInOrder && d > lastKept;
        lastKept = d;
      }
      if (!blocks.empty() && blocks.back().first == red[d]) blocks.back().second *= xs[d];
      else blocks.emplace_back(red[d], xs[d]);
    }
    const float scale = op == Red::Mean ? 1.0f / static_cast<float>(a.redN) : 1.0f;
    const DT t = a.t;
    auto is = [&](std::initializer_list<bool> kinds) {
      if (blocks.size() != kinds.size()) return false;
      size_t i = 0;
      for (bool k : kinds)
        if (blocks[i++].first != k) return false;
      return true;
    };
    if (keptInOrder && is({true, false})) {
      const int64_t R = blocks[0].second, K = blocks[1].second;
      const Scratch acc = scratch(reduceColumnsScratch(R, K));
      add([X, Y, t, R, K, scale, acc](cudaStream_t s) { return reduceColumns(X, t, Y, R, K, scale, acc.f(), s); });
      return;
    }
    if (keptInOrder && (is({true, false, true}) || is({true}))) {
      const int64_t A = blocks[0].second, K = blocks.size() == 3 ? blocks[1].second : 1, B = blocks.size() == 3 ? blocks[2].second : 1;
      const Scratch acc = scratch(reduceMiddleScratch(A, K, B));
      add([X, Y, t, A, K, B, scale, acc](cudaStream_t s) { return reduceMiddle(X, t, Y, A, K, B, scale, acc.f(), s); });
      return;
    }
    // [A, K, B] over K with enough outputs to fill the GPU with a thread each (the warp per output
    // of the general kernel idles 29 of 32 lanes over a K of 3).
    if (keptInOrder && is({false, true, false}) && blocks[0].second * blocks[2].second >= 4096 && blocks[1].second <= 1024) {
      const int64_t A = blocks[0].second, K = blocks[1].second, B = blocks[2].second;
      add([X, Y, t, A, K, B, scale](cudaStream_t s) { return reduceStrided(X, t, Y, A, K, B, scale, s); });
      return;
    }
  }
  add([X, Y, a](cudaStream_t s) { return cuda::reduce(X, Y, a, s); });
}

void Program::Lowering::lower() {
  const std::string& op = n.op();
  // Every operand constant: computed now by the CPU kernels, into a buffer of its own.
  if (allConstInputs(n)) {
    std::vector<const Tensor*> ins;
    for (const Value* v : n.inputs()) ins.push_back(v ? v->constData() : nullptr);
    auto outs = cpu::runNode(n, ins);
    for (size_t i = 0; i < outs.size(); ++i) {
      void* d = p.allocPersistent(std::max<size_t>(outs[i].data.size(), 1));
      check(cudaMemcpy(d, outs[i].data.data(), outs[i].data.size(), cudaMemcpyHostToDevice), n.describe());
      p.where_[out(i)] = d;
    }
    return;
  }
  // What the target says the CUDA kernels cannot run (a plan compiled elsewhere, or by an older ampc).
  if (const Target& cuda = findTarget("cuda"); cuda.refusal)
    if (std::string why = cuda.refusal(n); !why.empty()) fail(why);
  // The ONNX elementwise ops: one row each, op -> kernel op. Every other op's row is in table().
  static const std::map<std::string, Ew> kEw = {
      {"Add", Ew::Add}, {"Sub", Ew::Sub}, {"Mul", Ew::Mul}, {"Div", Ew::Div}, {"Pow", Ew::Pow}, {"Equal", Ew::Equal},
      {"Less", Ew::Less}, {"LessOrEqual", Ew::LessEq}, {"Greater", Ew::Greater}, {"GreaterOrEqual", Ew::GreaterEq},
      {"And", Ew::And}, {"Or", Ew::Or}, {"Where", Ew::Where}, {"Sqrt", Ew::Sqrt}, {"Reciprocal", Ew::Reciprocal},
      {"Exp", Ew::Exp}, {"Log", Ew::Log}, {"Tanh", Ew::Tanh}, {"Sigmoid", Ew::Sigmoid}, {"Erf", Ew::Erf},
      {"Softplus", Ew::Softplus}, {"LeakyRelu", Ew::LeakyRelu}, {"Relu", Ew::Relu}, {"Neg", Ew::Neg}, {"Abs", Ew::Abs},
      {"Not", Ew::Not}, {"IsNaN", Ew::IsNaN}, {"IsInf", Ew::IsInf}, {"Cast", Ew::Copy}, {"CastLike", Ew::Copy},
      {"Sin", Ew::Sin}, {"Cos", Ew::Cos}, {"HardSigmoid", Ew::HardSigmoid}, {"HardSwish", Ew::HardSwish}, {"Elu", Ew::Elu},
      {"Selu", Ew::Selu}, {"Celu", Ew::Celu}, {"Mish", Ew::Mish}, {"Floor", Ew::Floor}, {"Ceil", Ew::Ceil}, {"Round", Ew::Round},
      {"Sign", Ew::Sign}, {"PRelu", Ew::PRelu}, {"Mod", Ew::Mod}};
  if (n.domain().empty()) {  // first the folds: nodes that another node's launch does
    if (fusableComparison(n)) return;  // computed by its Where
    if (castFolded(n)) return;          // done by the elementwise op that reads or writes it
    if (op == "Where" && in(0)->producer())
      if (const Ew* cmp = fusableComparison(*in(0)->producer())) {
        const Node& c = *in(0)->producer();
        EwArgs a = ewArgs(Ew::WhereCmp, {c.inputs()[0], c.inputs()[1], in(1), in(2)}, out(0));
        a.cmp = *cmp;
        a.intMath = isInt(a.outType);
        add([a](cudaStream_t st) { return cuda::elementwise(a, st); });
        return;
      }
    if (auto it = kEw.find(op); it != kEw.end()) {
      std::vector<const Value*> ins;
      const size_t count = op == "CastLike" ? 1 : n.inputs().size();
      for (size_t i = 0; i < count; ++i) ins.push_back(in(i));
      return elementwise(it->second, ins);
    }
  }
  const auto& rules = table();
  if (auto it = rules.find({n.domain(), op}); it != rules.end()) return (this->*it->second)();
  fail("no CUDA lowering for op '" + n.qualifiedOp() + "'");
}

// The lowering table: one row per op, (domain, op) -> the member that lowers it. The ONNX
// elementwise ops are rows of kEw (lower()); every other op that has a CUDA lowering is here.
const std::map<std::pair<std::string, std::string>, Program::Lowering::Rule>& Program::Lowering::table() {
  static const std::map<std::pair<std::string, std::string>, Rule> kTable = {
      {{"", "Gelu"}, &Lowering::onnxGelu},
      {{"", "Max"}, &Lowering::onnxMaxMin},
      {{"", "Min"}, &Lowering::onnxMaxMin},
      {{"", "Clip"}, &Lowering::onnxClip},
      {{"", "Identity"}, &Lowering::onnxView},
      {{"", "Reshape"}, &Lowering::onnxView},
      {{"", "Flatten"}, &Lowering::onnxView},
      {{"", "Squeeze"}, &Lowering::onnxView},
      {{"", "Unsqueeze"}, &Lowering::onnxView},
      {{"", "Transpose"}, &Lowering::onnxTranspose},
      {{"", "Slice"}, &Lowering::onnxSlice},
      {{"", "Expand"}, &Lowering::onnxExpand},
      {{"", "Concat"}, &Lowering::onnxConcatSplit},
      {{"", "Split"}, &Lowering::onnxConcatSplit},
      {{"", "Pad"}, &Lowering::onnxPad},
      {{"", "Gather"}, &Lowering::onnxGather},
      {{"", "GatherElements"}, &Lowering::onnxGatherElements},
      {{"", "GatherND"}, &Lowering::onnxGatherElements},
      {{"", "ScatterElements"}, &Lowering::onnxScatterElements},
      {{"", "ScatterND"}, &Lowering::onnxScatterElements},
      {{"", "Trilu"}, &Lowering::onnxTrilu},
      {{"ampc", "RotateHalf"}, &Lowering::ampcRotateHalf},
      {{"", "CumSum"}, &Lowering::onnxCumSum},
      {{"", "Det"}, &Lowering::onnxDet},
      {{"ampc", "DetGrad"}, &Lowering::ampcDetGrad},
      {{"", "MatMul"}, &Lowering::onnxMatMul},
      {{"", "Gemm"}, &Lowering::onnxGemm},
      {{kCudaDomain, "Gemm"}, &Lowering::onnxGemm},  // with the bias gradient's epilogue (passes/fuse_bias_grad.cpp)
      {{kCudaDomain, "MultiCast"}, &Lowering::cudaMultiCast},
      {{"", "Conv"}, &Lowering::onnxConv},
      {{"", "MaxPool"}, &Lowering::onnxMaxPool},
      {{"", "AveragePool"}, &Lowering::onnxAveragePool},
      {{"", "GlobalAveragePool"}, &Lowering::onnxGlobalAveragePool},
      {{"", "ReduceSum"}, &Lowering::onnxReduceSum},
      {{"", "ReduceMean"}, &Lowering::onnxReduceMean},
      {{"", "ReduceMax"}, &Lowering::onnxReduceMax},
      {{"", "ReduceMin"}, &Lowering::onnxReduceMin},
      {{"", "Softmax"}, &Lowering::onnxSoftmax},
      {{"", "LogSoftmax"}, &Lowering::onnxSoftmax},
      {{"", "LayerNormalization"}, &Lowering::onnxLayerNormalization},
      {{"ampc", "RmsNorm"}, &Lowering::onnxLayerNormalization},
      {{"", "BatchNormalization"}, &Lowering::onnxBatchNormalization},
      {{kCudaDomain, "BatchNormalization"}, &Lowering::onnxBatchNormalization},  // + residual, Relu (passes/fuse_norm_epilogue.cpp)
      {{"", "SoftmaxCrossEntropyLoss"}, &Lowering::onnxSoftmaxCrossEntropyLoss},
      {{kCudaDomain, "SoftmaxCrossEntropyLoss"}, &Lowering::onnxSoftmaxCrossEntropyLoss},  // + row statistics (passes/keep_loss_stats.cpp)
      {{"", "Dropout"}, &Lowering::onnxDropout},
      {{kCudaDomain, "Dropout"}, &Lowering::onnxDropout},  // + residual (passes/fuse_dropout_residual.cpp)
      {{"", "RandomUniformLike"}, &Lowering::onnxRandom},
      {{"", "RandomNormalLike"}, &Lowering::onnxRandom},
      {{"", "Bernoulli"}, &Lowering::onnxRandom},
      {{"", "Shape"}, &Lowering::onnxShape},
      {{"", "ConstantOfShape"}, &Lowering::onnxConstantOfShape},
      {{"ampc", "Fused"}, &Lowering::ampcFused},
      {{"ampc", "Gelu"}, &Lowering::ampcGelu},
      {{"ampc", "GeluGrad"}, &Lowering::ampcGelu},
      {{"ampc", "Silu"}, &Lowering::ampcSilu},
      {{"ampc", "SiluGrad"}, &Lowering::ampcSiluGrad},
      {{"ampc", "ConvGrad"}, &Lowering::ampcConvGrad},
      {{"ampc", "AveragePoolGrad"}, &Lowering::ampcAveragePoolGrad},
      {{"ampc", "ScatterAddFlat"}, &Lowering::ampcScatterAddFlat},
      {{"ampc", "GatherGrad"}, &Lowering::ampcGatherGrad},
      {{"ampc", "AllReduce"}, &Lowering::ampcAllReduce},
      {{"", "TopK"}, &Lowering::onnxTopK},
      {{"", "GridSample"}, &Lowering::onnxGridSample},
      {{"ampc", "GridSampleGrad"}, &Lowering::ampcGridSampleGrad},
      {{"", "Tile"}, &Lowering::onnxTile},
      {{"", "ArgMax"}, &Lowering::onnxArgMax},
      {{"ampc", "GatherElementsGrad"}, &Lowering::ampcGatherElementsGrad},
      {{"ampc", "GatherNDGrad"}, &Lowering::ampcGatherElementsGrad},
      {{"ampc", "SliceGrad"}, &Lowering::ampcSliceGrad},
      {{"ampc", "PadGrad"}, &Lowering::ampcPadGrad},
      {{"ampc", "BatchNormGrad"}, &Lowering::ampcBatchNormGrad},
      {{kCudaDomain, "BatchNormGrad"}, &Lowering::ampcBatchNormGrad},  // dY gated by y (passes/fuse_relu_grad.cpp)
      {{"ampc", "LayerNormGrad"}, &Lowering::ampcLayerNormGrad},
      {{kCudaDomain, "LayerNormGrad"}, &Lowering::ampcLayerNormGrad},  // + residual (passes/fuse_norm_epilogue.cpp)
      {{"ampc", "SoftmaxCrossEntropyLossGrad"}, &Lowering::ampcSoftmaxCrossEntropyLossGrad},
      {{kCudaDomain, "SoftmaxCrossEntropyLossGrad"}, &Lowering::ampcSoftmaxCrossEntropyLossGrad},  // reading them
      {{"ampc", "Attention"}, &Lowering::ampcAttention},
      {{"ampc", "AttentionGrad"}, &Lowering::ampcAttention},
      {{kCudaDomain, "Attention"}, &Lowering::ampcAttention},  // operands in place (passes/attention_in_place.cpp)
      {{kCudaDomain, "AttentionGrad"}, &Lowering::ampcAttention},
      {{"ampc", "DropoutGrad"}, &Lowering::ampcDropoutGrad},
      {{"ampc", "UnscaleCheck"}, &Lowering::ampcTrainStep},
      {{"ampc", "ClipByGlobalNorm"}, &Lowering::ampcTrainStep},
      {{"ampc", "StepIncrement"}, &Lowering::ampcTrainStep},
      {{"ampc", "LearningRate"}, &Lowering::ampcTrainStep},
      {{"ampc", "SGD"}, &Lowering::ampcTrainStep},
      {{"ampc", "Adam"}, &Lowering::ampcTrainStep},
      {{"ampc", "ScalerUpdate"}, &Lowering::ampcTrainStep}
  };
  return kTable;
}

// cuda::MultiCast (passes/fuse_param_casts.cpp): the step's parameter casts to one type as one
// multi-tensor launch.
void Program::Lowering::cudaMultiCast() {
  std::vector<std::vector<void*>> roles(2);
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < n.numResults(); ++i) {
    if (dt(in(i)) != DT::f32) fail("operand " + std::to_string(i) + " must be f32");
    roles[0].push_back(P(in(i)));
    roles[1].push_back(P(out(i)));
    sizes.push_back(out(i)->type().numel());
  }
  auto l = std::make_shared<TensorList>(sizes, roles);
  p.keep_.push_back(l);
  const DT to = dt(out(0));
  if (to != DT::f16 && to != DT::bf16) fail("the results must be f16 or bf16");
  add([=](cudaStream_t st) { return castTensors(*l, to, st); });
}

// Max, Min: variadic, folded pairwise into the result.
void Program::Lowering::onnxMaxMin() {
  const std::string& op = n.op();
  const Ew e = op == "Max" ? Ew::Max : Ew::Min;
  if (n.inputs().size() == 1) return copyValue(in(0), out(0));
  elementwise(e, {in(0), in(1)});
  for (size_t i = 2; i < n.inputs().size(); ++i) {
    EwArgs a = ewArgs(e, {out(0), in(i)}, out(0));
    add([a](cudaStream_t st) { return cuda::elementwise(a, st); });
  }
}

// Clip by constant bounds: f32 bounds for floats; integers (token ids clamped into a table) clip
// in int64 arithmetic against int64 bounds.
void Program::Lowering::onnxClip() {
  const double lo = has(1) ? constScalar(1, 0) : -INFINITY, hi = has(2) ? constScalar(2, 0) : INFINITY;
  EwArgs a = ewArgs(Ew::Clip, {in(0)}, out(0));
  a.nin = 3;
  a.access[1] = a.access[2] = Access::Scalar;
  if (isInt(a.outType)) {
    auto* bounds = static_cast<int64_t*>(p.allocPersistent(2 * sizeof(int64_t)));
    auto toInt = [](double v) {
      return v <= -9.2e18 ? INT64_MIN : v >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(v);
    };
    const int64_t hb[2] = {toInt(lo), toInt(hi)};
    check(cudaMemcpy(bounds, hb, sizeof(hb), cudaMemcpyHostToDevice), "Clip bounds");
    a.in[1] = bounds;
    a.in[2] = bounds + 1;
    a.inType[1] = a.inType[2] = DT::i64;
    a.intMath = true;
  } else {
    float* bounds = static_cast<float*>(p.allocPersistent(2 * sizeof(float)));
    const float hb[2] = {static_cast<float>(lo), static_cast<float>(hi)};
    check(cudaMemcpy(bounds, hb, sizeof(hb), cudaMemcpyHostToDevice), "Clip bounds");
    a.in[1] = bounds;
    a.in[2] = bounds + 1;
    a.inType[1] = a.inType[2] = DT::f32;
  }
  add([a](cudaStream_t st) { return cuda::elementwise(a, st); });
}

void Program::Lowering::onnxTranspose() {
  const auto& xs = shape(in(0));
  const int64_t r = static_cast<int64_t>(xs.size());
  std::vector<int64_t> perm = n.getInts("perm");
  if (perm.empty())
    for (int64_t i = r - 1; i >= 0; --i) perm.push_back(i);
  // Tiled when it is [batch, R, C] -> [batch, C, R] (compiler/ops/geometry.h, tiledTranspose), reading an f16/bf16
  // operand through a widening Cast in front when there is one.
  int64_t batch = 1, R = 0, C = 0;
  const int eb = dtSize(dt(in(0)));
  if ((eb == 2 || eb == 4) && tiledTranspose(n, batch, R, C)) {
    const Value* x = readThrough(in(0));
    const void* src = P(x);
    void* dst = P(out(0));
    if (x != in(0)) {
      const DT from = dt(x);
      add([=](cudaStream_t st) { return transpose2dWiden(src, from, static_cast<float*>(dst), batch, R, C, st); });
    } else {
      add([=](cudaStream_t st) { return transpose2d(src, dst, batch, R, C, eb, st); });
    }
    return;
  }
  const auto st = stridesOf(xs), os = stridesOf(shape(out(0)));
  CopyArgs a;
  a.rank = static_cast<int>(r);
  a.n = out(0)->type().numel();
  for (int64_t d = 0; d < r; ++d) {
    a.shape[d] = shape(out(0))[d];
    a.srcStride[d] = st[perm[d]];
    a.dstStride[d] = os[d];
  }
  return strided(in(0), out(0), a);
}

void Program::Lowering::onnxSlice() {
  const auto& xs = shape(in(0));
  auto ints = [&](size_t i) { return has(i) ? constInts(i) : std::vector<int64_t>{}; };
  const SliceSpec s = sliceSpecOf(xs, ints(1), ints(2), ints(3), ints(4));
  const auto st = stridesOf(xs), os = stridesOf(s.out);
  CopyArgs a;
  a.rank = static_cast<int>(xs.size());
  a.n = out(0)->type().numel();
  for (size_t d = 0; d < xs.size(); ++d) {
    a.shape[d] = s.out[d];
    a.srcStride[d] = st[d] * s.step[d];
    a.srcOffset += s.start[d] * st[d];
    a.dstStride[d] = os[d];
  }
  return strided(in(0), out(0), a);
}

void Program::Lowering::onnxExpand() {
  const auto &os = shape(out(0)), &xs = shape(in(0));
  if (xs == os) return copyValue(in(0), out(0));
  if (p.nhwc_.count(out(0)) && xs.size() == 4 && xs[0] == os[0] && xs[1] == os[1] && xs[2] * xs[3] == 1) {
    const void* X = P(in(0));
    void* Y = P(out(0));
    const int64_t N = os[0], C = os[1], HW = os[2] * os[3];
    const int eb = dtSize(dt(out(0)));
    add([=](cudaStream_t st) { return broadcastChannelsLast(X, Y, N, HW, C, eb, st); });  // [N, C] over H * W
    return;
  }
  if (os.size() > static_cast<size_t>(kMaxRank)) fail("rank above " + std::to_string(kMaxRank));
  CopyArgs a;
  a.rank = static_cast<int>(os.size());
  a.n = out(0)->type().numel();
  const auto dst = p.nhwc_.count(out(0)) ? nhwcStrides(os) : stridesOf(os), src = stridesOf(xs);  // [N, C, 1, 1] -> either layout
  const size_t off = os.size() - xs.size();
  for (size_t d = 0; d < os.size(); ++d) {
    a.shape[d] = os[d];
    a.dstStride[d] = dst[d];
    a.srcStride[d] = d >= off && xs[d - off] != 1 ? src[d - off] : 0;  // broadcast dims read one element
  }
  return strided(in(0), out(0), a);
}

void Program::Lowering::onnxConcatSplit() {
  const std::string& op = n.op();
  const bool concat = op == "Concat";
  const Value* whole = concat ? out(0) : in(0);
  const auto& ws = shape(whole);
  const int64_t axis = normalizeAxis(n.getInt("axis", 0), static_cast<int64_t>(ws.size()));
  const auto wst = stridesOf(ws);
  int64_t at = 0;
  const size_t parts = concat ? n.inputs().size() : n.numResults();
  for (size_t i = 0; i < parts; ++i) {
    const Value* part = concat ? in(i) : out(i);
    const auto& ps = shape(part);
    const auto pst = stridesOf(ps);
    CopyArgs a;
    a.rank = static_cast<int>(ps.size());
    a.n = part->type().numel();
    for (size_t d = 0; d < ps.size(); ++d) {
      a.shape[d] = ps[d];
      (concat ? a.srcStride : a.dstStride)[d] = pst[d];
      (concat ? a.dstStride : a.srcStride)[d] = wst[d];
    }
    (concat ? a.dstOffset : a.srcOffset) = at * wst[axis];
    at += ps[axis];
    if (concat) strided(part, whole, a);
    else strided(whole, part, a);
  }
}

// Pad's reflect, edge and wrap modes (and their gradients): each output element's source offset,
// computed on the device into scratch, then a flat gather forward, a scatter-add backward.
// Where the input starts in each dim of Pad's result: the pads (input `padsAt`) over the axes (input
// `axesAt`, or every dim).
std::vector<int64_t> Program::Lowering::padBegin(int64_t rank, int padsAt, int axesAt) {
  const auto pads = constInts(padsAt);
  std::vector<int64_t> axes;
  if (has(axesAt)) axes = constInts(axesAt);
  else for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  std::vector<int64_t> begin(rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) begin[normalizeAxis(axes[i], rank)] = pads[i];
  return begin;
}

PadMap Program::Lowering::padMap(const std::vector<int64_t>& xs, const std::vector<int64_t>& os, const std::vector<int64_t>& begin) {
  const std::string mode = n.getString("mode", "constant");
  PadMap m;
  m.mode = mode == "edge" ? 1 : mode == "wrap" ? 2 : 0;
  m.rank = static_cast<int>(xs.size());
  if (m.rank > kMaxRank) fail("rank " + std::to_string(m.rank) + " is past the " + std::to_string(kMaxRank) + " CUDA pads");
  m.n = 1;
  for (int d = 0; d < m.rank; ++d) {
    if (xs[d] == 0 && os[d] > 0) fail(mode + " padding of an empty dim");
    m.inShape[d] = xs[d], m.outShape[d] = os[d], m.begin[d] = begin[d];
    m.n *= os[d];
  }
  return m;
}

void Program::Lowering::onnxPad() {
  const auto& xs = shape(in(0));
  const int64_t r = static_cast<int64_t>(xs.size());
  const std::vector<int64_t> begin = padBegin(r, 1, 3);
  if (n.getString("mode", "constant") != "constant") {
    const PadMap m = padMap(xs, shape(out(0)), begin);
    const Scratch idx = scratch(sizeof(int64_t) * static_cast<size_t>(std::max<int64_t>(m.n, 1)));
    const void* X = P(in(0));
    void* Y = P(out(0));
    const int eb = dtSize(dt(in(0)));
    const int64_t xN = in(0)->type().numel();
    add([=](cudaStream_t st) {
      auto* I = static_cast<int64_t*>(idx.at(0));
      if (cudaError_t e = padSourceIndex(I, m, st); e != cudaSuccess) return e;
      return gather(X, I, DT::i64, Y, eb, 1, xN, m.n, 1, st);
    });
    return;
  }
  for (const int64_t pad : constInts(1))
    if (pad < 0) fail("negative pads are not supported on CUDA");
  const double value = constScalar(2, 0.0);
  void* Y = P(out(0));
  const DT t = dt(out(0));
  const int64_t total = out(0)->type().numel();
  add([Y, t, total, value](cudaStream_t st) { return fill(Y, t, total, value, st); });
  const auto xst = stridesOf(xs), ost = stridesOf(shape(out(0)));
  CopyArgs a;
  a.rank = static_cast<int>(r);
  a.n = in(0)->type().numel();
  for (int64_t d = 0; d < r; ++d) {
    a.shape[d] = xs[d];
    a.srcStride[d] = xst[d];
    a.dstStride[d] = ost[d];
    a.dstOffset += begin[d] * ost[d];
  }
  return strided(in(0), out(0), a);
}

void Program::Lowering::onnxGather() {
  const auto& xs = shape(in(0));
  int64_t outer, dim, inner;
  split(xs, normalizeAxis(n.getInt("axis", 0), static_cast<int64_t>(xs.size())), outer, dim, inner);
  const int64_t cnt = in(1)->type().numel();
  const void *X = P(in(0)), *I = P(in(1));
  const DT it = dt(in(1));
  void* Y = P(out(0));
  const int eb = dtSize(dt(in(0)));
  add([=](cudaStream_t st) { return gather(X, I, it, Y, eb, outer, dim, cnt, inner, st); });
}

void Program::Lowering::onnxGatherElements() {
  const IndexGeom g = indexGeom(n, shape(in(0)));
  const void *X = P(in(0)), *I = P(in(1));
  const DT it = dt(in(1));
  void* Y = P(out(0));
  const int eb = dtSize(dt(in(0)));
  add([=](cudaStream_t st) { return indexGather(X, eb, I, it, Y, g, st); });
}

void Program::Lowering::onnxScatterElements() {
  // out = data, then the updates written (or added) over it; the updates walk the geometry of
  // the gather that reads them back.
  const IndexGeom g = indexGeom(n, shape(in(0)));
  const void *X = P(in(0)), *I = P(in(1)), *U = P(in(2));
  void* Y = P(out(0));
  const DT t = dt(in(0)), it = dt(in(1));
  const int eb = dtSize(t);
  const size_t bytes = in(0)->type().bytes();
  const bool accumulate = n.getString("reduction", "none") == "add";  // max and min: Target::refusal
  const int64_t outN = in(0)->type().numel();
  const size_t ob = accumulate && isFloat(in(0)->type().dtype) ? orderBytes(g.n, outN) : 0;
  const Scratch ord = scratch(ob);
  add([=](cudaStream_t st) {
    if (Y != X)
      if (cudaError_t e = cudaMemcpyAsync(Y, X, bytes, cudaMemcpyDeviceToDevice, st); e != cudaSuccess) return e;
    return indexScatter(U, t, eb, I, it, Y, g, accumulate, ob ? ord.at(0) : nullptr, outN, st);
  });
}

void Program::Lowering::onnxTrilu() {
  const auto& xs = shape(in(0));
  const int64_t R = xs[xs.size() - 2], Cc = xs.back(), batches = R * Cc != 0 ? in(0)->type().numel() / (R * Cc) : 0;
  const int64_t k = has(1) ? static_cast<int64_t>(constScalar(1, 0)) : 0;
  const bool upper = n.getInt("upper", 1) != 0;
  const void* X = P(in(0));
  void* Y = P(out(0));
  const int eb = dtSize(dt(in(0)));
  add([=](cudaStream_t st) { return trilu(X, Y, eb, batches, R, Cc, k, upper, st); });
}

void Program::Lowering::ampcRotateHalf() {
  const auto& xs = shape(in(0));
  const int64_t d = xs.back(), rows = d ? in(0)->type().numel() / d : 0;
  const bool negFirst = n.getInt("sign", 1) > 0;
  const void* X = P(in(0));
  void* Y = P(out(0));
  const int eb = dtSize(dt(in(0)));
  add([=](cudaStream_t st) { return rotateHalf(X, Y, eb, rows, d / 2, negFirst, st); });
}

void Program::Lowering::onnxCumSum() {
  const auto& xs = shape(in(0));
  int64_t outer, dim, inner;
  split(xs, normalizeAxis(constInts(1).at(0), static_cast<int64_t>(xs.size())), outer, dim, inner);
  const void* X = P(in(0));
  void* Y = P(out(0));
  const DT t = dt(in(0));
  const bool excl = n.getInt("exclusive", 0) != 0, rev = n.getInt("reverse", 0) != 0;
  add([=](cudaStream_t st) { return cumSum(X, Y, t, outer, dim, inner, excl, rev, st); });
}

void Program::Lowering::onnxSoftmax() {
  const std::string& op = n.op();
  const auto& xs = shape(in(0));
  int64_t outer, axis, inner;
  split(xs, normalizeAxis(n.getInt("axis", -1), static_cast<int64_t>(xs.size())), outer, axis, inner);
  const void* X = P(in(0));
  void* Y = P(out(0));
  const DT t = dt(in(0));
  const bool log = op == "LogSoftmax";
  add([=](cudaStream_t st) { return softmax(X, Y, t, outer, axis, inner, log, st); });
}

void Program::Lowering::onnxLayerNormalization() {
  const auto& xs = shape(in(0));
  int64_t rows, D;
  rowsOf(xs, normalizeAxis(n.getInt("axis", -1), static_cast<int64_t>(xs.size())), rows, D);
  if (in(1)->type().numel() != D || (has(2) && in(2)->type().numel() != D)) fail("scale and bias must cover the normalised dims");
  if (n.numResults() > 1 && dt(out(1)) != DT::f32) fail("Mean must be f32");
  const Value* x = readThrough(in(0));  // a widening Cast in front is read through
  const void *X = P(x), *S = P(in(1)), *B = has(2) ? P(in(2)) : nullptr;
  if (B && dt(in(2)) != dt(in(1))) fail("scale and bias must share a type");
  const Node* narrow = narrowedResult(n);  // a Cast after it is written through
  const Value* y = narrow ? narrow->result(0) : out(0);
  void* Y = P(y);
  float* mean = n.numResults() > 1 ? static_cast<float*>(P(out(1))) : nullptr;
  float* inv = n.numResults() > 2 ? static_cast<float*>(P(out(2))) : nullptr;
  const DT t = dt(x), yT = dt(y), pt = dt(in(1));
  const float eps = n.getFloat("epsilon", 1e-5f);
  const bool rms = n.op() == "RmsNorm";  // ampc.RmsNorm (fuse-rms-norm): no mean
  add([=](cudaStream_t st) { return layerNorm(X, S, B, Y, t, yT, pt, rows, D, eps, rms, mean, inv, st); });
}

void Program::Lowering::onnxBatchNormalization() {
  BatchNormArgs a = bnArgs(in(0), in(1));
  for (size_t i = 2; i < 5; ++i)
    if (dt(in(i)) != a.pT) fail("scale, bias, mean and var must share a type");
  if (a.t != DT::f32 && a.t != DT::f16 && a.t != DT::bf16) fail("X must be f32, f16 or bf16");
  // cuda::BatchNormalization: + input 5 (a residual), then a Relu, on the way out.
  a.relu = n.getInt("relu", 0) != 0;
  a.residual = has(5) ? P(in(5)) : nullptr;
  if (a.residual && dt(in(5)) != a.t) fail("the residual's type differs from X's");
  a.nhwc = p.nhwc_.count(in(0)) != 0;
  const Scratch ws = scratch(batchNormScratchBytes(a.C, a.nhwc));
  const void *X = P(in(0)), *S = P(in(1)), *B = P(in(2)), *M = P(in(3)), *V = P(in(4));
  void* Y = P(out(0));
  void* rm = n.numResults() > 1 ? P(out(1)) : nullptr;
  void* rv = n.numResults() > 2 ? P(out(2)) : nullptr;
  add([=](cudaStream_t st) { return batchNorm(X, S, B, M, V, Y, rm, rv, ws.f(), a, st); });
}

void Program::Lowering::onnxSoftmaxCrossEntropyLoss() {
  const bool target = n.domain() == kCudaDomain;  // cuda::SoftmaxCrossEntropyLoss: result 1 is the row statistics
  if (!target && n.numResults() > 1 && dt(out(1)) != dt(in(0))) fail("the log-probabilities' type differs from the scores'");
  const Value* x = readThrough(in(0));  // a Cast to f32 in front is read through
  LossArgs a = lossArgs(x, in(1));
  a.outT = dt(out(0));
  a.pitch = pitchOf(x);
  // The rows' max and sum, kept for the gradient (passes/keep_loss_stats.cpp).
  if (target) {
    if (a.inner != 1 || out(1)->type() != TensorType{DType::f32, {a.outer, 2}}) fail("the row statistics must be f32 [rows, 2] of 2-d scores");
    a.rowStats = static_cast<float*>(P(out(1)));
  }
  const Scratch ws = scratch(sizeof(float) * (2 * a.outer * a.inner + 2));
  const void *X = P(x), *L = P(in(1)), *W = has(2) ? P(in(2)) : nullptr;
  void* loss = P(out(0));
  void* logp = !target && n.numResults() > 1 ? P(out(1)) : nullptr;
  add([=](cudaStream_t st) { return softmaxCrossEntropy(X, L, W, loss, logp, ws.f(), a, st); });
}

void Program::Lowering::onnxDropout() {
  const float ratio = static_cast<float>(constScalar(1, 0.5));
  const bool training = has(2) && constScalar(2, 0) != 0;
  if (training && (ratio < 0.0f || ratio >= 1.0f)) fail("ratio must be in [0, 1)");
  bool* mask = n.numResults() > 1 ? static_cast<bool*>(P(out(1))) : nullptr;
  // cuda::Dropout: result 0 is input 3 (an f32 residual) + widen(y).
  const bool sum = has(3);
  const bool off = !training || !p.opts_.dropout || ratio == 0.0f;
  if (off && !sum) {
    copyValue(in(0), out(0));
    if (mask) {
      const int64_t cnt = out(1)->type().numel();
      add([mask, cnt](cudaStream_t st) { return fill(mask, DT::boolean, cnt, 1, st); });
    }
    return;
  }
  const uint64_t seed = cpu::randomSeed(n, p.opts_.seed);
  const uint32_t key = cpu::dropoutNodeKey(n);
  const void* X = P(in(0));
  void* Y = sum ? nullptr : P(out(0));
  if (sum && (dt(in(3)) != DT::f32 || dt(out(0)) != DT::f32)) fail("the residual and the sum must be f32");
  const float* R = sum ? static_cast<const float*>(P(in(3))) : nullptr;
  float* S = sum ? static_cast<float*>(P(out(0))) : nullptr;
  const DT t = dt(in(0));
  const int64_t cnt = in(0)->type().numel();
  const uint64_t* step = p.step_;
  const float r = off ? 0.0f : ratio;  // off: every element kept, at scale 1
  add([=](cudaStream_t st) { return dropout(X, t, Y, mask, R, S, cnt, r, seed, step, key, st); });
}

void Program::Lowering::onnxRandom() {
  const std::string& op = n.op();
  const RandomMode mode = op == "RandomUniformLike" ? RandomMode::Uniform : op == "RandomNormalLike" ? RandomMode::Normal : RandomMode::Bernoulli;
  const float a = mode == RandomMode::Uniform ? n.getFloat("low", 0.0f) : n.getFloat("mean", 0.0f);
  const float b = mode == RandomMode::Uniform ? n.getFloat("high", 1.0f) : n.getFloat("scale", 1.0f);
  const uint64_t seed = cpu::randomSeed(n, p.opts_.seed);
  const uint32_t key = cpu::dropoutNodeKey(n);
  const void* Pr = P(in(0));
  const DT pt = dt(in(0)), t = dt(out(0));
  void* Y = P(out(0));
  const int64_t cnt = out(0)->type().numel();
  const uint64_t* step = p.step_;
  add([=](cudaStream_t st) { return randomFill(mode, Pr, pt, Y, t, cnt, a, b, seed, step, key, st); });
}

// Shape: static, the dims are known now.
void Program::Lowering::onnxShape() {
  int64_t b = 0, e = 0;
  shapeRangeOf(n, in(0)->type().rank(), b, e);
  std::vector<int64_t> dims(shape(in(0)).begin() + b, shape(in(0)).begin() + e);
  const Tensor t = Tensor::fromInts(out(0)->type().dtype, out(0)->type().shape, dims);
  check(cudaMemcpy(P(out(0)), t.data.data(), t.data.size(), cudaMemcpyHostToDevice), "Shape");
}

void Program::Lowering::onnxConstantOfShape() {
  const Tensor v = constantOfShapeValue(n);
  void* Y = P(out(0));
  const DT t = dt(out(0));
  const int64_t cnt = out(0)->type().numel();
  const double x = v.getDouble(0);
  add([=](cudaStream_t st) { return fill(Y, t, cnt, x, st); });
}

// A generated kernel (compiler/codegen/nvptx.h): operands, then results.
void Program::Lowering::ampcFused() {
  const std::string ptx = n.getString("ptx", ""), entry = n.getString("entry", "");
  if (ptx.empty() || entry.empty()) fail("the fused group has no kernel (a plan written by an ampc without LLVM is expanded at load)");
  cudaLibrary_t lib = nullptr;
  if (auto it = p.fusedLibraries_.find(ptx); it != p.fusedLibraries_.end()) {
    lib = static_cast<cudaLibrary_t>(it->second);
  } else {
    check(cudaLibraryLoadData(&lib, ptx.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0), "loading the generated kernel");
    p.keep_.push_back(std::shared_ptr<void>(lib, [](void* l) { cudaLibraryUnload(static_cast<cudaLibrary_t>(l)); }));
    p.fusedLibraries_.emplace(ptx, lib);
  }
  std::vector<void*> ptrs;
  for (size_t i = 0; i < n.numInputs(); ++i) ptrs.push_back(const_cast<void*>(P(in(i))));
  for (size_t r = 0; r < n.numResults(); ++r) ptrs.push_back(P(out(r)));
  const int64_t count = out(0)->type().numel();
  // The vector entry where every operand of the results' shape, and every result, is aligned to
  // its vector (the addresses are fixed at load).
  const int64_t V = n.getInt("vector", 1);
  bool vec = V > 1 && count % V == 0 && !n.getString("vector_entry", "").empty();
  for (size_t i = 0; i < n.numInputs() + n.numResults() && vec; ++i) {
    const Value* v = i < n.numInputs() ? in(i) : out(i - n.numInputs());
    if (v->type().numel() == count)
      vec = reinterpret_cast<uintptr_t>(ptrs[i]) % static_cast<uintptr_t>(V * static_cast<int64_t>(dtypeSize(v->type().dtype))) == 0;
  }
  cudaKernel_t kernel = nullptr;
  const std::string name = vec ? n.getString("vector_entry", "") : entry;
  check(cudaLibraryGetKernel(&kernel, lib, name.c_str()), "finding the generated kernel");
  const int64_t chunks = vec ? count / V : count;
  const int grid = static_cast<int>(std::min<int64_t>((chunks + 255) / 256, 132 * 16));
  add([=](cudaStream_t st) {
    std::vector<void*> vals = ptrs;
    std::vector<void*> args;
    for (void*& v : vals) args.push_back(&v);
    return count == 0 ? cudaSuccess : cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(256), args.data(), 0, st);
  });
}

void Program::Lowering::ampcGelu() {
  const std::string& op = n.op();
  const std::string approx = n.getString("approximate", "none");
  if (approx != "none" && approx != "tanh") fail("unknown approximate '" + approx + "'");
  const bool t = approx == "tanh";
  if (op == "Gelu") return elementwise(t ? Ew::GeluTanh : Ew::Gelu, {in(0)});
  return elementwise(t ? Ew::GeluTanhGrad : Ew::GeluGrad, {in(0), in(1)});
}

void Program::Lowering::ampcScatterAddFlat() {
  const int64_t outN = out(0)->type().numel(), cnt = in(0)->type().numel();
  if (dt(in(1)) != DT::i64) fail("indices must be i64");
  const Node* mp = in(1)->producer();
  if (p.nhwc_.count(out(0)) && mp && isOnnx(*mp, "MaxPool") && mp->numResults() > 1 && mp->result(1) == in(1) && dt(in(0)) == dt(out(0))) {
    // A channels-last max pool's gradient: gathered per input element (no f32 buffer, no atomics).
    const PoolArgs a = poolArgs(*mp, mp->inputs()[0]);
    const void* dY = P(in(0));
    const int64_t* I = static_cast<const int64_t*>(P(in(1)));
    void* dX = P(out(0));
    add([=](cudaStream_t st) { return maxPoolGradChannelsLast(dY, I, dX, a, st); });
    return;
  }
  const size_t accBytes = alignUp(sizeof(float) * outN), ob = orderBytes(cnt, outN);
  const Scratch acc = scratch(accBytes + ob);
  const void* dY = P(in(0));
  const int64_t* I = static_cast<const int64_t*>(P(in(1)));
  void* dX = P(out(0));
  const DT t = dt(in(0));
  add([=](cudaStream_t st) { return scatterAddFlat(dY, t, I, cnt, acc.f(), dX, outN, ob ? acc.at(accBytes) : nullptr, st); });
}

// AllReduce(x1..xn) {reduction: mean} (passes/data_parallel.h), as the CPU kernel computes it: the
// operands widened into one f32 buffer, summed across the group by one NCCL all-reduce (so the loss,
// the gradients and any overflow they carry travel together), divided by the group's size and
// rounded once into the results. Without a group (a group of one) the operands are copied through.
void Program::Lowering::ampcAllReduce() {
  if (n.getString("reduction", "mean") != "mean") fail("only reduction 'mean' is supported");
  if (n.numInputs() != n.numResults()) fail("wants one result per operand");
  auto flat = [&](Ew op, const Value* from, const Value* to) {
    EwArgs a;
    a.op = op;
    a.rank = 1;
    a.n = a.shape[0] = from->type().numel();
    a.in[0] = P(from);
    a.inType[0] = dt(from);
    a.access[0] = Access::Same;
    a.out = to ? P(to) : nullptr;
    a.outType = to ? dt(to) : DT::f32;
    return a;
  };
  NcclGroup* group = p.opts_.collective;
  if (!group) {
    for (size_t i = 0; i < n.numInputs(); ++i) {
      if (in(i)->type().numel() == 0 || P(in(i)) == P(out(i))) continue;
      const EwArgs a = flat(Ew::Copy, in(i), out(i));
      add([=](cudaStream_t st) { return cuda::elementwise(a, st); });
    }
    return;
  }
  std::vector<size_t> at;
  size_t total = 0;
  for (size_t i = 0; i < n.numInputs(); ++i) {
    if (!isFloat(in(i)->type().dtype) || in(i)->type().dtype != out(i)->type().dtype) fail("operand " + std::to_string(i) + " must be a float tensor of its result's type");
    at.push_back(total);
    total += static_cast<size_t>(in(i)->type().numel());
  }
  // On a stream of its own (overlapping the nodes after it until the first reader of an average,
  // where the main stream waits: joinComm), with a buffer of its own; in order on the main stream
  // under --check-plan and --explain-overflow, whose per-node checks would race with it.
  const bool overlap = !p.opts_.checkPlan && !p.opts_.watchFinite;
  float* packed = overlap ? static_cast<float*>(p.allocPersistent(sizeof(float) * std::max<size_t>(total, 1))) : nullptr;
  const Scratch buf = scratch(overlap ? 0 : sizeof(float) * total);
  float* size = static_cast<float*>(p.allocPersistent(sizeof(float)));
  const float world = static_cast<float>(group->world());
  check(cudaMemcpy(size, &world, sizeof world, cudaMemcpyHostToDevice), "AllReduce group size");
  std::vector<EwArgs> packs, unpacks;
  std::vector<size_t> offsets;
  for (size_t i = 0; i < n.numInputs(); ++i) {
    if (in(i)->type().numel() == 0) continue;
    packs.push_back(flat(Ew::Copy, in(i), nullptr));
    EwArgs a = flat(Ew::Div, in(i), out(i));
    a.nin = 2;
    a.inType[0] = DT::f32;
    a.in[1] = size;
    a.inType[1] = DT::f32;
    a.access[1] = Access::Scalar;
    unpacks.push_back(a);
    offsets.push_back(at[i]);
  }
  cudaEvent_t ready = nullptr, done = nullptr;
  if (overlap) {
    if (!p.comm_) check(cudaStreamCreateWithFlags(&p.comm_, cudaStreamNonBlocking), "the data-parallel stream");
    for (cudaEvent_t* e : {&ready, &done}) {
      check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "the data-parallel stream's events");
      p.commEvents_.push_back(*e);
    }
    p.pendingJoins_.push_back(done);
  }
  cudaStream_t comm = p.comm_;
  add([=](cudaStream_t st) {
    cudaError_t e = cudaSuccess;
    cudaStream_t work = st;
    if (overlap) {
      if ((e = cudaEventRecord(ready, st)) != cudaSuccess || (e = cudaStreamWaitEvent(comm, ready, 0)) != cudaSuccess) return e;
      work = comm;
    }
    float* base = overlap ? packed : buf.f();
    for (size_t k = 0; k < packs.size(); ++k) {
      EwArgs a = packs[k];
      a.out = base + offsets[k];
      if ((e = cuda::elementwise(a, work)) != cudaSuccess) return e;
    }
    group->allReduceSum(base, total, work);
    for (size_t k = 0; k < unpacks.size(); ++k) {
      EwArgs a = unpacks[k];
      a.in[0] = base + offsets[k];
      if ((e = cuda::elementwise(a, work)) != cudaSuccess) return e;
    }
    return overlap ? cudaEventRecord(done, comm) : cudaGetLastError();
  });
}

// Tile: the output read as [reps_0, x_0, reps_1, x_1, ...] (the same bytes), a strided copy whose
// reps dims read x again (source stride 0).
void Program::Lowering::onnxTile() {
  const auto &xs = shape(in(0)), &os = shape(out(0));
  if (p.nhwc_.count(in(0)) || p.nhwc_.count(out(0))) fail("a channels-last operand is not supported");
  if (xs == os) return copyValue(in(0), out(0));
  if (2 * xs.size() > static_cast<size_t>(kMaxRank)) fail("rank above " + std::to_string(kMaxRank / 2));
  const auto reps = constInts(1);
  const auto src = stridesOf(xs), dst = stridesOf(os);
  CopyArgs a;
  a.rank = static_cast<int>(2 * xs.size());
  a.n = out(0)->type().numel();
  for (size_t d = 0; d < xs.size(); ++d) {
    a.shape[2 * d] = reps[d];
    a.dstStride[2 * d] = xs[d] * dst[d];
    a.srcStride[2 * d] = 0;
    a.shape[2 * d + 1] = xs[d];
    a.dstStride[2 * d + 1] = dst[d];
    a.srcStride[2 * d + 1] = src[d];
  }
  return strided(in(0), out(0), a);
}

// ArgMax: TopK's kernel with k = 1 (the first of equal maxima, NaN above every number, as the CPU
// kernel picks), its value written to scratch.
void Program::Lowering::onnxArgMax() {
  if (n.getInt("select_last_index", 0) != 0) fail("select_last_index = 1 is not supported on CUDA");
  const auto& xs = shape(in(0));
  int64_t outer, dim, inner;
  split(xs, normalizeAxis(n.getInt("axis", 0), static_cast<int64_t>(xs.size())), outer, dim, inner);
  const DT t = dt(in(0));
  const Scratch vals = scratch(static_cast<size_t>(dtSize(t) * std::max<int64_t>(outer * inner, 1)));
  const void* x = P(in(0));
  auto* idx = static_cast<int64_t*>(P(out(0)));
  add([=](cudaStream_t st) { return topK(x, t, vals.at(0), idx, outer, dim, inner, 1, true, st); });
}

void Program::Lowering::onnxTopK() {
  const auto& xs = shape(in(0));
  int64_t outer, dim, inner;
  split(xs, normalizeAxis(n.getInt("axis", -1), static_cast<int64_t>(xs.size())), outer, dim, inner);
  const int64_t k = constInts(1).at(0);
  const DT t = dt(in(0));
  const void* x = P(in(0));
  void* v = P(out(0));
  auto* idx = static_cast<int64_t*>(P(out(1)));
  const bool largest = n.getInt("largest", 1) != 0;
  add([=](cudaStream_t st) { return topK(x, t, v, idx, outer, dim, inner, k, largest, st); });
}

void Program::Lowering::onnxDet() {
  const int64_t n = shape(in(0)).back(), batches = out(0)->type().numel();
  const Scratch w = scratch(detWorkBytes(batches, n));
  const void* x = P(in(0));
  void* y = P(out(0));
  const DT t = dt(in(0));
  add([=](cudaStream_t st) { return det(x, t, y, batches, n, static_cast<double*>(w.at(0)), st); });
}

void Program::Lowering::ampcDetGrad() {
  const int64_t n = shape(in(1)).back(), batches = in(0)->type().numel();
  const Scratch w = scratch(detWorkBytes(batches, n));
  const void *dy = P(in(0)), *x = P(in(1));
  void* dx = P(out(0));
  const DT dyT = dt(in(0)), t = dt(in(1));
  if (dt(out(0)) != t) fail("dX must have X's type");
  add([=](cudaStream_t st) { return detGrad(dy, dyT, x, t, dx, batches, n, static_cast<double*>(w.at(0)), st); });
}

// GridSample and its gradient (2-d; the shape rule refuses other ranks and bicubic): the node's
// geometry from X [N, C, H, W] and grid [N, Ho, Wo, 2].
static GridArgs gridArgs(const Node& n, const Value* x, const Value* grid) {
  GridArgs a;
  const auto &xs = x->type().shape, &gs = grid->type().shape;
  a.N = xs[0], a.C = xs[1], a.H = xs[2], a.W = xs[3], a.Ho = gs[1], a.Wo = gs[2];
  a.align = n.getInt("align_corners", 0) != 0;
  a.nearest = n.getString("mode", "bilinear") == "nearest";
  const std::string pad = n.getString("padding_mode", "zeros");
  a.pad = pad == "border" ? 1 : pad == "reflection" ? 2 : 0;
  return a;
}

void Program::Lowering::onnxGridSample() {
  const GridArgs a = gridArgs(n, in(0), in(1));
  const void *x = P(in(0)), *g = P(in(1));
  void* y = P(out(0));
  const DT t = dt(in(0)), gt = dt(in(1));
  add([=](cudaStream_t st) { return gridSample(x, t, g, gt, y, a, st); });
}

// dX is summed in f32 (in place when it is f32) with atomics, or under --deterministic in sample
// order through the ordered scatter (OrderBuffers).
void Program::Lowering::ampcGridSampleGrad() {
  const GridArgs a = gridArgs(n, in(1), in(2));
  const int64_t xN = out(0)->type().numel();
  const DT t = dt(in(0)), gt = dt(in(2));
  if (dt(in(1)) != t) fail("dY and X must have one type");
  const bool direct = t == DT::f32;
  const size_t accBytes = direct ? 0 : alignUp(sizeof(float) * static_cast<size_t>(std::max<int64_t>(xN, 1)));
  const size_t ob = orderBytes(a.N * a.Ho * a.Wo * 4, a.N * a.H * a.W);
  const Scratch acc = scratch(accBytes + ob);
  const void *dY = P(in(0)), *x = P(in(1)), *g = P(in(2));
  void *dX = P(out(0)), *dG = P(out(1));
  add([=](cudaStream_t st) {
    float* sum = direct ? static_cast<float*>(dX) : acc.f();
    return gridSampleGrad(dY, t, x, g, gt, sum, dX, dG, a, ob ? acc.at(accBytes) : nullptr, st);
  });
}

void Program::Lowering::ampcGatherGrad() {
  const auto xs = n.getInts("shape");
  int64_t outer, dim, inner;
  split(xs, normalizeAxis(n.getInt("axis", 0), static_cast<int64_t>(xs.size())), outer, dim, inner);
  const int64_t cnt = in(1)->type().numel();
  const DT t = dt(in(0)), it = dt(in(1));
  // An f32 result is summed in place; another type in an f32 scratch, then narrowed.
  const bool direct = t == DT::f32;
  const size_t accBytes = direct ? 0 : alignUp(sizeof(float) * out(0)->type().numel()), ob = orderBytes(cnt, dim);
  const Scratch acc = scratch(accBytes + ob);
  const void *dY = P(in(0)), *I = P(in(1));
  const void* base = has(2) ? P(in(2)) : nullptr;  // the sum's start (passes/accumulate_gather_grads.cpp)
  const DT bt = has(2) ? dt(in(2)) : DT::f32;
  void* dX = P(out(0));
  add([=](cudaStream_t st) {
    float* sum = direct ? static_cast<float*>(dX) : acc.f();
    return gatherGrad(dY, t, I, it, base, bt, sum, direct ? nullptr : dX, outer, dim, cnt, inner, ob ? acc.at(accBytes) : nullptr, st);
  });
}

void Program::Lowering::ampcGatherElementsGrad() {
  const IndexGeom g = indexGeom(n, n.getInts("shape"));
  const int64_t outN = out(0)->type().numel();
  const size_t accBytes = alignUp(sizeof(float) * std::max<int64_t>(outN, 1)), ob = orderBytes(g.n, outN);
  const Scratch acc = scratch(accBytes + ob);
  const void *dY = P(in(0)), *I = P(in(1));
  void* dX = P(out(0));
  const DT t = dt(in(0)), it = dt(in(1));
  add([=](cudaStream_t st) { return indexGatherGrad(dY, t, I, it, acc.f(), dX, outN, g, ob ? acc.at(accBytes) : nullptr, st); });
}

void Program::Lowering::ampcSliceGrad() {
  const auto xs = n.getInts("shape");
  auto ints = [&](size_t i) { return has(i) ? constInts(i) : std::vector<int64_t>{}; };
  const SliceSpec s = sliceSpecOf(xs, ints(1), ints(2), ints(3), ints(4));
  zero(out(0));
  const auto st = stridesOf(xs), ds = stridesOf(s.out);
  CopyArgs a;
  a.rank = static_cast<int>(xs.size());
  a.n = in(0)->type().numel();
  for (size_t d = 0; d < xs.size(); ++d) {
    a.shape[d] = s.out[d];
    a.dstStride[d] = st[d] * s.step[d];
    a.dstOffset += s.start[d] * st[d];
    a.srcStride[d] = ds[d];
  }
  return strided(in(0), out(0), a);  // a slice's elements are distinct: a copy, not a sum
}

void Program::Lowering::ampcPadGrad() {
  const auto xs = n.getInts("shape");
  const int64_t r = static_cast<int64_t>(xs.size());
  const std::vector<int64_t> begin = padBegin(r, 1, 2);
  if (n.getString("mode", "constant") != "constant") {  // each dY element added to the input element it read
    const PadMap m = padMap(xs, shape(in(0)), begin);
    const int64_t xN = out(0)->type().numel();
    const size_t idxBytes = alignUp(sizeof(int64_t) * static_cast<size_t>(std::max<int64_t>(m.n, 1)));
    const size_t accBytes = alignUp(sizeof(float) * static_cast<size_t>(std::max<int64_t>(xN, 1))), ob = orderBytes(m.n, xN);
    const Scratch s = scratch(idxBytes + accBytes + ob);
    const void* dY = P(in(0));
    void* dX = P(out(0));
    const DT t = dt(in(0));
    add([=](cudaStream_t st) {
      auto* I = static_cast<int64_t*>(s.at(0));
      if (cudaError_t e = padSourceIndex(I, m, st); e != cudaSuccess) return e;
      return scatterAddFlat(dY, t, I, m.n, static_cast<float*>(s.at(idxBytes)), dX, xN, ob ? s.at(idxBytes + accBytes) : nullptr, st);
    });
    return;
  }
  const auto xst = stridesOf(xs), ost = stridesOf(shape(in(0)));
  CopyArgs a;
  a.rank = static_cast<int>(r);
  a.n = out(0)->type().numel();
  for (int64_t d = 0; d < r; ++d) {
    if (begin[d] < 0) fail("negative pads are not supported on CUDA");
    a.shape[d] = xs[d];
    a.dstStride[d] = xst[d];
    a.srcStride[d] = ost[d];
    a.srcOffset += begin[d] * ost[d];
  }
  return strided(in(0), out(0), a);
}

void Program::Lowering::ampcBatchNormGrad() {
  BatchNormArgs a = bnArgs(in(1), in(2));
  a.nhwc = p.nhwc_.count(in(1)) != 0;
  if (dt(in(0)) != a.t || dt(out(1)) != a.pT || dt(in(3)) != a.pT) fail("mixed operand types");
  const Scratch ws = scratch(batchNormScratchBytes(a.C, a.nhwc));
  // cuda::BatchNormGrad: a Relu's gradient read through, dz (input 0) gated by y (input 5).
  if (has(5) && dt(in(5)) != a.t) fail("y's type differs from X's");
  const void *dY = P(in(0)), *gate = has(5) ? P(in(5)) : nullptr;
  const void *X = P(in(1)), *S = P(in(2)), *M = P(in(3)), *V = P(in(4));
  void *dX = P(out(0)), *dS = P(out(1)), *dB = P(out(2));
  add([=](cudaStream_t st) { return batchNormGrad(dY, gate, X, S, M, V, dX, dS, dB, ws.f(), a, st); });
}

void Program::Lowering::ampcLayerNormGrad() {
  const auto& xs = shape(in(1));
  int64_t rows, D;
  rowsOf(xs, normalizeAxis(n.getInt("axis", -1), static_cast<int64_t>(xs.size())), rows, D);
  if (in(2)->type().numel() != D) fail("scale must cover the normalised dims");
  const Scratch ws = scratch(layerNormGradScratch(rows, D));
  // A Cast to f32 in front of dY or X is read through.
  const Value *dy = readThrough(in(0)), *x = readThrough(in(1));
  // cuda::LayerNormGrad: result 0 is dX + input 3 (the residual stream's gradient).
  const Value* r = has(3) ? in(3) : nullptr;
  const void *dY = P(dy), *X = P(x), *S = P(in(2)), *R = r ? P(r) : nullptr;
  void *dX = P(out(0)), *dS = P(out(1)), *dB = P(out(2));
  const DT dyT = dt(dy), t = dt(x), dxT = dt(out(0)), st_ = dt(in(2)), pt = dt(out(1));
  if (r && dt(r) != dxT) fail("the residual's type differs from dX's");
  const float eps = n.getFloat("epsilon", 1e-5f);
  const bool rms = n.getInt("rms", 0) != 0;  // ampc.RmsNorm's gradient
  add([=](cudaStream_t st) { return layerNormGrad(dY, dyT, X, S, t, st_, dX, dxT, R, dS, dB, pt, rows, D, eps, rms, ws.f(), st); });
}

void Program::Lowering::ampcSoftmaxCrossEntropyLossGrad() {
  if (dt(out(0)) != dt(in(1))) fail("the gradient's type differs from the scores'");
  const Value* x = readThrough(in(1));  // a Cast to f32 in front is read through
  const Node* narrow = narrowedResult(n);  // a Cast after it is written through
  const Value* g = narrow ? narrow->result(0) : out(0);
  LossArgs a = lossArgs(x, in(2));
  a.gT = dt(g);
  a.pitch = pitchOf(x);
  a.gPitch = pitchOf(g);
  const bool target = n.domain() == kCudaDomain;  // input 3: the loss's row statistics (passes/keep_loss_stats.cpp)
  if (target) {
    if (a.inner != 1 || dt(in(3)) != DT::f32) fail("the row statistics must be f32 [rows, 2] of 2-d scores");
    a.rowStats = static_cast<float*>(P(in(3)));
  }
  const size_t w = target ? 4 : 3;
  const Scratch ws = scratch(sizeof(float) * (2 * a.outer * a.inner + 2));
  const void *dL = P(in(0)), *X = P(x), *L = P(in(2)), *W = has(w) ? P(in(w)) : nullptr;
  const DT dlT = dt(in(0));
  void* dX = P(g);
  add([=](cudaStream_t st) { return softmaxCrossEntropyGrad(dL, dlT, X, L, W, dX, ws.f(), a, st); });
}

void Program::Lowering::ampcAttention() {
  const std::string& op = n.op();
  const bool grad = op == "AttentionGrad", target = n.domain() == kCudaDomain;
  const size_t q = grad ? 1 : 0, maskAt = grad ? 6 : 3;
  // The logical dims: the target node's attribute, or ampc's operands [.., Tq, D], [.., D, Tk], [.., Tk, Dv].
  AttentionDims d;
  std::vector<int64_t> lead;
  if (target) {
    try {
      d = attentionDims(n);
    } catch (const Error& e) {
      fail(e.what());
    }
    lead = {d.B, d.H};
  } else {
    const auto &qs = shape(in(q)), &ks = shape(in(q + 1)), &vs = shape(in(q + 2));
    const size_t r = qs.size();
    lead.assign(qs.begin(), qs.end() - 2);
    d.Tq = qs[r - 2], d.D = qs[r - 1], d.Tk = ks[r - 1], d.Dv = vs[r - 1];
  }
  // Head dims past the kernels' (kernels/cuda/limits.h): cuDNN's fused SDPA only (the target fused
  // such a node only without dropout and with a mask computed from no parameter, if any).
  bool kernels = true;
  AttentionArgs a = attentionArgs(lead, d.Tq, d.Tk, d.D, d.Dv, in(q), has(maskAt) ? in(maskAt) : nullptr, target ? &kernels : nullptr);
  const bool packed = n.getInt("packed_grads", 0) != 0;
  const size_t maskGradAt = packed ? 1 : 3;
  if (grad && n.numResults() > maskGradAt) {  // a trained mask's gradient
    if (!has(6) || dt(out(maskGradAt)) != DT::f32) fail("the mask's gradient needs an f32 mask");
    a.dMask = static_cast<float*>(P(out(maskGradAt)));
  }
  // Operands in place (cuda::Attention, passes/attention_in_place.cpp): each slot's layout, or the
  // value itself as [N, rows, cols].
  bool inPlace = false;
  auto at = [&](const Value* v, const std::string& slot, AttnLayout& l, bool* keyRows = nullptr) {
    AttentionLayout o;
    if (target) {
      try {
        o = attentionLayout(n, d, slot);
      } catch (const Error& e) {
        fail(e.what());
      }
    } else {
      o.sRow = shape(v).back();
      o.sB = shape(v)[shape(v).size() - 2] * o.sRow;
    }
    l = {o.heads, o.sB, o.sH, o.sRow, o.group};
    if (keyRows) *keyRows = o.keyRows;
    inPlace |= o.offset != 0 || o.heads != 1;
    return static_cast<char*>(P(v)) + o.offset * dtSize(a.t);
  };
  auto checkInPlace = [&] {  // only the mma.sync kernels take strided operands (and cuDNN)
    if (kernels && inPlace && !attentionTensorCores(a)) fail("internal: strided attention operands off the mma.sync path");
  };
  // cuDNN for the node: where it is the only implementation, it must take it. copyK / copyDK: K and
  // dK pass through scratch as rows (transposed from and to KT; scratchK bytes after cuDNN's)
  CudnnStaging staging;
  const bool &copyK = staging.copyK, &copyDK = staging.copyDK;
  const int64_t N = d.B * d.H, eb = dtSize(a.t);
  const size_t kBytes = alignUp(static_cast<size_t>(N * d.Tk * d.D * eb));
  auto cudnnFor = [&](std::string& key) {
    auto c = target ? cudnnAttention(a, d, grad, has(maskAt) ? in(maskAt) : nullptr, key, !kernels, staging) : nullptr;
    if (!c && !kernels)
      fail("head dims D " + std::to_string(a.D) + ", Dv " + std::to_string(a.Dv) + " run only through cuDNN's fused SDPA (the kernels take up to " +
           std::to_string(kAttentionMaxHeadDimMma) + "), and it does not take this node" + (key.empty() ? "" : ": " + key));
    // Where cuDNN is chosen before the first run (stored in the plan, or cuDNN only), the kernels
    // never run this node: no tile flags or scratch for them.
    if (c && !attentionPick(c, key, kernels).kernelsMayRun) kernels = false;
    return c;
  };
  // The kernels' mask tile flags (computed where the step first reads this mask with the kernels,
  // then shared) and their scratch.
  auto kernelsScratch = [&] {
    if (a.mask && kernels) {
      auto [it, first] = p.maskFlags_.try_emplace(in(maskAt), nullptr);
      if (first) {
        it->second = static_cast<uint8_t*>(p.allocPersistent(attentionFlagBytes(a)));
        uint8_t* f = it->second;
        add([a, f](cudaStream_t st) { return attentionMaskTiles(a, f, st); });
      }
      a.flags = it->second;
    }
    return scratch(kernels ? attentionScratch(a, grad) : 0);
  };
  const void *Q = at(in(q), "q", a.q), *KT = at(in(q + 1), "k", a.k, &a.kRows), *V = at(in(q + 2), "v", a.v);
  const void* M = a.mask;  // cuDNN's bias, where it reads the mask
  if (!grad) {
    if (dt(out(1)) != DT::f32) fail("LSE must be f32");
    void* O = at(out(0), "o", a.o);
    float* lse = static_cast<float*>(P(out(1)));
    checkInPlace();
    // With dropout on the tensor-core kernels: the keep bits, drawn ahead of the forward by a kernel
    // of their own and read by it and by the backward of the same step.
    if (const size_t kb = attentionKeepBytes(a); kb && kernels) {
      a.keep = static_cast<uint32_t*>(p.allocPersistent(kb));
      p.keepBits_[out(1)] = a;
    }
    std::string key;
    auto dnn = cudnnFor(key);
    kernelsScratch();
    Launch ours;
    if (kernels) ours = [=](cudaStream_t st) { return attentionForward(Q, KT, V, O, lse, a, st); };
    if (!dnn) {
      add(ours);
    } else {
      const size_t wsB = alignUp(dnn->workspaceBytes());
      const Scratch dws = scratch(wsB + (copyK ? kBytes : 0));
      CudnnSdpa* c = dnn.get();
      const CudnnStaging x = staging;
      attentionLaunch(ours, dnn, key, [=](size_t plan, cudaStream_t st) {
        void* kr = copyK ? dws.at(wsB) : nullptr;
        if (copyK && transpose2d(KT, kr, N, d.D, d.Tk, static_cast<int>(eb), st) != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED;
        const cudnnStatus_t s = c->forward(Q, copyK ? kr : KT, V, M, O, lse, dws.at(0), plan, st);
        if (s != CUDNN_STATUS_SUCCESS || !x.zeroEmpty) return s;
        return attentionZeroEmptyRows(O, a.t, lse, d.B, d.H, d.Tq, d.Dv, x.o.sB, x.o.sH, x.o.sRow, st) == cudaSuccess ? s
                                                                                                       : CUDNN_STATUS_EXECUTION_FAILED;
      });
    }
    // Rows masked everywhere by a finite fill: recomputed after whichever implementation ran
    if (fillRows(a, has(maskAt) ? in(maskAt) : nullptr, d)) {
      const Scratch fs = scratch(attentionFillRowsScratch(a, false));  // (after the implementation's launch: its scratch is free)
      add([=](cudaStream_t st) { return attentionFillRowsForward(Q, KT, V, O, lse, fs.at(0), a, st); });
    }
    return;
  }
  if (dt(in(0)) != a.t || dt(in(4)) != a.t || dt(in(5)) != DT::f32) fail("dO and O must have Q's type, LSE f32");
  const void *dO = at(in(0), "do", a.dO), *O = at(in(4), "o", a.o);
  const float* lse = static_cast<const float*>(P(in(5)));
  void *dQ = at(out(0), "dq", a.dq), *dKT = at(out(packed ? 0 : 1), "dk", a.dk, &a.dkRows), *dV = at(out(packed ? 0 : 2), "dv", a.dv);
  checkInPlace();
  // The forward's keep bits, where it drew them with this node's shapes, mask and stream.
  if (auto it = p.keepBits_.find(in(5)); it != p.keepBits_.end() && a.ratio > 0.0f) {
    const AttentionArgs& f = it->second;
    if (f.N == a.N && f.Tq == a.Tq && f.Tk == a.Tk && f.D == a.D && f.Dv == a.Dv && f.t == a.t && f.mask == a.mask &&
        f.maskDiv == a.maskDiv && f.maskMod == a.maskMod && f.maskRows == a.maskRows && f.ratio == a.ratio && f.seed == a.seed && f.key == a.key && f.step == a.step)
      a.keep = f.keep;
  }
  std::string key;
  auto dnn = cudnnFor(key);
  const Scratch ws = kernelsScratch();
  // Rows masked everywhere by a finite fill: the implementation reads an LSE of +inf there (scratch
  // after both implementations' own), and a fix-up adds their gradients after it.
  const bool fill = fillRows(a, has(maskAt) ? in(maskAt) : nullptr, d);
  const size_t wsB = dnn ? alignUp(dnn->workspaceBytes()) : 0;
  const size_t dnnBytes = dnn ? wsB + (copyK ? kBytes : 0) + (copyDK ? kBytes : 0) : 0;
  const size_t lseAt = alignUp(std::max(kernels ? attentionScratch(a, true) : 0, dnnBytes));
  // The backward's fix-up runs after both (and reads the forward's LSE): its scratch from 0.
  const size_t fillBytes = fill ? attentionFillRowsScratch(a, true) : 0;
  const Scratch all = scratch(fill ? std::max(lseAt + sizeof(float) * static_cast<size_t>(N * d.Tq), fillBytes) : dnnBytes);
  auto lseRead = [=] { return fill ? static_cast<const float*>(all.at(lseAt)) : lse; };
  if (fill) add([=](cudaStream_t st) { return attentionFillRowsLse(lse, static_cast<float*>(all.at(lseAt)), a, st); });
  Launch ours;
  if (kernels) ours = [=](cudaStream_t st) { return attentionBackward(dO, Q, KT, V, O, lseRead(), dQ, dKT, dV, ws.f(), a, st); };
  if (!dnn) {
    add(ours);
  } else {
    CudnnSdpa* c = dnn.get();
    attentionLaunch(ours, dnn, key, [=](size_t plan, cudaStream_t st) {
      void *kr = copyK ? all.at(wsB) : nullptr, *dkr = copyDK ? all.at(wsB + (copyK ? kBytes : 0)) : nullptr;
      if (copyK && transpose2d(KT, kr, N, d.D, d.Tk, static_cast<int>(eb), st) != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED;
      const cudnnStatus_t s = c->backward(dO, Q, copyK ? kr : KT, V, O, M, lseRead(), dQ, copyDK ? dkr : dKT, dV, all.at(0), plan, st);
      if (s != CUDNN_STATUS_SUCCESS || !copyDK) return s;
      return transpose2d(dkr, dKT, N, d.Tk, d.D, static_cast<int>(eb), st) == cudaSuccess ? s : CUDNN_STATUS_EXECUTION_FAILED;
    });
  }
  if (fill) add([=](cudaStream_t st) { return attentionFillRowsBackward(dO, Q, KT, V, O, lse, dQ, dKT, dV, all.at(0), a, st); });
}

// Whether a node's mask can leave a row masked everywhere by a finite fill (kAttentionFillLse): any
// mask but the exact causal one (each row keeps its diagonal).
bool Program::Lowering::fillRows(const AttentionArgs& a, const Value* mask, const AttentionDims& d) {
  if (!mask || !attentionNeedsFillRows(a)) return false;
  auto [it, first] = p.causalMask_.try_emplace(mask, CausalMask::none);
  if (first) it->second = classifyCausalMask(mask, d.Tq, d.Tk);
  return it->second != CausalMask::exact;
}

// cuDNN's fused SDPA for a cuda::Attention(Grad) node where ProgramOptions::attention allows it and
// the node is one cuDNN's graphs express: no dropout, no trained mask, f16/bf16 operands with K as
// rows, grouped heads alike for K and V; the causal mask from constants generated by cuDNN, another
// mask read as a bias (per batch, head, both or shared), zero_empty_rows applied after the forward
// (attentionZeroEmptyRows). Null otherwise, the
// reason noted as the shape's implementation (amprun --bench lists them); `key`: the node's
// attention shape (the automatic choice's).
std::shared_ptr<CudnnSdpa> Program::Lowering::cudnnAttention(const AttentionArgs& a, const AttentionDims& d, bool grad, const Value* mask,
                                                             std::string& key, bool only, CudnnStaging& staging) {
  bool &copyK = staging.copyK, &copyDK = staging.copyDK;
  const auto mode = p.opts_.attention;
  if (mode == ProgramOptions::Attention::kernels && !only) return nullptr;
  const int64_t group = a.k.group;
  key = std::to_string(d.B) + "x" + std::to_string(d.H) + "/" + std::to_string(group > 0 ? d.H / group : 0) + "x" + std::to_string(d.Tq) + "x" +
        std::to_string(d.Tk) + " D" + std::to_string(d.D) + "/" + std::to_string(d.Dv) + (mask ? " masked" : "") + (grad ? " backward" : " forward");
  auto no = [&](const std::string& why) -> std::shared_ptr<CudnnSdpa> {
    key += " (not for cuDNN: " + why + ")";
    if (only) return nullptr;  // the caller's error names it
    auto [it, first] = p.attentionPick_.try_emplace(key);
    if (first) it->second.pick = std::make_shared<int>(0), it->second.names = {"kernels"};
    return nullptr;
  };
  // cuDNN's backward sums dQ with atomics, and which implementation runs is timed (a forward only
  // cuDNN runs runs there, on its first plan)
  if (p.opts_.deterministic && (!only || grad)) return no("--deterministic");
  if (a.ratio > 0.0f) return no("dropout");
  if (a.dMask) return no("a trained mask");
  if (a.t != DT::f16 && a.t != DT::bf16) return no("f32 operands");
  // K or dK stored as KT [B H, D, Tk] itself: through scratch as rows where only cuDNN runs the node
  auto contiguousKT = [&](const AttnLayout& l) { return l.heads == 1 && l.group == 1 && l.sRow == d.Tk && l.sB == d.D * d.Tk; };
  copyK = !a.kRows && only && contiguousKT(a.k);
  copyDK = grad && !a.dkRows && only && contiguousKT(a.dk);
  if ((!a.kRows && !copyK) || (grad && !a.dkRows && !copyDK)) return no("K or dK not stored as rows");
  if (group < 1 || d.H % group != 0 || a.v.group != group || a.q.group != 1 || a.o.group != 1) return no("K and V heads grouped unlike");
  // dK and dV per K/V head (the group's sum), or per query head
  const bool fullHead = grad && group > 1 && a.dk.group == 1 && a.dv.group == 1;
  if (grad && (a.dO.group != 1 || a.dq.group != 1 || (!fullHead && (a.dk.group != group || a.dv.group != group))))
    return no("gradients grouped unlike K and V");
  bool causal = false, bias = false;
  SdpaStrides biasAt;
  if (mask) {
    // The causal one, a constant or computed from constants only (evaluated here, once per mask
    // value): cuDNN generates it. Any other: read as an additive bias [B, H, Tq, Tk] with
    // broadcast strides, where its slices map onto batch and heads (attentionMaskMap); where it
    // masks above the diagonal whatever the step's inputs (a causal LM's padding mask), cuDNN
    // generates the causal mask too and skips the tiles above the diagonal.
    auto [it, first] = p.causalMask_.try_emplace(mask, CausalMask::none);
    if (first) it->second = classifyCausalMask(mask, d.Tq, d.Tk);
    causal = it->second != CausalMask::none;
    if (it->second != CausalMask::exact) {
      const int64_t slice = a.maskRows ? d.Tq * d.Tk : d.Tk, B = d.B, H = d.H;
      biasAt.sRow = a.maskRows ? d.Tk : 0;
      if (a.maskMod == 1) biasAt.sB = biasAt.sH = 0;
      else if (a.maskDiv == 1 && a.maskMod == B * H) biasAt.sB = H * slice, biasAt.sH = slice;
      else if (a.maskDiv == 1 && a.maskMod == H) biasAt.sB = 0, biasAt.sH = slice;
      else if (a.maskDiv == H && a.maskMod == B) biasAt.sB = slice, biasAt.sH = 0;
      else return no("a mask whose slices are not per batch, head or both");
      bias = true;
    }
  }
  SdpaDesc s;
  s.t = a.t;
  s.B = d.B, s.H = d.H, s.Hk = d.H / group, s.Tq = d.Tq, s.Tk = d.Tk, s.D = d.D, s.Dv = d.Dv;
  // [b, h] at b sB + h sH: a layout over the heads, or the contiguous slices n = b H + h
  bool laid = true;
  auto st = [&](const AttnLayout& l) {
    if (l.heads == d.H) return SdpaStrides{l.sB, l.sH, l.sRow};
    laid &= l.heads == 1 && l.group == 1;
    return SdpaStrides{l.sB * d.H, l.sB, l.sRow};
  };
  s.q = st(a.q), s.k = st(a.k), s.v = st(a.v), s.o = st(a.o);
  if (grad) s.dO = st(a.dO), s.dq = st(a.dq), s.dk = st(a.dk), s.dv = st(a.dv);
  if (!laid) return no("an operand's layout");
  const SdpaStrides rows{d.H * d.Tk * d.D, d.Tk * d.D, d.D};  // the scratch copies
  if (copyK) s.k = rows;
  if (copyDK) s.dk = rows;
  staging.zeroEmpty = a.zeroEmpty && bias;  // (the causal mask leaves no row empty)
  staging.o = s.o;
  s.causal = causal;
  s.bias = bias;
  s.biasT = a.maskType;
  s.biasAt = biasAt;
  s.scale = a.scale;
  s.backward = grad;
  s.fullHeadGrads = fullHead;
  if (std::string why; !CudnnSdpa::shapeSupported(s, &why)) return no(why);
  if (causal) key.replace(key.find(" masked"), 7, bias ? " causal, masked" : " causal");
  try {
    auto c = std::make_shared<CudnnSdpa>(static_cast<cudnnHandle_t>(p.cudnn_), s);
    p.keep_.push_back(c);
    return c;
  } catch (const Error& e) {
    if (mode == ProgramOptions::Attention::cudnn || only) fail(e.what());
    return no(e.what());  // automatic: cuDNN has no engine for it; ampc's kernels run
  }
}

// The entry of the node's attention shape (made by its first node): the implementation the plan
// stores for the shape where it is offered here (ProgramOptions::attentionChoices), else -1 to be
// measured in the first run, or the only candidate where nothing is timed.
Program::Lowering::ShapePick Program::Lowering::attentionPick(const std::shared_ptr<CudnnSdpa>& dnn, const std::string& key, bool kernels) {
  // (no kernels for the node, or cuDNN asked for: candidate 0 is not run)
  const size_t from = p.opts_.attention == ProgramOptions::Attention::cudnn || !kernels ? 1 : 0;
  auto [it, first] = p.attentionPick_.try_emplace(key);
  AttentionPick& e = it->second;
  if (first) {
    e.names = {"kernels"};
    for (size_t i = 0; i < dnn->plans(); ++i) e.names.push_back("cuDNN " + dnn->engine(i));
    int pick = p.opts_.deterministic ? static_cast<int>(from) : -1;
    if (auto c = p.opts_.attentionChoices.find(key); pick < 0 && c != p.opts_.attentionChoices.end()) {
      const auto n = std::find(e.names.begin(), e.names.end(), c->second);
      if (n != e.names.end() && static_cast<size_t>(n - e.names.begin()) >= from) pick = static_cast<int>(n - e.names.begin()), e.stored = true;
    }
    e.pick = std::make_shared<int>(pick);
  }
  return {e.pick, from, from == 0 && *e.pick <= 0};
}

// A node that ampc's kernels (candidate 0) and cuDNN's plans (1..) can run: the one the plan stores
// for its attention shape, or the fastest as the first run measures it (only cuDNN's with
// ProgramOptions::Attention::cudnn).
void Program::Lowering::attentionLaunch(Launch ours, const std::shared_ptr<CudnnSdpa>& dnn, const std::string& key,
                                        std::function<cudnnStatus_t(size_t, cudaStream_t)> theirs) {
  const ShapePick s = attentionPick(dnn, key, static_cast<bool>(ours));
  if (!ours) ours = [](cudaStream_t) { return cudaErrorNotSupported; };
  std::vector<Launch> candidates{std::move(ours)};
  for (size_t i = 0; i < dnn->plans(); ++i)
    candidates.push_back([theirs, i](cudaStream_t st) { return theirs(i, st) == CUDNN_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown; });
  std::shared_ptr<int> pick = s.pick;
  const size_t from = s.from;
  add([candidates, pick, dnn, from](cudaStream_t st) -> cudaError_t {
    if (*pick < 0)
      if (cudaError_t e = pickFastest(candidates, from, *pick, st); e != cudaSuccess) return e;
    // (a node of the shape whose operands lie otherwise may have been offered fewer plans)
    return candidates[std::min(static_cast<size_t>(*pick), candidates.size() - 1)](st);
  });
}

void Program::Lowering::ampcDropoutGrad() {
  const float ratio = static_cast<float>(constScalar(2, 0.5));
  const bool training = has(3) && constScalar(3, 0) != 0;
  // A narrowing Cast in front is read through: dY's f32 source, rounded here.
  const Node* narrow = narrowedGradInput(n);
  const Value* dy = narrow ? narrow->inputs()[0] : in(0);
  const bool off = !training || !p.opts_.dropout || ratio == 0.0f;
  if (off && !narrow) return copyValue(in(0), out(0));
  const void* dY = P(dy);
  const bool* M = static_cast<const bool*>(P(in(1)));
  void* dX = P(out(0));
  const DT dyT = dt(dy), t = dt(out(0));
  const int64_t cnt = in(0)->type().numel();
  // off: the mask is all true (the Dropout filled it), so dx = round(dy) at scale 1
  const float r = off ? 0.0f : ratio;
  add([=](cudaStream_t st) { return dropoutGrad(dY, dyT, t, M, dX, cnt, r, st); });
}

void Program::Lowering::train() {
  const std::string& op = n.op();
  auto f32 = [&](const Value* v) {
    if (dt(v) != DT::f32) fail("'" + v->name() + "' must be f32");
    return static_cast<float*>(P(v));
  };
  auto flag = [&](const Value* v) {
    if (dt(v) != DT::boolean) fail("'" + v->name() + "' must be bool");
    return static_cast<const bool*>(P(v));
  };
  auto i64 = [&](const Value* v) {
    if (dt(v) != DT::i64) fail("'" + v->name() + "' must be i64");
    return static_cast<int64_t*>(P(v));
  };
  if (op == "UnscaleCheck") {
    // One launch per gradient type: f32, and f16/bf16 gradients whose widening Cast is read through.
    const size_t k = n.inputs().size() - 1;
    std::map<DT, std::vector<size_t>> byType;
    for (size_t i = 0; i < k; ++i) byType[dt(readThrough(in(i + 1)))].push_back(i);
    const float* inv = f32(in(0));
    bool* found = const_cast<bool*>(flag(out(k)));
    bool clear = true;
    const Node* clip = nullptr;
    if (fusedGradChain(n, &clip)) {  // only the check (and the clip's squares): the optimizer unscales
      // The clip's sum of squares: one partial per chunk of every launch, then summed in order.
      std::vector<std::pair<DT, std::shared_ptr<TensorList>>> lists;  // per gradient type
      size_t chunks = 0;
      for (const auto& [t, idx] : byType) {
        if (t != DT::f32 && t != DT::f16 && t != DT::bf16) fail("gradients must be f32, f16 or bf16");
        std::vector<int64_t> sizes;
        std::vector<void*> src;
        for (size_t i : idx) {
          src.push_back(P(readThrough(in(i + 1))));
          sizes.push_back(in(i + 1)->type().numel());
        }
        lists.emplace_back(t, std::make_shared<TensorList>(sizes, std::vector<std::vector<void*>>{src}));
        p.keep_.push_back(lists.back().second);
        chunks += static_cast<size_t>(lists.back().second->chunks());
      }
      double* normSq = clip ? p.chainNorm(&n) : nullptr;
      double* parts = clip ? static_cast<double*>(p.allocPersistent(sizeof(double) * std::max<size_t>(chunks, 1))) : nullptr;
      size_t at = 0;
      for (const auto& entry : lists) {
        const DT gt = entry.first;
        const std::shared_ptr<TensorList> l = entry.second;
        double* part = parts ? parts + at : nullptr;
        add([l, gt, inv, found, clear, part](cudaStream_t st) { return unscaleCheckNorm(*l, gt, inv, found, clear, part, st); });
        at += static_cast<size_t>(l->chunks());
        clear = false;
      }
      if (normSq) {
        const int total = static_cast<int>(chunks);
        add([parts, total, normSq](cudaStream_t st) { return sumInOrder(parts, total, normSq, st); });
      }
      if (byType.empty()) add([found](cudaStream_t st) { return cudaMemsetAsync(found, 0, 1, st); });
      return;
    }
    for (const auto& [t, idx] : byType) {
      if (t != DT::f32 && t != DT::f16 && t != DT::bf16) fail("gradients must be f32, f16 or bf16");
      std::vector<int64_t> sizes;
      std::vector<void*> src, dst;
      for (size_t i : idx) {
        src.push_back(P(readThrough(in(i + 1))));
        dst.push_back(f32(out(i)));
        sizes.push_back(in(i + 1)->type().numel());
      }
      auto l = std::make_shared<TensorList>(sizes, std::vector<std::vector<void*>>{src, dst});
      p.keep_.push_back(l);
      const DT gt = t;
      add([l, gt, inv, found, clear](cudaStream_t st) { return unscaleCheck(*l, gt, inv, found, clear, st); });
      clear = false;
    }
    if (byType.empty()) add([found](cudaStream_t st) { return cudaMemsetAsync(found, 0, 1, st); });
    return;
  }
  if (op == "ClipByGlobalNorm") {
    const size_t k = n.inputs().size() - 1;
    const Node* u = k ? in(1)->producer() : nullptr;
    const Node* clip = nullptr;
    if (u && fusedGradChain(*u, &clip) && clip == &n) {  // folded: the optimizer clips; only the norm here
      const double* normSq = p.chainNorm(u);
      float* norm = n.numResults() > k ? f32(out(k)) : nullptr;
      if (norm) add([normSq, norm](cudaStream_t st) { return clipNormOut(normSq, norm, st); });
      return;
    }
    std::vector<int64_t> sizes;
    std::vector<void*> src, dst;
    for (size_t i = 0; i < k; ++i) {
      src.push_back(f32(in(i + 1)));
      dst.push_back(f32(out(i)));
      sizes.push_back(in(i + 1)->type().numel());
    }
    auto l = std::make_shared<TensorList>(sizes, std::vector<std::vector<void*>>{src, dst});
    p.keep_.push_back(l);
    const bool* found = flag(in(0));
    float* norm = f32(out(k));
    const float maxNorm = n.getFloat("max_norm", 0.0f);
    const Scratch sq = scratch(sizeof(double) * (1 + static_cast<size_t>(l->chunks())));
    add([l, found, norm, maxNorm, sq](cudaStream_t st) { return clipByGlobalNorm(*l, found, maxNorm, reinterpret_cast<double*>(sq.f()), norm, st); });
    return;
  }
  if (op == "StepIncrement") {
    const int64_t* s = i64(in(0));
    const bool* found = flag(in(1));
    int64_t* o = i64(out(0));
    add([=](cudaStream_t st) { return stepIncrement(s, found, o, st); });
    return;
  }
  if (op == "LearningRate") {
    const int64_t* s = i64(in(0));
    float* o = f32(out(0));
    const float lr = n.getFloat("lr", 0.01f);
    const std::string sched = n.getString("schedule", "constant");
    const int schedule = sched == "constant" ? 0 : sched == "cosine" ? 2 : sched == "linear" ? 3 : 1;
    const int64_t warmup = n.getInt("warmup", 0), total = n.getInt("total", 0);
    add([=](cudaStream_t st) { return learningRate(s, o, lr, schedule, warmup, total, st); });
    return;
  }
  if (op == "ScalerUpdate") {
    const float* s = f32(in(0));
    const int64_t *t = i64(in(1)), *l = i64(in(2));
    const bool* found = flag(in(3));
    float* so = f32(out(0));
    int64_t *to = i64(out(1)), *lo = i64(out(2));
    const float growth = n.getFloat("growth_factor", 2.0f), backoff = n.getFloat("backoff_factor", 0.5f);
    const int64_t interval = n.getInt("growth_interval", 2000), hyst = n.getInt("hysteresis", 1);
    const float lo_ = n.getFloat("min_scale", 0.0f), hi = n.getFloat("max_scale", 0.0f);
    add([=](cudaStream_t st) { return scalerUpdate(s, t, l, found, so, to, lo, growth, backoff, interval, hyst, lo_, hi, st); });
    return;
  }
  // SGD / Adam: this node and every later optimizer node of the same op, attributes and shared
  // operands run as one multi-tensor launch here (the memory plan gave them one position).
  fail("internal: optimizer nodes are lowered in groups");
}

// ---------------------------------------------------------------------------------------------

namespace {


}  // namespace

void* Program::allocPersistent(size_t bytes) {
  void* d = nullptr;
  const cudaError_t e = cudaMalloc(&d, alignUp(bytes));
  if (e != cudaSuccess) {
    size_t free = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free, &total);
    throw Error("out of device memory: " + std::to_string(alignUp(bytes)) + " more bytes needed, " + std::to_string(free) + " free on cuda:" +
                std::to_string(opts_.device));
  }
  allocations_.push_back(d);
  return d;
}

Program::Program(const Graph& g, const ProgramOptions& o) : g_(g), opts_(o) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) throw Error("no CUDA device is present");
  if (o.device < 0 || o.device >= count) throw Error("cuda:" + std::to_string(o.device) + ": there are " + std::to_string(count) + " devices");
  check(cudaSetDevice(o.device), "cudaSetDevice");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  cublasLtHandle_t lt = nullptr;
  check(cublasLtCreate(&lt), "cublasLtCreate");
  cublas_ = lt;
  cudnnHandle_t dnn = nullptr;
  check(cudnnCreate(&dnn), "cudnnCreate");
  cudnn_ = dnn;
  check(cudnnSetStream(dnn, stream_), "cudnnSetStream");
  {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
    identity_ = std::string(prop.name) + " (sm_" + std::to_string(prop.major * 10 + prop.minor) + "), cuDNN " + std::to_string(cudnnGetVersion()) +
                ", cuBLASLt " + std::to_string(cublasLtGetVersion());
  }
  // Stored choices hold only for the machine (and cuDNN) that measured them.
  if ((!opts_.attentionChoices.empty() || !opts_.algoChoices.empty()) && opts_.tunedOn != identity_) {
    tuningNote_ = "the plan's choices were measured on " + opts_.tunedOn + ", not on this " + identity_ + ": " +
                  (opts_.algos == ProgramOptions::Algos::measured ? "measured again" : "attention measured again, GEMMs and convolutions by heuristics");
    opts_.attentionChoices.clear();
    opts_.algoChoices.clear();
  }

  // Memory: params, constants and inputs in their own buffers; node results in one arena, planned
  // over where each node's work runs and without the values the folds never write (runtime/folds.h).
  auto t0 = std::chrono::steady_clock::now();
  nhwc_ = placeChannelsLast(g);
  folds::Schedule sched;
  // The loss's scores and their gradient with 16-byte row pitches (pitch_).
  plan_ = planCudaMemory(g, &sched, &pitch_);
  order_ = std::move(sched.order);
  const std::vector<size_t>& leader = sched.leader;
  checkMemoryPlan(plan_);
  int64_t persistent = 0;
  for (const auto* list : {&g.inputs(), &g.params(), &g.consts()})
    for (const Value* v : *list) persistent += static_cast<int64_t>(alignUp(v->type().bytes()));
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  const int64_t needed = plan_.arenaBytes + persistent + static_cast<int64_t>(kGemmWorkspace);
  if (needed > static_cast<int64_t>(free))
    throw Error("out of device memory: the plan needs " + std::to_string(needed) + " bytes (arena " + std::to_string(plan_.arenaBytes) +
                ", params and inputs " + std::to_string(persistent) + ", workspace " + std::to_string(kGemmWorkspace) + "), " +
                std::to_string(free) + " are free on cuda:" + std::to_string(o.device));
  stats_.arenaBytes = plan_.arenaBytes;
  stats_.paramBytes = persistent;
  load_.memoryPlan = since(t0);
  t0 = std::chrono::steady_clock::now();
  arena_ = static_cast<char*>(allocPersistent(static_cast<size_t>(std::max<int64_t>(plan_.arenaBytes, 1))));
  for (const auto* list : {&g.inputs(), &g.params(), &g.consts()})
    for (const Value* v : *list) {
      void* d = allocPersistent(std::max<size_t>(v->type().bytes(), 1));
      where_[v] = d;
      if (v->kind() != ValueKind::Input) {
        if (!v->data()) throw Error("'" + v->name() + "' has no data");
        // Straight from the host tensor (a view of the mapped weights file): no staging copy. State
        // that starts at zero (optimizer moments) is set on the device, never paged in on the host.
        const Bytes& b = v->data()->data;
        if (b.knownZero()) check(cudaMemset(d, 0, b.size()), "zero '" + v->name() + "'");
        else check(cudaMemcpy(d, b.data(), b.size(), cudaMemcpyHostToDevice), "upload '" + v->name() + "'");
      }
    }
  for (const auto& [v, s] : plan_.slots) where_[v] = arena_ + s.offset;
  for (const auto& [v, state] : sched.aliases) where_[v] = where_.at(state);  // optimizer updates in place
  step_ = static_cast<uint64_t*>(allocPersistent(sizeof(uint64_t)));
  check(cudaMemset(step_, 0, sizeof(uint64_t)), "step counter");
  load_.uploads = since(t0);
  t0 = std::chrono::steady_clock::now();

  // Lowering, node by node; an optimizer group lowers at its first node.
  std::vector<const Node*> nodes;
  for (const auto& n : g.nodes()) nodes.push_back(n.get());
  // checkPlan: each float group's bytes, by the position after which nothing reads them.
  std::map<int, std::vector<std::pair<int64_t, int64_t>>> freedAt;
  if (o.checkPlan) {
    std::map<int, std::pair<int, std::pair<int64_t, int64_t>>> groups;  // id -> (last, (offset, bytes))
    std::set<int> nonFloat;
    for (const auto& [v, s] : plan_.slots) {
      if (!isFloat(v->type().dtype)) nonFloat.insert(s.group);
      auto& gr = groups.try_emplace(s.group, s.last, std::make_pair(s.offset, s.bytes)).first->second;
      gr.first = std::max(gr.first, s.last);
      gr.second.second = std::max(gr.second.second, s.bytes);
    }
    for (const auto& [id, gr] : groups)
      if (!nonFloat.count(id) && gr.second.second > 0 && gr.first < static_cast<int>(nodes.size())) freedAt[gr.first].push_back(gr.second);
    nan_ = static_cast<unsigned long long*>(allocPersistent(sizeof(unsigned long long) * std::max<size_t>(nodes.size(), 1)));
    check(cudaMemset(nan_, 0, sizeof(unsigned long long) * std::max<size_t>(nodes.size(), 1)), "plan check counters");
    for (const Node* n : nodes) nodeNames_.push_back(n->describe());
  }
  // watchFinite: the nodes each position's launches compute, and the values that can be scanned
  // (float, in the arena or a buffer of their own, written, stored densely).
  std::vector<Watched> groups(o.watchFinite ? nodes.size() : 0);
  auto scannable = [&](const Value* v) {
    if (!isFloat(v->type().dtype) || v->type().dtype == DType::f64 || v->type().numel() == 0 || sched.unwritten.count(v) || pitch_.count(v))
      return false;
    auto it = plan_.slots.find(v);
    return it != plan_.slots.end() ? it->second.bytes > 0 : where_.count(v) != 0;
  };
  if (o.watchFinite) {
    for (size_t i = 0; i < nodes.size(); ++i) groups[static_cast<size_t>(sched.positions[i])].nodes.push_back(nodes[i]);
    for (size_t p = 0; p < groups.size(); ++p) {
      Watched& w = groups[p];
      std::set<const Value*> seen;
      for (const Node* m : w.nodes) {
        for (const Value* v : m->inputs())
          if (v && scannable(v) && (!v->producer() || sched.positions[static_cast<size_t>(order_.at(v->producer()))] != static_cast<int>(p)) &&
              seen.insert(v).second)
            w.operands.emplace_back(v, finiteRecords_++);
        for (size_t r = 0; r < m->numResults(); ++r)
          if (scannable(m->result(r))) w.results.emplace_back(m->result(r), finiteRecords_++);
      }
    }
    finite_ = static_cast<unsigned long long*>(allocPersistent(sizeof(unsigned long long) * 3 * std::max<size_t>(finiteRecords_, 1)));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = *nodes[i];
    if (o.checkPlan && i > 0) addPlanCheck(nodes, i - 1, freedAt);  // after node i - 1's launches
    if (o.watchFinite) addFiniteScans(groups[i].operands, "scan operands of " + n.describe());
    // The nodes whose work runs here (a group's, at its first node).
    std::vector<const Node*> here;
    if (leader[i] == i) {
      const bool optimizer = n.domain() == "ampc" && (n.op() == "SGD" || n.op() == "Adam");
      if (optimizer) {
        for (size_t j = i; j < nodes.size() && leader[j] == i; ++j) here.push_back(nodes[j]);
      } else {
        here.push_back(&n);
      }
    }
    // A data-parallel average is read only after the main stream has waited for its bucket.
    for (const Node* m : here)
      for (const Value* v : m->inputs())
        if (v && v->producer() && v->producer()->domain() == "ampc" && v->producer()->op() == "AllReduce") joinComm();
    if (leader[i] == i) {
      if (n.domain() == "ampc" && (n.op() == "SGD" || n.op() == "Adam")) lowerOptimizer(here);
      else Lowering{*this, n}.lower();
    }
    if (o.watchFinite) addFiniteScans(groups[i].results, "scan results of " + n.describe());
  }
  joinComm();  // the metrics and the state write-back read the last averages
  if (o.checkPlan && !nodes.empty()) addPlanCheck(nodes, nodes.size() - 1, freedAt);
  if (o.watchFinite) {
    for (auto& w : groups)
      if (!w.nodes.empty()) watched_.push_back(std::move(w));
    unsigned long long* rec = finite_;
    const size_t bytes = sizeof(unsigned long long) * 3 * finiteRecords_;
    launches_.insert(launches_.begin(), Step{"zero the finite scans", "check", [=](cudaStream_t st) { return cudaMemsetAsync(rec, 0, bytes, st); }});
  }
  load_.lowering = since(t0);
  tuneBuffers_.reset();  // the measuring's scratch, before the shared scratch is had
  scratch_ = scratchBytes_ ? allocPersistent(scratchBytes_) : nullptr;
  stats_.workspaceBytes = static_cast<int64_t>(scratchBytes_);
  stats_.launches = static_cast<int64_t>(launches_.size());
}

void Program::joinComm() {
  if (pendingJoins_.empty()) return;
  std::vector<cudaEvent_t> done;
  done.swap(pendingJoins_);
  launches_.push_back({"join the data-parallel stream", "ampc.AllReduce", [done](cudaStream_t st) {
                         for (cudaEvent_t e : done)
                           if (const cudaError_t r = cudaStreamWaitEvent(st, e, 0); r != cudaSuccess) return r;
                         return cudaSuccess;
                       }});
}

// checkPlan, after node `index`'s launches: count the NaN elements of its float results,
// then poison the float groups whose last reader it was.
void Program::addPlanCheck(const std::vector<const Node*>& nodes, size_t index,
                           const std::map<int, std::vector<std::pair<int64_t, int64_t>>>& freedAt) {
  const Node& n = *nodes[index];
  unsigned long long* count = nan_ + index;
  for (size_t r = 0; r < n.numResults(); ++r) {
    const Value* v = n.result(r);
    auto it = plan_.slots.find(v);
    if (it == plan_.slots.end() || it->second.bytes == 0 || !isFloat(v->type().dtype) || v->type().dtype == DType::f64) continue;
    const void* x = arena_ + it->second.offset;
    const DT t = deviceType(v->type().dtype, v->name());
    const int64_t cnt = v->type().numel();
    launches_.push_back({"check " + n.describe(), "check", [=](cudaStream_t st) { return countNaN(x, t, cnt, count, st); }});
  }
  auto f = freedAt.find(static_cast<int>(index));
  if (f == freedAt.end()) return;
  for (const auto& [offset, bytes] : f->second) {
    char* p = arena_ + offset;
    const size_t b = static_cast<size_t>(bytes);
    launches_.push_back({"poison after " + n.describe(), "check", [=](cudaStream_t st) { return cudaMemsetAsync(p, 0xFF, b, st); }});
  }
}

void Program::addFiniteScans(const std::vector<std::pair<const Value*, size_t>>& values, const std::string& what) {
  for (const auto& [v, rec] : values) {
    const void* x = ptr(v);
    const DT t = deviceType(v->type().dtype, v->name());
    const int64_t cnt = v->type().numel();
    unsigned long long* r = finite_ + 3 * rec;
    launches_.push_back({what, "check", [=](cudaStream_t st) { return scanFinite(x, t, cnt, r, st); }});
  }
}

void Program::findOverflow(OverflowWatch& w) {
  if (!finite_) throw Error("internal: findOverflow without ProgramOptions::watchFinite");
  std::vector<unsigned long long> c(3 * std::max<size_t>(finiteRecords_, 1));
  hostSync(stream_, "finite scans");
  check(cudaMemcpy(c.data(), finite_, sizeof(unsigned long long) * c.size(), cudaMemcpyDeviceToHost), "finite scans");
  auto scanOf = [&](size_t rec) {
    FiniteScan f;
    f.inf = static_cast<int64_t>(c[3 * rec]);
    f.nan = static_cast<int64_t>(c[3 * rec + 1]);
    const uint32_t bits = static_cast<uint32_t>(c[3 * rec + 2]);
    float big = 0;
    std::memcpy(&big, &bits, sizeof(big));
    f.largest = big;
    return f;
  };
  for (const Watched& g : watched_) {
    std::vector<std::pair<const Value*, FiniteScan>> operands;
    for (const auto& [v, rec] : g.operands) operands.emplace_back(v, scanOf(rec));
    for (const auto& [v, rec] : g.results) {
      const FiniteScan s = scanOf(rec);
      if (!s.inf && !s.nan) continue;
      const Node* n = v->producer();
      std::vector<std::string> others;
      for (const Node* m : g.nodes)
        if (m != n && others.size() < 8) others.push_back("'" + (m->name().empty() ? m->result(0)->name() : m->name()) + "' (" + m->qualifiedOp() + ")");
      if (g.nodes.size() > others.size() + 1) others.push_back(std::to_string(g.nodes.size() - 1 - others.size()) + " more");
      w.observeScans(*n, static_cast<size_t>(v->resultIndex()), s, operands, others);
      if (w.found()) return;
    }
  }
}

std::vector<std::pair<std::string, int64_t>> Program::nanWriters() {
  std::vector<std::pair<std::string, int64_t>> r;
  if (!nan_) return r;
  std::vector<unsigned long long> c(nodeNames_.size());
  hostSync(stream_, "plan check");
  check(cudaMemcpy(c.data(), nan_, sizeof(unsigned long long) * c.size(), cudaMemcpyDeviceToHost), "plan check counters");
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i]) r.emplace_back(nodeNames_[i], static_cast<int64_t>(c[i]));
  return r;
}

// The gradient an optimizer node reads: where the step's UnscaleCheck (and clip) fold into it
// (folds::fusedGradChain), UnscaleCheck's operand and how to unscale and clip it; else the operand.
std::pair<const Value*, GradIn> Program::gradIn(const Value* grad) {
  const Node* prod = grad->producer();
  const Node* u = prod && prod->op() == "ClipByGlobalNorm" ? prod->inputs()[1]->producer() : prod;
  const Node* clip = nullptr;
  if (!u || !fusedGradChain(*u, &clip) || (clip ? clip != prod : u != prod)) return {grad, GradIn{}};
  const Value* src = readThrough(u->inputs()[static_cast<size_t>(grad->resultIndex()) + 1]);
  GradIn gi;
  gi.t = src->type().dtype == DType::f16 ? DT::f16 : src->type().dtype == DType::bf16 ? DT::bf16 : DT::f32;
  gi.invScale = static_cast<const float*>(ptr(u->inputs()[0]));
  if (clip) {
    gi.normSq = chainNorm(u);
    gi.clipFound = static_cast<const bool*>(ptr(clip->inputs()[0]));
    gi.maxNorm = clip->getFloat("max_norm", 0.0f);
  }
  return {src, gi};
}

void Program::lowerOptimizer(const std::vector<const Node*>& group) {
  // One launch per kind of gradient (f32, or UnscaleCheck's f16/bf16/f32 operand read in place).
  std::map<std::pair<int, bool>, std::vector<const Node*>> parts;
  for (const Node* m : group) {
    const GradIn gi = gradIn(m->inputs()[1]).second;
    parts[{static_cast<int>(gi.t), gi.invScale != nullptr}].push_back(m);
  }
  for (const auto& [kind, part] : parts) lowerOptimizerPart(part, group.size());
}

void Program::lowerOptimizerPart(const std::vector<const Node*>& group, size_t groupSize) {
  const Node& n = *group.front();
  const bool isSgd = n.op() == "SGD";
  const size_t tensors = isSgd ? 3 : 4, outs = isSgd ? 2 : 3;
  std::vector<std::vector<void*>> roles(tensors + outs);
  std::vector<int64_t> sizes;
  GradIn gin;
  for (const Node* m : group) {
    for (size_t r = 0; r < tensors; ++r) {
      const Value* v = m->inputs()[r];
      if (r == 1) {  // the gradient, as the step's folded UnscaleCheck and clip leave it
        const auto [src, gi] = gradIn(v);
        roles[r].push_back(ptr(src));
        gin = gi;
        if (!gi.invScale && v->type().dtype != DType::f32) throw Error(m->describe() + ": CUDA backend: optimizer gradients must be f32");
        continue;
      }
      if (!v) {  // SGD without momentum: no buffer (the kernel reads none)
        roles[r].push_back(nullptr);
        continue;
      }
      if (v->type().dtype != DType::f32) throw Error(m->describe() + ": CUDA backend: optimizer state must be f32");
      roles[r].push_back(ptr(v));
    }
    for (size_t r = 0; r < outs; ++r) roles[tensors + r].push_back(r < m->numResults() ? ptr(m->result(r)) : nullptr);
    sizes.push_back(m->inputs()[0]->type().numel());
  }
  auto l = std::make_shared<TensorList>(sizes, roles);
  keep_.push_back(l);
  const float* lr = static_cast<const float*>(ptr(n.inputs()[isSgd ? 3 : 4]));
  const bool* found = static_cast<const bool*>(ptr(n.inputs()[isSgd ? 4 : 6]));
  const std::string what = n.describe() + (groupSize > 1 ? " (+" + std::to_string(groupSize - 1) + " fused)" : "");
  if (isSgd) {
    const float mom = n.getFloat("momentum", 0.0f), wd = n.getFloat("weight_decay", 0.0f);
    const bool nesterov = n.getInt("nesterov", 0) != 0;
    launches_.push_back({what, n.qualifiedOp(), [=](cudaStream_t st) { return sgd(*l, lr, found, mom, wd, nesterov, gin, st); }});
    return;
  }
  const int64_t* step = static_cast<const int64_t*>(ptr(n.inputs()[5]));
  const float b1 = n.getFloat("beta1", 0.9f), b2 = n.getFloat("beta2", 0.999f), eps = n.getFloat("eps", 1e-8f);
  const float wd = n.getFloat("weight_decay", 0.0f);
  const bool decoupled = n.getInt("decoupled", 0) != 0, lamb = n.getInt("lamb", 0) != 0;
  double* norms = lamb ? static_cast<double*>(allocPersistent(sizeof(double) * 2 * (sizes.size() + static_cast<size_t>(l->chunks())))) : nullptr;  // one per group
  launches_.push_back(
      {what, n.qualifiedOp(), [=](cudaStream_t st) { return adam(*l, lr, step, found, b1, b2, eps, wd, decoupled, lamb, norms, gin, st); }});
}

Program::~Program() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) cudaStreamSynchronize(comm_);
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  for (cudaEvent_t e : commEvents_) cudaEventDestroy(e);
  if (comm_) cudaStreamDestroy(comm_);
  keep_.clear();
  for (auto& [v, s] : staging_) {
    if (s.done) cudaEventDestroy(s.done);
    if (s.host) cudaFreeHost(s.host);
  }
  for (void* a : allocations_) cudaFree(a);
  if (cudnn_) cudnnDestroy(static_cast<cudnnHandle_t>(cudnn_));
  if (cublas_) cublasLtDestroy(static_cast<cublasLtHandle_t>(cublas_));
  if (stream_) cudaStreamDestroy(stream_);
}

void* Program::ptr(const Value* v) const {
  auto it = where_.find(v);
  if (it == where_.end()) throw Error("internal: '" + v->name() + "' has no device buffer");
  return it->second;
}

void Program::upload(const Value* v, const Tensor& t) {
  if (t.type != v->type()) throw Error("'" + v->name() + "' is " + t.type.str() + "; the graph wants " + v->type().str());
  Staging& s = staging_[v];
  if (!s.host) {
    s.bytes = std::max<size_t>(t.data.size(), 1);
    check(cudaHostAlloc(&s.host, s.bytes, cudaHostAllocDefault), "cudaHostAlloc");
    check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
  } else if (cudaEventQuery(s.done) == cudaErrorNotReady) {
    ++gSyncs;  // the previous copy from this buffer is still pending: waiting is a host sync
    check(cudaEventSynchronize(s.done), "input staging");
  }
  std::memcpy(s.host, t.data.data(), t.data.size());
  check(cudaMemcpyAsync(ptr(v), s.host, t.data.size(), cudaMemcpyHostToDevice, stream_), "upload '" + v->name() + "'");
  check(cudaEventRecord(s.done, stream_), "cudaEventRecord");
}

Tensor Program::download(const Value* v) {
  Tensor t(v->type());
  ++gSyncs;
  if (auto it = pitch_.find(v); it != pitch_.end()) {  // stored with a padded row pitch: its rows only
    const size_t row = static_cast<size_t>(v->type().shape.back()) * dtypeSize(v->type().dtype);
    const size_t pitch = static_cast<size_t>(it->second) * dtypeSize(v->type().dtype);
    check(cudaMemcpy2DAsync(t.data.data(), row, ptr(v), pitch, row, row ? t.data.size() / row : 0, cudaMemcpyDeviceToHost, stream_),
          "download '" + v->name() + "'");
  } else {
    check(cudaMemcpyAsync(t.data.data(), ptr(v), t.data.size(), cudaMemcpyDeviceToHost, stream_), "download '" + v->name() + "'");
  }
  waitFor(stream_, ("download '" + v->name() + "'").c_str());
  return t;
}

void Program::setStep(uint64_t step) {
  check(cudaMemcpyAsync(step_, &step, sizeof(step), cudaMemcpyHostToDevice, stream_), "step counter");
  hostSync(stream_, "step counter");  // `step` lives on this stack frame
}

void Program::enqueueAll() {
  for (const auto& [what, op, l] : launches_) {
    const cudaError_t e = l(stream_);
    if (e != cudaSuccess) throw Error(what + ": CUDA launch failed: " + cudaGetErrorString(e));
  }
  for (const auto& l : epilogue_) check(l(stream_), "step epilogue");
  check(addStep(step_, stream_), "step counter");
}

std::vector<Program::Timing> Program::profile() {
  std::vector<cudaEvent_t> ev(launches_.size() + 1);
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  std::vector<Timing> t;
  // Consecutive launches of one node share one entry.
  std::vector<size_t> ends;
  for (size_t i = 0; i < launches_.size(); ++i)
    if (i + 1 == launches_.size() || launches_[i + 1].what != launches_[i].what) ends.push_back(i);
  check(cudaEventRecord(ev[0], stream_), "cudaEventRecord");
  size_t k = 0;
  for (size_t i = 0; i < launches_.size(); ++i) {
    const cudaError_t e = launches_[i].launch(stream_);
    if (e != cudaSuccess) throw Error(launches_[i].what + ": CUDA launch failed: " + cudaGetErrorString(e));
    if (k < ends.size() && ends[k] == i) check(cudaEventRecord(ev[++k], stream_), "cudaEventRecord");
  }
  for (const auto& l : epilogue_) check(l(stream_), "step epilogue");
  check(addStep(step_, stream_), "step counter");
  hostSync(stream_, "profile");
  size_t first = 0;
  for (size_t j = 0; j < ends.size(); ++j) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[j], ev[j + 1]), "cudaEventElapsedTime");
    t.push_back({launches_[first].what, launches_[first].op, ms});
    first = ends[j] + 1;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return t;
}

void Program::run() {
  ++stats_.runs;
  if (exec_) {
    ++stats_.replays;
    check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
    return;
  }
  if (!opts_.cudaGraph || stats_.runs == 1) {  // the first run is the warm-up (algorithms, lazy module loads)
    enqueueAll();
    return;
  }
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    enqueueAll();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream_, &broken);
    if (broken) cudaGraphDestroy(broken);
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph_), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  stats_.captured = true;
  ++stats_.replays;
  check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
}

}  // namespace ampc::cuda
