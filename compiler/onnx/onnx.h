// ONNX <-> IR. Import: ModelProto -> Graph (initializers become params, Constant nodes and shape
// subgraphs fold into constants, static shapes everywhere). Export: Graph -> ModelProto that
// passes onnx::checker.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace onnx {
class ModelProto;
class TensorProto;
}

namespace ampc {

struct ImportOptions {
  // --input-shape NAME=2x3x32x32: fixes (symbolic) dims of graph inputs.
  std::map<std::string, std::vector<int64_t>> inputShapes;
  // --bind NAME=FILE.npy: a graph input whose value is known at compile time (a shape or an index
  // that a static-shape graph needs) becomes a constant.
  std::map<std::string, Tensor> constInputs;
  // A BatchNormalization in inference form (training_mode 0, one result) whose statistics are
  // initializers is what PyTorch's dynamo exporter writes for a model in train() mode: ampc, a
  // training compiler, gives it PyTorch's training semantics (batch statistics, running statistics
  // updated). --batchnorm as-exported keeps the running statistics (a frozen BatchNorm).
  bool batchNormAsExported = false;
  // Where the graph also holds BatchNormalizations in training form (the TorchScript exporter's
  // train() mode), its inference-form ones are deliberately frozen (a submodule in eval(), as
  // fine-tuning often keeps them) and keep their running statistics; --batchnorm train (this flag)
  // gives them batch statistics all the same.
  bool batchNormTrainAll = false;
  // --embedding-padding TABLE=ROW: nn.Embedding(padding_idx=ROW) for an initializer TABLE, as the
  // model's "ampc.embedding_padding" metadata says (and over it); no exporter keeps padding_idx.
  std::map<std::string, int64_t> embeddingPadding;
  // Initializers whose data comes from the caller, not the model: the model declares them (name,
  // type, shape) and holds no data for them. A plan's graphs are read this way, their weights
  // viewed from the plan's weights file.
  std::map<std::string, Tensor> initializerData;
  // The model is ampc's own (a plan's graphs): its standard ops carry the passes' annotations (a
  // Cast's "fold"), which import keeps without checking them against what the ops read.
  bool ampcGraph = false;
  // --straight-through: every Add of a and (b - a) without a stop-gradient marker is read as the
  // straight-through estimator a + (b - a).detach() whose detach() the exporter dropped: b's value,
  // a's gradient. Without it ampc differentiates the sum as written (b's gradient) and notes each.
  bool straightThrough = false;
};

// Reads and imports an .onnx file. Every failure is an Error whose message starts with the file
// name and names the node (and op) where there is one.
std::unique_ptr<Graph> importOnnxFile(const std::string& path, const ImportOptions& opts = {});
// Imports a parsed model; `modelDir` resolves external data, `file` names the model in errors.
std::unique_ptr<Graph> importOnnxModel(const onnx::ModelProto& model, const std::string& modelDir,
                                       const std::string& file, const ImportOptions& opts = {});

// Imports a parsed model that the graph may keep alive: initializers' inline data is viewed in
// place instead of copied.
std::unique_ptr<Graph> importOnnxModel(std::shared_ptr<const onnx::ModelProto> model, const std::string& modelDir,
                                       const std::string& file, const ImportOptions& opts = {});

struct ExportOptions {
  // Initializers are declared (name, type, shape) without their data, which travels beside the
  // model (a plan's weights file; ImportOptions::initializerData reads it back). Such a model is
  // not checked by onnx::checker, which would ask for the data.
  bool initializerData = true;
};

// Exports; runs onnx::checker::check_model on the result (Error if it fails) when it holds its data.
onnx::ModelProto exportOnnx(const Graph& g, const ExportOptions& opts = {});
// Exports and writes atomically (temp file + rename).
void exportOnnxFile(const Graph& g, const std::string& path);

// The model at `source` with each initializer that `weights` names holding that value instead
// (converted to the initializer's own float type; the shapes must agree), written atomically to
// `path`: a trained model for any ONNX runtime. Initializers whose data lay outside the source
// (external data) are read and written with the rest: inline, or all into `path`.data where the
// model would pass `inlineBytes` (1.5 GiB: protobuf's 2 GiB limit, with room for the rest). Returns how many initializers it replaced (all of `weights`: a name that
// is no initializer of the source is an Error, as are a shape that differs and a file it cannot write).
int64_t writeOnnxWithWeights(const std::string& source, const std::map<std::string, const Tensor*>& weights, const std::string& path,
                             int64_t inlineBytes = int64_t{3} << 29);

// One TensorProto (inline or external data under modelDir); Errors start with `file` and name `what`.
Tensor tensorFromOnnx(const onnx::TensorProto& p, const std::string& modelDir, const std::string& file, const std::string& what);

// Whether import rewrites this default-domain op into registry ops (CastLike, sequences of
// static length, and ops that are compositions of registry ops: the norms over groups and
// instances, the reductions built on sums, Einsum, Attention, ...: kImportLowered in
// compiler/onnx/onnx_import.cpp lists them).
bool importLowersOp(const std::string& op);
// The attributes that import's lowering of `op` reads, as an OpDef::attrs list (any other
// attribute is refused); nullopt when import does not lower `op`.
std::optional<std::string_view> importLoweredAttributes(const std::string& op);

// Parses "2x3x32x32" (Error on anything else).
std::vector<int64_t> parseShapeSpec(const std::string& s);

}  // namespace ampc
