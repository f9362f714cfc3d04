// attach-loss: a model exported without its loss (the forward alone, as torch.onnx.export(model, x)
// or an inference export writes it) gets one, as `ampc --loss KIND` asks, so that it trains. The
// loss reads one output (the first, or the one named) and a new graph input of targets, and becomes
// the graph's only output (what only the other outputs read is dropped):
// - cross-entropy: PyTorch's F.cross_entropy, mean over the targets that are not ignore_index
//   (-100 by default), as ONNX's SoftmaxCrossEntropyLoss: int64 class indices, classes on axis 1 of
//   [N, C, d...]; with class axis -1 on the last axis (a language model's [B, T, V] logits), read as
//   [B T, V] against [B T] as transformers computes its loss (with shiftTargets, the logits at t
//   against the target at t + 1: a causal LM's labels are its input ids, shifted as transformers does);
// - mse, l1: F.mse_loss, F.l1_loss (mean over every element), targets of the output's shape;
// - bce-with-logits: F.binary_cross_entropy_with_logits (mean), targets of the output's shape, as
//   max(x, 0) - x t + log(1 + exp(-|x|)), the stable form PyTorch computes.
#include "passes/attach_loss.h"

#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {
namespace {

class AttachLossPass final : public Pass {
 public:
  explicit AttachLossPass(LossOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "attach-loss"; }
  bool run(Graph& g) override {
    if (g.outputs().empty()) throw Error("--loss: the graph has no output");
    Value* y = g.outputs()[0];
    if (!o_.output.empty()) {
      y = nullptr;
      for (Value* v : g.outputs())
        if (v->name() == o_.output) y = v;
      if (!y) {
        std::string names;
        for (const Value* v : g.outputs()) names += (names.empty() ? "" : ", ") + v->name();
        throw Error("--loss-output: the graph has no output '" + o_.output + "' (its outputs: " + names + ")");
      }
    }
    const TensorType yt = y->type();
    if (!isFloat(yt.dtype)) throw Error("--loss: output '" + y->name() + "' is " + yt.str() + ", not a float tensor");
    if (yt.rank() == 0)
      throw Error("--loss: output '" + y->name() + "' is already a scalar: the graph has its loss (drop --loss, or name another output with --loss-output)");
    if (g.lookup(o_.target)) throw Error("--loss-target: '" + o_.target + "' names a value the graph has; choose another name");
    const std::string base = "loss/";
    auto node = [&](const std::string& op, const std::vector<Value*>& ins, const TensorType& t, std::map<std::string, Attribute> attrs = {}) {
      Node* n = g.createNode(op, "", ins, {{g.uniqueName(base + op), t}});
      n->setName(g.uniqueName(base + op));
      for (auto& [k, a] : attrs) n->setAttr(k, std::move(a));
      return n->result(0);
    };
    auto ints = [&](const std::string& what, const std::vector<int64_t>& v) {
      return g.addConst(g.uniqueName(base + what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
    };
    const TensorType scalar{yt.dtype, {}};
    Value* loss = nullptr;
    if (o_.kind == "cross-entropy") {
      const int64_t r = yt.rank();
      if (r < 2) throw Error("--loss cross-entropy: output '" + y->name() + "' is " + yt.str() + "; it needs a batch and a class axis");
      int64_t axis = o_.classAxis < 0 ? o_.classAxis + r : o_.classAxis;
      if (axis != 1 && axis != r - 1)
        throw Error("--class-axis " + std::to_string(o_.classAxis) + ": the classes of " + yt.str() + " must be on axis 1 or the last");
      Value* scores = y;
      std::vector<int64_t> labels;
      if (axis == 1) {
        labels = yt.shape;
        labels.erase(labels.begin() + 1);
      } else {  // the last axis: [.., C] -> [prod, C]
        labels.assign(yt.shape.begin(), yt.shape.end() - 1);
        std::vector<int64_t> ys = yt.shape;
        Value* src = y;
        if (o_.shiftTargets) {  // the logits at t against the target at t + 1: logits[:, :-1]
          if (r != 3 || ys[1] < 2) throw Error("--shift-targets: the logits must be [B, T, V] with T >= 2, got " + yt.str());
          ys[1] -= 1;
          src = node("Slice", {y, ints("start", {0}), ints("end", {ys[1]}), ints("axis", {1})}, TensorType{yt.dtype, ys});
        }
        int64_t rows = 1;
        for (int64_t d = 0; d < r - 1; ++d) rows *= ys[static_cast<size_t>(d)];
        if (r > 2) scores = node("Reshape", {src, ints("rows", {rows, ys.back()})}, TensorType{yt.dtype, {rows, ys.back()}});
      }
      if (o_.shiftTargets && axis == 1) throw Error("--shift-targets reads a causal LM's [B, T, V] logits: it needs --class-axis -1");
      Value* t = g.addInput(o_.target, TensorType{DType::i64, labels});
      if (axis != 1 && r > 2) {
        if (o_.shiftTargets)  // target[:, 1:]
          t = node("Slice", {t, ints("start", {1}), ints("end", {labels[1]}), ints("axis", {1})}, TensorType{DType::i64, {labels[0], labels[1] - 1}});
        int64_t rows = scores->type().shape[0];
        t = node("Reshape", {t, ints("flat", {rows})}, TensorType{DType::i64, {rows}});
      }
      loss = node("SoftmaxCrossEntropyLoss", {scores, t}, scalar, {{"reduction", std::string("mean")}, {"ignore_index", o_.ignoreIndex}});
      if (o_.labelSmoothing != 0.0) {
        // PyTorch's label_smoothing e: (1 - e) nll + e (the mean over classes of -log p), both
        // averaged over the targets that are not ignored.
        if (!(o_.labelSmoothing > 0.0 && o_.labelSmoothing <= 1.0)) throw Error("--label-smoothing must be in (0, 1]");
        const TensorType st = scores->type();
        std::vector<int64_t> rowShape = st.shape;
        rowShape.erase(rowShape.begin() + 1);
        const TensorType rows{st.dtype, rowShape};
        Value* logp = node("LogSoftmax", {scores}, st, {{"axis", int64_t{1}}});
        Value* meanLogp = g.opset >= 18  // axes an input from opset 18, an attribute before
                              ? node("ReduceMean", {logp, ints("class_axis", {1})}, rows, {{"keepdims", int64_t{0}}})
                              : node("ReduceMean", {logp}, rows, {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}});
        Value* ignore = g.addConst(g.uniqueName(base + "ignore_index"), Tensor::fromInts(DType::i64, {}, {o_.ignoreIndex}));
        Value* valid = node("Cast", {node("Not", {node("Equal", {t, ignore}, TensorType{DType::boolean, t->type().shape})},
                                          TensorType{DType::boolean, t->type().shape})},
                            TensorType{st.dtype, t->type().shape}, {{"to", static_cast<int64_t>(dtypeToOnnx(st.dtype))}});
        Value* kept = node("ReduceSum", {node("Mul", {meanLogp, valid}, rows)}, scalar, {{"keepdims", int64_t{0}}});
        Value* count = node("ReduceSum", {valid}, scalar, {{"keepdims", int64_t{0}}});
        Value* smooth = node("Neg", {node("Div", {kept, count}, scalar)}, scalar);
        auto scaled = [&](Value* v, double f) { return node("Mul", {v, g.addConst(g.uniqueName(base + "factor"), Tensor::fromDoubles(st.dtype, {}, {f}))}, scalar); };
        loss = node("Add", {scaled(loss, 1.0 - o_.labelSmoothing), scaled(smooth, o_.labelSmoothing)}, scalar);
      }
    } else if (o_.kind == "mse" || o_.kind == "l1" || o_.kind == "bce-with-logits") {
      Value* t = g.addInput(o_.target, yt);
      Value* per = nullptr;
      if (o_.kind == "mse") {
        Value* d = node("Sub", {y, t}, yt);
        per = node("Mul", {d, d}, yt);
      } else if (o_.kind == "l1") {
        per = node("Abs", {node("Sub", {y, t}, yt)}, yt);
      } else {
        Value* soft = node("Softplus", {node("Neg", {node("Abs", {y}, yt)}, yt)}, yt);
        per = node("Add", {node("Sub", {node("Relu", {y}, yt), node("Mul", {y, t}, yt)}, yt), soft}, yt);
      }
      loss = node("ReduceMean", {per}, scalar, {{"keepdims", int64_t{0}}});
    } else {
      throw Error("--loss: unknown kind '" + o_.kind + "' (cross-entropy, mse, l1, bce-with-logits)");
    }
    g.renameValue(loss, g.uniqueName("loss"));
    g.clearOutputs();
    g.addOutput(loss);
    createDcePass()->run(g);
    return true;
  }

 private:
  LossOptions o_;
};

}  // namespace

std::unique_ptr<Pass> createAttachLossPass(const LossOptions& o) { return std::make_unique<AttachLossPass>(o); }

}  // namespace ampc
