#!/usr/bin/env bash
# amprun --save-onnx against onnxruntime: the digits model trained 100 bf16 steps on CUDA, saved as
# ONNX, evaluated by onnxruntime and by ampc --eval on 64 test samples. On the GPU machine, staged
# (ampc and amprun on PATH, numpy and onnxruntime there), from the repository root:
#   bash tools/bench/save_onnx_ort.sh [OUT]     (the line also goes to OUT/save_onnx_ort.txt)
set -uo pipefail
out=${1:-${OUT:-/tmp}}
w=$(mktemp -d)
ampc models/digits.onnx --precision bf16 -o $w/digits.ampplan && amprun $w/digits.ampplan --device cuda --data models/digits/train \
  --steps 100 --save-onnx $w/trained.onnx > /dev/null
W=$w python3 - <<'PY' 2>&1 | tee "$out/save_onnx_ort.txt"
import os, subprocess, numpy as np, onnxruntime as ort
w = os.environ["W"]
x = np.load("models/digits/test/x.npy")[:64]; t = np.load("models/digits/test/target.npy")[:64]
os.makedirs(w + "/in", exist_ok=True); np.save(w + "/in/x.npy", x); np.save(w + "/in/target.npy", t)
s = ort.InferenceSession(w + "/trained.onnx", providers=["CPUExecutionProvider"])
feed = {i.name: {"x": x, "target": t}[i.name] for i in s.get_inputs()}
theirs = float(s.run(None, feed)[0])
subprocess.run(["ampc", w + "/trained.onnx", "--eval", "--inputs", w + "/in", "--outputs", w + "/out"], check=True, capture_output=True)
ours = float(np.load(w + "/out/" + s.get_outputs()[0].name + ".npy"))
print("save-onnx: trained digits loss on 64 test samples: onnxruntime %.6f, ampc --eval %.6f, relative difference %.1e" % (theirs, ours, abs(theirs - ours) / abs(theirs)))
PY
rm -rf "$w"
