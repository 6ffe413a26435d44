"""Quantize-dequantize round trips in Triton (attention-v41.md §3); twin: `attnv41.reference.qdq`.

Contract shared by the three ops: `x` is a 2-D bf16 tensor `[rows, width]` with a
contiguous last dim (any row stride); each block of consecutive values along the last
dim gets one scale; the dequantized values are written as bf16 into `out` (allocated
when None; same shape, bf16, contiguous last dim; may be `x` itself for an in-place
round trip, but must not partially overlap it) and `out` is returned. The results equal
the reference bit for bit: every scale and every rounding is done exactly, with integer
operations on fp32 bits and correctly rounded fp32 division, never with approximate
hardware paths (`/` on fp32 is approximate on NVIDIA GPUs; `tl.math.div_rn` is not),
and bf16 <-> fp32 conversions go through the bits (see `_bf16_to_f32`).

- `fp8_qdq`: e4m3, block 32, power-of-two scale (window kv rows).
- `fp4_e8m0_qdq`: e2m1, block 32, power-of-two scale (index queries and keys).
- `fp4_e4m3_qdq`: e2m1, block 16, e4m3 scale, not a power of two (compressed kv rows);
  contract: amax ≤ 6·464 = 2784 per block. Beyond it the reference's e4m3 cast of the
  scale depends on torch (NaN before 2.13, saturating from 2.13); the kernel saturates
  the scale at 448, so such blocks clip to ±2688.

`<op>_torch` runs the reference twin with the same signature (the CPU path).

`nonfinite` (every op, optional): an int64 `[1]` tensor on x's device to which the op adds
the number of non-finite values (NaN, ±inf) of `x`, on the device (an integer atomic add
per program that saw any: exact and deterministic, no host sync). The runtime passes its
counter on the round trips that write caches.
"""

from __future__ import annotations

import torch

from ..reference import qdq as _ref
from ._triton import HAVE_TRITON, bf16_out_like, interpreting, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16

__all__ = [
    "fp8_qdq",
    "fp4_e8m0_qdq",
    "fp4_e4m3_qdq",
    "fp8_qdq_torch",
    "fp4_e8m0_qdq_torch",
    "fp4_e4m3_qdq_torch",
]

FP8_BLOCK = 32
FP4_E8M0_BLOCK = 32
FP4_E4M3_BLOCK = 16
_MODE_FP8, _MODE_FP4_E8M0, _MODE_FP4_E4M3 = 0, 1, 2
_BLOCKS_PER_PROGRAM = 64  # quantization blocks per program: a [64, 32] tile at most (best of 16..128 on an H200)
_NUM_WARPS = 4
_HW_E4M3 = True  # fp8 mode on the GPU: the hardware e4m3 cast (False: the bit arithmetic, as the interpreter)


