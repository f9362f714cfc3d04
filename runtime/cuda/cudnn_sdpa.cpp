#include "runtime/cuda/cudnn_sdpa.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "compiler/ir/ir.h"

namespace ampc::cuda {

namespace {

// The graph's real tensors (the variant pack's ids); virtual ones count up from kFirstVirtual.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV, kScale, kNegInf, kOne, kRowSum, kDQAcc, kBias, kFirstVirtual = 100 };

using Dims = std::array<int64_t, 4>;

std::string lastError() {
  char buf[512] = {0};
  cudnnGetLastErrorString(buf, sizeof buf);
  return buf;
}

void ok(cudnnStatus_t s, const char* what) {
  if (s != CUDNN_STATUS_SUCCESS) {
    const std::string detail = lastError();
    throw Error(std::string("cuDNN attention: ") + what + ": " + cudnnGetErrorString(s) + (detail.empty() ? "" : " (" + detail + ")"));
  }
}

// One backend descriptor, destroyed with its owner.
struct Desc {
  cudnnBackendDescriptor_t d = nullptr;
  explicit Desc(cudnnBackendDescriptorType_t t) { ok(cudnnBackendCreateDescriptor(t, &d), "create descriptor"); }
  ~Desc() {
    if (d) cudnnBackendDestroyDescriptor(d);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  void set(cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v, const char* what) {
    ok(cudnnBackendSetAttribute(d, a, t, n, v), what);
  }
  void finalize(const char* what) { ok(cudnnBackendFinalize(d), what); }
};

cudnnDataType_t dnn(DT t) { return t == DT::f16 ? CUDNN_DATA_HALF : t == DT::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT; }

}  // namespace

// The descriptors of one operation graph and its plans (all kept alive for the plans' life).
struct CudnnSdpa::Graph {
  cudnnHandle_t h;
  std::vector<std::unique_ptr<Desc>> owned;
  std::map<int64_t, cudnnBackendDescriptor_t> tensors;
  std::vector<cudnnBackendDescriptor_t> ops;
  std::vector<std::unique_ptr<Desc>> plans;
  std::vector<std::string> names;  // each plan's engine
  int64_t nextUid = kFirstVirtual;

