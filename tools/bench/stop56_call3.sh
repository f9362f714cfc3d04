#!/usr/bin/env bash
# Stop 56's third GPU call: the library's fp32 sweep under the dynamo exporter through the helper as it
# now is (a custom autograd Function's forward no stop-gradient: Bloom; the TorchScript fallback where
# torch.export fails; the state dict's versions kept), against PyTorch on the machine's CPUs; the
# failing models' files come back (hf:xglm: ampc exited with no message in call 2).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
SHARDS=15 MODEL_LIMIT=100 LIMIT=${LIMIT:-290} PACK_MB=20 OUT=$OUT bash tools/sweep/library_sweep.sh > "$OUT/summary.txt" 2>&1
x=/tmp/library_dynamo/hf:xglm
if [ -f "$x/hf:xglm.onnx" ]; then
  ampc "$x/hf:xglm.onnx" --grad --eval --inputs "$x/inputs" --outputs /tmp/xg > /tmp/xg.txt 2>&1; echo "xglm ampc rc $?" >> "$OUT/summary.txt"
  tail -5 /tmp/xg.txt >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt" | cut -c1-500
