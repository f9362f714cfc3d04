#!/usr/bin/env bash
# Installs ampc from BUILD into BUILD/install, builds tests/consumer against the installed
# package, and runs it on the MLP.   run.sh BUILD SOURCE
set -euo pipefail
build=$(realpath "$1") src=$(realpath "$2")
cmake --install "$build" --prefix "$build/install" >/dev/null
cmake -S "$src/tests/consumer" -B "$build/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$build/install" >/dev/null
cmake --build "$build/consumer"
"$build/consumer/consumer" "$src/models/mlp.onnx"
