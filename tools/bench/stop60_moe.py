"""Stop 60, on the GPU machine (transformers 5 there): the sweep's tiny Hugging Face mixtures of
experts exported through the helper (dynamo; the helper now switches transformers' experts backend to
batched_mm), with PyTorch's f64 and f32 loss and gradients saved beside each (ref/, ref32/), so that
ampc --grad can be checked against them on a machine without PyTorch:
    python3 tools/bench/stop60_moe.py OUT hf:mixtral hf:qwen2_moe ...
    ampc OUT/NAME/NAME.onnx --grad --eval --inputs OUT/NAME/inputs --outputs G
    python3 tools/sweep/compare_grads.py OUT/NAME/ref G"""
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sweep"))
import torchvision_sweep as ts  # noqa: E402

out = sys.argv[1]
for name in sys.argv[2:]:
    try:
        p = ts.prepare(name, out, "dynamo")
    except Exception as e:  # noqa: BLE001
        print(f"{name} PREPARE-ERROR {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}", flush=True)
        continue
    if isinstance(p, tuple):
        print(name, *p, flush=True)
        continue
    x64 = p.x.double() if p.x.is_floating_point() else p.x
    runs = {}
    for sub, dt in (("ref", "f64"), ("ref32", "f32")):
        m = ts.WithLoss(copy.deepcopy(p.reference), p.lossFn)
        for sub_m in m.modules():  # transformers' reference loop over the experts (grouped_mm takes no f64)
            if callable(getattr(sub_m, "set_experts_implementation", None)):
                sub_m.set_experts_implementation("eager")
        if dt == "f64":
            m = m.double()
        loss = m(x64 if dt == "f64" else p.x, p.t)
        loss.backward()
        d = os.path.join(p.d, sub)
        os.makedirs(d, exist_ok=True)
        for n, prm in m.named_parameters():
            if prm.grad is not None:
                np.save(os.path.join(d, p.names.get(n, n) + "_grad.npy"), prm.grad.detach().numpy().astype(np.float64))
        np.save(os.path.join(d, "loss.npy"), np.array([loss.item()]))
        runs[dt] = loss.item()
    print(f"{name} EXPORTED loss f64 {runs['f64']:.6f} f32 {runs['f32']:.6f} {os.path.getsize(p.path)} bytes", flush=True)
