"""The FP8 linear the released checkpoint runs (`wq_a`, `wq_b`, `wkv`, `wo_b`,
`indexer.wq_b`; golden README, v41_fp8). Only its torch twin exists so far: the
reference's `fp8_linear`, exact, written into the runtime's buffer. The CUDA kernel is
pending; the runtime refuses FP8 weights on an op table without one (`Ops.fp8_mm` None).
"""

from __future__ import annotations

import torch

from ..reference.fp8 import fp8_linear

__all__ = ["fp8_mm_torch"]


def fp8_mm_torch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = bf16(x · Wᵀ)` the released FP8 way: x bf16 `[m, K]`, w float8_e4m3fn `[N, K]`,
    scale float8_e8m0fnu `[ceil(N/32), K/32]`, out bf16 `[m, N]` (see `reference.fp8.fp8_linear`)."""
    out.copy_(fp8_linear(x, w, scale))
    return out
