#!/usr/bin/env bash
# Times `ampc MODEL --summary` (read + import + fold + verify) on resnet18, best of N runs.
#   tools/bench/import_time.sh [MODEL.onnx] [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/lib.sh
model=${1:-build/models/resnet18.onnx}
[ "$model" != build/models/resnet18.onnx ] || ensure_resnet18
n=${2:-5}
printf 'import %s: best of %d = %.3f s\n' "$model" "$n" "$(best_of "$n" build/tools/ampc "$model" --summary)"
