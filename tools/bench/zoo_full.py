#!/usr/bin/env python3
"""Full-size real models, as a new user brings them: exported with PyTorch's default (dynamo)
exporter through tools/export/ampc_export.py, compiled by ampc at bf16 and trained by
`amprun --bench` on the GPU, beside PyTorch eager AMP bf16 (autocast) on the same model, batch and
optimizer (SGD, lr 0.01) in the same call.

    python3 tools/bench/zoo_full.py --out DIR [--models vit_s,convnext_t,...] [--steps 20]

Appends one JSON row per model to DIR/rows.jsonl as it is measured (ampc step ms and peak GiB,
torch step ms and peak GiB, or the error that stopped it) and prints a table at the end.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "export"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models", "zoo"))
from ampc_export import export_training_graph  # noqa: E402
from make_zoo import ImageLoss, LMLoss, NanoGpt  # noqa: E402  the zoo's loss wrappers and nanoGPT
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_size import measure, weight_bytes  # noqa: E402


def image(ctor, batch, size=224):
    def make():
        return ImageLoss(ctor()), {"x": torch.randn(batch, 3, size, size), "target": torch.randint(0, 1000, (batch,))}
    return make


def lm(ctor, batch, seq, vocab):
    def make():
        return LMLoss(ctor()), {"input_ids": torch.randint(0, vocab, (batch, seq)), "target": torch.randint(0, vocab, (batch, seq))}
    return make


def lm_padded(ctor, batch, seq, vocab):
    """With an attention_mask whose rows end in 0 to seq // 2 padding positions (a padding mask per
    batch, as a tokenizer gives)."""
    def make():
        mask = torch.ones(batch, seq, dtype=torch.int64)
        for b, pad in enumerate(torch.randint(0, seq // 2, (batch,)).tolist()):
            if pad:
                mask[b, seq - pad:] = 0
        return LMLoss(ctor(), with_mask=True), {"input_ids": torch.randint(0, vocab, (batch, seq)), "attention_mask": mask,
                                                "target": torch.randint(0, vocab, (batch, seq))}
    return make


def seq2seq(ctor, batch, seq, vocab):
    def make():
        return LMLoss(ctor(), seq2seq=True), {"input_ids": torch.randint(0, vocab, (batch, seq)),
                                              "decoder_input_ids": torch.randint(0, vocab, (batch, seq)),
                                              "target": torch.randint(0, vocab, (batch, seq))}
    return make


def t5_small():
    """t5-small's configuration (60M parameters; relative-position bias, trained, on every layer's
    scores). PyTorch 2.11's dynamo exporter fails on it (models/zoo/report.json): use --exporter torchscript."""
    from transformers import T5Config, T5ForConditionalGeneration
    return T5ForConditionalGeneration(T5Config(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8,
                                               dropout_rate=0.0, use_cache=False))


def timm_model(name):
    import timm

    def make():
        try:
            return timm.create_model(name, pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
        except TypeError:  # a family without stochastic depth (DenseNet)
            return timm.create_model(name, pretrained=False, drop_rate=0.0)
    return make


def bert_base():
    from transformers import BertConfig, BertForMaskedLM
    return BertForMaskedLM(BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def llama_100m():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                                        use_cache=False))


def llama_hd128():
    """A Llama-style LM with the head dim of today's Llamas: 128 (8 heads over 2 KV heads, 1024
    wide, 8 layers, MLP 2816; about 155M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                        num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=2048,
                                        use_cache=False))


def gemma_hd256():
    """A Gemma-style LM with Gemma's head dim, 256 (past ampc's kernels: cuDNN's fused SDPA runs its
    attention), multi-query (8 heads over 1 KV head), 1024 wide, 6 layers, MLP 4096, GELU-tanh."""
    from transformers import GemmaConfig, GemmaForCausalLM
    return GemmaForCausalLM(GemmaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=6,
                                        num_attention_heads=8, num_key_value_heads=1, head_dim=256, max_position_embeddings=2048,
                                        use_cache=False))


def llama_1_5b():
    """1.6B parameters (24 layers, 2048 wide, MLP 8192, 16 heads over 4 KV heads): 6.4 GB of f32
    weights, past protobuf's 2 GiB, so its ONNX file carries them as external data."""
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=1024,
                                        use_cache=False))


def gpt2_124m():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def bloom_small():
    """A BLOOM-style LM (ALiBi added by baddbmm on [B H, T, D], scores viewed as [B, H, T, T] around
    the softmax: passes/fuse_attention.cpp's reshaped form). 6 layers, 768 wide, 12 heads. Added in
    stop 49 without a GPU lent: not yet run."""
    from transformers import BloomConfig, BloomForCausalLM
    return BloomForCausalLM(BloomConfig(vocab_size=32000, hidden_size=768, n_layer=6, n_head=12, hidden_dropout=0.0,
                                        attention_dropout=0.0, use_cache=False))


