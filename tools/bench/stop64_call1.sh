#!/usr/bin/env bash
# Stop 64, call 1 (pack gpuD): convolution algorithms timed through the step's own cuDNN call
# instead of cudnnFind*AlgorithmEx (which ran RegNetY-016 at 65.7 ms against the heuristics' 34.5 in
# stop 63's call), with where the load's time goes (amprun --bench's new load line).
# 1. gpu_tests: the algorithms' test (measures every key of a small net, stores, follows).
# 2. RegNetY-016 @64, ConvNeXt-T @64, GPT-2 124M: --algos heuristics against --algos auto.
# 3. torch.compile (AMP bf16) on RegNetY in the same call, while time is left.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
(while sleep 40; do tar -cJf "$OUT/partial.tar.xz.tmp" -C $R . 2>/dev/null && mv "$OUT/partial.tar.xz.tmp" "$OUT/partial.tar.xz"; done) &
saver=$!
W=/tmp/ampc-full
convs=${CONVS:-timm:regnety_016@64,timm:convnext_tiny@64}
IFS=, read -ra list <<< "$convs"
exports=()
for m in "${list[@]}"; do
  (CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export_${m//[:@]/_}.txt" 2>&1) &
  exports+=($!)
done
mkdir -p /tmp/ampc-bench
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/export_models.py" /tmp/ampc-bench gpt2 > $R/export_gpt2.txt 2>&1) &
exports+=($!)
timeout 120 gpu_tests --gtest_filter='*AlgorithmsMeasured*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" $R/gpu_tests.txt
wait "${exports[@]}"
bench() {  # PLAN NAME [amprun flags...]
  local plan=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout 200 amprun "$plan" --device cuda --synthetic --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|peak device|algorithms|load:" $R/run_$name.txt
}
onnxOf() { find $W -name '*.onnx' | grep -i "$1" | head -1; }
for m in "${list[@]}"; do
  n=${m#timm:}; n=${n%@*}
  onnx=$(onnxOf "$n"); echo "onnx $n: $onnx" >> $R/export.txt
  [ -n "$onnx" ] || { echo "$n: no export"; continue; }
  ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$n.ampplan > $R/compile_$n.txt 2>&1 || { echo "$n: compile failed"; tail -3 $R/compile_$n.txt; continue; }
  bench $R/$n.ampplan ${n}_heuristics --algos heuristics
  bench $R/$n.ampplan ${n}_measured --algos auto --profile 12
  rm -f $R/$n.ampplan*
done
g=/tmp/ampc-bench/gpt2.onnx
if [ -f $g ]; then
  ampc $g --precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask -o $R/gpt2.ampplan > $R/compile_gpt2.txt 2>&1
  d="--int-range input_ids=0:50256 --int-range labels=0:50256"
  bench $R/gpt2.ampplan gpt2_heuristics $d --algos heuristics
  bench $R/gpt2.ampplan gpt2_measured $d --algos auto
  rm -f $R/gpt2.ampplan*
else
  echo "gpt2: no export"; tail -3 $R/export_gpt2.txt
fi
deadline=${DEADLINE:-540}
for m in "${list[@]}"; do
  left=$((deadline - SECONDS)); [ $left -lt 70 ] && { echo "$m: no time left for torch.compile" | tee -a $R/skipped.txt; continue; }
  timeout $((left < 150 ? left : 150)) python3 "$bench/zoo_full.py" --out $R/zoo --models "$m" --work $W --torch-compile --no-eager --steps 20 > "$R/zoo_${m//[:@]/_}.txt" 2>&1
  grep -h '^{"model"' "$R/zoo_${m//[:@]/_}.txt" | cut -c1-400
done
pkill -P $saver 2>/dev/null; kill $saver 2>/dev/null
tar -cJf "$OUT/call1.tar.xz" -C $R . && rm -f "$OUT"/partial.tar.xz*
