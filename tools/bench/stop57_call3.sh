#!/usr/bin/env bash
# Stop 57's third GPU call: why the dynamo exporter fails on x[mask] losses and transformers' MoE
# models (stop57_dynamo_why.py); moe_loop in bf16 against PyTorch's autocast (its index_add now in
# the accumulator's dtype).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 240 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-700; }
sweep --out /tmp/q1 --exporter dynamo --amp bf16 moe_loop > "$OUT/bf16.txt" &
timeout 200 python3 tools/bench/stop57_dynamo_why.py hf:mixtral hf:bart > "$OUT/why.txt" 2>&1
for f in /tmp/why_*.onnx; do echo "$f: $(ampc "$f" --summary 2>&1 >/dev/null | tail -1 | cut -c1-400)"; done >> "$OUT/why.txt"
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-600 "$f" | head -120; done
