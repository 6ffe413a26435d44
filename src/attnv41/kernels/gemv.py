"""Decode GEMVs for bf16 and fp32 weights (m ≤ 16 tokens), Triton; twins: `gemv_exact` /
`group_gemv_exact` (fp64 accumulation, `linear.mm_exact`), and `gemv_torch` /
`group_gemv_torch` (this kernel's own fp32 order, in torch).

`y = x · Wᵀ`, W stored `[N, K]`.

- `gemv(x, weights, outs)`: x bf16 `[m, K]`; `weights` 1..`MAX_WEIGHTS` tensors `[N_i, K]`
  (bf16 or fp32) sharing the input; `outs[i]` `[m, N_i]`, bf16 for a bf16 weight, fp32 for
  an fp32 weight (x converted to fp32 exactly). One launch for all of them.
- `group_gemv(o, w, out, scale=None)`: per group g, `out[:, g] = o[:, g] · w[g]ᵀ`; o bf16
  `[m, G, gw]`, w bf16 `[G, r, gw]` (or float8_e4m3fn with its e8m0 `scale`: wo_a's
  checkpoint bytes, read as their exact bf16), out bf16 `[m, G, r]`, strided views allowed
  (contiguous last dims).

The order of the fp32 sums (the bits): for a weight `[N, K]` of dtype d, `(BK, SEGS) =
plan(N, K, d)`; K is cut into SEGS segments of IPS = ceil(K/BK)/SEGS chunks of BK columns
(the tail past K reads as zero). For output (t, n) and segment s:
  1. BK lane sums `a_j`, each a chain over the segment's chunks i = 0..IPS−1 in order:
     `a_j ← fma(w[n, k], x[t, k], a_j)`, k = (s·IPS + i)·BK + j, from a_j = +0. A bf16
     product is exact in fp32, so the fma and a multiply-then-add give the same bits; an
     fp32 product is exact in the GPU's fma and rounded in Triton's CPU interpreter.
  2. the segment sum: a pairwise tree over adjacent lanes (a_j ← a_2j + a_2j+1, log2(BK)
     levels); lane 0 holds the sum.
  3. the total: seg_0 + seg_1 + … + seg_{SEGS−1}, left to right.
  4. `round_bf16` (nearest even) for bf16 outputs; fp32 outputs as they are.
  5. (`rope=`, one bf16 output) the values in each head's RoPE tail rotated as
     `rope.apply_rope` rotates them: pairs (2k, 2k+1) of the tail, re = a·c − b·s and
     im = a·s + b·c in fp32 without FMA contraction (the launch is compiled without it;
     the lane chains' `tl.fma` are explicit), each rounded to bf16. A row tile holds
     whole pairs (BN even, tiles start at even rows). The runtime's q RoPE: no launch of
     its own.
Nothing of that depends on m, on the other tokens, on the other weights of the launch, on
the launch's tile shape (BN rows × MB tokens per program, warps, stages) or on the SM
count: every step is elementwise or a fixed tree written out (`tl.sum` only over axes of
two elements, one commutative add; a wider `tl.sum`'s tree follows the register layout).
So the CPU interpreter and the GPU give the same bits for bf16 weights, and `gemv_torch`
reproduces them.

Launch: one program per (weight, BN-row tile, K segment, block of MB tokens), the token
block fastest so that programs reading the same weight tile run together (one DRAM read,
the others from L2). A split weight (SEGS > 1) stores fp32 partials `[SEGS, m, N]` in a
workspace, and a second launch (PDL) adds them in segment order and writes the output
(`_SPLIT_FORM = "launch"`). The other forms, the same steps in the same order, so the same
bits: the last program of a (tile, token block) to arrive adds them (an arrival counter,
acq_rel, "counter"; or its atomics with release / acquire semantics split, "release") and
resets the counter. Counters are one buffer per device and owner
(`_triton.ArrivalCounters`): a runtime's own (its calls run in order, so runtimes may run
at once on different streams), else one per device allocated once (`prepare`) and shared
by direct launches, which must then not overlap on different streams. No host sync: the
call can be captured in a CUDA graph once `prepare(device)` ran.

The runtime (`mm_auto`, `mm_many`) takes it for one token only (`AUTO_MAX_M`): on the H200
it beats cuBLAS at m = 1 (x → wq_a + wkv + weights_proj in one launch 10.2 µs against 23.9
for three cuBLAS calls; wq_b 27.5 against 28.2) and is 2-7x slower at m = 16, where the
CUDA-core FMAs bound it (BENCHMARKS.md, 2026-12-01 night).
"""

from __future__ import annotations

import torch

from ..reference.fp8 import BLOCK, fp8_linear
from . import linear
from . import rope as _rope
from ._triton import HAVE_TRITON, ArrivalCounters, interpreting, pdl_launch, require_triton, tl, triton
from .gemv_fp8 import ordered_terms, scaled_terms

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, round_bf16
    from .gemv_fp8 import fp8_lanes

__all__ = [
    "gemv",
    "group_gemv",
    "mm_auto",
    "mm_many",
    "mm_many_exact",
    "group_mm_auto",
    "gemv_exact",
    "group_gemv_exact",
    "gemv_torch",
    "group_gemv_torch",
    "plan",
    "prepare",
    "DECODE_MAX_M",
    "MAX_WEIGHTS",
]

DECODE_MAX_M = 16  # tokens per call
MAX_WEIGHTS = 6  # weights per fused launch: x → wq_a, wkv, weights_proj, compressor.wkv, compressor.wgate
_DTYPES = (torch.bfloat16, torch.float32)  # weights without scales
FP8 = torch.float8_e4m3fn  # a weight with e8m0 scales (`scales=`, kernels/gemv_fp8.py); its output is bf16

# The bits (module doc): BK per weight dtype (512 bytes of a weight row per chunk) and the
# split rule of `plan`. Changing any of these changes the results' bits.
_BK = {torch.bfloat16: 256, torch.float32: 128, FP8: 256}
_PLAN_BN = 16  # the row tile the split rule counts with (not the launch's BN)
_TARGET_PROGRAMS = 1024  # weight tiles × segments at least this (about 8 per SM on an H200)
# FP8 weights' own target (None: _TARGET_PROGRAMS): at 16,384 every FP8 weight of Flash runs
# one chunk per program (SEGS = ceil(K/BK)), with the partials added by a launch of their own
# (`_SPLIT_FORM`): the FP8 step at 4K 3.38 ms against 3.59 with the counter at 1,024 (H100,
# 2026-12-05, BENCHMARKS.md thirtieth entry).
_TARGET_PROGRAMS_FP8 = 16384
# Per-shape split counts that override the rule: {(N, K, dtype): SEGS}, SEGS a divisor of
# ceil(K/BK): constants of the weight's shape and dtype, so of the geometry. Production: the
# V4.1-Flash FP8 shapes measured faster split otherwise than one chunk per program. H100,
# 2026-12-06 (BENCHMARKS.md forty-first entry; scripts/ab_steps.py, single-sequence FP8
# step, ms/step at 4K, one run): one chunk per program 3.243; wo_b in 8 segments of 4 chunks
# 3.193; wq_b in one segment of 5 chunks 3.210; both 3.173 (−2.2 %). Alone in another run,
# wo_a in 4 segments of 4 chunks 3.230 and the x launch's weights in 5 of 4 3.232 against
# 3.242, but each with wo_b's 8 slower than wo_b's 8 alone (3.204, 3.219); wo_b in 4 or 16
# segments, wo_a in 8, the x launch in 10: slower or equal. indexer.wq_b (the same K as
# wq_b, in wq_b's launch on index sources) is unsplit too, so that launch needs no sum launch.
# Fewer segments to spare a sum launch lose (forty-second entry, over this table, 32K: 3.155
# ms): the x launch's wq_a + wkv in 1 / 2 / 4 segments 3.797 / 3.364 / 3.217, wo_a in 1 / 2
# 3.238 / 3.176, wo_b in 2 3.217; the FP8 row tile at 8 rows (`_ACC_ROWS8`) 3.539.
_PLAN_SEGS: dict = {
    (5120, 8192, FP8): 8,  # wo_b
    (32768, 1280, FP8): 1,  # wq_b
    (4096, 1280, FP8): 1,  # indexer.wq_b
}
# FP8 weights' segments by a chunk cap (None: off, the target above): segments of the
# largest divisor of the chunk count not above this many chunks (a tuning option). At 5 on
# Flash (wo_b 8 × 4, wq_b 1 × 5, wo_a 4 × 4, the x launch 4 × 5): 3.243 ms/step against
# 3.244 at one chunk per program; at 4: 3.228; at 8: 3.309 (H100, forty-first entry).
_SEG_CHUNKS_FP8 = None

