"""Sparse attention for the decode regime: the selection split across programs by its
64-entry blocks (Triton), in the reference's order. Twin: `attnv41.reference.sparse_attn.
sparse_attn` itself (the same order the fused kernel and the golden data follow).

`sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None)` has the contract of
`kernels.sparse_attn.sparse_attn` (same arguments, −1 rule and checks); win and comp may
also be V4.1's packed rows (uint8, `attnv41.packed`: fp8_e8m0 window rows, fp4_e4m3
compressed rows), dequantized as they are loaded: the same values, so the same bits. The fused kernel
runs one program per token from the first block to the last (one SM per token: 77 µs at
batch 1 on an H200); this one spreads the work over programs and keeps the order:

1. `_logits_kernel`, grid (m, blocks, head blocks): per 64-entry block, the logits τ·q·Rᵀ
   (fp32, absent → −inf) and their max per head, stored.
2. The fused loop over the blocks on the stored logits, for a BLOCK_DV-column slice of the
   weighted rows: running max = max(running max, block max) (exact: equal to the fused
   loop's bit for bit), p = exp(s − running max), den = den·α + Σp, acc = acc·α +
   dot(bf16(p), R), the sink last, o = bf16(acc / den). Two kernels compute it
   (`kernels/sparse_attn_combine.py`):
   - `_pv_combine_kernel`, grid (m, head blocks, D slices): the loop itself, block by block;
   - `_pv_blocks_kernel`, grid (m, blocks, head blocks × D slices): each block's
     dot(bf16(p), R) in its own program (the running max at a block is the max of the block
     maxima so far, so each program has it without the loop), stored as fp32; the last
     program of a slice to arrive runs the recurrence over the stored products. The
     gathers and dots run in parallel instead of in sequence (batch 1: 14.2 µs against
     17.5 on the H200), at the cost of an [m, blocks, H, D] fp32 workspace (batch 64: 166
     against 108 µs).
   Both take Σp as a fixed pairwise tree (`_row_sum`) and the same dot tile, so they give
   the same bits (checked on the GPU at the Flash shapes): the wrapper takes blocks for
   m ≤ `_BLOCKS_MAX_M` tokens, the loop above, and a token's bits do not depend on which.

So each block's bf16 probabilities are rounded against the same running max as in the
reference and the fused kernel; what may differ is fp32 summation order only (the logits'
dot is taken in D chunks; Σp as a tree and the weighted rows in other tile shapes). On the
H200 at the Flash shapes the split differs from the fused kernel in 6e-5 of the output
elements, by one bf16 ulp (`test_differs_from_fused_only_in_fp32_order`: under 1 % of the
elements, within one bf16 rounding). Chosen by regime, never by m: every decode step (one
token per sequence, whatever the number of tokens in a call) runs this kernel; prefill
runs the fused one (whose single program per token holds a [64, 512] accumulator,
efficient at large m). A token's programs read only its own row of q and sel, and the tile
shapes are constants, so its bits do not depend on m or on the other tokens of the call;
appending −1 entries changes no bit (an all-absent block has α = 1 and adds exact zeros).

The block-parallel combine's arrival counters are one buffer per device and owner, as the
decode GEMV's (`_triton.ArrivalCounters`): each runtime's own; direct calls share one per
device (`prepare`) and must not run at once on different streams.

Workspace per token: the logits (H·64·4 bytes per block: 16 KiB at 64 heads) and the block
maxima, allocated per call (from the graph's pool under capture).
"""

from __future__ import annotations

import os

import torch

from . import rope
from ._triton import HAVE_TRITON, ArrivalCounters, interpreting, pdl_launch, require_triton, tl, triton
from .packed_rows import fp4_words_mode
from .sparse_attn import BLOCK_K, _validate, sparse_attn_torch
from .sparse_attn_gluon import HAVE_GLUON, sparse_attn_gluon
from .sparse_attn_logits_gluon import logits_gluon, logits_gluon_ok

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait
    from .packed_rows import fp4_rows_bf16, fp8_e8m0_rows
    from .sparse_attn_combine import _gather_ptrs, _load_rows, _pv_blocks_kernel, _pv_combine_kernel

__all__ = ["sparse_attn_split", "sparse_attn_batch", "sparse_attn_split_torch", "prepare", "BATCH_TUNE"]

