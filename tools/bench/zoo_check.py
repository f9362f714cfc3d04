#!/usr/bin/env python3
"""The model zoo (models/zoo/make_zoo.py's output) trained by ampc against PyTorch's references.

    python3 tools/bench/zoo_check.py ZOO_DIR --device cuda [--ampc BIN --amprun BIN] [--out FILE.json]

For every FAMILY/FAMILY.EXPORTER.onnx with a ref.json: an fp32 SGD plan for 3 steps (losses within
1e-4 relative of PyTorch's fp32), then fp16 (dynamic loss scaling) and bf16 plans for 20 steps
(every loss within 5% of PyTorch AMP's on the same weights and batch, skipped steps within one).
Prints one line per check and a closing 'N passed, N failed'; exits 1 if any failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def metrics(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("zoo")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--ampc", default="ampc")
    ap.add_argument("--amprun", default="amprun")
    ap.add_argument("--out")
    a = ap.parse_args()
    results, passed, failed = [], 0, 0
    for fam in sorted(os.listdir(a.zoo)):
        d = os.path.join(a.zoo, fam)
        if not os.path.isfile(os.path.join(d, "ref.json")):
            continue
        ref = json.load(open(os.path.join(d, "ref.json")))
        for ex in ("dynamo", "torchscript"):
            model = os.path.join(d, f"{fam}.{ex}.onnx")
            if not os.path.exists(model):
                continue
            checks = [("fp32", 3, ref["sgd_fp32"], None, 1e-4)]
            for p in ("fp16", "bf16"):
                r = ref.get("amp_" + p, {})
                if "loss" in r:
                    checks.append((p, len(r["loss"]), r["loss"], r["skipped"], 0.05))
            for prec, steps, want, want_skipped, tol in checks:
                with tempfile.TemporaryDirectory() as t:
                    plan, m = os.path.join(t, "p.ampplan"), os.path.join(t, "m.jsonl")
                    code, out = run([a.ampc, model, "--precision", prec, "--optimizer", "sgd", "--lr", str(ref["sgd_lr"]), "-o", plan])
                    row = {"family": fam, "exporter": ex, "precision": prec}
                    if code == 0:
                        code, out = run([a.amprun, plan, "--device", a.device, "--data", os.path.join(d, "inputs"), "--steps",
                                         str(steps), "--log-every", "1", "--metrics", m])
                    if code != 0:
                        row.update(ok=False, error=out.strip().splitlines()[-1] if out.strip() else f"exit {code}")
                    else:
                        got = metrics(m)
                        losses = [g["loss"] for g in got]
                        dev = max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(losses, want))
                        ok = len(losses) == len(want) and dev < tol
                        row.update(losses=losses, worst_rel=dev)
                        if want_skipped is not None:
                            ours, theirs = sum(1 for g in got if g["skipped"]), sum(want_skipped)
                            row.update(skipped=ours, torch_skipped=theirs)
                            ok = ok and abs(ours - theirs) <= 1
                        row["ok"] = ok
                    passed += row["ok"]
                    failed += not row["ok"]
                    results.append(row)
                    print(f"{'ok  ' if row['ok'] else 'FAIL'} {fam}.{ex} {prec} {a.device}: "
                          + (f"worst loss deviation {row['worst_rel']:.2e}" if 'worst_rel' in row else row.get('error', ''))
                          + (f", skipped {row['skipped']} (PyTorch {row['torch_skipped']})" if 'skipped' in row else ""), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
