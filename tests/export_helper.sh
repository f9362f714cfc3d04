#!/usr/bin/env bash
# tools/export/ampc_export.py against PyTorch (Debian's python3-torch: the TorchScript exporter through
# the helper): models whose forward stops gradients (detach(), torch.no_grad()), uses label smoothing
# or keeps a BatchNorm frozen, calls a custom autograd Function (whose forward runs with gradients off:
# no stop-gradient) or custom Functions whose backward is not their derivative (a straight-through sign, a
# spiking step's surrogate gradient: written as the forward's value with the backward's gradient), needs its state dict's versions (torchvision's MNASNet) or looks up an embedding
# with scale_grad_by_freq (which both exporters drop) train with PyTorch's
# loss and gradients (every one PASS: loss against
# f64, every first-step gradient against f64 as close as PyTorch's own f32, 3 SGD steps), and the
# plain TorchScript export of the straight-through model does not (MISMATCH: what the marker fixes);
# Glow's invertible 1x1 convolution (torch.det) through the dynamo path or its TorchScript fallback;
# x[mask] (NonZero of a computed mask) into cross-entropy, a masked mean, logsumexp and max over
# the selected rows (masked_selection), and a mixture of experts that routes by torch.where and
# index_add (moe_loop), and a prototypical network over torch.unique's classes (prototypes: Unique, index_add
# over repeated indices, a cross-entropy over the classes found), and BART's classification head (selected
# rows viewed as [B, -1, H], each group's last: eos_pool), through the plain TorchScript export: PASS.
# A mixture of experts whose experts' backend is set as transformers 5 sets it (moe_experts_backend:
# its default stands for a custom op no exporter writes): EXPORT-FAILS plainly, PASS through the
# helper, which exports it with the batched_mm backend.
# Without torch it skips (exit 77).
set -uo pipefail
build=$1
here=$(cd "$(dirname "$0")/.." && pwd)
if ! /usr/bin/python3 -c 'import torch, torchvision, numpy' 2>/dev/null; then
  echo "export_helper: python3-torch/torchvision/numpy missing; skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sweep() { OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore /usr/bin/python3 "$here/tools/sweep/torchvision_sweep.py" --ampc "$build/tools/ampc" \
  --amprun "$build/tools/amprun" --model-limit 120 "$@" 2>&1 | grep -E "^[a-z_0-9]+ +[A-Z-]+ "; }
helper=$(sweep --out "$out/h" --exporter torchscript-helper vq_straight_through simsiam teacher_no_grad loss_label_smoothing frozen_bn_mixed \
  function_mlp mnasnet0_5 embedding_freq surrogate_functions moe_experts_backend)
plain=$(sweep --out "$out/p" --exporter torchscript vq_straight_through masked_selection moe_loop prototypes eos_pool moe_experts_backend)
# --exporter dynamo: PyTorch's dynamo exporter where it exports, else (Debian's PyTorch has none) the
# helper's TorchScript fallback, which the verdict names.
dyn=$(sweep --out "$out/d" --exporter dynamo invertible_conv)
echo "$helper"
echo "$plain"
echo "$dyn"
ok=1
[ "$(echo "$helper" | grep -c ' PASS ')" = 10 ] || { echo "export_helper: not every model passed through the helper"; ok=0; }
echo "$plain" | grep -q '^masked_selection  *PASS ' || { echo "export_helper: x[mask] into the losses did not train as PyTorch"; ok=0; }
echo "$plain" | grep -q '^moe_loop  *PASS ' || { echo "export_helper: the torch.where/index_add mixture of experts did not train as PyTorch"; ok=0; }
echo "$plain" | grep -q '^prototypes  *PASS ' || { echo "export_helper: the torch.unique prototypical network did not train as PyTorch"; ok=0; }
echo "$plain" | grep -q '^eos_pool  *PASS ' || { echo "export_helper: selected rows viewed as groups (BART's head) did not train as PyTorch"; ok=0; }
echo "$plain" | grep -q '^moe_experts_backend  *EXPORT-FAILS ' || { echo "export_helper: the experts backend stand-in exported without the helper's switch"; ok=0; }
echo "$plain" | grep -q '^vq_straight_through  *MISMATCH ' || { echo "export_helper: the plain export's straight-through gradient matched"; ok=0; }
echo "$dyn" | grep -q '^invertible_conv  *PASS ' || { echo "export_helper: invertible_conv failed through the dynamo path"; ok=0; }
[ $ok = 1 ]
