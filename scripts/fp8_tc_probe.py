"""What bounds the batched runtime's FP8 projections (`kernels.tc_mm`, FP8 weights): a
standalone copy of its FP8 tile loop with the e4m3 -> bf16 dequantization swapped (CUDA
only; a development tool, not part of `attnv41 bench`).

`tc_mm` reads an FP8 weight at about 1 TB/s where the same kernel reads a bf16 weight at
2.6-2.9 TB/s (BENCHMARKS.md, 2026-12-03). The loop per chunk: the weight bytes by cp.async
into shared memory, back to registers, e4m3 -> f16x2 -> fp32, times the e8m0 scale, -> bf16,
into shared memory again, a barrier, the tensor-core product, waited on at once. Modes of
the same loop (BM 64, BN 64, BK 128, 4 warps, 3 stages, the production split count; the
segment partials stored, not summed):

- `deq`: the production chain (fp32 multiply by the scale gathered per element);
- `asm`: the bf16 bits made by integer operations on four bytes at a time (inline PTX:
  each byte's sign to bit 15, its 7 exponent and mantissa bits four places up: the value
  times 2^-120, bf16 subnormal for e4m3 subnormals; 2 operations per value), times the
  scale times 2^120, 2^(e-7), as bf16 (`mul.rn.bf16x2`; e <= 134);
- `noscale`: e4m3 -> bf16 without the scale (wrong values: timing only);
- `bytes`: the FP8 bytes read as a bf16 weight of K/2 columns through the same loop with
  no conversion at all (wrong values: the loop's ceiling at these bytes);
- `tdeq`, `tasm`: the tile transposed, the dequantized weight the product's first operand
  in registers (as `tc_mm` does for fp32 weights);
- `rp`, `rpasm` (4 warps), `rp8`, `rpasm8` (8 warps): no cp.async; the next chunk's weight
  and scales loaded into registers while this chunk is converted and multiplied.

Every form but `noscale` and `bytes` must give `deq`'s partials bit for bit (checked first).
H200 results: BENCHMARKS.md, 2026-12-04 nineteenth entry.

    python3 scripts/fp8_tc_probe.py        # OUT set: $OUT/fp8_tc_probe.json
    python3 scripts/fp8_tc_probe.py plans  # the production kernel under other split rules
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

from attnv41.kernels import qdq
from attnv41.kernels import tc_mm as TC
from attnv41.kernels.gemv_fp8 import _e8m0
from attnv41.reference.fp8 import dequant_weight, quant_weight

BF = torch.bfloat16
# name: (loop form, warps, stages)
FORMS = {  # name: (loop form, warps, stages, chunks per iteration)
    "deq": (0, 4, 3, 1),
    "asm": (1, 4, 3, 1),
    "noscale": (2, 4, 3, 1),
    "bytes": (3, 4, 3, 1),
    "tdeq": (4, 4, 3, 1),
    "tasm": (5, 4, 3, 1),
    "rp": (6, 4, 1, 1),
    "rpasm": (7, 4, 1, 1),
    "rp8": (6, 8, 1, 1),
    "rpasm8": (7, 8, 1, 1),
    "u2": (8, 4, 3, 2),
    "u2asm": (9, 4, 3, 2),
    "u2s2": (8, 4, 2, 2),
    "u2s1": (8, 4, 1, 2),
    "u4s1": (8, 4, 1, 4),
    "u4asms1": (9, 4, 1, 4),
    "deqseg2": (0, 4, 3, 1),  # twice the production split count: twice the programs
    "deqseg4": (0, 4, 3, 1),
}
SEG_MULT = {"deqseg2": 2, "deqseg4": 4}
MODES = os.environ.get("PROBE_MODES", ",".join(FORMS)).split(",")
SHAPES = {
    "wq_a": (1280, 5120),
    "wkv": (512, 5120),
    "wq_b": (32768, 1280),
    "indexer.wq_b": (4096, 1280),
    "wo_b": (5120, 8192),
}


@triton.jit
def _e4m3_scaled(u, s):
    """bf16 e4m3(u)·s for e4m3 bytes u and bf16 powers of two s·2^-120 (four at a time): per
    pair of bytes b, the halves (b & 0x7F)·16 + (b & 0x80)·256 = b·16 + (b & 0x80)·240."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 p, q, t, u;
        prmt.b32 p, $2, 0, 0x4140;
        prmt.b32 q, $2, 0, 0x4342;
        and.b32 t, p, 0x00800080;
        and.b32 u, q, 0x00800080;
        mad.lo.u32 p, t, 15, p;
        mad.lo.u32 q, u, 15, q;
        shl.b32 p, p, 4;
        shl.b32 q, q, 4;
        mul.rn.bf16x2 $0, p, $3;
        mul.rn.bf16x2 $1, q, $4;
        }
        """,
        "=r,=r,r,r,r",
        [u, s],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _deq(b, e, ASM: tl.constexpr):
    """e4m3 values b times their e8m0 scale bytes e, as bf16: `asm` or `deq`."""
    if ASM:
        s = ((e.to(tl.int32) + 120) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 2^(e-127+120), e <= 134
        return _e4m3_scaled(b.to(tl.uint8, bitcast=True), s)
    return (b.to(tl.float32) * _e8m0(e.to(tl.int32))).to(tl.bfloat16)


@triton.jit
def _deq_chunk(wp, sp, k, cok, ASM: tl.constexpr):
    """One [BK, BN] weight chunk, loaded and dequantized to bf16 (`deq` or `asm`)."""
    b = tl.load(wp + k[:, None], mask=cok[None, :], other=0.0)
    e = tl.load(sp + (k // 32)[:, None], mask=cok[None, :], other=127)
    return _deq(b, e, ASM)


@triton.jit
def _probe_kernel(
    x,
    w,
    sc,
    part,
    M,
    N,
    K,
    IPS,
    MODE: tl.constexpr,
    U: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    pm, pn, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pm * BM + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    rok, cok = rows < M, cols < N
    ks = tl.arange(0, BK)
    xp = x + rows[:, None] * K
    wp = w + cols[None, :].to(tl.int64) * K
    sp = sc + (cols // 32)[None, :] * (K // 32)
    if MODE >= 8:  # U chunks per iteration: all converted, then their products into the one accumulator in order
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(IPS // U):
            k = (seg * IPS + i * U) * BK + ks
            b0 = _deq_chunk(wp, sp, k, cok, MODE == 9)
            b1 = _deq_chunk(wp, sp, k + BK, cok, MODE == 9)
            a0 = tl.load(xp + k[None, :], mask=rok[:, None], other=0.0)
            a1 = tl.load(xp + (k + BK)[None, :], mask=rok[:, None], other=0.0)
            if U == 4:
                b2 = _deq_chunk(wp, sp, k + 2 * BK, cok, MODE == 9)
                b3 = _deq_chunk(wp, sp, k + 3 * BK, cok, MODE == 9)
                a2 = tl.load(xp + (k + 2 * BK)[None, :], mask=rok[:, None], other=0.0)
                a3 = tl.load(xp + (k + 3 * BK)[None, :], mask=rok[:, None], other=0.0)
            acc = tl.dot(a0, b0, acc)
            acc = tl.dot(a1, b1, acc)
            if U == 4:
                acc = tl.dot(a2, b2, acc)
                acc = tl.dot(a3, b3, acc)
    elif MODE >= 6:  # the next chunk's weight loaded into registers while this one is converted (no cp.async)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        k = seg * IPS * BK + ks
        b_next = tl.load(wp + k[:, None], mask=cok[None, :], other=0.0)
        e_next = tl.load(sp + (k // 32)[:, None], mask=cok[None, :], other=127)
        for i in range(IPS):
            b, e = b_next, e_next
            kn = k + BK
            nok = i + 1 < IPS
            b_next = tl.load(wp + kn[:, None], mask=cok[None, :] & nok, other=0.0)
            e_next = tl.load(sp + (kn // 32)[:, None], mask=cok[None, :] & nok, other=127)
            a = tl.load(xp + k[None, :], mask=rok[:, None], other=0.0)
            acc = tl.dot(a, _deq(b, e, MODE == 7), acc)
            k = kn
    elif MODE >= 4:  # transposed: the dequantized weight is the product's first operand, in registers
        xpt = x + rows[None, :] * K  # [BK, BM]
        wpt = w + cols[:, None].to(tl.int64) * K  # [BN, BK]
        spt = sc + (cols // 32)[:, None] * (K // 32)
        acct = tl.zeros((BN, BM), dtype=tl.float32)
        for i in range(IPS):
            k = (seg * IPS + i) * BK + ks
            at = tl.load(xpt + k[:, None], mask=rok[None, :], other=0.0)
            bt = tl.load(wpt + k[None, :], mask=cok[:, None], other=0.0)
            e = tl.load(spt + (k // 32)[None, :], mask=cok[:, None], other=127)
            acct = tl.dot(_deq(bt, e, MODE == 5), at, acct)
        acc = tl.trans(acct)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(IPS):
            k = (seg * IPS + i) * BK + ks
            a = tl.load(xp + k[None, :], mask=rok[:, None], other=0.0)
            b = tl.load(wp + k[:, None], mask=cok[None, :], other=0.0)
            if MODE <= 1:
                e = tl.load(sp + (k // 32)[:, None], mask=cok[None, :], other=127)
                b = _deq(b, e, MODE == 1)
            elif MODE == 2:
                b = b.to(tl.bfloat16)
            acc = tl.dot(a, b, acc)
    ok = rok[:, None] & cok[None, :]
    tl.store(part + (seg * M + rows[:, None]) * N + cols[None, :], acc, mask=ok)


def launch(mode: str, x, w, sc, part, segs: int):
    m, K = x.shape
    N = w.shape[0]
    if mode == "bytes":
        w, K = w.view(torch.uint8).view(BF), K // 2
        x = x[:, :K]
    segs *= SEG_MULT.get(mode, 1)
    ips = K // TC.BK // segs
    grid = (triton.cdiv(m, TC.BM), triton.cdiv(N, TC.BN), segs)
    _probe_kernel[grid](
        x,
        w,
        sc,
        part,
        m,
        N,
        K,
        ips,
        MODE=FORMS[mode][0],
        BM=TC.BM,
        BN=TC.BN,
        BK=TC.BK,
        U=FORMS[mode][3],
        num_warps=FORMS[mode][1],
        num_stages=FORMS[mode][2],
    )
    return part


def check_exact(dev) -> bool:
    """Every exact form against `deq` on every finite e4m3 byte (both signs, subnormals)
    under scales 2^-20..2^5: the same fp32 partials, bit for bit."""
    N, K = 256, 1024
    g = torch.Generator(device="cpu").manual_seed(1)
    codes = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    wb = codes[torch.randint(len(codes), (N, K), generator=g)]
    w = wb.view(torch.float8_e4m3fn).to(dev)
    sc = (torch.randint(107, 133, (N // 32, K // 32), generator=g)).to(torch.uint8).to(dev)
    x = qdq.fp8_qdq(torch.randn(64, K, generator=g).to(BF).to(dev))
    parts = {}
    for mode in MODES:
        if mode in ("noscale", "bytes") or mode in SEG_MULT:  # not exact / another split (other bits)
            continue
        parts[mode] = launch(mode, x, w, sc, torch.zeros(1, 64, N, device=dev), 1).clone()
    ref = (x.double() @ dequant_weight(w, sc).double().t()).float()
    same = all(torch.equal(parts["deq"], parts[md]) for md in parts)
    err = float((parts["deq"] - ref).abs().max())
    eq = ", ".join(f"{md} == deq: {torch.equal(parts[md], parts['deq'])}" for md in parts)
    print(f"exact check: {eq}", flush=True)
    print(f"deq vs fp64 max abs err {err:.3g}", flush=True)
    return same


def main() -> None:
    from attnv41.bench.common import Timer  # noqa: PLC0415

    dev = torch.device("cuda")
    ok = check_exact(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for name, (N, K) in SHAPES.items():
        w8, sc = quant_weight(torch.randn(N, K, generator=gen, device=dev) * 0.05)
        sc = sc.view(torch.uint8)
        segs = TC.plan(N, K, 1)
        nbytes = w8.numel()
        copies = max(1, -(-(200 << 20) // nbytes))
        ws = [w8.clone() for _ in range(copies)]
        for m in (1, 64):
            x = qdq.fp8_qdq(torch.randn(m, K, generator=gen, device=dev).to(BF))
            part = torch.empty(4 * segs, m, N, device=dev)  # room for the deqseg forms
            for mode in MODES:
                chunks, mult, u = K // TC.BK, SEG_MULT.get(mode, 1), FORMS[mode][3]
                if chunks % (segs * mult) or (chunks // (segs * mult)) % u:
                    continue  # the form does not cover this shape's chunks
                t = timer.time_graph(
                    [
                        lambda w_=w_, mode=mode, x=x, sc=sc, part=part, segs=segs: launch(mode, x, w_, sc, part, segs)
                        for w_ in ws
                    ],
                    reps=10,
                )
                us = t.median_ms * 1e3
                rows.append(dict(name=name, m=m, mode=mode, us=us, gbs=nbytes / us * 1e-3))
                print(f"{name:14s} m={m:3d} {mode:8s} {us:8.1f} µs {nbytes / us * 1e-3:7.0f} GB/s", flush=True)
            # the production kernel, same weight (split sum included)
            out = torch.empty(m, N, dtype=BF, device=dev)
            t = timer.time_graph(
                [lambda w_=w_, x=x, sc=sc, out=out: TC.fp8_mm_batch(x, w_, sc, out, xq=x) for w_ in ws], reps=10
            )
            us = t.median_ms * 1e3
            rows.append(dict(name=name, m=m, mode="tc_mm", us=us, gbs=nbytes / us * 1e-3))
            print(f"{name:14s} m={m:3d} {'tc_mm':8s} {us:8.1f} µs {nbytes / us * 1e-3:7.0f} GB/s", flush=True)
        del ws
    print("\n| weight | m | " + " | ".join([*MODES, "tc_mm"]) + " |")
    print("|---" * (len(MODES) + 3) + "|")
    for name in SHAPES:
        for m in (1, 64):
            cells = [
                next((r for r in rows if (r["name"], r["m"], r["mode"]) == (name, m, md)), None)
                for md in [*MODES, "tc_mm"]
            ]
            print(f"| {name} | {m} | " + " | ".join("" if c is None else f"{c['us']:.1f}" for c in cells) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_tc_probe.json"), "w") as f:
            json.dump(dict(exact=ok, rows=rows), f, indent=1)
    sys.exit(0 if ok else 1)


def plans() -> None:
    """`python3 scripts/fp8_tc_probe.py plans`: the production `fp8_mm_batch` (its ordered
    split-K sum included) under other split rules (`tc_mm._TARGET_PROGRAMS`,
    `_MIN_SEG_PRODUCTS`: more segments, more programs), each checked against the fp64
    product first; µs per weight, weights cold."""
    from attnv41.bench.common import Timer  # noqa: PLC0415

    dev = torch.device("cuda")
    TC.prepare(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    rules = [(128, 10), (256, 10), (256, 5), (512, 5), (512, 2), (1024, 2)]
    base = (TC._TARGET_PROGRAMS, TC._MIN_SEG_PRODUCTS)
    rows = []
    for name, (N, K) in SHAPES.items():
        w8, sc = quant_weight(torch.randn(N, K, generator=gen, device=dev) * 0.05)
        sc = sc.view(torch.uint8)
        W = dequant_weight(w8, sc).double()
        copies = max(1, -(-(200 << 20) // w8.numel()))
        ws = [w8.clone() for _ in range(copies)]
        for m in (1, 64):
            x = qdq.fp8_qdq(torch.randn(m, K, generator=gen, device=dev).to(BF))
            ref, A = x.double() @ W.t(), x.double().abs() @ W.abs().t()
            out = torch.empty(m, N, dtype=BF, device=dev)
            for tp, mp in rules:
                TC._TARGET_PROGRAMS, TC._MIN_SEG_PRODUCTS = tp, mp
                try:
                    segs = TC.plan(N, K, 1)
                    TC.fp8_mm_batch(x, ws[0], sc, out, xq=x)
                    err = float(((out.double() - ref).abs() / (A + 1e-30)).max())
                    assert err < 2.0**-7, f"error {err}"
                    fns = [lambda w_=w_, x=x, sc=sc, out=out: TC.fp8_mm_batch(x, w_, sc, out, xq=x) for w_ in ws]
                    us = timer.time_graph(fns, reps=10).median_ms * 1e3
                finally:
                    TC._TARGET_PROGRAMS, TC._MIN_SEG_PRODUCTS = base
                rows.append(dict(name=name, m=m, target=tp, min_products=mp, segs=segs, us=us))
                print(f"{name:14s} m={m:3d} target {tp:5d} min {mp:3d}: {segs:3d} segments {us:7.1f} µs", flush=True)
        del ws
    print("\n| weight | m | " + " | ".join(f"{tp}/{mp}" for tp, mp in rules) + " |")
    print("|---" * (len(rules) + 2) + "|")
    for name in SHAPES:
        for m in (1, 64):
            cells = [r for r in rows if (r["name"], r["m"]) == (name, m)]
            print(f"| {name} | {m} | " + " | ".join(f"{c['us']:.1f} ({c['segs']})" for c in cells) + " |")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "fp8_tc_plans.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    plans() if sys.argv[1:] == ["plans"] else main()
