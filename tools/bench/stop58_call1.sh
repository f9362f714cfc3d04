#!/usr/bin/env bash
# Stop 58's first GPU call (run at c48ac40, with the experiment in the tree; it was taken out after:
# results/2026-12-06d-h100/cudnn_dropout_mask.patch): cuDNN's fused SDPA with dropout from a mask ampc fills from its own
# Philox stream (SdpaDesc::dropoutRatio, attentionDropoutMask). The GpuAttention tests (the new
# CudnnDropoutMatchesTheCpu among them), then issue 22's GPT-2 shape with each implementation and
# PyTorch's SDPA in the same call, and the Llama shape.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
timeout 300 gpu_tests --gtest_filter='GpuAttention.*' > "$OUT/gpu_attention.txt" 2>&1
tail -5 "$OUT/gpu_attention.txt"
for impl in auto kernels cudnn; do
  timeout 60 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention $impl > "$OUT/attn_gpt2_$impl.txt" 2>&1
done
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > "$OUT/sdpa_ref.txt" 2>&1
timeout 90 attn_bench --bh 128 --heads 32 --kv-heads 8 --seq 2048 --dim 128 --layout gqa > "$OUT/attn_llama.txt" 2>&1
timeout 90 python3 "$bench/sdpa_ref.py" --b 4 --h 32 --kv-heads 8 --t 2048 --d 128 > "$OUT/sdpa_ref_llama.txt" 2>&1
for f in "$OUT"/attn*.txt "$OUT"/sdpa_ref*.txt; do echo "== $(basename $f)"; cut -c1-400 "$f" | tail -14; done
grep -E "FAILED|Failure|error" "$OUT/gpu_attention.txt" | head -30
# GPT-2 124M bf16 step (attention dropout 0.1) against torch.compile, same call
timeout 200 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out "$OUT/harness" > "$OUT/harness.txt" 2>&1
tail -12 "$OUT/harness.txt"
