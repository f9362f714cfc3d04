#!/usr/bin/env python3
"""Architectures the zoo does not hold, checked the way a new user meets ampc: torchvision models
built here with whatever PyTorch is installed (Debian's python3-torch works), exported with the
TorchScript exporter (opset 17, training mode, no constant folding) or, with `--exporter dynamo`
(PyTorch 2.9 and up), PyTorch's default exporter through tools/export/ampc_export.py, or with
`--exporter torchscript-helper` the TorchScript exporter through the helper (its stop-gradient
markers, label smoothing written out, frozen BatchNorms named: what a plain export loses), compiled
by ampc at fp32 and trained 3 SGD steps by amprun on the CPU, against PyTorch's own 3 steps on the
same weights and batch.

    python3 tools/sweep/torchvision_sweep.py --ampc build/tools/ampc --amprun build/tools/amprun \
        --out /tmp/sweep [--exporter dynamo|torchscript-helper] [MODEL...]

Besides torchvision's classifiers: two segmentation nets, a U-Net, an encoder-decoder
Transformer, a top-2 mixture of experts, each read as a classifier (PooledHead, TinySeq2Seq,
TinyMoE), a spatial transformer (TinySTN: an affine grid and grid_sample) and a CNN with local response
normalisation.

Prints one line per model: PASS when
- the forward loss is within 1e-5 of PyTorch's in f64 (or twice PyTorch's own f32 error, for a
  net as ill-conditioned as inception_v3 at 96 px, batch 2),
- every first-step gradient (`ampc --grad`), against f64, is at most 2x PyTorch's own f32 error
  (+1e-6), over the parameters whose exact gradient is at least 1e-3 of the largest,
- and 3 SGD steps of an fp32 plan on amprun match PyTorch's losses within 1e-4, or twice PyTorch's
  own f32-vs-f64 drift over the same steps where it is larger; where that drift passes 1% (batch-2
  BatchNorm nets can be that chaotic: two PyTorch runs differ) the steps are shown, not judged;
else KINK (the loss right, the f64 run's gradients right, and some ReLU input changing sign
between ampc's f32 and f64 runs: a gradient through the kink, not a wrong op), else CUSTOM-BACKWARD
(the loss right, and the forward calls torch.autograd.Function subclasses of its own, whose backward
PyTorch runs and no export keeps), else EXPORT-WRONG (the loss off, and onnxruntime, where
installed, computes ampc's loss from the same file: the exporter wrote another function), else
MISMATCH with the numbers, or the step that failed (export, ampc, amprun) with its first
error line. Dropout probabilities and
stochastic depth are set to 0 (masks cannot match across frameworks); a model whose PyTorch loss
still differs between two forwards of the same weights and batch is TORCH-RANDOM (randomness the
sweep did not find), and nothing of it is compared.

With `--amp bf16` (or fp16) each model is checked in mixed precision instead (check_amp): ampc's
loss and first-step gradients under its autocast policy against f64, beside PyTorch's autocast (on
CUDA where there is one) on the same weights and batch: AMP-PASS, AMP-WORSE or AMP-CHAOTIC.
"""
import argparse
import copy
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

LR = 0.005


class WithLoss(nn.Module):
    """The model and its loss: cross-entropy, or the MODELS entry's own loss(logits, target)."""

    def __init__(self, model, loss=None):
        super().__init__()
        self.model = model
        self.loss = loss or F.cross_entropy

    def forward(self, x, target):
        return self.loss(self.model(x), target)


def tiny_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                                mlp_dim=64, num_classes=10)


class PooledHead(nn.Module):
    """A dense-prediction net (segmentation: [N, classes, H, W]) as a classifier: its output
    averaged over the pixels."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        y = self.net(x)
        return (y["out"] if isinstance(y, dict) else y).mean(dim=(2, 3))


class TinyUNet(nn.Module):
    """Strided convolutions down, ConvTranspose and a bilinear Upsample up, skips concatenated,
    GroupNorm and SiLU: the classes of a diffusion or segmentation U-Net."""

    def __init__(self, c=8, classes=10):
        super().__init__()
        self.inc = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(2, c), nn.SiLU())
        self.down1 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.GroupNorm(2, 2 * c), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(2 * c, 4 * c, 3, stride=2, padding=1), nn.GroupNorm(2, 4 * c), nn.SiLU())
        self.up1 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.fuse1 = nn.Sequential(nn.Conv2d(4 * c, 2 * c, 3, padding=1), nn.GroupNorm(2, 2 * c), nn.SiLU())
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.fuse2 = nn.Sequential(nn.Conv2d(3 * c, c, 3, padding=1), nn.SiLU())
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        a = self.inc(x)
        b = self.down1(a)
        u = self.up1(self.down2(b))
        u = self.fuse1(torch.cat([u, b], dim=1))
        u = self.fuse2(torch.cat([self.up2(u), a], dim=1))
        return self.out(u)


class TinySeq2Seq(nn.Module):
    """nn.Transformer (encoder-decoder): the image's pixels as the source sequence, 4 learned
    queries as the target with a causal mask, cross-attention between them."""

    def __init__(self, d=16, classes=10):
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.queries = nn.Parameter(torch.randn(4, d) * 0.1)
        self.t = nn.Transformer(d_model=d, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32, dropout=0.0,
                                batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        src = self.embed(x.flatten(2).transpose(1, 2))
        tgt = self.queries.unsqueeze(0).expand(x.shape[0], -1, -1)
        mask = torch.triu(torch.full((4, 4), float("-inf")), diagonal=1)
        return self.head(self.t(src, tgt, tgt_mask=mask).mean(dim=1))


class TinyMoE(nn.Module):
    """A mixture-of-experts layer with a top-2 router (TopK, a softmax over the chosen scores
    scattered into dense gates), its experts computed densely: the static-shape form of Mixtral's
    and Switch's routing."""

    def __init__(self, d=16, experts=4, classes=10):
        super().__init__()
        self.embed = nn.Linear(3, d)
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d)) for _ in range(experts))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.embed(x.flatten(2).transpose(1, 2))
        top, idx = self.router(h).topk(2, dim=-1)
        gates = h.new_zeros(h.shape[0], h.shape[1], len(self.experts)).scatter(-1, idx, top.softmax(dim=-1))
        y = sum(gates[..., e:e + 1] * expert(h) for e, expert in enumerate(self.experts))
        return self.head((h + y).mean(dim=1))


class TinySTN(nn.Module):
    """A spatial transformer: a small net predicts an affine transform per image, the affine grid
    (F.affine_grid's, written out) is the sampling grid and F.grid_sample (bilinear, reflection padding) warps the image before
    the classifier; the gradient flows into both the image and the grid."""

    def __init__(self, classes=10):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6))
        with torch.no_grad():
            self.loc[-1].weight.mul_(0.1)
            self.loc[-1].bias.copy_(torch.tensor([1.0, 0.1, 0.0, -0.1, 0.9, 0.05]))
        self.head = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, classes))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        n, _, h, w = x.shape
        # F.affine_grid(theta, x.shape, align_corners=False), written out (PyTorch 1.13 cannot export it)
        ys, xs = (torch.arange(h, dtype=x.dtype) * 2 + 1) / h - 1, (torch.arange(w, dtype=x.dtype) * 2 + 1) / w - 1
        base = torch.stack([xs.view(1, w).expand(h, w), ys.view(h, 1).expand(h, w), torch.ones(h, w, dtype=x.dtype)], dim=-1)
        grid = (base.view(1, h * w, 3) @ theta.transpose(1, 2)).view(n, h, w, 2)
        return self.head(F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False))


# name: (builder, input resolution). Resolutions leave the last stage at least 2x2: at 1x1 a
# BatchNorm over a batch of 2 normalises two values, and even PyTorch's f32 loss leaves its f64 one
# by 11% (wide_resnet50_2 at 32 px, inception_v3 at 96 px): nothing is left to compare.
class RowsAsSequence(nn.Module):
    """A recurrent classifier: the image's rows as a sequence of 3 x width features, the last
    step's output to 10 classes."""

    def __init__(self, rnn, features):
        super().__init__()
        self.rnn = rnn
        self.fc = nn.Linear(features, 10)

    def forward(self, x):
        n, c, h, w = x.shape
        y, _ = self.rnn(x.permute(0, 2, 1, 3).reshape(n, h, c * w))
        return self.fc(y[:, -1])


class ConvThen(nn.Module):
    """A 3x3 convolution to 8 channels, then `f`, then a linear layer to 10 classes: one op or
    module under test."""

    def __init__(self, f, res):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.f = f
        with torch.no_grad():
            features = self.f(self.c(torch.zeros(1, 3, res, res))).numel()
        self.fc = nn.Linear(features, 10)

    def forward(self, x):
        return self.fc(self.f(self.c(x)).flatten(1))


class Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, x):
        return self.f(x)


