#!/usr/bin/env bash
# Times `ampc MODEL` (read + import + fold + verify) on resnet18, best of N runs.
#   tools/bench/import_time.sh [MODEL.onnx] [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-build/models/resnet18.onnx}
n=${2:-5}
[ -f "$model" ] || /usr/bin/python3 models/make_models.py "$(dirname "$model")" resnet18 >/dev/null 2>&1
best=""
for _ in $(seq "$n"); do
  s=$(date +%s.%N)
  build/tools/ampc "$model" >/dev/null
  e=$(date +%s.%N)
  t=$(awk "BEGIN {print $e - $s}")
  if [ -z "$best" ] || awk "BEGIN {exit !($t < $best)}"; then best=$t; fi
done
printf 'import %s: best of %d = %.3f s\n' "$model" "$n" "$best"
