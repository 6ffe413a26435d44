# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Sweep of the FP8-weight decode GEMVs at the V4.1-Flash shapes (CUDA only; a development
tool, not part of `attnv41 bench`).

For m = 1 (and the production rows at m = 16): each FP8 projection alone (and, at m = 1,
reading the input's round trip `xq` made outside: alone, and after one `fp8_qdq` launch) through
`fp8_linear.fp8_mm` (the lane-sum launch of `gemv`, kernels/gemv_fp8.py), its knobs one at
a time (rows per program, warps, stages; BK changes the bits), and the fused x → wq_a +
wkv (+ the bf16 indexer.weights_proj) launch against the separate calls. (The per-block
launch it replaced, compared here until commit 91e58c4: BENCHMARKS.md, 2026-12-01 late
night.) Every variant is first checked:
the production lanes rows bit for bit against `gemv.gemv_torch` (the kernel's order in
torch), launch-shape variants bit for bit against production, the rest against the
reference `fp8_linear` within the kernel tests' bound; and equal bits on a second call.
Times: one CUDA graph over copies of the weights past the 50 MB L2, flushed before each
replay. Prints a line per row; JSON to $OUT/fp8_gemv_tune.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from contextlib import contextmanager

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import fp8_linear as F
from attnv41.kernels import gemv as G
from attnv41.kernels import qdq
from attnv41.reference.fp8 import fp8_linear

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
SHAPES = {
    "wq_a": (5120, 1280),
    "wkv": (5120, 512),
    "wq_b": (1280, 32768),
    "wo_b": (8192, 5120),
    "indexer.wq_b": (1280, 4096),
}  # fmt: skip  name: (K, N)
PROD = dict(acc8=G._ACC_ROWS8, warps=G._WARPS8, stages=G._STAGES, bk8=G._BK[FP8])
SWEEP = [dict(acc8=32), dict(warps=1), dict(warps=4), dict(acc8=8), dict(acc8=32, warps=4), dict(acc8=8, warps=1),
         dict(stages=1), dict(stages=4), dict(bk8=128), dict(bk8=512)]  # fmt: skip
# the input's round trip made outside (`xq=`): read as it is ("xq"), or made by one fp8_qdq
# launch in the same graph ("qdq+xq"), with launch knobs (same bits)
PREQ_SWEEP = [dict(acc8=32), dict(warps=4), dict(acc8=32, warps=4), dict(acc8=8), dict(warps=1), dict(acc8=32, warps=8)]
KINDS = os.environ.get("KINDS", "lanes,xq,qdq+xq").split(",")
BUDGET_S = float(os.environ.get("BUDGET_S", "150"))
L2_PASS = 128 << 20


@contextmanager
def config(cfg: dict):
    c = {**PROD, **cfg}
    saved = (G._ACC_ROWS8, G._WARPS8, G._STAGES, G._BK[FP8])
    G._ACC_ROWS8, G._WARPS8, G._STAGES, G._BK[FP8] = c["acc8"], c["warps"], c["stages"], c["bk8"]
    try:
        yield
    finally:
        G._ACC_ROWS8, G._WARPS8, G._STAGES, G._BK[FP8] = saved


def bad_vs_reference(x, w, s, got) -> int:
    """Outputs off the reference by more than the kernel tests' bound (one bf16 ulp + K·2^-24·Σ|terms|,
    with Σ|terms| bounded by |x|·|w|·max scales), plus NaNs."""
    ref = fp8_linear(x, w, s).double()
    sw = s.view(torch.uint8).double().sub(127).exp2().max()
    A = (x.double().abs() * 1.01) @ w.double().abs().t() * sw
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0**-126))) - 7)
    bound = ulp + x.shape[1] * 2.0**-24 * A
    return int(((got.double() - ref).abs() > bound).sum()) + int(torch.isnan(got.float()).sum())


