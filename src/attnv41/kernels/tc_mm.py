"""Batch-invariant tensor-core matmuls for bf16 weights (Triton): the batched runtime's
projections on CUDA (`runtime/batch.py`), where a token's bits must not depend on the
step's other tokens, nor on how many there are.

- `tc_mm(x, w, out)`: `out = bf16(x · wᵀ)`; x bf16 `[m, K]` (rows contiguous), w bf16
  `[N, K]` contiguous, out bf16 `[m, N]`; any m ≥ 1.
- `tc_group_mm(o, w, out)`: per group g `out[:, g] = bf16(o[:, g] · w[g]ᵀ)`; o bf16
  `[m, G, gw]`, w `[G, r, gw]` contiguous, out `[m, G, r]` (strided views allowed, last
  dims contiguous): wo_a's grouped low-rank projection.

Why invariant: every call runs the same compiled kernel whatever m is (BM = 64 token rows
per program, BN weight rows, BK columns per chunk, warps and stages fixed; m is not
specialized), rows past m are masked loads; a matrix product's row depends on its own row
of x and on the weights only; K is cut into SEGS segments of IPS chunks, SEGS a constant
of the weight's shape (`plan`); each segment accumulates its chunks in order with
`tl.dot(a, b, acc)`; with SEGS > 1 the fp32 segment partials go to a workspace and a
second launch adds them left to right and rounds once to bf16 (nearest even). So a row's
bits depend on nothing but its own input and the weights: the same at m = 1 and m = 256,
alone or with other sequences, on any SM count. The bits differ from `gemv.gemv`'s
(another summation order), within the bf16 tolerance of the exact product.

Programs: grid (row tiles, weight tiles, groups × segments), the row tile fastest so
that the programs reading one weight tile run together (one DRAM read, the others from
L2). Capturable (no host sync; the workspace comes from the caching allocator).

Twin: `tc_mm_torch`/`tc_group_mm_torch` (fp32 matmul, one rounding; equal within fp32
summation-order error, not in bits).
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, interpreting, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import round_bf16

__all__ = [
    "tc_mm",
    "tc_group_mm",
    "tc_mm_torch",
    "tc_group_mm_torch",
    "plan",
    "mm_batch",
    "mm_many_batch",
    "BM",
    "BN",
    "BK",
]

# The bits: BK and the split rule (`plan`). The rest is the launch shape, fixed for every m
# (what makes the kernel batch-invariant).
# H200 sweep (scripts/tc_tune.py, BENCHMARKS.md 2026-12-02 fifth entry), µs for one layer's
# bf16 projections (wq_a, wkv, wq_b, indexer.wq_b, wo_b, wo_a) at m = 1 / 64 / 256:
# 64/64/128 w4 s3 109.8 / 115.3 / 234.8; 16/64/64 w4 s4 111.0 / 156.7 / 517.3; cuBLAS
# 103.4 / 109.5 / 138.8 (not batch-invariant); the chunked GEMV 98.4 / 2490.8 / 9931.9.
BM, BN, BK = 64, 64, 128
_TARGET_PROGRAMS = 128  # weight tiles × segments at least this (about one per SM on an H200)
_WARPS, _STAGES = 4, 3


def plan(N: int, K: int) -> int:
    """SEGS for a weight `[N, K]`: the smallest divisor s of ceil(K/BK) with
    ceil(N/BN)·s ≥ the target program count (else ceil(K/BK)). A constant of the shape."""
    chunks, tiles = -(-K // BK), -(-N // BN)
    for s in range(1, chunks + 1):
        if chunks % s == 0 and tiles * s >= _TARGET_PROGRAMS:
            return s
    return chunks


if HAVE_TRITON:

    @triton.jit(do_not_specialize=["M"])
    def _tc_kernel(
        x, sxm, sxg, w, swg, out, som, sog, part,
        M, N, K, SEGS: tl.constexpr, IPS: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr,
    ):  # fmt: skip
        pm, pn, pgs = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        g, seg = pgs // SEGS, pgs % SEGS
        rows = pm * BM + tl.arange(0, BM)
        cols = pn * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        rok, cok = rows < M, cols < N
        xp = x + g * sxg + rows[:, None] * sxm
        wp = w + g * swg + cols[None, :] * K  # [BK, BN] view of w's rows (transposed)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for i in range(IPS):
            k = (seg * IPS + i) * BK + ks
            if EVEN_K:
                a = tl.load(xp + k[None, :], mask=rok[:, None], other=0.0)
                b = tl.load(wp + k[:, None], mask=cok[None, :], other=0.0)
            else:
                kok = k < K
                a = tl.load(xp + k[None, :], mask=rok[:, None] & kok[None, :], other=0.0)
                b = tl.load(wp + k[:, None], mask=cok[None, :] & kok[:, None], other=0.0)
            if DOT_FP32:  # interpreter only: its tl.dot multiplies bf16 bit patterns as integers
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        ok = rok[:, None] & cok[None, :]
        if SEGS == 1:
            tl.store(out + g * sog + rows[:, None] * som + cols[None, :], round_bf16(acc), mask=ok)
        else:
            pp = part + ((g * SEGS + seg) * M + rows[:, None]) * N + cols[None, :]
            tl.store(pp, acc, mask=ok)

    @triton.jit(do_not_specialize=["M"])
    def _combine_kernel(part, out, som, sog, M, N, SEGS: tl.constexpr, BLOCK: tl.constexpr):
        g = tl.program_id(1)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < M * N
        t, n = i // N, i % N
        s = tl.load(part + (g * SEGS * M) * N + i, mask=ok, other=0.0)
        for j in range(1, SEGS):
            s = s + tl.load(part + ((g * SEGS + j) * M) * N + i, mask=ok, other=0.0)
        tl.store(out + g * sog + t * som + n, round_bf16(s), mask=ok)


def _check(name, t, dims, last_contig=True) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != dims or t.dtype != torch.bfloat16:
        got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: {got}; allowed: a {dims}-D torch.bfloat16 tensor")
    if last_contig and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) = {t.stride(-1)}; allowed: 1 (contiguous last dim)")


def _launch(x, sxm, sxg, w, out, som, sog, m, G, N, K) -> None:
    segs = plan(G * N if G > 1 else N, K)  # groups: the split sees all G·N rows, as one weight
    part = torch.empty(G * segs * m * N if segs > 1 else 1, dtype=torch.float32, device=x.device)
    grid = (-(-m // BM), -(-N // BN), G * segs)
    _tc_kernel[grid](
        x, sxm, sxg, w, N * K, out, som, sog, part, m, N, K, SEGS=segs, IPS=-(-K // BK) // segs,
        BM=BM, BN=BN, BK=BK, EVEN_K=K % BK == 0, DOT_FP32=interpreting(), num_warps=_WARPS, num_stages=_STAGES,
    )  # fmt: skip
    if segs > 1:
        blk = 1024
        _combine_kernel[(-(-(m * N) // blk), G)](part, out, som, sog, m, N, SEGS=segs, BLOCK=blk, num_warps=4)


def tc_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = bf16(x · wᵀ)`, batch-invariant (module doc); returns out."""
    _check("x", x, 2)
    _check("w", w, 2)
    _check("out", out, 2)
    m, K = x.shape
    N = w.shape[0]
    if m < 1 or w.shape[1] != K or not w.is_contiguous():
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)}; allowed: x [m >= 1, K], w contiguous [N, K]")
    if tuple(out.shape) != (m, N):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: ({m}, {N})")
    require_triton("tc_mm", x, w, out)
    _launch(x, x.stride(0), 0, w, out, out.stride(0), 0, m, 1, N, K)
    return out


