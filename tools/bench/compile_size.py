#!/usr/bin/env python3
"""How ampc's compile scales with the weights: wall time and peak resident memory of `ampc` (one
process, measured by /usr/bin/time), and the bytes of the plan plus its weights file, each against the
bytes of the model's float weights.

    compile_size.py MODEL.onnx [--precision bf16] [--work DIR]
    compile_size.py --make-gpt124 build/models/gpt124.onnx   # a GPT-2 124M-size decoder LM (12 x 768,
                                                             # vocab 50257, context 1024), TorchScript export

The --make-gpt124 model is models/make_models.py's TinyGPT at GPT-2 124M's sizes (163M parameters:
its head is not tied), so this runs on a machine without transformers. On the GPU machine,
tools/bench/zoo_full.py measures the same on Hugging Face's GPT-2 and a 1.6B Llama.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def make_gpt124(path):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "models"))
    from make_models import TinyGPT, export  # noqa: E402
    torch.manual_seed(0)
    seq = 1024
    model = TinyGPT(vocab=50257, seq=seq, d=768, heads=12, layers=12)
    idx = torch.randint(0, 50257, (1, seq))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    export(model, (idx, idx.clone()), ["idx", "target"], path)


def measure(cmd):
    """Runs cmd under /usr/bin/time; returns (exit code, output, wall seconds, peak resident bytes of
    that process alone). Not wait4's rusage of a child forked from this interpreter: a fork starts
    with the parent's resident set, and ru_maxrss keeps it across exec (with torch loaded, GBs)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", tf.name] + cmd, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        wall, kb = tf.read().split()[-2:]
    return p.returncode, p.stdout, float(wall), int(kb) * 1024


def weight_bytes(path):
    import onnx
    m = onnx.load(path, load_external_data=False)
    size = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.BFLOAT16: 2, onnx.TensorProto.DOUBLE: 8}
    total = 0
    for t in m.graph.initializer:
        if t.data_type in size:
            n = 1
            for d in t.dims:
                n *= d
            total += n * size[t.data_type]
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--make-gpt124", action="store_true")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--ampc", default=os.path.join(ROOT, "build", "tools", "ampc"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--flags", default="", help="more ampc flags")
    a = ap.parse_args()
    if a.make_gpt124:
        if not os.path.exists(a.model):
            make_gpt124(a.model)
    work = a.work or tempfile.mkdtemp(prefix="ampc-size-")
    plan = os.path.join(work, "m.ampplan")
    cmd = [a.ampc, a.model, "--precision", a.precision, "-o", plan] + a.flags.split()
    code, out, wall, rss = measure(cmd)
    if code != 0:
        print(out)
        return code
    wb = weight_bytes(a.model)
    files = os.path.getsize(plan) + os.path.getsize(plan + ".safetensors")
    row = {"model": a.model, "weights_mb": round(wb / 1e6, 1), "compile_s": round(wall, 2), "peak_rss_mb": round(rss / 1e6, 1),
           "peak_rss_x_weights": round(rss / wb, 3), "plan_mb": round(os.path.getsize(plan) / 1e6, 2),
           "plan_plus_weights_file_x_weights": round(files / wb, 4)}
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
