# ruff: noqa: B023  (the timed lambdas run inside the loop iteration that made them)
"""Probe: FP8 weights at m = 1 on the tensor cores' own e4m3 MMA (wgmma e4m3 × e4m3, one
32-column scale block per dot, both scales applied to each block's fresh sum, the blocks in
K order in fp32) against the production CUDA-core lane GEMV (`fp8_linear.fp8_mm`), at the
V4.1-Flash shapes; with cuBLAS `_scaled_mm` (tensor-wise scales, not the released math) as
a speed peer. CUDA only; a development tool.

For each variant: the error against the reference `fp8_linear` (max |Δ| over Σ|terms| and in
bf16 ulps), bits equal on a second call, token 0's bits at m = 1 and m = 16, then the time:
one CUDA graph over copies of the weights past the L2, flushed before each replay.
"""

from __future__ import annotations

import json
import os
import time
import traceback

import torch

from attnv41.bench.common import Timer
from attnv41.kernels import fp8_linear as F
from attnv41.kernels._triton import round_bf16, tl, triton
from attnv41.kernels.gemv_fp8 import _e8m0, _quant_block
from attnv41.reference.fp8 import fp8_linear

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
SHAPES = {
    "wq_a": (5120, 1280),
    "wkv": (5120, 512),
    "wq_b": (1280, 32768),
    "wo_b": (8192, 5120),
    "indexer.wq_b": (1280, 4096),
}  # fmt: skip  name: (K, N)
L2_PASS = 128 << 20


