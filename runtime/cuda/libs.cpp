#include "runtime/cuda/libs.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc::cuda {

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error(what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t e, const std::string& what) {
  if (e != CUBLAS_STATUS_SUCCESS) throw Error(what + ": cuBLASLt status " + std::to_string(static_cast<int>(e)));
}
void check(cudnnStatus_t e, const std::string& what) {
  if (e != CUDNN_STATUS_SUCCESS) throw Error(what + ": " + cudnnGetErrorString(e));
}

namespace {

cudaDataType_t cudaType(DT t) {
  switch (t) {
    case DT::f16: return CUDA_R_16F;
    case DT::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
cudnnDataType_t dnnType(DT t) {
  switch (t) {
    case DT::f16: return CUDNN_DATA_HALF;
    case DT::bf16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// The median time in ms of five runs of `once` (true where it ran) on `st`, each alone between two
// events after TuneBuffers::coldL2, following two warm-up runs (the first may load or build its
// kernels); -1 where a run or an event failed.
template <typename F>
float timeRuns(TuneBuffers& buf, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, F once) {
  constexpr int kReps = 5;
  if (!once() || !once()) return -1.0f;
  float t[kReps];
  for (int r = 0; r < kReps; ++r) {
    buf.coldL2(st);
    if (cudaEventRecord(e0, st) != cudaSuccess || !once() || cudaEventRecord(e1, st) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
        cudaEventElapsedTime(&t[r], e0, e1) != cudaSuccess)
      return -1.0f;
  }
  std::sort(t, t + kReps);
  return t[kReps / 2];
}

// Times candidates 0 .. n - 1 (`once(i)`: one run of candidate i, true where it ran) with timeRuns
// and returns the one to run: the fastest where it beats candidate 0 by more than 3%, else 0; -1
// where candidate 0 could not be timed.
template <typename F>
int fastestCandidate(TuneBuffers& buf, cudaStream_t st, size_t n, F once) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) {
    if (e0) cudaEventDestroy(e0);
    cudaGetLastError();
    return -1;
  }
  std::vector<float> ms(n, -1.0f);
  for (size_t i = 0; i < n; ++i) ms[i] = timeRuns(buf, st, e0, e1, [&] { return once(i); });
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGetLastError();
  if (n == 0 || ms[0] < 0) return -1;
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (ms[i] >= 0 && ms[i] < ms[best]) best = i;
  return ms[best] < 0.97f * ms[0] ? static_cast<int>(best) : 0;
}

cublasLtMatrixLayout_t layout(DT t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check(cublasLtMatrixLayoutCreate(&l, cudaType(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t b = static_cast<int32_t>(batch);
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof(b)), "batch count");
    check(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), "batch stride");
  }
  return l;
}

}  // namespace

// Row-major D = op(A) op(B) is column-major D^T = op(B)^T op(A)^T: cuBLASLt's first operand is B's
// storage, its second A's, and its output (N rows, M columns) is D's storage.
Gemm::Gemm(cublasLtHandle_t h, const GemmDesc& d, size_t workspaceBytes) : h_(h), d_(d), ws_(workspaceBytes) {
  const cublasComputeType_t compute = d.t == DT::f32 && d.allowTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  check(cublasLtMatmulDescCreate(&desc_, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t opX = d.transB ? CUBLAS_OP_T : CUBLAS_OP_N, opY = d.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &opX, sizeof(opX)), "transa");
  check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &opY, sizeof(opY)), "transb");
  auto setEpilogue = [&](cublasLtEpilogue_t epi) {
    check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
    if (epi == CUBLASLT_EPILOGUE_DEFAULT) return;
    const cudaDataType_t bt = cudaType(d.t);
    check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)), "bias type");
  };
  using BG = GemmDesc::BiasGrad;
  if (d.bias && d.biasGrad != BG::none) throw Error("internal: a GEMM with both a bias and a bias gradient");
  if ((d.biasGrad == BG::ofB && d.transB) || (d.biasGrad == BG::ofA && !d.transA))
    throw Error("internal: a bias gradient needs B as stored or A transposed");  // cuBLASLt's A not transposed, or its B transposed
  if (d.bias) setEpilogue(CUBLASLT_EPILOGUE_BIAS);
  if (d.biasGrad != BG::none) setEpilogue(d.biasGrad == BG::ofB ? CUBLASLT_EPILOGUE_BGRADA : CUBLASLT_EPILOGUE_BGRADB);
  x_ = d.transB ? layout(d.t, d.K, d.N, d.K, d.batch, d.strideB) : layout(d.t, d.N, d.K, d.N, d.batch, d.strideB);
  y_ = d.transA ? layout(d.t, d.M, d.K, d.M, d.batch, d.strideA) : layout(d.t, d.K, d.M, d.K, d.batch, d.strideA);
  out_ = layout(d.t, d.N, d.M, d.N, d.batch, d.strideD);
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = workspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "workspace");
  constexpr int kCandidates = 8;  // Gemm::measure times these
  cublasLtMatmulHeuristicResult_t res[kCandidates]{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc_, x_, y_, out_, out_, pref, kCandidates, res, &found);
  if (d_.biasGrad != BG::none && (s != CUBLAS_STATUS_SUCCESS || found == 0)) {  // no fused bias gradient here: the caller sums it
    d_.biasGrad = BG::none;
    setEpilogue(CUBLASLT_EPILOGUE_DEFAULT);
    s = cublasLtMatmulAlgoGetHeuristic(h, desc_, x_, y_, out_, out_, pref, kCandidates, res, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (s == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (res[i].state == CUBLAS_STATUS_SUCCESS) algos_.push_back(res[i].algo);
  if (algos_.empty())
    throw Error("cuBLASLt has no algorithm for this GEMM (M=" + std::to_string(d.M) + " N=" + std::to_string(d.N) + " K=" + std::to_string(d.K) +
                " batch=" + std::to_string(d.batch) + ")");
  algo_ = algos_[0];
}

std::string Gemm::key() const { return gemmKey(d_); }

std::string gemmKey(const GemmDesc& d) {
  auto num = [](float v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
    return std::string(b);
  };
  std::string k = std::string(d.t == DT::f16 ? "f16" : d.t == DT::bf16 ? "bf16" : d.allowTf32 ? "f32 tf32" : "f32") + " M" + std::to_string(d.M) +
                  " N" + std::to_string(d.N) + " K" + std::to_string(d.K) + (d.transA ? " A^T" : "") + (d.transB ? " B^T" : "");
  if (d.batch > 1)
    k += " batch " + std::to_string(d.batch) + " strides " + std::to_string(d.strideA) + "," + std::to_string(d.strideB) + "," + std::to_string(d.strideD);
  if (d.alpha != 1.0f) k += " alpha " + num(d.alpha);
  if (d.beta != 0.0f) k += " beta " + num(d.beta);
  if (d.bias) k += " bias";
  if (d.biasGrad != GemmDesc::BiasGrad::none) k += d.biasGrad == GemmDesc::BiasGrad::ofA ? " bias-grad A" : " bias-grad B";
  return k;
}

bool Gemm::use(int rank) {
  if (rank < 0 || rank >= candidates()) return false;
  rank_ = rank;
  algo_ = algos_[static_cast<size_t>(rank)];
  return true;
}

int Gemm::measure(TuneBuffers& buf, cudaStream_t st) const {
  const GemmDesc& d = d_;
  const size_t eb = static_cast<size_t>(dtSize(d.t));
  const int64_t nb = std::max<int64_t>(d.batch, 1);
  const size_t a = static_cast<size_t>((d.strideA ? nb : 1) * d.M * d.K), b = static_cast<size_t>((d.strideB ? nb : 1) * d.K * d.N),
               out = static_cast<size_t>((d.strideD ? nb : 1) * d.M * d.N);
  void *A = buf.get(0, a * eb), *B = buf.get(1, b * eb), *D = buf.get(2, out * eb), *ws = buf.get(3, ws_);
  void* bias = d.bias || d.biasGrad != GemmDesc::BiasGrad::none ? buf.get(4, static_cast<size_t>(std::max(d.M, d.N)) * eb) : nullptr;
  if (!A || !B || !D || !ws || ((d.bias || d.biasGrad != GemmDesc::BiasGrad::none) && !bias)) return -1;
  if (d.bias || d.biasGrad != GemmDesc::BiasGrad::none)
    if (cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) != CUBLAS_STATUS_SUCCESS) return -1;
  return fastestCandidate(buf, st, algos_.size(), [&](size_t i) {
    return cublasLtMatmul(h_, desc_, &d.alpha, B, x_, A, y_, &d.beta, D, out_, D, out_, &algos_[i], ws, ws_, st) == CUBLAS_STATUS_SUCCESS;
  });
}

Gemm::~Gemm() {
  if (out_) cublasLtMatrixLayoutDestroy(out_);
  if (y_) cublasLtMatrixLayoutDestroy(y_);
  if (x_) cublasLtMatrixLayoutDestroy(x_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

cublasStatus_t Gemm::run(const void* A, const void* B, const void* bias, void* D, void* workspace, cudaStream_t st) const {
  if (d_.bias || d_.biasGrad != GemmDesc::BiasGrad::none) {
    cublasStatus_t s = cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return cublasLtMatmul(h_, desc_, &d_.alpha, B, x_, A, y_, &d_.beta, D, out_, D, out_, &algo_, workspace, ws_, st);
}

Conv::Conv(cudnnHandle_t h, const ConvDesc& d) : h_(h), d_(d) {
  const int nd = d.nsp + 2;
  std::vector<int> xs{static_cast<int>(d.N), static_cast<int>(d.C)}, ys{static_cast<int>(d.N), static_cast<int>(d.M)};
  std::vector<int> ws{static_cast<int>(d.M), static_cast<int>(d.C / d.groups)};
  for (int i = 0; i < d.nsp; ++i) {
    xs.push_back(static_cast<int>(d.in[i]));
    ys.push_back(static_cast<int>(d.out[i]));
    ws.push_back(static_cast<int>(d.k[i]));
  }
  auto strides = [&](const std::vector<int>& s) {
    std::vector<int> st(s.size(), 1);
    if (d.nhwc && nd == 4) return std::vector<int>{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};  // dims N C H W, stored N H W C
    for (int i = nd - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
    return st;
  };
  const cudnnDataType_t t = dnnType(d.t);
  check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
  check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
  check(cudnnSetTensorNdDescriptor(x_, t, nd, xs.data(), strides(xs).data()), "conv input descriptor");
  check(cudnnSetTensorNdDescriptor(y_, t, nd, ys.data(), strides(ys).data()), "conv output descriptor");
  check(cudnnCreateFilterDescriptor(&w_), "cudnnCreateFilterDescriptor");
  check(cudnnSetFilterNdDescriptor(w_, t, d.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, nd, ws.data()), "conv filter descriptor");
  check(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
  check(cudnnSetConvolutionNdDescriptor(conv_, d.nsp, d.pad, d.stride, d.dil, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT), "conv descriptor");
  check(cudnnSetConvolutionGroupCount(conv_, static_cast<int>(d.groups)), "conv groups");
  const cudnnMathType_t math = d.t != DT::f32 ? CUDNN_TENSOR_OP_MATH : d.allowTf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  check(cudnnSetConvolutionMathType(conv_, math), "conv math type");
}

void Conv::chooseHeuristic(ConvDir dir) {
  const std::vector<int> offers = offered(dir);
  if (offers.empty())
    throw Error(std::string("cuDNN has no ") + (d_.deterministic ? "deterministic " : "") + convDirName(dir) + " algorithm for this convolution");
  size_t b = 0;
  if (!workspace(dir, offers[0], &b)) throw Error(std::string("cuDNN's conv ") + convDirName(dir) + " workspace query failed");
  adopt(dir, offers[0], b);
}

void Conv::adopt(ConvDir dir, int algo, size_t wsBytes) {
  switch (dir) {
    case ConvDir::forward: fwd_ = static_cast<cudnnConvolutionFwdAlgo_t>(algo); break;
    case ConvDir::backwardData: bwdData_ = static_cast<cudnnConvolutionBwdDataAlgo_t>(algo); break;
    default: bwdFilter_ = static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo); break;
  }
  ws_[static_cast<int>(dir)] = wsBytes;
}

const char* convDirName(ConvDir d) {
  switch (d) {
    case ConvDir::forward: return "forward";
    case ConvDir::backwardData: return "backward-data";
    default: return "backward-filter";
  }
}

std::string Conv::key(ConvDir dir) const { return convKey(d_, dir); }

std::string convKey(const ConvDesc& d, ConvDir dir) {
  auto dims = [&](const int64_t* v) {
    std::string s;
    for (int i = 0; i < d.nsp; ++i) s += (i ? "x" : "") + std::to_string(v[i]);
    return s;
  };
  auto ints = [&](const int* v) {
    std::string s;
    for (int i = 0; i < d.nsp; ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s;
  };
  std::string t = d.t == DT::f16 ? "f16" : d.t == DT::bf16 ? "bf16" : d.allowTf32 ? "f32 tf32" : "f32";
  return std::string(convDirName(dir)) + " " + t + (d.nhwc ? " NHWC" : " NCHW") + " N" + std::to_string(d.N) + " C" + std::to_string(d.C) +
         " " + dims(d.in) + " M" + std::to_string(d.M) + " k" + dims(d.k) + " g" + std::to_string(d.groups) + " pad " + ints(d.pad) +
         " stride " + ints(d.stride) + " dil " + ints(d.dil);
}

int Conv::algo(ConvDir dir) const {
  switch (dir) {
    case ConvDir::forward: return static_cast<int>(fwd_);
    case ConvDir::backwardData: return static_cast<int>(bwdData_);
    default: return static_cast<int>(bwdFilter_);
  }
}

namespace {
std::atomic<int64_t> gHeuristicQueries{0};
}  // namespace

int64_t Conv::heuristicQueries() { return gHeuristicQueries.load(); }

std::vector<int> Conv::offered(ConvDir dir) const {
  gHeuristicQueries.fetch_add(1);
  constexpr int kAlgos = 16;
  int n = 0;
  std::vector<int> r;
  auto collect = [&](const auto* perf) {
    for (int i = 0; i < n; ++i) {
      const int a = static_cast<int>(perf[i].algo);
      if (perf[i].status == CUDNN_STATUS_SUCCESS && (!d_.deterministic || perf[i].determinism == CUDNN_DETERMINISTIC) &&
          std::find(r.begin(), r.end(), a) == r.end())
        r.push_back(a);
    }
  };
  switch (dir) {
    case ConvDir::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kAlgos];
      if (cudnnGetConvolutionForwardAlgorithm_v7(h_, x_, w_, conv_, y_, kAlgos, &n, perf) == CUDNN_STATUS_SUCCESS) collect(perf);
      break;
    }
    case ConvDir::backwardData: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kAlgos];
      if (cudnnGetConvolutionBackwardDataAlgorithm_v7(h_, w_, y_, conv_, x_, kAlgos, &n, perf) == CUDNN_STATUS_SUCCESS) collect(perf);
      break;
    }
    default: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kAlgos];
      if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(h_, x_, y_, conv_, w_, kAlgos, &n, perf) == CUDNN_STATUS_SUCCESS) collect(perf);
      break;
    }
  }
  return r;
}

