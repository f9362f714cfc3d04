#!/usr/bin/env bash
# Stop 60's first GPU call: the head-64 forward stop 59 committed without a GPU (one m-tile a warp,
# three blocks a SM) and this stop's eight-warp backward (128 keys a block, AMPC_ATTENTION_BWD_KB128=1)
# against the four-warp one, through GpuAttention (its second pass runs the eight-warp backward) and
# attn_bench at the GPT-2 and Llama shapes, beside PyTorch's SDPA in the same call; then ncu's stall
# breakdown of the GPT-2-shape backward (both) and forward (causal, dropout 0.1). Everything under
# $OUT goes into one tarball.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout 240 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
G="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels"
L="--bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels"
timeout 60 attn_bench $G > $R/w4_gpt2_1.txt 2>&1
AMPC_ATTENTION_BWD_KB128=1 timeout 60 attn_bench $G > $R/w8_gpt2_1.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > $R/sdpa_ref.txt 2>&1
timeout 60 attn_bench $G > $R/w4_gpt2_2.txt 2>&1
AMPC_ATTENTION_BWD_KB128=1 timeout 60 attn_bench $G > $R/w8_gpt2_2.txt 2>&1
timeout 90 attn_bench $L > $R/llama.txt 2>&1
S="--section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis"
timeout 90 ncu --kernel-name regex:attnBwdMma --launch-skip 3 --launch-count 1 $S attn_bench $G --mask causal --dropout 0.1 --reps 3 > $R/ncu_bwd_w4.txt 2>&1
AMPC_ATTENTION_BWD_KB128=1 timeout 90 ncu --kernel-name regex:attnBwdMma --launch-skip 3 --launch-count 1 $S attn_bench $G --mask causal --dropout 0.1 --reps 3 > $R/ncu_bwd_w8.txt 2>&1
timeout 90 ncu --kernel-name regex:attnFwdMma --launch-skip 3 --launch-count 1 $S attn_bench $G --mask causal --dropout 0.1 --reps 3 > $R/ncu_fwd.txt 2>&1
tar -cJf "$OUT/call1.tar.xz" -C $R .
for f in $R/*.txt; do echo "== $(basename $f)"; cut -c1-160 "$f" | grep -v "^\[ *OK\|^\[ RUN\|^==PROF\|^ *----\|^ *$" | tail -12; done
