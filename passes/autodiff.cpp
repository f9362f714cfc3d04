// autodiff: reverse-mode over the (possibly painted) forward graph, one gradient rule per op from
// the registry. Only values on a path from a trainable parameter to the loss get gradients;
// integer and bool values stop them. A value used several times sums its contributions (in FP32
// when any contribution is FP32, then in its own dtype). The gradient of a Cast is the reverse
// Cast, so low-precision forward ops get low-precision backward ops and parameter gradients
// arrive in FP32.
#include "passes/autodiff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "compiler/ops/geometry.h"
#include "compiler/ops/grad.h"
#include "compiler/ops/registry.h"

namespace ampc {
namespace {

// Values that depend on a trainable parameter through differentiable float edges.
std::unordered_set<const Value*> requiresGrad(const Graph& g, const std::vector<Value*>& params) {
  std::unordered_set<const Value*> req(params.begin(), params.end());
  for (const auto& n : g.nodes()) {
    const bool diff = !n->def() || n->def()->differentiable;
    if (!diff) continue;
    bool any = false;
    const uint32_t noGrad = noGradOperands(*n);
    for (size_t i = 0; i < n->numInputs(); ++i) {
      const Value* v = n->input(i);
      any |= v && req.count(v) && isFloat(v->type().dtype) && !(noGrad >> i & 1);
    }
    if (!any) continue;
    for (size_t i = 0; i < n->numResults(); ++i)
      if (isFloat(n->result(i)->type().dtype)) req.insert(n->result(i));
  }
  return req;
}

// Values the loss depends on through edges a gradient can cross: float operands of differentiable
// ops (and of custom ops, which autodiff then refuses by name) that are not no-grad operands. A
// value reaching the loss only through an integer tensor, a comparison or a straight-through
// estimator's held operand (fake quantization's scale) gets no gradient and is not trained.
std::unordered_set<const Value*> lossDeps(const Graph& g, const Value* loss) {
  std::unordered_set<const Value*> deps;
  if (isFloat(loss->type().dtype)) deps.insert(loss);
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const Node* n = it->get();
    bool live = false;
    for (size_t i = 0; i < n->numResults(); ++i) live |= deps.count(n->result(i)) != 0;  // deps holds float values only
    if (!live || (n->def() && !n->def()->differentiable)) continue;
    const uint32_t noGrad = noGradOperands(*n);
    for (size_t i = 0; i < n->numInputs(); ++i)
      if (const Value* v = n->input(i); v && isFloat(v->type().dtype) && !(noGrad >> i & 1)) deps.insert(v);
  }
  return deps;
}

std::unique_ptr<std::regex> optionRegex(const std::string& flag, const std::string& re) {
  if (re.empty()) return nullptr;
  try {
    return std::make_unique<std::regex>(re);
  } catch (const std::regex_error& e) {
    throw Error(flag + ": bad regex '" + re + "': " + e.what());
  }
}

bool allFinite(const Tensor& t) {
  if (t.type.dtype == DType::f32) {  // the common case: it scans every weight, so on the exponent bits
    const uint8_t* p = t.data.data();  // (a loop the compiler vectorizes), in blocks that stop early
    const int64_t n = t.numel();
    for (int64_t b = 0; b < n; b += 4096) {
      uint32_t bad = 0;
      const int64_t e = std::min<int64_t>(n, b + 4096);
      for (int64_t i = b; i < e; ++i) {
        uint32_t bits;
        std::memcpy(&bits, p + 4 * i, 4);
        bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      }
      if (bad) return false;
    }
    return true;
  }
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.getDouble(i))) return false;
  return true;
}

std::vector<Value*> candidates(const Graph& g, const AutodiffOptions& opts) {
  std::vector<Value*> r;
  for (const auto& p : paramPolicy(g, opts))
    if (p.candidate) r.push_back(p.param);
  return r;
}

}  // namespace

