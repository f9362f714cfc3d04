#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): what stop 46 left for a GPU (tools/bench/
# NOTES.md). The GPU tests of the dropout draws ahead, RmsNorm's kernels and the softcap refusal;
# attn_bench at GPT-2's shape with the draws inline and ahead; PyTorch's flash at that shape; and the
# harness's GPT-2 124M bf16 step (torch.compile in the same call) with and without amprun --draw-ahead.
# Logs under $OUT.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../env.sh"
out=${OUT:-/tmp/ampc-gpu}
mkdir -p "$out"
gpu_tests --gtest_filter='GpuAttention.*:GpuOps*RmsNorm*:GpuProgram.*' > "$out/gpu_tests.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==' "$out/gpu_tests.txt"
for d in inline ahead; do
  attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --draw "$d" > "$out/attn_gpt2_$d.txt" 2>&1
  echo "== draw $d"; grep dropout "$out/attn_gpt2_$d.txt"
done
python3 "$here/sdpa_ref.py" > "$out/sdpa_ref.txt" 2>&1; tail -6 "$out/sdpa_ref.txt"
python3 "$here/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out "$out/harness" > "$out/harness.txt" 2>&1
tail -8 "$out/harness.txt"
plan=/tmp/ampc-bench/gpt2.bf16.ampplan
if [ -f "$plan" ]; then
  for flag in "" --draw-ahead; do
    echo "== amprun $flag"
    amprun "$plan" --synthetic --int-range input_ids=0:50256 --int-range labels=0:50256 --steps 30 --bench $flag 2>&1 | grep -E "median|peak"
  done | tee "$out/gpt2_draws.txt"
fi
