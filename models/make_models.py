#!/usr/bin/env python3
"""Make ampc's test models: training graphs that end in a cross-entropy loss.

Uses Debian's python3-torch / python3-torchvision and PyTorch's TorchScript exporter
(opset 17, TrainingMode.TRAINING, no constant folding), so that the graphs stay trainable.

    models/make_models.py OUTDIR [NAME...]          # NAME in mlp cnn transformer resnet_tiny resnet18 rnn
    models/make_models.py --refs OUTDIR [NAME...]   # PyTorch reference outputs, see make_refs
    models/make_models.py --digits OUTDIR          # digits.onnx and the digits data, see make_digits

mlp, cnn, transformer and resnet_tiny are small and committed under models/; resnet18 (45 MB of weights)
is made on demand, and so is rnn (LSTM and GRU, whose exported form depends on the torch that
exports it): the test suite makes them into the build folder.
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


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        return F.relu(self.bn3(self.conv3(y)) + self.down(x))


class TinyResNet(nn.Module):
    """ResNet-50's op pattern in miniature (stem, max pool, bottlenecks, global average pool):
    channels multiples of 8, so the CUDA backend stores its activations channels-last."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.block1 = Bottleneck(16, 8, 32, 1)
        self.block2 = Bottleneck(32, 8, 32, 2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.block2(self.block1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


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


class TinyRNN(nn.Module):
    """Recurrent layers as PyTorch exports them (ONNX LSTM and GRU nodes): token embeddings, a
    2-layer bidirectional LSTM (time-major), a batch-first GRU, the last step classified."""

    def __init__(self, vocab=32, d=12, hidden=10, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, hidden, num_layers=2, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, idx):
        y, _ = self.lstm(self.embed(idx).transpose(0, 1))
        z, _ = self.gru(y.transpose(0, 1))
        return self.head(z[:, -1])


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
    elif name == "resnet_tiny":
        export(TinyResNet(), (torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))),
               ["x", "target"], path)
    elif name == "transformer":
        export(TinyGPT(), (torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))),
               ["idx", "target"], path)
    elif name == "rnn":
        export(TinyRNN(), (torch.randint(0, 32, (3, 9)), torch.randint(0, 5, (3,))), ["idx", "target"], path)
    elif name == "resnet18":
        import torchvision
        export(torchvision.models.resnet18(num_classes=10),
               (torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))), ["x", "target"], path)
    else:
        sys.exit(f"make_models: unknown model {name!r}")


MODELS = {
    # name: (constructor, inputs maker)
    "mlp": (MLP, lambda g: {"x": torch.randn(100, 10, generator=g),
                            "target": torch.randint(0, 10, (100,), generator=g)}),
    "cnn": (SmallCNN, lambda g: {"x": torch.randn(4, 3, 16, 16, generator=g),
                                 "target": torch.randint(0, 10, (4,), generator=g)}),
    "transformer": (TinyGPT, lambda g: {"idx": torch.randint(0, 64, (2, 16), generator=g),
                                        "target": torch.randint(0, 64, (2, 16), generator=g)}),
    "rnn": (TinyRNN, lambda g: {"idx": torch.randint(0, 32, (3, 9), generator=g),
                                "target": torch.randint(0, 5, (3,), generator=g)}),
    "resnet18": (lambda: __import__("torchvision").models.resnet18(num_classes=10),
                 lambda g: {"x": torch.randn(2, 3, 32, 32, generator=g),
                            "target": torch.randint(0, 10, (2,), generator=g)}),
}


