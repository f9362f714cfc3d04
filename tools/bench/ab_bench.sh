#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): two builds of ampc/amprun, A and B, on the
# harness's ResNet-50 fp16 and GPT-2 124M bf16 plans, alternating (A B A B), each `amprun --bench`:
# the median step, the measured peak and the launches per step, for a before/after in one call.
#   tools/bench/ab_bench.sh BIN_A BIN_B        (folders holding ampc and amprun; logs under $OUT)
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/../env.sh"
a=$1 b=$2
out=${OUT:-/tmp/ampc-ab}
work=${WORK:-/tmp/ampc-ab-work}
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 "$bench/export_models.py" "$work" ${MODELS:-resnet50 gpt2} > "$out/export.log" 2>&1 || { echo "export failed"; tail -20 "$out/export.log"; exit 1; }
declare -A flags=([resnet50]="--precision fp16 --optimizer sgd --lr 0.05 --momentum 0.9"
                  [gpt2]="--precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask")
declare -A data=([resnet50]="--int-range target=0:999" [gpt2]="--int-range input_ids=0:50256 --int-range labels=0:50256")
for m in ${MODELS:-resnet50 gpt2}; do
  for side in A B; do
    bin=$a; [ "$side" = B ] && bin=$b
    "$bin/ampc" "$work/$m.onnx" ${flags[$m]} -o "$work/$m.$side.ampplan" > "$out/${m}_$side.compile.log" 2>&1 || { echo "$m $side: compile failed"; tail -3 "$out/${m}_$side.compile.log"; }
  done
  for rep in 1 2; do
    for side in A B; do
      bin=$a; [ "$side" = B ] && bin=$b
      "$bin/amprun" "$work/$m.$side.ampplan" --device cuda --synthetic ${data[$m]} --steps "${STEPS:-60}" --bench > "$out/${m}_${side}_$rep.log" 2>&1
      echo "$m $side rep $rep rc=$? $(grep -oE 'median [0-9.]+ ms|peak device memory \(measured\) [0-9.]+ MiB|launches per step: [0-9]+' "$out/${m}_${side}_$rep.log" | tr '\n' ' ')"
    done
  done
done
