#!/usr/bin/env bash
# On the GPU machine: exports GPT-2 124M (batch 8 x 1024) and ResNet-50 (batch 256) with the
# PyTorch there, compiles each at fp16 and bf16 with ampc, and trains 200 steps on one fixed batch
# with `amprun --bench` (metrics files under $OUT). GPT-2: AdamW; ResNet-50: SGD with momentum.
#   STEPS=200 MODELS="gpt2 resnet50" PRECISIONS="fp16 bf16" big_models.sh
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-/tmp/ampc-gpu}
work=${WORK:-/tmp/ampc-big}
steps=${STEPS:-200}
mkdir -p "$out" "$work"
for m in ${MODELS:-gpt2 resnet50}; do
  if [ ! -f "$work/$m.onnx" ]; then
    start=$(date +%s)
    python3 "$here/export_models.py" "$work" "$m" 2>&1 | grep -v -i warn | tail -3
    echo "export $m: $(( $(date +%s) - start )) s"
  fi
  for p in ${PRECISIONS:-fp16 bf16}; do
    if [ "$m" = gpt2 ]; then
      flags="--optimizer adamw --lr 3e-4 --weight-decay 0.01 --clip-norm 1.0 --growth-interval 50 --freeze causal_mask"
      data="--int-range input_ids=0:50256 --int-range labels=0:50256"
    else
      flags="--optimizer sgd --lr 0.05 --momentum 0.9 --growth-interval 50"
      data="--int-range target=0:999"
    fi
    plan="$work/$m.$p.ampplan"
    start=$(date +%s)
    if ! ampc "$work/$m.onnx" --precision "$p" $flags -o "$plan" > "$out/$m.$p.compile.log" 2>&1; then
      echo "== $m $p: ampc failed:"; tail -5 "$out/$m.$p.compile.log"; continue
    fi
    echo "== $m $p: compiled in $(( $(date +%s) - start )) s"
    timeout "${RUN_LIMIT:-300}" amprun "$plan" --synthetic $data --steps "$steps" --bench --metrics "$out/$m.$p.jsonl" \
      > "$out/$m.$p.run.log" 2>&1
    echo "rc $?"; grep -E '^step (1|10|50|100|150|200)/|bench|step time|memory|host sync|error' "$out/$m.$p.run.log" | tail -12
  done
done
