"""The decode attention's first kernel over V4.1's packed rows in Gluon, each row chunk
dequantized straight into the warpgroup MMA's A fragment: `sparse_attn_split`'s
`_logits_kernel` (its batched launch: the rows as the MMA's rows, all heads per program),
with its bits. An option of `sparse_attn_split` (`gluon_logits`), off: the same bytes on an
H100 but slower there (the logits alone on a B = 64, 32K step's inputs 31.0-38.8 µs over its
launch options against the Triton kernel's 28.8; the B = 64 step 0.6-3.6 % slower;
BENCHMARKS.md, fifty-first entry). Unlike the index kernel, this one is not bound by the
tile's shared-memory round trip; what bounds it was not profiled.

Why: over packed rows the Triton kernel converts each 64-column chunk of a block's rows in
registers, stores the bf16 tile in shared memory and loads it back in the MMA's operand
layout (the tile's 8 KiB round trip and its barriers, on top of q's chunk); the H200's
B = 64 step pays +168 µs per step in this kernel over packed rows against bf16 rows
(BENCHMARKS.md, thirty-second entry), where the index kernel over packed keys was found
bound by that same L1 traffic (forty-eighth entry). Here each thread loads the code words
its own fragment needs (a quad of lanes holds one row's words, one each), a transpose within
the quad (two shuffles and two prmt per word) hands each lane the bytes of its fragment
columns, and they are converted there: no shared-memory tile, no barrier in the chunk loop.

Grid (m, blocks): program (t, kb) computes the logits of token t's entries kb·64 … kb·64 +
63 for every head (H ≤ 64: the MMA's N), as the Triton kernel's program (t, kb, 0) at
`BATCH_TUNE` (bh 64, rsplit 1). q [H, D] sits in shared memory for the whole program (D/64
chunks of [H_P, 64]: 64 KiB at Flash, three programs per SM).

The same operations in the same order as the Triton kernel, so the same bits (checked on
the GPU, `tests/kernels/test_sparse_attn_logits_gluon.py`):
- each entry's row: a window row (entry < offset: fp8_e8m0, D e4m3 codes then D/32 e8m0
  scales), a compressed row (fp4_e4m3: D/2 bytes of e2m1 pairs then D/16 e4m3 scales) or
  absent (zeros); values exact in bf16 (window: e4m3 → fp32 times 2^(e − 127), rounded to
  bf16, exact; compressed: `packed_rows`' table-lookup PTX, exact);
- the logits: the MMA chain over D in 16-column steps from the first column into a zero
  fp32 accumulator ([64 rows, H_P heads]), times τ in fp32, −inf where the entry is absent;
- stored as the Triton kernel stores them ([m, blocks, H, 64] fp32), with each head's max
  over the block ([m, blocks, H]).
A block whose rows are all of one format converts that format only; a block of both
converts both for every row and keeps each row's own (the Triton kernel's `_load_rows`).

Scope: packed rows of D a multiple of 128 (at most 512: whole words of window scales), at most 64 heads, rows 4-byte
aligned (fp4 words), sm_90. Gluon does not run under `TRITON_INTERPRET`: CI compiles it
for sm_90 offline; its numerics are checked on the GPU against the Triton kernel.
"""

from __future__ import annotations

import torch

from ._triton import interpreting, pdl_launch, require_triton, triton
from .sparse_attn import BLOCK_K
from .sparse_attn_gluon import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .indexer_gluon import _QUAD_T, AFRAG_WORDS16, _lut8
    from .packed_rows import _FP4_LUT_HEAD, fp4_lut_body
    from .sparse_attn_gluon import _pdl_release_wait

__all__ = ["HAVE_GLUON", "GLUON_LOGITS_TUNE", "logits_gluon", "logits_gluon_ok"]

# Launch options (none moves a bit): pdl (programmatic dependent launch where
# `_triton.pdl_launch` allows it), maxnreg (a register cap for ptxas, or None), q_stages (0:
# q whole in shared memory, H_P·D·2 bytes, 64 KiB at Flash; 2: streamed through two chunk
# buffers, 16 KiB, one more barrier per chunk).
GLUON_LOGITS_TUNE = dict(pdl=True, maxnreg=None, q_stages=0)

