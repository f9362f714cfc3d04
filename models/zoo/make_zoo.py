#!/usr/bin/env python3
"""The model-zoo conformance suite: small configurations of real architectures (timm,
torchvision-style, Hugging Face transformers), exported by PyTorch >= 2.9 with both of its
exporters, with PyTorch's own reference numbers on the same weights and batch.

    python3 models/zoo/make_zoo.py OUTDIR [FAMILY...]      # run where torch, timm, transformers are

For each family it writes, under OUTDIR/FAMILY/:
    FAMILY.dynamo.onnx, FAMILY.torchscript.onnx   (an exporter that fails is named in report.json)
    inputs/NAME.npy        the batch (graph input names)
    grads64/PARAM.npy      the same in f64 (the exact reference; --grads64-only ZOO FAMILY... adds it to an
                           existing folder from its export's weights)
    grads/PARAM.npy        torch.autograd's fp32 gradients on the initial weights (CPU), by
                           named_parameters() name; the .onnx files' "ampc.trainable" key lists
                           the initializer each parameter became
    ref.json               {"loss0": fp32 loss, "sgd_lr": lr, "sgd_fp32": [3 losses, CPU],
                            "sgd_fp64": [the same 3 steps in f64], "fp32_20": [20 fp32 losses],
                            "amp_fp16": {"loss": [20], "skipped": [20]}, "amp_bf16": {...},
                            "names": {exporter: {parameter: initializer}}}
                           (fp32_20 and AMP on CUDA when present, TF32 off; AMP is autocast,
                           with GradScaler at fp16)
                           --amp-refs ZOO [FAMILY...] adds amp_grad_err, amp_fp16_cpu and amp_bf16_cpu (see amp_refs)
                           --amp-lr ZOO [FAMILY...] picks amp_lr, the learning rate of the 20-step AMP
                           references, and remakes them at it (see amp_lr)
OUTDIR/report.json says what exported and what failed, with the error.
Every dropout probability is 0 and stochastic depth is off: masks cannot match across
frameworks.
"""
import copy
import json
import os
import sys
import traceback

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "export"))
from ampc_export import export_training_graph  # noqa: E402

SGD_LR = 0.005  # small enough that 20 steps on one batch do not memorise it (losses stay comparable)
AMP_STEPS = 20
# The learning rates amp_lr() tries for the 20-step AMP references, largest first, and how closely
# PyTorch's own AMP runs must agree at one of them (see amp_lr).
AMP_LRS = (0.005, 0.002, 0.001, 0.0005, 0.0002)
AMP_AGREE = 0.02


