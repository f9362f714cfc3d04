#!/usr/bin/env bash
# Fuzzing under ASan+UBSan: builds the libFuzzer drivers of tests/fuzz with clang (build-fuzz/,
# CPU only, ccache) and runs each for a budget, from a seed corpus of the committed models, IR
# texts, a plan compiled here and a checkpoint of it, .npy and safetensors files, and the reproducers in
# tests/fuzz/corpus/DRIVER/. A sanitizer report, a crash, a timeout or an oversized allocation stops
# it with the reproducer's path and exit 1.
#   tools/fuzz.sh [SECONDS_PER_DRIVER (60)] [DRIVER...]      # tools/test.sh runs it after the tests
# The inputs libFuzzer made interesting stay in build-fuzz/corpus/ between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-60}
shift || true
drivers=("$@")
[ ${#drivers[@]} -gt 0 ] || drivers=(onnx ir_text plan npy safetensors checkpoint)
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DAMPC_CUDA=OFF -DAMPC_FUZZ=ON "-DCMAKE_CXX_FLAGS=$san -fsanitize=fuzzer-no-link" "-DCMAKE_EXE_LINKER_FLAGS=$san" >/dev/null
cmake --build build-fuzz --target $(printf 'fuzz_%s ' "${drivers[@]}") ampc amprun
# The seeds: what the readers normally see, made fresh (a plan and its weights come from one compile).
seeds=build-fuzz/seeds
rm -rf "$seeds" && mkdir -p "$seeds"/{onnx,ir_text,plan,npy,safetensors,checkpoint}
cp models/*.onnx "$seeds/onnx/"
for m in mlp cnn; do
  ASAN_OPTIONS=detect_leaks=0 build-fuzz/tools/ampc "models/$m.onnx" --emit text > "$seeds/ir_text/$m.ir"
done
cp tests/golden/*.ir "$seeds/ir_text/"
ASAN_OPTIONS=detect_leaks=0 build-fuzz/tools/ampc models/mlp.onnx --precision fp16 --optimizer adamw -o "$seeds/seed.ampplan" >/dev/null
head -c -9 "$seeds/seed.ampplan" > "$seeds/plan/mlp.body"   # the body: fuzz_plan appends the checksum
cp "$seeds/seed.ampplan.safetensors" "$seeds/safetensors/"
ASAN_OPTIONS=detect_leaks=0 build-fuzz/tools/amprun "$seeds/seed.ampplan" --synthetic --steps 1 --checkpoint "$seeds/ck" --checkpoint-every 1 >/dev/null 2>&1
cp "$seeds"/ck/ckpt-*.safetensors "$seeds/checkpoint/"
for f in $(find models/ref -name '*.npy' | sort | awk 'NR % 9 == 1 && ++n <= 24'); do cp "$f" "$seeds/npy/$(echo "$f" | tr / _)"; done
status=0
for d in "${drivers[@]}"; do
  corpus=build-fuzz/corpus/$d
  mkdir -p "$corpus" build-fuzz/findings/$d
  extra=()
  [ -d "tests/fuzz/corpus/$d" ] && extra+=("tests/fuzz/corpus/$d")
  log=build-fuzz/findings/$d/log.txt
  echo "fuzz: $d for ${budget}s"
  if ! AMPC_FUZZ_WEIGHTS="$PWD/$seeds/seed.ampplan.safetensors" AMPC_FUZZ_PLAN_NAME=seed.ampplan AMPC_FUZZ_PLAN_FILE="$PWD/$seeds/seed.ampplan" \
       ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 \
       build-fuzz/tests/fuzz/fuzz_$d "$corpus" "$seeds/$d" "${extra[@]}" -max_total_time="$budget" -timeout=10 \
       -rss_limit_mb=3072 -malloc_limit_mb=2048 -max_len=262144 -print_final_stats=1 \
       -artifact_prefix=build-fuzz/findings/$d/ > "$log" 2>&1; then
    echo "fuzz: $d found a problem; reproducer in build-fuzz/findings/$d/ (run build-fuzz/tests/fuzz/fuzz_$d FILE):"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written" "$log" | head -20
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | sed "s/^/fuzz: $d /"
done
exit $status
