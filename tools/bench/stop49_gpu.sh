#!/usr/bin/env bash
# For the first session that is lent a GPU after stop 49 (which had none): one call that checks on
# the H200 what stop 49 wrote without one, and measures issue 22's open point again. Staged by
# tools/bench/stage_gpu.sh, .gpuz carried; every step has its own timeout and the logs are packed
# into $OUT/stop49.tar.gz after each step, so a cut-short call still brings back what ran.
# - gpu_tests: GpuOps (MatMul_partial_batch and Pad_crop, through target-shapes), GpuAttention,
#   GpuProgram, GpuFused;
# - the committed zoo on CUDA against PyTorch (every plan now runs target-shapes and the new fusions);
# - the sweep's new models (scripted_loop, fold_unfold), both exporters, on the CPU backend against PyTorch;
# - fusion_check.py on bloom_small and deberta_v3_small_padded (the attention viewed with heads around the
#   softmax): attentions fused and the 20-step losses against --no-fuse;
# - attn_bench at GPT-2's shape and PyTorch's flash (and cuDNN) in the same call: issue 22's kernel point.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # (not `here`: env.sh sets that to its own folder)
source "$bench/../env.sh"
root=$(cd "$bench/../.." && pwd)
o=/tmp/stop49; mkdir -p $o
t0=$(date +%s); stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
pack() { tar -czf "${OUT:-/tmp}/stop49.tar.gz" -C $o .; }
stamp gpu_tests
timeout 200 gpu_tests --gtest_filter='*GpuOps.*:GpuAttention.*:GpuProgram.*:GpuFused.*' > $o/gpu_tests.txt 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' $o/gpu_tests.txt | head -30; pack
stamp zoo_cuda  # the committed zoo on CUDA against PyTorch, plans with stop 49's fusions and target-shapes
AMPC_ZOO_DIR=$root/models/zoo AMPC_ZOO_DEVICE=cuda AMPC_ZOO_BIN=$bench/../bin timeout 150 zoo_tests > $o/zoo_cuda.txt 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' $o/zoo_cuda.txt | head -30; pack
stamp attn_bench
timeout 60 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 > $o/attn_gpt2.txt 2>&1; cat $o/attn_gpt2.txt
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > $o/sdpa_ref.txt 2>&1; tail -8 $o/sdpa_ref.txt; pack
stamp sweep
if [ -f "$root/tools/sweep/torchvision_sweep.py" ]; then
  for e in torchscript dynamo; do
    OMP_NUM_THREADS=8 timeout 150 python3 "$root/tools/sweep/torchvision_sweep.py" --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
      --out /tmp/sweep_$e --exporter $e scripted_loop fold_unfold > $o/sweep_$e.txt 2>&1
    grep -E "^[a-z_0-9]+ +(PASS|MISMATCH|EXPORT-FAILS|AMPC-REFUSES|AMPRUN-FAILS|SWEEP-ERROR)" $o/sweep_$e.txt | cut -c1-230
  done
fi
pack
stamp fusion_check
timeout 240 python3 "$bench/fusion_check.py" --out $o/fusion --models bloom_small,deberta_v3_small_padded > $o/fusion.txt 2>&1
tail -6 $o/fusion.txt
stamp done
pack