def _check(x: torch.Tensor, out: torch.Tensor | None, block: int) -> torch.Tensor:
    """Validate `x` and `out` (ValueError naming the argument); return `out`, allocated if None."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x = {type(x).__name__}; allowed: a torch.Tensor")
    if x.dim() != 2:
        raise ValueError(f"x.dim() = {x.dim()}; allowed: 2 ([rows, width])")
    if x.dtype != torch.bfloat16:
        raise ValueError(f"x.dtype = {x.dtype}; allowed: torch.bfloat16")
    if x.shape[-1] % block:
        raise ValueError(f"x.shape[-1] = {x.shape[-1]}; allowed: a multiple of {block}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"x.stride(-1) = {x.stride(-1)}; allowed: 1 (contiguous last dim)")
    return bf16_out_like(x, out)


if HAVE_TRITON:

    @triton.jit
    def _bf16_to_f32(v):
        """Widen bf16 to fp32 through the bits (exact for subnormals too, which the Triton
        interpreter's float conversion mishandles)."""
        return (v.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)

    _f32_to_bf16_rne = round_bf16  # fp32 → bf16, nearest even, NaN kept (kernels/_triton.py)

    @triton.jit
    def _pow2_ceil_exp(t):
        """Biased fp32 exponent of `2^ceil(log2(t))` for positive normal fp32 `t`:
        the exponent field of t, +1 if its mantissa is nonzero (exact, no log2)."""
        bits = t.to(tl.int32, bitcast=True)
        return (bits >> 23) + ((bits & 0x7FFFFF) != 0).to(tl.int32)

    @triton.jit
    def _e4m3_rne(a):
        """Round fp32 `a` to e4m3 (fn) precision, nearest, ties to even; sign kept.

        Normal e4m3 (|a| ≥ 2^-6): keep 3 mantissa bits by adding 0x7FFFF plus the kept
        lsb to the fp32 bits and truncating (a carry into the exponent is correct).
        Subnormal e4m3 (|a| < 2^-6): round the 24-bit significand to a multiple of 2^-9.
        Magnitudes above 448 are rounded on the same 3-bit grid (no NaN, no saturation);
        callers clamp to ±448 first where the reference does.
        """
        bits = a.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        sign = bits ^ mag
        exp = mag >> 23
        normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & -1048576  # -1048576 = ~0xFFFFF
        # value = sig·2^(exp-150) = sig·2^-9·2^(exp-141): drop (141 - exp) bits, at least
        # 21 (exp ≤ 120 here) and at most 25 (sig < 2^24 then rounds to 0).
        sig = (mag & 0x7FFFFF) | 0x800000
        shift = tl.minimum(tl.maximum(141 - exp, 21), 25)
        k = sig >> shift
        rem = sig & ((1 << shift) - 1)
        half = 1 << (shift - 1)
        k = k + ((rem > half) | ((rem == half) & ((k & 1) == 1))).to(tl.int32)
        sub = (k.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # k·2^-9, exact
        rounded = tl.where(exp >= 121, normal, sub)
        return (rounded | sign).to(tl.float32, bitcast=True)

    @triton.jit
    def _e2m1_round(a):
        """Round fp32 `a` (within ±6) to the e2m1 grid {0,.5,1,1.5,2,3,4,6}, ties to the
        even code (0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4); sign kept."""
        m = tl.abs(a)
        r = tl.where(m > 0.25, 0.5, 0.0)
        r = tl.where(m >= 0.75, 1.0, r)
        r = tl.where(m > 1.25, 1.5, r)
        r = tl.where(m >= 1.75, 2.0, r)
        r = tl.where(m > 2.5, 3.0, r)
        r = tl.where(m >= 3.5, 4.0, r)
        r = tl.where(m > 5.0, 6.0, r)
        bits = a.to(tl.int32, bitcast=True)
        sign = bits ^ (bits & 0x7FFFFFFF)
        return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)

    @triton.jit
    def _e2m1_round_scaled(v, s):
        """`e2m1_round(clamp(fl(v/s), ±6))` for bf16-valued fp32 `v` and an e4m3 scale `s`,
        without the division: |v| is compared with mid·s for each midpoint between codes.

        Exact: mid·s is exact in fp32 (≤ 3 + 4 significant bits), and when v/s ≠ mid the two
        differ by far more than half an fp32 ulp (v has 8 significant bits, mid·s 7, so
        |v - mid·s| ≥ 2^-9·mid·s), so fl(v/s) lies on the same side of mid as v/s. The clamp
        never changes a code (every midpoint is below 6).
        """
        m = tl.abs(v)
        r = tl.where(m > 0.25 * s, 0.5, 0.0)
        r = tl.where(m >= 0.75 * s, 1.0, r)
        r = tl.where(m > 1.25 * s, 1.5, r)
        r = tl.where(m >= 1.75 * s, 2.0, r)
        r = tl.where(m > 2.5 * s, 3.0, r)
        r = tl.where(m >= 3.5 * s, 4.0, r)
        r = tl.where(m > 5.0 * s, 6.0, r)
        bits = v.to(tl.int32, bitcast=True)
        sign = bits ^ (bits & 0x7FFFFFFF)
        return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)

    @triton.jit
    def _renamed_col(cols):
        """`tc_fp8`'s renamed column of each column (`tc_fp8.rename_cols`): physical column
        128c + 32q + 4s + 2h + p → 128c + 16s + 8h + 2q + p."""
        j = cols % 32
        return (cols // 128) * 128 + (j >> 2) * 16 + ((j >> 1) & 1) * 8 + ((cols // 32) % 4) * 2 + (j & 1)

    @triton.jit
    def _qdq_kernel(
        x_ptr,
        out_ptr,
        count_ptr,  # int64 [1]: += the non-finite inputs (when COUNT)
        n_blocks_total,  # rows · blocks per row
        blocks_per_row,
        stride_x,
        stride_out,
        MODE: tl.constexpr,  # 0 fp8, 1 fp4_e8m0, 2 fp4_e4m3
        QBLOCK: tl.constexpr,  # values per quantization block (32 or 16)
        BLOCKS: tl.constexpr,  # quantization blocks per program (power of two)
        COUNT: tl.constexpr,  # count non-finite inputs into count_ptr
        EXACT_CAST: tl.constexpr,  # e4m3 rounding by bit arithmetic (the interpreter) or the GPU's cast
        PDL: tl.constexpr = False,
        RENAME: tl.constexpr = False,  # store in `tc_fp8`'s renamed column order (fp8, width % 128 == 0)
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # The [rows, width] tensor is viewed as n_blocks_total blocks of QBLOCK values;
        # this program takes BLOCKS consecutive ones (they may span rows).
        pid = tl.program_id(0).to(tl.int64)
        # [BLOCKS]
        g = pid * BLOCKS + tl.arange(0, BLOCKS).to(tl.int64)
        row = g // blocks_per_row
        col0 = (g % blocks_per_row) * QBLOCK
        # [BLOCKS, QBLOCK]
        cols = col0[:, None] + tl.arange(0, QBLOCK)[None, :].to(tl.int64)
        mask = (g < n_blocks_total)[:, None] & (cols >= 0)
        v = _bf16_to_f32(tl.load(x_ptr + row[:, None] * stride_x + cols, mask=mask, other=0.0))
        if COUNT:
            # non-finite: all exponent bits set; integer sum, so the count is exact and
            # deterministic whatever the order of the programs' atomic adds
            bad = (v.to(tl.int32, bitcast=True) & 0x7F800000) == 0x7F800000
            n_bad = tl.sum(tl.sum((bad & mask).to(tl.int64), axis=1), axis=0)
            tl.atomic_add(count_ptr, n_bad, mask=n_bad > 0)
        # [BLOCKS]
        amax = tl.max(tl.abs(v), axis=1)
        if MODE == 0:
            # s = 2^ceil(log2(max(amax, 1e-4)·fp32(1/448))); v/s is exact as v·(1/s)
            e = _pow2_ceil_exp(tl.maximum(amax, 1e-4) * 0.002232142857142857)
            s = (e << 23).to(tl.float32, bitcast=True)
            inv_s = ((254 - e) << 23).to(tl.float32, bitcast=True)
            # [BLOCKS, QBLOCK]
            q = tl.minimum(tl.maximum(v * inv_s[:, None], -448.0), 448.0)
            if EXACT_CAST:  # the interpreter's fp8 cast does not round to nearest even: bit arithmetic
                y = _e4m3_rne(q) * s[:, None]
            else:  # the GPU's cvt.rn.satfinite (q is within ±448): nearest even, the same values
                y = q.to(tl.float8e4nv).to(tl.float32) * s[:, None]
        elif MODE == 1:
            # s = 2^ceil(log2(max(amax, 6·2^-126)/6)), amax/6 correctly rounded
            t = tl.math.div_rn(tl.maximum(amax, 7.052966104933725e-38), tl.full(amax.shape, 6.0, tl.float32))
            e = _pow2_ceil_exp(t)
            s = (e << 23).to(tl.float32, bitcast=True)
            inv_s = ((254 - e) << 23).to(tl.float32, bitcast=True)
            # [BLOCKS, QBLOCK]
            q = tl.minimum(tl.maximum(v * inv_s[:, None], -6.0), 6.0)
            y = _e2m1_round(q) * s[:, None]
        else:
            # s = e4m3_rne(max(amax, 6·2^-9)/6), not a power of two: divide correctly rounded;
            # the cast saturates at 448 like torch ≥ 2.13's (amax > 2784; out of contract)
            t = tl.math.div_rn(tl.maximum(amax, 0.01171875), tl.full(amax.shape, 6.0, tl.float32))
            s = _e4m3_rne(tl.minimum(t, 448.0))
            # [BLOCKS, QBLOCK]: e2m1(clamp(v/s, ±6)) without dividing, see _e2m1_round_scaled
            y = _e2m1_round_scaled(v, s[:, None]) * s[:, None]
        if RENAME:
            cols = _renamed_col(cols)
        tl.store(out_ptr + row[:, None] * stride_out + cols, _f32_to_bf16_rne(y), mask=mask)


def _check_count(nonfinite: torch.Tensor | None, x: torch.Tensor) -> None:
    if nonfinite is None:
        return
    if not isinstance(nonfinite, torch.Tensor) or nonfinite.dtype != torch.int64 or nonfinite.numel() != 1:
        raise ValueError(f"nonfinite = {nonfinite!r}; allowed: None or an int64 tensor of one element")
    if nonfinite.device != x.device:
        raise ValueError(f"nonfinite.device = {nonfinite.device}; allowed: {x.device} (x's device)")


def _count_torch(x: torch.Tensor, nonfinite: torch.Tensor | None) -> None:
    """The counting twin: add the non-finite values of `x` to `nonfinite` (no host sync)."""
    if nonfinite is not None:
        nonfinite.add_((~torch.isfinite(x)).sum().view(1))


def _launch(
    op: str,
    x: torch.Tensor,
    out: torch.Tensor | None,
    block: int,
    mode: int,
    nonfinite: torch.Tensor | None,
    rename: bool = False,
) -> torch.Tensor:
    out = _check(x, out, block)
    _check_count(nonfinite, x)
    if rename:
        _check_rename(x, out)
    require_triton(op, x, out)
    rows, width = x.shape
    blocks_per_row = width // block
    total = rows * blocks_per_row
    if total == 0:
        return out
    blocks = min(_BLOCKS_PER_PROGRAM, triton.next_power_of_2(total))
    grid = (triton.cdiv(total, blocks),)
    _qdq_kernel[grid](
        x,
        out,
        out if nonfinite is None else nonfinite,  # any pointer when not counting
        total,
        blocks_per_row,
        x.stride(0),
        out.stride(0),
        MODE=mode,
        QBLOCK=block,
        BLOCKS=blocks,
        COUNT=nonfinite is not None,
        EXACT_CAST=interpreting() or not _HW_E4M3,
        RENAME=rename,
        num_warps=_NUM_WARPS,
        **pdl_launch(x),
    )
    return out


def fp8_qdq(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None, rename: bool = False
) -> torch.Tensor:
    """FP8 e4m3 round trip per 32 values, power-of-two scale, in Triton.

    `amax = max(|v|, 1e-4)`, `s = 2^ceil(log2(amax·fp32(1/448)))`,
    `v ← bf16(e4m3_rne(clamp(v/s, ±448))·s)`. `x`: bf16 `[rows, width]`, width a
    multiple of 32. `out`: None or bf16 of x's shape (may be x). Returns `out`.
    `rename`: the values stored in `tc_fp8`'s column order, `rename_cols(fp8_qdq(x))`
    (width a multiple of 128; `out` must not be x): the input the Gluon FP8 product reads.
    """
    return _launch("fp8_qdq", x, out, FP8_BLOCK, _MODE_FP8, nonfinite, rename)


def _check_rename(x: torch.Tensor, out: torch.Tensor) -> None:
    if x.shape[-1] % 128:
        raise ValueError(f"x.shape[-1] = {x.shape[-1]}; allowed with rename: a multiple of 128")
    if out.numel() and x.numel() and out.data_ptr() == x.data_ptr():
        raise ValueError("out is x; allowed with rename: a separate tensor (the columns move)")


def fp4_e8m0_qdq(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None
) -> torch.Tensor:
    """FP4 e2m1 round trip per 32 values, scale `2^ceil(log2(amax/6))`, `amax ≥ 6·2^-126`, in Triton.

    `x`: bf16 `[rows, width]`, width a multiple of 32. `out`: None or bf16 of x's shape
    (may be x). Returns `out`.
    """
    return _launch("fp4_e8m0_qdq", x, out, FP4_E8M0_BLOCK, _MODE_FP4_E8M0, nonfinite)


def fp4_e4m3_qdq(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None
) -> torch.Tensor:
    """FP4 e2m1 round trip per 16 values, scale `e4m3_rne(amax/6)`, `amax ≥ 6·2^-9`, in Triton.

    `x`: bf16 `[rows, width]`, width a multiple of 16, block amax ≤ 2784 (beyond it the
    scale saturates at 448). `out`: None or bf16 of x's shape (may be x). Returns `out`.
    """
    return _launch("fp4_e4m3_qdq", x, out, FP4_E4M3_BLOCK, _MODE_FP4_E4M3, nonfinite)


def fp8_qdq_torch(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None, rename: bool = False
) -> torch.Tensor:
    """`fp8_qdq` through the reference twin (any device); same contract."""
    out = _check(x, out, FP8_BLOCK)
    _check_count(nonfinite, x)
    if rename:
        from .tc_fp8 import rename_cols  # noqa: PLC0415

        _check_rename(x, out)
        _count_torch(x, nonfinite)
        return out.copy_(rename_cols(_ref.fp8_qdq(x, FP8_BLOCK)))
    _count_torch(x, nonfinite)
    return out.copy_(_ref.fp8_qdq(x, FP8_BLOCK))


def fp4_e8m0_qdq_torch(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None
) -> torch.Tensor:
    """`fp4_e8m0_qdq` through the reference twin (any device); same contract."""
    out = _check(x, out, FP4_E8M0_BLOCK)
    _check_count(nonfinite, x)
    _count_torch(x, nonfinite)
    return out.copy_(_ref.fp4_e8m0_qdq(x, FP4_E8M0_BLOCK))


def fp4_e4m3_qdq_torch(
    x: torch.Tensor, out: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None
) -> torch.Tensor:
    """`fp4_e4m3_qdq` through the reference twin (any device); same contract."""
    out = _check(x, out, FP4_E4M3_BLOCK)
    _check_count(nonfinite, x)
    _count_torch(x, nonfinite)
    return out.copy_(_ref.fp4_e4m3_qdq(x, FP4_E4M3_BLOCK))
