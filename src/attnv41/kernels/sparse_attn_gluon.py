"""The decode regime's sparse attention in one pass per token, written in Gluon (Triton's
lower-level language: explicit layouts, `cp.async` gathers and Hopper's warpgroup MMA), with
the bits of `kernels.sparse_attn_split`'s two-kernel form.

Why: the two-kernel form (a logits kernel per 64-row block, then a loop over the blocks on
the stored logits) waits on each block's row gathers in turn; Triton's own loops cannot keep
a block's indirect gathers in flight while the previous block computes. Here each program
issues the gathers of block kb + 1 (`cp.async`, straight into shared memory) before it
computes block kb, so a token's ten blocks stream through two shared-memory stages.

Grid (m, NSPLIT): program (t, j) holds all the heads of token t (one warpgroup, the MMA's
64 rows) and columns j·D/NSPLIT … of the output. Each program computes the whole logits
tile of every block (its rows' full D), so the NSPLIT programs of a token compute the same
logits, maxima and probabilities; each weights only its own columns.

Order (the module doc of `kernels.sparse_attn_split`, the same operations in the same
order, so the same bits; checked byte for byte on the GPU):
- logits s = τ·(q·Rᵀ) per block, the MMA chained over D in 16-column steps from the first
  column, fp32; absent entries → −inf;
- running max = max(running max, block max); base = 0 where it is −inf; α = exp(mx − base);
  p = exp(s − base); den = den·α + Σp (Σp the fixed pairwise tree of `_row_sum`);
  acc = acc·α + dot(bf16(p), R), the dot in a fresh accumulator;
- the sink last, o = bf16(acc / den) (division rounded to nearest), NaN → 0x7FC0; with `rot`
  the inverse RoPE of o's tail as `_combine_epilogue` computes it.

No FMA contraction (`enable_fp_fusion=False`), as the Triton kernels.

Gluon does not run under `TRITON_INTERPRET`: on the CPU the kernel is compiled for sm_90
only (its registers, shared memory and SASS are checked offline); its numerics are checked
on the GPU against `sparse_attn_split` (bytes) and the reference.

Use: `sparse_attn_batch` takes it for calls of ≥ 32 tokens when switched on
(`ATTNV41_GLUON_ATTN=1`; off by default). H200, 2026-12-04 (BENCHMARKS.md, fifteenth entry):
alone 39.2 µs at B = 64 (0.87x FlashMLA; the Triton pair 49.6), but 51.2 µs per layer
inside the batched step against the Triton pair's 48.4, so the step is slower with it.
At B = 1 it takes 36 µs (ten blocks in sequence in one program). Its time is the gathers:
about 20 GB/s per SM with one 64 KiB block in flight, all that q (64 KiB) and two stages
leave of the shared memory.

PDL: launched with programmatic dependent launch on Hopper (`pdl`, on), it releases its
successor and waits for its predecessor before any load (`_pdl_release_wait`; the offline
SASS test checks the order).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, triton
from .sparse_attn import BLOCK_K, _validate

try:  # Gluon ships with Triton ≥ 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    HAVE_GLUON = HAVE_TRITON
except ImportError:  # pragma: no cover - an older Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "sparse_attn_gluon", "GLUON_TUNE"]

# Launch shape (constants of the geometry, never of m): nsplit programs per token (each its
# D / nsplit output columns), stages of 64 gathered rows in shared memory, the gathers issued
# in column chunks of ch, pdl (launched under programmatic dependent launch where
# `_triton.pdl_launch` allows it). None of them moves a bit (the GPU tests).
GLUON_TUNE = dict(nsplit=2, stages=2, ch=128, pdl=True)
_SMEM_MAX = 227 * 1024  # an sm_90 block's shared memory
_SMEM_EXTRA = 24 * 1024  # the selection (at most 8 KiB) and the layout conversions' scratch

if HAVE_GLUON:

    @gluon.jit
    def _opaque_gl(x):
        """x through an inline-asm move: keeps the block's dot in a fresh accumulator."""
        return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True, pack=1)

    @gluon.jit
    def _pdl_release_wait(PDL: gl.constexpr):
        """Programmatic dependent launch (`_triton.pdl_release`, then `pdl_wait`): the next
        kernel may start its programs; then block until the previous kernel finished and its
        writes are visible. Before any read of another kernel's output."""
        if PDL:
            gl.inline_asm_elementwise(
                "griddepcontrol.launch_dependents;\ngriddepcontrol.wait;\nmov.b32 $0, 0;",
                "=r",
                [],
                dtype=gl.int32,
                is_pure=False,
                pack=1,
            )

    @gluon.jit
    def _pv_step(p_op, r, acc, alpha, C0: gl.constexpr, N: gl.constexpr, MMA_O: gl.constexpr):
        """acc·α + dot(bf16(p), R[:, C0 : C0 + N]), the dot in a fresh accumulator."""
        pv = gl.zeros([p_op.shape[0], N], gl.float32, layout=MMA_O)
        pv = warpgroup_mma(p_op, r.slice(C0, N, dim=1), pv, use_acc=False, is_async=True)
        pv = warpgroup_mma_wait(num_outstanding=0, deps=(pv,))
        return acc * alpha[:, None] + _opaque_gl(pv)

    @gluon.jit
    def _block_sel(sel_smem, kb, K, BLOCK_K: gl.constexpr, layout: gl.constexpr):
        """[BLOCK_K] block kb's selection entries (past K: −1, absent) in `layout`."""
        kk = kb * BLOCK_K + gl.arange(0, BLOCK_K, layout=layout)
        return gl.where(kk < K, sel_smem.index(kb).load(layout), -1)

    @gluon.jit
    def _issue_rows(
        r_stage, win_ptr, comp_ptr, sel_smem, kb, K, offset, n_comp, stride_wn, stride_wd, stride_cn, stride_cd, D,
        BLOCK_K: gl.constexpr, BLOCK_D: gl.constexpr, LD: gl.constexpr, CH: gl.constexpr,
    ):  # fmt: skip
        """cp.async the rows of block kb (its entries from the selection in shared memory)
        into r_stage ([BLOCK_K, BLOCK_D] bf16; absent entries and columns past D zero-filled)."""
        idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(1, LD)).to(gl.int64)
        from_win = (idx >= 0) & (idx < offset)
        crow = idx - offset
        from_comp = (idx >= offset) & (crow < n_comp)
        ok = from_win | from_comp
        base = gl.where(from_win, win_ptr + gl.where(from_win, idx, 0) * stride_wn,
                        comp_ptr + gl.where(from_comp, crow, 0) * stride_cn)  # fmt: skip
        sd = gl.where(from_win, stride_wd, stride_cd)
        for c in gl.static_range(BLOCK_D // CH):  # in column chunks: fewer live pointers
            offs_d = c * CH + gl.arange(0, CH, layout=gl.SliceLayout(0, LD))
            ptrs = base[:, None] + offs_d.to(gl.int64)[None, :] * sd[:, None]
            mask = ok[:, None] & (offs_d < D)[None, :]
            async_copy.async_copy_global_to_shared(r_stage.slice(c * CH, CH, dim=1), ptrs, mask=mask)

    @gluon.jit(do_not_specialize=["n_kb"])
    def _attn_gl_kernel(
        q_ptr, win_ptr, comp_ptr, sel_ptr, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr,
        H, D, K, offset, n_comp, scale, n_kb,
        stride_qt, stride_qh, stride_qd,
        stride_wn, stride_wd, stride_cn, stride_cd, stride_st, stride_sk,
        stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
        ROT: gl.constexpr, HALF: gl.constexpr,
        BLOCK_H: gl.constexpr, BLOCK_D: gl.constexpr, DV: gl.constexpr, BLOCK_K: gl.constexpr,
        LOG2_K: gl.constexpr, K_BLOCKS: gl.constexpr, KB_P2: gl.constexpr, STAGES: gl.constexpr,
        num_warps: gl.constexpr, CH: gl.constexpr = 128, PDL: gl.constexpr = False,
    ):  # fmt: skip
        _pdl_release_wait(PDL)
        t = gl.program_id(0).to(gl.int64)
        j = gl.program_id(1)
        d0 = j * DV
        DV2: gl.constexpr = DV // 2

        # layouts: the gathers (16-byte pieces along a row), the logits' and the output's MMA tiles
        LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        MMA_S: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_K, 16]
        )
        MMA_O: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, DV2, 16]
        )
        P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
        ROWS: gl.constexpr = gl.BlockedLayout([1, BLOCK_K], [32, 1], [num_warps, 1], [1, 0])
        Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_D], gl.bfloat16)
        R_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, BLOCK_D], gl.bfloat16)

        q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_D], Q_SL)
        r_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_K, BLOCK_D], R_SL)

        # q [BLOCK_H, BLOCK_D] (heads past H and columns past D zero) into shared memory
        offs_qh = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LD))
        offs_qd = gl.arange(0, BLOCK_D, layout=gl.SliceLayout(0, LD))
        q_ptrs = q_ptr + t * stride_qt + offs_qh.to(gl.int64)[:, None] * stride_qh + offs_qd[None, :] * stride_qd
        async_copy.async_copy_global_to_shared(q_smem, q_ptrs, mask=(offs_qh < H)[:, None] & (offs_qd < D)[None, :])
        # the token's selection [KB_P2, BLOCK_K] with q in one group (entries past K zero-filled,
        # read as −1; KB_P2 covers every block the prologue may issue)
        LS: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        SEL_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sel_smem = gl.allocate_shared_memory(gl.int32, [KB_P2, BLOCK_K], SEL_SL)
        for i in gl.static_range(KB_P2):  # (rows past K_BLOCKS: all masked, zero-filled)
            offs_s = i * BLOCK_K + gl.arange(0, BLOCK_K, layout=LS)
            async_copy.async_copy_global_to_shared(
                sel_smem.index(i), sel_ptr + t * stride_st + offs_s.to(gl.int64) * stride_sk, mask=offs_s < K
            )
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        # the first STAGES − 1 blocks' rows (blocks past the selection: all absent, zero-filled)
        for i in gl.static_range(STAGES - 1):
            _issue_rows(
                r_smem.index(i), win_ptr, comp_ptr, sel_smem, i, K, offset, n_comp,
                stride_wn, stride_wd, stride_cn, stride_cd, D, BLOCK_K, BLOCK_D, LD, CH,
            )  # fmt: skip
            async_copy.commit_group()

        mx = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, MMA_S))
        den = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, ROWS))
        # the output slice's accumulator in two halves of DV2 columns (one product tile live at a time)
        acc0 = gl.zeros([BLOCK_H, DV2], gl.float32, layout=MMA_O)
        acc1 = gl.zeros([BLOCK_H, DV2], gl.float32, layout=MMA_O)
        for kb in range(0, n_kb):  # n_kb = K_BLOCKS, a runtime value (a loop of one constant trip fails to lower)
            # block kb's rows have landed (STAGES − 2 later groups may be in flight), and every
            # warp is past block kb − 1's MMAs, so its stage may be refilled
            async_copy.wait_group(STAGES - 2)
            gl.thread_barrier()
            fence_async_shared()
            r = r_smem.index(kb % STAGES)
            s = gl.zeros([BLOCK_H, BLOCK_K], gl.float32, layout=MMA_S)
            s = warpgroup_mma(q_smem, r.permute((1, 0)), s, use_acc=False, is_async=True)
            # while the MMA runs: the gathers of block kb + STAGES − 1
            nxt = kb + STAGES - 1
            if nxt < n_kb:
                _issue_rows(
                    r_smem.index(nxt % STAGES), win_ptr, comp_ptr, sel_smem, nxt, K, offset, n_comp,
                    stride_wn, stride_wd, stride_cn, stride_cd, D, BLOCK_K, BLOCK_D, LD, CH,
                )  # fmt: skip
            async_copy.commit_group()
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

            # s [BLOCK_H, BLOCK_K]: q·Rᵀ over all of D, then τ, absent → −inf
            idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(0, MMA_S))
            s = s * scale
            s = gl.where((idx >= 0)[None, :], s, float("-inf"))

            new = gl.maximum(mx, gl.max(s, axis=1))
            base = gl.where(new == float("-inf"), 0.0, new)
            alpha = gl.exp(mx - base)
            p = gl.exp(s - base[:, None])
            # Σp: the fixed pairwise tree (entries 2i, 2i+1 → i) in a layout holding whole rows
            ps = gl.convert_layout(p, ROWS)
            for lvl in gl.static_range(LOG2_K):
                a, b = gl.split(gl.reshape(ps, [BLOCK_H, BLOCK_K >> (lvl + 1), 2]))
                ps = a + b
            ps = gl.reshape(ps, [BLOCK_H])
            den = den * gl.convert_layout(alpha, gl.SliceLayout(1, ROWS)) + gl.convert_layout(ps, den.type.layout)

            p_op = gl.convert_layout(p.to(gl.bfloat16), P_OP)
            alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, MMA_O))
            for jj in gl.static_range(BLOCK_D // DV):  # a slice's start must be a constant
                if j == jj:
                    acc0 = _pv_step(p_op, r, acc0, alpha_o, jj * DV, DV2, MMA_O)
                    acc1 = _pv_step(p_op, r, acc1, alpha_o, jj * DV + DV2, DV2, MMA_O)
            mx = new
        async_copy.wait_group(0)

        # epilogue: the sink last, o = bf16(acc / den), and the inverse RoPE of o's tail
        EPI: gl.constexpr = gl.BlockedLayout([1, 2], [1, 32], [num_warps, 1], [1, 0])
        offs_h = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, EPI))
        mask_h = offs_h < H
        sink = gl.load(sink_ptr + offs_h.to(gl.int64), mask=mask_h, other=0.0)
        mx_e = gl.convert_layout(mx, gl.SliceLayout(1, EPI))
        none = mx_e == float("-inf")
        den_e = gl.where(
            none, 1.0, gl.convert_layout(den, gl.SliceLayout(1, EPI)) + gl.exp(sink - gl.where(none, sink, mx_e))
        )
        _store_o(
            gl.convert_layout(acc0, EPI),
            den_e,
            d0,
            offs_h,
            mask_h,
            out_ptr,
            rot_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            t,
            D,
            stride_ot,
            stride_oh,
            stride_od,
            stride_rt,
            stride_rh,
            stride_cos,
            stride_sin,
            ROT,
            HALF,
            DV2,
        )
        _store_o(gl.convert_layout(acc1, EPI), den_e, d0 + DV2, offs_h, mask_h, out_ptr, rot_ptr, cos_ptr, sin_ptr,
                 pos_ptr, t, D, stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin, ROT, HALF,
                 DV2)  # fmt: skip

    @gluon.jit
    def _store_o(
        acc, den, lo, offs_h, mask_h, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, D,
        stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
        ROT: gl.constexpr, HALF: gl.constexpr, N: gl.constexpr,
    ):  # fmt: skip
        """o = bf16(acc / den) for columns lo … lo + N − 1 stored, and with ROT the inverse
        RoPE of the pairs in o's tail written to rot (`_combine_epilogue`'s math)."""
        EPI: gl.constexpr = acc.type.layout
        offs_v = lo + gl.arange(0, N, layout=gl.SliceLayout(0, EPI))
        mask_v = offs_v < D
        offs_h64 = offs_h.to(gl.int64)
        offs_v64 = offs_v.to(gl.int64)
        o32 = gl.div_rn(acc, den[:, None])
        nan = gl.full(o32.shape, 0x7FC0, gl.uint16, layout=EPI).to(gl.bfloat16, bitcast=True)
        o = gl.where(o32 != o32, nan, o32.to(gl.bfloat16))
        om = mask_h[:, None] & mask_v[None, :]
        gl.store(out_ptr + t * stride_ot + offs_h64[:, None] * stride_oh + offs_v64[None, :] * stride_od, o, mask=om)
        if ROT:
            # pairs (a, b) = columns lo + 2i, lo + 2i + 1; rotated where they lie in the tail
            a, b = gl.split(gl.reshape(o.to(gl.float32), [o.shape[0], N // 2, 2]))
            PAIR: gl.constexpr = a.type.layout
            col = lo + 2 * gl.arange(0, N // 2, layout=gl.SliceLayout(0, PAIR))
            lead = D - 2 * HALF
            tail = (col >= lead) & (col < D)
            k = gl.where(tail, (col - lead) // 2, 0)
            ps = gl.load(pos_ptr + t).to(gl.int64)
            c = gl.load(cos_ptr + ps * stride_cos + k, mask=tail, other=1.0)
            sn = -gl.load(sin_ptr + ps * stride_sin + k, mask=tail, other=0.0)
            re = a * c[None, :] - b * sn[None, :]
            im = a * sn[None, :] + b * c[None, :]
            re = gl.where(tail[None, :], _round_bf16_f32(re), a)
            im = gl.where(tail[None, :], _round_bf16_f32(im), b)
            rr = gl.convert_layout(gl.reshape(gl.join(re, im), [o.shape[0], N]), EPI).to(gl.bfloat16)
            gl.store(rot_ptr + t * stride_rt + offs_h64[:, None] * stride_rh + offs_v64[None, :], rr, mask=om)

    @gluon.jit
    def _round_bf16_f32(x):
        """fp32 → bf16 (round to nearest even, NaN → 0x7FC0) → fp32."""
        nan = gl.full(x.shape, 0x7FC0, gl.uint16, layout=x.type.layout).to(gl.bfloat16, bitcast=True)
        return gl.where(x != x, nan, x.to(gl.bfloat16)).to(gl.float32)


def sparse_attn_gluon(q, win, comp, sel, offset, sink, scale, out=None, rot=None, **tune) -> torch.Tensor:
    """`sparse_attn_split`'s contract and bits (bf16 rows; CUDA, sm_90), one pass per token
    (this module's docstring). `tune`: keys of `GLUON_TUNE` (probes only)."""
    from .sparse_attn_split import _check_rot, _rot_launch_args  # noqa: PLC0415

    _validate(q, win, comp, sel, offset, sink, scale, out, allow_packed=False)
    _check_rot(rot, q)
    unknown = sorted(set(tune) - set(GLUON_TUNE))
    if unknown:
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(GLUON_TUNE)}")
    cfg = dict(GLUON_TUNE)
    cfg.update(tune)
    m, H, D = q.shape
    if H > 64:
        raise ValueError(f"q.shape[1] (heads) = {H}; allowed: 1 … 64 (one warpgroup's MMA rows)")
    if D > 512:
        raise ValueError(f"q.shape[2] (D) = {D}; allowed: 1 … 512 (q and two stages of rows in shared memory)")
    if cfg["ch"] not in (32, 64, 128, 256, 512):
        raise ValueError(f"ch = {cfg['ch']!r}; allowed: 32, 64, 128, 256, 512")
    block_d = max(64, triton.next_power_of_2(D)) if HAVE_TRITON else D
    nsplit = cfg["nsplit"]
    if nsplit not in (1, 2, 4) or block_d % (nsplit * 32):
        raise ValueError(f"nsplit = {nsplit}; allowed: 1, 2 or 4, dividing {block_d} into slices of >= 32 columns")
    st = cfg["stages"]
    if not isinstance(st, int) or st < 2 or (1 + st) * 64 * block_d * 2 + _SMEM_EXTRA > _SMEM_MAX:
        most = max(2, (_SMEM_MAX - _SMEM_EXTRA) // (64 * block_d * 2) - 1)
        raise ValueError(f"stages = {st!r}; allowed: 2 … {most} at D = {D} (q and the stages in shared memory)")
    require_triton("sparse_attn_gluon", q, win, sel, sink)
    if not HAVE_GLUON or interpreting():
        raise RuntimeError("sparse_attn_gluon: needs Gluon and a CUDA device (it does not run under TRITON_INTERPRET)")
    K = sel.shape[1]
    if out is None:
        out = torch.empty(m, H, D, dtype=torch.bfloat16, device=q.device)
    if m == 0:
        return out
    n_comp = comp.shape[0]
    if n_comp == 0:
        comp = win
    kbs = max(1, triton.cdiv(K, BLOCK_K))
    cos, sin, pos, o_rot, half = _rot_launch_args(rot, sink, sel, out)
    _attn_gl_kernel[(m, nsplit)](
        q, win, comp, sel, sink, out, o_rot, cos, sin, pos,
        H, D, K, offset, n_comp, float(scale), kbs,
        *q.stride(), *win.stride(), *comp.stride(), *sel.stride(), *out.stride(),
        o_rot.stride(0), o_rot.stride(1), cos.stride(0), sin.stride(0),
        ROT=rot is not None, HALF=half, BLOCK_H=64, BLOCK_D=block_d, DV=block_d // nsplit, BLOCK_K=BLOCK_K,
        LOG2_K=BLOCK_K.bit_length() - 1, K_BLOCKS=kbs, KB_P2=triton.next_power_of_2(max(2, kbs, cfg["stages"])), STAGES=cfg["stages"], num_warps=4,
        CH=min(cfg["ch"], block_d),
        enable_fp_fusion=False,
        **(pdl_launch(q) if cfg["pdl"] else {"PDL": False}),
    )  # fmt: skip
    return out
