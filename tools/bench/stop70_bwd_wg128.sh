#!/usr/bin/env bash
# For the next stop (built at stop 69, never run): the wgmma backward at head tile 128 too
# (results/2026-12-07i-h100/bwd_wg128.patch: N = 128 products for dV and dK, eight k-steps for S^T and
# dP^T, dQ in two halves of 64 d; 107 KB, 255 registers with 80-96 bytes of spill against the
# mma.sync kernel's 104-136, two blocks a SM both). Built here (no argument): gpu_tests and
# attn_bench_wg128 with the patch; pack gpuW (12 MB). On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuW.tar.xz && bash tools/bench/stop70_bwd_wg128.sh run
# GpuAttention but cuDNN's (head dims 16..128 against the CPU, in place, grouped keys), then the
# bench at the Llama shape (head 128) and the GPT-2 shape with the wgmma backward and with
# AMPC_ATTENTION_BWD_MMA_SYNC=1 (mma.sync at both head tiles), alternating. Keep the patch if the
# suite passes and the Llama backward is faster (mma.sync: 2.22 ms, flash 1.68, H100, stop 69).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
if [ "${1:-}" = run ] || [ "${1:-}" = bench ]; then
  # "bench": the bench alone, into the caller's $OUT (stop70_call1.sh runs the tests first).
  source "$bench/call_env.sh"
  cp $R/gpu.txt $OUT/; R=$OUT
  [ "$1" = run ] && run_gpu_tests 150 'GpuAttention.*:-GpuAttention.Cudnn*'
  for k in 1 2; do
    for e in 0 1; do
      b=attn_bench_wg128
      echo "# AMPC_ATTENTION_BWD_MMA_SYNC=$e Llama" >> $R/attn_bench.txt
      AMPC_ATTENTION_BWD_MMA_SYNC=$e timeout 60 $b --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
      echo "# AMPC_ATTENTION_BWD_MMA_SYNC=$e GPT-2" >> $R/attn_bench.txt
      AMPC_ATTENTION_BWD_MMA_SYNC=$e timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    done
  done
  grep -E "#|bf16" $R/attn_bench.txt
  exit 0
fi
cd "$root"
source "$bench/lib.sh"
build_variant _wg128 "$root/tools/bench/results/2026-12-07i-h100/bwd_wg128.patch" tools/attn_bench tests/gpu_tests || exit 1
mv build/variants/gpu_tests_wg128 build/variants/gpu_tests
tools/bench/pack.sh gpuW build/variants/gpu_tests build/variants/attn_bench_wg128
