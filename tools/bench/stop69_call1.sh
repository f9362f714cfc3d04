#!/usr/bin/env bash
# For the next stop's first GPU call (built at stop 68, never run). Built here (no argument):
# gpu_tests with results/2026-12-07f-h200/wg128_two_stages_three_blocks.patch (the head-128 wgmma
# forward in two stages at three blocks a SM: 168 registers, 80 bytes of spill, against three
# stages at two blocks now), attn_bench from the tree and attn_bench_w128 with the patch; pack gpuT.
# On the GPU machine (carry .gpuz/gpuT.tar.xz):
#   rm -rf .gpu; tar -xJf .gpuz/gpuT.tar.xz && bash tools/bench/stop69_call1.sh run
# The pack holds no ampc, so GpuFused is left out: with ampc (17.7 MB) the device refused the call
# (stop 68). Head tile 64 is the tree's in both binaries, so the suite checks the tree there and the
# patch at 128. Keep the patch if the Llama shape's forward is faster with it and the suite passes.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
P=$root/tools/bench/results/2026-12-07f-h200
if [ "${1:-}" = run ]; then
  source "$bench/call_env.sh"
  R=$OUT
  cp /tmp/r/gpu.txt $R/ 2>/dev/null
  timeout 200 gpu_tests --gtest_filter='-GpuFused.*' > $R/gpu_tests.txt 2>&1
  echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|tests ran|rc=" $R/gpu_tests.txt | head -30; grep -E "Failure" -A6 $R/gpu_tests.txt | head -20
  for b in attn_bench attn_bench_w128; do
    echo "# $b GPT-2" >> $R/attn_bench.txt
    timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    echo "# $b Llama" >> $R/attn_bench.txt
    timeout 60 $b --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
  grep -E "#|bf16" $R/attn_bench.txt
  timeout 60 python3 "$bench/sdpa_ref.py" --b 4 --h 32 --t 2048 --d 128 --kv-heads 8 > $R/sdpa_ref_llama.txt 2>&1; grep -E "causal" $R/sdpa_ref_llama.txt | tail -4
  exit 0
fi
cd "$root"
source "$bench/lib.sh"
git diff --quiet kernels/cuda/attention.cu || { echo "attention.cu has local changes" >&2; exit 1; }
build_variant "" "" tools/attn_bench || exit 1
build_variant _w128 "$P/wg128_two_stages_three_blocks.patch" tools/attn_bench tests/gpu_tests || exit 1
mv build/variants/gpu_tests_w128 build/variants/gpu_tests  # the suite runs under its own name
tools/bench/pack.sh gpuT build/variants/gpu_tests build/variants/attn_bench build/variants/attn_bench_w128
