#!/usr/bin/env python3
"""ampc's loss, step by step, against PyTorch's on the same weights and the same batch: ResNet-50 at
the harness's settings (batch 256, 224x224, SGD lr 0.05 momentum 0.9). On the GPU machine:

    source .gpu/env.sh && python3 .gpu/bench/same_batch.py --out $OUT/same --steps 25

It builds torchvision's ResNet-50 (seed 0), exports it (export_models.py's exporter), writes the
batch as x.npy / target.npy, trains ampc's fp32, fp16 and bf16 plans on it (`amprun --data DIR
--fixed-batch --metrics`), then PyTorch from the same initial weights: eager FP32 (TF32 off), AMP
fp16 with GradScaler, AMP bf16. Prints each step's losses and writes them as JSON (same_batch.json).
The harness's single loss after 25 steps cannot tell a numerics fault from different data; this
can, at the first steps, before rounding differences grow."""
import argparse
import copy
import json
import os
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from export_models import WithLoss, export  # noqa: E402


def torch_losses(model, state, x, t, mode, steps):
    model.load_state_dict(state)
    model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=mode == "amp_fp16")
    dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(mode)
    out = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(x, t)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        out.append(float(loss))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/ampc-same")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    data = os.path.join(a.work, "data")
    os.makedirs(data, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    import torchvision
    torch.manual_seed(0)
    model = WithLoss(torchvision.models.resnet50())
    state = copy.deepcopy(model.state_dict())  # before the export's traced forward touches the running stats
    x = torch.randn(a.batch, 3, 224, 224)
    t = torch.randint(0, 1000, (a.batch,))
    onnx = os.path.join(a.work, "resnet50.onnx")
    export(model, (x, t), ["x", "target"], onnx)
    np.save(os.path.join(data, "x.npy"), x.numpy())
    np.save(os.path.join(data, "target.npy"), t.numpy())

    rows = {}
    for p in ("fp32", "fp16", "bf16"):
        plan = os.path.join(a.work, f"resnet50.{p}.ampplan")
        metrics = os.path.join(a.work, f"resnet50.{p}.jsonl")
        subprocess.run(["ampc", onnx, "--precision", p, "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "-o", plan], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["amprun", plan, "--data", data, "--fixed-batch", "--steps", str(a.steps), "--metrics", metrics], check=True,
                       stdout=subprocess.DEVNULL)
        rows["ampc " + p] = [json.loads(line)["loss"] for line in open(metrics)]
    xc, tc = x.cuda(), t.cuda()
    for mode in ("fp32", "amp_fp16", "amp_bf16"):
        rows["torch " + mode] = torch_losses(model, state, xc, tc, mode, a.steps)

    names = list(rows)
    print("step  " + "".join(f"{n:>15}" for n in names))
    for s in range(a.steps):
        print(f"{s + 1:4}  " + "".join(f"{rows[n][s]:15.5f}" if s < len(rows[n]) else f"{'-':>15}" for n in names))
    with open(os.path.join(a.out, "same_batch.json"), "w") as f:
        json.dump(dict(model="resnet50", batch=a.batch, optimizer="sgd lr 0.05 momentum 0.9", losses=rows), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
