#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): the GPU tests, then the committed models
# and the exported GPT-2 / ResNet-50 compiled and trained with `amprun --bench`. Logs under $OUT.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # (not `here`: env.sh sets that to its own folder)
source "$bench/../env.sh"
out=${OUT:-/tmp/ampc-gpu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  AMPC_MODELS_DIR="$bench/../models" gpu_tests --gtest_brief=1 2>&1 | tee "$out/gpu_tests.log" | grep -v '^\[       OK' | tail -60
fi
models=$bench/../models
for m in mlp cnn transformer; do
  for p in fp32 fp16 bf16; do
    ampc "$models/$m.onnx" --precision "$p" -o "$out/$m.$p.ampplan" >/dev/null || continue
    r=""
    [ "$m" = transformer ] && r="--int-range idx=0:63 --int-range target=0:63" || r="--int-range target=0:9"
    echo "== $m $p"
    amprun "$out/$m.$p.ampplan" --synthetic $r --steps 200 --bench --metrics "$out/$m.$p.jsonl" 2>&1 | tail -4
  done
done
