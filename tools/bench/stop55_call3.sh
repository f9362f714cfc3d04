#!/usr/bin/env bash
# Stop 55's last (short) GPU call: losses_many's terms one by one under the dynamo exporter (its loss
# was 9.808444 against PyTorch's 9.790133 in call 1), three processes of terms in parallel.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
run() { EXPORTERS=dynamo TERMS="$1" OMP_NUM_THREADS=2 timeout 55 python3 tools/bench/stop55_diag.py "$a" losses 2>&1 | grep -E "^[a-z_]+ +dynamo" | cut -c1-400; }
run "l1 kl margin_ranking triplet" > /tmp/l1.txt &
run "cosine_embedding multilabel_soft_margin soft_margin poisson_nll" > /tmp/l2.txt &
run "hinge_embedding nll_ignore ce_smoothing" > /tmp/l3.txt &
wait
cat /tmp/l1.txt /tmp/l2.txt /tmp/l3.txt
