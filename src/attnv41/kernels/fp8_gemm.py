"""Prefill GEMM of the FP8 linear (`fp8_linear.fp8_mm`, m > 16) in one Triton launch: the
"wide GEMM" (golden README, v41_fp8) with the weight dequantized in the kernel.

`fp8_gemm(xq, w, sw, out, cfg=None)`: xq bf16 `[m, K]`, already the activation's exact FP8
round trip (`qdq.fp8_qdq(x)`), w float8_e4m3fn `[N, K]`, sw the e8m0 scale bytes
`[ceil(N/32), K/32]` (uint8 or float8_e8m0fnu; trusted, no 0xFF), out bf16 `[m, N]`.

`out[t, n] = bf16_rne(Σ_k xq[t, k]·W[n, k])`, `W[n, k] = e4m3(w[n, k])·2^(sw[n//32, k//32]−127)`.
Each program dequantizes its weight tile in registers (e4m3 → fp32, times the power of
two, → bf16: exact for scale bytes 3..246) and runs `tl.dot` on bf16 operands into an fp32
accumulator, BK columns at a time in K order; the result is rounded once (`round_bf16`).
The products are exact (8 × 4 significant bits); only the fp32 sums round, as in cuBLAS.

Contract: the tile config (`GemmConfig`) is a function of the weight's shape (N, K) only,
never of m (`config(N, K)`, or the caller's `cfg`). So a token's output bits depend only on
its own row, its row index and the weight: not on m, nor on the other rows of the call.

`swap=True` computes out^T tiles, `dot(W_tile, xq_tileᵀ)`, so that the converted weight is
the register (A) operand of Hopper's wgmma: the same sums, possibly in another fp32 order.
No host sync: capturable in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference.fp8 import BLOCK
from ._triton import HAVE_TRITON, interpreting, require_triton, tl, triton

if HAVE_TRITON:
    from ._triton import round_bf16
    from .fp8_linear import _e8m0

__all__ = ["fp8_gemm", "GemmConfig", "DEFAULT_CONFIG", "SWEEP_CONFIGS", "config"]


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch options: BM tokens × BN weight rows × BK columns per step."""

    BM: int = 128
    BN: int = 128
    BK: int = 64
    num_warps: int = 8
    num_stages: int = 3
    group_m: int = 8  # row tiles that sweep the weight tiles together (L2 reuse)
    swap: bool = False  # out^T tiles: the weight is the first dot operand


DEFAULT_CONFIG = GemmConfig()  # for Hopper; not yet swept on the H200
SWEEP_CONFIGS = [
    DEFAULT_CONFIG,
    GemmConfig(128, 128, 64, 8, 4),
    GemmConfig(128, 128, 64, 4, 4),
    GemmConfig(128, 128, 128, 8, 3),
    GemmConfig(128, 256, 64, 8, 3),
    GemmConfig(64, 256, 64, 4, 4),
    GemmConfig(128, 128, 64, 8, 3, swap=True),
    GemmConfig(64, 256, 64, 8, 3, swap=True),
]


def config(N: int, K: int) -> GemmConfig:
    """The tile config for a weight `[N, K]`: a function of (N, K) only (module doc)."""
    return DEFAULT_CONFIG


def _pow2(v) -> bool:
    return isinstance(v, int) and v > 0 and v & (v - 1) == 0


def _as_config(cfg) -> GemmConfig:
    c = cfg if isinstance(cfg, GemmConfig) else GemmConfig(*cfg) if isinstance(cfg, tuple) else None
    if c is None:
        raise ValueError(f"cfg = {type(cfg).__name__}; allowed: None, a GemmConfig or a tuple of its fields")
    if not (_pow2(c.BM) and _pow2(c.BN) and _pow2(c.BK) and min(c.BM, c.BN) >= 16 and c.BK >= BLOCK):
        raise ValueError(f"cfg {c}: allowed BM, BN powers of two >= 16 and BK a power of two >= {BLOCK}")
    if not (_pow2(c.num_warps) and isinstance(c.num_stages, int) and c.num_stages >= 1 and _pow2(c.group_m)):
        raise ValueError(f"cfg {c}: allowed num_warps and group_m powers of two, num_stages >= 1")
    return c


