"""The FP8 linear the released checkpoint runs (`wq_a`, `wq_b`, `wkv`, `wo_b`,
`indexer.wq_b`; golden README, v41_fp8) on CUDA; twin: `reference.fp8.fp8_linear`.

`fp8_mm(x, w, scale, out)`: x bf16 `[m, K]`, w float8_e4m3fn `[N, K]`, scale e8m0
`[ceil(N/32), K/32]` (float8_e8m0fnu or uint8 bytes), out bf16 `[m, N]`.

Both launches compute the released math on exact operands and differ from the
reference (exact 32-term block sums, then one fp32 chain over K) only in fp32 summation
order: the activation is quantized exactly as `act_quant` (its round trip `qx·sx` is
`fp8_qdq(x)`, exact in bf16), the weight is e4m3 times a power of two (exact in bf16 and
fp32), so every product is exact and only the sums round.

- decode (m ≤ 16): the decode GEMV's FP8 weights (`gemv.gemv(..., scales=)`,
  kernels/gemv_fp8.py): the activation quantized in the kernel, the exact terms summed as
  lane chains of fused multiply-adds, a fixed lane tree, fixed split-K per weight shape. A
  token's bits do not depend on m or on the other tokens of the call.
- prefill (m > 16): `fp8_qdq(x)` (Triton, exact), the weight dequantized to a bf16
  temporary (`dequant_bf16`, one Triton pass, exact), then cuBLAS's bf16 GEMM with fp32
  accumulation: the "wide GEMM" formulation the golden README says reproduces the
  released outputs. Its cost is the bf16 matmul rate plus the two pre-passes (the
  temporary: 2 bytes per weight, written and read once).

Why not FP8 tensor cores: the H200's FP8 MMA sums a block of 32 products with about 13
bits below the largest term, not fp32. In this model an ulp moved in one linear's output
moves the next linear's e4m3 activation by a whole e4m3 step; an FP8-MMA version of this
kernel failed `v41_fp8.safetensors` on the H200 (q off by 2.8x the tolerance). Measured
and dropped on the H200 (BENCHMARKS.md, 2026-12-01 evening): a Triton bf16-MMA prefill
GEMM with the weight dequantized in registers (3-26 % of the FP8 rate, below cuBLAS), and
an f16 tensor-core decode GEMV (exact operands; 1.2-3.4x slower than the per-block CUDA-core
GEMV at m = 1, 2.8-5x faster at m = 16: the candidate for batched decode, commit 85ac54d).
The per-block CUDA-core GEMV (each 32-column block summed by a fixed cross-thread tree)
was replaced by the lane-sum one, measured at 0.80-1.06x its time per weight and one launch
for x → wq_a + wkv (BENCHMARKS.md, 2026-12-01 late night; its code: commit 91e58c4).

The scale bytes are trusted here (checked at load: `weights.py` rejects 0xFF, NaN).
"""

from __future__ import annotations

import torch

from ..reference.fp8 import BLOCK, fp8_linear
from . import gemv, qdq
from ._triton import HAVE_TRITON, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import round_bf16
    from .gemv_fp8 import _e8m0

__all__ = ["fp8_mm", "fp8_mm_torch", "DECODE_MAX_M", "prepare", "dequant_bf16"]

DECODE_MAX_M = gemv.DECODE_MAX_M  # tokens per call served by the decode GEMV


def fp8_mm_torch(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, xq: torch.Tensor | None = None
) -> torch.Tensor:
    """`out = bf16(x · Wᵀ)` the released FP8 way: x bf16 `[m, K]`, w float8_e4m3fn `[N, K]`,
    scale float8_e8m0fnu `[ceil(N/32), K/32]`, out bf16 `[m, N]` (see `reference.fp8.fp8_linear`).
    `xq` (`fp8_mm`'s) is checked and not read: the reference makes the round trip itself."""
    _check(x, w, scale, out)
    gemv._check_xq(x, xq, (w,))
    out.copy_(fp8_linear(x, w, scale))
    return out


def prepare(device: torch.device | str) -> None:
    """Allocate the decode GEMV's arrival counters on `device` (`gemv.prepare`). Done by
    the first call; call it before capturing a CUDA graph whose first FP8 linear is in the
    capture."""
    gemv.prepare(device)