bool Conv::workspace(ConvDir dir, int algo, size_t* bytes) const {
  switch (dir) {
    case ConvDir::forward:
      return cudnnGetConvolutionForwardWorkspaceSize(h_, x_, w_, conv_, y_, static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes) ==
             CUDNN_STATUS_SUCCESS;
    case ConvDir::backwardData:
      return cudnnGetConvolutionBackwardDataWorkspaceSize(h_, w_, y_, conv_, x_, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes) ==
             CUDNN_STATUS_SUCCESS;
    default:
      return cudnnGetConvolutionBackwardFilterWorkspaceSize(h_, x_, y_, conv_, w_, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes) ==
             CUDNN_STATUS_SUCCESS;
  }
}

cudnnStatus_t Conv::run(ConvDir dir, int algo, void* x, void* w, void* y, void* ws, size_t wsBytes) const {
  const float one = 1.0f, zero = 0.0f;
  switch (dir) {
    case ConvDir::forward:
      return cudnnConvolutionForward(h_, &one, x_, x, w_, w, conv_, static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, wsBytes, &zero, y_, y);
    case ConvDir::backwardData:  // y: dY in, x: dX out
      return cudnnConvolutionBackwardData(h_, &one, w_, w, y_, y, conv_, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, wsBytes, &zero,
                                          x_, x);
    default:  // x and y (dY) in, w: dW out
      return cudnnConvolutionBackwardFilter(h_, &one, x_, x, y_, y, conv_, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, wsBytes,
                                            &zero, w_, w);
  }
}

