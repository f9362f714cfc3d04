// The CUDA backend: a graph lowered once, when it loads, to a list of device launches over fixed
// addresses (params and inputs in their own buffers, every node result at its memory-plan offset in
// one arena), then run step after step: eagerly the first time, then as one captured CUDA graph
// replayed. GEMMs go through cuBLASLt, convolutions through cuDNN, every other op through
// kernels/cuda. Nothing in a run synchronises with the host: every device-to-host copy and stream
// synchronisation of the runtime goes through hostSync(), which counts them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "compiler/ir/ir.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/train.h"
#include "passes/attention_mask.h"
#include "passes/memory_plan.h"
#include "runtime/overflow.h"

namespace ampc::cuda {

// The number of host synchronisations so far (stream syncs, device-to-host copies).
int64_t hostSyncs();
// Waits for `st` and counts one host synchronisation.
void hostSync(cudaStream_t st, const char* why);
// While set, hostSync waits through `w` instead of cudaStreamSynchronize (an open NCCL group polls
// for its peers' failures and its timeout: runtime/cuda/nccl.h). Null restores the plain wait.
void setStreamWaiter(std::function<void(cudaStream_t, const char*)> w);

class NcclGroup;
class Conv;
class Gemm;
class TuneBuffers;

// True when a CUDA device is present and usable.
bool gpuPresent();
// Bytes in use on the device (all processes): total minus free.
int64_t deviceMemoryUsed(int device);
// "cuda:N" -> N; "cuda" -> 0. Error on anything else.
int parseDevice(const std::string& spec);

struct ProgramOptions {
  int device = 0;
  bool allowTf32 = false;  // FP32 GEMMs and convolutions may use TF32
  bool cudaGraph = true;   // capture the run once after the first, then replay it
  uint64_t seed = 0;       // Dropout's Philox key
  bool dropout = true;     // false: Dropout is the identity (comparisons)
  // Checks the memory plan against the kernels (amprun --check-plan): after each node, the bytes of
  // every float value whose live range ended there are filled with NaN, and each node's float
  // results are scanned for NaNs; nanWriters() names the nodes that wrote some. A kernel that reads
  // a value after its bytes were given to another shows up as NaNs downstream. (Infinities are
  // left alone: masks hold -inf by design.)
  bool checkPlan = false;
  // amprun --explain-overflow: around every launch, the float operands from outside it are scanned
  // before and the results it writes after (Inf and NaN counts, largest finite |x|), into per-value
  // records that each run zeroes first; findOverflow() reads the last run's.
  bool watchFinite = false;
  // amprun --deterministic: the same bits every run. cuDNN algorithms marked deterministic only, the
  // attention backward's dQ summed per key tile in order, scatter-adds (embedding and index
  // gradients, ScatterND/ScatterElements add) sorted and summed in index order instead of atomics.
  // (The other reductions are in a fixed order always; cuBLASLt is deterministic on one stream
  // with its own workspace.) AveragePool's gradient is gathered per input element.
  bool deterministic = false;
  // A data-parallel group (runtime/cuda/nccl.h): ampc.AllReduce sums across it. None: a group of
  // one, whose AllReduce copies its operands through.
  NcclGroup* collective = nullptr;
  // The fused attention (cuda::Attention, AttentionGrad): ampc's kernels (kernels/cuda/attention.cu)
  // or cuDNN's fused SDPA (runtime/cuda/cudnn_sdpa.h), which takes attention without dropout or a
  // trained mask: the causal mask (a constant, or computed from constants only: evaluated at load)
  // it generates itself, any other it reads as an additive bias.
  // automatic: where cuDNN takes a node, the first run times the kernels and cuDNN's plans on its
  // operands and keeps the fastest for every node of that shape; kernels: never cuDNN; cudnn: cuDNN
  // wherever it takes the node. With `deterministic`, the kernels only. Head dims past the kernels'
  // (up to 256: kernels/cuda/limits.h) run through cuDNN in every mode (with `deterministic`, the
  // forward only: the backward is an error).
  enum class Attention { automatic, kernels, cudnn };
  Attention attention = Attention::automatic;
  // automatic: choices measured before and stored in the plan (amprun --tune), per attention shape
  // ("kernels" or "cuDNN engine <n>"), followed without timing where `tunedOn` equals this
  // machine's tuningIdentity() and the choice is offered; other shapes are measured.
  std::map<std::string, std::string> attentionChoices;
  std::string tunedOn;
  // Convolutions' cuDNN algorithms and GEMMs' cuBLASLt algorithms, per key ("conv " Conv::key, a
  // shape and direction; "gemm " Gemm::key; runtime/cuda/libs.h): measured: timed when the plan
  // loads, each key once, on scratch operands (Conv::measure: cuDNN's heuristics' first six within
  // kConvWorkspaceLimit; Gemm::measure: cuBLASLt's eight heuristic candidates; the fastest where it
  // beats the first pick by 3%), or followed from `algoChoices` (amprun --tune) where `tunedOn` is this machine;
  // heuristics: the libraries' first pick, nothing timed. With `deterministic`, always the
  // heuristics' first (convolutions: the first deterministic one).
  enum class Algos { heuristics, measured };
  Algos algos = Algos::heuristics;
  std::map<std::string, std::string> algoChoices;
};

DT deviceType(DType t, const std::string& where);

class Program {
 public:
  // Error naming the node and op for an op or form without a CUDA lowering; Error with the needed
  // and the free bytes when the device cannot hold the plan.
  Program(const Graph& g, const ProgramOptions& o);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  cudaStream_t stream() const { return stream_; }
  void* ptr(const Value* v) const;
  // Copies a graph input's (or param's) value to the device, asynchronously on the stream (the host
  // data is staged in pinned memory; the staging buffer is reused only after the copy that last
  // read it has finished).
  void upload(const Value* v, const Tensor& t);
  // The value's current contents (a counted host synchronisation).
  Tensor download(const Value* v);
  // Launches run after every node, in order (part of the captured graph).
  void addEpilogue(std::function<cudaError_t(cudaStream_t)> f) { epilogue_.push_back(std::move(f)); }
  // Runs the graph once on the stream (asynchronous).
  void run();
  // Dropout's step counter (device): set before a run; each run adds one at its end.
  void setStep(uint64_t step);
  const uint64_t* stepCounter() const { return step_; }

