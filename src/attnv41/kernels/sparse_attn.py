"""Sparse attention with the attention sink (attention-v41.md §7): Triton kernel + torch fallback.

Contract of `sparse_attn(q, win, comp, sel, offset, sink, scale, out=None)`:

- q: bf16 `[m, H, D]`, the queries (1 ≤ D ≤ 512).
- win: bf16 `[Nw, D]`, the window rows; comp: bf16 `[Nc, D]`, the compressed rows, or
  V4.1's packed fp4_e4m3 rows, uint8 `[Nc, D/2 + D/16]` (`attnv41.packed`; D a multiple
  of 32), dequantized in the kernel to the same bf16 values, so the same bits. When
  Nc = 0, comp may be any tensor with D columns on q's device: nothing reads it.
- sel: int32 `[m, K]`, the selection. −1 is absent; 0 ≤ i < offset reads `win[i]`;
  i ≥ offset reads `comp[i − offset]`. Any other negative value also counts as absent.
  Entries ≥ offset + Nc break the contract: the kernel reads them as zero rows (it never
  reads out of bounds) but they still take part in the softmax. Nothing is checked on
  the host (that would need a device sync).
- offset: python int, 0 ≤ offset ≤ Nw (window rows at index ≥ offset are unreachable).
- sink: fp32 `[H]`, one logit per head, NOT scaled by `scale`.
- scale: python float, τ, applied to q·R (in fp32, after the dot).
- out: optional bf16 `[m, H, D]`, written in place and returned (allocated when None).

Order (the reference twin `attnv41.reference.sparse_attn.sparse_attn` on the rows
`cat(win[:offset], comp)`, which the golden data matches): per token t and head h, the
K entries are taken in blocks of BLOCK_K = 64 (part of the numerics contract) with an
online softmax: fp32 running max over the PRESENT logits, starting at −inf, and fp32
running sum. Each block's probabilities `p = exp(s − new_max)` are rounded to bf16
(round to nearest even) before they weight the bf16 rows (fp32 accumulation); the sum
keeps the fp32 p. After the last block the sink joins the denominator as
`exp(sink − max)`, and `o = bf16(acc / den)` (IEEE division, round to nearest even).
All entries absent → o = 0 exactly. Appending −1 entries to sel (wider K) changes no
output bit: an all-absent block rescales by exp(0) = 1 and adds exact zeros.

Kernel design: grid `(m, cdiv(H, BLOCK_H))`. One program per token and block of heads
(all heads at once when H ≤ BLOCK_H): every head of a token reads the same selected
rows, so each 64-row block `[64, D]` is gathered once per program and serves all its
heads through `tl.dot(q [BLOCK_H, D], rowsᵀ)` and `tl.dot(p [BLOCK_H, 64], rows)`. D is
padded to a power of two BLOCK_D ≥ 16 and kept whole (the fp32 accumulator is
`[BLOCK_H, BLOCK_D]`); BLOCK_H = H rounded up to a power of two, at least 16 (tl.dot's
minimum; masks pad the heads) and at most 64 (the accumulator's registers). The K loop's trip count cdiv(K, 64) is a constexpr (one compile per value):
the interpreter cannot loop to a runtime bound. No split over K: the 64-entry order is
the contract, so one token's heads run in one program from the first block to the last.
"""

from __future__ import annotations

import math

import torch

from ..reference.sparse_attn import sparse_attn as _sparse_attn_reference
from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, tl, triton
from .packed_rows import fp4_words_mode

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16
    from .packed_rows import fp4_rows_bf16

__all__ = ["sparse_attn", "sparse_attn_torch", "BLOCK_K", "MAX_HEAD_DIM"]

BLOCK_K = 64  # selection entries per online-softmax step: part of the numerics contract
MAX_HEAD_DIM = 512


