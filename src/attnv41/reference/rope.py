"""RoPE tables (plain and YaRN) and their application (attention-v41.md §3).

Tables are fp32 `cos`, `sin` of shape `[positions, rope_dim/2]`: row = position,
column k = the k-th interleaved pair of a row's last `rope_dim` values.
"""

from __future__ import annotations

import math

import torch

__all__ = ["rope_freqs", "yarn_range", "rope_table", "apply_rope"]


def yarn_range(
    rope_dim: int, theta: float, original_seq_len: int, beta_fast: float, beta_slow: float
) -> tuple[int, int]:
    """The YaRN ramp's (low, high) pair indices: `corr(b) = d·ln(L0/(2πb)) / (2 ln θ)`."""

    def corr(b: float) -> float:
        return rope_dim * math.log(original_seq_len / (b * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), rope_dim - 1)
    return low, high


def rope_freqs(
    rope_dim: int,
    theta: float,
    yarn: tuple[float, int, float, float] | None = None,
) -> torch.Tensor:
    """fp32 angular frequencies ω_k, k < rope_dim/2.

    `yarn = (factor, original_seq_len, beta_fast, beta_slow)` blends ω_k with ω_k/factor
    along a linear ramp between the pairs `yarn_range` returns; no mscale.
    """
    k2 = torch.arange(0, rope_dim, 2, dtype=torch.float32)
    freqs = 1.0 / (theta ** (k2 / rope_dim))
    if yarn is not None:
        factor, orig, beta_fast, beta_slow = yarn
        low, high = yarn_range(rope_dim, theta, orig, beta_fast, beta_slow)
        span = max(high - low, 1e-3)
        ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / span).clamp(0, 1)
        freqs = freqs / factor * ramp + freqs * (1 - ramp)
    return freqs


def rope_table(positions: int, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 `(cos, sin)`, each `[positions, len(freqs)]`, angle `p·ω_k` computed in fp32.

    Built through `torch.polar` as the released code does: on the CPU this equals the
    golden tables bit for bit (plain `torch.cos`/`torch.sin` differ by an fp32 ulp).
    """
    angle = torch.outer(torch.arange(positions, dtype=torch.float32), freqs.float())
    z = torch.polar(torch.ones_like(angle), angle)
    return z.real.contiguous(), z.imag.contiguous()


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    inverse: bool = False,
) -> torch.Tensor:
    """Rotate the last `2·cos.shape[1]` values of every row of `x` (bf16) in interleaved pairs.

    x: `[m, ..., width]`; positions: `[m]` integer. Each pair `(a, b)` is the complex number
    `a + ib` multiplied by `e^{±i·p·ω}` in fp32, rounded to x's dtype. The leading values
    pass through unchanged.
    """
    half = cos.shape[1]
    rd = 2 * half
    c = cos[positions.long()]
    s = sin[positions.long()]
    if inverse:
        s = -s
    # broadcast [m, half] over the middle dims of x
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    c = c.reshape(shape)
    s = s.reshape(shape)
    tail = x[..., -rd:].float().unflatten(-1, (half, 2))
    a, b = tail[..., 0], tail[..., 1]
    rot = torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)
