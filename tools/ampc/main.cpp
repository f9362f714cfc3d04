// ampc: the compiler's front end.
//
//   ampc MODEL.onnx --emit text            print the IR after import
//   ampc MODEL.onnx --emit onnx -o OUT.onnx write the imported graph back as ONNX
//   ampc MODEL.onnx --summary              node counts, parameters, inputs and outputs
//   ampc MODEL.ir --passes dce --emit text run passes over the text form
//   ampc MODEL.onnx --eval --inputs DIR    evaluate on the CPU backend; writes OUTPUT.npy files
//
// Exit codes: 0 ok, 1 bad input, 2 bad usage.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <algorithm>
#include <set>
#include <sstream>

#include "compiler/target.h"
#include "compiler/ir/text.h"
#include "compiler/onnx/onnx.h"
#include "compiler/ops/registry.h"
#include "passes/attach_loss.h"
#include "passes/autocast.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/evaluator.h"
#include "runtime/plan.h"
#include "runtime/npy.h"

namespace fs = std::filesystem;
using namespace ampc;

namespace {

std::unique_ptr<Graph> load(const std::string& path, const ImportOptions& opts) {
  if (fs::path(path).extension() == ".ir") {
    std::ifstream in(path);
    if (!in) throw Error(path + ": no such file");
    std::stringstream ss;
    ss << in.rdbuf();
    auto g = parseGraph(ss.str(), path);
    try {
      verify(*g);
    } catch (const Error& e) {
      throw Error(path + ": " + e.what());
    }
    return g;
  }
  return importOnnxFile(path, opts);
}

void writeAtomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text) || !out.flush()) {
      std::remove(tmp.c_str());
      throw Error(path + ": cannot write");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(path + ": rename failed: " + ec.message());
}

void printSummary(const Graph& g, const AutodiffOptions& ad) {
  std::map<std::string, int> counts;
  for (const auto& n : g.nodes()) counts[n->qualifiedOp()]++;
  fmt::print("graph '{}' opset {}: {} nodes\n", g.name, g.opset, g.numNodes());
  for (const auto& [op, c] : counts) fmt::print("  {:<28} {}\n", op, c);
  int64_t elems = 0, bytes = 0;
  for (const Value* p : g.params()) {
    elems += p->type().numel();
    bytes += static_cast<int64_t>(p->type().bytes());
  }
  fmt::print("params: {} tensors, {} elements, {} bytes\n", g.params().size(), elems, bytes);
  for (const Value* v : g.inputs()) fmt::print("input  {} : {}\n", v->name(), v->type().str());
  for (const Value* v : g.outputs()) fmt::print("output {} : {}\n", v->name(), v->type().str());
  // What a plan trains, and why each other float initializer is frozen.
  if (g.outputs().empty()) return;
  const auto trained = trainableParams(g, ad);
  const std::set<const Value*> on(trained.begin(), trained.end());
  int64_t trainedElems = 0;
  for (const Value* p : trained) trainedElems += p->type().numel();
  fmt::print("trained: {} tensors, {} elements{}\n", trained.size(), trainedElems,
             g.declaredTrainable ? " (the model lists its trainable parameters: ampc.trainable)" : "");
  for (const auto& p : paramPolicy(g, ad)) {
    const bool t = on.count(p.param) != 0;
    const std::string why = t ? p.why : p.candidate ? "no differentiable path to the loss" : p.why;
    fmt::print("  {} {} : {}  ({})\n", t ? "train " : "frozen", p.param->name(), p.param->type().str(), why);
  }
}

