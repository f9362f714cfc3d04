#!/usr/bin/env bash
# Stop 69: the GPU suite from a pack of gpu_tests, on the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/NAME.tar.xz && bash tools/bench/stop69_suite.sh [FILTER]
# FILTER: a gtest filter, by default the whole suite but GpuFused (its pack would hold ampc, too
# large to carry). Run with pack gpuU (stop69_bwd_wg.sh builds it): the wgmma backward's suite.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
run_gpu_tests 280 "${1:--GpuFused.*}"
