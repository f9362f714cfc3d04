#!/usr/bin/env bash
# The sweep's models on CUDA against the CPU backend: for each DIR/NAME/NAME.onnx with its
# DIR/NAME/inputs (torchvision_sweep.py writes both), an fp32 SGD plan trains 3 steps on each backend
# from the same weights and batch; the losses must agree within 1e-4 relative. Also a bf16 plan
# trains 3 steps on CUDA (it must run and stay finite). One line per model.
#   bash tools/sweep/cuda_vs_cpu.sh DIR [NAME...]     (ampc and amprun on PATH; FLAGS_NAME=... more ampc flags)
set -uo pipefail
dir=$1
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(ls "$dir"))
work=$(mktemp -d)
for m in "${names[@]}"; do
  onnx=$dir/$m/$m.onnx
  [ -f "$onnx" ] || { echo "$m: no $onnx"; continue; }
  flagsVar=FLAGS_$m
  flags=${!flagsVar:-}
  line="$m:"
  ok=1
  for p in fp32 bf16; do
    if ! ampc "$onnx" --precision $p --optimizer sgd --lr 0.005 $flags -o "$work/$m.$p.ampplan" > "$work/$m.$p.log" 2>&1; then
      line="$line ampc $p failed: $(grep -m1 -i error "$work/$m.$p.log")"
      ok=0
      continue
    fi
    for d in cpu cuda; do
      [ $p = bf16 ] && [ $d = cpu ] && continue
      if ! amprun "$work/$m.$p.ampplan" --device $d --data "$dir/$m/inputs" --steps 3 --log-every 1 --metrics "$work/$m.$p.$d.jsonl" \
          > "$work/$m.$p.$d.log" 2>&1; then
        line="$line amprun $p $d failed: $(grep -m1 -i error "$work/$m.$p.$d.log")"
        ok=0
      fi
    done
  done
  if [ $ok = 1 ]; then
    line="$line $(python3 - "$work/$m.fp32.cpu.jsonl" "$work/$m.fp32.cuda.jsonl" "$work/$m.bf16.cuda.jsonl" <<'PY'
import json, math, sys
cpu, cuda, bf = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:4])
rel = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(cpu, cuda))
finite = all(math.isfinite(v) for v in bf)
verdict = "PASS" if len(cpu) == len(cuda) == 3 and rel <= 1e-4 and finite else "MISMATCH"
print(f"{verdict} fp32 losses cpu {cpu} cuda {cuda} (within {rel:.1e}); bf16 cuda {bf}")
PY
)"
  fi
  echo "$line"
done
rm -rf "$work"
