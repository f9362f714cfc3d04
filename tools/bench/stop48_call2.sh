#!/usr/bin/env bash
# Stop 48, second GPU call (staged by tools/bench/stage_gpu.sh, .gpuz carried): what call 1 could
# not show (its script lost its own folder to env.sh's `here`, and GpuOps stopped at a case the
# harness cannot run):
# - GpuOps (RmsNorm's kernels among them) and the draws-ahead test, fixed;
# - zoo_full's llama_hd128_padded and gemma_hd256_padded with fuse-rms-norm on for cuda and off,
#   torch.compile in the same call;
# - the RMS-norm families of the zoo on CUDA against PyTorch;
# - the harness's GPT-2 124M bf16 step against torch.compile, and amprun with --draw-ahead.
# Everything lands in $OUT/call2.tar.gz.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/../env.sh"
o=/tmp/o; mkdir -p $o
t0=$(date +%s); stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
pack() { tar -czf "$OUT/call2.tar.gz" -C $o .; }
stamp gpu_tests
timeout 150 gpu_tests --gtest_filter='Dtypes/GpuOps.*:GpuAttention.DropoutDrawnAheadMatchesDrawnInline' > $o/gpu_tests.txt 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]|Failure|exception' $o/gpu_tests.txt | head -30; pack
stamp zoo_full
timeout 170 python3 "$bench/zoo_full.py" --models llama_hd128_padded,gemma_hd256_padded --torch-compile --no-eager \
  --out $o/zoo_full_rms > $o/zoo_full_rms.txt 2>&1; grep '"model"' $o/zoo_full_rms.txt | cut -c1-700
timeout 60 python3 "$bench/zoo_full.py" --models llama_hd128_padded,gemma_hd256_padded --no-torch \
  --ampc-flags=--no-fuse-rms-norm --out $o/zoo_full_norms > $o/zoo_full_norms.txt 2>&1; grep '"model"' $o/zoo_full_norms.txt | cut -c1-500; pack
stamp zoo_cuda
AMPC_ZOO_DIR=$PWD/models/zoo AMPC_ZOO_DEVICE=cuda AMPC_ZOO_BIN=$bench/../bin timeout 90 zoo_tests \
  --gtest_filter='*llama*:*qwen*:*gemma*:*t5*' > $o/zoo_cuda.txt 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' $o/zoo_cuda.txt | head -30; pack
stamp harness
timeout 120 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out $o/harness > $o/harness.txt 2>&1
tail -6 $o/harness.txt
plan=/tmp/ampc-bench/gpt2.bf16.ampplan
if [ -f "$plan" ]; then
  for flag in "" --draw-ahead; do
    echo "-- amprun $flag"
    timeout 30 amprun "$plan" --synthetic --int-range input_ids=0:50256 --int-range labels=0:50256 --steps 30 --bench $flag 2>&1 | grep -E "median|peak"
  done | tee $o/gpt2_draws.txt
fi
stamp done
pack
