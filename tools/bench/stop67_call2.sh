#!/usr/bin/env bash
# Stop 67's second GPU call (pack gpuN: gpu_tests and attn_bench with the dropout decisions drawn
# ahead of the forward by attnKeepDrawKernel v2 (no divisions; shared-memory ORs instead of quad
# transposes), the wgmma forward's row loads (RowTiles) and live-tile end, and the wgmma forward the
# default at head tile 64; attn_bench_old: the same tool at 2679e12, the decisions drawn inside the
# forward). Lean, and each result written to $OUT as it comes (little device time was left):
# GpuAttention (but cuDNN's) and GpuDropout against the CPU; attn_bench at the GPT-2 shape, causal,
# old and new, mma.sync and wgmma forward at head tile 64; PyTorch's flash SDPA; the rest of the GPU
# suite (but cuDNN's attention tests and GpuFused: the pack holds no ampc); Nsight Compute on the
# draw kernel.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
R=$OUT
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2"
timeout 80 gpu_tests --gtest_filter='GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*' > $R/gpu_tests_attention.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=|tests ran" $R/gpu_tests_attention.txt
grep -E "Failure" -A6 $R/gpu_tests_attention.txt | head -30
for b in attn_bench_old attn_bench; do
  for w in 0 1; do
    echo "# $b AMPC_ATTENTION_WGMMA64=$w" >> $R/attn_bench.txt
    AMPC_ATTENTION_WGMMA64=$w timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
done
cat $R/attn_bench.txt | grep -E "#|bf16"
timeout 50 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; grep -E "causal" $R/sdpa_ref.txt | tail -4
timeout 100 gpu_tests --gtest_filter='-GpuFused.*:GpuAttention.*:GpuDropout.*' > $R/gpu_tests_rest.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests_rest.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=|tests ran" $R/gpu_tests_rest.txt
timeout 40 ncu --clock-control none --section SpeedOfLight --section InstructionStats --kernel-name "regex:attnKeepDraw" \
  --launch-skip 1 --launch-count 1 attn_bench $args --dropout 0.1 > $R/ncu_keep_draw.txt 2>&1
echo "ncu rc=$?"; grep -E "Duration|Executed Instructions  |Compute \(SM\)" $R/ncu_keep_draw.txt
