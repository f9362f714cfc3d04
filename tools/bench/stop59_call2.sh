#!/usr/bin/env bash
# Stop 59's second GPU call: the head-64 forward with two m-tiles a warp (attnFwdMmaKernel MT 2, 128
# queries a block) against the one-m-tile kernel (AMPC_ATTENTION_FWD_MT1=1, the same binary) and the
# previous build (attn_bench_old), beside PyTorch's SDPA; GpuAttention against the CPU. (The ncu
# profiles planned here were cut: refused starts had used most of the device time.) Everything under $OUT
# goes into one tarball (a call brings back a few files only).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout 300 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
G="--bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels"
L="--bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels"
timeout 60 attn_bench $G > $R/mt2_gpt2_1.txt 2>&1
AMPC_ATTENTION_FWD_MT1=1 timeout 60 attn_bench $G > $R/mt1_gpt2.txt 2>&1
timeout 60 "$root/.gpu/bin/attn_bench_old" $G > $R/old_gpt2.txt 2>&1
timeout 60 attn_bench $G > $R/mt2_gpt2_2.txt 2>&1
timeout 90 attn_bench $L > $R/new_llama.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > $R/sdpa_ref.txt 2>&1
for f in $R/*.txt; do echo "== $(basename $f)"; cut -c1-300 "$f" | grep -v "^\[ *OK\|^\[ RUN" | tail -8; done
tar -cJf "$OUT/call2.tar.xz" -C $R .
