"""Index scores over packed index keys in Gluon (sm_90): the batched decode's
`indexer.index_scores_paged` over a pool of V4.1's fp4_e8m0 key rows, with the bits of the
Triton kernel (`indexer._index_scores_kernel` at `_PAGED_TUNE`). The runtime's default over
packed keys since the fifty-first entry, in its `afrag` form (below, `GLUON_INDEX_TUNE`):
each quad of lanes loads one row's code words in the warpgroup MMA's A-fragment layout, a
byte transpose within the quad (`_QUAD_T`) hands each lane its own columns' bytes, and the
keys reach the MMA from registers (no shared-memory tile, one barrier in the kernel). H100,
a B = 64 step's ratio-1 call: 103.6 µs against the Triton kernel's 122.0; the B = 64, 32K
FP8 step over packed caches 2.1-2.4 % faster (BENCHMARKS.md, fifty-first entry).

Why it was built: over packed keys the Triton kernel reads its bytes at about a third of the
copy rate (BENCHMARKS.md, thirty-third entry), and its loads of a block's code words wait at
the top of each iteration (Triton's pipeliner does not prefetch loads that feed inline
assembly). Here each program streams its blocks' code and scale words through STAGES
shared-memory stages by `cp.async`, the next blocks' bytes in flight while one block is
converted and multiplied.

What it measured (H100, 2026-12-07, forty-eighth entry; BENCHMARKS.md): slower. A B = 64 step's
ratio-1 call over 32K packed keys per sequence, L2 flushed: 151-170 µs over the launch shapes
against the Triton kernel's 121.5; the B = 64, 32K FP8 step with it 8.747 against 8.513 ms.
Nsight Compute: the Triton kernel is bound by its L1/TEX pipe (80 % busy, DRAM 37 %: 4-byte
global loads using 9.5 of each 32-byte sector, 7.2-way bank conflicts on 43 % of its shared
stores), not by load latency; this kernel moves the same words through `cp.async` and
shared loads, and its 42 KiB of shared memory and 99 registers leave 4 programs per SM
(25 % occupancy against 37.5 %). So it is off (`indexer._PAGED_TUNE["gluon"]`); its value
is a Gluon form with the Triton kernel's bits (checked on the GPU) for the levers the
profile names: 16-byte copies of a pool block's contiguous rows, the dequantized keys
straight into the MMA's A fragment (no shared-memory round trip of the tile).

Forty-ninth entry (H100, BENCHMARKS.md): Nsight Compute's source counters put the Triton
kernel's shared-store conflicts on its eight 16-byte stores of the dequantized tile (525,312
excess wavefronts each, 4.2 M of its 4.4 M): four code words per thread along a row (the
layout Triton's coalescing gives the words' load) make each quarter warp's stores meet two
ways on every bank. `one_word` converts one word per thread in the copies' layout
(shared-store conflicts 0.15 M against the Triton kernel's 4.4 M; its 4-byte copies still
meet 1.1 M): 145-167 µs over its shapes. The direct form (`stages = 0`: the words one
per thread straight into registers, no cp.async, the Triton kernel's 24.7 KiB of shared
memory, 80 registers under a cap): 134.6 µs at its best shape against the Triton kernel's
121.0; the B = 64, 32K FP8 step 8.506 against 8.475 ms. Still off.

The same operations in the same order as the Triton kernel, so the same bits (checked byte
for byte on the GPU, `tests/kernels/test_indexer_gluon.py`):
- the keys' values by `packed_rows`' scale-word PTX (`_FP4_SW_E8M0`; exact, so any exact
  conversion gives the same values);
- dots = the warpgroup MMA of the keys [64, D] (registers, the MMA's A operand) by qᵀ
  (shared memory), fp32 from zero (the first MMA without the accumulator), D in 16-column
  steps from the first column;
- round to bf16 (hardware, two values per cvt), max with 0, times the head weight (bf16 as
  fp32), round to bf16, summed over the heads along the MMA layout's rows (`gl.sum`: the
  lowering of Triton's `tl.sum` on the same layout);
- −∞ past the token's visible rows, rounded to bf16 and stored.

Scope: one token per program group (no `tokens` option), the full and the gathered form (the
reindex layers' candidates), keys of 128 values, up to 32 heads (the Flash index geometry and the tiny ones that fit it). The wrapper
refuses the rest. Gluon does not run under `TRITON_INTERPRET`: CI compiles it for sm_90
offline; its numerics are checked on the GPU against the Triton kernel.
"""

from __future__ import annotations

import torch

from ._triton import interpreting, pdl_launch, require_triton, triton
from .sparse_attn_gluon import HAVE_GLUON

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .sparse_attn_gluon import _pdl_release_wait

