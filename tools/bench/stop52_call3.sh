#!/usr/bin/env bash
# Stop 52's third GPU call. The CPUs re-run the library sweep (the Swin V2 norm fix, the KINK
# diagnosis on the RegNet/ResNeSt/DPN mismatches, inception_v3 at 192 px, and the families added
# this stop); meanwhile the GPU runs issue 22's kernel numbers (attn_bench and PyTorch's SDPA in the
# same call), the committed zoo on CUDA against PyTorch, and --save-onnx against onnxruntime. Then
# every model the sweep passed trains on CUDA against the CPU backend (fp32) and in bf16
# (tools/sweep/cuda_vs_cpu.sh).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
mkdir -p "$OUT/lib"
t0=$(date +%s); stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
again="hfimg:swinv2 hfimg:regnet timm:resnest14d timm:dpn48b timm:inception_v3@192 hf:yoso timm:ghostnet_100"
new=$(sed -n '/^# Stop 52/,$p' tools/sweep/library_models.txt | grep -v '^#' | grep -v '^ *$' | grep -v inception_v3)
MODELS="$again $new" SHARDS=${SHARDS:-14} MODEL_LIMIT=${MODEL_LIMIT:-150} LIMIT=${LIMIT:-230} PACK_MB=${PACK_MB:-30} OUT=$OUT/lib \
  bash "$root/tools/sweep/library_sweep.sh" > "$OUT/lib/summary.txt" 2>&1 &
stamp attn_bench
timeout 60 attn_bench --bh 96 --seq 1024 --dim 64 --layout gpt2 > "$OUT/attn_gpt2.txt" 2>&1; cat "$OUT/attn_gpt2.txt"
timeout 60 python3 "$bench/sdpa_ref.py" --cudnn > "$OUT/sdpa_ref.txt" 2>&1; tail -8 "$OUT/sdpa_ref.txt"
stamp zoo_cuda
AMPC_ZOO_DIR=$root/models/zoo AMPC_ZOO_DEVICE=cuda AMPC_ZOO_BIN=$root/.gpu/bin timeout 120 zoo_tests > "$OUT/zoo_cuda.txt" 2>&1
grep -E '^\[  (PASSED|FAILED) |^\[==|FAILED  \]' "$OUT/zoo_cuda.txt" | head -20
stamp save_onnx
bash "$bench/save_onnx_ort.sh" "$OUT"  # --save-onnx against onnxruntime
stamp sweep_wait
wait
cat "$OUT/lib/summary.txt"
stamp cuda_vs_cpu
pass=$(grep -E " (PASS|KINK) " "$OUT/lib/library_dynamo.txt" | awk '{print $1}')
JOBS=${JOBS:-4} timeout ${CUDA_LIMIT:-230} bash tools/sweep/cuda_vs_cpu.sh /tmp/library_dynamo $pass > "$OUT/cuda_vs_cpu.txt" 2>&1
echo "cuda_vs_cpu exit $?"
awk '{print $2}' "$OUT/cuda_vs_cpu.txt" | sort | uniq -c
grep -v " PASS fp32" "$OUT/cuda_vs_cpu.txt" | cut -c1-300
stamp done
