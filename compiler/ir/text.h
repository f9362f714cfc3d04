// The IR's stable text form: the language of golden tests and of `ampc --emit text`.
//
//   graph "main" opset 17 {
//     domain "com.example" 1
//     input %x : f32[100,10]
//     param %fc1.weight : f32[100,10]
//     const %shape : i64[2] = [100, -1]
//     %h : f32[100,100] = Gemm(%x, %fc1.weight, %fc1.bias) {alpha = 1.0, transB = 1} @"/fc1/Gemm"
//     %y : f32[4], %mask : bool[4] = Dropout(%h, _, _)
//     output %loss
//   }
//
// Names are %name (or %"quoted"); an omitted optional operand is `_`; ops of other domains are
// written domain::Op. Attribute values: ints `1`, floats `1.0`, strings "s", lists `[1, 2]`,
// `[1.0]`, `["a"]` (empty lists `[]`, `[]f`, `[]s`), tensors `f32[2] [1.0, 2.0]`. Params print no
// data; constants with more than kMaxInlineElements print `...` and parse back without data.
// print(parse(print(g))) == print(g).
#pragma once

#include <memory>
#include <string>

#include "compiler/ir/ir.h"

namespace ampc {

inline constexpr int64_t kMaxInlineElements = 64;

std::string printGraph(const Graph& g);
// Parses the text form; Error "FILE:LINE:COL: message" on bad text. Types are taken as written;
// run verify() to check them against the registry.
std::unique_ptr<Graph> parseGraph(const std::string& text, const std::string& file = "<text>");

}  // namespace ampc
