// Where the end-to-end tests find the models and PyTorch's references, and the error measure
// they share.
#pragma once

#include <cmath>
#include <filesystem>
#include <string>

#include "compiler/ir/ir.h"

namespace ampc::test {

// A committed model (models/NAME.onnx), else a generated one (build/models/NAME.onnx).
inline std::string modelPath(const std::string& m) {
  namespace fs = std::filesystem;
  fs::path committed = fs::path(AMPC_SOURCE_DIR) / "models" / (m + ".onnx");
  return (fs::exists(committed) ? committed : fs::path(AMPC_BINARY_DIR) / "models" / (m + ".onnx")).string();
}

// PyTorch's references: made now by the make_models fixture with the installed torch
// (build/models/refs/NAME), else the committed ones (models/ref/NAME).
inline std::filesystem::path refDir(const std::string& m) {
  namespace fs = std::filesystem;
  fs::path fresh = fs::path(AMPC_BINARY_DIR) / "models" / "refs" / m;
  if (fs::exists(fresh / "loss.npy")) return fresh;
  return fs::path(AMPC_SOURCE_DIR) / "models" / "ref" / m;
}

// Relative L2 error of a against b (absolute when b is all zeros); NaN in a never passes.
inline double relL2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = a.getDouble(i), y = b.getDouble(i);
    if (std::isnan(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

}  // namespace ampc::test
