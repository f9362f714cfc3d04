#!/usr/bin/env bash
# Stop 66's fifth GPU call (pack gpuM: gpu_tests, attn_bench; the wgmma forward now the default at
# head tile 64), kept short for the device time left: the attention, dropout, determinism and
# training-step GPU tests, attn_bench at the GPT-2 shape by default and with AMPC_ATTENTION_WGMMA64=0
# (mma.sync), and PyTorch's flash SDPA where time is left.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
timeout 200 gpu_tests --gtest_filter='GpuAttention.*:GpuDropout.*:GpuDeterministic.*:GpuTrainStep.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests.txt
grep -E "Failure" -A8 $R/gpu_tests.txt | head -30
cp $R/gpu_tests.txt "$OUT/"
for w in default 0; do
  echo "# attn_bench AMPC_ATTENTION_WGMMA64=$w"
  ( [ $w = default ] || export AMPC_ATTENTION_WGMMA64=$w; timeout 40 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels 2>&1 | grep -E "bf16" )
done
[ $SECONDS -lt 170 ] || exit 0
timeout 50 python3 "$bench/sdpa_ref.py" 2>&1 | grep "back to back"
