"""Stop 57: why PyTorch's dynamo exporter fails on x[mask] losses (masked_selection, and each of its
losses alone) and on transformers' MoE models: the exception's telling lines."""
import os
import re
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sweep"))
import torchvision_sweep as sw  # noqa: E402

m = lambda o: o[2] >= 0  # noqa: E731
variants = {
    "ce": lambda o, t: F.cross_entropy(o[0][m(o)], o[2][m(o)]),
    "mse": lambda o, t: ((o[1][m(o)] - o[3][m(o)]) ** 2).mean(),
    "lse": lambda o, t: torch.logsumexp(o[0][m(o)], -1).mean(),
    "amax": lambda o, t: o[0][m(o)].amax(0).sum(),
    "ce_none": lambda o, t: F.cross_entropy(o[0][m(o)], o[2][m(o)], reduction="none").sum(),
}
cases = [(f"masked_selection:{k}", sw.MaskedSelection, v) for k, v in variants.items()]
cases += [(n, None, None) for n in sys.argv[1:]]
for name, build, loss in cases:
    try:
        if build is None:
            b, res, *rest = sw.entry(name)
            model, x = b(), torch.randn(2, 3, res, res)
            loss = rest[0] if rest else None
            if len(rest) > 2:
                x = rest[2]()
        else:
            model, x = build(), torch.randn(2, 3, 8, 8)
        sw.no_randomness(model)
        model.train()
        w = sw.WithLoss(model, loss)
        t = torch.randint(0, 10, (2,))
        torch.onnx.export(w, (x, t), f"/tmp/why_{name.replace(':', '_')}.onnx", dynamo=True, optimize=False)
        print(f"== {name}: exported")
    except Exception as e:  # noqa: BLE001
        text = "".join(traceback.format_exception(e))
        keep = [ln for ln in text.splitlines() if re.search(r"data-dependent|Could not guard|Guard|Unsupported|histc|No ONNX|DispatchError|u\d+ |Error:|torch\._|File \".*(transformers|torchvision_sweep)", ln)]
        print(f"== {name}: FAILS\n" + "\n".join(dict.fromkeys(keep[-30:])))
