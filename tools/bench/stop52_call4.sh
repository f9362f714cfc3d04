#!/usr/bin/env bash
# Stop 52's fourth GPU call: the library models on the CUDA backend. The CPUs export them (PyTorch's
# dynamo exporter, torchvision_sweep.py --export-only); then each trains 3 fp32 SGD steps on CUDA
# against the CPU backend and 3 bf16 steps on CUDA (tools/sweep/cuda_vs_cpu.sh), while the committed
# zoo runs on CUDA against PyTorch (zoo_tests).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
t0=$(date +%s); stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
exp=/tmp/exported; mkdir -p $exp
models=${MODELS:-$(grep -v '^#' tools/sweep/library_models.txt | grep -v '^ *$' | grep -vE '@(192|224|240|256)$' | tac)}
n=14
stamp export
for ((i = 0; i < n; i++)); do
  OMP_NUM_THREADS=1 timeout ${EXPORT_LIMIT:-110} python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
    --out $exp --exporter dynamo --export-only --model-limit 60 --shard "$i/$n" $models > $exp/shard$i.txt 2>&1 &
done
wait
cat $exp/shard*.txt | grep -E "^[a-zA-Z_0-9:@.-]+ +[A-Z-]+ " | awk '{print $2}' | sort | uniq -c
done_=$(cat $exp/shard*.txt | grep -E " EXPORTED " | awk '{print $1}')
stamp cuda_vs_cpu
(AMPC_ZOO_DIR=$root/models/zoo AMPC_ZOO_DEVICE=cuda AMPC_ZOO_BIN=$root/.gpu/bin timeout ${ZOO_LIMIT:-300} zoo_tests > "$OUT/zoo_cuda.txt" 2>&1) &
JOBS=${JOBS:-6} timeout ${CUDA_LIMIT:-290} bash tools/sweep/cuda_vs_cpu.sh $exp $done_ > "$OUT/cuda_vs_cpu.txt" 2>&1
echo "cuda_vs_cpu exit $?"
wait
awk '{print $2, $3}' "$OUT/cuda_vs_cpu.txt" | sed 's/fp32//' | sort | uniq -c
grep -v " PASS fp32" "$OUT/cuda_vs_cpu.txt" | cut -c1-400
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' "$OUT/zoo_cuda.txt" | head -20
stamp done
