#!/usr/bin/env bash
# Stop 57's fifth GPU call: the helper's elementwise custom Functions (surrogate_functions, function_mlp,
# hf:bloom's GeLUFunction, hf:yoso's non-elementwise ones) and the stop-gradient models under the
# dynamo exporter; masked_regression after the CastLike fix; fp32 / bf16 against PyTorch, CUDA against
# the CPU.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 280 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ |^ampc_export: custom" | cut -c1-600; }
sweep --out /tmp/p1 --exporter dynamo surrogate_functions function_mlp masked_regression vq_straight_through > "$OUT/fp32_1.txt" &
sweep --out /tmp/p2 --exporter dynamo hf:bloom hf:yoso simsiam teacher_no_grad > "$OUT/fp32_2.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 surrogate_functions masked_regression hf:bloom > "$OUT/bf16.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only surrogate_functions masked_regression > /dev/null 2>&1
JOBS=2 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp surrogate_functions masked_regression > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-600 "$f" | head -30; done
