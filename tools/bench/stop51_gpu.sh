#!/usr/bin/env bash
# Stop 51's first GPU call. The machine's CPUs run the library sweep on (a) small versions of the
# families whose gradients stop 50's sweep found wrong and the hfimg models it found wrong, to bring
# their ONNX files, inputs and f64 gradients back (in 15 MB pieces), and (b) the 26 models stop 50
# did not reach. Meanwhile the GPU runs the GPU tests stop 49 added and no call has run yet.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib"
repro="stdconv_tiny nf_regnet_small resnest_small dpn_small hfimg:regnet hfimg:cvt hfimg:focalnet
  hfimg:segformer hfimg:beit hfimg:efficientnet timm:nf_regnet_b0 timm:resnest14d timm:dpn48b timm:resnetv2_50x1_bit
  timm:mobileone_s0 timm:ghostnetv2_100"
rest="timm:vit_small_patch14_reg4_dinov2@56 timm:swin_tiny_patch4_window7_224@224 timm:pit_ti_224@224 hf:bert hf:deberta-v2
  hf:mpnet hf:mobilebert hf:big_bird hf:gpt_neox hf:gptj hf:bloom hf:llama hf:phi3 hf:starcoder2 hf:olmo2 hf:cohere hf:mixtral
  hf:biogpt hf:esm hf:t5 hf:falcon hf:xlnet hf:funnel hfimg:dinov2 hfimg:convnext hfimg:swin hfimg:swinv2 hfimg:resnet hfimg:pvt_v2 hfimg:bit hfimg:mobilenet_v2"
MODELS="$repro $rest" SHARDS=${SHARDS:-13} MODEL_LIMIT=${MODEL_LIMIT:-100} LIMIT=${LIMIT:-200} PACK_MB=${PACK_MB:-75} OUT=$OUT/lib \
  bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
timeout 120 gpu_tests --gtest_filter='GpuOps.*:GpuProgram.*:GpuFused.*' > "$OUT/gpu_tests.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' "$OUT/gpu_tests.txt" | head -30
wait
cat "$OUT/lib/summary.txt"
