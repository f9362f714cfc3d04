#include "runtime/cuda/libs.h"

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

// The heuristics' best algorithm that runs here (and, when `deterministic`, gives the same bits
// every run).
template <typename Perf>
auto firstWorking(const Perf* perf, int n, const char* what, bool deterministic) {
  for (int i = 0; i < n; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS && (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC)) return perf[i].algo;
  throw Error(std::string("cuDNN has no ") + (deterministic ? "deterministic " : "") + what + " algorithm for this convolution");
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
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, desc_, x_, y_, out_, out_, pref, 1, &res, &found);
  if (d_.biasGrad != BG::none && (s != CUBLAS_STATUS_SUCCESS || found == 0)) {  // no fused bias gradient here: the caller sums it
    d_.biasGrad = BG::none;
    setEpilogue(CUBLASLT_EPILOGUE_DEFAULT);
    s = cublasLtMatmulAlgoGetHeuristic(h, desc_, x_, y_, out_, out_, pref, 1, &res, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0)
    throw Error("cuBLASLt has no algorithm for this GEMM (M=" + std::to_string(d.M) + " N=" + std::to_string(d.N) + " K=" + std::to_string(d.K) +
                " batch=" + std::to_string(d.batch) + ")");
  algo_ = res.algo;
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

Conv::Conv(cudnnHandle_t h, const ConvDesc& d, bool forward, bool backwardData, bool backwardFilter) : h_(h) {
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
  constexpr int kAlgos = 16;  // more than cuDNN has of each kind
  int n = 0;
  if (forward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kAlgos];
    check(cudnnGetConvolutionForwardAlgorithm_v7(h, x_, w_, conv_, y_, kAlgos, &n, perf), "conv forward algorithm");
    fwd_ = firstWorking(perf, n, "forward", d.deterministic);
    size_t b = 0;
    check(cudnnGetConvolutionForwardWorkspaceSize(h, x_, w_, conv_, y_, fwd_, &b), "conv forward workspace");
    ws_ = std::max(ws_, b);
  }
  if (backwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kAlgos];
    check(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w_, y_, conv_, x_, kAlgos, &n, perf), "conv backward-data algorithm");
    bwdData_ = firstWorking(perf, n, "backward-data", d.deterministic);
    size_t b = 0;
    check(cudnnGetConvolutionBackwardDataWorkspaceSize(h, w_, y_, conv_, x_, bwdData_, &b), "conv backward-data workspace");
    ws_ = std::max(ws_, b);
  }
  if (backwardFilter) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kAlgos];
    check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x_, y_, conv_, w_, kAlgos, &n, perf), "conv backward-filter algorithm");
    bwdFilter_ = firstWorking(perf, n, "backward-filter", d.deterministic);
    size_t b = 0;
    check(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, x_, y_, conv_, w_, bwdFilter_, &b), "conv backward-filter workspace");
    ws_ = std::max(ws_, b);
  }
}

Conv::~Conv() {
  if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
  if (w_) cudnnDestroyFilterDescriptor(w_);
  if (y_) cudnnDestroyTensorDescriptor(y_);
  if (x_) cudnnDestroyTensorDescriptor(x_);
}

cudnnStatus_t Conv::forward(const void* x, const void* w, void* y, void* ws, size_t wsBytes) const {
  const float one = 1.0f, zero = 0.0f;
  return cudnnConvolutionForward(h_, &one, x_, x, w_, w, conv_, fwd_, ws, wsBytes, &zero, y_, y);
}
cudnnStatus_t Conv::backwardData(const void* dy, const void* w, void* dx, void* ws, size_t wsBytes) const {
  const float one = 1.0f, zero = 0.0f;
  return cudnnConvolutionBackwardData(h_, &one, w_, w, y_, dy, conv_, bwdData_, ws, wsBytes, &zero, x_, dx);
}
cudnnStatus_t Conv::backwardFilter(const void* x, const void* dy, void* dw, void* ws, size_t wsBytes) const {
  const float one = 1.0f, zero = 0.0f;
  return cudnnConvolutionBackwardFilter(h_, &one, x_, x, y_, dy, conv_, bwdFilter_, ws, wsBytes, &zero, w_, dw);
}

}  // namespace ampc::cuda