__all__ = ["HAVE_GLUON", "index_scores_paged_gluon", "GLUON_INDEX_TUNE"]

# Launch shape (constants, never of m): SUB blocks of 64 keys per program, STAGES of code
# words in shared memory, pdl (programmatic dependent launch where `pdl_launch` allows),
# maxnreg (a register cap for ptxas, or None), mid (the next block's copies issued before a
# block's conversion instead of after its scores). None of them moves a bit (the GPU tests).
# one_word: each thread converts one code word (`packed_rows`' table-lookup PTX, eight bf16
# values out of one word) in the copies' layout, two whole rows per warp, instead of four
# words of a row per thread (the scale-word PTX, two words per instance): the words' shared
# loads and the dequantized tile's 16-byte stores then free of bank conflicts (with four
# words per thread a quarter warp's stores meet two ways on every bank, and its word loads
# four ways). The same values, so the same bits. stages = 0: the direct form (no stages,
# no cp.async: each block's words loaded into registers in the one-word layout).
# The defaults (fifty-first entry): stages 0 with afrag and slice_out, sub 8 (H100, a B = 64
# step's ratio-1 call, L2 flushed, µs: sub 8 103.6, 4 105.3, 16 105.9, 2 112.3, 1 126.1, 32
# 112.7; without slice_out 105.9; row0 103.5; ahead 111.6, with row0 103.7; cap 80 104.8; the
# direct one-word form 134.5, the Triton kernel 122.0). Whole B = 64, 32K FP8 steps over
# packed caches (ab_steps.py, ms): afrag 8.316, sub 4 8.342, sub 16 8.355, ahead row0 8.323,
# production before 8.498.
# afrag (with stages = 0): each block's code words loaded straight into registers in the
# warpgroup MMA's A-fragment layout (`_afrag_blocks`' LWA: a quad of lanes holds one row's
# words 4i … 4i + 3, one each), a byte transpose within each quad (`_QUAD_T`: two
# shuffles and two prmt per word) handing each lane the bytes of its own fragment columns,
# converted there by the table-lookup PTX: no shared-memory tile, no barrier between
# blocks, 8 KiB of shared memory (q alone). The same values into the same MMA, so the
# same bits.
# slice_out (with afrag): the scores stored from the head sum's layout (`_scores_of`), no
# shared-memory round trip and no barrier in the loop. row0 (with afrag): where a block of 64
# keys lies in one pool block (the full form, block_rows a multiple of 64) its table entry
# is read once and the rows' pointers are the first one's plus 32-bit offsets (the same
# rows; elsewhere the per-row form). ahead (with afrag): block i + 1's words loaded into
# registers before block i's transpose, conversion and MMA.
GLUON_INDEX_TUNE = dict(
    sub=8,
    stages=0,
    pdl=True,
    maxnreg=None,
    mid=False,
    one_word=False,
    afrag=True,
    slice_out=True,
    row0=False,
    ahead=False,
)
_BLOCK_L = 64
_D = 128