  struct Stats {
    int64_t arenaBytes = 0, paramBytes = 0, workspaceBytes = 0, launches = 0;  // workspaceBytes: the shared scratch
    int64_t runs = 0, replays = 0;
    bool captured = false;
  };
  const Stats& stats() const { return stats_; }
  // The fused attention's implementation per attention shape where cuDNN takes it (ProgramOptions::
  // attention): "kernels" or "cuDNN engine <n>", followed by " (stored in the plan)" where the plan's
  // choice was followed, or "not measured" before the first run.
  std::vector<std::pair<std::string, std::string>> attentionPicks() const;
  // The shapes with a choice between implementations and the one in force (measured or stored):
  // what amprun --tune stores (ProgramOptions::attentionChoices).
  std::map<std::string, std::string> attentionChoices() const;
  // The convolution and GEMM keys with a measured or stored algorithm (what amprun --tune stores:
  // ProgramOptions::algoChoices), and how many were measured here and followed from the plan.
  std::map<std::string, std::string> algoChoices() const;
  std::pair<int, int> algoCounts() const;
  // Where loading the plan's program went, in seconds: the memory plan, the uploads of params and
  // constants, the lowering; of the lowering, cuDNN's convolutions and cuBLASLt's GEMMs (their
  // descriptors and algorithm choice, measuring included), and the measuring alone.
  struct LoadTimes {
    double memoryPlan = 0, uploads = 0, lowering = 0, convolutions = 0, gemms = 0, measuring = 0;
  };
  const LoadTimes& loadTimes() const { return load_; }
  // The machine the choices hold for: the device's name and compute capability, and cuDNN's version.
  const std::string& tuningIdentity() const { return identity_; }
  // Why the plan's stored choices were not followed (measured on another machine), or "".
  const std::string& tuningNote() const { return tuningNote_; }
  // One eager run with events around every node's launches: device milliseconds per node, in
  // order (the run counts as a step: state moves on).
  struct Timing {
    std::string what, op;
    double ms = 0;
  };
  std::vector<Timing> profile();
  const MemoryPlan& memoryPlan() const { return plan_; }
  // With ProgramOptions::checkPlan: the nodes whose results held NaNs in the runs so far,
  // in order, with how many elements (a counted host synchronisation).
  std::vector<std::pair<std::string, int64_t>> nanWriters();
  // With ProgramOptions::watchFinite: feeds the last run's scans to `w`, launch by launch in order
  // (a counted host synchronisation); w.finding() is then the first launch that made a non-finite
  // value from operands without one.
  void findOverflow(OverflowWatch& w);
  // Whether v's bytes are stored channels-last (NHWC) rather than in its shape's NCHW order.
  bool channelsLast(const Value* v) const { return nhwc_.count(v) != 0; }

 private:
  using Launch = std::function<cudaError_t(cudaStream_t)>;
  struct Lowering;
  void* allocPersistent(size_t bytes);
  void lowerOptimizer(const std::vector<const Node*>& group);
  void lowerOptimizerPart(const std::vector<const Node*>& group, size_t groupSize);
  std::pair<const Value*, GradIn> gradIn(const Value* grad);
  void enqueueAll();

