#!/usr/bin/env bash
# Stop 52's fifth GPU call (short): are mnasnet_small's and mixnet_s's bf16 losses on CUDA (22% and
# 10% from fp32 in call 4) CUDA's, or the nets'? The same bf16 autocast on the CPU backend
# (ampc --precision bf16 --eval) beside fp32; and cuda_vs_cpu.sh's first-step verdicts on four of call 4's mismatches.
set -uo pipefail
bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/../.." && pwd)
source "$root/.gpu/env.sh"
cd "$root"
exp=/tmp/exported; mkdir -p $exp
ms="timm:mnasnet_small timm:mixnet_s hfimg:convnextv2 timm:resnetv2_50x1_bit"
i=0; for m in $ms; do
  OMP_NUM_THREADS=2 timeout 60 python3 tools/sweep/torchvision_sweep.py --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" \
    --out $exp --exporter dynamo --export-only $m > $exp/e$i.txt 2>&1 & i=$((i + 1))
done
wait
cat $exp/e*.txt | grep -E " [A-Z-]+ " | cut -c1-120
for m in timm:mnasnet_small timm:mixnet_s; do
  for p in fp32 bf16 fp16; do
    echo "$m $p CPU autocast: $(ampc $exp/$m/$m.onnx --precision $p --eval --no-dropout --inputs $exp/$m/inputs --outputs /tmp/o_$p 2>&1 | grep '^loss')"
  done
done
JOBS=4 timeout 70 bash tools/sweep/cuda_vs_cpu.sh $exp $ms 2>&1 | tee "$OUT/cuda_vs_cpu5.txt" | cut -c1-400
