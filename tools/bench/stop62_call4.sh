#!/usr/bin/env bash
# Stop 62's fourth GPU call (pack gpuB: gpu_tests, ampc, amprun; models/ left behind for size):
# maskGradSumKernel over 32 lanes of sharers a block (call 2's Swin-T: one thread an element summed
# 4096 parts, 3.4 ms), checked by GpuAttention's cases against the CPU, then Swin-T timed: the plan
# of HEAD, the shared bias's gradient by atomics (AMPC_EXP_MASK_ATOMICS=1), and the masks summed in
# the Softmax's view (AMPC_EXP_NO_REFINED=1), each with its profile; torch.compile last if time is left.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
W=/tmp/ampc-full
m=timm:swin_tiny_patch4_window7_224@64
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
(CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > $R/export.txt 2>&1) &
exp=$!
timeout 120 gpu_tests --gtest_filter='GpuAttention.ForwardAndBackwardMatchTheCpu:GpuAttention.OperandsInPlaceMatchTheCpu' > $R/gpu_tests.txt 2>&1; echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|OK \]|FAILED  \]|rc=" $R/gpu_tests.txt
wait $exp
onnx=$(find $W -name '*.onnx' | grep -i swin | head -1); echo "onnx: $onnx" >> $R/export.txt
for v in head norefined; do
  env $([ $v = norefined ] && echo AMPC_EXP_NO_REFINED=1) ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$v.ampplan > $R/compile_$v.txt 2>&1
done
for run in "head 0" "norefined 0" "head 1"; do
  set -- $run
  AMPC_EXP_MASK_ATOMICS=$2 timeout 60 amprun $R/$1.ampplan --device cuda --synthetic --steps 20 --bench --profile 40 > $R/run_$1_atomics$2.txt 2>&1
  echo "== $1 atomics=$2"; grep -E "ms|step" $R/run_$1_atomics$2.txt | head -4; grep -E "AttentionGrad|Transpose|Concat" $R/run_$1_atomics$2.txt | head -6
done
rm -f $R/*.ampplan*
if [ $SECONDS -lt ${TORCH_BY:-150} ]; then
  timeout $((260 - SECONDS)) python3 "$bench/zoo_full.py" --out $R/zoo --models "$m" --work $W --torch-compile --no-eager --steps 20 > $R/zoo.txt 2>&1
  grep -h '^{"model"' $R/zoo.txt | cut -c1-400
fi
tar -cJf "$OUT/call4.tar.xz" -C $R .
