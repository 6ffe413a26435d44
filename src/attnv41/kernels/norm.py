"""RMSNorm in Triton (attention-v41.md §3); twin: `attnv41.reference.norm.rms_norm`.

Contract: `x` is a 2-D bf16 tensor `[rows, width]` with a contiguous last dim (any row
stride); `weight` is fp32 or bf16 `[width]`; `y = bf16(w ⊙ v / sqrt(mean(v²) + eps))`
in fp32 over the last dim, written into `out` (allocated when None; bf16 of x's shape,
contiguous last dim; may be `x` itself, must not partially overlap it); `out` is
returned.

Not bit-exact with the reference, by design: the sum of squares is reduced in a
different order than torch's, and the reciprocal square root is rounded differently
from `torch.rsqrt`, so the fp32 value before the final bf16 rounding differs by a few
fp32 ulps and may, near a bf16 rounding boundary, land one bf16 ulp away. Compare with
a tolerance of one bf16 ulp.

`qdq_out` (optional, bf16 of x's shape, width a multiple of 32): also write the FP8
round trip of the result, `qdq.fp8_qdq(y)` bit for bit (per 32 values, from the bf16 y
this call stores), in the same kernel: the input an FP8 linear reads next
(`gemv.gemv(..., xq=)`), without a launch of its own. `qdq_rename` (width a multiple of
128): those values stored in the Gluon FP8 product's column order instead,
`qdq.fp8_qdq(y, rename=True)` (`tc_fp8.rename_cols`), the input `tc_fp8` reads.

`rms_norm_torch` runs the reference twin with the same signature (the CPU path).
"""

from __future__ import annotations

import math

import torch

from ..reference import norm as _ref
from ..reference import qdq as _ref_qdq
from ._triton import HAVE_TRITON, bf16_out_like, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import interpreting, pdl_release, pdl_wait
    from .gemv_fp8 import _quant_block
    from .qdq import _bf16_to_f32, _f32_to_bf16_rne, _renamed_col

__all__ = ["rms_norm", "rms_norm_torch"]

_MAX_BLOCK = 4096  # widest chunk one program holds; wider rows loop over chunks in two passes


def _check_qdq(x: torch.Tensor, out: torch.Tensor, qdq_out, rename: bool = False) -> None:
    if not isinstance(rename, bool):
        raise ValueError(f"qdq_rename = {rename!r}; allowed: True or False")
    if qdq_out is None:
        if rename:
            raise ValueError("qdq_rename = True with qdq_out None; allowed: qdq_rename only with a qdq_out")
        return
    if not isinstance(qdq_out, torch.Tensor) or qdq_out.dtype != torch.bfloat16 or qdq_out.shape != x.shape:
        raise ValueError(
            f"qdq_out: {getattr(qdq_out, 'dtype', type(qdq_out).__name__)} {tuple(getattr(qdq_out, 'shape', ()))}; "
            f"allowed: None or torch.bfloat16 {tuple(x.shape)} (the shape of x)"
        )
    if qdq_out.device != x.device:
        raise ValueError(f"qdq_out.device = {qdq_out.device}; allowed: {x.device} (the device of x)")
    if x.shape[-1] % 32:
        raise ValueError(f"x.shape[-1] = {x.shape[-1]}; allowed with qdq_out: a multiple of 32 (fp8 blocks)")
    if rename and x.shape[-1] % 128:
        raise ValueError(f"x.shape[-1] = {x.shape[-1]}; allowed with qdq_rename: a multiple of 128")
    if qdq_out.shape[-1] > 1 and qdq_out.stride(-1) != 1:
        raise ValueError(f"qdq_out.stride(-1) = {qdq_out.stride(-1)}; allowed: 1 (contiguous last dim)")
    for name, t in (("x", x), ("out", out)):
        if qdq_out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            raise ValueError(f"qdq_out shares storage with {name}; allowed: a separate tensor")


