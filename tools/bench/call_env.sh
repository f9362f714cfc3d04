# Sourced by a GPU call's script (tools/bench/stopNN_callK.sh) on the GPU machine: strict mode,
# $bench and $root, the staged programs on PATH (.gpu/env.sh), the repository root as the working
# folder, a fresh results folder $R, and the card's name and clocks in $R/gpu.txt.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
R=/tmp/r; rm -rf "$R"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > "$R/gpu.txt" 2>&1
# run_gpu_tests SECONDS FILTER: gpu_tests with a gtest filter into $R/gpu_tests.txt (its exit status
# at the end), then the summary and any failures printed.
run_gpu_tests() {
  timeout "$1" gpu_tests --gtest_filter="$2" > "$R/gpu_tests.txt" 2>&1
  echo "gpu_tests rc=$?" >> "$R/gpu_tests.txt"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]|rc=" "$R/gpu_tests.txt" | head -30
  grep -E "Failure" -B2 -A8 "$R/gpu_tests.txt" | head -60
}
