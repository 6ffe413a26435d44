"""What bounds the batched projections? (CUDA; a development probe, not part of `attnv41 bench`.)

Three measurements at the V4.1-Flash projection shapes, bf16 weights:

1. `ceiling`: the weight read alone by a streaming kernel (contiguous 16-byte loads, an
   elementwise max, one reduction at the end), best of several program counts. The read
   rate a kernel can reach on this GPU, to compare the products with (the copy bandwidth
   of `bench` counts a read and a write).
2. `tma`: `tc_mm`'s product of one weight (its launch shape and split plan, partials stored
   and not summed, as scripts/tile_probe.py) with the weight tile loaded by pointer
   (`ptr`, as `tc_mm`), by a TMA descriptor (`tma w`: `triton.tools.tensor_descriptor`,
   one [BN, BK] box per chunk), or both operands by TMA (`tma wx`). Outputs compared byte
   for byte with `ptr`.
3. `segs`: the real `tc_mm` (its fused ordered split-K sum) on the small weights with the
   split count overridden (`tc_mm.plan`), alone and x → [wq_a, wkv] in one
   `mm_many_batch` launch: what the split-K sum costs against the parallelism it buys.

Times: `Timer.time_graph` over copies of the weights (past the L2), L2 flushed before each
replay, median µs per call.

    python3 scripts/mm_probe.py                       # OUT set: $OUT/mm_probe.json
    PARTS=tma,segs M_LIST=1,64 python3 scripts/mm_probe.py
    TRITON_INTERPRET=1 python3 scripts/mm_probe.py --selftest   # tiny shapes on the CPU
"""

# ruff: noqa: B023  (every lambda runs inside its loop iteration: captured into a graph there)
from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from attnv41.kernels import tc_mm as TC

BF = torch.bfloat16
SHAPES = {
    "wq_b": (32768, 1280),
    "wo_b": (5120, 8192),
    "wq_a": (1280, 5120),
    "wkv": (512, 5120),
    "indexer.wq_b": (4096, 1280),
}
M_LIST = [int(v) for v in os.environ.get("M_LIST", "1,64").split(",")]
PARTS = os.environ.get("PARTS", "ceiling,tma,segs").split(",")
SEG_SHAPES = ("wq_a", "wkv", "indexer.wq_b")


