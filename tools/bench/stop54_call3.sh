#!/usr/bin/env bash
# Stop 54's last, shortest GPU call: the signal and fake-quantization models under both exporters
# against PyTorch (fp32), and the ops each exporter wrote.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
sweep() { OMP_NUM_THREADS=1 timeout ${SIG_LIMIT:-100} python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" --model-limit 50 "$@" 2>&1 | grep -E "^[a-z:_0-9-]+ +[A-Z-]+ " | cut -c1-400; }
for e in torchscript dynamo; do
  for m in qat_cnn qat_cnn_per_channel spectrogram_cnn spectrogram_learned rfft_frames fourier_mixer fno_tiny hf:fnet hfaudio:wav2vec2 hfaudio:whisper; do
    sweep --out /tmp/s_$e --exporter $e $m > "$OUT/${e}_${m//:/_}.txt" &
  done
done
wait
for f in "$OUT"/*.txt; do cat "$f"; done
for e in torchscript dynamo; do
  python3 - /tmp/s_$e <<'PY' 2>&1 | cut -c1-500
import collections, glob, onnx, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/*.onnx")):
    m = onnx.load(f, load_external_data=False)
    print(sys.argv[1][-6:], f.split("/")[-1], m.opset_import[0].version, dict(collections.Counter(n.op_type for n in m.graph.node)))
PY
done
