// XXH3-64 (libxxhash-dev, header-only): the integrity hash of plans, weights and checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace ampc {

inline uint64_t hash64(const void* p, size_t n) { return XXH3_64bits(p, n); }

}  // namespace ampc
