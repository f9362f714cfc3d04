#!/usr/bin/env python3
"""How many inputs of a graph's Relus change sign between ampc's f32 and f64 runs of its gradient
graph (ampc --eval-values), without numpy. One flip moves a whole element's gradient through the
kink, which no rounding analysis covers: a mismatch whose whole-graph f64 run is right and whose f32
run flips a ReLU is that kink, not a wrong op (stop 52 traced HF RegNet's to one input: -1.1e-7 in
f64, +5.8e-7 in f32). The library sweep calls it KINK.

    python3 tools/sweep/kinks.py MODEL.onnx INPUTS_DIR [--ampc build/tools/ampc] [-- AMPC_FLAGS...]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_grads import read_npy  # noqa: E402


def relu_flips(ampc, path, inputs, out, flags=()):
    """(flips, elements) over the Relus' inputs, or None where the graph has no Relu or a run fails."""
    text = subprocess.run([ampc, path, "--emit", "text", *flags], capture_output=True, text=True).stdout
    names = sorted(set(re.findall(r"= Relu\(%([^)]+)\)", text)))
    if not names:
        return None
    meta = lambda n: "".join("\\" + ch if ch in "\\^$.|?*+()[]{}" else ch for ch in n)  # noqa: E731
    pattern = "^(" + "|".join(meta(n) for n in names) + ")$"
    runs = {}
    for prec in ("f32", "f64"):
        d = os.path.join(out, "relu_" + prec)
        r = subprocess.run([ampc, path, "--grad", "--eval", "--inputs", inputs, "--outputs", d, "--precision-run", prec,
                            "--eval-values", pattern, *flags], capture_output=True, text=True)
        if r.returncode:
            return None
        runs[prec] = d
    flips = total = 0
    for n in names:
        f = n.replace("/", "_").replace("\\", "_").replace(":", "_") + ".npy"
        if not all(os.path.exists(os.path.join(d, f)) for d in runs.values()):  # a value the gradient graph renamed
            continue
        a, b = read_npy(os.path.join(runs["f32"], f)), read_npy(os.path.join(runs["f64"], f))
        flips += sum(1 for x, y in zip(a, b) if (x > 0) != (y > 0))
        total += len(a)
    return flips, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("inputs")
    ap.add_argument("--ampc", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "tools", "ampc"))
    ap.add_argument("flags", nargs="*")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        r = relu_flips(a.ampc, a.model, a.inputs, out, a.flags)
    if r is None:
        print("no Relu, or an ampc run failed")
        return 1
    print(f"{r[0]} of {r[1]} ReLU inputs change sign from ampc's f64 run to its f32 one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
