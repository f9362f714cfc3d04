#!/usr/bin/env bash
# Stop 53's first GPU call. The GPU runs every CUDA test (stop 52's kernels shared between fused
# groups that differ only in names ran on no GPU), while the machine's CPUs and the GPU run the
# library models' mixed-precision check (tools/sweep/library_sweep.sh with AMP=bf16: ampc's bf16 loss
# and first-step gradients against f64, beside PyTorch's CUDA autocast on the same weights and batch).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib"
# The library's models and the sweep's own (MODELS: torchvision's, the small probes)
models="$(grep -v '^#' tools/sweep/library_models.txt | grep -v '^ *$' | grep -vE '@(192|224|240|256)$') $(cd tools/sweep && python3 -c 'import torchvision_sweep as t; print(" ".join(t.MODELS))')"
MODELS=$models AMP=bf16 SHARDS=${SHARDS:-14} MODEL_LIMIT=${MODEL_LIMIT:-100} LIMIT=${LIMIT:-420} PACK_MB=${PACK_MB:-40} OUT=$OUT/lib \
  bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
AMPC_MODELS_DIR=$root/.gpu/models timeout ${GPU_LIMIT:-330} gpu_tests > "$OUT/gpu_tests.txt" 2>&1
echo "gpu_tests exit $?"
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]|SKIPPED \] [0-9]' "$OUT/gpu_tests.txt" | cut -c1-160 | tail -30
wait
cat "$OUT/lib/summary.txt"
# The new ReduceMax / Max gradients (ties shared, or to the first index) on CUDA against the CPU
# backend: amax (textcnn), adaptive max pooling, and max_ties (torch.maximum, amax, max(dim), pooling to 1).
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 120 python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only textcnn_padding_idx adaptive_max max_ties 2>&1 | grep -E " [A-Z-]+ " | cut -c1-200
JOBS=3 timeout 120 bash tools/sweep/cuda_vs_cpu.sh $exp textcnn_padding_idx adaptive_max max_ties 2>&1 | cut -c1-400
