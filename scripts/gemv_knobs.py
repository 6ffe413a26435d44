# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Sweep of the decode GEMV's lane-loop launch knobs (`kernels/gemv.py`: `_XB`, `_PF`,
`_PDL`, with rows per program and warps) at the V4.1-Flash shapes, bf16 and FP8 weights,
m = 1 (CUDA only; a development tool, not part of `attnv41 bench`).

The knobs are free of the bits, so every variant must give production's outputs byte for
byte (checked before timing; a variant that differs is reported and not timed). Times:
one CUDA graph over copies of the weights past the L2, flushed before each replay
(`bench.common.Timer.time_graph`); with `_PDL` the copies in one graph overlap as a
decode step's kernels would. The "layer chain" rows time the GEMVs of one layer (x pass,
wq_b, wo_a, wo_b) back to back, alone and with a small non-PDL kernel between each, per
knob set. Prints a line per row and a summary; JSON to $OUT/gemv_knobs.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from contextlib import contextmanager

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import gemv as G

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
L2_PASS = 160 << 20
BUDGET_S = float(os.environ.get("BUDGET_S", "200"))
# name: (K, [(N, dtype)]); an fp8 weight carries its e8m0 scales
SHAPES = {
    "wq_b": (1280, [(32768, BF)]),
    "wo_b": (8192, [(5120, BF)]),
    "x->wq_a+wkv+weights_proj": (5120, [(1280, BF), (512, BF), (32, BF)]),
    "cq->wq_b+indexer.wq_b": (1280, [(32768, BF), (4096, BF)]),
    "wq_b fp8": (1280, [(32768, FP8)]),
    "wo_b fp8": (8192, [(5120, FP8)]),
    "x->wq_a+wkv fp8 +weights_proj": (5120, [(1280, FP8), (512, FP8), (32, BF)]),
}
KNOBS = ("_XB", "_XB8", "_PF", "_PDL", "_ACC_ROWS", "_ACC_ROWS8", "_WARPS", "_WARPS8", "_TARGET_PROGRAMS")
# SET=fp8: the fp8 lane loop with x quantized in the weight tile's layout (XB8)
VARIANTS_FP8 = [
    {},
    dict(_XB8=True),
    dict(_XB8=True, _WARPS8=4),
    dict(_XB8=True, _ACC_ROWS8=8),
    dict(_XB8=True, _ACC_ROWS8=8, _WARPS8=1),
    dict(_XB8=True, _ACC_ROWS8=32, _WARPS8=8),
    dict(_XB8=True, _PF=True),
    dict(_XB8=True, _PF=True, _WARPS8=4),
    dict(_XB8=True, _PF=True, _ACC_ROWS8=8),
    dict(_XB8=True, _WARPS=2),
    dict(_XB8=True, _XB=True, _PF=True, _WARPS=2),
    dict(_XB8=True, _ACC_ROWS8=8, _WARPS=2),
    # the split rule (changes the bits: checked against gemv_torch under the same plan)
    dict(_XB8=True, _TARGET_PROGRAMS=512),
    dict(_XB8=True, _TARGET_PROGRAMS=256),
    dict(_XB8=True, _TARGET_PROGRAMS=512, _WARPS=2),
]
SHAPES_FP8 = {
    "wq_b fp8": (1280, [(32768, FP8)]),
    "wo_b fp8": (8192, [(5120, FP8)]),
    "x->wq_a+wkv fp8 +weights_proj": (5120, [(1280, FP8), (512, FP8), (32, BF)]),
    "cq->wq_b+indexer.wq_b fp8": (1280, [(32768, FP8), (4096, FP8)]),
    "indexer.wq_b fp8": (1280, [(4096, FP8)]),
}
VARIANTS = [
    {},
    dict(_XB=True),
    dict(_PF=True),
    dict(_XB=True, _PF=True),
    dict(_XB=True, _PF=True, _ACC_ROWS=32, _WARPS=8),
    dict(_XB=True, _PF=True, _ACC_ROWS=8),
    dict(_XB=True, _PF=True, _WARPS=2),
    dict(_PF=True, _ACC_ROWS8=32, _WARPS8=4),
    dict(_PF=True, _WARPS8=4),
    dict(_XB=True, _PDL=True),
    dict(_XB=True, _PF=True, _PDL=True),
]


