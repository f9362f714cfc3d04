#!/usr/bin/env bash
# The README's second command: build and run the whole test suite through CTest, then the fuzzers.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
cd ..
# Fuzzing under ASan+UBSan (tools/fuzz.sh): 45 s per driver; AMPC_NO_FUZZ=1 skips it.
[ "${AMPC_NO_FUZZ:-0}" = 1 ] || tools/fuzz.sh "${AMPC_FUZZ_SECONDS:-45}"
