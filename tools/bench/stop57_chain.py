"""Stop 57: the producers of a node's inputs in an ONNX file, a few levels up (why ampc found a
shape it could not read). Usage: stop57_chain.py FILE NODE [DEPTH]"""
import sys

import onnx

m = onnx.load(sys.argv[1], load_external_data=False)
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 6
prod = {o: n for n in m.graph.node for o in n.output}
inits = {t.name for t in m.graph.initializer}


def show(v, d):
    p = prod.get(v)
    if p is None:
        print("  " * d + f"{v} ({'initializer' if v in inits else 'input'})")
        return
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in p.attribute if a.name != "value"}
    print("  " * d + f"{v} <- {p.op_type} {p.name} {attrs}")
    if d < depth:
        for i in p.input:
            if i:
                show(i, d + 1)


node = next(n for n in m.graph.node if n.name == sys.argv[2])
print(f"{node.op_type} {node.name} {list(node.input)}")
for i in node.input:
    show(i, 1)
