#!/usr/bin/env bash
# Stop 50's first GPU call: stop 49's checks on the GPU (tools/bench/stop49_gpu.sh) while the
# machine's CPUs run the library sweep (tools/sweep/library_sweep.sh: timm and transformers models,
# PyTorch's dynamo exporter, each against PyTorch on ampc's CPU backend).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib" /tmp/acc
SHARDS=${SHARDS:-12} MODEL_LIMIT=${MODEL_LIMIT:-150} LIMIT=${LIMIT:-380} OUT=$OUT/lib bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
timeout ${STOP49_LIMIT:-400} bash "$bench/stop49_gpu.sh"
wait
cat "$OUT/lib/summary.txt"
# The training step's ops (a skipped step's in-place update now returns at once; the linear schedule).
timeout 60 gpu_tests --gtest_filter='GpuTrainStep.*' > "$OUT/gpu_train_step.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |FAILED  \]' "$OUT/gpu_train_step.txt"
bash "$bench/save_onnx_ort.sh" "$OUT"  # --save-onnx against onnxruntime
# Gradient accumulation on CUDA against the CPU: the same plan (2 micro-batches a step, fp16 with
# the dynamic scale, AdamW with clipping), the same synthetic batches.
bash "$bench/accumulate_check.sh"
