#!/usr/bin/env bash
# Issue 22's reach over models no list tuned for: every hf:/hfimg: model of library_models.txt (the
# sweep's small configurations, or $MODELS) exported with $EXPORTER (dynamo unless given; the helper
# falls back to TorchScript where dynamo fails) on the machine's CPUs in $SHARDS parallel exports,
# then planned by ampc for the cuda target at bf16. One line per model in $OUT/census.txt: the fused
# attentions (cuda::Attention / ampc.Attention), the Softmax nodes left in the training graph, and
# ampc's error where it refused. A model with Softmax left has attention the matcher did not take
# (or a softmax that is no attention: read its graph). The ONNX files and inputs of those models
# come back in $OUT/census_unfused.tar.gz (smallest first, up to $PACK_MB MB).
#   OUT=/tmp/o SHARDS=12 bash tools/sweep/attention_census.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ -f "$root/.gpu/env.sh" ] && source "$root/.gpu/env.sh"
out=${OUT:-/tmp/ampc-census}
e=${EXPORTER:-dynamo}
work=/tmp/census_$e
mkdir -p "$out" "$work"
models=${MODELS:-$(grep -v '^#' "$root/tools/sweep/library_models.txt" | grep -E '^(hf|hfimg):')}
n=${SHARDS:-12}
for ((i = 0; i < n; i++)); do
  CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 timeout "${LIMIT:-400}" python3 "$root/tools/sweep/torchvision_sweep.py" \
    --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" --out "$work" --exporter "$e" --model-limit "${MODEL_LIMIT:-150}" \
    --shard "$i/$n" --export-only $models > "$work/shard$i.txt" 2>&1 &
done
wait
: > "$out/census.txt"
for m in $models; do
  f="$work/$m/$m.onnx"
  if [ ! -f "$f" ]; then
    echo "$m NOT-EXPORTED $(grep -h "^$m " "$work"/shard*.txt | cut -c1-300)" >> "$out/census.txt"
    continue
  fi
  t=$(timeout 120 ampc "$f" --precision bf16 --train --emit text 2> "$work/$m/census_err.txt")
  if [ $? -ne 0 ]; then
    echo "$m AMPC-ERROR $(tail -c 300 "$work/$m/census_err.txt" | tr '\n' ' ')" >> "$out/census.txt"
    continue
  fi
  fused=$(grep -cE '= ([a-z]+::)?Attention\(' <<< "$t")
  soft=$(grep -cE '= Softmax\(|= LogSoftmax\(' <<< "$t")
  fb=$(grep -qa "ampc.export_fallback" "$f" && echo " (TorchScript fallback)")
  echo "$m fused=$fused softmax=$soft$fb" >> "$out/census.txt"
done
cat "$out/census.txt"
budget=$((${PACK_MB:-12} * 1024 * 1024)); list=()
for m in $(awk '$3 != "softmax=0" && $2 ~ /^fused=/ {print $1}' "$out/census.txt"); do
  s=$(du -sb --exclude='*.ampplan*' --exclude='grads*' --exclude='ref*' "$work/$m" | cut -f1); echo "$s $m"
done | sort -n > "$work/sizes.txt"
while read -r s m; do
  [ $((budget - s)) -lt 0 ] && continue
  budget=$((budget - s)); list+=("$m")
done < "$work/sizes.txt"
[ ${#list[@]} -gt 0 ] && tar -czf "$out/census_unfused.tar.gz" -C "$work" --exclude='*.ampplan*' --exclude='grads*' --exclude='ref*' "${list[@]}"
exit 0
