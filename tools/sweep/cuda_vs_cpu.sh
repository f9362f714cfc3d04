#!/usr/bin/env bash
# The sweep's models on CUDA against the CPU backend: for each DIR/NAME/NAME.onnx with its
# DIR/NAME/inputs (torchvision_sweep.py writes both), an fp32 SGD plan trains 3 steps on each backend
# from the same weights and batch: the first step's loss within 1e-5 and its gradient norm within 1e-4
# (relative; absolute below 1), and the three losses within 1e-4 (else DRIFT: the first step agreed,
# the trajectory did not, as batch-2 BatchNorm nets amplify last-bit differences). Also a bf16 plan
# trains 3 steps on CUDA (it must run and stay finite; a first loss 5% or more from fp32's is flagged
# BF16-FAR). One line per model.
#   [JOBS=4] bash tools/sweep/cuda_vs_cpu.sh DIR [NAME...]     (ampc and amprun on PATH; FLAGS_NAME=... more ampc flags)
set -uo pipefail
dir=$1
shift
names=("$@")
[ ${#names[@]} -gt 0 ] || names=($(ls "$dir"))
jobs=${JOBS:-1}  # JOBS=N: N processes, each with every Nth model (the GPU is shared; the CPU runs are the long part)
if [ "$jobs" -gt 1 ] && [ ${#names[@]} -gt 1 ]; then
  for ((j = 0; j < jobs; j++)); do  # each writes its lines as it goes (a timeout keeps what ran)
    mine=()
    for ((i = j; i < ${#names[@]}; i += jobs)); do mine+=("${names[$i]}"); done
    [ ${#mine[@]} -gt 0 ] && JOBS=1 bash "$0" "$dir" "${mine[@]}" &
  done
  wait
  exit 0
fi
work=$(mktemp -d)
for m in "${names[@]}"; do
  onnx=$dir/$m/$m.onnx
  [ -f "$onnx" ] || { echo "$m: no $onnx"; continue; }
  flagsVar=FLAGS_$(echo "$m" | tr -c "A-Za-z0-9_\n" _)  # timm:NAME@RES: FLAGS_timm_NAME_RES
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
rows = [[json.loads(l) for l in open(f)] for f in sys.argv[1:4]]
cpu, cuda, bf = ([r["loss"] for r in rs] for rs in rows)
norms = [rs[0].get("grad_norm") if rs else None for rs in rows[:2]]
close = lambda a, b, tol: abs(a - b) <= tol * max(abs(a), abs(b), 1.0)  # relative, absolute below 1
rel = max(abs(a - b) / max(abs(a), abs(b), 1.0) for a, b in zip(cpu, cuda)) if cpu and cuda else float("inf")
finite = all(math.isfinite(v) for v in bf)
first = abs(bf[0] - cpu[0]) / max(abs(cpu[0]), 1e-12) if bf and cpu else float("inf")
# The first step decides: its loss (the forward) and its gradient norm (the backward) on CUDA as on
# the CPU. Steps 2 and 3 start from weights that already differ in their last bits, which batch-2
# BatchNorm nets amplify by orders of magnitude: past 1e-4 they are DRIFT, shown, not failed.
same = len(cpu) == len(cuda) == 3 and close(cpu[0], cuda[0], 1e-5) and None not in norms and close(norms[0], norms[1], 1e-4)
verdict = ("PASS" if rel <= 1e-4 else "DRIFT") if same and finite else "MISMATCH"
# bf16's first loss (before any step) within 5% of fp32's: past that it is flagged, not failed
# (a batch-2 BatchNorm net can be that sensitive).
flag = "" if first <= 5e-2 else " BF16-FAR"
print(f"{verdict}{flag} fp32 losses cpu {cpu} cuda {cuda} (within {rel:.1e}; first grad norm cpu {norms[0]} cuda {norms[1]}); "
      f"bf16 cuda {bf} (first {first:.1e} from fp32)")
PY
)"
  fi
  echo "$line"
done
rm -rf "$work"
