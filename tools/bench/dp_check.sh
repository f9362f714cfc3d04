#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): issue 20's one-GPU checks. The GPU tests of
# the data-parallel path and of the ops that last ran without a GPU, then GPT-2 124M bf16 trained
# plain, as a group of one through NCCL (WORLD_SIZE=1) in 25 MB buckets, and in one bucket per
# gradient (--bucket-mb 0), each through `amprun --bench`. Logs under $OUT (or /tmp/ampc-dp).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)  # env.sh sets its own "here"
source "$bench/../env.sh"
out=${OUT:-/tmp/ampc-dp}
work=${WORK:-/tmp/ampc-dp-work}
mkdir -p "$out" "$work"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
[ "${FILTER:-}" = none ] || AMPC_MODELS_DIR="$bench/../models" gpu_tests --gtest_filter="${FILTER:-GpuDataParallel.*:GpuOps.*TopK*:GpuOps.*Tile*:GpuOps.*ArgMax*}" \
  2>&1 | tee "$out/gpu_tests_dp.log" | grep -E '^\[  (FAILED|  PASSED|SKIPPED) |Failure|error' | head -40
python3 "$bench/export_models.py" "$work" gpt2 > "$out/export.log" 2>&1 || { echo "export failed"; tail -20 "$out/export.log"; exit 1; }
ampc "$work/gpt2.onnx" --precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask \
  -o "$work/gpt2.ampplan" > "$out/gpt2_compile.log" 2>&1 || { tail -5 "$out/gpt2_compile.log"; exit 1; }
data="--int-range input_ids=0:50256 --int-range labels=0:50256"
steps=${STEPS:-60}
run() {  # NAME ENV... -- AMPRUN-FLAGS...
  local name=$1; shift
  echo "== $name"
  env "$@" amprun "$work/gpt2.ampplan" --device cuda --synthetic $data --steps "$steps" --bench ${EXTRA:-} \
    > "$out/gpt2_$name.log" 2>&1
  echo "rc=$?"
  grep -E "amprun: a group|median|peak device memory|launches per step|error" "$out/gpt2_$name.log" | head -6
}
for rep in 1 2; do
  [ "${GROUP_ONLY:-0}" = 1 ] || run plain_$rep AMPC_NONE=1
  run group1_$rep WORLD_SIZE=1 RANK=0 LOCAL_RANK=0
  EXTRA="--bucket-mb 0" run group1_bucket0_$rep WORLD_SIZE=1 RANK=0 LOCAL_RANK=0
done
