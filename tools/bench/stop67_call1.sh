#!/usr/bin/env bash
# Stop 67's first GPU call (pack gpuN: gpu_tests and attn_bench with the dropout decisions drawn
# ahead of the forward by attnKeepDrawKernel, attention.cu built with -lineinfo; attn_bench_old: the
# same tool at 2679e12, the decisions drawn inside the forward). The whole GPU suite; attn_bench at
# the GPT-2 shape, old and new, mma.sync and wgmma forward at head tile 64, beside PyTorch's flash
# SDPA; then Nsight Compute on the new forward with dropout (source counters: executed instructions
# per SASS line), the draw kernel, and the forward without dropout.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2"
timeout 240 gpu_tests > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=|tests ran" $R/gpu_tests.txt
grep -E "Failure" -A6 $R/gpu_tests.txt | head -30
for b in attn_bench_old attn_bench; do
  for w in 0 1; do
    echo "# $b AMPC_ATTENTION_WGMMA64=$w" | tee -a $R/attn_bench.txt
    AMPC_ATTENTION_WGMMA64=$w timeout 40 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels 2>&1 | tee -a $R/attn_bench.txt | grep -E "bf16"
  done
done
timeout 60 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; tail -8 $R/sdpa_ref.txt
src() {  # name, kernel regex, env value, dropout
  AMPC_ATTENTION_WGMMA64=$3 timeout 100 ncu --clock-control none --section SourceCounters --section LaunchStats --section Occupancy \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --import-source no --kernel-name "regex:$2" \
    --launch-skip 1 --launch-count 1 -o $R/$1 attn_bench $args --dropout $4 > $R/ncu_$1.log 2>&1
  echo "$1 rc=$?"
  timeout 60 ncu --import $R/$1.ncu-rep --page source --csv --print-source sass > $R/sass_$1.csv 2>&1
  timeout 60 ncu --import $R/$1.ncu-rep --page details > $R/details_$1.txt 2>&1
  wc -l $R/sass_$1.csv; grep -E "Duration|Issue Slots Busy|One or More Eligible|Registers Per|Warp Cycles Per Issued|Executed Instructions  " $R/details_$1.txt | head
}
src fwd_wg_dropout attnFwdWgKernel 1 0.1
src keep_draw attnKeepDraw 1 0.1
src fwd_wg_nodrop attnFwdWgKernel 1 0
rm -f $R/*.ncu-rep
tar -cJf "$OUT/call1.tar.xz" -C $R .
ls -la $OUT