class ImageLoss(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        return F.cross_entropy(self.model(x), target)


class LMLoss(nn.Module):
    """Token-level cross-entropy over an HF model's logits (no shift: targets are given)."""

    def __init__(self, model, with_mask=False, seq2seq=False):
        super().__init__()
        self.model = model
        self.with_mask = with_mask
        self.seq2seq = seq2seq

    def forward(self, input_ids, *rest):
        if self.seq2seq:
            decoder_input_ids, target = rest
            logits = self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
        elif self.with_mask:
            attention_mask, target = rest
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        else:
            (target,) = rest
            logits = self.model(input_ids=input_ids).logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def images(g, n, c, h, classes=10):
    return {"x": torch.randn(n, c, h, h, generator=g), "target": torch.randint(0, classes, (n,), generator=g)}


def tokens(g, n, t, vocab, mask=False, dec=False):
    d = {"input_ids": torch.randint(0, vocab, (n, t), generator=g)}
    if mask:
        m = torch.ones(n, t, dtype=torch.int64)
        m[-1, t - t // 4:] = 0  # the last sample is padded
        d["attention_mask"] = m
    if dec:
        d["decoder_input_ids"] = torch.randint(0, vocab, (n, t), generator=g)
    d["target"] = torch.randint(0, vocab, (n, t), generator=g)
    return d


# ---- families: name -> () -> (module with loss, inputs dict)

def vit():
    from timm.models.vision_transformer import VisionTransformer
    m = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3, mlp_ratio=2.0,
                          num_classes=10, drop_rate=0.0, drop_path_rate=0.0)
    return ImageLoss(m), lambda g: images(g, 8, 3, 32)


def convnext():
    from timm.models.convnext import ConvNeXt
    m = ConvNeXt(depths=(1, 1, 1, 1), dims=(16, 24, 32, 48), num_classes=10, ls_init_value=0.1, drop_path_rate=0.0)
    return ImageLoss(m), lambda g: images(g, 8, 3, 64)


def efficientnet():
    from timm.models.efficientnet import _gen_efficientnet
    m = _gen_efficientnet("efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.34, pretrained=False,
                          num_classes=10, drop_rate=0.0, drop_path_rate=0.0)
    return ImageLoss(m), lambda g: images(g, 8, 3, 64)


def mobilenetv3():
    from timm.models.mobilenetv3 import _gen_mobilenet_v3
    m = _gen_mobilenet_v3("mobilenetv3_large_100", channel_multiplier=0.25, pretrained=False, num_classes=10,
                          drop_rate=0.0, drop_path_rate=0.0)
    return ImageLoss(m), lambda g: images(g, 8, 3, 64)


def resnet_timm():
    from timm.models.resnet import ResNet, BasicBlock
    m = ResNet(BasicBlock, (1, 1, 1, 1), channels=(8, 16, 32, 64), stem_width=16, num_classes=10)
    return ImageLoss(m), lambda g: images(g, 8, 3, 64)


def resnet_tv():
    """torchvision's ResNet class and blocks, narrowed: the same ops as resnet50 (Bottleneck)."""
    import torchvision.models.resnet as R
    m = R.ResNet(R.Bottleneck, [1, 1, 1, 1], num_classes=10)
    # Narrow every conv and norm of the stock class to a fraction of its channels: same graph, few weights.
    return ImageLoss(_narrow_resnet(m)), lambda g: images(g, 8, 3, 64)


def _narrow_resnet(m, div=8):
    import torchvision.models.resnet as R

    def conv(c):
        return nn.Conv2d(3 if c.in_channels == 3 else c.in_channels // div, c.out_channels // div, c.kernel_size,
                         c.stride, c.padding, bias=c.bias is not None)
    for mod in list(m.modules()):
        for name, ch in list(mod.named_children()):
            if isinstance(ch, nn.Conv2d):
                setattr(mod, name, conv(ch))
            elif isinstance(ch, nn.BatchNorm2d):
                setattr(mod, name, nn.BatchNorm2d(ch.num_features // div))
    m.fc = nn.Linear(m.fc.in_features // div, 10)
    return m


def bert():
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return LMLoss(BertForMaskedLM(cfg), with_mask=True), lambda g: tokens(g, 2, 16, 96, mask=True)


def distilbert():
    from transformers import DistilBertConfig, DistilBertForMaskedLM
    cfg = DistilBertConfig(vocab_size=96, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32,
                           dropout=0.0, attention_dropout=0.0)
    return LMLoss(DistilBertForMaskedLM(cfg), with_mask=True), lambda g: tokens(g, 2, 16, 96, mask=True)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, use_cache=False)
    return LMLoss(GPT2LMHeadModel(cfg)), lambda g: tokens(g, 2, 16, 96)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=32, use_cache=False)
    return LMLoss(LlamaForCausalLM(cfg)), lambda g: tokens(g, 2, 16, 96)


def gemma():
    """Gemma-style: multi-query attention (4 heads over 1 K/V head), GELU-tanh MLP, a padded batch
    (transformers builds the causal-and-padding mask in the step; the loss reads every position, the
    padded ones too)."""
    from transformers import GemmaConfig, GemmaForCausalLM
    cfg = GemmaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=32, use_cache=False)
    return LMLoss(GemmaForCausalLM(cfg), with_mask=True), lambda g: tokens(g, 2, 16, 96, mask=True)


def qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=32, use_cache=False)
    return LMLoss(Qwen2ForCausalLM(cfg)), lambda g: tokens(g, 2, 16, 96)


def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                   dropout_rate=0.0, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                   use_cache=False, decoder_start_token_id=0)
    return LMLoss(T5ForConditionalGeneration(cfg), seq2seq=True), lambda g: tokens(g, 2, 16, 96, dec=True)