def _check(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None) -> torch.Tensor:
    """Validate the arguments (ValueError naming the argument); return `out`, allocated if None."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x = {type(x).__name__}; allowed: a torch.Tensor")
    if x.dim() != 2:
        raise ValueError(f"x.dim() = {x.dim()}; allowed: 2 ([rows, width])")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x.dtype = {x.dtype}; allowed: torch.bfloat16")
    if x.shape[-1] < 1:
        raise ValueError(f"x.shape[-1] = {x.shape[-1]}; allowed: >= 1")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"x.stride(-1) = {x.stride(-1)}; allowed: 1 (contiguous last dim)")
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight = {type(weight).__name__}; allowed: a torch.Tensor")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"weight.shape = {tuple(weight.shape)}; allowed: ({x.shape[-1]},) (x.shape[-1])")
    if weight.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weight.dtype = {weight.dtype}; allowed: torch.float32 or torch.bfloat16")
    if weight.device != x.device:
        raise ValueError(f"weight.device = {weight.device}; allowed: {x.device} (the device of x)")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps = {eps!r}; allowed: a finite float >= 0")
    return bf16_out_like(x, out)


if HAVE_TRITON:

    @triton.jit
    def _load_weight(ptrs, mask):
        """fp32 weights as they are; bf16 ones widened through the bits."""
        if ptrs.dtype.element_ty == tl.bfloat16:
            return _bf16_to_f32(tl.load(ptrs, mask=mask, other=0.0))
        else:
            return tl.load(ptrs, mask=mask, other=0.0)

    @triton.jit
    def _store_rows(
        out_row,
        q_row,
        cols,
        cmask,
        y,
        QDQ: tl.constexpr,
        BLOCK: tl.constexpr,
        EXACT_CAST: tl.constexpr,
        RENAME: tl.constexpr = False,
    ):
        """Store fp32 `y [BLOCK]` rounded to bf16 at out_row + cols and, with QDQ, its fp8
        round trip per 32 values (`qdq.fp8_qdq` of the stored bf16 values) at q_row + cols,
        or with RENAME at `tc_fp8`'s renamed column of each (`qdq._qdq_kernel`'s map)."""
        yb = _f32_to_bf16_rne(y)
        tl.store(out_row + cols, yb, mask=cmask)
        if QDQ:
            # [BLOCK // 32, 32]: masked columns are +0 and never raise a block's amax
            v, sx = _quant_block(tl.reshape(_bf16_to_f32(yb), (BLOCK // 32, 32)), EXACT_CAST)
            qcols = cols
            if RENAME:
                qcols = _renamed_col(cols)
            tl.store(q_row + qcols, _f32_to_bf16_rne(tl.reshape(v * sx[:, None], (BLOCK,))), mask=cmask)

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        q_ptr,  # bf16 round trip of out (QDQ), else any pointer
        width,
        width_f,  # float(width): an int arg equal to 1 would be specialized to a constexpr
        stride_x,
        stride_w,
        stride_out,
        stride_q,
        eps,
        BLOCK: tl.constexpr,  # power of two, >= width when NUM_CHUNKS == 1
        NUM_CHUNKS: tl.constexpr,  # cdiv(width, BLOCK)
        QDQ: tl.constexpr,
        EXACT_CAST: tl.constexpr,
        PDL: tl.constexpr = False,
        RENAME: tl.constexpr = False,  # the round trip stored renamed (`qdq_rename`)
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # One program per row.
        row = tl.program_id(0).to(tl.int64)
        x_row = x_ptr + row * stride_x
        out_row = out_ptr + row * stride_out
        q_row = q_ptr + row * stride_q
        # [BLOCK]
        offs = tl.arange(0, BLOCK)
        if NUM_CHUNKS == 1:
            mask = offs < width
            v = _bf16_to_f32(tl.load(x_row + offs, mask=mask, other=0.0))
            ss = tl.sum(v * v, axis=0)
        else:
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for c in range(NUM_CHUNKS):
                cols = c * BLOCK + offs
                v = _bf16_to_f32(tl.load(x_row + cols, mask=cols < width, other=0.0))
                acc += v * v
            ss = tl.sum(acc, axis=0)
        # scalar: 1/sqrt(mean + eps), each step correctly rounded (torch.rsqrt rounds once)
        ms = tl.math.div_rn(ss, width_f)
        r = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))
        if NUM_CHUNKS == 1:
            w = _load_weight(w_ptr + offs * stride_w, mask)
            _store_rows(out_row, q_row, offs, mask, w * (v * r), QDQ, BLOCK, EXACT_CAST, RENAME)
        else:
            for c in range(NUM_CHUNKS):
                cols = c * BLOCK + offs
                cmask = cols < width
                v = _bf16_to_f32(tl.load(x_row + cols, mask=cmask, other=0.0))
                w = _load_weight(w_ptr + cols * stride_w, cmask)
                _store_rows(out_row, q_row, cols, cmask, w * (v * r), QDQ, BLOCK, EXACT_CAST, RENAME)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    qdq_out: torch.Tensor | None = None,
    qdq_rename: bool = False,
) -> torch.Tensor:
    """`bf16(w ⊙ v / sqrt(mean(v²) + eps))` per row of bf16 `x [rows, width]`, in Triton.

    `weight`: fp32 or bf16 `[width]`; `eps`: finite float >= 0; `out`: None or bf16 of
    x's shape (may be x). `qdq_out`: None, or bf16 of x's shape (not x or out) that gets
    `fp8_qdq(out)`, renamed with `qdq_rename` (module doc). Returns `out`. Within one bf16
    ulp of the reference.
    """
    out = _check(x, weight, eps, out)
    _check_qdq(x, out, qdq_out, qdq_rename)
    require_triton("rms_norm", x, weight, out)
    rows, width = x.shape
    if rows == 0:
        return out
    block = min(triton.next_power_of_2(width), _MAX_BLOCK)
    num_chunks = triton.cdiv(width, block)
    q = out if qdq_out is None else qdq_out
    _rms_norm_kernel[(rows,)](
        x,
        weight,
        out,
        q,
        width,
        float(width),
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        q.stride(0),
        float(eps),
        BLOCK=block,
        NUM_CHUNKS=num_chunks,
        QDQ=qdq_out is not None,
        EXACT_CAST=interpreting(),
        RENAME=qdq_rename,
        num_warps=4 if block <= 1024 else 8,
        **pdl_launch(x),
    )
    return out


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    qdq_out: torch.Tensor | None = None,
    qdq_rename: bool = False,
) -> torch.Tensor:
    """`rms_norm` through the reference twin (any device); same contract, bit-exact with it
    (`qdq_out` by the reference `fp8_qdq` of the result, renamed by `tc_fp8.rename_cols`)."""
    out = _check(x, weight, eps, out)
    _check_qdq(x, out, qdq_out, qdq_rename)
    out.copy_(_ref.rms_norm(x, weight, eps))
    if qdq_out is not None:
        q = _ref_qdq.fp8_qdq(out, 32)
        if qdq_rename:
            from .tc_fp8 import rename_cols  # noqa: PLC0415

            q = rename_cols(q)
        qdq_out.copy_(q)
    return out
