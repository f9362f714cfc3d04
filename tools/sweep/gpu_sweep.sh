#!/usr/bin/env bash
# On the GPU machine (staged by tools/bench/stage_gpu.sh; PyTorch 2.11 there): the architecture sweep
# with both exporters side by side, on the machine's CPUs (ampc and amprun on the CPU backend), plus
# gpu_tests. One line per model under $OUT/sweep_{dynamo,torchscript}.txt.
#   MODELS="rnn_tanh lrn_cnn" LIMIT=500 bash tools/sweep/gpu_sweep.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$root/.gpu/env.sh"
out=${OUT:-/tmp/ampc-sweep}
mkdir -p "$out"
python3 -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)" | tee "$out/versions.txt"
[ "${SKIP_TESTS:-0}" = 1 ] || AMPC_MODELS_DIR="$root/.gpu/models" gpu_tests --gtest_brief=1 > "$out/gpu_tests.txt" 2>&1
[ "${SKIP_TESTS:-0}" = 1 ] || grep -E "^\[  (FAILED|  PASSED) |tests ran" "$out/gpu_tests.txt"
export OMP_NUM_THREADS=${THREADS:-4}
for e in ${EXPORTERS:-dynamo torchscript}; do
  timeout "${LIMIT:-480}" python3 "$root/tools/sweep/torchvision_sweep.py" --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
    --out "/tmp/sweep_$e" --exporter "$e" ${MODELS:-} > "$out/sweep_$e.txt" 2>&1 &
done
wait
for e in ${EXPORTERS:-dynamo torchscript}; do
  echo "== $e"
  grep -E "^[a-z_0-9]+ +(PASS|MISMATCH|EXPORT-FAILS|AMPC-REFUSES|AMPRUN-FAILS|SWEEP-ERROR)" "$out/sweep_$e.txt" | cut -c1-230
done
