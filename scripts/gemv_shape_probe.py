"""What bounds the decode GEMV at m = 1 (CUDA only; a development tool, not part of `attnv41 bench`).

The FP8 wo_b [5120, 8192] and wq_b [32768, 1280] are the same 42 MB, yet the GEMV reads wo_b
at about 1.9 TB/s and wq_b at about 2.5 (BENCHMARKS.md, 2026-12-01 late night). Two causes
are untested: the access pattern (each program reads 16 rows × 256 bytes per chunk, the rows
K bytes apart) and the program count / chain length of the split rule (`gemv.plan`'s
`_TARGET_PROGRAMS`). This probe times, at a constant weight size:

1. `shapes`: the same bytes as [N, K] for K = 8192 … 256 (FP8 and bf16 weights), production
   launch. At K = 256 each program's chunk is 4 KiB of contiguous bytes: what a tile-major
   weight layout would give (the same lane order, so the same bits, if the kernel read it).
2. `progs`: wo_b and wq_b under `_TARGET_PROGRAMS` = 1024 (production), 2048, 4096, 16384
   (more K segments: shorter chains, more programs; other bits, still fixed per shape).
3. `tiled`: wo_b, wq_b and wo_a's [2048, 8192]-sized FP8 weight through a copy of the FP8 lane loop
   (`_probe_fp8`, production plan, one token) reading the weight row-major (the control) or
   tile-major: each (16-row tile, 256-column chunk) as 4 KiB of contiguous bytes, a tile's
   chunks in order, so that a program's segment is one contiguous run. Same lanes, same
   bits (checked against `gemv.gemv_torch`); only the addresses differ.
   `split2`: the same loop at several segment counts (other plans, so other bits, each
   checked against `gemv.gemv_torch` under that plan), its partials summed by the last
   program of a tile to arrive (`gemv._finish`: an arrival counter, whose release costs a
   MEMBAR.ALL.GPU and whose acquire a CCTL.IVALL in every program, sm_90 SASS; or its
   "release" form, the acquire only in the last program) or by a second kernel
   (`_sum_parts`, launched with PDL): no fence in the GEMV's programs. The
   question: at one chunk per program (wo_b at 32 segments, 23.6 µs on the H100 under
   the counter) is the counter what keeps it from the 19.0 µs of a shape that needs no
   split ([163840, 256])?
4. `stream`: a plain streaming read of the same bytes (16-byte loads, a max, one store per
   program; 4 warps): the ceiling of a read-only kernel of this size, with 16 to 256 bytes
   per thread loaded per iteration (the bytes each SM keeps in flight). The GEMV keeps one
   chunk in flight per program: 64 bytes per thread at 8 programs of 2 warps per SM (128
   registers), about 32 KiB per SM.

The twenty-ninth entry of BENCHMARKS.md (H100) has the `tiled` results: tile-major gains
0.2-0.5 µs (1-2 %), so the access pattern is not what holds wo_b back. The twenty-eighth
entry (H100) has the others, and those of a part `ahead`
(the weight's next chunks loaded ahead, as bytes or int32 words) whose kernel knobs were
removed after it lost: commit acd56e1 has both.

Every GEMV row is first checked bit for bit against `gemv.gemv_torch` (the kernel's order in
torch, under the same plan). Times: one CUDA graph over copies of the weights past the L2,
flushed before each replay (`Timer.time_graph`). Prints a line per row; JSON to
$OUT/gemv_shape_probe.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import time
import traceback

import torch

from attnv41.bench.common import Timer, _copy_ms
from attnv41.kernels import gemv as G
from attnv41.kernels import qdq
from attnv41.kernels._triton import interpreting, pdl_launch, tl, triton

if triton is not None:
    from attnv41.kernels._triton import pdl_release, pdl_wait, round_bf16
from attnv41.kernels.gemv_fp8 import _e8m0, _quant_block

_finish = G._finish
_lane_tree = G._lane_tree

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
ELEMS = 5120 * 8192  # 42 MB of FP8, 84 MB of bf16
KS = (8192, 4096, 2048, 1280, 1024, 512, 256)
PROGS = (1024, 2048, 4096, 16384)
PARTS = os.environ.get("PARTS", "stream,progs,shapes").split(",")
L2_PASS = 128 << 20


@triton.jit
def _stream(w_ptr, out_ptr, n, PER: tl.constexpr, BLOCK: tl.constexpr):
    """Program p reads the int32 elements [p·PER·BLOCK, (p + 1)·PER·BLOCK) and stores their max."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    base = tl.cast(pid, tl.int64) * (PER * BLOCK)
    for i in range(PER):
        idx = base + i * BLOCK + offs
        v = tl.load(w_ptr + idx, mask=idx < n, other=0)
        acc = tl.maximum(acc, v)
    tl.store(out_ptr + pid, tl.max(acc, axis=0))


