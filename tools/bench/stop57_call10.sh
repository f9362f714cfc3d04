#!/usr/bin/env bash
# Stop 57's tenth GPU call: the library's fp32 sweep under the dynamo exporter through the helper after
# this stop's import and helper changes (padded selections, Unique, the scatter-add rewrite, custom
# Functions with an elementwise backward, max_norm), against stop 56's call 3 (152 PASS).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
SHARDS=15 MODEL_LIMIT=100 LIMIT=${LIMIT:-290} PACK_MB=5 OUT=$OUT bash tools/sweep/library_sweep.sh > "$OUT/summary.txt" 2>&1
rm -f "$OUT"/library_failing.tar.gz.*
cat "$OUT/summary.txt" | cut -c1-400
grep -v " PASS " "$OUT/library_dynamo.txt" | cut -c1-300