# The launch configuration (tile shapes, warps): constants, never derived from m.
# warps_b = 8: the H200 sweep of 2026-12-01 (late; scripts/attn_tune.py): 17.3 µs at batch 1
# (19.1 with 4 warps), 108 at batch 64 (92.5); the runtime's decode is one token per call today.
# combine: "blocks" (`_pv_blocks_kernel`, warps_pv) or "loop" (`_pv_combine_kernel`,
# warps_b), the same bits (the GPU tests check it); "auto" takes blocks for m ≤
# _BLOCKS_MAX_M tokens. H200, context 32K, µs (BENCHMARKS.md, 2026-12-02), blocks / loop:
# batch 1 14.5 / 17.4, 2 17.6 / 17.5, 4 22.1 / 17.4, 8 30.5 / 22.2, 64 166.5 / 112.3 (the
# block form's [m, blocks, H, D] fp32 workspace: 84 MB at batch 64).
# fmt_dots (a tuning option, off; packed rows only): the logits kernel runs one dot per
# format present in a block instead of one over a tile holding both. Same bytes (H200,
# 2026-12-03 eighth entry: quick tier passed with it on), 179 registers instead of 254 at
# dk = 128 but not faster there (82.9 against 80.5 µs at B = 64); 148 at dk = 64, untimed.
# dk_packed: the column chunk over packed rows (None: dk). fp4_asm: packed fp4 rows
# dequantized by PTX straight into bf16 (`packed_rows.fp4_rows_bf16`, the same bits): on
# since the tenth entry (below); the ninth entry's form was slower here.
# warps_b_packed: the loop combine's warps over packed rows (None: warps_b).
# maxnreg_a_packed, maxnreg_b_packed: a register cap (ptxas .maxnreg) for the logits kernel
# and the loop combine over packed rows (None: none). It changes the allocation, not the
# arithmetic: the same bytes.
# rsplit (a tuning option, 1): the logits kernel's programs each over 64 / rsplit rows of a
# block (its max per head kept per sub-block, the combines take their max: the same bytes,
# checked on the H200 at the Flash shapes). 2026-12-04 (eleventh entry;
# scripts/logits_split_probe.py, batch 1, L2 flushed): the logits kernel alone 8.1 → 7.1 µs
# over bf16 rows and 13.8 → 10.0 over packed rows with rsplit = 4, but the whole attention
# not faster (17.5 → 18.5, 22.3 → 22.3), and whole steps slower (ab_steps.py, DecodeGraphs
# at 4K: bf16 4.172 → 4.204 ms, packed 4.451 → 4.490; BatchGraphs B = 64, rsplit = 2: bf16
# 8.001 → 8.317, packed 8.733 → 9.251): off.
# keys_m: the logits as rows · qᵀ, the rows the MMA's A operand (no transposed tile in
# shared memory); keys_m_packed: over packed rows (None: keys_m). The same bytes as q · rowsᵀ
# on the H200 at the Flash shapes (the GPU test), 179-188 registers instead of 254 over
# packed rows. Off in `_TUNE`; on over packed rows in `BATCH_TUNE` (below).
# 2026-12-03 (ninth entry; scripts/attn_ncu.py --time --rounds 3, synthetic Flash shapes at
# a 32K context, both kernels, L2 flushed; scripts/batch_kernel_probe.py --attn-set asm on a
# B = 64 step's own inputs; the same bytes in every case): at batch 1 (`_TUNE`) head blocks
# of 16 (4 × the logits programs) 16.5 µs against 16.9 over bf16 rows, 20.2 against 21.6
# over packed rows; fp4_asm 21.6 → 22.7 (bh = 64). At B = 64 (BATCH_TUNE, step inputs)
# bf16 rows with dk = 64 60.4 against 64.5 (dk = 32: 74.0); packed rows with dk = 32 and
# fmt_dots 75.4 against 80.1 (dk = 64: 79.0; fp4_asm with dk = 32, fmt_dots: 96.2). In the
# whole step the packed choice reverses (scripts/ab_steps.py: BatchGraphs, B = 64 at 32K,
# the shapes swapped in one run): dk = 32 with fmt_dots 9.27 ms/step against 9.09 with
# dk = 128 and one dot; bf16 rows' dk = 64 8.005 against 8.12; batch 1's bh = 16 4.96
# against 5.04 (bf16), 5.26 against 5.31 (packed). The kernels timed alone (L2 flushed)
# and inside the step disagree for packed rows: the step decides. And bh = 16 at batch 1
# helps the batched runtime's step but not the single-sequence one's (DecodeGraphs, bf16
# caches, same run: 4.25 / 4.27 ms at 4K / 32K against 4.18 / 4.21 with bh = 64): `_TUNE`
# keeps 64, the batched runtime's m = 1 calls take `_BATCH_SMALL_TUNE` (bh = 16).
# 2026-12-03 (tenth entry; ab_steps.py, same run, ms/step, BatchGraphs at 32K): fp4_asm on,
# now that its scales load per 16-value block (no 16-bit shared stores of the tile): packed
# caches B = 64 9.057 → 8.906, B = 1 5.227 → 5.140; bf16 caches unchanged (7.955 / 7.939,
# 4.945 / 4.947); single-sequence DecodeGraphs at 4K, packed 4.447 → 4.432. keys_m: B = 64
# packed 9.113 (8.933 with fp4_asm), bf16 7.998. The kernels alone (batch_kernel_probe.py,
# B = 64 step inputs, L2 flushed): packed 80.2 → 77.1 µs (keys_m with fp4_asm 76.0, and 73.0
# with dk_packed = 64, not timed in the step); bf16 60.5.
# early_rows (blocks combine, under PDL): `_pv_blocks_kernel` gathers its block's rows while
# the logits kernel runs (that kernel then releases it only after its own wait, so every
# writer of the selection and the caches has finished; the logits and workspace are read
# after the wait). The same loads and arithmetic: the same bytes (the GPU test, also in
# graph replays whose inputs are rewritten just before). 2026-12-04 (fourteenth entry;
# scripts/ab_steps.py --single, DecodeGraphs, 3 rounds, ms/step at 4K / 32K): bf16 caches
# 4.177 / 4.196 → 4.164 / 4.178, packed caches 4.451 / 4.465 → 4.399 / 4.411; BatchGraphs
# B = 1 at 32K: bf16 4.958 → 4.961, packed 5.184 → 5.148. The attention alone in bench (c)
# did not move (13.8-14.1 µs, B = 1): the gain is the overlap with the logits kernel
# inside a step. On.
_TUNE = dict(
    bh=64,
    dk=128,
    dk_packed=None,
    warps_a=4,
    stages_a=3,
    comb_h=16,
    comb_d=64,
    warps_b=8,
    stages_b=3,
    combine="auto",
    warps_pv=4,
    fmt_dots=False,
    fp4_asm=True,
    keys_m=False,
    keys_m_packed=None,
    rsplit=1,
    warps_b_packed=None,
    maxnreg_a_packed=None,
    maxnreg_b_packed=None,
    scale_word=False,
    early_rows=True,
    counter_release=False,
    lut=False,
    fmt_loops=True,
    gluon_logits=False,
)
# gluon_logits (fifty-first entry; off): over packed rows at the loop combine's shape (rsplit
# 1), the logits by `sparse_attn_logits_gluon` (the rows dequantized straight into the MMA's A
# fragment, no shared-memory tile), with this kernel's bits; True, or a dict of its launch
# options (`GLUON_LOGITS_TUNE` keys). Where it does not apply (`logits_gluon_ok`: packed rows
# 4-byte aligned, D a multiple of 128 up to 512, H ≤ 64, sm_90) `_logits_kernel` runs.
# The same bytes on an H100 (its GPU tests, the probe), but slower there: the attention on a
# B = 64, 32K step's inputs 65.6 µs with this kernel, 76.1 with the Gluon logits (q whole in
# shared memory), 72.3 with q_stages 2 under a cap of 128, 67.6 under 96 (logits alone 28.8
# against 31.0-38.8); the B = 64 FP8 step over packed caches 8.804 against 8.497 ms (q whole)
# and 8.354 against 8.302 (q_stages 2, cap 96). Off.
# fmt_loops (thirty-fourth entry; on in `_TUNE`, off in BATCH_TUNE): the logits
# kernel picks a block's format once and runs that format's chunk loop, with no branch
# inside, so Triton's pipeliner turns its row loads into asynchronous copies stages ahead,
# as it does for the q chunks and for bf16 rows (in the branch of `_load_rows` they are
# synchronous loads: each of the D / DK chunks waits for its rows). Offline sm_90 (B = 64,
# BATCH_TUNE): 8 → 52 asynchronous copies, 1,584 → 2,296 instructions (three loops), 4 → 8
# spill stores under the cap of 96 registers (none at 128); m = 1 (`_TUNE`): 24 → 144. The
# same loads and arithmetic per chunk: the same bytes (test_sparse_attn_packed.py). The loop
# combine's analogue (both formats' loads outside the branch) was tried offline and dropped:
# nothing pipelined at its single stage; at 2 stages 2 more copies, spills 37 → 54.
# 2026-12-06 (thirty-fifth entry; H200, scripts/ab_steps.py, FP8 weights at 32K, ms/step,
# median of 3 rounds, min-max apart): the single-sequence DecodeGraphs step over packed
# caches 3.257 → 3.213 (bf16 caches 3.054 / 3.052, no packed rows to load): on in `_TUNE`.
# BatchGraphs: B = 1 packed 5.596 → 5.617, B = 64 packed 8.773 → 8.765 (bf16 caches equal),
# and with the cap of 128 registers B = 64 packed 9.081: BATCH_TUNE keeps it off. The
# kernels alone on a B = 64 step's inputs (batch_kernel_probe.py --attn-set loops, L2
# flushed): packed 62.8 → 63.1 µs, logits only 26.9 → 27.2.
# lut (thirty-third entry, a tuning option, off): the compressed rows by `packed_rows`'
# table-lookup PTX (WORDS = 4; D a multiple of 64). Offline sm_90: the logits kernel's
# fp4-only branch 155 → 126 instructions per chunk, the loop combine's 148 → 138; the same
# bytes (tests/kernels/test_sparse_attn_packed.py, H100). Not timed alone; the index scores'
# lut (indexer.py) was not faster in the B = 64 step (BENCHMARKS.md, thirty-third entry).
# counter_release (twenty-ninth entry, a tuning option, off; untimed): the block combine's
# arrival counter with release / acquire split as `gemv._SPLIT_FORM = "release"` (no L1
# invalidation in the programs that are not last); the same bytes.
# scale_word (twelfth entry, a tuning option, off): packed fp4 tiles of four scales (chunks
# of 64 columns: the batched logits kernel) take them as one word per row
# (`packed_rows.fp4_words_mode`, WORDS = 3) instead of a scale tile of joins. Offline sm_90
# (BATCH_TUNE, packed): 1,584 → 1,568 instructions in the logits kernel, but under its cap of
# 96 registers 6 spill stores and 3 reloads against 3 and 0, and its shared round trips stay
# (they are not the scale tile's, unlike the index scores'). H200 (ab_steps.py, BatchGraphs
# B = 64 at 32K, packed caches): 8.283 ms/step against 8.252 without. The same bytes
# (tests/kernels/test_sparse_attn_packed.py, its scale-word variants on the GPU).
_BLOCKS_MAX_M = 1
# The batched runtime's decode attention (`sparse_attn_batch`, ops.TRITON_BATCH_OPS): one
# launch shape for every m there too (the loop combine over all 64 heads per program, so a
# token's rows are gathered once per column slice, not once per 16 heads). H200 tile sweep
# of the two-kernel split (BENCHMARKS.md 2026-12-01 night): 67.6 µs at batch 64 against
# 92-161 for the 16-head tiles, 27.6 against 16.7 at batch 1. The single-sequence runtime
# keeps `_TUNE` (batch 1 is its regime); each runtime's bits are m-invariant on its own.
# 2026-12-02 (scripts/batch_kernel_probe.py: the kernels alone on one batched step's own
# inputs, batch 64 at a 32K context, rope epilogue on): 128-column slices 76.0 µs against
# 98.5 for 64 (bf16 rows; packed 108.8 against 139.8), the same bytes on the H200; with
# the rope epilogue in registers 68.5 (packed 102.1), and one pipeline stage in the loop
# 69.3 (packed 86.5: the packed loop's dequantization spills less).
# 2026-12-03 (batch_kernel_probe --attn-set logits, B = 64 at 32K, the same bytes): the
# logits kernel with 2 pipeline stages instead of 3, 64.5 µs against 66.1 (packed rows 80.5
# against 82.8); 8 warps lose on packed rows (98.4: 166 registers, one program per SM). At
# batch 1 (`_TUNE`, 10 logits programs) 2 stages lose (9.1 against 7.2 µs, logits alone).
# 2026-12-03 (ninth entry, above): dk = 64 over bf16 rows, 128 over packed rows (the launch
# shape follows the rows' format, never m).
# 2026-12-03 (tenth entry; ab_steps.py, BatchGraphs B = 64 at 32K, packed caches, same run):
# packed rows in chunks of 64 with keys_m 8.742 ms/step against 8.894 (dk 128, heads-major)
# and 9.006 (dk 64, heads-major); bf16 rows keep heads-major (keys_m: 7.998 against 7.955).
# 2026-12-04 (eleventh entry; ab_steps.py, BatchGraphs B = 64 at 32K, same run): the loop
# combine in 8 warps over bf16 rows, 7.852 ms/step against 8.001 with 4 (128 registers
# instead of 254: two programs of 8 warps per SM); over packed rows 8 warps alone lose, 9.193
# against 8.733 (188 registers: one program per SM). 64-column slices lost on both (8.606
# / 9.589). Over packed rows with register caps (ptxas .maxnreg; no spill reloaded in the
# logits kernel, 5 spilled values in the combine): the logits kernel at 96 registers (five
# programs of 4 warps per SM: the 640 programs of B = 64 in one wave) 8.608 against 8.733,
# and with the combine in 8 warps at 128 registers (two per SM) **8.374** (same run; bench
# (f) 8.42 against 8.83 before). The same bytes (the GPU tests: packed == bf16 rows).
BATCH_TUNE = dict(
    bh=64,
    dk=64,
    dk_packed=64,
    keys_m_packed=True,
    fmt_dots=False,
    comb_h=64,
    comb_d=128,
    warps_b=8,
    warps_b_packed=8,
    maxnreg_a_packed=96,
    maxnreg_b_packed=128,
    stages_b=1,
    combine="loop",
    stages_a=2,
    fmt_loops=False,
)
_BATCH_SMALL_M = 1  # `sparse_attn_batch` calls of at most this many tokens take `_BATCH_SMALL_TUNE` (same bytes)
_BATCH_SMALL_TUNE = dict(bh=16, fmt_loops=False)  # over `_TUNE`: its 64-row blocks' logits in 4 head blocks
# The one-pass Gluon kernel (`kernels/sparse_attn_gluon.py`): the same bytes as the two
# kernels here (the GPU tests compare them at the Flash shapes, with the rope epilogue), so
# a wrapper may choose it by m. Opt-in (`ATTNV41_GLUON_ATTN=1`, read at import, or
# `_GLUON["on"]`): calls of at least `_GLUON["min_m"]` tokens over bf16 rows on an sm_90 GPU
# then run it. 2026-12-04 (fifteenth entry), H200, µs: alone it is faster from m = 32
# (scripts/gluon_attn_probe.py, L2 flushed, Triton BATCH_TUNE / Gluon: B = 16 36.5 / 44.1,
# 24 40.8 / 44.6, 32 49.1 / 44.9, 64 60.5 / 47.6; bench (c) at B = 64, 32K: 39.2 against 49.6,
# FlashMLA 44.9), but inside the batched step it is slower (scripts/step_profile.py, B = 64 at
# 32K: 51.2 µs per layer against 16.9 + 31.6 = 48.4 for the two kernels, which gain in the
# step where it loses; the cause is not known; ab_steps.py, BatchGraphs: 8.04 against 7.85
# ms/step at B = 64, 7.24 against 6.80 at B = 32; with PDL 8.50). So it stays off by default.
GLUON_ENV = "ATTNV41_GLUON_ATTN"
# a dict: ab_steps.py switches it in place
_GLUON = dict(on=os.environ.get(GLUON_ENV, "0") == "1", min_m=32)
_LOG2_K = BLOCK_K.bit_length() - 1  # the Σp tree's levels (BLOCK_K a power of two)
_LOCKS = 1 << 16
_counters = ArrivalCounters("sparse_attn_split", "attnv41.kernels.sparse_attn_split.prepare", _LOCKS)