  Desc& make(cudnnBackendDescriptorType_t t) {
    owned.push_back(std::make_unique<Desc>(t));
    return *owned.back();
  }
  int64_t tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t t, bool isVirtual, bool byValue = false) {
    Desc& x = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    const bool virt = isVirtual;
    x.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t, "tensor type");
    x.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    x.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    x.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    x.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    x.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt, "tensor virtual");
    if (byValue) {
      const bool b = true;
      x.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b, "tensor by value");
    }
    x.finalize("tensor");
    tensors[uid] = x.d;
    return uid;
  }
  // A virtual tensor, packed row-major unless strides are given.
  int64_t temp(const Dims& dims, cudnnDataType_t t = CUDNN_DATA_FLOAT, const Dims* strides = nullptr) {
    const Dims s = strides ? *strides : Dims{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
    return tensor(nextUid++, dims, s, t, true);
  }
  int64_t scalar(int64_t uid, cudnnDataType_t t = CUDNN_DATA_FLOAT) { return tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, t, false, true); }
  void add(Desc& op, const char* what) {
    op.finalize(what);
    ops.push_back(op.d);
  }
  // y = mode(x[, b][, t]); compute in `prec`.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t b, int64_t y, int64_t t = 0, cudnnDataType_t prec = CUDNN_DATA_FLOAT,
                 int64_t axis = -1) {
    Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    pw.finalize("pointwise");
    Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw.d, "pointwise op");
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(x), "pointwise x");
    if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(b), "pointwise b");
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(y), "pointwise y");
    if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(t), "pointwise t");
    add(op, "pointwise operation");
  }
  void matmul(int64_t a, int64_t b, int64_t c) {
    Desc& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul compute type");
    mm.finalize("matmul");
    Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(a), "matmul a");
    op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(b), "matmul b");
    op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(c), "matmul c");
    op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm.d, "matmul desc");
    add(op, "matmul operation");
  }
  void reduce(cudnnReduceTensorOp_t how, int64_t x, int64_t y) {
    Desc& r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how, "reduction operator");
    r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction compute type");
    r.finalize("reduction");
    Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(x), "reduction x");
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(y), "reduction y");
    op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r.d, "reduction desc");
    add(op, "reduction operation");
  }
  void reshape(int64_t x, int64_t y) {
    Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(x), "reshape x");
    op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tensors.at(y), "reshape y");
    add(op, "reshape operation");
  }
  // The causal mask on scores s [B, H, Tq, Tk]: key j > query i replaced by the fill.
  int64_t causal(int64_t s, const Dims& sd) {
    const Dims packed{sd[1] * sd[2] * sd[3], sd[2] * sd[3], sd[3], 1};
    const int64_t row = temp(sd, CUDNN_DATA_INT32, &packed), col = temp(sd, CUDNN_DATA_INT32, &packed);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, row, 0, CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, 0, col, 0, CUDNN_DATA_INT32, 3);
    const int64_t keep = temp(sd, CUDNN_DATA_BOOLEAN, &packed);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, 0, CUDNN_DATA_BOOLEAN);
    const int64_t y = temp(sd);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, kNegInf, y, keep);
    return y;
  }
  // The operation graph, and the plans of the first kMaxPlans engine configurations whose plans
  // finalize, in the order of heuristics mode A (or, where it has none, of the fallback list).
  void finalize() {
    constexpr size_t kMaxPlans = 3;
    Desc& og = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    og.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()), ops.data(), "graph ops");
    og.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "graph handle");
    og.finalize("operation graph");
    std::string tried;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og.d, "heuristics graph");
      heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
      if (cudnnBackendFinalize(heur.d) != CUDNN_STATUS_SUCCESS) {
        tried += " heuristics mode " + std::to_string(static_cast<int>(mode)) + ": " + lastError() + ";";
        continue;
      }
      int64_t count = 0;
      ok(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr), "heuristics count");
      std::vector<std::unique_ptr<Desc>> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(cfgs.back()->d);
      }
      int64_t got = 0;
      if (count > 0)
        ok(cudnnBackendGetAttribute(heur.d, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()), "heuristics results");
      for (int64_t i = 0; i < got; ++i) {
        auto p = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        p->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h, "plan handle");
        p->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw[i], "plan config");
        if (cudnnBackendFinalize(p->d) != CUDNN_STATUS_SUCCESS) {
          tried += " config " + std::to_string(i) + ": " + lastError() + ";";
          continue;
        }
        // The engine's global index, to name it.
        std::string name = "config " + std::to_string(i);
        Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        int64_t n = 0, index = -1;
        if (cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine.d) == CUDNN_STATUS_SUCCESS &&
            cudnnBackendGetAttribute(engine.d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index) == CUDNN_STATUS_SUCCESS)
          name = "engine " + std::to_string(index);
        plans.push_back(std::move(p));
        names.push_back(name);
        if (plans.size() == kMaxPlans) return;
      }
      if (got == 0) tried += " heuristics mode " + std::to_string(static_cast<int>(mode)) + ": no engine;";
      if (!plans.empty()) return;
    }
    throw Error("cuDNN attention: no engine takes the graph:" + tried);
  }
};

bool CudnnSdpa::shapeSupported(const SdpaDesc& d, std::string* why) {
  auto no = [&](const std::string& w) {
    if (why) *why = w;
    return false;
  };
  if (d.t != DT::f16 && d.t != DT::bf16) return no("f16 or bf16 operands only");
  if (d.D % 8 != 0 || d.Dv % 8 != 0 || d.D > 256 || d.Dv > 256) return no("head dims multiples of 8 up to 256");
  if (d.Hk < 1 || d.H % d.Hk != 0) return no("query heads a multiple of the key/value heads");
  if (d.B < 1 || d.Tq < 1 || d.Tk < 1) return no("empty");
  // cuDNN's notes: before 9.15.1 its backward could read out of bounds where Tk is not a multiple of
  // 128 and no padding mask is given (a graph with one costs more; ampc's kernels run instead).
  if (d.backward && d.Tk % 128 != 0 && cudnnGetVersion() < 91501) return no("the backward with Tk a multiple of 128 (cuDNN before 9.15.1)");
  return true;
}

