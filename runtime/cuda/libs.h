// cuBLASLt GEMMs and cuDNN convolutions for the CUDA backend: descriptors, layouts and algorithm
// choices are made once, when a plan loads (one object per node), and each step only launches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/cuda/ops.h"

namespace ampc::cuda {

// Throws Error("WHAT: <cuda/cublas/cudnn message>") on failure.
void check(cudaError_t e, const std::string& what);
void check(cublasStatus_t e, const std::string& what);
void check(cudnnStatus_t e, const std::string& what);

// Row-major D[b] (M x N) = alpha * op(A[b]) op(B[b]) + beta * D[b] (+ bias[N] when `bias`), f32
// accumulation; op transposes when trans*. Strides in elements, 0 broadcasts an operand.
struct GemmDesc {
  DT t = DT::f32;
  bool transA = false, transB = false;
  int64_t M = 0, N = 0, K = 0;
  int64_t batch = 1, strideA = 0, strideB = 0, strideD = 0;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  // The bias gradient: the sums of one operand over the contraction into the bias buffer, of D's
  // type: of B (not transposed: N sums; cuBLASLt's BGRADA, B being its first operand) or of A
  // (transposed: M sums; BGRADB). Where cuBLASLt has no algorithm for it, the Gemm runs without it
  // and biasGrad() says so.
  enum class BiasGrad { none, ofA, ofB };
  BiasGrad biasGrad = BiasGrad::none;
  bool allowTf32 = false;
};
// Device scratch for timing a GEMM's or a convolution's algorithms (Gemm::measure, Conv::measure):
// operands and workspace, grown as needed and freed with the object. Bytes that cannot be had make
// measure() give up.
class TuneBuffers {
 public:
  TuneBuffers() = default;
  ~TuneBuffers();
  TuneBuffers(const TuneBuffers&) = delete;
  TuneBuffers& operator=(const TuneBuffers&) = delete;
  // Slot 0-2 the operands, 3 the workspace, 4 a bias: at least `bytes`, filled when new (operands
  // with small finite numbers, the workspace with zeros); nullptr
  // when the device has not that much free.
  void* get(int slot, size_t bytes);
  // Before a timed run: writes a buffer twice the L2 cache's size on `st`, so that the run reads
  // its operands from memory, as the step does, not from what the previous run left in L2 (a
  // memory-bound algorithm that re-reads its input looks cheap when the input stays hot). Nothing
  // where the buffer cannot be had, or with AMPC_EXP_HOT_L2=1 (the timings before stop 64's
  // change, for an A/B).
  void coldL2(cudaStream_t st);