bool Conv::use(ConvDir dir, int algo) {
  if (algo < 0) return false;
  const std::vector<int> offers = offered(dir);
  size_t b = 0;
  if (std::find(offers.begin(), offers.end(), algo) == offers.end() || !workspace(dir, algo, &b)) return false;
  adopt(dir, algo, b);
  return true;
}

TuneBuffers::~TuneBuffers() {
  for (void* p : p_)
    if (p) cudaFree(p);
  if (flush_) cudaFree(flush_);
}

void TuneBuffers::coldL2(cudaStream_t st) {
  if (!flushTried_) {
    flushTried_ = true;
    const char* hot = std::getenv("AMPC_EXP_HOT_L2");
    int dev = 0, l2 = 0;
    if (!(hot && std::string(hot) == "1") && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0) {
      flushBytes_ = 2 * static_cast<size_t>(l2);
      if (cudaMalloc(&flush_, flushBytes_) != cudaSuccess) {
        cudaGetLastError();
        flush_ = nullptr;
      }
    }
  }
  if (flush_ && cudaMemsetAsync(flush_, 0, flushBytes_, st) != cudaSuccess) cudaGetLastError();
}

void* TuneBuffers::get(int slot, size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (n_[slot] >= bytes) return p_[slot];
  if (p_[slot]) cudaFree(p_[slot]);
  p_[slot] = nullptr;
  n_[slot] = 0;
  if (cudaMalloc(&p_[slot], bytes) != cudaSuccess) {
    cudaGetLastError();
    p_[slot] = nullptr;
    return nullptr;
  }
  // Operands hold small finite numbers in every type (bytes 0x22: f16 0.0129, bf16 and f32 about
  // 2e-18), not zeros, which some products run faster on than on real data.
  if (cudaMemset(p_[slot], slot == 3 ? 0 : 0x22, bytes) != cudaSuccess) return nullptr;
  n_[slot] = bytes;
  return p_[slot];
}

