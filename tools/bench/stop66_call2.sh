#!/usr/bin/env bash
# Stop 66's second GPU call (pack gpuL: gpu_tests, attn_bench): the pipelined head-64 wgmma forward
# (AMPC_ATTENTION_WGMMA64=2) against the CPU (GpuAttention, four forward passes), then attn_bench at the
# GPT-2 shape with each head-64 forward (0 mma.sync, 1 wgmma, 2 pipelined wgmma, 3 the same with two warpgroups a block) and PyTorch's flash
# SDPA in the same call; then the whole GPU suite with the pipelined forward.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
timeout 200 gpu_tests --gtest_filter='GpuAttention.*:GpuDropout.*' > $R/gpu_attention.txt 2>&1
echo "gpu_tests attention rc=$?" >> $R/gpu_attention.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_attention.txt
grep -E "Failure" -A8 $R/gpu_attention.txt | head -40
for w in 0 1 2 3; do
  echo "# attn_bench AMPC_ATTENTION_WGMMA64=$w"
  AMPC_ATTENTION_WGMMA64=$w timeout 40 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels 2>&1 | grep -E "bf16"
done
timeout 60 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; tail -8 $R/sdpa_ref.txt
AMPC_ATTENTION_WGMMA64=2 timeout 300 gpu_tests --gtest_filter='-GpuAttention.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rest rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests.txt
grep -E "Failure" -A6 $R/gpu_tests.txt | head -30
tar -cJf "$OUT/call2.tar.xz" -C $R .
