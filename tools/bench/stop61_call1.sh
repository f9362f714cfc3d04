#!/usr/bin/env bash
# Stop 61's first GPU call: GPT-2 124M bf16 through the harness beside torch.compile (issue 22's
# <= 22 ms step), then models no list tuned for, through zoo_full.py beside torch.compile (AMP bf16):
# a Mixtral-style MoE (dense-experts on CUDA, first run) and timm models of other classes, each with
# amprun's profile of its costliest ops. The exports run on the CPUs while the GPU times GPT-2.
# Usage (GPU machine): bash tools/bench/stop61_call1.sh "timm:a@64,timm:b@64,..."
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R/zoo
W=/tmp/ampc-full
models=${1:-mixtral_moe}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
if [ "${CENSUS:-0}" = 1 ]; then  # issue 22's reach over the library's transformers, on the CPUs at the lowest priority
  (OUT=$R/census MODELS="${CENSUS_MODELS:-}" SHARDS=${CENSUS_SHARDS:-6} LIMIT=${CENSUS_LIMIT:-420} nice -n 19 bash "$root/tools/sweep/attention_census.sh" > $R/census_log.txt 2>&1) &
  census=$!
fi
IFS=, read -ra list <<< "$models"
for m in "${list[@]}"; do   # exports in parallel on the CPUs (zoo_full skips a model already exported)
  (CUDA_VISIBLE_DEVICES= timeout 240 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export_${m//[:@]/_}.txt" 2>&1) &
done
if [ "${NO_GPT2:-0}" != 1 ]; then
  timeout 220 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out $R/harness > $R/harness.txt 2>&1
  echo "harness rc=$?" >> $R/harness.txt
  tail -8 $R/harness.txt
fi
for job in $(jobs -p); do [ "$job" = "${census:-}" ] || wait "$job"; done
deadline=${DEADLINE:-530}  # seconds into the call: what is still running then is cut, so that the pack comes back
for m in "${list[@]}"; do
  left=$((deadline - SECONDS)); [ $left -lt 60 ] && { echo "$m: no time left" >> $R/skipped.txt; continue; }
  timeout $((left < ${PER_MODEL:-170} ? left : ${PER_MODEL:-170})) python3 "$bench/zoo_full.py" --out $R/zoo --models "$m" --work $W --torch-compile --no-eager --profile 14 --steps 20 > "$R/zoo_${m//[:@]/_}.txt" 2>&1
  echo "rc=$?" >> "$R/zoo_${m//[:@]/_}.txt"
  grep -h '^{"model"' "$R/zoo_${m//[:@]/_}.txt" | cut -c1-600
done
if [ -n "${census:-}" ]; then
  while kill -0 "$census" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 5; done
  cat $R/census/census.txt 2>/dev/null
fi
tar -cJf "$OUT/call.tar.xz" -C $R .
