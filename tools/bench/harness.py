#!/usr/bin/env python3
"""ampc against PyTorch on the same GPU, in one call (issue 8). On the GPU machine, after staging
(see README, "Benchmarks"):

    source .gpu/env.sh && python3 .gpu/bench/harness.py --out $OUT/bench
    source .gpu/env.sh && python3 .gpu/bench/harness.py --out $OUT/bench --zoo   # the zoo set (zoo_full.py)

For each model (the seeds' MLP 10-100-10 at batch 100 with SGD; ResNet-50 at batch 256, 224x224,
SGD with momentum; GPT-2 124M at batch 8 x 1024 with AdamW) it exports the ONNX training graph with
the PyTorch installed there, compiles it with `ampc` at fp32, fp16 and bf16, runs `amprun --bench`
on one fixed batch, then runs PyTorch on the same model and batch: eager FP32 (TF32 off), eager AMP
fp16 with GradScaler, eager AMP bf16, and torch.compile with AMP bf16. Step time is the median of
--steps steps after --warmup; peak memory is PyTorch's max_memory_reserved (ampc: device memory in
use at the peak minus before loading, as amprun --bench measures it). MFU counts the model FLOPs
of a step (6 x params x tokens + attention for GPT-2; 3 x forward FLOPs for the others) against
the 800 TFLOP/s that cuBLASLt reaches on this H200 (../shared/GPU.md). Prints one table and writes
it as JSON (bench.json), with the ratio of each ampc row to each PyTorch row."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEAK_FLOPS = 800e12

MODELS = {
    "mlp": dict(batch=100, unit="samples", optimizer="--optimizer sgd --lr 0.01", data="--int-range target=0:9"),
    "resnet50": dict(batch=256, unit="images", optimizer="--optimizer sgd --lr 0.05 --momentum 0.9", data="--int-range target=0:999"),
    "gpt2": dict(batch=8 * 1024, unit="tokens", optimizer="--optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask",
                 data="--int-range input_ids=0:50256 --int-range labels=0:50256"),
}


def step_flops(model):
    if model == "mlp":
        return 3 * 2 * 100 * (10 * 100 + 100 * 10)
    if model == "resnet50":
        return 3 * 2 * 4.09e9 * 256  # 4.09 G multiply-adds (torchvision's "GFLOPS") per 224x224 image forward
    # GPT-2 124M: 6 N T for the weights (N without the position embedding) + 12 L T^2 d for attention.
    n, layers, d, seq, batch = 124.4e6 - 1024 * 768, 12, 768, 1024, 8
    return 6 * n * seq * batch + 12 * layers * seq * seq * d * batch


# ---------------------------------------------------------------- PyTorch side

def torch_model(model):
    import torch
    if model == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(10, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
        x, y = torch.randn(100, 10), torch.randint(0, 10, (100,))
        opt = lambda p: torch.optim.SGD(p, lr=0.01)
        loss = lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y)
    elif model == "resnet50":
        import torchvision
        net = torchvision.models.resnet50()
        x, y = torch.randn(256, 3, 224, 224), torch.randint(0, 1000, (256,))
        opt = lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)
        loss = lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel
        net = GPT2LMHeadModel(GPT2Config())  # PyTorch's own best attention (SDPA)
        x = torch.randint(0, 50257, (8, 1024))
        y = x.clone()
        opt = lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.01)
        loss = lambda m, x, y: m(input_ids=x, labels=y, use_cache=False).loss
    return net, x, y, opt, loss


def torch_run(model, mode, warmup, steps):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    net, x, y, make_opt, loss_fn = torch_model(model)
    dev = torch.device("cuda")
    net = net.to(dev).train()
    x, y = x.to(dev), y.to(dev)
    opt = make_opt(net.parameters())
    amp = {"fp32": None, "amp_fp16": torch.float16, "amp_bf16": torch.bfloat16, "compile_bf16": torch.bfloat16}[mode]
    scaler = torch.amp.GradScaler("cuda") if mode == "amp_fp16" else None
    fwd = torch.compile(net) if mode == "compile_bf16" else net

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp, enabled=amp is not None):
            l = loss_fn(fwd, x, y)
        if scaler:
            scaler.scale(l).backward()
            scaler.step(opt)
            scaler.update()
        else:
            l.backward()
            opt.step()
        return l

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        l = step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    loss = float(l)
    peak = torch.cuda.max_memory_reserved()
    del fwd, net, opt
    torch.cuda.empty_cache()
    return dict(step_ms=statistics.median(times), peak_bytes=peak, loss=loss, warmup_s=warm_s)


# ---------------------------------------------------------------- ampc side

def sh(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, shell=True, stdout=f, stderr=subprocess.STDOUT)
    return r.returncode


def export(model, work):
    if model == "mlp":  # the committed seeds' MLP (staged beside bench/, or the repository's)
        for d in (os.path.join(HERE, "..", "models"), os.path.join(HERE, "..", "..", "models")):
            if os.path.exists(os.path.join(d, "mlp.onnx")):
                return os.path.join(d, "mlp.onnx")
    path = os.path.join(work, model + ".onnx")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(HERE, "export_models.py"), work, model], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return path


def ampc_run(model, precision, onnx, work, steps, flags=""):
    cfg = MODELS[model]
    plan = os.path.join(work, f"{model}.{precision}.ampplan")
    log = os.path.join(work, f"{model}.{precision}.log")
    if sh(f"ampc {onnx} --precision {precision} {cfg['optimizer']} {flags} -o {plan}", log) != 0:
        return dict(error=open(log).read()[-400:])
    if sh(f"amprun {plan} --synthetic {cfg['data']} --steps {steps} --bench", log) != 0:
        return dict(error=open(log).read()[-400:])
    text = open(log).read()
    step_ms = float(re.search(r"median ([0-9.]+) ms", text).group(1))
    peak = re.search(r"peak device memory \(measured\) ([0-9.]+) MiB", text)
    syncs = re.search(r"\(([0-9.]+) per step\)", text)
    peak = float(peak.group(1)) * 2**20 if peak else float("nan")
    syncs = float(syncs.group(1)) if syncs else None
    losses = re.findall(r"loss ([0-9.eE+-]+|nan|inf)", text)
    launches = re.search(r"launches per step: ([0-9]+)", text)
    return dict(step_ms=step_ms, peak_bytes=peak, host_syncs_per_step=syncs, loss=float(losses[-1]) if losses else None,
                launches_per_step=int(launches.group(1)) if launches else None, ampc_flags=flags)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench")
    ap.add_argument("--work", default="/tmp/ampc-bench")
    ap.add_argument("--models", default="mlp,resnet50,gpt2")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--torch-modes", default="fp32,amp_fp16,amp_bf16,compile_bf16")
    ap.add_argument("--ampc-precisions", default="fp32,fp16,bf16")
    ap.add_argument("--ampc-flags", action="append", default=None,
                    help="more ampc flags for the ampc rows; repeat to measure each set in turn (e.g. '' and '--no-fuse-elementwise')")
    ap.add_argument("--torch-one", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--table", nargs="+", metavar="ROWS.jsonl",
                    help="measure nothing: print the table (and write OUT/bench.json) from rows.jsonl files of earlier calls")
    ap.add_argument("--zoo", nargs="?", const=",".join(ZOO), metavar="MODELS",
                    help="the zoo set instead (zoo_full.py: full-size timm and transformers models, ampc bf16 against "
                         "torch.compile AMP bf16 in the same call); prints the zoo table")
    ap.add_argument("--zoo-table", nargs="+", metavar="ROWS.jsonl", help="measure nothing: the zoo table from zoo_full.py's rows")
    a = ap.parse_args()
    if a.zoo_table:
        rows = []
        for path in a.zoo_table:
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        zoo_report(rows)
        return
    if a.zoo:
        os.makedirs(a.out, exist_ok=True)
        zoo_out = os.path.join(a.out, "zoo")
        subprocess.run([sys.executable, os.path.join(HERE, "zoo_full.py"), "--out", zoo_out, "--models", a.zoo, "--steps", str(a.steps),
                        "--torch-compile", "--work", os.path.join(a.work, "zoo")], check=False)
        path = os.path.join(zoo_out, "rows.jsonl")
        with open(path) as f:
            zoo_report([json.loads(line) for line in f if line.strip()])
        return
    if a.table:
        rows = []
        for path in a.table:
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        os.makedirs(a.out, exist_ok=True)
        report(rows, a.out)
        return
    if a.torch_one:  # one PyTorch configuration in its own process (clean allocator and peak)
        print("RESULT " + json.dumps(torch_run(a.torch_one[0], a.torch_one[1], a.warmup, a.steps)))
        return
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    rows = []
    for model in a.models.split(","):
        onnx = export(model, a.work)
        for p in [p for p in a.ampc_precisions.split(",") if p]:  # "" runs none
            for flags in a.ampc_flags or [""]:
                r = ampc_run(model, p, onnx, a.work, a.warmup + a.steps, flags)
                rows.append(dict(model=model, system="ampc", mode=p + (" " + flags if flags else ""), **r))
                print(json.dumps(rows[-1]), flush=True)
                with open(os.path.join(a.out, "rows.jsonl"), "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
        for mode in [m for m in a.torch_modes.split(",") if m]:
            r = subprocess.run([sys.executable, __file__, "--torch-one", model, mode, "--warmup", str(a.warmup), "--steps", str(a.steps)],
                               capture_output=True, text=True)
            m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
            res = json.loads(m.group(1)) if m else dict(error=(r.stderr or r.stdout)[-400:])
            rows.append(dict(model=model, system="torch", mode=mode, **res))
            print(json.dumps(rows[-1]), flush=True)
            with open(os.path.join(a.out, "rows.jsonl"), "a") as f:  # kept if the call is cut short
                f.write(json.dumps(rows[-1]) + "\n")
    report(rows, a.out)


# Issue 19's models beyond the two tuned ones (zoo_full.py's MODELS names).
ZOO = ["convnext_t", "efficientnet_b0", "vit_s", "mobilenetv3_l", "bert_base", "llama_100m"]


def zoo_report(rows):
    """ampc bf16 against torch.compile AMP bf16 of the same zoo_full.py call: step time, peak memory,
    launches, and whether ampc is at least as fast at no higher peak (the criterion of issue 19, on
    torch.compile's median step). `fastest`: torch.compile's fastest step of the call, and ampc's
    speedup against it (rows from before zoo_full recorded it show '-')."""
    print(f"\n{'model':16} {'ampc ms':>8} {'GiB':>6} {'launches':>8} {'compile ms':>10} {'GiB':>6} {'speedup':>8} {'memory':>7} "
          f"{'fastest':>8} {'vs it':>6}  verdict")
    for r in rows:
        if "ampc_ms" not in r or "torch_compile_ms" not in r:
            print(f"{r.get('model', '?'):16} error: {(r.get('error') or r.get('ampc_error') or 'no timing')[:90]!r}")
            continue
        speed = r["torch_compile_ms"] / r["ampc_ms"]
        mem = r["ampc_peak_gib"] / r["torch_compile_peak_gib"]
        verdict = "meets" if speed >= 1.0 and mem <= 1.0 else ("slower" if speed < 1.0 else "") + (" more memory" if mem > 1.0 else "")
        fastest = r.get("torch_compile_min_ms")
        fast = f"{fastest:8.2f} {fastest / r['ampc_ms']:5.2f}x" if fastest else f"{'-':>8} {'-':>6}"
        print(f"{r['model']:16} {r['ampc_ms']:8.2f} {r['ampc_peak_gib']:6.2f} {r.get('ampc_launches', 0):8d} "
              f"{r['torch_compile_ms']:10.2f} {r['torch_compile_peak_gib']:6.2f} {speed:7.2f}x {mem:7.2f} {fast}  {verdict.strip()}")


def report(rows, out):
    """Throughput, MFU and the ratios of each ampc row to each PyTorch row of its model; prints the
    table and writes bench.json into `out`."""
    for row in rows:
        if "step_ms" in row:
            cfg = MODELS[row["model"]]
            row["per_s"] = cfg["batch"] / (row["step_ms"] / 1e3)
            row["unit"] = cfg["unit"]
            row["mfu"] = step_flops(row["model"]) / (row["step_ms"] / 1e3) / PEAK_FLOPS
    # Ratios: each ampc row against each PyTorch row of the same model.
    for r in rows:
        if r["system"] != "ampc" or "step_ms" not in r:
            continue
        r["vs_torch"] = {t["mode"]: dict(speedup=t["step_ms"] / r["step_ms"], memory=r["peak_bytes"] / t["peak_bytes"])
                         for t in rows if t["model"] == r["model"] and t["system"] == "torch" and "step_ms" in t}
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(dict(gpu=subprocess.run("nvidia-smi --query-gpu=name --format=csv,noheader", shell=True, capture_output=True,
                                          text=True).stdout.strip(), peak_flops=PEAK_FLOPS, rows=rows), f, indent=1)
    print(f"\n{'model':9} {'system':6} {'mode':13} {'step ms':>9} {'peak GiB':>9} {'throughput':>18} {'MFU':>6}  ampc speedup / memory ratio vs torch")
    for r in rows:
        if "step_ms" not in r:
            print(f"{r['model']:9} {r['system']:6} {r['mode']:13} error: {r.get('error', '')[:80]!r}")
            continue
        vs = "  ".join(f"{k} {v['speedup']:.2f}x/{v['memory']:.2f}" for k, v in r.get("vs_torch", {}).items())
        print(f"{r['model']:9} {r['system']:6} {r['mode']:13} {r['step_ms']:9.3f} {r['peak_bytes'] / 2**30:9.2f} "
              f"{r['per_s']:12.0f} {r['unit']:>5} {100 * r['mfu']:5.1f}%  {vs}")


if __name__ == "__main__":
    main()
