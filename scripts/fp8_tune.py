# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Tile sweep of the FP8 linear at the V4.1-Flash shapes (GPU only; a development tool,
not part of `attnv41 bench`). Prints one line per (shape, m, config) with the time per
call (CUDA graph over copies, L2 flushed), GB/s, the floor of the bytes read and the
bf16 cuBLAS time of the same shape; prefill lines add TFLOP/s against the FP8 matmul
rate (torch._scaled_mm, per-tensor scales, 8192^3) measured here. Writes JSON to argv[1]."""

from __future__ import annotations

import json
import sys
import traceback

import torch

from attnv41.bench.common import Timer, measure_ceilings
from attnv41.kernels import fp8_linear as K

SHAPES = {"wq_a": (1280, 5120), "wq_b": (32768, 1280), "wkv": (512, 5120), "wo_b": (5120, 8192), "iwq_b": (4096, 1280)}
DEC = [(64, 4, 3, 512, 4), (64, 4, 3, 512, 8), (64, 4, 3, 1024, 4), (32, 4, 3, 1024, 4), (128, 8, 3, 512, 4),
       (64, 8, 3, 512, 8), (32, 2, 3, 1024, 8), (64, 4, 3, 256, 2)]  # fmt: skip
PRE = [("cublas",)]


def fp8_rate(timer: Timer) -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    t = timer.time(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 3, 20)
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


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
            if m == 8192 and name == "iwq_b":
                continue
            copies = 8 if m <= 16 else 1
            xs = [torch.randn(m, Kd, device=dev).to(torch.bfloat16) for _ in range(copies)]
            ws = [(torch.randn(N, Kd, device=dev) * 32).to(torch.float8_e4m3fn) for _ in range(copies)]
            ss = [torch.full((-(-N // 32), Kd // 32), 120, dtype=torch.uint8, device=dev) for _ in range(copies)]
            wb = [w.to(torch.bfloat16) for w in ws]
            outs = [torch.empty(m, N, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
            tb = timer.time_graph([lambda i=i: torch.mm(xs[i], wb[i].t(), out=outs[i]) for i in range(copies)])
            nbytes = N * Kd + ss[0].numel() + 2 * m * (Kd + N)
            floor = nbytes / ceil.copy_gbps / 1e9 * 1e3
            flops = 2 * m * N * Kd
            cfgs = DEC if m == 1 else ([DEC[0]] if m == 16 else PRE)
            for cfg in cfgs:
                if m <= 16:
                    K._DEC_BN, K._DEC_WARPS, K._DEC_STAGES, K._TARGET_PROGRAMS, K._BKB = cfg
                try:
                    K.fp8_mm(xs[0], ws[0], ss[0], out=outs[0])
                    torch.cuda.synchronize()
                    t = timer.time_graph(
                        [lambda i=i: K.fp8_mm(xs[i], ws[i], ss[i], out=outs[i]) for i in range(copies)]
                    )
                    row = dict(name=name, m=m, cfg=cfg, segs=K.plan(N, Kd)[0], ms=t.median_ms, bf16_ms=tb.median_ms,
                               floor_ms=floor, x_floor=t.median_ms / floor, gbps=nbytes / t.median_ms / 1e6,
                               tflops=flops / t.median_ms / 1e9, pct_fp8=flops / t.median_ms / 1e9 / r8 * 100)  # fmt: skip
                except Exception as e:
                    row = dict(name=name, m=m, cfg=cfg, error=f"{type(e).__name__}: {e}"[:400])
                    traceback.print_exc()
                res["rows"].append(row)
                if "error" in row:
                    print(f"{name:6s} m={m:5d} {cfg} ERROR {row['error'][:200]}")
                else:
                    print(
                        f"{name:6s} m={m:5d} {str(cfg):22s} segs={row['segs']:3d} {row['ms'] * 1e3:8.1f} us "
                        f"x_floor {row['x_floor']:5.2f} bf16 {tb.median_ms * 1e3:8.1f} us "
                        f"{row['tflops']:7.1f} TF ({row['pct_fp8']:4.1f}% fp8)"
                    )
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