int Conv::measure(ConvDir dir, TuneBuffers& buf, size_t wsLimit) const {
  const ConvDesc& d = d_;
  const size_t eb = static_cast<size_t>(dtSize(d.t));
  int64_t sx = d.N * d.C, sy = d.N * d.M, sw = d.M * (d.C / d.groups);
  for (int i = 0; i < d.nsp; ++i) {
    sx *= d.in[i];
    sy *= d.out[i];
    sw *= d.k[i];
  }
  void *x = buf.get(0, static_cast<size_t>(sx) * eb), *w = buf.get(1, static_cast<size_t>(sw) * eb), *y = buf.get(2, static_cast<size_t>(sy) * eb);
  if (!x || !w || !y) return -1;
  // The candidates: the heuristics' pick (the algorithm in force) first, then the others cuDNN
  // offers, best first, that fit in wsLimit; kMaxCandidates at most.
  constexpr size_t kMaxCandidates = 6;
  std::vector<int> cands{algo(dir)};
  std::vector<size_t> need{ws_[static_cast<int>(dir)]};
  for (int a : offered(dir)) {
    size_t b = 0;
    if (cands.size() < kMaxCandidates && a != cands[0] && workspace(dir, a, &b) && b <= wsLimit) {
      cands.push_back(a);
      need.push_back(b);
    }
  }
  size_t wsBytes = *std::max_element(need.begin(), need.end());
  void* ws = buf.get(3, wsBytes);
  if (!ws) {  // less free than the largest asks: the candidates that fit the first's workspace
    wsBytes = need[0];
    if (!(ws = buf.get(3, wsBytes))) return -1;
  }
  cudaStream_t st = nullptr;
  if (cudnnGetStream(h_, &st) != CUDNN_STATUS_SUCCESS) return -1;
  // Each candidate as the step will run it (this descriptor, this call).
  const int best = fastestCandidate(buf, st, cands.size(), [&](size_t i) {
    return need[i] <= wsBytes && run(dir, cands[i], x, w, y, ws, need[i]) == CUDNN_STATUS_SUCCESS;
  });
  return best < 0 ? -1 : cands[static_cast<size_t>(best)];
}

Conv::~Conv() {
  if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  if (y_) cudnnDestroyTensorDescriptor(y_);
  if (x_) cudnnDestroyTensorDescriptor(x_);
}

cudnnStatus_t Conv::forward(const void* x, const void* w, void* y, void* ws, size_t wsBytes) const {
  return run(ConvDir::forward, fwd_, const_cast<void*>(x), const_cast<void*>(w), y, ws, wsBytes);
}
cudnnStatus_t Conv::backwardData(const void* dy, const void* w, void* dx, void* ws, size_t wsBytes) const {
  return run(ConvDir::backwardData, bwdData_, dx, const_cast<void*>(w), const_cast<void*>(dy), ws, wsBytes);
}
cudnnStatus_t Conv::backwardFilter(const void* x, const void* dy, void* dw, void* ws, size_t wsBytes) const {
  return run(ConvDir::backwardFilter, bwdFilter_, const_cast<void*>(x), dw, const_cast<void*>(dy), ws, wsBytes);
}

}  // namespace ampc::cuda