class TextCnn(nn.Module):
    """Token ids from the image (|x| of its first channel, bucketed into 50 ids, 0 among them) through
    nn.Embedding(50, 16, padding_idx=0), Conv1d, BatchNorm1d, ReLU and a max over the sequence."""

    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(50, 16, padding_idx=0)
        self.c = nn.Conv1d(16, 8, 3, padding=1)
        self.bn = nn.BatchNorm1d(8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        ids = (x[:, 0].flatten(1).abs() * 20).long().clamp(0, 49)
        h = torch.relu(self.bn(self.c(self.e(ids).transpose(1, 2))))
        return self.fc(h.amax(2))


class MaxTies(nn.Module):
    """Ties at the extreme that reach different parameters, as zero borders (letterboxing, padding)
    make them: two convolutions with non-negative weights and bias 0.5 over an input that is <= 0 in a
    2 x 2 patch and 0 elsewhere equal 0.5 exactly wherever their window sees only zeros. Then
    torch.maximum of the two (PyTorch splits dy between the tied inputs), amax over the positions
    (shared among the tied positions), max(dim).values and adaptive max pooling to 1 (to the first
    index). A rule that gives dy to every tie multiplies the biases' gradients by the tie count."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(3, 4, 3, padding=1)
        with torch.no_grad():
            for c in (self.a, self.b):
                c.weight.abs_().mul_(0.1)
                c.bias.fill_(0.5)
        self.fc = nn.Linear(12, 10)

    def forward(self, x):
        ya, yb = self.a(x), self.b(x)
        m = torch.maximum(ya, yb)
        return self.fc(torch.cat([m.amax((2, 3)), ya.flatten(2).max(2).values, F.adaptive_max_pool2d(yb, 1).flatten(1)], 1))


class Spectrogram(nn.Module):
    """Audio classifiers: a power spectrogram (torch.stft with a Hann window, centred frames
    reflect-padded, as torchaudio's Spectrogram computes it) into a small CNN; with `learned`, a
    Conv1d before it, so the gradient runs back through the STFT; with `rfft`, frames' real FFT
    magnitudes (torch.fft.rfft) instead."""

    def __init__(self, learned=False, rfft=False, n_fft=64, hop=16):
        super().__init__()
        self.pre = nn.Conv1d(1, 1, 5, padding=2) if learned else None
        self.rfft, self.n_fft, self.hop = rfft, n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):  # x: [N, samples]
        if self.pre is not None:
            x = self.pre(x.unsqueeze(1)).squeeze(1)
        if self.rfft:
            frames = x.unfold(1, self.n_fft, self.hop) * self.window  # [N, frames, n_fft]
            spec = torch.fft.rfft(frames, dim=-1).abs().transpose(1, 2)
        else:
            spec = torch.stft(x, self.n_fft, self.hop, window=self.window, center=True, return_complex=True).abs()
        return self.net(torch.log1p(spec.pow(2)).unsqueeze(1))


class FourierMixer(nn.Module):
    """FNet's token mixing: the real part of a 2-D FFT over the sequence and hidden dims
    (torch.fft.fftn), in a residual block with a LayerNorm, over 4x4 patches as tokens."""

    def __init__(self, d=16, classes=10):
        super().__init__()
        self.embed = nn.Conv2d(3, d, 4, stride=4)
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        t = self.embed(x).flatten(2).transpose(1, 2)
        t = self.norm(t + torch.fft.fftn(t, dim=(-2, -1)).real)
        return self.head((t + self.ff(t)).mean(1))


class SpectralConv(nn.Module):
    """A Fourier neural operator's layer (1-D): the signal's rfft, its lowest modes mixed across
    channels by trained complex weights (kept as real and imaginary parts), the rest zero, and the
    irfft back to the signal's length, beside a pointwise convolution."""

    def __init__(self, c=8, modes=5, classes=10):
        super().__init__()
        self.modes = modes
        self.lift = nn.Conv1d(4, c, 1)
        self.wr = nn.Parameter(torch.randn(c, c, modes) / c)
        self.wi = nn.Parameter(torch.randn(c, c, modes) / c)
        self.point = nn.Conv1d(c, c, 1)
        self.head = nn.Linear(c, classes)

    def forward(self, x):  # x: [N, 4, length]
        h = self.lift(x)
        spec = torch.fft.rfft(h)[..., :self.modes]
        xr, xi = spec.real, spec.imag
        yr = torch.einsum("bim,iom->bom", xr, self.wr) - torch.einsum("bim,iom->bom", xi, self.wi)
        yi = torch.einsum("bim,iom->bom", xr, self.wi) + torch.einsum("bim,iom->bom", xi, self.wr)
        y = F.pad(torch.stack([yr, yi], -1), (0, 0, 0, h.shape[-1] // 2 + 1 - self.modes))
        h = F.gelu(torch.fft.irfft(torch.view_as_complex(y), n=h.shape[-1]) + self.point(h))
        return self.head(h.mean(-1))


def qat_cnn(per_channel=False):
    """Quantization-aware training as torch.ao prepares it: fake quantization of the activations
    (uint8) and the weights (int8, per tensor or per output channel), observers run once on a batch
    and then disabled (the scales the exporters freeze into the graph stay PyTorch's too)."""
    import torch.ao.quantization as tq
    m = nn.Sequential(tq.QuantStub(), nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10), tq.DeQuantStub())
    weight = (tq.FakeQuantize.with_args(observer=tq.MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                        dtype=torch.qint8, qscheme=torch.per_channel_symmetric) if per_channel
              else tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=-128, quant_max=127,
                                             dtype=torch.qint8, qscheme=torch.per_tensor_symmetric))
    m.qconfig = tq.QConfig(activation=tq.FakeQuantize.with_args(observer=tq.MovingAverageMinMaxObserver, quant_min=0, quant_max=255),
                           weight=weight)
    m.train()
    tq.prepare_qat(m, inplace=True)
    with torch.no_grad():
        m(torch.randn(4, 3, 12, 12))
    m.apply(tq.disable_observer)
    return m


def audio(samples=1024):
    return lambda: torch.randn(2, samples)


def zero_bordered():
    x = torch.zeros(2, 3, 8, 8)
    x[:, :, 3:5, 3:5] = -torch.randn(2, 3, 2, 2).abs()
    return x


class PatchAttention(nn.Module):
    """4x4 patches as tokens through nn.MultiheadAttention with a key padding mask (the last token
    masked), or through a pre-norm nn.TransformerDecoderLayer with a causal float mask; mean-pooled."""

    def __init__(self, decoder=False):
        super().__init__()
        self.c = nn.Conv2d(3, 16, 4, stride=4)
        self.decoder = decoder
        self.a = (nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True) if decoder
                  else nn.MultiheadAttention(16, 2, batch_first=True))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        t = self.c(x).flatten(2).transpose(1, 2)
        if self.decoder:
            n = t.shape[1]
            return self.fc(self.a(t, t, tgt_mask=torch.triu(torch.full((n, n), float("-inf")), 1)).mean(1))
        m = torch.zeros(t.shape[0], t.shape[1], dtype=torch.bool)
        m[:, -1] = True
        return self.fc(self.a(t, t, t, key_padding_mask=m)[0].mean(1))


class ScriptedRecurrence(nn.Module):
    """A scripted submodule (torch.jit.script) with a for loop over the columns and a list that it
    stacks: the TorchScript exporter writes the loop as ONNX Loop (a trip count from the shape, the
    list a carried sequence), which ampc unrolls."""

    class Cell(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.w = nn.Linear(d, d)

        def forward(self, x):  # [N, T, d]
            h = torch.zeros_like(x[:, 0])
            outs: list[torch.Tensor] = []
            for t in range(x.size(1)):
                h = torch.tanh(self.w(h) + x[:, t])
                outs.append(h)
            return torch.stack(outs, 1).mean(1)

    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.cell = torch.jit.script(ScriptedRecurrence.Cell(8))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.cell(self.c(x).mean(2).transpose(1, 2)))


class FrozenBn(nn.Module):
    """A convolution with a BatchNorm left in eval() (frozen, running statistics not 0 and 1), and,
    with `trained`, a second convolution whose BatchNorm trains: fine-tuning's usual mix."""

    def __init__(self, trained):
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1, bias=False) if trained else None
        self.bn2 = nn.BatchNorm2d(8) if trained else None
        self.fc = nn.Linear(8, 10)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
        self.bn.eval()

    def train(self, mode=True):
        super().train(mode)
        self.bn.eval()
        return self

    def forward(self, x):
        h = torch.relu(self.bn(self.c(x)))
        if self.c2 is not None:
            h = torch.relu(self.bn2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


def timm_small(name, **kw):
    import timm
    return timm.create_model(name, pretrained=False, num_classes=10, **kw)


def nf_regnet_small():
    """timm's nf_regnet_b0, 8 to 32 channels wide, a block a stage."""
    import dataclasses
    from timm.models import nfnet
    cfg = dataclasses.replace(nfnet.model_cfgs["nf_regnet_b0"], depths=(1, 1, 1, 1), channels=(16, 16, 32, 32), stem_chs=8,
                              num_features=64, group_size=8)
    return nfnet.NormFreeNet(cfg, num_classes=10)


class StdConvNet(nn.Module):
    """timm's weight-standardised convolutions (BiT's StdConv2d; the NF nets' ScaledStdConv2d, with
    its learned gain), each after the other, strided and grouped."""

    def __init__(self):
        super().__init__()
        from timm.layers import ScaledStdConv2d, StdConv2d
        self.a = StdConv2d(3, 8, 3, padding=1, eps=1e-8)
        self.b = ScaledStdConv2d(8, 16, 3, stride=2, padding=1)
        self.c = StdConv2d(16, 16, 3, padding=1, groups=4)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = torch.relu(self.b(h))
        return self.fc(self.c(h).mean((2, 3)))



# ---- Stop 55: classes of model no MODELS entry had (message passing, diffusion, contrastive towers,
# losses, metric learning, point clouds, capsules, neural ODEs, mixture densities), and the
# stop-gradient forms (detach(), torch.no_grad()) that no exporter keeps: VQ-VAE's straight-through
# estimator, SimSiam, a no_grad() teacher. Scalars joined to the logits are scaled per class (a
# constant added to every logit leaves the cross-entropy unchanged, and would test nothing).

class GraphScatter(nn.Module):
    """Message passing with scatter_add over duplicated destinations, and a scatter_reduce mean."""
    def __init__(self):
        super().__init__()
        n = 128
        src = torch.cat([torch.arange(n), torch.arange(n), torch.arange(0, n, 3)])
        dst = torch.cat([(torch.arange(n) + 1) % n, (torch.arange(n) + 5) % n, (torch.arange(0, n, 3) * 7) % n])
        self.register_buffer("src", src); self.register_buffer("dst", dst)
        self.l1 = nn.Linear(3, 16); self.l2 = nn.Linear(16, 16); self.out = nn.Linear(16, 10)
    def forward(self, x):
        h = self.l1(x.permute(0, 2, 3, 1).reshape(128, 3))
        idx = self.dst.unsqueeze(1).expand(-1, 16)
        agg = torch.zeros_like(h).scatter_add(0, idx, h.index_select(0, self.src))
        h = F.relu(self.l2(agg + h))
        agg = torch.zeros_like(h).scatter_reduce(0, idx, h[self.src], reduce="mean", include_self=False)
        h = torch.tanh(agg + h)
        return self.out(h.view(2, 64, 16).mean(1))


class TinyDiffusion(nn.Module):
    """A denoiser: sinusoidal timestep embedding, GroupNorm, SiLU, a self-attention block, nearest
    upsampling; outputs [N, 10] pooled (the loss is MSE to a fixed noise over the logits)."""
    def __init__(self):
        super().__init__()
        self.inc = nn.Conv2d(3, 16, 3, padding=1)
        self.temb = nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16))
        self.n1 = nn.GroupNorm(4, 16); self.c1 = nn.Conv2d(16, 16, 3, stride=2, padding=1)
        self.n2 = nn.GroupNorm(4, 16); self.qkv = nn.Conv2d(16, 48, 1); self.proj = nn.Conv2d(16, 16, 1)
        self.up = nn.Conv2d(16, 16, 3, padding=1); self.out = nn.Linear(16, 10)
    def forward(self, x):
        n = x.shape[0]
        t = torch.arange(n, dtype=x.dtype) * 37.0 + 5.0
        half = 8
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=x.dtype) / half)
        a = t[:, None] * freqs[None]
        e = self.temb(torch.cat([torch.sin(a), torch.cos(a)], 1))
        h = self.inc(x) + e[:, :, None, None]
        h = self.c1(F.silu(self.n1(h)))
        b, c, hh, ww = h.shape
        q, k, v = self.qkv(self.n2(h)).reshape(b, 3, c, hh * ww).unbind(1)
        w = torch.softmax(q.transpose(1, 2) @ k / math.sqrt(c), -1)
        h = h + self.proj((v @ w.transpose(1, 2)).reshape(b, c, hh, ww))
        h = self.up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h.mean((2, 3)))


class ClipTowers(nn.Module):
    """Two towers over two views of the batch, normalised embeddings, a learned temperature
    (exp, clamped), the symmetric InfoNCE loss; output [2, 10] through a head so the sweep's
    cross-entropy is added to it."""
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16))
        self.b = nn.Sequential(nn.Conv2d(3, 8, 3), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 16))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.head = nn.Linear(16, 10)
    def forward(self, x):
        u = F.normalize(self.a(x), dim=-1); v = F.normalize(self.b(x.flip(3)), dim=-1)
        logits = self.logit_scale.exp().clamp(max=100) * u @ v.t()
        labels = torch.arange(x.shape[0])
        contrast = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        return self.head(u) + contrast


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    def forward(self, x):
        return self.c(x)


