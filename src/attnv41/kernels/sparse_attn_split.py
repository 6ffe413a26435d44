"""Sparse attention for the decode regime: flash-decoding over fixed splits of the
selection (Triton), twin `attnv41.reference.sparse_attn.sparse_attn_split`.

`sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None)` has the contract of
`kernels.sparse_attn.sparse_attn` (same arguments, same −1 rule, same checks) and computes
the same attention in another fp32 order, chosen by regime, never by m: every decode
step (one token per sequence, whatever the number of tokens in the call) runs this
kernel; prefill runs the fused one. The two orders agree within one bf16 rounding.

Order (part of the numerics contract): the K selection entries are cut into splits of
SPLIT = BLOCKS_PER_SPLIT · 64 entries, a constant of the module (so the split count of a
launch is cdiv(K, SPLIT): the selection width of the layer class, never m or the SM
count). Each split runs the fused kernel's online softmax over its 64-entry blocks from a
fresh state: its bf16 probabilities are rounded against the split's own running max. The
combine then takes the splits in order: M = max of the split maxima; for a split with a
finite max, w = exp(max − M), sum += w·sum_s, acc += w·acc_s; the sink joins the sum last
as exp(sink − M); o = bf16(acc / sum) (IEEE division, nearest even). All entries absent →
o = 0 exactly; appending −1 entries changes no bit (an all-absent split is skipped).
A token's programs read only its own row of q and sel: its bits do not depend on the
other tokens of the call.

Kernels: (1) `_split_kernel`, grid (m, n_splits, head blocks · D / PV_D): up to 64 heads
of a token (one
gather of each 64-row block serves them through `tl.dot`), the logits over the whole
head dim, the weighted rows over a PV_D-column slice of it (so a split's work spreads over
D / PV_D programs and each holds a [BLOCK_H, PV_D] accumulator); it stores the split's
fp32 max, sum and accumulator slice. The logits and probabilities are the same in every
slice's program (same code, same operands). (2) `_combine_kernel`, grid (m, cdiv(H,
BLOCK_HC)): the in-order combine above.
"""

from __future__ import annotations

import torch

from ..reference.sparse_attn import sparse_attn_split as _split_reference
from ._triton import HAVE_TRITON, interpreting, require_triton, tl, triton
from .sparse_attn import BLOCK_K, _validate

if HAVE_TRITON:
    from ._triton import round_bf16

__all__ = ["sparse_attn_split", "sparse_attn_split_torch", "SPLIT", "BLOCKS_PER_SPLIT"]

BLOCKS_PER_SPLIT = 1  # 64-entry blocks per split: part of the numerics contract
SPLIT = BLOCKS_PER_SPLIT * BLOCK_K
# The launch configuration (tile shapes, warps): constants, never derived from m.
_TUNE = dict(variant="chunked", bps=BLOCKS_PER_SPLIT, bh=64, dk=128, pv_d=128, warps=4, stages=3, comb_h=16, comb_d=128)

