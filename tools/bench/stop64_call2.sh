#!/usr/bin/env bash
# Stop 64, call 2 (pack gpuE): a convolution's cuDNN heuristics asked once per key (call 1: RegNetY's
# load spent 86 s in them), and the convolution tests on it. RegNetY-016 @64 heuristics against auto.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
(while sleep 30; do tar -cJf "$OUT/partial.tar.xz.tmp" -C $R . 2>/dev/null && mv "$OUT/partial.tar.xz.tmp" "$OUT/partial.tar.xz"; done) &
saver=$!
W=/tmp/ampc-full
m=timm:regnety_016@64
(CUDA_VISIBLE_DEVICES= timeout 150 python3 "$bench/zoo_full.py" --out $R/export --models "$m" --export-only --work $W > "$R/export.txt" 2>&1) &
exp=$!
timeout 100 gpu_tests --gtest_filter='*AlgorithmsMeasured*:*ChannelsLast*:Dtypes/GpuOps.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests.txt
wait $exp
bench() {  # PLAN NAME [amprun flags...]
  local plan=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout 120 amprun "$plan" --device cuda --synthetic --steps 20 --bench "$@" > $R/run_$name.txt 2>&1
  echo "== $name (rc=$?, $((SECONDS - t0)) s with load)"
  grep -E "step time|algorithms|load:" $R/run_$name.txt
}
onnx=$(find $W -name '*.onnx' | head -1)
if [ -n "$onnx" ] && ampc "$onnx" --precision bf16 --optimizer sgd --lr 0.01 -o $R/r.ampplan > $R/compile.txt 2>&1; then
  bench $R/r.ampplan heuristics
  bench $R/r.ampplan measured --algos auto
  bench $R/r.ampplan deterministic --deterministic
else
  echo "no export or compile failed"; tail -3 $R/export.txt $R/compile.txt
fi
pkill -P $saver 2>/dev/null; kill $saver 2>/dev/null
tar -cJf "$OUT/call2.tar.xz" -C $R . && rm -f "$OUT"/partial.tar.xz*