if HAVE_TRITON:

    @triton.jit
    def _logits_dot(q_c, r_c, s, DOT_FP32: tl.constexpr, KEYS_M: tl.constexpr):
        """s + q_c · r_cᵀ ([BLOCK_H, DK] · [BLOCK_K, DK]ᵀ), or with KEYS_M its transpose s +
        r_c · q_cᵀ (the rows the MMA's A operand: each entry the same products over the same
        chunk), fp32 accumulation; under the interpreter (DOT_FP32) fp64: its sums of exact
        bf16 products stay exact over all the chunks, so its logits do not depend on the chunk
        DK, as the GPU's MMA chain's do not (the launch shapes differ in DK by row format and
        between m = 1 and m > 1)."""
        if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
            a, b = q_c.to(tl.float64), r_c.to(tl.float64)
            if KEYS_M:
                s = tl.dot(b, tl.trans(a), s, input_precision="ieee", out_dtype=tl.float64)
            else:
                s = tl.dot(a, tl.trans(b), s, input_precision="ieee", out_dtype=tl.float64)
        elif KEYS_M:
            s = tl.dot(r_c, tl.trans(q_c), s)
        else:
            s = tl.dot(q_c, tl.trans(r_c), s)
        return s

    @triton.jit
    def _q_chunk(q_ptr, t, cols, D, offs_h64, mask_h, stride_qt, stride_qh, stride_qd):
        """[BLOCK_H, DK] columns `cols` of token t's queries (0 past D and past H)."""
        return tl.load(
            q_ptr + t * stride_qt + offs_h64[:, None] * stride_qh + cols.to(tl.int64)[None, :] * stride_qd,
            mask=mask_h[:, None] & (cols < D)[None, :],
            other=0.0,
        )

    @triton.jit
    def _logits_kernel(
        q_ptr,
        win_ptr,
        comp_ptr,
        sel_ptr,
        s_ptr,  # fp32 [m, KB, H, BLOCK_K] logits (τ applied, absent → −inf)
        bm_ptr,  # fp32 [m, KB · RSPLIT, H] maxima of each sub-block of BLOCK_K / RSPLIT rows
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
        PACKED: tl.constexpr,
        WORDS: tl.constexpr,
        PDL: tl.constexpr = False,
        FMT_DOTS: tl.constexpr = False,
        KEYS_M: tl.constexpr = False,
        RSPLIT: tl.constexpr = 1,
        LATE_RELEASE: tl.constexpr = False,
        FMT_LOOPS: tl.constexpr = False,
    ):
        """Grid (m, blocks · RSPLIT, head blocks): each program the logits of BLOCK_K /
        RSPLIT rows of one block (sub-block r of block kb) for BLOCK_H heads, and their max
        per head. Each logit is one row's dot over D in the same chunks whatever RSPLIT,
        and a block's max is the max of its sub-blocks' (the combines take it): RSPLIT moves
        no bit. LATE_RELEASE: the next kernel may start only once this one's wait returned
        (every kernel before this one finished), so that it may read their outputs before
        its own wait (`_pv_blocks_kernel`'s EARLY)."""
        if LATE_RELEASE:
            pdl_wait(PDL)
            pdl_release(PDL)
        else:
            pdl_release(PDL)
            pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        kb = tl.program_id(1) // RSPLIT
        r = tl.program_id(1) % RSPLIT
        hb = tl.program_id(2)
        KB = tl.num_programs(1) // RSPLIT
        BLOCK_R: tl.constexpr = BLOCK_K // RSPLIT

        # [BLOCK_H] heads, [DK] columns of one chunk, [BLOCK_R] entries of this sub-block
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_c = tl.arange(0, DK)
        offs_k = r * BLOCK_R + tl.arange(0, BLOCK_R)
        mask_h = offs_h < H
        offs_h64 = offs_h.to(tl.int64)
        kk = kb * BLOCK_K + offs_k
        present, from_win, ok, w_base, c_base = _gather_ptrs(
            win_ptr, comp_ptr, sel_ptr, t, kk, K, offset, n_comp, stride_st, stride_sk, stride_wn, stride_cn
        )

        # s: [BLOCK_H, BLOCK_R] fp32, q·Rᵀ summed over D in chunks of DK columns
        if KEYS_M:  # [BLOCK_R, BLOCK_H]: the rows as the MMA's rows
            s = tl.zeros([BLOCK_R, BLOCK_H], dtype=tl.float64 if DOT_FP32 else tl.float32)
        else:
            s = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float64 if DOT_FP32 else tl.float32)
        if FMT_DOTS:
            # (a tuning option, packed rows) one dot per format present in the block, over
            # that format's rows (the others' 0): each logit is one row's dot, so the other
            # format's dot adds exact zeros to it, the bits of one dot over the mixed rows
            from_comp = ok & ~from_win
            any_win = tl.sum(from_win.to(tl.int32), axis=0) > 0
            any_comp = tl.sum(from_comp.to(tl.int32), axis=0) > 0
        if FMT_LOOPS:
            # (a tuning option, packed rows) the block's format chosen once, each format's
            # chunk loop without a branch inside, so that its row loads may be pipelined as
            # the q chunks are; the same loads and arithmetic per chunk
            n_w = tl.sum(from_win.to(tl.int32), axis=0)
            n_c = tl.sum((ok & ~from_win).to(tl.int32), axis=0)
            if n_c == 0:
                for c in range(0, D_CHUNKS):
                    q_c = _q_chunk(q_ptr, t, c * DK + offs_c, D, offs_h64, mask_h, stride_qt, stride_qh, stride_qd)
                    r_c = fp8_e8m0_rows(w_base, from_win, c * DK, D, DK).to(tl.bfloat16)
                    s = _logits_dot(q_c, r_c, s, DOT_FP32, KEYS_M)
            elif n_w == 0:
                for c in range(0, D_CHUNKS):
                    q_c = _q_chunk(q_ptr, t, c * DK + offs_c, D, offs_h64, mask_h, stride_qt, stride_qh, stride_qd)
                    r_c = fp4_rows_bf16(c_base, ok & ~from_win, c * DK, D, DK, 16, False, WORDS)
                    s = _logits_dot(q_c, r_c, s, DOT_FP32, KEYS_M)
            else:
                for c in range(0, D_CHUNKS):
                    cols = c * DK + offs_c
                    q_c = _q_chunk(q_ptr, t, cols, D, offs_h64, mask_h, stride_qt, stride_qh, stride_qd)
                    r_c = _load_rows(
                        w_base, c_base, from_win, ok, cols.to(tl.int64), cols < D, stride_wd, stride_cd, D, c * DK,
                        DK, PACKED, WORDS,
                    )  # fmt: skip
                    s = _logits_dot(q_c, r_c, s, DOT_FP32, KEYS_M)
        for c in range(0, 0 if FMT_LOOPS else D_CHUNKS):
            cols = c * DK + offs_c
            cm = cols < D
            cols64 = cols.to(tl.int64)
            q_c = tl.load(
                q_ptr + t * stride_qt + offs_h64[:, None] * stride_qh + cols64[None, :] * stride_qd,
                mask=mask_h[:, None] & cm[None, :],
                other=0.0,
            )
            if FMT_DOTS:
                if any_win:
                    r_w = fp8_e8m0_rows(w_base, from_win, c * DK, D, DK).to(tl.bfloat16)
                    s = _logits_dot(q_c, r_w, s, DOT_FP32, KEYS_M)
                if any_comp:
                    r_p = fp4_rows_bf16(c_base, from_comp, c * DK, D, DK, 16, False, WORDS)
                    s = _logits_dot(q_c, r_p, s, DOT_FP32, KEYS_M)
            else:
                r_c = _load_rows(
                    w_base, c_base, from_win, ok, cols64, cm, stride_wd, stride_cd, D, c * DK, DK, PACKED, WORDS
                )
                s = _logits_dot(q_c, r_c, s, DOT_FP32, KEYS_M)
        if KEYS_M:
            s = tl.trans(s)
        s = s.to(tl.float32) * scale
        s = tl.where(present[None, :], s, float("-inf"))

        row = t * KB + kb
        s_ptrs = s_ptr + (row * H + offs_h64[:, None]) * BLOCK_K + offs_k[None, :]
        tl.store(s_ptrs, s, mask=mask_h[:, None])
        tl.store(bm_ptr + (row * RSPLIT + r) * H + offs_h64, tl.max(s, axis=1), mask=mask_h)


