#!/usr/bin/env bash
# Stop 57's sixth GPU call: masked_regression under the dynamo exporter after the count-through-Reshape
# fix (fp32, bf16, CUDA against the CPU), and the producers of any Expand ampc cannot read.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 200 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-600; }
sweep --out /tmp/p1 --exporter dynamo masked_regression > "$OUT/fp32.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 masked_regression > "$OUT/bf16.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only masked_regression > /dev/null 2>&1
f=$exp/masked_regression/masked_regression.onnx
node=$(ampc $f --summary 2>&1 >/dev/null | grep -o "node '[^']*'" | head -1 | cut -d"'" -f2)
[ -n "$node" ] && timeout 30 python3 tools/bench/stop57_chain.py $f "$node" 7 > "$OUT/chain.txt" 2>&1
JOBS=1 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp masked_regression > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-600 "$f" | head -60; done
