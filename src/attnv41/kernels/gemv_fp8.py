"""FP8 weights in the decode GEMV (`kernels.gemv.gemv`, `scales=`): the released FP8 linear
(golden README, v41_fp8; twin of the math: `reference.fp8.fp8_linear`) as lane sums of
fused multiply-adds, so the weight bytes stream at the GEMV's rate.

A weight is float8_e4m3fn `[N, K]` with e8m0 scales `[ceil(N/32), K/32]`; x bf16 `[m, K]`,
K a multiple of 32; the output bf16 `[m, N]`.

The terms. The activation is quantized as the reference's `act_quant` (per 32 columns:
`q`, e4m3 values, and `sx`, a power of two), in the kernel. For output row n, column k in
32-column block b: `xs[k] = q[k]·(sx_b·sw[n//32, b])` (a power of two times an e4m3 value:
exact while the product is an fp32 normal, which the checkpoint's scales give), and the
term `w[n, k]·xs[k]` has at most 8 significant bits, exact in fp32. The reference sums the
same terms: exactly within a block (`p_b`), then one fp32 chain over blocks; this kernel
only adds them in another fp32 order:
  1. BK lane sums `a_j`, each a chain over the segment's chunks in order,
     `a_j ← fma(w[n, k], xs[k], a_j)` (k = chunk·BK + j; the product exact, one rounding);
  2. the pairwise lane tree, 3. the segments left to right, 4. `round_bf16`
as every weight of `gemv` (its module doc). BK = `gemv._BK[float8_e4m3fn]`. A program's
rows lie in one 32-row scale block (the launch's row tile divides 32), so `sx·sw` is one
vector per chunk, computed once for all the program's rows.

Why not the per-block sums of `fp8_linear`'s decode launch: a fixed 32-term tree per block
is a cross-thread reduction per block in the loads' layout (sm_90 SASS: one shuffle per
weight element at its tile shape); the lane chains have none until the final tree.

Bits: a token's result does not depend on m, on the other tokens or weights of the launch,
on the launch shape or on the SM count (as the bf16 weights of `gemv`). `ordered_terms`
builds the terms in torch for `gemv.gemv_torch` (the kernel's bits on the GPU and in the
interpreter).
"""

from __future__ import annotations

import torch

from ..reference.fp8 import BLOCK, act_quant, e8m0_to_float
from ._triton import HAVE_TRITON, tl, triton

if HAVE_TRITON:
    from .qdq import _e4m3_rne, _pow2_ceil_exp

__all__ = ["ordered_terms", "scaled_terms"]


