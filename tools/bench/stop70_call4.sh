#!/usr/bin/env bash
# Stop 70 call 4 (call 3 cut short for device time): pack gpuY, the suite's attention cases and one
# bench round, vector row kernels against the warp-a-row ones. On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuY.tar.xz && bash tools/bench/stop70_call4.sh
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
run_gpu_tests 100 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*:GpuAttention.GroupedKeys*:GpuDropout.*'
for e in 0 1 0 1; do
  echo "# AMPC_ATTENTION_ROWS_SCALAR=$e GPT-2" >> $R/attn_bench.txt
  AMPC_ATTENTION_ROWS_SCALAR=$e timeout 30 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
done
grep -E "#|bf16" $R/attn_bench.txt
