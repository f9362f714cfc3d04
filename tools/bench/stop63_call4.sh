#!/usr/bin/env bash
# Stop 63's last chance at a GPU (under 5 minutes of device time left): gpu_tests only, the
# measured GEMM and convolution algorithms' test first, then stop 62's GpuAttention cases (pack gpuC).
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
timeout ${TESTS_S:-170} gpu_tests --gtest_filter='*AlgorithmsMeasured*:GpuAttention.ForwardAndBackwardMatchTheCpu:*Deterministic*:GpuAttention.OperandsInPlaceMatchTheCpu' > "$OUT/gpu_tests.txt" 2>&1
echo "gpu_tests rc=$?" >> "$OUT/gpu_tests.txt"
cp $R/gpu.txt "$OUT/gpu.txt"
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" "$OUT/gpu_tests.txt"
