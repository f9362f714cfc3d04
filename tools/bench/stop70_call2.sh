#!/usr/bin/env bash
# Stop 70, the GPU call (replaces stop70_call1.sh's pack gpuW): pack gpuX, gpu_tests and attn_bench_x
# built with results/2026-12-08a/wg128_dq_bulk.patch (stop 69's head-128 wgmma backward, and the
# head-64 wgmma backward's dQ tiles added by bulk reductions, AMPC_ATTENTION_DQ_ATOMICS=1 for the
# reds) on the tree at 2ed108f+ (where_masked's GPU cases). On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuX.tar.xz && bash tools/bench/stop70_call2.sh
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
# 1. GpuAttention but cuDNN's, and GpuDropout, as built (both patches on).
run_gpu_tests 150 'GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*'
mv $R/gpu_tests.txt $R/gpu_tests_x.txt
# 2. Where any failed: the cases holding where_masked with the mma.sync backward (neither patch's
#    code runs), to tell the patches from where_masked.
if ! grep -q "gpu_tests rc=0" $R/gpu_tests_x.txt; then
  AMPC_ATTENTION_BWD_MMA_SYNC=1 run_gpu_tests 90 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*'
  mv $R/gpu_tests.txt $R/gpu_tests_sync.txt
fi
# 3. attn_bench, three backwards alternating: wgmma with bulk dQ, wgmma with reds, mma.sync.
b=attn_bench_x
for k in 1 2; do
  for e in bulk red sync; do
    env=(); [ $e = red ] && env=(AMPC_ATTENTION_DQ_ATOMICS=1); [ $e = sync ] && env=(AMPC_ATTENTION_BWD_MMA_SYNC=1)
    echo "# $e GPT-2" >> $R/attn_bench.txt
    env "${env[@]}" timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    echo "# $e Llama" >> $R/attn_bench.txt
    env "${env[@]}" timeout 60 $b --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
done
grep -E "#|bf16" $R/attn_bench.txt
# 4. Nsight Compute on the head-64 wgmma backward (bulk dQ) at the GPT-2 shape with dropout.
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2 --dropout 0.1"
timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters \
  --kernel-name "regex:attnBwdMma" --launch-skip 1 --launch-count 1 -o $R/ncu_bwd $b $args > $R/ncu_bwd.txt 2>&1
echo "ncu rc=$?"
timeout 40 ncu --import $R/ncu_bwd.ncu-rep --print-summary none > $R/ncu_bwd_details.txt 2>&1
grep -E "Duration|Executed Instructions  |Achieved Occupancy|Issue Slots Busy|Registers Per|L2 Cache Throughput|Stall|Warp Cycles" $R/ncu_bwd_details.txt | head -20
timeout 60 ncu --import $R/ncu_bwd.ncu-rep --page source --csv --print-source sass > $R/ncu_bwd_sass.csv 2>&1
xz -9 $R/ncu_bwd_sass.csv
