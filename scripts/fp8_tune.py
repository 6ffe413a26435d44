# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Sweep of the FP8 linear's launches at the V4.1-Flash shapes (GPU only; a development
tool, not part of `attnv41 bench`).

Decode (m = 1 and 16): the CUDA-core GEMV per tile config and e4m3 weight conversion.
Prefill (m = 8192): the shipped path (exact `fp8_qdq`, bf16 dequantization, cuBLAS) with
the activation round trip by the hardware cast or by bit arithmetic, and its two
pre-passes alone. Every variant is first checked
on 4 rows against the exact twin (`reference.fp8.fp8_linear`) with the kernel tests'
bound; a variant that fails is reported and not timed. Times: CUDA graph over copies, L2
flushed. Prints one line per row and writes JSON to argv[1]."""

from __future__ import annotations

import json
import sys
import traceback

import torch

from attnv41.bench.common import Timer, measure_ceilings
from attnv41.kernels import fp8_linear as K
from attnv41.kernels import qdq
from attnv41.reference.fp8 import act_quant, e8m0_to_float, fp8_linear

SHAPES = {"wq_a": (1280, 5120), "wq_b": (32768, 1280), "wkv": (512, 5120), "wo_b": (5120, 8192), "iwq_b": (4096, 1280)}
# BN, warps, stages, program target, BKB, e4m3 weights by integer ops (_W_BITS)
FMA = [(32, 2, 3, 1024, 8, False), (32, 2, 3, 1024, 8, True), (32, 4, 3, 1024, 8, True), (64, 4, 3, 1024, 8, True),
       (32, 2, 4, 512, 8, True), (16, 2, 3, 2048, 8, True)]  # fmt: skip


def fp8_rate(timer: Timer) -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    t = timer.time(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 3, 20)
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def bound_ok(x, w, s, got) -> int:
    """Outputs of `got` (rows of x) outside ulp_bf16(ref) + K·2^-24·Σ|terms| of the exact twin."""
    ref = fp8_linear(x, w, s)
    qx, sx = act_quant(x)
    sw = e8m0_to_float(s).repeat_interleave(32, 0)[: w.shape[0]]
    nb = x.shape[1] // 32
    a = torch.einsum("mbk,nbk->mnb", qx.double().abs().view(-1, nb, 32), w.double().abs().view(-1, nb, 32))
    A = (a * sx.double()[:, None, :] * sw.double()[None]).sum(-1)
    r = ref.double().abs()
    bnd = torch.exp2(torch.floor(torch.log2(r.clamp_min(2.0**-126))) - 7) + x.shape[1] * 2.0**-24 * A
    err = (got.double() - ref.double()).abs()
    return int((err > bnd).sum()) + int(torch.isnan(got.float()).sum())


def set_decode(kind, cfg):
    if kind == "fma":
        K._DEC_BN, K._DEC_WARPS, K._DEC_STAGES, K._TARGET_PROGRAMS, K._BKB, K._W_BITS = cfg
    elif kind in ("cublas", "qdq"):
        qdq._HW_E4M3 = cfg  # the activation round trip by the hardware cast, or by bit arithmetic


def main(path: str) -> None:
    dev = torch.device("cuda")
    timer = Timer(dev, flush_l2=True)
    ceil = measure_ceilings(dev)
    r8 = fp8_rate(Timer(dev))
    res = {"copy_gbps": ceil.copy_gbps, "bf16_tflops": ceil.mm_tflops, "fp8_tflops": r8, "rows": []}
    print(f"copy {ceil.copy_gbps:.0f} GB/s, bf16 mm {ceil.mm_tflops:.0f} TFLOP/s, fp8 scaled_mm {r8:.0f} TFLOP/s")
    K.prepare(dev)
    for name, (N, Kd) in SHAPES.items():
        for m in (1, 16, 8192):
            copies = 8 if m <= 16 else 1
            gen = torch.Generator().manual_seed(N + Kd + m)
            xs = [torch.randn(m, Kd, generator=gen).to(torch.bfloat16).to(dev) for _ in range(copies)]
            ws = [(torch.randn(N, Kd, generator=gen) * 32).clamp(-448, 448).to(torch.float8_e4m3fn).to(dev)
                  for _ in range(copies)]  # fmt: skip
            ss = [torch.randint(116, 124, (-(-N // 32), Kd // 32), generator=gen, dtype=torch.uint8).to(dev)
                  for _ in range(copies)]  # fmt: skip
            outs = [torch.empty(m, N, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
            wb = [K.dequant_bf16(w, s) for w, s in zip(ws, ss)]
            tb = timer.time_graph([lambda i=i: torch.mm(xs[i], wb[i].t(), out=outs[i]) for i in range(copies)])
            wb = None
            nbytes = N * Kd + ss[0].numel() + 2 * m * (Kd + N)
            floor = nbytes / ceil.copy_gbps / 1e9 * 1e3
            flops = 2 * m * N * Kd
            x4, w0, s0 = xs[0][:4].cpu(), ws[0].cpu(), ss[0].cpu()
            if m <= 16:
                variants = [("fma", c) for c in (FMA if m == 1 else FMA[:2])]
            else:
                xq = [qdq.fp8_qdq(x) for x in xs]
                variants = [("cublas", True), ("cublas", False), ("qdq", True), ("qdq", False), ("dequant", None)]
            for kind, cfg in variants:
                row = dict(name=name, m=m, kind=kind, cfg=str(cfg), bf16_ms=tb.median_ms, floor_ms=floor)
                try:
                    set_decode(kind, cfg)
                    if kind == "fma":
                        fn = [lambda i=i: K.fp8_mm(xs[i], ws[i], ss[i], out=outs[i]) for i in range(copies)]
                        row["segs"] = K.plan(N, Kd)[0]
                    elif kind == "cublas":
                        fn = [lambda i=i: K.fp8_mm(xs[i], ws[i], ss[i], out=outs[i]) for i in range(copies)]
                    elif kind == "qdq":  # the prefill path's parts alone
                        fn = [lambda i=i: qdq.fp8_qdq(xs[i], out=xq[i]) for i in range(copies)]
                    else:
                        fn = [lambda i=i: K.dequant_bf16(ws[i], ss[i]) for i in range(copies)]
                    fn[0]()
                    torch.cuda.synchronize()
                    row["bad"] = bound_ok(x4, w0, s0, outs[0][:4].cpu()) if kind not in ("qdq", "dequant") else 0
                    first = outs[0].clone()
                    fn[0]()
                    row["deterministic"] = bool(torch.equal(first.view(torch.int16), outs[0].view(torch.int16)))
                    if row["bad"] == 0:
                        t = timer.time_graph(fn)
                        row.update(ms=t.median_ms, x_floor=t.median_ms / floor, gbps=nbytes / t.median_ms / 1e6,
                                   tflops=flops / t.median_ms / 1e9, pct_fp8=flops / t.median_ms / 1e9 / r8 * 100)  # fmt: skip
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:400]
                    traceback.print_exc()
                res["rows"].append(row)
                if "error" in row:
                    print(f"{name:6s} m={m:5d} {kind:6s} {row['cfg']:40s} ERROR {row['error'][:160]}", flush=True)
                elif "ms" not in row:
                    print(f"{name:6s} m={m:5d} {kind:6s} {row['cfg']:40s} WRONG: {row['bad']} outputs off", flush=True)
                else:
                    print(
                        f"{name:6s} m={m:5d} {kind:6s} {row['cfg']:40s} {row['ms'] * 1e3:8.1f} us "
                        f"x_floor {row['x_floor']:5.2f} bf16 {tb.median_ms * 1e3:8.1f} us "
                        f"{row['pct_fp8']:5.1f}% fp8 det={row['deterministic']}",
                        flush=True,
                    )
            xs = ws = ss = outs = xq = None  # free before the next shape
            torch.cuda.empty_cache()
    json.dump(res, open(path, "w"), indent=1)
    print("\n== best per (shape, m)")
    best: dict = {}
    for r in res["rows"]:
        if "ms" in r:
            k = (r["name"], r["m"])
            if k not in best or r["ms"] < best[k]["ms"]:
                best[k] = r
    for (n, m), r in best.items():
        print(f"{n:6s} m={m:5d} {r['kind']:6s} {r['cfg']:40s} {r['ms'] * 1e3:8.1f} us x_floor {r['x_floor']:5.2f} "
              f"{r['pct_fp8']:5.1f}% fp8 (bf16 {r['bf16_ms'] * 1e3:.1f} us)")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
