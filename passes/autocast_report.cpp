// The autocast report (text and JSON) and the --amp-config parser.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "passes/autocast.h"

namespace ampc {

std::string formatReport(const AutocastReport& r) {
  size_t wn = 4, wo = 2;
  for (const auto& row : r.rows) {
    wn = std::max(wn, row.node.size());
    wo = std::max(wo, row.op.size());
  }
  wn = std::min<size_t>(wn, 60);
  std::string s = fmt::format("{:<{}}  {:<{}}  {:<9}  {}\n", "node", wn, "op", wo, "precision", "rule");
  for (const auto& row : r.rows)
    s += fmt::format("{:<{}}  {:<{}}  {:<9}  {}\n", row.node.empty() ? "(unnamed)" : row.node, wn, row.op, wo, row.precision, row.rule);
  s += fmt::format("totals: {} of {} float ops run {} ({:.1f}%), {:.1f}% of {:.4g} FLOPs; casts inserted: {}",
                   r.lowOps, r.floatOps, r.lowName, r.floatOps ? 100.0 * r.lowOps / r.floatOps : 0.0,
                   r.flops > 0 ? 100.0 * r.lowFlops / r.flops : 0.0, r.flops, r.castsInserted);
  if (r.castsAfterCleanup >= 0) s += fmt::format(", after cleanup: {}", r.castsAfterCleanup);
  return s + "\n";
}

std::string reportJson(const AutocastReport& r) {
  nlohmann::json j;
  j["precision"] = r.lowName;
  j["nodes"] = nlohmann::json::array();
  for (const auto& row : r.rows)
    j["nodes"].push_back({{"name", row.node}, {"op", row.op}, {"precision", row.precision}, {"rule", row.rule}, {"flops", row.flops}});
  j["totals"] = {{"float_ops", r.floatOps}, {"low_ops", r.lowOps}, {"flops", r.flops}, {"low_flops", r.lowFlops},
                 {"low_flop_share", r.flops > 0 ? r.lowFlops / r.flops : 0.0}, {"casts_inserted", r.castsInserted},
                 {"casts_after_cleanup", r.castsAfterCleanup}};
  return j.dump(2) + "\n";
}

AutocastOptions parseAmpConfig(const std::string& text, const std::string& file) {
  AutocastOptions o;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error(file + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(file + ": the config must be a JSON object");
  auto category = [&](const std::string& c) {
    for (AmpCategory k : {AmpCategory::Allow, AmpCategory::Deny, AmpCategory::Infer, AmpCategory::Clear})
      if (c == ampCategoryName(k)) return k;
    throw Error(file + ": unknown category '" + c + "' (use allow, deny, infer or clear)");
  };
  auto knownOp = [&](const std::string& op) {
    for (const OpDef& d : allOps())
      if (d.name == op) return;
    throw Error(file + ": unknown op '" + op + "' (not in the op registry)");
  };
  auto precision = [&](const nlohmann::json& v) {
    if (!v.is_string()) throw Error(file + ": a precision must be a string");
    try {
      return parsePrecision(v.get<std::string>());
    } catch (const Error& e) {
      throw Error(file + ": " + e.what());
    }
  };
  for (const auto& [key, v] : j.items()) {
    if (key == "precision") {
      o.low = precision(v);
    } else if (key == "ops") {
      if (!v.is_object()) throw Error(file + ": \"ops\" must map op names to categories");
      for (const auto& [op, c] : v.items()) {
        knownOp(op);
        if (!c.is_string()) throw Error(file + ": the category of " + op + " must be a string");
        o.opCategories[op] = category(c.get<std::string>());
      }
    } else if (key == "allow" || key == "deny" || key == "infer" || key == "clear") {
      if (!v.is_array()) throw Error(file + ": \"" + key + "\" must be a list of op names");
      for (const auto& op : v) {
        if (!op.is_string()) throw Error(file + ": \"" + key + "\" must be a list of op names");
        knownOp(op.get<std::string>());
        o.opCategories[op.get<std::string>()] = category(key);
      }
    } else if (key == "nodes") {
      if (!v.is_array()) throw Error(file + ": \"nodes\" must be a list of pins");
      for (const auto& pin : v) {
        if (!pin.is_object() || !pin.contains("precision") || (pin.contains("name") == pin.contains("regex")))
          throw Error(file + ": each pin needs \"precision\" and one of \"name\" or \"regex\"");
        AutocastOptions::Pin p;
        p.precision = precision(pin["precision"]);
        if (pin.contains("name")) p.name = pin["name"].get<std::string>();
        else {
          p.pattern = pin["regex"].get<std::string>();
          try {
            std::regex check(p.pattern);
          } catch (const std::regex_error& e) {
            throw Error(file + ": bad regex '" + p.pattern + "': " + e.what());
          }
        }
        o.pins.push_back(p);
      }
    } else {
      throw Error(file + ": unknown key \"" + key + "\" (use precision, ops, allow, deny, infer, clear, nodes)");
    }
  }
  return o;
}

}  // namespace ampc
