#!/usr/bin/env bash
# Times a forward evaluation of resnet18 (32x32, batch 2) on the CPU backend: `ampc --eval`,
# including import, best of N runs.   tools/bench/eval_time.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/lib.sh
ensure_resnet18
n=${1:-5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 -c "
import numpy as np
np.save('$dir/x.npy', np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32))
np.save('$dir/target.npy', np.array([3, 7], dtype=np.int64))"
best=$(best_of "$n" build/tools/ampc build/models/resnet18.onnx --eval --inputs "$dir" --outputs "$dir/out")
printf 'resnet18 32x32 batch 2 forward (ampc --eval, import included), %d threads: best of %d = %.3f s\n' "$(nproc)" "$n" "$best"
