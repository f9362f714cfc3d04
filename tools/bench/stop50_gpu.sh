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
# amprun --save-onnx: the trained digits model in onnxruntime against ampc's evaluation of it.
ampc models/digits.onnx --precision bf16 -o /tmp/acc/digits.ampplan && amprun /tmp/acc/digits.ampplan --device cuda --data models/digits/train \
  --steps 100 --save-onnx /tmp/acc/trained.onnx > /dev/null
python3 - <<'PY' 2>&1 | tee "$OUT/save_onnx_ort.txt"
import subprocess, numpy as np, onnxruntime as ort
x = np.load("models/digits/test/x.npy")[:64]; t = np.load("models/digits/test/target.npy")[:64]
import os; os.makedirs("/tmp/acc/in", exist_ok=True); np.save("/tmp/acc/in/x.npy", x); np.save("/tmp/acc/in/target.npy", t)
s = ort.InferenceSession("/tmp/acc/trained.onnx", providers=["CPUExecutionProvider"])
feed = {i.name: {"x": x, "target": t}[i.name] for i in s.get_inputs()}
theirs = float(s.run(None, feed)[0])
subprocess.run(["ampc", "/tmp/acc/trained.onnx", "--eval", "--inputs", "/tmp/acc/in", "--outputs", "/tmp/acc/out"], check=True)
ours = float(np.load("/tmp/acc/out/" + s.get_outputs()[0].name + ".npy"))
print("save-onnx: trained digits loss on 64 test samples: onnxruntime %.6f, ampc --eval %.6f, relative difference %.1e" % (theirs, ours, abs(theirs - ours) / abs(theirs)))
PY
# Gradient accumulation on CUDA against the CPU: the same plan (2 micro-batches a step, fp16 with
# the dynamic scale, AdamW with clipping), the same synthetic batches.
bash "$bench/accumulate_check.sh"
