# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Probe: the decode GEMV's chunk loads software-pipelined through shared memory
(`gemv._LOOP_STAGES` / `_LOOP_STAGES8`: `tl.range(num_stages=)`, cp.async, so the bytes in
flight hold no registers), and fp8 weights reading x's round trip once per token instead of
once per weight row (`gemv._X1`), with the row tile and warps around them. Launch shapes
only: every variant must give the production bytes (checked before timing). Flash shapes,
m = 1, weights cold: one CUDA graph over
copies past the L2, flushed before each replay. CUDA only. JSON to $OUT/gemv_pipe_probe.json.

Run at commit 19ab969: gemv._LOOP_STAGES, _LOOP_STAGES8 and _X1 were removed after the run (measured no gain; BENCHMARKS.md,
2026-12-04 fourteenth entry), so this probe no longer runs on later code: a record.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import gemv as G
from attnv41.kernels import qdq
from attnv41.reference.fp8 import quant_weight

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
SHAPES = {
    "wq_a": (5120, 1280),
    "wkv": (5120, 512),
    "wq_b": (1280, 32768),
    "wo_b": (8192, 5120),
    "indexer.wq_b": (1280, 4096),
}  # fmt: skip  name: (K, N)
KNOBS = ("_LOOP_STAGES", "_LOOP_STAGES8", "_X1", "_ACC_ROWS", "_ACC_ROWS8", "_WARPS", "_WARPS8")
CFG8 = [{}, dict(s8=2), dict(s8=3), dict(s8=4), dict(s8=3, x1=1), dict(s8=2, x1=1), dict(s8=4, x1=1),
        dict(x1=1), dict(s8=3, x1=1, acc8=32), dict(s8=3, x1=1, w8=4), dict(s8=3, x1=1, acc8=32, w8=4),
        dict(s8=3, acc8=32, w8=4), dict(s8=3, w8=4), dict(s8=4, x1=1, acc8=8)]  # fmt: skip
CFG16 = [{}, dict(s=2), dict(s=3), dict(s=4), dict(s=3, acc=32), dict(s=3, w=8, acc=32), dict(s=3, w=2),
         dict(s=4, acc=32, w=8), dict(s=3, acc=8, w=2)]  # fmt: skip
NAMES = dict(
    s="_LOOP_STAGES", s8="_LOOP_STAGES8", x1="_X1", acc="_ACC_ROWS", acc8="_ACC_ROWS8", w="_WARPS", w8="_WARPS8"
)
BUDGET_S = float(os.environ.get("BUDGET_S", "240"))
L2_PASS = 128 << 20


@contextmanager
def config(cfg: dict):
    saved = {k: getattr(G, k) for k in KNOBS}
    for k, v in cfg.items():
        setattr(G, NAMES[k], bool(v) if k == "x1" else v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(G, k, v)


def main(dev: torch.device) -> None:
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    a = torch.ones(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy = 2 * a.numel() / (timer.time(lambda: b.copy_(a), warmup=3, reps=20).median_ms * 1e-3) / 1e9
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s", flush=True)
    G.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []

    def weight(N, K, kind):
        w = (torch.randn(N, K, generator=gen, device=dev) * K**-0.5).to(BF)
        return (w, None) if kind == "bf16" else quant_weight(w)

    cases = []  # (name, kind, m, nbytes, make) make(n) -> list of calls
    m = 1  # the runtime's GEMV calls (gemv.AUTO_MAX_M)
    for kind in ("fp8+xq", "fp8", "bf16"):
        for name, (K, N) in SHAPES.items():
            cases.append((name, kind, m, K, N))
        if kind != "fp8+xq":
            cases.append(("wo_a group", kind, m, 4096, 8 * 1024))
    for name, kind, m, K, N in cases:
        wbytes = N * K * (2 if kind == "bf16" else 1)
        n = max(1, min(16, -(-L2_PASS // wbytes)))
        ws = [weight(N, K, kind.split("+")[0]) for _ in range(n)]
        grouped = name == "wo_a group"
        if grouped:
            xs = [torch.randn(m, 8, K, generator=gen, device=dev).to(BF) for _ in range(n)]
            outs = [torch.empty(m, 8, N // 8, dtype=BF, device=dev) for _ in range(n)]
            ws = [(w.view(8, N // 8, K), s) for w, s in ws]
        else:
            xs = [torch.randn(m, K, generator=gen, device=dev).to(BF) for _ in range(n)]
            outs = [torch.empty(m, N, dtype=BF, device=dev) for _ in range(n)]
        xqs = [qdq.fp8_qdq(x) for x in xs] if kind == "fp8+xq" else [None] * n

        def call(i):
            w, s = ws[i]
            if grouped:
                return G.group_gemv(xs[i], w, outs[i], s)
            return G.gemv(xs[i], (w,), (outs[i],), (s,), xq=xqs[i])[0]

        prod = None
        for cfg in CFG16 if kind == "bf16" else CFG8:
            if cfg and time.time() - t0 > BUDGET_S:
                continue
            label = ",".join(f"{k}={v}" for k, v in cfg.items()) or "prod"
            row = dict(name=name, kind=kind, m=m, cfg=label, bytes=wbytes)
            try:
                with config(cfg):
                    first = call(0).clone()
                    again = call(0).clone()
                    if prod is None:
                        prod = first
                    bad = int((first.view(torch.int16) != prod.view(torch.int16)).sum())
                    det = torch.equal(first, again)
                    if bad or not det or torch.isnan(first.float()).any():
                        raise AssertionError(f"{bad} outputs differ from production, deterministic={det}")
                    t = timer.time_graph([lambda i=i: call(i) for i in range(n)])
                us = t.median_ms * 1e3
                row.update(us=us, gbps=wbytes / us / 1e3, pct_copy=100 * wbytes / us / 1e3 / copy)
                print(f"{name:14s} {kind:7s} m={m:2d} {label:26s} {us:7.1f} us {row['gbps']:6.0f} GB/s "
                      f"{row['pct_copy']:5.1f}%", flush=True)  # fmt: skip
            except Exception as e:  # noqa: BLE001  (a probe: record and go on)
                row["error"] = f"{type(e).__name__}: {e}"[:300]
                print(f"{name:14s} {kind:7s} m={m:2d} {label:26s} FAILED {row['error']}", flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gemv_pipe_probe.json"), "w") as f:
            json.dump(dict(copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(torch.device("cuda"))
