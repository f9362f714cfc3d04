#!/usr/bin/env bash
# Stop 60's second GPU call: the tree as committed (HEAD's kernels: stop 59's forward, the four-warp
# backward) through GpuAttention and attn_bench at the GPT-2 and Llama shapes, beside PyTorch's SDPA;
# and attn_bench_lb3, the same backward at three blocks a SM (launch bounds 128, 3: 168 registers,
# 428 bytes spilled; two cp.async stages so that three blocks' shared memory fits), against it.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
G="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels"
L="--bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels"
timeout 60 attn_bench $G > $R/head_gpt2_1.txt 2>&1
timeout 60 "$root/.gpu/bin/attn_bench_lb3" $G > $R/lb3_gpt2_1.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > $R/sdpa_ref.txt 2>&1
timeout 60 attn_bench $G > $R/head_gpt2_2.txt 2>&1
timeout 60 "$root/.gpu/bin/attn_bench_lb3" $G > $R/lb3_gpt2_2.txt 2>&1
timeout 90 attn_bench $L > $R/head_llama_1.txt 2>&1
timeout 90 attn_bench $L > $R/head_llama_2.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --b 4 --h 32 --kv-heads 8 --t 2048 --d 128 --cudnn > $R/sdpa_ref_llama.txt 2>&1
timeout 240 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
tar -cJf "$OUT/call2.tar.xz" -C $R .
for f in $R/*.txt; do echo "== $(basename $f)"; cut -c1-160 "$f" | grep -v "^\[ *OK\|^\[ RUN\|^ *$" | tail -9; done
