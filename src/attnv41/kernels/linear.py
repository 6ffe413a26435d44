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


def _dequant_group(w: torch.Tensor, scale: torch.Tensor | None, check: bool = True) -> torch.Tensor:
    """w `[G, r, gw]` as bf16: itself, or an FP8-stored weight (float8_e4m3fn) with its e8m0
    block scales `[G·r/32, gw/32]` dequantized exactly (`reference.fp8.dequant_weight`: the
    released conversion's bf16 of wo_a). `check=False`: no scan of the scale bytes for 0xFF
    (no read back to the host, so CUDA graphs capture it; `weights.py` checked them at load)."""
    if scale is None:
        return w
    from ..reference.fp8 import dequant_weight  # noqa: PLC0415

    G, r, gw = w.shape
    return dequant_weight(w.reshape(G * r, gw), scale, name="wo_a.weight", check=check).view(G, r, gw)


def group_mm(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per group g: `out[:, g] = o[:, g] · w[g]ᵀ`; o `[m, G, gw]`, w `[G, r, gw]`, out `[m, G, r]` bf16
    (an FP8-stored w with its `scale`: dequantized first, a bf16 copy per call; the scale bytes
    trusted, so the call is capturable: no read back to the host)."""
    w = _dequant_group(w, scale, check=False)
    res = torch.bmm(o.transpose(0, 1), w.transpose(1, 2))  # [G, m, r]
    out.copy_(res.transpose(0, 1))
    return out


def group_mm_exact(
    o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    out.copy_(torch.einsum("mgk,grk->mgr", o.double(), _dequant_group(w, scale).double()))
    return out