if HAVE_TRITON:

    @triton.jit
    def _split_kernel(
        q_ptr,
        win_ptr,
        comp_ptr,
        sel_ptr,
        part_ptr,  # fp32 [m, S, H, D] accumulators
        stat_ptr,  # fp32 [m, S, 2, H]: the split's running max, then its sum
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
        BLOCK_H: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PV_D: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BPS: tl.constexpr,
        N_DC: tl.constexpr,
        DOT_FP32: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        sp = tl.program_id(1)
        hb = tl.program_id(2) // N_DC
        dc = tl.program_id(2) % N_DC
        S = tl.num_programs(1)

        # [BLOCK_H] heads, [BLOCK_D] columns of the logits, [PV_D] columns of this slice
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        offs_v = dc * PV_D + tl.arange(0, PV_D)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask_d = offs_d < D
        mask_v = offs_v < D
        offs_h64 = offs_h.to(tl.int64)
        offs_d64 = offs_d.to(tl.int64)
        offs_v64 = offs_v.to(tl.int64)

        # q: [BLOCK_H, BLOCK_D] bf16, padded heads and columns are 0
        q_ptrs = q_ptr + t * stride_qt + offs_h64[:, None] * stride_qh + offs_d64[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=mask_h[:, None] & mask_d[None, :], other=0.0)

        # the split's running max and sum [BLOCK_H] fp32, accumulator slice [BLOCK_H, PV_D] fp32
        mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, PV_D], dtype=tl.float32)

        for kb in range(0, BPS):
            # idx: [BLOCK_K] selection entries of this block; past K reads as absent (−1)
            kk = (sp * BPS + kb) * BLOCK_K + offs_k
            idx = tl.load(sel_ptr + t * stride_st + kk.to(tl.int64) * stride_sk, mask=kk < K, other=-1)
            idx = idx.to(tl.int64)
            present = idx >= 0
            from_win = present & (idx < offset)
            crow = idx - offset
            from_comp = present & (idx >= offset) & (crow < n_comp)
            ok = from_win | from_comp
            wrow = tl.where(from_win, idx, 0)
            crow = tl.where(from_comp, crow, 0)

            # rows: [BLOCK_K, BLOCK_D] bf16 for the logits; absent entries are 0
            w_ptrs = win_ptr + wrow[:, None] * stride_wn + offs_d64[None, :] * stride_wd
            c_ptrs = comp_ptr + crow[:, None] * stride_cn + offs_d64[None, :] * stride_cd
            rows = tl.load(tl.where(from_win[:, None], w_ptrs, c_ptrs), mask=ok[:, None] & mask_d[None, :], other=0.0)

            # s: [BLOCK_H, BLOCK_K] fp32 logits, τ after the dot; absent → −inf
            if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                s = tl.dot(q.to(tl.float32), tl.trans(rows.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(rows))
            s = s * scale
            s = tl.where(present[None, :], s, float("-inf"))

            # new, base, alpha: [BLOCK_H] fp32; base = 0 while nothing is present
            new = tl.maximum(mx, tl.max(s, axis=1))
            base = tl.where(new == float("-inf"), 0.0, new)
            alpha = tl.exp(mx - base)
            p = tl.exp(s - base[:, None])
            den = den * alpha + tl.sum(p, axis=1)
            p_bf16 = round_bf16(p)

            # vrows: [BLOCK_K, PV_D] bf16, this program's column slice of the same rows
            wv = win_ptr + wrow[:, None] * stride_wn + offs_v64[None, :] * stride_wd
            cv = comp_ptr + crow[:, None] * stride_cn + offs_v64[None, :] * stride_cd
            vrows = tl.load(tl.where(from_win[:, None], wv, cv), mask=ok[:, None] & mask_v[None, :], other=0.0)
            if DOT_FP32:
                pv = tl.dot(p_bf16.to(tl.float32), vrows.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(p_bf16, vrows)
            acc = acc * alpha[:, None] + pv
            mx = new

        # the split's state: accumulator slice [BLOCK_H, PV_D]; max and sum [BLOCK_H] (slice 0 stores them)
        row = t * S + sp
        a_ptrs = part_ptr + (row * H + offs_h64[:, None]) * D + offs_v64[None, :]
        tl.store(a_ptrs, acc, mask=mask_h[:, None] & mask_v[None, :])
        st = stat_ptr + row * 2 * H + offs_h64
        tl.store(st, mx, mask=mask_h & (dc == 0))
        tl.store(st + H, den, mask=mask_h & (dc == 0))

    @triton.jit
    def _split_kernel_chunked(
        q_ptr,
        win_ptr,
        comp_ptr,
        sel_ptr,
        part_ptr,  # fp32 [m, S, H, D] accumulators
        stat_ptr,  # fp32 [m, S, 2, H]: the split's running max, then its sum
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
        BLOCK_H: tl.constexpr,
        D_CHUNKS: tl.constexpr,
        DK: tl.constexpr,
        PV_CHUNKS: tl.constexpr,
        PV_D: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BPS: tl.constexpr,
        DOT_FP32: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        sp = tl.program_id(1)
        hb = tl.program_id(2)
        S = tl.num_programs(1)

        # [BLOCK_H] heads, [DK] columns of a logits chunk, [PV_D] columns of a weighted-rows chunk
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_c = tl.arange(0, DK)
        offs_v = tl.arange(0, PV_D)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        offs_h64 = offs_h.to(tl.int64)
        row = t * S + sp
        a_base = part_ptr + (row * H + offs_h64[:, None]) * D  # [BLOCK_H, 1]

        mx = tl.full([BLOCK_H], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_H], dtype=tl.float32)
        for kb in tl.static_range(0, BPS):
            # idx: [BLOCK_K] selection entries of this block; past K reads as absent (−1)
            kk = (sp * BPS + kb) * BLOCK_K + offs_k
            idx = tl.load(sel_ptr + t * stride_st + kk.to(tl.int64) * stride_sk, mask=kk < K, other=-1)
            idx = idx.to(tl.int64)
            present = idx >= 0
            from_win = present & (idx < offset)
            crow = idx - offset
            from_comp = present & (idx >= offset) & (crow < n_comp)
            ok = from_win | from_comp
            # base: [BLOCK_K] row addresses (win or comp); column strides below
            w_base = win_ptr + tl.where(from_win, idx, 0) * stride_wn
            c_base = comp_ptr + tl.where(from_comp, crow, 0) * stride_cn

            # s: [BLOCK_H, BLOCK_K] fp32 logits, summed over D in chunks of DK columns
            s = tl.zeros([BLOCK_H, BLOCK_K], dtype=tl.float32)
            for c in range(0, D_CHUNKS):
                cols = c * DK + offs_c
                cm = cols < D
                cols64 = cols.to(tl.int64)
                q_c = tl.load(
                    q_ptr + t * stride_qt + offs_h64[:, None] * stride_qh + cols64[None, :] * stride_qd,
                    mask=mask_h[:, None] & cm[None, :],
                    other=0.0,
                )
                r_ptrs = tl.where(
                    from_win[:, None],
                    w_base[:, None] + cols64[None, :] * stride_wd,
                    c_base[:, None] + cols64[None, :] * stride_cd,
                )
                r_c = tl.load(r_ptrs, mask=ok[:, None] & cm[None, :], other=0.0)
                if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                    s = tl.dot(q_c.to(tl.float32), tl.trans(r_c.to(tl.float32)), s, input_precision="ieee")
                else:
                    s = tl.dot(q_c, tl.trans(r_c), s)
            s = s * scale
            s = tl.where(present[None, :], s, float("-inf"))

            # new, base, alpha: [BLOCK_H] fp32; base = 0 while nothing is present
            new = tl.maximum(mx, tl.max(s, axis=1))
            base = tl.where(new == float("-inf"), 0.0, new)
            alpha = tl.exp(mx - base)
            p = tl.exp(s - base[:, None])
            den = den * alpha + tl.sum(p, axis=1)
            p_bf16 = round_bf16(p)
            mx = new

            # the weighted rows, chunk by chunk, into the split's accumulator (this program's own)
            for c in range(0, PV_CHUNKS):
                cols = c * PV_D + offs_v
                cm = cols < D
                cols64 = cols.to(tl.int64)
                v_ptrs = tl.where(
                    from_win[:, None],
                    w_base[:, None] + cols64[None, :] * stride_wd,
                    c_base[:, None] + cols64[None, :] * stride_cd,
                )
                v_c = tl.load(v_ptrs, mask=ok[:, None] & cm[None, :], other=0.0)
                if DOT_FP32:
                    pv = tl.dot(p_bf16.to(tl.float32), v_c.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p_bf16, v_c)
                a_ptrs = a_base + cols64[None, :]
                am = mask_h[:, None] & cm[None, :]
                if kb > 0:
                    pv = tl.load(a_ptrs, mask=am, other=0.0) * alpha[:, None] + pv
                tl.store(a_ptrs, pv, mask=am)
            if BPS > 1:
                tl.debug_barrier()  # this block's accumulator stores before the next block reads them

        st = stat_ptr + row * 2 * H + offs_h64
        tl.store(st, mx, mask=mask_h)
        tl.store(st + H, den, mask=mask_h)

    @triton.jit
    def _combine_kernel(
        part_ptr,
        stat_ptr,
        sink_ptr,
        out_ptr,
        H,
        D,
        stride_ot,
        stride_oh,
        stride_od,
        S: tl.constexpr,
        BLOCK_HC: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        h0 = tl.program_id(1) * BLOCK_HC

        # [BLOCK_HC] heads, [BLOCK_D] columns (this program's slice of the head dim)
        offs_h = h0 + tl.arange(0, BLOCK_HC)
        offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_h = offs_h < H
        mask_d = offs_d < D
        offs_h64 = offs_h.to(tl.int64)
        offs_d64 = offs_d.to(tl.int64)

        # big: [BLOCK_HC] fp32, the max over the splits' maxima
        big = tl.full([BLOCK_HC], float("-inf"), tl.float32)
        for sp in tl.static_range(S):  # unrolled: every split's loads can be in flight at once
            mx_s = tl.load(stat_ptr + (t * S + sp) * 2 * H + offs_h64, mask=mask_h, other=float("-inf"))
            big = tl.maximum(big, mx_s)

        # den: [BLOCK_HC] fp32; acc: [BLOCK_HC, BLOCK_D] fp32; splits in order
        den = tl.zeros([BLOCK_HC], dtype=tl.float32)
        acc = tl.zeros([BLOCK_HC, BLOCK_D], dtype=tl.float32)
        for sp in tl.static_range(S):
            row = t * S + sp
            mx_s = tl.load(stat_ptr + row * 2 * H + offs_h64, mask=mask_h, other=float("-inf"))
            den_s = tl.load(stat_ptr + row * 2 * H + H + offs_h64, mask=mask_h, other=0.0)
            live = mx_s != float("-inf")
            w = tl.exp(mx_s - tl.where(live, big, 0.0))
            a_ptrs = part_ptr + (row * H + offs_h64[:, None]) * D + offs_d64[None, :]
            acc_s = tl.load(a_ptrs, mask=(mask_h & live)[:, None] & mask_d[None, :], other=0.0)
            den = tl.where(live, den + w * den_s, den)
            acc = tl.where(live[:, None], acc + w[:, None] * acc_s, acc)

        # sink: [BLOCK_HC] fp32, joins the sum last; no key present → den = 1, acc = 0, o = 0
        sink = tl.load(sink_ptr + offs_h64, mask=mask_h, other=0.0)
        none = big == float("-inf")
        den = tl.where(none, 1.0, den + tl.exp(sink - tl.where(none, sink, big)))
        o = round_bf16(tl.math.div_rn(acc, den[:, None]))
        o_ptrs = out_ptr + t * stride_ot + offs_h64[:, None] * stride_oh + offs_d64[None, :] * stride_od
        tl.store(o_ptrs, o, mask=mask_h[:, None] & mask_d[None, :])


def _config(H: int, D: int, pv_d: int, bh: int = 64) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_D, PV_D) from H and D only (never m)."""
    block_d = max(16, triton.next_power_of_2(D))
    block_h = min(bh, max(16, triton.next_power_of_2(H)))
    pv = min(block_d, pv_d)
    return block_h, block_d, pv


def sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None, **tune) -> torch.Tensor:
    """o[t, h] = Σ_j softmax_j(τ·q[t,h]·R_j ∪ sink_h) · R_j as bf16 `[m, H, D]`, split over
    the selection (the decode regime); contract as `sparse_attn.sparse_attn`, order in
    this module's docstring. `tune` is for the tuning script only (it may change the
    order: production calls never pass it)."""
    _validate(q, win, comp, sel, offset, sink, scale, out)
    require_triton("sparse_attn_split", q, win, sel, sink)
    m, H, D = q.shape
    K = sel.shape[1]
    if out is None:
        out = torch.empty(m, H, D, dtype=torch.bfloat16, device=q.device)
    if m == 0:
        return out
    n_comp = comp.shape[0]
    if n_comp == 0:
        comp = win  # nothing reads comp; keep the kernel's pointer types fixed
    cfg = dict(_TUNE)
    cfg.update(tune)
    bps = cfg["bps"]
    block_h, block_d, pv_d = _config(H, D, cfg["pv_d"], cfg["bh"])
    S = max(1, triton.cdiv(K, bps * BLOCK_K))
    part = torch.empty(m, S, H, D, dtype=torch.float32, device=q.device)
    stat = torch.empty(m, S, 2, H, dtype=torch.float32, device=q.device)
    common = (q, win, comp, sel, part, stat, H, D, K, offset, n_comp, float(scale))
    common += (*q.stride(), *win.stride(), *comp.stride(), *sel.stride())
    launch = dict(num_warps=cfg["warps"], num_stages=cfg["stages"], enable_fp_fusion=False)
    n_hb = triton.cdiv(H, block_h)
    if cfg["variant"] == "chunked":
        dk = min(block_d, cfg["dk"])
        _split_kernel_chunked[(m, S, n_hb)](
            *common,
            BLOCK_H=block_h,
            D_CHUNKS=triton.cdiv(D, dk),
            DK=dk,
            PV_CHUNKS=triton.cdiv(D, pv_d),
            PV_D=pv_d,
            BLOCK_K=BLOCK_K,
            BPS=bps,
            DOT_FP32=interpreting(),
            **launch,
        )
    else:
        n_dc = triton.cdiv(D, pv_d)
        _split_kernel[(m, S, n_hb * n_dc)](
            *common,
            BLOCK_H=block_h,
            BLOCK_D=block_d,
            PV_D=pv_d,
            BLOCK_K=BLOCK_K,
            BPS=bps,
            N_DC=n_dc,
            DOT_FP32=interpreting(),
            **launch,
        )
    if cfg.get("skip_combine"):  # tuning only: the split kernel's time alone
        return out
    bdc = min(block_d, cfg["comb_d"])
    _combine_kernel[(m, triton.cdiv(H, cfg["comb_h"]), triton.cdiv(D, bdc))](
        part,
        stat,
        sink,
        out,
        H,
        D,
        *out.stride(),
        S=S,
        BLOCK_HC=cfg["comb_h"],
        BLOCK_D=bdc,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def sparse_attn_split_torch(q, win, comp, sel, offset, sink, scale, out=None) -> torch.Tensor:
    """The split order on the reference twin (any device, no Triton), for tests."""
    _validate(q, win, comp, sel, offset, sink, scale, out)
    m, H, D = q.shape
    rows = win[:offset] if comp.shape[0] == 0 else torch.cat([win[:offset], comp])
    if rows.shape[0] == 0:
        rows = win.new_zeros(1, D)
    o = _split_reference(q, rows, sel, sink, float(scale), SPLIT)
    if out is None:
        return o
    out.copy_(o)
    return out
