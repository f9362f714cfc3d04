#!/usr/bin/env bash
# The committed zoo (tests/e2e/zoo_test.cpp) with its plans on CUDA, in $SHARDS gtest shards at once
# (one run took over 300 s in stop 52: each case compiles and runs several plans, mostly on the CPU).
# On the GPU machine, staged: `bash tools/bench/zoo_cuda.sh [OUT]`; one summary line per shard.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/.gpu/env.sh"
out=${1:-${OUT:-/tmp}/zoo_cuda}
mkdir -p "$out"
n=${SHARDS:-8}
for ((i = 0; i < n; i++)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i AMPC_ZOO_DIR=$root/models/zoo AMPC_ZOO_DEVICE=cuda AMPC_ZOO_BIN=$root/.gpu/bin \
    timeout ${LIMIT:-400} zoo_tests > "$out/shard$i.txt" 2>&1 &
done
wait
for ((i = 0; i < n; i++)); do
  echo "shard $i: $(grep -E '^\[  (PASSED|FAILED) ' "$out/shard$i.txt" | tr '\n' ' ')$(grep -q '^\[==========\].*ran' "$out/shard$i.txt" || echo '(did not finish)')"
  grep -E '^\[  FAILED  \] ' "$out/shard$i.txt" | head -5
done