def gpt_neo_125m():
    """GPT-Neo 125M's shape (12 layers, 768 wide, 12 heads; global and 256-key local attention
    alternating, unscaled scores, the mask's fill a tensor the forward creates: the dynamo export
    lifts it, stop 65)."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    return GPTNeoForCausalLM(GPTNeoConfig(vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12,
                                          attention_types=[[["global", "local"], 6]], window_size=256, max_position_embeddings=2048,
                                          embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0, use_cache=False))


def xglm_small():
    """An XGLM (12 layers, 768 wide, 12 heads, vocabulary 32000): its masked scores clamped at the
    lowest float (the fused op's score_floor, stop 65); the dynamo exporter fails on it, so the
    helper writes it with the TorchScript exporter."""
    from transformers import XGLMConfig, XGLMForCausalLM
    return XGLMForCausalLM(XGLMConfig(vocab_size=32000, d_model=768, num_layers=12, attention_heads=12, ffn_dim=3072,
                                      max_position_embeddings=2048, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                                      use_cache=False))


def deberta_v3_small():
    """deberta-v3-small's shape (6 layers, 768 wide, 12 heads, relative positions: c2p and p2c terms
    added to bmm scores on [B H, T, D], viewed as [B, H, T, T] for the padding mask). Added in stop 49
    without a GPU lent: not yet run."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    return DebertaV2ForMaskedLM(DebertaV2Config(vocab_size=32000, hidden_size=768, num_hidden_layers=6, num_attention_heads=12,
                                                intermediate_size=3072, relative_attention=True, position_buckets=256,
                                                pos_att_type=["p2c", "c2p"], max_relative_positions=-1, norm_rel_ebd="layer_norm",
                                                share_att_key=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def mixtral_moe():
    """A Mixtral-style mixture of experts (8 experts, 2 a token; 768 wide, expert MLP 2048, 8 layers, 12 heads
    over 4 KV heads; about 350M parameters, 130M active a token). transformers' default experts backend
    (grouped_mm) has no ONNX form: the export helper exports it with batched_mm (stop 60), and ampc's
    dense-experts pass computes every expert's product for every token (4x the active arithmetic)."""
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                                            num_attention_heads=12, num_key_value_heads=4, num_local_experts=8,
                                            num_experts_per_tok=2, max_position_embeddings=1024, use_cache=False))


def resnet50():
    import torchvision
    return torchvision.models.resnet50()


MODELS = {
    "vit_s": image(timm_model("vit_small_patch16_224"), 64),
    "convnext_t": image(timm_model("convnext_tiny"), 32),
    "efficientnet_b0": image(timm_model("efficientnet_b0"), 64),
    "mobilenetv3_l": image(timm_model("mobilenetv3_large_100"), 64),
    "resnet50": image(resnet50, 64),
    "bert_base": lm(bert_base, 8, 128, 30522),
    "bert_base_padded": lm_padded(bert_base, 8, 128, 30522),
    "t5_small": seq2seq(t5_small, 16, 256, 32128),
    "llama_100m": lm(llama_100m, 4, 512, 32000),
    "llama_hd128": lm(llama_hd128, 4, 1024, 32000),
    "gpt2_124m": lm(gpt2_124m, 8, 1024, 50257),
    "nanogpt": lm(NanoGpt, 8, 1024, 50304),
    "llama_1_5b": lm(llama_1_5b, 4, 512, 32000),
    "gemma_hd256_padded": lm_padded(gemma_hd256, 4, 1024, 32000),
    "llama_hd128_padded": lm_padded(llama_hd128, 4, 1024, 32000),
    "bloom_small": lm(bloom_small, 4, 512, 32000),
    "deberta_v3_small_padded": lm_padded(deberta_v3_small, 8, 128, 32000),
    "mixtral_moe": lm(mixtral_moe, 4, 512, 32000),
    "gpt_neo_125m": lm(gpt_neo_125m, 8, 1024, 50257),
    "xglm_small_padded": lm_padded(xglm_small, 8, 512, 32000),
}


def model_named(name):
    """MODELS[name], or timm:NAME[@BATCH]: any timm model at its default input size, 1000 classes
    (batch 64 unless given), for models no list names."""
    if name in MODELS:
        return MODELS[name]
    lib, _, spec = name.partition(":")
    spec, _, batch = spec.partition("@")
    if lib == "timm":
        import timm
        size = timm.create_model(spec, pretrained=False).default_cfg["input_size"][-1]
        return image(timm_model(spec), int(batch or 64), size)
    raise KeyError(f"no model {name!r}: a MODELS name or timm:NAME[@BATCH]")


def torch_amp(model, inputs, steps, compiled=False, stats=None):
    """Eager AMP bf16, or with `compiled` the same step under torch.compile (the model compiled;
    the compile happens in the 3 warm-up steps). Each step is timed on the wall clock between two
    synchronizes; the median is returned, and `stats` (a dict) gets the fastest step too: the wall
    clock of the GPU machine has read the same model up to 2x apart between calls, and the fastest
    step tells a slow call from slow steps within one."""
    model = model.cuda().train()
    fwd = torch.compile(model) if compiled else model
    args = [v.cuda() for v in inputs.values()]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(*args)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    if stats is not None:
        stats["min_ms"] = times[0]
    peak = torch.cuda.max_memory_allocated() / 2**30
    model.cpu()
    torch.cuda.empty_cache()
    return times[len(times) // 2], peak, float(loss)


def write_batch(inputs, work):
    """The batch PyTorch runs, as amprun --data reads it (one NAME.npy per graph input): both time the
    same inputs, e.g. a padded model's real padding mask, not seeded random bits."""
    import numpy as np
    d = os.path.join(work, "data")
    os.makedirs(d, exist_ok=True)
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v.detach().cpu().numpy())
    return d


