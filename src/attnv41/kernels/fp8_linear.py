"""The FP8 linear the released checkpoint runs (`wq_a`, `wq_b`, `wkv`, `wo_b`,
`indexer.wq_b`; golden README, v41_fp8) on CUDA; twin: `reference.fp8.fp8_linear`.

`fp8_mm(x, w, scale, out)`: x bf16 `[m, K]`, w float8_e4m3fn `[N, K]`, scale e8m0
`[ceil(N/32), K/32]` (float8_e8m0fnu or uint8 bytes), out bf16 `[m, N]`.

Both launches compute the released math on exact operands and differ from the
reference (exact 32-term block sums, then one fp32 chain over K) only in fp32 summation
order: the activation is quantized exactly as `act_quant` (its round trip `qx·sx` is
`fp8_qdq(x)`, exact in bf16), the weight is e4m3 times a power of two (exact in bf16 and
fp32), so every product is exact and only the sums round.

- decode (m ≤ 16), Triton, CUDA cores: one program per (weights tile, token, K segment).
  The activation is quantized in the kernel; per 32-column block `p_b` = the fp32 sum of
  its 32 products (a fixed reduction tree); each iteration takes BKB consecutive blocks
  and adds `Σ_b (p_b·sx_b)·sw_b` (a fixed tree over the BKB terms) to the fp32
  accumulator, iterations in K order. K is cut into `SEGS` equal segments; (SEGS, BKB) =
  `plan(N, K)`, constants of the weight's shape. Each program runs one segment, and the
  last program of a tile to finish sums the segments' fp32 partials in order (an arrival
  counter per tile, reset by that program: counters are not shared by two launches
  running at once, so one stream at a time). A token's bits do not depend on m or on the
  other tokens of the call.
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
an f16 tensor-core decode GEMV (exact operands; 1.2-3.4x slower than this one at m = 1,
2.8-5x faster at m = 16: the candidate for batched decode, commit 85ac54d).

The scale bytes are trusted here (checked at load: `weights.py` rejects 0xFF, NaN).
"""

from __future__ import annotations

import torch

from ..reference.fp8 import BLOCK, fp8_linear
from . import gemv, qdq
from ._triton import HAVE_TRITON, ArrivalCounters, interpreting, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import round_bf16
    from .gemv_fp8 import _e8m0, _quant_block

__all__ = ["fp8_mm", "fp8_mm_torch", "plan", "DECODE_MAX_M", "prepare", "dequant_bf16"]

DECODE_MAX_M = 16  # tokens per call served by the decode launch
# which decode launch serves m <= DECODE_MAX_M: "lanes" (gemv.gemv's fp8 weights, kernels/gemv_fp8.py)
# or "blocks" (_fp8_gemv_kernel below: per-block sums)
DECODE = "lanes"
_DEC_BN, _DEC_WARPS, _DEC_STAGES, _BKB = 32, 2, 3, 8  # best of a sweep on the H200 (scripts/fp8_tune.py)
_TARGET_PROGRAMS = 1024  # decode: weight tiles × segments at least this (about 8 per SM on an H200)
_LOCKS = 1 << 16
_counters = ArrivalCounters("fp8_mm", "attnv41.kernels.fp8_linear.prepare", _LOCKS)