class NanoGpt(nn.Module):
    """A GPT written by hand as nanoGPT (and many user models) writes it: q, k, v split from one
    projection, (q @ k^T) * d^-1/2, masked_fill of a causal buffer with -inf, softmax, attention
    dropout, @ v. Its attention reaches ONNX as Where(mask, -inf, scores) rather than an Add."""

    def __init__(self, vocab=50304, n_layer=6, n_head=12, n_embd=768, block=1024, dropout=0.1):
        super().__init__()
        self.n_head = n_head
        self.attn_drop = nn.Dropout(dropout)
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList()
        for _ in range(n_layer):
            b = nn.Module()
            b.ln1, b.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            b.attn, b.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
            b.fc, b.out = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)
            self.blocks.append(b)
        self.ln_f, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, input_ids):
        import types
        B, T = input_ids.shape
        x = self.wte(input_ids) + self.wpe(torch.arange(T, device=input_ids.device))
        for b in self.blocks:
            q, k, v = b.attn(b.ln1(x)).split(x.shape[-1], dim=2)
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.shape[-1] ** 0.5))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = self.attn_drop(F.softmax(att, dim=-1))
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, -1)
            x = x + b.proj(y)
            x = x + b.out(F.gelu(b.fc(b.ln2(x))))
        return types.SimpleNamespace(logits=self.head(self.ln_f(x)))


def nanogpt():
    """A hand-written GPT (nanoGPT's attention: masked_fill of a causal buffer with -inf)."""
    return LMLoss(NanoGpt(vocab=96, n_layer=2, n_head=2, n_embd=32, block=32, dropout=0.0)), lambda g: tokens(g, 2, 16, 96)


# Architectures beyond the list: the suite is for the class, not for a list.
def mixer():
    from timm.models.mlp_mixer import MlpMixer
    m = MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=32, drop_rate=0.0, drop_path_rate=0.0)
    return ImageLoss(m), lambda g: images(g, 8, 3, 32)


def mobilenetv2_tv():
    import torchvision
    m = torchvision.models.mobilenet_v2(num_classes=10, width_mult=0.25)
    zero_dropout(m)
    return ImageLoss(m), lambda g: images(g, 8, 3, 64)


def roberta():
    from transformers import RobertaConfig, RobertaForMaskedLM
    cfg = RobertaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        pad_token_id=1)
    return LMLoss(RobertaForMaskedLM(cfg), with_mask=True), lambda g: tokens(g, 2, 16, 96, mask=True)


class TinyUNet(nn.Module):
    """A small encoder-decoder of the image-to-image kind (segmentation, diffusion): GroupNorm and
    SiLU, a strided conv down, spatial self-attention written with torch.einsum, ConvTranspose2d
    (grouped, with output_padding) and F.interpolate (bilinear and nearest) back up, a skip
    connection; pooled to class logits so that it trains with the zoo's cross-entropy."""

    def __init__(self, classes=10):
        super().__init__()
        self.inp = nn.Conv2d(3, 8, 3, padding=1)
        self.norm1 = nn.GroupNorm(2, 8)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.norm2 = nn.GroupNorm(4, 16)
        self.qkv = nn.Conv2d(16, 48, 1)
        self.up = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up2 = nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1)
        self.out = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Linear(8, classes)

    def forward(self, x):
        h = F.silu(self.norm1(self.inp(x)))                       # [n, 8, 16, 16]
        d = F.silu(self.norm2(self.down(h)))                      # [n, 16, 8, 8]
        q, k, v = self.qkv(d).flatten(2).chunk(3, dim=1)          # [n, 16, 64] each
        a = torch.softmax(torch.einsum("bcn,bcm->bnm", q, k) / 4.0, dim=-1)
        d = d + torch.einsum("bnm,bcm->bcn", a, v).reshape(d.shape)
        u = self.up(d)                                            # [n, 8, 16, 16]
        u = u + F.interpolate(d[:, :8], scale_factor=2, mode="bilinear", align_corners=False)
        u = torch.cat([u, F.interpolate(h[:, :, ::2, ::2], scale_factor=2, mode="nearest")], dim=1)
        y = F.silu(self.out(u))                                   # [n, 8, 16, 16]
        y = self.up2(y)                                           # [n, 8, 32, 32]
        return self.head(y.mean(dim=(2, 3)))


