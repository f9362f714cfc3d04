#!/usr/bin/env bash
# Stop 54's short GPU call (little device time left): the signal and fake-quantization models under
# both exporters against PyTorch (fp32; bf16 under the dynamo exporter), the ops each exporter wrote,
# the new models on CUDA against the CPU backend, and the CUDA op and model tests.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/sig"
sweep() { OMP_NUM_THREADS=1 timeout ${SIG_LIMIT:-150} python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" --model-limit 60 "$@" 2>&1 | grep -E "^[a-z:_0-9-]+ +[A-Z-]+ " | cut -c1-500; }
a="qat_cnn qat_cnn_per_channel spectrogram_cnn spectrogram_learned rfft_frames fourier_mixer fno_tiny hf:fnet"
b="hfaudio:wav2vec2 hfaudio:hubert hfaudio:wavlm hfaudio:whisper hfaudio:audio-spectrogram-transformer hfaudio:sew hfaudio:wav2vec2-conformer"
for e in torchscript dynamo; do
  sweep --out /tmp/sa_$e --exporter $e $a > "$OUT/sig/a_$e.txt" &
  sweep --out /tmp/sb_$e --exporter $e $b > "$OUT/sig/b_$e.txt" &
done
sweep --out /tmp/samp --exporter dynamo --amp bf16 $a > "$OUT/sig/a_bf16_dynamo.txt" &
sweep --out /tmp/samp2 --exporter torchscript --amp bf16 qat_cnn spectrogram_learned > "$OUT/sig/a_bf16_torchscript.txt" &
AMPC_MODELS_DIR=$root/.gpu/models timeout ${GPU_LIMIT:-120} gpu_tests --gtest_filter='Dtypes/GpuOps.*:Committed/GpuModels.*:GpuTrainStep.*:GpuFused.*:GpuProgram.*' > "$OUT/gpu_tests.txt" 2>&1
echo "gpu_tests exit $?"
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]|SKIPPED \] [0-9]' "$OUT/gpu_tests.txt" | cut -c1-160 | tail -20
wait
for f in "$OUT"/sig/*.txt; do echo "== $(basename $f)"; cat "$f"; done
for e in torchscript dynamo; do
  python3 tools/sweep/onnx_ops.py /tmp/sa_$e 2>&1 | cut -c1-600
done
JOBS=4 timeout 40 bash tools/sweep/cuda_vs_cpu.sh /tmp/sa_dynamo qat_cnn spectrogram_learned fno_tiny fourier_mixer 2>&1 | cut -c1-300
