#!/usr/bin/env python3
"""Fused attention against the unfused plan on full-size models (issue 22's reach check): each
model of zoo_full.py is exported, compiled by ampc at bf16 twice (as is, and with --no-fuse, which
keeps attention and GELU as the exporter wrote them), and each plan trains 20 steps on the GPU on
the same seeded synthetic batches. Prints, per model, how many attentions the plan fused, the
largest relative difference between the two runs' losses, and whether it is within --tol.

    python3 tools/bench/fusion_check.py --out DIR --models llama_hd128,bert_base_padded [--exporter torchscript]
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zoo_full import MODELS, export_training_graph  # noqa: E402


def int_ranges(inputs):
    """--int-range for every integer input: token ids over the vocabulary (the largest id the batch
    holds), a mask or other 0/1 input over 0:1."""
    out = []
    for name, t in inputs.items():
        if t.dtype in (torch.int64, torch.int32):
            hi = int(t.max()) if int(t.max()) > 1 else 1
            out += ["--int-range", f"{name}=0:{hi}"]
    return out


def losses(metrics):
    with open(metrics) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tol", type=float, default=2e-2)
    ap.add_argument("--work", default="/tmp/ampc-fusion")
    ap.add_argument("--ampc", default="ampc")
    ap.add_argument("--amprun", default="amprun")
    ap.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    ok = True
    for name in a.models.split(","):
        work = os.path.join(a.work, name)
        os.makedirs(work, exist_ok=True)
        torch.manual_seed(0)
        model, inputs = MODELS[name]()
        path = os.path.join(work, name + ".onnx")
        dyn = a.exporter == "dynamo"
        export_training_graph(model, tuple(inputs.values()), path, dynamo=dyn, input_names=list(inputs), external_data=True if dyn else None)
        row = {"model": name, "exporter": a.exporter}
        runs = {}
        for label, flags in (("fused", []), ("unfused", ["--no-fuse"])):
            plan = os.path.join(work, label + ".ampplan")
            subprocess.run([a.ampc, path, "--precision", "bf16", "--optimizer", "sgd", "--lr", "0.01", *flags, "-o", plan], check=True)
            text = subprocess.run([a.ampc, path, "--precision", "bf16", "--train", "--emit", "text", *flags], check=True,
                                  capture_output=True, text=True).stdout
            # ampc::Attention, or cuda::Attention where the CUDA lowering reads its operands in place
            row[label + "_attention_nodes"] = text.count("ampc::Attention(") + text.count("cuda::Attention(")
            row[label + "_softmax_nodes"] = text.count("Softmax(")
            metrics = os.path.join(work, label + ".jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            subprocess.run([a.amprun, plan, "--device", "cuda", "--synthetic", "--seed", "7", "--steps", str(a.steps), "--metrics", metrics,
                            *int_ranges(inputs)], check=True, capture_output=True)
            runs[label] = losses(metrics)
        f, u = runs["fused"], runs["unfused"]
        worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(f, u))
        row.update({"fused_losses": f, "unfused_losses": u, "max_rel_diff": worst, "within_tol": worst <= a.tol and len(f) == len(u) == a.steps})
        ok &= row["within_tol"]
        with open(os.path.join(a.out, "fusion_rows.jsonl"), "a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{name:18s} {a.exporter:11s} attention fused {row['fused_attention_nodes']:3d} (softmax left {row['fused_softmax_nodes']}), "
              f"unfused plan softmax {row['unfused_softmax_nodes']}; losses {f[0]:.4f} -> {f[-1]:.4f} vs {u[0]:.4f} -> {u[-1]:.4f}; "
              f"max rel diff {worst:.2e} {'ok' if row['within_tol'] else 'OVER ' + str(a.tol)}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
