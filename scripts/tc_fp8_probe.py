"""The FP8 linear with the weight as the register operand (`kernels.tc_fp8`, Gluon) against
the production `tc_mm` FP8 path (CUDA only; a development tool, not part of `attnv41 bench`).

1. Numerics: every finite e4m3 byte under scales 2^-20..2^5, and the Flash FP8 shapes at
   m = 1, 7, 64, 130: `tc_fp8` against the exact product (fp64) within the bound of one
   bf16 rounding plus fp32 summation (|out − exact| ≤ 2^-8·|exact| + K·2^-23·Σ|terms|);
   each row of the m = 130 call equal, bit for bit, to its one-row call (batch invariance);
   how many outputs differ from `tc_mm`'s bits (another summation order).
2. Time, weights cold (one CUDA graph over copies, L2 flushed): the Flash FP8 shapes at m =
   1, 64, 2048, each `FP8_TUNE` variant in PROBE_TUNES (JSON list, default pf 1 and 2)
   and `tc_mm`.

    python3 scripts/tc_fp8_probe.py        # OUT set: $OUT/tc_fp8_probe.json
"""

from __future__ import annotations

import json
import os
import sys

import torch

from attnv41.kernels import qdq
from attnv41.kernels import tc_fp8 as F
from attnv41.kernels import tc_mm as TC
from attnv41.reference.fp8 import dequant_weight, quant_weight

BF = torch.bfloat16
SHAPES = {
    "wq_a": (1280, 5120),
    "wkv": (512, 5120),
    "wq_b": (32768, 1280),
    "indexer.wq_b": (4096, 1280),
    "wo_b": (5120, 8192),
}
TUNES = json.loads(os.environ.get("PROBE_TUNES", "[{}]"))


def check(dev) -> dict:
    g = torch.Generator(device="cpu").manual_seed(1)
    res = {}
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    cases = [("codes", 256, 1024, 64)] + [(n, *SHAPES[n], m) for n in SHAPES for m in (1, 7, 64, 130)]
    ok_all = True
    for name, N, K, m in cases:
        if name == "codes":
            w = codes[torch.randint(len(codes), (N, K), generator=g)].view(torch.float8_e4m3fn).to(dev)
            sc = torch.randint(107, 133, (N // 32, K // 32), generator=g).to(torch.uint8).to(dev)
        else:
            w, sc = quant_weight(torch.randn(N, K, generator=g) * 0.05)
            w, sc = w.to(dev), sc.view(torch.uint8).to(dev)
        x = qdq.fp8_qdq(torch.randn(m, K, generator=g).to(BF).to(dev))
        wd = dequant_weight(w, sc).double()
        exact = x.double() @ wd.t()
        mag = x.double().abs() @ wd.abs().t()
        bound = exact.abs() * 2.0**-8 + mag * K * 2.0**-23
        rows = {}
        for tune in TUNES:
            xin = F.rename_cols(x)
            try:
                out = F.tc_fp8(xin, w, sc, torch.empty(m, N, dtype=BF, device=dev), **tune)
            except ValueError as e:  # a split count this shape does not take
                print(f"check {name:14s} m={m:4d} {tune}: skipped ({e})", flush=True)
                continue
            err = (out.double() - exact).abs()
            fin = bool(torch.isfinite(out).all())
            within = fin and bool((err <= bound).all())
            ref = TC.tc_mm(x, w, torch.empty(m, N, dtype=BF, device=dev), sc)
            differ = int((out.view(torch.int16) != ref.view(torch.int16)).sum())
            inv = True
            if m == 130:
                for t in (0, 1, 63, 64, 129):
                    one = F.tc_fp8(xin[t : t + 1], w, sc, torch.empty(1, N, dtype=BF, device=dev), **tune)
                    inv &= torch.equal(one.view(torch.int16), out[t : t + 1].view(torch.int16))
            key = json.dumps(tune, sort_keys=True)
            rows[key] = dict(within=within, worst=float((err / bound).max()), differ=differ, n=m * N, invariant=inv)
            ok_all &= within and inv
            print(f"check {name:14s} m={m:4d} {key}: within={within} worst/bound={rows[key]['worst']:.3f} "
                  f"bits != tc_mm {differ}/{m * N} invariant={inv}", flush=True)  # fmt: skip
        res[f"{name} m={m}"] = rows
    res["ok"] = ok_all
    return res


def timing(dev) -> list:
    from attnv41.bench.common import Timer  # noqa: PLC0415

    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        w8, sc = quant_weight(torch.randn(N, K, generator=gen, device=dev) * 0.05)
        sc = sc.view(torch.uint8)
        nbytes = w8.numel()
        copies = max(1, -(-(200 << 20) // nbytes))
        ws = [w8.clone() for _ in range(copies)]
        for m in (1, 64, 2048):
            if m == 2048 and name not in ("wq_b", "wo_b"):
                continue
            x = qdq.fp8_qdq(torch.randn(m, K, generator=gen, device=dev).to(BF))
            out = torch.empty(m, N, dtype=BF, device=dev)
            variants = [("tc_mm", {})] + [(json.dumps(t, sort_keys=True), t) for t in TUNES]
            for vname, tune in variants:
                if vname == "tc_mm":
                    fns = [lambda w_=w_, x=x, out=out, sc=sc: TC.fp8_mm_batch(x, w_, sc, out, xq=x) for w_ in ws]
                else:
                    xin = F.rename_cols(x)
                    fns = [
                        lambda w_=w_, x=xin, out=out, tune=tune, sc=sc: F.tc_fp8(x, w_, sc, out, **tune) for w_ in ws
                    ]
                us = timer.time_graph(fns, reps=10).median_ms * 1e3
                rows.append(dict(name=name, m=m, variant=vname, us=us, gbs=nbytes / us * 1e-3))
                print(f"time {name:14s} m={m:5d} {vname:14s} {us:8.1f} µs {nbytes / us * 1e-3:7.0f} GB/s", flush=True)
        del ws
    names = ["tc_mm"] + [json.dumps(t, sort_keys=True) for t in TUNES]
    print("\n| weight | m | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for name in SHAPES:
        for m in (1, 64, 2048):
            cells = [next((r for r in rows if (r["name"], r["m"], r["variant"]) == (name, m, v)), None) for v in names]
            if any(cells):
                print(f"| {name} | {m} | " + " | ".join("" if c is None else f"{c['us']:.1f}" for c in cells) + " |")
    return rows


def main() -> None:
    dev = torch.device("cuda")
    TC.prepare(dev)
    res = check(dev)
    rows = timing(dev)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tc_fp8_probe.json"), "w") as f:
            json.dump(dict(check=res, rows=rows), f, indent=1)
    print(f"numerics ok: {res['ok']}", flush=True)
    sys.exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
