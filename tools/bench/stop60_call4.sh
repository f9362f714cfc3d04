#!/usr/bin/env bash
# Stop 60's fourth GPU call: the split backward as it is committed (head tile 64: two 32-query
# sub-tiles, 168 registers and three blocks a SM without a trained mask, two stages; head tile 128's
# code kept in HEAD's order) against HEAD's backward (attn_bench_head), GPT-2 and Llama shapes,
# interleaved; GpuAttention (the occupancy test asks three blocks at head 64).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
G="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels"
L="--bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels"
B=$root/.gpu/bin
for i in 1 2; do
  for v in head new; do timeout 60 $B/attn_bench_$v $G > $R/${v}_gpt2_$i.txt 2>&1; done
done
for v in head new; do timeout 90 $B/attn_bench_$v $L > $R/${v}_llama.txt 2>&1; done
timeout 240 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
tar -cJf "$OUT/call4.tar.xz" -C $R .
for f in $R/*.txt; do echo "== $(basename $f)"; cut -c1-160 "$f" | grep -v "^\[ *OK\|^\[ RUN\|^ *$" | tail -9; done