def losses_a(o, t):
    dt = o.dtype
    y = F.one_hot(t, 10).to(dt)
    s = torch.linspace(-1, 1, 10, dtype=dt).expand(2, 10)
    sign = torch.where(y > 0, torch.ones_like(y), -torch.ones_like(y))
    return (F.l1_loss(o, s)
            + F.kl_div(F.log_softmax(o / 2, 1), F.softmax(s / 2, 1), reduction="batchmean") * 4
            + F.margin_ranking_loss(o[:, 0], o[:, 1], torch.tensor([1.0, -1.0], dtype=dt), margin=0.1)
            + F.triplet_margin_loss(o[:, :3], o[:, 3:6], o[:, 6:9], margin=0.5)
            + F.cosine_embedding_loss(o[:, :5], o[:, 5:], torch.tensor([1.0, -1.0], dtype=dt), margin=0.1)
            + F.multilabel_soft_margin_loss(o, y) + F.soft_margin_loss(o, sign)
            + F.poisson_nll_loss(o, y, log_input=True) + F.hinge_embedding_loss(o, sign, margin=0.5)
            + F.nll_loss(F.log_softmax(o, 1), t, ignore_index=3)
            + F.cross_entropy(o, t, label_smoothing=0.1))


def losses_b(o, t):
    s = torch.linspace(-1, 1, 10, dtype=o.dtype).expand(2, 10)
    return F.smooth_l1_loss(o, s, beta=0.5) + F.huber_loss(o, s, delta=0.3) + F.multi_margin_loss(o, t, margin=0.7)


class Proto(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.protos = nn.Parameter(torch.randn(10, 8))
    def forward(self, x):
        return -torch.cdist(self.f(x), self.protos) ** 2


class InvertibleConv(nn.Module):
    """Glow's invertible 1x1 convolution: log |det W| added to the logits."""
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linalg.qr(torch.randn(3, 3))[0])
        self.head = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    def forward(self, x):
        y = F.conv2d(x, self.w.view(3, 3, 1, 1))
        return self.head(y) + torch.det(self.w).abs().log() * 64


class Bags(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.EmbeddingBag(50, 8, mode="mean"); self.e2 = nn.EmbeddingBag(50, 8, mode="sum")
        self.l = nn.Linear(16, 10)
    def forward(self, x):
        idx = (x.abs() * 10).long().clamp(max=49).view(2, -1)[:, :12]
        return self.l(torch.cat([self.e(idx), self.e2(idx)], 1))


class PointKnn(nn.Module):
    """DGCNN's edge convolution: k nearest neighbours by topk over pairwise distances, gathered
    features, a max over the neighbours, PointNet's max over points."""
    def __init__(self):
        super().__init__()
        self.e = nn.Sequential(nn.Conv2d(6, 16, 1), nn.BatchNorm2d(16), nn.LeakyReLU(0.2))
        self.p = nn.Conv1d(16, 32, 1); self.out = nn.Linear(32, 10)
    def forward(self, x):
        pts = x.reshape(2, 3, 64)  # [B, 3, N]
        inner = -2 * pts.transpose(1, 2) @ pts
        sq = (pts ** 2).sum(1, keepdim=True)
        d = -sq - inner - sq.transpose(1, 2)
        idx = d.topk(k=5, dim=-1)[1]  # [B, N, k]
        B, C, N = pts.shape
        base = torch.arange(B).view(-1, 1, 1) * N
        flat = (idx + base).view(-1)
        f = pts.transpose(1, 2).reshape(B * N, C)[flat].view(B, N, 5, C)
        c = pts.transpose(1, 2).unsqueeze(2).expand(-1, -1, 5, -1)
        e = torch.cat([f - c, c], 3).permute(0, 3, 1, 2)
        h = self.e(e).max(-1)[0]
        return self.out(self.p(h).max(-1)[0])


class Capsules(nn.Module):
    """Dynamic routing by agreement (3 iterations), squash."""
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(3, 32, 3, stride=2)
        self.W = nn.Parameter(torch.randn(1, 36, 10, 4, 8) * 0.1)
    @staticmethod
    def squash(s, dim=-1):
        n2 = (s ** 2).sum(dim, keepdim=True)
        return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)
    def forward(self, x):
        u = self.squash(F.relu(self.c(x)).view(2, 8, 36).transpose(1, 2))  # [B, 36, 8]
        uhat = (self.W @ u[:, :, None, :, None]).squeeze(-1)  # [B, 36, 10, 4]
        b = torch.zeros(2, 36, 10)
        for i in range(3):
            c = b.softmax(2)
            v = self.squash((c.unsqueeze(-1) * uhat).sum(1))  # [B, 10, 4]
            if i < 2:
                b = b + (uhat * v.unsqueeze(1)).sum(-1)
        return v.norm(dim=-1) * 5


class NeuralOde(nn.Module):
    """RK4 with 4 fixed steps through a small vector field."""
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(17, 16), nn.Tanh(), nn.Linear(16, 16))
        self.inp = nn.Linear(192, 16); self.out = nn.Linear(16, 10)
    def forward(self, x):
        h = self.inp(x.flatten(1)); dt = 0.25
        for i in range(4):
            t = torch.full((2, 1), i * dt)
            f = lambda t, h: self.f(torch.cat([h, t], 1))
            k1 = f(t, h); k2 = f(t + dt / 2, h + dt / 2 * k1); k3 = f(t + dt / 2, h + dt / 2 * k2); k4 = f(t + dt, h + dt * k3)
            h = h + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.out(h)


class MixtureDensity(nn.Module):
    """A mixture density network's negative log-likelihood via logsumexp (the logits carry it)."""
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 15))
        self.head = nn.Linear(15, 10)
    def forward(self, x):
        p = self.f(x); logit, mu, logsig = p[:, :5], p[:, 5:10], p[:, 10:]
        y = torch.linspace(-1, 1, 2).unsqueeze(1)
        logp = F.log_softmax(logit, 1) - logsig - 0.5 * ((y - mu) / logsig.exp()) ** 2 - 0.5 * math.log(2 * math.pi)
        nll = -torch.logsumexp(logp, 1).mean()
        return self.head(p) + nll


class VQ(nn.Module):
    """VQ-VAE's quantiser: nearest code by argmin of distances, the straight-through estimator
    z + (zq - z).detach(), and the codebook and commitment losses with detach()."""
    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(3, 4, 3, stride=2); self.codes = nn.Parameter(torch.randn(6, 4))
        self.dec = nn.Sequential(nn.Conv2d(4, 8, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    def forward(self, x):
        z = self.enc(x).permute(0, 2, 3, 1)  # [B, h, w, 4]
        d = (z.unsqueeze(-2) - self.codes).pow(2).sum(-1)
        zq = self.codes[d.argmin(-1)]
        loss = (zq - z.detach()).pow(2).mean() + 0.25 * (z - zq.detach()).pow(2).mean()
        zst = z + (zq - z).detach()
        return self.dec(zst.permute(0, 3, 1, 2)) + loss * torch.linspace(0, 1, 10)


class SimSiam(nn.Module):
    """SimSiam's symmetric negative cosine loss with a stop-gradient on the target branch, added to
    the logits."""
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8))
        self.h = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 10)
    def forward(self, x):
        z1, z2 = self.f(x), self.f(x.flip(3))
        p1, p2 = self.h(z1), self.h(z2)
        d = lambda p, z: -F.cosine_similarity(p, z.detach(), dim=-1).mean()
        return self.head(z1) + (d(p1, z2) + d(p2, z1)) / 2 * torch.linspace(0, 1, 10)


class Teacher(nn.Module):
    """Distillation from a teacher run under torch.no_grad() whose weights train elsewhere (an EMA
    or a co-trained teacher): PyTorch gives the teacher nothing from this loss."""
    def __init__(self):
        super().__init__()
        self.s = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
        self.t = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    def forward(self, x):
        s = self.s(x)
        with torch.no_grad():
            t = self.t(x)
        kd = (F.softmax(t / 2, 1) * (F.log_softmax(t / 2, 1) - F.log_softmax(s / 2, 1))).sum(1).mean() * 4
        return s + kd * torch.linspace(0, 1, 10) + 0.1 * self.t(x)  # the teacher's own supervised term trains it


class _TanhGelu(torch.autograd.Function):
    """Bloom's GeLUFunction: the tanh GELU with its derivative as a backward of its own. Autograd runs
    the forward with gradients off, which is not a stop-gradient."""
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class _SignSte(torch.autograd.Function):
    """sign(x) forward, the gradient passed straight through (a binarized network's estimator)."""
    @staticmethod
    def forward(ctx, x):
        return torch.sign(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


class _Spike(torch.autograd.Function):
    """A spiking neuron's threshold (x > 0 fires) with the fast-sigmoid surrogate gradient
    dy / (1 + 5 |x|)^2, as spiking-network libraries write it; a scale as a second, plain input."""
    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return (x > 0).to(x.dtype) * scale

    @staticmethod
    def backward(ctx, dy):
        x, = ctx.saved_tensors
        return dy * ctx.scale / (1 + 5 * x.abs()) ** 2, None


class SurrogateNet(nn.Module):
    """Custom autograd Functions whose backward is not their forward's derivative: a binarized layer
    (sign with a straight-through gradient) and spiking units (a step with a surrogate gradient).
    Differentiating their forward gives 0; PyTorch trains with their backward."""
    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.a, self.b = nn.Linear(32, 32), nn.Linear(32, 32)
        self.out = nn.Linear(32, 10)
    def forward(self, x):
        h = self.c(x)
        h = h + 0.5 * self.a(_SignSte.apply(h))
        return self.out(h + _Spike.apply(self.b(h), 0.7))


class FunctionMlp(nn.Module):
    """A custom autograd Function in the middle of the network (Bloom's MLP)."""
    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)
        self.out = nn.Linear(32, 10)
    def forward(self, x):
        h = self.c(x)
        return self.out(h + self.down(_TanhGelu.apply(self.up(h))))


class OrderStats(nn.Module):
    """Sorting and order statistics in the forward: torch.sort, the top two of each group; with
    medians, median over a dim, kthvalue, cumprod and logcumsumexp as well (PyTorch 1.13's TorchScript
    exporter refuses those four)."""
    def __init__(self, medians=False):
        super().__init__()
        self.medians = medians
        self.c = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(2), nn.Flatten())
        self.l = nn.Linear(8 * 4 + 8, 10)
    def forward(self, x):
        h = self.c(x)  # [2, 32]
        v, i = torch.sort(h, dim=1, descending=True)
        g = h.view(2, 8, 4)
        second = torch.topk(g, 2, dim=2).values[..., 1]
        y = self.l(torch.cat([v * torch.linspace(1, 2, 32, device=h.device), second], 1))
        if self.medians:
            y = y + torch.logcumsumexp(h[:, :10], 1) * 0.1 + (torch.median(g, dim=2).values + torch.kthvalue(g, 3, dim=2).values
                     + torch.cumprod(torch.sigmoid(g), dim=2)[..., -1]).sum(1, keepdim=True) * 0.1
        return y


