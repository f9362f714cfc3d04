#!/usr/bin/env bash
# Stop 65's second GPU call (pack gpuF): the fused attention's new reach (lifted tensor constants,
# masks subtracted behind no-op Casts, XGLM's clamp as score_floor, a view round trip after the
# softmax) checked against PyTorch, and the floor's CUDA fix-ups against the CPU.
# 1. gpu_tests GpuAttention.* (the floored rows' cases) while, on the CPUs,
# 2. every hf: model of library_models.txt through torchvision_sweep.py with the dynamo exporter
#    (PASS: loss and first-step gradients against f64, 3 fp32 plan steps against PyTorch's), and the
#    three models this stop fused (funnel, gpt_neo, xglm) with the TorchScript exporter too;
# 3. the census of those three, fused and Softmax counts.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
hf=$(grep -v '^#' "$root/tools/sweep/library_models.txt" | grep -E '^hf:' | tr '\n' ' ')
(OUT=$R/lib EXPORTER=dynamo MODELS="$hf" SHARDS=13 MODEL_LIMIT=150 LIMIT=430 PACK_MB=6 nice -n 5 bash "$root/tools/sweep/library_sweep.sh" > $R/lib_dynamo.log 2>&1) &
lib=$!
(OUT=$R/lib_ts EXPORTER=torchscript MODELS="hf:funnel hf:gpt_neo hf:xglm" SHARDS=3 MODEL_LIMIT=150 LIMIT=300 PACK_MB=2 nice -n 5 bash "$root/tools/sweep/library_sweep.sh" > $R/lib_ts.log 2>&1) &
ts=$!
timeout 240 gpu_tests --gtest_filter='GpuAttention.*' > $R/gpu_tests.txt 2>&1
echo "gpu_tests rc=$?" >> $R/gpu_tests.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $R/gpu_tests.txt
grep -E "Failure" -A6 $R/gpu_tests.txt | head -40
wait $ts
cat $R/lib_ts/library_torchscript.txt 2>/dev/null | cut -c1-300
while kill -0 $lib 2>/dev/null && [ $SECONDS -lt 520 ]; do sleep 5; done
cat $R/lib_dynamo.log | head -30
grep -E "funnel|gpt_neo|xglm" $R/lib/library_dynamo.txt 2>/dev/null | cut -c1-300
tar -cJf "$OUT/call2.tar.xz" -C $R .