def sparse_attn_batch(q, win, comp, sel, offset, sink, scale, out=None, rot=None) -> torch.Tensor:
    """`sparse_attn_split` with the batched runtime's launch shape: the same order and
    contract. `BATCH_TUNE` (the loop over all 64 heads per program), except for calls of m ≤
    `_BATCH_SMALL_M` tokens, which take the single-sequence shape `_TUNE` (the block-parallel
    combine, 16 heads × 64 columns: 4 programs per token with BATCH_TUNE's 128-column slices
    leave the GPU idle at batch 1) with the logits in head blocks of 16 (`_BATCH_SMALL_TUNE`). Both give a token the same bytes (the same logits
    kernel, the same Σp tree and dot order; checked on the GPU at the Flash shapes, bf16 and
    packed rows, by tests/kernels/test_decode_invariance.py), so the choice by m moves no
    bit."""
    m = q.shape[0] if isinstance(q, torch.Tensor) and q.dim() == 3 else 0
    if _GLUON["on"] and m >= _GLUON["min_m"] and gluon_attn_ok(q, win):
        return sparse_attn_gluon(q, win, comp, sel, offset, sink, scale, out=out, rot=rot)
    tune = _BATCH_SMALL_TUNE if 0 < m <= _BATCH_SMALL_M else BATCH_TUNE
    return sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=out, rot=rot, **tune)