def unet():
    return ImageLoss(TinyUNet()), lambda g: images(g, 4, 3, 16)


FAMILIES = {
    "vit": vit, "convnext": convnext, "efficientnet": efficientnet, "mobilenetv3": mobilenetv3,
    "resnet_timm": resnet_timm, "resnet_tv": resnet_tv, "bert": bert, "distilbert": distilbert,
    "gpt2": gpt2, "llama": llama, "gemma": gemma, "qwen2": qwen2, "t5": t5, "nanogpt": nanogpt,
    "mixer": mixer, "mobilenetv2_tv": mobilenetv2_tv, "roberta": roberta, "unet": unet,
}


def zero_dropout(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def sgd_losses(model, inputs, steps, device, amp=None, lr=SGD_LR):
    """Plain SGD at lr on one batch; the loss before each update (and whether it was skipped)."""
    model = copy.deepcopy(model).to(device)
    args = [v.to(device) for v in inputs.values()]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device) if amp == torch.float16 else None
    losses, skipped = [], []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if amp is None:
            loss = model(*args)
        else:
            with torch.autocast(device, dtype=amp):
                loss = model(*args)
        losses.append(float(loss.detach().float()))
        if scaler is None:
            loss.backward()
            opt.step()
            skipped.append(0)
        else:
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped.append(int(scaler.get_scale() < before))
    return losses, skipped


def f64_copy(model):
    """The model in f64, with the epsilons the f32 graph holds (f32-rounded)."""
    m = copy.deepcopy(model)
    for mod in m.modules():
        if hasattr(mod, "eps") and isinstance(mod.eps, float):
            mod.eps = float(np.float32(mod.eps))
    return m.double()


def write_grads64(model, inputs, d):
    """grads64/PARAM.npy: the gradients in f64 on the same weights and batch (the exact reference:
    PyTorch's own f32 gradients of an ill-conditioned model are off by up to a few percent)."""
    m = f64_copy(model)
    m(*[v.double() if v.is_floating_point() else v for v in inputs.values()]).backward()
    os.makedirs(os.path.join(d, "grads64"), exist_ok=True)
    for pname, p in m.named_parameters():
        if p.grad is not None:
            np.save(os.path.join(d, "grads64", pname + ".npy"), p.grad.numpy())


def rebuild(name, zoo):
    """The family's model with the weights of its committed export (no exporter run), its batch and
    its ref.json; exits when the rebuilt model's loss is not the reference's."""
    import onnx
    from onnx import numpy_helper
    torch.manual_seed(0)
    model, make_inputs = FAMILIES[name]()
    zero_dropout(model)
    model.train()
    d = os.path.join(zoo, name)
    ref = json.load(open(os.path.join(d, "ref.json")))
    exporter = "torchscript" if os.path.exists(os.path.join(d, f"{name}.torchscript.onnx")) else "dynamo"
    proto = onnx.load(os.path.join(d, f"{name}.{exporter}.onnx"))
    w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in proto.graph.initializer}
    for param, init in ref.get("names", {}).get(exporter, {}).items():  # a parameter the exporter renamed (a tied weight)
        if init in w:
            w.setdefault(param, w[init])
    state = model.state_dict()
    missing = [k for k, v in model.named_parameters() if k not in w]
    if missing:
        sys.exit(f"{name}: the {exporter} export has no initializer for {missing[:5]}")
    model.load_state_dict({k: v for k, v in w.items() if k in state}, strict=False)
    order = list(make_inputs(torch.Generator().manual_seed(1234)))  # the forward's argument order
    inputs = {k: torch.from_numpy(np.load(os.path.join(d, "inputs", k + ".npy"))) for k in order}
    loss = model(*inputs.values())
    if abs(float(loss) - ref["loss0"]) > 1e-4 * abs(ref["loss0"]):
        sys.exit(f"{name}: rebuilt model's loss {float(loss)} is not the reference's {ref['loss0']}")
    return model, inputs, ref, d


def grads64_only(name, zoo):
    """Adds grads64/ to an existing zoo folder, weights from its export (no exporter run)."""
    model, inputs, _, d = rebuild(name, zoo)
    write_grads64(model, inputs, d)
    print(f"{name}: wrote grads64")


