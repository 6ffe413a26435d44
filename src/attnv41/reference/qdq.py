"""Quantize-dequantize round trips (attention-v41.md §3).

Each function takes a tensor whose last dim is a multiple of its block, quantizes
every block of consecutive values with one scale, and returns the dequantized
values as bf16 (every result is exactly representable in bf16, so packed fp8/fp4
storage could hold the same values losslessly).

- `fp8_qdq`: e4m3, block 32, power-of-two scale (window kv rows).
- `fp4_e8m0_qdq`: e2m1, block 32, power-of-two scale (index queries and keys).
- `fp4_e4m3_qdq`: e2m1, block 16, e4m3 scale, not a power of two (compressed kv rows).
"""

from __future__ import annotations

import torch

__all__ = ["fp8_qdq", "fp4_e8m0_qdq", "fp4_e4m3_qdq", "e2m1_round", "pow2_ceil", "E2M1_GRID"]

FP8_MAX = 448.0
FP4_MAX = 6.0
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between consecutive e2m1 codes, and whether the upper code of each pair is
# even (a tie then rounds up to it) or odd (a tie stays on the lower, even code).
_E2M1_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_UPPER_EVEN = (False, True, False, True, False, True, False)


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """`2^ceil(log2(s))` for positive fp32 `s`, exactly: the exponent of s, +1 if its mantissa is nonzero."""
    mant, exp = torch.frexp(s)  # s = mant · 2^exp, mant in [0.5, 1)
    exp = torch.where(mant == 0.5, exp - 1, exp)
    return torch.ldexp(torch.ones_like(s), exp)


def _blocks(v: torch.Tensor, block: int) -> torch.Tensor:
    if v.shape[-1] % block:
        raise ValueError(f"last dim = {v.shape[-1]}; allowed: a multiple of the block size {block}")
    return v.float().unflatten(-1, (v.shape[-1] // block, block))


def fp8_qdq(v: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP8 e4m3 round trip per `block` values with a power-of-two scale.

    `amax = max(|v|, 1e-4)`, `s = pow2_ceil(amax · fp32(1/448))`,
    `v ← bf16(e4m3_rne(clamp(v/s, ±448)) · s)`.
    """
    x = _blocks(v, block)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2_ceil(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    q = (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (q * s).flatten(-2).to(torch.bfloat16)


def e2m1_round(a: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already within ±6) to the e2m1 grid, ties to the even code, sign kept."""
    mag = a.abs()
    code = torch.zeros_like(mag, dtype=torch.int64)
    for mid, upper_even in zip(_E2M1_MIDS, _E2M1_UPPER_EVEN):
        code += (mag >= mid) if upper_even else (mag > mid)
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=a.device)
    return torch.copysign(grid[code], a)


def fp4_e8m0_qdq(v: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP4 e2m1 round trip per `block` values, scale `2^ceil(log2(amax/6))`, `amax ≥ 6·2^-126`."""
    x = _blocks(v, block)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(FP4_MAX * 2.0**-126)
    s = pow2_ceil(amax / FP4_MAX)
    q = e2m1_round((x / s).clamp(-FP4_MAX, FP4_MAX))
    return (q * s).flatten(-2).to(torch.bfloat16)


def fp4_e4m3_qdq(v: torch.Tensor, block: int = 16) -> torch.Tensor:
    """FP4 e2m1 round trip per `block` values, scale `e4m3_rne(amax/6)`, `amax ≥ 6·2^-9`."""
    x = _blocks(v, block)
    amax = x.abs().amax(-1, keepdim=True).clamp_min(FP4_MAX * 2.0**-9)
    # e4m3 saturates at 448 (torch releases differ: some cast larger values to NaN)
    s = (amax / FP4_MAX).clamp_max(FP8_MAX).to(torch.float8_e4m3fn).float()
    q = e2m1_round((x / s).clamp(-FP4_MAX, FP4_MAX))
    return (q * s).flatten(-2).to(torch.bfloat16)
