#include "passes/memory_plan.h"

#include "compiler/ops/registry.h"

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace ampc {
namespace {

int64_t aligned(int64_t b) { return (b + MemoryPlan::kAlignment - 1) / MemoryPlan::kAlignment * MemoryPlan::kAlignment; }

bool overlaps(int a0, int a1, int b0, int b1) { return a0 <= b1 && b0 <= a1; }


}  // namespace

MemoryPlan planMemory(const Graph& g, const std::vector<int>& positions, const std::set<const Value*>& unwritten,
                      const std::vector<std::pair<const Value*, int>>& extraReads, const std::map<const Value*, int64_t>& bytes,
                      const std::map<const Value*, const Value*>& inPlace) {
  if (!positions.empty() && positions.size() != g.numNodes()) throw Error("memory plan: one position per node expected");
  MemoryPlan p;
  std::vector<const Value*> values;
  int index = 0;
  const int end = static_cast<int>(g.numNodes());
  auto at = [&](int i) { return positions.empty() ? i : positions[static_cast<size_t>(i)]; };
  for (const auto& n : g.nodes()) {
    for (const Value* in : n->inputs())
      if (in) {
        auto it = p.slots.find(in);
        if (it != p.slots.end()) it->second.last = std::max(it->second.last, at(index));
      }
    for (size_t i = 0; i < n->numResults(); ++i) {
      const Value* r = n->result(i);
      MemoryPlan::Slot s;
      const auto wide = bytes.find(r);
      s.bytes = unwritten.count(r) ? 0 : wide != bytes.end() ? wide->second : static_cast<int64_t>(r->type().bytes());
      s.first = s.last = at(index);
      p.slots.emplace(r, s);
      values.push_back(r);
    }
    ++index;
  }
  for (const Value* o : g.outputs())
    if (auto it = p.slots.find(o); it != p.slots.end()) it->second.last = end;  // read after the step
  for (const auto& [v, at] : extraReads)
    if (auto it = p.slots.find(v); it != p.slots.end()) it->second.last = std::max(it->second.last, at);
  for (const auto& [v, s] : p.slots) p.totalBytes += aligned(s.bytes);
  // In place: group a result with an input it may overwrite.
  std::map<const Value*, int> groupOf;
  std::vector<std::vector<const Value*>> groups;
  for (const Value* v : values) {
    groupOf[v] = static_cast<int>(groups.size());
    groups.push_back({v});
  }
  // The last use of any member: a group's bytes are free only after it.
  auto groupLast = [&](int gi) {
    int last = 0;
    for (const Value* m : groups[static_cast<size_t>(gi)]) last = std::max(last, p.slots[m].last);
    return last;
  };
  auto join = [&](const Value* r, int gi) {
    groups[static_cast<size_t>(gi)].push_back(r);
    groups[static_cast<size_t>(groupOf[r])].clear();
    groupOf[r] = gi;
  };
  // r may take in's bytes: in is its group's newest member, and no member is read after this node.
  auto takeOver = [&](const Value* r, const Value* in) {
    if (!in || !p.slots.count(in) || g.isOutput(in)) return false;
    const int gi = groupOf[in];
    if (groups[gi].back() != in || groupLast(gi) != at(index)) return false;
    join(r, gi);
    ++p.inPlace;
    return true;
  };
  index = 0;
  for (const auto& n : g.nodes()) {
    const OpDef* d = n->def();
    const auto target = n->numResults() >= 1 ? inPlace.find(n->result(0)) : inPlace.end();
    if (target != inPlace.end()) {
      const Value *r = target->first, *in = target->second;  // a target's kernel: the same bytes, both written
      if (p.slots.count(in) && p.slots[r].bytes > 0 && p.slots[in].bytes == p.slots[r].bytes) takeOver(r, in);
    } else if (d && d->view && n->numResults() == 1 && !n->inputs().empty() && n->inputs()[0] && p.slots.count(n->inputs()[0]) &&
        !unwritten.count(n->inputs()[0]) && n->inputs()[0]->type().bytes() == n->result(0)->type().bytes()) {
      // A view shares its input's bytes for as long as either is read.
      join(n->result(0), groupOf[n->inputs()[0]]);
      ++p.views;
    } else if (d && d->inplace && n->numResults() >= 1) {
      const Value* r = n->result(0);
      for (const Value* in : n->inputs()) {
        // Only the chain's newest member, and only when no member (a view of it) is read later.
        if (in && in->type().dtype == r->type().dtype && in->type().numel() == r->type().numel() && takeOver(r, in)) break;
      }
    }
    ++index;
  }
  // Groups: live from the first member's birth to the last member's last use.
  struct Group {
    int id, first, last;
    int64_t bytes;
  };
  std::vector<Group> gs;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i].empty()) continue;
    Group gr{static_cast<int>(i), p.slots[groups[i].front()].first, 0, 0};
    for (const Value* v : groups[i]) {
      gr.last = std::max(gr.last, p.slots[v].last);
      gr.bytes = std::max(gr.bytes, aligned(std::max<int64_t>(p.slots[v].bytes, 1)));
    }
    gs.push_back(gr);
  }
  // Peak live bytes over the groups: the lower bound any placement of them meets.
  std::vector<int64_t> live(static_cast<size_t>(end + 1), 0);
  for (const Group& gr : gs)
    for (int k = gr.first; k <= gr.last; ++k) live[k] += gr.bytes;
  if (!live.empty()) {
    const auto peak = std::max_element(live.begin(), live.end());
    p.peakLiveBytes = *peak;
    p.peakAt = static_cast<int>(peak - live.begin());
  }
  // Largest first; ties in definition order, so the plan is deterministic.
  std::stable_sort(gs.begin(), gs.end(), [](const Group& a, const Group& b) { return a.bytes > b.bytes; });
  std::vector<std::pair<const Group*, int64_t>> placed;
  for (const Group& gr : gs) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const auto& [q, off] : placed)
      if (overlaps(gr.first, gr.last, q->first, q->last)) busy.emplace_back(off, off + q->bytes);
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (const auto& [b, e] : busy) {
      if (offset + gr.bytes <= b) break;
      offset = std::max(offset, e);
    }
    for (const Value* v : groups[gr.id]) {
      p.slots[v].offset = offset;
      p.slots[v].group = gr.id;
    }
    p.arenaBytes = std::max(p.arenaBytes, offset + gr.bytes);
    placed.emplace_back(&gr, offset);
  }
  return p;
}

