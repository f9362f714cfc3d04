#!/usr/bin/env bash
# Stop 63's last chance at a GPU (under 5 minutes of device time left): gpu_tests only, the
# measured GEMM and convolution algorithms' test first, then stop 62's GpuAttention cases (pack gpuC).
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
cp $R/gpu.txt "$OUT/gpu.txt"
timeout 60 gpu_tests --gtest_filter='*AlgorithmsMeasured*' > "$OUT/gpu_tests_algos.txt" 2>&1
echo "gpu_tests rc=$?" >> "$OUT/gpu_tests_algos.txt"
timeout ${TESTS_S:-150} gpu_tests --gtest_filter='GpuAttention.ForwardAndBackwardMatchTheCpu:*Deterministic*:GpuAttention.OperandsInPlaceMatchTheCpu' > "$OUT/gpu_tests_attention.txt" 2>&1
echo "gpu_tests rc=$?" >> "$OUT/gpu_tests_attention.txt"
grep -hE "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" "$OUT"/gpu_tests_*.txt
