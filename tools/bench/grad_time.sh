#!/usr/bin/env bash
# Times `ampc resnet18.onnx --grad --emit onnx` (import, autodiff, export with the checker), best
# of N runs.   tools/bench/grad_time.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/lib.sh
ensure_resnet18
n=${1:-5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
best=$(best_of "$n" build/tools/ampc build/models/resnet18.onnx --grad --emit onnx -o "$out/g.onnx")
printf 'resnet18 --grad --emit onnx: best of %d = %.3f s\n' "$n" "$best"
