#!/usr/bin/env bash
# Stop 63's second GPU call (pack gpuC): GPT-2 124M bf16 through the harness beside torch.compile
# (amprun's default now measures the GEMMs' cuBLASLt candidates at load), then the same plan with
# --algos heuristics (as before this stop) and --tune + the stored choices; ViT-B/16 through zoo_full
# beside torch.compile and its plan with --algos heuristics, if time is left.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
W=/tmp/ampc-full
vit=${VIT:-timm:vit_base_patch16_224@64}
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$vit" --export-only --work $W > $R/export_vit.txt 2>&1) &
timeout 240 python3 "$bench/harness.py" --models gpt2 --torch-modes compile_bf16 --ampc-precisions bf16 --out $R/harness > $R/harness.txt 2>&1
echo "harness rc=$?" >> $R/harness.txt
tail -8 $R/harness.txt
plan=/tmp/ampc-bench/gpt2.bf16.ampplan
data="--int-range input_ids=0:50256 --int-range labels=0:50256"
bench() {  # NAME [amprun flags...]
  local name=$1; shift
  local t0=$SECONDS
  timeout 100 amprun $plan --device cuda --synthetic $data --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|peak device|algorithms|stored" $R/run_$name.txt
}
if [ -f $plan ]; then
  bench gpt2_heuristics --algos heuristics
  bench gpt2_measured
  bench gpt2_tune --tune
  bench gpt2_stored
  amprun $plan --dump | sed -n '/^tuning/,/^steps:/p' | head -40 > $R/gpt2_tuning.txt
fi
wait
if [ $SECONDS -lt ${VIT_BY:-380} ]; then
  timeout $((560 - SECONDS)) python3 "$bench/zoo_full.py" --out $R/zoo --models "$vit" --work $W --torch-compile --no-eager --steps 20 > $R/zoo_vit.txt 2>&1
  grep -h '^{"model"' $R/zoo_vit.txt | cut -c1-400
  p=$W/m.ampplan
  [ -f $p ] && timeout 60 amprun $p --device cuda --synthetic --steps 20 --bench --algos heuristics > $R/run_vit_heuristics.txt 2>&1
  grep -E "step time" $R/run_vit_heuristics.txt
fi
tar -cJf "$OUT/call2.tar.xz" -C $R .
