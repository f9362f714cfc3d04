#!/usr/bin/env bash
# Stop 52's GPU call. The machine's CPUs run the library sweep on (a) the models stop 51 left as
# MISMATCH whose files it did not bring back (hfimg:swinv2's 3 steps, resnest14d, dpn48b), (b) the
# three that timed out at 90 s, with more time, and (c) the families added to library_models.txt this
# stop. Meanwhile the GPU runs the CUDA op tests (their suite is Dtypes/GpuOps: stop 51's filter
# named none) and the other GPU suites.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib"
again="hfimg:swinv2 timm:resnest14d timm:dpn48b timm:davit_tiny@224 timm:focalnet_tiny_srf@224 timm:sequencer2d_s@224"
new=$(sed -n '/^# Stop 52/,$p' tools/sweep/library_models.txt | grep -v '^#' | grep -v '^ *$')
MODELS="$again $new" SHARDS=${SHARDS:-14} MODEL_LIMIT=${MODEL_LIMIT:-150} LIMIT=${LIMIT:-330} PACK_MB=${PACK_MB:-90} OUT=$OUT/lib \
  bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
AMPC_MODELS_DIR=$root/.gpu/models timeout ${GPU_LIMIT:-300} gpu_tests --gtest_filter='*GpuOps*:GpuAttention.*:GpuDropout.*:GpuConvert.*:GpuOverflow.*:GpuDeterministic.*:*GpuModels*:GpuTrainStep.*' \
  > "$OUT/gpu_tests.txt" 2>&1
echo "gpu_tests exit $?"
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]|^\[       OK' "$OUT/gpu_tests.txt" | cut -c1-160 | tail -60
wait
cat "$OUT/lib/summary.txt"