@triton.jit
def _mma_kernel(x_ptr, stride_xm, xq_ptr, sx_ptr, w_ptr, sw_ptr, out_ptr, stride_om, part_ptr, lock_ptr, M, N, K,
                SEGS: tl.constexpr, BPS: tl.constexpr, BN: tl.constexpr, MB: tl.constexpr,
                STAGES: tl.constexpr, UNROLL: tl.constexpr, XQ: tl.constexpr):  # fmt: skip
    tile = tl.program_id(0)
    seg = tl.program_id(1)
    offs_n = (tile * BN + tl.arange(0, BN)).to(tl.int64)
    offs_t = tl.arange(0, MB).to(tl.int64)
    offs_k = tl.arange(0, 32)
    t_ok = offs_t < M
    nkb = K // 32
    w_rows = w_ptr + offs_n[:, None] * K + offs_k[None, :]
    x_rows = x_ptr + offs_t[:, None] * stride_xm + offs_k[None, :]
    sw_rows = sw_ptr + (offs_n // 32) * nkb
    acc = tl.zeros((BN, MB), tl.float32)
    b0 = seg * BPS
    for i in tl.range(0, BPS // UNROLL, num_stages=STAGES):
        for u in tl.static_range(UNROLL):
            b = b0 + i * UNROLL + u
            k0 = b.to(tl.int64) * 32
            w = tl.load(w_rows + k0)
            if XQ:  # x's e4m3 values [MB, K] (rows past M zero) and scales [MB, K/32], made outside
                q8 = tl.load(xq_ptr + offs_t[:, None] * K + offs_k[None, :] + k0)
                sx = tl.load(sx_ptr + offs_t * nkb + b)
            else:
                xv = tl.load(x_rows + k0, mask=t_ok[:, None], other=0.0).to(tl.float32)
                q, sx = _quant_block(xv, False)
                q8 = q.to(tl.float8e4nv)
            p = tl.dot(w, tl.trans(q8))  # [BN, MB] fp32, a fresh sum per block
            sw = _e8m0(tl.load(sw_rows + b).to(tl.int32))
            acc += p * (sw[:, None] * sx[None, :])
    ok = t_ok[None, :] & (offs_n < N)[:, None]
    out = out_ptr + offs_t[None, :] * stride_om + offs_n[:, None]
    if SEGS > 1:
        part = part_ptr + offs_t[None, :] * N + offs_n[:, None]
        plane = tl.cast(M, tl.int64) * N
        tl.store(part + seg * plane, acc, mask=ok)
        tl.debug_barrier()
        lock = lock_ptr + tile
        arrived = tl.atomic_add(lock, 1, sem="acq_rel", scope="gpu")
        if arrived == SEGS - 1:
            total = tl.load(part, mask=ok, other=0.0, cache_modifier=".cg")
            for s in tl.static_range(1, SEGS):
                total += tl.load(part + s * plane, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(out, round_bf16(total), mask=ok)
            tl.atomic_xchg(lock, 0)
    else:
        tl.store(out, round_bf16(acc), mask=ok)


_ws = {}


def prequant(x, mb=16):
    """x bf16 [m, K] → (e4m3 [mb, K], fp32 scales [mb, K/32]), rows past m zero (scale 1)."""
    from attnv41.reference.fp8 import act_quant

    m, K = x.shape
    q, sx = act_quant(x, 32)
    xq = torch.zeros(mb, K, dtype=FP8, device=x.device)
    xs = torch.ones(mb, K // 32, dtype=torch.float32, device=x.device)
    xq[:m] = q.to(FP8)
    xs[:m] = sx
    return xq, xs


def mma(x, w, s, out, segs, bn=64, stages=4, warps=4, unroll=1, xq=None):
    M, K = x.shape
    N = w.shape[0]
    nkb = K // 32
    assert nkb % segs == 0 and N % bn == 0 and (nkb // segs) % unroll == 0
    key = (x.device, N, segs)
    if key not in _ws:
        _ws[key] = (torch.empty(segs * 16 * N, dtype=torch.float32, device=x.device),
                    torch.zeros(N // bn + 1, dtype=torch.int32, device=x.device))  # fmt: skip
    part, lock = _ws[key]
    q8, sx = xq if xq is not None else (x, x)
    _mma_kernel[(N // bn, segs)](x, x.stride(0), q8, sx, w, s.view(torch.uint8), out, out.stride(0), part, lock,
                                 M, N, K, SEGS=segs, BPS=nkb // segs, BN=bn, MB=16, STAGES=stages, UNROLL=unroll,
                                 XQ=xq is not None, num_warps=warps)  # fmt: skip
    return out


def err_stats(x, w, s, got):
    ref = fp8_linear(x, w, s).double()
    sw = s.view(torch.uint8).double().sub(127).exp2().max()
    A = (x.double().abs() * 1.01) @ w.double().abs().t() * sw
    d = (got.double() - ref).abs()
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0**-126))) - 7)
    return dict(max_rel_terms=float((d / A.clamp_min(1e-30)).max()), max_ulps=float((d / ulp).max()),
                frac_differ=float((got.view(torch.int16) != fp8_linear(x, w, s).view(torch.int16)).float().mean()),
                nan=int(torch.isnan(got.float()).sum()))  # fmt: skip


def best_segs(N, nkb, bn=64):
    """The smallest divisor of the K blocks giving at least 256 programs."""
    for s in range(1, nkb + 1):
        if nkb % s == 0 and (N // bn) * s >= 256:
            return s
    return nkb


def main(dev):
    t0 = time.time()
    timer = Timer(dev, flush_l2=True)
    a = torch.ones(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    copy = 2 * (1 << 30) / (timer.time(lambda: b.copy_(a), warmup=3, reps=20).median_ms * 1e-3) / 1e9
    a = b = None
    print(f"{torch.cuda.get_device_name(dev)}; copy {copy:.0f} GB/s", flush=True)
    F.prepare(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    budget = float(os.environ.get("BUDGET_S", "200"))

    def fp8_weight(N, K):
        w = (torch.randn(N, K, generator=gen, device=dev) * 64).clamp(-448, 448).to(FP8)
        sc = torch.randint(118, 124, (-(-N // 32), K // 32), generator=gen, device=dev, dtype=torch.uint8)
        return w, sc.view(torch.float8_e8m0fnu)

    for name, (K, N) in SHAPES.items():
        nbytes = N * K + N * K // 1024 + 2 * (K + N)
        n = max(1, min(16, -(-L2_PASS // nbytes)))
        xs = [torch.randn(1, K, generator=gen, device=dev).to(BF) for _ in range(n)]
        ws = [fp8_weight(N, K) for _ in range(n)]
        outs = [torch.empty(1, N, dtype=BF, device=dev) for _ in range(n)]
        nkb = K // 32
        segs_opts = sorted({s for s in (1, 2, 4, 5, 8, 10, 16, 20, 32, 40) if nkb % s == 0})
        variants = [("lanes", None)]
        for bn in (64, 128):
            for segs in segs_opts:
                progs = (N // bn) * segs
                if 128 <= progs <= 1400:
                    variants.append(("mma", dict(segs=segs, bn=bn, stages=4)))
                    variants.append(("mma_xq", dict(segs=segs, bn=bn, stages=4)))
        for st in (2, 6, 8):
            variants.append(("mma_xq", dict(segs=best_segs(N, nkb), bn=64, stages=st)))
        variants.append(("scaled_mm", None))
        for kind, cfg in variants:
            if time.time() - t0 > budget:
                break
            row = dict(name=name, kind=kind, cfg=cfg, bytes=nbytes)
            try:
                if kind == "lanes":

                    def call(i):
                        return F.fp8_mm(xs[i], ws[i][0], ws[i][1], outs[i])
                elif kind == "mma":

                    def call(i):
                        return mma(xs[i], ws[i][0], ws[i][1], outs[i], **cfg)
                elif kind == "mma_xq":
                    xqs = [prequant(x) for x in xs]

                    def call(i):
                        return mma(xs[i], ws[i][0], ws[i][1], outs[i], xq=xqs[i], **cfg)
                else:
                    xq16 = [torch.zeros(16, K, device=dev).to(FP8) for _ in range(n)]
                    one = torch.ones((), device=dev)

                    def call(i):
                        return torch._scaled_mm(xq16[i], ws[i][0].t(), scale_a=one, scale_b=one, out_dtype=BF)

                if kind != "scaled_mm":
                    first = call(0).clone()
                    row["deterministic"] = bool(torch.equal(first.view(torch.int16), call(0).view(torch.int16)))
                    row.update(err_stats(xs[0], ws[0][0], ws[0][1], first))
                    if kind in ("mma", "mma_xq"):
                        x16 = torch.cat([xs[0], torch.randn(15, K, generator=gen, device=dev).to(BF)])
                        o16 = torch.empty(16, N, dtype=BF, device=dev)
                        mma(x16, ws[0][0], ws[0][1], o16, xq=prequant(x16) if kind == "mma_xq" else None, **cfg)
                        row["m16_same"] = bool(torch.equal(o16[:1].view(torch.int16), first.view(torch.int16)))
                t = timer.time_graph([lambda i=i: call(i) for i in range(n)])
                row.update(us=t.median_ms * 1e3, gbps=nbytes / (t.median_ms * 1e-3) / 1e9)
                row["pct_copy"] = 100 * row["gbps"] / copy
                print(f"{name:13s} {kind:9s} {str(cfg):44s} {row['us']:7.1f} us {row['gbps']:6.0f} GB/s "
                      f"{row['pct_copy']:5.1f}%  err {row.get('max_rel_terms', 0):.2e} ulps {row.get('max_ulps', 0):.2f} "
                      f"differ {row.get('frac_differ', 0):.3f} det {row.get('deterministic')} m16 {row.get('m16_same')}",
                      flush=True)  # fmt: skip
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:400]
                traceback.print_exc()
                print(f"{name:13s} {kind:9s} {str(cfg):44s} ERROR {row['error'][:200]}", flush=True)
            rows.append(row)
        xs = ws = outs = None
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "fp8_mma_probe.json"), "w") as f:
            json.dump(dict(copy_gbps=copy, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(torch.device("cuda"))
