"""Sparse attention for the decode regime: the selection split across programs by its
64-entry blocks (Triton), in the reference's order. Twin: `attnv41.reference.sparse_attn.
sparse_attn` itself (the same order the fused kernel and the golden data follow).

`sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None)` has the contract of
`kernels.sparse_attn.sparse_attn` (same arguments, −1 rule and checks). The fused kernel
runs one program per token from the first block to the last (one SM per token: 77 µs at
batch 1 on an H200); this one spreads the blocks over programs and keeps the order:

1. `_logits_kernel`, grid (m, blocks, head blocks): per block, the logits τ·q·Rᵀ (fp32,
   absent → −inf) and their max per head, stored.
2. `_pv_kernel`, grid (m, blocks, head blocks · D/PV_D): the running max after block b is
   the max of the block maxima 0..b (max is exact, so this equals the fused loop's running
   max bit for bit); p = exp(s − that max), its fp32 sum, and the weighted rows
   dot(bf16(p), R) over a PV_D-column slice, into a fresh fp32 accumulator, stored.
3. `_combine_kernel`, grid (m, head blocks, D slices): the fused loop's recurrence over the
   blocks in order, on the stored sums: den = den·α + Σp, acc = acc·α + pv with
   α = exp(old max − new max); the sink last; o = bf16(acc / den).

So each block's bf16 probabilities are rounded against the same running max as in the
reference and the fused kernel, and the recurrence is the reference's formula (a
separate multiply and add). What may differ from the fused kernel is fp32 summation order
only: the logits' dot is taken in D chunks, a block's Σp in another reduction tree, and
the fused kernel folds acc·α into its second dot's accumulator (Triton's dot-add
combine), which this split keeps apart as the reference does. Chosen by regime, never by
m: every decode step (one token per sequence, whatever the number of tokens in a call)
runs this kernel; prefill runs the fused one. A token's programs read only its own row of
q and sel, and the tile shapes are constants, so its bits do not depend on m or on the
other tokens of the call; appending −1 entries changes no bit (an all-absent block has
α = 1 and adds exact zeros).

Workspace per token: the logits (H·64·4 bytes per block), the weighted rows (H·D·4 bytes
per block: 128 KiB at 64 heads × 512) and two [H] vectors per block, allocated per call
(from the graph's pool under capture).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, interpreting, require_triton, tl, triton
from .sparse_attn import BLOCK_K, _validate, sparse_attn_torch

if HAVE_TRITON:
    from ._triton import round_bf16

__all__ = ["sparse_attn_split", "sparse_attn_split_torch"]

# The launch configuration (tile shapes, warps): constants, never derived from m.
_TUNE = dict(bh=64, dk=128, warps_a=4, stages_a=3, pv_d=128, warps_b=4, comb_h=16, comb_d=128)

if HAVE_TRITON:

    @triton.jit
    def _gather_ptrs(win_ptr, comp_ptr, sel_ptr, t, kk, K, offset, n_comp, stride_st, stride_sk, stride_wn, stride_cn):
        """One block's selection entries kk [BLOCK_K] of token t → (present, ok, win row base
        pointers, comp row base pointers), all [BLOCK_K]; past K reads as absent (−1)."""
        idx = tl.load(sel_ptr + t * stride_st + kk.to(tl.int64) * stride_sk, mask=kk < K, other=-1).to(tl.int64)
        present = idx >= 0
        from_win = present & (idx < offset)
        crow = idx - offset
        from_comp = present & (idx >= offset) & (crow < n_comp)
        w_base = win_ptr + tl.where(from_win, idx, 0) * stride_wn
        c_base = comp_ptr + tl.where(from_comp, crow, 0) * stride_cn
        return present, from_win, from_win | from_comp, w_base, c_base

    @triton.jit
    def _logits_kernel(
        q_ptr,
        win_ptr,
        comp_ptr,
        sel_ptr,
        s_ptr,  # fp32 [m, KB, H, BLOCK_K] logits (τ applied, absent → −inf)
        bm_ptr,  # fp32 [m, KB, H] block maxima
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
        BLOCK_K: tl.constexpr,
        DOT_FP32: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1)
        hb = tl.program_id(2)
        KB = tl.num_programs(1)

        # [BLOCK_H] heads, [DK] columns of one chunk, [BLOCK_K] entries of this block
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_c = tl.arange(0, DK)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        offs_h64 = offs_h.to(tl.int64)
        kk = kb * BLOCK_K + offs_k
        present, from_win, ok, w_base, c_base = _gather_ptrs(
            win_ptr, comp_ptr, sel_ptr, t, kk, K, offset, n_comp, stride_st, stride_sk, stride_wn, stride_cn
        )

        # s: [BLOCK_H, BLOCK_K] fp32, q·Rᵀ summed over D in chunks of DK columns
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

        row = t * KB + kb
        s_ptrs = s_ptr + (row * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :]
        tl.store(s_ptrs, s, mask=mask_h[:, None])
        tl.store(bm_ptr + row * H + offs_h64, tl.max(s, axis=1), mask=mask_h)

    @triton.jit
    def _pv_kernel(
        win_ptr,
        comp_ptr,
        sel_ptr,
        s_ptr,  # fp32 [m, KB, H, BLOCK_K]
        bm_ptr,  # fp32 [m, KB, H]
        pv_ptr,  # fp32 [m, KB, H, D] the blocks' weighted rows
        ps_ptr,  # fp32 [m, KB, H] the blocks' probability sums
        H,
        D,
        K,
        offset,
        n_comp,
        stride_wn,
        stride_wd,
        stride_cn,
        stride_cd,
        stride_st,
        stride_sk,
        BLOCK_H: tl.constexpr,
        PV_D: tl.constexpr,
        N_DC: tl.constexpr,
        BLOCK_K: tl.constexpr,
        K_BLOCKS: tl.constexpr,
        DOT_FP32: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1)
        hb = tl.program_id(2) // N_DC
        dc = tl.program_id(2) % N_DC

        # [BLOCK_H] heads, [PV_D] columns of this program's slice, [BLOCK_K] entries
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_v = dc * PV_D + tl.arange(0, PV_D)
        offs_k = tl.arange(0, BLOCK_K)
        mask_h = offs_h < H
        mask_v = offs_v < D
        offs_h64 = offs_h.to(tl.int64)
        offs_v64 = offs_v.to(tl.int64)

        # base: [BLOCK_H] fp32, the running max after this block (max is exact: any order)
        new = tl.full([BLOCK_H], float("-inf"), tl.float32)
        for j in tl.static_range(K_BLOCKS):
            bm_j = tl.load(bm_ptr + (t * K_BLOCKS + j) * H + offs_h64, mask=mask_h & (j <= kb), other=float("-inf"))
            new = tl.maximum(new, bm_j)
        base = tl.where(new == float("-inf"), 0.0, new)

        # p: [BLOCK_H, BLOCK_K] fp32 = exp(s − base), absent → 0
        row = t * K_BLOCKS + kb
        s = tl.load(s_ptr + (row * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :], mask=mask_h[:, None], other=0.0)
        p = tl.exp(s - base[:, None])
        tl.store(ps_ptr + row * H + offs_h64, tl.sum(p, axis=1), mask=mask_h & (dc == 0))
        p_bf16 = round_bf16(p)

        # vrows: [BLOCK_K, PV_D] bf16, this slice of the block's rows; pv: [BLOCK_H, PV_D] fp32
        kk = kb * BLOCK_K + offs_k
        present, from_win, ok, w_base, c_base = _gather_ptrs(
            win_ptr, comp_ptr, sel_ptr, t, kk, K, offset, n_comp, stride_st, stride_sk, stride_wn, stride_cn
        )
        v_ptrs = tl.where(
            from_win[:, None],
            w_base[:, None] + offs_v64[None, :] * stride_wd,
            c_base[:, None] + offs_v64[None, :] * stride_cd,
        )
        vrows = tl.load(v_ptrs, mask=ok[:, None] & mask_v[None, :], other=0.0)
        if DOT_FP32:
            pv = tl.dot(p_bf16.to(tl.float32), vrows.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p_bf16, vrows)
        tl.store(
            pv_ptr + (row * H + offs_h64[:, None]) * D + offs_v64[None, :], pv, mask=mask_h[:, None] & mask_v[None, :]
        )

    @triton.jit
    def _combine_kernel(
        pv_ptr,
        ps_ptr,
        bm_ptr,
        sink_ptr,
        out_ptr,
        H,
        D,
        stride_ot,
        stride_oh,
        stride_od,
        K_BLOCKS: tl.constexpr,
        BLOCK_HC: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        t = tl.program_id(0).to(tl.int64)

        # [BLOCK_HC] heads, [BLOCK_D] columns (this program's slice of the head dim)
        offs_h = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)
        offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        mask_h = offs_h < H
        mask_d = offs_d < D
        offs_h64 = offs_h.to(tl.int64)
        offs_d64 = offs_d.to(tl.int64)

        # the fused loop's recurrence, block by block: mx, den [BLOCK_HC], acc [BLOCK_HC, BLOCK_D] fp32
        mx = tl.full([BLOCK_HC], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_HC], dtype=tl.float32)
        acc = tl.zeros([BLOCK_HC, BLOCK_D], dtype=tl.float32)
        for kb in tl.static_range(K_BLOCKS):  # unrolled: every block's loads can be in flight at once
            row = t * K_BLOCKS + kb
            bm = tl.load(bm_ptr + row * H + offs_h64, mask=mask_h, other=float("-inf"))
            ps = tl.load(ps_ptr + row * H + offs_h64, mask=mask_h, other=0.0)
            pv = tl.load(
                pv_ptr + (row * H + offs_h64[:, None]) * D + offs_d64[None, :],
                mask=mask_h[:, None] & mask_d[None, :],
                other=0.0,
            )
            new = tl.maximum(mx, bm)
            base = tl.where(new == float("-inf"), 0.0, new)
            alpha = tl.exp(mx - base)
            den = den * alpha + ps
            acc = acc * alpha[:, None] + pv
            mx = new

        # sink: [BLOCK_HC] fp32, joins the sum last; no key present → den = 1, acc = 0, o = 0
        sink = tl.load(sink_ptr + offs_h64, mask=mask_h, other=0.0)
        none = mx == float("-inf")
        den = tl.where(none, 1.0, den + tl.exp(sink - tl.where(none, sink, mx)))
        o = round_bf16(tl.math.div_rn(acc, den[:, None]))
        o_ptrs = out_ptr + t * stride_ot + offs_h64[:, None] * stride_oh + offs_d64[None, :] * stride_od
        tl.store(o_ptrs, o, mask=mask_h[:, None] & mask_d[None, :])


def sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None, **tune) -> torch.Tensor:
    """o[t, h] = Σ_j softmax_j(τ·q[t,h]·R_j ∪ sink_h) · R_j as bf16 `[m, H, D]`, split over
    the selection's 64-entry blocks (the decode regime); contract as
    `sparse_attn.sparse_attn`, order in this module's docstring. `tune` is for the tuning
    script only (tile shapes and warps; the order stays the reference's)."""
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
    dev = q.device
    block_d = max(16, triton.next_power_of_2(D))
    block_h = min(cfg["bh"], max(16, triton.next_power_of_2(H)))
    n_hb = triton.cdiv(H, block_h)
    kbs = max(1, triton.cdiv(K, BLOCK_K))
    s_buf = torch.empty(m, kbs, H, BLOCK_K, dtype=torch.float32, device=dev)
    bm = torch.empty(m, kbs, H, dtype=torch.float32, device=dev)
    pv = torch.empty(m, kbs, H, D, dtype=torch.float32, device=dev)
    ps = torch.empty(m, kbs, H, dtype=torch.float32, device=dev)
    dk = min(block_d, cfg["dk"])
    strides = (*win.stride(), *comp.stride(), *sel.stride())
    _logits_kernel[(m, kbs, n_hb)](
        q,
        win,
        comp,
        sel,
        s_buf,
        bm,
        H,
        D,
        K,
        offset,
        n_comp,
        float(scale),
        *q.stride(),
        *strides,
        BLOCK_H=block_h,
        D_CHUNKS=triton.cdiv(D, dk),
        DK=dk,
        BLOCK_K=BLOCK_K,
        DOT_FP32=interpreting(),
        num_warps=cfg["warps_a"],
        num_stages=cfg["stages_a"],
        enable_fp_fusion=False,  # no FMA contraction: the twin's separate fp32 multiply and add
    )
    if cfg.get("only_logits"):  # tuning only: the first kernel's time alone
        return out
    pv_d = min(block_d, cfg["pv_d"])
    n_dc = triton.cdiv(D, pv_d)
    _pv_kernel[(m, kbs, n_hb * n_dc)](
        win,
        comp,
        sel,
        s_buf,
        bm,
        pv,
        ps,
        H,
        D,
        K,
        offset,
        n_comp,
        *strides,
        BLOCK_H=block_h,
        PV_D=pv_d,
        N_DC=n_dc,
        BLOCK_K=BLOCK_K,
        K_BLOCKS=kbs,
        DOT_FP32=interpreting(),
        num_warps=cfg["warps_b"],
        enable_fp_fusion=False,
    )
    if cfg.get("skip_combine"):  # tuning only
        return out
    bdc = min(block_d, cfg["comb_d"])
    _combine_kernel[(m, triton.cdiv(H, cfg["comb_h"]), triton.cdiv(D, bdc))](
        pv,
        ps,
        bm,
        sink,
        out,
        H,
        D,
        *out.stride(),
        K_BLOCKS=kbs,
        BLOCK_HC=cfg["comb_h"],
        BLOCK_D=bdc,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return out


def sparse_attn_split_torch(q, win, comp, sel, offset, sink, scale, out=None) -> torch.Tensor:
    """The twin on any device: the reference order itself (`sparse_attn.sparse_attn_torch`)."""
    return sparse_attn_torch(q, win, comp, sel, offset, sink, scale, out=out)
