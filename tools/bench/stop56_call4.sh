#!/usr/bin/env bash
# Stop 56's fourth GPU call: this stop's probe models and fixes under PyTorch 2.11's dynamo exporter
# (through the helper) in fp32 and bf16 against PyTorch, and on CUDA against the CPU backend (3 steps:
# Conv3d, Det, sort/top-k, LRN and bicubic on the device); hf:xglm after the import fix (it
# segfaulted), hf:bloom in bf16 after the helper's fix.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 220 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-600; }
m1="hf:xglm order_stats order_stats_medians layer_zoo layer_zoo_atan2"
m2="embedding_max_norm function_mlp video_r3d mnasnet0_5 invertible_conv"
sweep --out /tmp/p1 --exporter dynamo $m1 > "$OUT/fp32_1.txt" &
sweep --out /tmp/p2 --exporter dynamo $m2 > "$OUT/fp32_2.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 $m1 hf:bloom > "$OUT/bf16_1.txt" &
sweep --out /tmp/q2 --exporter dynamo --amp bf16 $m2 > "$OUT/bf16_2.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only video_r3d invertible_conv order_stats_medians layer_zoo_atan2 embedding_max_norm hf:xglm > /dev/null 2>&1
JOBS=3 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp video_r3d invertible_conv order_stats_medians layer_zoo_atan2 embedding_max_norm hf:xglm > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-500 "$f" | head -40; done
