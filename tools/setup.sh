#!/usr/bin/env bash
# The README's first command: install the dependencies, build in Release, and train the digits
# example end to end with fp16 AMP (plus a look at the compiler's other outputs).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
echo "== ampc: the seeds' MLP, its IR and its autocast report"
build/tools/ampc models/mlp.onnx --summary
build/tools/ampc models/mlp.onnx --precision fp16 --report
echo "== train: digits (sklearn's 8x8 images), fp16 AMP with dynamic loss scaling, SGD + momentum"
mkdir -p build/example
build/tools/ampc models/digits.onnx --precision fp16 --optimizer sgd --lr 0.1 --momentum 0.9 -o build/example/digits.ampplan
build/tools/amprun build/example/digits.ampplan --data models/digits/train --shuffle --seed 1 --steps 400 \
  --metrics build/example/digits.jsonl --save build/example/digits.safetensors --eval-data models/digits/test
