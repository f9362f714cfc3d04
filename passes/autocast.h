// Autocast: paints every op of the forward graph with a precision (low = fp16 or bf16, or FP32)
// from the registry's allow/deny/infer/clear categories, inserts the casts that make it true, and
// explains each decision in a report.
#pragma once

#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"
#include "compiler/ops/registry.h"
#include "passes/pass.h"

namespace ampc {

struct AutocastOptions {
  DType low = DType::f16;  // f16 or bf16; f32 turns autocast off
  // Ops moved between categories (--amp-config "ops", --fp32-ops).
  std::map<std::string, AmpCategory> opCategories;
  // Nodes pinned to a precision by exact name or regex (--amp-config "nodes", --fp32-nodes).
  struct Pin {
    std::string name;     // exact node name, or
    std::string pattern;  // a regex matched against the whole node name
    DType precision;
  };
  std::vector<Pin> pins;
};

// Parses an --amp-config JSON file's text (schema in the README). Error for unknown keys, ops,
// categories or precisions.
AutocastOptions parseAmpConfig(const std::string& json, const std::string& file = "amp-config");
// "fp16" / "bf16" / "fp32" (and f16, bf16, f32) -> DType; Error otherwise.
DType parsePrecision(const std::string& s);

enum class AmpRule { AllowList, DenyList, Inferred, Clear, CustomOp, UserPin, Loss, ExplicitCast, NotFloat, Angle, Fp32Lowering };
std::string_view ampRuleName(AmpRule r);

struct AutocastReport {
  struct Row {
    std::string node, op, precision, rule;
    double flops = 0;
    const Node* ir = nullptr;  // for finalizeReport; not part of the printed report
  };
  std::vector<Row> rows;
  std::string lowName;       // "f16" / "bf16"
  int castsInserted = 0;     // by autocast
  int castsAfterCleanup = -1;  // set by the caller after cast-cleanup
  int floatOps = 0, lowOps = 0;
  double flops = 0, lowFlops = 0;
};

// The painting pass. `report`, when given, receives one row per node.
std::unique_ptr<Pass> createAutocastPass(const AutocastOptions& opts, AutocastReport* report = nullptr);
// cast-cleanup: removes no-op casts, collapses exact Cast(Cast(x)) chains (never a high->low->high
// pair), folds casts of constants, keeps one cast per (value, dtype), and moves casts through
// clear ops (towards the producer when that casts no more elements, towards the consumer when
// that casts fewer).
std::unique_ptr<Pass> createCastCleanupPass();

int countCasts(const Graph& g);
// After cast-cleanup: each row's precision becomes the dtype its node now computes in (cleanup
// may move a cast through a clear op), casts are recounted (net of the model's own casts), and
// the totals are redone.
void finalizeReport(AutocastReport& r, const Graph& g, int modelCasts);
std::string formatReport(const AutocastReport& r);
std::string reportJson(const AutocastReport& r);

}  // namespace ampc