 private:
  void* p_[5] = {};
  size_t n_[5] = {};
  void* flush_ = nullptr;
  size_t flushBytes_ = 0;
  bool flushTried_ = false;
};
// The key a GEMM's stored algorithm goes by (Gemm::key): every field of the descriptor that the
// candidates depend on, so that two GEMMs share a key only where they share candidates.
std::string gemmKey(const GemmDesc& d);
class Gemm {
 public:
  Gemm(cublasLtHandle_t h, const GemmDesc& d, size_t workspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // `bias`: the bias read (bias) or the bias gradient written (biasGrad).
  cublasStatus_t run(const void* A, const void* B, const void* bias, void* D, void* workspace, cudaStream_t st) const;
  bool biasGrad() const { return d_.biasGrad != GemmDesc::BiasGrad::none; }
  // The shape, type, transposes, strides, scalars and epilogue, as stored choices name them
  // (plan.proto, Tuning.gemm).
  std::string key() const;
  // cuBLASLt's heuristic candidates (up to 8, best first): the one that runs, by its rank.
  int candidates() const { return static_cast<int>(algos_.size()); }
  int rank() const { return rank_; }
  // Runs candidate `rank`: false (nothing changed) where there is no such candidate.
  bool use(int rank);
  // Times every candidate on scratch operands on `st` (two warm-up runs, then the median of five,
  // each alone after TuneBuffers::coldL2; host synchronisations) and returns the rank to run: the fastest where it beats the
  // heuristics' first by more than 3%, else 0; -1 where nothing could be measured (scratch not to
  // be had, or the first candidate failed). Changes nothing.
  int measure(TuneBuffers& buf, cudaStream_t st) const;

 private:
  cublasLtHandle_t h_;
  GemmDesc d_;
  size_t ws_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t x_ = nullptr, y_ = nullptr, out_ = nullptr;
  std::vector<cublasLtMatmulAlgo_t> algos_;
  int rank_ = 0;
  cublasLtMatmulAlgo_t algo_{};
};

// An N-d convolution (NCHW, or NHWC in 2-d; symmetric pads, groups) and its two gradients through cuDNN.
struct ConvDesc {
  DT t = DT::f32;
  int nsp = 2;
  int64_t N = 0, C = 0, M = 0, groups = 1;
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int pad[3] = {0, 0, 0}, stride[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  bool allowTf32 = false;
  bool nhwc = false;  // x, y (and their gradients) NHWC, the filter KRSC (2 spatial dims)
  bool deterministic = false;  // only algorithms cuDNN marks CUDNN_DETERMINISTIC
};
// A convolution's three directions, each with its own cuDNN algorithm.
enum class ConvDir { forward, backwardData, backwardFilter };
const char* convDirName(ConvDir d);
// The key a convolution's stored algorithm goes by (Conv::key), per direction: every field of the
// descriptor.
std::string convKey(const ConvDesc& d, ConvDir dir);
class Conv {
 public:
  // The descriptors only: each direction that will run takes its algorithm from chooseHeuristic(),
  // use() or adopt() before it runs.
  Conv(cudnnHandle_t h, const ConvDesc& d);
  ~Conv();
  Conv(const Conv&) = delete;
  Conv& operator=(const Conv&) = delete;
  size_t workspaceBytes() const { return std::max({ws_[0], ws_[1], ws_[2]}); }
  size_t workspaceBytes(ConvDir dir) const { return ws_[static_cast<int>(dir)]; }
  // cuDNN's heuristics' first algorithm for `dir` (with `deterministic`, the first deterministic
  // one). Error where there is none. (cuDNN 9's heuristics take up to a second a query for grouped
  // convolutions: Program asks once per key.)
  void chooseHeuristic(ConvDir dir);
  // Runs `algo` with `wsBytes` of workspace for `dir`, unchecked: a choice that use() or
  // chooseHeuristic() made for a convolution of the same key.
  void adopt(ConvDir dir, int algo, size_t wsBytes);
  // How many times any Conv has asked cuDNN's heuristics (offered()) in this process: the load
  // asks once per key, not per node (the test of that).
  static int64_t heuristicQueries();
  // The shape, type, layout and direction, as stored choices name them (plan.proto, Tuning.convolution).
  std::string key(ConvDir dir) const;
  int algo(ConvDir dir) const;
  // Runs `algo` for `dir`: false (nothing changed) where cuDNN has no such algorithm for this
  // convolution, or with `deterministic`, one it does not mark deterministic.
  bool use(ConvDir dir, int algo);
  // Times the algorithm in force (the heuristics' pick) and up to five more that cuDNN's heuristics
  // offer for `dir` within `wsLimit` bytes of workspace, each through the call the step makes, on
  // scratch operands on the handle's stream (as Gemm::measure: two warm-up runs, then the median of
  // five, each alone after TuneBuffers::coldL2), and returns the one to run: the fastest where it
  // beats the one in force by more than 3%, else that one; -1 where nothing could be measured
  // (scratch not to be had, or the one in force failed). Changes nothing. (cuDNN's own
  // cudnnFind*AlgorithmEx chose algorithms that ran a RegNetY step at half the speed, and this
  // timing with hot L2, back to back, 30% slower: stop 64, tools/bench/NOTES.md.)
  int measure(ConvDir dir, TuneBuffers& buf, size_t wsLimit) const;
  cudnnStatus_t forward(const void* x, const void* w, void* y, void* ws, size_t wsBytes) const;
  cudnnStatus_t backwardData(const void* dy, const void* w, void* dx, void* ws, size_t wsBytes) const;
  cudnnStatus_t backwardFilter(const void* x, const void* dy, void* dw, void* ws, size_t wsBytes) const;

 private:
  cudnnHandle_t h_;
  ConvDesc d_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t bwdData_{};
  cudnnConvolutionBwdFilterAlgo_t bwdFilter_{};
  size_t ws_[3] = {};  // per direction (ConvDir)
  // The algorithms cuDNN's heuristics list for `dir` with a success status (each once: some are
  // listed once per math type), best first; with `deterministic` only those marked deterministic.
  std::vector<int> offered(ConvDir dir) const;
  // `algo`'s workspace for `dir` in *bytes: false where cuDNN cannot say.
  bool workspace(ConvDir dir, int algo, size_t* bytes) const;
  // One run of `algo` in direction `dir`: forward reads x and w and writes y; backward-data reads y
  // (dY) and w and writes x (dX); backward-filter reads x and y (dY) and writes w (dW). (The public
  // calls take their read operands const.)
  cudnnStatus_t run(ConvDir dir, int algo, void* x, void* w, void* y, void* ws, size_t wsBytes) const;
};

}  // namespace ampc::cuda
