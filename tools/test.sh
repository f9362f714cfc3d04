#!/usr/bin/env bash
# The README's second command: build and run the whole test suite through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
