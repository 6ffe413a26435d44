"""Batch-invariant tensor-core matmuls (Triton): the batched runtime's projections on
CUDA (`runtime/batch.py`), where a token's bits must not depend on the step's other
tokens, nor on how many there are.

- `tc_mm(x, w, out, scale=None)`: `out = x · wᵀ`; x bf16 `[m, K]` (rows contiguous), w
  `[N, K]` contiguous, out `[m, N]`; any m ≥ 1. Weights:
  - bf16 (out bf16): `tl.dot(a, b, acc)` per BK-column chunk;
  - fp32, the compressor's (out fp32, no rounding): each chunk of w split in registers
    into three bf16 parts with hi + mid + lo == w exactly (`_split3`), three products
    into the same fp32 accumulator. Every product of bf16 x by a part is exact in fp32;
    only the sums round (3K terms instead of K). The parts, made in registers, are the
    first operand: the tile is computed transposed (H200, one [1024, 5120] weight, µs at m
    = 1 / 64 / 256: 20.5 / 21.6 / 53.5 against 25.7 / 26.8 / 86.9 untransposed, 69 / 73 /
    257 with fp32 FMAs, and the decode GEMV in row chunks of 16 at m = 64: 155.8);
  - float8_e4m3fn with its e8m0 block scale `[ceil(N/32), K/32]` (out bf16), the
    released FP8 linear (`reference.fp8.fp8_linear`): x must be the input's FP8 round
    trip `fp8_qdq(x)` = q·sx (bf16, exact); each weight chunk is dequantized in registers
    to e4m3 · 2^(e−127) (exact in bf16: 4 significant bits, normal for any weight whose
    scale the released conversion made) and multiplied as a bf16 weight: every product
    exact in fp32, the K terms summed in fp32, one rounding (the "wide GEMM" form the
    golden README says reproduces the released outputs; the prefill path's too). Not the
    FP8 MMA (its 32-term sums keep about 13 bits; `fp8_linear.py`). Measured and dropped
    on the H200 (scripts/tc_kinds.py, 2026-12-03): one product per 32-column block
    scaled as it is added (the reference's chain: 1.5-2x slower), 32-row tiles with one
    scale row, 256-column chunks, the transposed tile (1.5x slower).
- `tc_group_mm(o, w, out, scale=None)`: per group g `out[:, g] = bf16(o[:, g] · w[g]ᵀ)`; o
  bf16 `[m, G, gw]`, w bf16 `[G, r, gw]` contiguous (or float8_e4m3fn with its `scale`: wo_a
  as the checkpoint stores it, the same bits as its bf16 dequantization), out `[m, G, r]`
  (strided views allowed, last dims contiguous): wo_a's grouped low-rank projection.

Why invariant: every call runs the same compiled kernel whatever m is (BM = 64 token rows
per program, BN weight rows, BK columns per chunk, warps and stages fixed; m is not
specialized), rows past m are masked loads; a matrix product's row depends on its own row
of x and on the weights only; K is cut into SEGS segments of IPS chunks, SEGS a constant
of the weight's shape and kind (`plan`; FP8 linears and wo_a: two levels, below); each
segment accumulates its chunks in order; with SEGS > 1 the fp32 segment partials go to a
workspace, and a second launch (`gemv._sum_kernel`, PDL) adds the partials in segment
order 0, 1, … and rounds once (bf16 nearest even, or none for fp32 out); or, the same
steps (`_SPLIT_FORM = "counter"`), each program counts its arrival on its tile's counter,
the last of the tile's SEGS programs to arrive (whichever it is) adds them and resets the
counter. So a row's bits depend on nothing but its own input
and the weights: the same at m = 1 and m = 256, alone or with other sequences, on any SM
count, whatever the arrival order. The bits differ from `gemv.gemv`'s (another summation
order), within the tolerance of the exact product.

Two split levels (FP8 linears and wo_a; `split_levels`, `_FINE_PLAN`): K's chunks are cut
into `fine` segments, and those into `outer` consecutive groups; a tile's sum is the
groups' sums added in order, each group's sum its fine segments' sums added in order, each
fine segment's sum its chunks from zero, all fp32 (fine and outer constants of the shape
and kind). A call of at most `_FINE_MAX_M` rows (per weight dtype) runs one program per
fine segment, and the sum (launch or last program) adds the partials group by group; a
larger call runs one program per group, which adds its fine segments in registers (the same fp32 additions in the same
order), and the sum adds the groups' sums. The same bits either way, so the choice
follows m: the fine programs give small calls the parallelism they lack (one row tile,
few weight tiles), and the coarse ones spare large calls the fine partials' traffic
(m·N·4 bytes each). A kind with fine == outer is the one-level split above, unchanged.

Programs: grid (row tiles, weight tiles, groups × segments), the row tile fastest so
that the programs reading one weight tile run together (one DRAM read, the others from
L2). Capturable (no host sync; the workspace comes from the caching allocator; under
"counter" the counters are one buffer per device and owner, `_triton.ArrivalCounters`: each runtime's
own, one per device shared by direct split calls, which then must not run at once on
different streams).

Twin: `tc_mm_torch`/`tc_group_mm_torch` (fp32 matmul, one rounding; the reference FP8
linear for FP8 weights; equal within fp32 summation-order error, not in bits).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, ArrivalCounters, interpreting, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import pdl_release, pdl_wait, prefetch_l2, round_bf16

__all__ = [
    "tc_mm",
    "tc_group_mm",
    "tc_mm_torch",
    "tc_group_mm_torch",
    "plan",
    "mm_batch",
    "mm_many_batch",
    "rms_norm_batch",
    "fp8_mm_batch",
    "prepare",
    "BM",
    "BN",
    "BK",
]

# The bits: BK and the split rule (`plan`). The rest is the launch shape, fixed for every m
# (what makes the kernel batch-invariant).
# H200 sweep (scripts/tc_tune.py, BENCHMARKS.md 2026-12-02 fifth entry), µs for one layer's
# bf16 projections (wq_a, wkv, wq_b, indexer.wq_b, wo_b, wo_a) at m = 1 / 64 / 256:
# 64/64/128 w4 s3 109.8 / 115.3 / 234.8; 16/64/64 w4 s4 111.0 / 156.7 / 517.3; cuBLAS
# 103.4 / 109.5 / 138.8 (not batch-invariant); the chunked GEMV 98.4 / 2490.8 / 9931.9.
BM, BN, BK = 64, 64, 128
_TARGET_PROGRAMS = 128  # weight tiles × segments at least this (about one per SM on an H200)
# ... but every segment keeps at least this many chunk products (a chunk of an fp32 weight is
# three): a segment's partial store, counted arrival and load in the ordered sum cost about
# the same whatever its length, so short segments lose. H200 (scripts/mm_probe.py,
# BENCHMARKS.md 2026-12-03 third entry), x -> [wq_a, wkv] in one launch, µs at m = 1 / 64:
# 8 and 20 segments (the rule without this floor) 12.1 / 18.4; 4 and 4 (with it) 11.2 / 12.6;
# indexer.wq_b alone 2 segments 8.2 / 8.9, 1 segment 8.2 / 8.5.
_MIN_SEG_PRODUCTS = 10
# The fine split (module doc, "Two split levels"): per weight kind ("bf16", "fp32", "fp8":
# FP8 linears, "group": tc_group_mm's weights of either dtype), `plan`'s (target, min_seg)
# for the fine segments; a kind not listed has fine == coarse (one level, the bits as
# before). H200 (BENCHMARKS.md 2026-12-05, twenty-third entry), the batched FP8 step at 4K,
# ms at B = 1 / 8 / 64 (split rule for FP8 weights only): 128/10 (one level) 6.55 / 7.37 /
# 8.51; 396/5 5.59 / 6.37 / 7.95; 200/4 5.95 / 6.71 / 7.95; 640/8 5.78 / 6.52 / 8.03; 1024/4
# 6.48 / 7.51 / 9.61. bf16 weights gained nothing (264/4: 4.93 → 5.13 at B = 1).
# Group weights (wo_a) too: with FP8 bytes (the FP8 stacks') 6.07 / 6.89 / 8.32 ms without
# their fine split, 5.59 / 6.40 / 7.97 with it.
_FINE_PLAN: dict[str, tuple[int, int]] = {"fp8": (396, 5), "group": (396, 5)}
# Per weight dtype ("bf16", "fp32", "fp8"; absent: never), calls of at most this many rows
# run one program per fine segment; other calls one per coarse segment (the same bits:
# module doc). The fine split's partials cost m·N·4 bytes per segment, which a chunked
# prefill (m = 2048) pays: 322 → 356 ms for 4,096 tokens with the fine split at every m. A
# bf16 wo_a runs coarse programs at every m (its fine ones: B = 64 steps 2 % slower, 6.85 →
# 6.98 ms), with the bits of its FP8 bytes' fine programs.
_FINE_MAX_M: dict[str, int] = {"fp8": BM}
_WARPS, _STAGES = 4, 3
# PDL (kernels/_triton.py): before waiting for the previous kernel, each program asks L2 for
# the first _PF_BYTES of each of its weight rows' segment (0: no prefetch). Timing only.
_PF_BYTES = 512
_LOCKS = 1 << 20  # arrival counters: one per (group, row tile, weight tile) of a split call
# How a split call's partials are added (the same steps in the same order, so the same bits):
# "counter", the last program of a tile to arrive adds them (an acq_rel arrival counter: a
# fence and an L1 invalidation in every program of a split tile), or "launch", the
# programs store their partials and a PDL launch of their own adds them (`gemv._sum_kernel`,
# `gemv.launch_sums` / `launch_group_sums`, up to _SUM_MB tokens per program). "launch" is
# production (2026-12-05, thirtieth entry, H100): the batched FP8 step at 32K, bf16 caches,
# 5.76 → 5.52 ms at B = 1 and 9.72 → 9.39 at B = 64, the bytes of the counter (GPU-checked),
# for calls of at most _SUM_MAX_M rows (the decode steps it was timed in); larger calls
# (prefill chunks, verify steps past one row tile) keep the counter, untimed with the launch
# (the same bytes either way, so the regime may choose).
_SPLIT_FORMS = ("counter", "launch")
_SPLIT_FORM = "launch"
_SUM_MAX_M = BM
_SUM_MB = 4
# Development switch, off (None): a `tc_fp8.FP8_TUNE` dict sends `mm_many_batch`'s FP8
# weights to the Gluon FP8 product (`tc_fp8.tc_fp8_many`, on x's round trip renamed: a
# producer's `xq` as `rms_norm_batch` makes it then, else made for the call) and
# the others here, in two launches. Its bits are other bits (another summation order,
# batch-invariant too), so it is one choice per process, never per call; CUDA only
# (BENCHMARKS.md, 2026-12-04, twentieth entry: not yet measured in a step).
FP8_GLUON: dict | None = None
_counters = ArrivalCounters("tc_mm", "attnv41.kernels.tc_mm.prepare", _LOCKS)


def plan(
    N: int, K: int, products: int = 1, target: int | None = None, min_seg: int | None = None, step: int = 1
) -> int:
    """SEGS for a weight `[N, K]` whose chunks cost `products` tensor-core products each (3
    for fp32 weights, else 1): among the divisors s of ceil(K/BK) that leave each segment at
    least `min_seg` products (default `_MIN_SEG_PRODUCTS`; s ≤ chunks·products / that; s = 1
    always allowed), the smallest with ceil(N/BN)·s ≥ `target` programs (default
    `_TARGET_PROGRAMS`), else the largest. A constant of the shape and weight kind
    (`tc_fp8` probes other targets and minimums: tune keys). `step`: only multiples of it
    (`split_levels`' fine counts: multiples of the coarse one; `step` itself when no
    other qualifies)."""
    target = _TARGET_PROGRAMS if target is None else target
    min_seg = _MIN_SEG_PRODUCTS if min_seg is None else min_seg
    chunks, tiles = -(-K // BK), -(-N // BN)
    cap = max(1, chunks * products // min_seg)
    allowed = [s for s in range(1, min(cap, chunks) + 1) if chunks % s == 0 and s % step == 0] or [step]
    for s in allowed:
        if tiles * s >= target:
            return s
    return allowed[-1]


if HAVE_TRITON:
    from .gemv import _store, _sum_tile
    from .gemv_fp8 import _e8m0

    @triton.jit
    def _split3(v):
        """fp32 → three bf16 (hi, mid, lo) with hi + mid + lo == v exactly: each step keeps
        the nearest bf16 and the remainder is exact in fp32 (for |v| ≥ 2^-100: then no part
        is subnormal); after two 8-bit steps at most 8 significant bits remain."""
        hi = round_bf16(v)
        r = v - hi.to(tl.float32)
        mid = round_bf16(r)
        lo = round_bf16(r - mid.to(tl.float32))
        return hi, mid, lo

    @triton.jit
    def _seg_fp32(
        x, sxm, sxg, w, swg, g, rows, cols, rok, cok, ks, K, fs, IPS: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr,
    ):  # fmt: skip
        """Fine segment fs of an fp32 weight, transposed `[BN, BM]`: its IPS chunks from zero,
        each chunk's three exact bf16 parts as the first operand."""
        xpt = x + g * sxg + rows[None, :] * sxm  # [BK, BM] view of x's rows
        wpt = w + g * swg + cols[:, None] * K  # [BN, BK] the weight's rows
        acct = tl.zeros((BN, BM), dtype=tl.float32)
        for i in range(IPS):
            k = (fs * IPS + i) * BK + ks
            if EVEN_K:
                at = tl.load(xpt + k[:, None], mask=rok[None, :], other=0.0)
                bt = tl.load(wpt + k[None, :], mask=cok[:, None], other=0.0)
            else:
                kok = k < K
                at = tl.load(xpt + k[:, None], mask=rok[None, :] & kok[:, None], other=0.0)
                bt = tl.load(wpt + k[None, :], mask=cok[:, None] & kok[None, :], other=0.0)
            hi, mid, lo = _split3(bt)
            if DOT_FP32:
                a32 = at.to(tl.float32)
                acct = tl.dot(hi.to(tl.float32), a32, acct, input_precision="ieee")
                acct = tl.dot(mid.to(tl.float32), a32, acct, input_precision="ieee")
                acct = tl.dot(lo.to(tl.float32), a32, acct, input_precision="ieee")
            else:
                acct = tl.dot(hi, at, acct)
                acct = tl.dot(mid, at, acct)
                acct = tl.dot(lo, at, acct)
        return acct

    @triton.jit
    def _seg_mm(
        x, sxm, sxg, w, swg, wsc, g, rows, cols, rok, cok, ks, K, fs, IPS: tl.constexpr, WK: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr,
    ):  # fmt: skip
        """Fine segment fs of a bf16 (WK 0) or FP8 (WK 2) weight, `[BM, BN]`: its IPS chunks
        from zero."""
        xp = x + g * sxg + rows[:, None] * sxm
        wp = w + g * swg + cols[None, :] * K  # [BK, BN] view of w's rows (transposed)
        sp = wsc + g * (swg // 1024) + (cols // 32)[None, :] * (K // 32)  # FP8: the columns' scale rows (group g's)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(IPS):
            k = (fs * IPS + i) * BK + ks
            if EVEN_K:
                a = tl.load(xp + k[None, :], mask=rok[:, None], other=0.0)
                b = tl.load(wp + k[:, None], mask=cok[None, :], other=0.0)
            else:
                kok = k < K
                a = tl.load(xp + k[None, :], mask=rok[:, None] & kok[None, :], other=0.0)
                b = tl.load(wp + k[:, None], mask=cok[None, :] & kok[:, None], other=0.0)
            if WK == 2:  # e4m3 · 2^(e−127): exact in bf16 (4 significant bits)
                e = tl.load(sp + (k // 32)[:, None], mask=cok[None, :] & (k < K)[:, None], other=127)
                b = b.to(tl.float32) * _e8m0(e.to(tl.int32))
                if not DOT_FP32:
                    b = b.to(tl.bfloat16)
            if DOT_FP32:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        return acc

    @triton.jit
    def _add_seg(tot, acc, DOT_FP32: tl.constexpr):
        """tot + acc, a fine segment's sum added to the program's: one fp32 addition (round to
        nearest, as the combine's). On the GPU an opaque `add.rn.f32`: Triton's combine pass
        turns `dot(a, b, 0) + tot` into `dot(a, b, tot)` (the tensor cores' sum, other
        bits), which it would do to a one-chunk segment (IPS 1: its loop folded away)."""
        if DOT_FP32:
            return tot + acc
        return tl.inline_asm_elementwise(
            "add.rn.f32 $0, $1, $2;", "=r,r,r", [tot, acc], dtype=tl.float32, is_pure=True, pack=1
        )

    @triton.jit
    def _tc_tile(
        x, sxm, sxg, w, swg, wsc, out, som, sog, part, locks, M, N, K, pm, pn, g, seg, n_pm, n_pn,
        SEGS: tl.constexpr, NF: tl.constexpr, GRP: tl.constexpr, IPS: tl.constexpr, WK: tl.constexpr,
        OUT_F32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        DOT_FP32: tl.constexpr, PDL: tl.constexpr, PF_LINES: tl.constexpr, PF_ELT: tl.constexpr, rope,
        ROPE: tl.constexpr, SUM_LAUNCH: tl.constexpr,
    ):  # fmt: skip
        """Output tile (pm, pn) of group g, program segment seg of SEGS (of n_pm × n_pn
        tiles per group): the weight's first lines prefetched, the wait for the previous
        kernel (PDL), the program's NF fine segments of IPS chunks (each from zero, added
        in order), and the store or the ordered split-K sum of the SEGS partials in groups
        of GRP (module doc: two split levels).
        WK: 0 bf16 weights, 1 fp32 (three exact bf16 parts), 2 FP8 (e4m3 with e8m0 block
        scales wsc, dequantized in registers). DOT_FP32: the interpreter's form of each
        product (its tl.dot multiplies bf16 bit patterns as integers): fp32 operands.
        PDL: started early (kernels/_triton.py); PF_LINES 128-byte lines of each weight
        row's segment are prefetched into L2 before the wait (weights only). ROPE: the
        rounded tile's RoPE-tail pairs rotated before the store (`gemv._store`, the decode
        GEMV's epilogue: the rope op's bits). SUM_LAUNCH (`_SPLIT_FORM` "launch"): a split
        tile's programs store their partials only; `gemv._sum_kernel` /
        `gemv._group_sum_kernel` add them (the same order) in a launch of their own."""
        rows = pm * BM + tl.arange(0, BM)
        cols = pn * BN + tl.arange(0, BN)
        rok, cok = rows < M, cols < N
        ks = tl.arange(0, BK)
        if PF_LINES > 0:  # [BN, PF_LINES] addresses (clamped into the weight): its first lines
            kl = tl.minimum(seg * NF * IPS * BK + tl.arange(0, PF_LINES) * (128 // PF_ELT), K - 1)
            prefetch_l2(w + g * swg + tl.where(cok, cols, 0)[:, None].to(tl.int64) * K + kl[None, :])
        pdl_wait(PDL)
        if WK == 1:  # the parts are made in registers and go first: the tile is computed transposed
            for f in tl.static_range(NF):  # the program's fine segments, each from zero, added in order
                acct = _seg_fp32(x, sxm, sxg, w, swg, g, rows, cols, rok, cok, ks, K, seg * NF + f, IPS, BM, BN,
                                 BK, EVEN_K, DOT_FP32)  # fmt: skip
                if f == 0:
                    tott = acct
                else:
                    tott = _add_seg(tott, acct, DOT_FP32)
            acc = tl.trans(tott)
        else:
            for f in tl.static_range(NF):
                accf = _seg_mm(x, sxm, sxg, w, swg, wsc, g, rows, cols, rok, cok, ks, K, seg * NF + f, IPS, WK,
                               BM, BN, BK, EVEN_K, DOT_FP32)  # fmt: skip
                if f == 0:
                    acc = accf
                else:
                    acc = _add_seg(acc, accf, DOT_FP32)
        ok = rok[:, None] & cok[None, :]
        op = out + g * sog + rows[:, None] * som + cols[None, :]
        toks = (rok, rows)
        if SEGS == 1:
            _store(op, acc, ok, toks, cols, rope, ROPE, BN, BM)  # bf16: rounded (and rotated); fp32 as is
        else:  # the partials in the workspace; the last segment of the tile to arrive sums them in order
            plane = M * N
            pp = part + (g * SEGS * M + rows[:, None]) * N + cols[None, :]
            tl.store(pp + seg * plane, acc, mask=ok)
            if not SUM_LAUNCH:
                tl.debug_barrier()  # every thread's partial stored before the release below
                lock = locks + (g * n_pm + pm) * n_pn + pn
                arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
                if arrived == SEGS - 1:
                    _sum_tile(pp, plane, op, ok, toks, cols, rope, ROPE, SEGS, BN, BM, GRP)
                    tl.atomic_xchg(lock, 0)

    @triton.jit(do_not_specialize=["M"])
    def _tc_kernel(
        x, sxm, sxg, w, swg, wsc, out, som, sog, part, locks,
        M, N, K, SEGS: tl.constexpr, NF: tl.constexpr, GRP: tl.constexpr, IPS: tl.constexpr, WK: tl.constexpr,
        OUT_F32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        DOT_FP32: tl.constexpr, PDL: tl.constexpr = False, PF_LINES: tl.constexpr = 0, PF_ELT: tl.constexpr = 2,
        SUM_LAUNCH: tl.constexpr = False,
    ):  # fmt: skip
        """One weight (G groups: tc_group_mm): grid (row tiles, weight tiles, G × SEGS)."""
        pdl_release(PDL)
        pm, pn, pgs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        _tc_tile(
            x, sxm, sxg, w, swg, wsc, out, som, sog, part, locks, M, N, K, pm, pn, pgs // SEGS, pgs % SEGS,
            tl.num_programs(0), tl.num_programs(1), SEGS, NF, GRP, IPS, WK, OUT_F32, BM, BN, BK, EVEN_K, DOT_FP32,
            PDL, PF_LINES, PF_ELT, (x, x, x, 0, 0, 2, 1), False, SUM_LAUNCH,
        )  # fmt: skip

    @triton.jit(do_not_specialize=["M", "n_pm"])
    def _tc_many_kernel(
        x, sxm, xq, sxqm, ws, scs, outs, ns, soms, starts, lock_offs, part_offs, part, locks, M, K, n_pm, rope,
        SEGSS: tl.constexpr, NFS: tl.constexpr, GRPS: tl.constexpr, IPSS: tl.constexpr, WKS: tl.constexpr,
        OUT_F32S: tl.constexpr, PFS: tl.constexpr,
        PF_ELTS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
        DOT_FP32: tl.constexpr, ROPE_I: tl.constexpr = -1, PDL: tl.constexpr = False, SUM_LAUNCH: tl.constexpr = False,
    ):  # fmt: skip
        """Several weights sharing x in one launch (`mm_many_batch`): work item j of weight i
        (starts[i] ≤ j < starts[i + 1]; weight tile fastest, then the segment) × n_pm row
        tiles (fastest), each as `_tc_kernel` computes it alone: the same bits. FP8
        weights (WKS[i] = 2) read xq, x's FP8 round trip. Weight ROPE_I's output (−1: none)
        is stored rotated (`rope`: cos, sin, pos, their strides, head_dim, half the tail)."""
        pdl_release(PDL)
        pid = tl.program_id(0)
        pm = pid % n_pm
        item = pid // n_pm
        for i in tl.static_range(len(ws)):
            if (item >= starts[i]) & (item < starts[i + 1]):
                local = item - starts[i]
                n_pn = tl.cdiv(ns[i], BN)
                pn, seg = local % n_pn, local // n_pn
                if WKS[i] == 2:
                    _tc_tile(
                        xq, sxqm, 0, ws[i], 0, scs[i], outs[i], soms[i], 0, part + part_offs[i], locks + lock_offs[i],
                        M, ns[i], K, pm, pn, 0, seg, n_pm, n_pn, SEGSS[i], NFS[i], GRPS[i], IPSS[i], WKS[i],
                        OUT_F32S[i],
                        BM, BN, BK, EVEN_K, DOT_FP32, PDL, PFS[i], PF_ELTS[i], rope, ROPE_I == i, SUM_LAUNCH,
                    )  # fmt: skip
                else:
                    _tc_tile(
                        x, sxm, 0, ws[i], 0, scs[i], outs[i], soms[i], 0, part + part_offs[i], locks + lock_offs[i],
                        M, ns[i], K, pm, pn, 0, seg, n_pm, n_pn, SEGSS[i], NFS[i], GRPS[i], IPSS[i], WKS[i],
                        OUT_F32S[i],
                        BM, BN, BK, EVEN_K, DOT_FP32, PDL, PFS[i], PF_ELTS[i], rope, ROPE_I == i, SUM_LAUNCH,
                    )  # fmt: skip


def _check(name, t, dims, dtypes=(torch.bfloat16,)) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != dims or t.dtype not in dtypes:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: {got}; allowed: a {dims}-D {allowed} tensor")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) = {t.stride(-1)}; allowed: 1 (contiguous last dim)")


def split_levels(N: int, K: int, kind: str) -> tuple[int, int]:
    """(fine, outer): the two split levels of a weight `[N, K]` of `kind` (`_FINE_PLAN`'s
    keys; group weights pass G·N rows). K's chunks are cut into `fine` segments, summed in
    `outer` consecutive groups of fine // outer (module doc); constants of the shape and
    kind, so the bits. coarse = `plan`'s default rule, and the fine count a multiple of it
    (`_FINE_PLAN`'s rule among those), so outer = coarse: large calls keep the one-level
    parallelism."""
    products = 3 if kind == "fp32" else 1
    coarse = plan(N, K, products)
    fine = plan(N, K, products, *_FINE_PLAN[kind], step=coarse) if kind in _FINE_PLAN else coarse
    return fine, coarse


def _weight_plan(w, N: int, K: int, G: int, wsc, pdl: bool, m: int, group: bool = False) -> tuple:
    """(SEGS, NF, GRP, IPS, WK, PF_LINES) of a weight `[N, K]` (per group, G groups) in a
    call of m rows: SEGS programs per output tile, each summing NF fine segments of IPS
    chunks, the last to arrive adding their partials in groups of GRP (`split_levels`: the
    bits depend on the shape and kind only, not on m); WK; the prefetch (lines of each
    row's segment: a power of two, only with PDL)."""
    wk = 2 if wsc is not None else (1 if w.dtype == torch.float32 else 0)
    dtype = ("bf16", "fp32", "fp8")[wk]
    fine, outer = split_levels(G * N if group else N, K, "group" if group else dtype)  # groups: all G·N rows
    ips = -(-K // BK) // fine
    if m <= _FINE_MAX_M.get(dtype, 0):
        segs, nf, grp = fine, 1, fine // outer
    else:
        segs, nf, grp = outer, fine // outer, 1
    pf = 0
    if pdl and _PF_BYTES > 0:
        pf = min(_PF_BYTES, nf * ips * BK * w.element_size()) // 128
        pf = 1 << (pf.bit_length() - 1) if pf else 0
    return segs, nf, grp, ips, wk, pf


def _check_part(m: int, values: int) -> None:
    """The split-K workspace is addressed with int32 offsets in the kernels: fewer than 2³¹
    values (checked before anything is launched)."""
    if values >= 1 << 31:
        raise ValueError(
            f"m = {m}: split-K workspace of {values} fp32 values; allowed: < 2^31 (int32 offsets; split the call)"
        )


def _counters_needed(m: int, G: int, N: int, segs: int) -> int:
    return G * -(-m // BM) * -(-N // BN) if segs > 1 and not _sum_launch(m) else 0


def _sum_launch(m: int) -> bool:
    """Whether a split call of m rows adds its partials in a launch of its own
    (`_SPLIT_FORM` "launch" and m ≤ `_SUM_MAX_M`)."""
    if _SPLIT_FORM not in _SPLIT_FORMS:
        raise ValueError(f"tc_mm._SPLIT_FORM = {_SPLIT_FORM!r}; allowed: {list(_SPLIT_FORMS)}")
    return _SPLIT_FORM == "launch" and m <= _SUM_MAX_M


def _sum_mb(m: int) -> int:
    """Token rows per program of the sum launch: m rounded up to a power of two, at most _SUM_MB."""
    return min(_SUM_MB, 1 << (m - 1).bit_length())


def _launch(x, sxm, sxg, w, out, som, sog, m, G, N, K, wsc=None, group=False) -> None:
    pdl = pdl_launch(x)
    segs, nf, grp, ips, wk, pf = _weight_plan(w, N, K, G, wsc, pdl["PDL"], m, group)
    tiles = (-(-m // BM), -(-N // BN))
    if _counters_needed(m, G, N, segs) > _LOCKS:  # checked before anything is launched
        raise ValueError(
            f"m = {m}: arrival counters needed = {G * tiles[0] * tiles[1]} (groups × row tiles × weight tiles "
            f"of {tuple(w.shape)}); allowed: <= {_LOCKS}"
        )
    _check_part(m, G * segs * m * N if segs > 1 else 0)
    dev = x.device
    part = torch.empty(G * segs * m * N if segs > 1 else 1, dtype=torch.float32, device=dev)
    sum_launch = segs > 1 and _sum_launch(m)
    locks = _counters.buffer(dev) if segs > 1 and not sum_launch else part
    _tc_kernel[(*tiles, G * segs)](
        x, sxm, sxg, w, N * K, w if wsc is None else wsc, out, som, sog, part, locks, m, N, K,
        SEGS=segs, NF=nf, GRP=grp, IPS=ips, WK=wk, OUT_F32=out.dtype == torch.float32,
        BM=BM, BN=BN, BK=BK, EVEN_K=K % BK == 0, DOT_FP32=interpreting(), PF_LINES=pf, PF_ELT=w.element_size(),
        SUM_LAUNCH=sum_launch, num_warps=_WARPS, num_stages=_STAGES, **pdl,
    )  # fmt: skip
    if sum_launch:
        from .gemv import launch_group_sums  # noqa: PLC0415

        launch_group_sums(x, part, _sum_mb(m), out, som, sog, G, N, segs, grp)


def _plan_many(x, weights, scales, pdl: bool) -> tuple:
    """`_launch_many`'s layout, checked (ValueError before anything is launched): each
    weight's plan, its first work item, arrival counters and workspace offset, and the
    totals."""
    m, K = x.shape
    plans = [_weight_plan(w, w.shape[0], K, 1, sc, pdl, m) for w, sc in zip(weights, scales)]
    starts, lock_offs, part_offs = [0], [], []
    locks_used = part_used = 0
    for w, (segs, *_) in zip(weights, plans):
        N = w.shape[0]
        starts.append(starts[-1] + -(-N // BN) * segs)
        lock_offs.append(locks_used)
        part_offs.append(part_used)
        locks_used += _counters_needed(m, 1, N, segs)
        part_used += segs * m * N if segs > 1 else 0
    if locks_used > _LOCKS:
        raise ValueError(
            f"m = {m}: arrival counters needed = {locks_used} (row tiles × weight tiles of "
            f"{[tuple(w.shape) for w in weights]}); allowed: <= {_LOCKS}"
        )
    _check_part(m, part_used)
    return plans, starts, lock_offs, part_offs, locks_used, part_used


def _launch_many(x, xq, weights, outs, scales, rope=None) -> None:
    """Every weight of `mm_many_batch` in one launch (`_tc_many_kernel`): each weight's
    plan and counters as `tc_mm` alone would use them, so the same bits; `rope` (checked):
    output i rotated in the store."""
    from .gemv import _rope_args, launch_sums  # noqa: PLC0415

    m, K = x.shape
    pdl = pdl_launch(x)
    plans, starts, lock_offs, part_offs, locks_used, part_used = _plan_many(x, weights, scales, pdl["PDL"])
    dev = x.device
    part = torch.empty(max(part_used, 1), dtype=torch.float32, device=dev)
    locks = _counters.buffer(dev) if locks_used else part
    n_pm = -(-m // BM)
    xr = x if xq is None else xq
    rope_i, rargs = _rope_args(rope, x)
    sum_launch = _sum_launch(m) and any(p[0] > 1 for p in plans)
    _tc_many_kernel[(starts[-1] * n_pm,)](
        x, x.stride(0), xr, xr.stride(0), tuple(weights), tuple(w if sc is None else sc for w, sc in zip(weights, scales)),
        tuple(outs), tuple(w.shape[0] for w in weights), tuple(o.stride(0) for o in outs), tuple(starts),
        tuple(lock_offs), tuple(part_offs), part, locks, m, K, n_pm, rargs,
        SEGSS=tuple(p[0] for p in plans), NFS=tuple(p[1] for p in plans), GRPS=tuple(p[2] for p in plans),
        IPSS=tuple(p[3] for p in plans), WKS=tuple(p[4] for p in plans),
        OUT_F32S=tuple(o.dtype == torch.float32 for o in outs), PFS=tuple(p[5] for p in plans),
        PF_ELTS=tuple(w.element_size() for w in weights), BM=BM, BN=BN, BK=BK, EVEN_K=K % BK == 0,
        DOT_FP32=interpreting(), ROPE_I=rope_i, SUM_LAUNCH=sum_launch, num_warps=_WARPS, num_stages=_STAGES,
        enable_fp_fusion=rope is None,  # the rotation as the rope op computes it: no FMA contraction
        **pdl,
    )  # fmt: skip
    if sum_launch:
        launch_sums(
            x, part, _sum_mb(m), outs, [o.stride(0) for o in outs], part_offs, [p[0] for p in plans],
            [p[2] for p in plans], rope, rope_i, rargs,
        )  # fmt: skip


def _scale_bytes(scale, w) -> torch.Tensor:
    """An FP8 weight's e8m0 block scale as uint8 `[ceil(N/32), K/32]` (ValueError otherwise)."""
    N, K = w.shape
    want = (-(-N // 32), K // 32)
    if (
        not isinstance(scale, torch.Tensor)
        or scale.dtype not in (torch.float8_e8m0fnu, torch.uint8)
        or tuple(scale.shape) != want
        or not scale.is_contiguous()
        or scale.device != w.device
    ):
        got = f"{tuple(scale.shape)} {scale.dtype}" if isinstance(scale, torch.Tensor) else type(scale).__name__
        raise ValueError(f"scale: {got}; allowed: a contiguous float8_e8m0fnu or uint8 {want} on {w.device}")
    return scale.view(torch.uint8)


def _check_mm(x, w, out, scale):
    """tc_mm's arguments checked (ValueError naming the value and what is allowed); returns
    the scale as uint8 bytes (None for bf16 and fp32 weights)."""
    _check("x", x, 2)
    if scale is None:
        _check("w", w, 2, (torch.bfloat16, torch.float32))
    else:
        _check("w", w, 2, (torch.float8_e4m3fn,))
        if w.shape[1] % 32:
            raise ValueError(f"w.shape[1] (K) = {w.shape[1]}; allowed: a multiple of 32 (the FP8 scale blocks)")
        scale = _scale_bytes(scale, w)
    _check("out", out, 2, (torch.float32,) if w.dtype == torch.float32 else (torch.bfloat16,))
    m, K = x.shape
    N = w.shape[0]
    if m < 1 or w.shape[1] != K or not w.is_contiguous():
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)}; allowed: x [m >= 1, K], w contiguous [N, K]")
    if tuple(out.shape) != (m, N):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: ({m}, {N})")
    return scale


def tc_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """`out = x · wᵀ`, batch-invariant (module doc); returns out. w bf16 (out bf16), fp32
    (out fp32: the compressor's projections) or float8_e4m3fn with its e8m0 `scale` (out
    bf16; x must then be the FP8 round trip `fp8_qdq` of the input, as `fp8_mm_batch`
    makes it)."""
    scale = _check_mm(x, w, out, scale)
    require_triton("tc_mm", x, w, out)
    m, K = x.shape
    _launch(x, x.stride(0), 0, w, out, out.stride(0), 0, m, 1, w.shape[0], K, scale)
    return out


def tc_group_mm(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Per group g: `out[:, g] = bf16(o[:, g] · w[g]ᵀ)`, batch-invariant (module doc). With
    `scale`, w is float8_e4m3fn with its e8m0 block scales `[G·r/32, gw/32]` (wo_a as the
    checkpoint stores it; r and gw multiples of 32), dequantized in registers to the exact
    bf16 values, and o is read as it is (not quantized: wo_a is not an FP8 linear): the
    same operands, plan and order as the bf16 weight, so the same bits, from half the
    weight bytes."""
    _check("o", o, 3)
    _check("w", w, 3, (torch.bfloat16,) if scale is None else (torch.float8_e4m3fn,))
    _check("out", out, 3)
    m, G, gw = o.shape
    if m < 1 or w.shape[0] != G or w.shape[2] != gw or not w.is_contiguous():
        raise ValueError(f"o {tuple(o.shape)}, w {tuple(w.shape)}; allowed: o [m >= 1, G, gw], w contiguous [G, r, gw]")
    r = w.shape[1]
    if tuple(out.shape) != (m, G, r):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: ({m}, {G}, {r})")
    sb = None
    if scale is not None:
        if r % 32 or gw % 32:
            raise ValueError(
                f"w.shape = {tuple(w.shape)}; allowed: r and gw multiples of 32 (whole FP8 blocks per group)"
            )
        sb = _scale_bytes(scale, w.view(G * r, gw))
    require_triton("tc_group_mm", o, w, out)
    _launch(o, o.stride(0), o.stride(1), w, out, out.stride(0), out.stride(1), m, G, r, gw, sb, group=True)
    return out


def prepare(device: torch.device | str) -> None:
    """Allocate the split-K arrival counters on `device` (zeros). Done by the first call
    that splits K; call it before capturing a CUDA graph whose first such call is inside it."""
    _counters.prepare(device)


# ------------------------------------------ the batched runtime's entry points (ops table)


def mm_many_batch(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """`ops.mm_many` of the batched runtime on CUDA: every weight as `tc_mm` computes it
    alone (bf16, fp32, or FP8 with its scale), all in one launch; FP8 weights read x's FP8 round trip,
    `xq` if given (its producer made it; under `FP8_GLUON` in `tc_fp8`'s renamed column
    order, as `rms_norm_batch` makes it then), else `qdq.fp8_qdq(x)` once for the call; `rope`
    (i, head_dim, cos, sin, pos) rotates output i in the store, as the decode GEMV's
    epilogue does (`gemv._store`): the bits of the rope op applied after the product, no
    launch of its own."""
    from . import gemv, qdq  # noqa: PLC0415

    scales = (None,) * len(weights) if scales is None else tuple(scales)
    if len(scales) != len(weights) or len(outs) != len(weights):
        raise ValueError(f"{len(weights)} weights, {len(outs)} outs, {len(scales)} scales; allowed: as many of each")
    fp8 = [sc is not None for sc in scales]
    gemv._check_xq(x, xq, [w for w, f in zip(weights, fp8) if f])
    sbytes = [_check_mm(x, w, o, sc) for w, o, sc in zip(weights, outs, scales)]
    if rope is not None:
        rope = gemv._check_rope(rope, weights, outs)
    require_triton("mm_many_batch", x, *weights, *outs)
    if FP8_GLUON is not None and any(fp8):
        return _many_gluon(x, weights, outs, scales, sbytes, fp8, rope, xq)
    xr = None
    if any(fp8):
        xr = xq if xq is not None else qdq.fp8_qdq(x.contiguous())
    _launch_many(x, xr, weights, outs, sbytes, rope)
    return tuple(outs)


def _many_gluon(x, weights, outs, scales, sbytes, fp8, rope, xq=None) -> tuple:
    """`mm_many_batch` under `FP8_GLUON`: the FP8 weights through `tc_fp8.tc_fp8_many` on x's
    round trip stored renamed: the producer's `xq` (renamed, `rms_norm_batch`), else
    `qdq.fp8_qdq(x, rename=True)` made here; the others through `_launch_many` as before."""
    from . import qdq, tc_fp8  # noqa: PLC0415

    if interpreting() or x.device.type != "cuda":
        raise RuntimeError(
            f"tc_mm.FP8_GLUON = {FP8_GLUON!r}: the Gluon FP8 product runs on CUDA only (x on {x.device})"
        )
    K = x.shape[1]
    if K % 128:
        raise ValueError(f"x.shape[1] (K) = {K}; allowed with tc_mm.FP8_GLUON: a multiple of 128")
    idx8 = [i for i, f in enumerate(fp8) if f]
    rest = [i for i, f in enumerate(fp8) if not f]
    if rest:  # the second launch's limits checked before anything runs
        _plan_many(x, [weights[i] for i in rest], [sbytes[i] for i in rest], pdl_launch(x)["PDL"])
    xr = xq if xq is not None else qdq.fp8_qdq(x.contiguous(), rename=True)
    rope8 = rope_rest = None
    if rope is not None:
        if fp8[rope[0]]:
            rope8 = (idx8.index(rope[0]), *rope[1:])
        else:
            rope_rest = (rest.index(rope[0]), *rope[1:])
    tc_fp8.tc_fp8_many(
        xr, [weights[i] for i in idx8], [outs[i] for i in idx8], [scales[i] for i in idx8], rope=rope8, **FP8_GLUON
    )
    if rest:
        _launch_many(x, None, [weights[i] for i in rest], [outs[i] for i in rest], [sbytes[i] for i in rest], rope_rest)
    return tuple(outs)


def rms_norm_batch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
    qdq_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`ops.rms_norm` of the batched runtime on CUDA: `norm.rms_norm`, with `qdq_out` (the
    round trip an FP8 linear reads next, `mm_many_batch(..., xq=)`) stored in `tc_fp8`'s
    renamed column order while `FP8_GLUON` is on: the order `mm_many_batch` reads a
    producer's `xq` in then, so the switch costs no launch of its own."""
    from . import norm  # noqa: PLC0415

    rename = FP8_GLUON is not None and qdq_out is not None
    return norm.rms_norm(x, weight, eps, out=out, qdq_out=qdq_out, qdq_rename=rename)


def mm_batch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`ops.mm` of the batched runtime on CUDA (`mm_many_batch`, one weight)."""
    return mm_many_batch(x, (w,), (out,))[0]


def fp8_mm_batch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, xq=None) -> torch.Tensor:
    """`ops.fp8_mm` of the batched runtime on CUDA (`mm_many_batch`, one FP8 weight): the
    released FP8 linear's math on the tensor cores (module doc)."""
    return mm_many_batch(x, (w,), (out,), (scale,), xq)[0]


def tc_mm_torch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The twin: fp32 products and sums, one rounding to out's dtype; with an FP8 weight's
    `scale`, the released FP8 linear (`reference.fp8.fp8_linear`, x the unquantized input)."""
    if scale is not None:
        from ..reference.fp8 import fp8_linear  # noqa: PLC0415

        return out.copy_(fp8_linear(x, w, scale))
    return out.copy_((x.float() @ w.float().t()).to(out.dtype))


def tc_group_mm_torch(
    o: torch.Tensor, w: torch.Tensor, out: torch.Tensor, scale: torch.Tensor | None = None
) -> torch.Tensor:
    from .linear import _dequant_group  # noqa: PLC0415

    return out.copy_(torch.einsum("mgk,grk->mgr", o.float(), _dequant_group(w, scale).float()).to(torch.bfloat16))
