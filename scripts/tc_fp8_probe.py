"""The FP8 linear with the weight as the register operand (`kernels.tc_fp8`, Gluon) against
the production `tc_mm` FP8 path (CUDA only; a development tool, not part of `attnv41 bench`).

Each variant (a `tc_fp8` tune dict of PROBE_TUNES, a JSON list; default: the variants
below) runs in a subprocess of its own with a time limit (PROBE_VARIANT_S, default 90 s),
so a variant that hangs (a warp-specialized form with a wrong barrier phase) costs its
slot, not the call. Per variant:

1. Numerics: every finite e4m3 byte under scales 2^-20..2^5, and the Flash FP8 shapes at
   m = 1, 7, 64, 130: against the exact product (fp64) within one bf16 rounding plus fp32
   summation (|out − exact| ≤ 2^-8·|exact| + K·2^-23·Σ|terms|); rows 0, 1, 63, 64, 129 of
   the m = 130 call equal, bit for bit, to their one-row calls (batch invariance); how many
   outputs differ from `tc_mm`'s bits and from the default variant's.
2. Time, weights cold (one CUDA graph over copies, L2 flushed): the Flash FP8 shapes at m =
   1, 64, 2048 (2048: wq_b and wo_b only); and one layer's three FP8 passes as the batched
   runtime calls them, through `tc_mm.FP8_GLUON` (one-weight forms excepted).

`tc_mm` (production) and, at m = 1, the single-sequence runtime's decode GEMV (`gemv`) are
timed in subprocesses of their own. The table is printed last.

    python3 scripts/tc_fp8_probe.py              # OUT set: $OUT/tc_fp8_probe.json
    python3 scripts/tc_fp8_probe.py one '{"ws": 1}'   # one variant, JSON on the last line
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from fp8_tc_probe import SHAPES  # the Flash FP8 linears (this folder: the script's own path)

from attnv41.kernels import qdq
from attnv41.kernels import tc_fp8 as F
from attnv41.kernels import tc_mm as TC
from attnv41.reference.fp8 import dequant_weight, quant_weight

BF = torch.bfloat16
DEFAULT_TUNES = [  # in order of interest: an outer time limit cuts the last ones
    {},
    # token rows per tile by m (8 at m = 1): smaller x stages, more programs per SM
    {"bt": 0},
    {"bt": 0, "stages": 8},
    {"bt": 0, "progs": 528, "minseg": 4},  # and more K segments: wo_b 640 programs against 160
    {"bt": 0, "ws": 1, "stages": 4, "maxnreg": 128},
    {"stages": 3},
    {"xr": 64},
    {"segs": 4},
    {"ws": 1, "stages": 3, "maxnreg": 128},
    {"ws": 1, "stages": 4, "maxnreg": 128},
    {"ws": 2, "stages": 2, "maxnreg": 112, "cregs": 128},
    {"ws": 2, "stages": 4},
]
MS = (1, 64, 2048)


def _key(tune: dict) -> str:
    return json.dumps(tune, sort_keys=True)


def check(dev, tune: dict) -> dict:
    g = torch.Generator(device="cpu").manual_seed(1)
    res = {"ok": True}
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    cases = [("codes", 256, 1024, 64)] + [(n, *SHAPES[n], m) for n in SHAPES for m in (1, 7, 64, 130)]
    for name, N, K, m in cases:
        if name == "codes":
            w = codes[torch.randint(len(codes), (N, K), generator=g)].view(torch.float8_e4m3fn).to(dev)
            sc = torch.randint(107, 133, (N // 32, K // 32), generator=g).to(torch.uint8).to(dev)
        else:
            w, sc = quant_weight(torch.randn(N, K, generator=g) * 0.05)
            w, sc = w.to(dev), sc.view(torch.uint8).to(dev)
        x = qdq.fp8_qdq(torch.randn(m, K, generator=g).to(BF).to(dev))
        xr = F.rename_cols(x)
        try:
            out = F.tc_fp8(xr, w, sc, torch.empty(m, N, dtype=BF, device=dev), **tune)
        except ValueError as e:  # a split count this shape does not take
            res[f"{name} m={m}"] = dict(skipped=str(e))
            continue
        wd = dequant_weight(w, sc).double()
        exact = x.double() @ wd.t()
        bound = exact.abs() * 2.0**-8 + (x.double().abs() @ wd.abs().t()) * K * 2.0**-23
        err = (out.double() - exact).abs()
        within = bool(torch.isfinite(out).all()) and bool((err <= bound).all())
        ref = TC.tc_mm(x, w, torch.empty(m, N, dtype=BF, device=dev), sc)
        base = F.tc_fp8(xr, w, sc, torch.empty(m, N, dtype=BF, device=dev))
        inv = True
        if m == 130:
            for t in (0, 1, 63, 64, 129):
                one = F.tc_fp8(xr[t : t + 1], w, sc, torch.empty(1, N, dtype=BF, device=dev), **tune)
                inv &= torch.equal(one.view(torch.int16), out[t : t + 1].view(torch.int16))
        row = dict(
            within=within,
            worst=float((err / bound).max()),
            vs_tc_mm=int((out.view(torch.int16) != ref.view(torch.int16)).sum()),
            vs_default=int((out.view(torch.int16) != base.view(torch.int16)).sum()),
            n=m * N,
            invariant=inv,
        )
        res[f"{name} m={m}"] = row
        res["ok"] &= within and inv
        print(f"check {name:14s} m={m:4d}: {row}", flush=True)
    return res


def _cold_weights(gen, dev, N: int, K: int) -> tuple[list, torch.Tensor, int]:
    """A random FP8 weight `[N, K]` in enough copies (≥ 200 MiB) for each timed call to read
    it cold; its scale bytes; its bytes."""
    w8, sc = quant_weight(torch.randn(N, K, generator=gen, device=dev) * 0.05)
    nbytes = w8.numel()
    return [w8.clone() for _ in range(max(1, -(-(200 << 20) // nbytes)))], sc.view(torch.uint8), nbytes


def gemv_timing(dev) -> list:
    """The single-sequence runtime's decode GEMV (`gemv.gemv`, m ≤ 16: its FP8 step's
    projections) at m = 1 on the same shapes, x's round trip given: the figure a tc_fp8 form
    would have to beat to serve that runtime's decode too."""
    from attnv41.bench.common import Timer  # noqa: PLC0415
    from attnv41.kernels import gemv  # noqa: PLC0415

    gemv.prepare(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        ws, sc, nbytes = _cold_weights(gen, dev, N, K)
        x = torch.randn(1, K, generator=gen, device=dev).to(BF)
        xq = qdq.fp8_qdq(x.clone())
        out = torch.empty(1, N, dtype=BF, device=dev)
        fns = [lambda w_=w_, x=x, out=out, sc=sc, xq=xq: gemv.gemv(x, (w_,), (out,), (sc,), xq=xq) for w_ in ws]
        us = timer.time_graph(fns, reps=10).median_ms * 1e3
        rows.append(dict(name=name, m=1, us=us, gbs=nbytes / us * 1e-3))
        print(f"time {name:14s} m={1:5d} {us:8.1f} µs {nbytes / us * 1e-3:7.0f} GB/s (gemv)", flush=True)
        del ws
    return rows


def timing(dev, tune: dict | None) -> list:
    """tune None: tc_mm (production); else tc_fp8 with it."""
    from attnv41.bench.common import Timer  # noqa: PLC0415

    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        ws, sc, nbytes = _cold_weights(gen, dev, N, K)
        for m in MS:
            if m == 2048 and name not in ("wq_b", "wo_b"):
                continue
            x = qdq.fp8_qdq(torch.randn(m, K, generator=gen, device=dev).to(BF))
            out = torch.empty(m, N, dtype=BF, device=dev)
            if tune is None:
                fns = [lambda w_=w_, x=x, out=out, sc=sc: TC.fp8_mm_batch(x, w_, sc, out, xq=x) for w_ in ws]
            else:
                xr = F.rename_cols(x)
                fns = [lambda w_=w_, x=xr, out=out, sc=sc: F.tc_fp8(x, w_, sc, out, **tune) for w_ in ws]
                try:
                    fns[0]()
                except ValueError:
                    continue
            us = timer.time_graph(fns, reps=10).median_ms * 1e3
            rows.append(dict(name=name, m=m, us=us, gbs=nbytes / us * 1e-3))
            print(f"time {name:14s} m={m:5d} {us:8.1f} µs {nbytes / us * 1e-3:7.0f} GB/s", flush=True)
        del ws
    if tune is None or not tune.get("ws"):  # the warp-specialized forms take one weight per launch
        rows += layer_timing(dev, timer, gen, tune)
    return rows


def layer_timing(dev, timer, gen, tune: dict | None) -> list:
    """One layer's FP8 projections as the batched runtime calls `mm_many_batch` (x → wq_a,
    wkv; cq → wq_b with q's RoPE in the store, indexer.wq_b, cq's round trip given as a
    producer makes it at decode sizes, renamed under the switch; u → wo_b), with `tc_mm.FP8_GLUON` = tune (None: the
    production path): launches, round trips and split sums included. Weights cold (copies)."""
    TC.FP8_GLUON = tune
    H, D, half = 64, 512, 32
    sets = []
    for _ in range(3):  # about 100 MB of FP8 weights per set
        sets.append({n: quant_weight(torch.randn(*SHAPES[n], generator=gen, device=dev) * 0.05) for n in SHAPES})
    ang = torch.rand(256, half, generator=gen, device=dev) * 6
    cos, sin = ang.cos(), ang.sin()
    rows = []
    for m in (1, 64):
        x = torch.randn(m, 5120, generator=gen, device=dev).to(BF)
        cq = torch.randn(m, 1280, generator=gen, device=dev).to(BF)
        cq_q = qdq.fp8_qdq(cq.clone(), rename=tune is not None)  # as rms_norm_batch makes it under the switch
        u = torch.randn(m, 8192, generator=gen, device=dev).to(BF)
        pos = torch.randint(0, 256, (m,), generator=gen, device=dev, dtype=torch.int32)
        outs = {n: torch.empty(m, N, dtype=BF, device=dev) for n, (N, _) in SHAPES.items()}

        def layer(ws, x=x, cq=cq, cq_q=cq_q, u=u, pos=pos, outs=outs):
            sc = {n: ws[n][1].view(torch.uint8) for n in ws}
            TC.mm_many_batch(x, (ws["wq_a"][0], ws["wkv"][0]), (outs["wq_a"], outs["wkv"]), (sc["wq_a"], sc["wkv"]))
            TC.mm_many_batch(
                cq, (ws["wq_b"][0], ws["indexer.wq_b"][0]), (outs["wq_b"], outs["indexer.wq_b"]),
                (sc["wq_b"], sc["indexer.wq_b"]), xq=cq_q, rope=(0, D, cos, sin, pos),
            )  # fmt: skip
            TC.fp8_mm_batch(u, ws["wo_b"][0], sc["wo_b"], outs["wo_b"])

        us = timer.time_graph([lambda ws=ws: layer(ws) for ws in sets], reps=10).median_ms * 1e3
        nbytes = sum(ws[n][0].numel() for n in SHAPES for ws in sets[:1])
        rows.append(dict(name="layer (3 passes)", m=m, us=us, gbs=nbytes / us * 1e-3))
        print(f"time {'layer (3 passes)':14s} m={m:5d} {us:8.1f} µs", flush=True)
    TC.FP8_GLUON = None
    assert H * D == SHAPES["wq_b"][0]
    return rows


def one(arg: str) -> None:
    dev = torch.device("cuda")
    TC.prepare(dev)
    if arg == "tc_mm":
        print(json.dumps(dict(rows=timing(dev, None))))
        return
    if arg == "gemv":
        print(json.dumps(dict(rows=gemv_timing(dev))))
        return
    tune = json.loads(arg)
    res = check(dev, tune)
    rows = timing(dev, tune)
    print(json.dumps(dict(check=res, rows=rows)))


def main() -> None:
    tunes = json.loads(os.environ["PROBE_TUNES"]) if os.environ.get("PROBE_TUNES") else DEFAULT_TUNES
    limit = float(os.environ.get("PROBE_VARIANT_S", "90"))
    results = {}
    for arg in ["tc_mm", "gemv"] + [_key(t) for t in tunes]:
        try:
            r = subprocess.run(
                [sys.executable, __file__, "one", arg], capture_output=True, text=True, timeout=limit, env=os.environ
            )
            sys.stdout.write(r.stdout[-4000:])
            if r.returncode:
                sys.stdout.write(r.stderr[-3000:])
            last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            results[arg] = json.loads(last) if r.returncode == 0 and last.startswith("{") else {"rc": r.returncode}
        except subprocess.TimeoutExpired:
            results[arg] = {"timeout": limit}
        print(f"== {arg}: {'ok' if 'rows' in results[arg] else results[arg]}", flush=True)
        if os.environ.get("OUT"):  # what has run so far, should an outer limit cut the call
            with open(os.path.join(os.environ["OUT"], "tc_fp8_probe.json"), "w") as f:
                json.dump(results, f, indent=1)
    names = list(results)
    print("\n| weight | m | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 2) + "|")
    for wname in [*SHAPES, "layer (3 passes)"]:
        for m in MS:
            cells = []
            for a in names:
                hit = [r for r in results[a].get("rows", []) if (r["name"], r["m"]) == (wname, m)]
                cells.append(f"{hit[0]['us']:.1f}" if hit else "")
            if any(cells):
                print(f"| {wname} | {m} | " + " | ".join(cells) + " |")
    for a in names[2:]:
        chk = results[a].get("check", {})
        print(f"numerics {a}: ok={chk.get('ok')}")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "tc_fp8_probe.json"), "w") as f:
            json.dump(results, f, indent=1)
    ok = all(results[a].get("check", {}).get("ok") for a in names[2:] if "rows" in results[a])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "one":
        one(sys.argv[2])
    else:
        main()
