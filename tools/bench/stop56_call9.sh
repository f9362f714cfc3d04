#!/usr/bin/env bash
# Stop 56's ninth GPU call: embedding_freq (scale_grad_by_freq written out by the helper) under the
# dynamo exporter in fp32 and bf16, and embedding_max_norm's and label smoothing's dynamo exports once
# more for their errors.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sw() { OMP_NUM_THREADS=2 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 90 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ |ampc_export: the dynamo exporter failed" | cut -c1-500; }
sw --out /tmp/f --exporter dynamo embedding_freq loss_label_smoothing > /tmp/o1.txt &
sw --out /tmp/g --exporter dynamo --amp bf16 embedding_freq > /tmp/o2.txt &
wait
cat /tmp/o1.txt /tmp/o2.txt