std::vector<ParamPolicy> paramPolicy(const Graph& g, const AutodiffOptions& opts) {
  const auto freeze = optionRegex("--freeze", opts.freeze);
  const auto only = optionRegex("--trainable", opts.trainable);
  std::unordered_set<std::string> listed;
  if (g.declaredTrainable) listed.insert(g.declaredTrainable->begin(), g.declaredTrainable->end());
  std::vector<ParamPolicy> r;
  for (Value* p : g.params()) {
    if (!isFloat(p->type().dtype)) continue;
    bool state = false;
    for (const Use& u : p->uses()) state |= u.user->def() && (u.user->def()->stateOperands >> u.operand & 1);
    if (state) r.push_back({p, false, "op state (" + p->uses()[0].user->op() + " statistics)"});
    else if (freeze && std::regex_match(p->name(), *freeze)) r.push_back({p, false, "--freeze"});
    else if (only) r.push_back({p, std::regex_match(p->name(), *only), std::regex_match(p->name(), *only) ? "--trainable" : "not matched by --trainable"});
    else if (g.declaredTrainable) r.push_back({p, listed.count(p->name()) != 0, listed.count(p->name()) ? "the model's ampc.trainable list" : "not in the model's ampc.trainable list (a buffer)"});
    else if (p->data() && !allFinite(*p->data())) r.push_back({p, false, "holds Inf or NaN (a mask buffer, not a parameter)"});
    else r.push_back({p, true, "a float initializer"});
  }
  return r;
}

std::vector<Value*> trainableParams(const Graph& g, const AutodiffOptions& opts) {
  if (g.outputs().empty()) return {};
  auto cand = candidates(g, opts);
  auto req = requiresGrad(g, cand);
  auto deps = lossDeps(g, g.outputs()[0]);
  // A candidate trains if some differentiable use of it reaches the loss.
  std::vector<Value*> r;
  for (Value* p : cand) {
    bool reaches = false;
    for (const Use& u : p->uses()) {
      const Node* n = u.user;
      if ((n->def() && !n->def()->differentiable) || (noGradOperands(*n) >> u.operand & 1)) continue;
      for (size_t i = 0; i < n->numResults(); ++i) reaches |= deps.count(n->result(i)) && req.count(n->result(i));
    }
    if (reaches) r.push_back(p);
  }
  return r;
}

std::vector<std::string> listedButUntrained(const Graph& g, const AutodiffOptions& opts) {
  if (!g.declaredTrainable || g.outputs().empty() || !opts.freeze.empty() || !opts.trainable.empty()) return {};
  const auto trained = trainableParams(g, opts);
  std::unordered_set<std::string> on;
  for (const Value* p : trained) on.insert(p->name());
  std::vector<std::string> r;
  for (const std::string& name : *g.declaredTrainable)
    if (!on.count(name)) r.push_back(name);
  return r;
}

namespace {

class AutodiffPass : public Pass {
 public:
  explicit AutodiffPass(AutodiffOptions o) : opts_(std::move(o)) {}
  std::string name() const override { return "autodiff"; }

