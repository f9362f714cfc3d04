#!/usr/bin/env bash
# Stop 66's first GPU calls (built at 4d233e3; never ran: no machine, then no device time left; the
# check stop 67 should make, on a fresh pack): the head-64 wgmma forward
# (AMPC_ATTENTION_WGMMA64=1) through the whole GPU suite and attn_bench at the GPT-2 shape both ways
# beside PyTorch's flash SDPA (part a, pack gpuK1: gpu_tests, attn_bench); the GPT-2 124M bf16 step
# beside torch.compile (part b, pack gpuK2: ampc, amprun; the tree and one pack of all four exceed
# the device's 64 MiB).   bash tools/bench/stop66_call1.sh a|b
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
export AMPC_ATTENTION_WGMMA64=1
if [ "$1" = a ]; then
  timeout 330 gpu_tests > $R/gpu_tests.txt 2>&1
  echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=|tests ran" $R/gpu_tests.txt
  grep -E "Failure" -A6 $R/gpu_tests.txt | head -30
  for w in 0 1; do
    echo "# attn_bench AMPC_ATTENTION_WGMMA64=$w"
    AMPC_ATTENTION_WGMMA64=$w timeout 40 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 --attention kernels 2>&1 | grep -E "bf16"
  done
  timeout 60 python3 "$bench/sdpa_ref.py" > $R/sdpa_ref.txt 2>&1; tail -8 $R/sdpa_ref.txt
else
  timeout 300 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out $R/harness > $R/harness.txt 2>&1
  echo "harness rc=$?"; tail -12 $R/harness.txt
fi
tar -cJf "$OUT/call1$1.tar.xz" -C $R .
