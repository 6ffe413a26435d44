"""RoPE on the device (attention-v41.md §3): `apply_rope` (Triton) and `apply_rope_torch`.

Twin: `attnv41.reference.rope.apply_rope`. Positions are read on the device, so a
launch needs no host value that changes per step and can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from ..reference import rope as _ref
from ._triton import HAVE_TRITON, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16

__all__ = ["apply_rope", "apply_rope_torch"]

_INT = (torch.int32, torch.int64)


def _check(x, cos, sin, pos, out) -> torch.Tensor:
    """Validate the arguments; return x viewed `[m, n_vec, width]`."""
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x.dtype = {x.dtype}; allowed: torch.bfloat16")
    if x.dim() not in (2, 3):
        raise ValueError(
            f"x.dim() = {x.dim()} (shape {tuple(x.shape)}); allowed: 2 ([m, width]) or 3 ([m, n_vec, width])"
        )
    x3 = x if x.dim() == 3 else x.unsqueeze(1)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name}.dtype = {t.dtype}; allowed: torch.float32")
        if t.dim() != 2 or t.shape[1] < 1:
            raise ValueError(f"{name}.shape = {tuple(t.shape)}; allowed: [max_seq, rope_dim/2] with rope_dim/2 >= 1")
        if t.device != x.device:
            raise ValueError(f"{name}.device = {t.device}; allowed: x.device = {x.device}")
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}.stride(1) = {t.stride(1)}; allowed: 1")
    if sin.shape != cos.shape:
        raise ValueError(f"sin.shape = {tuple(sin.shape)}; allowed: cos.shape = {tuple(cos.shape)}")
    rope_dim = 2 * cos.shape[1]
    if not 1 <= rope_dim <= x.shape[-1]:
        raise ValueError(f"rope_dim = 2*cos.shape[1] = {rope_dim}; allowed: 2..x.shape[-1] = {x.shape[-1]}")
    if pos.dtype not in _INT:
        raise ValueError(f"pos.dtype = {pos.dtype}; allowed: torch.int32 or torch.int64")
    if tuple(pos.shape) != (x.shape[0],):
        raise ValueError(f"pos.shape = {tuple(pos.shape)}; allowed: [m] = [{x.shape[0]}]")
    if pos.device != x.device:
        raise ValueError(f"pos.device = {pos.device}; allowed: x.device = {x.device}")
    if out is not None:
        if out.dtype != x.dtype or out.shape != x.shape or out.device != x.device:
            raise ValueError(
                f"out = {out.dtype} {tuple(out.shape)} on {out.device}; allowed: {x.dtype} {tuple(x.shape)} on {x.device}"
            )
    for name, t in (("x", x), ("out", out)):
        if t is not None and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name}.stride(-1) = {t.stride(-1)}; allowed: 1 (rows contiguous in their last dim)")
    return x3


def apply_rope_torch(x, cos, sin, pos, inverse: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """CPU/any-device fallback of `apply_rope`, built on the reference twin (same contract)."""
    _check(x, cos, sin, pos, out)
    y = _ref.apply_rope(x, cos, sin, pos, inverse)
    if out is None:
        return y
    return out.copy_(y)


def apply_rope(x, cos, sin, pos, inverse: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate the last `rope_dim = 2·cos.shape[1]` values of every vector of `x`.

    x: bf16 `[m, n_vec, width]` (or `[m, width]`, one vector per token); cos, sin: fp32
    `[max_seq, rope_dim/2]`; pos: int32/int64 `[m]` on x's device, each in
    `0 … max_seq−1` (not checked: that would need a host sync). Pair k of a vector's
    tail, values `(2k, 2k+1) = (a, b)`, becomes `(a·c − b·s, a·s + b·c)` in fp32 with
    `c, s = cos[p, k], ±sin[p, k]` (− when `inverse`), rounded to bf16 (nearest even);
    the leading `width − rope_dim` values are copied unchanged. Every product is rounded
    before the sum (no fused multiply-add), as the reference's separate PyTorch ops do,
    so the result equals `reference.rope.apply_rope` bit for bit (CUDA and interpreter).

    out: None (allocate), x itself (in place), or a non-overlapping tensor like x.
    Returns out. No host synchronisation: capturable in a CUDA graph.
    """
    x3 = _check(x, cos, sin, pos, out)
    require_triton("apply_rope", x, cos, sin, pos)
    if out is None:
        out = torch.empty_like(x)
    out3 = out if out.dim() == 3 else out.unsqueeze(1)
    m, n_vec, width = x3.shape
    if m == 0 or n_vec == 0:
        return out
    half = cos.shape[1]
    lead = width - 2 * half
    half_p = triton.next_power_of_2(half)
    block_v = min(triton.next_power_of_2(n_vec), max(1, 2048 // half_p), 16)
    block_w = min(triton.next_power_of_2(max(lead, 1)), 128)
    copy_lead = lead > 0 and out.data_ptr() != x.data_ptr()
    grid = (m, triton.cdiv(n_vec, block_v))
    _rope_kernel[grid](
        x3,
        out3,
        cos,
        sin,
        pos,
        n_vec,
        x3.stride(0),
        x3.stride(1),
        out3.stride(0),
        out3.stride(1),
        cos.stride(0),
        sin.stride(0),
        LEAD=lead,
        HALF=half,
        INVERSE=bool(inverse),
        COPY_LEAD=copy_lead,
        BLOCK_V=block_v,
        HALF_P=half_p,
        BLOCK_W=block_w,
        # The reference rounds a·c and b·s separately; a contracted fma would differ by an ulp.
        enable_fp_fusion=False,
        **pdl_launch(x3),
    )
    return out


if HAVE_TRITON:

    @triton.jit
    def _rope_kernel(
        x_ptr,
        out_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        n_vec,
        sx_m,
        sx_v,
        so_m,
        so_v,
        scos,
        ssin,
        LEAD: tl.constexpr,
        HALF: tl.constexpr,
        INVERSE: tl.constexpr,
        COPY_LEAD: tl.constexpr,
        BLOCK_V: tl.constexpr,
        HALF_P: tl.constexpr,
        BLOCK_W: tl.constexpr,
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (t, vb): token t, vectors vb·BLOCK_V … +BLOCK_V−1
        t = tl.program_id(0).to(tl.int64)
        vb = tl.program_id(1)
        p = tl.load(pos_ptr + t).to(tl.int64)
        # [HALF_P] pair index k
        k = tl.arange(0, HALF_P)
        k_ok = k < HALF
        c = tl.load(cos_ptr + p * scos + k, mask=k_ok, other=0.0)
        s = tl.load(sin_ptr + p * ssin + k, mask=k_ok, other=0.0)
        if INVERSE:
            s = -s
        # [BLOCK_V] vector index v
        v = vb * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = v < n_vec
        v64 = v.to(tl.int64)
        x_row = x_ptr + t * sx_m + v64 * sx_v  # [BLOCK_V] pointers to each vector
        o_row = out_ptr + t * so_m + v64 * so_v
        # [BLOCK_V, HALF_P] pairs (a, b) = values lead+2k, lead+2k+1
        ok = v_ok[:, None] & k_ok[None, :]
        col = LEAD + 2 * k.to(tl.int64)
        a = tl.load(x_row[:, None] + col[None, :], mask=ok, other=0.0).to(tl.float32)
        b = tl.load(x_row[:, None] + col[None, :] + 1, mask=ok, other=0.0).to(tl.float32)
        re = a * c[None, :] - b * s[None, :]
        im = a * s[None, :] + b * c[None, :]
        tl.store(o_row[:, None] + col[None, :], round_bf16(re), mask=ok)
        tl.store(o_row[:, None] + col[None, :] + 1, round_bf16(im), mask=ok)
        if COPY_LEAD:
            # LEAD is constexpr: a loop bound read from a runtime argument breaks the interpreter
            # (numpy >= 2.4 refuses int() of its 1-element arrays), and widths are few.
            for w0 in tl.static_range(0, LEAD, BLOCK_W):
                # [BLOCK_W] leading column w, [BLOCK_V, BLOCK_W] values copied as they are
                w = w0 + tl.arange(0, BLOCK_W)
                w_ok = v_ok[:, None] & (w < LEAD)[None, :]
                w64 = w.to(tl.int64)
                y = tl.load(x_row[:, None] + w64[None, :], mask=w_ok, other=0.0)
                tl.store(o_row[:, None] + w64[None, :], y, mask=w_ok)


check = _check  # the argument checks, for kernels that apply this rotation in their epilogue (gemv)
