"""Stop 56: what PyTorch 2.11's dynamo exporter writes for the channel-wise and alpha dropouts in
training mode (the TorchScript exporter refuses them), and whether ampc takes the file."""
import subprocess
import sys

import onnx
import torch
import torch.nn as nn

ampc = sys.argv[1]
for name, drop in [("dropout2d", nn.Dropout2d(0.3)), ("alpha", nn.AlphaDropout(0.3)), ("feature_alpha", nn.FeatureAlphaDropout(0.3))]:
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.d = nn.Conv2d(3, 4, 3), drop
        def forward(self, x):
            return (self.d(self.c(x)) ** 2).mean()
    path = f"/tmp/{name}.onnx"
    try:
        torch.onnx.export(M().train(), (torch.randn(2, 3, 8, 8),), path, dynamo=True, optimize=False)
    except Exception as e:  # noqa: BLE001
        print(name, "EXPORT FAILS", str(e).splitlines()[0][:200])
        continue
    m = onnx.load(path)
    print(name, [n.op_type for n in m.graph.node])
    r = subprocess.run([ampc, path, "--summary"], capture_output=True, text=True)
    print("  ampc rc", r.returncode, r.stderr[-300:])
