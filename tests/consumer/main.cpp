// Runs ampc's autocast on an ONNX model through the installed library and checks the result:
// the output passes onnx::checker, MatMul/Gemm/Conv run low, the loss stays FP32.
//   consumer MODEL.onnx
#include <ampc/ampc.h>
#include <onnx/checker.h>

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer MODEL.onnx\n";
    return 2;
  }
  onnx::ModelProto model;
  std::ifstream in(argv[1], std::ios::binary);
  if (!model.ParseFromIstream(&in)) {
    std::cerr << argv[1] << ": not an ONNX model\n";
    return 1;
  }
  try {
    ampc::AutocastOptions opts;
    opts.low = ampc::DType::bf16;
    ampc::AutocastResult r = ampc::autocastModel(model, opts);
    onnx::checker::check_model(r.model);
    int low = 0, gemms = 0, casts = 0;
    for (const auto& row : r.report.rows) {
      if (row.op == "MatMul" || row.op == "Gemm" || row.op == "Conv") {
        ++gemms;
        low += row.precision == "bf16";
      }
      if (row.rule == "loss (FP32)" && row.precision != "f32") {
        std::cerr << "loss is not FP32\n";
        return 1;
      }
    }
    for (const auto& n : r.model.graph().node()) casts += n.op_type() == "Cast";
    std::cout << ampc::formatReport(r.report);
    std::cout << "consumer: " << low << " of " << gemms << " GEMM-type ops in bf16, " << casts << " Cast nodes in the output\n";
    return gemms > 0 && low == gemms && casts > 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "consumer: " << e.what() << "\n";
    return 1;
  }
}