class LayerZoo(nn.Module):
    """Layers and functions no other model here uses: LocalResponseNorm (AlexNet's), the shrink
    activations, LogSigmoid, Softmin, GLU, a bilinear form (nn.Bilinear's, as an einsum: PyTorch
    1.13's TorchScript exporter refuses aten::bilinear), cosine similarity and pairwise distance,
    bicubic resampling (8 -> 7); with atan2, torch.atan2 too (that exporter refuses it)."""
    def __init__(self, atan2=False):
        super().__init__()
        self.atan2 = atan2
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.lrn = nn.LocalResponseNorm(3, alpha=1e-2, beta=0.75, k=1.0)
        self.bil = nn.Parameter(torch.randn(6, 8, 8) * 0.2)
        self.glu = nn.Linear(8, 16)
        self.out = nn.Linear(8 * 9 + 6 + 8 + 2 + 8, 10)
    def forward(self, x):
        h0 = self.lrn(self.c(x))  # [2, 8, 8, 8]
        p = F.avg_pool2d(F.hardshrink(h0, 0.1) + F.softshrink(h0, 0.2) + F.tanhshrink(h0), 3, 2)[:, :, :3, :3].flatten(1)  # 8 x 9
        h = F.interpolate(h0, size=(7, 7), mode="bicubic", align_corners=False)
        v = h.mean((2, 3))  # [2, 8]
        w = F.logsigmoid(h).mean((2, 3))
        b = torch.einsum("bi,oij,bj->bo", v, self.bil, w)
        g = F.glu(self.glu(v), dim=1) + F.softmin(v, 1)
        a = torch.atan2(v, w + 2.0) if self.atan2 else v * w
        d = torch.stack([F.cosine_similarity(v, w, dim=1), F.pairwise_distance(v, w)], 1)
        return self.out(torch.cat([p, b, g, d, a], 1))


class EmbeddingFreq(nn.Module):
    """nn.Embedding(scale_grad_by_freq=True): each row's gradient divided by how often the batch looks
    it up. Only the backward differs, and both exporters write a plain Gather (the TorchScript one
    refuses the flag in training mode, the dynamo one drops it); ampc_export.py writes it out."""
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(20, 8, scale_grad_by_freq=True)
        self.l = nn.Linear(8, 10)
    def forward(self, x):
        idx = (x.abs() * 4).long().clamp(max=19).view(2, -1)[:, :24]  # repeated rows
        return self.l(self.e(idx).mean(1))


class MaskedSelection(nn.Module):
    """Per-token heads trained on the tokens a mask picks at run time, as x[mask] (NonZero, then
    GatherND): a data-dependent length, which ampc pads to its bound. The output bundles the
    per-token logits, a regression head, the token labels (-1: no label) and their mask for the
    losses below."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 16)
        self.cls = nn.Linear(16, 10)
        self.reg = nn.Linear(16, 1)
    def forward(self, x):
        tok = x.flatten(2).transpose(1, 2)  # [2, 64, 3]
        h = F.gelu(self.inp(tok))
        labels = (x[:, 0].flatten(1) * 3).long().clamp(-1, 9)  # [2, 64], -1 where x < 0
        return self.cls(h), self.reg(h).squeeze(-1), labels, x[:, 1].flatten(1)


class EosPool(nn.Module):
    """BART's and T5's sequence-classification heads: each sequence's hidden state at its last <eos>
    token, written hidden[eos_mask].view(B, -1, H)[:, -1, :] (transformers checks that every
    sequence holds as many <eos> tokens). Here three per sequence, at data-dependent places."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 16)
        self.mix = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)
    def forward(self, x):
        h = torch.tanh(self.mix(F.gelu(self.inp(x.flatten(2).transpose(1, 2)))))  # [2, 64, 16]
        score = x[:, 0].flatten(1)
        eos = score >= score.topk(3, dim=1).values[:, -1:]  # the three largest of each row
        return self.out(h[eos, :].view(h.size(0), -1, h.size(-1))[:, -1, :])


class MoeLoop(nn.Module):
    """A top-2 mixture of experts as hand-written routers loop over experts: torch.where(top == e)
    picks each expert's tokens (NonZero), which it runs and index_add_s back, weighted."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.gate = nn.Linear(8, 4)
        self.experts = nn.ModuleList([nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)) for _ in range(4)])
        self.out = nn.Linear(8, 10)
    def forward(self, x):
        h = self.inp(x.flatten(2).transpose(1, 2))  # [2, 64, 8]
        flat = h.reshape(-1, 8)
        weights, chosen = F.softmax(self.gate(flat), -1).topk(2, -1)
        mixed = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(chosen == e)
            mixed = mixed.index_add(0, tok, (expert(flat[tok]) * weights[tok, slot, None]).to(mixed.dtype))
        return self.out(mixed.view(2, -1, 8).mean(1))


class BackendExperts(nn.Module):
    """transformers' experts module, as its 5.x MoE layers hold them: every expert's gate-up and down
    matrices stacked, and the products run by a backend the model picks. Here "grouped_mm" stands
    for transformers' default, whose custom op no exporter writes (an error during the export, as
    there), and "batched_mm" gathers each token's experts' matrices and runs one batched product."""
    def __init__(self, d=8, hidden=12, experts=4):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * hidden, d) * 0.3)
        self.down_proj = nn.Parameter(torch.randn(experts, d, hidden) * 0.3)
        self.backend = "grouped_mm"
    def forward(self, h, chosen, weights):  # h [T, d], chosen and weights [T, k]
        if self.backend != "batched_mm":
            if torch.onnx.is_in_onnx_export():
                raise RuntimeError("no ONNX function for the grouped_mm stand-in")
            out = torch.zeros_like(h)
            for e in range(self.gate_up_proj.shape[0]):
                tok, slot = torch.where(chosen == e)
                gate, up = (h[tok] @ self.gate_up_proj[e].t()).chunk(2, -1)
                out = out.index_add(0, tok, (F.silu(gate) * up) @ self.down_proj[e].t() * weights[tok, slot, None])
            return out
        gate, up = torch.matmul(self.gate_up_proj[chosen], h[:, None, :, None]).squeeze(-1).chunk(2, -1)  # [T, k, hidden]
        y = torch.matmul(self.down_proj[chosen], (F.silu(gate) * up)[..., None]).squeeze(-1)  # [T, k, d]
        return (y * weights[..., None]).sum(1)


class ExpertsBackendMoE(nn.Module):
    """A top-2 MoE whose experts' backend is set as transformers 5 sets it (set_experts_implementation,
    get_experts_implementation): the export helper switches it to batched_mm for the export."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 8)
        self.gate = nn.Linear(8, 4)
        self.experts = BackendExperts()
        self.out = nn.Linear(8, 10)
    def get_experts_implementation(self):
        return {"": self.experts.backend}
    def set_experts_implementation(self, impl):
        self.experts.backend = impl[""] if isinstance(impl, dict) else impl
    def forward(self, x):
        h = self.inp(x.flatten(2).transpose(1, 2)).reshape(-1, 8)
        weights, chosen = F.softmax(self.gate(h), -1).topk(2, -1)
        return self.out(self.experts(h, chosen, weights).view(2, -1, 8).mean(1))


def masked_losses(o, t):
    logits, pred, labels, value = o
    m = labels >= 0
    picked = logits[m]  # [count, 10]
    return (F.cross_entropy(picked, labels[m])  # over the selected rows
            + ((pred[m] - value[m]) ** 2).mean()  # a masked regression
            + 0.1 * torch.logsumexp(picked, -1).mean()
            + 0.01 * picked.amax(0).sum()  # a max over the selected rows
            + 0.01 * F.cross_entropy(picked, labels[m], reduction="none").sum())


class ComplexRotary(nn.Module):
    """Rotary embeddings as Meta's reference Llama code writes them: the query and key pairs as complex
    numbers (view_as_complex) times the positions' unit phasors (torch.polar), back through
    view_as_real; then causal attention and a classifier."""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 32)
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 10)
        freqs = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
        angles = torch.outer(torch.arange(64).float(), freqs)  # [T, 4]
        self.register_buffer("phasors", torch.polar(torch.ones_like(angles), angles), persistent=False)
    def rotate(self, x):  # [B, H, T, 8]
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * self.phasors).flatten(3).type_as(x)
    def forward(self, x):
        h = self.inp(x.flatten(2).transpose(1, 2))  # [2, 64, 32]
        q, k, v = self.qkv(h).view(2, 64, 3, 4, 8).permute(2, 0, 3, 1, 4)
        s = self.rotate(q) @ self.rotate(k).transpose(-1, -2) / 8 ** 0.5
        causal = torch.ones(64, 64, dtype=torch.bool, device=x.device).triu(1)
        a = F.softmax(s.masked_fill(causal, float("-inf")), -1) @ v
        return self.out(a.transpose(1, 2).reshape(2, 64, 32).mean(1))


class Prototypes(nn.Module):
    """Prototypical-network training: the classes present in the batch (torch.unique with
    return_inverse: a data-dependent count), each class's mean embedding (index_add), logits as
    negative squared distances to them, and cross-entropy over the classes found."""
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(3, 16), nn.GELU(), nn.Linear(16, 16))
    def forward(self, x):
        h = self.f(x.flatten(2).transpose(1, 2).reshape(-1, 3))  # [128, 16]
        labels = ((x[:, 0].flatten() * 2).long().clamp(-2, 2) + 2)  # classes 0..4, not all present
        classes, inv = torch.unique(labels, return_inverse=True)
        sums = torch.zeros(classes.shape[0], 16, dtype=h.dtype, device=h.device).index_add(0, inv, h)
        counts = torch.zeros(classes.shape[0], dtype=h.dtype, device=h.device).index_add(0, inv, torch.ones_like(inv, dtype=h.dtype))
        protos = sums / counts[:, None]
        logits = -((h[:, None, :] - protos[None]) ** 2).sum(-1)  # [128, classes]
        return logits, inv


def masked_regression(o, t):
    """Losses over x[mask] that PyTorch's dynamo exporter takes (its cross_entropy and logsumexp over a
    data-dependent count are not), each selection by its own mask-making code."""
    logits, pred, labels, value = o
    return (((pred[labels >= 0] - value[labels >= 0]) ** 2).mean()
            + (pred[labels >= 0] - value[labels >= 0]).abs().mean()
            + 0.01 * logits[labels >= 0].amax(0).sum()
            + 0.1 * F.normalize(logits[labels >= 0], dim=-1).sum() / (labels >= 0).sum())


class SeqModels(nn.Module):
    """Sequence layers as NLP code writes them: nn.TransformerEncoder (pre-norm, GELU) with a key
    padding mask, a bidirectional LSTM over pack_padded_sequence (per-sample lengths), index_add and
    index_put(accumulate=True). (Over repeated indices PyTorch 1.13's TorchScript exporter writes both
    as scatters without reduction, which lose the sums and which ampc refuses by name; hence the
    indices here are distinct.)"""
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.lstm = nn.LSTM(16, 8, batch_first=True, bidirectional=True)
        self.out = nn.Linear(16 + 16 + 6, 10)
    def forward(self, x):
        seq = self.inp(x.reshape(2, 16, 12))  # [2, 16, 16]
        pad = torch.arange(16).unsqueeze(0) >= torch.tensor([[16], [11]])
        h = self.enc(seq, src_key_padding_mask=pad)
        packed = nn.utils.rnn.pack_padded_sequence(h, torch.tensor([16, 11]), batch_first=True)
        _, (hn, _) = self.lstm(packed)
        last = torch.cat([hn[0], hn[1]], 1)
        idx = torch.tensor([0, 2, 4, 5, 3, 1])
        pooled = h.new_zeros(2, 6, 16).index_add(1, idx, h[:, :6])
        acc = h.new_ones(2, 6).index_put((torch.tensor([0, 1, 1]), torch.tensor([3, 2, 5])), h[0, :3, :3].sum(1), accumulate=True)
        return self.out(torch.cat([last, pooled.mean(1), acc], 1))


