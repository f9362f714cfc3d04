// Checkpoints (amprun --checkpoint / --resume): safetensors files of the state, metadata checked.
#include "runtime/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "runtime/safetensors.h"

namespace fs = std::filesystem;

namespace ampc {

// The checkpoint of the state after `step` steps: every state param, the data position and the
// seed, in DIR/ckpt-STEP.safetensors; DIR/latest names the newest. Both written atomically.
void writeCheckpoint(const std::string& dir, const Graph& g, int64_t step, const DataSource::Position& pos, uint64_t seed) {
  fs::create_directories(dir);
  Safetensors st;
  for (const Value* p : g.params())
    if (p->data()) st.tensors.emplace(p->name(), *p->data());
  st.metadata = {{"step", std::to_string(step)}, {"data_epoch", std::to_string(pos.epoch)}, {"data_index", std::to_string(pos.index)},
                 {"seed", std::to_string(seed)}, {"format", "ampc-checkpoint-1"}};
  const std::string name = fmt::format("ckpt-{:08d}.safetensors", step);
  writeSafetensors((fs::path(dir) / name).string(), st);
  const std::string latest = (fs::path(dir) / "latest").string(), tmp = latest + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    if (!out.flush()) throw Error(latest + ": write failed");
  }
  fs::rename(tmp, latest);
}

namespace {

// A checkpoint's integer metadata, parsed whole and range-checked: nothing in the file is trusted.
int64_t metaInt(const Safetensors& st, const std::string& file, const char* key, int64_t lo, int64_t hi) {
  auto it = st.metadata.find(key);
  if (it == st.metadata.end()) throw Error(file + ": not an ampc checkpoint (metadata '" + key + "' is missing)");
  const std::string& s = it->second;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || v < lo || v > hi)
    throw Error(file + ": checkpoint metadata " + key + " = '" + s + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// The step's counters and scale, range-checked (their hash only says they are what was written):
// ampc.step in [0, step] (it counts the steps not skipped), ampc.micro_step 0, the growth tracker in
// [0, growth_interval), the hysteresis budget in [0, hysteresis], the loss scale finite and > 0. So
// no counter can leave int64 while a run goes on (at most --steps steps).
void checkTrainingState(const Graph& g, const Safetensors& st, const std::string& file, int64_t step) {
  auto scalar = [&](const char* name) -> const Tensor* {
    auto it = st.tensors.find(name);
    return it != st.tensors.end() && it->second.numel() == 1 ? &it->second : nullptr;
  };
  auto within = [&](const char* name, int64_t lo, int64_t hi) {
    if (const Tensor* t = scalar(name); t && !isFloat(t->type.dtype)) {
      const int64_t v = t->getInt(0);
      if (v < lo || v > hi)
        throw Error(file + ": tensor '" + name + "' = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  };
  within("ampc.step", 0, step);
  // Checkpoints fall between steps, never inside an accumulation window (the counter is an f32).
  if (const Tensor* t = scalar("ampc.micro_step"); t && t->getDouble(0) != 0)
    throw Error(file + ": tensor 'ampc.micro_step' = " + std::to_string(t->getDouble(0)) + ", not 0: a checkpoint inside an accumulation window");
  for (const auto& n : g.nodes())
    if (n->domain() == "ampc" && n->op() == "ScalerUpdate") {
      within("ampc.growth_tracker", 0, std::max<int64_t>(n->getInt("growth_interval", 2000) - 1, 0));
      within("ampc.hysteresis_left", 0, std::max<int64_t>(n->getInt("hysteresis", 1), 0));
    }
  if (const Tensor* t = scalar("ampc.loss_scale"); t && isFloat(t->type.dtype)) {
    const double s = t->getDouble(0);
    if (!std::isfinite(s) || s <= 0) throw Error(file + ": tensor 'ampc.loss_scale' = " + std::to_string(s) + " is not a finite positive scale");
  }
}

}  // namespace

// A folder resumes from the checkpoint `latest` names; if that one is damaged, from the newest
// other checkpoint that loads, with a note naming both.
Resumed resume(const std::string& where, Graph& g, uint64_t seed) {
  std::error_code ec;
  if (!fs::exists(where, ec)) throw Error(where + ": no checkpoint yet (nothing is there); run without --resume to start");
  if (!fs::is_directory(where, ec)) return resumeFile(where, g, seed);
  std::ifstream in(fs::path(where) / "latest");
  std::string name;
  if (!(in >> name)) throw Error(where + ": no checkpoint yet ('latest' is missing); run without --resume to start");
  // `latest` names a file in this folder, nothing else.
  if (name.find('/') != std::string::npos || name == "." || name == ".." || fs::path(name).filename() != name)
    throw Error(where + "/latest: names '" + name + "', which is not a checkpoint file in this folder");
  const std::string newest = (fs::path(where) / name).string();
  try {
    return resumeFile(newest, g, seed);
  } catch (const Error& first) {
    std::vector<std::string> older;
    for (const auto& e : fs::directory_iterator(where, ec)) {
      const std::string f = e.path().filename().string();
      if (f != name && f.rfind("ckpt-", 0) == 0 && e.path().extension() == ".safetensors") older.push_back(e.path().string());
    }
    std::sort(older.rbegin(), older.rend());  // ckpt-%08d: by name is by step, newest first
    for (const auto& f : older) {
      try {
        Resumed r = resumeFile(f, g, seed);
        std::cerr << "amprun: note: " << first.what() << "\namprun: note: resuming from the previous checkpoint " << f << " instead\n";
        return r;
      } catch (const Error&) {
      }
    }
    throw;
  }
}

Resumed resumeFile(const std::string& file, Graph& g, uint64_t seed) {
  Safetensors st = readSafetensors(file);
  // Everything is checked before the graph takes any of it.
  for (const Value* p : g.params()) {
    auto it = st.tensors.find(p->name());
    if (it == st.tensors.end()) throw Error(file + ": has no tensor '" + p->name() + "' (a checkpoint of another plan?)");
    if (it->second.type != p->type())
      throw Error(file + ": tensor '" + p->name() + "' is " + it->second.type.str() + ", the plan has " + p->type().str());
  }
  Resumed r;
  const int64_t big = int64_t{1} << 52;
  r.step = metaInt(st, file, "step", 0, big);
  r.pos.epoch = metaInt(st, file, "data_epoch", 0, big);
  r.pos.index = metaInt(st, file, "data_index", 0, big);
  if (auto it = st.metadata.find("seed"); it == st.metadata.end() || it->second != std::to_string(seed))
    throw Error(file + ": written by a run with --seed " + (it == st.metadata.end() ? std::string("(none)") : it->second) +
                "; this run has --seed " + std::to_string(seed) + " (the data order would differ)");
  checkTrainingState(g, st, file, r.step);
  for (Value* p : g.params()) p->setData(std::move(st.tensors.at(p->name())));
  return r;
}

}  // namespace ampc
