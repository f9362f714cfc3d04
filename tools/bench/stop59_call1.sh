#!/usr/bin/env bash
# Stop 59's first GPU call: the forward's leaner softmax (kernels/cuda/attention.cu softmaxTile: no
# per-element select on whole unmasked tiles, exp2 with the scale folded in, dropout as a select with
# its 1 / (1 - ratio) on O, Philox round keys as kernel parameters). GpuAttention against the CPU,
# then attn_bench with the previous build (attn_bench_old), this build, and this build with three
# forward blocks per SM at head tile 64 (attn_bench_lb3), beside PyTorch's SDPA, in one call; and the
# SASS of the head-64 forward for counting instructions.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 300 gpu_tests --gtest_filter='GpuAttention.*' > "$OUT/gpu_tests_attention.txt" 2>&1; echo "gpu_tests rc=$?" >> "$OUT/gpu_tests_attention.txt"
for b in attn_bench_old attn_bench attn_bench_lb3; do
  for rep in 1 2; do
    timeout 60 "$root/.gpu/bin/$b" --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels > "$OUT/${b}_gpt2_$rep.txt" 2>&1
  done
  timeout 90 "$root/.gpu/bin/$b" --bh 128 --seq 2048 --dim 128 --layout gqa --heads 32 --kv-heads 8 --attention kernels > "$OUT/${b}_llama.txt" 2>&1
done
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > "$OUT/sdpa_ref.txt" 2>&1
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [ -x "$CUOBJ" ]; then
  # every function's SASS, then only the bf16 head-64 forwards (mma.sync) kept
  "$CUOBJ" -sass "$root/.gpu/att_new.o" > /tmp/sass_all.txt 2>&1
  awk '/Function :/ {keep = ($0 ~ /attnFwdMmaKernelI13__nv_bfloat16Lb1ELi64E/)} keep' /tmp/sass_all.txt > "$OUT/sass_fwd64.txt"
  grep -c "" /tmp/sass_all.txt > "$OUT/sass_lines.txt"
else
  ls /usr/local/cuda/bin > "$OUT/no_cuobjdump.txt"
fi
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-300 "$f" | grep -v "^\[ *OK\|^\[ RUN" | tail -14; done
