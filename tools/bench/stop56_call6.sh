#!/usr/bin/env bash
# Stop 56's sixth GPU call: r3d_18 (Conv3d, its bias-less convolutions written by the dynamo exporter
# as a rank-2 Expand of 0) in fp32 and bf16 against PyTorch, and on CUDA against the CPU backend;
# order_stats in bf16 (its constant now on the model's device).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=4 timeout 200 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 180 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-600; }
sweep --out /tmp/v --exporter dynamo video_r3d > "$OUT/fp32.txt" &
sweep --out /tmp/w --exporter dynamo --amp bf16 video_r3d order_stats > "$OUT/bf16.txt" &
wait
JOBS=1 timeout 150 bash tools/sweep/cuda_vs_cpu.sh /tmp/v video_r3d > "$OUT/cuda_vs_cpu.txt" 2>&1
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-600 "$f"; done