if HAVE_GLUON:
    # `_FP4_LUT_E4M3` with two scales per word: $10 selects scale byte b0 into the low half
    # and b1 into the high half of s (0x4040 | b0 | b1 << 8); pairs 0, 1 (nibbles 0-3) take
    # b0's bf16 pair, pairs 2, 3 (nibbles 4-7) b1's.
    _LUT2_E4M3 = gl.constexpr(
        _FP4_LUT_HEAD.replace("{\n", "{\n.reg .b32 sa, sb;\n", 1)
        + "shl.b32 s, s, 4;\nand.b32 s, s, 0x07F007F0;\nmov.b32 r, 0x7B807B80;\nmul.rn.bf16x2 s, s, r;\n"
        + "prmt.b32 sa, s, s, 0x1010;\nprmt.b32 sb, s, s, 0x3232;\n"
        + fp4_lut_body(("sa", "sa", "sb", "sb"))
    )
    # A halfword transpose within each quad of lanes: lane q's word X_q = [h0, h1] (16-bit
    # halves); out, lane q holds [X_{q//2}.h(q%2), X_{2+q//2}.h(q%2)]. With lane q ^ 2 the
    # halves that cross (selector $2: 0x5410 where bit 1 of q is 0, else 0x3276: lanes 0,
    # 1 then hold [X_q.h0, X_{q^2}.h0], lanes 2, 3 [X_{q^2}.h1, X_q.h1]), then lanes 1 and 2
    # swap (lane q ^ 3; selector $3: 0x7654, the partner's word, on lanes 1 and 2, 0x3210
    # on lanes 0 and 3). Every lane of the warp runs it.
    _QUAD_H = gl.constexpr(
        "{\n.reg .b32 p, t;\n"
        "shfl.sync.bfly.b32 p, $1, 2, 0x1f, 0xffffffff;\n"
        "prmt.b32 t, $1, p, $2;\n"
        "shfl.sync.bfly.b32 p, t, 3, 0x1f, 0xffffffff;\n"
        "prmt.b32 $0, t, p, $3;\n}"
    )

    @gluon.jit
    def _entries(sel_ptr, t, kb, K, offset, n_comp, s_st, s_sk, L: gl.constexpr):
        """Block kb's 64 entries of token t in layout L (past K: absent): (present, from the
        window, from the compressed rows, window row, compressed row)."""
        k = kb * 64 + gl.arange(0, 64, layout=L)
        idx = gl.load(sel_ptr + t * s_st + k.to(gl.int64) * s_sk, mask=k < K, other=-1).to(gl.int64)
        present = idx >= 0
        from_win = present & (idx < offset)
        crow = idx - offset
        from_comp = present & (idx >= offset) & (crow < n_comp)
        return present, from_win, from_comp, gl.where(from_win, idx, 0), gl.where(from_comp, crow, 0)

    @gluon.jit
    def _win_chunk(w_base, ok, c, D: gl.constexpr, LWA: gl.constexpr, A_OP: gl.constexpr):
        """Columns 64c … 64c + 63 of fp8_e8m0 rows (byte pointers w_base [64], rows not ok
        zero) as [64, 64] bf16 in A_OP. Lane 4r + q loads words 16c + 4g + q (g = 0 … 3) of
        its rows; after `_QUAD_H` its word at index 4g + q holds the codes of columns 16g +
        2q, + 1 and 16g + 8 + 2q, + 9: the fragment's columns of step g. Scale of step g:
        block 2c + g // 2, a byte of the row's scale word at D + 4 (c // 2)."""
        wc = gl.arange(0, 16, layout=gl.SliceLayout(0, LWA))
        words = gl.load(
            w_base.to(gl.pointer_type(gl.int32))[:, None] + (c * 16 + wc)[None, :], mask=ok[:, None], other=0
        )
        swc = gl.load((w_base + D + 4 * (c // 2)).to(gl.pointer_type(gl.int32)), mask=ok, other=0)
        q = wc % 4
        s1 = gl.broadcast(gl.where((q & 2) != 0, 0x3276, 0x5410)[None, :], words)[0]
        s2 = gl.broadcast(gl.where((q == 1) | (q == 2), 0x7654, 0x3210)[None, :], words)[0]
        # not pure: a result depends on the other lanes' operands (see `indexer_gluon._afrag_keys`)
        tw = gl.inline_asm_elementwise(_QUAD_H, "=r,r,r,r", [words, s1, s2], dtype=gl.int32, is_pure=False, pack=1)
        sh = gl.broadcast((8 * (2 * (c % 2) + (wc // 4) // 2))[None, :], words)[0]
        e = (gl.broadcast(swc[:, None], words)[0] >> sh) & 0xFF
        sc = (e << 23).to(gl.float32, bitcast=True)  # 2^(e − 127) (`_triton.e8m0_scale`)
        v0 = ((tw & 0xFF).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc).to(gl.bfloat16)
        v1 = (((tw >> 8) & 0xFF).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc).to(gl.bfloat16)
        v2 = (((tw >> 16) & 0xFF).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc).to(gl.bfloat16)
        v3 = (((tw >> 24) & 0xFF).to(gl.uint8).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc).to(gl.bfloat16)
        # [64, 16, 4]: word 4g + q, byte 2h + n (joins from the slowest axis) → column 16g + 8h + 2q + n
        v = gl.join(gl.join(v0, v2), gl.join(v1, v3))
        v = gl.permute(gl.reshape(v, [64, 4, 4, 2, 2]), (0, 1, 3, 2, 4))
        return gl.convert_layout(gl.reshape(v, [64, 64]), A_OP)

    @gluon.jit
    def _comp_chunk(c_base, ok, c, D: gl.constexpr, LWF: gl.constexpr, A_OP: gl.constexpr):
        """Columns 64c … 64c + 63 of fp4_e4m3 rows (byte pointers c_base [64], rows not ok
        zero) as [64, 64] bf16 in A_OP. Lane 4r + q loads words 8c + 4i + q (i = 0, 1) of its
        rows; after `_QUAD_T` its word at index 4i + q holds byte q of words 4i … 4i + 3:
        columns 32i + 8j + 2q, + 1 (j = 0 … 3), the fragment's columns of steps 2i (j = 0,
        1) and 2i + 1 (j = 2, 3), whose scales are bytes 2i and 2i + 1 of the row's scale
        word at D/2 + 4c."""
        wc = gl.arange(0, 8, layout=gl.SliceLayout(0, LWF))
        words = gl.load(
            c_base.to(gl.pointer_type(gl.int32))[:, None] + (c * 8 + wc)[None, :], mask=ok[:, None], other=0
        )
        swc = gl.load((c_base + D // 2 + 4 * c).to(gl.pointer_type(gl.int32)), mask=ok, other=0)
        s1 = gl.broadcast(gl.where((wc & 2) != 0, 0x3276, 0x5410)[None, :], words)[0]
        s2 = gl.broadcast(gl.where((wc & 1) != 0, 0x3715, 0x6240)[None, :], words)[0]
        tw = gl.inline_asm_elementwise(_QUAD_T, "=r,r,r,r", [words, s1, s2], dtype=gl.int32, is_pure=False, pack=1)
        i = wc // 4
        sel = gl.broadcast((0x4040 | (2 * i) | ((2 * i + 1) << 8))[None, :], words)[0]
        o0, o1, o2, o3, o4, o5, o6, o7 = _lut8(_LUT2_E4M3, tw, swc, sel)
        # [64, 8, 8]: word 4i + q, value 2j + n → column 32i + 8j + 2q + n
        v = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
        v = gl.permute(gl.reshape(v, [64, 2, 4, 4, 2]), (0, 1, 3, 2, 4))
        return gl.convert_layout(gl.reshape(v, [64, 64]), A_OP)

    @gluon.jit
    def _logits_gl_kernel(
        q_ptr, win_ptr, comp_ptr, sel_ptr, s_ptr, bm_ptr, H, K, offset, n_comp, scale,
        s_qt, s_qh, s_qd, s_wn, s_cn, s_st, s_sk,
        H_P: gl.constexpr, D: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
        QST: gl.constexpr = 0,
    ):  # fmt: skip
        _pdl_release_wait(PDL)
        t = gl.program_id(0).to(gl.int64)
        kb = gl.program_id(1)
        KB = gl.num_programs(1)
        NC: gl.constexpr = D // 64

        # layouts: the MMA ([64 rows, H_P heads]) and its A operand; the window rows' words
        # [64, 16] and the compressed rows' [64, 8] per chunk in the A fragment's layout at
        # word granularity (registers over words 4·i and the row + 8, lanes over words q =
        # 0 … 3 and rows 0 … 7, warps over rows 16w); q's loads
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, H_P, 16]
        )
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        LWA: gl.constexpr = AFRAG_WORDS16
        LWF: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 4], [8, 0]],
            lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]],
            block_bases=[],
            shape=[64, 8],
        )
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([H_P, 64], gl.bfloat16)

        # the block's entries, in each layout that reads them
        _, fw_a, _, widx, _ = _entries(sel_ptr, t, kb, K, offset, n_comp, s_st, s_sk, gl.SliceLayout(1, LWA))
        _, _, fc_f, _, cidx = _entries(sel_ptr, t, kb, K, offset, n_comp, s_st, s_sk, gl.SliceLayout(1, LWF))
        _, fw_o, _, _, _ = _entries(sel_ptr, t, kb, K, offset, n_comp, s_st, s_sk, gl.SliceLayout(1, A_OP))
        present, _, _, _, _ = _entries(sel_ptr, t, kb, K, offset, n_comp, s_st, s_sk, gl.SliceLayout(1, MMA))
        w_base = win_ptr + widx * s_wn
        c_base = comp_ptr + cidx * s_cn
        # the block's formats: 0 window rows only, 1 compressed rows only, 2 both
        n_win = gl.sum(fw_a.to(gl.int32), axis=0)
        n_cmp = gl.sum(fc_f.to(gl.int32), axis=0)
        mode = gl.where(n_cmp == 0, 0, gl.where(n_win == 0, 1, 2))

        # q [H_P, D] (heads past H zero) in shared memory: whole (QST 0), or streamed through
        # QST = 2 buffers of one chunk (chunk c + 1 loaded into registers during chunk c,
        # stored once chunk c's MMA is done: the buffer chunk c − 1 used)
        qh = gl.arange(0, H_P, layout=gl.SliceLayout(1, LQ))
        qc = gl.arange(0, 64, layout=gl.SliceLayout(0, LQ))
        q_rows = q_ptr + t * s_qt + qh.to(gl.int64)[:, None] * s_qh + qc.to(gl.int64)[None, :] * s_qd
        q_ok = gl.broadcast((qh < H)[:, None], q_rows)[0]
        if QST == 0:
            q_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, H_P, 64], Q_SL)
            for qi in gl.static_range(NC):
                q_smem.index(qi).store(gl.load(q_rows + qi * 64 * s_qd, mask=q_ok, other=0.0))
        else:
            q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, H_P, 64], Q_SL)
            q_smem.index(0).store(gl.load(q_rows, mask=q_ok, other=0.0))

        acc = gl.zeros([64, H_P], gl.float32, layout=MMA)
        for c in range(NC):
            if QST != 0:
                qv = gl.load(q_rows + (c + 1) * 64 * s_qd, mask=q_ok & (c + 1 < NC), other=0.0)
            if mode == 0:
                a = _win_chunk(w_base, fw_a, c, D, LWA, A_OP)
            elif mode == 1:
                a = _comp_chunk(c_base, fc_f, c, D, LWF, A_OP)
            else:
                aw = _win_chunk(w_base, fw_a, c, D, LWA, A_OP)
                ac = _comp_chunk(c_base, fc_f, c, D, LWF, A_OP)
                a = gl.where(gl.broadcast(fw_o[:, None], aw)[0], aw, ac)
            if (QST != 0) | (
                c == 0
            ):  # q's chunk stored by every warp before the MMA reads it (the async proxy: the fence)
                gl.thread_barrier()
                fence_async_shared()
            if QST == 0:
                qb = q_smem.index(c)
            else:
                qb = q_smem.index(c % 2)
            acc = warpgroup_mma(a, qb.permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            if QST != 0:
                # chunk c − 1's buffer: its MMA finished before chunk c's (every warp is past it)
                if c + 1 < NC:
                    q_smem.index((c + 1) % 2).store(qv)

        # τ, −inf where absent; stored [m, blocks, H, 64] and each head's max over the block
        s = acc * scale
        s = gl.where(gl.broadcast(present[:, None], s)[0], s, float("-inf"))
        k = gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
        h = gl.arange(0, H_P, layout=gl.SliceLayout(0, MMA))
        row = t * KB + kb
        h64 = h.to(gl.int64)
        gl.store(s_ptr + (row * H + h64[None, :]) * 64 + k[:, None], s, mask=gl.broadcast((h < H)[None, :], s)[0])
        gl.store(bm_ptr + row * H + h64, gl.max(s, axis=0), mask=h < H)


def _on_sm90(t: torch.Tensor) -> bool:
    """Whether t lives on an sm_90 CUDA device (`bench.sass.compile_only` answers yes)."""
    return t.device.type == "cuda" and torch.cuda.get_device_capability(t.device) == (9, 0)


def logits_gluon_ok(q: torch.Tensor, win: torch.Tensor, comp: torch.Tensor) -> bool:
    """Whether the Gluon logits kernel takes these tensors: packed rows (uint8) 4-byte
    aligned, D a multiple of 128 up to 512, at most 64 heads, an sm_90 CUDA device, Gluon
    importable, not the interpreter (`sparse_attn_split`'s `gluon_logits` option then runs
    it; elsewhere the Triton kernel, with the same bits)."""
    if not (HAVE_GLUON and isinstance(q, torch.Tensor) and isinstance(win, torch.Tensor)):
        return False
    if interpreting() or win.dtype != torch.uint8 or q.dim() != 3:
        return False
    H, D = q.shape[1], q.shape[2]
    if H > 64 or D % 128 or D > 512:  # D/32 window scales: whole 4-byte words
        return False
    for rows in (win, comp):
        if rows.data_ptr() % 4 or (rows.shape[0] > 1 and rows.stride(0) % 4) or (rows.numel() and rows.stride(1) != 1):
            return False
    return _on_sm90(q)


def logits_gluon(q, win, comp, sel, offset, n_comp, scale, s_buf, bm, **tune) -> None:
    """`_logits_kernel`'s work at `BATCH_TUNE` (rsplit 1, every head in one program) over
    packed rows, into `s_buf` (fp32 [m, blocks, H, 64]) and `bm` (fp32 [m, blocks, H]), for
    `sparse_attn_split` (which checked the arguments; `logits_gluon_ok` must hold). `tune`:
    keys of `GLUON_LOGITS_TUNE`."""
    unknown = sorted(set(tune) - set(GLUON_LOGITS_TUNE))
    if unknown:
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(GLUON_LOGITS_TUNE)}")
    cfg = dict(GLUON_LOGITS_TUNE)
    cfg.update(tune)
    cap = cfg["maxnreg"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 64 <= cap <= 255):
        raise ValueError(f"maxnreg = {cap!r}; allowed: None or 64 … 255")
    if cfg["q_stages"] not in (0, 2) or isinstance(cfg["q_stages"], bool):
        raise ValueError(f"q_stages = {cfg['q_stages']!r}; allowed: 0 or 2")
    if not logits_gluon_ok(q, win, comp):
        raise ValueError(
            "logits_gluon: needs packed rows (4-byte aligned), D a multiple of 64 up to 512, H <= 64, sm_90"
        )
    require_triton("logits_gluon", q, win, sel)
    m, H, D = q.shape
    kbs = s_buf.shape[1]
    if m == 0:
        return
    _logits_gl_kernel[(m, kbs)](
        q, win, comp, sel, s_buf, bm, H, sel.shape[1], offset, n_comp, float(scale),
        *q.stride(), win.stride(0), comp.stride(0), *sel.stride(),
        H_P=max(16, triton.next_power_of_2(H)), D=D, QST=cfg["q_stages"], num_warps=4, enable_fp_fusion=False,
        **({"maxnreg": cap} if cap else {}),
        **(pdl_launch(q) if cfg["pdl"] else {"PDL": False}),
    )  # fmt: skip


assert BLOCK_K == 64  # the kernel's blocks are the selection's 64-entry blocks
