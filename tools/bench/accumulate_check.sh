#!/usr/bin/env bash
# Gradient accumulation on CUDA against the CPU: the same plan (2 micro-batches a step, fp16 with the
# dynamic scale, AdamW with clipping; its skipped runs take the optimizer's in-place early return),
# the same synthetic batches. Run from the repository root with ampc and amprun on PATH; writes $OUT/accumulate_cuda.txt.
set -uo pipefail
mkdir -p /tmp/acc
ampc models/mlp.onnx --precision fp16 --optimizer adamw --lr 0.003 --clip-norm 1.0 --accumulate 2 -o /tmp/acc/a.ampplan
for dev in cuda cpu; do amprun /tmp/acc/a.ampplan --device $dev --synthetic --steps 8 --metrics /tmp/acc/$dev.jsonl > /dev/null; done
python3 - <<'PY' | tee "$OUT/accumulate_cuda.txt"
import json
c = [json.loads(l) for l in open("/tmp/acc/cuda.jsonl")]; p = [json.loads(l) for l in open("/tmp/acc/cpu.jsonl")]
worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(c, p))
print("accumulate 2, cuda vs cpu, 8 steps: losses", [round(a["loss"], 5) for a in c], "largest relative difference %.2e" % worst,
      "scales", [a["loss_scale"] for a in c] == [b["loss_scale"] for b in p])
PY
