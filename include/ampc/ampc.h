// ampc as a library: the autocast passes for other compilers' ONNX graphs.
//
//   #include <ampc/ampc.h>
//   ampc::AutocastOptions opts;            // low = f16; opCategories; pins (see passes/autocast.h)
//   opts.low = ampc::DType::bf16;
//   ampc::AutocastResult r = ampc::autocastModel(model, opts);
//   // r.model: the mixed-precision ModelProto (real Cast nodes, passes onnx::checker)
//   // r.report: one row per node (precision, rule) and the totals; ampc::formatReport(r.report)
//
// CMake: find_package(ampc) and target_link_libraries(x ampc::passes). All of ampc's headers are
// installed under <ampc/...>.
#pragma once

#include <onnx/onnx_pb.h>

#include <string>

#include "passes/autocast.h"

namespace ampc {

struct AutocastResult {
  onnx::ModelProto model;
  AutocastReport report;
};

// Imports `model` (static shapes; external data is read from `modelDir`), paints it with
// `options`, removes redundant casts, and exports the mixed graph. Throws ampc::Error (a
// std::runtime_error naming the node and op) on bad input.
AutocastResult autocastModel(const onnx::ModelProto& model, const AutocastOptions& options, const std::string& modelDir = ".");

}  // namespace ampc