def fp8_mm_torch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = bf16(x · Wᵀ)` the released FP8 way: x bf16 `[m, K]`, w float8_e4m3fn `[N, K]`,
    scale float8_e8m0fnu `[ceil(N/32), K/32]`, out bf16 `[m, N]` (see `reference.fp8.fp8_linear`)."""
    out.copy_(fp8_linear(x, w, scale))
    return out


def plan(N: int, K: int) -> tuple[int, int]:
    """(SEGS, BKB) for a weight `[N, K]`: BKB blocks of 32 columns per decode iteration (the
    largest of 8, 4, 2, 1 dividing K/32), and SEGS, the smallest divisor S of K/32/BKB with
    ceil(N/BN)·S ≥ the target program count (else the largest). Constants of the weight's
    shape: the accumulation order of every call with this weight."""
    nkb = K // BLOCK
    bkb = next(b for b in (_BKB, 4, 2, 1) if b <= _BKB and nkb % b == 0)
    iters = nkb // bkb
    tiles = -(-N // _DEC_BN)
    best = 1
    for s in range(1, iters + 1):
        if iters % s:
            continue
        best = s
        if tiles * s >= _TARGET_PROGRAMS:
            break
    return best, bkb


def prepare(device: torch.device | str) -> None:
    """Allocate the decode launch's arrival counters on `device` (zeros). Done by the first
    call; call it before capturing a CUDA graph whose first FP8 linear is in the capture."""
    _counters.prepare(device)
    gemv.prepare(device)  # the "lanes" decode launch's


if HAVE_TRITON:

    @triton.jit
    def _fp8_gemv_kernel(
        x_ptr,  # bf16 [M, K]
        w_ptr,  # e4m3 [N, K]
        sw_ptr,  # uint8 [ceil(N/32), K/32]
        out_ptr,  # bf16 [M, N]
        part_ptr,  # fp32 [SEGS, M, N] partials (SPLIT only)
        lock_ptr,  # int32 counters, one per (token, weights tile) (SPLIT only)
        M,
        N,
        K,
        stride_xm,
        stride_om,
        BN: tl.constexpr,
        BKB: tl.constexpr,
        SEG_KB: tl.constexpr,
        SEGS: tl.constexpr,
        SPLIT: tl.constexpr,
        EXACT_CAST: tl.constexpr,
    ):
        pid_n = tl.program_id(0)
        t = tl.program_id(1).to(tl.int64)
        pid_s = tl.program_id(2)
        nkb = K // 32
        offs_n = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
        offs_b = tl.arange(0, BKB)
        offs_k = tl.arange(0, 32)
        n_ok = offs_n < N
        # [BN, BKB, 32]: BKB consecutive blocks of 32 columns of each weight row
        w_tile = w_ptr + offs_n[:, None, None] * K + offs_b[None, :, None] * 32 + offs_k[None, None, :]
        x_tile = x_ptr + t * stride_xm + offs_b[:, None] * 32 + offs_k[None, :]  # [BKB, 32]
        sw_tile = sw_ptr + (offs_n // 32)[:, None] * nkb + offs_b[None, :]  # [BN, BKB]
        total = tl.zeros((BN,), dtype=tl.float32)
        LOOP: tl.constexpr = 1 if SPLIT else SEGS  # segments this program runs (from pid_s; 0 unless SPLIT)
        for si in range(LOOP):
            seg = pid_s + si
            acc = tl.zeros((BN,), dtype=tl.float32)
            for j in range(SEG_KB // BKB):
                kb = seg * SEG_KB + j * BKB
                qf, sx = _quant_block(tl.load(x_tile + kb * 32).to(tl.float32), EXACT_CAST)  # [BKB, 32], [BKB]
                w = tl.load(w_tile + kb * 32, mask=n_ok[:, None, None], other=0.0).to(tl.float32)
                p = tl.sum(w * qf[None, :, :], axis=2)  # [BN, BKB]: each block's 32 exact products, fp32 sum
                sw = _e8m0(tl.load(sw_tile + kb, mask=n_ok[:, None], other=127).to(tl.int32))
                acc = acc + tl.sum((p * sx[None, :]) * sw, axis=1)
            total = total + acc
        out_row = out_ptr + t * stride_om + offs_n
        if SPLIT:
            part = part_ptr + t * N + offs_n
            tl.store(part + pid_s * (M * N), total, mask=n_ok)
            tl.debug_barrier()  # every thread's partial stored before the release below
            tile = t * tl.num_programs(0) + pid_n
            arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SEGS - 1:  # the last segment of this tile: sum all in segment order
                tot = tl.zeros((BN,), dtype=tl.float32)
                for s in range(SEGS):
                    tot = tot + tl.load(part + s * (M * N), mask=n_ok, other=0.0, cache_modifier=".cg")
                tl.store(out_row, round_bf16(tot), mask=n_ok)
                tl.atomic_xchg(lock_ptr + tile, 0)
        else:
            tl.store(out_row, round_bf16(total), mask=n_ok)


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


def fp8_mm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`out = bf16(x · Wᵀ)` the released FP8 way (module doc), written into `out` and
    returned. Capturable in a CUDA graph (no host sync) once `prepare(device)` ran."""
    sw = _check(x, w, scale, out)
    require_triton("fp8_mm", x, w, out)
    m, K = x.shape
    N = w.shape[0]
    if m == 0:
        return out
    if m <= DECODE_MAX_M and DECODE == "lanes":
        gemv.gemv(x, (w,), (out,), (sw,))
        return out
    segs, bkb = plan(N, K)
    if m <= DECODE_MAX_M:
        split = segs > 1
        n_tiles = -(-N // _DEC_BN)
        if split:
            locks = _counters.buffer(x.device)
            if n_tiles * m > locks.numel():
                raise ValueError(f"N = {N}; allowed: <= {locks.numel() // m * _DEC_BN} (decode arrival counters)")
            part = torch.empty(segs, m, N, dtype=torch.float32, device=x.device)
        else:
            locks = part = out  # unused
        _fp8_gemv_kernel[(n_tiles, m, segs if split else 1)](
            x, w, sw, out, part, locks, m, N, K, x.stride(0), out.stride(0),
            BN=_DEC_BN, BKB=bkb, SEG_KB=K // BLOCK // segs, SEGS=segs, SPLIT=split, EXACT_CAST=interpreting(),
            num_warps=_DEC_WARPS, num_stages=_DEC_STAGES,
        )  # fmt: skip
        return out
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
