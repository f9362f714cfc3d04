// Passes: one per file, one small interface (run(Graph&) -> changed), and a manager that runs
// a named pipeline and verifies the graph between passes.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

// Whether n is the default-domain (ONNX) op `op`; false for null.
inline bool isOnnxOp(const Node* n, std::string_view op) { return n && n->domain().empty() && n->op() == op; }
// Whether v is read by exactly one node operand and is not a graph output (a pattern may absorb
// it); false for null.
inline bool singleUse(const Graph& g, const Value* v) { return v && v->uses().size() == 1 && !g.isOutput(v); }
// A lowering's new node `op` before `at`: one result of type t (named after at's first result), the
// node named at's name / op, with attrs.
inline Value* emitBefore(Graph& g, Node* at, const std::string& op, const std::vector<Value*>& ins, const TensorType& t,
                         std::map<std::string, Attribute> attrs = {}) {
  Node* k = g.createNode(op, "", ins, {{g.uniqueName(at->result(0)->name() + "." + op), t}}, at);
  k->setName(at->name() + "/" + op);
  for (auto& [name, a] : attrs) k->setAttr(name, std::move(a));
  return k->result(0);
}
// A constant i64 vector for a lowering at `at` (shapes, axes), named after at's first result.
inline Value* i64Const(Graph& g, Node* at, const std::string& what, const std::vector<int64_t>& v) {
  return g.addConst(g.uniqueName(at->result(0)->name() + "." + what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
}

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string name() const = 0;
  // Returns true if the graph changed. Throws Error on bad input.
  virtual bool run(Graph& g) = 0;
};

// Every pass, by the name pipelines use ("fold-constants", "dce", ...).
std::unique_ptr<Pass> createPass(const std::string& name);
std::vector<std::string> passNames();

class PassManager {
 public:
  explicit PassManager(bool verifyEach = true) : verifyEach_(verifyEach) {}
  void add(std::unique_ptr<Pass> p) { passes_.push_back(std::move(p)); }
  // "fold-constants,dce": Error for an unknown pass name.
  void addPipeline(const std::string& commaSeparated);
  bool run(Graph& g);

 private:
  bool verifyEach_;
  std::vector<std::unique_ptr<Pass>> passes_;
};

// nn.Linear as the dynamo exporter writes it, MatMul(X, Transpose(W)) [+ bias], becomes
// Gemm(X viewed [M, K], W, bias) {transB = 1} viewed back (passes/fuse_linear.cpp).
std::unique_ptr<Pass> createFuseLinearPass();  // fuse_linear.cpp
// Attention's q, k, v unbound from a [k, B, H, T, d] permute (timm) become a Split of the
// projection, views and Transposes [0, 2, 1, 3] (Hugging Face's form); k.transpose(-2, -1) written
// over merged dims becomes one Transpose (passes/split_heads.cpp).
std::unique_ptr<Pass> createSplitHeadsPass();  // split_heads.cpp

// The passes (one file each under passes/).
std::unique_ptr<Pass> createInferShapesPass();    // infer_shapes.cpp
std::unique_ptr<Pass> createFoldConstantsPass();  // fold_constants.cpp
// One step of fold-constants: infers n's result types and, when its inputs are constants, replaces
// it by constants (n is then erased). The importer runs it node by node, so that each node sees
// its inputs' types. Returns true if anything changed.
bool inferAndFoldNode(Graph& g, Node* n);
// Whether n can be computed ahead from its operands' data (fold-constants' rule, and the importer's
// evaluation of index cones): a standard registry op, not random, with a CPU kernel.
bool evaluableAhead(const Node& n);
std::unique_ptr<Pass> createDcePass();            // dce.cpp
// Common subexpression elimination: equal constants become one, and a node that repeats an earlier
// one (op, attributes, operands, result types; not random ops) goes, its readers reading the earlier.
std::unique_ptr<Pass> createCsePass();            // cse.cpp
std::unique_ptr<Pass> createConvertPrecisionPass(DType to, const std::string& keep = "");  // convert_precision.cpp
// Softmax(scale * Q KT + mask) (Dropout) V -> one ampc.Attention node (a trainable mask, a bias,
// gets its gradient). `target` says which shapes its fused attention takes (compiler/target.h;
// the default is cuda); `compute`, the dtype autocast will run the fused node at (the plan's f16 or
// bf16, or f32; the pass runs before autocast, on the exporter's f32 graph).
struct Target;  // compiler/target.h
std::unique_ptr<Pass> createFuseAttentionPass();  // for cuda, f32
std::unique_ptr<Pass> createFuseAttentionPass(const Target& target, DType compute = DType::f32);  // fuse_attention.cpp
// GELU written out op by op (tanh or erf form) -> one ampc.Gelu (backward: one ampc.GeluGrad).
std::unique_ptr<Pass> createFuseGeluPass();  // fuse_gelu.cpp
// Connected pointwise nodes of one result shape -> one ampc.Fused node (compiler/ops/pointwise.h).
// `excluded` keeps nodes out of every group (a backend's own folds claim them). `readsWidened`
// (user, operand) says which readers take a widening Cast's f32 result through the Cast (the
// backend reads its narrow operand): a member Cast read only so outside the group is recomputed
// in it rather than written.
// `alone` (node) makes a group of that one node anyway (an op the backend runs only as a generated
// kernel).
std::unique_ptr<Pass> createFuseElementwisePass(std::function<bool(const Node&)> excluded = {},
                                                std::function<bool(const Node&, size_t)> readsWidened = {},
                                                std::function<bool(const Node&)> alone = {});  // fuse_elementwise.cpp
// A pointwise result read again far later is recomputed before those reads from operands live
// there anyway (passes/rematerialize.cpp); `excluded` nodes (claimed by a backend's folds) stay.
std::unique_ptr<Pass> createRematerializePass(std::function<bool(const Node&)> excluded = {}, bool paramCasts = false);  // rematerialize.cpp
// A widening Cast read only by a Transpose moves below it (passes/sink_casts.cpp).
std::unique_ptr<Pass> createSinkCastsPass();  // sink_casts.cpp
// A Transpose of a Transpose becomes one, or none where they undo each other; a Transpose of a
// Gemm, the Gemm with its operands swapped (fold_transposes.cpp).
std::unique_ptr<Pass> createFoldTransposesPass();  // fold_transposes.cpp
// An Identity that is not a graph output goes, its readers reading its operand (drop_identities.cpp).
std::unique_ptr<Pass> createDropIdentitiesPass();  // drop_identities.cpp
// Add(GatherGrad(dY, idx), X) becomes GatherGrad(dY, idx, X), a widening Cast in front of X read
// through (accumulate_gather_grads.cpp).
std::unique_ptr<Pass> createAccumulateGatherGradsPass();  // accumulate_gather_grads.cpp
// Rotary embeddings' rotate_half (Concat(Neg(Slice(x, h..2h)), Slice(x, 0..h)) on the last axis) becomes
// one ampc::RotateHalf (fuse_rotate_half.cpp).
std::unique_ptr<Pass> createFuseRotateHalfPass();  // fuse_rotate_half.cpp
// RMS normalisation written op by op (Llama, Mistral, Qwen, Gemma, T5, torch.nn.RMSNorm) becomes one
// ampc.RmsNorm where the target runs it (Target::rmsNorm); fuse_rms_norm.cpp.
std::unique_ptr<Pass> createFuseRmsNormPass(const Target& t);
// NegativeLogLikelihoodLoss as SoftmaxCrossEntropyLoss over its LogSoftmax's input, or as
// GatherElements, weights and a reduction (lower_nll.cpp).
std::unique_ptr<Pass> createLowerNllPass();  // lower_nll.cpp
std::unique_ptr<Pass> createDenseExpertsPass();  // dense_experts.cpp
// IsNaN and IsInf of a widening Cast read the Cast's operand (narrow_checks.cpp).
std::unique_ptr<Pass> createNarrowChecksPass();  // narrow_checks.cpp
// For a target whose convolutions pad both ends of a dim alike (Target::convPadsBothEnds): a Conv
// whose pads differ at a dim's two ends (explicit, or auto_pad SAME_* with an even window) reads a
// zero Pad of its input for the difference and pads both ends by the smaller amount (conv_pads.cpp).
std::unique_ptr<Pass> createConvPadsPass(const Target& t);  // conv_pads.cpp
// Shapes the target's kernels do not take, written as ones they do (target_shapes.cpp): a MatMul
// operand that broadcasts over part of the batch is expanded (Target::matmulWholeBatch); a Pad's
// negative amounts become a Slice in front of it (Target::padsNonNegative).
std::unique_ptr<Pass> createTargetShapesPass(const Target& t);  // target_shapes.cpp

// The CUDA target's lowering rewrites (runtime/lower.cpp), each making explicit target nodes
// ("cuda" domain) that the CPU reference runs too:
// ReduceSum(dY, axes [0]) beside its weight gradient's Gemm(X^T dY or dY^T X) becomes one
// cuda::Gemm whose second result is the bias gradient (fuse_bias_grad.cpp).
std::unique_ptr<Pass> createFuseBiasGradPass();  // fuse_bias_grad.cpp
// The step's parameter casts (f32 -> f16/bf16 of a parameter) become cuda::MultiCast nodes, one
// launch per group (fuse_param_casts.cpp).
std::unique_ptr<Pass> createFuseParamCastsPass();  // fuse_param_casts.cpp
// A batch norm with the residual Add and Relu after it, a LayerNormGrad with the residual Add after
// it, become cuda::BatchNormalization / cuda::LayerNormGrad nodes that write the sum (fuse_norm_epilogue.cpp).
std::unique_ptr<Pass> createFuseNormEpiloguePass();  // fuse_norm_epilogue.cpp
// BatchNormGrad of a ReLU's gradient Where(Greater(y, 0), dz, 0) becomes cuda::BatchNormGrad
// reading dz gated by y (fuse_relu_grad.cpp).
std::unique_ptr<Pass> createFuseReluGradPass();  // fuse_relu_grad.cpp
// Add(Cast(Dropout(x)) to f32, r) becomes cuda::Dropout writing r + the dropped x (fuse_dropout_residual.cpp).
std::unique_ptr<Pass> createFuseDropoutResidualPass();  // fuse_dropout_residual.cpp
// The cross-entropy loss keeps its rows' max and sum for the gradients over the same scores:
// cuda::SoftmaxCrossEntropyLoss's result 1, read by cuda::SoftmaxCrossEntropyLossGrad (keep_loss_stats.cpp).
std::unique_ptr<Pass> createKeepLossStatsPass();  // keep_loss_stats.cpp
// Fused attention reads and writes its operands where they lie (the head Transposes, the QKV
// Split and its gradient's Concat, a grouped-query repeat): cuda::Attention / cuda::AttentionGrad
// with layouts, where the target takes strided operands (attention_in_place.cpp).
std::unique_ptr<Pass> createAttentionInPlacePass(const Target& target);  // attention_in_place.cpp
// The loss scores and their gradient over rows that are not 16-byte multiples stored with a padded
// row pitch where only the padded GEMMs around them, their views, the loss and its gradient touch
// them: scores_pitch / grad_pitch on the gradient node (pitch_loss_scores.cpp).
std::unique_ptr<Pass> createPitchLossScoresPass(const Target& target);  // pitch_loss_scores.cpp
// The step's UnscaleCheck (and ClipByGlobalNorm) run inside the SGD / Adam nodes that read their
// results: fold = "optimizer" on each (fuse_grad_chain.cpp, passes/fuse_grad_chain.h).
std::unique_ptr<Pass> createFuseGradChainPass();  // fuse_grad_chain.cpp
// Consecutive SGD/Adam nodes that share op, attributes and lr/step/found run as one launch: group = K
// on each member (group_optimizers.cpp, passes/group_optimizers.h).
std::unique_ptr<Pass> createGroupOptimizersPass();  // group_optimizers.cpp
// A float comparison whose one use is a Where's condition runs in that Where: fold = "where" on it
// (fold_comparisons.cpp, passes/fold_comparisons.h).
std::unique_ptr<Pass> createFoldComparisonsPass();  // fold_comparisons.cpp
// The Casts the target's kernels do in their neighbours (a widening Cast read through by its
// readers, a narrowing one written by its producer or read by DropoutGrad): `fold` on each
// (fold_casts.cpp, passes/fold_casts.h).
std::unique_ptr<Pass> createFoldCastsPass(const Target& target);  // fold_casts.cpp

}  // namespace ampc
