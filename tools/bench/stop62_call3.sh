#!/usr/bin/env bash
# Stop 62's third GPU call (pack gpu): why Swin-T went 27.3 -> 30.0 ms in call 2. One export, then
# four plans timed by amprun with their profiles: HEAD; the shared bias's gradient by atomics again
# (AMPC_EXP_MASK_ATOMICS=1 at run time); the masks summed in the Softmax's view again
# (AMPC_EXP_NO_REFINED=1 at compile time); both. The attention nodes' shapes from the plan's text.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf $R; mkdir -p $R
W=/tmp/ampc-full
m=timm:swin_tiny_patch4_window7_224@64
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
CUDA_VISIBLE_DEVICES= timeout 200 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > $R/export.txt 2>&1
onnx=$(find $W -name '*.onnx' | grep -i swin | head -1); echo "onnx: $onnx" >> $R/export.txt
for v in head norefined; do
  env $([ $v = norefined ] && echo AMPC_EXP_NO_REFINED=1) ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/$v.ampplan > $R/compile_$v.txt 2>&1
  env $([ $v = norefined ] && echo AMPC_EXP_NO_REFINED=1) ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 --train --kernels --emit text 2>/dev/null | grep -E "Attention(Grad)?\(" | cut -c1-600 > $R/attn_$v.txt
done
for run in "head 0" "head 1" "norefined 0" "norefined 1"; do
  set -- $run
  AMPC_EXP_MASK_ATOMICS=$2 timeout 60 amprun $R/$1.ampplan --device cuda --synthetic --steps 20 --bench --profile 40 > $R/run_$1_atomics$2.txt 2>&1
  echo "== $1 atomics=$2"; grep -E "step|ms/step|median" $R/run_$1_atomics$2.txt | head -3; grep -E "AttentionGrad|Transpose|Concat" $R/run_$1_atomics$2.txt | head -8
done
rm -f $R/*.ampplan*
tar -cJf "$OUT/call3.tar.xz" -C $R .
