#!/usr/bin/env bash
# Stop 60's third GPU call: the head-64 backward taking each 64-query tile in two sub-tiles of 32
# (S^T and dP^T in half the registers): attn_bench_split3 (168 registers, three blocks a SM, two
# cp.async stages; the build's default, which gpu_tests runs) and attn_bench_split2 (no register
# bound, two blocks, three stages) against HEAD's backward (attn_bench_head), at the GPT-2 and Llama
# shapes; GpuAttention on the split build.
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
  for v in head split3 split2; do timeout 60 $B/attn_bench_$v $G > $R/${v}_gpt2_$i.txt 2>&1; done
done
timeout 90 $B/attn_bench_head $L > $R/head_llama.txt 2>&1
timeout 90 $B/attn_bench_split3 $L > $R/split3_llama.txt 2>&1
timeout 240 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
tar -cJf "$OUT/call3.tar.xz" -C $R .
for f in $R/*.txt; do echo "== $(basename $f)"; cut -c1-160 "$f" | grep -v "^\[ *OK\|^\[ RUN\|^ *$" | tail -9; done
