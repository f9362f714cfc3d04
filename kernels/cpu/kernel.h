// The CPU reference backend's kernels: one function per registry op, for every dtype the op
// accepts. f16/bf16 are computed the way a GPU computes them: inputs widened to f32, arithmetic in
// f32 (GEMM and convolution accumulate in f32), the result rounded once to the storage type.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// The processes that train one model together, data parallel (runtime/dist.h puts one over Gloo).
// ampc.AllReduce's kernel calls it; every process of the group must call it in the same order.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Sums n floats element-wise across the group, in place. Every process gets the same bits.
  // Error when a peer has died or stopped answering (the group's timeout).
  virtual void allReduceSum(float* data, size_t n) = 0;
  // Rank 0's `bytes` under `key`, on every rank (the others' `bytes` are ignored): how a device
  // collective engine's group id (NCCL's) reaches the group. Error when rank 0 does not answer.
  virtual std::string shareFromRankZero(const std::string& key, const std::string& bytes) = 0;
};

// What a backend needs besides the graph: the random stream's position and switches.
struct ExecOptions {
  uint64_t seed = 0;     // Dropout's Philox key
  uint64_t step = 0;     // training step: part of Dropout's Philox counter
  bool dropout = true;   // false: Dropout is the identity even in training mode (comparisons)
  Collective* collective = nullptr;  // ampc.AllReduce's group; none: a group of one
};

}  // namespace ampc

namespace ampc::cpu {

class KernelCtx {
 public:
  KernelCtx(const Node& node, const std::vector<const Tensor*>& in, std::vector<Tensor>& out, const ExecOptions& opts)
      : node(node), opts(opts), in_(in), out_(out) {}

  const Node& node;
  const ExecOptions& opts;

  size_t numInputs() const { return in_.size(); }
  bool has(size_t i) const { return i < in_.size() && in_[i]; }
  const Tensor& in(size_t i) const;  // Error if absent
  size_t numOutputs() const { return out_.size(); }
  Tensor& out(size_t i) { return out_.at(i); }
  [[noreturn]] void fail(const std::string& msg) const { throw Error(node.describe() + ": " + msg); }

 private:
  const std::vector<const Tensor*>& in_;
  std::vector<Tensor>& out_;
};

using Kernel = void (*)(KernelCtx&);

// The kernel for an op of the default domain (or of `domain`), or null.
Kernel findKernel(std::string_view op, std::string_view domain = {});
// Every op name that has a kernel.
std::vector<std::string> kernelOps();

// Runs one node: allocates its results from the node's result types and calls the kernel.
// Error (naming the node) if the op has no kernel or the inputs are wrong.
std::vector<Tensor> runNode(const Node& n, const std::vector<const Tensor*>& in, const ExecOptions& opts = {});

// x converted to dtype `to` with Cast's semantics (float->float rounds once to nearest even,
// float->int truncates, ->bool is x != 0).
Tensor castTensor(const Tensor& x, DType to);

// Philox 4x32-10 (Salmon et al., SC'11): the counter-based generator behind Dropout's masks.
struct Philox {
  static void block(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
};
// Dropout keep/drop for element i: the same stream on every backend, keyed by (seed, step, node).
uint32_t dropoutNodeKey(const Node& n);  // stable hash of the node's first result name (or of its `stream` attribute)
// The seed of a random op's stream: its "seed" attribute (an int for Dropout's extension, a float
// for RandomUniformLike, RandomNormalLike and Bernoulli), else the run's seed.
uint64_t randomSeed(const Node& n, uint64_t runSeed);
// Uniform in [0, 1) with 24 bits, for element `i` of the stream (seed, step, nodeKey): the random
// ops' draws (RandomUniformLike, RandomNormalLike, Bernoulli), four elements per Philox block.
float randomUniform(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t i);
// Dropout's 16-bit draw for element `i` of the stream (seed, step, nodeKey): eight elements per
// Philox block (block i / 8; word (i / 2) % 4, its low half for even i), so that a GPU lane turns one
// block into eight decisions. Element i is kept when its draw is at least dropoutThreshold(ratio).
uint32_t dropoutDraw(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t i);
// The draws of elements 8 blk .. 8 blk + 7 (one Philox block).
void dropoutDraws8(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t blk, uint32_t draws[8]);
// ceil(ratio * 65536), exact in float: the smallest kept draw (65536 keeps none). The dropped share is
// ratio rounded up to a multiple of 2^-16; the kept values are still scaled by 1 / (1 - ratio).
inline uint32_t dropoutThreshold(float ratio) { return static_cast<uint32_t>(std::ceil(ratio * 65536.0f)); }

}  // namespace ampc::cpu
