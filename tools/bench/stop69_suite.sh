#!/usr/bin/env bash
# Stop 69: the GPU suite (without GpuFused: its pack would hold ampc, too large to carry) with the
# wgmma backward the default at head tile 64, from pack gpuU (stop69_bwd_wg.sh builds it). On the GPU
# machine: rm -rf .gpu; tar -xJf .gpuz/gpuU.tar.xz && bash tools/bench/stop69_suite.sh
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
timeout 280 gpu_tests --gtest_filter='-GpuFused.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|rc=" $R/gpu_tests.txt | head -30; grep -E "Failure" -A8 $R/gpu_tests.txt | head -40
tail -3 $R/gpu_tests.txt
