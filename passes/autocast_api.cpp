// The library entry point: ModelProto in, mixed ModelProto and report out.
#include "ampc/ampc.h"
#include "compiler/onnx/onnx.h"

namespace ampc {

AutocastResult autocastModel(const onnx::ModelProto& model, const AutocastOptions& options, const std::string& modelDir) {
  auto g = importOnnxModel(model, modelDir, model.graph().name().empty() ? "model" : model.graph().name());
  AutocastResult r;
  const int modelCasts = countCasts(*g);
  PassManager pm;
  pm.add(createAutocastPass(options, &r.report));
  pm.add(createCastCleanupPass());
  pm.run(*g);
  finalizeReport(r.report, *g, modelCasts);
  r.model = exportOnnx(*g);
  return r;
}

}  // namespace ampc
