#!/usr/bin/env bash
# Stop 57's fourth GPU call: masked_regression (x[mask] losses the dynamo exporter takes, masks made
# by repeated code) and complex_rotary (Meta-style complex rotary embeddings) under the dynamo
# exporter, fp32 / bf16 against PyTorch and CUDA against the CPU; then issue 22's GPT-2-shape
# attention numbers (attn_bench and PyTorch's SDPA in the same call, GPU otherwise idle).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 240 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-700; }
m="masked_regression complex_rotary"
sweep --out /tmp/p1 --exporter dynamo $m > "$OUT/fp32.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 $m > "$OUT/bf16.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only $m > /dev/null 2>&1
timeout 60 python3 tools/bench/stop57_ops.py "$a" $exp/complex_rotary/complex_rotary.onnx > "$OUT/ops.txt" 2>&1
JOBS=2 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp $m > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
timeout 60 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 > "$OUT/attn_gpt2.txt" 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > "$OUT/sdpa_ref.txt" 2>&1
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-700 "$f" | tail -40; done
