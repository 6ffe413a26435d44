"""Programmatic dependent launch (PDL, `kernels/_triton.py`) measured on chains of one
layer's projections at the V4.1-Flash shapes (CUDA only; a development tool, not part of
`attnv41 bench`).

A chain is what one layer's step launches for its projections, on 8 copies of the
weights (past the L2, as in a step where every layer's weights are cold):
- `tc_mm` (the batched runtime) at m = 1 and 64: wq_a + wkv (x, one launch), wq_b (cq),
  wo_a (grouped), wo_b;
- the decode GEMV (the single-sequence runtime) at m = 1: x → wq_a + wkv in one launch,
  cq → wq_b, wo_a (grouped), wo_b.
Modes: PDL off (`ATTNV41_PDL=0`), PDL on without the weight prefetch, PDL on with
`tc_mm._PF_BYTES` of each weight row prefetched before the wait. Each chain is one CUDA
graph (`Timer.time_graph`, L2 flushed before each replay); µs per layer and GB/s over the
weight bytes. Every mode's outputs are compared byte for byte with PDL off.

    python3 scripts/pdl_probe.py           # OUT set: $OUT/pdl_probe.json
"""

from __future__ import annotations

import json
import os

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import gemv
from attnv41.kernels import tc_mm as TC
from attnv41.kernels._triton import PDL_ENV

BF = torch.bfloat16
COPIES = 8
D, QR, KV, H, HD, G, OR = 5120, 1280, 512, 64, 512, 8, 1024
GW = H * HD // G
MODES = [("off", "0", 0), ("on", "1", 0), ("on+pf512", "1", 512), ("on+pf2048", "1", 2048)]


def main() -> None:
    dev = torch.device("cuda")
    TC.prepare(dev)
    gemv.prepare(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, s=0.05):
        return (torch.randn(*shape, generator=gen, device=dev) * s).to(BF)

    layers = [
        dict(wq_a=rnd(QR, D), wkv=rnd(KV, D), wq_b=rnd(H * HD, QR), wo_a=rnd(G, OR, GW), wo_b=rnd(D, G * OR))
        for _ in range(COPIES)
    ]
    nbytes = sum(t.numel() * 2 for t in layers[0].values())
    rows, outs_by = [], {}
    for kind, m in (("tc_mm", 1), ("tc_mm", 64), ("gemv", 1)):
        x, cq, o = rnd(m, D, s=1.0), rnd(m, QR, s=1.0), rnd(m, G, GW, s=1.0)
        u = rnd(m, G * OR, s=1.0)
        outs = [
            dict(
                a=torch.empty(m, QR, dtype=BF, device=dev),
                kv=torch.empty(m, KV, dtype=BF, device=dev),
                q=torch.empty(m, H * HD, dtype=BF, device=dev),
                u=torch.empty(m, G, OR, dtype=BF, device=dev),
                y=torch.empty(m, D, dtype=BF, device=dev),
            )
            for _ in layers
        ]

        def chain(w, ob, x=x, cq=cq, o=o, u=u, kind=kind):
            if kind == "tc_mm":
                TC.mm_many_batch(x, (w["wq_a"], w["wkv"]), (ob["a"], ob["kv"]))
                TC.tc_mm(cq, w["wq_b"], ob["q"])
                TC.tc_group_mm(o, w["wo_a"], ob["u"])
                TC.tc_mm(u, w["wo_b"], ob["y"])
            else:
                gemv.gemv(x, (w["wq_a"], w["wkv"]), (ob["a"], ob["kv"]))
                gemv.gemv(cq, (w["wq_b"],), (ob["q"],))
                gemv.group_gemv(o, w["wo_a"], ob["u"])
                gemv.gemv(u, (w["wo_b"],), (ob["y"],))

        base = None
        for label, env, pf in MODES:
            os.environ[PDL_ENV] = env
            TC._PF_BYTES = pf
            if kind == "gemv" and pf:  # the GEMV has no prefetch
                continue
            try:
                for w, ob in zip(layers, outs):
                    chain(w, ob)
                torch.cuda.synchronize()
                got = [t.clone() for ob in outs for t in ob.values()]
                same = base is None or all(torch.equal(a, b) for a, b in zip(base, got))
                if base is None:
                    base = got
                t = timer.time_graph([lambda w=w, ob=ob: chain(w, ob) for w, ob in zip(layers, outs)], reps=20)
                us = t.median_ms * 1e3
                rows.append(dict(kind=kind, m=m, mode=label, us=us, gbs=nbytes / us * 1e-3, same_bytes=same))
                print(
                    f"{kind:6s} m={m:3d} {label:10s} {us:8.1f} µs/layer {nbytes / us * 1e-3:6.0f} GB/s same={same}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001
                print(f"{kind} m={m} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        outs_by[(kind, m)] = outs
    os.environ[PDL_ENV] = "1"
    print("\n| chain | m | " + " | ".join(lab for lab, _, _ in MODES) + " |")
    print("|---" * (len(MODES) + 2) + "|")
    for kind, m in (("tc_mm", 1), ("tc_mm", 64), ("gemv", 1)):
        cells = []
        for lab, _, _ in MODES:
            r = next((r for r in rows if (r["kind"], r["m"], r["mode"]) == (kind, m, lab)), None)
            cells.append(
                "" if r is None else f"{r['us']:.1f} ({r['gbs']:.0f} GB/s){'' if r['same_bytes'] else ' DIFF'}"
            )
        print(f"| {kind} | {m} | " + " | ".join(cells) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "pdl_probe.json"), "w") as f:
            json.dump(dict(weight_bytes=nbytes, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
