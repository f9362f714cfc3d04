// Making one node of the CUDA target's domain (compiler/target.h, kCudaDomain) out of a pattern of
// nodes: the lowering rewrites (runtime/lower.cpp) share it.
#pragma once

#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// A cuda::`op` node on `inputs`, placed before `at` and given at's name and attributes, whose result
// i stands for the value standsFor[i]: it takes that value's readers (graph outputs included), type
// and name. Then the nodes `erase` are removed, readers before producers (each must have no reader
// left), and with them the constants that only they read. Results `added` (a base name and a type
// each: values the pattern did not have) follow those. Returns the new node.
Node* replaceByTargetNode(Graph& g, const std::string& op, Node& at, const std::vector<Value*>& inputs,
                          const std::vector<Value*>& standsFor, const std::vector<Node*>& erase,
                          const std::vector<std::pair<std::string, TensorType>>& added = {});

// The value's one reader, or null (none, several, or a graph output).
Node* onlyReader(const Graph& g, const Value* v);

}  // namespace ampc
