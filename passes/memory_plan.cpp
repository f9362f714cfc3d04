#include "passes/memory_plan.h"

#include <algorithm>
#include <vector>

namespace ampc {
namespace {

int64_t aligned(int64_t b) { return (b + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment; }

bool overlaps(int a0, int a1, int b0, int b1) { return a0 <= b1 && b0 <= a1; }

}  // namespace

MemoryPlan planMemory(const Graph& g) {
  MemoryPlan p;
  std::vector<const Value*> values;
  int index = 0;
  const int end = static_cast<int>(g.numNodes());
  for (const auto& n : g.nodes()) {
    for (const Value* in : n->inputs())
      if (in) {
        auto it = p.slots.find(in);
        if (it != p.slots.end()) it->second.last = index;
      }
    for (size_t i = 0; i < n->numResults(); ++i) {
      const Value* r = n->result(i);
      MemoryPlan::Slot s;
      s.bytes = static_cast<int64_t>(r->type().bytes());
      s.first = s.last = index;
      p.slots.emplace(r, s);
      values.push_back(r);
    }
    ++index;
  }
  for (const Value* o : g.outputs())
    if (auto it = p.slots.find(o); it != p.slots.end()) it->second.last = end;  // read after the step
  // Peak live bytes: the lower bound any plan meets.
  std::vector<int64_t> live(static_cast<size_t>(end + 1), 0);
  for (const auto& [v, s] : p.slots) {
    p.totalBytes += aligned(s.bytes);
    for (int k = s.first; k <= s.last; ++k) live[k] += aligned(s.bytes);
  }
  p.peakLiveBytes = live.empty() ? 0 : *std::max_element(live.begin(), live.end());
  // Largest first; ties in definition order, so the plan is deterministic.
  std::stable_sort(values.begin(), values.end(), [&](const Value* a, const Value* b) { return p.slots[a].bytes > p.slots[b].bytes; });
  std::vector<const Value*> placed;
  for (const Value* v : values) {
    MemoryPlan::Slot& s = p.slots[v];
    const int64_t need = aligned(std::max<int64_t>(s.bytes, 1));
    std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of slots live at the same time
    for (const Value* q : placed) {
      const MemoryPlan::Slot& t = p.slots[q];
      if (overlaps(s.first, s.last, t.first, t.last)) busy.emplace_back(t.offset, t.offset + aligned(std::max<int64_t>(t.bytes, 1)));
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + need <= b) break;
      offset = std::max(offset, e);
    }
    s.offset = offset;
    p.arenaBytes = std::max(p.arenaBytes, offset + need);
    placed.push_back(v);
  }
  return p;
}

void checkMemoryPlan(const MemoryPlan& p) {
  std::vector<std::pair<const Value*, MemoryPlan::Slot>> all(p.slots.begin(), p.slots.end());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [a, s] = all[i];
    if (s.offset % MemoryPlan::kAlignment != 0) throw Error("memory plan: '" + a->name() + "' is not aligned");
    if (s.offset + s.bytes > p.arenaBytes) throw Error("memory plan: '" + a->name() + "' runs past the arena");
    for (size_t j = i + 1; j < all.size(); ++j) {
      const auto& [b, t] = all[j];
      if (!overlaps(s.first, s.last, t.first, t.last) || s.bytes == 0 || t.bytes == 0) continue;
      if (s.offset < t.offset + t.bytes && t.offset < s.offset + s.bytes)
        throw Error("memory plan: '" + a->name() + "' and '" + b->name() + "' are live together and overlap");
    }
  }
}

}  // namespace ampc
