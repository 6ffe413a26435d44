# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Sweep of the decode GEMVs (`kernels.gemv`) at the V4.1-Flash shapes (CUDA only; a
development tool, not part of `attnv41 bench`).

For m = 1 and 16: every projection alone, the fused launches the runtime would make
(x → wq_a+wkv, +indexer.weights_proj, +the fp32 compressor pair; cq → wq_b+indexer.wq_b)
and the grouped wo_a, each with the production config, then (m = 1: one knob at a time;
m = 16: the token-block shapes) BK, row tile, split count, warps and stages; beside them
cuBLAS as the runtime calls it today (`linear.mm`, `linear.group_mm` with its copy).
Every variant is first checked against `linear.mm_exact` on the GPU (the kernel tests'
bound) and for equal bits on a second call; a variant that fails or raises is printed and
not timed. Times: one CUDA graph over enough copies of the weights to pass the 50 MB L2,
the L2 flushed before each replay (`bench.common.Timer.time_graph`). Prints one line per
row and a Markdown table (µs, GB/s, % of the copy bandwidth measured here); JSON to
$OUT/gemv_tune.json when OUT is set. About 2-3 minutes on an H200 (mostly compiles); past
BUDGET_S (default 150 s) the remaining sweep variants are skipped, never the production
rows.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from contextlib import contextmanager

import torch

from attnv41.bench.common import Timer, markdown_table
from attnv41.kernels import gemv as G
from attnv41.kernels import linear

BF, F32 = torch.bfloat16, torch.float32
SINGLE = {  # name: (K, N, dtype)
    "wq_a": (5120, 1280, BF),
    "wkv": (5120, 512, BF),
    "indexer.weights_proj": (5120, 32, BF),
    "compressor.wkv (fp32)": (5120, 512, F32),
    "indexer.wq_b": (1280, 4096, BF),
    "wq_b": (1280, 32768, BF),
    "wo_b": (8192, 5120, BF),
}
FUSED = {  # name: (K, [weights of SINGLE])
    "x->wq_a+wkv": (5120, ["wq_a", "wkv"]),
    "x->wq_a+wkv+weights_proj": (5120, ["wq_a", "wkv", "indexer.weights_proj"]),
    "x->wq_a+wkv+weights_proj+compressor(2xfp32)": (
        5120,
        ["wq_a", "wkv", "indexer.weights_proj", "compressor.wkv (fp32)", "compressor.wkv (fp32)"],
    ),
    "cq->wq_b+indexer.wq_b": (1280, ["wq_b", "indexer.wq_b"]),
}
WO_A = (8, 1024, 4096)  # G, r, gw
HEAD_DIM = 512
# The knobs (kernels/gemv.py): BK of bf16 and fp32 weights, MB·BN fp32 lane-sum rows per
# program, most tokens per program, warps, stages, and a factor on the plan's split count.
PROD = dict(bk16=G._BK[BF], bk32=G._BK[F32], acc=G._ACC_ROWS, mb=G._MB_MAX, warps=G._WARPS, stages=G._STAGES, segs=1.0)
SWEEP_M1 = [dict(bk16=128, bk32=64), dict(bk16=512, bk32=256), dict(acc=8), dict(acc=32), dict(warps=2),
            dict(warps=8), dict(stages=1), dict(segs=0.5), dict(segs=2.0)]  # fmt: skip
SWEEP_M16 = [dict(mb=1), dict(mb=2), dict(mb=8, acc=32), dict(acc=32), dict(warps=8)]
BUDGET_S = float(os.environ.get("BUDGET_S", "140"))
L2_PASS = 128 << 20  # weight bytes per graph replay: past the 50 MB L2


def _divisor_near(n: int, want: float) -> int:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return min(ds, key=lambda d: (abs(math.log(d / want)), d))


