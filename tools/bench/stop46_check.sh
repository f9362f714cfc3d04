#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): what stop 46 left for a GPU (tools/bench/
# NOTES.md, results/2026-12-04h-cpu/NOTE.md) and stop 47 (no GPU either). The GPU tests: every GpuOps
# case (RmsNorm's kernels among them), the generated groups
# (GpuFused: the 'trig' group), the attention, and GpuProgram (the softcap and scatter-max refusals); attn_bench at GPT-2's shape and PyTorch's flash there; the harness's GPT-2 124M
# bf16 step (torch.compile in the same call). Built with results/2026-12-04h-cpu/draw_ahead.patch
# applied (attn_bench then takes --draw), it also times the dropout draws ahead against inline, in
# attn_bench and in the GPT-2 step (amprun --draw-ahead). Logs under $OUT.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # (not `here`: env.sh sets that to its own folder)
source "$bench/../env.sh"
out=${OUT:-/tmp/ampc-gpu}
mkdir -p "$out"
# (GpuOps' cases run inside Dtypes/GpuOps.MatchTheCpuBackend/N: a filter on a case's name matches nothing.)
gpu_tests --gtest_filter='*GpuOps.*:GpuFused.*:GpuAttention.*:GpuProgram.*' > "$out/gpu_tests.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==' "$out/gpu_tests.txt"
draws=(default)
attn_bench --draw inline --bh 12 --seq 64 --reps 1 > /dev/null 2>&1 && draws=(inline ahead)
for d in "${draws[@]}"; do
  flag=(); [ "$d" != default ] && flag=(--draw "$d")
  attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 "${flag[@]}" > "$out/attn_gpt2_$d.txt" 2>&1
  echo "== attn_bench $d"; cat "$out/attn_gpt2_$d.txt"
done
python3 "$bench/sdpa_ref.py" > "$out/sdpa_ref.txt" 2>&1; tail -6 "$out/sdpa_ref.txt"
python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out "$out/harness" > "$out/harness.txt" 2>&1
tail -8 "$out/harness.txt"
plan=/tmp/ampc-bench/gpt2.bf16.ampplan
if [ -f "$plan" ] && [ "${#draws[@]}" = 2 ]; then
  for flag in "" --draw-ahead; do
    echo "== amprun $flag"
    amprun "$plan" --synthetic --int-range input_ids=0:50256 --int-range labels=0:50256 --steps 30 --bench $flag 2>&1 | grep -E "median|peak"
  done | tee "$out/gpt2_draws.txt"
fi