def tc_group_mm(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Per group g: `out[:, g] = bf16(o[:, g] · w[g]ᵀ)`, batch-invariant (module doc)."""
    _check("o", o, 3)
    _check("w", w, 3)
    _check("out", out, 3)
    m, G, gw = o.shape
    if m < 1 or w.shape[0] != G or w.shape[2] != gw or not w.is_contiguous():
        raise ValueError(f"o {tuple(o.shape)}, w {tuple(w.shape)}; allowed: o [m >= 1, G, gw], w contiguous [G, r, gw]")
    r = w.shape[1]
    if tuple(out.shape) != (m, G, r):
        raise ValueError(f"out.shape = {tuple(out.shape)}; allowed: ({m}, {G}, {r})")
    require_triton("tc_group_mm", o, w, out)
    _launch(o, o.stride(0), o.stride(1), w, out, out.stride(0), out.stride(1), m, G, r, gw)
    return out


# ------------------------------------------ the batched runtime's entry points (ops table)


def mm_many_batch(x: torch.Tensor, weights, outs, scales=None, xq=None, rope=None):
    """`ops.mm_many` of the batched runtime on CUDA: each bf16 weight through `tc_mm`;
    fp32 weights (the compressor's) and FP8 weights (with their scales) through the GEMV in
    row chunks (`gemv.mm_many_invariant`: batch-invariant too, on the CUDA cores); `rope`
    (i, head_dim, cos, sin, pos) rotates output i, by the rope op after a tensor-core
    product (the same bits as the GEMV's epilogue would give those values)."""
    from . import gemv  # noqa: PLC0415
    from . import rope as _rope  # noqa: PLC0415

    scales = (None,) * len(weights) if scales is None else tuple(scales)
    tc = [j for j, (w, sc) in enumerate(zip(weights, scales)) if sc is None and w.dtype == torch.bfloat16]
    rest = [j for j in range(len(weights)) if j not in tc]
    for j in tc:
        tc_mm(x, weights[j], outs[j])
    if rest:
        r = None if rope is None or rope[0] not in rest else (rest.index(rope[0]), *rope[1:])
        gemv.mm_many_invariant(x, [weights[j] for j in rest], [outs[j] for j in rest], [scales[j] for j in rest], xq, r)
    if rope is not None and rope[0] in tc:
        gemv._rope_after(outs, rope, _rope.apply_rope)
    return tuple(outs)


def mm_batch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`ops.mm` of the batched runtime on CUDA (`mm_many_batch`, one weight)."""
    return mm_many_batch(x, (w,), (out,))[0]


def tc_mm_torch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The twin: fp32 products and sums, one rounding to bf16."""
    return out.copy_((x.float() @ w.float().t()).to(torch.bfloat16))


def tc_group_mm_torch(o: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return out.copy_(torch.einsum("mgk,grk->mgr", o.float(), w.float()).to(torch.bfloat16))
