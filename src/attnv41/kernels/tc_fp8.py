"""FP8 linears on the tensor cores with the dequantized weight as the product's register
operand (Gluon, sm_90): `tc_mm`'s FP8 math (x the input's FP8 round trip, each weight
value e4m3 · 2^(e−127) exact in bf16, the products exact in fp32, fp32 sums, one bf16
rounding) and its split rule, without the dequantized weight's trip through shared memory.
Not wired into the runtime: a candidate for `tc_mm`'s FP8 path, measured by
`scripts/tc_fp8_probe.py` (BENCHMARKS.md, 2026-12-04, twentieth entry).

Why: `tc_mm` dequantizes each FP8 weight chunk in registers and stores it to shared memory
for the product; Triton then puts `fence.proxy.async` before the product, which compiles to
`MEMBAR.ALL.CTA` (offline SASS), a memory barrier in every chunk while the next chunks'
copies are in flight. The same loop over bf16 weights, with no such store and no barrier,
streams 2.2-2.4x more bytes per second (nineteenth entry); here x copied by cp.async (with
the fence) ran slower than x copied by TMA (without) at most shapes (twentieth entry).
Here each program computes a transposed tile `outᵀ[BN weight rows, BT tokens]`: the weight
chunk `[BN, BK]` is the product's first operand, converted in registers and passed to the
product from there; only x's chunk `[BT, BK]` is in shared memory as the second operand,
copied by TMA (no fence needed). The weight bytes reach each thread through shared memory
as raw FP8 bytes: `_fp8_kernel` copies each thread's own 32 bytes (cp.async into its own
slots, read back by the same thread); the warp-specialized `_fp8_ws_kernel` (tune ws) has
a producer warp copy whole chunks by TMA while consumer warpgroups convert and multiply.

The column order. The product's register operand gives each thread, per row and chunk,
the columns {16s + 8h + 2q + p} (s < 8, h, p < 2, q = lane % 4): 2-byte runs. A sum over
k does not depend on how the columns are named, as long as x's columns get the same names,
so each chunk's 128 columns are renamed: logical column 16s + 8h + 2q + p holds physical
column 32q + 4s + 2h + p. Thread q of a row then holds the 32 contiguous bytes 32q … 32q +
31, exactly one FP8 scale block (one scale per thread and chunk). x is given renamed
(`rename_cols`). The renaming is a constant of the kernel, so it moves no bit between
calls (but the fp32 sums run in another order than `tc_mm`'s: other bits, within the same
bound of the exact product).

Each product is waited on at once: the warpgroup product reads its register operand
asynchronously, and Triton keeps the unpacked bf16 values alive across a later wait, not the
packed registers the product reads (with one product left in flight, ptxas reused them for
the next chunk's loads: offline SASS). Conversion and product overlap across programs on
an SM, or across the two consumers of `ws = 2`.

Batch invariance: as `tc_mm` (module doc): a fixed tile of BT token rows (tune bt, 64 by
default) for every m, SEGS and IPS from `tc_mm.plan` (or the tune's segs), the segment
partials summed by the last program to arrive in segment order, one bf16 rounding. x's TMA
boxes of rows wholly past m are not loaded: those rows of shared memory keep stale values,
which reach only output columns past m (each output column depends on its own x row
only), never stored. A token's bits depend on its own row of x and the weights only.

Gluon does not run under `TRITON_INTERPRET`: on the CPU the kernels are compiled for sm_90
only (`bench.sass tcfp8`, tests/kernels/test_tc_fp8_sass.py); the numerics are checked on
the GPU (tests/kernels/test_tc_fp8.py).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, triton

try:  # Gluon ships with Triton >= 3.5
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
except ImportError:  # pragma: no cover - an older Triton
    HAVE_GLUON = False

__all__ = ["HAVE_GLUON", "tc_fp8", "tc_fp8_many", "rename_cols", "FP8_TUNE"]

BN, BK = 64, 128  # weight rows (the product's M), columns per chunk; token rows (its N): tune bt
# Launch shape (no bit depends on it): stages of shared memory (each chunk's weight bytes,
# scale words and x; stages − 1 chunks in flight); xm, how x (given renamed: `rename_cols`)
# is copied: 1 cp.async, 2 TMA in boxes of xr rows; segs: 0 the split rule of `tc_mm.plan`,
# else that many K segments (probes: other bits); ws: 1 or 2, the warp-specialized form
# (`_fp8_ws_kernel`: a producer warp, ws consumer warpgroups, the second of cregs registers;
# stages a multiple of ws; ws = 2 sums two chains: other bits); 4 warps per warpgroup (the
# product's 64 rows); maxnreg: 0 ptxas's count, else the launch's register cap; bt: token
# rows per tile (the product's N: 8, 16, 32 or 64), 0 by m (`_tile_rows`: the smallest that
# holds min(m, 64)); boxes of min(xr, bt) rows. A token's sums run over k alone, so bt
# should move no bit; tests/kernels/test_tc_fp8.py compares each bt's bytes with bt 64's on
# the GPU (not yet run: until it has passed, bt 0 is not a rule the runtime may use).
# progs, minseg: the split rule's target program count and least chunks per segment
# (`tc_mm.plan`'s arguments; with segs 0): a constant of the shape, so the bits too.
FP8_TUNE = dict(stages=4, xm=2, xr=16, segs=0, ws=0, cregs=152, maxnreg=0, bt=64, progs=128, minseg=10)

if HAVE_GLUON:
    from .sparse_attn_gluon import _pdl_release_wait

    # A weight chunk's bytes [BN rows, 4 scale blocks q, 32]: thread (lane l, warp v) holds
    # rows 16v + l/4 and 16v + l/4 + 8, block q = l % 4, all 32 bytes in registers: after
    # `_rename`, the product's register operand with a register permutation only.
    _LB = gl.constexpr(
        gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16], [8, 0, 0]],
            lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
            warp_bases=[[16, 0, 0], [32, 0, 0]],
            block_bases=[],
            shape=[BN, 4, 32],
        )
    )

    @gluon.jit
    def _rename(t, R: gl.constexpr):
        """[R, 128] physical columns 32q + 4s + 2h + p → logical 16s + 8h + 2q + p."""
        t = gl.reshape(t, [R, 4, 8, 2, 2])
        t = gl.permute(t, (0, 2, 3, 1, 4))
        return gl.reshape(t, [R, 128])

    @gluon.jit
    def _bytes(v):
        """[R, 4, 8] int32 words → [R, 4, 32] float8e4nv, byte b of word i at 4i + b."""
        b0 = (v & 0xFF).to(gl.uint8)
        b1 = ((v >> 8) & 0xFF).to(gl.uint8)
        b2 = ((v >> 16) & 0xFF).to(gl.uint8)
        b3 = ((v >> 24) & 0xFF).to(gl.uint8)
        t = gl.join(gl.join(b0, b2), gl.join(b1, b3))  # [R, 4, 8, 2, 2]: [.., j, i] = byte 2j + i
        t = gl.reshape(t, [v.shape[0], 4, 32])
        return t.to(gl.float8e4nv, bitcast=True)

    @gluon.jit
    def _tma_x(xd, x_smem, bars, st, row, col, pred, M, BT: gl.constexpr, XR: gl.constexpr):
        """Chunk columns col … col + 127 of x's rows row … row + BT − 1 into stage st (its two
        [BT, 64] halves) in boxes of XR rows, counted on its barrier by one expect of the
        loaded boxes' bytes (one arrival); boxes wholly past m are not loaded (their rows keep
        stale values: they feed only output columns past m, which are not stored). Nothing
        when not pred. The compiler puts a CTA barrier (`BAR.SYNC`) before every operation on
        an mbarrier, TMA copies included, so the expect (one per possible box count: its
        byte count is a constant) and each box's copies sit behind branches of their own: the
        chunk loop runs 6 CTA barriers at m = 1 and 11 for a full tile (it was 18 at every m
        with an expect, or an arrive, per box; offline SASS)."""
        nb = gl.minimum(gl.cdiv(M - row, XR), BT // XR)  # ≥ 1: a program's first row is < m
        for k in gl.static_range(1, BT // XR + 1):
            if pred & (nb == k):
                mbarrier.expect(bars.index(st), k * (XR * 64 * 2 * 2))
        for j in gl.static_range(BT // XR):
            r = row + j * XR
            if pred & (r < M):
                bar = bars.index(st)
                tma.async_copy_global_to_shared(xd, [r, col], bar, x_smem.index(2 * st).slice(j * XR, XR, dim=0))
                tma.async_copy_global_to_shared(
                    xd, [r, col + 64], bar, x_smem.index(2 * st + 1).slice(j * XR, XR, dim=0)
                )

    @gluon.jit
    def _e8m0_gl(b):
        """fp32 2^(b−127) of e8m0 bytes (int32 0..254); b = 0 is the subnormal 2^−127."""
        return gl.where(b == 0, 0x00400000, b << 23).to(gl.float32, bitcast=True)

    @gluon.jit
    def _issue(
        w_smem, s_smem, x_smem, bars, st, chunk, pred, w, w_off, w_ok, wsc, s_off, s_ok, x, xc_off, xc_ok, row0, M,
        XM: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, XR: gl.constexpr,
    ):  # fmt: skip
        """Chunk `chunk`'s copies into stage st (nothing where not pred; one cp.async group
        committed either way): each thread's 32 weight bytes and its rows' scale word
        (cp.async, the thread's own slots), x's [BT, BK] chunk (cp.async, or TMA on the
        stage's barrier)."""
        async_copy.async_copy_global_to_shared(w_smem.index(st), w + w_off + chunk * (BK // 4), mask=w_ok & pred)
        async_copy.async_copy_global_to_shared(s_smem.index(st), wsc + s_off + chunk, mask=s_ok & pred)
        if XM == 1:
            async_copy.async_copy_global_to_shared(x_smem.index(st), x + xc_off + chunk * BK, mask=xc_ok & pred)
        else:
            _tma_x(x, x_smem, bars, st, row0, chunk * BK, pred, M, BT, XR)
        async_copy.commit_group()

    @gluon.jit
    def _fp8_tile(
        x, sxm, w, wsc, out, som, part, locks, M, N, K, rope, pm, pn, seg, n_pn, w_smem, s_smem, x_smem, bars,
        SEGS: gl.constexpr, IPS: gl.constexpr, S: gl.constexpr, XM: gl.constexpr, XR: gl.constexpr,
        BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, ROPE: gl.constexpr,
    ):  # fmt: skip
        """Output tile (pm, pn), K segment seg of one weight: the chunk loop over the stages
        (shared memory and x's barriers allocated by the kernel, fresh: one tile per program)
        and the store or ordered split-K sum."""
        # the weight chunk as int32 words [BN rows, 32 words]: thread (lane l, warp v) holds
        # rows 16v + l/4 and 16v + l/4 + 8, words 8q … 8q + 7 (q = l % 4: one scale block)
        LW: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [8, 0]],
            lane_bases=[[0, 8], [0, 16], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]],
            block_bases=[],
            shape=[BN, 32],
        )
        LS: gl.constexpr = gl.SliceLayout(2, _LB)  # [BN, 4] the chunk's scale words
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)

        rows = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, LW))
        w_off = rows.to(gl.int64)[:, None] * (K // 4) + gl.arange(0, 32, layout=gl.SliceLayout(0, LW))[None, :]
        w_ok = (rows < N)[:, None]
        srows = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, LS))
        sq = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        s_off = (srows // 32).to(gl.int64)[:, None] * (K // BK) + (sq * 0)[None, :]  # the rows' scale word of chunk 0
        s_ok = (srows < N)[:, None] & (sq >= 0)[None, :]
        if XM == 1:  # x renamed in global memory (`rename_cols`), copied by cp.async
            LXC: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])  # [BT, BK] 16-byte pieces
            ct = pm * BT + gl.arange(0, BT, layout=gl.SliceLayout(1, LXC))
            xc_off = ct.to(gl.int64)[:, None] * sxm + gl.arange(0, BK, layout=gl.SliceLayout(0, LXC))[None, :]
            xc_ok = (ct < M)[:, None]
        else:
            xc_off = 0
            xc_ok = False

        c0 = seg * IPS  # the segment's first chunk
        for st in gl.static_range(S - 1):
            _issue(
                w_smem, s_smem, x_smem, bars, st, c0 + st, st < IPS, w, w_off, w_ok, wsc, s_off, s_ok, x, xc_off,
                xc_ok, pm * BT, M, XM, BT, BK, XR,
            )  # fmt: skip
        acc = gl.zeros([BN, BT], gl.float32, layout=MMA)
        for i in range(IPS):
            cur = i % S
            async_copy.wait_group(S - 2)  # this thread's copies of chunk i have landed
            if XM == 2:
                mbarrier.wait(bars.index(cur), (i // S) & 1)  # and x's boxes
            wv = gl.reshape(w_smem.index(cur).load(LW), [BN, 4, 8])
            sb = (s_smem.index(cur).load(LS) >> (sq * 8)[None, :]) & 0xFF  # block q's e8m0 byte
            # e4m3 · 2^(e−127), exact in bf16 (4 significant bits), renamed into the operand
            wf = _bytes(wv).to(gl.float32) * gl.expand_dims(_e8m0_gl(sb), 2)
            ab = _rename(gl.reshape(wf.to(gl.bfloat16), [BN, BK]), BN)
            if XM == 1:
                fence_async_shared()  # x's cp.async writes, before the product reads them
            gl.thread_barrier()  # every warp has chunk i's x and is past chunk i − 1's product
            nx = i + S - 1  # into the stage chunk i − 1 used
            _issue(
                w_smem, s_smem, x_smem, bars, nx % S, c0 + nx, nx < IPS, w, w_off, w_ok, wsc, s_off, s_ok, x, xc_off,
                xc_ok, pm * BT, M, XM, BT, BK, XR,
            )  # fmt: skip
            # each product waited on at once (module doc)
            if XM == 2:
                a0, a1 = gl.split(gl.permute(gl.reshape(ab, [BN, 2, 64]), (0, 2, 1)))
                acc = warpgroup_mma(
                    gl.convert_layout(a0, A_OP), x_smem.index(2 * cur).permute((1, 0)), acc, is_async=True
                )
                acc = warpgroup_mma(
                    gl.convert_layout(a1, A_OP), x_smem.index(2 * cur + 1).permute((1, 0)), acc, is_async=True
                )
            else:
                acc = warpgroup_mma(gl.convert_layout(ab, A_OP), x_smem.index(cur).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        async_copy.wait_group(0)
        _epilogue(acc, out, som, part, locks, M, N, pm, pn, seg, n_pn, rope, SEGS, BN, BT, ROPE)

    @gluon.jit(do_not_specialize=["M", "n_pm"])
    def _fp8_kernel(
        x, sxm, ws, scs, outs, ns, soms, starts, lock_offs, part_offs, part, locks, M, K, n_pm, rope,
        SEGSS: gl.constexpr, IPSS: gl.constexpr, S: gl.constexpr, XM: gl.constexpr, XR: gl.constexpr,
        BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, PDL: gl.constexpr, num_warps: gl.constexpr,
        ROPE_I: gl.constexpr = -1,
    ):  # fmt: skip
        """Several FP8 weights reading the same x in one launch (`tc_fp8_many`): work item j of
        weight i (starts[i] ≤ j < starts[i + 1]; weight tile fastest, then the segment) × n_pm
        row tiles (fastest), each as it is computed alone: the same bits. Weight ROPE_I's
        output (−1: none) is stored rotated (`rope`)."""
        gl.static_assert(BN == 64 and BK == 128 and num_warps == 4)
        _pdl_release_wait(PDL)
        pid = gl.program_id(0)
        pm = pid % n_pm
        item = pid // n_pm
        W_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
        S_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        w_smem = gl.allocate_shared_memory(gl.int32, [S, BN, 32], W_SL)
        s_smem = gl.allocate_shared_memory(gl.int32, [S, BN, 4], S_SL)
        if XM == 1:
            X_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BK], gl.bfloat16)
            x_smem = gl.allocate_shared_memory(gl.bfloat16, [S, BT, BK], X_SL)
            bars = s_smem  # (unused)
        else:  # x a TMA descriptor of [XR, 64] boxes: two halves per chunk, one barrier per stage
            XH_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
            x_smem = gl.allocate_shared_memory(gl.bfloat16, [2 * S, BT, 64], XH_SL)
            bars = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
            for st in gl.static_range(S):
                mbarrier.init(bars.index(st), count=1)
            fence_async_shared()
        for i in gl.static_range(len(ws)):
            if (item >= starts[i]) & (item < starts[i + 1]):
                local = item - starts[i]
                n_pn = gl.cdiv(ns[i], BN)
                _fp8_tile(
                    x, sxm, ws[i], scs[i], outs[i], soms[i], part + part_offs[i], locks + lock_offs[i], M, ns[i], K,
                    rope, pm, local % n_pn, local // n_pn, n_pn, w_smem, s_smem, x_smem, bars,
                    SEGSS[i], IPSS[i], S, XM, XR, BN, BT, BK, ROPE_I == i,
                )  # fmt: skip

    @gluon.jit
    def _round_bf16_gl(x):
        """fp32 → bf16, round to nearest even, NaN → 0x7FC0 (`_triton.round_bf16`'s bits)."""
        nan = gl.full(x.shape, 0x7FC0, gl.uint16, layout=x.type.layout).to(gl.bfloat16, bitcast=True)
        return gl.where(x != x, nan, x.to(gl.bfloat16))

    @gluon.jit
    def _store_out(o_ptr, total, ok2, n0, t0, M, rope, ROPE: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr):
        """The [BN, BT] fp32 sums (rows n0 …, tokens t0 …) rounded to bf16 and stored; with ROPE
        the pairs (rows 2i, 2i + 1) in each head's rope tail rotated as `gemv._store` does
        (`rope`: cos, sin, pos, their row strides, head_dim, half the tail; the launch without
        FMA contraction): the rope op's bits after the product."""
        y = _round_bf16_gl(total)
        if ROPE:
            cos_ptr, sin_ptr, pos_ptr, stride_cos, stride_sin, D, HALF = rope
            a, b = gl.split(gl.permute(gl.reshape(y.to(gl.float32), [BN // 2, 2, BT]), (0, 2, 1)))
            PAIR: gl.constexpr = a.type.layout
            lead = D - 2 * HALF
            jn = (
                n0 + 2 * gl.arange(0, BN // 2, layout=gl.SliceLayout(1, PAIR))
            ) % D  # each pair's first column in its head
            tail = jn >= lead
            k = gl.where(tail, (jn - lead) // 2, 0)
            tt = t0 + gl.arange(0, BT, layout=gl.SliceLayout(0, PAIR))
            tok = tt < M
            p = gl.load(pos_ptr + tt, mask=tok, other=0).to(gl.int64)
            m2 = tail[:, None] & tok[None, :]
            c = gl.load(cos_ptr + p[None, :] * stride_cos + k[:, None], mask=m2, other=1.0)
            sn = gl.load(sin_ptr + p[None, :] * stride_sin + k[:, None], mask=m2, other=0.0)
            re = _round_bf16_gl(a * c - b * sn).to(gl.float32)
            im = _round_bf16_gl(a * sn + b * c).to(gl.float32)
            rot = gl.reshape(gl.permute(gl.join(re, im), (0, 2, 1)), [BN, BT])
            keep = gl.reshape(gl.permute(gl.join(m2, m2), (0, 2, 1)), [BN, BT])
            rot = gl.convert_layout(rot, y.type.layout)
            keep = gl.convert_layout(keep, y.type.layout)
            y = gl.where(keep, rot.to(gl.bfloat16), y)
        gl.store(o_ptr, y, mask=ok2)

    @gluon.jit
    def _epilogue(
        acc, out, som, part, locks, M, N, pm, pn, seg, n_pn, rope,
        SEGS: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr, ROPE: gl.constexpr,
    ):  # fmt: skip
        """outᵀ tile → out[t, n] (bf16, n contiguous per thread; `_store_out`), or the
        segment's partial and, by the last of the tile's SEGS programs to arrive, the
        partials summed in segment order."""
        LO: gl.constexpr = gl.BlockedLayout([4, 1], [16, 2], [1, 4], [0, 1])
        acc = gl.convert_layout(acc, LO)
        on = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, LO))
        ot = pm * BT + gl.arange(0, BT, layout=gl.SliceLayout(0, LO))
        ok2 = (on < N)[:, None] & (ot < M)[None, :]
        o_ptr = out + ot.to(gl.int64)[None, :] * som + on[:, None]
        if SEGS == 1:
            _store_out(o_ptr, acc, ok2, pn * BN, pm * BT, M, rope, ROPE, BN, BT)
        else:
            plane = M * N
            pp = part + ot.to(gl.int64)[None, :] * N + on[:, None]
            gl.store(pp + seg * plane, acc, mask=ok2)
            gl.thread_barrier()  # every thread's partial stored before the release below
            lock = locks + pm * n_pn + pn
            arrived = gl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
            if arrived == SEGS - 1:
                s = gl.load(pp, mask=ok2, other=0.0, cache_modifier=".cg")
                for j in gl.static_range(1, SEGS):  # the adds in segment order
                    s += gl.load(pp + j * plane, mask=ok2, other=0.0, cache_modifier=".cg")
                _store_out(o_ptr, s, ok2, pn * BN, pm * BT, M, rope, ROPE, BN, BT)
                gl.atomic_xchg(lock, 0)

    # ------------------------------------------------------------ warp-specialized form (ws = 1, 2)

    @gluon.jit
    def _ws_consumer0(
        w_smem, x_smem, s_smem, full, empty, IPS,
        S: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, NC: gl.constexpr,
    ):  # fmt: skip
        """The default partition: consumer 0 (every NC-th chunk from the first); returns its
        accumulator."""
        return (_ws_chain(0, w_smem, x_smem, s_smem, full, empty, IPS, S, BN, BT, BK, NC),)

    @gluon.jit
    def _ws_consumer1(
        w_smem,
        x_smem,
        s_smem,
        full,
        empty,
        acc_smem,
        IPS,
        S: gl.constexpr,
        BN: gl.constexpr,
        BT: gl.constexpr,
        BK: gl.constexpr,
    ):
        """A worker warpgroup: consumer 1 (the odd chunks); leaves its accumulator in acc_smem."""
        acc_smem.store(_ws_chain(1, w_smem, x_smem, s_smem, full, empty, IPS, S, BN, BT, BK, 2))

    @gluon.jit
    def _ws_chain(
        cid: gl.constexpr, w_smem, x_smem, s_smem, full, empty, IPS,
        S: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, NC: gl.constexpr,
    ):  # fmt: skip
        """Consumer cid's chunks cid, cid + NC, …: waits for the stage, converts the weight
        bytes (renamed into the product's register operand), multiplies, releases the stage;
        returns the accumulator."""
        # the chunk's bytes as a [BN, 128] tile read from the TMA-written stage: `_LB`'s threads
        LB2: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
            lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
            warp_bases=[[16, 0], [32, 0]],
            block_bases=[],
            shape=[BN, 128],
        )
        LS: gl.constexpr = gl.SliceLayout(2, _LB)
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        sq = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
        acc = gl.zeros([BN, BT], gl.float32, layout=MMA)
        for t in range((IPS - cid + NC - 1) // NC):
            j = cid + NC * t
            st = j % S
            mbarrier.wait(full.index(st), (j // S) & 1)
            wb = gl.reshape(w_smem.index(st).load(LB2), [BN, 4, 32])
            sw = s_smem.index(j).load(gl.SliceLayout(1, LS))  # [BN] each row's scale word of chunk j
            sb = (sw[:, None] >> (sq * 8)[None, :]) & 0xFF  # block q's e8m0 byte
            wf = gl.convert_layout(wb, _LB).to(gl.float8e4nv, bitcast=True).to(gl.float32)
            wf = wf * gl.expand_dims(_e8m0_gl(sb), 2)
            ab = _rename(gl.reshape(wf.to(gl.bfloat16), [BN, BK]), BN)
            a0, a1 = gl.split(gl.permute(gl.reshape(ab, [BN, 2, 64]), (0, 2, 1)))
            acc = warpgroup_mma(gl.convert_layout(a0, A_OP), x_smem.index(2 * st).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma(
                gl.convert_layout(a1, A_OP), x_smem.index(2 * st + 1).permute((1, 0)), acc, is_async=True
            )
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            gl.thread_barrier()  # the partition's warps are past the stage's reads and product
            mbarrier.arrive(empty.index(st))
        return acc

    @gluon.jit
    def _ws_producer(
        xd, wd, w_smem, x_smem, full, empty, w_row, c0, x_row, M, IPS,
        S: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, XR: gl.constexpr,
    ):  # fmt: skip
        """One warp: each chunk's weight box [BN, BK] and x's boxes by TMA into stage j % S,
        once the consumer of chunk j − S has released it."""
        for j in range(IPS):
            st = j % S
            mbarrier.wait(empty.index(st), ((j // S) - 1) & 1, pred=j >= S)
            mbarrier.expect(full.index(st), w_smem.shape[1] * BK)
            tma.async_copy_global_to_shared(wd, [w_row, (c0 + j) * BK], full.index(st), w_smem.index(st))
            _tma_x(xd, x_smem, full, st, x_row, (c0 + j) * BK, True, M, BT, XR)

    @gluon.jit(do_not_specialize=["M"])
    def _fp8_ws_kernel(
        xd, wd, wsc, out, som, part, locks, M, N, K, rope,
        SEGS: gl.constexpr, IPS: gl.constexpr, IPS_P2: gl.constexpr, S: gl.constexpr, XR: gl.constexpr,
        NC: gl.constexpr, C_REGS: gl.constexpr, BN: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
        PDL: gl.constexpr, num_warps: gl.constexpr, ROPE: gl.constexpr = False,
    ):  # fmt: skip
        """`_fp8_kernel`'s tile, warp-specialized: a producer warp issues every copy (TMA for the
        weight and x) into S stages; NC consumer warpgroups convert and multiply. NC = 1: one
        chain, `_fp8_kernel`'s bits; NC = 2: chunks even and odd in two chains added at the end
        (other bits), one converting while the other's product runs."""
        gl.static_assert(BN == 64 and BK == 128 and num_warps == 4 and S % NC == 0)
        _pdl_release_wait(PDL)
        pm, pn, seg = gl.program_id(0), gl.program_id(1), gl.program_id(2)
        n_pn = gl.num_programs(1)
        c0 = seg * IPS
        W_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        XH_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        SC_SL: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 16])
        w_smem = gl.allocate_shared_memory(gl.uint8, [S, BN, BK], W_SL)
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [2 * S, BT, 64], XH_SL)
        acc_smem = gl.allocate_shared_memory(
            gl.float32, [BN, BT if NC == 2 else 1], gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        )
        full = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
        for st in gl.static_range(S):
            mbarrier.init(full.index(st), count=2)
            mbarrier.init(empty.index(st), count=1)
        # the segment's scale words, one per weight row and chunk: s_smem[j, r]
        LSC: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
        jj = gl.arange(0, IPS_P2, layout=gl.SliceLayout(1, LSC))
        rr = pn * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, LSC))
        sw = gl.load(
            wsc + (rr // 32).to(gl.int64)[None, :] * (K // BK) + (c0 + jj)[:, None],
            mask=(jj < IPS)[:, None] & (rr < N)[None, :],
            other=0,
        )
        s_smem = gl.allocate_shared_memory(gl.int32, [IPS_P2, BN], SC_SL, sw)
        # the same bytes (unswizzled, row-major) as rows that `.index(j)` takes
        s_smem = s_smem._reinterpret(gl.int32, [IPS_P2, BN], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        fence_async_shared()
        gl.thread_barrier()
        if NC == 2:
            (acc,) = gl.warp_specialize(
                [
                    (_ws_consumer0, (w_smem, x_smem, s_smem, full, empty, IPS, S, BN, BT, BK, NC)),
                    (_ws_consumer1, (w_smem, x_smem, s_smem, full, empty, acc_smem, IPS, S, BN, BT, BK)),
                    (_ws_producer, (xd, wd, w_smem, x_smem, full, empty, pn * BN, c0, pm * BT, M, IPS, S, BT, BK, XR)),
                ],
                [4, 1],
                [C_REGS, 24],
            )
            acc = acc + acc_smem.load(MMA)  # the even chunks' chain, then the odd ones'
        else:
            (acc,) = gl.warp_specialize(
                [
                    (_ws_consumer0, (w_smem, x_smem, s_smem, full, empty, IPS, S, BN, BT, BK, NC)),
                    (_ws_producer, (xd, wd, w_smem, x_smem, full, empty, pn * BN, c0, pm * BT, M, IPS, S, BT, BK, XR)),
                ],
                [1],
                [24],
            )
        _epilogue(acc, out, som, part, locks, M, N, pm, pn, seg, n_pn, rope, SEGS, BN, BT, ROPE)


def rename_cols(x: torch.Tensor) -> torch.Tensor:
    """x `[m, K]` with each chunk's 128 columns in the kernel's logical order (module doc):
    column 16s + 8h + 2q + p of a chunk holds x's column 32q + 4s + 2h + p (K a multiple of 128)."""
    m, K = x.shape
    return x.reshape(m, K // 128, 4, 8, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(m, K).contiguous()


def _check_tune(tune: dict) -> dict:
    unknown = sorted(set(tune) - set(FP8_TUNE))
    if unknown:
        raise ValueError(f"tune keys {unknown}; allowed: {sorted(FP8_TUNE)}")
    cfg = dict(FP8_TUNE, **tune)
    odd = {k: v for k, v in cfg.items() if isinstance(v, bool) or not isinstance(v, int)}
    if odd:
        raise ValueError(f"tune values {odd}; allowed: ints")
    if (
        cfg["stages"] not in (2, 3, 4, 5, 6, 8)
        or cfg["xm"] not in (1, 2)
        or cfg["xr"] not in (8, 16, 32, 64)
        or cfg["ws"] not in (0, 1, 2)
        or (cfg["ws"] and (cfg["stages"] % cfg["ws"] or cfg["xm"] != 2))
        or cfg["cregs"] not in range(24, 257, 8)
        or cfg["maxnreg"] not in (0, *range(24, 257, 8))
        or cfg["bt"] not in (0, 8, 16, 32, 64)
        or not 1 <= cfg["progs"] <= 4096
        or not 1 <= cfg["minseg"] <= 64
    ):
        raise ValueError(
            f"tune {cfg}; allowed: stages 2, 3, 4, 5, 6 or 8, xm 1 or 2, xr 8, 16, 32 or 64, ws 0, 1 or 2 "
            "(consumer warpgroups; stages a multiple, xm 2), cregs 24 … 256 in steps of 8, maxnreg 0 or as "
            "cregs, bt 0, 8, 16, 32 or 64, progs 1 … 4096, minseg 1 … 64"
        )
    if cfg["ws"] == 2 and cfg["maxnreg"] and 128 * (cfg["maxnreg"] + cfg["cregs"]) + 32 * 24 > 288 * cfg["maxnreg"]:
        # the launch's pool (maxnreg for each of the 288 threads) must hold the default warpgroup's
        # maxnreg, the second consumer's cregs and the producer warp's 24, or the second
        # consumer's register request waits forever
        most = (160 * cfg["maxnreg"] - 768) // 128 // 8 * 8
        raise ValueError(f"cregs = {cfg['cregs']} with ws = 2, maxnreg = {cfg['maxnreg']}; allowed: <= {most}")
    return cfg


def _tile_rows(cfg: dict, m: int) -> tuple[int, int]:
    """(token rows per tile, rows per x box) of a call of m rows under tune `cfg`."""
    bt = cfg["bt"] or next(b for b in (8, 16, 32, 64) if b >= min(m, 64))
    return bt, min(cfg["xr"], bt)


def tc_fp8(
    xq: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, rope=None, **tune
) -> torch.Tensor:
    """`out = bf16(xq · dequant(w)ᵀ)`, `tc_mm`'s FP8 contract: xq the input's FP8 round trip
    renamed (`qdq.fp8_qdq(x, rename=True)`, or `rename_cols` of the round trip), w
    float8_e4m3fn `[N, K]` with its e8m0 scale `[ceil(N/32), K/32]`, out bf16 `[m, N]`; K a
    multiple of 128; CUDA sm_90 only (module doc). `rope`: None or (head_dim, cos, sin,
    pos): out's heads' RoPE tails rotated in the store, as `tc_mm.mm_many_batch`'s `rope`
    does (the rope op's bits after the product). `tune`: keys of `FP8_TUNE`. Every argument
    is checked before anything runs."""
    if rope is not None and (not isinstance(rope, tuple) or len(rope) != 4):
        raise ValueError(f"rope = {type(rope).__name__}; allowed: None or a tuple (head_dim, cos, sin, pos)")
    tc_fp8_many(xq, (w,), (out,), (scale,), rope=None if rope is None else (0, *rope), **tune)
    return out


def tc_fp8_many(xq: torch.Tensor, weights, outs, scales, rope=None, **tune) -> tuple:
    """`tc_fp8` for several FP8 weights reading the same renamed xq, in one launch (each
    weight's bits as alone; `tc_mm.mm_many_batch`'s grouping); `rope` (i, head_dim, cos,
    sin, pos) rotates output i in the store. The warp-specialized forms (tune ws) take one
    weight. Returns outs."""
    from . import gemv  # noqa: PLC0415
    from . import tc_mm as TC  # noqa: PLC0415

    weights, outs, scales = tuple(weights), tuple(outs), tuple(scales)
    if not weights or len(outs) != len(weights) or len(scales) != len(weights):
        raise ValueError(
            f"{len(weights)} weights, {len(outs)} outs, {len(scales)} scales; allowed: >= 1, as many of each"
        )
    sbytes = [TC._check_mm(xq, w, o, sc) for w, o, sc in zip(weights, outs, scales)]
    cfg = _check_tune(tune)
    m, K = xq.shape
    if K % BK:
        raise ValueError(f"w.shape[1] (K) = {K}; allowed: a multiple of {BK}")
    if cfg["ws"] and len(weights) > 1:
        raise ValueError(f"ws = {cfg['ws']} with {len(weights)} weights; allowed: one weight")
    segs_tune = cfg["segs"]
    if not isinstance(segs_tune, int) or segs_tune < 0 or (segs_tune and (K // BK) % segs_tune):
        raise ValueError(f"segs = {segs_tune!r}; allowed: 0 (tc_mm.plan) or a divisor of K / {BK} = {K // BK}")
    plans = [segs_tune or TC.plan(w.shape[0], K, 1, cfg["progs"], cfg["minseg"]) for w in weights]
    bt, xr = _tile_rows(cfg, m)
    n_pm = -(-m // bt)
    starts, lock_offs, part_offs = [0], [], []
    locks_used = part_used = 0
    for w, segs in zip(weights, plans):
        N = w.shape[0]
        starts.append(starts[-1] + -(-N // BN) * segs)
        lock_offs.append(locks_used)
        part_offs.append(part_used)
        locks_used += n_pm * -(-N // BN) if segs > 1 else 0
        part_used += segs * m * N if segs > 1 else 0
    if locks_used > TC._LOCKS:
        raise ValueError(f"m = {m}: arrival counters needed = {locks_used}; allowed: <= {TC._LOCKS}")
    TC._check_part(m, part_used)
    if cfg["xm"] == 2 and (xq.data_ptr() % 16 or (xq.stride(0) * 2) % 16):
        raise ValueError(
            f"xq: data_ptr() % 16 = {xq.data_ptr() % 16}, row stride {xq.stride(0)}; allowed: 16-byte aligned "
            "start and rows (x's TMA boxes)"
        )
    for i, (w, sb) in enumerate(zip(weights, sbytes)):
        if w.data_ptr() % 16 or sb.data_ptr() % 4:
            raise ValueError(
                f"weight {i}: data_ptr() % 16 = {w.data_ptr() % 16}, its scale's % 4 = {sb.data_ptr() % 4}; "
                "allowed: 0 and 0 (16-byte weight copies, the scales read as int32 words)"
            )
    if rope is not None:
        rope = gemv._check_rope(rope, weights, outs)
    rope_i, rargs = gemv._rope_args(rope, xq)
    require_triton("tc_fp8", xq, *weights, *outs)
    if not HAVE_GLUON or interpreting():
        raise RuntimeError("tc_fp8: needs Gluon and a CUDA device (it does not run under TRITON_INTERPRET)")
    dev = xq.device
    part = torch.empty(max(part_used, 1), dtype=torch.float32, device=dev)
    locks = TC._counters.buffer(dev) if locks_used else part
    xa = xq
    if cfg["xm"] == 2:
        xa = TensorDescriptor.from_tensor(xq, [xr, 64], gl.NVMMASharedLayout(128, 16, 2))
    cap = {"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] else {}
    launch = dict(enable_fp_fusion=rope is None, **pdl_launch(xq), **cap)  # the rotation as the rope op: no FMA
    if cfg["ws"]:
        (w,), (out,), (sb,), (segs,) = weights, outs, sbytes, plans
        N = w.shape[0]
        ips = K // BK // segs
        wd = TensorDescriptor.from_tensor(w.view(torch.uint8), [BN, BK], gl.NVMMASharedLayout(128, 8, 2))
        _fp8_ws_kernel[(n_pm, -(-N // BN), segs)](
            xa, wd, sb.view(torch.int32), out, out.stride(0), part, locks, m, N, K, rargs,
            SEGS=segs, IPS=ips, IPS_P2=triton.next_power_of_2(ips), S=cfg["stages"], XR=xr,
            NC=cfg["ws"], C_REGS=cfg["cregs"], BN=BN, BT=bt, BK=BK, num_warps=4, ROPE=rope is not None, **launch,
        )  # fmt: skip
        return outs
    _fp8_kernel[(starts[-1] * n_pm,)](
        xa, xq.stride(0), tuple(w.view(torch.int32) for w in weights), tuple(sb.view(torch.int32) for sb in sbytes),
        outs, tuple(w.shape[0] for w in weights), tuple(o.stride(0) for o in outs), tuple(starts), tuple(lock_offs),
        tuple(part_offs), part, locks, m, K, n_pm, rargs,
        SEGSS=tuple(plans), IPSS=tuple(K // BK // sg for sg in plans), S=cfg["stages"], XM=cfg["xm"], XR=xr,
        BN=BN, BT=bt, BK=BK, num_warps=4, ROPE_I=rope_i, **launch,
    )  # fmt: skip
    return outs
