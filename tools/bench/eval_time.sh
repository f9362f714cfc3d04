#!/usr/bin/env bash
# Times a forward evaluation of resnet18 (32x32, batch 2) on the CPU backend: `ampc --eval`,
# including import, best of N runs.   tools/bench/eval_time.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-5}
model=build/models/resnet18.onnx
[ -f "$model" ] || /usr/bin/python3 models/make_models.py build/models resnet18 >/dev/null 2>&1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 -c "
import numpy as np
np.save('$dir/x.npy', np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32))
np.save('$dir/target.npy', np.array([3, 7], dtype=np.int64))"
best=""
for _ in $(seq "$n"); do
  s=$(date +%s.%N)
  build/tools/ampc "$model" --eval --inputs "$dir" --outputs "$dir/out" >/dev/null
  e=$(date +%s.%N)
  t=$(awk "BEGIN {print $e - $s}")
  if [ -z "$best" ] || awk "BEGIN {exit !($t < $best)}"; then best=$t; fi
done
printf 'resnet18 32x32 batch 2 forward (ampc --eval, import included), %d threads: best of %d = %.3f s\n' \
  "$(nproc)" "$n" "$best"
