#!/usr/bin/env bash
# Stop 56's fifth GPU call: the two dynamo exports ampc refused in call 4 (r3d_18's Conv3d,
# embedding_max_norm), looked at node by node (tools/bench/stop56_diag.py).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
OMP_NUM_THREADS=8 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
  --out /tmp/e --exporter dynamo --export-only video_r3d embedding_max_norm > /dev/null 2>&1
timeout 60 python3 tools/bench/stop56_diag.py "$(command -v ampc)" /tmp/e/video_r3d/video_r3d.onnx /tmp/e/embedding_max_norm/embedding_max_norm.onnx 2>&1 | cut -c1-700
