# ruff: noqa: B023, I001  (the timed lambdas run inside the loop iteration that made them)
"""Probe: a decode GEMV whose weight was asked into L2 (`kernels/prefetch.l2_prefetch`) while
a latency-bound kernel ran, against the same GEMV cold and hot. Per Flash weight (FP8 and
bf16), m = 1, µs, in one CUDA graph replayed after an L2 flush:
  cold:       GEMV alone (weight in DRAM)
  hot:        GEMV alone, replayed without the flush (the weight in L2 where it fits)
  spin+gemv:  a spin kernel of SPIN_US (torch.cuda._sleep: DRAM idle), then the GEMV
  pf+spin+gemv: l2_prefetch(weight), the spin, the GEMV
The last two differ by what the prefetch saves the GEMV behind a kernel that leaves DRAM
idle (the attention's place in a step). CUDA only; JSON to $OUT/l2_prefetch_probe.json.

Run at commit 71890df: kernels/prefetch.py were removed after the run (measured no gain; BENCHMARKS.md,
2026-12-04 fourteenth entry), so this probe no longer runs on later code: a record.
"""

from __future__ import annotations

import json
import os

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import gemv as G
from attnv41.kernels.prefetch import l2_prefetch
from attnv41.reference.fp8 import quant_weight

BF = torch.bfloat16
SPIN_US = float(os.environ.get("SPIN_US", "14"))
SHAPES = {"wq_b": (1280, 32768), "wo_b": (8192, 5120), "wq_a": (5120, 1280), "wo_a": (4096, 8192)}  # (K, N)


def main(dev: torch.device) -> None:
    cold, hot = Timer(dev, flush_l2=True), Timer(dev, flush_l2=False)
    G.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    # cycles of the spin for SPIN_US: measure the clock with one long spin
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    e0.record()
    torch.cuda._sleep(2_000_000)
    e1.record()
    torch.cuda.synchronize()
    cyc_per_us = 2_000_000 / (e0.elapsed_time(e1) * 1e3)
    spin = int(SPIN_US * cyc_per_us)
    t_spin = cold.time_graph([lambda: torch.cuda._sleep(spin)]).median_ms * 1e3
    print(f"{torch.cuda.get_device_name(dev)}; spin {spin} cycles = {t_spin:.1f} us", flush=True)
    rows = []
    for kind in ("fp8", "bf16"):
        for name, (K, N) in SHAPES.items():
            w = (torch.randn(N, K, generator=gen, device=dev) * K**-0.5).to(BF)
            w, s = (w, None) if kind == "bf16" else quant_weight(w)
            grouped = name == "wo_a"
            if grouped:
                x = torch.randn(1, 8, K, generator=gen, device=dev).to(BF)
                out = torch.empty(1, 8, N // 8, dtype=BF, device=dev)
                wg = w.view(8, N // 8, K)

                def gemv():
                    G.group_gemv(x, wg, out, s)
            else:
                x = torch.randn(1, K, generator=gen, device=dev).to(BF)
                out = torch.empty(1, N, dtype=BF, device=dev)

                def gemv():
                    G.gemv(x, (w,), (out,), (s,))

            gemv()
            ref = out.clone()
            res = dict(name=name, kind=kind, bytes=w.numel() * w.element_size())
            res["cold"] = cold.time_graph([gemv]).median_ms * 1e3
            res["hot"] = hot.time_graph([gemv]).median_ms * 1e3
            res["spin+gemv"] = cold.time_graph([lambda: torch.cuda._sleep(spin), gemv]).median_ms * 2e3
            for cap in (None, 24 << 20):
                key = "pf+spin+gemv" + ("" if cap is None else f" (first {cap >> 20} MB)")
                res[key] = (
                    cold.time_graph([lambda: l2_prefetch((w,), max_bytes=cap), lambda: torch.cuda._sleep(spin), gemv])
                    .median_ms * 3e3
                )  # fmt: skip
            res["same_bits"] = bool(torch.equal(out, ref))
            res["gemv_after_spin_saved_us"] = res["spin+gemv"] - res["pf+spin+gemv"]
            rows.append(res)
            print(
                f"{name:6s} {kind:4s} {res['bytes'] / 1e6:6.1f} MB cold {res['cold']:6.1f} hot {res['hot']:6.1f} "
                f"spin+gemv {res['spin+gemv']:6.1f} pf+spin+gemv {res['pf+spin+gemv']:6.1f} "
                f"(24 MB: {res['pf+spin+gemv (first 24 MB)']:6.1f}) same bits {res['same_bits']}",
                flush=True,
            )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "l2_prefetch_probe.json"), "w") as f:
            json.dump(dict(spin_us=t_spin, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(torch.device("cuda"))
