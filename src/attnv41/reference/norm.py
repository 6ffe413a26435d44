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
    """`bf16(x · Wᵀ)` with fp32 accumulation of bf16 inputs (W stored `[out, in]`)."""
    return (x.float() @ weight.float().t()).to(torch.bfloat16)