  bool run(Graph& g) override {
    if (g.outputs().empty()) throw Error("autodiff: the graph has no outputs");
    Value* loss = g.outputs()[0];
    if (!isFloat(loss->type().dtype) || loss->type().numel() != 1)
      throw Error("autodiff: the first output '" + loss->name() + "' must be a scalar float loss, it is " + loss->type().str());
    const auto params = trainableParams(g, opts_);
    if (params.empty()) throw Error("autodiff: no trainable parameter reaches the loss");
    g.domainOpsets.emplace(kGradDomain, 1);
    const auto req = requiresGrad(g, params);
    const auto deps = lossDeps(g, loss);
    auto onPath = [&](const Value* v) { return req.count(v) && deps.count(v); };

    std::vector<Node*> forward;
    for (const auto& n : g.nodes()) forward.push_back(n.get());
    // Optional results the gradient rules read (Dropout's mask, MaxPool's Indices).
    for (Node* n : forward) {
      const OpDef* d = n->def();
      if (!d || !d->gradResults || static_cast<int>(n->numResults()) >= d->gradResults) continue;
      bool needed = false;
      for (size_t i = 0; i < n->numResults(); ++i) needed |= onPath(n->result(i));
      if (!needed) continue;
      while (static_cast<int>(n->numResults()) < d->gradResults)
        g.addResult(n, g.uniqueName(n->result(0)->name() + ".aux"), TensorType{});
      auto types = inferTypes(*n);
      for (size_t i = 0; i < n->numResults(); ++i) n->result(i)->setType(types[i]);
    }

    std::unordered_map<const Value*, std::vector<Value*>> contrib;
    if (opts_.seed.empty()) {
      contrib[loss].push_back(g.addConst(g.uniqueName(loss->name() + "_grad/seed"), Tensor::fromDoubles(loss->type().dtype, loss->type().shape, {1.0})));
    } else {
      Value* s = g.lookup(opts_.seed);
      if (!s || s->type().numel() != 1 || !isFloat(s->type().dtype)) throw Error("autodiff: the seed '" + opts_.seed + "' must be a float scalar");
      if (s->type().dtype != loss->type().dtype) {
        Node* c = g.createNode("Cast", "", {s}, {{g.uniqueName(s->name() + "." + std::string(dtypeName(loss->type().dtype))), TensorType{loss->type().dtype, s->type().shape}}});
        c->setAttr("to", static_cast<int64_t>(dtypeToOnnx(loss->type().dtype)));
        s = c->result(0);
      }
      if (s->type().shape != loss->type().shape) {
        Node* r = g.createNode("Reshape", "", {s, g.addConst(g.uniqueName(s->name() + "/shape"), Tensor::fromInts(DType::i64, {loss->type().rank()}, loss->type().shape))},
                               {{g.uniqueName(s->name() + ".as_loss"), loss->type()}});
        s = r->result(0);
      }
      contrib[loss].push_back(s);
    }
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      Node* n = *it;
      std::vector<Value*> dOut(n->numResults(), nullptr);
      bool any = false;
      for (size_t i = 0; i < n->numResults(); ++i) {
        auto c = contrib.find(n->result(i));
        if (c == contrib.end() || !onPath(n->result(i))) continue;
        dOut[i] = sum(g, n->result(i), c->second);
        any = true;
      }
      if (!any) continue;
      const OpDef* d = n->def();
      if (!d) throw Error(n->describe() + ": a custom op on the path to the loss has no gradient rule");
      if (!d->differentiable) continue;
      if (!d->grad) throw Error(n->describe() + ": the op is differentiable but has no gradient rule");
      std::vector<bool> needs(n->numInputs(), false);
      for (size_t i = 0; i < n->numInputs(); ++i)
        needs[i] = n->input(i) && req.count(n->input(i)) && isFloat(n->input(i)->type().dtype) && !(noGradOperands(*n) >> i & 1);
      GradBuilder b(g, *n, dOut, needs);
      d->grad(b);
      for (size_t i = 0; i < n->numInputs(); ++i) {
        if (!needs[i]) continue;
        if (b.grads()[i]) contrib[n->input(i)].push_back(b.grads()[i]);
        else if (!b.declaredZero(i))
          throw Error(n->describe() + ": operand " + std::to_string(i) + " ('" + n->input(i)->name() +
                      "') depends on a trained parameter, and ampc has no gradient for it through this op");
      }
    }

    std::vector<Value*> outs{loss};
    for (Value* p : params) {
      auto c = contrib.find(p);
      if (c == contrib.end()) continue;
      Value* grad = sum(g, p, c->second);
      const std::string name = g.uniqueName(p->name() + "_grad");
      if (grad->producer() && std::find(outs.begin(), outs.end(), grad) == outs.end() && grad->name() != loss->name()) {
        g.renameValue(grad, name);
      } else {
        grad = g.createNode("Identity", "", {grad}, {{name, grad->type()}})->result(0);
      }
      outs.push_back(grad);
    }
    g.clearOutputs();
    for (Value* v : outs) g.addOutput(v);
    createDcePass()->run(g);
    return true;
  }

 private:
  // The sum of a value's gradient contributions, in FP32 if any is FP32, returned in the value's
  // own dtype.
  static Value* sum(Graph& g, const Value* v, std::vector<Value*>& parts) {
    concatTiles(g, v, parts);
    if (parts.size() == 1 && parts[0]->type().dtype == v->type().dtype) return parts[0];
    DType acc = parts[0]->type().dtype;
    for (Value* p : parts)
      if (p->type().dtype != acc) acc = DType::f32;
    auto castTo = [&](Value* x, DType t) {
      if (x->type().dtype == t) return x;
      Node* c = g.createNode("Cast", "", {x}, {{g.uniqueName(x->name() + "." + std::string(dtypeName(t))), TensorType{t, x->type().shape}}});
      c->setAttr("to", static_cast<int64_t>(dtypeToOnnx(t)));
      return c->result(0);
    };
    Value* s = castTo(parts[0], acc);
    for (size_t i = 1; i < parts.size(); ++i) {
      Node* add = g.createNode("Add", "", {s, castTo(parts[i], acc)}, {{g.uniqueName(v->name() + "_grad/sum"), TensorType{acc, v->type().shape}}});
      s = add->result(0);
    }
    Value* r = castTo(s, v->type().dtype);
    parts = {r};
    return r;
  }