def gluon_attn_ok(q, win) -> bool:
    """Whether the one-pass Gluon kernel can run on these tensors: bf16 rows, at most 64
    heads of width at most 512, a CUDA device of compute capability 9.x (its warpgroup MMA
    is Hopper's), Gluon importable, not the interpreter. (`sparse_attn_batch` takes it only
    when `_GLUON["on"]`.)"""
    if not (HAVE_GLUON and isinstance(q, torch.Tensor) and isinstance(win, torch.Tensor)):
        return False
    if q.device.type != "cuda" or interpreting():
        return False
    if win.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[1] > 64 or q.shape[2] > 512:
        return False
    return torch.cuda.get_device_capability(q.device)[0] == 9


def sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=None, rot=None, **tune) -> torch.Tensor:
    """o[t, h] = Σ_j softmax_j(τ·q[t,h]·R_j ∪ sink_h) · R_j as bf16 `[m, H, D]`, split over
    the selection's 64-entry blocks (the decode regime); contract as
    `sparse_attn.sparse_attn`, order in this module's docstring.

    rot: None, or `(cos, sin, pos, o_rot)`: also write `rope.apply_rope(o, cos, sin, pos,
    inverse=True)` into o_rot (bf16 `[m, H, D]`, last dim contiguous), bit for bit, in the
    kernel's epilogue (the layer's output projection reads o_rot). `tune` is for the tuning
    script only (tile shapes and warps; the order stays the reference's)."""
    _validate(q, win, comp, sel, offset, sink, scale, out, allow_packed=True)
    _check_rot(rot, q)
    require_triton("sparse_attn_split", q, win, sel, sink)
    packed = win.dtype == torch.uint8
    m, H, D = q.shape
    K = sel.shape[1]
    if out is None:
        out = torch.empty(m, H, D, dtype=torch.bfloat16, device=q.device)
    if m == 0:
        return out
    n_comp = comp.shape[0]
    if n_comp == 0:
        comp = win  # nothing reads comp; keep the kernel's pointer types fixed
    unknown = sorted(set(tune) - set(_TUNE) - {"only_logits"})
    if unknown:  # a misspelt launch option would otherwise be ignored
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(_TUNE)} and 'only_logits'")
    cfg = dict(_TUNE)
    cfg.update(tune)
    words = fp4_words_mode(comp, cfg["fp4_asm"], cfg["scale_word"], cfg["lut"], D, 16) if packed else 0
    combine = cfg["combine"]
    if combine not in ("auto", "blocks", "loop"):
        raise ValueError(f"combine = {combine!r}; allowed: 'auto', 'blocks', 'loop'")
    blocks = combine == "blocks" or (combine == "auto" and m <= _BLOCKS_MAX_M)
    dev = q.device
    block_d = max(16, triton.next_power_of_2(D))
    bdv = min(block_d, cfg["comb_d"])
    n_slices = triton.cdiv(H, cfg["comb_h"]) * triton.cdiv(D, bdv)
    if blocks and m * n_slices > _LOCKS:  # checked before anything is launched
        raise ValueError(f"m = {m}: counters needed = {m * n_slices}; allowed: <= {_LOCKS} (tokens × slices)")
    block_h = min(cfg["bh"], max(16, triton.next_power_of_2(H)))
    n_hb = triton.cdiv(H, block_h)
    kbs = max(1, triton.cdiv(K, BLOCK_K))
    rsplit = cfg["rsplit"]
    if rsplit not in (1, 2, 4):  # a tuning value: sub-blocks of at least 16 rows (the MMA's smallest tile)
        raise ValueError(f"rsplit = {rsplit!r}; allowed: 1, 2, 4")
    s_buf = torch.empty(m, kbs, H, BLOCK_K, dtype=torch.float32, device=dev)
    bm = torch.empty(m, kbs * rsplit, H, dtype=torch.float32, device=dev)
    dk = min(block_d, cfg["dk"] if not packed or cfg["dk_packed"] is None else cfg["dk_packed"])
    if packed and dk % 32:  # a tuning value: the packed loaders read whole 32-value scale blocks
        raise ValueError(f"dk = {dk}; allowed with packed rows: a multiple of 32")
    strides = (*win.stride(), *comp.stride(), *sel.stride())
    glo = cfg["gluon_logits"]
    if not isinstance(glo, (bool, dict)):
        raise ValueError(f"gluon_logits = {glo!r}; allowed: True, False or a dict of GLUON_LOGITS_TUNE keys")
    if (
        (glo is True or isinstance(glo, dict))
        and packed
        and not blocks
        and rsplit == 1
        and logits_gluon_ok(q, win, comp)
    ):
        # packed rows straight into the MMA's A fragment, the same bits (`sparse_attn_logits_gluon`)
        logits_gluon(q, win, comp, sel, offset, n_comp, scale, s_buf, bm, **(glo if isinstance(glo, dict) else {}))
    else:
        _logits_kernel[(m, kbs * rsplit, n_hb)](
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
            PACKED=packed,
            WORDS=words,
            FMT_DOTS=packed and bool(cfg["fmt_dots"]),
            KEYS_M=bool(cfg["keys_m"] if not packed or cfg["keys_m_packed"] is None else cfg["keys_m_packed"]),
            RSPLIT=rsplit,
            LATE_RELEASE=blocks and bool(cfg["early_rows"]),
            FMT_LOOPS=packed and bool(cfg["fmt_loops"]),
            num_warps=cfg["warps_a"],
            num_stages=cfg["stages_a"],
            **({"maxnreg": cfg["maxnreg_a_packed"]} if packed and cfg["maxnreg_a_packed"] else {}),
            enable_fp_fusion=False,  # no FMA contraction: the twin's separate fp32 multiply and add
            **pdl_launch(q),
        )
    if cfg.get("only_logits"):  # tuning only: the first kernel's time alone
        return out
    cos, sin, pos, o_rot, half = _rot_launch_args(rot, sink, sel, out)
    if blocks:
        locks = _counters.buffer(dev)
        pv = torch.empty(m, kbs, H, D, dtype=torch.float32, device=dev)
        _pv_blocks_kernel[(m, kbs, n_slices)](
            win, comp, sel, s_buf, bm, pv, locks, sink, out, o_rot, cos, sin, pos,
            H, D, K, offset, n_comp, *strides, *out.stride(), o_rot.stride(0), o_rot.stride(1),
            cos.stride(0), sin.stride(0),
            ROT=rot is not None, HALF=half, BLOCK_HC=cfg["comb_h"], BLOCK_DV=bdv, BLOCK_K=BLOCK_K, LOG2_K=_LOG2_K, K_BLOCKS=kbs,
            KB_P2=triton.next_power_of_2(kbs), DOT_FP32=interpreting(), PACKED=packed, WORDS=words, RS=rsplit,
            EARLY=bool(cfg["early_rows"]), RELEASE=bool(cfg["counter_release"]), num_warps=cfg["warps_pv"], num_stages=cfg["stages_b"], enable_fp_fusion=False, **pdl_launch(win),
        )  # fmt: skip
        return out
    _pv_combine_kernel[(m, triton.cdiv(H, cfg["comb_h"]), triton.cdiv(D, bdv))](
        win,
        comp,
        sel,
        s_buf,
        bm,
        sink,
        out,
        o_rot,
        cos,
        sin,
        pos,
        H,
        D,
        K,
        offset,
        n_comp,
        *strides,
        *out.stride(),
        o_rot.stride(0),
        o_rot.stride(1),
        cos.stride(0),
        sin.stride(0),
        ROT=rot is not None,
        HALF=half,
        BLOCK_HC=cfg["comb_h"],
        BLOCK_DV=bdv,
        BLOCK_K=BLOCK_K,
        LOG2_K=_LOG2_K,
        K_BLOCKS=kbs,
        DOT_FP32=interpreting(),
        PACKED=packed,
        WORDS=words,
        RS=rsplit,
        num_warps=cfg["warps_b"] if not packed or cfg["warps_b_packed"] is None else cfg["warps_b_packed"],
        **({"maxnreg": cfg["maxnreg_b_packed"]} if packed and cfg["maxnreg_b_packed"] else {}),
        num_stages=cfg["stages_b"],
        enable_fp_fusion=False,
        **pdl_launch(win),
    )
    return out