@contextmanager
def config(cfg: dict):
    """The module's knobs set to `cfg` (PROD for the missing ones), restored after."""
    c = {**PROD, **cfg}
    saved = (dict(G._BK), G._ACC_ROWS, G._MB_MAX, G._WARPS, G._STAGES, G.plan)
    base = G.plan
    G._BK[BF], G._BK[F32] = c["bk16"], c["bk32"]
    G._ACC_ROWS, G._MB_MAX, G._WARPS, G._STAGES = c["acc"], c["mb"], c["warps"], c["stages"]
    if c["segs"] != 1.0:

        def plan(N, K, dtype):
            bk, s = base(N, K, dtype)
            return bk, _divisor_near(-(-K // bk), s * c["segs"])

        G.plan = plan
    try:
        yield c
    finally:
        G._BK.clear()
        G._BK.update(saved[0])
        G._ACC_ROWS, G._MB_MAX, G._WARPS, G._STAGES, G.plan = saved[1:]


def bad_outputs(x: torch.Tensor, w: torch.Tensor, got: torch.Tensor, plan: tuple[int, int] | None = None) -> int:
    """Outputs outside the kernel tests' bound against fp64 (tests/kernels/test_gemv.py),
    plus NaNs; for 4 tokens at most. `plan`: (BK, SEGS), default `G.plan` of w."""
    x, got = x[:4], got[:4]
    bk, segs = plan or G.plan(w.shape[0], x.shape[1], w.dtype)
    d = -(-x.shape[1] // bk) // segs + int(math.log2(bk)) + segs + 1
    xd, wd = x.double(), w.double()
    ref = (xd @ wd.t()).to(got.dtype).double()
    A = xd.abs() @ wd.abs().t()
    rel = 2.0**-7 if got.dtype == BF else 2.0**-23
    bound = rel * ref.abs() + 1.03 * d * 2.0**-24 * A + 2.0**-126
    return int(((got.double() - ref).abs() > bound).sum()) + int(torch.isnan(got.float()).sum())


def copies_for(nbytes: int) -> int:
    return max(1, min(16, -(-L2_PASS // nbytes)))


def measure_copy_gbps(dev: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of `nbytes` (20× the L2): (bytes read + written) / time."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = Timer(dev).time(lambda: dst.copy_(src), warmup=3, reps=20)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def main(dev: torch.device) -> None:
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    copy_gbps = measure_copy_gbps(dev)
    p = torch.cuda.get_device_properties(dev)
    print(f"{p.name}, {p.multi_processor_count} SMs; copy {copy_gbps:.0f} GB/s", flush=True)
    G.prepare(dev)
    rows: list[dict] = []
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, dtype=BF):
        return torch.randn(*shape, generator=gen, device=dev).to(dtype)

    def record(row: dict, fn=None, check=None) -> None:
        """Check (`check()` → bad outputs, deterministic), then time the graph of `fn`."""
        try:
            if check is not None:
                bad, det = check()
                row.update(bad=bad, deterministic=det)
                if bad or not det:
                    raise AssertionError(f"{bad} outputs outside the bound, deterministic={det}")
            t = timer.time_graph(fn)
            row.update(us=t.median_ms * 1e3, us_min=t.min_ms * 1e3)
            row["gbps"] = row["bytes"] / (t.median_ms * 1e-3) / 1e9
            row["pct_copy"] = 100 * row["gbps"] / copy_gbps
            row["x_floor"] = t.median_ms * 1e-3 / (row["bytes"] / (copy_gbps * 1e9))
        except Exception as e:  # a failing config is reported and skipped
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            if not isinstance(e, AssertionError):
                traceback.print_exc()
        rows.append(row)
        if "us" in row:
            print(f"{row['name']:44s} m={row['m']:2d} {row['kind']:7s} {row['cfg']:34s} {row['us']:8.1f} us "
                  f"{row['gbps']:7.0f} GB/s {row['pct_copy']:5.1f}% copy", flush=True)  # fmt: skip
        else:
            print(
                f"{row['name']:44s} m={row['m']:2d} {row['kind']:7s} {row['cfg']:34s} SKIPPED {row['error']}",
                flush=True,
            )

    def gemv_rows(name: str, m: int, K: int, specs: list[tuple[int, torch.dtype]], sweep: list[dict]) -> None:
        nbytes = sum(N * K * dt.itemsize + m * N * dt.itemsize for N, dt in specs) + 2 * m * K
        n = copies_for(nbytes)
        xs = [rand(m, K) for _ in range(n)]
        ws = [tuple(rand(N, K, dtype=dt) for N, dt in specs) for _ in range(n)]
        outs = [tuple(torch.empty(m, N, dtype=dt, device=dev) for N, dt in specs) for _ in range(n)]
        base = dict(name=name, m=m, bytes=nbytes, copies=n)
        record({**base, "kind": "cublas", "cfg": "torch.mm per weight"},
               [lambda i=i: [linear.mm(xs[i], w, o) for w, o in zip(ws[i], outs[i])] for i in range(n)])  # fmt: skip
        for j, cfg in enumerate([{}] + sweep):
            label = "prod" if not cfg else ",".join(f"{k}={v}" for k, v in cfg.items())
            if j and time.time() - t0 > BUDGET_S:
                rows.append({**base, "kind": "gemv", "cfg": label, "error": "skipped: time budget"})
                continue
            with config(cfg):
                segs = [G.plan(N, K, dt)[1] for N, dt in specs]

                def check():
                    G.gemv(xs[0], ws[0], outs[0])
                    timer.sync()
                    first = [o.clone() for o in outs[0]]
                    bad = sum(bad_outputs(xs[0], w, o) for w, o in zip(ws[0], outs[0]))
                    G.gemv(xs[0], ws[0], outs[0])
                    det = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(first, outs[0]))
                    return bad, det

                record({**base, "kind": "gemv", "cfg": label, "segs": segs},
                       [lambda i=i: G.gemv(xs[i], ws[i], outs[i]) for i in range(n)], check)  # fmt: skip
        torch.cuda.empty_cache()

    def group_rows(m: int, sweep: list[dict]) -> None:
        Gn, r, gw = WO_A
        nbytes = 2 * (Gn * r * gw + m * Gn * r + m * Gn * gw)
        n = copies_for(nbytes)
        heads = Gn * gw // HEAD_DIM  # o: a view of the attention output [m, heads, HEAD_DIM]
        os_ = [rand(m, heads, HEAD_DIM).view(m, Gn, gw) for _ in range(n)]
        ws = [rand(Gn, r, gw) for _ in range(n)]
        outs = [torch.empty(m, Gn, r, dtype=BF, device=dev) for _ in range(n)]
        base = dict(name="wo_a (grouped)", m=m, bytes=nbytes, copies=n)
        record({**base, "kind": "cublas", "cfg": "bmm + copy (linear.group_mm)"},
               [lambda i=i: linear.group_mm(os_[i], ws[i], outs[i]) for i in range(n)])  # fmt: skip
        for j, cfg in enumerate([{}] + sweep):
            label = "prod" if not cfg else ",".join(f"{k}={v}" for k, v in cfg.items())
            if j and time.time() - t0 > BUDGET_S:
                rows.append({**base, "kind": "gemv", "cfg": label, "error": "skipped: time budget"})
                continue
            with config(cfg):

                def check():
                    G.group_gemv(os_[0], ws[0], outs[0])
                    timer.sync()
                    first = outs[0].clone()
                    pl = G.plan(Gn * r, gw, BF)
                    bad = sum(bad_outputs(os_[0][:, g], ws[0][g], outs[0][:, g], pl) for g in range(Gn))
                    G.group_gemv(os_[0], ws[0], outs[0])
                    return bad, torch.equal(first.view(torch.int16), outs[0].view(torch.int16))

                record({**base, "kind": "gemv", "cfg": label, "segs": [G.plan(Gn * r, gw, BF)[1]]},
                       [lambda i=i: G.group_gemv(os_[i], ws[i], outs[i]) for i in range(n)], check)  # fmt: skip
        torch.cuda.empty_cache()

    for m in (1, 16):
        sweep = SWEEP_M1 if m == 1 else SWEEP_M16
        for name, (K, N, dt) in SINGLE.items():
            gemv_rows(name, m, K, [(N, dt)], sweep if name != "indexer.weights_proj" else [])
        for name, (K, names) in FUSED.items():
            gemv_rows(name, m, K, [SINGLE[s][1:] for s in names], [dict(acc=32)] if m == 1 else [])
        group_rows(m, sweep)

    cols = [("name", "weights"), ("m", "m"), ("kind", "kind"), ("cfg", "config"), ("segs", "SEGS"),
            ("us", "µs"), ("gbps", "GB/s"), ("pct_copy", "% copy"), ("x_floor", "× floor"), ("error", "note")]  # fmt: skip
    table = [{**r, "segs": ",".join(map(str, r["segs"])) if "segs" in r else None} for r in rows]
    print(f"\ncopy bandwidth {copy_gbps:.0f} GB/s (measured here); floor = bytes / copy bandwidth\n")
    print(markdown_table(table, cols))
    print("\n== best gemv config per (weights, m), beside cuBLAS")
    best: dict = {}
    blas: dict = {}
    for r in rows:
        if "us" not in r:
            continue
        k = (r["name"], r["m"])
        if r["kind"] == "cublas":
            blas[k] = r["us"]
        elif k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    for (n, m), r in best.items():
        print(f"{n:44s} m={m:2d} {r['cfg']:34s} {r['us']:8.1f} us {r['pct_copy']:5.1f}% copy "
              f"(cuBLAS {blas.get((n, m), float('nan')):.1f} us)")  # fmt: skip
    print(f"\n{time.time() - t0:.0f} s in all")
    if os.environ.get("OUT"):
        path = os.path.join(os.environ["OUT"], "gemv_tune.json")
        res = {"device": p.name, "sms": p.multi_processor_count, "copy_gbps": copy_gbps, "prod": PROD, "rows": rows}
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("gemv_tune.py: needs a CUDA device")
    main(torch.device("cuda"))
