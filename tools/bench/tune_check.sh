#!/usr/bin/env bash
# amprun --tune on a plan, then the same plan again: the first run measures each fused attention
# shape's implementation and each GEMM's and convolution's algorithm and stores the choices in the
# plan; the second follows them ("stored in the plan" in --bench's lists) without timing. Integer inputs get 0:999 (token ids of any vocabulary
# past 1000).
#   tools/bench/tune_check.sh PLAN [STEPS]
set -euo pipefail
plan=$1
steps=${2:-20}
ranges=()
while read -r name; do
  hi=999
  [[ $name == *mask* ]] && hi=1
  ranges+=(--int-range "$name=0:$hi")
done < <(amprun "$plan" --dump | awk '$1 == "INPUT" && $4 ~ /^i(32|64)\[/ {print $2}')
echo "== amprun --tune --bench"
amprun "$plan" --device cuda --synthetic --steps "$steps" --bench --tune "${ranges[@]}"
echo "== amprun --dump (tuning)"
amprun "$plan" --dump | sed -n '/^tuning/,/^steps:/p' | grep -v '^steps:'
echo "== amprun --bench (the stored choices)"
amprun "$plan" --device cuda --synthetic --steps "$steps" --bench "${ranges[@]}"
