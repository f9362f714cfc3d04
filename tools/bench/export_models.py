#!/usr/bin/env python3
"""Exports the large benchmark models as ONNX training graphs (forward + scalar loss), with the
PyTorch of the machine it runs on (the GPU machine has transformers and torchvision):

    export_models.py OUTDIR [gpt2] [resnet50] [--gpt2-batch 8 --gpt2-seq 1024 --resnet-batch 256]

GPT-2 124M: transformers' GPT2LMHeadModel, random init (seed 0), inputs input_ids and labels
(i64 [batch, seq]), loss = the model's shifted cross-entropy; the causal mask is the initializer
`causal_mask` (compile with --freeze causal_mask). ResNet-50: torchvision, random init,
input x f32 [batch, 3, 224, 224] and target i64 [batch], loss = cross-entropy. Both exported with
the TorchScript exporter in training mode (BatchNorm keeps batch statistics; no constant folding),
opset 17. Dropout is kept as exported (GPT-2's p = 0.1)."""
import argparse
import os
import sys

import torch


class WithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        return torch.nn.functional.cross_entropy(self.model(x), target)


class Gpt2WithLoss(torch.nn.Module):
    """The causal mask (additive, [1, 1, seq, seq]) and the position ids are given as buffers:
    transformers' own mask construction uses ops the TorchScript exporter lacks (aten::diff). The
    mask exports as the initializer `causal_mask`, which ampc must not train (--freeze)."""

    def __init__(self, model, seq):
        super().__init__()
        self.model = model
        allowed = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
        mask = torch.zeros(seq, seq).masked_fill(~allowed, torch.finfo(torch.float32).min)
        self.register_buffer("causal_mask", mask[None, None])
        self.register_buffer("position_ids", torch.arange(seq)[None])

    def forward(self, input_ids, labels):
        return self.model(input_ids=input_ids, labels=labels, attention_mask=self.causal_mask, position_ids=self.position_ids,
                          use_cache=False).loss


def export(module, args, names, path):
    module.train()
    torch.onnx.export(module, args, path, dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=names, output_names=["loss"])
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("models", nargs="*", default=["gpt2", "resnet50"])
    ap.add_argument("--gpt2-batch", type=int, default=8)
    ap.add_argument("--gpt2-seq", type=int, default=1024)
    ap.add_argument("--resnet-batch", type=int, default=256)
    ap.add_argument("--gpt2-tiny", action="store_true",
                    help="a 2-layer GPT-2 (64 wide, 4 heads, vocab 512): the same exporter pattern, small enough for tests")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    if "gpt2" in a.models:
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config()  # 124M: 12 layers, 12 heads, 768 wide, vocab 50257, context 1024
        if a.gpt2_tiny:
            cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=a.gpt2_seq)
        cfg._attn_implementation = "eager"  # explicit Softmax(QK^T + mask)V, not SDPA
        m = Gpt2WithLoss(GPT2LMHeadModel(cfg), a.gpt2_seq)
        ids = torch.randint(0, cfg.vocab_size, (a.gpt2_batch, a.gpt2_seq))
        export(m, (ids, ids.clone()), ["input_ids", "labels"], os.path.join(a.out, "gpt2_tiny.onnx" if a.gpt2_tiny else "gpt2.onnx"))
    if "resnet50" in a.models:
        import torchvision
        m = WithLoss(torchvision.models.resnet50())
        x = torch.randn(a.resnet_batch, 3, 224, 224)
        t = torch.randint(0, 1000, (a.resnet_batch,))
        export(m, (x, t), ["x", "target"], os.path.join(a.out, "resnet50.onnx"))


if __name__ == "__main__":
    sys.exit(main())
