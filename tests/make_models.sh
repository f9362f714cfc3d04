#!/usr/bin/env bash
# Makes the generated test models (resnet18) into DIR with Debian's python3-torch; if torch is
# missing it writes nothing and the model tests that need the file skip themselves.
set -euo pipefail
dir=$1
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
if ! /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
  echo "make_models: python3-torch/python3-torchvision missing; skipping generated models"
  exit 0
fi
[ -f "$dir/resnet18.onnx" ] || /usr/bin/python3 "$here/models/make_models.py" "$dir" resnet18 2>&1 | grep -v -i warn || true
test -f "$dir/resnet18.onnx"
