#!/usr/bin/env bash
# Stop 55's first GPU call: stop 54's (never run, below) and stop 55's model classes (message passing,
# diffusion, contrastive, losses, point clouds, ... and the stop-gradient forms that ampc_export.py now
# marks: VQ-VAE, SimSiam, a no_grad() teacher, spectral norm) under the TorchScript exporter plain and
# through the helper, and the dynamo exporter through the helper (whose marker is torch.onnx.ops.symbolic).
#
# Stop 54's: stop 53's checks (every CUDA test; the library's mixed-precision sweep
# against PyTorch's CUDA autocast; the new max gradients on CUDA against the CPU backend), and the
# signal ops' models (STFT, DFT, the windows) exported by both of PyTorch's exporters, checked in
# fp32 and bf16 against PyTorch, with the ops each exporter wrote.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib" "$OUT/sig" "$OUT/s55"
sweep() { OMP_NUM_THREADS=1 timeout ${SIG_LIMIT:-240} python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" --model-limit 100 "$@" 2>&1 | grep -E "^[a-z:_0-9-]+ +[A-Z-]+ " | cut -c1-600; }
sig="qat_cnn qat_cnn_per_channel spectrogram_cnn spectrogram_learned rfft_frames fourier_mixer fno_tiny hf:fnet hfaudio:wav2vec2 hfaudio:hubert hfaudio:wavlm hfaudio:whisper hfaudio:audio-spectrogram-transformer hfaudio:sew hfaudio:wav2vec2-conformer"
for e in torchscript dynamo; do
  sweep --out /tmp/sig_$e --exporter $e $sig > "$OUT/sig/fp32_$e.txt" &
  sweep --out /tmp/sigamp_$e --exporter $e --amp bf16 $sig > "$OUT/sig/bf16_$e.txt" &
done
s55="vq_straight_through simsiam teacher_no_grad spectral_norm weight_norm gnn_scatter diffusion_tiny clip_towers losses_many losses_smooth proto_cdist embedding_bag point_knn capsules neural_ode mixture_density invertible_conv"
for e in torchscript torchscript-helper dynamo; do
  sweep --out /tmp/s55_$e --exporter $e $s55 > "$OUT/s55/fp32_$e.txt" &
done
models="$(grep -v '^#' tools/sweep/library_models.txt | grep -v '^ *$' | grep -vE '@(192|224|240|256)$') $(cd tools/sweep && python3 -c 'import torchvision_sweep as t; print(" ".join(t.MODELS))')"
MODELS=$models AMP=bf16 SHARDS=${SHARDS:-12} MODEL_LIMIT=${MODEL_LIMIT:-100} LIMIT=${LIMIT:-200} PACK_MB=${PACK_MB:-40} OUT=$OUT/lib \
  bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
AMPC_MODELS_DIR=$root/.gpu/models timeout ${GPU_LIMIT:-200} gpu_tests > "$OUT/gpu_tests.txt" 2>&1
echo "gpu_tests exit $?"
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]|SKIPPED \] [0-9]' "$OUT/gpu_tests.txt" | cut -c1-160 | tail -30
wait $(jobs -p | head -7)
for e in torchscript dynamo; do
  python3 tools/sweep/onnx_ops.py /tmp/sig_$e > "$OUT/sig/ops_$e.txt" 2>&1
done
for f in "$OUT"/sig/*.txt "$OUT"/s55/*.txt; do echo "== $(basename $f)"; cat "$f"; done
wait
cat "$OUT/lib/summary.txt" | tail -40
exp=/tmp/exported; mkdir -p $exp
OMP_NUM_THREADS=4 timeout 40 python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
  --out $exp --exporter dynamo --export-only textcnn_padding_idx adaptive_max max_ties spectrogram_learned qat_cnn fno_tiny 2>&1 | grep -E " [A-Z-]+ " | cut -c1-200
JOBS=4 timeout 50 bash tools/sweep/cuda_vs_cpu.sh $exp textcnn_padding_idx adaptive_max max_ties spectrogram_learned qat_cnn fno_tiny 2>&1 | cut -c1-400