@triton.jit
def _stream(w, out, n, PER: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * PER
    acc = tl.full((BLOCK,), float("-inf"), tl.float32)
    for i in range(0, PER, BLOCK):
        o = start + i + tl.arange(0, BLOCK)
        v = tl.load(w + o, mask=o < n, other=float("-inf"))
        acc = tl.maximum(acc, v.to(tl.float32))
    tl.store(out + pid, tl.max(acc, 0))


@triton.jit
def _mm(x, w, wdesc, xdesc, part, M, N, K, MODE: tl.constexpr, SEGS: tl.constexpr, IPS: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """MODE 0: pointer loads (tc_mm's); 1: the weight by TMA; 2: both by TMA."""
    pm, pn, seg = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pm * BM + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    rok = rows < M
    ks = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for i in range(IPS):
        c = seg * IPS + i
        k = c * BK + ks
        if MODE >= 1:
            b = tl.trans(wdesc.load([pn * BN, c * BK]))
        else:
            b = tl.load(w + cols[None, :].to(tl.int64) * K + k[:, None])
        if MODE == 2:
            a = xdesc.load([pm * BM, c * BK])
        else:
            a = tl.load(x + rows[:, None] * K + k[None, :], mask=rok[:, None], other=0.0)
        if x.dtype.element_ty == tl.float32:  # the interpreter's form (selftest: fp32 operands)
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    ok = rok[:, None] & (cols < N)[None, :]
    tl.store(part + (seg * M + rows[:, None]) * N + cols[None, :], acc, mask=ok)


def _launch_mm(mode, x, w, wd, xd, part, m, N, K, segs):
    ips = (K // TC.BK) // segs
    _mm[(-(-m // TC.BM), N // TC.BN, segs)](
        x, w, wd, xd, part, m, N, K, MODE=mode, SEGS=segs, IPS=ips, BM=TC.BM, BN=TC.BN, BK=TC.BK,
        num_warps=TC._WARPS, num_stages=TC._STAGES,
    )  # fmt: skip


def selftest() -> None:
    """Tiny shapes under the interpreter: each mode's partials against the fp64 product."""
    g = torch.Generator().manual_seed(0)
    N, K, m, segs = 128, 512, 3, 2
    w = torch.randn(N, K, generator=g).to(BF).float()
    x = torch.randn(m, K, generator=g).to(BF).float()
    wd = TensorDescriptor.from_tensor(w, [TC.BN, TC.BK])
    xd = TensorDescriptor.from_tensor(x, [TC.BM, TC.BK])
    ref = (x.double() @ w.double().t()).float()
    for mode in (0, 1, 2):
        part = torch.zeros(segs * m * N)
        _launch_mm(mode, x, w, wd, xd, part, m, N, K, segs)
        got = part.view(segs, m, N).sum(0)
        err = float((got - ref).abs().max())
        print(f"selftest mode {mode}: max |err| {err:.3g}")
        assert err < 1e-3, (mode, err)
    out = torch.empty(4)
    wf = w.reshape(-1)
    per = -(-wf.numel() // 4)
    _stream[(4,)](wf, out, wf.numel(), PER=per, BLOCK=1024)
    assert float(out.max()) == float(wf.max()), (out, wf.max())
    print("selftest: ok")


def main() -> None:
    from attnv41.bench.common import Timer

    dev = torch.device("cuda")
    TC.prepare(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
    rows = []

    def rec(part, name, m, kind, us, nbytes, **kw):
        rows.append(dict(part=part, name=name, m=m, kind=kind, us=us, gbs=nbytes / us * 1e-3, **kw))
        print(f"{part:8s} {name:13s} m={m:3d} {kind:22s} {us:8.2f} µs {nbytes / us * 1e-3:6.0f} GB/s", flush=True)

    weights = {}
    for name, (N, K) in SHAPES.items():
        nbytes = N * K * 2
        copies = max(1, -(-(200 << 20) // nbytes))
        weights[name] = [(torch.randn(N, K, generator=gen, device=dev) * 0.05).to(BF) for _ in range(copies)]

    if "ceiling" in PARTS:
        for name, ws in weights.items():
            n = ws[0].numel()
            best = None
            for progs in (132, 528, 2112):
                for block in (4096,):
                    per = -(-n // progs)
                    per = -(-per // block) * block
                    outs = [torch.empty(progs, device=dev) for _ in ws]
                    t = timer.time_graph(
                        [lambda w=w, o=o, p=progs, pe=per, b=block: _stream[(p,)](w, o, n, PER=pe, BLOCK=b, num_warps=8)
                         for w, o in zip(ws, outs)], reps=10,
                    )  # fmt: skip
                    us = t.median_ms * 1e3
                    if best is None or us < best[0]:
                        best = (us, progs, block)
            rec("ceiling", name, 0, f"stream p{best[1]} b{best[2]}", best[0], n * 2)

    if "tma" in PARTS:
        for name, ws in weights.items():
            N, K = SHAPES[name]
            segs = TC.plan(N, K)
            wds = [TensorDescriptor.from_tensor(w, [TC.BN, TC.BK]) for w in ws]
            for m in M_LIST:
                x = torch.randn(m, K, generator=gen, device=dev).to(BF)
                xd = TensorDescriptor.from_tensor(x, [TC.BM, TC.BK])
                parts = [torch.empty(segs * m * N, dtype=torch.float32, device=dev) for _ in ws]
                first = {}
                for mode, kind in ((0, "ptr"), (1, "tma w"), (2, "tma wx")):
                    try:
                        _launch_mm(mode, x, ws[0], wds[0], xd, parts[0], m, N, K, segs)
                        torch.cuda.synchronize()
                        first[kind] = parts[0].clone()
                        t = timer.time_graph(
                            [lambda w=w, wd=wd, p=p, mode=mode: _launch_mm(mode, x, w, wd, xd, p, m, N, K, segs)
                             for w, wd, p in zip(ws, wds, parts)], reps=10,
                        )  # fmt: skip
                        same = torch.equal(first[kind], first["ptr"])
                        rec("tma", name, m, f"{kind} segs={segs}", t.median_ms * 1e3, N * K * 2, same_bytes=same)
                        if not same:
                            print(f"  {kind}: bytes differ from ptr")
                    except Exception as e:  # noqa: BLE001
                        print(f"tma {name} m={m} {kind}: {type(e).__name__}: {str(e)[:300]}", flush=True)

    if "segs" in PARTS:
        orig = TC.plan
        try:
            for name in SEG_SHAPES:
                ws = weights[name]
                N, K = SHAPES[name]
                chunks = K // TC.BK
                for m in M_LIST:
                    x = torch.randn(m, K, generator=gen, device=dev).to(BF)
                    outs = [torch.empty(m, N, dtype=BF, device=dev) for _ in ws]
                    ref = x.double() @ ws[0].double().t()
                    for segs in [s for s in (1, 2, 4, 5, 8, 10, 20) if chunks % s == 0]:
                        TC.plan = lambda N_, K_, *_a, s=segs, **_k: s  # (fine == coarse: one level)
                        TC.tc_mm(x, ws[0], outs[0])
                        torch.cuda.synchronize()
                        err = float((outs[0].double() - ref).abs().max())
                        t = timer.time_graph([lambda w=w, o=o: TC.tc_mm(x, w, o) for w, o in zip(ws, outs)], reps=10)
                        rec("segs", name, m, f"tc_mm segs={segs}{' (plan)' if segs == orig(N, K) else ''}",
                            t.median_ms * 1e3, N * K * 2, err=err)  # fmt: skip
            # x -> [wq_a, wkv] in one launch, both with the same split count
            wa, wk = weights["wq_a"], weights["wkv"]
            nb = (SHAPES["wq_a"][0] + SHAPES["wkv"][0]) * 5120 * 2
            n = min(len(wa), len(wk))
            for m in M_LIST:
                x = torch.randn(m, 5120, generator=gen, device=dev).to(BF)
                oa = [torch.empty(m, 1280, dtype=BF, device=dev) for _ in range(n)]
                ok = [torch.empty(m, 512, dtype=BF, device=dev) for _ in range(n)]
                for segs in (None, 1, 2, 4, 5, 10):
                    TC.plan = orig if segs is None else (lambda N_, K_, s=segs: s)
                    t = timer.time_graph(
                        [lambda i=i: TC.mm_many_batch(x, (wa[i], wk[i]), (oa[i], ok[i])) for i in range(n)], reps=10
                    )
                    rec(
                        "segs", "wq_a+wkv", m, f"mm_many segs={'plan' if segs is None else segs}", t.median_ms * 1e3, nb
                    )
        finally:
            TC.plan = orig

    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "mm_probe.json"), "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    if "--selftest" in sys.argv:
        selftest()
    else:
        main()
