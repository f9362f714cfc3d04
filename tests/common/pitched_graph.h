// GPT-2's lm_head in small, for the loss scores' row pitch (passes/pitch_loss_scores.cpp): bf16
// scores [1040, 1001] (rows of 2002 bytes) from a product large enough for the padded GEMM path,
// the loss, its gradient (some rows ignored: label 3), and the two products that read it.
// `extra` is inserted before the closing brace (more outputs or readers).
#pragma once

#include <string>

namespace ampc::test {

inline std::string pitchedLossGraph(const std::string& extra = "") {
  return R"(graph "p" opset 17 {
  domain "ampc" 1
  input %h : bf16[1040,1040]
  input %w : bf16[1040,1001]
  input %wt : bf16[1001,1040]
  input %l : i64[1040]
  input %d : f32[]
  const %s : i64[3] = [8, 130, 1001]
  %z : bf16[1040,1001] = MatMul(%h, %w)
  %zf : f32[1040,1001] = Cast(%z) {to = 1}
  %loss : f32[] = SoftmaxCrossEntropyLoss(%zf, %l) {ignore_index = 3}
  %g : f32[1040,1001] = ampc::SoftmaxCrossEntropyLossGrad(%d, %zf, %l) {reduction = "mean", ignore_index = 3}
  %gb : bf16[1040,1001] = Cast(%g) {to = 16}
  %gr : bf16[8,130,1001] = Reshape(%gb, %s)
  %dh : bf16[8,130,1040] = MatMul(%gr, %wt)
  %dw : bf16[1040,1001] = Gemm(%h, %gb) {transA = 1}
  output %loss
  output %dh
  output %dw
)" + extra + "}\n";
}

}  // namespace ampc::test
