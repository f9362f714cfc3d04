#!/usr/bin/env bash
# For the next stop's first GPU call (stop 67 left these built but never run): builds, on this
# machine, attn_bench for three variants of the attention kernels and gpu_tests for the last, and
# packs them as gpuQ; then the GPU call is `bash tools/bench/stop67_next.sh run` (carry
# .gpuz/gpuQ.tar.xz; command: rm -rf .gpu; tar -xJf .gpuz/gpuQ.tar.xz && bash tools/bench/stop67_next.sh run).
#   attn_bench      the committed kernels (draw kernel v2)
#   attn_bench_v3   + results/2026-12-07e-h100/keep_draw_v3.patch (a draw block a query tile)
#   attn_bench_v3s2 + wg64_two_stages_four_blocks.patch (the head-64 wgmma forward in two stages,
#                   at most 128 registers: four blocks a SM)
#   gpu_tests       built with both patches (GpuAttention and GpuDropout check both against the CPU)
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
P=$root/tools/bench/results/2026-12-07e-h100
if [ "${1:-}" = run ]; then
  source "$bench/call_env.sh"
  R=$OUT
  timeout 90 gpu_tests --gtest_filter='GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*' > $R/gpu_tests_attention.txt 2>&1
  echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests_attention.txt; grep -E "Failure" -A6 $R/gpu_tests_attention.txt | head -20
  for b in attn_bench attn_bench_v3 attn_bench_v3s2; do
    echo "# $b" >> $R/attn_bench.txt
    timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
  echo "# attn_bench_v3s2 Llama shape" >> $R/attn_bench.txt
  timeout 60 attn_bench_v3s2 --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  grep -E "#|bf16" $R/attn_bench.txt
  timeout 50 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; grep -E "causal" $R/sdpa_ref.txt | tail -4
  exit 0
fi
cd "$root"
git diff --quiet kernels/cuda/attention.cu || { echo "attention.cu has local changes" >&2; exit 1; }
restore() { git checkout -q kernels/cuda/attention.cu; }
trap restore EXIT
ninja -C build tools/attn_bench tests/gpu_tests >/dev/null || exit 1
mkdir -p build/variants
cp build/tools/attn_bench build/variants/attn_bench
git apply "$P/keep_draw_v3.patch" && ninja -C build tools/attn_bench >/dev/null && cp build/tools/attn_bench build/variants/attn_bench_v3 || exit 1
git apply "$P/wg64_two_stages_four_blocks.patch" && ninja -C build tools/attn_bench tests/gpu_tests >/dev/null || exit 1
cp build/tools/attn_bench build/variants/attn_bench_v3s2
cp build/tests/gpu_tests build/variants/gpu_tests
restore
ninja -C build tools/attn_bench tests/gpu_tests >/dev/null  # the committed build again
tools/bench/pack.sh gpuQ build/variants/gpu_tests build/variants/attn_bench build/variants/attn_bench_v3 build/variants/attn_bench_v3s2
