// The training graph of a committed model, built as ampc's plans build it: the fused attention and
// GELU passes, autocast and cast cleanup at a low precision, then the training step (the tests'
// shared recipe: tests/unit and tests/gpu).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "compiler/onnx/onnx.h"
#include "compiler/target.h"
#include "passes/autocast.h"
#include "passes/pass.h"
#include "passes/train_step.h"

namespace ampc::test {

// models/<model>.onnx under `dir`; `o` gives the optimizer and its settings (its precision and
// frozen parameters are set here: the transformers' causal masks are constants, not parameters).
inline std::unique_ptr<Graph> trainGraph(const std::filesystem::path& dir, const std::string& model, DType precision, TrainOptions o) {
  auto g = importOnnxFile((dir / (model + ".onnx")).string());
  const std::string freeze = model == "transformer" ? "model\\.mask" : model == "gpt2_tiny" ? "causal_mask" : "";
  createFuseAttentionPass(findTarget("cuda"), precision)->run(*g);
  createFuseGeluPass()->run(*g);
  createFuseRotateHalfPass()->run(*g);
  if (precision != DType::f32) {
    PassManager pm;
    AutocastOptions ao;
    ao.low = precision;
    pm.add(createAutocastPass(ao));
    pm.add(createCastCleanupPass());
    pm.run(*g);
  }
  o.precision = precision;
  o.autodiff.freeze = freeze;
  createTrainStepPass(o)->run(*g);
  return g;
}

}  // namespace ampc::test
