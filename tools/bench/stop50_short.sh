#!/usr/bin/env bash
# Stop 50's call when little device time is left: the library sweep on the CPUs (LIMIT seconds) while
# the GPU runs stop 49's GPU tests, the training step's and gradient accumulation on CUDA against the CPU.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib" /tmp/acc
SHARDS=14 MODEL_LIMIT=${MODEL_LIMIT:-90} LIMIT=${LIMIT:-170} OUT=$OUT/lib bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
timeout 120 gpu_tests --gtest_filter='*GpuOps.*:GpuAttention.*:GpuProgram.*:GpuFused.*:GpuTrainStep.*' > "$OUT/gpu_tests.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' "$OUT/gpu_tests.txt" | head -30
ampc models/mlp.onnx --precision fp16 --optimizer adamw --lr 0.003 --clip-norm 1.0 --accumulate 2 -o /tmp/acc/a.ampplan
for dev in cuda cpu; do amprun /tmp/acc/a.ampplan --device $dev --synthetic --steps 8 --metrics /tmp/acc/$dev.jsonl > /dev/null; done
python3 - <<'PY' | tee "$OUT/accumulate_cuda.txt"
import json
c = [json.loads(l) for l in open("/tmp/acc/cuda.jsonl")]; p = [json.loads(l) for l in open("/tmp/acc/cpu.jsonl")]
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(c, p))
print("accumulate 2, cuda vs cpu, 8 steps: losses", [round(a["loss"], 5) for a in c], "largest relative difference %.2e" % worst,
      "scales", [a["loss_scale"] for a in c] == [b["loss_scale"] for b in p])
PY
wait
cat "$OUT/lib/summary.txt"
