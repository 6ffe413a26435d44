# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Does the weight's memory layout bound the batched projections? (CUDA only; a
development probe, not part of `attnv41 bench`.)

`tc_mm` reads a [BN, BK] weight tile per chunk from row-major `[N, K]` weights: BN runs
of BK·2 bytes, K·2 bytes apart. This probe times the same tensor-core product with the
weight stored tile by tile (`[N/BN, K/BK, BN, BK]` contiguous: each chunk one
contiguous 16 KB run), and both layouts with the product removed (the weight read
alone, summed so that the loads stay), at the V4.1-Flash projection shapes, m = 1 and 64,
the production split plan (`tc_mm.plan`). Split partials are stored, not combined (both
layouts alike). Outputs of the two product layouts are compared byte for byte.
Times: `Timer.time_graph` over copies of the weights (past the L2), L2 flushed before
each replay.

    python3 scripts/tile_probe.py          # OUT set: $OUT/tile_probe.json
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from attnv41.bench.common import Timer
from attnv41.kernels import tc_mm as TC

BF = torch.bfloat16
SHAPES = {
    "wq_b": (32768, 1280),
    "wo_b": (5120, 8192),
    "wq_a": (1280, 5120),
    "wkv": (512, 5120),
    "wo_a as one": (8192, 4096),
}
M_LIST = [int(v) for v in os.environ.get("M_LIST", "1,64").split(",")]
VARIANTS = [(64, 128, 4, 3)]  # BN, BK, warps, stages (the production tile)


@triton.jit
def _probe(x, w, out, part, M, N, K, TILED: tl.constexpr, DOT: tl.constexpr, SEGS: tl.constexpr, IPS: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    pm, pn, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pm * BM + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    rok = rows < M
    ks = tl.arange(0, BK)
    nch = K // BK
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    tot = tl.zeros((BN,), dtype=tl.float32)
    for i in range(IPS):
        c = seg * IPS + i
        k = c * BK + ks
        if TILED:  # tile (pn, c) is BN·BK contiguous values, row-major inside
            b = tl.load(w + (pn.to(tl.int64) * nch + c) * (BN * BK) + tl.arange(0, BN)[None, :] * BK + ks[:, None])
        else:
            b = tl.load(w + cols[None, :].to(tl.int64) * K + k[:, None])
        if DOT:
            a = tl.load(x + rows[:, None] * K + k[None, :], mask=rok[:, None], other=0.0)
            acc = tl.dot(a, b, acc)
        else:
            tot += tl.sum(b.to(tl.float32), axis=0)
    if not DOT:
        acc += tot[None, :]
    ok = rok[:, None] & (cols < N)[None, :]
    if SEGS == 1:
        tl.store(out + rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=ok)
    else:
        tl.store(part + (seg * M + rows[:, None]) * N + cols[None, :], acc, mask=ok)


def main() -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        nbytes = N * K * 2
        copies = max(1, -(-(200 << 20) // nbytes))
        ws = [(torch.randn(N, K, generator=gen, device=dev) * 0.05).to(BF) for _ in range(copies)]
        for bn, bk, warps, stages in VARIANTS:
            saved = TC.BN, TC.BK
            TC.BN, TC.BK = bn, bk
            segs = TC.plan(N, K)
            TC.BN, TC.BK = saved
            ips = (K // bk) // segs
            tiled = [w.view(N // bn, bn, K // bk, bk).permute(0, 2, 1, 3).contiguous() for w in ws]
            for m in M_LIST:
                x = torch.randn(m, K, generator=gen, device=dev).to(BF)
                outs = [torch.empty(m, N, dtype=BF, device=dev) for _ in ws]
                part = torch.empty(max(segs, 1) * m * N, dtype=torch.float32, device=dev)
                res = {}
                for lay, wl in (("rows", ws), ("tiled", tiled)):
                    for dot in (1, 0):

                        def fn(w, o, x=x, part=part, lay=lay, dot=dot, m=m):
                            _probe[(1 if m <= 64 else -(-m // 64), N // bn, segs)](
                                x, w, o, part, m, N, K, TILED=lay == "tiled", DOT=dot, SEGS=segs, IPS=ips,
                                BM=64, BN=bn, BK=bk, num_warps=warps, num_stages=stages,
                            )  # fmt: skip

                        fn(wl[0], outs[0])
                        torch.cuda.synchronize()
                        if dot:
                            res[lay] = (outs[0].clone(), part.clone())
                        t = timer.time_graph([lambda w=w, o=o, fn=fn: fn(w, o) for w, o in zip(wl, outs)], reps=10)
                        us = t.median_ms * 1e3
                        label = f"{lay} {'mm' if dot else 'read'}"
                        rows.append(dict(name=name, m=m, variant=f"{bn}/{bk} w{warps} s{stages}", segs=segs, kind=label,
                                         us=us, gbs=nbytes / us * 1e-3))  # fmt: skip
                        print(
                            f"{name:12s} m={m:3d} {bn}/{bk} w{warps} s{stages} segs={segs:3d} {label:11s} {us:8.1f} µs {nbytes / us * 1e-3:6.0f} GB/s",
                            flush=True,
                        )
                same = all(torch.equal(a, b) for a, b in zip(res["rows"], res["tiled"]))
                print(f"{name} m={m} {bn}/{bk}: tiled == rows bytes: {same}", flush=True)
            del tiled
        del ws
    print("\n| shape | m | variant | rows mm | tiled mm | rows read | tiled read |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted(
        {(r["name"], r["m"], r["variant"]) for r in rows}, key=lambda k: (list(SHAPES).index(k[0]), k[1], k[2])
    ):
        cells = []
        for kind in ("rows mm", "tiled mm", "rows read", "tiled read"):
            r = next((r for r in rows if (r["name"], r["m"], r["variant"], r["kind"]) == (*key, kind)), None)
            cells.append("" if r is None else f"{r['us']:.1f} ({r['gbs']:.0f})")
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tile_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
