"""How much cuDNN's algorithm choice matters for a convolutional net's training step: PyTorch eager
AMP (bf16) with torch.backends.cudnn.benchmark off (cuDNN's heuristics, as ampc's lowering chooses
today) and on (every algorithm timed). Usage: cudnn_benchmark_probe.py MODEL[@BATCH] ...
(timm names); prints one JSON line per model and setting."""
import json, sys, time
import torch, timm

def step_ms(model, x, y, opt, steps=20):
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1e3 / steps

for spec in sys.argv[1:]:
    name, _, b = spec.partition("@")
    b = int(b or 64)
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).cuda().train()
    x = torch.randn(b, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    model = model.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        print(json.dumps({"model": spec, "cudnn_benchmark": bench, "ms": round(step_ms(model, x, y, opt), 3)}), flush=True)