CudnnSdpa::CudnnSdpa(cudnnHandle_t h, const SdpaDesc& d) : h_(h), d_(d), g_(std::make_unique<Graph>()) {
  std::string why;
  if (!shapeSupported(d, &why)) throw Error("cuDNN attention: " + why);
  Graph& g = *g_;
  g.h = h;
  const cudnnDataType_t io = dnn(d.t), f32 = CUDNN_DATA_FLOAT;
  const int64_t B = d.B, H = d.H, Hk = d.Hk, Tq = d.Tq, Tk = d.Tk, D = d.D, Dv = d.Dv;
  auto st = [](const SdpaStrides& s) { return Dims{s.sB, s.sH, s.sRow, 1}; };
  auto stT = [](const SdpaStrides& s) { return Dims{s.sB, s.sH, 1, s.sRow}; };  // a rows operand read transposed
  const Dims sd{B, H, Tq, Tk}, rowDims{B, H, Tq, 1};
  g.tensor(kQ, {B, H, Tq, D}, st(d.q), io, false);
  g.tensor(kK, {B, Hk, D, Tk}, stT(d.k), io, false);  // K^T
  g.tensor(kStats, rowDims, {H * Tq, Tq, 1, 1}, f32, false);
  g.scalar(kScale);
  if (d.causal) g.scalar(kNegInf);
  if (d.bias) g.tensor(kBias, sd, {d.biasAt.sB, d.biasAt.sH, d.biasAt.sRow, 1}, dnn(d.biasT), false);
  // scale s [+ bias]
  auto scaledScores = [&](int64_t s) {
    const int64_t scaled = g.temp(sd);
    g.pointwise(CUDNN_POINTWISE_MUL, s, kScale, scaled);
    if (!d.bias) return scaled;
    const int64_t biased = g.temp(sd);
    g.pointwise(CUDNN_POINTWISE_ADD, scaled, kBias, biased);
    return biased;
  };
  if (!d.backward) {
    g.tensor(kV, {B, Hk, Tk, Dv}, st(d.v), io, false);
    g.tensor(kO, {B, H, Tq, Dv}, st(d.o), io, false);
    int64_t s = g.temp(sd);
    g.matmul(kQ, kK, s);
    const int64_t scaled = scaledScores(s);
    s = d.causal ? g.causal(scaled, sd) : scaled;
    // softmax, with its statistics max + log(sum exp(s - max))
    const int64_t mx = g.temp(rowDims), centred = g.temp(sd), e = g.temp(sd), sum = g.temp(rowDims), lg = g.temp(rowDims);
    g.reduce(CUDNN_REDUCE_TENSOR_MAX, s, mx);
    g.pointwise(CUDNN_POINTWISE_SUB, s, mx, centred);
    g.pointwise(CUDNN_POINTWISE_EXP, centred, 0, e);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, e, sum);
    g.pointwise(CUDNN_POINTWISE_LOG, sum, 0, lg);
    g.pointwise(CUDNN_POINTWISE_ADD, mx, lg, kStats);
    const int64_t p = g.temp(sd, io);
    g.pointwise(CUDNN_POINTWISE_DIV, e, sum, p);
    g.matmul(p, kV, kO);
  } else {
    g.tensor(kV, {B, Hk, Dv, Tk}, stT(d.v), io, false);  // V^T
    g.tensor(kO, {B, H, Tq, Dv}, st(d.o), io, false);
    g.tensor(kDO, {B, H, Tq, Dv}, st(d.dO), io, false);
    g.tensor(kDQ, {B, H, Tq, D}, st(d.dq), io, false);
    const int64_t Hg = d.fullHeadGrads ? H : Hk;  // dK's and dV's heads
    g.tensor(kDK, {B, Hg, Tk, D}, st(d.dk), io, false);
    g.tensor(kDV, {B, Hg, Tk, Dv}, st(d.dv), io, false);
    g.scalar(kOne);
    // rowSum = sum_d dO O (each query row's), f32 in scratch; times 1 where a graph with dropout
    // scales it by 1 - p (the form the engines match). The product's strides are those cuDNN's own
    // frontend gives this virtual tensor.
    const Dims odStrides{H * Tq * Dv, Tq * Dv, H * Dv, 1};
    const int64_t dOO = g.temp({B, H, Tq, Dv}, f32, &odStrides), rs = g.temp(rowDims);
    g.pointwise(CUDNN_POINTWISE_MUL, kDO, kO, dOO);
    g.reduce(CUDNN_REDUCE_TENSOR_ADD, dOO, rs);
    g.tensor(kRowSum, rowDims, {H * Tq, Tq, 1, 1}, f32, false);
    g.pointwise(CUDNN_POINTWISE_MUL, rs, kOne, kRowSum);
    // P = exp(scale Q K^T [+ bias] [masked] - stats)
    const int64_t s = g.temp(sd), centred = g.temp(sd);
    g.matmul(kQ, kK, s);
    g.pointwise(CUDNN_POINTWISE_SUB, scaledScores(s), kStats, centred);
    const int64_t masked = d.causal ? g.causal(centred, sd) : centred;
    const int64_t p = g.temp(sd);
    g.pointwise(CUDNN_POINTWISE_EXP, masked, 0, p);
    // dV = P^T dO (summed over each K/V head's group)
    const Dims tDims{B, H, Tk, Tq}, tStrides{H * Tq * Tk, Tq * Tk, 1, Tk};
    const int64_t pT = g.temp(tDims, io, &tStrides);
    g.reshape(p, pT);
    // a b into `out` [B, Hg, Tk, cols], summed over each K/V head's group where Hg < H
    auto perKeyHead = [&](int64_t a, int64_t b, int64_t out, int64_t cols) {
      if (Hg == H) return g.matmul(a, b, out);
      const int64_t full = g.temp({B, H, Tk, cols}, io);
      g.matmul(a, b, full);
      g.reduce(CUDNN_REDUCE_TENSOR_ADD, full, out);
    };
    perKeyHead(pT, kDO, kDV, Dv);
    // dS = scale P (dO V^T - rowSum)
    const int64_t dP = g.temp(sd), centredDP = g.temp(sd), dSu = g.temp(sd), dS = g.temp(sd);
    g.matmul(kDO, kV, dP);
    g.pointwise(CUDNN_POINTWISE_SUB, dP, kRowSum, centredDP);
    g.pointwise(CUDNN_POINTWISE_MUL, centredDP, p, dSu);
    g.pointwise(CUDNN_POINTWISE_MUL, dSu, kScale, dS);
    // dK = dS^T Q (summed over the group)
    const int64_t dST = g.temp(tDims, io, &tStrides);
    g.reshape(dS, dST);
    perKeyHead(dST, kQ, kDK, D);
    // dQ = dS K, accumulated in f32 scratch, then rounded into dQ
    const Dims kDims{B, Hk, Tk, D}, kStrides{d.k.sB, d.k.sH, d.k.sRow, 1};
    const int64_t kk = g.temp(kDims, io, &kStrides);
    g.reshape(kK, kk);
    g.tensor(kDQAcc, {B, H, Tq, D}, {H * Tq * D, Tq * D, D, 1}, f32, false);
    g.matmul(dS, kk, kDQAcc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kDQAcc, 0, kDQ);
  }
  g.finalize();
  for (const auto& p : g.plans) {
    int64_t n = 0, ws = 0;
    ok(cudnnBackendGetAttribute(p->d, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws), "workspace size");
    planWs_ = std::max(planWs_, static_cast<size_t>(ws));
  }
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  wsBytes_ = align(planWs_);
  if (d.backward) {
    sumOffset_ = wsBytes_;
    wsBytes_ += align(static_cast<size_t>(B * H * Tq) * sizeof(float));
    accOffset_ = wsBytes_;
    wsBytes_ += align(static_cast<size_t>(B * H * Tq * D) * sizeof(float));
  }
}