def prepare(device: torch.device | str) -> None:
    """Allocate the block-parallel combine's arrival counters on `device` (zeros). Done by
    the first call; call it before capturing a CUDA graph whose first call is inside it."""
    _counters.prepare(device)


def _rot_launch_args(rot, sink, sel, out) -> tuple:
    """(cos, sin, pos, o_rot, half) for a kernel launch: `rot`'s tables and buffer, or
    without it placeholders of the right pointer types that nothing reads (ROT off)."""
    if rot is None:
        return sink, sink, sel, out, 1
    cos, sin, pos, o_rot = rot
    return cos, sin, pos, o_rot, cos.shape[1]


def _check_rot(rot, q) -> None:
    """`rot` is None or (cos, sin, pos, o_rot) fitting q (ValueError naming the field)."""
    if rot is None:
        return
    if not isinstance(rot, tuple) or len(rot) != 4:
        raise ValueError(f"rot = {type(rot).__name__}; allowed: None or a tuple (cos, sin, pos, o_rot)")
    cos, sin, pos, o_rot = rot
    m, H, D = q.shape
    if not isinstance(o_rot, torch.Tensor) or tuple(o_rot.shape) != (m, H, D) or o_rot.dtype != torch.bfloat16:
        got = (getattr(o_rot, "dtype", None), tuple(getattr(o_rot, "shape", ())))
        raise ValueError(f"rot o_rot = {got}; allowed: bf16 [{m}, {H}, {D}]")
    if o_rot.device != q.device or (D > 1 and o_rot.stride(2) != 1):
        raise ValueError(
            f"rot o_rot on {o_rot.device} with strides {o_rot.stride()}; allowed: q's device, last dim contiguous"
        )
    if o_rot.data_ptr() == q.data_ptr():
        raise ValueError("rot o_rot is q's memory; allowed: a buffer of its own")
    rope._check(o_rot, cos, sin, pos, None)  # the rope op's own checks (tables, positions)
    half = cos.shape[1]
    if half & (half - 1):
        raise ValueError(f"rot cos.shape[1] = {half}; allowed: a power of two")
    if q.shape[2] % 2:  # the epilogue splits o's columns into (even, odd) pairs
        raise ValueError(f"rot with q.shape[2] (D) = {q.shape[2]}; allowed: an even D")