def ordered_terms(x: torch.Tensor, scale: torch.Tensor, N: int) -> torch.Tensor:
    """fp32 `[m, N, K]`: `xs` of the module doc for each output row (the activation's
    e4m3 values times `sx_b·sw[n//32, b]`, rounded as the kernel rounds that product)."""
    m, K = x.shape
    q, sx = act_quant(x, BLOCK)  # [m, K], [m, K/32]
    sw = e8m0_to_float(scale.view(torch.float8_e8m0fnu) if scale.dtype == torch.uint8 else scale)  # [NB, K/32]
    ss = sx[:, None, :] * sw[None, :, :]  # [m, NB, K/32] (fp32, one rounding: exact in the normal range)
    xs = q.view(m, 1, K // BLOCK, BLOCK) * ss[..., None]  # [m, NB, K/32, 32]
    rows = torch.arange(N, device=x.device) // BLOCK
    return xs.view(m, -1, K)[:, rows]


def scaled_terms(x: torch.Tensor, scale: torch.Tensor, N: int) -> torch.Tensor:
    """fp32 `[m, N, K]`: x's values as they are (not quantized) times the weight block's
    scale `sw[n//32, k//32]`, per output row: the factors of an FP8-stored weight read as
    its bf16 dequantization (`gemv.group_gemv` with a scale: wo_a). Exact (a bf16 value
    times a power of two)."""
    m, K = x.shape
    sw = e8m0_to_float(scale.view(torch.float8_e8m0fnu) if scale.dtype == torch.uint8 else scale)  # [NB, K/32]
    xs = x.float().view(m, 1, K // BLOCK, BLOCK) * sw[None, :, :, None]  # [m, NB, K/32, 32]
    rows = torch.arange(N, device=x.device) // BLOCK
    return xs.view(m, -1, K)[:, rows]


if HAVE_TRITON:

    @triton.jit
    def _quant_block(xv, EXACT_CAST: tl.constexpr):
        """One 32-column block per row of fp32 `xv [R, 32]` → (e4m3 values as fp32 [R, 32],
        scale fp32 [R]); the reference's act_quant (and `qdq.fp8_qdq`), exactly."""
        amax = tl.maximum(tl.max(tl.abs(xv), axis=1), 1e-4)
        e = _pow2_ceil_exp(amax * 0.002232142857142857)  # fp32(1/448) = 0x3B124925
        s = (e << 23).to(tl.float32, bitcast=True)
        inv = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 1/s, exact (s a normal power of two)
        v = tl.minimum(tl.maximum(xv * inv[:, None], -448.0), 448.0)
        if EXACT_CAST:  # the interpreter's fp8 cast does not round to nearest even: bit arithmetic
            v = _e4m3_rne(v)
        else:  # the GPU's cvt.rn.satfinite: nearest even
            v = v.to(tl.float8e4nv).to(tl.float32)
        return v, s

    @triton.jit
    def _e8m0(b):
        """fp32 2^(b−127) of e8m0 bytes (int32 values 0..254); b = 0 is the subnormal 2^−127."""
        return tl.where(b == 0, 0x00400000, b << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def fp8_lanes(
        x_ptr,  # bf16 [M, K], row stride stride_xm: x, or its round trip `fp8_qdq(x)` (PREQ)
        stride_xm,
        w_ptr,  # e4m3 [N, K] contiguous
        sw_ptr,  # uint8 [ceil(N/32), K/32]
        M,
        N,
        K,
        tile,
        seg,
        tb,
        IPS: tl.constexpr,
        BN: tl.constexpr,
        MB: tl.constexpr,
        BK: tl.constexpr,
        EVEN_K: tl.constexpr,
        EXACT_CAST: tl.constexpr,
        PREQ: tl.constexpr,
    ):
        """[MB, BN, BK] lane sums of one (row tile, K segment, token block), step 1 of the
        module doc. BN divides 32, so the tile's rows share one row of scales.

        x is loaded and quantized in the weight tile's shape [MB, BN, BK] (pointers with
        stride 0 over the rows): every row gets the same values, in the weight loads'
        layout, so the multiply-add needs no layout conversion. (Quantizing a [MB, 1, BK]
        chunk and broadcasting it took a shared-memory round trip with about 13 barriers per
        chunk in sm_90 SASS. On the H200 the old form ran wq_b 20.4 µs in a sweep with random
        per-block scales, 15.5 in `bench` (b); this one 16.9 and 15.6: the same speed where
        the old form was fast, faster where it was not; BENCHMARKS.md, 2026-12-02.) The
        compiler keeps one copy per thread of the values its rows share.

        PREQ: x_ptr holds `fp8_qdq(x)` (bf16 `q·sx`, exact), computed once by its producer;
        the term's factor is then `(q·sx)·sw`, the same fp32 value as `q·(sx·sw)` (both
        exact), without the per-program quantization (about 40 % of the loop's
        instructions in sm_90 SASS at the production tile, redone by every row tile)."""
        NBK: tl.constexpr = BK // 32
        offs_t = (tb * MB + tl.arange(0, MB)).to(tl.int64)
        offs_n = (tile * BN + tl.arange(0, BN)).to(tl.int64)
        offs_j = tl.arange(0, BK)
        offs_b = tl.arange(0, NBK)
        t_ok = (offs_t < M)[:, None, None]
        n_ok = (offs_n < N)[None, :, None]
        # [MB, BN, BK] token rows (stride 0 over the weight rows) and [1, BN, BK] weight rows
        x_rows = x_ptr + offs_t[:, None, None] * stride_xm + (offs_n * 0)[None, :, None] + offs_j[None, None, :]
        w_rows = w_ptr + offs_n[None, :, None] * K + offs_j[None, None, :]
        nkb = K // 32
        sw_row = sw_ptr + tl.cast((tile * BN) // 32, tl.int64) * nkb + offs_b  # [NBK]
        acc = tl.zeros((MB, BN, BK), dtype=tl.float32)
        k0 = tl.cast(seg, tl.int64) * (IPS * BK)
        for _ in range(IPS):
            kb0 = k0 // 32
            # the weight chunk loaded before x: in the other order Triton 3.6 gave x's load a
            # layout whose quantization was repeated for each row a thread holds (4× the
            # work; tests/kernels/test_gemv_sass.py checks the compiled form)
            if EVEN_K:
                wv = tl.load(w_rows + k0, mask=n_ok, other=0.0).to(tl.float32)
                xv = tl.load(x_rows + k0, mask=t_ok, other=0.0).to(tl.float32)
                sb = tl.load(sw_row + kb0)
            else:
                k_ok = ((k0 + offs_j) < K)[None, None, :]
                wv = tl.load(w_rows + k0, mask=n_ok & k_ok, other=0.0).to(tl.float32)
                xv = tl.load(x_rows + k0, mask=t_ok & k_ok, other=0.0).to(tl.float32)
                sb = tl.load(sw_row + kb0, mask=(kb0 + offs_b) < nkb, other=127)
            if PREQ:  # [MB, BN, NBK, 32] the round trip q·sx times the weight block's scale
                sw = _e8m0(sb.to(tl.int32))[None, None, :, None]
                xs = tl.reshape(tl.reshape(xv, (MB, BN, NBK, 32)) * sw, (MB, BN, BK))
            else:  # [MB·BN·NBK, 32] blocks → e4m3 values and their scales (act_quant)
                v, sx = _quant_block(tl.reshape(xv, (MB * BN * NBK, 32)), EXACT_CAST)
                ss = tl.reshape(sx, (MB, BN, NBK)) * _e8m0(sb.to(tl.int32))[None, None, :]
                xs = tl.reshape(tl.reshape(v, (MB, BN, NBK, 32)) * ss[:, :, :, None], (MB, BN, BK))
            acc = tl.fma(wv, xs, acc)
            k0 += BK
        return acc
