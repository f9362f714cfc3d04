#!/usr/bin/env bash
# The failing models a library sweep brought back (library_failing.tar.gz.NN in DIR), unpacked into
# OUT and each run here: ampc --grad on the CPU, fused and unfused, against the f64 gradients the
# sweep saved (ref/), the worst parameters first, and the ReLU inputs whose sign differs between
# ampc's f32 and f64 runs (tools/sweep/kinks.py). No PyTorch or numpy needed.
#   bash tools/sweep/repro_failing.sh DIR [OUT]
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$1
out=${2:-/tmp/ampc-failing}
ampc=${AMPC:-$root/build/tools/ampc}
mkdir -p "$out"
if ls "$dir"/library_failing.tar.gz.* > /dev/null 2>&1; then
  cat "$dir"/library_failing.tar.gz.* | tar -xzf - -C "$out"
elif [ -f "$dir/library_failing.tar.gz" ]; then
  tar -xzf "$dir/library_failing.tar.gz" -C "$out"
fi
for m in "$out"/*/; do
  m=${m%/}
  name=$(basename "$m")
  onnx="$m/$name.onnx"
  [ -f "$onnx" ] || continue
  echo "== $name"
  for flags in "" "--no-fuse --no-fuse-rms-norm" "--precision-run f64"; do
    g="$m/g$(echo "$flags" | tr -d ' -')"
    if "$ampc" "$onnx" --grad --eval --inputs "$m/inputs" --outputs "$g" $flags > "$m/ampc.log" 2>&1; then
      echo "-- ampc --grad $flags: loss $(python3 -c "import sys; sys.path.insert(0, '$root/tools/sweep'); from compare_grads import read_npy; print(read_npy('$g/loss.npy')[0])") (f64 $(python3 -c "import sys; sys.path.insert(0, '$root/tools/sweep'); from compare_grads import read_npy; print(read_npy('$m/ref/loss.npy')[0])"))"
      python3 "$root/tools/sweep/compare_grads.py" "$m/ref" "$g" --top 6
    else
      echo "-- ampc --grad $flags failed: $(tail -1 "$m/ampc.log")"
    fi
  done
  echo "-- kinks: $(python3 "$root/tools/sweep/kinks.py" "$onnx" "$m/inputs" --ampc "$ampc")"
done
