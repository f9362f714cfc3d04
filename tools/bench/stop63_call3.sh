#!/usr/bin/env bash
# Stop 63: calls 1 and 2 in one (GPU starts were scarce), most needed first (pack gpuC).
# 1. gpu_tests: GpuAttention's cases on stop 62's maskGradSumKernel (not yet run on a GPU) and the
#    measured GEMM and convolution algorithms' test.
# 2. GPT-2 124M bf16 and convolutional nets: --algos heuristics (the default, as before this stop)
#    against --algos auto (measured at load), then --tune and the stored choices (GPT-2, RegNetY).
# 3. Swin-T from stop 62's refined masks against AMPC_EXP_NO_REFINED=1.
# 4. torch.compile (AMP bf16) in the same call, RegNetY first, while time is left.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
# What has been written so far comes back even where the call is cut at its limit.
(while sleep 40; do tar -cJf "$OUT/partial.tar.xz.tmp" -C $R . 2>/dev/null && mv "$OUT/partial.tar.xz.tmp" "$OUT/partial.tar.xz"; done) &
saver=$!
W=/tmp/ampc-full
convs=${CONVS:-timm:regnety_016@64,timm:convnext_tiny@64}
swin=timm:swin_tiny_patch4_window7_224@64
IFS=, read -ra list <<< "$convs,$swin"
exports=()
for m in "${list[@]}"; do
  (CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export_${m//[:@]/_}.txt" 2>&1) &
  exports+=($!)
done
mkdir -p /tmp/ampc-bench
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/export_models.py" /tmp/ampc-bench gpt2 > $R/export_gpt2.txt 2>&1) &
exports+=($!)
timeout 170 gpu_tests --gtest_filter='GpuAttention.ForwardAndBackwardMatchTheCpu:GpuAttention.OperandsInPlaceMatchTheCpu:*Deterministic*:*AlgorithmsMeasured*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" $R/gpu_tests.txt
wait "${exports[@]}"
bench() {  # PLAN NAME [amprun flags...]
  local plan=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout 120 amprun "$plan" --device cuda --synthetic --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|peak device|algorithms" $R/run_$name.txt
}
g=/tmp/ampc-bench/gpt2.onnx
if [ -f $g ]; then
  t0=$SECONDS
  ampc $g --precision bf16 --optimizer adamw --lr 3e-4 --weight-decay 0.01 --freeze causal_mask -o $R/gpt2.ampplan > $R/compile_gpt2.txt 2>&1
  echo "gpt2: ampc rc=$? in $((SECONDS - t0)) s"
  d="--int-range input_ids=0:50256 --int-range labels=0:50256"
  bench $R/gpt2.ampplan gpt2_heuristics $d --algos heuristics
  bench $R/gpt2.ampplan gpt2_measured $d --algos auto --profile 12
  bench $R/gpt2.ampplan gpt2_tune $d --tune
  amprun $R/gpt2.ampplan --dump | sed -n '/^tuning/,/^steps:/p' | head -60 > $R/gpt2_tuning.txt
  rm -f $R/gpt2.ampplan*
else
  echo "gpt2: no export"; tail -3 $R/export_gpt2.txt
fi
onnxOf() { find $W -name '*.onnx' | grep -i "$1" | head -1; }
IFS=, read -ra clist <<< "$convs"
for m in "${clist[@]}"; do
  n=${m#timm:}; n=${n%@*}
  onnx=$(onnxOf "$n"); echo "onnx $n: $onnx" >> $R/export.txt
  [ -n "$onnx" ] || { echo "$n: no export"; continue; }
  ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$n.ampplan > $R/compile_$n.txt 2>&1 || { echo "$n: compile failed"; tail -3 $R/compile_$n.txt; continue; }
  bench $R/$n.ampplan ${n}_heuristics --algos heuristics --profile 12
  bench $R/$n.ampplan ${n}_measured --algos auto --profile 12
  if [ $n = regnety_016 ]; then bench $R/$n.ampplan ${n}_tune --tune; bench $R/$n.ampplan ${n}_stored; fi
  rm -f $R/$n.ampplan*
done
onnx=$(onnxOf swin); echo "onnx swin: $onnx" >> $R/export.txt
for v in head norefined; do
  env $([ $v = norefined ] && echo AMPC_EXP_NO_REFINED=1) ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/swin_$v.ampplan > $R/compile_swin_$v.txt 2>&1
  bench $R/swin_$v.ampplan swin_$v --profile 40
  grep -E "AttentionGrad|Transpose|Concat" $R/run_swin_$v.txt | head -6
  rm -f $R/swin_$v.ampplan*
done
deadline=${DEADLINE:-540}
for m in "${list[@]}"; do
  left=$((deadline - SECONDS)); [ $left -lt 70 ] && { echo "$m: no time left for torch.compile" | tee -a $R/skipped.txt; continue; }
  timeout $((left < 150 ? left : 150)) python3 "$bench/zoo_full.py" --out $R/zoo --models "$m" --work $W --torch-compile --no-eager --steps 20 > "$R/zoo_${m//[:@]/_}.txt" 2>&1
  grep -h '^{"model"' "$R/zoo_${m//[:@]/_}.txt" | cut -c1-400
done
pkill -P $saver 2>/dev/null; kill $saver 2>/dev/null
tar -cJf "$OUT/call3.tar.xz" -C $R . && rm -f "$OUT"/partial.tar.xz*
