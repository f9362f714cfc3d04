#!/usr/bin/env bash
# Stop 56's eleventh GPU call: the channel-wise and alpha dropouts under the dynamo exporter
# (tools/bench/stop56_dropouts.py).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
timeout 100 python3 tools/bench/stop56_dropouts.py "$(command -v ampc)" 2>&1 | grep -v "Warning\|warn\|torch.onnx\]" | cut -c1-600
