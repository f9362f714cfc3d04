#!/usr/bin/env bash
# Issue 21's kill -9 acceptance: an uninterrupted run against TRIALS runs that are each killed
# (SIGKILL) at a random moment, before the first checkpoint, during a checkpoint's write or between
# checkpoints, and then resumed with --resume until they finish. Each must end with byte-identical
# final weights (--save) and a metrics file equal to the uninterrupted run's except step_ms.
#   tools/killtest.sh [TRIALS (50)] [BUILD (build)]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-50}
build=${2:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/tools/ampc" models/digits.onnx --precision fp16 --optimizer adamw --lr 0.003 --clip-norm 1.0 -o "$work/p.ampplan" >/dev/null
common=(--device cpu --data models/digits/train --shuffle --seed 3 --steps 60 --checkpoint-every 7)
strip() { sed -E 's/, "step_ms": [0-9.]+//' "$1"; }
"$build/tools/amprun" "$work/p.ampplan" "${common[@]}" --checkpoint "$work/ref_ck" --metrics "$work/ref.jsonl" --save "$work/ref.safetensors" >/dev/null 2>&1
t0=$(date +%s%N)
"$build/tools/amprun" "$work/p.ampplan" "${common[@]}" --checkpoint "$work/t_ck" --metrics "$work/t.jsonl" >/dev/null 2>&1
full_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
rm -rf "$work/t_ck" "$work/t.jsonl"
ok=0 kills=0
for i in $(seq 1 "$trials"); do
  ck="$work/ck$i" m="$work/m$i.jsonl" s="$work/s$i.safetensors"
  rm -rf "$ck" "$m" "$s"
  # One kill at a random moment of the first run, then resumes (killed again, at random, half the
  # time) until a run finishes.
  killed_once=0
  while :; do
    args=("${common[@]}" --checkpoint "$ck" --metrics "$m" --save "$s")
    [ -e "$ck/latest" ] && args+=(--resume "$ck")
    "$build/tools/amprun" "$work/p.ampplan" "${args[@]}" >"$work/out$i" 2>&1 &
    pid=$!
    hit=0
    if [ $killed_once -eq 0 ] || [ $((RANDOM % 2)) -eq 0 ]; then
      sleep "$(awk -v r=$RANDOM -v t="$full_ms" 'BEGIN { printf "%.3f", r / 32768 * 0.9 * t / 1000 }')"
      if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); killed_once=1; hit=1; fi
    fi
    if wait $pid 2>/dev/null; then break; fi
    if [ $hit -eq 0 ]; then echo "killtest: trial $i: amprun failed on its own:"; tail -3 "$work/out$i"; break; fi
  done
  if cmp -s "$s" "$work/ref.safetensors" && [ "$(strip "$m")" = "$(strip "$work/ref.jsonl")" ]; then
    ok=$((ok + 1))
  else
    echo "killtest: trial $i differs from the uninterrupted run:"
    cmp "$s" "$work/ref.safetensors" || true
    diff <(strip "$m") <(strip "$work/ref.jsonl") | head -6 || true
    tail -3 "$work/out$i"
  fi
done
echo "killtest: $ok of $trials trials equal the uninterrupted run (weights byte-identical, metrics equal), after $kills kills; a full run takes ${full_ms} ms"
[ "$ok" -eq "$trials" ]
