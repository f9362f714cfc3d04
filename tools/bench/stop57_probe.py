"""Stop 57: losses and ops a user calls, each in a tiny model exported (TorchScript, or the dynamo exporter
with `dynamo`) and read by `ampc --grad`: which exporter refuses what, and what ampc refuses.
Usage: stop57_probe.py AMPC [dynamo]"""
import torch, torch.nn as nn, torch.nn.functional as F, subprocess, sys, warnings
warnings.filterwarnings("ignore")
torch.manual_seed(0)
lin = nn.Linear(8, 6)
cases = {
 "gumbel_hard": lambda x: F.gumbel_softmax(lin(x), tau=0.5, hard=True).pow(2).sum(),
 "ctc": lambda x: F.ctc_loss(lin(x).view(4, 2, 6).log_softmax(-1), torch.tensor([[1, 2], [3, 1]]), torch.tensor([4, 4]), torch.tensor([2, 2])),
 "unique": lambda x: lin(x)[:, torch.unique(torch.tensor([0, 2, 2, 5]))].sum(),
 "repeat_interleave": lambda x: lin(x).repeat_interleave(torch.tensor([1, 2, 1, 1, 2, 1, 1, 1]), 0).sum(),
 "bucketize": lambda x: (lin(x) * torch.bucketize(x[:, :6], torch.tensor([-0.5, 0.0, 0.5]))).sum(),
 "inv": lambda x: torch.linalg.inv(lin(x)[:6] + 3 * torch.eye(6)).sum(),
 "kl_div": lambda x: F.kl_div(lin(x).log_softmax(-1), torch.full((8, 6), 1 / 6), reduction="batchmean"),
 "triplet": lambda x: F.triplet_margin_loss(lin(x)[:2], lin(x)[2:4], lin(x)[4:6]),
 "cos_embed": lambda x: F.cosine_embedding_loss(lin(x)[:4], lin(x)[4:], torch.tensor([1, -1, 1, -1])),
 "multilabel_soft": lambda x: F.multilabel_soft_margin_loss(lin(x), (x[:, :6] > 0).float()),
 "poisson": lambda x: F.poisson_nll_loss(lin(x), x[:, :6].abs()),
 "huber": lambda x: F.huber_loss(lin(x), x[:, :6], delta=0.5),
 "multi_margin": lambda x: F.multi_margin_loss(lin(x), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1])),
 "hinge_embed": lambda x: F.hinge_embedding_loss(lin(x), torch.ones(8, 6)),
 "logdet": lambda x: torch.logdet(lin(x)[:6] @ lin(x)[:6].T + torch.eye(6)),
 "cholesky": lambda x: torch.linalg.cholesky(lin(x)[:6] @ lin(x)[:6].T + torch.eye(6)).sum(),
 "cumsum_rev": lambda x: lin(x).flip(0).cumsum(0).flip(0).sum(),
 "nan_to_num": lambda x: torch.nan_to_num(lin(x).log()).sum(),
 "std_mean": lambda x: lin(x).std(0).sum() + lin(x).var(1, unbiased=False).sum(),
 "lerp": lambda x: torch.lerp(lin(x), x[:, :6], 0.3).sum(),
 "clamp_tensor": lambda x: torch.clamp(lin(x), min=x[:, :6] * 0.1, max=x[:, :6].abs() + 0.5).sum(),
}
class M(nn.Module):
    def __init__(s, f): super().__init__(); s.lin = lin; s.f = f
    def forward(s, x): return s.f(x)
dynamo = len(sys.argv) > 2 and sys.argv[2] == "dynamo"
for name, f in cases.items():
    path = f"/tmp/probe_{name}.onnx"
    try:
        if dynamo:
            torch.onnx.export(M(f), (torch.randn(8, 8),), path, dynamo=True, optimize=False)
        else:
            torch.onnx.export(M(f), (torch.randn(8, 8),), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    except Exception as e:
        print(f"{name:18s} EXPORT-FAILS {str(e).splitlines()[0][:120]}"); continue
    r = subprocess.run([sys.argv[1], path, "--grad", "-o", f"/tmp/probe_{name}.grad.onnx"], capture_output=True, text=True)
    print(f"{name:18s} {'ampc ok' if r.returncode == 0 else 'AMPC: ' + (r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
