// Memory planning (DESIGN.md step 11): every value a node produces gets an offset in one arena,
// from liveness over the whole step (forward, backward, update): two values share bytes only when
// their live ranges do not overlap. Graph inputs, params and constants live outside the arena.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

struct MemoryPlan {
  static constexpr int64_t kAlignment = 256;  // bytes, every offset
  struct Slot {
    int64_t offset = 0, bytes = 0;
    int first = 0, last = 0;  // live from the producing node's index to the last reader's
    int group = 0;            // values of one group share bytes: an in-place chain, views
  };
  std::map<const Value*, Slot> slots;
  int64_t arenaBytes = 0;   // the arena's size
  int64_t totalBytes = 0;   // every activation in its own buffer (no reuse)
  int64_t peakLiveBytes = 0;  // the most bytes live at one node (after in-place): no placement beats it
  int peakAt = 0;             // the (first) position where peakLiveBytes are live
  int inPlace = 0;            // results that took an input's bytes
  int views = 0;              // view results (Reshape and the like) that share their input's bytes
};

// Views first: a Reshape-like result shares its input's bytes, and the two are one group.
// In place next: an elementwise op's result takes the bytes of a same-sized input that nothing
// reads afterwards (chains form groups). Then greedy by size over the groups (largest first,
// lowest offset that overlaps no live-overlapping group).
// `positions` (optional, one per node) is when each node's work runs, if not at its own index: nodes
// that one fused launch executes share a position, so none of them overwrites another's inputs, and
// a node computed later, inside its consumer, keeps its operands alive until then.
// `unwritten` (optional): values no backend ever writes (the wide side of a Cast folded into the ops
// around it): they get no bytes. `extraReads` (optional): (value, position) reads that no node's
// operands show (a fused kernel reading a value in place of the one its operand names).
// `bytes` (optional): values stored in more bytes than their type's (a padded row pitch).
// `inPlace` (optional): written -> read, a target's kernel that may write a result over an operand
// it reads element by element (runtime/folds.h, Schedule::inPlace); joined as an elementwise op's
// result is, on the same conditions.
MemoryPlan planMemory(const Graph& g, const std::vector<int>& positions = {}, const std::set<const Value*>& unwritten = {},
                      const std::vector<std::pair<const Value*, int>>& extraReads = {},
                      const std::map<const Value*, int64_t>& bytes = {}, const std::map<const Value*, const Value*>& inPlace = {});

// The values whose bytes are live at `position`, one per group of shared bytes (its largest
// member), largest first: what the arena holds there.
std::vector<std::pair<const Value*, int64_t>> liveAt(const MemoryPlan& p, int position);
// The plan's peak explained: live bytes against the arena, the `top` largest values live at the
// peak and the live bytes by the op that made them.
std::string explainPeak(const MemoryPlan& p, size_t top);

// Error if two values with overlapping live ranges overlap in the arena.
void checkMemoryPlan(const MemoryPlan& p);

}  // namespace ampc
