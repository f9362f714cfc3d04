#include "compiler/target.h"

#include "compiler/ir/ir.h"
#include "kernels/cuda/limits.h"

namespace ampc {
namespace {

bool cudaAttention(const AttentionShape& s) { return cuda::attentionFits(s.lowFloat, s.headDim, s.vHeadDim, s.keys, s.dropout); }
// The mma.sync kernels take strided operands.
bool cudaAttentionInPlace(const AttentionShape& s) { return cuda::attentionMmaShape(s.lowFloat, s.headDim, s.vHeadDim, s.keys, s.dropout); }

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"cuda", cudaAttention, cudaAttentionInPlace, cuda::gemmRunsPadded},
      {"cpu", nullptr, nullptr, nullptr},
  };
  return t;
}

}  // namespace

const Target& findTarget(const std::string& name) {
  for (const auto& t : targets())
    if (t.name == name) return t;
  std::string known;
  for (const auto& t : targets()) known += (known.empty() ? "" : ", ") + t.name;
  throw Error("unknown target '" + name + "' (known: " + known + ")");
}

std::vector<std::string> targetNames() {
  std::vector<std::string> n;
  for (const auto& t : targets()) n.push_back(t.name);
  return n;
}

}  // namespace ampc
