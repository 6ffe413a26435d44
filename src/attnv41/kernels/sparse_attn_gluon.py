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
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAVE_GLUON = HAVE_TRITON
    if HAVE_GLUON:
        from .packed_rows import _FP4_ASM
except ImportError:  # pragma: no cover - an older Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "sparse_attn_gluon", "GLUON_TUNE", "GLUON_PACKED_TUNE"]

# Launch shape (constants of the geometry, never of m): nsplit programs per token (each its
# D / nsplit output columns), stages of 64 gathered rows in shared memory, the gathers issued
# in column chunks of ch, pdl (launched under programmatic dependent launch where
# `_triton.pdl_launch` allows it). None of them moves a bit (the GPU tests).
GLUON_TUNE = dict(nsplit=2, stages=2, ch=128, pdl=True)
# Over packed rows: one program per token of `warps` warps (8: two warpgroups share a block's
# dequantization, which nsplit programs would each repeat), compressed rows dequantized by
# PTX (asm). Neither moves a bit (the GPU tests).
GLUON_PACKED_TUNE = dict(nsplit=1, stages=2, ch=128, pdl=True, warps=8, asm=True, tma=False, diag=0)
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

            idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(0, MMA_S))
            mx, den, acc0, acc1 = _block_step(s, idx, scale, mx, den, acc0, acc1, r, j, BLOCK_D, DV, LOG2_K, ROWS, P_OP)
        async_copy.wait_group(0)

        _epilogue(acc0, acc1, mx, den, d0, H, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, D,
                  stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
                  ROT, HALF, BLOCK_H, DV2, num_warps)  # fmt: skip

    @gluon.jit
    def _issue_packed(
        c_stage, s_stage, win_ptr, comp_ptr, sel_smem, kb, K, offset, n_comp,
        DP: gl.constexpr, BLOCK_K: gl.constexpr, LC: gl.constexpr, LS2: gl.constexpr,
    ):  # fmt: skip
        """cp.async block kb's packed rows into a stage: c_stage [BLOCK_K, DP] uint8 their code
        bytes (a window row's DP e4m3 codes, a compressed row's DP/2 bytes of nibbles), s_stage
        [BLOCK_K, 32] uint8 their scale bytes (DP/32 e8m0, DP/16 e4m3); absent rows and
        bytes past a row's zero-filled. Rows are contiguous (stride = their bytes) and start
        16-byte aligned (DP = 512: 528 and 288 bytes), so every piece is 16 bytes."""
        base, from_win, from_comp = _packed_bases(win_ptr, comp_ptr, sel_smem, kb, K, offset, n_comp, DP, BLOCK_K, LC)
        offs = gl.arange(0, DP, layout=gl.SliceLayout(0, LC))
        nb = gl.where(from_win, DP, gl.where(from_comp, DP // 2, 0))
        async_copy.async_copy_global_to_shared(c_stage, base[:, None] + offs[None, :], mask=offs[None, :] < nb[:, None])
        base, from_win, from_comp = _packed_bases(win_ptr, comp_ptr, sel_smem, kb, K, offset, n_comp, DP, BLOCK_K, LS2)
        offs = gl.arange(0, 32, layout=gl.SliceLayout(0, LS2))
        nb = gl.where(from_win, DP // 32, gl.where(from_comp, DP // 16, 0))
        base = base + gl.where(from_win, DP, DP // 2)
        async_copy.async_copy_global_to_shared(s_stage, base[:, None] + offs[None, :], mask=offs[None, :] < nb[:, None])

    @gluon.jit
    def _issue_packed_tma(
        c_stage, s_stage, bar, wc_desc, ws_desc, cc_desc, sel_row, stride_sk, kb, K, offset, n_comp,
        DP: gl.constexpr, BLOCK_K: gl.constexpr,
    ):  # fmt: skip
        """Block kb's packed rows into a stage by TMA, the same two copies for every row, so
        a block always brings BLOCK_K · (DP + DP/32) bytes and `bar` expects them once:
        - c_stage [BLOCK_K, DP/4] int32: a window row's DP code bytes (wc_desc), or a
          compressed row's DP/2 code bytes and DP/16 scale bytes, the rest of the box zero
          (cc_desc's columns end at the row's end);
        - s_stage [BLOCK_K, 32] int32 (rows 128-byte aligned, as TMA destinations must be):
          a window row's DP/32 scale bytes (ws_desc) first; for a compressed row, bytes
          `_dequant_packed` does not read.
        An absent row copies from row −1: out of bounds, all zeros. The entries are scalar
        loads of the token's selection row (sel_row: its first entry), cached after the
        first."""
        mbarrier.expect(bar, BLOCK_K * (DP + DP // 32))
        for r in gl.static_range(BLOCK_K):
            i = kb * BLOCK_K + r
            idx = gl.load(sel_row + i * stride_sk, mask=i < K, other=-1)
            crow = idx - offset
            is_comp = (idx >= offset) & (crow < n_comp)
            row = gl.where((idx >= 0) & (idx < offset), idx, -1)
            c_row = c_stage.slice(r, 1, dim=0)
            tma.async_copy_global_to_shared(wc_desc, [row, 0], bar, c_row, pred=~is_comp)
            tma.async_copy_global_to_shared(cc_desc, [crow, 0], bar, c_row, pred=is_comp)
            tma.async_copy_global_to_shared(ws_desc, [row, 0], bar, s_stage.slice(r, 1, dim=0).slice(0, DP // 128, dim=1))

    @gluon.jit
    def _packed_bases(win_ptr, comp_ptr, sel_smem, kb, K, offset, n_comp, DP: gl.constexpr, BLOCK_K: gl.constexpr,
                      L: gl.constexpr):  # fmt: skip
        """Block kb's rows as byte pointers ([BLOCK_K] in SliceLayout(1, L)) and whether each
        is a window row or a compressed row (neither: absent)."""
        idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(1, L)).to(gl.int64)
        from_win = (idx >= 0) & (idx < offset)
        crow = idx - offset
        from_comp = (idx >= offset) & (crow < n_comp)
        base = gl.where(from_win, win_ptr + gl.where(from_win, idx, 0) * (DP + DP // 32),
                        comp_ptr + gl.where(from_comp, crow, 0) * (DP // 2 + DP // 16))  # fmt: skip
        return base, from_win, from_comp

    @gluon.jit
    def _dequant_packed(
        c_stage, s_stage, r_tile, sel_smem, kb, K, offset,
        DP: gl.constexpr, BLOCK_K: gl.constexpr, CH: gl.constexpr, ASM: gl.constexpr, num_warps: gl.constexpr,
        ZERO_ABSENT: gl.constexpr,
    ):  # fmt: skip
        """Block kb's packed rows (a stage of `_issue_packed` or `_issue_packed_tma`; with
        ZERO_ABSENT, absent rows' slots hold stale bytes and give zeros) dequantized into r_tile
        ([BLOCK_K, DP] bf16), CH columns at a time: window rows code · 2^(e − 127) in fp32
        rounded to bf16 (`packed_rows.fp8_e8m0_rows`), compressed rows e2m1 · e4m3 scale
        (with ASM by `packed_rows._FP4_ASM`'s PTX in bf16, else in fp32 as `fp4_rows`):
        exact, the values of the unpacked rows. A block of one source (the usual case: the
        selection's window entries come first) computes only its format."""
        # every form gives LB: 32 consecutive values per thread, TW threads along a chunk
        TW: gl.constexpr = CH // 32
        LB: gl.constexpr = gl.BlockedLayout([1, 32], [32 // TW, TW], [num_warps, 1], [1, 0])
        P3: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
        P2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(1, LB))
        from_win = (idx >= 0) & (idx < offset)
        from_comp = (idx >= offset) & ~from_win  # (past the compressed rows: not loaded, and never selected)
        n_win = gl.sum(from_win.to(gl.int32), axis=0)
        n_comp = gl.sum(from_comp.to(gl.int32), axis=0)
        # the stage's bytes as plain rows (its int32 TMA words or uint8 bytes: the same bytes);
        # with ZERO_ABSENT (the TMA stages) a compressed row's scales follow its codes
        codes_w = c_stage._reinterpret(gl.uint8, [BLOCK_K, DP // 32, 32], P3)
        if ZERO_ABSENT:
            s_bytes = s_stage._reinterpret(gl.uint8, [BLOCK_K, 128], P2)
            s_comp = c_stage._reinterpret(gl.uint8, [BLOCK_K, DP], P2).slice(DP // 2, DP // 16, dim=1)
        else:
            s_bytes = s_stage._reinterpret(gl.uint8, [BLOCK_K, 32], P2)
            s_comp = s_bytes
        if ASM:
            codes_c = c_stage._reinterpret(gl.int32, [BLOCK_K, DP // 4], P2)  # a compressed row: DP/8 words
        else:
            codes_c = c_stage._reinterpret(gl.uint8, [BLOCK_K, DP // 8, 8], P3)
        zero = gl.zeros([BLOCK_K, CH], gl.bfloat16, layout=LB)
        for c in gl.static_range(DP // CH):
            dst = r_tile.slice(c * CH, CH, dim=1)
            if n_comp == 0:
                v = _dequant_win(codes_w, s_bytes, c, CH, LB, num_warps)
                if ZERO_ABSENT:
                    v = gl.where(from_win[:, None], v, zero)
            elif n_win == 0:
                v = _dequant_comp(codes_c, s_comp, c, CH, LB, ASM, num_warps)
                if ZERO_ABSENT:
                    v = gl.where(from_comp[:, None], v, zero)
            else:
                wv = _dequant_win(codes_w, s_bytes, c, CH, LB, num_warps)
                cv = _dequant_comp(codes_c, s_comp, c, CH, LB, ASM, num_warps)
                v = gl.where(from_win[:, None], wv, cv)
                if ZERO_ABSENT:
                    v = gl.where((from_win | from_comp)[:, None], v, zero)
            dst.store(v)

    @gluon.jit
    def _dequant_win(codes_w, s_stage, c: gl.constexpr, CH: gl.constexpr, LB: gl.constexpr, num_warps: gl.constexpr):
        """[BLOCK_K, CH] bf16 in LB: columns c·CH … of the stage read as fp8_e8m0 rows
        (codes_w: the code bytes as [BLOCK_K, D/32, 32]; a thread's 32 bytes one scale block)."""
        TW: gl.constexpr = CH // 32
        LW3: gl.constexpr = gl.BlockedLayout([1, 1, 32], [32 // TW, TW, 1], [num_warps, 1, 1], [2, 1, 0])
        codes = codes_w.slice(c * TW, TW, dim=1).load(LW3)
        e = s_stage.slice(c * TW, TW, dim=1).load(gl.SliceLayout(2, LW3))
        sc = (e.to(gl.int32) << 23).to(gl.float32, bitcast=True)  # 2^(e − 127); 0 for a zero byte
        v = codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc[:, :, None]
        return gl.convert_layout(gl.reshape(v.to(gl.bfloat16), [codes.shape[0], CH]), LB, assert_trivial=True)

    @gluon.jit
    def _dequant_comp(
        codes_c, s_stage, c: gl.constexpr, CH: gl.constexpr, LB: gl.constexpr, ASM: gl.constexpr,
        num_warps: gl.constexpr,
    ):  # fmt: skip
        """[BLOCK_K, CH] bf16 in LB: columns c·CH … of the stage read as fp4_e4m3 rows (value
        2i in the low nibble of byte i, one e4m3 scale per 16 values, i.e. per 8 bytes).
        ASM: codes_c the code words ([BLOCK_K, ·] int32, 8 values each), built in bf16 by
        `_FP4_ASM` (two words per instance, nibble j of both words in output j); else codes_c
        the code bytes as [BLOCK_K, D/8, 8], in fp32 (`_e2m1_f32`)."""
        TW: gl.constexpr = CH // 32
        R: gl.constexpr = codes_c.shape[0]
        if ASM:
            LWD: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TW, TW], [num_warps, 1], [1, 0])
            LSB: gl.constexpr = gl.BlockedLayout([1, 2], [32 // TW, TW], [num_warps, 1], [1, 0])
            words = codes_c.slice(c * (CH // 8), CH // 8, dim=1).load(LWD)
            sb = s_stage.slice(c * (CH // 16), CH // 16, dim=1).load(LSB)
            sc = sb.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(gl.bfloat16)  # exact
            sc = gl.convert_layout(gl.reshape(gl.join(sc, sc), [R, CH // 8]), LWD, assert_trivial=True)  # word w: scale w // 2
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                _FP4_ASM_GL, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [words, sc], dtype=(gl.bfloat16,) * 8, is_pure=True,
                pack=2,
            )  # fmt: skip
            # nibble j = 4h + 2b + n of word w is column 8w + j: joins from the slowest axis
            v = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
            v = gl.reshape(v, [R, CH])
        else:
            LC3: gl.constexpr = gl.BlockedLayout([1, 2, 8], [32 // TW, TW, 1], [num_warps, 1, 1], [2, 1, 0])
            by = codes_c.slice(c * (CH // 16), CH // 16, dim=1).load(LC3)
            sc = s_stage.slice(c * (CH // 16), CH // 16, dim=1).load(gl.SliceLayout(2, LC3))
            sc = sc.to(gl.float8e4nv, bitcast=True).to(gl.float32)[:, :, None]
            b = by.to(gl.int32)
            lo = _e2m1_f32(b & 15) * sc
            hi = _e2m1_f32(b >> 4) * sc
            v = gl.reshape(gl.join(lo, hi), [R, CH // 16, 16])  # value 2i + n: nibble n of byte i
            v = gl.reshape(v.to(gl.bfloat16), [R, CH])
        return gl.convert_layout(v, LB, assert_trivial=True)

    _FP4_ASM_GL = gl.constexpr(_FP4_ASM.value)

    @gluon.jit
    def _e2m1_f32(nib):
        """int32 e2m1 nibbles → fp32, exactly (`_triton.e2m1_value`'s bit placement)."""
        bits = ((nib & 7) << 22) | ((nib & 8) << 28)
        return bits.to(gl.float32, bitcast=True) * 8.507059173023462e37  # 2^126

    @gluon.jit
    def _block_step(
        s, idx, scale, mx, den, acc0, acc1, r, j,
        BLOCK_D: gl.constexpr, DV: gl.constexpr, LOG2_K: gl.constexpr, ROWS: gl.constexpr, P_OP: gl.constexpr,
    ):  # fmt: skip
        """One block of the recurrence on its logits s = q·Rᵀ ([BLOCK_H, BLOCK_K], fp32, all of
        D) and its rows r (shared memory): τ, absent (idx < 0) → −inf, the running max, p,
        den·α + Σp, acc·α + dot(bf16(p), R) for this program's columns. Returns (mx, den,
        acc0, acc1)."""
        BLOCK_H: gl.constexpr = s.shape[0]
        BLOCK_K: gl.constexpr = s.shape[1]
        MMA_O: gl.constexpr = acc0.type.layout
        DV2: gl.constexpr = DV // 2
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
        return new, den, acc0, acc1

    @gluon.jit
    def _epilogue(
        acc0, acc1, mx, den, d0, H, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, D,
        stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
        ROT: gl.constexpr, HALF: gl.constexpr, BLOCK_H: gl.constexpr, DV2: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        """The sink last, o = bf16(acc / den), and the inverse RoPE of o's tail (`_store_o`),
        for this program's two column halves at d0 and d0 + DV2."""
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


    @gluon.jit(do_not_specialize=["n_kb"])
    def _attn_gl_packed_kernel(
        q_ptr, win_ptr, comp_ptr, sel_ptr, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr,
        wc_desc, ws_desc, cc_desc,
        H, K, offset, n_comp, scale, n_kb,
        stride_qt, stride_qh, stride_qd, stride_st, stride_sk,
        stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
        ROT: gl.constexpr, HALF: gl.constexpr,
        BLOCK_H: gl.constexpr, DP: gl.constexpr, DV: gl.constexpr, BLOCK_K: gl.constexpr,
        LOG2_K: gl.constexpr, KB_P2: gl.constexpr, STAGES: gl.constexpr,
        num_warps: gl.constexpr, CH: gl.constexpr = 128, ASM: gl.constexpr = True, TMA: gl.constexpr = False,
        PDL: gl.constexpr = False, DIAG: gl.constexpr = 0,
    ):  # fmt: skip
        """`_attn_gl_kernel` over packed rows (D = DP = 512): the stages hold a block's packed
        bytes (`_issue_packed`), each block is dequantized into one bf16 tile
        (`_dequant_packed`) that the logits and the weighted sum read; the same values, the
        same MMAs, so the same bits. num_warps 4 or 8: with 8 the MMAs' columns are split
        between two warpgroups (each output element's chain over D is the same), and a
        program's dequantization has twice the warps."""
        WN: gl.constexpr = num_warps // 4  # warpgroups, along the MMAs' columns
        _pdl_release_wait(PDL)
        t = gl.program_id(0).to(gl.int64)
        j = gl.program_id(1)
        d0 = j * DV
        DV2: gl.constexpr = DV // 2

        LD: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        LC: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [num_warps, 1], [1, 0])
        LS2: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [num_warps, 1], [1, 0])
        MMA_S: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_K, 16]
        )
        MMA_O: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, WN], instr_shape=[16, DV2 // WN, 16]
        )
        P_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
        ROWS: gl.constexpr = gl.BlockedLayout([1, BLOCK_K], [32, 1], [num_warps, 1], [1, 0])
        Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, DP], gl.bfloat16)
        R_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_K, DP], gl.bfloat16)
        PL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])

        q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, DP], Q_SL)
        r_tile = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_K, DP], R_SL)
        if TMA:  # TMA destinations: plain rows (no swizzle), int32 words
            T_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
            c_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_K, DP // 4], T_SL)
            # (a TMA destination starts 128-byte aligned: a window row's 16 scale bytes take 128)
            s_smem = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_K, 32], T_SL)
            bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(STAGES):
                mbarrier.init(bars.index(i), count=1)
            fence_async_shared()
        else:
            c_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_K, DP], PL)
            s_smem = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_K, 32], PL)

        offs_qh = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, LD))
        offs_qd = gl.arange(0, DP, layout=gl.SliceLayout(0, LD))
        q_ptrs = q_ptr + t * stride_qt + offs_qh.to(gl.int64)[:, None] * stride_qh + offs_qd[None, :] * stride_qd
        async_copy.async_copy_global_to_shared(q_smem, q_ptrs, mask=(offs_qh < H)[:, None])
        LSEL: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        SEL_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        sel_smem = gl.allocate_shared_memory(gl.int32, [KB_P2, BLOCK_K], SEL_SL)
        for i in gl.static_range(KB_P2):
            offs_s = i * BLOCK_K + gl.arange(0, BLOCK_K, layout=LSEL)
            async_copy.async_copy_global_to_shared(
                sel_smem.index(i), sel_ptr + t * stride_st + offs_s.to(gl.int64) * stride_sk, mask=offs_s < K
            )
        async_copy.commit_group()
        async_copy.wait_group(0)
        gl.thread_barrier()
        for i in gl.static_range(STAGES - 1):
            if TMA:
                _issue_packed_tma(c_smem.index(i), s_smem.index(i), bars.index(i), wc_desc, ws_desc, cc_desc,
                                  sel_ptr + t * stride_st, stride_sk, i, K, offset, n_comp, DP, BLOCK_K)  # fmt: skip
            else:
                _issue_packed(c_smem.index(i), s_smem.index(i), win_ptr, comp_ptr, sel_smem, i, K, offset, n_comp,
                              DP, BLOCK_K, LC, LS2)  # fmt: skip
                async_copy.commit_group()

        mx = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, MMA_S))
        den = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, ROWS))
        acc0 = gl.zeros([BLOCK_H, DV2], gl.float32, layout=MMA_O)
        acc1 = gl.zeros([BLOCK_H, DV2], gl.float32, layout=MMA_O)
        for kb in range(0, n_kb):
            # block kb's bytes have landed, and every warp is past block kb − 1's MMAs (the
            # tile) and its dequantization (the stage block kb + STAGES − 1 refills)
            nxt = kb + STAGES - 1
            if TMA:
                mbarrier.wait(bars.index(kb % STAGES), (kb // STAGES) & 1)
                gl.thread_barrier()
                if nxt < n_kb:
                    fence_async_shared()  # the stage's reads (block kb − 1) before the TMA writes
                    _issue_packed_tma(c_smem.index(nxt % STAGES), s_smem.index(nxt % STAGES), bars.index(nxt % STAGES),
                                      wc_desc, ws_desc, cc_desc, sel_ptr + t * stride_st, stride_sk, nxt, K,
                                      offset, n_comp, DP, BLOCK_K)  # fmt: skip
            else:
                async_copy.wait_group(STAGES - 2)
                gl.thread_barrier()
                if nxt < n_kb:
                    _issue_packed(c_smem.index(nxt % STAGES), s_smem.index(nxt % STAGES), win_ptr, comp_ptr, sel_smem,
                                  nxt, K, offset, n_comp, DP, BLOCK_K, LC, LS2)  # fmt: skip
                async_copy.commit_group()
            if DIAG != 1:  # (DIAG: timing probes only, wrong results: 1 no dequantization, 2 no MMAs)
                _dequant_packed(c_smem.index(kb % STAGES), s_smem.index(kb % STAGES), r_tile, sel_smem, kb, K, offset,
                                DP, BLOCK_K, CH, ASM, num_warps, TMA)  # fmt: skip
            fence_async_shared()
            gl.thread_barrier()
            if DIAG != 2:
                s = gl.zeros([BLOCK_H, BLOCK_K], gl.float32, layout=MMA_S)
                s = warpgroup_mma(q_smem, r_tile.permute((1, 0)), s, use_acc=False, is_async=True)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
                idx = _block_sel(sel_smem, kb, K, BLOCK_K, gl.SliceLayout(0, MMA_S))
                mx, den, acc0, acc1 = _block_step(s, idx, scale, mx, den, acc0, acc1, r_tile, j, DP, DV, LOG2_K, ROWS,
                                                  P_OP)  # fmt: skip
        if not TMA:
            async_copy.wait_group(0)
        _epilogue(acc0, acc1, mx, den, d0, H, sink_ptr, out_ptr, rot_ptr, cos_ptr, sin_ptr, pos_ptr, t, DP,
                  stride_ot, stride_oh, stride_od, stride_rt, stride_rh, stride_cos, stride_sin,
                  ROT, HALF, BLOCK_H, DV2, num_warps)  # fmt: skip

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
    """`sparse_attn_split`'s contract and bits (bf16 rows, or V4.1's packed rows at D = 512;
    CUDA, sm_90), one pass per token (this module's docstring). `tune`: keys of
    `GLUON_TUNE` (probes only)."""
    from .sparse_attn_split import _check_rot, _rot_launch_args  # noqa: PLC0415

    _validate(q, win, comp, sel, offset, sink, scale, out, allow_packed=True)
    _check_rot(rot, q)
    packed = win.dtype == torch.uint8
    base = GLUON_PACKED_TUNE if packed else GLUON_TUNE
    unknown = sorted(set(tune) - set(base))
    if unknown:
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(base)}")
    cfg = dict(base)
    cfg.update(tune)
    if packed and cfg["warps"] not in (4, 8, 16):
        raise ValueError(f"warps = {cfg['warps']!r}; allowed: 4, 8 or 16")
    m, H, D = q.shape
    if H > 64:
        raise ValueError(f"q.shape[1] (heads) = {H}; allowed: 1 … 64 (one warpgroup's MMA rows)")
    if D > 512 or (packed and D != 512):
        allowed = "512 (packed rows: 16-byte row starts)" if packed else "1 … 512 (q and two stages of rows in shared memory)"
        raise ValueError(f"q.shape[2] (D) = {D}; allowed: {allowed}")
    if packed:
        for name, x in (("win", win), ("comp", comp)):
            if x.shape[0] and x.data_ptr() % 16:
                raise ValueError(f"{name}.data_ptr() % 16 = {x.data_ptr() % 16}; allowed: 0 (packed rows, 16-byte copies)")
    if cfg["ch"] not in (32, 64, 128, 256, 512):
        raise ValueError(f"ch = {cfg['ch']!r}; allowed: 32, 64, 128, 256, 512")
    block_d = max(64, triton.next_power_of_2(D)) if HAVE_TRITON else D
    nsplit = cfg["nsplit"]
    if nsplit not in (1, 2, 4) or block_d % (nsplit * 32):
        raise ValueError(f"nsplit = {nsplit}; allowed: 1, 2 or 4, dividing {block_d} into slices of >= 32 columns")
    st = cfg["stages"]
    # shared memory: q and the stages of bf16 rows; packed: q, one bf16 tile and the stages of bytes
    fixed, per_stage = (2 * 64 * block_d * 2, 64 * (block_d + 32)) if packed else (64 * block_d * 2, 64 * block_d * 2)
    if not isinstance(st, int) or st < 2 or fixed + st * per_stage + _SMEM_EXTRA > _SMEM_MAX:
        most = max(2, (_SMEM_MAX - _SMEM_EXTRA - fixed) // per_stage)
        what = "q, a bf16 tile and the stages of packed bytes" if packed else "q and the stages"
        raise ValueError(f"stages = {st!r}; allowed: 2 … {most} at D = {D} ({what} in shared memory)")
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
    kb_p2 = triton.next_power_of_2(max(2, kbs, st))
    pdl = pdl_launch(q) if cfg["pdl"] else {"PDL": False}
    if packed:
        descs = _packed_descs(win, comp, D) if cfg["tma"] else (None,) * 3
        _attn_gl_packed_kernel[(m, nsplit)](
            q, win, comp, sel, sink, out, o_rot, cos, sin, pos, *descs,
            H, K, offset, n_comp, float(scale), kbs,
            *q.stride(), *sel.stride(), *out.stride(),
            o_rot.stride(0), o_rot.stride(1), cos.stride(0), sin.stride(0),
            ROT=rot is not None, HALF=half, BLOCK_H=64, DP=D, DV=D // nsplit, BLOCK_K=BLOCK_K,
            LOG2_K=BLOCK_K.bit_length() - 1, KB_P2=kb_p2, STAGES=st, num_warps=cfg["warps"], CH=min(cfg["ch"], 256),
            ASM=bool(cfg["asm"]), TMA=bool(cfg["tma"]), DIAG=int(cfg["diag"]),
            enable_fp_fusion=False, **pdl,
        )  # fmt: skip
        return out
    _attn_gl_kernel[(m, nsplit)](
        q, win, comp, sel, sink, out, o_rot, cos, sin, pos,
        H, D, K, offset, n_comp, float(scale), kbs,
        *q.stride(), *win.stride(), *comp.stride(), *sel.stride(), *out.stride(),
        o_rot.stride(0), o_rot.stride(1), cos.stride(0), sin.stride(0),
        ROT=rot is not None, HALF=half, BLOCK_H=64, BLOCK_D=block_d, DV=block_d // nsplit, BLOCK_K=BLOCK_K,
        LOG2_K=BLOCK_K.bit_length() - 1, K_BLOCKS=kbs, KB_P2=kb_p2, STAGES=st, num_warps=4,
        CH=min(cfg["ch"], block_d),
        enable_fp_fusion=False,
        **pdl,
    )  # fmt: skip
    return out


def _packed_descs(win, comp, D) -> tuple:
    """TMA descriptors of packed rows as int32 words, one row per copy (`_issue_packed_tma`):
    window codes (box D/4 words) and scales (D/128 words, at byte D), compressed rows whole
    (box D/4 words over rows of D/8 + D/64: the rest zero-filled). Row strides of 528 and
    288 bytes are 16-byte multiples."""
    lay = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    w32, c32 = win.view(torch.int32), comp.view(torch.int32)
    nw, nc = w32.shape[1], c32.shape[1]
    return (
        TensorDescriptor(w32, [w32.shape[0], D // 4], [nw, 1], [1, D // 4], lay),
        TensorDescriptor(w32[:, D // 4 :], [w32.shape[0], D // 128], [nw, 1], [1, D // 128], lay),
        TensorDescriptor(c32, [c32.shape[0], nc], [nc, 1], [1, D // 4], lay),
    )