@triton.jit
def _probe_fp8(
    x_ptr, w_ptr, sw_ptr, out_ptr, part_ptr, lock_ptr, N, K,
    SEGS: tl.constexpr, IPS: tl.constexpr, TILED: tl.constexpr, PREQ: tl.constexpr, EXACT_CAST: tl.constexpr,
    BN: tl.constexpr, BK: tl.constexpr, LOG2_BK: tl.constexpr, SPLIT2: tl.constexpr = False, PDL: tl.constexpr = False,
    COUNTER: tl.constexpr = 0,
):  # fmt: skip
    """`gemv_fp8.fp8_lanes` at one token (K a multiple of BK) with the weight row-major
    `[N, K]` or tile-major `[N/BN, K/BK, BN, BK]` (TILED), then `gemv._finish` (its counter's
    form: COUNTER, `gemv._SPLIT_FORMS`); or (SPLIT2,
    SEGS > 1) the segment's sums stored as partials `[SEGS, N]` with no counter, for
    `_sum_parts` to add in a kernel of its own."""
    NBK: tl.constexpr = BK // 32
    pdl_release(PDL)
    pdl_wait(PDL)
    pid = tl.program_id(0)
    tile = pid // SEGS
    seg = pid % SEGS
    offs_r = tl.arange(0, BN)
    offs_j = tl.arange(0, BK)
    offs_b = tl.arange(0, NBK)
    c0 = tl.cast(seg, tl.int64) * IPS  # the segment's first chunk
    if TILED:
        w_rows = (
            w_ptr
            + (tl.cast(tile, tl.int64) * (K // BK) + c0) * (BN * BK)
            + offs_r[None, :, None] * BK
            + offs_j[None, None, :]
        )
        step = BN * BK
    else:
        w_rows = w_ptr + (tile * BN + offs_r).to(tl.int64)[None, :, None] * K + c0 * BK + offs_j[None, None, :]
        step = BK
    x_rows = x_ptr + (offs_r * 0)[None, :, None] + c0 * BK + offs_j[None, None, :]
    nkb = K // 32
    sw_row = sw_ptr + tl.cast((tile * BN) // 32, tl.int64) * nkb + c0 * NBK + offs_b
    acc = tl.zeros((1, BN, BK), dtype=tl.float32)
    for i in range(IPS):
        wv = tl.load(w_rows + i * step).to(tl.float32)
        xv = tl.load(x_rows + i * BK).to(tl.float32)
        sb = tl.load(sw_row + i * NBK)
        if PREQ:
            sw = _e8m0(sb.to(tl.int32))[None, None, :, None]
            xs = tl.reshape(tl.reshape(xv, (1, BN, NBK, 32)) * sw, (1, BN, BK))
        else:
            v, sx = _quant_block(tl.reshape(xv, (BN * NBK, 32)), EXACT_CAST)
            ss = tl.reshape(sx, (1, BN, NBK)) * _e8m0(sb.to(tl.int32))[None, None, :]
            xs = tl.reshape(tl.reshape(v, (1, BN, NBK, 32)) * ss[:, :, :, None], (1, BN, BK))
        acc = tl.fma(wv, xs, acc)
    if SPLIT2:
        offs_n = tile * BN + offs_r
        tl.store(part_ptr + seg * N + offs_n, tl.reshape(_lane_tree(acc, 1, BN, BK, LOG2_BK), (BN,)))
    else:
        _finish(
            acc,
            out_ptr,
            N,
            part_ptr,
            lock_ptr,
            1,
            N,
            tile,
            seg,
            0,
            1,
            SEGS,
            BN=BN,
            MB=1,
            BK=BK,
            LOG2_BK=LOG2_BK,
            SPLIT=COUNTER,
        )


@triton.jit
def _sum_parts(part_ptr, out_ptr, N, SEGS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[n] = round_bf16(part[0, n] + part[1, n] + … + part[SEGS − 1, n]), left to right
    (`gemv` steps 3-4)."""
    pdl_release(PDL)
    pdl_wait(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    total = tl.load(part_ptr + offs, mask=ok, other=0.0)
    for s in tl.static_range(1, SEGS):
        total += tl.load(part_ptr + s * N + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, round_bf16(total), mask=ok)


def tile_major(w: torch.Tensor, bn: int = 16, bk: int = 256) -> torch.Tensor:
    """[N, K] → the same bytes as [N/bn, K/bk, bn, bk], contiguous."""
    N, K = w.shape
    return w.view(N // bn, bn, K // bk, bk).transpose(1, 2).contiguous()


def main(dev: torch.device) -> None:
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    copy_gbps = 2 * (1 << 30) / (_copy_ms(timer, 1 << 30) * 1e-3) / 1e9  # as `bench`'s ceilings
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy_gbps:.0f} GB/s", flush=True)
    G.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []

    def record(row, fns, check=None):
        try:
            if check is not None:
                bad = check()
                row["bad"] = bad
                if bad:
                    raise AssertionError(f"{bad} outputs differ from the twin")
            t = timer.time_graph(fns)
            row.update(us=t.median_ms * 1e3, gbps=row["bytes"] / (t.median_ms * 1e-3) / 1e9)
            row["pct_copy"] = 100 * row["gbps"] / copy_gbps
            print(f"{row['part']:6s} {row['what']:34s} {row['us']:7.1f} us {row['gbps']:6.0f} GB/s "
                  f"{row['pct_copy']:5.1f}%", flush=True)  # fmt: skip
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            if not isinstance(e, AssertionError):
                traceback.print_exc()
            print(f"{row['part']:6s} {row['what']:34s} FAILED {row['error']}", flush=True)
        rows.append(row)

    def weights(N, K, dtype, n):
        if dtype == FP8:
            out = []
            for _ in range(n):
                w = (torch.randn(N, K, generator=gen, device=dev) * 64).clamp(-448, 448).to(FP8)
                s = torch.randint(118, 124, (-(-N // 32), K // 32), generator=gen, device=dev, dtype=torch.uint8)
                out.append((w, s.view(torch.float8_e8m0fnu)))
            return out
        return [(torch.randn(N, K, generator=gen, device=dev).to(BF), None) for _ in range(n)]

    def gemv_row(part, what, N, K, dtype, xq_kind=False):
        nbytes = N * K * dtype.itemsize
        n = max(1, -(-L2_PASS // nbytes))
        ws = weights(N, K, dtype, n)
        xs = [torch.randn(1, K, generator=gen, device=dev).to(BF) for _ in range(n)]
        xqs = [qdq.fp8_qdq(x) for x in xs] if xq_kind else [None] * n
        outs = [torch.empty(1, N, dtype=BF, device=dev) for _ in range(n)]
        segs = G.plan(N, K, dtype)[1]

        def call(i):
            sc = None if ws[i][1] is None else (ws[i][1],)
            return G.gemv(xs[i], (ws[i][0],), (outs[i],), sc, xq=xqs[i])

        def check():
            call(0)
            got = outs[0].clone()
            twin = torch.empty_like(got)
            sc = None if ws[0][1] is None else (ws[0][1],)
            G.gemv_torch(xs[0], (ws[0][0],), (twin,), sc, xq=xqs[0])
            call(0)
            return int((got.view(torch.int16) != twin.view(torch.int16)).sum()) + int(
                (got.view(torch.int16) != outs[0].view(torch.int16)).sum()
            )

        row = dict(part=part, what=what, N=N, K=K, dtype=str(dtype), segs=segs, bytes=nbytes, copies=n,
                   programs=-(-N // (16)) * segs, target=G._TARGET_PROGRAMS, xq=xq_kind)  # fmt: skip
        record(row, [lambda i=i: call(i) for i in range(n)], check)

    def tiled_rows(name, N, K):
        bk, segs = G.plan(N, K, FP8)
        ips = K // bk // segs
        nbytes = N * K
        n = max(1, -(-L2_PASS // nbytes))
        ws = weights(N, K, FP8, n)
        tws = [tile_major(w) for w, _ in ws]
        xs = [torch.randn(1, K, generator=gen, device=dev).to(BF) for _ in range(n)]
        xqs = [qdq.fp8_qdq(x) for x in xs]
        outs = [torch.empty(1, N, dtype=BF, device=dev) for _ in range(n)]
        part = torch.empty(segs * N, dtype=torch.float32, device=dev)
        lock = torch.zeros(N // 16, dtype=torch.int32, device=dev)
        for preq in (True, False):
            for tiled in (False, True):

                def call(i, preq=preq, tiled=tiled):
                    w = tws[i] if tiled else ws[i][0]
                    _probe_fp8[(N // 16 * segs,)](
                        xqs[i] if preq else xs[i], w, ws[i][1].view(torch.uint8), outs[i], part, lock, N, K,
                        SEGS=segs, IPS=ips, TILED=tiled, PREQ=preq, EXACT_CAST=interpreting(), BN=16, BK=bk, LOG2_BK=8,
                        num_warps=G._WARPS8,
                    )  # fmt: skip

                def check(call=call, preq=preq):
                    call(0)
                    twin = torch.empty_like(outs[0])
                    G.gemv_torch(xs[0], (ws[0][0],), (twin,), (ws[0][1],), xq=xqs[0] if preq else None)
                    return int((outs[0].view(torch.int16) != twin.view(torch.int16)).sum())

                what = f"{name} {'tile-major' if tiled else 'row-major'}{' xq' if preq else ''} segs {segs}"
                row = dict(part="tiled", what=what, N=N, K=K, segs=segs, bytes=nbytes, copies=n, xq=preq, tiled=tiled)
                record(row, [lambda i=i, call=call: call(i) for i in range(n)], check)
            gemv_row("tiled", f"{name} production{' xq' if preq else ''} segs {segs}", N, K, FP8, preq)

    if "tiled" in PARTS:
        for name, (N, K) in (("wo_b", (5120, 8192)), ("wq_b", (32768, 1280)), ("wo_a-size", (2048, 8192))):
            tiled_rows(name, N, K)

    def split2_rows(name, N, K, segs_list):
        bk = G._BK[FP8]
        chunks = K // bk
        nbytes = N * K
        n = max(1, -(-L2_PASS // nbytes))
        ws = weights(N, K, FP8, n)
        xs = [torch.randn(1, K, generator=gen, device=dev).to(BF) for _ in range(n)]
        xqs = [qdq.fp8_qdq(x) for x in xs]
        outs = [torch.empty(1, N, dtype=BF, device=dev) for _ in range(n)]
        lock = torch.zeros(N // 16, dtype=torch.int32, device=dev)
        pdl = pdl_launch(xs[0])
        for segs in segs_list:
            part = torch.empty(segs * N, dtype=torch.float32, device=dev)
            for preq in (True, False):
                for form in ("counter", "release", "launch"):
                    split2 = form == "launch"

                    def call(i, preq=preq, split2=split2, segs=segs, part=part, form=form):
                        _probe_fp8[(N // 16 * segs,)](
                            xqs[i] if preq else xs[i], ws[i][0], ws[i][1].view(torch.uint8), outs[i], part, lock, N, K,
                            SEGS=segs, IPS=chunks // segs, TILED=False, PREQ=preq, EXACT_CAST=interpreting(), BN=16,
                            BK=bk, LOG2_BK=8, SPLIT2=split2, COUNTER=G._SPLIT_FORMS[form] if form != "launch" else 0,
                            num_warps=G._WARPS8, **pdl,
                        )  # fmt: skip
                        if split2:
                            _sum_parts[(-(-N // 256),)](part, outs[i], N, SEGS=segs, BLOCK=256, num_warps=2, **pdl)

                    def check(call=call, preq=preq, segs=segs):
                        call(0)
                        twin = torch.empty_like(outs[0])
                        saved = G._TARGET_PROGRAMS
                        G._TARGET_PROGRAMS = (N // 16) * segs  # the plan with `segs` segments
                        try:
                            assert G.plan(N, K, FP8)[1] == segs
                            G.gemv_torch(xs[0], (ws[0][0],), (twin,), (ws[0][1],), xq=xqs[0] if preq else None)
                        finally:
                            G._TARGET_PROGRAMS = saved
                        return int((outs[0].view(torch.int16) != twin.view(torch.int16)).sum())

                    what = f"{name} segs {segs}{' xq' if preq else ''} {form}"
                    row = dict(
                        part="split2", what=what, N=N, K=K, segs=segs, bytes=nbytes, copies=n, xq=preq, form=form
                    )
                    record(row, [lambda i=i, call=call: call(i) for i in range(n)], check)

    if "split2" in PARTS:
        split2_rows("wo_b", 5120, 8192, (4, 8, 32))
        split2_rows("wq_b", 32768, 1280, (5,))
        split2_rows("wo_a-size", 2048, 8192, (8, 16, 32))

    if "stream" in PARTS:
        for dtype in (FP8, BF) if "stream_bf16" in PARTS else (FP8,):
            nbytes = ELEMS * dtype.itemsize
            n = max(1, -(-L2_PASS // nbytes))
            bufs = [
                torch.randint(0, 1 << 30, (nbytes // 4,), generator=gen, device=dev, dtype=torch.int32)
                for _ in range(n)
            ]
            for per, block in ((4, 512), (16, 512), (4, 2048), (16, 2048), (4, 8192)):
                progs = -(-bufs[0].numel() // (per * block))
                out = torch.empty(progs, dtype=torch.int32, device=dev)

                def run(i, per=per, progs=progs, out=out, bufs=bufs, block=block):
                    _stream[(progs,)](bufs[i], out, bufs[i].numel(), PER=per, BLOCK=block, num_warps=4)

                record(dict(part="stream", what=f"{nbytes >> 20} MiB, {block * 4 // 128} B/thread x {per}, {progs} progs", bytes=nbytes, copies=n),
                       [lambda i=i: run(i) for i in range(n)])  # fmt: skip

    if "progs" in PARTS:
        saved = G._TARGET_PROGRAMS
        try:
            for target in PROGS:
                G._TARGET_PROGRAMS = target
                for name, (N, K) in (("wo_b", (5120, 8192)), ("wq_b", (32768, 1280))):
                    for xq_kind in (False, True):
                        segs = G.plan(N, K, FP8)[1]
                        what = f"{name} fp8{' xq' if xq_kind else ''} target {target} segs {segs}"
                        gemv_row("progs", what, N, K, FP8, xq_kind)
                if time.time() - t0 > float(os.environ.get("BUDGET_S", "240")):
                    break
        finally:
            G._TARGET_PROGRAMS = saved

    if "shapes" in PARTS:
        for dtype in (FP8, BF):
            for K in KS:
                N = ELEMS // K
                segs = G.plan(N, K, dtype)[1]
                gemv_row("shapes", f"[{N}, {K}] {'fp8' if dtype == FP8 else 'bf16'} segs {segs}", N, K, dtype)
            if time.time() - t0 > float(os.environ.get("BUDGET_S", "240")):
                break

    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gemv_shape_probe.json"), "w") as f:
            json.dump(dict(copy_gbps=copy_gbps, rows=rows), f, indent=1)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("gemv_shape_probe needs CUDA")
    main(torch.device("cuda"))
