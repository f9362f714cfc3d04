#!/usr/bin/env bash
# For the next stop, after stop69_call1.sh (same pack, gpuT; or any pack with attn_bench):
#   rm -rf .gpu; tar -xJf .gpuz/gpuT.tar.xz && bash tools/bench/stop69_call2.sh
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
R=$OUT
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