CudnnSdpa::~CudnnSdpa() = default;

size_t CudnnSdpa::plans() const { return g_->plans.size(); }
const std::string& CudnnSdpa::engine(size_t plan) const { return g_->names.at(plan); }

cudnnStatus_t CudnnSdpa::execute(const std::vector<std::pair<int64_t, const void*>>& ptrs, void* ws, size_t plan, cudaStream_t st) const {
  if (plan >= g_->plans.size()) return CUDNN_STATUS_BAD_PARAM;
  cudnnStatus_t s = cudnnSetStream(h_, st);
  if (s != CUDNN_STATUS_SUCCESS) return s;
  std::vector<int64_t> uids;
  std::vector<void*> data;
  for (const auto& [u, p] : ptrs) {
    uids.push_back(u);
    data.push_back(const_cast<void*>(p));
  }
  cudnnBackendDescriptor_t vp = nullptr;
  if ((s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)) != CUDNN_STATUS_SUCCESS) return s;
  const int64_t n = static_cast<int64_t>(uids.size());
  if ((s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data())) == CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, data.data())) == CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) == CUDNN_STATUS_SUCCESS &&
      (s = cudnnBackendFinalize(vp)) == CUDNN_STATUS_SUCCESS) {
    // (cuDNN 9.14 can let a C++ exception out of an execution, "argument not found" from a graph
    // whose plan finalized: a failed status here, so that the node's error names it)
    try {
      s = cudnnBackendExecute(h_, g_->plans[plan]->d, vp);
    } catch (const std::exception&) {
      s = CUDNN_STATUS_EXECUTION_FAILED;
    }
  }
  cudnnBackendDestroyDescriptor(vp);
  return s;
}

