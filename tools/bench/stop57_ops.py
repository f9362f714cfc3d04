"""Stop 57: what PyTorch's dynamo exporter writes for x[mask] and for a hand-written mixture of
experts (torch.where + index_add), printed around each NonZero, and what ampc says of each graph."""
import collections
import subprocess
import sys

import onnx

ampc = sys.argv[1]
for path in sys.argv[2:]:
    g = onnx.load(path).graph
    print(f"== {path}: {dict(collections.Counter(n.op_type for n in g.node))}")
    users = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            users[i].append(n)
    for n in g.node:
        if n.op_type != "NonZero":
            continue
        frontier, seen = [n], set()
        for depth in range(6):
            nxt = []
            for m in frontier:
                for o in m.output:
                    for u in users[o]:
                        if u.name in seen:
                            continue
                        seen.add(u.name)
                        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in u.attribute if a.name != "value"}
                        print("  " * (depth + 1) + f"{u.op_type} {u.name} {list(u.input)} {attrs}")
                        nxt.append(u)
            frontier = nxt
        break  # the first NonZero's readers show the form
    r = subprocess.run([ampc, path, "--summary"], capture_output=True, text=True)
    print("ampc:", (r.stderr.strip().splitlines() or ["ok"])[-1][:400] if r.returncode else "takes it")
