"""Stop 56: why ampc --grad gives hf:bloom's dynamo export no gradient for
h.0.post_attention_layernorm.weight (fp32 and bf16 alike; its TorchScript export passes): what
--summary says of each parameter, whether --no-fuse changes it, and the ONNX nodes downstream of
the initializer."""
import os
import subprocess
import sys
from collections import deque

import onnx

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "sweep"))
import torchvision_sweep as t  # noqa: E402

ampc = sys.argv[1]
name = sys.argv[2] if len(sys.argv) > 2 else "hf:bloom"
p = t.prepare(name, "/tmp/bloomdiag", "dynamo")
if isinstance(p, tuple):
    print("prepare:", p)
    sys.exit(0)
r = subprocess.run([ampc, p.path, "--summary"], capture_output=True, text=True)
print("== summary (frozen lines):")
print("\n".join(l for l in r.stdout.splitlines() if "frozen" in l or "trained:" in l)[:3000], r.stderr[-1500:])
for flags in ([], ["--no-fuse"]):
    gdir = "/tmp/bloomdiag/g" + "".join(flags)
    r = subprocess.run([ampc, p.path, "--grad", "--eval", "--inputs", os.path.join(p.d, "inputs"), "--outputs", gdir] + flags + p.flags,
                       capture_output=True, text=True)
    got = set(f[:-len("_grad.npy")] for f in os.listdir(gdir) if f.endswith("_grad.npy")) if os.path.isdir(gdir) else set()
    want = set(p.names.get(n, n) for n, q in p.reference.named_parameters() if q.requires_grad)
    print(f"== --grad {flags}: rc {r.returncode}, missing {sorted(want - got)}", r.stderr[-800:])
m = onnx.load(p.path, load_external_data=False)
target = [i.name for i in m.graph.initializer if "h.0.post_attention_layernorm.weight" in i.name]
print("== initializers:", target, "declared inputs:", [i.name for i in m.graph.input if "post_attention" in i.name])
users = {}
for n in m.graph.node:
    for i in n.input:
        users.setdefault(i, []).append(n)
seen, q = set(), deque((x, 0) for x in target)
while q:
    v, d = q.popleft()
    for n in users.get(v, []):
        if n.name in seen or d > 8:
            continue
        seen.add(n.name)
        print("  " * d + f"{n.op_type} {n.name}: {list(n.input)} -> {list(n.output)}"[:400])
        for o in n.output:
            q.append((o, d + 1))
