#!/usr/bin/env bash
# For the next stop, its first GPU call (stop 70 built it and had no device time left). Pack gpuZ:
# gpu_tests built with results/2026-12-08a/dq_red_v4.patch (the backward's dQ reds four floats at a
# time, red.global.add.v4.f32, lanes tq and tq ^ 1 swapping a pair), attn_bench from the tree and
# attn_bench_v4 with the patch; both with the opt-in vector row kernels (AMPC_ATTENTION_ROWS_VEC=1:
# rowDotVecKernel, fromF32VecKernel). On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuZ.tar.xz && bash tools/bench/stop71_call1.sh
# Rebuild the pack if the tree changed: build_variant _v4 "$PWD/tools/bench/results/2026-12-08a/
# dq_red_v4.patch" tools/attn_bench tests/gpu_tests (tools/bench/lib.sh), then tools/bench/pack.sh
# gpuZ with gpu_tests_v4 renamed gpu_tests, build/tools/attn_bench and attn_bench_v4.
# Then: tests pass -> make rowsVec on by default (kernels/cuda/attention.cu) and, if attn_bench_v4's
# backward is faster, apply the patch.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
export AMPC_ATTENTION_ROWS_VEC=1
run_gpu_tests 150 'GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*'
mv $R/gpu_tests.txt $R/gpu_tests_vec_v4.txt
if ! grep -q "gpu_tests rc=0" $R/gpu_tests_vec_v4.txt; then  # which of the two
  export AMPC_ATTENTION_ROWS_VEC=0
  run_gpu_tests 100 'GpuAttention.ForwardAndBackward*:GpuAttention.OperandsInPlace*:GpuAttention.GroupedKeys*'
  mv $R/gpu_tests.txt $R/gpu_tests_v4_only.txt
fi
for k in 1 2; do
  for v in base vec v4; do
    b=attn_bench; e=0
    [ $v = vec ] && e=1
    [ $v = v4 ] && { b=attn_bench_v4; e=1; }
    echo "# $v GPT-2" >> $R/attn_bench.txt
    AMPC_ATTENTION_ROWS_VEC=$e timeout 30 $b --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    [ $k = 1 ] || continue
    echo "# $v Llama" >> $R/attn_bench.txt
    AMPC_ATTENTION_ROWS_VEC=$e timeout 60 $b --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
done
grep -E "#|bf16" $R/attn_bench.txt
timeout 60 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; grep -E "causal" $R/sdpa_ref.txt | tail -4
