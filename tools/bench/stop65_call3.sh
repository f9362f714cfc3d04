#!/usr/bin/env bash
# Stop 65's third GPU call (pack gpuF): XGLM's clamp (score_floor) against PyTorch with rows masked
# everywhere (floor_check.py: gradients on the CPU, fp32 and bf16 steps on the GPU), then GPT-Neo 125M
# and a 12-layer XGLM (right-padded) at full size: ampc bf16 fused, ampc --no-fuse, torch.compile.
source "$(dirname "${BASH_SOURCE[0]}")/call_env.sh"
W=/tmp/ampc-full
for m in gpt_neo_125m xglm_small_padded; do
  (CUDA_VISIBLE_DEVICES= timeout 240 python3 "$bench/zoo_full.py" --out $R/export --models $m --export-only --work $W > $R/export_$m.txt 2>&1) &
done
timeout 200 python3 "$bench/floor_check.py" --ampc "$(command -v ampc)" --amprun "$(command -v amprun)" --out /tmp/fc > $R/floor_check.txt 2>&1
echo "floor_check rc=$?" >> $R/floor_check.txt
cat $R/floor_check.txt | cut -c1-600
wait
for m in gpt_neo_125m xglm_small_padded; do
  f=$(find $W/$m -name '*.onnx' | head -1)
  [ -n "$f" ] || { echo "$m: not exported"; tail -3 $R/export_$m.txt; continue; }
  echo "$m: $(ampc "$f" --precision bf16 --train --emit text 2>/dev/null | grep -cE '= ([a-z]+::)?Attention\(') fused attentions, $(ampc "$f" --precision bf16 --train --emit text --no-fuse 2>/dev/null | grep -cE '= Softmax\(') softmaxes unfused"
  timeout 200 python3 "$bench/zoo_full.py" --out $R/zoo --models $m --work $W --torch-compile --no-eager --steps 20 > $R/zoo_$m.txt 2>&1
  grep -h '^{"model"' $R/zoo_$m.txt | cut -c1-500
  timeout 120 python3 "$bench/zoo_full.py" --out $R/zoo_nofuse --models $m --work $W --no-torch --ampc-flags=--no-fuse --steps 20 > $R/zoo_nofuse_$m.txt 2>&1
  grep -h '^{"model"' $R/zoo_nofuse_$m.txt | cut -c1-400
done
tar -cJf "$OUT/call3.tar.xz" -C $R .
