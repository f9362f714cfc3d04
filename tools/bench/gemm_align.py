#!/usr/bin/env python3
"""On the GPU machine: cuBLAS (through PyTorch) bf16 GEMM time for GPT-2's lm_head shapes with the
vocabulary as exported (50257, odd) and padded to a multiple of 64 (50304). Prints one line per case:
the three GEMMs of the lm_head's forward and backward, in ms (median of 20 after 5 warm-up)."""
import torch

def timed(fn, reps=20):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]

M, K = 8192, 768
for V in (50257, 50304):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(V, K, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(M, V, device="cuda", dtype=torch.bfloat16)
    fwd = timed(lambda: x @ w.t())          # logits [M, V]
    dx = timed(lambda: g @ w)               # [M, K]
    dw = timed(lambda: g.t() @ x)           # [V, K]
    flops = 2 * M * K * V
    print(f"V={V}: logits {fwd:.3f} ms ({flops / fwd / 1e9:.0f} TFLOP/s)  dX {dx:.3f} ms  dW {dw:.3f} ms")