if HAVE_TRITON:

    @triton.jit
    def _sparse_attn_kernel(
        q_ptr,
        win_ptr,
        comp_ptr,
        sel_ptr,
        sink_ptr,
        out_ptr,
        H,
        D,
        K,
        offset,
        n_comp,
        scale,
        stride_qt,
        stride_qh,
        stride_qd,
        stride_wn,
        stride_wd,
        stride_cn,
        stride_cd,
        stride_st,
        stride_sk,
        stride_ot,
        stride_oh,
        stride_od,
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_K: tl.constexpr,
        K_BLOCKS: tl.constexpr,
        DOT_FP32: tl.constexpr,
        PACKED_COMP: tl.constexpr,
        WORDS: tl.constexpr,  # packed comp rows: packed_rows.fp4_words_mode
        PDL: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        h0 = tl.program_id(1) * BLOCK_H

        # [BLOCK_H] heads of this program, [BLOCK_D] columns, [BLOCK_K] entries of one block
        offs_h = h0 + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask_d = offs_d < D
        offs_h64 = offs_h.to(tl.int64)
        offs_d64 = offs_d.to(tl.int64)

        # q: [BLOCK_H, BLOCK_D] bf16, padded heads and columns are 0
        q_ptrs = q_ptr + t * stride_qt + offs_h64[:, None] * stride_qh + offs_d64[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)

        # running max and sum: [BLOCK_H] fp32; acc: [BLOCK_H, BLOCK_D] fp32
        mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)

        for kb in range(0, K_BLOCKS):
            # idx: [BLOCK_K] int64 selection entries; past K reads as absent (−1)
            kk = kb * BLOCK_K + offs_k
            idx = tl.load(sel_ptr + t * stride_st + kk.to(tl.int64) * stride_sk, mask=kk < K, other=-1)
            idx = idx.to(tl.int64)
            present = idx >= 0
            from_win = present & (idx < offset)
            crow = idx - offset
            from_comp = present & (idx >= offset) & (crow < n_comp)

            # rows: [BLOCK_K, BLOCK_D] bf16, gathered from win or comp; absent entries are 0
            w_ptrs = win_ptr + tl.where(from_win, idx, 0)[:, None] * stride_wn + offs_d64[None, :] * stride_wd
            if PACKED_COMP:  # comp: V4.1's packed fp4_e4m3 rows, dequantized here (exact)
                wm = from_win[:, None] & mask_d[None, :]
                if tl.sum(from_comp.to(tl.int32), axis=0) == 0:  # a block of window rows only
                    rows = tl.load(w_ptrs, mask=wm, other=0.0)
                else:
                    c_base = comp_ptr + tl.where(from_comp, crow, 0) * stride_cn
                    rows = fp4_rows_bf16(c_base, from_comp, 0, D, BLOCK_D, 16, False, WORDS)
                    if tl.sum(from_win.to(tl.int32), axis=0) > 0:
                        rows = tl.where(from_win[:, None], tl.load(w_ptrs, mask=wm, other=0.0), rows)
            else:
                c_ptrs = comp_ptr + tl.where(from_comp, crow, 0)[:, None] * stride_cn + offs_d64[None, :] * stride_cd
                r_ptrs = tl.where(from_win[:, None], w_ptrs, c_ptrs)
                rows = tl.load(r_ptrs, mask=(from_win | from_comp)[:, None] & mask_d[None, :], other=0.0)

            # s: [BLOCK_H, BLOCK_K] fp32 logits, τ applied after the dot; absent → −inf
            if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                s = tl.dot(q.to(tl.float32), tl.trans(rows.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(rows))
            s = s * scale
            s = tl.where(present[None, :], s, float("-inf"))

            # new, base, alpha: [BLOCK_H] fp32; base = 0 while nothing is present (exps stay 0)
            new = tl.maximum(mx, tl.max(s, axis=1))
            base = tl.where(new == float("-inf"), 0.0, new)
            alpha = tl.exp(mx - base)

            # p: [BLOCK_H, BLOCK_K] fp32; the sum keeps fp32 p, the rows are weighted by bf16(p)
            p = tl.exp(s - base[:, None])
            den = den * alpha + tl.sum(p, axis=1)
            p_bf16 = round_bf16(p)
            if DOT_FP32:
                pv = tl.dot(p_bf16.to(tl.float32), rows.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p_bf16, rows)
            acc = acc * alpha[:, None] + pv
            mx = new

        # sink: [BLOCK_H] fp32, joins the denominator last; no key present → den = 1, acc = 0, o = 0
        sink = tl.load(sink_ptr + offs_h64, mask=mask_h, other=0.0)
        none = mx == float("-inf")
        den = tl.where(none, 1.0, den + tl.exp(sink - tl.where(none, sink, mx)))

        # o: [BLOCK_H, BLOCK_D] bf16
        o = round_bf16(tl.math.div_rn(acc, den[:, None]))
        o_ptrs = out_ptr + t * stride_ot + offs_h64[:, None] * stride_oh + offs_d64[None, :] * stride_od
        tl.store(o_ptrs, o, mask=mask_h[:, None] & mask_d[None, :])


def _check(cond: bool, what: str, value, allowed: str) -> None:
    if not cond:
        raise ValueError(f"{what} = {value}; allowed: {allowed}")


def _validate(
    q, win, comp, sel, offset, sink, scale, out, allow_packed: bool = False, packed_comp: bool = False
) -> None:
    """ValueError naming the argument, its value and the allowed range; no device sync.
    allow_packed: win and comp may be uint8 rows in V4.1's packed formats (`attnv41.packed`:
    win fp8_e8m0 `[Nw, D + D/32]`, comp fp4_e4m3 `[Nc, D/2 + D/16]`), both or neither.
    packed_comp: comp alone may be packed (win bf16: the prefill regime's fresh rows)."""
    for name, x in (("q", q), ("win", win), ("comp", comp), ("sel", sel), ("sink", sink)):
        _check(isinstance(x, torch.Tensor), f"type({name})", type(x).__name__, "torch.Tensor")
    _check(q.dim() == 3, "q.shape", tuple(q.shape), "[m, H, D]")
    m, H, D = q.shape
    _check(q.dtype == torch.bfloat16, "q.dtype", q.dtype, "torch.bfloat16")
    _check(H >= 1, "q.shape[1] (H)", H, "H ≥ 1")
    _check(1 <= D <= MAX_HEAD_DIM, "q.shape[2] (D)", D, f"1 ≤ D ≤ {MAX_HEAD_DIM}")
    if allow_packed and win.dtype == torch.uint8:
        _check(D % 32 == 0, "q.shape[2] (D)", D, "a multiple of 32 (packed rows)")
        wd, cd = D + D // 32, D // 2 + D // 16
        _check(win.dim() == 2 and win.shape[1] == wd, "win.shape", tuple(win.shape), f"[Nw, {wd}] (packed fp8_e8m0)")
        _check(comp.dim() == 2, "comp.shape", tuple(comp.shape), f"[Nc, {cd}] (packed fp4_e4m3)")
        if comp.shape[0] > 0:
            _check(comp.shape[1] == cd, "comp.shape", tuple(comp.shape), f"[Nc, {cd}] (packed fp4_e4m3)")
            _check(comp.dtype == torch.uint8, "comp.dtype", comp.dtype, "torch.uint8 (packed, as win)")
        for name, x in (("win", win), ("comp", comp)):
            _check(x.shape[0] == 0 or x.is_contiguous(), f"{name}.is_contiguous()", False, "True (packed rows)")
    else:
        _check(win.dim() == 2 and win.shape[1] == D, "win.shape", tuple(win.shape), f"[Nw, {D}]")
        allowed = "torch.bfloat16 (or torch.uint8 packed rows)" if allow_packed else "torch.bfloat16"
        _check(win.dtype == torch.bfloat16, "win.dtype", win.dtype, allowed)
        if packed_comp and comp.dtype == torch.uint8:
            _check(D % 32 == 0, "q.shape[2] (D)", D, "a multiple of 32 (packed rows)")
            cd = D // 2 + D // 16
            _check(
                comp.dim() == 2 and comp.shape[1] == cd,
                "comp.shape",
                tuple(comp.shape),
                f"[Nc, {cd}] (packed fp4_e4m3)",
            )
            _check(comp.shape[0] == 0 or comp.is_contiguous(), "comp.is_contiguous()", False, "True (packed rows)")
        else:
            _check(comp.dim() == 2 and comp.shape[1] == D, "comp.shape", tuple(comp.shape), f"[Nc, {D}]")
            if comp.shape[0] > 0:
                allowed = (
                    "torch.bfloat16 (or torch.uint8 packed rows; any dtype when Nc = 0)"
                    if packed_comp
                    else ("torch.bfloat16 (any dtype when Nc = 0)")
                )
                _check(comp.dtype == torch.bfloat16, "comp.dtype", comp.dtype, allowed)
    _check(sel.dim() == 2 and sel.shape[0] == m, "sel.shape", tuple(sel.shape), f"[{m}, K]")
    _check(sel.dtype == torch.int32, "sel.dtype", sel.dtype, "torch.int32")
    _check(
        isinstance(offset, int) and not isinstance(offset, bool) and 0 <= offset <= win.shape[0],
        "offset",
        offset,
        f"a python int, 0 ≤ offset ≤ Nw = {win.shape[0]}",
    )
    _check(tuple(sink.shape) == (H,), "sink.shape", tuple(sink.shape), f"[{H}]")
    _check(sink.dtype == torch.float32, "sink.dtype", sink.dtype, "torch.float32")
    _check(
        isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale),
        "scale",
        scale,
        "a finite python float",
    )
    for name, x in (("win", win), ("comp", comp), ("sel", sel), ("sink", sink)):
        _check(x.device == q.device, f"{name}.device", x.device, f"q.device = {q.device}")
    if out is not None:
        _check(isinstance(out, torch.Tensor), "type(out)", type(out).__name__, "torch.Tensor or None")
        _check(tuple(out.shape) == (m, H, D), "out.shape", tuple(out.shape), f"[{m}, {H}, {D}]")
        _check(out.dtype == torch.bfloat16, "out.dtype", out.dtype, "torch.bfloat16")
        _check(out.device == q.device, "out.device", out.device, f"q.device = {q.device}")


