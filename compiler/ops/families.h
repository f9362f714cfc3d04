// Each op family file adds its rows to the registry table.
#pragma once
#include <vector>

#include "compiler/ops/registry.h"

namespace ampc {
void registerElementwiseOps(std::vector<OpDef>& t);  // ops_elementwise.cpp
void registerNNOps(std::vector<OpDef>& t);           // ops_nn.cpp
void registerTensorOps(std::vector<OpDef>& t);       // ops_tensor.cpp
void registerGradOps(std::vector<OpDef>& t);         // grad_rules.cpp: the "ampc" backward ops
void attachGradRules(std::vector<OpDef>& t);         // grad_rules.cpp: GradFn of each row
void attachPointwise(std::vector<OpDef>& t);         // pointwise.cpp: PwFormula of each elementwise row
void registerTrainOps(std::vector<OpDef>& t);        // ops_train.cpp: the training step's ops
void attachOnnxAttributes(std::vector<OpDef>& t);   // registry.cpp: OpDef::attrs of each ONNX row

}  // namespace ampc
