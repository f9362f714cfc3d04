// The step graph as a target runs it (runtime/plan.h, lowerStep): for CUDA, the target rewrites,
// pointwise groups fused into generated kernels, and last the casts folded into their neighbours.
#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "compiler/ir/text.h"
#include "compiler/ops/pointwise.h"
#include "compiler/target.h"
#include "passes/fold_casts.h"
#include "passes/fold_comparisons.h"
#include "passes/fuse_grad_chain.h"
#include "passes/group_optimizers.h"
#include "passes/pass.h"
#include "passes/pitch_loss_scores.h"
#include "runtime/folds.h"
#include "runtime/plan.h"

namespace ampc {
namespace {

bool pointwise(const Node* n) { return n && pointwiseFormula(*n) && n->numResults() == 1; }

// Casts a fold runs inside a non-pointwise neighbour (a layer norm, a loss, a dropout's gradient,
// UnscaleCheck, a Transpose): fusing them would write what the fold never writes. Between pointwise
// ops the group does the same work in registers.
bool claimedByFold(const Graph& g, const Node& n, const Target& t) {
  switch (foldableCast(g, n, t)) {
    case CastFold::GradReader: return true;
    case CastFold::Producer: return !pointwise(n.input(0)->producer());
    case CastFold::Readers:
      for (const Use& u : n.result(0)->uses())
        if (!pointwise(u.user)) return true;
      return false;
    case CastFold::None: break;
  }
  return false;
}

// A fused group's body with its values renamed in order, its nodes unnamed and only the domains it
// uses: two groups with the same text generate the same kernel (the body's text is all the
// generator reads, its constants inline), however their values were named.
std::string canonicalBody(const Node& fused) {
  const Attribute* attr = fused.attr("body");
  const auto* text = attr ? std::get_if<std::string>(attr) : nullptr;
  if (!text) return "\x02" + fused.name();  // no body to compare (the generator names the fault): its own
  std::unique_ptr<Graph> g;
  try {
    g = parseGraph(*text, "canonical");
  } catch (const Error&) {
    return "\x02" + fused.name();  // a bad body: the generator names it
  }
  std::vector<Value*> all;
  for (const auto* list : {&g->inputs(), &g->params(), &g->consts()}) all.insert(all.end(), list->begin(), list->end());
  for (const auto& n : g->nodes()) {
    n->setName("");
    for (size_t r = 0; r < n->numResults(); ++r) all.push_back(n->result(r));
  }
  // Through names no body has, so that no new name meets an old one.
  for (size_t i = 0; i < all.size(); ++i) g->renameValue(all[i], "\x01" + std::to_string(i));
  for (size_t i = 0; i < all.size(); ++i) g->renameValue(all[i], "v" + std::to_string(i));
  // Only the domains its nodes use (a body keeps the domains its graph had imported when it was cut).
  std::map<std::string, int> used;
  for (const auto& n : g->nodes())
    if (auto d = g->domainOpsets.find(n->domain()); d != g->domainOpsets.end()) used.insert(*d);
  g->domainOpsets = used;
  return printGraph(*g);
}

}  // namespace

MemoryPlan planCudaMemory(const Graph& step, folds::Schedule* sched, std::map<const Value*, int64_t>* pitches) {
  checkCastFolds(step, findTarget("cuda"));
  checkGradChain(step);
  checkComparisonFolds(step);
  checkOptimizerGroups(step);
  folds::Schedule s = folds::schedule(step);
  const auto pitch = pitchedValues(step);
  std::map<const Value*, int64_t> bytes;
  for (const auto& [v, p] : pitch) bytes[v] = v->type().numel() / v->type().shape.back() * p * static_cast<int64_t>(dtypeSize(v->type().dtype));
  MemoryPlan plan = planMemory(step, s.positions, s.unwritten, s.extraReads, bytes, s.inPlace);
  if (sched) *sched = std::move(s);
  if (pitches) *pitches = pitch;
  return plan;
}

void recordFolds(Graph& step) {
  createFuseGradChainPass()->run(step);
  createFoldComparisonsPass()->run(step);
  createGroupOptimizersPass()->run(step);
  createFoldCastsPass(findTarget("cuda"))->run(step);
}

int lowerStep(Graph& step, const TrainOptions& opts, const KernelGenerator& generate) {
  if (opts.target != "cuda") return 0;
  const Target& cuda = findTarget("cuda");
  for (const auto& n : step.nodes())  // (a node of constants only is computed on the CPU at load)
    if (std::string why = cuda.refusal && !allConstInputs(*n) ? cuda.refusal(*n) : std::string(); !why.empty())
      throw Error(n->describe() + ": " + why);
  std::set<const Node*> claimed;
  auto claim = [&] {
    claimed.clear();
    for (const auto& n : step.nodes())
      if (claimedByFold(step, *n, cuda)) claimed.insert(n.get());
  };
  createDropIdentitiesPass()->run(step);
  createAccumulateGatherGradsPass()->run(step);
  createFoldTransposesPass()->run(step);
  createSinkCastsPass()->run(step);
  createFuseBiasGradPass()->run(step);
  createFuseNormEpiloguePass()->run(step);
  createFuseReluGradPass()->run(step);
  createFuseDropoutResidualPass()->run(step);
  createKeepLossStatsPass()->run(step);
  createAttentionInPlacePass(cuda)->run(step);
  if (opts.rematerialize) {
    claim();
    createRematerializePass([&](const Node& n) { return claimed.count(&n) != 0; }, opts.rematerializeParamCasts)->run(step);
  }
  if (!opts.fuseElementwise) {
    createFuseParamCastsPass()->run(step);
    createPitchLossScoresPass(cuda)->run(step);
    recordFolds(step);
    return 0;
  }
  claim();
  createFuseElementwisePass([&](const Node& n) { return claimed.count(&n) != 0; }, cuda.readsWidened,
                            [&](const Node& n) { return !cuda.pointwiseByHand(n); })
      ->run(step);
  createFuseParamCastsPass()->run(step);  // the parameter casts no group took
  // On the final graph: every node that touches the scores, and every reader of a Cast, is known.
  createPitchLossScoresPass(cuda)->run(step);
  recordFolds(step);
  std::vector<Node*> groups;
  for (const auto& n : step.nodes())
    if (n->domain() == "ampc" && n->op() == "Fused") groups.push_back(n.get());
  if (!generate) return static_cast<int>(groups.size());
  // Groups whose bodies differ only in names (an unrolled recurrence's steps, repeated layers)
  // share the first one's kernel, entry names included.
  std::vector<size_t> first(groups.size()), unique;
  std::map<std::string, size_t> byBody;
  for (size_t i = 0; i < groups.size(); ++i) {
    first[i] = byBody.emplace(canonicalBody(*groups[i]), i).first->second;
    if (first[i] == i) unique.push_back(i);
  }
  // Each kernel in its own LLVM context: generated on several threads, attached in order.
  std::vector<std::optional<codegen::Kernel>> kernels(groups.size());
  std::vector<std::exception_ptr> errors(groups.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t u; (u = next++) < unique.size();) {
      const size_t i = unique[u];
      try {
        kernels[i] = generate(*groups[i], "ampc_fused_" + std::to_string(i));
      } catch (const codegen::NoLibdevice&) {
        // no kernel: amprun runs its ops one by one
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>(unique.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  int without = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (errors[first[i]]) std::rethrow_exception(errors[first[i]]);
    if (!kernels[first[i]]) {
      ++without;
      continue;
    }
    const codegen::Kernel& kernel = *kernels[first[i]];
    groups[i]->setAttr("ptx", kernel.ptx);
    groups[i]->setAttr("entry", kernel.name);
    if (kernel.vector > 1) {
      groups[i]->setAttr("vector_entry", kernel.vectorName);
      groups[i]->setAttr("vector", static_cast<int64_t>(kernel.vector));
    }
  }
  return without;
}

int expandFused(Graph& g, bool onlyWithoutKernel) {
  std::vector<Node*> fused;
  for (const auto& n : g.nodes())
    if (n->domain() == "ampc" && n->op() == "Fused" && (!onlyWithoutKernel || n->getString("ptx", "").empty())) fused.push_back(n.get());
  for (Node* f : fused) {
    const auto body = fusedBody(*f);
    std::map<const Value*, Value*> map;
    for (size_t i = 0; i < body->inputs().size(); ++i) map[body->inputs()[i]] = f->input(i);
    for (const Value* c : body->consts()) map[c] = g.addConst(g.uniqueName(f->name() + "/" + c->name()), *c->data());
    for (const auto& bn : body->nodes()) {
      std::vector<Value*> ins;
      for (const Value* v : bn->inputs()) ins.push_back(v ? map.at(v) : nullptr);
      std::vector<std::pair<std::string, TensorType>> results;
      for (size_t r = 0; r < bn->numResults(); ++r) results.emplace_back(g.uniqueName(bn->result(r)->name() + ".x"), bn->result(r)->type());
      Node* c = g.copyNode(*bn, ins, results, f);
      for (size_t r = 0; r < bn->numResults(); ++r) map[bn->result(r)] = c->result(r);
    }
    std::vector<std::string> names;
    for (size_t r = 0; r < f->numResults(); ++r) {
      names.push_back(f->result(r)->name());
      f->result(r)->replaceAllUsesWith(map.at(body->outputs()[r]));
    }
    g.eraseNode(f);
    for (size_t r = 0; r < names.size(); ++r) g.renameValue(map.at(body->outputs()[r]), names[r]);
  }
  if (!fused.empty()) g.bindOps();
  return static_cast<int>(fused.size());
}

}  // namespace ampc
