#!/usr/bin/env bash
# Stop 62's last GPU call, not run (no device time left; the next session's first): pack gpuB
# (gpu_tests, ampc, amprun: 16.9 MB, beside the tracked tree under the 64 MiB). maskGradSumKernel
# over 32 lanes of sharers a block (--deterministic only now), checked by GpuAttention's cases
# against the CPU; then Swin-T timed from the plan of HEAD and with the masks summed in the
# Softmax's view (AMPC_EXP_NO_REFINED=1 at compile time), each with its profile; torch.compile last
# if time is left (TORCH_BY seconds into the call).
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
W=/tmp/ampc-full
m=timm:swin_tiny_patch4_window7_224@64
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > $R/export.txt 2>&1) &
exp=$!
timeout 150 gpu_tests --gtest_filter='GpuAttention.ForwardAndBackwardMatchTheCpu:GpuAttention.OperandsInPlaceMatchTheCpu:*Deterministic*' > $R/gpu_tests.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" $R/gpu_tests.txt
wait $exp
onnx=$(find $W -name '*.onnx' | grep -i swin | head -1); echo "onnx: $onnx" >> $R/export.txt
for v in head norefined; do
  env $([ $v = norefined ] && echo AMPC_EXP_NO_REFINED=1) ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$v.ampplan > $R/compile_$v.txt 2>&1
done
for run in head norefined; do
  timeout 60 amprun $R/$run.ampplan --device cuda --synthetic --steps 20 --bench --profile 40 > $R/run_$run.txt 2>&1
  echo "== $run"; grep -E "ms|step" $R/run_$run.txt | head -4; grep -E "AttentionGrad|Transpose|Concat" $R/run_$run.txt | head -6
done
rm -f $R/*.ampplan*
if [ $SECONDS -lt ${TORCH_BY:-150} ]; then
  timeout $((260 - SECONDS)) python3 "$bench/zoo_full.py" --out $R/zoo --models "$m" --work $W --torch-compile --no-eager --steps 20 > $R/zoo.txt 2>&1
  grep -h '^{"model"' $R/zoo.txt | cut -c1-400
fi
tar -cJf "$OUT/call4.tar.xz" -C $R .