if HAVE_GLUON:
    from .packed_rows import _FP4_LUT_E8M0, _FP4_SW_E8M0

    _SW_ASM = gl.constexpr(_FP4_SW_E8M0.value if hasattr(_FP4_SW_E8M0, "value") else _FP4_SW_E8M0)
    _LUT_ASM = gl.constexpr(_FP4_LUT_E8M0.value if hasattr(_FP4_LUT_E8M0, "value") else _FP4_LUT_E8M0)
    from ._triton import ROUND_BF16_PAIR_PTX

    # `_triton.round_bf16_plain_cvt`'s PTX: fp32 → bf16 → fp32, two values per cvt
    _RND_ASM = gl.constexpr(ROUND_BF16_PAIR_PTX.value)

    @gluon.jit
    def _rnd_inner(x):
        return gl.inline_asm_elementwise(_RND_ASM, "=r,=r,r,r", [x], dtype=gl.float32, is_pure=True, pack=2)

    # A byte transpose within each quad of lanes (lanes 4r … 4r + 3): lane q's word holds
    # bytes x_q[0 … 3]; out, lane q holds x_0[q], x_1[q], x_2[q], x_3[q]. Two butterfly
    # rounds: with lane q ^ 2 the 16-bit halves that cross (selector $2: 0x5410 where
    # bit 1 of q is 0, else 0x3276), then with lane q ^ 1 the bytes (selector $3: 0x6240
    # where bit 0 of q is 0, else 0x3715). Every lane of the warp runs it (no divergence).
    _QUAD_T = gl.constexpr(
        "{\n.reg .b32 p, t;\n"
        "shfl.sync.bfly.b32 p, $1, 2, 0x1f, 0xffffffff;\n"
        "prmt.b32 t, $1, p, $2;\n"
        "shfl.sync.bfly.b32 p, t, 1, 0x1f, 0xffffffff;\n"
        "prmt.b32 $0, t, p, $3;\n}"
    )

    # [64 rows, 16 words] at 4 warps: registers over words 4i (i = 0 … 3) and the row + 8,
    # lanes over words q = 0 … 3 and rows 0 … 7, warps over rows 16w: the warpgroup MMA's A
    # fragment (rows r and r + 8 of a warp's 16 in lane 4r + q) at word granularity (also
    # `sparse_attn_logits_gluon`'s window rows)
    AFRAG_WORDS16 = gl.constexpr(
        gl.DistributedLinearLayout(
            reg_bases=[[0, 4], [0, 8], [8, 0]],
            lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]],
            block_bases=[],
            shape=[64, 16],
        )
    )

    @gluon.jit
    def _lut_values(words, sw, L: gl.constexpr):
        """The eight bf16 values of each code word (nibble j: value j) by `_FP4_LUT_E8M0`,
        one word per instance; `sw` [64] the rows' scale words (word c's scale is byte
        c // 4 of it, c its index along L's second axis), passed with the byte's selector and
        the runtime high half its tables' prmt ignores, as `packed_rows._fp4_rows_bf16_lut`
        passes them."""
        b = gl.arange(0, 16, layout=gl.SliceLayout(0, L)) // 4
        return _lut8(_LUT_ASM, words, sw, gl.broadcast((0x0404 | (b << 4) | (b << 12))[None, :], words)[0])

    @gluon.jit
    def _lut8(asm: gl.constexpr, words, sw, sel):
        """`packed_rows`' table-lookup PTX `asm` (`_FP4_LUT_*` or a variant with the same
        operands), one code word per instance: eight bf16 values per word of `words` [R, W],
        scaled by the bytes of the rows' scale words `sw` [R] that `sel` [R, W] selects."""
        sw2 = gl.broadcast(sw[:, None], words)[0]
        ident = gl.broadcast((0x3210 | ((sw != 0).to(gl.int32) << 16))[:, None], words)[0]
        return gl.inline_asm_elementwise(
            asm,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
            [words, sw2, sel, ident],
            dtype=(gl.bfloat16,) * 8,
            is_pure=True,
            pack=1,
        )

    @gluon.jit
    def _afrag_keys(words, sw, LWA: gl.constexpr, A_OP: gl.constexpr):
        """[64, 128] bf16 keys in the MMA's A-fragment layout from a block's code words [64,
        16] and scale words [64] loaded in `_afrag_blocks`' layout LWA (lane 4r + q holds words
        4i + q, i = 0 … 3, of its rows). After `_QUAD_T` lane q's word at index 4i + q holds
        byte q of words 4i … 4i + 3: columns 32i + 8j + 2q and + 1 for j = 0 … 3, the
        fragment's columns 2q, 2q + 1, 2q + 8, 2q + 9 of column groups 2i and 2i + 1; their
        scale is the row's byte i, the one its index 4i + q names. The values placed at
        their columns by reshapes and a permute of registers (no data moves)."""
        wc = gl.arange(0, 16, layout=gl.SliceLayout(0, LWA))
        s1 = gl.broadcast(gl.where((wc & 2) != 0, 0x3276, 0x5410)[None, :], words)[0]
        s2 = gl.broadcast(gl.where((wc & 1) != 0, 0x3715, 0x6240)[None, :], words)[0]
        # not pure: an instance's result depends on the other lanes' operands, so two instances
        # with equal operands in one thread (two zero words of a row) must not be merged
        tw = gl.inline_asm_elementwise(_QUAD_T, "=r,r,r,r", [words, s1, s2], dtype=gl.int32, is_pure=False, pack=1)
        o0, o1, o2, o3, o4, o5, o6, o7 = _lut_values(tw, sw, LWA)
        # [64, 16, 8]: word 4i + q, value k = 2j + n (joins from the slowest axis)
        v = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
        v = gl.reshape(v, [64, 4, 4, 4, 2])  # [row, i, q, j, n]
        v = gl.permute(v, (0, 1, 3, 2, 4))  # [row, i, j, q, n]: column 32i + 8j + 2q + n
        return gl.convert_layout(gl.reshape(v, [64, 128]), A_OP)

    @gluon.jit
    def _entry_rows(ids_ptr, t, s_ids, j, L, NK, GATHER: gl.constexpr, CB: gl.constexpr):
        """The logical key rows of entries j (int64, any layout): j itself, or in the gathered
        form row ids[t, j // CB] · CB + j % CB (NK, unread and −∞, for entries past L)."""
        if GATHER:
            cid = gl.load(ids_ptr + t * s_ids + j // CB, mask=j < L, other=0).to(gl.int64)
            jr = gl.where(j < L, cid * CB + j % CB, NK)
        else:
            jr = j
        return jr

    @gluon.jit
    def _block_rows(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j0, L, NK, vis_r,
        BLOCK_ROWS: gl.constexpr, GATHER: gl.constexpr, CB: gl.constexpr, LWC: gl.constexpr,
    ):  # fmt: skip
        """Block j0's 64 row pointers and which rows are read (entries below L whose rows
        are visible; the table entries of the others unread), in the copies' row layout."""
        j = j0 + gl.arange(0, 64, layout=gl.SliceLayout(1, LWC)).to(gl.int64)
        jr = _entry_rows(ids_ptr, t, s_ids, j, L, NK, GATHER, CB)
        ok = (j < L) & (jr < vis_r)
        blk = gl.load(tbl_ptr + slot * s_tbl + jr // BLOCK_ROWS, mask=ok, other=0).to(gl.int64)
        return k_ptr + (blk * BLOCK_ROWS + jr % BLOCK_ROWS) * s_k, ok

    @gluon.jit
    def _copy_block(codes_st, scales_st, base, ok, LWC: gl.constexpr):
        """cp.async a block's code words [64, 16] and scale words [64] (rows not ok
        zero-filled) into one stage."""
        w = gl.arange(0, 16, layout=gl.SliceLayout(0, LWC))
        async_copy.async_copy_global_to_shared(
            codes_st, base.to(gl.pointer_type(gl.int32))[:, None] + w[None, :], mask=ok[:, None]
        )
        async_copy.async_copy_global_to_shared(scales_st, (base + 64).to(gl.pointer_type(gl.int32)), mask=ok)

    @gluon.jit
    def _words_bf16(words, sw, L: gl.constexpr, ONE_WORD: gl.constexpr):
        """[64, 128] bf16 keys of a block's code words [64, 16] (layout L) and scale words
        [64] (its row slice): word c holds columns 8c … 8c + 7, its scale is byte c // 4 of
        the row's scale word. ONE_WORD: `_lut_values` (`_FP4_LUT_E8M0`, one word per
        instance); else `_FP4_SW_E8M0`, two words per instance."""
        if ONE_WORD:
            o0, o1, o2, o3, o4, o5, o6, o7 = _lut_values(words, sw, L)
        else:
            wc = gl.arange(0, 16, layout=gl.SliceLayout(0, L))
            sw2 = gl.broadcast(sw[:, None], words)[0]
            sh = gl.broadcast(((wc // 4) * 8)[None, :], words)[0]
            o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
                _SW_ASM,
                "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r",
                [words, sw2, sh],
                dtype=(gl.bfloat16,) * 8,
                is_pure=True,
                pack=2,
            )
        v = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
        return gl.reshape(v, [64, 128])

    @gluon.jit
    def _block_scores(
        a_smem, q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j0, L, NK, vis_r,
        GATHER: gl.constexpr, CB: gl.constexpr, H_P: gl.constexpr,
        MMA: gl.constexpr, A_OP: gl.constexpr, OUT: gl.constexpr,
    ):  # fmt: skip
        """Block j0's scores from its dequantized keys just stored in a_smem: every warp's
        stores seen, the keys as the MMA's A operand (registers) by qᵀ, the epilogue, the
        bf16 scores stored (−∞ past the visible rows)."""
        gl.thread_barrier()
        _scores_of(
            a_smem.load(A_OP), q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j0, L, NK, vis_r, GATHER, CB, H_P, MMA, OUT,
        )  # fmt: skip

    @gluon.jit
    def _scores_of(
        a, q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j0, L, NK, vis_r,
        GATHER: gl.constexpr, CB: gl.constexpr, H_P: gl.constexpr, MMA: gl.constexpr, OUT: gl.constexpr,
        SLICE_OUT: gl.constexpr = False,
    ):  # fmt: skip
        """Block j0's scores from its keys `a` [64, 128] in the MMA's A-operand registers:
        a by qᵀ (shared memory), the epilogue, the bf16 scores stored (−∞ past the visible
        rows): from OUT's layout (one score per thread, through shared memory and two
        barriers), or with SLICE_OUT from the head sum's own layout (a quad of lanes
        holds each score; one of them stores it). The same values either way."""
        acc = gl.zeros([64, H_P], gl.float32, layout=MMA)
        acc = warpgroup_mma(a, q_smem.permute((1, 0)), acc, use_acc=False, is_async=True)
        dots = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        dots = gl.maximum(_rnd_inner(dots), 0.0)
        prod = _rnd_inner(dots * w[None, :])
        s = gl.sum(prod, axis=1)
        j = j0 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA)).to(gl.int64)
        s = gl.where(_entry_rows(ids_ptr, t, s_ids, j, L, NK, GATHER, CB) < vis_r, s, float("-inf"))
        nan = gl.full(s.shape, 0x7FC0, gl.uint16, layout=s.type.layout).to(gl.bfloat16, bitcast=True)
        sb = gl.where(s != s, nan, s.to(gl.bfloat16))
        if SLICE_OUT:
            gl.store(out_ptr + t * s_out + j, sb, mask=j < L)
        else:
            sb = gl.convert_layout(sb, OUT)
            jo = j0 + gl.arange(0, 64, layout=OUT).to(gl.int64)
            gl.store(out_ptr + t * s_out + jo, sb, mask=jo < L)

    @gluon.jit(do_not_specialize=["L"])
    def _index_gl_kernel(
        iq_ptr, w_ptr, k_ptr, vis_ptr, out_ptr, L,
        s_iq_m, s_iq_h, s_w_m, s_w_h, s_k, s_out, tbl_ptr, slot_ptr, s_tbl,
        H: gl.constexpr, H_P: gl.constexpr, SUB: gl.constexpr, STAGES: gl.constexpr,
        BLOCK_ROWS: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = False,
        MID: gl.constexpr = False,
        ONE_WORD: gl.constexpr = False,
        AFRAG: gl.constexpr = False,
        SLICE_OUT: gl.constexpr = False,
        ROW0: gl.constexpr = False,  # (AFRAG, the full form, BLOCK_ROWS a multiple of 64) one table entry per block
        AHEAD: gl.constexpr = False,  # (AFRAG) the next block's words loaded before a block's MMA
        ids_ptr=None,  # GATHER: int32 [m, ≥ L / CB] kept candidate blocks (`indexer.index_scores`' gathered form)
        s_ids=0,
        NK=0,  # GATHER: logical key rows that exist (rows ≥ NK score −∞, unread)
        GATHER: gl.constexpr = False,
        CB: gl.constexpr = 1,
    ):  # fmt: skip
        _pdl_release_wait(PDL)
        t = gl.program_id(0).to(gl.int64)
        lb = gl.program_id(1).to(gl.int64)
        D: gl.constexpr = 128

        # layouts: the code words' copies (one 4-byte word per copy: the 68-byte rows are only
        # 4-byte aligned, and the copy's width follows the per-thread contiguity alone), the
        # code words' conversion (ONE_WORD: the copies' layout; else 4 per thread along a
        # row), the MMA's accumulator and A operand
        LWC: gl.constexpr = gl.BlockedLayout([1, 1], [2, 16], [num_warps, 1], [1, 0])
        if ONE_WORD:
            LW: gl.constexpr = LWC
        else:
            LW: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, H_P, 16]
        )
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        OUT: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([H_P, D], gl.bfloat16)
        A_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        W_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        S_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])

        q_smem = gl.allocate_shared_memory(gl.bfloat16, [H_P, D], Q_SL)
        if not AFRAG:
            a_smem = gl.allocate_shared_memory(gl.bfloat16, [64, D], A_SL)
        if STAGES > 0:
            codes = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 16], W_SL)
            scales = gl.allocate_shared_memory(gl.int32, [STAGES, 64], S_SL)

        vis = gl.load(vis_ptr + t).to(gl.int64)
        slot = gl.load(slot_ptr + t).to(gl.int64)
        # q [H_P, D] (heads past H zero) into shared memory, the head weights [H_P] as fp32
        qh = gl.arange(0, H_P, layout=gl.SliceLayout(1, LQ))
        qc = gl.arange(0, D, layout=gl.SliceLayout(0, LQ))
        q = gl.load(
            iq_ptr + t * s_iq_m + qh.to(gl.int64)[:, None] * s_iq_h + qc[None, :], mask=(qh < H)[:, None], other=0.0
        )
        q_smem.store(q)
        wh = gl.arange(0, H_P, layout=gl.SliceLayout(0, MMA))
        w = gl.load(w_ptr + t * s_w_m + wh.to(gl.int64) * s_w_h, mask=wh < H, other=0.0).to(gl.float32)

        # blocks j0 = (lb·SUB + i)·64; the live ones (some entry below L with a visible row)
        # are a prefix in the full form; the gathered form runs every block below L (its rows
        # past the visible count unread: the same stores as a skipped block's)
        j_base = lb * SUB * 64
        if GATHER:
            lim = L
            vis_r = gl.minimum(vis, NK)
        else:
            lim = gl.minimum(vis, L)
            vis_r = vis
        n_live = gl.minimum(gl.maximum((lim - j_base + 63) // 64, 0), SUB).to(gl.int32)
        if AFRAG:
            _afrag_blocks(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live,
                q_smem, w, out_ptr, s_out, BLOCK_ROWS, GATHER, CB, H_P, MMA, A_OP, OUT, num_warps, SLICE_OUT, ROW0, AHEAD,
            )  # fmt: skip
        elif STAGES == 0:
            _direct_blocks(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live,
                q_smem, a_smem, w, out_ptr, s_out, BLOCK_ROWS, GATHER, CB, H_P, LWC, MMA, A_OP, OUT,
            )  # fmt: skip
        else:
            _staged_blocks(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live,
                q_smem, a_smem, codes, scales, w, out_ptr, s_out,
                BLOCK_ROWS, GATHER, CB, H_P, STAGES, MID, ONE_WORD, LWC, LW, MMA, A_OP, OUT,
            )  # fmt: skip
        # the blocks past the visible rows: −∞
        for i in range(n_live, SUB):
            jo = j_base + i * 64 + gl.arange(0, 64, layout=OUT).to(gl.int64)
            gl.store(
                out_ptr + t * s_out + jo,
                gl.full([64], float("-inf"), gl.float32, layout=OUT).to(gl.bfloat16),
                mask=jo < L,
            )

    @gluon.jit
    def _direct_blocks(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live,
        q_smem, a_smem, w, out_ptr, s_out,
        BLOCK_ROWS: gl.constexpr, GATHER: gl.constexpr, CB: gl.constexpr, H_P: gl.constexpr,
        LWC: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr, OUT: gl.constexpr,
    ):  # fmt: skip
        """STAGES = 0: each live block's code and scale words loaded straight into registers
        in the one-word layout (a warp over two whole rows), converted there, the tile into
        a_smem once every warp is past the previous block's MMA."""
        gl.thread_barrier()  # q's store before the MMAs read it (through the async proxy: the fence)
        fence_async_shared()
        wc = gl.arange(0, 16, layout=gl.SliceLayout(0, LWC))
        for i in range(n_live):
            base, ok = _block_rows(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base + i * 64, L, NK, vis_r,
                BLOCK_ROWS, GATHER, CB, LWC,
            )  # fmt: skip
            words = gl.load(base.to(gl.pointer_type(gl.int32))[:, None] + wc[None, :], mask=ok[:, None], other=0)
            sw = gl.load((base + 64).to(gl.pointer_type(gl.int32)), mask=ok, other=0)
            v = _words_bf16(words, sw, LWC, True)
            gl.thread_barrier()  # every warp past block i − 1's load of a_smem
            a_smem.store(v)
            _block_scores(
                a_smem, q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j_base + i * 64, L, NK, vis_r,
                GATHER, CB, H_P, MMA, A_OP, OUT,
            )  # fmt: skip

    @gluon.jit
    def _afrag_blocks(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live, q_smem, w, out_ptr, s_out,
        BLOCK_ROWS: gl.constexpr, GATHER: gl.constexpr, CB: gl.constexpr, H_P: gl.constexpr,
        MMA: gl.constexpr, A_OP: gl.constexpr, OUT: gl.constexpr, num_warps: gl.constexpr,
        SLICE_OUT: gl.constexpr, ROW0: gl.constexpr, AHEAD: gl.constexpr,
    ):  # fmt: skip
        """`afrag`: each live block's code and scale words loaded straight into registers in
        the A fragment's layout (`_afrag_keys`), no shared-memory tile and no barrier
        between blocks."""
        LWA: gl.constexpr = AFRAG_WORDS16
        gl.thread_barrier()  # q's store before the MMAs read it (through the async proxy: the fence)
        fence_async_shared()
        if AHEAD:
            words, sw = _afrag_words(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, BLOCK_ROWS, GATHER, CB, LWA,
                ROW0,
            )  # fmt: skip
            for i in range(n_live):
                # block i + 1's words loaded before block i's conversion and MMA (none past the
                # live blocks: their rows are not visible, so every load is masked off)
                nwords, nsw = _afrag_words(
                    k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base + (i + 1) * 64, L, NK, vis_r,
                    BLOCK_ROWS, GATHER, CB, LWA, ROW0,
                )  # fmt: skip
                _scores_of(
                    _afrag_keys(words, sw, LWA, A_OP), q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j_base + i * 64,
                    L, NK, vis_r, GATHER, CB, H_P, MMA, OUT, SLICE_OUT,
                )  # fmt: skip
                words = nwords
                sw = nsw
        else:
            for i in range(n_live):
                words, sw = _afrag_words(
                    k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base + i * 64, L, NK, vis_r,
                    BLOCK_ROWS, GATHER, CB, LWA, ROW0,
                )  # fmt: skip
                _scores_of(
                    _afrag_keys(words, sw, LWA, A_OP), q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j_base + i * 64,
                    L, NK, vis_r, GATHER, CB, H_P, MMA, OUT, SLICE_OUT,
                )  # fmt: skip

    @gluon.jit
    def _afrag_words(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j0, L, NK, vis_r,
        BLOCK_ROWS: gl.constexpr, GATHER: gl.constexpr, CB: gl.constexpr, LWA: gl.constexpr, ROW0: gl.constexpr,
    ):  # fmt: skip
        """Block j0's code words [64, 16] and scale words [64] in LWA (rows not visible or
        past L: 0, unread). ROW0: the block's 64 rows in one pool block (the full form,
        BLOCK_ROWS a multiple of 64): its table entry read once (where j0 is below L and
        the visible count), the rows' pointers the first one's plus 32-bit offsets."""
        if ROW0:
            jl = gl.arange(0, 64, layout=gl.SliceLayout(1, LWA))
            ok = (j0 + jl < L) & (j0 + jl < vis_r)
            blk = gl.load(tbl_ptr + slot * s_tbl + j0 // BLOCK_ROWS, mask=(j0 < L) & (j0 < vis_r), other=0)
            base = (k_ptr + (blk.to(gl.int64) * BLOCK_ROWS + j0 % BLOCK_ROWS) * s_k) + jl * s_k
        else:
            base, ok = _block_rows(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j0, L, NK, vis_r, BLOCK_ROWS, GATHER, CB, LWA,
            )  # fmt: skip
        wc = gl.arange(0, 16, layout=gl.SliceLayout(0, LWA))
        words = gl.load(base.to(gl.pointer_type(gl.int32))[:, None] + wc[None, :], mask=ok[:, None], other=0)
        sw = gl.load((base + 64).to(gl.pointer_type(gl.int32)), mask=ok, other=0)
        return words, sw

    @gluon.jit
    def _staged_blocks(
        k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base, L, NK, vis_r, n_live,
        q_smem, a_smem, codes, scales, w, out_ptr, s_out,
        BLOCK_ROWS: gl.constexpr, GATHER: gl.constexpr, CB: gl.constexpr, H_P: gl.constexpr, STAGES: gl.constexpr,
        MID: gl.constexpr, ONE_WORD: gl.constexpr,
        LWC: gl.constexpr, LW: gl.constexpr, MMA: gl.constexpr, A_OP: gl.constexpr, OUT: gl.constexpr,
    ):  # fmt: skip
        """STAGES ≥ 2: the blocks' words streamed through the shared-memory stages by cp.async."""
        for i in gl.static_range(STAGES - 1):
            if i < n_live:
                base, ok = _block_rows(
                    k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base + i * 64, L, NK, vis_r,
                    BLOCK_ROWS, GATHER, CB, LWC,
                )  # fmt: skip
                _copy_block(codes.index(i), scales.index(i), base, ok, LWC)
            async_copy.commit_group()
        # q's store before the MMAs read it (through the async proxy: the fence)
        gl.thread_barrier()
        fence_async_shared()
        for i in range(n_live):
            # block i's words have landed; every warp is past block i − 1 (its stage and a_smem free)
            async_copy.wait_group(STAGES - 2)
            gl.thread_barrier()
            words = codes.index(i % STAGES).load(LW)
            sw = scales.index(i % STAGES).load(gl.SliceLayout(1, LW))
            # block i + STAGES − 1 (into the stage block i − 1 used): its table entries read now,
            # its copies issued now (MID) or after block i's MMA and scores (the table loads'
            # latency then hidden behind them)
            nxt = i + STAGES - 1
            nbase, nok = _block_rows(
                k_ptr, tbl_ptr, slot, s_tbl, s_k, ids_ptr, t, s_ids, j_base + nxt * 64, L, NK, vis_r,
                BLOCK_ROWS, GATHER, CB, LWC,
            )  # fmt: skip
            if MID:
                if nxt < n_live:
                    _copy_block(codes.index(nxt % STAGES), scales.index(nxt % STAGES), nbase, nok, LWC)
                async_copy.commit_group()
            a_smem.store(_words_bf16(words, sw, LW, ONE_WORD))
            _block_scores(
                a_smem, q_smem, w, out_ptr, t, s_out, ids_ptr, s_ids, j_base + i * 64, L, NK, vis_r,
                GATHER, CB, H_P, MMA, A_OP, OUT,
            )  # fmt: skip
            if not MID:
                if nxt < n_live:
                    _copy_block(codes.index(nxt % STAGES), scales.index(nxt % STAGES), nbase, nok, LWC)
                async_copy.commit_group()
        async_copy.wait_group(0)


def index_scores_paged_gluon(
    iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out=None, *, ids=None, cand_block=0, **tune
) -> torch.Tensor:
    """`indexer.index_scores_paged`'s contract and bits over packed fp4_e8m0 keys of 128
    values (sm_90, CUDA), the full or the gathered form (ids, cand_block), one token per
    program group. `tune`: keys of `GLUON_INDEX_TUNE`."""
    from .indexer import _check_paged_call  # noqa: PLC0415

    unknown = sorted(set(tune) - set(GLUON_INDEX_TUNE))
    if unknown:
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(GLUON_INDEX_TUNE)}")
    cfg = dict(GLUON_INDEX_TUNE)
    cfg.update(tune)
    n = _check_paged_call(iq, weights, keys, block_table, tok_slot, block_rows, visible, width, out, ids, cand_block)
    m, H, d = iq.shape
    if keys.dtype != torch.uint8 or d != _D:
        raise ValueError(f"keys {keys.dtype} with d = {d}; allowed: packed fp4_e8m0 keys (torch.uint8) of {_D} values")
    if keys.shape[1] != _D // 2 + _D // 32 or keys.stride(0) % 4 or keys.data_ptr() % 4:
        raise ValueError(
            f"keys.shape = {tuple(keys.shape)}, stride {keys.stride(0)}; allowed: rows of {_D // 2 + _D // 32} "
            "bytes starting 4-byte aligned"
        )
    if H > 32:
        raise ValueError(f"iq.shape[1] (heads) = {H}; allowed: 1 … 32")
    sub, st = cfg["sub"], cfg["stages"]
    if sub not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"sub = {sub!r}; allowed: 1, 2, 4, 8, 16, 32")
    if isinstance(st, bool) or not isinstance(st, int) or not (st == 0 or 2 <= st <= 8):
        raise ValueError(f"stages = {st!r}; allowed: 0 (direct loads) or 2 … 8")
    cap = cfg["maxnreg"]
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or not 64 <= cap <= 255):
        raise ValueError(f"maxnreg = {cap!r}; allowed: None or 64 … 255")
    if not isinstance(cfg["afrag"], bool) or (cfg["afrag"] and st != 0):
        raise ValueError(f"afrag = {cfg['afrag']!r} with stages = {st!r}; allowed: False, or True with stages = 0")
    for key in ("slice_out", "row0", "ahead"):
        if not isinstance(cfg[key], bool) or (cfg[key] and not cfg["afrag"]):
            raise ValueError(f"{key} = {cfg[key]!r}; allowed: False, or True with afrag")
    row0 = cfg["row0"] and ids is None and block_rows % _BLOCK_L == 0
    extra = [] if ids is None else [ids]
    require_triton("index_scores_paged_gluon", iq, weights, keys, visible, block_table, tok_slot, *extra)
    if not HAVE_GLUON or interpreting():
        raise RuntimeError("index_scores_paged_gluon: needs Gluon and a CUDA device (not under TRITON_INTERPRET)")
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=iq.device)
    if m == 0:
        return out
    gather = {} if ids is None else dict(ids_ptr=ids, s_ids=ids.stride(0), NK=width, GATHER=True, CB=cand_block)
    grid = (m, triton.cdiv(n, _BLOCK_L * sub))
    _index_gl_kernel[grid](
        iq, weights, keys, visible, out, n,
        iq.stride(0), iq.stride(1), weights.stride(0), weights.stride(1), keys.stride(0), out.stride(0),
        block_table, tok_slot, block_table.stride(0),
        H=H, H_P=max(16, triton.next_power_of_2(H)), SUB=sub, STAGES=st, BLOCK_ROWS=block_rows,
        num_warps=4, MID=bool(cfg["mid"]), ONE_WORD=bool(cfg["one_word"]), AFRAG=cfg["afrag"], SLICE_OUT=cfg["slice_out"], ROW0=row0, AHEAD=cfg["ahead"], **({"maxnreg": cap} if cap else {}),
        **gather,
        **(pdl_launch(iq) if cfg["pdl"] else {"PDL": False}),
    )  # fmt: skip
    return out