namespace {
const float kNegFill = std::numeric_limits<float>::lowest(), kUnit = 1.0f;
}

cudnnStatus_t CudnnSdpa::forward(const void* Q, const void* K, const void* V, const void* bias, void* O, float* stats, void* ws, size_t plan,
                                 cudaStream_t st) const {
  std::vector<std::pair<int64_t, const void*>> p{{kQ, Q}, {kK, K}, {kV, V}, {kO, O}, {kStats, stats}, {kScale, &d_.scale}};
  if (d_.causal) p.emplace_back(kNegInf, &kNegFill);
  if (d_.bias) p.emplace_back(kBias, bias);
  return execute(p, ws, plan, st);
}

cudnnStatus_t CudnnSdpa::backward(const void* dO, const void* Q, const void* K, const void* V, const void* O, const void* bias,
                                  const float* stats, void* dQ, void* dK, void* dV, void* ws, size_t plan, cudaStream_t st) const {
  char* w = static_cast<char*>(ws);
  std::vector<std::pair<int64_t, const void*>> p{{kQ, Q},   {kK, K},   {kV, V},   {kO, O},      {kStats, stats},        {kDO, dO},
                                                 {kDQ, dQ}, {kDK, dK}, {kDV, dV}, {kScale, &d_.scale}, {kOne, &kUnit},
                                                 {kRowSum, w + sumOffset_},     {kDQAcc, w + accOffset_}};
  if (d_.causal) p.emplace_back(kNegInf, &kNegFill);
  if (d_.bias) p.emplace_back(kBias, bias);
  return execute(p, ws, plan, st);
}

}  // namespace ampc::cuda
