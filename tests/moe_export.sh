#!/usr/bin/env bash
# transformers 5.17's Mixtral (a tiny config: 2 layers, 4 experts, top-2; models/moe, exported on the
# GPU machine by the export helper through PyTorch 2.11's dynamo exporter, which writes its experts
# with the batched_mm backend: tools/bench/stop60_moe.py) trains with PyTorch's gradients: ampc --grad
# on the committed batch against PyTorch's f64 loss and gradients (eager experts backend, the
# reference loop), each gradient at most twice as far from them as PyTorch's own f32 one (ref32),
# and every parameter of the model given one.
set -uo pipefail
build=$1
here=$(cd "$(dirname "$0")/.." && pwd)
m=$here/models/moe
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$build/tools/ampc" "$m/hf_mixtral.onnx" --grad --eval --inputs "$m/inputs" --outputs "$out" > "$out.log" 2>&1; then
  cat "$out.log"; rm -f "$out.log"; exit 1
fi
rm -f "$out.log"
python3 - "$m" "$out" "$here/tools/sweep" <<'PY'
import math, os, sys
sys.path.insert(0, sys.argv[3])
from compare_grads import read_npy
m, got = sys.argv[1], sys.argv[2]
def err(a, b):
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / max(math.sqrt(sum(y * y for y in b)), 1e-30)
exact = {f[:-9]: read_npy(os.path.join(m, "ref", f)) for f in os.listdir(os.path.join(m, "ref")) if f.endswith("_grad.npy")}
largest = max(math.sqrt(sum(v * v for v in g)) for g in exact.values())
bad, worst = [], (0.0, "")
for n, g in sorted(exact.items()):
    f = os.path.join(got, n + "_grad.npy")
    if not os.path.exists(f):
        bad.append(f"{n}: no gradient from ampc")
        continue
    ours, theirs = err(read_npy(f), g), err(read_npy(os.path.join(m, "ref32", n + "_grad.npy")), g)
    if math.sqrt(sum(v * v for v in g)) < 1e-3 * largest:
        continue
    worst = max(worst, (ours / (theirs + 1e-6), n))
    if not ours <= 2 * theirs + 1e-6:
        bad.append(f"{n}: {ours:.3e} from f64 (PyTorch f32 {theirs:.3e})")
loss, loss64 = read_npy(os.path.join(got, "loss.npy"))[0], read_npy(os.path.join(m, "ref", "loss.npy"))[0]
if not abs(loss - loss64) <= 1e-5 * abs(loss64):
    bad.append(f"loss {loss} against f64 {loss64}")
print(f"moe_export: {len(exact)} gradients, loss {loss:.6f} (f64 {loss64:.6f}), worst ratio to PyTorch f32's error {worst[0]:.2f} ({worst[1]})")
for b in bad:
    print("moe_export:", b)
sys.exit(1 if bad or len(exact) < 20 else 0)
PY