class EmbeddingMaxNorm(nn.Module):
    """nn.Embedding(max_norm=...): the lookup renormalises the rows it reads in place, under no_grad,
    before the gather (torch.embedding_renorm_): PyTorch's gradient is the lookup's of the new rows.
    Through the helper the rows are renormalised at each lookup with that gradient, but not written
    back into the weight: after the first step the trajectory drifts from PyTorch's (1.1e-4 in 3 steps
    here), as the helper warns."""
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(50, 8, max_norm=1.0)
        self.l = nn.Linear(8, 10)
    def forward(self, x):
        idx = (x.abs() * 10).long().clamp(max=49).view(2, -1)[:, :12]
        return self.l(self.e(idx).mean(1))


class Reparametrized(nn.Module):
    """torch.nn.utils.parametrizations (PyTorch 2.x): spectral norm (its power iteration runs under
    torch.no_grad() and updates the buffer u; ampc_export.py marks it) or weight norm; orthogonal."""

    def __init__(self, spectral):
        super().__init__()
        P = nn.utils.parametrizations
        self.c = P.spectral_norm(nn.Conv2d(3, 8, 3)) if spectral else P.weight_norm(nn.Conv2d(3, 8, 3))
        self.l = P.orthogonal(nn.Linear(8, 10)) if spectral else P.weight_norm(nn.Linear(8, 10), dim=None)

    def forward(self, x):
        return self.l(F.relu(self.c(x)).mean((2, 3)))

MODELS = {
    "alexnet": (lambda: torchvision.models.alexnet(num_classes=10), 64),
    "vgg11_bn": (lambda: torchvision.models.vgg11_bn(num_classes=10), 32),
    "squeezenet1_1": (lambda: torchvision.models.squeezenet1_1(num_classes=10), 64),
    "shufflenet_v2_x0_5": (lambda: torchvision.models.shufflenet_v2_x0_5(num_classes=10), 64),
    "mnasnet0_5": (lambda: torchvision.models.mnasnet0_5(num_classes=10), 64),
    "densenet121": (lambda: torchvision.models.densenet121(num_classes=10), 64),
    "googlenet": (lambda: torchvision.models.googlenet(num_classes=10, aux_logits=False, init_weights=True), 64),
    "inception_v3": (lambda: torchvision.models.inception_v3(num_classes=10, aux_logits=False, init_weights=True), 160),
    "regnet_y_400mf": (lambda: torchvision.models.regnet_y_400mf(num_classes=10), 64),
    "resnext50_32x4d": (lambda: torchvision.models.resnext50_32x4d(num_classes=10), 64),
    "wide_resnet50_2": (lambda: torchvision.models.wide_resnet50_2(num_classes=10), 64),
    "mobilenet_v3_small": (lambda: torchvision.models.mobilenet_v3_small(num_classes=10), 64),
    "efficientnet_v2_s": (lambda: torchvision.models.efficientnet_v2_s(num_classes=10), 64),
    "convnext_tiny": (lambda: torchvision.models.convnext_tiny(num_classes=10), 64),
    "swin_t": (lambda: torchvision.models.swin_t(num_classes=10), 64),
    "vit_tiny": (tiny_vit, 32),
    # Classes the zoo lacks: segmentation heads (bilinear Resize, atrous convolutions, adaptive
    # pooling), a U-Net (ConvTranspose, GroupNorm, skips), an encoder-decoder Transformer.
    "lraspp_mobilenet_v3": (lambda: PooledHead(torchvision.models.segmentation.lraspp_mobilenet_v3_large(num_classes=10, weights_backbone=None)), 64),
    "deeplabv3_mobilenet_v3": (lambda: PooledHead(torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(num_classes=10, weights_backbone=None, aux_loss=False)), 64),
    "unet_tiny": (lambda: PooledHead(TinyUNet()), 16),
    "seq2seq_tiny": (TinySeq2Seq, 4),
    "moe_tiny": (TinyMoE, 4),
    "stn_tiny": (TinySTN, 12),
    "bicubic_upsample": (lambda: PooledHead(nn.Sequential(nn.Conv2d(3, 10, 3), nn.Upsample(scale_factor=2, mode="bicubic"), nn.ReLU())), 8),
    # AlexNet-era local response normalisation: PyTorch writes F.local_response_norm with an If on the
    # input's rank, which ampc takes once the condition folds.
    # Elman RNNs (ONNX RNN: tanh one way; relu, two layers, both ways).
    "rnn_tanh": (lambda: RowsAsSequence(nn.RNN(24, 16, batch_first=True), 16), 8),
    "rnn_relu_bi2": (lambda: RowsAsSequence(nn.RNN(24, 16, num_layers=2, nonlinearity="relu", bidirectional=True, batch_first=True), 32), 8),
    # torch.fmod exports as Mod: its gradient flows to the convolution (it was dropped once).
    "fmod_remainder": (lambda: ConvThen(Lambda(lambda y: torch.fmod(y, 0.3) + torch.remainder(y, 0.7) + torch.round(y * 2) / 2), 8), 8),
    # Losses other than cross-entropy over class indices, after one small net (the loss functions
    # build their tensors in the logits' dtype: the f64 reference runs them too).
    "loss_bce_one_hot": (lambda: ConvThen(nn.ReLU(), 8), 8,  # OneHot, BCE with logits and pos_weight
                         lambda o, t: F.binary_cross_entropy_with_logits(o, F.one_hot(t, 10).to(o.dtype),
                                                                         pos_weight=torch.linspace(0.5, 2, 10, dtype=o.dtype))),
    "loss_soft_targets": (lambda: ConvThen(nn.ReLU(), 8), 8,  # class probabilities, class weights, [N, C, d] scores
                          lambda o, t: F.cross_entropy(o, F.softmax(torch.linspace(-1, 1, 10, dtype=o.dtype).expand(2, 10), 1),
                                                       weight=torch.linspace(0.5, 1.5, 10, dtype=o.dtype))
                          + F.cross_entropy(o.view(2, 5, 2), F.softmax(torch.linspace(-1, 1, 10, dtype=o.dtype).view(1, 5, 2).expand(2, 5, 2), 1),
                                            reduction="sum")),
    "loss_gaussian_nll": (lambda: ConvThen(nn.ReLU(), 8), 8,
                          lambda o, t: F.gaussian_nll_loss(o, F.one_hot(t, 10).to(o.dtype), torch.full((2, 10), 0.5, dtype=o.dtype))),
    # A text CNN: nn.Embedding(padding_idx=0), Conv1d, BatchNorm1d, a max over time. No exporter keeps
    # padding_idx: ampc notes the all-zero row, and --embedding-padding says what PyTorch knew.
    "textcnn_padding_idx": (TextCnn, 8, None, ["--embedding-padding", "model.e.weight=0"]),
    # A BatchNorm frozen in eval(): beside a training one ampc keeps it so by itself; alone (nothing in
    # the graph tells it from the dynamo exporter's train()-mode BatchNorm) --batchnorm as-exported says so.
    "frozen_bn_mixed": (lambda: FrozenBn(True), 8),
    "frozen_bn_alone": (lambda: FrozenBn(False), 8, None, ["--batchnorm", "as-exported"]),
    "lrn_cnn": (lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.LocalResponseNorm(3, alpha=0.5, beta=0.75, k=2.0),
                                      nn.Conv2d(8, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)), 16),
    # Probed in stop 38 (all passed): attention with a key padding mask, a pre-norm decoder layer,
    # data movement (pixel shuffle, roll, flip), adaptive max pooling, normalisation written out.
    "mha_key_padding": (lambda: PatchAttention(False), 16),
    "decoder_layer_prenorm": (lambda: PatchAttention(True), 16),
    "pixel_shuffle": (lambda: ConvThen(nn.Sequential(nn.PixelShuffle(2), nn.PixelUnshuffle(2)), 8), 8),
    "roll_flip": (lambda: ConvThen(Lambda(lambda y: torch.roll(y, 2, 3) + torch.flip(y, [2])), 8), 8),
    "adaptive_max": (lambda: ConvThen(nn.AdaptiveMaxPool2d(3), 9), 9),
    # Stop 53: ties at a max that reach different parameters (ampc gave every tie all of dy).
    "max_ties": (MaxTies, 8, None, [], zero_bordered),
    # Added in stop 49, when no GPU was lent (not yet run): a scripted loop (ONNX Loop under the
    # TorchScript exporter) and F.fold after F.unfold (Col2Im at opset 18: the dynamo exporter;
    # the TorchScript exporter's opset 17 has no Col2Im). stn_tiny has F.affine_grid.
    "scripted_loop": (ScriptedRecurrence, 8),
    "fold_unfold": (lambda: ConvThen(Lambda(lambda y: F.fold(F.unfold(y, 3, padding=1, stride=2) * 0.5, (9, 9), 3, padding=1, stride=2)), 9), 9),
    "normalize_std": (lambda: ConvThen(Lambda(lambda y: F.normalize(y, dim=1) * F.cosine_similarity(y, y.flip(1), dim=1).unsqueeze(1)
                                              + (y - y.mean((2, 3), keepdim=True)) / (y.var((2, 3), keepdim=True) + 1e-3).sqrt()), 8), 8),
    # Small versions of the timm families whose gradients the library sweep of stop 50 found wrong
    # (the models' own configs, narrower and shallower through timm.create_model's keywords): weight
    # standardisation (StdConv2d in BiT, ScaledStdConv2d with its gain in the NF nets), ResNeSt's split
    # attention (a BatchNorm over pooled [N, C, 1, 1]), DPN's dual paths with grouped convolutions.
    "stdconv_tiny": (lambda: StdConvNet(), 16),
    "nf_regnet_small": (nf_regnet_small, 32),
    "resnest_small": (lambda: timm_small("resnest14d", channels=(8, 16, 16, 32), stem_width=8), 32),
    # Stop 54: the signal ops (STFT under the TorchScript exporter; DFT, which the dynamo exporter
    # writes for torch.fft.*, and likely for torch.stft; the windows), with and without a gradient through them.
    "spectrogram_cnn": (lambda: Spectrogram(), 8, None, [], audio()),
    "spectrogram_learned": (lambda: Spectrogram(learned=True), 8, None, [], audio()),
    "rfft_frames": (lambda: Spectrogram(learned=True, rfft=True), 8, None, [], audio()),
    "fourier_mixer": (FourierMixer, 16),
    "qat_cnn": (qat_cnn, 12),
    "qat_cnn_per_channel": (lambda: qat_cnn(True), 12),
    "fno_tiny": (SpectralConv, 32, None, [], lambda: torch.randn(2, 4, 32)),
    "dpn_small": (lambda: timm_small("dpn48b", k_sec=(1, 1, 2, 1), inc_sec=(8, 8, 8, 16), k_r=16, groups=4, num_init_features=8), 32),
    # Stop 55 (above). The stop-gradient ones pass only through the helper (the dynamo exporter's
    # path, or --exporter torchscript-helper): a plain TorchScript export drops every detach().
    # scatter_reduce(mean) exports (dynamo) as ScatterElements with reduction 'none' over duplicate
    # indices, which ONNX leaves undefined: ampc refuses it by name (stop 55; it trained another function).
    "gnn_scatter": (GraphScatter, 8),
    "diffusion_tiny": (TinyDiffusion, 8),
    "clip_towers": (ClipTowers, 8),
    "losses_many": (SmallNet, 8, losses_a),
    "losses_smooth": (SmallNet, 8, losses_b),
    # cross_entropy's label_smoothing: the dynamo exporter writes SoftmaxCrossEntropyLoss without it
    # (the plain loss), the TorchScript exporter refuses it; ampc_export.py writes it out.
    "loss_label_smoothing": (SmallNet, 8, lambda o, t: (
        F.cross_entropy(o, t, label_smoothing=0.1)
        + F.cross_entropy(o, t, weight=torch.linspace(0.5, 1.5, 10, dtype=o.dtype), ignore_index=int(t[0]), label_smoothing=0.2)
        + F.cross_entropy(o, F.softmax(torch.linspace(-1, 1, 10, dtype=o.dtype).expand(2, 10), 1), label_smoothing=0.05)
        + F.cross_entropy(o, t, reduction="sum", label_smoothing=0.3) * 0.1)),
    "proto_cdist": (Proto, 8),
    "embedding_bag": (Bags, 8),
    "point_knn": (PointKnn, 8),
    "capsules": (Capsules, 8),
    "neural_ode": (NeuralOde, 8),
    "mixture_density": (MixtureDensity, 8),
    "invertible_conv": (InvertibleConv, 8),  # torch.det: ONNX Det and its cofactor gradient
    "vq_straight_through": (VQ, 8),
    "simsiam": (SimSiam, 8),
    "teacher_no_grad": (Teacher, 8),
    "function_mlp": (FunctionMlp, 8),
    "surrogate_functions": (SurrogateNet, 8),  # custom Functions whose backward is not the derivative (stop 57)  # a custom autograd Function's forward runs with gradients off: not a stop-gradient
    # Stop 56: a video network (3-D convolutions and pooling), order statistics, a renormalising embedding.
    "video_r3d": (lambda: torchvision.models.video.r3d_18(num_classes=10), 16, None, [], lambda: torch.randn(2, 3, 4, 16, 16)),
    "order_stats": (OrderStats, 8),
    "layer_zoo": (LayerZoo, 8),
    "layer_zoo_atan2": (lambda: LayerZoo(True), 8),
    "order_stats_medians": (lambda: OrderStats(True), 8),
    "embedding_max_norm": (EmbeddingMaxNorm, 8),
    "embedding_freq": (EmbeddingFreq, 8),
    "seq_models": (SeqModels, 8),
    # Stop 57: x[mask] (NonZero of a computed mask) into losses and reductions over the rows.
    "masked_selection": (MaskedSelection, 8, masked_losses),
    "masked_regression": (MaskedSelection, 8, masked_regression),
    "moe_loop": (MoeLoop, 8),
    "moe_experts_backend": (ExpertsBackendMoE, 8),  # stop 60: transformers 5's experts backends
    "eos_pool": (EosPool, 8),  # stop 58: selected rows viewed as [B, -1, H], then each group's last
    "prototypes": (Prototypes, 8, lambda o, t: F.cross_entropy(o[0], o[1])),
    "complex_rotary": (ComplexRotary, 8),
    "spectral_norm": (lambda: Reparametrized(True), 8),
    "weight_norm": (lambda: Reparametrized(False), 8),
}


