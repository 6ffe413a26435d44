# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Sweep of the batch-invariant tensor-core matmuls (`kernels.tc_mm`) at the V4.1-Flash
projection shapes (CUDA only; a development tool, not part of `attnv41 bench`).

For m in M_LIST (default 1, 8, 64, 256): each bf16 projection of a layer and wo_a (grouped)
through `tc_mm` with the production launch shape and with variants of (BM, BN, BK, warps,
stages, target programs) (the split count is part of the bits: a variant is another constant), beside cuBLAS (`linear.mm`,
`linear.group_mm`) (the chunked GEMV the batched runtime ran before is gone; its figures
are in BENCHMARKS.md, 2026-12-02 fifth entry). Every variant is checked first: within the fp64 bound of the kernel tests
and equal bits on a second call. Times: `Timer.time_graph` over copies of the weights
(past the L2), L2 flushed before each replay. Prints a Markdown table: µs per call, and
for the whole layer's projections the sum and its GB/s over the weight bytes.

    python3 scripts/tc_tune.py            # OUT set: $OUT/tc_tune.json
"""

from __future__ import annotations

import json
import os
import time

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import linear
from attnv41.kernels import tc_mm as TC

BF = torch.bfloat16
SHAPES = {  # name: (N, K) or (G, r, gw) for the grouped wo_a
    "wq_a": (1280, 5120),
    "wkv": (512, 5120),
    "wq_b": (32768, 1280),
    "indexer.wq_b": (4096, 1280),
    "wo_b": (5120, 8192),
    "wo_a (grouped)": (8, 1024, 4096),
}
M_LIST = [int(v) for v in os.environ.get("M_LIST", "1,64,256").split(",")]
# (BM, BN, BK, warps, stages, target programs); the first is production. The split count
# (from the target) changes the bits (another constant). TC_VARIANTS="64/128/64/4/6/132 ..."
# replaces the list after production.
VARIANTS = [
    (TC.BM, TC.BN, TC.BK, TC._WARPS, TC._STAGES, TC._TARGET_PROGRAMS),
    (64, 128, 64, 4, 6, 132),
    (64, 128, 64, 8, 6, 132),
    (64, 128, 128, 8, 4, 132),
    (64, 256, 64, 8, 5, 132),
    (64, 64, 64, 4, 6, 264),
    (64, 128, 64, 4, 4, 264),
]
if os.environ.get("TC_VARIANTS"):
    VARIANTS = VARIANTS[:1] + [tuple(int(v) for v in s.split("/")) for s in os.environ["TC_VARIANTS"].split()]
BUDGET_S = float(os.environ.get("BUDGET_S", "200"))


def main() -> None:
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, shp in SHAPES.items():
        grouped = len(shp) == 3
        wshape = shp if grouped else shp
        nbytes = 2 * torch.Size(wshape).numel()
        copies = max(1, -(-(200 << 20) // nbytes))
        ws = [(torch.randn(wshape, generator=gen, device=dev) * 0.05).to(BF) for _ in range(copies)]
        for m in M_LIST:
            if grouped:
                Gn, r, gw = shp
                x = torch.randn(m, Gn, gw, generator=gen, device=dev).to(BF)
                outs = [torch.empty(m, Gn, r, dtype=BF, device=dev) for _ in ws]
                ref = torch.einsum("mgk,grk->mgr", x.double(), ws[0].double())
                A = torch.einsum("mgk,grk->mgr", x.double().abs(), ws[0].double().abs())
                K = gw
                cands = {
                    "cublas": lambda w, o: linear.group_mm(x, w, o),
                }
                tc = TC.tc_group_mm
            else:
                N, K = shp
                x = torch.randn(m, K, generator=gen, device=dev).to(BF)
                outs = [torch.empty(m, N, dtype=BF, device=dev) for _ in ws]
                ref = x.double() @ ws[0].double().t()
                A = x.double().abs() @ ws[0].double().abs().t()
                cands = {
                    "cublas": lambda w, o: linear.mm(x, w, o),
                }
                tc = TC.tc_mm
            tol = 2.0**-7 * ref.abs() + 2.02 * K * 2.0**-24 * A + 2.0**-133
            for v in VARIANTS:
                if time.perf_counter() - t0 > BUDGET_S and v != VARIANTS[0]:
                    continue
                cands["tc {}/{}/{} w{} s{} t{}".format(*v)] = lambda w, o, v=v: _with(v, tc, x, w, o)
            for label, fn in cands.items():
                try:
                    fn(ws[0], outs[0])
                    first = outs[0].clone()
                    fn(ws[0], outs[0])
                    torch.cuda.synchronize()
                    ok = bool(((outs[0].double() - ref).abs() <= tol).all()) and torch.equal(first, outs[0])
                    if not ok and label != "cublas":
                        print(f"{name} m={m} {label}: FAILED the check")
                        continue
                    t = timer.time_graph([lambda w=w, o=o: fn(w, o) for w, o in zip(ws, outs)], reps=10)
                    us = t.median_ms * 1e3
                    rows.append(dict(name=name, m=m, kernel=label, us=us, gbs=nbytes / us * 1e-3))
                    print(f"{name:16s} m={m:4d} {label:28s} {us:9.1f} µs {nbytes / us * 1e-3:7.0f} GB/s", flush=True)
                except Exception as e:  # noqa: BLE001
                    print(f"{name} m={m} {label}: {type(e).__name__}: {str(e)[:200]}")
        del ws
    print("\n| m | kernel | " + " | ".join(SHAPES) + " | sum µs |")
    print("|---" * (len(SHAPES) + 3) + "|")
    labels = sorted({r["kernel"] for r in rows})
    for m in M_LIST:
        for k in labels:
            cells = [
                next((r["us"] for r in rows if r["m"] == m and r["kernel"] == k and r["name"] == n), None)
                for n in SHAPES
            ]
            if None in cells:
                continue
            print(f"| {m} | {k} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {sum(cells):.1f} |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tc_tune.json"), "w") as f:
            json.dump(rows, f, indent=1)


def _with(v, fn, x, w, o):
    saved = TC.BM, TC.BN, TC.BK, TC._WARPS, TC._STAGES, TC._TARGET_PROGRAMS
    TC.BM, TC.BN, TC.BK, TC._WARPS, TC._STAGES, TC._TARGET_PROGRAMS = v
    try:
        return fn(x, w, o)
    finally:
        TC.BM, TC.BN, TC.BK, TC._WARPS, TC._STAGES, TC._TARGET_PROGRAMS = saved


if __name__ == "__main__":
    main()
