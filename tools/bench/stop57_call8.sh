#!/usr/bin/env bash
# Stop 57's eighth GPU call: Unique at run time (prototypes: torch.unique's classes, index_add, a
# cross-entropy over them; embedding_max_norm: the dynamo exporter's renorm through Unique) under the
# dynamo exporter, fp32 / bf16 against PyTorch, CUDA against the CPU; the stop's other probes again
# after the scatter rewrite (moe_loop, masked_regression, masked_selection).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sweep() { OMP_NUM_THREADS=1 timeout 240 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 150 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ " | cut -c1-600; }
sweep --out /tmp/p1 --exporter dynamo prototypes embedding_max_norm > "$OUT/fp32_1.txt" &
sweep --out /tmp/p2 --exporter dynamo moe_loop masked_regression masked_selection > "$OUT/fp32_2.txt" &
sweep --out /tmp/q1 --exporter dynamo --amp bf16 prototypes embedding_max_norm > "$OUT/bf16.txt" &
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only prototypes embedding_max_norm > /dev/null 2>&1
for m in prototypes embedding_max_norm; do
  f=$exp/$m/$m.onnx
  node=$(ampc $f --summary 2>&1 >/dev/null | grep -o "node '[^']*'" | head -1 | cut -d"'" -f2)
  [ -n "$node" ] && timeout 30 python3 tools/bench/stop57_chain.py $f "$node" 5 > "$OUT/chain_$m.txt" 2>&1
done
JOBS=2 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp prototypes embedding_max_norm > "$OUT/cuda_vs_cpu.txt" 2>&1
wait
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-600 "$f" | head -40; done
