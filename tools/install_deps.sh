#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages. Idempotent: it does nothing
# when all are present. CUDA 13 is expected at /usr/local/cuda (the build goes on without it).
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache pkg-config clang libclang-rt-14-dev libomp-dev
      libonnx-dev libprotobuf-dev protobuf-compiler libgtest-dev libcli11-dev nlohmann-json3-dev
      libfmt-dev libbenchmark-dev libxxhash-dev libgloo-dev llvm-19-dev libzstd-dev zlib1g-dev
      python3 python3-numpy python3-torch python3-torchvision python3-onnx python3-sklearn libonnx-testdata)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