class HfLogits(nn.Module):
    """A Hugging Face model read as a classifier: its logits for the input given by keyword."""

    def __init__(self, model, key):
        super().__init__()
        self.m = model
        self.key = key

    def forward(self, x):
        out = self.m(**{self.key: x})
        return out.logits if hasattr(out, "logits") else out.last_hidden_state.mean(1)


# A small model of each family: the widths, depths and heads each config calls by these names (or
# maps to them through its attribute_map). Two heads over one key/value head where the family has
# grouped attention; two of four experts where it routes.
HF_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
               vocab_size=128, max_position_embeddings=64, head_dim=16, d_kv=16, d_ff=64, embedding_size=32,
               num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
               shared_expert_intermediate_size=32, decoder_layers=2, encoder_layers=2, decoder_attention_heads=2,
               encoder_attention_heads=2, decoder_ffn_dim=64, encoder_ffn_dim=64, num_decoder_layers=2,
               type_vocab_size=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, sep_token_id=2,
               decoder_start_token_id=0)


# Per-family overrides of HF_TINY where a family's code needs more (CodeGen splits its heads into 4
# model-parallel groups: 2 heads became 0 a group, stop 52's TORCH-FAILS; its rotary dims fit a head of 8).
# Not yet run: check on the GPU machine.
HF_FAMILY = {"codegen": dict(num_attention_heads=4, rotary_dim=4)}


def hf_config(model_type, overrides):
    from transformers import AutoConfig
    overrides = dict(overrides, **HF_FAMILY.get(model_type, {}))
    cls = type(AutoConfig.for_model(model_type))
    amap = getattr(cls, "attribute_map", {}) or {}
    probe = cls()
    hierarchical = hasattr(probe, "depths")  # per-stage depths and heads: those stay, one block a stage
    kw = {}
    for k, v in overrides.items():
        name = amap.get(k, k)
        if hierarchical and k in ("num_hidden_layers", "num_attention_heads"):
            continue
        try:  # a property may refuse to be read (XLNet's max_position_embeddings) or set (Falcon's head_dim)
            cur = getattr(probe, name)
        except Exception:  # noqa: BLE001
            continue
        prop = getattr(cls, name, None)
        if isinstance(prop, property) and prop.fset is None:
            continue
        if isinstance(cur, (list, tuple, dict)) or isinstance(cur, bool):  # a per-stage list stays the family's own
            continue
        kw[name] = v
    # Dropout probabilities that the modules read as floats (an SDPA call's dropout_p) and the
    # stochastic depth rates: 0, as no_randomness() sets the dropout modules.
    for name, cur in vars(probe).items():
        if "dropout" in name or "drop_path" in name or name.endswith("_drop") or name == "drop_rate":
            if isinstance(cur, float):
                kw[name] = 0.0
            elif isinstance(cur, (list, tuple)) and all(isinstance(v, float) for v in cur):
                kw[name] = [0.0] * len(cur)
    for _ in range(len(kw) + 1):  # drop the overrides a family's validation names (Funnel's num_hidden_layers)
        try:
            cfg = cls(**kw)
            break
        except Exception as e:  # noqa: BLE001
            bad = [k for k in kw if k in str(e)]
            if not bad:
                raise
            for k in bad:
                kw.pop(k)
    for k in ("decoder_start_token_id",):  # read by the seq2seq heads (T5) whether or not the class declares it
        if k in overrides and getattr(cfg, k, None) is None:
            setattr(cfg, k, overrides[k])
    if hasattr(cfg, "depths") and isinstance(cfg.depths, (list, tuple)):
        cfg.depths = [1] * len(cfg.depths)
    cfg.num_labels = 10
    return cfg


def hf_text(model_type, seq=16):
    def build():
        from transformers import AutoModel, AutoModelForSequenceClassification
        cfg = hf_config(model_type, HF_TINY)
        try:
            m = AutoModelForSequenceClassification.from_config(cfg)
        except ValueError:  # no classification head in this family: mean of the last hidden states
            return nn.Sequential(HfLogits(AutoModel.from_config(cfg), "input_ids"), nn.Linear(cfg.hidden_size, 10))
        return HfLogits(m, "input_ids")
    def tokens():  # BOS first and EOS last: the classification heads of BART and T5 pool at EOS
        x = torch.randint(3, HF_TINY["vocab_size"], (2, seq))
        x[:, 0], x[:, -1] = HF_TINY["bos_token_id"], HF_TINY["eos_token_id"]
        return x
    return (build, seq, None, [], tokens)


def hf_image(model_type, res=64):
    def build():
        from transformers import AutoModelForImageClassification
        over = dict(HF_TINY, image_size=res, num_channels=3, hidden_size=64, intermediate_size=128)
        return HfLogits(AutoModelForImageClassification.from_config(hf_config(model_type, over)), "pixel_values")
    return (build, res)


# Audio families: raw waveforms through a convolutional feature encoder (wav2vec2 and its kin), or
# spectrogram features (Whisper's encoder, AST). Their configs shrunk where per-layer lists or input
# sizes are fixed by the family; SpecAugment's time and feature masks and LayerDrop off (random in
# training, and numpy's: no exporter keeps them).
HF_AUDIO_RAW = dict(conv_dim=[32, 32, 32], conv_kernel=[10, 3, 3], conv_stride=[5, 2, 2], num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=2, mask_time_prob=0.0, mask_feature_prob=0.0, layerdrop=0.0)


def hf_audio(model_type, samples=1600):
    features = {"whisper": (16, 32), "audio-spectrogram-transformer": (36, 26)}.get(model_type)  # the input's dims past N

    def build():
        from transformers import AutoModelForAudioClassification
        cfg = hf_config(model_type, dict(HF_TINY, num_mel_bins=16, max_source_positions=16, max_length=36))
        if model_type == "audio-spectrogram-transformer":
            cfg.num_mel_bins = 26
        if features is None:
            for k, v in HF_AUDIO_RAW.items():
                if hasattr(cfg, k):
                    setattr(cfg, k, v)
            cfg.num_feat_extract_layers = len(cfg.conv_dim)
        key = "input_values" if features is None or model_type == "audio-spectrogram-transformer" else "input_features"
        return HfLogits(AutoModelForAudioClassification.from_config(cfg), key)

    def inputs():  # Whisper's [N, mel bins, frames], AST's [N, frames, mel bins], or [N, samples]
        return torch.randn(2, *features) if features else torch.randn(2, samples)
    return (build, samples, None, [], inputs)


def timm_entry(name, res=64):
    def build():
        import timm
        try:
            return timm.create_model(name, pretrained=False, num_classes=10, img_size=res)
        except TypeError:  # a convolutional net: any size
            return timm.create_model(name, pretrained=False, num_classes=10)
    return (build, res)


def entry(name):
    """MODELS[name], or a model named by its library: timm:NAME[@RES] (timm.create_model, 10 classes,
    RES px, 64 unless given), hf:TYPE (a transformers model type as a small sequence classifier on 16
    tokens), hfimg:TYPE[@RES] (a small image classifier), hfaudio:TYPE[@SAMPLES] (a small audio
    classifier on SAMPLES samples, 1600 unless given, or its family's spectrogram features)."""
    if name in MODELS:
        return MODELS[name]
    lib, _, spec = name.partition(":")
    spec, _, res = spec.partition("@")
    if lib == "timm":
        return timm_entry(spec, int(res or 64))
    if lib == "hf":
        return hf_text(spec, int(res or 16))
    if lib == "hfimg":
        return hf_image(spec, int(res or 64))
    if lib == "hfaudio":
        return hf_audio(spec, int(res or 1600))
    raise KeyError(f"no model {name!r}: a MODELS name, timm:NAME[@RES], hf:TYPE, hfimg:TYPE[@RES] or hfaudio:TYPE[@SAMPLES]")