def copy_rate(timer: Timer, dev: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of `nbytes` (20× the L2): (bytes read + written) / time."""
    a = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    return 2 * nbytes / (timer.time(lambda: b.copy_(a), warmup=3, reps=20).median_ms * 1e-3) / 1e9


def main(dev: torch.device) -> None:
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    copy_gbps = copy_rate(timer, dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy_gbps:.0f} GB/s", flush=True)
    F.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []

    def fp8_weight(N, K):
        w = (torch.randn(N, K, generator=gen, device=dev) * 64).clamp(-448, 448).to(FP8)
        s = torch.randint(118, 124, (-(-N // 32), K // 32), generator=gen, device=dev, dtype=torch.uint8)
        return w, s.view(torch.float8_e8m0fnu)

    def record(row, fns, check=None):
        try:
            if check is not None:
                bad, det = check()
                row.update(bad=bad, deterministic=det)
                if bad or not det:
                    raise AssertionError(f"{bad} outputs off, deterministic={det}")
            t = timer.time_graph(fns)
            row.update(us=t.median_ms * 1e3, gbps=row["bytes"] / (t.median_ms * 1e-3) / 1e9)
            row["pct_copy"] = 100 * row["gbps"] / copy_gbps
            print(f"{row['name']:30s} m={row['m']:2d} {row['kind']:6s} {row['cfg']:22s} {row['us']:7.1f} us "
                  f"{row['gbps']:6.0f} GB/s {row['pct_copy']:5.1f}%", flush=True)  # fmt: skip
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            if not isinstance(e, AssertionError):
                traceback.print_exc()
            print(f"{row['name']:30s} m={row['m']:2d} {row['kind']:6s} {row['cfg']:22s} SKIPPED {row['error']}")
        rows.append(row)

    def label(cfg):
        return "prod" if not cfg else ",".join(f"{k}={v}" for k, v in cfg.items())

    for m, sweep in ((1, SWEEP), (16, [])):
        for name, (K, N) in SHAPES.items():
            nbytes = N * K + N * K // 1024 + 2 * m * (K + N)
            n = max(1, min(16, -(-L2_PASS // nbytes)))
            xs = [torch.randn(m, K, generator=gen, device=dev).to(BF) for _ in range(n)]
            ws = [fp8_weight(N, K) for _ in range(n)]
            outs = [torch.empty(m, N, dtype=BF, device=dev) for _ in range(n)]
            base = dict(name=name, m=m, bytes=nbytes, copies=n)
            xqs = [qdq.fp8_qdq(x) for x in xs]
            prod_out = None
            runs = [("lanes", {})] + [("lanes", c) for c in sweep if "lanes" in KINDS]
            if m == 1:
                runs += [(k, {}) for k in ("xq", "qdq+xq") if k in KINDS]
                runs += [("xq", c) for c in PREQ_SWEEP if "xq" in KINDS]
            for kind, cfg in runs:
                if cfg and time.time() - t0 > BUDGET_S:
                    continue
                with config(cfg):

                    def call(i):
                        if kind == "xq":
                            return F.fp8_mm(xs[i], ws[i][0], ws[i][1], outs[i], xq=xqs[i])
                        if kind == "qdq+xq":
                            return F.fp8_mm(xs[i], ws[i][0], ws[i][1], outs[i], xq=qdq.fp8_qdq(xs[i], out=xqs[i]))
                        return F.fp8_mm(xs[i], ws[i][0], ws[i][1], outs[i])

                    def check():
                        nonlocal prod_out
                        first = call(0).clone()
                        det = torch.equal(first.view(torch.int16), call(0).view(torch.int16))
                        if kind in ("xq", "qdq+xq") and "bk8" not in cfg and prod_out is not None:
                            bad = int((first.view(torch.int16) != prod_out.view(torch.int16)).sum())
                        elif kind == "lanes" and not cfg:
                            twin = torch.empty_like(first)
                            G.gemv_torch(xs[0], (ws[0][0],), (twin,), (ws[0][1],))
                            prod_out = first
                            bad = int((first.view(torch.int16) != twin.view(torch.int16)).sum())
                        elif kind == "lanes" and "bk8" not in cfg and prod_out is not None:
                            bad = int((first.view(torch.int16) != prod_out.view(torch.int16)).sum())
                        else:
                            bad = bad_vs_reference(xs[0], ws[0][0], ws[0][1], first)
                        return bad, det

                    record({**base, "kind": kind, "cfg": label(cfg)}, [lambda i=i: call(i) for i in range(n)], check)
            torch.cuda.empty_cache()
        # fused x -> wq_a + wkv (+ weights_proj, bf16) against separate calls
        K = 5120
        for extra in (False, True):
            nm = "x->wq_a+wkv" + ("+weights_proj" if extra else "")
            specs = [(1280, FP8), (512, FP8)] + ([(32, BF)] if extra else [])
            nbytes = sum(N * K * dt.itemsize for N, dt in specs) + 2 * m * K
            n = max(1, min(16, -(-L2_PASS // nbytes)))
            xs = [torch.randn(m, K, generator=gen, device=dev).to(BF) for _ in range(n)]
            ws, scs = [], []
            for _ in range(n):
                pairs = [fp8_weight(N, K) if dt == FP8 else (torch.randn(N, K, generator=gen, device=dev).to(BF), None)
                         for N, dt in specs]  # fmt: skip
                ws.append(tuple(p[0] for p in pairs))
                scs.append(tuple(p[1] for p in pairs))
            outs = [tuple(torch.empty(m, N, dtype=BF, device=dev) for N, _ in specs) for _ in range(n)]
            base = dict(name=nm, m=m, bytes=nbytes, copies=n)

            def sep(i):
                for w, sc, o in zip(ws[i], scs[i], outs[i]):
                    F.fp8_mm(xs[i], w, sc, o) if sc is not None else G.mm_auto(xs[i], w, o)

            with config({}):
                record({**base, "kind": "lanes", "cfg": "separate calls"}, [lambda i=i: sep(i) for i in range(n)])

                def fused_check():
                    G.gemv(xs[0], ws[0], outs[0], scs[0])
                    first = [o.clone() for o in outs[0]]
                    sep(0)
                    bad = sum(int((a.view(torch.int16) != b.view(torch.int16)).sum()) for a, b in zip(first, outs[0]))
                    return bad, True

                record({**base, "kind": "lanes", "cfg": "one launch"},
                       [lambda i=i: G.gemv(xs[i], ws[i], outs[i], scs[i]) for i in range(n)], fused_check)  # fmt: skip
                if m == 1:
                    xqs = [qdq.fp8_qdq(x) for x in xs]

                    def xq_check():
                        G.gemv(xs[0], ws[0], outs[0], scs[0])
                        first = [o.clone() for o in outs[0]]
                        G.gemv(xs[0], ws[0], outs[0], scs[0], xq=xqs[0])
                        bad = sum(
                            int((a.view(torch.int16) != b.view(torch.int16)).sum()) for a, b in zip(first, outs[0])
                        )
                        return bad, True

                    record({**base, "kind": "qdq+xq", "cfg": "one launch"},
                           [lambda i=i: G.gemv(xs[i], ws[i], outs[i], scs[i], xq=qdq.fp8_qdq(xs[i], out=xqs[i]))
                            for i in range(n)], xq_check)  # fmt: skip
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_gemv_tune.json"), "w") as f:
            json.dump(dict(copy_gbps=copy_gbps, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(torch.device("cuda"))