def grad_error(grads, d):
    """The median, over the parameters whose reference gradient is at least 1e-2 of the largest
    (in L2), of |g - ref| / |ref|, against the folder's reference gradients (grads64/ where present,
    else grads/): the measure tests/e2e/zoo_test.cpp applies to ampc's mixed-precision gradients.
    A gradient that is 0 in exact arithmetic (a bias before a norm, a zero-initialised head's inputs)
    is rounding noise in any precision and is left out."""
    refdir = os.path.join(d, "grads64") if os.path.isdir(os.path.join(d, "grads64")) else os.path.join(d, "grads")
    refs = {f[:-4]: np.load(os.path.join(refdir, f)).astype(np.float64) for f in os.listdir(refdir)}
    largest = max(np.linalg.norm(r) for r in refs.values())
    errs = [np.linalg.norm(grads[k].astype(np.float64) - r) / np.linalg.norm(r)
            for k, r in refs.items() if np.linalg.norm(r) >= 1e-2 * largest]
    return float(np.median(errs))


def amp_grads(model, inputs, device, amp, scale):
    """The first step's parameter gradients under autocast (the loss times scale, unscaled in f32)."""
    m = copy.deepcopy(model).to(device)
    args = [v.to(device) for v in inputs.values()]
    with torch.autocast(device, dtype=amp):
        loss = m(*args)
    (loss.float() * scale).backward()
    return {k: (p.grad.float() / scale).cpu().numpy() for k, p in m.named_parameters() if p.grad is not None}


def amp_refs(name, zoo):
    """Adds to an existing zoo folder's ref.json what the mixed-precision test compares against
    besides PyTorch's CUDA AMP trajectory (run on the GPU machine, TF32 off):
      amp_grad_err: {fp16, bf16}: the first step's AMP gradients' error (grad_error) on CUDA, fp16
                    at the first loss scale PyTorch's GradScaler kept;
      amp_fp16_cpu, amp_bf16_cpu: {"loss", "skipped"}: 20 steps of CPU autocast, a second implementation
                    of the same AMP semantics (oneDNN rather than cuDNN/cuBLAS): where the two
                    implementations part by more than 5%, no third can be held to 5% of either."""
    model, inputs, ref, d = rebuild(name, zoo)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    errs = {"fp32": grad_error(fp32_grads(model, inputs, dev), d)}
    lead = next((i for i, s in enumerate(ref["amp_fp16"]["skipped"]) if not s), 0)
    for key, dt, scale in (("fp16", torch.float16, 65536.0 / 2 ** lead), ("bf16", torch.bfloat16, 1.0)):
        try:
            errs[key] = grad_error(amp_grads(model, inputs, dev, dt, scale), d)
        except Exception as e:  # noqa: BLE001 - CPU autocast without fp16 (PyTorch < 2.4)
            errs[key + "_error"] = str(e)[:300]
    ref["amp_grad_err"] = errs
    ref["amp_grad_err"]["device"] = dev
    for key, dt in (("amp_fp16_cpu", torch.float16), ("amp_bf16_cpu", torch.bfloat16)):
        with torch.autocast("cpu", dtype=dt):  # an old PyTorch disables CPU autocast at fp16 with a warning
            if (torch.ones(2, 2) @ torch.ones(2, 2)).dtype != dt:
                ref[key] = {"error": f"this PyTorch's CPU autocast does not run {dt}"}
                continue
        try:
            l, s = sgd_losses(model, inputs, AMP_STEPS, "cpu", dt)
            ref[key] = {"loss": l, "skipped": s, "device": "cpu"}
        except Exception as e:  # noqa: BLE001 - an op CPU autocast lacks at this dtype
            ref[key] = {"error": str(e)[:500]}
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{name}: gradient error {errs}; "
          f"CPU bf16 {[round(x, 4) for x in ref['amp_bf16_cpu'].get('loss', [])]}", flush=True)


def amp_spread(amp, skipped, fp32, other):
    """How far an AMP run strays: the largest relative difference, over the steps, from the fp32 run
    (a step the scaler skipped repeats the loss before it, so step i meets the fp32 loss after the
    updates actually made) and from the other implementation's run at the same step."""
    worst, done = 0.0, 0
    for i, x in enumerate(amp):
        done += i > 0 and not skipped[i - 1]
        worst = max(worst, abs(x - fp32[min(done, len(fp32) - 1)]) / abs(fp32[min(done, len(fp32) - 1)]))
        if i < len(other):
            worst = max(worst, abs(other[i] - x) / abs(x))
    return worst


