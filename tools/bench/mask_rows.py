"""Counts the query rows that a zoo_full model's attention masks leave with no key (every entry
masked), as the model builds its masks for SDPA in eager PyTorch: python3 mask_rows.py MODEL."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from zoo_full import MODELS  # noqa: E402


def main():
    import transformers
    model, inputs = MODELS[sys.argv[1]]()
    seen = []

    def spy(q, k, v, attn_mask=None, **kw):
        m = attn_mask
        if m is not None and not seen:
            empty = (~m).all(-1) if m.dtype == torch.bool else (m <= torch.finfo(m.dtype).min / 2).all(-1)
            seen.append(m)
            print(f"transformers {transformers.__version__}: mask {m.dtype} {list(m.shape)}, min {m.min().item() if m.dtype != torch.bool else '-'}; "
                  f"rows with no key: {int(empty.sum())} of {empty.numel()}")
        return orig(q, k, v, attn_mask=attn_mask, **kw)

    orig = F.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = spy
    with torch.no_grad():
        model(*inputs.values())
    if not seen:
        print("no SDPA call with a mask")


if __name__ == "__main__":
    main()
