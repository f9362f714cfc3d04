#!/usr/bin/env bash
# On the GPU machine: one step of GPT-2 and ResNet-50 timed node by node (`amprun --profile`).
#   MODELS="gpt2 resnet50" PRECISION=bf16 TOP=30 profile.sh
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=${WORK:-/tmp/ampc-big}
mkdir -p "$work"
for m in ${MODELS:-gpt2 resnet50}; do
  [ -f "$work/$m.onnx" ] || python3 "$here/export_models.py" "$work" "$m" 2>&1 | grep -v -i warn | tail -1
  p=${PRECISION:-bf16}
  if [ "$m" = gpt2 ]; then
    flags="--optimizer adamw --lr 3e-4 --clip-norm 1.0 --freeze causal_mask"; data="--int-range input_ids=0:50256 --int-range labels=0:50256"
  else
    flags="--optimizer sgd --lr 0.05 --momentum 0.9"; data="--int-range target=0:999"
  fi
  ampc "$work/$m.onnx" --precision "$p" $flags -o "$work/$m.$p.ampplan" >/dev/null || continue
  echo "== $m $p"
  amprun "$work/$m.$p.ampplan" --synthetic $data --steps 3 --bench --profile "${TOP:-30}" 2>&1 | grep -v '^step'
done
