"""Projections: cuBLAS through torch on CUDA; on the CPU the reference's rounding
(fp64 accumulation, one rounding at the end) so that the CPU runtime reproduces the
reference bit for bit and its tests need no tolerance.

`y = x · Wᵀ` with W stored `[out, in]`; results are written into `out` and returned.
"""

from __future__ import annotations

import torch

__all__ = ["mm", "mm_exact", "group_mm", "group_mm_exact"]


def mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """cuBLAS (fp32 accumulation): bf16 × bf16 → bf16, or fp32 × fp32 → fp32."""
    return torch.mm(x.to(w.dtype), w.t(), out=out)


def mm_exact(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """fp64 accumulation rounded once to `out.dtype` (the reference's `linear`)."""
    out.copy_(x.double() @ w.double().t())
    return out


def group_mm(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Per group g: `out[:, g] = o[:, g] · w[g]ᵀ`; o `[m, G, gw]`, w `[G, r, gw]`, out `[m, G, r]` bf16."""
    res = torch.bmm(o.transpose(0, 1), w.transpose(1, 2))  # [G, m, r]
    out.copy_(res.transpose(0, 1))
    return out


def group_mm_exact(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(torch.einsum("mgk,grk->mgr", o.double(), w.double()))
    return out
