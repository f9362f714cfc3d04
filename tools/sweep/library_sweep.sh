#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh; PyTorch, timm and transformers there): the
# models of tools/sweep/library_models.txt (or $MODELS), each checked by torchvision_sweep.py on the
# machine's CPUs against PyTorch, in $SHARDS parallel sweeps of one thread each, with $EXPORTER
# (dynamo, PyTorch's default, unless given). Every model has $MODEL_LIMIT seconds, each sweep $LIMIT. One line per model
# in $OUT/library_$EXPORTER.txt (with AMP=bf16 or fp16: mixed precision against PyTorch's autocast,
# torchvision_sweep.py --amp, in $OUT/library_${EXPORTER}_amp.txt); the ONNX files and inputs of the models ampc refused, failed or got
# wrong come back in $OUT/library_failing.tar.gz.NN (the smallest first, up to $PACK_MB MB), to reproduce here.
#   SHARDS=14 MODEL_LIMIT=240 OUT=/tmp/o bash tools/sweep/library_sweep.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -f "$root/.gpu/env.sh" ] && source "$root/.gpu/env.sh"
out=${OUT:-/tmp/ampc-library}
e=${EXPORTER:-dynamo}
work=/tmp/library_$e
mkdir -p "$out" "$work"
python3 -c "import torch, timm, transformers; print('torch', torch.__version__, 'timm', timm.__version__, 'transformers', transformers.__version__)" \
  | tee "$out/library_versions.txt"
models=${MODELS:-$(grep -v '^#' "$root/tools/sweep/library_models.txt" | grep -v '^ *$')}
n=${SHARDS:-14}
for ((i = 0; i < n; i++)); do
  OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 timeout "${LIMIT:-3600}" python3 "$root/tools/sweep/torchvision_sweep.py" --ampc "$(command -v ampc)" \
    --amprun "$(command -v amprun)" --out "$work" --exporter "$e" --model-limit "${MODEL_LIMIT:-240}" --shard "$i/$n" \
    ${AMP:+--amp "$AMP"} $models > "$work/shard$i.txt" 2>&1 &
done
wait
cat "$work"/shard*.txt | grep -E "^[a-zA-Z_0-9:@.-]+ +(PASS|KINK|CUSTOM-BACKWARD|MISMATCH|EXPORT-WRONG|EXPORT-FAILS|AMPC-REFUSES|AMPRUN-FAILS|SWEEP-ERROR|TORCH-FAILS|TORCH-RANDOM|TIMEOUT|AMP-PASS|AMP-WORSE|AMP-CHAOTIC) " \
  | sort > "$out/library_$e${AMP:+_amp}.txt"
e=$e${AMP:+_amp}
awk '{print $2}' "$out/library_$e.txt" | sort | uniq -c
grep -vE " (PASS|AMP-PASS|TORCH-FAILS) " "$out/library_$e.txt" | cut -c1-400
# The failing models' files, smallest first, while they fit in $PACK_MB MB (15 unless given), in
# pieces of 15 MB (library_failing.tar.gz.00, .01, ...: cat them back together) where they pass one.
budget=$((${PACK_MB:-15} * 1024 * 1024)); list=()
for m in $(grep -E " (MISMATCH|EXPORT-WRONG|KINK|AMPC-REFUSES|AMPRUN-FAILS|AMP-WORSE) " "$out/library_$e.txt" | awk '{print $1}'); do
  s=$(du -sb --exclude='*.ampplan*' --exclude='grads*' "$work/$m" 2>/dev/null | cut -f1)
  [ -n "$s" ] && echo "$s $m"
done | sort -n > "$work/sizes.txt"
while read -r s m; do
  [ $((budget - s)) -lt 0 ] && continue
  budget=$((budget - s)); list+=("$m")
done < "$work/sizes.txt"
if [ ${#list[@]} -gt 0 ]; then
  tar -czf "$work/failing.tar.gz" -C "$work" --exclude='*.ampplan*' --exclude='grads*' --exclude=m.jsonl "${list[@]}"
  split -b 15M -d "$work/failing.tar.gz" "$out/library_failing.tar.gz."
fi
echo "packed ${#list[@]} failing models: ${list[*]}"