def _unpacked_selection(D: int, win, comp, sel, offset):
    """Packed rows → (bf16 rows, an empty comp, the selection over them, its offset): token
    t's entry k becomes row t·K + k (−1 kept). The attention's bits follow the rows'
    values and their order in the selection, not where they live."""
    from ..packed import unpack  # noqa: PLC0415

    m, K = sel.shape
    s = sel.long()
    rows = unpack(win.index_select(0, s.clamp(0, max(win.shape[0] - 1, 0)).reshape(-1)), "fp8_e8m0", D)
    if comp.shape[0]:
        cr = unpack(comp.index_select(0, (s - offset).clamp(0, comp.shape[0] - 1).reshape(-1)), "fp4_e4m3", D)
        rows = torch.where((s >= offset).reshape(-1, 1), cr, rows)
    local = torch.arange(m, device=sel.device)[:, None] * K + torch.arange(K, device=sel.device)[None, :]
    local = torch.where(s >= 0, local, -1).to(torch.int32)
    return rows, rows[:0], local, m * K


def sparse_attn_split_torch(q, win, comp, sel, offset, sink, scale, out=None, rot=None) -> torch.Tensor:
    """The twin on any device: the reference order itself (`sparse_attn.sparse_attn_torch`),
    then, with `rot`, `rope.apply_rope_torch(o, cos, sin, pos, inverse=True, out=o_rot)`."""
    _check_rot(rot, q)
    if win.dtype == torch.uint8:  # packed rows: the selected ones unpacked (exact), then as bf16
        _validate(q, win, comp, sel, offset, sink, scale, out, allow_packed=True)
        win, comp, sel, offset = _unpacked_selection(q.shape[2], win, comp, sel, offset)
    o = sparse_attn_torch(q, win, comp, sel, offset, sink, scale, out=out)
    if rot is not None:
        cos, sin, pos, o_rot = rot
        rope.apply_rope_torch(o, cos, sin, pos, inverse=True, out=o_rot)
    return o
