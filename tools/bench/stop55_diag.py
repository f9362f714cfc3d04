"""Stop 55's diagnosis on the GPU machine: why the dynamo exporter fails on models (the root
cause of each, with and without ampc_export.py's stop-gradient markers); which of losses_many's
terms ampc computes differently; gnn_scatter's loss from onnxruntime beside ampc's and PyTorch's."""
import os
import subprocess
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "sweep"))
sys.path.insert(0, os.path.join(here, "..", "export"))
import torchvision_sweep as t  # noqa: E402
import ampc_export  # noqa: E402

ampc = sys.argv[1]
what = sys.argv[2]
out = "/tmp/diag55"


def root_cause(e):
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    return e


if what == "export":
    for name in sys.argv[3:]:
        for marks in ("1", "0"):
            os.environ["AMPC_EXPORT_MARKS"] = marks
            build, res, *rest = t.entry(name)
            torch.manual_seed(0)
            try:
                model = build()
                t.no_randomness(model)
                model.train()
                x = rest[2]() if len(rest) > 2 else torch.randn(2, 3, res, res)
                tt = torch.randint(0, 10, (2,))
                w = t.WithLoss(model, rest[0] if rest else None)
                n = ampc_export.stop_gradients(w, (x, tt))
                os.makedirs(f"{out}/{name}", exist_ok=True)
                ampc_export.export_training_graph(w, (x, tt), f"{out}/{name}/m.onnx", dynamo=True, input_names=["x", "target"])
                print(f"{name} marks={marks} detached={n}: EXPORTED", flush=True)
            except Exception as e:  # noqa: BLE001
                r = root_cause(e)
                tb = "".join(traceback.format_exception(type(r), r, r.__traceback__)[-6:])
                print(f"{name} marks={marks}: FAILS {type(r).__name__}: {str(r)[:600]}\n{tb[-1500:]}", flush=True)

if what == "losses":
    terms = {
        "l1": lambda o, s, y, sign, t_: F.l1_loss(o, s),
        "kl": lambda o, s, y, sign, t_: F.kl_div(F.log_softmax(o / 2, 1), F.softmax(s / 2, 1), reduction="batchmean") * 4,
        "margin_ranking": lambda o, s, y, sign, t_: F.margin_ranking_loss(o[:, 0], o[:, 1], torch.tensor([1.0, -1.0], dtype=o.dtype), margin=0.1),
        "triplet": lambda o, s, y, sign, t_: F.triplet_margin_loss(o[:, :3], o[:, 3:6], o[:, 6:9], margin=0.5),
        "cosine_embedding": lambda o, s, y, sign, t_: F.cosine_embedding_loss(o[:, :5], o[:, 5:], torch.tensor([1.0, -1.0], dtype=o.dtype), margin=0.1),
        "multilabel_soft_margin": lambda o, s, y, sign, t_: F.multilabel_soft_margin_loss(o, y),
        "soft_margin": lambda o, s, y, sign, t_: F.soft_margin_loss(o, sign),
        "poisson_nll": lambda o, s, y, sign, t_: F.poisson_nll_loss(o, y, log_input=True),
        "hinge_embedding": lambda o, s, y, sign, t_: F.hinge_embedding_loss(o, sign, margin=0.5),
        "nll_ignore": lambda o, s, y, sign, t_: F.nll_loss(F.log_softmax(o, 1), t_, ignore_index=3),
        "ce_smoothing": lambda o, s, y, sign, t_: F.cross_entropy(o, t_, label_smoothing=0.1),
    }
    only = os.environ.get("TERMS", "").split()
    for name, fn in terms.items():
        if only and name not in only:
            continue
        def loss(o, t_, fn=fn):
            y = F.one_hot(t_, 10).to(o.dtype)
            s = torch.linspace(-1, 1, 10, dtype=o.dtype).expand(2, 10)
            sign = torch.where(y > 0, torch.ones_like(y), -torch.ones_like(y))
            return fn(o, s, y, sign, t_)
        t.MODELS["term_" + name] = (t.SmallNet, 8, loss)
        for exporter in os.environ.get("EXPORTERS", "dynamo torchscript").split():
            try:
                v, detail = t.check("term_" + name, ampc, os.path.join(os.path.dirname(ampc), "amprun"), f"{out}/{exporter}", exporter)
            except Exception as e:  # noqa: BLE001
                v, detail = "SWEEP-ERROR", str(e)[:200]
            print(f"{name:24s} {exporter:12s} {v:14s} {detail[:220]}", flush=True)

if what == "ort":
    import onnxruntime as ort
    for d in sys.argv[3:]:
        name = os.path.basename(d.rstrip("/"))
        path = f"{d}/{name}.onnx"
        feeds = {"x": np.load(f"{d}/inputs/x.npy"), "target": np.load(f"{d}/inputs/target.npy")}
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = s.run(None, {k: v for k, v in feeds.items() if k in [i.name for i in s.get_inputs()]})[0]
        r = subprocess.run([ampc, path, "--eval", "--inputs", f"{d}/inputs"], capture_output=True, text=True)
        ref = float(np.load(f"{d}/ref/loss.npy")) if os.path.exists(f"{d}/ref/loss.npy") else float("nan")
        print(f"{name}: onnxruntime {float(got):.6f}, ampc {r.stdout.strip()[:120]}, PyTorch f64 {ref:.6f}", flush=True)
