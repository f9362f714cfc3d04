#!/usr/bin/env bash
# Stop 66's third GPU call (pack gpuL): where the head-64 forward's time goes. Nsight Compute (full
# set, clocks left alone) on one launch each of the wgmma forward (AMPC_ATTENTION_WGMMA64=1), the
# pipelined one (2) and the backward, at the GPT-2 shape, causal, dropout 0.1; and on the forward
# without dropout (1).
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
args="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 2"
prof() {  # name, kernel regex, env value, dropout
  AMPC_ATTENTION_WGMMA64=$3 timeout 150 ncu --clock-control none --set full --import-source no --kernel-name "regex:$2" \
    --launch-skip 1 --launch-count 1 attn_bench $args --dropout $4 > $R/ncu_$1.txt 2>&1
  echo "$1 rc=$?"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Executed Ipc A|No Eligible|Stall|Warp Cycles Per Issued" $R/ncu_$1.txt | head -30
}
prof fwd_wg_dropout attnFwdWgKernel 1 0.1
prof fwd_pipe_dropout attnFwdWgPipe 2 0.1
prof fwd_wg_nodrop attnFwdWgKernel 1 0
prof bwd_dropout attnBwdMma 1 0.1
cp $R/ncu_*.txt "$OUT/"
