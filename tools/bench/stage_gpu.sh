#!/usr/bin/env bash
# Builds (Release, CUDA for sm_90) and stages everything the GPU machine needs into .gpu/ (git-ignored,
# carried by the device tool): ampc, amprun, gpu_tests and the shared libraries they need
# (../shared/gpu/stage.sh), zoo_tests, the committed models and tools/bench, and packs .gpu into
# .gpuz/gpu.tar.xz (git-ignored): the tracked tree plus an unpacked .gpu pass the device tool's 64 MiB.
# Carry .gpuz; then, on the GPU machine:
#   tar -xJf .gpuz/gpu.tar.xz && source .gpu/env.sh && AMPC_MODELS_DIR=$PWD/.gpu/models gpu_tests
#   tar -xJf .gpuz/gpu.tar.xz && source .gpu/env.sh && python3 .gpu/bench/harness.py --out $OUT/bench
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$build" --target ampc amprun gpu_tests attn_bench zoo_tests
tmp=$(mktemp -d)
cp "$build/tools/ampc" "$build/tools/amprun" "$build/tests/gpu_tests" "$build/tools/attn_bench" "$build/tests/zoo_tests" "$tmp/"
strip "$tmp"/*
rm -rf .gpu
"${STAGE:-../shared/gpu/stage.sh}" .gpu "$tmp/ampc" "$tmp/amprun" "$tmp/gpu_tests" "$tmp/attn_bench" "$tmp/zoo_tests"
mkdir -p .gpu/models .gpu/bench
cp models/*.onnx .gpu/models/
cp tools/bench/*.sh tools/bench/*.py .gpu/bench/
rm -rf "$tmp"
mkdir -p .gpuz
tar -cf - .gpu | xz -T0 -9e > .gpuz/gpu.tar.xz  # -9e: the tracked tree plus the pack must stay under 64 MiB
du -sh .gpu .gpuz/gpu.tar.xz
