#!/usr/bin/env bash
# Stop 62's first GPU call (pack gpuA: gpu_tests, amprun, attn_bench): GpuAttention, with stop 61's
# shared-bias gradient through per-score parts (maskGradInParts, never run on a GPU before) and its
# case mma_bias_shared_over_batch; then attn_bench at issue 22's GPT-2 and Llama shapes beside
# PyTorch's SDPA in the same call.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
timeout ${TEST_LIMIT:-300} gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests_attention.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
G="--bh 96 --seq 1024 --dim 64 --layout gpt2"
L="--bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8"
timeout 60 attn_bench $G --attention kernels > $R/bench_gpt2.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > $R/sdpa_ref_gpt2.txt 2>&1
timeout 90 attn_bench $L --attention auto > $R/bench_llama.txt 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --b 4 --h 32 --kv-heads 8 --t 2048 --d 128 --cudnn > $R/sdpa_ref_llama.txt 2>&1
if [ -n "${MORE_TESTS:-}" ]; then
  timeout ${MORE_LIMIT:-200} gpu_tests --gtest_filter="$MORE_TESTS" > $R/gpu_tests_more.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests_more.txt
fi
tar -cJf "$OUT/call1.tar.xz" -C $R .
grep -E "^\[  (PASSED|FAILED) |FAILED  \]|rc=" $R/gpu_tests_*.txt | cut -c1-200 | tail -20
grep -B2 -A12 "Failure" $R/gpu_tests_*.txt | head -40
for f in $R/bench_*.txt $R/sdpa_ref_*.txt; do echo "== $(basename $f)"; cut -c1-160 "$f" | tail -8; done