# The launch shape: free of the bits. MB tokens × BN rows × BK columns of fp32 lane sums
# per program (_ACC_ROWS = MB·BN, 32 registers per thread at 4 warps for BK = 256).
_ACC_ROWS = 16
_ACC_ROWS8 = 16  # fp8 weights: MB·BN8 rows (BN8 divides 32)
_WARPS8 = 2  # a launch of fp8 weights only (H200 sweep, scripts/fp8_gemv_tune.py: wq_b 16.9 µs against 20.4 at 32 rows, 4 warps)
_MB_MAX = 4
_WARPS, _STAGES = 4, 3
# How a split weight's partials are added (steps 3-5, the same order, so the same bits),
# `_SPLIT_FORM`:
# - "counter": the last program of a tile to arrive adds them (an arrival
#   counter, acq_rel: in sm_90 SASS a MEMBAR.ALL.GPU before and an L1 invalidation,
#   CCTL.IVALL, after the atomic in every program of a split weight, and again at the reset);
# - "release": the same counter with a release add (no L1 invalidation), an acquire only in
#   the last program to arrive (an atomic add of 0, then the partials' loads, which bypass L1
#   anyway: `.cg`), and a relaxed reset (the next launch that reads the counter is ordered
#   after this one's end by the stream, or by its PDL wait);
# - "launch" (production): the programs store their partials only, and a second launch
#   (`_sum_kernel` / `_group_sum_kernel`, PDL, _SUM_ROWS rows × MB tokens per program) adds
#   them: no fence in the GEMV's programs, 40 registers instead of 128 at one chunk per
#   program. On the H100 (2026-12-05, scripts/gemv_shape_probe.py PARTS=split2) it was the
#   fastest form at every split tried but one (wo_b from xq at 8 segments 20.7 µs, release
#   22.2, counter 22.4); the FP8 step at 4K 3.44 ms against 3.59 (counter) at the same
#   plans and bits, 3.38 with `_TARGET_PROGRAMS_FP8`; the bf16 step 5.03 against 5.13.
_SPLIT_FORMS = {"counter": 0, "release": 1, "launch": 2}
_SPLIT_FORM = "launch"
_SUM_ROWS, _SUM_WARPS = 64, 2

_LOCKS = 1 << 16
_counters = ArrivalCounters("gemv", "attnv41.kernels.gemv.prepare", _LOCKS)


