#!/usr/bin/env bash
# Stop 58's fifth GPU call: the padded-selection sweep models under the dynamo exporter after the
# Reshape change (rows viewed as groups), fp32 against PyTorch.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
MODELS="masked_selection masked_regression moe_loop prototypes eos_pool" SHARDS=5 MODEL_LIMIT=120 LIMIT=140 OUT="$OUT" \
  bash tools/sweep/library_sweep.sh > "$OUT/sweep.txt" 2>&1
rm -f "$OUT"/library_failing.tar.gz.*
cut -c1-500 "$OUT/library_dynamo.txt"
