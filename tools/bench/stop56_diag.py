"""Stop 56: what the dynamo exporter writes for r3d_18's Conv3d (ampc: 'B must have shape [M]') and
which op of embedding_max_norm's export ampc does not support."""
import subprocess
import sys

import onnx

ampc = sys.argv[1]
for path in sys.argv[2:]:
    m = onnx.load(path, load_external_data=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception as e:  # noqa: BLE001
        print("shape inference:", e)
        inferred = m
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in
              list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    print("==", path, "opset", [(o.domain, o.version) for o in m.opset_import])
    shown = 0
    for n in m.graph.node:
        if n.op_type == "Conv" and len(n.input) > 2 and shown < 3:
            shown += 1
            b = n.input[2]
            p = prod.get(b)
            print(f"  Conv {n.name}: inputs {list(n.input)}; B init dims {inits.get(b)}, inferred {shapes.get(b)}, "
                  f"produced by {p.op_type + ' ' + p.name + ' ' + str(list(p.input)) if p else None}")
            if p is not None:
                for i in p.input:
                    q = prod.get(i)
                    print(f"    {i}: init {inits.get(i)} inferred {shapes.get(i)} from {q.op_type if q else None}")
    r = subprocess.run([ampc, path, "--summary"], capture_output=True, text=True)
    print("  ampc:", r.stderr[-600:])
    print("  ops:", sorted({(n.domain, n.op_type) for n in m.graph.node}))
