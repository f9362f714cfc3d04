#!/usr/bin/env bash
# Stop 64's last call, for the next session (pack gpuE): not run yet.
# 1. gpu_tests: the algorithms' test (each conv key's heuristics asked once, later nodes adopt; the
#    candidates timed with cold L2), the channels-last and GpuOps cases (convolutions throughout).
# 2. RegNetY-016 @64: the load (call 1: 86 s in cuDNN's heuristics) and the step with
#    --algos heuristics, --algos auto (cold L2), auto with AMPC_EXP_HOT_L2=1 (stop 64 call 2's
#    timing: 46.7 ms against the heuristics' 36.1 on an H100), and --deterministic.
# 3. ConvNeXt-T and GPT-2: heuristics against auto; then torch.compile on RegNetY while time is left.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
(while sleep 30; do tar -cJf "$OUT/partial.tar.xz.tmp" -C $R . 2>/dev/null && mv "$OUT/partial.tar.xz.tmp" "$OUT/partial.tar.xz"; done) &
saver=$!
W=/tmp/ampc-full
models=(timm:regnety_016@64 timm:convnext_tiny@64)
exports=()
for m in "${models[@]}"; do
  (CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export_${m//[:@]/_}.txt" 2>&1) &
  exports+=($!)
done
mkdir -p /tmp/ampc-bench
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/export_models.py" /tmp/ampc-bench gpt2 > $R/export_gpt2.txt 2>&1) &
exports+=($!)
timeout 150 gpu_tests --gtest_filter='*AlgorithmsMeasured*:*ChannelsLast*:Dtypes/GpuOps.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests.txt
wait "${exports[@]}"
bench() {  # PLAN NAME [amprun flags...]
  local plan=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout 150 amprun "$plan" --device cuda --synthetic --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|algorithms|load:" $R/run_$name.txt
}
onnxOf() { find $W -name '*.onnx' | grep -i "$1" | head -1; }
for n in regnety_016 convnext_tiny; do
  onnx=$(onnxOf $n)
  [ -n "$onnx" ] && ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$n.ampplan > $R/compile_$n.txt 2>&1 || { echo "$n: no export or compile failed"; continue; }
  # --profile: which nodes a choice changes (eager, per node); the step time above it is the graph's.
  bench $R/$n.ampplan ${n}_heuristics --profile 16
  bench $R/$n.ampplan ${n}_auto --algos auto --profile 16
  if [ $n = regnety_016 ]; then
    AMPC_EXP_HOT_L2=1 bench $R/$n.ampplan ${n}_auto_hot --algos auto
    bench $R/$n.ampplan ${n}_deterministic --deterministic
  fi
  rm -f $R/$n.ampplan*
done
g=/tmp/ampc-bench/gpt2.onnx
if [ -f $g ] && ampc $g --precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask -o $R/gpt2.ampplan > $R/compile_gpt2.txt 2>&1; then
  d="--int-range input_ids=0:50256 --int-range labels=0:50256"
  bench $R/gpt2.ampplan gpt2_heuristics $d
  bench $R/gpt2.ampplan gpt2_auto $d --algos auto
  rm -f $R/gpt2.ampplan*
fi
left=$((${DEADLINE:-540} - SECONDS))
if [ $left -ge 70 ]; then
  timeout $((left < 150 ? left : 150)) python3 "$bench/zoo_full.py" --out $R/zoo --models timm:regnety_016@64 --work $W --torch-compile --no-eager --steps 20 > $R/zoo_regnety.txt 2>&1
  grep -h '^{"model"' $R/zoo_regnety.txt | cut -c1-400
fi
pkill -P $saver 2>/dev/null; kill $saver 2>/dev/null
tar -cJf "$OUT/call2.tar.xz" -C $R . && rm -f "$OUT"/partial.tar.xz*
