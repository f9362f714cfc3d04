#!/usr/bin/env python3
"""Make ampc's test models: training graphs that end in a cross-entropy loss.

Uses Debian's python3-torch / python3-torchvision and PyTorch's TorchScript exporter
(opset 17, TrainingMode.TRAINING, no constant folding), so that the graphs stay trainable.

    models/make_models.py OUTDIR [NAME...]     # NAME in mlp cnn transformer resnet18

mlp, cnn and transformer are small and committed under models/; resnet18 (45 MB of weights)
is made on demand (the test suite makes it into the build folder).
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17


class WithLoss(nn.Module):
    """Wraps a model so that the graph's one output is the mean cross-entropy loss."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        logits = self.model(x)
        if logits.dim() == 3:  # (batch, seq, vocab) -> (batch*seq, vocab)
            logits = logits.reshape(-1, logits.shape[-1])
            target = target.reshape(-1)
        return F.cross_entropy(logits, target)


class MLP(nn.Module):
    """The seeds' MLP: 10 -> 100 -> 10 with ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 100)
        self.fc2 = nn.Linear(100, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


class TinyGPT(nn.Module):
    """Decoder-only transformer from nn.TransformerEncoderLayer with a causal mask."""

    def __init__(self, vocab=64, seq=16, d=32, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.1,
                                           activation="gelu", batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        x = self.tok(idx) + self.pos
        x = self.blocks(x, mask=self.mask)
        return self.head(self.norm(x))


def export(model, args, names, path):
    model.train()
    torch.onnx.export(WithLoss(model), args, path, opset_version=OPSET,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=names, output_names=["loss"])
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


def make(name, out):
    torch.manual_seed(0)
    path = os.path.join(out, name + ".onnx")
    if name == "mlp":
        export(MLP(), (torch.randn(100, 10), torch.randint(0, 10, (100,))), ["x", "target"], path)
    elif name == "cnn":
        export(SmallCNN(), (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))),
               ["x", "target"], path)
    elif name == "transformer":
        export(TinyGPT(), (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))),
               ["idx", "target"], path)
    elif name == "resnet18":
        import torchvision
        export(torchvision.models.resnet18(num_classes=10),
               (torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))), ["x", "target"], path)
    else:
        sys.exit(f"make_models: unknown model {name!r}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name in sys.argv[2:] or ["mlp", "cnn", "transformer", "resnet18"]:
        make(name, out)


if __name__ == "__main__":
    main()
