#!/usr/bin/env bash
# Stop 56's eighth GPU call: the stop-gradient models under the dynamo exporter after the helper's
# change (nothing inside a custom Function's forward is marked): the markers must still be written
# where the forward itself detaches (VQ-VAE, SimSiam, a no_grad() teacher), with label smoothing and
# the custom Function beside them.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
for m in vq_straight_through simsiam teacher_no_grad loss_label_smoothing function_mlp; do
  OMP_NUM_THREADS=2 timeout 150 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 120 \
    --out /tmp/s --exporter dynamo $m 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ |ampc_export: the forward stops" | cut -c1-400 > "/tmp/s_$m.txt" &
done
wait
cat /tmp/s_*.txt
