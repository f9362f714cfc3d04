"""PyTorch's scaled_dot_product_attention (flash backend) at GPT-2's attention shape, timed with
CUDA events, forward and backward, causal, dropout 0 and 0.1: the attention numbers ampc's fused
kernels (tools/attn_bench) are held against; with --cudnn, PyTorch's cuDNN backend as well.
--kv-heads N: grouped-query attention (K and V with N heads, enable_gqa), as Llama's.
Each is timed per call (events around each, synchronised) and back to back (n calls between two
events).
Usage: python3 sdpa_ref.py [--b 8 --h 12 --t 1024 --d 64] [--kv-heads N] [--cudnn]"""
import argparse

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--b", type=int, default=8)
p.add_argument("--h", type=int, default=12)
p.add_argument("--t", type=int, default=1024)
p.add_argument("--d", type=int, default=64)
p.add_argument("--kv-heads", type=int, default=0, help="K/V heads (grouped-query attention); default: --h")
p.add_argument("--reps", type=int, default=20)
p.add_argument("--cudnn", action="store_true", help="also time the CUDNN_ATTENTION backend")
a = p.parse_args()
dev = "cuda"
hk = a.kv_heads or a.h
q = torch.randn(a.b, a.h, a.t, a.d, device=dev, dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(a.b, hk, a.t, a.d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
do = torch.randn(a.b, a.h, a.t, a.d, device=dev, dtype=torch.bfloat16)
flops = 4 * a.b * a.h * a.t * a.t * a.d / 2  # causal half
backends = [("flash", torch.nn.attention.SDPBackend.FLASH_ATTENTION)]
if a.cudnn:
    backends.append(("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION))
for name, backend in backends:
    for ratio in (0.0, 0.1):
        fw, bw = [], []
        try:
            with torch.nn.attention.sdpa_kernel(backend):
                for r in range(a.reps + 3):
                    e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                    e[0].record()
                    o = F.scaled_dot_product_attention(q, k, v, dropout_p=ratio, is_causal=True, enable_gqa=hk != a.h)
                    e[1].record()
                    o.backward(do)
                    e[2].record()
                    torch.cuda.synchronize()
                    if r >= 3:
                        fw.append(e[0].elapsed_time(e[1]))
                        bw.append(e[1].elapsed_time(e[2]))
                    q.grad = k.grad = v.grad = None
        except RuntimeError as err:
            print(f"torch sdpa {name} bf16 causal dropout {ratio}: not run ({str(err).splitlines()[0][:120]})")
            continue
        fw.sort(), bw.sort()
        f, b = fw[len(fw) // 2], bw[len(bw) // 2]
        print(f"torch sdpa {name} bf16 causal{' gqa' if hk != a.h else ''} dropout {ratio}: forward {f:.3f} ms ({flops / f / 1e9:.0f} TFLOP/s), "
              f"backward {b:.3f} ms ({2.5 * flops / b / 1e9:.0f} TFLOP/s)")
        # Back to back: n calls between two events with no synchronisation between them, so that the
        # host's launch time hides behind the device's (the per-call events above can include it).
        n = a.reps
        with torch.nn.attention.sdpa_kernel(backend):
            e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            torch.cuda.synchronize()
            e[0].record()
            for _ in range(n):
                o = F.scaled_dot_product_attention(q, k, v, dropout_p=ratio, is_causal=True, enable_gqa=hk != a.h)
            e[1].record()
            for _ in range(n):
                o = F.scaled_dot_product_attention(q, k, v, dropout_p=ratio, is_causal=True, enable_gqa=hk != a.h)
                o.backward(do)
                q.grad = k.grad = v.grad = None
            e[2].record()
            torch.cuda.synchronize()
        f2 = e[0].elapsed_time(e[1]) / n
        b2 = e[1].elapsed_time(e[2]) / n - f2
        print(f"torch sdpa {name} bf16 causal{' gqa' if hk != a.h else ''} dropout {ratio} back to back: forward {f2:.3f} ms "
              f"({flops / f2 / 1e9:.0f} TFLOP/s), backward {b2:.3f} ms ({2.5 * flops / b2 / 1e9:.0f} TFLOP/s)")