def _name(t) -> str:
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check(xq, w, sw, out) -> torch.Tensor:
    """Validate the arguments (ValueError naming the value and what is allowed); sw as uint8."""
    if not isinstance(xq, torch.Tensor) or xq.dim() != 2 or xq.dtype != torch.bfloat16:
        raise ValueError(f"xq: {_name(xq)}; allowed: a 2-D torch.bfloat16 [m, K]")
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w: {_name(w)}; allowed: a 2-D torch.float8_e4m3fn [N, K]")
    (m, K), N = xq.shape, w.shape[0]
    if w.shape[1] != K or K % BLOCK:
        raise ValueError(f"xq {tuple(xq.shape)}, w {tuple(w.shape)}; allowed: the same K, a multiple of {BLOCK}")
    grid = (-(-N // BLOCK), K // BLOCK)
    if not isinstance(sw, torch.Tensor) or sw.dtype not in (torch.uint8, torch.float8_e8m0fnu):
        raise ValueError(f"sw: {_name(sw)}; allowed: torch.uint8 or torch.float8_e8m0fnu {grid}")
    if tuple(sw.shape) != grid:
        raise ValueError(f"sw.shape = {tuple(sw.shape)}; allowed: {grid} for w {tuple(w.shape)}")
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (m, N):
        raise ValueError(f"out: {_name(out)}; allowed: torch.bfloat16 {(m, N)}")
    for name, t in (("xq", xq), ("out", out)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name}.stride(1) = {t.stride(1)}; allowed: 1 (contiguous rows)")
    for name, t in (("w", w), ("sw", sw)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous; allowed: a contiguous tensor")
    for name, t in (("w", w), ("sw", sw), ("out", out)):
        if t.device != xq.device:
            raise ValueError(f"{name}.device = {t.device}; allowed: {xq.device} (the device of xq)")
    return sw.view(torch.uint8)


if HAVE_TRITON:

    @triton.jit
    def _fp8_gemm_kernel(
        x_ptr,  # bf16 [M, K], row stride stride_xm
        w_ptr,  # e4m3 [N, K]
        sw_ptr,  # uint8 [ceil(N/32), K/32]
        out_ptr,  # bf16 [M, N], row stride stride_om
        M,
        N,
        stride_xm,
        stride_om,
        K: tl.constexpr,  # a constant of the weight (and the interpreter cannot loop to a runtime bound)
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        SWAP: tl.constexpr,
        DOT_F32: tl.constexpr,
    ):
        # grouped order: GROUP_M row tiles, then the next weight tile (which tile, not its sums)
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        per_group = GROUP_M * tl.cdiv(N, BN)
        first_m = (pid // per_group) * GROUP_M
        rows = tl.minimum(tiles_m - first_m, GROUP_M)
        pid_m = first_m + (pid % per_group) % rows
        pid_n = (pid % per_group) // rows
        offs_m = pid_m.to(tl.int64) * BM + tl.arange(0, BM)
        offs_n = pid_n.to(tl.int64) * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        m_ok = offs_m < M
        n_ok = offs_n < N
        # [BM, BK]: activation rows
        x_tile = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        # [BN, BK]: weight rows
        w_tile = w_ptr + offs_n[:, None] * K + offs_k[None, :]
        # [BN, BK]: each weight's block scale byte
        sw_tile = sw_ptr + (offs_n // 32)[:, None] * (K // 32) + (offs_k // 32)[None, :]
        if SWAP:
            acc = tl.zeros((BN, BM), dtype=tl.float32)  # [BN, BM]: out^T
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)  # [BM, BN]
        for k0 in range(0, K, BK):
            k_ok = offs_k[None, :] < K - k0
            a = tl.load(x_tile, mask=m_ok[:, None] & k_ok, other=0.0)
            wq = tl.load(w_tile, mask=n_ok[:, None] & k_ok, other=0.0)
            sb = tl.load(sw_tile, mask=n_ok[:, None] & k_ok, other=127)
            wb = (wq.to(tl.float32) * _e8m0(sb.to(tl.int32))).to(tl.bfloat16)  # exact
            if DOT_F32:  # interpreter only: its bf16 dot multiplies the raw bits; fp32 products are exact
                a = a.to(tl.float32)
                wb = wb.to(tl.float32)
            if SWAP:
                acc = tl.dot(wb, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(wb), acc)
            x_tile += BK
            w_tile += BK
            sw_tile += BK // 32
        if SWAP:
            acc = tl.trans(acc)
        # [BM, BN]
        out_tile = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_tile, round_bf16(acc), mask=m_ok[:, None] & n_ok[None, :])


def fp8_gemm(xq: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, out: torch.Tensor, cfg=None) -> torch.Tensor:
    """`out = bf16(xq · Wᵀ)` (module doc), written into `out` and returned. `cfg`: a
    `GemmConfig` (or a tuple of its fields); None takes `config(N, K)`."""
    sw = _check(xq, w, sw, out)
    (m, K), N = xq.shape, w.shape[0]
    c = config(N, K) if cfg is None else _as_config(cfg)
    require_triton("fp8_gemm", xq, w, sw, out)
    if m == 0 or N == 0:
        return out
    grid = (triton.cdiv(m, c.BM) * triton.cdiv(N, c.BN),)
    _fp8_gemm_kernel[grid](
        xq, w, sw, out, m, N, xq.stride(0), out.stride(0),
        K=K, BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.group_m, SWAP=c.swap, DOT_F32=interpreting(),
        num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return out