def make_refs(name, model_dir, out):
    """PyTorch's forward on the committed model's own weights, for `ampc --eval` to match.

    Writes OUT/NAME/inputs/*.npy (seeded random inputs), OUT/NAME/loss.npy, OUT/NAME/logits.npy
    (the scores the loss reads, flattened to (N*, C)) and OUT/NAME/grads/PARAM.npy (torch.autograd's
    gradient of every parameter). The model runs in training mode (BatchNorm uses batch
    statistics, as the exported graph does) with every dropout probability set to 0, since dropout
    masks cannot match across frameworks: compare with `ampc --eval --no-dropout`. The model file
    is read from models/ or, for generated models (resnet18), from OUT's parent folder.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    ctor, make_inputs = MODELS[name]
    model = WithLoss(ctor())
    path = os.path.join(model_dir, name + ".onnx")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(os.path.abspath(out)), name + ".onnx")
    proto = onnx.load(path)
    weights = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in proto.graph.initializer}
    state = model.state_dict()
    missing = [k for k in weights if k not in state]
    if missing:
        sys.exit(f"make_refs: {name}: initializers with no PyTorch parameter: {missing}")
    model.load_state_dict(weights, strict=False)
    model.train()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = 0.0
    g = torch.Generator().manual_seed(1234)
    inputs = make_inputs(g)
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    for k, v in inputs.items():
        np.save(os.path.join(d, "inputs", k + ".npy"), v.numpy())
    args = list(inputs.values())
    with torch.no_grad():
        logits = model.model(args[0])
    loss = model(*args)
    loss.backward()
    os.makedirs(os.path.join(d, "grads"), exist_ok=True)
    for pname, p in model.named_parameters():
        np.save(os.path.join(d, "grads", pname + ".npy"), p.grad.numpy().astype(np.float32))
    # PyTorch's own AMP (CPU autocast, bf16) on the same model and data: the yardstick for ampc's
    # mixed-precision gradients.
    if name not in ("resnet18", "rnn"):  # generated models: gradients only
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            amp_loss = model(*args)
        amp_loss.backward()
        os.makedirs(os.path.join(d, "grads_amp_bf16"), exist_ok=True)
        for pname, p in model.named_parameters():
            np.save(os.path.join(d, "grads_amp_bf16", pname + ".npy"), p.grad.float().numpy())
    # 20 training steps on this batch from these weights, SGD with momentum and AdamW: the
    # reference for ampc's train-step (tests/e2e/train_test.cpp).
    if name not in ("resnet18", "rnn"):  # generated models: gradients only
        for opt_name, make_opt in (("sgd", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4)),
                                   ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01))):
            model.load_state_dict(weights, strict=False)
            opt = make_opt(model.parameters())
            for _ in range(20):
                opt.zero_grad()
                model(*args).backward()
                opt.step()
            os.makedirs(os.path.join(d, "train_" + opt_name), exist_ok=True)
            for pname, p in model.named_parameters():
                np.save(os.path.join(d, "train_" + opt_name, pname + ".npy"), p.detach().numpy())
        model.load_state_dict(weights, strict=False)
    # The same in f64: resnet18 at 32x32 and batch 2 is ill-conditioned (BatchNorm over 2 values in
    # its last stage), so f32 results of any two implementations differ by ~1e-3; f64 does not.
    # ONNX attributes are f32: the graph's epsilon is float32(1e-5), which the f64 run must use too.
    for mod in model.modules():
        if hasattr(mod, "eps") and isinstance(mod.eps, float):
            mod.eps = float(np.float32(mod.eps))
    model.double().zero_grad()
    model(*[a.double() if a.is_floating_point() else a for a in args]).backward()
    os.makedirs(os.path.join(d, "grads64"), exist_ok=True)
    for pname, p in model.named_parameters():
        np.save(os.path.join(d, "grads64", pname + ".npy"), p.grad.numpy())
    np.save(os.path.join(d, "loss.npy"), loss.detach().numpy().astype(np.float32))
    np.save(os.path.join(d, "logits.npy"), logits.reshape(-1, logits.shape[-1]).numpy().astype(np.float32))
    print(f"wrote {d}: loss {loss.item():.6f}")


class DigitsNet(nn.Module):
    """The digits example: 8x8 images as 64 features -> 128 -> 10."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def make_digits(out):
    """The digits data set of Debian's python3-sklearn (1797 8x8 images, 10 classes) as .npy, split
    into OUT/digits/train (1437 samples) and OUT/digits/test (360) with a fixed seed, pixels scaled
    to [0, 1]; and OUT/digits.onnx, DigitsNet with a cross-entropy loss at batch 64."""
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(0).permutation(len(x))
    split = {"train": perm[:1437], "test": perm[1437:]}
    for part, idx in split.items():
        p = os.path.join(out, "digits", part)
        os.makedirs(p, exist_ok=True)
        np.save(os.path.join(p, "x.npy"), x[idx])
        np.save(os.path.join(p, "target.npy"), y[idx])
    torch.manual_seed(0)
    export(DigitsNet(), (torch.randn(64, 64), torch.randint(0, 10, (64,))), ["x", "target"], os.path.join(out, "digits.onnx"))


def main():
    args = sys.argv[1:]
    if args and args[0] == "--digits":
        make_digits(args[1] if len(args) > 1 else os.path.dirname(os.path.abspath(__file__)))
        return
    refs = bool(args) and args[0] == "--refs"
    if refs:
        args = args[1:]
    if not args:
        sys.exit(__doc__)
    out = args[0]
    os.makedirs(out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    for name in args[1:] or (["mlp", "cnn", "transformer"] if refs else ["mlp", "cnn", "transformer", "resnet18"]):
        if refs:
            make_refs(name, here, out)
        else:
            make(name, out)


if __name__ == "__main__":
    main()
