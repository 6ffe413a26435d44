"""V4.1's own byte formats for the cached rows (issue 15): lossless packing of bf16 rows
that already lie on a quantization grid of attention-v41.md §3.

| format | rows | per block | row of D values |
|---|---|---|---|
| `fp8_e8m0` | window kv (`fp8_qdq`) | 32 e4m3 codes + 1 e8m0 scale | D code bytes, then D/32 scale bytes (D = 512: 528 B) |
| `fp4_e4m3` | compressed kv (`fp4_e4m3_qdq`) | 16 e2m1 codes + 1 e4m3 scale | D/2 code bytes, then D/16 scale bytes (D = 512: 288 B) |
| `fp4_e8m0` | index keys (`fp4_e8m0_qdq`) | 32 e2m1 codes + 1 e8m0 scale | D/2 code bytes, then D/32 scale bytes (D = 128: 68 B) |

Bytes of one row, in order:

    fp8_e8m0:  [c0][c1] … [c(D−1)] [e0] … [e(D/32−1)]     c: e4m3 (torch.float8_e4m3fn bits)
    fp4_*:     [c1|c0][c3|c2] … [c(D−1)|c(D−2)] [s0] … [s(D/B−1)]
                                                        c: e2m1 nibbles, value 2i in the low
                                                        nibble; s: e8m0 or e4m3 per block

- e2m1 nibble: bit 3 the sign, bits 0-2 the magnitude's index in {0, 0.5, 1, 1.5, 2, 3,
  4, 6} (the OCP MX encoding). −0 is kept (nibble 8), as the round trips can produce it.
- e8m0 byte e: the scale 2^(e − 127) (e = 255 unused).
- e4m3 scale: the torch.float8_e4m3fn bit pattern, finite and positive.

A value is `code · scale`, exact in bf16 for every code and scale the round trips make, so
`unpack(pack(v)) == v` bit for bit for every row a round trip produced (tested over
every code and scale). `pack` finds each block's scale from the values (the round trip's
formula; for `fp4_e4m3` blocks whose first candidate does not represent them, the block
maximum over each e2m1 magnitude), checks that every value is code · scale exactly, and
refuses a row that is not on the grid. These are the torch forms (and the CPU path);
kernels that write and read packed rows must give the same bytes and values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference.qdq import E2M1_GRID, FP4_MAX, FP8_MAX, pow2_ceil

__all__ = ["FORMATS", "Format", "pack", "unpack", "row_bytes", "kv_bytes_per_token"]


@dataclass(frozen=True)
class Format:
    name: str
    block: int
    fp4: bool  # e2m1 codes (two per byte), else e4m3 (one per byte)
    e8m0: bool  # power-of-two scales (one byte: the exponent), else e4m3 scales
    floor: float  # the round trip's amax floor
    qmax: float  # the largest code magnitude


FORMATS = {
    "fp8_e8m0": Format("fp8_e8m0", 32, False, True, 1e-4, FP8_MAX),
    "fp4_e4m3": Format("fp4_e4m3", 16, True, False, FP4_MAX * 2.0**-9, FP4_MAX),
    "fp4_e8m0": Format("fp4_e8m0", 32, True, True, FP4_MAX * 2.0**-126, FP4_MAX),
}
_GRID = torch.tensor(E2M1_GRID, dtype=torch.float32)


def _fmt(fmt) -> Format:
    if isinstance(fmt, Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}; allowed: {sorted(FORMATS)}")
    return FORMATS[fmt]


def row_bytes(fmt, D: int) -> int:
    """Bytes of one packed row of D values."""
    f = _fmt(fmt)
    if D < 1 or D % f.block or (f.fp4 and D % 2):
        raise ValueError(f"D = {D}; allowed: a positive multiple of {f.block} ({f.name})")
    return (D // 2 if f.fp4 else D) + D // f.block


def _scale_e8m0(amax: torch.Tensor, f: Format) -> torch.Tensor:
    if f.fp4:
        return pow2_ceil(amax.clamp_min(f.floor) / f.qmax)
    return pow2_ceil(amax.clamp_min(f.floor) * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32))


def _codes(x: torch.Tensor, s: torch.Tensor, f: Format) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes as bits: uint8 e4m3 or e2m1 nibbles, exact: whether code · s == x everywhere
    per block)."""
    q = x / s
    if f.fp4:
        mag = q.abs()
        idx = torch.zeros_like(mag, dtype=torch.uint8)
        for g in E2M1_GRID[1:]:  # the index of the largest grid value ≤ mag
            idx += (mag >= g).to(torch.uint8)
        ok = _GRID.to(x.device)[idx.long()] == mag
        nib = idx | (torch.signbit(q).to(torch.uint8) << 3)
        return nib, ok.all(-1)
    c = q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    ok = (c.float() == q) & torch.isfinite(q)
    return c.view(torch.uint8), ok.all(-1)