def run_ampc(path, work, steps, ampc, amprun, profile=0, flags=(), data=None):
    plan = os.path.join(work, "m.ampplan")
    code, out, compile_s, rss = measure([ampc, path, "--precision", "bf16", "--optimizer", "sgd", "--lr", "0.01", *flags, "-o", plan])
    if code != 0:
        return {"ampc_error": out.strip()[-1500:], "compile_s": compile_s}
    wb = weight_bytes(path)
    files = os.path.getsize(plan) + os.path.getsize(plan + ".safetensors")
    size = {"compile_s": compile_s, "compile_rss_mib": rss / 2**20, "weights_mib": wb / 2**20, "compile_rss_x": rss / wb,
            "plan_files_mib": files / 2**20, "plan_files_x": files / wb}
    print(json.dumps(size), flush=True)
    prof = ["--profile", str(profile)] if profile else []
    source = ["--data", data] if data else ["--synthetic"]
    r = subprocess.run([amprun, plan, "--device", "cuda", *source, "--steps", str(steps), "--bench", *prof], capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        return {"ampc_error": out.strip()[-1500:], **size}
    row = {**size, "bench": out.strip()[-800:]}
    if profile:
        row["profile"] = out[out.find("profile:"):].strip()[:4000] if "profile:" in out else ""
    m = re.search(r"step time: median ([0-9.]+) ms", out)
    if m:
        row["ampc_ms"] = float(m.group(1))
    m = re.search(r"peak device memory \(measured\) ([0-9.]+) MiB", out)
    if m:
        row["ampc_peak_gib"] = float(m.group(1)) / 1024
    m = re.search(r"launches per step: ([0-9]+)", out)
    if m:
        row["ampc_launches"] = int(m.group(1))
    attention = [line.strip()[len("fused attention "):] for line in out.splitlines() if line.strip().startswith("fused attention ")]
    if attention:
        row["ampc_attention"] = attention  # the implementation each attention shape ran (amprun --attention auto)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--work", default="/tmp/ampc-full")
    ap.add_argument("--ampc", default="ampc")
    ap.add_argument("--amprun", default="amprun")
    ap.add_argument("--export-only", action="store_true", help="export the models into --work and stop (CPU only)")
    ap.add_argument("--exporter", default="dynamo", choices=["dynamo", "torchscript"])
    ap.add_argument("--no-torch", action="store_true", help="measure ampc only (compile size, step time)")
    ap.add_argument("--torch-compile", action="store_true", help="also time PyTorch AMP bf16 under torch.compile (torch_compile_ms)")
    ap.add_argument("--no-eager", action="store_true", help="with --torch-compile: time torch.compile only, not eager AMP")
    ap.add_argument("--ampc-flags", default="", help="more ampc flags (e.g. --no-fuse-elementwise), split on spaces")
    ap.add_argument("--profile", type=int, default=0, help="amprun --profile N: the N costliest ops and nodes of one step (row 'profile')")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in a.models.split(","):
        row = {"model": name}
        work = os.path.join(a.work, name)
        os.makedirs(work, exist_ok=True)
        try:
            torch.manual_seed(0)
            model, inputs = model_named(name)()
            row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
            path = os.path.join(work, name + ("" if a.exporter == "dynamo" else "_ts") + ".onnx")
            if not os.path.exists(path):  # exported by an earlier --export-only run, else now
                t0 = time.perf_counter()
                dyn = a.exporter == "dynamo"
                export_training_graph(model, tuple(inputs.values()), path, dynamo=dyn, input_names=list(inputs),
                                      external_data=True if dyn else None)
                row["export_s"] = time.perf_counter() - t0
            if a.export_only:
                print(json.dumps(row), flush=True)
                continue
            row.update(run_ampc(path, work, a.steps, a.ampc, a.amprun, a.profile, a.ampc_flags.split(), write_batch(inputs, work)))
            if not a.no_torch:
                if not (a.no_eager and a.torch_compile):
                    row["torch_ms"], row["torch_peak_gib"], row["torch_loss"] = torch_amp(model, inputs, a.steps)
                if a.torch_compile:
                    st = {}
                    row["torch_compile_ms"], row["torch_compile_peak_gib"], _ = torch_amp(model, inputs, a.steps, compiled=True, stats=st)
                    row["torch_compile_min_ms"] = st["min_ms"]
        except Exception as e:  # noqa: BLE001 - the row says what stopped it
            row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
            row["trace"] = traceback.format_exc()[-1500:]
        with open(os.path.join(a.out, "rows.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k not in ("trace", "bench", "profile")}), flush=True)
        if row.get("profile"):
            print(row["profile"], flush=True)


if __name__ == "__main__":
    main()
