#!/usr/bin/env bash
# For the next stop (stop 70 ran out of device time before it): pack gpuY, the attention cases with
# the vector row kernels on (AMPC_ATTENTION_ROWS_VEC=1, opt-in until this passes), and the bench with
# them on and off. If the tests pass and the backward is faster, make rowsVec's default on. Rebuild
# the pack first if the tree changed: tools/bench/pack.sh gpuY build/tests/gpu_tests
# build/tools/attn_bench. On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuY.tar.xz && bash tools/bench/stop70_call4.sh
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
export AMPC_ATTENTION_ROWS_VEC=1
run_gpu_tests 100 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*:GpuAttention.GroupedKeys*:GpuDropout.*'
unset AMPC_ATTENTION_ROWS_VEC
for e in 1 0 1 0; do
  echo "# AMPC_ATTENTION_ROWS_VEC=$e GPT-2" >> $R/attn_bench.txt
  AMPC_ATTENTION_ROWS_VEC=$e timeout 30 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
done
grep -E "#|bf16" $R/attn_bench.txt