def no_randomness(m):
    """Every dropout and stochastic depth off: nn.Dropout*, torchvision's StochasticDepth, and the
    DropPath modules of timm and transformers (drop_prob; a random drop of a residual branch made
    PyTorch's f32 and f64 references, and ampc, each drop other samples in stop 50's sweep), and the
    rates that a forward passes to F.dropout itself (timm's GhostNet and Inception-v3 heads read
    self.drop_rate, 0.2 by default: stop 52's sweep saw their losses off by 3-7%)."""
    for mod in m.modules():
        name = type(mod).__name__
        if isinstance(mod, nn.modules.dropout._DropoutNd) or name == "StochasticDepth":
            mod.p = 0.0
        if "DropPath" in name or "StochasticDepth" in name:
            for attr in ("drop_prob", "p"):
                if isinstance(getattr(mod, attr, None), float):
                    setattr(mod, attr, 0.0)
        for attr in ("drop_rate", "drop_path_rate", "attn_drop_rate", "proj_drop_rate", "dropout_rate", "dropout_p"):
            if isinstance(getattr(mod, attr, None), float):
                setattr(mod, attr, 0.0)


def torch_steps(model, x, t, loss=None, steps=3):
    m = WithLoss(model, loss)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = m(x, t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def first_error(out):
    for line in out.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return out.strip().splitlines()[-1][:300] if out.strip() else "(no output)"


def grad_errors(model, x, t, grad_dir, loss=None, names=None, ref_dir=None):
    """Per parameter: (ampc's error, PyTorch f32's error), each against the f64 gradient, relative
    L2, over the parameters whose exact gradient is at least 1e-3 of the largest (a zero gradient,
    e.g. a bias that a BatchNorm follows, has no relative error)."""
    m64 = WithLoss(copy.deepcopy(model), loss).double()
    m64(x.double() if x.is_floating_point() else x, t).backward()
    m32 = WithLoss(copy.deepcopy(model), loss)
    m32(x, t).backward()
    p32 = dict(m32.named_parameters())
    exact = {n: p.grad.numpy() for n, p in m64.named_parameters() if p.grad is not None}
    if ref_dir:  # the f64 gradients by the initializers' names, to look into a mismatch without PyTorch
        os.makedirs(ref_dir, exist_ok=True)
        for n, g in exact.items():
            np.save(os.path.join(ref_dir, (names or {}).get(n, n) + "_grad.npy"), g.astype(np.float32))
    largest = max(np.linalg.norm(g) for g in exact.values())
    rows = {}
    for n, g in exact.items():
        f = os.path.join(grad_dir, (names or {}).get(n, n) + "_grad.npy")
        if not os.path.exists(f):
            raise RuntimeError(f"ampc --grad gave no gradient for {n}")
        got = np.load(f).astype(np.float64)
        norm = np.linalg.norm(g)
        if not np.isfinite(got).all():  # NaN would lose every comparison below and hide (stop 51's Swin V2)
            rows[n + " (non-finite)"] = (float("inf"), 0.0)
            continue
        if norm < 1e-3 * largest:
            continue
        ours = np.linalg.norm(got - g) / norm
        theirs = np.linalg.norm(p32[n].grad.double().numpy() - g) / norm
        rows[n] = (ours, theirs)
    return rows


def eager_experts(model):
    """transformers 5's mixtures of experts run their experts by a backend; PyTorch's references here
    use eager, the reference loop over the experts, which runs in f64 as in f32 (grouped_mm takes no
    f64). The export helper writes the same products with batched_mm. The stand-in
    moe_experts_backend keeps its default: its references run through its own loop."""
    for m in model.modules():
        if type(m).__module__.startswith("transformers") and callable(getattr(m, "set_experts_implementation", None)):
            m.set_experts_implementation("eager")


class Prepared:
    """A model built, run twice by PyTorch and exported: what check() and check_amp() compare."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def prepare(name, out_dir, exporter):
    """Builds NAME (dropout off, train mode) with its batch, exports it into OUT_DIR/NAME/ with its
    inputs: a Prepared, or (verdict, detail) where PyTorch or the export fails."""
    build, res, *rest = entry(name)
    lossFn = rest[0] if rest else None
    flags = rest[1] if len(rest) > 1 else []  # more ampc flags, for both the gradients and the plan
    torch.manual_seed(0)
    try:
        model = build()
        no_randomness(model)
        eager_experts(model)
        model.train()
        x = rest[2]() if len(rest) > 2 else torch.randn(2, 3, res, res)
        t = torch.randint(0, 10, (2,))
        twice = [WithLoss(copy.deepcopy(model), lossFn)(x, t).item() for _ in range(2)]
    except Exception as e:  # noqa: BLE001 (the model itself does not build or run here: nothing of ampc's)
        return "TORCH-FAILS", (str(e).splitlines() or [repr(e)])[0][:300]
    # Randomness no_randomness() missed (a dropout moves the loss by a percent or so): nothing compares.
    # Below 1e-4 it is PyTorch's own run-to-run rounding (gpt_bigcode's CPU attention: 3e-5).
    if abs(twice[0] - twice[1]) > 1e-4 * abs(twice[0]):
        return "TORCH-RANDOM", f"PyTorch's loss is {twice[0]:.6f}, then {twice[1]:.6f} on the same weights and batch"
    d = os.path.join(out_dir, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    path = os.path.join(d, name + ".onnx")
    reference = copy.deepcopy(model)  # tracing runs the forward: the running statistics move
    names = {}  # PyTorch's parameter name -> the initializer's, where the exporter renamed it
    try:
        if exporter in ("dynamo", "torchscript-helper"):  # through the helper: the graph with ampc's metadata and markers
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "export"))
            from ampc_export import export_training_graph
            names = dict(export_training_graph(WithLoss(model, lossFn), (x, t), path, dynamo=exporter == "dynamo", input_names=["x", "target"]))
        else:  # the TorchScript exporter (since PyTorch 2.9 only when asked for: dynamo=False)
            import inspect
            kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
            torch.onnx.export(WithLoss(model, lossFn), (x, t), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=["x", "target"], output_names=["loss"], **kw)
    except Exception as e:  # noqa: BLE001
        return "EXPORT-FAILS", (str(e).splitlines() or [repr(e)])[0][:300]
    np.save(os.path.join(d, "inputs", "x.npy"), x.numpy() if x.is_floating_point() else x.numpy().astype(np.int64))
    np.save(os.path.join(d, "inputs", "target.npy"), t.numpy().astype(np.int64))
    return Prepared(lossFn=lossFn, flags=flags, x=x, t=t, d=d, path=path, reference=reference, names=names)


def check(name, ampc, amprun, out_dir, exporter="torchscript", export_only=False):
    p = prepare(name, out_dir, exporter)
    if isinstance(p, tuple):
        return p
    lossFn, flags, x, t, d, path, reference, names = p.lossFn, p.flags, p.x, p.t, p.d, p.path, p.reference, p.names
    if export_only:  # the model and its batch, for tools/sweep/cuda_vs_cpu.sh
        return "EXPORTED", path
    # The first step's gradients, against f64, as accurate as PyTorch's own f32 ones.
    gdir = os.path.join(d, "grads")
    r = subprocess.run([ampc, path, "--grad", "--eval", "--inputs", os.path.join(d, "inputs"), "--outputs", gdir] + flags,
                       capture_output=True, text=True)
    if r.returncode:
        return "AMPC-REFUSES", first_error(r.stdout + r.stderr)
    # ampc's note on the export helper's ampc.custom_autograd: the model's own autograd.Functions,
    # whose backward PyTorch runs and no export keeps (transformers' YOSO).
    custom = "torch.autograd.Function subclasses" in r.stderr
    straight = "the straight-through estimator's form" in r.stderr  # ampc's note: a detach() the export dropped
    x64 = x.double() if x.is_floating_point() else x
    loss64 = WithLoss(copy.deepcopy(reference), lossFn).double()(x64, t).item()
    loss32 = WithLoss(copy.deepcopy(reference), lossFn)(x, t).item()
    lossTol = max(1e-5, 2 * abs(loss32 - loss64) / abs(loss64))  # an ill-conditioned net: PyTorch's own f32 error
    loss = float(np.load(os.path.join(gdir, "loss.npy")))
    errs = grad_errors(reference, x, t, gdir, lossFn, names, os.path.join(d, "ref"))
    np.save(os.path.join(d, "ref", "loss.npy"), np.array(loss64))
    worst = max(errs, key=lambda n: errs[n][0] / (errs[n][1] + 1e-6))
    ratio = errs[worst][0] / (errs[worst][1] + 1e-6)
    unfused = ""
    kinked = False  # the f64 run is right and the f32 run takes another side of a ReLU somewhere
    if ratio > 2 and "--no-fuse" not in flags:  # is it a fusion's? The same gradients with the graph as written
        g2 = os.path.join(d, "grads_unfused")
        r = subprocess.run([ampc, path, "--grad", "--eval", "--no-fuse", "--no-fuse-rms-norm", "--inputs", os.path.join(d, "inputs"),
                            "--outputs", g2] + flags, capture_output=True, text=True)
        if r.returncode == 0:
            e2 = grad_errors(reference, x, t, g2, lossFn, names)
            w2 = max(e2, key=lambda n: e2[n][0] / (e2[n][1] + 1e-6))
            unfused = f" [--no-fuse: worst {w2} ratio {e2[w2][0] / (e2[w2][1] + 1e-6):.2f}, loss {float(np.load(os.path.join(g2, 'loss.npy'))):.6f}]"
        # And the whole graph in f64: near 0 against PyTorch's f64, ampc's gradient graph is right and
        # its f32 error is rounding; far from it, a gradient (or the forward) is wrong.
        g3 = os.path.join(d, "grads_f64")
        r = subprocess.run([ampc, path, "--grad", "--eval", "--precision-run", "f64", "--inputs", os.path.join(d, "inputs"),
                            "--outputs", g3] + flags, capture_output=True, text=True)
        if r.returncode == 0:
            e3 = grad_errors(reference, x, t, g3, lossFn, names)
            w3 = max(e3, key=lambda n: e3[n][0])
            unfused += f" [f64 run: worst {w3} {e3[w3][0]:.1e} against f64]"
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from kinks import relu_flips
            kinks = relu_flips(ampc, path, os.path.join(d, "inputs"), d, flags) if e3[w3][0] < 1e-6 else None
            if kinks:
                unfused += f" [{kinks[0]} of {kinks[1]} ReLU inputs change sign from ampc's f64 run to its f32 one]"
                kinked = kinks[0] > 0
    # 3 SGD steps through a plan, against PyTorch's (within 1e-4, or twice PyTorch's own f32
    # drift from f64 where these tiny-batch nets are that chaotic).
    plan = os.path.join(d, name + ".ampplan")
    r = subprocess.run([ampc, path, "--precision", "fp32", "--optimizer", "sgd", "--lr", str(LR), "-o", plan] + flags,
                       capture_output=True, text=True)
    if r.returncode:
        return "AMPC-REFUSES", first_error(r.stdout + r.stderr)
    metrics = os.path.join(d, "m.jsonl")
    r = subprocess.run([amprun, plan, "--device", "cpu", "--data", os.path.join(d, "inputs"), "--steps", "3", "--log-every", "1",
                        "--metrics", metrics], capture_output=True, text=True)
    if r.returncode:
        return "AMPRUN-FAILS", first_error(r.stdout + r.stderr)
    got = [json.loads(line)["loss"] for line in open(metrics)]
    want = torch_steps(copy.deepcopy(reference), x, t, lossFn)
    exact = torch_steps(copy.deepcopy(reference).double(), x64, t, lossFn)
    drift = max(abs(a - b) / abs(b) for a, b in zip(want, exact))
    tol = max(1e-4, 2 * drift)
    rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, want))
    with open(os.path.join(d, "ref", "steps.json"), "w") as f:
        json.dump({"pytorch_f32": want, "pytorch_f64": exact, "ampc": got, "lr": LR}, f)
    # Where PyTorch's own f32 steps leave f64 by over 1%, the trajectory compares nothing (even two
    # PyTorch runs differ there): only the loss and the gradients decide.
    chaotic = drift > 1e-2
    lossOk = abs(loss - loss64) <= lossTol * abs(loss64)
    ok = lossOk and ratio <= 2 and (rel <= tol or chaotic)
    # KINK: the loss is right, the whole graph in f64 matches PyTorch's f64 gradients, and ampc's f32
    # run puts some ReLU input on the other side of 0 than its f64 run: a gradient through the kink,
    # as PyTorch's own f32 could have taken (judged by hand, not a pass).
    # CUSTOM-BACKWARD: the same, where the forward calls autograd.Functions of its own: PyTorch's
    # gradient is their backward's, ampc's the exported forward's derivative.
    verdict = "PASS" if ok else ("KINK" if lossOk and kinked else "CUSTOM-BACKWARD" if lossOk and custom else "MISMATCH")
    # EXPORT-WRONG: the loss is off, and onnxruntime, where installed, computes ampc's loss from the
    # same file: the exported graph is another function than the model's (stop 55: the dynamo
    # exporter's label smoothing and scatter_reduce(mean)). Where onnxruntime disagrees with both (its
    # inference-form BatchNorm uses the running statistics) nothing is concluded.
    if straight and verdict == "MISMATCH":
        unfused += " [ampc notes a + (b - a): a straight-through estimator whose detach() the export dropped]"
    ort = onnxruntime_loss(path, d) if not lossOk else None
    if ort is not None:
        unfused += f" [onnxruntime's loss from the same file: {ort:.6f}]"
        if abs(ort - loss) <= 1e-5 * abs(loss) and abs(ort - loss64) > lossTol * abs(loss64):
            verdict = "EXPORT-WRONG"
    return verdict, (
        f"loss {loss:.6f} (f64 {loss64:.6f}, PyTorch f32 {loss32:.6f}); worst gradient {worst}: {errs[worst][0]:.1e} vs PyTorch f32 {errs[worst][1]:.1e} "
        f"(ratio {ratio:.2f}, {len(errs)} checked); 3 steps within {rel:.1e} "
        + (f"(chaotic: PyTorch f32 leaves f64 by {drift:.1e})" if chaotic else f"(tolerance {tol:.1e})") + unfused)


def onnxruntime_loss(path, d):
    """The model file's loss on its inputs by onnxruntime (CPU), or None where it is not installed or fails."""
    try:
        import onnxruntime
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feeds = {n: np.load(os.path.join(d, "inputs", n + ".npy")) for n in names}
        return float(np.asarray(sess.run(None, feeds)[0]).reshape(-1)[0])
    except Exception:  # noqa: BLE001 (no onnxruntime, or an op it lacks: nothing concluded)
        return None


def relative_errors(got, exact):
    """(global, per-parameter) relative L2 errors of the gradients `got` against `exact` (name -> array):
    the global one over every parameter, the per-parameter ones over those whose exact gradient is at
    least 1e-3 of the largest. A non-finite gradient gives inf."""
    largest = max(np.linalg.norm(g) for g in exact.values())
    diff2 = ref2 = 0.0
    rows = {}
    for n, g in exact.items():
        e = got[n]
        if not np.isfinite(e).all():
            rows[n + " (non-finite)"] = float("inf")
            diff2 = float("inf")
            continue
        d2 = float(np.sum((e - g) ** 2))
        diff2 += d2
        ref2 += float(np.sum(g * g))
        if np.linalg.norm(g) >= 1e-3 * largest:
            rows[n] = d2 ** 0.5 / np.linalg.norm(g)
    return (diff2 / ref2) ** 0.5 if ref2 else 0.0, rows


def check_amp(name, ampc, out_dir, exporter, dtype):
    """ampc's mixed-precision loss and first-step gradients (`ampc --grad --eval --precision DTYPE`, the
    CPU backend's emulation of the plan's rounding) against f64, beside PyTorch's autocast (on CUDA where
    there is one) against the same f64 on the same weights and batch. AMP-PASS when ampc's errors are at
    most 3x PyTorch's plus a floor (1e-3 for the loss, 5e-3 for the gradients' global relative L2: bf16
    rounds to 2^-9); else AMP-CHAOTIC where PyTorch's own gradients are 30% or more off f64 (not judged),
    else AMP-WORSE, a precision policy that loses more than PyTorch's does. Neither side
    scales the loss (fp16 gradients may underflow alike)."""
    p = prepare(name, out_dir, exporter)
    if isinstance(p, tuple):
        return p
    gdir = os.path.join(p.d, "grads_" + dtype)
    r = subprocess.run([ampc, p.path, "--grad", "--eval", "--precision", dtype, "--inputs", os.path.join(p.d, "inputs"), "--outputs", gdir]
                       + p.flags, capture_output=True, text=True)
    if r.returncode:
        return "AMPC-REFUSES", first_error(r.stdout + r.stderr)
    x64 = p.x.double() if p.x.is_floating_point() else p.x
    m64 = WithLoss(copy.deepcopy(p.reference), p.lossFn).double()
    loss64 = m64(x64, p.t)
    loss64.backward()
    loss64 = loss64.item()
    exact = {n: q.grad.numpy() for n, q in m64.named_parameters() if q.grad is not None}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.allow_tf32 = False  # f32 convolutions outside autocast stay f32
    torch.backends.cuda.matmul.allow_tf32 = False
    mt = WithLoss(copy.deepcopy(p.reference), p.lossFn).to(device)
    try:
        with torch.autocast(device_type=device, dtype=getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[dtype])):
            lt = mt(p.x.to(device), p.t.to(device))
        lt.float().backward()
    except Exception as e:  # noqa: BLE001 (PyTorch's autocast itself fails: an old CPU autocast's LayerNorm)
        return "TORCH-FAILS", f"{device} autocast: " + (str(e).splitlines() or [repr(e)])[0][:300]
    theirs = {n: q.grad.double().cpu().numpy() for n, q in mt.named_parameters() if q.grad is not None}
    ours = {n: np.load(os.path.join(gdir, p.names.get(n, n) + "_grad.npy")).astype(np.float64) for n in exact}
    loss = float(np.load(os.path.join(gdir, "loss.npy")))
    for sub, grads, l in (("ref", exact, loss64), ("ref_" + dtype, theirs, lt.item())):  # to look into AMP-WORSE without PyTorch
        os.makedirs(os.path.join(p.d, sub), exist_ok=True)
        np.save(os.path.join(p.d, sub, "loss.npy"), np.array(l))
        for n, g in grads.items():
            np.save(os.path.join(p.d, sub, p.names.get(n, n) + "_grad.npy"), g.astype(np.float32))
    lossOurs, lossTheirs = abs(loss - loss64) / abs(loss64), abs(lt.item() - loss64) / abs(loss64)
    gOurs, rowsOurs = relative_errors(ours, exact)
    gTheirs, rowsTheirs = relative_errors(theirs, exact)
    worst = max(rowsOurs, key=lambda n: rowsOurs[n] / (rowsTheirs.get(n, 0.0) + 1e-3))
    ok = lossOurs <= 3 * lossTheirs + 1e-3 and gOurs <= 3 * gTheirs + 5e-3
    # Where PyTorch's own autocast gradients are 30% or more off f64 (batch-2 BatchNorm nets), the
    # rounding decides the answer and one batch judges nothing: AMP-CHAOTIC, shown, not judged.
    # A non-finite gradient of ampc's is AMP-WORSE whatever PyTorch's.
    verdict = "AMP-PASS" if ok else "AMP-CHAOTIC" if gTheirs > 0.3 and np.isfinite(gOurs) else "AMP-WORSE"
    return verdict, (
        f"{dtype} loss {loss:.6f} (f64 {loss64:.6f}, PyTorch {device} autocast {lt.item():.6f}): error {lossOurs:.1e} vs PyTorch's {lossTheirs:.1e}; "
        f"gradients {gOurs:.1e} vs {gTheirs:.1e} (global relative L2, {len(exact)} parameters); "
        f"worst against PyTorch's {worst}: {rowsOurs[worst]:.1e} vs {rowsTheirs.get(worst, float('nan')):.1e}")


