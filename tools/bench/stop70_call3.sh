#!/usr/bin/env bash
# Stop 70 call 3: the backward's row dots (D = rowsum dO O) and dQ conversion as 16-byte vector
# kernels (rowDotVecKernel, fromF32VecKernel; AMPC_ATTENTION_ROWS_SCALAR=1 runs the warp-a-row ones).
# Pack gpuY: gpu_tests and attn_bench from the tree. On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/gpuY.tar.xz && bash tools/bench/stop70_call3.sh
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/call_env.sh"
cp $R/gpu.txt $OUT/; R=$OUT
run_gpu_tests 150 'GpuAttention.*:GpuDropout.*:-GpuAttention.Cudnn*'
for k in 1 2; do
  for e in 0 1; do
    echo "# AMPC_ATTENTION_ROWS_SCALAR=$e GPT-2" >> $R/attn_bench.txt
    AMPC_ATTENTION_ROWS_SCALAR=$e timeout 30 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
    echo "# AMPC_ATTENTION_ROWS_SCALAR=$e Llama" >> $R/attn_bench.txt
    AMPC_ATTENTION_ROWS_SCALAR=$e timeout 60 attn_bench --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels --mask causal >> $R/attn_bench.txt 2>&1
  done
done
grep -E "#|bf16" $R/attn_bench.txt
timeout 60 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; grep -E "causal" $R/sdpa_ref.txt | tail -4
timeout 60 ncu --metrics gpu__time_duration.sum attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels --mask causal --reps 1 --dropout 0.1 > $R/ncu_all.txt 2>&1
grep -E "^  [a-zA-Z_<].*\(|gpu__time_duration" $R/ncu_all.txt | paste - - | awk '{print $1, $NF}' | tail -8
