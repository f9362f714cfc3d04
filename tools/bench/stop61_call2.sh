#!/usr/bin/env bash
# Stop 61's second GPU call: GpuAttention (a trained bias shared over the batch now sums its
# gradient through per-score parts: maskGradInParts), then attn_bench's GPT-2 point as a check that
# nothing else moved. Carries gpu_tests and amprun only (.gpuz/gpu.tar.xz of stop61_pack.sh A).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout ${TEST_LIMIT:-240} gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
grep -E "^\[  (PASSED|FAILED) |OK \]|FAILED  \]|rc=" $R/gpu_tests_attention.txt | cut -c1-200 | tail -14
grep -B2 -A12 "Failure" $R/gpu_tests_attention.txt | head -60
tar -cJf "$OUT/call2.tar.xz" -C $R .
