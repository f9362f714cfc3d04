#!/usr/bin/env bash
# The README's first command: install the dependencies, build in Release, run a real example.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
echo "== example: ampc on the committed MLP (the seeds' 10-100-10 model)"
build/tools/ampc models/mlp.onnx --summary
build/tools/ampc models/mlp.onnx --emit text
build/tools/ampc models/transformer.onnx --emit onnx -o build/transformer.roundtrip.onnx
build/tools/ampc build/transformer.roundtrip.onnx
echo "== example: evaluate the MLP on the CPU backend (inputs from models/ref/mlp)"
build/tools/ampc models/mlp.onnx --eval --no-dropout --inputs models/ref/mlp/inputs --outputs build/example