def pack(v: torch.Tensor, fmt, check: bool = True) -> torch.Tensor:
    """bf16 `[..., D]` rows on the format's grid → uint8 `[..., row_bytes(fmt, D)]` (module
    doc). Raises ValueError naming the first row and block that no code and scale of the
    format represent exactly. `check=False` (the runtime's cache writes, whose rows come
    from the round trips): no check and no host sync; a row off the grid then packs to
    the nearest codes below."""
    f = _fmt(fmt)
    if not isinstance(v, torch.Tensor) or v.dtype != torch.bfloat16:
        raise TypeError(f"v: {getattr(v, 'dtype', type(v).__name__)}; allowed: torch.bfloat16")
    D = v.shape[-1]
    row_bytes(f, D)
    lead = v.shape[:-1]
    x = v.reshape(-1, D // f.block, f.block).float()
    amax = x.abs().amax(-1, keepdim=True)
    if f.e8m0:
        s = _scale_e8m0(amax, f)
        codes, ok = _codes(x, s, f)
        sbytes = (torch.frexp(s)[1] - 1 + 127).to(torch.uint8)  # s = 2^(exp − 1)
    else:
        s = (amax.clamp_min(f.floor) / f.qmax).clamp_max(FP8_MAX).to(torch.float8_e4m3fn).float()
        codes, ok = _codes(x, s, f)
        # blocks whose scale is not the formula's (subnormal e4m3 scales): the block maximum
        # is code · s for one of the e2m1 magnitudes, so one of these scales represents it
        for g in sorted(E2M1_GRID[1:], reverse=True):
            if check and bool(ok.all()):
                break
            cand = (amax / g).to(torch.float8_e4m3fn).float()
            cand = torch.where((cand * g == amax) & (cand > 0), cand, s)
            c2, ok2 = _codes(x, cand, f)
            take = ~ok & ok2
            s = torch.where(take[:, :, None], cand, s)
            codes = torch.where(take[:, :, None], c2, codes)
            ok = ok | ok2
        sbytes = s.to(torch.float8_e4m3fn).view(torch.uint8)
    if check and not bool(ok.all()):
        bad = int((~ok).nonzero()[0, 0]), int((~ok).nonzero()[0, 1])
        raise ValueError(
            f"row {bad[0]}, block {bad[1]}: values not on the {f.name} grid; allowed: rows a "
            f"{'fp8_qdq' if not f.fp4 else ('fp4_e8m0_qdq' if f.e8m0 else 'fp4_e4m3_qdq')} round trip produced"
        )
    codes = codes.reshape(x.shape[0], D)
    if f.fp4:
        codes = codes[:, 0::2] | (codes[:, 1::2] << 4)
    out = torch.cat([codes, sbytes.reshape(x.shape[0], -1)], dim=1)
    return out.reshape(*lead, -1)


def unpack(p: torch.Tensor, fmt, D: int) -> torch.Tensor:
    """uint8 `[..., row_bytes(fmt, D)]` → bf16 `[..., D]`: code · scale per value."""
    f = _fmt(fmt)
    nb = row_bytes(f, D)
    if not isinstance(p, torch.Tensor) or p.dtype != torch.uint8 or p.shape[-1] != nb:
        got = f"{tuple(p.shape)} {p.dtype}" if isinstance(p, torch.Tensor) else type(p).__name__
        raise ValueError(f"p: {got}; allowed: uint8 [..., {nb}] ({f.name}, D = {D})")
    lead = p.shape[:-1]
    q = p.reshape(-1, nb)
    nc = D // 2 if f.fp4 else D
    cb, sb = q[:, :nc], q[:, nc:]
    if f.fp4:
        nib = torch.stack([cb & 15, cb >> 4], dim=-1).reshape(-1, D)
        mag = _GRID.to(p.device)[(nib & 7).long()]
        vals = torch.where((nib & 8).bool(), -mag, mag)
    else:
        vals = cb.contiguous().view(torch.float8_e4m3fn).float()
    if f.e8m0:
        s = torch.ldexp(torch.ones_like(sb, dtype=torch.float32), sb.long() - 127)
    else:
        s = sb.contiguous().view(torch.float8_e4m3fn).float()
    out = (vals.reshape(-1, D // f.block, f.block) * s[:, :, None]).reshape(-1, D)
    return out.to(torch.bfloat16).reshape(*lead, D)


def kv_bytes_per_token(cfg, kv_format: str = "packed") -> dict:
    """Cache bytes one token adds across the whole model (every kv source's compressed row
    share 1/ratio, and its index key's), and the window rings' bytes per sequence (fixed:
    n_layers × window rows). kv_format: "packed" (V4.1's formats) or "bf16"."""
    if kv_format not in ("packed", "bf16"):
        raise ValueError(f"kv_format = {kv_format!r}; allowed: 'packed', 'bf16'")
    D, Di = cfg.head_dim, cfg.index_head_dim
    if kv_format == "packed":
        comp, key, win = row_bytes("fp4_e4m3", D), row_bytes("fp4_e8m0", Di), row_bytes("fp8_e8m0", D)
    else:
        comp, key, win = 2 * D, 2 * Di, 2 * D
    per_tok = 0.0
    for i in cfg.kv_source_layers:
        r = cfg.roles[i].ratio
        per_tok += (comp + key) / r
    return dict(
        kv_format=kv_format,
        per_token=per_tok,
        window_per_sequence=cfg.n_layers * cfg.window * win,
        comp_row=comp,
        key_row=key,
        window_row=win,
    )
