#!/usr/bin/env bash
# Stop 57's first GPU call: x[mask] padded to its bound (masked_selection) and a hand-written MoE
# (moe_loop) under PyTorch 2.11's dynamo exporter, fp32 and bf16 against PyTorch, CUDA against the
# CPU; what the dynamo exporter writes for both (stop57_ops.py); the NonZero-refused library models
# (bart, t5, longformer); the dropouts probe prepared in stop 56 (stop56_dropouts.py).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 240 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-700; }
sweep --out /tmp/p1 --exporter dynamo masked_selection moe_loop > "$OUT/fp32.txt" &
sweep --out /tmp/p2 --exporter dynamo hf:bart hf:t5 hf:longformer > "$OUT/fp32_hf.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 masked_selection moe_loop > "$OUT/bf16.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only masked_selection moe_loop > /dev/null 2>&1
timeout 60 python3 tools/bench/stop57_ops.py "$a" $exp/masked_selection/masked_selection.onnx $exp/moe_loop/moe_loop.onnx > "$OUT/ops.txt" 2>&1
JOBS=2 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp masked_selection moe_loop > "$OUT/cuda_vs_cpu.txt" 2>&1
timeout 100 python3 tools/bench/stop56_dropouts.py "$a" 2>&1 | grep -v "Warning\|warn\|torch.onnx\]" | cut -c1-600 > "$OUT/dropouts.txt"
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-700 "$f" | head -60; done
