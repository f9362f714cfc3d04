#!/usr/bin/env bash
# Stop 69: the wgmma backward at head tile 64 (attnBwdMmaKernel<.., WG>), first run. Built here (no
# argument): gpu_tests and attn_bench from the tree, attn_bench_st3 with bwd_wg_three_stages.patch
# (three stages of Q and dO: 76 KB, still two blocks a SM), pack gpuU. On the GPU machine (carry
# .gpuz/gpuU.tar.xz): rm -rf .gpu; tar -xJf .gpuz/gpuU.tar.xz && bash tools/bench/stop69_bwd_wg.sh run
# GpuAttention and GpuDropout (the wgmma backward is the default at 64), then attn_bench at the GPT-2
# shape with it, with AMPC_ATTENTION_BWD_MMA_SYNC=1 (the mma.sync backward) and three stages, alternating.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
if [ "${1:-}" = run ]; then
  source "$bench/call_env.sh"
  cp $R/gpu.txt $OUT/; R=$OUT
  run_gpu_tests 150 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*:GpuAttention.GroupedKeys*:GpuAttention.Backward*:GpuDropout.*'
  for k in 1 2; do
    for v in wg mma_sync st3; do
      echo "# $v" >> $R/attn_bench.txt
      if [ $v = mma_sync ]; then e=1; else e=0; fi
      b=attn_bench; [ $v = st3 ] && b=attn_bench_st3
      AMPC_ATTENTION_BWD_MMA_SYNC=$e timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    done
  done
  cat $R/attn_bench.txt
  exit 0
fi
cd "$root"
source "$bench/lib.sh"
build_variant "" "" tools/attn_bench tests/gpu_tests || exit 1
build_variant _st3 "$root/tools/bench/results/2026-12-07i-h100/bwd_wg_three_stages.patch" tools/attn_bench || exit 1
tools/bench/pack.sh gpuU build/variants/gpu_tests build/variants/attn_bench build/variants/attn_bench_st3
