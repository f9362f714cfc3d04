#!/usr/bin/env bash
# Stop 68's second GPU call (it never ran: no machine came; for the next stop): the committed tree (the head-64 wgmma forward in two stages at four
# blocks a SM) through the whole GPU suite and attn_bench. Pack gpuS: gpu_tests, attn_bench and ampc
# (GpuFused's kernels come from it): tools/bench/pack.sh gpuS build/tests/gpu_tests
# build/tools/attn_bench build/tools/ampc; on the GPU machine (carry .gpuz/gpuS.tar.xz):
#   rm -rf .gpu; tar -xJf .gpuz/gpuS.tar.xz && bash tools/bench/stop68_call2.sh
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
R=$OUT
cp /tmp/r/gpu.txt $R/ 2>/dev/null
AMPC_BIN=$(command -v ampc) timeout 200 gpu_tests > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|rc=" $R/gpu_tests.txt | head -30; grep -E "Failure" -A6 $R/gpu_tests.txt | head -20
timeout 30 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
echo "# Llama shape" >> $R/attn_bench.txt
timeout 60 attn_bench --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
grep -E "#|bf16" $R/attn_bench.txt
# Nsight Compute (where device time is left): the draw kernel and the head-64 wgmma forward with
# dropout, their SASS with execution counts kept (ncu --import F.ncu-rep --page source --csv
# --print-source sass) and their occupancy and stall reasons.
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2 --dropout 0.1"
for k in attnKeepDraw attnFwdWg; do
  timeout 60 ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters --kernel-name "regex:$k" --launch-skip 1 --launch-count 1 \
    -o $R/ncu_$k attn_bench $args > $R/ncu_$k.txt 2>&1
  echo "ncu $k rc=$?"
  timeout 30 ncu --import $R/ncu_$k.ncu-rep --print-summary none > $R/ncu_${k}_details.txt 2>&1
  grep -E "Duration|Executed Instructions  |Achieved Occupancy|Issue Slots Busy|Registers Per" $R/ncu_${k}_details.txt | head -8
done
