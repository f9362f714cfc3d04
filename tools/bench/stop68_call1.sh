#!/usr/bin/env bash
# Stop 68's first GPU call. Built here (no argument): attn_bench from the working tree (its forward
# at head tile 64: the wgmma one, or with AMPC_ATTENTION_WG_PIPE=1 the one that overlaps consecutive
# key tiles' products), attn_bench_v3 (+ results/2026-12-07e-h100/keep_draw_v3.patch, a draw block a
# query tile), attn_bench_v3s2 (+ wg64_two_stages_four_blocks.patch) and gpu_tests with both
# patches, packed as gpuR. On the GPU machine (carry .gpuz/gpuR.tar.xz):
#   rm -rf .gpu; tar -xJf .gpuz/gpuR.tar.xz && bash tools/bench/stop68_call1.sh run
# (A record: its build no longer applies, the two-stage patch being in the tree since c1c876f.)
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
P=$root/tools/bench/results/2026-12-07e-h100
if [ "${1:-}" = run ]; then
  source "$bench/call_env.sh"
  R=$OUT
  cp /tmp/r/gpu.txt $R/ 2>/dev/null
  timeout 150 gpu_tests --gtest_filter='GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*' > $R/gpu_tests_attention.txt 2>&1
  echo "gpu_tests rc=$?" >> $R/gpu_tests_attention.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests_attention.txt; grep -E "Failure" -A6 $R/gpu_tests_attention.txt | head -20
  run() { echo "# $*" >> $R/attn_bench.txt; timeout 30 env "$@" --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1; }
  for rep in 1 2; do
    run attn_bench
    run AMPC_ATTENTION_WG_PIPE=1 attn_bench
    run attn_bench_v3
    run AMPC_ATTENTION_WG_PIPE=1 attn_bench_v3
    run attn_bench_v3s2
  done
  grep -E "#|bf16" $R/attn_bench.txt
  timeout 50 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; grep -E "causal" $R/sdpa_ref.txt | tail -4
  exit 0
fi
cd "$root"
cp kernels/cuda/attention.cu /tmp/attention.cu.tree
restore() { cp /tmp/attention.cu.tree kernels/cuda/attention.cu; }
trap restore EXIT
ninja -C build tools/attn_bench tests/gpu_tests >/dev/null || exit 1
mkdir -p build/variants
cp build/tools/attn_bench build/variants/attn_bench
git apply "$P/keep_draw_v3.patch" && ninja -C build tools/attn_bench >/dev/null && cp build/tools/attn_bench build/variants/attn_bench_v3 || exit 1
git apply "$P/wg64_two_stages_four_blocks.patch" && ninja -C build tools/attn_bench tests/gpu_tests >/dev/null || exit 1
cp build/tools/attn_bench build/variants/attn_bench_v3s2
cp build/tests/gpu_tests build/variants/gpu_tests
restore
ninja -C build tools/attn_bench tests/gpu_tests >/dev/null  # the working tree's build again
tools/bench/pack.sh gpuR build/variants/gpu_tests build/variants/attn_bench build/variants/attn_bench_v3 build/variants/attn_bench_v3s2
