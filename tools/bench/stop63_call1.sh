#!/usr/bin/env bash
# Stop 63's first GPU call (pack gpuC: gpu_tests, ampc, amprun).
# 1. gpu_tests: GpuAttention's cases on stop 62's maskGradSumKernel (32 lanes of sharers a block,
#    --deterministic only; not yet run on a GPU) and the convolution algorithms' new test.
# 2. Swin-T from stop 62's refined masks (HEAD) against AMPC_EXP_NO_REFINED=1, each with a profile.
# 3. Convolutional nets with the GEMMs' and convolutions' algorithms by heuristics (as before this stop)
#    and measured at load (amprun's new default, --algos auto), then --tune and the stored choices.
# 4. zoo_full beside torch.compile (AMP bf16) in the same call, for as many models as time allows.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
W=/tmp/ampc-full
convs=${CONVS:-timm:regnety_016@64,timm:convnext_tiny@64,timm:resnet50@64}
swin=timm:swin_tiny_patch4_window7_224@64
IFS=, read -ra list <<< "$convs,$swin"
for m in "${list[@]}"; do
  (CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export_${m//[:@]/_}.txt" 2>&1) &
done
timeout 170 gpu_tests --gtest_filter='GpuAttention.ForwardAndBackwardMatchTheCpu:GpuAttention.OperandsInPlaceMatchTheCpu:*Deterministic*:*AlgorithmsMeasured*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" $R/gpu_tests.txt
wait
onnxOf() { find $W -name '*.onnx' | grep -i "$1" | head -1; }
bench() {  # PLAN NAME [amprun flags...]
  local plan=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout 120 amprun "$plan" --device cuda --synthetic --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|peak device|algorithms" $R/run_$name.txt
}
IFS=, read -ra clist <<< "$convs"
for m in "${clist[@]}"; do
  n=${m#timm:}; n=${n%@*}
  onnx=$(onnxOf "$n"); echo "onnx $n: $onnx" >> $R/export.txt
  [ -n "$onnx" ] || { echo "$n: no export"; continue; }
  ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$n.ampplan > $R/compile_$n.txt 2>&1 || { echo "$n: compile failed"; tail -3 $R/compile_$n.txt; continue; }
  bench $R/$n.ampplan ${n}_heuristics --algos heuristics --profile 12
  bench $R/$n.ampplan ${n}_measured --profile 12
  bench $R/$n.ampplan ${n}_tune --tune
  bench $R/$n.ampplan ${n}_stored
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
tar -cJf "$OUT/call1.tar.xz" -C $R .
