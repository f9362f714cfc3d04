#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh): amprun --deterministic on GPT-2 124M
# (batch 8 x 1024, AdamW, dropout 0.1) and ResNet-50 (batch 256, SGD momentum) at bf16. Each runs
# twice with and twice without the flag (20 steps, --synthetic, the same seed); the metrics files
# and the saved weights are compared byte for byte, and --bench gives the step time of each mode.
# Output under $OUT/det (or /tmp/ampc-det): summary.txt and the logs.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$bench/../env.sh"
out=${OUT:-/tmp/ampc-det}/det
work=/tmp/ampc-det-work
mkdir -p "$out" "$work"
steps=${STEPS:-20}
python3 "$bench/export_models.py" "$work" gpt2 resnet50 >"$out/export.log" 2>&1 || { echo "export failed"; tail -20 "$out/export.log"; exit 1; }
declare -A opt data
opt[gpt2]="--optimizer adamw --lr 3e-4 --weight-decay 0.01 --clip-norm 1.0 --freeze causal_mask"
data[gpt2]="--int-range input_ids=0:50256 --int-range labels=0:50256"
opt[resnet50]="--optimizer sgd --lr 0.05 --momentum 0.9 --clip-norm 5.0"
data[resnet50]="--int-range target=0:999"
summary="$out/summary.txt"
: >"$summary"
for m in gpt2 resnet50; do
  plan="$work/$m.bf16.ampplan"
  ampc "$work/$m.onnx" --precision bf16 ${opt[$m]} -o "$plan" >"$out/$m.compile.log" 2>&1 || { echo "$m: compile failed" | tee -a "$summary"; tail -5 "$out/$m.compile.log"; continue; }
  for mode in default deterministic; do
    flag=""; [ $mode = deterministic ] && flag="--deterministic"
    for r in 1 2; do
      amprun "$plan" --synthetic ${data[$m]} --steps "$steps" $flag --metrics "$work/$m.$mode.$r.jsonl" --save "$work/$m.$mode.$r.safetensors" \
        >"$out/$m.$mode.$r.log" 2>&1 || echo "$m $mode run $r failed: $(tail -2 "$out/$m.$mode.$r.log")" | tee -a "$summary"
    done
    # The metrics without step_ms (timing differs run to run), then the weights.
    strip_ms() { sed -E 's/, "step_ms": [0-9.]+//' "$1"; }
    if cmp -s <(strip_ms "$work/$m.$mode.1.jsonl") <(strip_ms "$work/$m.$mode.2.jsonl"); then mres="metrics identical"; else mres="metrics DIFFER"; fi
    if cmp -s "$work/$m.$mode.1.safetensors" "$work/$m.$mode.2.safetensors"; then wres="weights identical"; else wres="weights DIFFER"; fi
    amprun "$plan" --synthetic ${data[$m]} --steps "$steps" $flag --bench >"$out/$m.$mode.bench.log" 2>&1
    ms=$(grep -oE "median [0-9.]+ ms" "$out/$m.$mode.bench.log" | head -1)
    last=$(tail -1 "$work/$m.$mode.1.jsonl" 2>/dev/null)
    echo "$m $mode: $mres, $wres ($steps steps; bench $ms); last: $last" | tee -a "$summary"
  done
  cp "$work/$m".*.jsonl "$out/" 2>/dev/null
done
