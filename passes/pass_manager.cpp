#include <sstream>

#include "compiler/target.h"
#include "passes/autocast.h"
#include "passes/autodiff.h"
#include "passes/data_parallel.h"
#include "passes/train_step.h"
#include "passes/pass.h"

namespace ampc {

namespace {
struct PassEntry {
  const char* name;
  std::unique_ptr<Pass> (*create)();
};
const PassEntry kPasses[] = {
    {"infer-shapes", createInferShapesPass},
    {"fold-constants", createFoldConstantsPass},
    {"dce", createDcePass},
    {"cse", createCsePass},
    {"fuse-attention", [] { return createFuseAttentionPass(); }},
    {"fuse-gelu", createFuseGeluPass},
    {"fuse-rotate-half", createFuseRotateHalfPass},
    {"fuse-rms-norm", [] { return createFuseRmsNormPass(findTarget("cpu")); }},  // (the reference runs it)
    {"lower-nll", createLowerNllPass},
    {"dense-experts", createDenseExpertsPass},
    {"narrow-checks", createNarrowChecksPass},
    {"fuse-bias-grad", createFuseBiasGradPass},
    {"fuse-param-casts", createFuseParamCastsPass},
    {"fuse-norm-epilogue", createFuseNormEpiloguePass},
    {"fuse-relu-grad", createFuseReluGradPass},
    {"fuse-dropout-residual", createFuseDropoutResidualPass},
    {"keep-loss-stats", createKeepLossStatsPass},
    {"attention-in-place", [] { return createAttentionInPlacePass(findTarget("cuda")); }},
    {"pitch-loss-scores", [] { return createPitchLossScoresPass(findTarget("cuda")); }},
    {"fold-casts", [] { return createFoldCastsPass(findTarget("cuda")); }},
    {"fuse-grad-chain", [] { return createFuseGradChainPass(); }},
    {"fold-comparisons", [] { return createFoldComparisonsPass(); }},
    {"group-optimizers", [] { return createGroupOptimizersPass(); }},
    {"fuse-linear", createFuseLinearPass},
    {"split-heads", createSplitHeadsPass},
    {"drop-identities", createDropIdentitiesPass},
    {"accumulate-gather-grads", createAccumulateGatherGradsPass},
    {"fuse-elementwise", [] { return createFuseElementwisePass(); }},
    {"convert-f64", [] { return createConvertPrecisionPass(DType::f64); }},
    {"convert-f32", [] { return createConvertPrecisionPass(DType::f32); }},
    {"convert-f16", [] { return createConvertPrecisionPass(DType::f16); }},
    {"convert-bf16", [] { return createConvertPrecisionPass(DType::bf16); }},
    {"autocast", [] { return createAutocastPass(AutocastOptions{}); }},
    {"autocast-bf16", [] { return createAutocastPass(AutocastOptions{DType::bf16, {}, {}}); }},
    {"cast-cleanup", createCastCleanupPass},
    {"autodiff", [] { return createAutodiffPass(); }},
    {"train-step", [] { return createTrainStepPass(TrainOptions{}); }},
    {"data-parallel", [] { return createDataParallelPass(); }},
};
}  // namespace

std::unique_ptr<Pass> createPass(const std::string& name) {
  for (const auto& p : kPasses)
    if (name == p.name) return p.create();
  std::string known;
  for (const auto& p : kPasses) known += std::string(known.empty() ? "" : ", ") + p.name;
  throw Error("unknown pass '" + name + "' (known: " + known + ")");
}

std::vector<std::string> passNames() {
  std::vector<std::string> r;
  for (const auto& p : kPasses) r.push_back(p.name);
  return r;
}

void PassManager::addPipeline(const std::string& s) {
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(item.begin());
    if (!item.empty()) add(createPass(item));
  }
}

bool PassManager::run(Graph& g) {
  bool changed = false;
  for (auto& p : passes_) {
    changed |= p->run(g);
    if (verifyEach_) {
      try {
        verify(g);
      } catch (const Error& e) {
        throw Error("after pass " + p->name() + ": " + e.what());
      }
    }
  }
  return changed;
}

}  // namespace ampc
