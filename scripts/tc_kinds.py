"""Timing of the batched runtime's projections by weight kind (`kernels.tc_mm`) at the
V4.1-Flash shapes (CUDA only; a development tool, not part of `attnv41 bench`).

For m in M_LIST (default 1, 64, 256): bf16 weights, the same weights in FP8 and the
compressor's fp32 weight through `tc_mm`; beside them the decode GEMV (`gemv.gemv`, the
single-sequence runtime's path) at m = 1 and, with CHUNKS=1, in row chunks of 16 (what the
batched runtime ran before) at m = 64. The forms measured and dropped (BENCHMARKS.md,
2026-12-03) were variants of this script. Each output is first checked against the fp64
product of its exact operands (a loose sanity bound: 2^-6 of Σ|terms|) and for equal
bytes on a second call. Times: `Timer.time_graph` over copies of the weights (past the
L2), L2 flushed before each replay; µs per call and GB/s over the weight bytes.

    python3 scripts/tc_kinds.py            # OUT set: $OUT/tc_kinds.json
"""

from __future__ import annotations

import json
import os

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import gemv, qdq
from attnv41.kernels import tc_mm as TC
from attnv41.reference.fp8 import dequant_weight, quant_weight

BF = torch.bfloat16
SHAPES = {  # name: (N, K, kind)
    "wq_a": (1280, 5120, "fp8"),
    "wkv": (512, 5120, "fp8"),
    "wq_b": (32768, 1280, "fp8"),
    "indexer.wq_b": (4096, 1280, "fp8"),
    "wo_b": (5120, 8192, "fp8"),
    "compressor (fp32)": (1024, 5120, "fp32"),
}
M_LIST = [int(v) for v in os.environ.get("M_LIST", "1,64,256").split(",")]


def _chunked(x, w, o, sc):
    for a in range(0, x.shape[0], gemv.DECODE_MAX_M):
        b = min(x.shape[0], a + gemv.DECODE_MAX_M)
        gemv.gemv(x[a:b], (w,), (o[a:b],), None if sc is None else (sc,))
    return o


def main() -> None:
    dev = torch.device("cuda")
    gemv.prepare(dev)
    TC.prepare(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K, kind) in SHAPES.items():
        base = torch.randn(N, K, generator=gen, device=dev) * 0.05
        if kind == "fp8":
            w8, sc = quant_weight(base)
            variants = {"bf16": (dequant_weight(w8, sc), None), "fp8": (w8, sc)}
        else:
            variants = {"fp32": (base.float(), None)}
        for label, (w, sc) in variants.items():
            nbytes = w.numel() * w.element_size()
            copies = max(1, -(-(200 << 20) // nbytes))
            ws = [w.clone() for _ in range(copies)]
            W = (dequant_weight(w, sc) if sc is not None else w).double()
            odt = torch.float32 if w.dtype == torch.float32 else BF
            for m in M_LIST:
                x = torch.randn(m, K, generator=gen, device=dev).to(BF)
                xr = qdq.fp8_qdq(x.clone()) if sc is not None else x
                ref = xr.double() @ W.t()
                A = xr.double().abs() @ W.abs().t()
                outs = [torch.empty(m, N, dtype=odt, device=dev) for _ in ws]
                cands = {}
                label_tc = {"fp8": "tc fp8", "fp32": "tc fp32"}.get(label, "tc bf16")
                cands[label_tc] = lambda w_, o, x=x, sc=sc: (
                    TC.fp8_mm_batch(x, w_, sc, o) if sc is not None else TC.tc_mm(x, w_, o)
                )
                if m == 1 or (m == 64 and os.environ.get("CHUNKS")):
                    cands["gemv" if m == 1 else "gemv chunks"] = lambda w_, o, x=x, sc=sc: _chunked(x, w_, o, sc)
                for k, fn in cands.items():
                    try:
                        fn(ws[0], outs[0])
                        first = outs[0].clone()
                        fn(ws[0], outs[0])
                        torch.cuda.synchronize()
                        err = float(((outs[0].double() - ref).abs() / (A + 1e-30)).max())
                        same = torch.equal(first, outs[0])
                        if err > 2.0**-6 or not same:
                            print(f"{name} {label} m={m} {k}: FAILED (max err/A {err:.3g}, repeat equal {same})")
                            continue
                        t = timer.time_graph([lambda w_=w_, o=o, fn=fn: fn(w_, o) for w_, o in zip(ws, outs)], reps=10)
                        us = t.median_ms * 1e3
                        rows.append(dict(name=name, weights=label, m=m, kernel=k, us=us, gbs=nbytes / us * 1e-3))
                        print(
                            f"{name:18s} {label:5s} m={m:4d} {k:16s} {us:9.1f} µs {nbytes / us * 1e-3:7.0f} GB/s",
                            flush=True,
                        )
                    except Exception as e:  # noqa: BLE001
                        print(f"{name} {label} m={m} {k}: {type(e).__name__}: {str(e)[:200]}")
            del ws
    print("\n| weights | kernel | m | " + " | ".join(SHAPES) + " |")
    print("|---" * (len(SHAPES) + 3) + "|")
    for lab, k, m in sorted({(r["weights"], r["kernel"], r["m"]) for r in rows}):
        cells = [
            next((r for r in rows if (r["weights"], r["kernel"], r["m"], r["name"]) == (lab, k, m, n)), None)
            for n in SHAPES
        ]
        print(
            f"| {lab} | {k} | {m} | "
            + " | ".join("" if c is None else f"{c['us']:.1f} ({c['gbs']:.0f})" for c in cells)
            + " |"
        )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tc_kinds.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
