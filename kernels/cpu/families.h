// Each kernel family file adds its (op, kernel) rows to the CPU kernel table.
#pragma once
#include <string_view>
#include <vector>

#include "kernels/cpu/kernel.h"

namespace ampc::cpu {
struct KernelRow {
  std::string_view op;
  Kernel kernel;
  std::string_view domain = {};  // "" = ai.onnx; "ampc" for the backward ops
};
void registerElementwiseKernels(std::vector<KernelRow>& t);  // k_elementwise.cpp
void registerLinearKernels(std::vector<KernelRow>& t);       // k_linear.cpp: MatMul, Gemm, Conv, pools
void registerNormKernels(std::vector<KernelRow>& t);         // k_norm.cpp: norms, softmax, reductions, losses
void registerTensorKernels(std::vector<KernelRow>& t);       // k_tensor.cpp: data movement, casts, shape ops
void registerGradKernels(std::vector<KernelRow>& t);         // k_grad.cpp: "ampc" backward ops
void registerLinearGradKernels(std::vector<KernelRow>& t);   // k_linear.cpp: ConvGrad, AveragePoolGrad
void registerTrainKernels(std::vector<KernelRow>& t);        // k_train.cpp: the training step's ops
void registerAttentionKernels(std::vector<KernelRow>& t);    // k_attention.cpp: fused attention
void registerTargetKernels(std::vector<KernelRow>& t);       // k_target.cpp: the CUDA target's epilogue nodes
}  // namespace ampc::cpu