@contextmanager
def knobs(cfg: dict):
    saved = {k: getattr(G, k) for k in KNOBS}
    for k, v in cfg.items():
        setattr(G, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(G, k, v)


def label(cfg: dict) -> str:
    return ",".join(f"{k[1:].lower()}={int(v) if isinstance(v, bool) else v}" for k, v in cfg.items()) or "prod"


def copy_rate(dev: torch.device, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy of `nbytes`: (bytes read + written) / time, GB/s."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / (Timer(dev).time(lambda: dst.copy_(src), warmup=3, reps=20).median_ms * 1e-3) / 1e9


def main(dev: torch.device) -> None:
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    copy_gbps = copy_rate(dev)
    p = torch.cuda.get_device_properties(dev)
    print(f"{p.name}, {p.multi_processor_count} SMs; copy {copy_gbps:.0f} GB/s", flush=True)
    G.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []

    def weight(N, K, dt):
        if dt == FP8:
            w = (torch.randn(N, K, generator=gen, device=dev) * 64).clamp(-448, 448).to(FP8)
            s = torch.randint(118, 127, (-(-N // 32), K // 32), generator=gen, device=dev, dtype=torch.uint8)
            return w, s
        return torch.randn(N, K, generator=gen, device=dev).to(dt), None

    def nbytes_of(ws, K, m=1):
        return (
            sum(w.numel() * w.element_size() + (0 if s is None else s.numel()) + 2 * m * w.shape[0] for w, s in ws)
            + 2 * m * K
        )

    def record(row, fns):
        try:
            t = timer.time_graph(fns)
            row.update(us=t.median_ms * 1e3)
            row["pct_copy"] = 100 * row["bytes"] / (t.median_ms * 1e-3) / 1e9 / copy_gbps
            print(
                f"{row['name']:34s} {row['cfg']:44s} {row['us']:8.2f} us {row['pct_copy']:5.1f}% copy segs {row.get('segs')}",
                flush=True,
            )
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:300]
            traceback.print_exc()
            print(f"{row['name']:34s} {row['cfg']:44s} FAILED {row['error']}", flush=True)
        rows.append(row)

    fp8_set = os.environ.get("SET") == "fp8"
    for name, (K, specs) in (SHAPES_FP8 if fp8_set else SHAPES).items():
        one = [weight(N, K, dt) for N, dt in specs]
        nb = nbytes_of(one, K)
        n = max(2, min(16, -(-L2_PASS // nb)))
        sets = [one] + [[weight(N, K, dt) for N, dt in specs] for _ in range(n - 1)]
        xs = [torch.randn(1, K, generator=gen, device=dev).to(BF) for _ in range(n)]
        outs = [
            [torch.empty(1, w.shape[0], dtype=BF if w.dtype == FP8 else w.dtype, device=dev) for w, _ in s]
            for s in sets
        ]

        def call(i):
            return G.gemv(xs[i], [w for w, _ in sets[i]], outs[i], [s for _, s in sets[i]])

        call(0)
        torch.cuda.synchronize()
        ref = [o.clone() for o in outs[0]]
        seen = set()
        for cfg in VARIANTS_FP8 if fp8_set else VARIANTS:
            if cfg and time.time() - t0 > BUDGET_S:
                continue
            # the knobs that act on these weights (XB, ACC_ROWS, WARPS: bf16 and fp32 weights
            # and mixed launches; ACC_ROWS8: fp8 weights; WARPS8: launches of fp8 weights only)
            has8, has16 = any(dt == FP8 for _, dt in specs), any(dt != FP8 for _, dt in specs)
            drop = set()
            if not has16:
                drop |= {"_XB", "_ACC_ROWS", "_WARPS"}
            if not has8:
                drop |= {"_ACC_ROWS8", "_XB8"}
            if has16 or not has8:
                drop |= {"_WARPS8"}
            cfg = {k: v for k, v in cfg.items() if k not in drop}
            if tuple(sorted(cfg.items())) in seen:
                continue
            seen.add(tuple(sorted(cfg.items())))
            row = dict(name=name, cfg=label(cfg), bytes=nb, copies=n)
            with knobs(cfg):
                row["segs"] = [G.plan(w.shape[0], K, w.dtype)[1] for w, _ in one]
            with knobs(cfg):
                try:
                    for o in outs[0]:
                        o.fill_(float("nan"))
                    call(0)
                    torch.cuda.synchronize()
                    want = ref
                    if "_TARGET_PROGRAMS" in cfg:  # another split: the order twin under this plan
                        want = [torch.empty_like(o) for o in outs[0]]
                        G.gemv_torch(xs[0], [w for w, _ in sets[0]], want, [s for _, s in sets[0]])
                    same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(want, outs[0]))
                except Exception as e:
                    traceback.print_exc()
                    same, row["error"] = False, f"{type(e).__name__}: {e}"[:300]
                if not same:
                    row.setdefault("error", "outputs differ from production")
                    print(f"{name:34s} {row['cfg']:44s} NOT TIMED: {row['error']}", flush=True)
                    rows.append(row)
                    continue
                record(row, [lambda i=i: call(i) for i in range(n)])
        torch.cuda.empty_cache()

    if fp8_set:
        return summary(rows, t0, p, copy_gbps)
    # one layer's GEMVs back to back (x pass, wq_b, wo_a grouped, wo_b), bf16 weights
    copies = 4
    lay = []
    for _ in range(copies):
        lay.append(
            dict(
                x=torch.randn(1, 5120, generator=gen, device=dev).to(BF),
                xp=[weight(1280, 5120, BF)[0], weight(512, 5120, BF)[0]],
                wq_b=weight(32768, 1280, BF)[0],
                wo_a=torch.randn(8, 1024, 4096, generator=gen, device=dev).to(BF),
                wo_b=weight(5120, 8192, BF)[0],
            )
        )
    cq = torch.randn(1, 1280, generator=gen, device=dev).to(BF)
    o = torch.randn(1, 8, 4096, generator=gen, device=dev).to(BF)
    u = torch.randn(1, 8192, generator=gen, device=dev).to(BF)
    bufs = dict(
        qa=torch.empty(1, 1280, dtype=BF, device=dev),
        kv=torch.empty(1, 512, dtype=BF, device=dev),
        q=torch.empty(1, 32768, dtype=BF, device=dev),
        oa=torch.empty(1, 8, 1024, dtype=BF, device=dev),
        y=torch.empty(1, 5120, dtype=BF, device=dev),
    )
    small = torch.zeros(1024, device=dev)
    lay_bytes = 2 * (5120 * 1792 + 32768 * 1280 + 8 * 1024 * 4096 + 5120 * 8192)

    def layer(i, between):
        L = lay[i]
        G.gemv(L["x"], L["xp"], (bufs["qa"], bufs["kv"]))
        if between:
            small.add_(1.0)
        G.gemv(cq, (L["wq_b"],), (bufs["q"],))
        if between:
            small.add_(1.0)
        G.group_gemv(o, L["wo_a"], bufs["oa"])
        if between:
            small.add_(1.0)
        G.gemv(u, (L["wo_b"],), (bufs["y"],))
        if between:
            small.add_(1.0)

    for cfg in [{}, dict(_XB=True, _PF=True), dict(_XB=True, _PF=True, _PDL=True), dict(_XB=True, _PDL=True)]:
        for between in (False, True):
            with knobs(cfg):
                row = dict(
                    name="layer chain" + (" +small" if between else ""), cfg=label(cfg), bytes=lay_bytes, copies=copies
                )
                record(row, [lambda i=i: layer(i, between) for i in range(copies)])

    summary(rows, t0, p, copy_gbps)


def summary(rows, t0, p, copy_gbps) -> None:
    print("\n== summary (µs, % of copy bandwidth)")
    for r in rows:
        if "us" in r:
            print(f"| {r['name']} | {r['cfg']} | {r['us']:.2f} | {r['pct_copy']:.1f} | {r.get('segs')} |")
    print(f"\n{time.time() - t0:.0f} s in all")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gemv_knobs.json"), "w") as f:
            json.dump(dict(device=p.name, copy_gbps=copy_gbps, rows=rows), f, indent=1)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("gemv_knobs.py: needs a CUDA device")
    main(torch.device("cuda"))