def plan(N: int, K: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BK, SEGS) for a weight `[N, K]` of `dtype`: BK columns per chunk, and SEGS: the
    shape's entry in `_PLAN_SEGS` if it has one; else for FP8 weights with `_SEG_CHUNKS_FP8`
    set, ceil(K/BK) / d, d the largest divisor of ceil(K/BK) not above it; else the smallest
    divisor S of ceil(K/BK) with ceil(N/16)·S ≥ the target program count
    (`_TARGET_PROGRAMS`, or `_TARGET_PROGRAMS_FP8` for FP8 weights where set), else
    ceil(K/BK). Constants of the weight's shape and dtype: the summation order of every
    call with this weight (module doc)."""
    if dtype not in _BK:
        raise ValueError(f"dtype = {dtype}; allowed: {list(_BK)}")
    bk = _BK[dtype]
    chunks = -(-K // bk)
    fixed = _PLAN_SEGS.get((N, K, dtype))
    if fixed is not None:
        if isinstance(fixed, bool) or not isinstance(fixed, int) or fixed < 1 or chunks % fixed:
            raise ValueError(
                f"_PLAN_SEGS[({N}, {K}, {dtype})] = {fixed!r}; allowed: a divisor of the {chunks} chunks of {bk} columns"
            )
        return bk, fixed
    if dtype == FP8 and _SEG_CHUNKS_FP8 is not None:
        per = max(d for d in range(1, min(_SEG_CHUNKS_FP8, chunks) + 1) if chunks % d == 0)
        return bk, chunks // per
    tiles = -(-N // _PLAN_BN)
    target = _TARGET_PROGRAMS_FP8 if dtype == FP8 and _TARGET_PROGRAMS_FP8 is not None else _TARGET_PROGRAMS
    segs = chunks
    for s in range(1, chunks + 1):
        if chunks % s == 0 and tiles * s >= target:
            segs = s
            break
    return bk, segs


def _launch(m: int) -> tuple[int, int, int]:
    """(MB, BN, BN8): tokens, weight rows per program (bf16/fp32 weights), and weight rows
    per program of an fp8 weight (dividing 32), for a call of m tokens (powers of two)."""
    mb = 1
    while mb < min(m, _MB_MAX):
        mb *= 2
    return mb, max(_ACC_ROWS // mb, 1), min(max(_ACC_ROWS8 // mb, 1), BLOCK)


def prepare(device: torch.device | str) -> None:
    """Allocate the arrival counters on `device` (zeros). Done by the first call; call it
    before capturing a CUDA graph whose first GEMV is inside the capture."""
    _counters.prepare(device)


if HAVE_TRITON:

    @triton.jit
    def _lane_tree(acc, MB: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LOG2_BK: tl.constexpr):
        """[MB, BN, BK] → [MB, BN]: each level adds adjacent lanes (2j, 2j+1 → j), log2(BK)
        levels. Each sum is over an axis of 2 (one add, commutative), so the order is that
        of the tree, not of the register layout; and the low lane bits are a thread's
        registers in the loads' layout, so the first levels are in-register adds and the
        rest one shuffle per row held (sm_90: 20 shuffles at BN = 16, BK = 256). Not
        `tl.split`: its layout demand gave each thread a whole row (254 registers)."""
        for lvl in tl.static_range(LOG2_BK):
            # [MB, BN, W/2, 2], W = BK >> lvl
            acc = tl.sum(tl.reshape(acc, (MB, BN, BK >> (lvl + 1), 2)), axis=3)
        return tl.reshape(acc, (MB, BN))

    @triton.jit
    def _lanes(
        x_ptr, stride_xm, w_ptr, M, N, K, tile, seg, tb,
        IPS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
    ):  # fmt: skip
        """[MB, BN, BK] lane sums of one (row tile, K segment, token block) of a bf16 or
        fp32 weight (module doc, step 1)."""
        offs_t = (tb * MB + tl.arange(0, MB)).to(tl.int64)
        offs_n = (tile * BN + tl.arange(0, BN)).to(tl.int64)
        offs_j = tl.arange(0, BK)
        t_ok = (offs_t < M)[:, None, None]
        n_ok = (offs_n < N)[None, :, None]
        # [MB, 1, BK] token rows and [1, BN, BK] weight rows at chunk offset 0: loaded as
        # 3-D blocks so that the multiply-add keeps the loads' (coalesced) layout
        x_rows = x_ptr + offs_t[:, None, None] * stride_xm + offs_j[None, None, :]
        w_rows = w_ptr + offs_n[None, :, None] * K + offs_j[None, None, :]
        acc = tl.zeros((MB, BN, BK), dtype=tl.float32)
        k0 = tl.cast(seg, tl.int64) * (IPS * BK)
        for _ in range(IPS):
            if EVEN_K:
                xv = tl.load(x_rows + k0, mask=t_ok, other=0.0).to(tl.float32)
                wv = tl.load(w_rows + k0, mask=n_ok, other=0.0).to(tl.float32)
            else:
                k_ok = ((k0 + offs_j) < K)[None, None, :]
                xv = tl.load(x_rows + k0, mask=t_ok & k_ok, other=0.0).to(tl.float32)
                wv = tl.load(w_rows + k0, mask=n_ok & k_ok, other=0.0).to(tl.float32)
            acc = tl.fma(wv, xv, acc)
            k0 += BK
        return acc

    @triton.jit
    def _store(out, total, ok, toks, offs_n, rope, ROPE: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr):
        """Store the [MB, BN] fp32 sums (bf16 outputs rounded); with ROPE, the values in each
        head's rope tail then rotated as `rope.apply_rope` does (module doc, step 5)."""
        if out.dtype.element_ty == tl.bfloat16:
            y = round_bf16(total)
            if ROPE:
                cos_ptr, sin_ptr, pos_ptr, stride_cos, stride_sin, D, HALF = rope
                lead = D - 2 * HALF
                # [BN/2] pairs (rows 2i, 2i+1 of the tile; the tile starts at an even row)
                n_even, _ = tl.split(tl.reshape(offs_n, (BN // 2, 2)))
                j = n_even % D  # the pair's first column in its head
                tail = j >= lead
                if tl.max(tail.to(tl.int32), axis=0) > 0:  # only tiles holding rope rows load and rotate
                    a, b = tl.split(tl.reshape(y.to(tl.float32), (MB, BN // 2, 2)))
                    k = tl.where(tail, (j - lead) // 2, 0)
                    p = tl.load(pos_ptr + toks[1], mask=toks[0], other=0).to(tl.int64)  # [MB] (toks: mask, index)
                    m2 = tail[None, :] & toks[0][:, None]
                    c = tl.load(cos_ptr + p[:, None] * stride_cos + k[None, :], mask=m2, other=1.0)
                    s = tl.load(sin_ptr + p[:, None] * stride_sin + k[None, :], mask=m2, other=0.0)
                    re = a * c - b * s
                    im = a * s + b * c
                    rot = tl.reshape(tl.join(round_bf16(re), round_bf16(im)), (MB, BN))
                    keep = tl.reshape(tl.join(tail, tail), (BN,))  # [BN] rows in a rope tail
                    y = tl.where(keep[None, :], rot, y)
            tl.store(out, y, mask=ok)
        else:
            tl.store(out, total, mask=ok)

    @triton.jit
    def _grp_sum(part, plane, j0, GRP: tl.constexpr, ok):
        """Partials j0 … j0 + GRP − 1 (`plane` apart) added in order (read from L2, `.cg`:
        other programs wrote them)."""
        t = tl.load(part + j0 * plane, mask=ok, other=0.0, cache_modifier=".cg")
        for j in tl.static_range(1, GRP):
            t += tl.load(part + (j0 + j) * plane, mask=ok, other=0.0, cache_modifier=".cg")
        return t

    @triton.jit
    def _sum_tile(part, plane, out, ok, toks, offs_n, rope, ROPE: tl.constexpr, SEGS: tl.constexpr,
                  BN: tl.constexpr, MB: tl.constexpr, GRP: tl.constexpr = 1):  # fmt: skip
        """Steps 3-5 of the module doc for one [MB, BN] tile of partials (`part`: segment 0's
        addresses, `plane` apart): the SEGS partials added in order in groups of GRP (each
        group's sum from its first partial, then the groups' sums in order: `tc_mm`'s two
        split levels; GRP 1: one chain), the store."""
        total = _grp_sum(part, plane, 0, GRP, ok)
        for gi in tl.static_range(1, SEGS // GRP):  # unrolled: the loads overlap, the adds stay in order
            total += _grp_sum(part, plane, gi * GRP, GRP, ok)
        _store(out, total, ok, toks, offs_n, rope, ROPE, BN, MB)

    @triton.jit
    def _finish(
        acc,  # [MB, BN, BK] lane sums
        out_ptr,  # bf16 or fp32 [M, N], row stride stride_om
        stride_om,
        part_ptr,  # fp32 [segs, M, N] partials of this weight (segs > 1)
        lock_ptr,  # int32 [tiles, ntb] arrival counters of this weight (segs > 1)
        M, N, tile, seg, tb, ntb,
        SEGS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr, BK: tl.constexpr, LOG2_BK: tl.constexpr,
        rope=None, ROPE: tl.constexpr = False, SPLIT: tl.constexpr = 0,
    ):  # fmt: skip
        """Steps 2-5 of the module doc: the lane tree, the segments in order, the store.
        SPLIT (SEGS > 1): `_SPLIT_FORMS[_SPLIT_FORM]`; 2: only this segment's partial is
        stored, a second launch (`_sum_kernel`, `_group_sum_kernel`) does steps 3-5."""
        offs_t = (tb * MB + tl.arange(0, MB)).to(tl.int64)
        offs_n = (tile * BN + tl.arange(0, BN)).to(tl.int64)
        # [MB, BN] this segment's sums
        total = _lane_tree(acc, MB, BN, BK, LOG2_BK)
        ok = (offs_t < M)[:, None] & (offs_n < N)[None, :]
        # [MB, BN] output and partial addresses
        out = out_ptr + offs_t[:, None] * stride_om + offs_n[None, :]
        part = part_ptr + offs_t[:, None] * N + offs_n[None, :]
        plane = tl.cast(M, tl.int64) * N  # one segment's partials
        if SEGS > 1:
            tl.store(part + seg * plane, total, mask=ok)
        if SEGS > 1 and SPLIT != 2:  # (SPLIT 2: a second launch adds the partials)
            tl.debug_barrier()  # every thread's partial stored before the release below
            lock = lock_ptr + tile * ntb + tb
            if SPLIT == 1:
                arrived = tl.atomic_add(lock, 1, sem="release", scope="gpu")
            else:
                arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if arrived == SEGS - 1:  # the last segment of this tile: sum all in segment order
                if SPLIT == 1:  # the acquire: every segment's release seen before the loads (its
                    # value, SEGS, feeds the loads' mask: an acquire whose result is unused was
                    # dropped from the sm_90 SASS)
                    ok = ok & (tl.atomic_add(lock, 0, sem="acquire", scope="gpu") == SEGS)
                _sum_tile(part, plane, out, ok, (offs_t < M, offs_t), offs_n, rope, ROPE, SEGS, BN, MB)
                if SPLIT == 1:
                    tl.atomic_xchg(lock, 0, sem="relaxed", scope="gpu")
                else:
                    tl.atomic_xchg(lock, 0)
        if SEGS == 1:
            _store(out, total, ok, (offs_t < M, offs_t), offs_n, rope, ROPE, BN, MB)

    @triton.jit
    def _gemv_tile(
        x_ptr, stride_xm, w_ptr, out_ptr, stride_om, part_ptr, lock_ptr, M, N, K, tile, seg, tb, ntb,
        SEGS: tl.constexpr, IPS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr, BK: tl.constexpr,
        LOG2_BK: tl.constexpr, EVEN_K: tl.constexpr, rope=None, ROPE: tl.constexpr = False,
        SPLIT: tl.constexpr = 0,
    ):  # fmt: skip
        """One (row tile, K segment, token block) of `out = x · Wᵀ` (module doc, steps 1-5)."""
        acc = _lanes(x_ptr, stride_xm, w_ptr, M, N, K, tile, seg, tb, IPS, BN, MB, BK, EVEN_K)
        _finish(
            acc, out_ptr, stride_om, part_ptr, lock_ptr, M, N, tile, seg, tb, ntb, SEGS, BN, MB, BK, LOG2_BK, rope, ROPE,
            SPLIT,
        )  # fmt: skip

    @triton.jit
    def _gemv_kernel(
        x_ptr,  # bf16 [M, K]
        stride_xm,
        xq_ptr,  # bf16 [M, K]: fp8_qdq(x), read by fp8 weights when PREQ (x_ptr otherwise)
        stride_xqm,
        M,
        K,
        ws,  # tuple: weight i, [N_i, K] bf16, fp32 or float8_e4m3fn
        scs,  # tuple: uint8 scales [ceil(N_i/32), K/32] of an fp8 weight i (any tensor otherwise)
        outs,  # tuple: out i, [M, N_i] (bf16 or fp32 as the weight; bf16 for fp8)
        ns,  # tuple: N_i
        out_strides,  # tuple: row stride of out i
        starts,  # tuple, len(ws) + 1: first work item of weight i (work item = tile·segs + seg)
        lock_offs,  # tuple: first counter of weight i
        part_offs,  # tuple: first partial of weight i
        part_ptr,  # fp32 workspace
        lock_ptr,  # int32 counters
        rope,  # tuple (cos, sin, pos, stride_cos, stride_sin, D, HALF) for weight ROPE_I's output (step 5)
        ntb,  # token blocks
        SEGSS: tl.constexpr,  # tuple: SEGS of weight i
        IPSS: tl.constexpr,  # tuple: chunks per segment of weight i
        BN: tl.constexpr,
        BN8: tl.constexpr,  # the row tile of fp8 weights (divides 32: one row of scales)
        MB: tl.constexpr,
        BK16: tl.constexpr,
        LOG2_BK16: tl.constexpr,
        BK32: tl.constexpr,
        LOG2_BK32: tl.constexpr,
        BK8: tl.constexpr,
        LOG2_BK8: tl.constexpr,
        EVEN_K: tl.constexpr,
        EXACT_CAST: tl.constexpr,
        PREQ: tl.constexpr,  # fp8 weights read the round trip xq (kernels/gemv_fp8.py)
        ROPE_I: tl.constexpr,  # the weight whose output gets step 5 (−1: none)
        PDL: tl.constexpr = False,  # programmatic dependent launch (kernels/_triton.py)
        SPLIT: tl.constexpr = 0,  # how split weights add their partials (`_SPLIT_FORMS`)
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        pid = tl.program_id(0)
        tb = pid % ntb
        item = pid // ntb
        for i in tl.static_range(len(ws)):
            if (item >= starts[i]) & (item < starts[i + 1]):
                local = item - starts[i]
                tile = local // SEGSS[i]
                seg = local % SEGSS[i]
                part = part_ptr + part_offs[i]
                lock = lock_ptr + lock_offs[i]
                if ws[i].dtype.element_ty == tl.float8e4nv:
                    acc = fp8_lanes(
                        xq_ptr, stride_xqm, ws[i], scs[i], M, ns[i], K, tile, seg, tb, IPSS[i],
                        BN=BN8, MB=MB, BK=BK8, EVEN_K=EVEN_K, EXACT_CAST=EXACT_CAST, PREQ=PREQ,
                    )  # fmt: skip
                    _finish(
                        acc, outs[i], out_strides[i], part, lock, M, ns[i], tile, seg, tb, ntb, SEGSS[i],
                        BN=BN8, MB=MB, BK=BK8, LOG2_BK=LOG2_BK8, rope=rope, ROPE=ROPE_I == i, SPLIT=SPLIT,
                    )  # fmt: skip
                elif ws[i].dtype.element_ty == tl.float32:
                    _gemv_tile(
                        x_ptr, stride_xm, ws[i], outs[i], out_strides[i], part, lock, M, ns[i], K,
                        tile, seg, tb, ntb, SEGSS[i], IPSS[i],
                        BN=BN, MB=MB, BK=BK32, LOG2_BK=LOG2_BK32, EVEN_K=EVEN_K, SPLIT=SPLIT,
                    )  # fmt: skip
                else:
                    _gemv_tile(
                        x_ptr, stride_xm, ws[i], outs[i], out_strides[i], part, lock, M, ns[i], K,
                        tile, seg, tb, ntb, SEGSS[i], IPSS[i],
                        BN=BN, MB=MB, BK=BK16, LOG2_BK=LOG2_BK16, EVEN_K=EVEN_K, rope=rope, ROPE=ROPE_I == i,
                        SPLIT=SPLIT,
                    )  # fmt: skip

    @triton.jit
    def _group_gemv_kernel(
        o_ptr,  # bf16 [M, G, GW], strides (so_m, so_g, 1)
        so_m,
        so_g,
        w_ptr,  # bf16 or float8_e4m3fn [G, R, GW] contiguous
        sw_ptr,  # FP8W: uint8 e8m0 scales [G·R/32, GW/32] (R a multiple of 32); else unused
        out_ptr,  # bf16 [M, G, R], strides (sout_m, sout_g, 1)
        sout_m,
        sout_g,
        part_ptr,  # fp32 [G, segs, M, R]
        lock_ptr,  # int32 [G, tiles, ntb]
        M,
        R,
        GW,
        tiles,
        ntb,
        SEGS: tl.constexpr,
        IPS: tl.constexpr,
        BN: tl.constexpr,
        MB: tl.constexpr,
        BK: tl.constexpr,
        LOG2_BK: tl.constexpr,
        EVEN_K: tl.constexpr,
        FP8W: tl.constexpr = False,  # the weight stored as e4m3 with its block scales (`group_gemv`)
        PDL: tl.constexpr = False,
        SPLIT: tl.constexpr = 0,  # how a split weight adds its partials (`_SPLIT_FORMS`)
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        pid = tl.program_id(0)
        tb = pid % ntb
        item = pid // ntb
        g = tl.cast(item // (tiles * SEGS), tl.int64)
        local = item % (tiles * SEGS)
        if FP8W:  # o's values as they are (the round trip's place in fp8_lanes): terms o·sw·w, exact
            acc = fp8_lanes(
                o_ptr + g * so_g, so_m, w_ptr + g * R * GW, sw_ptr + g * (R // 32) * (GW // 32), M, R, GW,
                local // SEGS, local % SEGS, tb, IPS,
                BN=BN, MB=MB, BK=BK, EVEN_K=EVEN_K, EXACT_CAST=False, PREQ=True,
            )  # fmt: skip
            _finish(
                acc, out_ptr + g * sout_g, sout_m, part_ptr + g * SEGS * M * R, lock_ptr + g * tiles * ntb,
                M, R, local // SEGS, local % SEGS, tb, ntb, SEGS, BN=BN, MB=MB, BK=BK, LOG2_BK=LOG2_BK, SPLIT=SPLIT,
            )  # fmt: skip
        else:
            _gemv_tile(
                o_ptr + g * so_g, so_m, w_ptr + g * R * GW, out_ptr + g * sout_g, sout_m,
                part_ptr + g * SEGS * M * R, lock_ptr + g * tiles * ntb, M, R, GW,
                local // SEGS, local % SEGS, tb, ntb, SEGS, IPS,
                BN=BN, MB=MB, BK=BK, LOG2_BK=LOG2_BK, EVEN_K=EVEN_K, SPLIT=SPLIT,
            )  # fmt: skip

    @triton.jit
    def _sum_kernel(
        part_ptr, M, outs, ns, out_strides, part_offs, starts, rope, ntb,
        SEGSS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr, ROPE_I: tl.constexpr, PDL: tl.constexpr = False,
        GRPS: tl.constexpr = (),
    ):  # fmt: skip
        """`gemv`'s split weights under `_SPLIT_FORM` "launch": one program per (weight,
        BN-row tile, token block) adds the partials `_gemv_kernel` stored (weights of one
        segment: no work items, `starts` repeats). Also `tc_mm`'s: GRPS[i], weight i's partials
        added in groups of that many (`_sum_tile`; gemv's: 1, one chain)."""
        pdl_release(PDL)
        pdl_wait(PDL)
        pid = tl.program_id(0)
        tb = pid % ntb
        item = pid // ntb
        offs_t = (tb * MB + tl.arange(0, MB)).to(tl.int64)
        for i in tl.static_range(len(outs)):
            if SEGSS[i] > 1:
                if (item >= starts[i]) & (item < starts[i + 1]):
                    N = ns[i]
                    offs_n = ((item - starts[i]) * BN + tl.arange(0, BN)).to(tl.int64)
                    ok = (offs_t < M)[:, None] & (offs_n < N)[None, :]
                    part = part_ptr + part_offs[i] + offs_t[:, None] * N + offs_n[None, :]
                    out = outs[i] + offs_t[:, None] * out_strides[i] + offs_n[None, :]
                    _sum_tile(
                        part, tl.cast(M, tl.int64) * N, out, ok, (offs_t < M, offs_t), offs_n, rope, ROPE_I == i,
                        SEGSS[i], BN, MB, GRPS[i],
                    )  # fmt: skip

    @triton.jit
    def _group_sum_kernel(
        part_ptr, out_ptr, sout_m, sout_g, M, R, tiles, ntb,
        SEGS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr, PDL: tl.constexpr = False, GRP: tl.constexpr = 1,
    ):  # fmt: skip
        """`group_gemv` under `_SPLIT_FORM` "launch": one program per (group, BN-row tile,
        token block); also `tc_mm` / `tc_group_mm`'s (partials added in groups of GRP)."""
        pdl_release(PDL)
        pdl_wait(PDL)
        pid = tl.program_id(0)
        tb = pid % ntb
        item = pid // ntb
        g = tl.cast(item // tiles, tl.int64)
        offs_t = (tb * MB + tl.arange(0, MB)).to(tl.int64)
        offs_n = ((item % tiles) * BN + tl.arange(0, BN)).to(tl.int64)
        ok = (offs_t < M)[:, None] & (offs_n < R)[None, :]
        part = part_ptr + g * SEGS * M * R + offs_t[:, None] * R + offs_n[None, :]
        out = out_ptr + g * sout_g + offs_t[:, None] * sout_m + offs_n[None, :]
        _sum_tile(part, tl.cast(M, tl.int64) * R, out, ok, (offs_t < M, offs_t), offs_n, None, False, SEGS, BN, MB, GRP)


def _log2(v: int) -> int:
    if v < 1 or v & (v - 1):
        raise ValueError(f"BK = {v}; allowed: a power of two")
    return v.bit_length() - 1


def _desc(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {tuple(t.shape)}"


def _check_x(name: str, x, dims: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != dims or x.dtype != torch.bfloat16:
        raise ValueError(f"{name}: {_desc(x)}; allowed: a {dims}-D torch.bfloat16 tensor")
    m = x.shape[0]
    if not 1 <= m <= DECODE_MAX_M:
        raise ValueError(f"{name}.shape[0] = m = {m}; allowed: 1..{DECODE_MAX_M} (DECODE_MAX_M)")
    if x.shape[-1] < 1:
        raise ValueError(f"{name}.shape[-1] = 0; allowed: >= 1")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) = {x.stride(-1)}; allowed: 1 (contiguous last dim)")


def _check_out(name: str, out, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != shape or out.dtype != dtype:
        raise ValueError(f"{name}: {_desc(out)}; allowed: {dtype} {shape}")
    if out.device != device:
        raise ValueError(f"{name}.device = {out.device}; allowed: {device} (the device of x)")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) = {out.stride(-1)}; allowed: 1 (contiguous last dim)")


def _check_scale(i: int, w: torch.Tensor, sc, device: torch.device) -> torch.Tensor | None:
    """The scales of weight i as uint8 (None for a bf16 or fp32 weight); ValueError else."""
    if w.dtype != FP8:
        if sc is not None:
            raise ValueError(f"scales[{i}]: {_desc(sc)}; allowed: None (weights[{i}] is {w.dtype}, not fp8)")
        return None
    N, K = w.shape
    if K % BLOCK:
        raise ValueError(f"weights[{i}].shape = {tuple(w.shape)}; allowed: K a multiple of {BLOCK} (fp8 blocks)")
    grid = (-(-N // BLOCK), K // BLOCK)
    if not isinstance(sc, torch.Tensor) or sc.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise ValueError(f"scales[{i}]: {_desc(sc)}; allowed: torch.float8_e8m0fnu or torch.uint8 {grid}")
    if tuple(sc.shape) != grid or not sc.is_contiguous() or sc.device != device:
        raise ValueError(f"scales[{i}]: {_desc(sc)} on {sc.device}; allowed: a contiguous {grid} on {device}")
    return sc.view(torch.uint8)


def _check_gemv(x, weights, outs, scales=None):
    """Validate `gemv`'s arguments (ValueError naming the value and what is allowed);
    returns (weights, outs, scales) as tuples, the scales as uint8 or None."""
    _check_x("x", x, 2)
    m, K = x.shape
    if isinstance(weights, torch.Tensor) or not isinstance(weights, (tuple, list)):
        raise ValueError(f"weights: {type(weights).__name__}; allowed: a tuple of 1..{MAX_WEIGHTS} tensors")
    if isinstance(outs, torch.Tensor) or not isinstance(outs, (tuple, list)):
        raise ValueError(f"outs: {type(outs).__name__}; allowed: a tuple of tensors, one per weight")
    if not 1 <= len(weights) <= MAX_WEIGHTS:
        raise ValueError(f"len(weights) = {len(weights)}; allowed: 1..{MAX_WEIGHTS} (MAX_WEIGHTS)")
    if len(outs) != len(weights):
        raise ValueError(f"len(outs) = {len(outs)}; allowed: {len(weights)} (one per weight)")
    if scales is None:
        scales = (None,) * len(weights)
    if isinstance(scales, torch.Tensor) or not isinstance(scales, (tuple, list)) or len(scales) != len(weights):
        raise ValueError(f"scales: {_desc(scales)}; allowed: None or a tuple, one entry (tensor or None) per weight")
    checked = []
    for i, (w, out, sc) in enumerate(zip(weights, outs, scales)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype not in (*_DTYPES, FP8):
            raise ValueError(
                f"weights[{i}]: {_desc(w)}; allowed: a 2-D torch.bfloat16, torch.float32 or torch.float8_e4m3fn [N, K]"
            )
        if w.shape[1] != K:
            raise ValueError(f"weights[{i}].shape = {tuple(w.shape)}; allowed: [N, {K}] (K of x {tuple(x.shape)})")
        if w.shape[0] < 1:
            raise ValueError(f"weights[{i}].shape[0] = 0; allowed: >= 1")
        if not w.is_contiguous():
            raise ValueError(f"weights[{i}] is not contiguous; allowed: a contiguous tensor")
        if w.device != x.device:
            raise ValueError(f"weights[{i}].device = {w.device}; allowed: {x.device} (the device of x)")
        checked.append(_check_scale(i, w, sc, x.device))
        _check_out(f"outs[{i}]", out, (m, w.shape[0]), torch.bfloat16 if w.dtype == FP8 else w.dtype, x.device)
    return tuple(weights), tuple(outs), tuple(checked)


def _check_xq(x: torch.Tensor, xq, weights) -> None:
    """`xq` of `gemv`/`mm_many`: None, or bf16 of x's shape on x's device with a contiguous
    last dim, given only when some weight is fp8 (ValueError otherwise)."""
    if xq is None:
        return
    if not isinstance(xq, torch.Tensor) or xq.dtype != torch.bfloat16 or xq.shape != x.shape:
        raise ValueError(f"xq: {_desc(xq)}; allowed: None or torch.bfloat16 {tuple(x.shape)} (the shape of x)")
    if xq.device != x.device:
        raise ValueError(f"xq.device = {xq.device}; allowed: {x.device} (the device of x)")
    if xq.shape[-1] > 1 and xq.stride(-1) != 1:
        raise ValueError(f"xq.stride(-1) = {xq.stride(-1)}; allowed: 1 (contiguous last dim)")
    if not any(w.dtype == FP8 for w in weights):
        raise ValueError("xq: given, but no weight is torch.float8_e4m3fn; allowed: None")


def _rope_args(rope, x) -> tuple[int, tuple]:
    """(the rotated output's index, −1 for none; the kernel's `rope` tuple: cos, sin, pos,
    their row strides, head_dim, half the tail) of a checked `rope` (any pointers when None:
    nothing reads them). Shared with `tc_mm`, whose store is this module's `_store`."""
    if rope is None:
        return -1, (x, x, x, 0, 0, 2, 1)
    i, D, cos, sin, pos = rope
    return i, (cos, sin, pos, cos.stride(0), sin.stride(0), D, cos.shape[1])


def _check_rope(rope, weights, outs):
    """`rope` of `gemv`/`mm_many`: None or (i, head_dim, cos, sin, pos) fitting weight i's
    output (ValueError naming the field); returns it with pos checked by the rope op."""
    if rope is None:
        return None
    if not isinstance(rope, tuple) or len(rope) != 5:
        raise ValueError(f"rope = {type(rope).__name__}; allowed: None or a tuple (i, head_dim, cos, sin, pos)")
    i, D, cos, sin, pos = rope
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(weights):
        raise ValueError(f"rope i = {i!r}; allowed: 0..{len(weights) - 1} (a weight index)")
    if outs[i].dtype != torch.bfloat16:
        raise ValueError(f"rope i = {i}: outs[{i}].dtype = {outs[i].dtype}; allowed: a bf16 output")
    N = weights[i].shape[0]
    if isinstance(D, bool) or not isinstance(D, int) or D < 2 or D % 2 or N % D:
        raise ValueError(f"rope head_dim = {D!r}; allowed: an even int >= 2 dividing N = {N} (weights[{i}])")
    _rope.check(outs[i].view(outs[i].shape[0], N // D, D), cos, sin, pos, None)
    return rope


def gemv(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """`outs[i] = x · weights[i]ᵀ` for every i in one launch (module doc: shapes, dtypes, the
    summation order); returns `outs` as a tuple. `scales`: None, or one entry per weight,
    the e8m0 scales `[ceil(N/32), K/32]` of a float8_e4m3fn weight (the released FP8 linear,
    kernels/gemv_fp8.py) and None for the others. `xq`: None, or bf16 `[m, K]` holding
    `qdq.fp8_qdq(x)`, which the fp8 weights then read instead of quantizing x in every
    program (same bits; trusted to be that round trip: its producer computes it, e.g.
    `norm.rms_norm(..., qdq_out=)`); only with an fp8 weight. Each output's bits equal those
    of a call with that weight alone, for any m. Bad arguments raise ValueError before
    anything is written; outputs must not overlap one another, x or xq. `rope`: None, or
    `(i, head_dim, cos, sin, pos)`: output i, viewed as heads of `head_dim` values, is
    stored rotated as `rope.apply_rope(out_i, cos, sin, pos)` would rotate it (step 5 of
    the module doc, bit for bit). Capturable once `prepare(device)` ran. The scale bytes are
    trusted (checked at load: `weights.py` rejects 0xFF)."""
    weights, outs, scales = _check_gemv(x, weights, outs, scales)
    _check_xq(x, xq, weights)
    rope = _check_rope(rope, weights, outs)
    require_triton("gemv", x, *weights, *outs)
    m, K = x.shape
    mb, bn, bn8 = _launch(m)
    ntb = -(-m // mb)
    ns, strides, segss, ipss, starts, lock_offs, part_offs = [], [], [], [], [0], [], []
    locks_used = part_used = 0
    for w, out in zip(weights, outs):
        N = w.shape[0]
        bk, segs = plan(N, K, w.dtype)
        tiles = -(-N // (bn8 if w.dtype == FP8 else bn))
        ns.append(N)
        strides.append(out.stride(0))
        segss.append(segs)
        ipss.append(-(-K // bk) // segs)
        starts.append(starts[-1] + tiles * segs)
        lock_offs.append(locks_used)
        part_offs.append(part_used)
        if segs > 1:
            locks_used += tiles * ntb
            part_used += segs * m * N
    if locks_used > _LOCKS:
        raise ValueError(f"counters needed = {locks_used}; allowed: <= {_LOCKS} (split weight tiles × token blocks)")
    locks = _counters.buffer(x.device)
    part = torch.empty(max(part_used, 1), dtype=torch.float32, device=x.device)
    bk16, bk32, bk8 = _BK[torch.bfloat16], _BK[torch.float32], _BK[FP8]
    even = all(K % _BK[w.dtype] == 0 for w in weights)
    scs = tuple(w if sc is None else sc for w, sc in zip(weights, scales))  # the kernel reads fp8 weights' only
    if rope is not None and (bn % 2 or bn8 % 2):  # step 5 rotates pairs inside one row tile
        raise ValueError(f"rope with row tiles of {bn} / {bn8} rows; allowed: even tiles (the launch shape)")
    xin = x if xq is None else xq  # what the fp8 weights read
    rope_i, rargs = _rope_args(rope, x)
    split_form = _SPLIT_FORMS[_SPLIT_FORM]
    sum_launch = split_form == 2 and any(sg > 1 for sg in segss)
    _gemv_kernel[(starts[-1] * ntb,)](
        x, x.stride(0), xin, xin.stride(0), m, K, weights, scs, outs, tuple(ns), tuple(strides),
        tuple(starts), tuple(lock_offs), tuple(part_offs), part, locks, rargs, ntb, SEGSS=tuple(segss), IPSS=tuple(ipss),
        BN=bn, BN8=bn8, MB=mb, BK16=bk16, LOG2_BK16=_log2(bk16), BK32=bk32, LOG2_BK32=_log2(bk32),
        BK8=bk8, LOG2_BK8=_log2(bk8), EVEN_K=even, EXACT_CAST=interpreting(), PREQ=xq is not None, ROPE_I=rope_i,
        enable_fp_fusion=rope is None,  # step 5 as the rope op computes it: no FMA contraction
        num_warps=_WARPS8 if all(w.dtype == FP8 for w in weights) else _WARPS, num_stages=_STAGES, SPLIT=split_form,
        **pdl_launch(x),
    )  # fmt: skip
    if sum_launch:
        launch_sums(x, part, mb, outs, strides, part_offs, segss, (1,) * len(segss), rope, rope_i, rargs)
    return outs


def launch_sums(x, part, mb, outs, strides, part_offs, segss, grps, rope, rope_i, rargs) -> None:
    """The second launch of `_SPLIT_FORM` "launch" (`_sum_kernel`, PDL after the products)
    for the outputs `outs` (row strides `strides`) of one call of x's m rows: weight i's
    segss[i] partials at `part_offs[i]` in `part` (`[segss[i], m, N_i]`, none where
    segss[i] is 1) added in groups of grps[i], mb tokens per program; output rope_i rotated
    (`_rope_args`). Shared with `tc_mm`."""
    m = x.shape[0]
    ns = tuple(o.shape[1] for o in outs)
    starts = [0]  # each split weight's first program (its row tiles of _SUM_ROWS)
    for n_i, sg in zip(ns, segss):
        starts.append(starts[-1] + (-(-n_i // _SUM_ROWS) if sg > 1 else 0))
    ntb = -(-m // mb)
    _sum_kernel[(starts[-1] * ntb,)](
        part, m, tuple(outs), ns, tuple(strides), tuple(part_offs), tuple(starts), rargs, ntb,
        SEGSS=tuple(segss), BN=_SUM_ROWS, MB=mb, ROPE_I=rope_i, GRPS=tuple(grps),
        enable_fp_fusion=rope is None,  # step 5 as the rope op computes it: no FMA contraction
        num_warps=_SUM_WARPS, **pdl_launch(x),
    )  # fmt: skip


def _check_group(o, w, out, scale=None):
    """`group_gemv`'s arguments checked (ValueError naming the value); returns the scale as
    uint8 (None for a bf16 weight)."""
    _check_x("o", o, 3)
    m, G, gw = o.shape
    dtypes = (FP8,) if scale is not None else (torch.bfloat16,)
    if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype not in dtypes:
        raise ValueError(
            f"w: {_desc(w)}; allowed: a 3-D {dtypes[0]} [G, r, gw]"
            + (" (scale given)" if scale is not None else " (no scale)")
        )
    if w.shape[0] != G or w.shape[2] != gw or w.shape[1] < 1:
        raise ValueError(f"w.shape = {tuple(w.shape)}; allowed: [{G}, r >= 1, {gw}] (G and gw of o {tuple(o.shape)})")
    if not w.is_contiguous():
        raise ValueError("w is not contiguous; allowed: a contiguous tensor")
    if w.device != o.device:
        raise ValueError(f"w.device = {w.device}; allowed: {o.device} (the device of o)")
    _check_out("out", out, (m, G, w.shape[1]), torch.bfloat16, o.device)
    if scale is None:
        return None
    r = w.shape[1]
    if r % BLOCK or gw % BLOCK:
        raise ValueError(
            f"w.shape = {tuple(w.shape)}; allowed: r and gw multiples of {BLOCK} (whole FP8 blocks per group)"
        )
    return _check_scale(0, w.view(G * r, gw), scale, o.device)


def group_gemv(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per group g: `out[:, g] = bf16(o[:, g] · w[g]ᵀ)` (module doc), written into `out` and
    returned. Each group is summed as the module doc says with the plan of the whole
    weight `[G·r, gw]` (`plan(G·r, gw, dtype)`, so the split count sees all G·r rows); no
    transpose copy of o or out. Capturable once `prepare(device)` ran.

    `scale`: w is float8_e4m3fn with its e8m0 block scales `[G·r/32, gw/32]` (wo_a as the
    checkpoint stores it, r and gw multiples of 32), dequantized as it is read: the weight's
    values are e4m3 · 2^(S−127), exact in bf16, so this is the bf16 product with the
    dequantized weight (o is not quantized: wo_a is not an FP8 linear). Each term o·sw·w is
    exact in fp32 and the order is `fp8_lanes`' (kernels/gemv_fp8.py) with o's values where
    the FP8 linears read their input's round trip; half the weight bytes of bf16."""
    sb = _check_group(o, w, out, scale)
    require_triton("group_gemv", o, w, out)
    m, G, gw = o.shape
    r = w.shape[1]
    mb, bn, bn8 = _launch(m)
    if sb is not None:
        bn = bn8
    ntb = -(-m // mb)
    bk, segs = plan(G * r, gw, w.dtype)
    tiles = -(-r // bn)
    split = segs > 1
    if split and G * tiles * ntb > _LOCKS:
        raise ValueError(f"counters needed = {G * tiles * ntb}; allowed: <= {_LOCKS} (groups × tiles × token blocks)")
    locks = _counters.buffer(o.device)
    part = torch.empty(G * segs * m * r if split else 1, dtype=torch.float32, device=o.device)
    _group_gemv_kernel[(G * tiles * segs * ntb,)](
        o, o.stride(0), o.stride(1), w, w if sb is None else sb, out, out.stride(0), out.stride(1), part, locks,
        m, r, gw, tiles, ntb, SEGS=segs, IPS=-(-gw // bk) // segs,
        BN=bn, MB=mb, BK=bk, LOG2_BK=_log2(bk), EVEN_K=gw % bk == 0, FP8W=sb is not None,
        num_warps=_WARPS8 if sb is not None else _WARPS, num_stages=_STAGES, SPLIT=_SPLIT_FORMS[_SPLIT_FORM],
        **pdl_launch(o),
    )  # fmt: skip
    if split and _SPLIT_FORM == "launch":
        launch_group_sums(o, part, mb, out, out.stride(0), out.stride(1), G, r, segs, 1)
    return out


def launch_group_sums(x, part, mb, out, sout_m, sout_g, G, R, segs, grp) -> None:
    """`launch_sums` for a grouped product (`_group_sum_kernel`): out `[m, G, R]` (strides
    sout_m, sout_g) from the partials `[G, segs, m, R]` in `part`, added in groups of grp;
    x: the call's input (m rows, its device). Shared with `tc_mm`."""
    m = x.shape[0]
    st, ntb = -(-R // _SUM_ROWS), -(-m // mb)
    _group_sum_kernel[(G * st * ntb,)](
        part, out, sout_m, sout_g, m, R, st, ntb, SEGS=segs, BN=_SUM_ROWS, MB=mb, GRP=grp,
        num_warps=_SUM_WARPS, **pdl_launch(x),
    )  # fmt: skip


# ------------------------------------------------------------ the runtime's entry points


# The runtime's calls take the GEMV at m = 1 only: measured on the H200 (scripts/gemv_tune.py,
# BENCHMARKS.md 2026-12-01 night) it beats cuBLAS at m = 1 (x → wq_a + wkv + weights_proj
# 10.2 vs 23.9 µs) and loses 2-7x at m = 16 (CUDA-core FMAs: compute-bound). Batched decode
# needs a tensor-core GEMV (issue 14).
AUTO_MAX_M = 1


def _decode_fits(x: torch.Tensor, weights, outs) -> bool:
    """Whether `gemv` serves this call: CUDA, 1 ≤ m ≤ AUTO_MAX_M, bf16 x, each weight bf16
    or fp32 with an output of its dtype, or fp8 with a bf16 output (the runtime's dtypes;
    shapes are checked by `gemv` itself)."""
    return (
        x.is_cuda
        and 1 <= x.shape[0] <= AUTO_MAX_M
        and x.dtype == torch.bfloat16
        and all(
            (w.dtype in _DTYPES and o.dtype == w.dtype) or (w.dtype == FP8 and o.dtype == torch.bfloat16)
            for w, o in zip(weights, outs)
        )
    )


def mm_auto(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`ops.mm` on CUDA: `gemv` for a decode-sized call (`_decode_fits`), else `linear.mm`
    (cuBLAS)."""
    if _decode_fits(x, (w,), (out,)):
        return gemv(x, (w,), (out,))[0]
    return linear.mm(x, w, out)


def _rope_after(outs, rope, apply) -> None:
    """Step 5 as a separate op (`apply`: `rope.apply_rope` or its twin), in place."""
    if rope is not None:
        i, D, cos, sin, pos = rope
        o = outs[i].view(outs[i].shape[0], -1, D)
        apply(o, cos, sin, pos, out=o)


def mm_many(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """`outs[i] = x · weights[i]ᵀ` (an fp8 weight with `scales[i]`: the released FP8 linear):
    one fused `gemv` launch for a decode-sized call, else per weight `linear.mm`, or
    `fp8_linear.fp8_mm` for an fp8 weight. `xq`: None or `fp8_qdq(x)` for the fp8 weights;
    `rope`: None or (i, head_dim, cos, sin, pos), output i rotated (as `gemv`; outside the
    GEMV by `rope.apply_rope`, the same bits). Returns `outs` as a tuple."""
    scales = (None,) * len(weights) if scales is None else scales
    if _decode_fits(x, weights, outs):
        return gemv(x, weights, outs, scales, xq, rope)
    from . import fp8_linear  # noqa: PLC0415 (fp8_linear imports this module)

    _check_xq(x, xq, weights)
    rope = _check_rope(rope, weights, outs)
    for w, out, sc in zip(weights, outs, scales):
        if sc is None:
            linear.mm(x, w, out)
        else:
            fp8_linear.fp8_mm(x, w, sc, out, xq=xq)
    _rope_after(outs, rope, _rope.apply_rope)
    return tuple(outs)


def mm_many_exact(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """The CPU runtime's `mm_many`: `linear.mm_exact` per weight (fp64 sums, one rounding),
    the reference `fp8_linear` for an fp8 weight (from x itself: `xq`, checked as `gemv`
    does, is only the round trip the reference makes), then `rope` by the rope op's twin;
    any m."""
    scales = (None,) * len(weights) if scales is None else scales
    _check_xq(x, xq, weights)
    rope = _check_rope(rope, weights, outs)
    for w, out, sc in zip(weights, outs, scales):
        if sc is None:
            linear.mm_exact(x, w, out)
        else:
            out.copy_(fp8_linear(x, w, sc))
    _rope_after(outs, rope, _rope.apply_rope_torch)
    return tuple(outs)


def group_mm_auto(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale=None) -> torch.Tensor:
    """`ops.group_mm` on CUDA (the single-sequence runtime): a bf16 weight by cuBLAS at every
    m (`group_gemv` measured 7 % slower at m = 1 on the H200, 2026-12-01); a weight stored as
    FP8 with its `scale` (wo_a as the checkpoint gives it) by `group_gemv` for 1 ≤ m ≤
    AUTO_MAX_M (half the bytes: 13.3 against cuBLAS's 21.4 µs for the Flash wo_a, H200,
    BENCHMARKS.md 2026-12-04 thirteenth entry), else dequantized for cuBLAS."""
    if scale is not None and o.is_cuda and 1 <= o.shape[0] <= AUTO_MAX_M:
        return group_gemv(o, w, out, scale)
    return linear.group_mm(o, w, out, scale)


# ---------------------------------------------------------------------------- twins


def gemv_exact(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """The CPU runtime's twin: each output by `linear.mm_exact` (fp64 sums, one rounding),
    an fp8 weight's by the reference `fp8_linear`; `rope` by the rope op's twin."""
    weights, outs, scales = _check_gemv(x, weights, outs, scales)
    return mm_many_exact(x, weights, outs, scales, xq, rope)


def group_gemv_exact(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale=None) -> torch.Tensor:
    """The CPU runtime's twin of `group_gemv`: `linear.group_mm_exact` (an FP8-stored weight
    dequantized exactly first)."""
    _check_group(o, w, out, scale)
    return linear.group_mm_exact(o, w, out, scale)


def _ordered(xf: torch.Tensor, w: torch.Tensor, plan_nk: tuple[int, int]) -> torch.Tensor:
    """fp32 `[m, N]` in the kernel's order (module doc, steps 1-3), computed in torch from
    the fp32 terms `xf`: `[m, K]` (x), or `[m, N, K]` per output row (an fp8 weight's
    `gemv_fp8.ordered_terms`); a product of an fp32 weight is rounded before its add (the
    interpreter's fma)."""
    bk, segs = plan_nk
    m, K = xf.shape[0], xf.shape[-1]
    N = w.shape[0]
    ips = -(-K // bk) // segs
    kp = segs * ips * bk
    if xf.dim() == 2:
        xf = xf[:, None]
    xp = torch.zeros(m, xf.shape[1], kp, dtype=torch.float32, device=xf.device)
    xp[..., :K] = xf
    wf = torch.zeros(N, kp, dtype=torch.float32, device=w.device)
    wf[:, :K] = w.float()
    xp, wf = xp.view(m, -1, segs, ips, bk), wf.view(N, segs, ips, bk)
    rows = []
    for n0 in range(0, N, 256):  # bounded memory: [m, 256, segs, bk] lane sums at a time
        wc = wf[n0 : n0 + 256]
        xc = xp if xp.shape[1] == 1 else xp[:, n0 : n0 + 256]
        acc = torch.zeros(m, wc.shape[0], segs, bk, dtype=torch.float32, device=xf.device)
        for i in range(ips):
            acc = acc + wc[None, :, :, i] * xc[:, :, :, i]
        while acc.shape[-1] > 1:  # the lane tree: lanes 2j and 2j + 1 onto lane j
            acc = acc.view(*acc.shape[:-1], -1, 2)
            acc = acc[..., 0] + acc[..., 1]
        seg = acc[..., 0]  # [m, n, segs]
        tot = seg[..., 0]
        for s in range(1, segs):
            tot = tot + seg[..., s]
        rows.append(tot)
    return torch.cat(rows, dim=1)


def gemv_torch(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """`gemv` in torch, in the kernel's summation order: the kernel's bits for bf16 and fp8
    weights (on the GPU and in the interpreter), and the interpreter's for fp32 weights.
    For tests and small shapes (it builds [m, 256, K] fp32 products at a time). `xq` is
    checked as `gemv` does; the terms come from x (the same values). `rope` by the rope
    op's twin (the kernel's step 5 gives its bits)."""
    weights, outs, scales = _check_gemv(x, weights, outs, scales)
    _check_xq(x, xq, weights)
    rope = _check_rope(rope, weights, outs)
    for w, out, sc in zip(weights, outs, scales):
        xf = x.float() if sc is None else ordered_terms(x, sc, w.shape[0])
        out.copy_(_ordered(xf, w, plan(w.shape[0], x.shape[1], w.dtype)))
    _rope_after(outs, rope, _rope.apply_rope_torch)
    return outs


def group_gemv_torch(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale=None) -> torch.Tensor:
    """`group_gemv` in torch, in the kernel's summation order (its bits); an FP8-stored weight
    (`scale`) from the terms o·sw (`gemv_fp8.scaled_terms`)."""
    sb = _check_group(o, w, out, scale)
    G, r, gw = w.shape
    p = plan(G * r, gw, w.dtype)
    for g in range(G):
        xf = o[:, g].float() if sb is None else scaled_terms(o[:, g], sb[g * r // BLOCK : (g + 1) * r // BLOCK], r)
        out[:, g].copy_(_ordered(xf, w[g], p))
    return out
