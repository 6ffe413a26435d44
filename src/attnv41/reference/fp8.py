"""FP8 linears the way the released checkpoint runs them (checkpoint-v41.md "FP8
block-scaled weights"; golden README, section v41_fp8).

`wq_a`, `wq_b`, `wkv`, `wo_b` and `indexer.wq_b` hold a float8_e4m3fn weight `[N, K]`
and an e8m0 block scale `[ceil(N/32), K/32]` (byte E means 2^(E−127)). Each call
quantizes its bf16 input per row in blocks of 32 columns (`act_quant`) and multiplies
e4m3 by e4m3 block by block along K (`fp8_linear`). `wo_a` does not run here: the
released conversion dequantizes it to bf16 (`dequant_weight`). `quant_weight` is the
released conversion's block quantization of a bf16/fp32 weight into that format.
"""

from __future__ import annotations

import torch

from .qdq import FP8_MAX, pow2_ceil

__all__ = [
    "BLOCK",
    "AMAX_FLOOR",
    "act_quant",
    "e4m3_sat",
    "e8m0_to_float",
    "quant_weight",
    "dequant_weight",
    "fp8_linear",
]

BLOCK = 32
AMAX_FLOOR = 1e-4


def e4m3_sat(v: torch.Tensor) -> torch.Tensor:
    """fp32 `v` rounded to nearest-even e4m3, saturating at ±448 (the torch cast alone
    may give NaN past 448); returned as fp32. Signs, −0 included, are kept."""
    return v.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()


