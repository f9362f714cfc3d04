#!/usr/bin/env bash
# Stop 58's third GPU call: selected rows viewed as groups (BART's and T5's classification heads,
# hidden[eos_mask].view(B, -1, H)[:, -1, :]) under the dynamo exporter: the sweep's eos_pool and
# Hugging Face's bart and t5 from the library list, fp32 against PyTorch.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
MODELS="eos_pool hf:bart hf:t5" SHARDS=3 MODEL_LIMIT=200 LIMIT=230 OUT="$OUT" bash tools/sweep/library_sweep.sh > "$OUT/sweep.txt" 2>&1
rm -f "$OUT"/library_failing.tar.gz.*
cut -c1-900 "$OUT/library_dynamo.txt"; tail -3 "$OUT/sweep.txt"
