"""The compressor of kv-source layers (attention-v41.md §5), in plain PyTorch.

A ratio-r compressor turns every r consecutive tokens into one latent row.
r = 1: `latent_t = RMSNorm(bf16(x_t · W_ckvᵀ); c_norm)` with bf16 weights.
r ≥ 2: fp32 projections `a = x·W_ckvᵀ`, `g = x·W_gateᵀ`, then per channel a softmax
over the r gate scores of a group weights the r values of `a`:
`latent_j = RMSNorm(bf16(Σ softmax(g)·a); c_norm)`.
"""

from __future__ import annotations

import torch

from .norm import linear, rms_norm

__all__ = ["compress_project", "compress_pool", "compress_latents"]


def compress_project(
    x: torch.Tensor, wkv: torch.Tensor, wgate: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token compressor inputs. r ≥ 2 (`wgate` given): fp32 `(a, g)`, each `[m, head_dim]`.
    r = 1 (`wgate` None): `(bf16(x·W_ckvᵀ), None)`."""
    if wgate is None:
        return linear(x, wkv), None
    # fp32 results, accumulated in fp64 so that they do not depend on the row count.
    xd = x.double()
    return (xd @ wkv.double().t()).float(), (xd @ wgate.double().t()).float()


def compress_pool(a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Pool groups: a, g fp32 `[n, r, head_dim]` → fp32 `[n, head_dim]`, softmax over r per channel."""
    return (a * torch.softmax(g, dim=1)).sum(dim=1)


def compress_latents(pooled: torch.Tensor, c_norm: torch.Tensor, eps: float) -> torch.Tensor:
    """Latent rows `RMSNorm(bf16(pooled); c_norm)` (bf16, `[n, head_dim]`)."""
    return rms_norm(pooled.to(torch.bfloat16), c_norm, eps)
