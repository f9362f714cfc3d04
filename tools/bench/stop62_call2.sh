#!/usr/bin/env bash
# Stop 62's second GPU call (pack gpu: ampc, amprun): stop61_call1.sh with Swin-T (the shared bias's
# gradient through parts; the shifted-window masks summed in the common refinement: refinedMasks)
# and RegNetY-016 beside torch.compile, the census over the transformers that left a Softmax in
# stop 61 (their files come back), and GPT-2 124M through the harness only where the card is an
# H200 (issue 22's <= 22 ms step is an H200 figure).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$name" in *H200*) gpt2=0 ;; *) gpt2=1 ;; esac
CENSUS=1 CENSUS_MODELS="${CENSUS_MODELS:-hf:mpnet hf:funnel hf:convbert hf:gpt_neo hf:falcon hf:t5 hfimg:swinv2 hfimg:cvt hf:codegen hf:mpt hf:xglm hfimg:swiftformer hfimg:mobilevitv2}" \
  CENSUS_SHARDS=${CENSUS_SHARDS:-7} NO_GPT2=${NO_GPT2:-$gpt2} PER_MODEL=${PER_MODEL:-160} DEADLINE=${DEADLINE:-540} \
  bash "$bench/stop61_call1.sh" "${1:-timm:swin_tiny_patch4_window7_224@64,timm:regnety_016@64}"
