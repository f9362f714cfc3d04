#!/usr/bin/env bash
# Stop 50's call when little device time is left: the library sweep on the CPUs (LIMIT seconds) while
# the GPU runs stop 49's GPU tests, the training step's and gradient accumulation on CUDA against the CPU.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib" /tmp/acc
SHARDS=14 MODEL_LIMIT=${MODEL_LIMIT:-90} LIMIT=${LIMIT:-170} OUT=$OUT/lib bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
timeout 120 gpu_tests --gtest_filter='*GpuOps.*:GpuAttention.*:GpuProgram.*:GpuFused.*:GpuTrainStep.*' > "$OUT/gpu_tests.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' "$OUT/gpu_tests.txt" | head -30
bash "$bench/accumulate_check.sh"
wait
cat "$OUT/lib/summary.txt"
