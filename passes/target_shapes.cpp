// target-shapes: shapes a target's kernels do not take, written as ones they do, with the same
// values (and, since it runs before autodiff, the same gradients):
// - MatMul whose operand broadcasts over only part of the batch ([1, H, K, N] against [B, H, M, K])
//   for a target whose batched GEMM takes each operand as one matrix or all of the batch
//   (Target::matmulWholeBatch: cuBLASLt's single batch stride). That operand becomes an Expand to
//   the whole batch; autodiff sums its gradient back.
// - Pad with negative pads (a crop) in constant mode, for a target whose Pad takes only
//   non-negative amounts (Target::padsNonNegative): a Slice of the cropped ends, then a Pad of the
//   rest.
#include <algorithm>
#include <vector>

#include "compiler/ops/registry.h"
#include "compiler/target.h"
#include "passes/pass.h"

namespace ampc {
namespace {

const Tensor* constOf(const Node* n, size_t i) {
  const Value* v = i < n->numInputs() ? n->input(i) : nullptr;
  return v ? v->constData() : nullptr;
}

class TargetShapesPass final : public Pass {
 public:
  explicit TargetShapesPass(const Target& t) : target_(t) {}
  std::string name() const override { return "target-shapes"; }
  bool run(Graph& g) override {
    if (!target_.matmulWholeBatch && !target_.padsNonNegative) return false;
    std::vector<Node*> todo;
    for (const auto& up : g.nodes())
      if ((target_.matmulWholeBatch && isOnnxOp(up.get(), "MatMul")) || (target_.padsNonNegative && isOnnxOp(up.get(), "Pad")))
        todo.push_back(up.get());
    bool changed = false;
    for (Node* n : todo) changed |= n->op() == "MatMul" ? wholeBatch(g, n) : cropFirst(g, n);
    return changed;
  }

 private:
  const Target& target_;

  static std::string base(const Node* n) { return n->name().empty() ? n->result(0)->name() : n->name(); }

  static bool wholeBatch(Graph& g, Node* n) {
    const auto& as = n->input(0)->type().shape;
    const auto& bs = n->input(1)->type().shape;
    if (as.size() < 3 && bs.size() < 3) return false;  // no batch on either side
    const size_t ar = as.size() >= 2 ? as.size() - 2 : 0, br = bs.size() >= 2 ? bs.size() - 2 : 0, r = std::max(ar, br);
    std::vector<int64_t> batch(r, 1);
    for (size_t i = 0; i < r; ++i) {
      const int64_t x = i + ar >= r ? as[i + ar - r] : 1, z = i + br >= r ? bs[i + br - r] : 1;
      batch[i] = std::max(x, z);
    }
    bool changed = false;
    for (size_t k = 0; k < 2; ++k) {
      Value* v = n->input(k);
      const auto& s = v->type().shape;
      if (s.size() < 3) continue;
      const std::vector<int64_t> own(s.begin(), s.end() - 2);
      int64_t count = 1;
      for (int64_t d : own) count *= d;
      std::vector<int64_t> padded(r - own.size(), 1);
      padded.insert(padded.end(), own.begin(), own.end());
      if (count == 1 || padded == batch) continue;
      std::vector<int64_t> whole = batch;
      whole.insert(whole.end(), s.end() - 2, s.end());
      Value* shape = g.addConst(g.uniqueName(base(n) + ".batch"), Tensor::fromInts(DType::i64, {static_cast<int64_t>(whole.size())}, whole));
      Node* e = g.createNode("Expand", "", {v, shape}, {{g.uniqueName(v->name() + ".whole_batch"), TensorType{v->type().dtype, whole}}}, n);
      e->setName(base(n) + "/Expand" + std::to_string(k));
      n->setInput(k, e->result(0));
      changed = true;
    }
    return changed;
  }

  static bool cropFirst(Graph& g, Node* n) {
    if (n->getString("mode", "constant") != "constant") return false;
    const Tensor* p = constOf(n, 1);
    if (!p) return false;
    const auto& xs = n->input(0)->type().shape;
    const int64_t r = static_cast<int64_t>(xs.size());
    std::vector<int64_t> axes;
    if (n->numInputs() > 3 && n->input(3)) {
      const Tensor* a = constOf(n, 3);
      if (!a) return false;
      for (int64_t i = 0; i < a->numel(); ++i) axes.push_back(a->getInt(i) < 0 ? a->getInt(i) + r : a->getInt(i));
    } else {
      for (int64_t i = 0; i < r; ++i) axes.push_back(i);
    }
    const int64_t na = static_cast<int64_t>(axes.size());
    if (p->numel() != 2 * na) return false;  // (shape inference reports it)
    std::vector<int64_t> begin(static_cast<size_t>(r), 0), end(static_cast<size_t>(r), 0);
    bool negative = false;
    for (int64_t i = 0; i < na; ++i) {
      begin[static_cast<size_t>(axes[static_cast<size_t>(i)])] = p->getInt(i);
      end[static_cast<size_t>(axes[static_cast<size_t>(i)])] = p->getInt(na + i);
      negative |= p->getInt(i) < 0 || p->getInt(na + i) < 0;
    }
    if (!negative) return false;
    std::vector<int64_t> starts, ends, sliceAxes, cropped = xs, pads(static_cast<size_t>(2 * r), 0);
    for (int64_t d = 0; d < r; ++d) {
      const size_t u = static_cast<size_t>(d);
      const int64_t b = std::max<int64_t>(0, -begin[u]), e = std::max<int64_t>(0, -end[u]);
      if (b || e) {
        starts.push_back(b);
        ends.push_back(xs[u] - e);
        sliceAxes.push_back(d);
        cropped[u] = xs[u] - b - e;
      }
      pads[u] = std::max<int64_t>(0, begin[u]);
      pads[static_cast<size_t>(r) + u] = std::max<int64_t>(0, end[u]);
    }
    const std::string b = base(n);
    auto ints = [&](const char* what, const std::vector<int64_t>& v) {
      return g.addConst(g.uniqueName(b + "." + what), Tensor::fromInts(DType::i64, {static_cast<int64_t>(v.size())}, v));
    };
    Value* x = n->input(0);
    Node* s = g.createNode("Slice", "", {x, ints("starts", starts), ints("ends", ends), ints("axes", sliceAxes)},
                           {{g.uniqueName(x->name() + ".cropped"), TensorType{x->type().dtype, cropped}}}, n);
    s->setName(b + "/Slice");
    n->setInput(0, s->result(0));
    n->setInput(1, ints("pads", pads));
    if (n->numInputs() > 3) n->setInput(3, nullptr);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> createTargetShapesPass(const Target& t) { return std::make_unique<TargetShapesPass>(t); }

}  // namespace ampc
