#!/usr/bin/env bash
# Stop 56's tenth GPU call: seq_models (a TransformerEncoder with a padding mask, a bidirectional
# LSTM over pack_padded_sequence: ONNX sequence_lens, index_add, index_put(accumulate)) under the
# dynamo exporter in fp32 and bf16, and on CUDA against the CPU backend.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
a=$(command -v ampc)
sw() { OMP_NUM_THREADS=2 timeout 100 python3 tools/sweep/torchvision_sweep.py --ampc "$a" --amprun "$(command -v amprun)" --model-limit 90 "$@" 2>&1 | grep -E "^[a-z:_0-9@-]+ +[A-Z-]+ |ampc_export: the dynamo exporter failed" | cut -c1-500; }
sw --out /tmp/f --exporter dynamo seq_models > /tmp/o1.txt &
sw --out /tmp/g --exporter dynamo --amp bf16 seq_models > /tmp/o2.txt &
wait
JOBS=1 timeout 60 bash tools/sweep/cuda_vs_cpu.sh /tmp/f seq_models > /tmp/o3.txt 2>&1
cat /tmp/o1.txt /tmp/o2.txt /tmp/o3.txt | cut -c1-500