// A file name for a value name: characters a path cannot hold become '_'.
std::string fileNameFor(const std::string& name) {
  std::string s = name;
  for (char& ch : s)
    if (ch == '/' || ch == '\\' || ch == ':' || ch == '\0') ch = '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

struct EvalArgs {
  std::string inputs, outputs = ".";
  std::string values;  // a regex: intermediate values written beside the outputs
  bool noDropout = false;
  uint64_t seed = 0;
};

// --eval: reads DIR/NAME.npy for each graph input, runs the CPU backend, writes OUTPUT.npy files.
void runEval(Graph& g, const EvalArgs& a) {
  if (!a.values.empty()) {
    std::regex re;
    try {
      re = std::regex(a.values);
    } catch (const std::regex_error& e) {
      throw Error("--eval-values: '" + a.values + "' is not a regex: " + e.what());
    }
    size_t added = 0;
    for (const auto& n : g.nodes())
      for (size_t r = 0; r < n->numResults(); ++r)
        if (Value* v = n->result(r); std::regex_search(v->name(), re) && !g.isOutput(v)) {
          g.addOutput(v);
          ++added;
        }
    if (added == 0) throw Error("--eval-values: no value's name matches '" + a.values + "'");
  }
  std::map<std::string, Tensor> feeds;
  for (const Value* v : g.inputs()) {
    const std::string path = (fs::path(a.inputs) / (fileNameFor(v->name()) + ".npy")).string();
    if (!fs::exists(path)) throw Error(path + ": missing: graph input '" + v->name() + "' (" + v->type().str() + ") is read from it");
    Tensor t = readNpy(path);
    if (t.type.shape != v->type().shape)
      throw Error(path + ": shape " + t.type.str() + " does not match graph input '" + v->name() + "' " + v->type().str());
    if (t.type.dtype != v->type().dtype) {
      if (isFloat(t.type.dtype) != isFloat(v->type().dtype))
        throw Error(path + ": dtype " + std::string(dtypeName(t.type.dtype)) + " does not match graph input '" + v->name() + "' " + v->type().str());
      t = cpu::castTensor(t, v->type().dtype);
    }
    feeds.emplace(v->name(), std::move(t));
  }
  auto backend = createCpuBackend();
  ExecOptions opts;
  opts.seed = a.seed;
  opts.dropout = !a.noDropout;
  auto outs = evaluate(g, feeds, *backend, opts);
  fs::create_directories(a.outputs);
  for (size_t i = 0; i < outs.size(); ++i) {
    const Value* v = g.outputs()[i];
    const std::string path = (fs::path(a.outputs) / (fileNameFor(v->name()) + ".npy")).string();
    writeNpy(path, outs[i]);
    if (outs[i].numel() == 1) fmt::print("{} : {} = {:.9g} -> {}\n", v->name(), v->type().str(), outs[i].getDouble(0), path);
    else fmt::print("{} : {} -> {}\n", v->name(), v->type().str(), path);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ampc: ahead-of-time mixed-precision training compiler for ONNX"};
  std::string model, emit, out, passes;
  std::vector<std::string> shapes;
  bool summary = false;
  app.add_option("model", model, "ONNX model (.onnx) or IR text (.ir)")->required();
  app.add_option("--emit", emit, "write the graph: text (IR) or onnx")->check(CLI::IsMember({"text", "onnx"}));
  app.add_option("-o,--output", out, "output file (--emit onnx needs it; text goes to stdout without it)");
  app.add_flag("--summary", summary, "print node counts per op, parameters, inputs and outputs");
  app.add_option("--input-shape", shapes, "fix an input's dims: NAME=2x3x32x32 (repeatable)");
  std::vector<std::string> binds, paddings;
  app.add_option("--bind", binds, "make a graph input a compile-time constant: NAME=FILE.npy (repeatable)");
  app.add_option("--embedding-padding", paddings,
                 "TABLE=ROW: the embedding table TABLE has nn.Embedding's padding_idx ROW, whose lookups pass no gradient (repeatable)");
  bool straightThrough = false;
  app.add_flag("--straight-through", straightThrough,
               "read each a + (b - a) as the straight-through estimator a + (b - a).detach() (the exporters drop detach())");
  app.add_option("--passes", passes, "comma-separated passes to run after import (infer-shapes, fold-constants, dce, cse)");
  std::string precision, ampConfig, fp32Ops, fp32Nodes, reportJsonPath;
  bool report = false;
  app.add_option("--precision", precision, "autocast to this low precision: fp16, bf16, or fp32 (autocast off)")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  app.add_option("--amp-config", ampConfig, "autocast policy overrides (JSON; see the README)");
  app.add_option("--fp32-ops", fp32Ops, "comma-separated ops that always run FP32 (moved to the deny list)");
  app.add_option("--fp32-nodes", fp32Nodes, "a regex: nodes whose name matches run FP32");
  app.add_flag("--report", report, "print one row per node: precision and the rule that decided it, then totals");
  app.add_option("--report-json", reportJsonPath, "write the report as JSON to this file");
  bool grad = false;
  AutodiffOptions adOpts;
  app.add_flag("--grad", grad, "build the backward graph: outputs become the loss and one <param>_grad per trainable parameter");
  LossOptions loss;
  app.add_option("--loss", loss.kind,
                 "a model exported without its loss: attach one to its first output (or --loss-output) against a new input of "
                 "targets (--loss-target, default 'target'): cross-entropy (int64 classes, as F.cross_entropy), mse, l1, bce-with-logits")
      ->check(CLI::IsMember({"cross-entropy", "mse", "l1", "bce-with-logits"}));
  app.add_option("--loss-output", loss.output, "--loss: the output it reads (default: the first)");
  app.add_option("--loss-target", loss.target, "--loss: the name of the new input of targets (default: target)");
  app.add_option("--class-axis", loss.classAxis, "--loss cross-entropy: the class axis, 1 ([N, C, ...], the default) or -1 (the last: a language model's [B, T, V])");
  app.add_flag("--shift-targets", loss.shiftTargets,
               "--loss cross-entropy --class-axis -1: the logits at position t are scored against the target at t + 1, so a causal LM's "
               "target is its input ids, shifted as transformers shifts its labels");
  app.add_option("--label-smoothing", loss.labelSmoothing, "--loss cross-entropy: PyTorch's label_smoothing (0: none)");
  app.add_option("--ignore-index", loss.ignoreIndex, "--loss cross-entropy: a target class that adds nothing to the loss (default -100, as PyTorch)");
  app.add_option("--freeze", adOpts.freeze, "--grad and plans: parameters whose name matches this regex are not trained");
  app.add_option("--trainable", adOpts.trainable,
                 "--grad and plans: train exactly the parameters whose name matches this regex (over the model's ampc.trainable list)");
  std::string batchNorm = "auto";
  app.add_option("--batchnorm", batchNorm,
                 "inference-form BatchNormalization of a training graph: auto (batch statistics, as PyTorch's train(), unless the graph "
                 "also holds training-form ones: then they are frozen eval() submodules), train (batch statistics for all) or as-exported")
      ->check(CLI::IsMember({"auto", "train", "as-exported"}));
  // Training plan (the default output): optimizer, schedule, clipping, loss scaling.
  TrainOptions train;
  std::string betas, lossScale = "auto";
  app.add_option("--optimizer", train.optimizer, "plan: sgd, adam, adamw or lamb")->check(CLI::IsMember({"sgd", "adam", "adamw", "lamb"}));
  bool noFuse = false;
  app.add_flag("--no-fuse", noFuse,
               "plans and --grad: keep attention, GELU, SiLU, linear layers and attention's heads as the model wrote them (no "
               "ampc.Attention, ampc.Gelu, ampc.Silu, nor a dynamo export's MatMul(X, Transpose(W)) + bias as one Gemm, nor q, k, v "
               "unbound from a permute as a Split)");
  bool noFuseRmsNorm = false;
  app.add_flag("--no-fuse-rms-norm", noFuseRmsNorm,
               "plans and --grad: keep RMS normalisation as the model wrote it (mean of squares, rsqrt, products) instead of one "
               "ampc.RmsNorm");
  bool noFuseElementwise = false;
  app.add_flag("--no-fuse-elementwise", noFuseElementwise,
               "plans and --train: keep the CUDA target's pointwise groups as separate ops (no ampc.Fused, no generated kernels)");
  bool noRemat = false;
  app.add_flag("--no-remat", noRemat,
               "plans and --train: hold every activation the backward reads (the CUDA target otherwise recomputes a pointwise "
               "result or batch norm read again far later, as GELU's and SiLU's outputs, from operands live there anyway)");
  bool noRematCasts = false;
  app.add_flag("--no-remat-casts", noRematCasts,
               "plans and --train: hold the forward's low-precision weight copies for the backward (the CUDA target otherwise "
               "casts the weights again where the backward reads them: less memory, one more read of the weights)");
  bool trainStep = false;
  app.add_option("--target", train.target,
                 "plan: the backend to plan for: cuda (the default; such plans also run on the CPU) or cpu (fused attention at any head "
                 "dim; CPU only)")
      ->check(CLI::IsMember(targetNames()));
  app.add_flag("--train", trainStep, "apply the training step (with the plan flags) before --emit text/onnx, to see it");
  bool kernels = false, memory = false;
  app.add_flag("--memory", memory,
               "with --train: explain the CUDA memory plan of the step (the values live at its peak, by the op that made them; "
               "what amprun allocates at load)");
  app.add_flag("--kernels", kernels,
               "with --emit text: fuse the graph's pointwise groups for the target (as plans do; after --train if given) and generate "
               "their kernels (each ampc::Fused node's ptx and entry attributes)");
  app.add_option("--lr", train.lr, "plan: learning rate (default 0.01)");
  app.add_option("--schedule", train.schedule,
                 "plan: constant, linear-warmup (then constant), cosine (the warmup, then to 0 at --total-steps) or linear (the warmup, "
                 "then linearly to 0 at --total-steps, transformers' default)")
      ->check(CLI::IsMember({"constant", "linear-warmup", "cosine", "linear"}));
  app.add_option("--warmup", train.warmup, "plan: warmup steps");
  app.add_option("--total-steps", train.total, "plan: the cosine schedule's length");
  app.add_option("--momentum", train.momentum, "plan: SGD momentum");
  app.add_flag("--nesterov", train.nesterov, "plan: Nesterov momentum");
  app.add_option("--weight-decay", train.weightDecay, "plan: weight decay (AdamW: decoupled)");
  app.add_option("--no-decay", train.noDecay,
                 "plan: parameters without weight decay: 1d (biases and normalisation scales, as timm, nanoGPT and transformers' Trainer "
                 "leave them out) or a regex on their names");
  app.add_option("--betas", betas, "plan: Adam betas B1,B2 (default 0.9,0.999)");
  app.add_option("--eps", train.eps, "plan: Adam epsilon");
  app.add_option("--clip-norm", train.clipNorm, "plan: clip the unscaled gradients' global L2 norm to this");
  app.add_option("--ema", train.ema,
                 "plan: keep an exponential moving average of the parameters with this decay (e.g. 0.9998, as timm's ModelEmaV2), "
                 "updated on every optimizer step; amprun --save-ema writes it");
  app.add_option("--accumulate", train.accumulate,
                 "plan: gradient accumulation: each optimizer step applies the mean gradient of this many micro-batches (amprun feeds them "
                 "one after another; the loss scale holds within a step)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--loss-scale", lossScale, "plan: dynamic, none or a number (default: dynamic for fp16, none otherwise)");
  app.add_option("--init-scale", train.initScale, "plan: the dynamic scale's start (65536)");
  app.add_option("--growth-factor", train.growthFactor, "plan: scale growth (2)");
  app.add_option("--backoff-factor", train.backoffFactor, "plan: scale backoff on overflow (0.5)");
  app.add_option("--growth-interval", train.growthInterval, "plan: finite steps between growths (2000)");
  app.add_option("--hysteresis", train.hysteresis, "plan: consecutive overflows before a backoff (1)");
  app.add_option("--min-scale", train.minScale, "plan: lower bound of the scale (0: none)");
  app.add_option("--max-scale", train.maxScale, "plan: upper bound of the scale (0: none)");
  bool eval = false;
  EvalArgs evalArgs;
  std::string precisionRun;
  app.add_flag("--eval", eval, "evaluate the graph on the CPU backend and write each output as NAME.npy");
  app.add_option("--inputs", evalArgs.inputs, "--eval: folder with one NAME.npy per graph input");
  app.add_option("--outputs", evalArgs.outputs, "--eval: folder for the outputs (default: .)");
  app.add_option("--precision-run", precisionRun, "--eval: run the whole graph in this dtype")
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16"}));
  std::string precisionRunExcept;
  app.add_option("--precision-run-except", precisionRunExcept,
                 "--precision-run: nodes whose name matches this regex run in the model's own dtypes (operands cast back, "
                 "results cast to the run's): which op's rounding matters");
  app.add_option("--eval-values", evalArgs.values, "--eval: also write the intermediate values whose name matches this regex");
  app.add_flag("--no-dropout", evalArgs.noDropout, "--eval: Dropout is the identity (to compare with a framework)");
  app.add_option("--seed", evalArgs.seed, "--eval: Dropout's random seed (default 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  if (eval && evalArgs.inputs.empty()) {
    std::cerr << "ampc: --eval needs --inputs DIR\n";
    return 2;
  }
  if (emit == "onnx" && out.empty()) {
    std::cerr << "ampc: --emit onnx needs -o OUT.onnx\n";
    return 2;
  }
  if (memory && !trainStep) {
    std::cerr << "ampc: --memory explains the training step's memory plan: it needs --train\n";
    return 2;
  }
  if (kernels && emit != "text") {
    std::cerr << "ampc: --kernels shows the generated kernels: it needs --emit text\n";
    return 2;
  }
  try {
    ImportOptions opts;
    opts.batchNormAsExported = batchNorm == "as-exported";
    opts.batchNormTrainAll = batchNorm == "train";
    opts.straightThrough = straightThrough;
    for (const auto& s : shapes) {
      auto eq = s.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "ampc: --input-shape wants NAME=2x3x32x32, got '" << s << "'\n";
        return 2;
      }
      try {
        opts.inputShapes[s.substr(0, eq)] = parseShapeSpec(s.substr(eq + 1));
      } catch (const Error& e) {
        std::cerr << "ampc: --input-shape: " << e.what() << "\n";
        return 2;
      }
    }
    for (const auto& b : binds) {
      auto eq = b.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "ampc: --bind wants NAME=FILE.npy, got '" << b << "'\n";
        return 2;
      }
      opts.constInputs[b.substr(0, eq)] = readNpy(b.substr(eq + 1));
    }
    for (const auto& p : paddings) {
      const auto eq = p.find('=');
      int64_t row = -1;
      size_t used = 0;
      try {
        if (eq != std::string::npos && eq > 0) row = std::stoll(p.substr(eq + 1), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (eq == std::string::npos || eq == 0 || used == 0 || used != p.size() - eq - 1 || row < 0) {
        std::cerr << "ampc: --embedding-padding wants TABLE=ROW (a row number), got '" << p << "'\n";
        return 2;
      }
      opts.embeddingPadding[p.substr(0, eq)] = row;
    }
    if (!precisionRunExcept.empty() && precisionRun.empty()) {
      std::cerr << "ampc: --precision-run-except needs --precision-run\n";
      return 2;
    }
    if (!evalArgs.values.empty() && !eval) {
      std::cerr << "ampc: --eval-values needs --eval\n";
      return 2;
    }
    PassManager pm;
    if (!loss.kind.empty()) pm.add(createAttachLossPass(loss));
    try {
      pm.addPipeline(passes);
      if (!precisionRun.empty()) pm.add(createConvertPrecisionPass(*dtypeFromName(precisionRun), precisionRunExcept));
    } catch (const Error& e) {
      std::cerr << "ampc: --passes: " << e.what() << "\n";
      return 2;
    }
    // Autocast runs when a precision, a policy or a report is asked for (default fp16).
    // With no other output asked for, ampc writes a training plan, at fp16 unless told otherwise.
    const bool plan = emit.empty() && !summary && !eval && !grad && !trainStep && !report && reportJsonPath.empty() &&
                      passes.empty() && fs::path(model).extension() != ".ir";
    if (plan && precision.empty()) precision = "fp16";
    const bool amp = !precision.empty() || !ampConfig.empty() || !fp32Ops.empty() || !fp32Nodes.empty() || report ||
                     !reportJsonPath.empty();
    AutocastOptions ampOpts;
    try {
      if (!ampConfig.empty()) {
        std::ifstream in(ampConfig);
        if (!in) throw Error(ampConfig + ": no such file");
        std::stringstream ss;
        ss << in.rdbuf();
        ampOpts = parseAmpConfig(ss.str(), ampConfig);
      }
      if (!precision.empty()) ampOpts.low = parsePrecision(precision);
      std::stringstream ops(fp32Ops);
      for (std::string op; std::getline(ops, op, ',');) {
        if (op.empty()) continue;
        if (!std::any_of(allOps().begin(), allOps().end(), [&](const OpDef& d) { return d.name == op; }))
          throw Error("--fp32-ops: unknown op '" + op + "' (not in the op registry)");
        ampOpts.opCategories[op] = AmpCategory::Deny;
      }
      if (!fp32Nodes.empty()) {
        try {
          std::regex check(fp32Nodes);
        } catch (const std::regex_error& e) {
          throw Error("--fp32-nodes: bad regex '" + fp32Nodes + "': " + e.what());
        }
        ampOpts.pins.push_back({"", fp32Nodes, DType::f32});
      }
      train.precision = amp ? ampOpts.low : DType::f32;
      train.lossScale = lossScale;
      train.fuseElementwise = !noFuseElementwise;
      train.rematerialize = !noRemat;
      train.rematerializeParamCasts = !noRematCasts;
      train.autodiff = adOpts;
      if (!betas.empty()) {
        auto comma = betas.find(',');
        if (comma == std::string::npos) throw Error("--betas wants B1,B2, got '" + betas + "'");
        try {
          train.beta1 = std::stof(betas.substr(0, comma));
          train.beta2 = std::stof(betas.substr(comma + 1));
        } catch (const std::exception&) {
          throw Error("--betas wants two numbers B1,B2, got '" + betas + "'");
        }
      }
    } catch (const Error& e) {
      std::cerr << "ampc: " << e.what() << "\n";
      return 2;
    }
    AutocastReport ampReport;
    // Plans (and --train, which shows a plan's graph, and --grad, whose gradients are the plan's)
    // first merge the work exporters repeat (per-layer copies of one mask), then fuse attention,
    // GELU and SiLU before autocast paints them.
    if (plan || trainStep || grad) {
      pm.add(createCsePass());
      pm.add(createLowerNllPass());      // the CUDA backend has no NegativeLogLikelihoodLoss kernel
      pm.add(createDenseExpertsPass());  // a mixture of experts' gathered matrices: every expert's product and a pick
      pm.add(createNarrowChecksPass());  // nor f64 ones (torch.nan_to_num's IsInf of an f64 Cast)
      pm.add(createConvPadsPass(findTarget(train.target)));  // cuDNN pads a dim's two ends alike
    }
    if ((plan || trainStep || grad) && !noFuse) {
      // The fused attention runs at the plan's low precision unless the config denies it one.
      const auto cat = ampOpts.opCategories.find("Attention");
      const bool lowAttention = amp && (cat == ampOpts.opCategories.end() || cat->second != AmpCategory::Deny);
      pm.add(createFuseAttentionPass(findTarget(train.target), lowAttention ? ampOpts.low : DType::f32));
      pm.add(createFuseGeluPass());
      pm.add(createFuseRotateHalfPass());
      if (!noFuseRmsNorm) pm.add(createFuseRmsNormPass(findTarget(train.target)));
      pm.add(createFuseLinearPass());
      pm.add(createSplitHeadsPass());
    }
    // cuBLASLt's one batch stride, crops as slices; after the fusions, so that a product the fused
    // attention takes (K broadcast over a group of heads) is not expanded first.
    if (plan || trainStep || grad) pm.add(createTargetShapesPass(findTarget(train.target)));
    if (amp) {
      pm.add(createAutocastPass(ampOpts, &ampReport));
      pm.add(createCastCleanupPass());
    }
    if (grad) {
      pm.add(createAutodiffPass(adOpts));
      if (amp) pm.add(createCastCleanupPass());
    }
    if (trainStep) pm.add(createTrainStepPass(train));
    // --train shows the step as the target runs it (its fused groups; their kernels are made for plans).
    struct LowerStep final : Pass {
      const TrainOptions& o;
      KernelGenerator generate;
      LowerStep(const TrainOptions& o, KernelGenerator gen) : o(o), generate(std::move(gen)) {}
      std::string name() const override { return "lower-step"; }
      bool run(Graph& g) override {
        lowerStep(g, o, generate);
        return true;
      }
    };
    if (kernels && !codegen::available()) throw Error("--kernels: this ampc was built without LLVM (llvm-19-dev), so it generates no kernels");
    if (trainStep || kernels) pm.add(std::make_unique<LowerStep>(train, kernels ? KernelGenerator(codegen::fusedKernel) : KernelGenerator()));
    auto g = load(model, opts);
    for (const auto& note : g->importNotes) std::cerr << "ampc: note: " << model << ": " << note << "\n";
    if (plan || trainStep || grad)
      if (const auto idle = listedButUntrained(*g, adOpts); !idle.empty()) {
        std::string names;
        for (size_t i = 0; i < idle.size() && i < 8; ++i) names += (i ? ", " : "") + idle[i];
        std::cerr << "ampc: note: " << model << ": " << idle.size() << " parameter(s) the model lists as trainable (ampc.trainable) "
                  << "reach the loss by no differentiable path in this graph and are not trained: " << names
                  << (idle.size() > 8 ? ", ..." : "") << " (PyTorch trains one its forward reads differentiably; --summary says why)\n";
      }
    const int castsBefore = countCasts(*g);
    try {
      pm.run(*g);
    } catch (const Error& e) {
      throw Error(model + ": " + e.what());
    }
    if (amp) {
      finalizeReport(ampReport, *g, castsBefore);
      if (report) std::cout << formatReport(ampReport);
      if (!reportJsonPath.empty()) writeAtomically(reportJsonPath, reportJson(ampReport));
    }
    if (summary) printSummary(*g, adOpts);
    if (memory) {
      if (train.target != "cuda") throw Error("--memory: the plan of target '" + train.target + "' is not explained (cuda only)");
      std::cout << explainPeak(planCudaMemory(*g), 25);
    }
    if (eval) runEval(*g, evalArgs);
    if (emit == "text") {
      std::string text = printGraph(*g);
      if (out.empty()) std::cout << text;
      else writeAtomically(out, text);
    } else if (emit == "onnx") {
      exportOnnxFile(*g, out);
    } else if (plan) {
      const std::string path = out.empty() ? (fs::path(model).replace_extension(".ampplan")).string() : out;
      KernelGenerator generate;
      if (codegen::available()) generate = codegen::fusedKernel;

      // The source as an absolute path: amprun --save-onnx reads it again, from wherever it runs.
      if (const int without = writePlan(path, *g, train, fs::absolute(model).lexically_normal().string(), generate); without > 0)
        std::cerr << "ampc: note: " << without << " fused group(s) got no kernel ("
                  << (codegen::available() ? "no libdevice found: CUDA's nvvm/libdevice/libdevice.10.bc; set AMPC_LIBDEVICE"
                                           : "this ampc was built without LLVM")
                  << "): amprun runs their ops one by one on CUDA\n";
      fmt::print("{}: wrote {} ({} precision, {} optimizer, loss scale {})\n", model, path, dtypeName(train.precision),
                 train.optimizer, lossScale == "auto" ? (train.precision == DType::f16 ? "dynamic" : "none") : lossScale);
    }
  } catch (const Error& e) {
    std::cerr << "ampc: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ampc: error: " << model << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}
