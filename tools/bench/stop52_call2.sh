#!/usr/bin/env bash
# Stop 52's second GPU call: hfimg:swinv2 (gradients right, 3 SGD steps far off) brought back whole
# with its steps.json; ghostnet_100 and inception_v3 again with the sweep's F.dropout fix
# (no_randomness now zeroes drop_rate), and yoso for the record.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib"
MODELS="hfimg:swinv2 timm:ghostnet_100 timm:inception_v3@96 timm:resnest14d timm:dpn48b" SHARDS=5 MODEL_LIMIT=150 LIMIT=200 PACK_MB=${PACK_MB:-40} \
  OUT=$OUT/lib bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1
cat "$OUT/lib/summary.txt"
for m in hfimg:swinv2 timm:ghostnet_100 timm:inception_v3@96; do echo "$m"; cat "/tmp/library_dynamo/$m/ref/steps.json"; echo; done
du -sb /tmp/library_dynamo/*/ | sort -n
