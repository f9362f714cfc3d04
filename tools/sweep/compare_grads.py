#!/usr/bin/env python3
"""Compares two folders of gradients (NAME_grad.npy, f32 or f64), without numpy: the relative L2
error of each file in WANT against the same-named file in GOT, the largest first. For a model the
sweep got wrong, on a machine without PyTorch:

    ampc M.onnx --grad --eval --inputs DIR/inputs --outputs /tmp/g
    python3 tools/sweep/compare_grads.py DIR/ref /tmp/g [--top 20]
"""
import argparse
import array
import ast
import math
import os
import sys


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not an .npy file")
    major = data[6]
    hlen = int.from_bytes(data[8:10], "little") if major == 1 else int.from_bytes(data[8:12], "little")
    start = (10 if major == 1 else 12) + hlen
    header = ast.literal_eval(data[(10 if major == 1 else 12):start].decode("latin1"))
    code = {"<f4": "f", "<f8": "d"}.get(header["descr"])
    if code is None or header.get("fortran_order"):
        raise ValueError(f"{path}: {header['descr']} (fortran {header.get('fortran_order')}) is not read here")
    a = array.array(code)
    a.frombytes(data[start:])
    return a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("want")
    ap.add_argument("got")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    rows, largest = [], 0.0
    for f in sorted(os.listdir(a.want)):
        if not f.endswith("_grad.npy"):
            continue
        w = read_npy(os.path.join(a.want, f))
        gp = os.path.join(a.got, f)
        if not os.path.exists(gp):
            print(f"{f}: missing in {a.got}")
            continue
        g = read_npy(gp)
        if len(g) != len(w):
            print(f"{f}: {len(g)} elements, want {len(w)}")
            continue
        norm = math.sqrt(sum(v * v for v in w))
        err = math.sqrt(sum((x - y) ** 2 for x, y in zip(g, w)))
        largest = max(largest, norm)
        rows.append((err / norm if norm else err, norm, f[:-9]))
    rows = [r for r in rows if r[1] >= 1e-3 * largest]  # as the sweep: the gradients that are not ~0
    rows.sort(reverse=True)
    for rel, norm, name in rows[:a.top]:
        print(f"{rel:10.3e}  |g| {norm:9.3e}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
