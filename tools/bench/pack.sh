#!/usr/bin/env bash
# Packs built programs for the GPU machine into one xz tarball under .gpuz/ (git-ignored), small
# enough to travel beside the tracked tree (the device's 64 MiB: about 18 MB of carry).
#   tools/bench/pack.sh NAME PROGRAM...      e.g. pack.sh gpuA build/tests/gpu_tests build/tools/amprun
# Stages with ../shared/gpu/stage.sh into .gpu (its env.sh puts bin/ and lib/ on the paths), strips
# the binaries and libraries, and writes .gpuz/NAME.tar.xz holding .gpu. On the GPU machine:
#   rm -rf .gpu; tar -xJf .gpuz/NAME.tar.xz && source .gpu/env.sh && ...
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME PROGRAM..." >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
name=$1; shift
cd "$root"
rm -rf .gpu
../shared/gpu/stage.sh .gpu "$@" >/dev/null
strip --strip-unneeded .gpu/bin/* .gpu/lib/* 2>/dev/null || true
mkdir -p .gpuz
tar -cf - .gpu | xz -9e -T2 > ".gpuz/$name.tar.xz.tmp"
mv ".gpuz/$name.tar.xz.tmp" ".gpuz/$name.tar.xz"
tracked=$(git ls-files -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
packed=$(stat -c %s ".gpuz/$name.tar.xz")
limit=$((64 * 1024 * 1024 - 1024 * 1024))  # the device's 64 MiB for what travels, less 1 MiB for untracked files
echo "pack: .gpuz/$name.tar.xz $packed bytes; tracked tree $tracked bytes; together $((tracked + packed)) of $limit"
[ $((tracked + packed)) -lt $limit ] || { echo "pack: too large for one call" >&2; exit 1; }