def _check(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Validate the arguments (ValueError/TypeError naming the value); the scale as uint8."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"x: {getattr(x, 'dtype', type(x).__name__)}; allowed: a 2-D torch.bfloat16 [m, K]")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w: {getattr(w, 'dtype', type(w).__name__)}; allowed: a 2-D torch.float8_e4m3fn [N, K]")
    m, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K:
        raise ValueError(f"x.shape = {tuple(x.shape)}, w.shape = {tuple(w.shape)}; allowed: the same K")
    if K % BLOCK:
        raise ValueError(f"K = {K}; allowed: a multiple of {BLOCK}")
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise ValueError(f"scale.dtype = {scale.dtype}; allowed: torch.float8_e8m0fnu or torch.uint8")
    grid = (-(-N // BLOCK), K // BLOCK)
    if tuple(scale.shape) != grid:
        raise ValueError(f"scale.shape = {tuple(scale.shape)}; allowed: {grid} for w {tuple(w.shape)}")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (m, N):
        raise ValueError(
            f"out: {getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}; allowed: torch.bfloat16 {(m, N)}"
        )
    for name, t in (("x", x), ("out", out)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}.stride(1) = {t.stride(1)}; allowed: 1 (contiguous rows)")
    for name, t in (("w", w), ("scale", scale)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous; allowed: a contiguous tensor")
        if t.device != x.device:
            raise ValueError(f"{name}.device = {t.device}; allowed: {x.device} (the device of x)")
    if out.device != x.device:
        raise ValueError(f"out.device = {out.device}; allowed: {x.device} (the device of x)")
    return scale.view(torch.uint8)


def fp8_mm(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, xq: torch.Tensor | None = None
) -> torch.Tensor:
    """`out = bf16(x · Wᵀ)` the released FP8 way (module doc), written into `out` and
    returned. `xq`: None, or bf16 `qdq.fp8_qdq(x)` made by x's producer (trusted to be that
    round trip); then neither launch quantizes x itself (same bits). Capturable in a CUDA
    graph (no host sync) once `prepare(device)` ran."""
    sw = _check(x, w, scale, out)
    gemv._check_xq(x, xq, (w,))
    require_triton("fp8_mm", x, w, out)
    m, K = x.shape
    if m == 0:
        return out
    if m <= DECODE_MAX_M:
        gemv.gemv(x, (w,), (out,), (sw,), xq)
        return out
    if xq is None:
        xq = qdq.fp8_qdq(x, out=torch.empty(m, K, dtype=torch.bfloat16, device=x.device))
    torch.mm(xq, dequant_bf16(w, sw).t(), out=out)
    return out


if HAVE_TRITON:

    @triton.jit
    def _dequant_kernel(w_ptr, sw_ptr, out_ptr, N, K, BN: tl.constexpr, BK: tl.constexpr):
        """bf16 out[n, k] = e4m3(w[n, k])·2^(sw[n//32, k//32]−127), a [BN, BK] tile per program."""
        offs_n = (tl.program_id(0) * BN + tl.arange(0, BN)).to(tl.int64)
        offs_k = (tl.program_id(1) * BK + tl.arange(0, BK)).to(tl.int64)
        ok = (offs_n < N)[:, None] & (offs_k < K)[None, :]
        # [BN, BK]
        w = tl.load(w_ptr + offs_n[:, None] * K + offs_k[None, :], mask=ok, other=0.0).to(tl.float32)
        sb = tl.load(sw_ptr + (offs_n // 32)[:, None] * (K // 32) + (offs_k // 32)[None, :], mask=ok, other=127)
        tl.store(out_ptr + offs_n[:, None] * K + offs_k[None, :], round_bf16(w * _e8m0(sb.to(tl.int32))), mask=ok)


def dequant_bf16(w: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """bf16 `w[n, k]·2^(sw[n//32, k//32]−127)` (exact where the bf16 result is normal; else
    rounded to nearest even, as `reference.fp8.dequant_weight`, which it equals bit for bit),
    without a host sync: `sw` as uint8, trusted (no 0xFF). One Triton pass (reads 1 byte,
    writes 2 per weight)."""
    require_triton("dequant_bf16", w, sw)
    N, K = w.shape
    out = torch.empty(N, K, dtype=torch.bfloat16, device=w.device)
    _dequant_kernel[(-(-N // 32), -(-K // 256))](w, sw, out, N, K, BN=32, BK=256, num_warps=4)
    return out
