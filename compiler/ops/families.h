// Each op family file adds its rows to the registry table.
#pragma once
#include <vector>

#include "compiler/ops/registry.h"

namespace ampc {
void registerElementwiseOps(std::vector<OpDef>& t);  // ops_elementwise.cpp
void registerNNOps(std::vector<OpDef>& t);           // ops_nn.cpp
void registerTensorOps(std::vector<OpDef>& t);       // ops_tensor.cpp

// Shared by the fold functions: index of the input element that output element `i` reads under
// numpy broadcasting.
int64_t broadcastIndex(int64_t i, const std::vector<int64_t>& outShape, const std::vector<int64_t>& inShape);
}  // namespace ampc
