"""Compressor pooling on the device (attention-v41.md §5): `compress_pool` (Triton) and
`compress_pool_torch`.

Twin: `attnv41.reference.compressor.compress_pool`.
"""

from __future__ import annotations

import torch

from ..reference import compressor as _ref
from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait

__all__ = ["compress_pool", "compress_pool_torch"]

_MAX_RATIO = 128
_BLOCK_ELEMS = 4096  # R_P · BLOCK_D values of a and of g per program


def _check(a, g, out) -> None:
    for name, t in (("a", a), ("g", g)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name}.dtype = {t.dtype}; allowed: torch.float32")
        if t.dim() != 3:
            raise ValueError(f"{name}.dim() = {t.dim()} (shape {tuple(t.shape)}); allowed: 3 ([n, r, D])")
        if t.shape[2] > 1 and t.stride(2) != 1:
            raise ValueError(f"{name}.stride(2) = {t.stride(2)}; allowed: 1")
    if g.shape != a.shape:
        raise ValueError(f"g.shape = {tuple(g.shape)}; allowed: a.shape = {tuple(a.shape)}")
    if g.device != a.device:
        raise ValueError(f"g.device = {g.device}; allowed: a.device = {a.device}")
    n, r, D = a.shape
    if not 2 <= r <= _MAX_RATIO:
        raise ValueError(f"a.shape[1] (compress ratio r) = {r}; allowed: 2..{_MAX_RATIO}")
    if out is not None:
        if out.dtype != torch.float32 or tuple(out.shape) != (n, D) or out.device != a.device:
            raise ValueError(
                f"out = {out.dtype} {tuple(out.shape)} on {out.device}; allowed: torch.float32 [{n}, {D}] on {a.device}"
            )
        if D > 1 and out.stride(1) != 1:
            raise ValueError(f"out.stride(1) = {out.stride(1)}; allowed: 1")


def compress_pool_torch(a: torch.Tensor, g: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Fallback of `compress_pool` (same contract), the reference twin."""
    _check(a, g, out)
    pooled = _ref.compress_pool(a, g)
    return pooled if out is None else out.copy_(pooled)


def compress_pool(a: torch.Tensor, g: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pool each group of r tokens: `out[j, c] = Σ_i softmax_i(g[j, :, c]) · a[j, i, c]`.

    a, g: fp32 `[n, r, D]` (values and gate scores of group j's r tokens), 2 ≤ r ≤ 128;
    out: None (allocate) or fp32 `[n, D]`; returned. fp32 throughout: max-subtracted
    softmax over r per channel, then the weighted sum. A gate score of −∞ gives its value
    weight 0; a channel whose r scores are all −∞ gives NaN, as in the reference. Equal
    to the reference within fp32 rounding (GPU `exp` is approximate to a few ulps).
    No host synchronisation.
    """
    _check(a, g, out)
    require_triton("compress_pool", a, g)
    n, r, D = a.shape
    if out is None:
        out = torch.empty(n, D, dtype=torch.float32, device=a.device)
    if n == 0 or D == 0:
        return out
    r_p = max(2, triton.next_power_of_2(r))
    block_d = min(triton.next_power_of_2(D), max(16, _BLOCK_ELEMS // r_p))
    grid = (n, triton.cdiv(D, block_d))
    _compress_pool_kernel[grid](
        a,
        g,
        out,
        D,
        a.stride(0),
        a.stride(1),
        g.stride(0),
        g.stride(1),
        out.stride(0),
        R=r,
        R_P=r_p,
        BLOCK_D=block_d,
        **pdl_launch(a),
    )
    return out


if HAVE_TRITON:

    @triton.jit
    def _compress_pool_kernel(
        a_ptr,
        g_ptr,
        out_ptr,
        D,
        s_a_n,
        s_a_r,
        s_g_n,
        s_g_r,
        s_out,
        R: tl.constexpr,
        R_P: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (j, db): group j, channels db·BLOCK_D … +BLOCK_D−1
        j = tl.program_id(0).to(tl.int64)
        db = tl.program_id(1)
        # [R_P] token i of the group, [BLOCK_D] channel c
        i = tl.arange(0, R_P)
        c = db * BLOCK_D + tl.arange(0, BLOCK_D)
        i_ok = i < R
        c_ok = c < D
        ok = i_ok[:, None] & c_ok[None, :]
        i64 = i.to(tl.int64)
        c64 = c.to(tl.int64)
        # [R_P, BLOCK_D] gate scores (padding −∞: weight 0) and values (padding 0)
        g = tl.load(g_ptr + j * s_g_n + i64[:, None] * s_g_r + c64[None, :], mask=ok, other=float("-inf"))
        g = tl.where(c_ok[None, :], g, 0.0)  # channels past D: finite, so no NaN even unstored
        a = tl.load(a_ptr + j * s_a_n + i64[:, None] * s_a_r + c64[None, :], mask=ok, other=0.0)
        # [BLOCK_D] per-channel softmax over the group's r tokens
        g_max = tl.max(g, axis=0)
        e = tl.exp(g - g_max[None, :])
        denom = tl.sum(e, axis=0)
        # [BLOCK_D] the weighted sum of the values
        pooled = tl.sum(a * (e / denom[None, :]), axis=0)
        tl.store(out_ptr + j * s_out + c64, pooled, mask=c_ok)
