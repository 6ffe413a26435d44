# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Probe: wo_a stored as FP8 (its checkpoint bytes: e4m3 + e8m0 scales, half the bf16 bytes)
and run as the lane GEMV with x's values as they are (`fp8_mm(..., xq=x)`: every term
w·(x·sw) exact, the bf16 einsum's terms), against cuBLAS's grouped bf16 product (the
single-sequence runtime's wo_a today) and `group_gemv` (bf16). The FP8 stand-in is one
[8192, 4096] weight (the same bytes and per-program work as the 8 groups). m = 1, weights
cold: one CUDA graph over copies past the L2, flushed before each replay. CUDA only.
"""

from __future__ import annotations

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import fp8_linear as F
from attnv41.kernels import gemv as G
from attnv41.kernels import linear
from attnv41.reference.fp8 import dequant_weight, quant_weight

BF = torch.bfloat16


def main(dev):
    timer = Timer(dev, flush_l2=True)
    F.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    Gr, R, GW = 8, 1024, 4096
    n = 8
    ws = []
    for _ in range(n):
        w = (torch.randn(Gr * R, GW, generator=gen, device=dev) * GW**-0.5 * 3).to(BF)
        w8, sc = quant_weight(w)
        ws.append((w8, sc, dequant_weight(w8, sc).view(Gr, R, GW).contiguous()))
    os_ = [torch.randn(1, Gr, GW, generator=gen, device=dev).to(BF) for _ in range(n)]
    outs = [torch.empty(1, Gr, R, dtype=BF, device=dev) for _ in range(n)]
    flat = [torch.empty(1, Gr * R, dtype=BF, device=dev) for _ in range(n)]
    xs = [torch.randn(1, GW, generator=gen, device=dev).to(BF) for _ in range(n)]
    from attnv41.kernels import tc_mm as TC

    TC.prepare(dev)
    o64 = [torch.randn(64, Gr, GW, generator=gen, device=dev).to(BF) for _ in range(n)]
    out64 = [torch.empty(64, Gr, R, dtype=BF, device=dev) for _ in range(n)]
    q3 = [w[0].view(Gr, R, GW) for w in ws]
    cases = {
        "tc_group_mm bf16 m=1": lambda i: TC.tc_group_mm(os_[i], ws[i][2], outs[i]),
        "tc_group_mm fp8 m=1": lambda i: TC.tc_group_mm(os_[i], q3[i], outs[i], ws[i][1]),
        "tc_group_mm bf16 m=64": lambda i: TC.tc_group_mm(o64[i], ws[i][2], out64[i]),
        "tc_group_mm fp8 m=64": lambda i: TC.tc_group_mm(o64[i], q3[i], out64[i], ws[i][1]),
        "group_gemv fp8 m=1": lambda i: G.group_gemv(os_[i], q3[i], outs[i], ws[i][1]),
        "cublas group_mm bf16": lambda i: linear.group_mm(os_[i], ws[i][2], outs[i]),
        "group_gemv bf16": lambda i: G.group_gemv(os_[i], ws[i][2], outs[i]),
        "fp8 lanes xq=x (stand-in)": lambda i: F.fp8_mm(xs[i], ws[i][0], ws[i][1], flat[i], xq=xs[i]),
        "fp8 lanes quantizing x": lambda i: F.fp8_mm(xs[i], ws[i][0], ws[i][1], flat[i]),
    }
    # the stand-in's values: each output the exact sum of the bf16 terms (within fp32 order)
    F.fp8_mm(xs[0], ws[0][0], ws[0][1], flat[0], xq=xs[0])
    want = (xs[0].double() @ ws[0][2].view(Gr * R, GW).double().t()).float()
    err = ((flat[0].float() - want).abs() / want.abs().clamp_min(1e-3)).max().item()
    print(f"fp8 xq=x against the bf16 einsum's exact sums: max rel {err:.2e}")
    for name, fn in cases.items():
        t = timer.time_graph([lambda i=i: fn(i) for i in range(n)])
        print(f"{name:28s} {t.median_ms * 1e3:7.1f} us", flush=True)


if __name__ == "__main__":
    main(torch.device("cuda"))
