#!/usr/bin/env bash
# Stop 57's second GPU call: the hand-written MoE (moe_loop: torch.where + index_add) under the dynamo
# exporter after the Shape/Expand and scatter support, fp32 / bf16 / CUDA against the CPU; why the
# dynamo exporter fails on masked_selection and on transformers' MoE models (AMPC_EXPORT_FALLBACK=0);
# masked_selection and moe_loop in the CUDA step's timing (amprun --bench, beside PyTorch eager).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 240 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-700; }
sweep --out /tmp/p1 --exporter dynamo moe_loop masked_selection > "$OUT/fp32.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 moe_loop > "$OUT/bf16.txt" &
AMPC_EXPORT_FALLBACK=0 sweep --out /tmp/r1 --exporter dynamo masked_selection hf:mixtral hf:qwen2_moe hf:bart > "$OUT/dynamo_errors.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only moe_loop > /dev/null 2>&1
timeout 60 python3 tools/bench/stop57_ops.py "$a" $exp/moe_loop/moe_loop.onnx > "$OUT/ops.txt" 2>&1
JOBS=1 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp moe_loop > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-900 "$f" | head -60; done
