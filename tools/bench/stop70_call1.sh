#!/usr/bin/env bash
# Stop 70, one GPU call for both of stop 69's unrun checks, from pack gpuW (gpu_tests built at 2ed108f
# with results/2026-12-07i-h100/bwd_wg128.patch, so it holds where_masked's GPU cases too):
#   rm -rf .gpu; tar -xJf .gpuz/gpuW.tar.xz && bash tools/bench/stop70_call1.sh
# 1. GpuAttention but cuDNN's with the patch (wgmma backward at head 128 too);
# 2. the cases holding where_masked (ForwardAndBackward, OperandsInPlace) again under AMPC_ATTENTION_BWD_MMA_SYNC=1 (the mma.sync
#    backward), so a failure there tells the patch from where_masked;
# 3. the bench at the Llama and GPT-2 shapes, wgmma against mma.sync backward, alternating.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
run_gpu_tests 150 'GpuAttention.*:-GpuAttention.Cudnn*'
mv $R/gpu_tests.txt $R/gpu_tests_wg.txt
AMPC_ATTENTION_BWD_MMA_SYNC=1 run_gpu_tests 90 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*'
mv $R/gpu_tests.txt $R/gpu_tests_sync.txt
bash "$bench/stop70_bwd_wg128.sh" bench
# 4. Nsight Compute on the head-64 wgmma backward at the GPT-2 shape with dropout: where it stalls,
#    and what its dQ atomics cost L2 (SASS with execution counts kept in the report).
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2 --dropout 0.1"
timeout 90 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --section SourceCounters \
  --kernel-name "regex:attnBwdMma" --launch-skip 1 --launch-count 1 -o $R/ncu_bwd attn_bench_wg128 $args > $R/ncu_bwd.txt 2>&1
echo "ncu rc=$?"
timeout 40 ncu --import $R/ncu_bwd.ncu-rep --print-summary none > $R/ncu_bwd_details.txt 2>&1
grep -E "Duration|Executed Instructions  |Achieved Occupancy|Issue Slots Busy|Registers Per|L2 Cache Throughput|Stall|Warp Cycles" $R/ncu_bwd_details.txt | head -20
timeout 60 ncu --import $R/ncu_bwd.ncu-rep --page source --csv --print-source sass > $R/ncu_bwd_sass.csv 2>&1
xz -9 $R/ncu_bwd_sass.csv
