#!/usr/bin/env bash
# Stop 65's first GPU call (pack gpuE, built at bef7102): stop64_call2.sh (the cuDNN heuristics
# asked once per key, cold-L2 algorithm timing, --algos auto against heuristics), and beside it on
# the CPUs the attention census of the three transformers left unfused (gpt_neo, funnel, xglm),
# with both exporters; their ONNX files come back (census_*.tar.gz) to be read here.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/.gpu/env.sh"
(for e in dynamo torchscript; do
   OUT=/tmp/cz_$e EXPORTER=$e MODELS="hf:gpt_neo hf:funnel hf:xglm" SHARDS=3 LIMIT=240 PACK_MB=40 \
     nice -n 19 bash "$root/tools/sweep/attention_census.sh" > /tmp/cz_$e.log 2>&1
   cp /tmp/cz_$e.log /tmp/cz_$e/census.txt "$OUT/" 2>/dev/null
   mv "$OUT/census.txt" "$OUT/census_$e.txt" 2>/dev/null
   cp /tmp/cz_$e/census_unfused.tar.gz "$OUT/census_$e.tar.gz" 2>/dev/null
 done) &
bash "$root/tools/bench/stop64_call2.sh"
wait