def fallback_note(path):
    """"[TorchScript export: ...] " where ampc_export.py wrote PATH with the TorchScript exporter after
    the dynamo exporter failed (its metadata "ampc.export_fallback"), else ""."""
    try:
        import onnx
        for m in onnx.load(path, load_external_data=False).metadata_props:
            if m.key == "ampc.export_fallback":
                return "[TorchScript export: the dynamo exporter failed] "
    except Exception:  # noqa: BLE001 (no file: the model did not get that far)
        pass
    return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ampc", required=True)
    ap.add_argument("--amprun", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--exporter", choices=["torchscript", "dynamo", "torchscript-helper"], default="torchscript",
                    help="torchscript: torch.onnx.export as a new user calls it; dynamo: PyTorch's default exporter (2.9 and up) "
                         "through tools/export/ampc_export.py; torchscript-helper: the TorchScript exporter through it")
    ap.add_argument("--model-limit", type=int, default=0, help="seconds one model may take (0: no limit): TIMEOUT past it")
    ap.add_argument("--shard", default="", help="I/N: only the models at I, I + N, ... of the list (parallel sweeps)")
    ap.add_argument("--export-only", action="store_true", help="write each model's ONNX file and inputs (OUT/NAME/), compare nothing")
    ap.add_argument("--amp", choices=["bf16", "fp16"], default="",
                    help="check ampc's mixed-precision loss and gradients against f64 beside PyTorch's autocast (check_amp), not fp32 training")
    ap.add_argument("models", nargs="*", help="MODELS names, timm:NAME[@RES], hf:TYPE or hfimg:TYPE[@RES]")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, os.cpu_count() or 1))
    names = a.models or list(MODELS)
    if a.shard:
        i, n = (int(v) for v in a.shard.split("/"))
        names = names[i::n]
    results = {}

    def expired(*_):
        raise TimeoutError(f"over {a.model_limit} s")
    signal.signal(signal.SIGALRM, expired)
    for n in names:
        signal.alarm(a.model_limit)
        try:
            if a.amp:
                verdict, detail = check_amp(n, os.path.abspath(a.ampc), a.out, a.exporter, a.amp)
            else:
                verdict, detail = check(n, os.path.abspath(a.ampc), os.path.abspath(a.amprun), a.out, a.exporter, a.export_only)
        except TimeoutError as e:
            verdict, detail = "TIMEOUT", str(e)
        except Exception as e:  # noqa: BLE001 (one model's failure must not end the sweep)
            verdict, detail = "SWEEP-ERROR", (str(e).splitlines() or [repr(e)])[0][:300]
        signal.alarm(0)
        if a.exporter == "dynamo":  # the helper fell back to the TorchScript exporter: the verdict is that export's
            detail = fallback_note(os.path.join(a.out, n, n + ".onnx")) + detail
        results[n] = {"verdict": verdict, "detail": detail}
        print(f"{n:22s} {verdict:13s} {detail}", flush=True)
    with open(os.path.join(a.out, f"sweep{a.shard.replace('/', 'of')}.json"), "w") as f:
        json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__, "exporter": a.exporter, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