def act_quant(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """The released activation quantizer (`act_quant(x, 32, ue8m0)`), per row and per
    `block` consecutive columns of `x` (bf16 `[..., K]`, K a multiple of `block`):

    `amax = max(max|x_blk|, 1e−4)` in fp32, `s = 2^ceil(log2(amax · fp32(1/448)))` (exactly,
    from the fp32 bits of the product), `q = e4m3_rne(clamp(x/s, ±448))`.

    Returns `(q, s)`: q fp32 `[..., K]` holding e4m3 values, s fp32 `[..., K/block]`
    holding powers of two. `q · s` is `fp8_qdq(x)`.
    """
    K = x.shape[-1]
    if K % block:
        raise ValueError(f"K = {K} (last dim of x {tuple(x.shape)}); allowed: a multiple of the block size {block}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x.dtype = {x.dtype}; allowed: torch.bfloat16 (the released linears quantize bf16 inputs)")
    xb = x.float().unflatten(-1, (K // block, block))
    amax = xb.abs().amax(-1, keepdim=True).clamp_min(AMAX_FLOOR)
    s = pow2_ceil(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    q = e4m3_sat(xb / s)
    return q.flatten(-2), s.squeeze(-1)


def e8m0_to_float(scale: torch.Tensor, name: str = "scale", check: bool = True) -> torch.Tensor:
    """fp32 `2^(E−127)` of e8m0 bytes (float8_e8m0fnu or raw uint8). Byte 0xFF (NaN) is rejected;
    `check=False` skips that scan (it reads the bytes back to the host, which a CUDA graph
    capture cannot do) for scales already checked at load (`weights.py` rejects 0xFF)."""
    if scale.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"{name}.dtype = {scale.dtype}; allowed: torch.float8_e8m0fnu or torch.uint8")
    e = scale.view(torch.uint8)
    bad = (e == 0xFF).nonzero() if check else None
    if bad is not None and bad.numel():
        raise ValueError(f"{name}: byte 0xFF (NaN) at block {bad[0].tolist()}; allowed: 0x00..0xFE")
    # 2^(E−127) from its fp32 bits: exponent field E for E >= 1, the subnormal 2^−127 for E = 0.
    bits = torch.where(e == 0, 0x00400000, e.to(torch.int32) << 23)
    return bits.view(torch.float32)


def _weight_scales(w: torch.Tensor, scale: torch.Tensor, block: int, name: str, check: bool = True) -> torch.Tensor:
    """Per row of `w` and per K block: fp32 `[N, K/block]`, after checking dtypes and shapes."""
    if w.dtype != torch.float8_e4m3fn or w.dim() != 2:
        raise TypeError(f"{name}: dtype {w.dtype}, {w.dim()} dims; allowed: a 2-D torch.float8_e4m3fn [out, in]")
    N, K = w.shape
    if K % block:
        raise ValueError(f"{name}: in = {K}; allowed: a multiple of the block size {block}")
    grid = (-(-N // block), K // block)
    if tuple(scale.shape) != grid:
        raise ValueError(f"{name} scale shape = {tuple(scale.shape)}; allowed: {grid} for a weight {[N, K]}")
    return e8m0_to_float(scale.to(w.device), name + " scale", check).repeat_interleave(block, 0)[:N]


def quant_weight(w: torch.Tensor, block: int = BLOCK, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """The released conversion's block quantization of a weight `w` (bf16 or fp32 `[N, K]`,
    K a multiple of `block`; N any): per `block`×`block` block, in fp32,

    `amax = max(max|w_blk|, 1e−4)`, `s = 2^ceil(log2(amax · fp32(1/448)))` (exactly, as
    `act_quant`), `q = e4m3_rne(clamp(w/s, ±448))`.

    Returns `(q, scale)`: q float8_e4m3fn `[N, K]`, scale float8_e8m0fnu `[ceil(N/32), K/32]`
    holding the byte log2(s) + 127 (s lies in 2^−22..2^120, so every byte is a valid
    power of two). A last block row with fewer than `block` rows takes its amax over the
    rows present. `dequant_weight(*quant_weight(w)) == w` whenever each block of w is
    e4m3 values times one power of two with amax >= 1e−4 (as every weight it produced).
    """
    if w.dim() != 2:
        raise ValueError(f"{name}: shape {tuple(w.shape)}; allowed: a 2-D weight [out, in]")
    if w.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"{name}.dtype = {w.dtype}; allowed: torch.bfloat16 or torch.float32")
    N, K = w.shape
    if K % block or N == 0 or K == 0:
        raise ValueError(f"{name}: shape {[N, K]}; allowed: out >= 1 and in a positive multiple of {block}")
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        raise ValueError(f"{name}: non-finite value at {bad.nonzero()[0].tolist()}; allowed: finite weights")
    R = -(-N // block)
    pad = torch.zeros(R * block, K, dtype=torch.float32, device=w.device)  # zero rows leave amax unchanged
    pad[:N] = w.float()
    blocks = pad.view(R, block, K // block, block)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp_min(AMAX_FLOOR)  # [R, 1, K/block, 1]
    s = pow2_ceil(amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))
    q = e4m3_sat(blocks / s).view(R * block, K)[:N]
    byte = (s.view(R, K // block).view(torch.int32) >> 23).to(torch.uint8)  # biased exponent of a normal fp32 2^e
    return q.to(torch.float8_e4m3fn).contiguous(), byte.view(torch.float8_e8m0fnu).contiguous()


def dequant_weight(
    w: torch.Tensor, scale: torch.Tensor, block: int = BLOCK, name: str = "weight", check: bool = True
) -> torch.Tensor:
    """bf16 `W[n, k] = e4m3(w[n, k]) · 2^(S[n // 32, k // 32] − 127)`, what the released
    conversion holds for `wo_a` (exact in bf16: 4 significant bits times a power of two).
    `check=False`: the scale bytes are trusted (see `e8m0_to_float`); same bits."""
    sw = _weight_scales(w, scale, block, name, check)
    return (w.float() * sw.repeat_interleave(block, 1)).to(torch.bfloat16)


def fp8_linear(
    x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, block: int = BLOCK, name: str = "weight"
) -> torch.Tensor:
    """`bf16(x · Wᵀ)` the released FP8 way: x bf16 `[..., K]`, w float8_e4m3fn `[N, K]`,
    scale e8m0 `[ceil(N/32), K/32]`.

    `(qx, sx) = act_quant(x)`; for each K block b (32 columns) in order 0, 1, …:
    `p_b = fp32(Σ_{k in b} qx·qw)` (the block's dot product of e4m3 values, summed exactly
    and rounded once to fp32), `acc ← fp32(acc + (p_b · sx_b) · sw_b)` (the scales are
    powers of two, so only the addition rounds), starting from acc = 0; the result is
    `bf16(acc)` (round to nearest-even).

    Accumulation order: exact within a block, then fp32 sequentially over the K blocks.
    The released CPU port's order inside a block is its GEMM's; any fp32 order differs
    from this one only below fp32 precision, so the bf16 results agree but for ties at a
    bf16 rounding boundary.
    """
    sw = _weight_scales(w, scale, block, name)  # [N, nb]
    K = w.shape[1]
    if x.shape[-1] != K:
        raise ValueError(f"x last dim = {x.shape[-1]}; allowed: {K} (in of {name} {list(w.shape)})")
    lead = x.shape[:-1]
    qx, sx = act_quant(x.reshape(-1, K), block)
    nb = K // block
    acc = torch.zeros(qx.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for b in range(nb):  # one [m, N] block product at a time: memory m·N, not m·N·K/32
        cols = slice(b * block, (b + 1) * block)
        # e4m3·e4m3 products are multiples of 2^−18 below 2^18, so a block of 32 sums exactly in fp64,
        # in whatever order the GEMM adds them; one rounding to fp32 follows.
        part = (qx[:, cols].double() @ w[:, cols].double().t()).float()
        acc = acc + (part * sx[:, b : b + 1]) * sw[None, :, b]
    return acc.to(torch.bfloat16).reshape(*lead, w.shape[0])
