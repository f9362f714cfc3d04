#!/usr/bin/env bash
# Stop 67's third GPU call (pack gpuP: ampc and amprun with the dropout decisions drawn ahead of the
# forward and the wgmma forward the default at head tile 64): the GPT-2 124M bf16 step beside
# torch.compile in the harness (issue 22's step point: <= 22 ms on an H200, at no higher peak memory).
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
timeout 420 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out $R/harness > $R/harness.txt 2>&1
echo "harness rc=$?"; tail -14 $R/harness.txt
tar -cJf "$OUT/call3.tar.xz" -C $R .
