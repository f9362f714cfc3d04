#include <algorithm>
#include <utility>

#include "kernels/cpu/families.h"
#include "kernels/cpu/kernel.h"

namespace ampc::cpu {

const Tensor& KernelCtx::in(size_t i) const {
  if (!has(i)) fail("input " + std::to_string(i) + " is required");
  return *in_[i];
}

namespace {
const std::vector<KernelRow>& table() {
  static const std::vector<KernelRow> t = [] {
    std::vector<KernelRow> r;
    registerElementwiseKernels(r);
    registerLinearKernels(r);
    registerNormKernels(r);
    registerTensorKernels(r);
    registerGradKernels(r);
    registerTrainKernels(r);
    registerAttentionKernels(r);
    registerTargetKernels(r);
    return r;
  }();
  return t;
}
}  // namespace

Kernel findKernel(std::string_view op, std::string_view domain) {
  for (const auto& r : table())
    if (r.op == op && r.domain == domain) return r.kernel;
  return nullptr;
}

std::vector<std::string> kernelOps() {
  std::vector<std::string> r;
  for (const auto& k : table())
    if (k.domain.empty()) r.emplace_back(k.op);
  return r;
}

std::vector<Tensor> runNode(const Node& n, const std::vector<const Tensor*>& in, const ExecOptions& opts) {
  Kernel k = findKernel(n.op(), n.domain());
  if (!k) throw Error(n.describe() + ": the CPU backend has no kernel for this op");
  std::vector<Tensor> out;
  out.reserve(n.numResults());
  for (size_t i = 0; i < n.numResults(); ++i) out.emplace_back(n.result(i)->type());
  for (size_t i = 0; i < in.size() && i < n.numInputs(); ++i)
    if (in[i] && n.input(i) && in[i]->type != n.input(i)->type())
      throw Error(n.describe() + ": input " + std::to_string(i) + " is " + in[i]->type.str() + ", the graph says " +
                  n.input(i)->type().str());
  KernelCtx ctx(n, in, out, opts);
  k(ctx);
  return out;
}

// ---- Philox 4x32-10

namespace {
inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

void Philox::block(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(0xD2511F53u, c0, hi0, lo0);
    mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint32_t dropoutNodeKey(const Node& n) {
  // FNV-1a of the first result's name, or of `stream` (a target node's: the name of the result
  // whose stream it keeps, passes/fuse_dropout_residual.cpp).
  uint32_t h = 2166136261u;
  for (char ch : n.hasAttr("stream") ? n.getString("stream", "") : n.result(0)->name()) h = (h ^ static_cast<uint8_t>(ch)) * 16777619u;
  return h;
}

uint64_t randomSeed(const Node& n, uint64_t runSeed) {
  const Attribute* a = n.attr("seed");
  if (!a) return runSeed;
  if (const auto* f = std::get_if<float>(a)) return static_cast<uint64_t>(static_cast<int64_t>(*f));
  return static_cast<uint64_t>(n.getInt("seed", 0));
}

namespace {
// Philox block `blk` of the stream (seed, step, nodeKey). Counter: (block, step, node); key: the seed.
void streamBlock(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t blk, uint32_t out[4]) {
  const uint32_t ctr[4] = {static_cast<uint32_t>(blk), static_cast<uint32_t>(blk >> 32), static_cast<uint32_t>(step), nodeKey};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  Philox::block(ctr, key, out);
}
}  // namespace

float randomUniform(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t i) {
  uint32_t out[4];
  streamBlock(seed, step, nodeKey, i >> 2, out);
  return static_cast<float>(out[i & 3] >> 8) * (1.0f / 16777216.0f);
}

void dropoutDraws8(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t blk, uint32_t draws[8]) {
  uint32_t out[4];
  streamBlock(seed, step, nodeKey, blk, out);
  for (int e = 0; e < 8; ++e) draws[e] = (out[e >> 1] >> (16 * (e & 1))) & 0xffffu;
}

uint32_t dropoutDraw(uint64_t seed, uint64_t step, uint32_t nodeKey, uint64_t i) {
  uint32_t d[8];
  dropoutDraws8(seed, step, nodeKey, i >> 3, d);
  return d[i & 7];
}

}  // namespace ampc::cpu
