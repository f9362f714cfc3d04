"""Counts of the ops in each exported model under DIR (DIR/NAME/NAME.onnx, as torchvision_sweep.py
writes them), local functions' bodies included: what an exporter wrote.
    python3 tools/sweep/onnx_ops.py DIR"""
import collections
import glob
import sys

import onnx

for f in sorted(glob.glob(sys.argv[1] + "/*/*.onnx")):
    m = onnx.load(f, load_external_data=False)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    for fn in m.functions:
        ops.update(n.op_type for n in fn.node)
    print(f.split("/")[-1], m.opset_import[0].version, dict(ops))