  const Graph& g_;
  ProgramOptions opts_;
  cudaStream_t stream_ = nullptr;
  void* cublas_ = nullptr;  // cublasLtHandle_t
  void* cudnn_ = nullptr;   // cudnnHandle_t
  MemoryPlan plan_;
  char* arena_ = nullptr;
  void* scratch_ = nullptr;  // shared by every node's launches (GEMM and convolution workspaces too)
  std::map<const Value*, uint8_t*> maskFlags_;  // attention masks' tile flags, one buffer per mask value
  // Attention forwards' dropout keep bits, by their LSE value (AttentionGrad's sixth input), with the
  // arguments that drew them: the backward reads them where its own arguments match.
  std::map<const Value*, AttentionArgs> keepBits_;
  // Attention masks: what each is ahead of the step (passes/attention_mask.h, classifyCausalMask)
  std::map<const Value*, CausalMask> causalMask_;
  // Per attention shape where cuDNN takes the node: which implementation runs, as stored in the plan
  // or as the first run measured it fastest (-1 until then; an index into the names: 0 ampc's
  // kernels, then cuDNN's plans), shared by the nodes of that shape.
  struct AttentionPick {
    std::shared_ptr<int> pick;
    std::vector<std::string> names;
    bool stored = false;  // the plan's choice, not measured here
  };
  std::map<std::string, AttentionPick> attentionPick_;
  // Per algorithm key (ProgramOptions::algos): the algorithm chosen for the first node of that key
  // (cuDNN's number, or the rank among cuBLASLt's candidates), and whether it was measured here or
  // stored in the plan (neither: the heuristics', not reported).
  struct AlgoPick {
    int algo = -1;
    bool measured = false, stored = false;
    size_t workspace = 0;  // a convolution's, for the later nodes of its key (Conv::adopt)
  };
  std::map<std::string, AlgoPick> algoPick_;
  LoadTimes load_;
  std::unique_ptr<TuneBuffers> tuneBuffers_;  // while the plan lowers: scratch for measuring
  void chooseConvAlgos(Conv& c, bool forward, bool backwardData, bool backwardFilter);
  void chooseGemmAlgo(Gemm& g);
  // A key's stored choice (its number), where the plan has one for this machine; else -1.
  int storedAlgo(const std::string& key) const;
  std::string identity_, tuningNote_;
  // UnscaleCheck nodes folded into their optimizer (folds::fusedGradChain) with a clip: the sum of
  // squares the clip's norm comes from.
  std::map<const Node*, double*> chainNorm_;
  double* chainNorm(const Node* unscale) {
    double*& d = chainNorm_[unscale];
    if (!d) d = static_cast<double*>(allocPersistent(sizeof(double)));
    return d;
  }
  std::map<const Node*, int> order_;            // each node's index in the graph's order
  std::set<const Value*> nhwc_;                 // 4-d values stored channels-last (passes/channels_last.h)
  std::map<const Value*, int64_t> pitch_;       // values stored with a padded row pitch (passes/pitch_loss_scores.h, pitchedValues)
  size_t scratchBytes_ = 0;
  unsigned long long* nan_ = nullptr;  // checkPlan: per node, the NaN elements its results held
  std::vector<std::string> nodeNames_;       // checkPlan: per node
  // watchFinite: per launch group (the nodes one position's launches compute), in order: the outside
  // operands scanned before it and the results scanned after, each with its record's index.
  struct Watched {
    std::vector<const Node*> nodes;
    std::vector<std::pair<const Value*, size_t>> operands, results;
  };
  std::vector<Watched> watched_;
  unsigned long long* finite_ = nullptr;  // 3 per record
  size_t finiteRecords_ = 0;
  void addFiniteScans(const std::vector<std::pair<const Value*, size_t>>& values, const std::string& what);
  void addPlanCheck(const std::vector<const Node*>& nodes, size_t index, const std::map<int, std::vector<std::pair<int64_t, int64_t>>>& freedAt);
  // Data-parallel buckets averaged on a stream of their own while the backward goes on (ampc.AllReduce
  // in a group): the stream, every event made for it, and the buckets' completion events that the
  // main stream has not waited for yet (it does before the first node that reads an average).
  cudaStream_t comm_ = nullptr;
  std::vector<cudaEvent_t> commEvents_, pendingJoins_;
  void joinComm();
  std::vector<void*> allocations_;
  std::map<const Value*, void*> where_;
  struct Step {
    std::string what, op;  // the node (description, qualified op)
    Launch launch;
  };
  std::vector<Step> launches_;
  std::vector<Launch> epilogue_;
  std::vector<std::shared_ptr<void>> keep_;  // objects the launches use (GEMM plans, tensor lists)
  // Generated kernels' libraries by their PTX: fused groups that share a kernel (groups that differ
  // only in names, compiler/codegen) load and JIT it once.
  std::unordered_map<std::string, void*> fusedLibraries_;
  uint64_t* step_ = nullptr;
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
  };
  std::map<const Value*, Staging> staging_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  Stats stats_;
};

}  // namespace ampc::cuda