def _launch_config(H: int, D: int) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_D, num_warps, num_stages), from H and D only, never from m: a
    token's bits must not depend on how many tokens share the launch.

    Measured on an H200 (H = 64, K = 640, random rows of a 68k-row table): all 64 heads in
    one program beat 32 by 1.7× at m = 1024 (D = 512) and by 1.6–1.8× at D ≤ 256, and
    lost by ~15% at m ≤ 64 (fewer programs than SMs). D = 512 fits shared memory only
    with one stage (a [64, 512] bf16 row block is 64 KiB) and wants 8 warps."""
    block_d = max(16, triton.next_power_of_2(D))
    block_h = min(64, max(16, triton.next_power_of_2(H)))
    num_warps = 8 if block_d >= 512 else 4
    num_stages = 1 if block_d >= 512 else 3
    return block_h, block_d, num_warps, num_stages


def sparse_attn(q, win, comp, sel, offset, sink, scale, out=None) -> torch.Tensor:
    """o[t, h] = Σ_j softmax_j(τ·q[t,h]·R_j ∪ sink_h) · R_j as bf16 `[m, H, D]`, on the
    Triton kernel; the contract and order are in this module's docstring."""
    _validate(q, win, comp, sel, offset, sink, scale, out, packed_comp=True)
    require_triton("sparse_attn", q, win, sel, sink)
    m, H, D = q.shape
    K = sel.shape[1]
    if out is None:
        out = torch.empty(m, H, D, dtype=torch.bfloat16, device=q.device)
    if m == 0:
        return out
    n_comp = comp.shape[0]
    packed = n_comp > 0 and comp.dtype == torch.uint8
    if n_comp == 0:
        comp = win  # nothing reads comp; keep the kernel's pointer types fixed
    block_h, block_d, num_warps, num_stages = _launch_config(H, D)
    grid = (m, triton.cdiv(H, block_h))
    _sparse_attn_kernel[grid](
        q,
        win,
        comp,
        sel,
        sink,
        out,
        H,
        D,
        K,
        offset,
        n_comp,
        float(scale),
        *q.stride(),
        *win.stride(),
        *comp.stride(),
        *sel.stride(),
        *out.stride(),
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        BLOCK_K=BLOCK_K,
        K_BLOCKS=triton.cdiv(K, BLOCK_K),
        DOT_FP32=interpreting(),
        PACKED_COMP=packed,
        WORDS=fp4_words_mode(comp, asm=False) if packed else 0,  # the fp32 form (PTX untimed here)
        num_warps=num_warps,
        num_stages=num_stages,
        enable_fp_fusion=False,  # no FMA contraction: the twin's separate fp32 multiply and add
        **pdl_launch(q),
    )
    return out


def sparse_attn_torch(q, win, comp, sel, offset, sink, scale, out=None) -> torch.Tensor:
    """The same op on the reference twin (any device, no Triton): the runtime's CPU path.

    Runs `reference.sparse_attn.sparse_attn` on `cat(win[:offset], comp)` and writes the
    result into `out` (allocated when None). The twin pads the selection with −1 to whole
    64-entry blocks, so a launch at a fixed width (the runtime's window + index_topk) gives
    the bytes the reference gives at the natural width."""
    _validate(q, win, comp, sel, offset, sink, scale, out, packed_comp=True)
    m, H, D = q.shape
    if comp.shape[0] > 0 and comp.dtype == torch.uint8:
        from ..packed import unpack  # noqa: PLC0415

        comp = unpack(comp, "fp4_e4m3", D)  # exact: the bf16 values of the rows
    rows = win[:offset] if comp.shape[0] == 0 else torch.cat([win[:offset], comp])
    if rows.shape[0] == 0:
        rows = win.new_zeros(1, D)  # no row at all: every entry must be −1; the twin still gathers row 0
    o = _sparse_attn_reference(q, rows, sel, sink, float(scale))
    if out is None:
        return o
    out.copy_(o)
    return out
