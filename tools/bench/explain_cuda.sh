#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh, with models/digits copied to .gpu/models):
# amprun --explain-overflow on CUDA against the CPU reference, for overflows injected into the
# committed digits model at fp16: inputs 1e5 times too large (the forward) and a loss scale of 1e30
# (the backward). Output: $OUT/explain/*.txt.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/../env.sh"
out=${OUT:-/tmp/ampc-explain}/explain
work=/tmp/ampc-explain-work
mkdir -p "$out" "$work/big"
models=$bench/../models
cp "$models"/digits/train/*.npy "$work/big/"
python3 -c "import numpy as np, sys; x = np.load(sys.argv[1]); np.save(sys.argv[1], (x * 1e5).astype(x.dtype))" "$work/big/x.npy"
ampc "$models/digits.onnx" --precision fp16 -o "$work/p.ampplan" >/dev/null
ampc "$models/digits.onnx" --precision fp16 --init-scale 1e30 --max-scale 1e38 -o "$work/huge.ampplan" >/dev/null
for dev in cpu cuda; do
  amprun "$work/p.ampplan" --device $dev --data "$work/big" --steps 2 --explain-overflow >"$out/forward.$dev.txt" 2>&1
  echo "exit $?" >>"$out/forward.$dev.txt"
  amprun "$work/huge.ampplan" --device $dev --data "$models/digits/train" --steps 2 --explain-overflow >"$out/backward.$dev.txt" 2>&1
  echo "exit $?" >>"$out/backward.$dev.txt"
  amprun "$work/p.ampplan" --device $dev --data "$models/digits/train" --steps 3 --explain-overflow >"$out/clean.$dev.txt" 2>&1
  echo "exit $?" >>"$out/clean.$dev.txt"
done
grep -H "overflow: node\|exit" "$out"/*.txt
