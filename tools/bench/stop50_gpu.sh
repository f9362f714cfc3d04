#!/usr/bin/env bash
# Stop 50's first GPU call: stop 49's checks on the GPU (tools/bench/stop49_gpu.sh) while the
# machine's CPUs run the library sweep (tools/sweep/library_sweep.sh: timm and transformers models,
# PyTorch's dynamo exporter, each against PyTorch on ampc's CPU backend).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
mkdir -p "$OUT/lib"
SHARDS=${SHARDS:-12} MODEL_LIMIT=${MODEL_LIMIT:-150} LIMIT=${LIMIT:-420} OUT=$OUT/lib bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
bash "$bench/stop49_gpu.sh"
wait
cat "$OUT/lib/summary.txt"
