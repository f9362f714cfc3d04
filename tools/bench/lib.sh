# Shared by the bench scripts: `best_of N CMD...` prints the best wall time of N runs in seconds.
best_of() {
  local n=$1 best="" s e t
  shift
  for _ in $(seq "$n"); do
    s=$(date +%s.%N)
    "$@" >/dev/null
    e=$(date +%s.%N)
    t=$(awk "BEGIN {print $e - $s}")
    if [ -z "$best" ] || awk "BEGIN {exit !($t < $best)}"; then best=$t; fi
  done
  echo "$best"
}

# Makes build/models/resnet18.onnx if it is missing.
ensure_resnet18() {
  [ -f build/models/resnet18.onnx ] || /usr/bin/python3 models/make_models.py build/models resnet18 >/dev/null 2>&1
}

# Builds ninja TARGETs (paths under build/) with the PATCHes (a space-separated list, applied in
# order to the tree) and copies each to build/variants/NAME (the target's file name + SUFFIX); then
# takes the patches out again and rebuilds the targets from the tree (ccache makes that quick).
#   build_variant _w128 "$P/wg128.patch" tools/attn_bench tests/gpu_tests
build_variant() {
  local suffix=$1 patches=$2 t p rc=0 applied=()
  shift 2
  for p in $patches; do
    git apply "$p" || { rc=1; break; }
    applied=("$p" "${applied[@]}")
  done
  [ $rc = 0 ] && { ninja -C build "$@" >/dev/null || rc=1; }
  if [ $rc = 0 ]; then
    mkdir -p build/variants
    for t in "$@"; do cp "build/$t" "build/variants/$(basename "$t")$suffix"; done
  fi
  for p in "${applied[@]}"; do git apply -R "$p"; done
  [ ${#applied[@]} = 0 ] || ninja -C build "$@" >/dev/null
  return $rc
}