  // Slices that tile a value along one axis (torch.roll's two, chunk and split written as Slices):
  // their gradients, each a SliceGrad that zero-fills the whole value and places its dY, are
  // summed by Adds, reading and writing the whole value once per slice. Where such SliceGrads of
  // one dtype, step 1, cover disjoint ranges of one axis that together make the whole axis (all
  // other dims whole), their sum is the Concat of their dYs in the ranges' order: the same values,
  // one copy. Replaces them in `parts` by that Concat.
  static void concatTiles(Graph& g, const Value* v, std::vector<Value*>& parts) {
    struct Tile {
      size_t part;
      int64_t begin, end;
    };
    const auto& shape = v->type().shape;
    std::map<std::pair<int64_t, DType>, std::vector<Tile>> byAxis;
    for (size_t i = 0; i < parts.size(); ++i) {
      const Node* n = parts[i]->producer();
      if (!n || n->domain() != kGradDomain || n->op() != "SliceGrad" || parts[i]->type().shape != shape || parts[i]->uses().size() > 0) continue;
      std::vector<std::vector<int64_t>> c(4);
      bool known = true;
      for (size_t k = 1; k < n->numInputs() && k < 5; ++k) {
        const Tensor* t = n->input(k) ? n->input(k)->constData() : nullptr;
        if (n->input(k) && !t) known = false;
        if (t) c[k - 1] = t->toInts();
      }
      if (!known || n->numInputs() < 3) continue;
      SliceSpec sp;
      try {
        sp = sliceSpecOf(shape, c[0], c[1], c[2], c[3]);
      } catch (const Error&) {
        continue;
      }
      int64_t axis = -1;
      bool ok = true;
      for (size_t d = 0; d < shape.size() && ok; ++d) {
        if (sp.start[d] == 0 && sp.out[d] == shape[d] && (sp.step[d] == 1 || shape[d] <= 1)) continue;
        ok = axis < 0 && sp.step[d] == 1 && sp.out[d] > 0;
        axis = static_cast<int64_t>(d);
      }
      if (!ok || axis < 0) continue;
      byAxis[{axis, parts[i]->type().dtype}].push_back({i, sp.start[axis], sp.start[axis] + sp.out[axis]});
    }
    std::vector<bool> drop(parts.size(), false);
    std::vector<Value*> concats;
    for (auto& [key, tiles] : byAxis) {
      if (tiles.size() < 2) continue;
      std::sort(tiles.begin(), tiles.end(), [](const Tile& a, const Tile& b) { return a.begin < b.begin; });
      int64_t at = 0;
      for (const Tile& t : tiles) at = t.begin == at ? t.end : -1;
      if (at != shape[key.first]) continue;  // a gap, an overlap, or short of the end
      std::vector<Value*> ins;
      for (const Tile& t : tiles) {
        ins.push_back(parts[t.part]->producer()->input(0));
        drop[t.part] = true;
      }
      Node* c = g.createNode("Concat", "", ins, {{g.uniqueName(v->name() + "_grad/tiles"), TensorType{key.second, shape}}});
      c->setAttr("axis", key.first);
      concats.push_back(c->result(0));
    }
    if (concats.empty()) return;
    std::vector<Value*> kept;
    for (size_t i = 0; i < parts.size(); ++i)
      if (!drop[i]) kept.push_back(parts[i]);
    kept.insert(kept.end(), concats.begin(), concats.end());
    parts = kept;
  }

  AutodiffOptions opts_;
};

}  // namespace

std::unique_ptr<Pass> createAutodiffPass(const AutodiffOptions& opts) { return std::make_unique<AutodiffPass>(opts); }

}  // namespace ampc
