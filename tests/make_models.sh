#!/usr/bin/env bash
# Makes the generated test models (resnet18) and PyTorch's reference outputs for the committed
# models into DIR with Debian's python3-torch; if torch is missing it writes nothing: the tests
# that need resnet18 skip themselves and the reference checks read the committed models/ref.
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
if ! /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
  echo "make_models: python3-torch/python3-torchvision missing; skipping generated models"
  exit 0
fi
[ -f "$dir/resnet18.onnx" ] || /usr/bin/python3 "$here/models/make_models.py" "$dir" resnet18 2>&1 | grep -v -i warn || true
[ -f "$dir/rnn.onnx" ] || /usr/bin/python3 "$here/models/make_models.py" "$dir" rnn 2>&1 | grep -v -i warn || true
test -f "$dir/resnet18.onnx" && test -f "$dir/rnn.onnx"
# PyTorch's reference outputs for the committed models, made fresh with the torch installed here.
/usr/bin/python3 "$here/models/make_models.py" --refs "$dir/refs" mlp cnn transformer resnet18 rnn 2>&1 | grep -v -i warn || true
test -f "$dir/refs/transformer/loss.npy" && test -f "$dir/refs/resnet18/grads/model.fc.weight.npy"
