#!/usr/bin/env python3
"""XGLM's clamp of the masked scores, max(S + M, lowest), as ampc fuses it (the fused op's
score_floor), against PyTorch on the same weights and batch, where the floor matters: a left-padded
sequence, whose first queries see only padding (rows masked everywhere, uniform after the clamp).

A small XGLM (the library sweep's configuration: tools/sweep/torchvision_sweep.py's hf_config), its
causal LM loss over every position (so the masked rows' outputs reach the loss), exported by
tools/export/ampc_export.py (TorchScript: the dynamo exporter fails on XGLM), then
- `ampc --grad --eval` fused and with --no-fuse: the loss and every parameter's gradient against
  PyTorch's f32 ones (relative L2; PyTorch's f64 run fails on XGLM's finfo constants);
- where CUDA is present, 3 SGD steps of fp32 plans on the GPU, fused and not, against PyTorch's f32
  steps; and 20 bf16 steps fused against unfused.
Prints one JSON line per check; exit status 1 where a check fails.

    python3 tools/bench/floor_check.py --ampc .gpu/bin/ampc --amprun .gpu/bin/amprun --out /tmp/fc
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tools", "sweep"))
sys.path.insert(0, os.path.join(root, "tools", "export"))
from torchvision_sweep import HF_TINY, hf_config  # noqa: E402
from ampc_export import export_training_graph  # noqa: E402

LR = 0.005


class LmLoss(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids, mask, target):
        logits = self.m(input_ids=ids, attention_mask=mask).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampc", required=True)
    ap.add_argument("--amprun", required=True)
    ap.add_argument("--out", default="/tmp/floor_check")
    a = ap.parse_args()
    os.makedirs(os.path.join(a.out, "inputs"), exist_ok=True)
    torch.manual_seed(0)
    from transformers import XGLMForCausalLM
    model = XGLMForCausalLM(hf_config("xglm", HF_TINY)).train()
    T = 12
    ids = torch.randint(3, HF_TINY["vocab_size"], (2, T))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, :4] = 0  # batch 1 left-padded: its queries 0-3 see only padding keys
    target = torch.randint(3, HF_TINY["vocab_size"], (2, T))
    for n, v in (("ids", ids), ("mask", mask), ("target", target)):
        np.save(os.path.join(a.out, "inputs", n + ".npy"), v.numpy())
    path = os.path.join(a.out, "xglm.onnx")
    ref = LmLoss(model)
    export_training_graph(ref, (ids, mask, target), path, dynamo=False, input_names=["ids", "mask", "target"])
    r = subprocess.run([a.ampc, path, "--precision", "bf16", "--train", "--emit", "text"], capture_output=True, text=True)
    fused = r.stdout.count("score_floor")
    print(json.dumps({"check": "fused", "ok": fused > 0 and " Softmax(" not in r.stdout, "attentions_with_floor": fused,
                      "softmax_left": r.stdout.count(" Softmax(")}))
    fails = int(fused == 0)
    import onnx
    meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    listed = json.loads(meta.get("ampc.trainable", "[]"))
    params = [n for n, p in ref.named_parameters() if p.requires_grad]

    m32 = LmLoss(model)
    m32.zero_grad()
    loss32 = m32(ids, mask, target)
    loss32.backward()
    theirs = {n: p.grad.numpy().copy() for n, p in m32.named_parameters() if p.grad is not None}
    for flag in ([], ["--no-fuse"]):
        g = os.path.join(a.out, "grads" + ("_unfused" if flag else ""))
        r = subprocess.run([a.ampc, path, "--grad", "--eval", "--inputs", os.path.join(a.out, "inputs"), "--outputs", g] + flag,
                           capture_output=True, text=True)
        if r.returncode:
            print(json.dumps({"check": "grad" + "".join(flag), "error": (r.stdout + r.stderr)[-400:]}))
            fails += 1
            continue
        loss = float(np.load(os.path.join(g, "loss.npy")))
        worst, wn, missing, checked = 0.0, "", [], 0
        largest = max(np.linalg.norm(w) for w in theirs.values())
        for n, want in theirs.items():
            f = os.path.join(g, n + "_grad.npy")
            if not os.path.exists(f):
                missing.append(n)
                continue
            # A gradient that is 0 but for rounding (the key projection's bias: softmax does not see a
            # shift of a row's scores) has no relative error: as the library sweep, those under 1e-3
            # of the largest are not compared.
            if np.linalg.norm(want) < 1e-3 * largest:
                continue
            checked += 1
            e = rel(np.load(f).astype(np.float64), want.astype(np.float64))
            if e > worst:
                worst, wn = e, n
        ok = abs(loss - loss32.item()) <= 1e-5 * abs(loss32.item()) and worst <= 1e-4 and not missing and checked > 0
        fails += not ok
        print(json.dumps({"check": "grad" + "".join(flag), "ok": ok, "loss": loss, "torch_loss": loss32.item(), "worst_grad": wn,
                          "worst_rel": worst, "missing": missing[:5], "checked": checked, "listed": len(listed), "params": len(params)}))
    if not torch.cuda.is_available():
        return fails
    # 3 fp32 SGD steps on the GPU against PyTorch's f32 steps on the CPU.
    m = LmLoss(XGLMForCausalLM(hf_config("xglm", HF_TINY)).train())
    m.load_state_dict(ref.state_dict())
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = m(ids, mask, target)
        loss.backward()
        opt.step()
        want.append(loss.item())
    runs = {}
    for prec, steps in (("fp32", 3), ("bf16", 20)):
        for flag in ([], ["--no-fuse"]):
            key = prec + "".join(flag)
            plan = os.path.join(a.out, key + ".ampplan")
            r = subprocess.run([a.ampc, path, "--precision", prec, "--optimizer", "sgd", "--lr", str(LR), "-o", plan] + flag,
                               capture_output=True, text=True)
            metrics = os.path.join(a.out, key + ".jsonl")
            if r.returncode == 0:
                r = subprocess.run([a.amprun, plan, "--device", "cuda", "--data", os.path.join(a.out, "inputs"), "--steps", str(steps),
                                    "--log-every", "1", "--metrics", metrics], capture_output=True, text=True)
            if r.returncode:
                print(json.dumps({"check": key, "error": (r.stdout + r.stderr)[-400:]}))
                fails += 1
                continue
            runs[key] = [json.loads(line)["loss"] for line in open(metrics)]
    for key in ("fp32", "fp32--no-fuse"):
        if key in runs:
            d = max(abs(x - y) / abs(y) for x, y in zip(runs[key], want))
            fails += d > 1e-4
            print(json.dumps({"check": "cuda " + key + " vs torch f32", "ok": d <= 1e-4, "ampc": runs[key], "torch": want, "max_rel": d}))
    if "bf16" in runs and "bf16--no-fuse" in runs:
        d = max(abs(x - y) / abs(y) for x, y in zip(runs["bf16"], runs["bf16--no-fuse"]))
        fails += d > 2e-2
        print(json.dumps({"check": "cuda bf16 fused vs unfused, 20 steps", "ok": d <= 2e-2, "max_rel": d,
                          "fused": runs["bf16"][::5], "unfused": runs["bf16--no-fuse"][::5]}))
    return fails


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
