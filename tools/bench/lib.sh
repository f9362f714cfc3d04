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
