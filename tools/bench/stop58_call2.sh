#!/usr/bin/env bash
# Stop 58's second GPU call, on the tree without the cuDNN dropout-mask experiment (call 1,
# results/2026-12-06d-h100): issue 22's GPT-2-shape attention (ampc's kernels with dropout) beside
# PyTorch's SDPA timed per call and back to back, then the GPT-2 124M bf16 step against
# torch.compile, in the same call.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
timeout 60 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 > "$OUT/attn_gpt2.txt" 2>&1
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > "$OUT/sdpa_ref.txt" 2>&1
timeout 200 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out "$OUT/harness" > "$OUT/harness.txt" 2>&1
rm -rf "$OUT/harness"
for f in "$OUT"/*.txt; do echo "== $(basename $f)"; cut -c1-400 "$f" | tail -12; done