std::vector<std::pair<const Value*, int64_t>> liveAt(const MemoryPlan& p, int position) {
  struct Span {
    int first = INT32_MAX, last = -1;
    const Value* v = nullptr;
    int64_t bytes = -1;
  };
  std::map<int, Span> byGroup;
  for (const auto& [v, s] : p.slots) {
    Span& g = byGroup[s.group];
    g.first = std::min(g.first, s.first);
    g.last = std::max(g.last, s.last);
    if (s.bytes > g.bytes || (s.bytes == g.bytes && g.v && v->name() < g.v->name())) {
      g.bytes = s.bytes;
      g.v = v;
    }
  }
  std::vector<std::pair<const Value*, int64_t>> out;
  for (const auto& [id, g] : byGroup)
    if (g.first <= position && position <= g.last && g.bytes > 0) out.emplace_back(g.v, g.bytes);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first->name() < b.first->name();
  });
  return out;
}

std::string explainPeak(const MemoryPlan& p, size_t top) {
  auto mib = [](int64_t b) { return std::to_string(b / (1 << 20)) + "." + std::to_string(b % (1 << 20) * 10 / (1 << 20)) + " MiB"; };
  const auto live = liveAt(p, p.peakAt);
  std::string s = "memory plan: arena " + mib(p.arenaBytes) + ", peak of live values " + mib(p.peakLiveBytes) + " at position " +
                  std::to_string(p.peakAt) + " (" + std::to_string(live.size()) + " values live)\n";
  std::map<std::string, std::pair<int64_t, int>> byOp;
  for (const auto& [v, b] : live) {
    auto& e = byOp[v->producer() ? v->producer()->qualifiedOp() : "(input)"];
    e.first += b;
    ++e.second;
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int>>> ops(byOp.begin(), byOp.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  s += "  live at the peak, by the op that made them:\n";
  for (size_t i = 0; i < std::min(top, ops.size()); ++i)
    s += "    " + mib(ops[i].second.first) + "  " + std::to_string(ops[i].second.second) + "x " + ops[i].first + "\n";
  s += "  largest values live at the peak:\n";
  for (size_t i = 0; i < std::min(top, live.size()); ++i) {
    const Value* v = live[i].first;
    const MemoryPlan::Slot& sl = p.slots.at(v);
    s += "    " + mib(live[i].second) + "  '" + v->name() + "' " + v->type().str() + " from " +
         (v->producer() ? v->producer()->describe() : std::string("outside")) + ", live " + std::to_string(sl.first) + ".." +
         std::to_string(sl.last) + "\n";
  }
  return s;
}

void checkMemoryPlan(const MemoryPlan& p) {
  std::vector<std::pair<const Value*, MemoryPlan::Slot>> all(p.slots.begin(), p.slots.end());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& [a, s] = all[i];
    if (s.offset % MemoryPlan::kAlignment != 0) throw Error("memory plan: '" + a->name() + "' is not aligned");
    if (s.offset + s.bytes > p.arenaBytes) throw Error("memory plan: '" + a->name() + "' runs past the arena");
    for (size_t j = i + 1; j < all.size(); ++j) {
      const auto& [b, t] = all[j];
      if (!overlaps(s.first, s.last, t.first, t.last) || s.bytes == 0 || t.bytes == 0 || s.group == t.group) continue;
      if (s.offset < t.offset + t.bytes && t.offset < s.offset + s.bytes)
        throw Error("memory plan: '" + a->name() + "' and '" + b->name() + "' are live together and overlap");
    }
  }
}

}  // namespace ampc
