#!/usr/bin/env bash
# Stop 69: the GPU suite from a pack of gpu_tests, on the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/NAME.tar.xz && bash tools/bench/stop69_suite.sh [FILTER]
# FILTER: a gtest filter, by default the whole suite but GpuFused (its pack would hold ampc, too
# large to carry). Run with pack gpuU (stop69_bwd_wg.sh builds it): the wgmma backward's suite.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
timeout 280 gpu_tests --gtest_filter="${1:--GpuFused.*}" > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|rc=" $R/gpu_tests.txt | head -30; grep -E "Failure" -B2 -A8 $R/gpu_tests.txt | head -60
tail -3 $R/gpu_tests.txt
