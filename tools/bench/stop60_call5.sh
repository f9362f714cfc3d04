#!/usr/bin/env bash
# Stop 60's fifth GPU call: transformers 5's mixtures of experts (the sweep's tiny configs) through the
# export helper, which now exports them with the batched_mm experts backend; the files and PyTorch's
# f64 / f32 gradients come back for ampc --grad here (tools/bench/stop60_moe.py).
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
R=/tmp/moe; rm -rf $R; mkdir -p $R
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > $R/versions.txt 2>&1
OMP_NUM_THREADS=8 timeout 400 python3 "$bench/stop60_moe.py" $R hf:mixtral hf:qwen2_moe hf:olmoe hf:qwen3_moe hf:granitemoe > $R/moe.txt 2> $R/moe_stderr.txt
echo "rc=$?" >> $R/moe.txt
rm -rf $R/*/grads*
tar -cJf "$OUT/moe.tar.xz" -C $R .
cat $R/versions.txt $R/moe.txt; grep -i "ampc_export\|error" $R/moe_stderr.txt | cut -c1-300 | tail -20