def amp_lr(name, zoo):
    """Picks amp_lr, the learning rate of the 20-step AMP references, and remakes them at it
    (fp32_20, amp_fp16, amp_bf16 on CUDA, amp_fp16_cpu, amp_bf16_cpu; TF32 off).

    The zoo test holds ampc's AMP losses to 5% of PyTorch AMP's at every step. That asks something
    of the reference: a trajectory where two implementations of the same AMP semantics (PyTorch's
    CUDA autocast and its CPU autocast) agree, and AMP tracks fp32. One batch at a large learning
    rate is chaotic on some nets (BatchNorm over 8 samples x 2 x 2 at the last stage: EfficientNet's
    loss falls from 2.77 to 0.85 in one step at 0.005, and bf16 rounding alone moves step 2 by 10%).
    So amp_lr is the largest of AMP_LRS at which every PyTorch AMP run, fp16 and bf16, stays within
    AMP_AGREE of its fp32 run and of the other device's run at every step; where none does, the one
    where they agree best (bf16's rounding alone keeps some BatchNorm nets a few percent apart at
    any learning rate; the test's horizon then says how far the comparison holds). amp_lr_search
    records the spread of the fp16 and bf16 runs at each learning rate tried."""
    model, inputs, ref, d = rebuild(name, zoo)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev != "cuda":
        sys.exit("--amp-lr needs a GPU: the references are PyTorch's CUDA AMP")
    tried, made = {}, {}
    for lr in AMP_LRS:
        runs = {"fp32_20": sgd_losses(model, inputs, AMP_STEPS, dev, lr=lr)[0]}
        spread = {}
        for key, dt in (("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)):
            l, s = sgd_losses(model, inputs, AMP_STEPS, dev, dt, lr)
            lc, sc = sgd_losses(model, inputs, AMP_STEPS, "cpu", dt, lr)
            runs[key] = {"loss": l, "skipped": s, "device": dev}
            runs[key + "_cpu"] = {"loss": lc, "skipped": sc, "device": "cpu"}
            spread[key[4:]] = round(max(amp_spread(l, s, runs["fp32_20"], lc), amp_spread(lc, sc, runs["fp32_20"], [])), 5)
        tried[str(lr)], made[lr] = spread, runs
        if max(spread.values()) <= AMP_AGREE:
            break
    else:  # none agrees to AMP_AGREE: the one that agrees best
        lr = min(made, key=lambda x: max(tried[str(x)].values()))
    ref.update(made[lr])
    ref["amp_lr"] = lr
    ref["amp_lr_search"] = tried
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print(f"{name}: amp_lr {lr}; PyTorch AMP's spread at each learning rate tried {tried}", flush=True)


def fp32_grads(model, inputs, device):
    m = copy.deepcopy(model).to(device)
    m(*[v.to(device) for v in inputs.values()]).backward()
    return {k: p.grad.cpu().numpy() for k, p in m.named_parameters() if p.grad is not None}


def make(name, out, report):
    torch.manual_seed(0)
    model, make_inputs = FAMILIES[name]()
    zero_dropout(model)
    model.train()
    g = torch.Generator().manual_seed(1234)
    inputs = make_inputs(g)
    d = os.path.join(out, name)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    for k, v in inputs.items():
        np.save(os.path.join(d, "inputs", k + ".npy"), v.numpy())
    nparams = sum(p.numel() for p in model.parameters())
    rep = {"params": nparams, "inputs": list(inputs)}
    args = tuple(inputs.values())
    init = copy.deepcopy(model.state_dict())
    for exporter in ("dynamo", "torchscript"):
        path = os.path.join(d, f"{name}.{exporter}.onnx")
        try:
            pairs = export_training_graph(model, args, path, dynamo=exporter == "dynamo", input_names=list(inputs))
            rep.setdefault("names", {})[exporter] = dict(pairs)
            model.load_state_dict(init)
            import onnx
            p = onnx.load(path)
            ops = sorted({(n.domain + "::" if n.domain else "") + n.op_type for n in p.graph.node})
            rep[exporter] = {"ok": True, "bytes": os.path.getsize(path), "opset": [(o.domain, o.version) for o in p.opset_import],
                             "ops": ops, "functions": [f.name for f in p.functions],
                             "outputs": [o.name for o in p.graph.output], "trainable": len(pairs),
                             "initializers": len(p.graph.initializer)}
        except Exception as e:  # noqa: BLE001 - the report names the failure
            model.load_state_dict(init)
            rep[exporter] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:2000]}",
                             "trace": traceback.format_exc()[-3000:]}
            if os.path.exists(path):
                os.remove(path)
    # References on the initial weights.
    m = copy.deepcopy(model)
    loss = m(*args)
    loss.backward()
    os.makedirs(os.path.join(d, "grads"), exist_ok=True)
    for pname, p in m.named_parameters():
        if p.grad is not None:
            np.save(os.path.join(d, "grads", pname + ".npy"), p.grad.numpy().astype(np.float32))
    write_grads64(model, inputs, d)
    ref = {"loss0": float(loss), "sgd_lr": SGD_LR}
    ref["sgd_fp32"], _ = sgd_losses(model, inputs, 3, "cpu")
    ref["fp32_20_device"] = "cuda" if torch.cuda.is_available() else "cpu"
    # The same in f64 (epsilons as the f32 graph holds them): how far apart two correct f32 runs may drift.
    in64 = {k: (v.double() if v.is_floating_point() else v) for k, v in inputs.items()}
    try:
        ref["sgd_fp64"], _ = sgd_losses(f64_copy(model), in64, 3, "cpu")
    except Exception as e:  # noqa: BLE001 - a model whose code forces f32 somewhere
        ref["sgd_fp64_error"] = str(e)[:300]
    ref["names"] = rep.get("names", {})
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    # PyTorch's own fp32 over the AMP runs' 20 steps, TF32 off: how far its AMP strays from fp32
    # (past that horizon the trajectory is too sensitive for any two AMP runs to agree).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ref["fp32_20"], _ = sgd_losses(model, inputs, AMP_STEPS, dev)
    for key, dt in (("amp_fp16", torch.float16), ("amp_bf16", torch.bfloat16)):
        if dev == "cpu" and dt == torch.float16:
            continue
        try:
            l, s = sgd_losses(model, inputs, AMP_STEPS, dev, dt)
            ref[key] = {"loss": l, "skipped": s, "device": dev}
        except Exception as e:  # noqa: BLE001
            ref[key] = {"error": str(e)[:500]}
    with open(os.path.join(d, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)
    if dev == "cuda" and (rep["dynamo"]["ok"] or rep["torchscript"]["ok"]):
        try:
            amp_lr(name, out)  # the AMP references at a learning rate where PyTorch's own AMP runs agree
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the report names it; the AMP refs stay at SGD_LR
            rep["amp_lr_error"] = str(e)[:500]
    rep["loss0"] = ref["loss0"]
    report[name] = rep
    print(f"{name}: {nparams} params, loss {ref['loss0']:.6f}, dynamo {rep['dynamo']['ok']}, "
          f"torchscript {rep['torchscript']['ok']}", flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    modes = {"--grads64-only": grads64_only, "--amp-refs": amp_refs, "--amp-lr": amp_lr}
    if sys.argv[1] in modes:
        for name in sys.argv[3:] or [n for n in FAMILIES if os.path.exists(os.path.join(sys.argv[2], n, "ref.json"))]:
            modes[sys.argv[1]](name, sys.argv[2])
        return
    out = sys.argv[1]
    names = sys.argv[2:] or list(FAMILIES)
    os.makedirs(out, exist_ok=True)
    report = {"torch": torch.__version__}
    try:
        import timm, transformers, onnx  # noqa: E401
        report.update(timm=timm.__version__, transformers=transformers.__version__, onnx=onnx.__version__)
        import onnxscript
        report["onnxscript"] = onnxscript.__version__
    except Exception as e:  # noqa: BLE001
        report["versions_error"] = str(e)
    for name in names:
        try:
            make(name, out, report)
        except Exception as e:  # noqa: BLE001
            report[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            print(f"{name}: FAILED {e}", flush=True)
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
