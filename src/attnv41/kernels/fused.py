"""Fused decode chains in Triton: norm → RoPE → quantize round trip → cache write, one launch.

Each function replaces a chain of the single-op kernels (`norm.rms_norm`,
`rope.apply_rope`, `qdq.*_qdq`, `ring.ring_write`) that the runtime launches one after
the other, and gives the same bytes as that chain (the outputs, the cache rows and the
non-finite counter):

- `kv_chain`: the window row of `_qkv` and its ring write (rms_norm, RoPE at `pos`,
  fp8 round trip, into `kv_out` and ring slot `pos % window`).
- `compress_kv_chain`: a kv source's compressed row (rms_norm into `latent`, RoPE at
  `row_pos`, fp4 e4m3 round trip, into cache row `row`).
- `index_k_chain`: its index key (rms_norm, RoPE at `row_pos`, fp4 e8m0 round trip, into
  `index_k` row `row`).
- `index_q_chain`: the index queries (RoPE at `pos`, fp4 e8m0 round trip), per head; with
  `hw=`, the head weights scaled in place in the same launch.

`<name>_torch` is the same chain of the ops' torch twins (the CPU path), same contract.

Bit identity. Every step runs the math of its single-op kernel: the bit-level helpers are
imported from those modules (`_bf16_to_f32`, `round_bf16`, `_load_weight`,
`_pow2_ceil_exp`, `_e4m3_rne`, `_e2m1_round`, `_e2m1_round_scaled`); the few lines those
kernels inline (the norm's sum and scale, the rotation, each mode's scale) are repeated
here, marked "as in". The norm's sum of squares is the same 1-D `tl.sum` over the same
`[BLOCK]` load, launched with the same `num_warps`, so the GPU reduces it in the same
order. The single-op kernels compile with fp fusion on, except RoPE's (off: its products
are rounded before the sum); this kernel keeps fusion on, like the norm, and rounds the
rotation's products with `mul_rn` on the GPU (the interpreter never fuses). Hence: equal
to the Triton chain bit for bit; equal to the torch chain wherever `rms_norm` and
`rms_norm_torch` agree (they may differ by one bf16 ulp by design, see `norm.py`).

Layout inside a program: the row is held as two `[NB_P, QB/2]` tiles, its even and odd
columns (row `j` = quantization block `j`). RoPE pairs `(lead+2k, lead+2k+1)` are then an
even and an odd value in the same place (lead and blocks are even), and a block's amax is
the larger of the two tiles' row maxima.

No host synchronisation; positions and slots are read on the device (capturable).
Outputs must not partially overlap the input (exactly the input is allowed where noted).
"""

from __future__ import annotations

import math

import torch

from . import norm as _norm
from . import qdq as _qdq
from . import ring as _ring
from . import rope as _rope
from ._triton import HAVE_TRITON, interpreting, pdl_launch, require_triton, tl, triton

if HAVE_TRITON:
    from triton.language.extra import libdevice

    from ._triton import pdl_release, pdl_wait, round_bf16
    from .norm import _load_weight
    from .qdq import _bf16_to_f32, _e2m1_round, _e2m1_round_scaled, _e4m3_rne, _pow2_ceil_exp

__all__ = [
    "kv_chain",
    "kv_chain_torch",
    "compress_kv_chain",
    "compress_kv_chain_torch",
    "index_k_chain",
    "index_k_chain_torch",
    "index_q_chain",
    "index_q_chain_torch",
]

_INT = (torch.int32, torch.int64)
_MAX_WIDTH = 4096  # norm.rms_norm's one-chunk width: wider rows would take its two-pass loop


# ---------------------------------------------------------------------- argument checks


def _tensor(name: str, t, dtypes: tuple, dim: int, device: torch.device | None) -> None:
    """ValueError unless `t` is a tensor of one of `dtypes`, `dim` dims, on `device`, last dim contiguous."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} = {type(t).__name__}; allowed: a torch.Tensor")
    if t.dtype not in dtypes:
        allowed = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}.dtype = {t.dtype}; allowed: {allowed}")
    if t.dim() != dim:
        raise ValueError(f"{name}.dim() = {t.dim()} (shape {tuple(t.shape)}); allowed: {dim}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}.device = {t.device}; allowed: {device} (the input's device)")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}.stride(-1) = {t.stride(-1)}; allowed: 1 (contiguous last dim)")


def _shape(name: str, t: torch.Tensor, shape: tuple, what: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}.shape = {tuple(t.shape)}; allowed: {list(shape)} ({what})")


def _check_rope(x_name: str, width: int, cos, sin, device) -> int:
    """Check the tables against rows of `width`; return half = rope_dim / 2."""
    for name, t in (("cos", cos), ("sin", sin)):
        _tensor(name, t, (torch.float32,), 2, device)
        if t.shape[1] < 1:
            raise ValueError(f"{name}.shape = {tuple(t.shape)}; allowed: [max_seq, rope_dim/2], rope_dim/2 >= 1")
    if sin.shape != cos.shape:
        raise ValueError(f"sin.shape = {tuple(sin.shape)}; allowed: cos.shape = {tuple(cos.shape)}")
    half = cos.shape[1]
    if 2 * half > width:
        raise ValueError(f"rope_dim = 2*cos.shape[1] = {2 * half}; allowed: 2..{x_name}.shape[-1] = {width}")
    return half


def _check_positions(name: str, t, m: int, device) -> None:
    _tensor(name, t, _INT, 1, device)
    _shape(name, t, (m,), "one per token")


def _check_rows(x_name: str, x, block: int) -> tuple[int, int]:
    """`x`: bf16 `[m, width]`, width a multiple of the quantization block, at most _MAX_WIDTH."""
    _tensor(x_name, x, (torch.bfloat16,), 2, None)
    m, width = x.shape
    if width < block or width % block or width > _MAX_WIDTH:
        raise ValueError(f"{x_name}.shape[1] = {width}; allowed: a multiple of {block} in {block}..{_MAX_WIDTH}")
    return m, width


def _check_norm(x_name: str, x, weight, eps) -> None:
    _tensor("norm_w", weight, (torch.float32, torch.bfloat16), 1, x.device)
    _shape("norm_w", weight, (x.shape[1],), f"{x_name}.shape[1]")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps = {eps!r}; allowed: a finite float >= 0")


def _check_out(name: str, t, like: torch.Tensor, like_name: str) -> None:
    _tensor(name, t, (torch.bfloat16,), like.dim(), like.device)
    _shape(name, t, tuple(like.shape), f"the shape of {like_name}")


def _check_cache(name: str, t, width: int, device, fmt: str | None = None) -> None:
    """bf16 `[rows, width]`, or (fmt given) uint8 rows of that packed format
    (`attnv41.packed`): the chain then writes the packed bytes."""
    if fmt is not None and isinstance(t, torch.Tensor) and t.dtype == torch.uint8:
        from ..packed import row_bytes  # noqa: PLC0415

        _tensor(name, t, (torch.uint8,), 2, device)
        nb = row_bytes(fmt, width)
        if t.shape[0] < 1 or t.shape[1] != nb or t.stride(1) != 1:
            raise ValueError(f"{name}.shape = {tuple(t.shape)}; allowed: [rows >= 1, {nb}] (packed {fmt})")
        return
    _tensor(name, t, (torch.bfloat16,) + ((torch.uint8,) if fmt else ()), 2, device)
    if t.shape[0] < 1 or t.shape[1] != width:
        raise ValueError(f"{name}.shape = {tuple(t.shape)}; allowed: [rows >= 1, {width}]")


def _check_count(nonfinite, device) -> None:
    if nonfinite is None:
        return
    if not isinstance(nonfinite, torch.Tensor) or nonfinite.dtype != torch.int64 or nonfinite.numel() != 1:
        raise ValueError(f"nonfinite = {nonfinite!r}; allowed: None or an int64 tensor of one element")
    if nonfinite.device != device:
        raise ValueError(f"nonfinite.device = {nonfinite.device}; allowed: {device} (the input's device)")


def _check_norm_chain(x_name: str, x, norm_w, eps, cos, sin, pos_name: str, pos, block: int) -> None:
    """The input half of a norm → rope → qdq chain: rows, weight, eps, tables, positions."""
    m, width = _check_rows(x_name, x, block)
    _check_norm(x_name, x, norm_w, eps)
    _check_rope(x_name, width, cos, sin, x.device)
    _check_positions(pos_name, pos, m, x.device)


def _check_kv(kv_pre, norm_w, eps, cos, sin, pos, kv_out, ring, nonfinite, slot=None, mapped=False) -> None:
    _check_norm_chain("kv_pre", kv_pre, norm_w, eps, cos, sin, "pos", pos, _qdq.FP8_BLOCK)
    if mapped and slot is None:
        raise ValueError("slot = None with mapped = True; allowed: the slot mapping, int [m]")
    if slot is not None:
        _check_positions("slot", slot, kv_pre.shape[0], kv_pre.device)
    _check_out("kv_out", kv_out, kv_pre, "kv_pre")
    if ring is not None:  # None: the rows only (a batched step writes its rings after attention)
        _check_cache("ring", ring, kv_pre.shape[1], kv_pre.device, "fp8_e8m0")
    _check_count(nonfinite, kv_pre.device)


def _check_compress_kv(lat_pre, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, nonfinite) -> None:
    _check_norm_chain("lat_pre", lat_pre, norm_w, eps, cos, sin, "row_pos", row_pos, _qdq.FP4_E4M3_BLOCK)
    _check_positions("row", row, lat_pre.shape[0], lat_pre.device)
    _check_out("latent", latent, lat_pre, "lat_pre")
    _check_cache("compress_kv", compress_kv, lat_pre.shape[1], lat_pre.device, "fp4_e4m3")
    _check_count(nonfinite, lat_pre.device)


def _check_index_k(kp, norm_w, eps, cos, sin, row_pos, row, index_k, nonfinite) -> None:
    _check_norm_chain("kp", kp, norm_w, eps, cos, sin, "row_pos", row_pos, _qdq.FP4_E8M0_BLOCK)
    _check_positions("row", row, kp.shape[0], kp.device)
    _check_cache("index_k", index_k, kp.shape[1], kp.device, "fp4_e8m0")
    _check_count(nonfinite, kp.device)


# ---------------------------------------------------------------------- the kernel

_MODE_FP8, _MODE_FP4_E8M0, _MODE_FP4_E4M3 = _qdq._MODE_FP8, _qdq._MODE_FP4_E8M0, _qdq._MODE_FP4_E4M3

if HAVE_TRITON:

    @triton.jit
    def _rotate_mul(a, b, RN: tl.constexpr):
        """fp32 `a·b` rounded on its own: never contracted into an fma with a later add."""
        if RN:
            return libdevice.mul_rn(a, b)
        else:  # the interpreter: numpy rounds every product
            return a * b

    @triton.jit
    def _e4m3_bits(v):
        """fp32 values exactly representable in e4m3 (±0, subnormals included) → their
        float8_e4m3fn bit patterns (int32)."""
        bits = v.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        exp = mag >> 23
        normal = ((exp - 120) << 3) | ((mag >> 20) & 7)  # e4m3 exponent = fp32's − 127 + 7
        sub = (tl.abs(v) * 512.0).to(tl.int32)  # |v| < 2^-6: a multiple of 2^-9
        return tl.where(exp >= 121, normal, sub) | (((bits >> 31) & 1) << 7)

    @triton.jit
    def _e2m1_nibble(c):
        """fp32 e2m1 values (±{0, .5, 1, 1.5, 2, 3, 4, 6}) → nibbles: bit 3 the sign, bits
        0-2 the magnitude's index (int32)."""
        a = tl.abs(c)
        idx = (a >= 0.5).to(tl.int32) + (a >= 1.0).to(tl.int32) + (a >= 1.5).to(tl.int32)
        idx += (a >= 2.0).to(tl.int32) + (a >= 3.0).to(tl.int32) + (a >= 4.0).to(tl.int32)
        idx += (a >= 6.0).to(tl.int32)
        return idx | (((c.to(tl.int32, bitcast=True) >> 31) & 1) << 3)

    @triton.jit
    def _chain_kernel(
        x_ptr,  # bf16 rows, x[t, v, :] at t·sx_m + v·sx_v
        w_ptr,  # norm weight [width] (when NORM)
        norm_out_ptr,  # bf16 [m, width]: the normed rows (when NORM_OUT)
        out_ptr,  # bf16 like x: the round-tripped rows (when WRITE_OUT)
        cos_ptr,
        sin_ptr,
        pos_ptr,  # int [m]: rope position of token t
        cache_ptr,  # bf16 [rows, width]: row t goes to slot[t] % rows (when CACHE), for t >= first
        slot_ptr,  # int [m]
        count_ptr,  # int64 [1]: += the non-finite inputs of the round trip (when COUNT)
        width,  # runtime, as norm.rms_norm passes it (its mask, its layout)
        width_f,
        eps,
        sx_m,
        sx_v,
        stride_w,
        sn_m,
        so_m,
        so_v,
        scos,
        ssin,
        s_cache,
        cache_rows,
        first,
        BLOCK: tl.constexpr,  # next_power_of_2(width): norm.rms_norm's BLOCK
        LEAD: tl.constexpr,  # width − rope_dim (even)
        NB: tl.constexpr,  # quantization blocks per row
        NB_P: tl.constexpr,  # next_power_of_2(NB)
        HQ: tl.constexpr,  # half a quantization block (16 or 8)
        MODE: tl.constexpr,  # 0 fp8, 1 fp4_e8m0, 2 fp4_e4m3 (qdq's modes)
        NORM: tl.constexpr,
        NORM_OUT: tl.constexpr,
        WRITE_OUT: tl.constexpr,
        CACHE: tl.constexpr,
        PACKED: tl.constexpr,  # the cache holds packed rows (uint8): write codes and scale bytes
        COUNT: tl.constexpr,
        EXACT_CAST: tl.constexpr,  # as qdq's: e4m3 by bit arithmetic (interpreter) or the GPU's cast
        RN: tl.constexpr,  # rotation products through mul_rn (GPU)
        PDL: tl.constexpr = False,
        MAPPED: tl.constexpr = False,  # slot[t] < 0: token t writes no cache row (a slot mapping's −1)
        hw_ptr=None,  # bf16 [m, n_vec]: hw[t, v] scaled in place by program (t, v) (when HW)
        s_hw_m=0,
        s_hw_v=0,
        hw_scale=1.0,  # fp32
        HW: tl.constexpr = False,
    ):
        pdl_release(PDL)
        pdl_wait(PDL)
        # program (t, v): token t, vector v of it (v = 0 unless index queries)
        t = tl.program_id(0).to(tl.int64)
        vec = tl.program_id(1).to(tl.int64)
        x_row = x_ptr + t * sx_m + vec * sx_v
        # [NB_P, HQ]: column 2k / 2k+1 of block j, at j·2HQ + 2k (+1)
        j = tl.arange(0, NB_P).to(tl.int64)
        k = tl.arange(0, HQ).to(tl.int64)
        col_e = j[:, None] * (2 * HQ) + 2 * k[None, :]
        col_o = col_e + 1
        ok = (j < NB)[:, None] & (k >= 0)[None, :]
        if NORM:
            # as in norm._rms_norm_kernel (one chunk): the same load, sum and scalar
            row = t
            # [BLOCK]
            offs = tl.arange(0, BLOCK)
            mask = offs < width
            v = _bf16_to_f32(tl.load(x_ptr + row * sx_m + offs, mask=mask, other=0.0))
            ss = tl.sum(v * v, axis=0)
            ms = tl.math.div_rn(ss, width_f)
            r = tl.math.div_rn(1.0, tl.sqrt_rn(ms + eps))
            # [NB_P, HQ] the normed values, bf16, as rms_norm stores them
            ve = _bf16_to_f32(tl.load(x_row + col_e, mask=ok, other=0.0))
            vo = _bf16_to_f32(tl.load(x_row + col_o, mask=ok, other=0.0))
            we = _load_weight(w_ptr + col_e * stride_w, ok)
            wo = _load_weight(w_ptr + col_o * stride_w, ok)
            ne = round_bf16(we * (ve * r))
            no = round_bf16(wo * (vo * r))
        else:
            ne = tl.load(x_row + col_e, mask=ok, other=0.0)
            no = tl.load(x_row + col_o, mask=ok, other=0.0)
        # as in rope._rope_kernel: pair (a, b) at (lead+2k', lead+2k'+1), k' = (col_e − lead)/2
        p = tl.load(pos_ptr + t).to(tl.int64)
        rot = ok & (col_e >= LEAD)
        kk = tl.maximum(col_e - LEAD, 0) // 2
        c = tl.load(cos_ptr + p * scos + kk, mask=rot, other=0.0)
        s = tl.load(sin_ptr + p * ssin + kk, mask=rot, other=0.0)
        a = ne.to(tl.float32)
        b = no.to(tl.float32)
        re = _rotate_mul(a, c, RN) - _rotate_mul(b, s, RN)
        im = _rotate_mul(a, s, RN) + _rotate_mul(b, c, RN)
        ze = tl.where(rot, round_bf16(re), ne)
        zo = tl.where(rot, round_bf16(im), no)
        # as in qdq._qdq_kernel: [NB_P, HQ] inputs, [NB_P] per-block scale
        ve = _bf16_to_f32(ze)
        vo = _bf16_to_f32(zo)
        if COUNT:
            bad_e = (ve.to(tl.int32, bitcast=True) & 0x7F800000) == 0x7F800000
            bad_o = (vo.to(tl.int32, bitcast=True) & 0x7F800000) == 0x7F800000
            n_bad = tl.sum(tl.sum((bad_e & ok).to(tl.int64), axis=1), axis=0) + tl.sum(
                tl.sum((bad_o & ok).to(tl.int64), axis=1), axis=0
            )
            tl.atomic_add(count_ptr, n_bad, mask=n_bad > 0)
        # one max over the block's 2·HQ values, as nested tl.max (not tl.maximum of the halves'
        # maxima): a reduction skips NaN unless all are NaN (interpreter and GPU), tl.maximum
        # on the interpreter does not
        amax = tl.max(tl.max(tl.join(tl.abs(ve), tl.abs(vo)), axis=2), axis=1)
        if MODE == 0:
            e = _pow2_ceil_exp(tl.maximum(amax, 1e-4) * 0.002232142857142857)
            sc = (e << 23).to(tl.float32, bitcast=True)[:, None]
            inv_s = ((254 - e) << 23).to(tl.float32, bitcast=True)[:, None]
            qe = tl.minimum(tl.maximum(ve * inv_s, -448.0), 448.0)
            qo = tl.minimum(tl.maximum(vo * inv_s, -448.0), 448.0)
            if EXACT_CAST:
                ce = _e4m3_rne(qe)
                co = _e4m3_rne(qo)
            else:
                ce = qe.to(tl.float8e4nv).to(tl.float32)
                co = qo.to(tl.float8e4nv).to(tl.float32)
            sbyte = e
        elif MODE == 1:
            tq = tl.math.div_rn(tl.maximum(amax, 7.052966104933725e-38), tl.full(amax.shape, 6.0, tl.float32))
            e = _pow2_ceil_exp(tq)
            sc = (e << 23).to(tl.float32, bitcast=True)[:, None]
            inv_s = ((254 - e) << 23).to(tl.float32, bitcast=True)[:, None]
            ce = _e2m1_round(tl.minimum(tl.maximum(ve * inv_s, -6.0), 6.0))
            co = _e2m1_round(tl.minimum(tl.maximum(vo * inv_s, -6.0), 6.0))
            sbyte = e
        else:
            tq = tl.math.div_rn(tl.maximum(amax, 0.01171875), tl.full(amax.shape, 6.0, tl.float32))
            s0 = _e4m3_rne(tl.minimum(tq, 448.0))
            sc = s0[:, None]
            ce = _e2m1_round_scaled(ve, sc)
            co = _e2m1_round_scaled(vo, sc)
            sbyte = _e4m3_bits(s0)
        # the codes ce, co and the block scale sc; their products are exact in fp32
        ye = round_bf16(ce * sc)
        yo = round_bf16(co * sc)
        # every program's loads before any store: outputs may be the input itself
        tl.debug_barrier()
        if NORM_OUT:
            tl.store(norm_out_ptr + t * sn_m + col_e, ne, mask=ok)
            tl.store(norm_out_ptr + t * sn_m + col_o, no, mask=ok)
        if WRITE_OUT:
            o_row = out_ptr + t * so_m + vec * so_v
            tl.store(o_row + col_e, ye, mask=ok)
            tl.store(o_row + col_o, yo, mask=ok)
        if CACHE:
            raw = tl.load(slot_ptr + t).to(tl.int64)
            slot = raw % cache_rows
            keep_t = t >= first
            if MAPPED:
                keep_t = keep_t & (raw >= 0)
            c_ok = ok & keep_t
            if PACKED:
                # V4.1's byte formats (attnv41.packed): the codes, then one scale byte per block
                row_b = cache_ptr + slot * s_cache
                s_ok = (j < NB) & keep_t
                if MODE == 0:
                    tl.store(row_b + col_e, _e4m3_bits(ce), mask=c_ok)
                    tl.store(row_b + col_o, _e4m3_bits(co), mask=c_ok)
                    tl.store(row_b + width + j, sbyte.to(tl.uint8), mask=s_ok)
                else:  # value 2i in the low nibble, 2i + 1 in the high one: byte col_e / 2
                    byte = _e2m1_nibble(ce) | (_e2m1_nibble(co) << 4)
                    tl.store(row_b + col_e // 2, byte.to(tl.uint8), mask=c_ok)
                    tl.store(row_b + width // 2 + j, sbyte.to(tl.uint8), mask=s_ok)
            else:
                tl.store(cache_ptr + slot * s_cache + col_e, ye, mask=c_ok)
                tl.store(cache_ptr + slot * s_cache + col_o, yo, mask=c_ok)
        if HW:  # bf16(fp32(hw) · fp32(scale)): torch's `hw.mul_(scale)` on bf16, one element per program
            h_at = hw_ptr + t * s_hw_m + vec * s_hw_v
            tl.store(h_at, round_bf16(_bf16_to_f32(tl.load(h_at)) * hw_scale))


def _launch(
    x3,
    mode,
    block,
    cos,
    sin,
    pos,
    *,
    norm_w=None,
    eps=0.0,
    norm_out=None,
    out3=None,
    cache=None,
    slot=None,
    nonfinite=None,
    mapped=False,
    hw=None,
    hw_scale=1.0,
) -> None:
    """One program per (token, vector) of bf16 `x3 [m, n_vec, width]` (checked by the caller).
    mapped: `slot` is a slot mapping (every token with slot ≥ 0 writes at that row, −1 none),
    not the ring rule (the last min(m, rows) tokens at slot % rows). hw: None or bf16
    `[m, n_vec]`, each element scaled in place by hw_scale (`index_q_chain`)."""
    m, n_vec, width = x3.shape
    if m == 0 or n_vec == 0:
        return
    nb = width // block
    bl = triton.next_power_of_2(width)
    any_t = x3
    keep = 0 if cache is None else (m if mapped else min(m, cache.shape[0]))
    _chain_kernel[(m, n_vec)](
        x3,
        any_t if norm_w is None else norm_w,
        any_t if norm_out is None else norm_out,
        any_t if out3 is None else out3,
        cos,
        sin,
        pos,
        any_t if cache is None else cache,
        pos if slot is None else slot,
        any_t if nonfinite is None else nonfinite,
        width,
        float(width),
        float(eps),
        x3.stride(0),
        x3.stride(1),
        0 if norm_w is None else norm_w.stride(0),
        0 if norm_out is None else norm_out.stride(0),
        0 if out3 is None else out3.stride(0),
        0 if out3 is None else out3.stride(1),
        cos.stride(0),
        sin.stride(0),
        0 if cache is None else cache.stride(0),
        1 if cache is None else cache.shape[0],
        m - keep,
        BLOCK=bl,
        LEAD=width - 2 * cos.shape[1],
        NB=nb,
        NB_P=triton.next_power_of_2(nb),
        HQ=block // 2,
        MODE=mode,
        NORM=norm_w is not None,
        NORM_OUT=norm_out is not None,
        WRITE_OUT=out3 is not None,
        CACHE=cache is not None,
        PACKED=cache is not None and cache.dtype == torch.uint8,
        COUNT=nonfinite is not None,
        EXACT_CAST=interpreting() or not _qdq._HW_E4M3,
        RN=not interpreting(),
        MAPPED=bool(mapped),
        **({} if hw is None else dict(hw_ptr=hw, s_hw_m=hw.stride(0), s_hw_v=hw.stride(1), hw_scale=hw_scale, HW=True)),
        # with a norm: rms_norm's warps, so its sum reduces in the same order
        num_warps=(4 if bl <= 1024 else 8) if norm_w is not None else 1,
        **pdl_launch(x3),
    )


# ---------------------------------------------------------------------- kv_chain


def kv_chain(kv_pre, norm_w, eps, cos, sin, pos, kv_out, ring, nonfinite=None, slot=None, mapped=False) -> torch.Tensor:
    """The window row of m tokens in one launch: `kv_out = fp8_qdq(rope(rms_norm(kv_pre)))`, and
    `ring[pos % window] = kv_out` for the last `min(m, window)` rows.

    kv_pre: bf16 `[m, D]`, D a multiple of 32, ≤ 4096; norm_w: fp32/bf16 `[D]`; eps:
    finite ≥ 0; cos, sin: fp32 `[max_seq, rope_dim/2]`, rope_dim ≤ D; pos: int32/int64
    `[m]`, each in 0..max_seq−1 (not checked: a host sync); kv_out: bf16 `[m, D]` (may be
    kv_pre); ring: bf16 `[window, D]`, packed fp8_e8m0 uint8 `[window, D + D/32]`, or None
    (no ring write); nonfinite: None or the int64 `[1]` counter, += the
    non-finite values entering the fp8 round trip; slot: None (the ring row of token t is
    pos[t] % window) or int `[m]`, its ring row slot[t] % rows (a batched step's staging
    rows). mapped: slot (given) is a slot mapping instead: every token with slot[t] ≥ 0
    writes ring row slot[t] (distinct, < rows: not checked, a host sync), −1 writes nothing
    (`attnv41.ops.kv_rows`). Returns kv_out. The same bytes as rms_norm → apply_rope →
    fp8_qdq → ring_write (Triton), see the module docstring.
    """
    _check_kv(kv_pre, norm_w, eps, cos, sin, pos, kv_out, ring, nonfinite, slot, mapped)
    require_triton("kv_chain", *(t for t in (kv_pre, kv_out, ring) if t is not None))
    _launch(
        kv_pre[:, None],
        _MODE_FP8,
        _qdq.FP8_BLOCK,
        cos,
        sin,
        pos,
        norm_w=norm_w,
        eps=eps,
        out3=kv_out[:, None],
        cache=ring,
        slot=slot,
        nonfinite=nonfinite,
        mapped=mapped,
    )
    return kv_out


def kv_chain_torch(
    kv_pre, norm_w, eps, cos, sin, pos, kv_out, ring, nonfinite=None, slot=None, mapped=False
) -> torch.Tensor:
    """`kv_chain` as the chain of the torch twins (any device); same contract."""
    _check_kv(kv_pre, norm_w, eps, cos, sin, pos, kv_out, ring, nonfinite, slot, mapped)
    m, D = kv_pre.shape
    _norm.rms_norm_torch(kv_pre, norm_w, eps, out=kv_out)
    _rope.apply_rope_torch(kv_out.view(m, 1, D), cos, sin, pos, out=kv_out.view(m, 1, D))
    _qdq.fp8_qdq_torch(kv_out, out=kv_out, nonfinite=nonfinite)
    if ring is not None:
        _cache_write_torch(ring, kv_out, pos if slot is None else slot, "fp8_e8m0", mapped)
    return kv_out


def _cache_write_torch(cache, rows, slot, fmt: str, mapped: bool = False) -> None:
    """`ring_write_torch`, or for a packed (uint8) cache the rows packed into it (same rule:
    the last min(m, rows) rows, at slot % rows). mapped: every row with slot ≥ 0 at that
    row, −1 nowhere (`ring.slot_write_torch`'s rule)."""
    from ..packed import pack  # noqa: PLC0415

    if mapped:
        keep = slot >= 0
        src = rows[keep]
        cache.index_copy_(0, slot[keep].long(), pack(src, fmt, check=False) if cache.dtype == torch.uint8 else src)
        return
    if cache.dtype != torch.uint8:
        _ring.ring_write_torch(cache, rows, slot)
        return
    m = rows.shape[0]
    keep = min(m, cache.shape[0])
    if keep:
        cache[slot[m - keep :].long() % cache.shape[0]] = pack(rows[m - keep :], fmt, check=False)


# ---------------------------------------------------------------------- compressed rows


def compress_kv_chain(lat_pre, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, nonfinite=None, mapped=False):
    """A kv source's new compressed rows in one launch: `latent = rms_norm(lat_pre)`, and
    `compress_kv[row % rows] = fp4_e4m3_qdq(rope(latent at row_pos))` for the last
    `min(m, rows)` tokens.

    lat_pre: bf16 `[m, D]`, D a multiple of 16, ≤ 4096; latent: bf16 `[m, D]` (the indexer
    key's input; may be lat_pre); row_pos, row: int32/int64 `[m]` (RoPE position, cache
    row); compress_kv: bf16 `[rows, D]`, or uint8 `[rows, D/2 + D/16]` for V4.1's packed
    fp4_e4m3 rows (`attnv41.packed`: the codes and scales written instead of their bf16
    products); other arguments (mapped: row a slot mapping) as `kv_chain`. Returns latent.
    The same bytes as rms_norm → apply_rope → fp4_e4m3_qdq → ring_write (Triton).
    """
    _check_compress_kv(lat_pre, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, nonfinite)
    require_triton("compress_kv_chain", lat_pre, latent, compress_kv)
    _launch(
        lat_pre[:, None],
        _MODE_FP4_E4M3,
        _qdq.FP4_E4M3_BLOCK,
        cos,
        sin,
        row_pos,
        norm_w=norm_w,
        eps=eps,
        norm_out=latent,
        cache=compress_kv,
        slot=row,
        nonfinite=nonfinite,
        mapped=mapped,
    )
    return latent


def compress_kv_chain_torch(
    lat_pre, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, nonfinite=None, mapped=False
):
    """`compress_kv_chain` as the chain of the torch twins (any device); same contract."""
    _check_compress_kv(lat_pre, norm_w, eps, cos, sin, row_pos, row, latent, compress_kv, nonfinite)
    m, D = lat_pre.shape
    _norm.rms_norm_torch(lat_pre, norm_w, eps, out=latent)
    rows = _rope.apply_rope_torch(latent.view(m, 1, D), cos, sin, row_pos)
    staged = _qdq.fp4_e4m3_qdq_torch(rows.view(m, D), nonfinite=nonfinite)
    _cache_write_torch(compress_kv, staged, row, "fp4_e4m3", mapped)
    return latent


def index_k_chain(kp, norm_w, eps, cos, sin, row_pos, row, index_k, nonfinite=None, mapped=False) -> torch.Tensor:
    """A kv source's new index keys in one launch: `index_k[row % rows] =
    fp4_e8m0_qdq(rope(rms_norm(kp) at row_pos))` for the last `min(m, rows)` tokens.

    kp: bf16 `[m, d]`, d a multiple of 32, ≤ 4096; index_k: bf16 `[rows, d]` or packed
    fp4_e8m0 uint8 `[rows, d/2 + d/32]`; other
    arguments (mapped: row a slot mapping) as `compress_kv_chain`. Returns index_k. The same bytes as rms_norm →
    apply_rope → fp4_e8m0_qdq → ring_write (Triton).
    """
    _check_index_k(kp, norm_w, eps, cos, sin, row_pos, row, index_k, nonfinite)
    require_triton("index_k_chain", kp, index_k)
    _launch(
        kp[:, None],
        _MODE_FP4_E8M0,
        _qdq.FP4_E8M0_BLOCK,
        cos,
        sin,
        row_pos,
        norm_w=norm_w,
        eps=eps,
        cache=index_k,
        slot=row,
        nonfinite=nonfinite,
        mapped=mapped,
    )
    return index_k


def index_k_chain_torch(kp, norm_w, eps, cos, sin, row_pos, row, index_k, nonfinite=None, mapped=False) -> torch.Tensor:
    """`index_k_chain` as the chain of the torch twins (any device); same contract."""
    _check_index_k(kp, norm_w, eps, cos, sin, row_pos, row, index_k, nonfinite)
    m, d = kp.shape
    kr = _norm.rms_norm_torch(kp, norm_w, eps)
    _rope.apply_rope_torch(kr.view(m, 1, d), cos, sin, row_pos, out=kr.view(m, 1, d))
    _cache_write_torch(index_k, _qdq.fp4_e8m0_qdq_torch(kr, nonfinite=nonfinite), row, "fp4_e8m0", mapped)
    return index_k


# ---------------------------------------------------------------------- index queries


def _check_index_q(iq, cos, sin, pos, out, nonfinite, hw=None, hw_scale=1.0) -> None:
    _tensor("iq", iq, (torch.bfloat16,), 3, None)
    m, H, d = iq.shape
    block = _qdq.FP4_E8M0_BLOCK
    if d < block or d % block or d > _MAX_WIDTH:
        raise ValueError(f"iq.shape[2] = {d}; allowed: a multiple of {block} in {block}..{_MAX_WIDTH}")
    _check_rope("iq", d, cos, sin, iq.device)
    _check_positions("pos", pos, m, iq.device)
    _check_out("out", out, iq, "iq")
    _check_count(nonfinite, iq.device)
    if hw is None:
        return
    _tensor("hw", hw, (torch.bfloat16,), 2, iq.device)
    _shape("hw", hw, (m, H), "[m, H] of iq")
    if isinstance(hw_scale, bool) or not isinstance(hw_scale, (int, float)) or not math.isfinite(hw_scale):
        raise ValueError(f"hw_scale = {hw_scale!r}; allowed: a finite float")


def index_q_chain(iq, cos, sin, pos, out, nonfinite=None, hw=None, hw_scale=1.0) -> torch.Tensor:
    """The index queries in one launch: `out = fp4_e8m0_qdq(rope(iq at pos))` per head.

    iq: bf16 `[m, H, d]`, d a multiple of 32, ≤ 4096; out: bf16 like iq (may be iq, in
    place); other arguments as `kv_chain`. Returns out. The same bytes as apply_rope →
    fp4_e8m0_qdq (Triton) on `[m·H, d]`. hw: None, or the head weights, bf16 `[m, H]` (not
    overlapping iq or out), scaled in place in the same launch as `hw.mul_(hw_scale)` scales
    them: bf16(fp32(hw) · fp32(hw_scale)) (hw_scale a finite float).
    """
    _check_index_q(iq, cos, sin, pos, out, nonfinite, hw, hw_scale)
    require_triton("index_q_chain", iq, out, *([] if hw is None else [hw]))
    extra = {} if hw is None else dict(hw=hw, hw_scale=float(hw_scale))
    _launch(iq, _MODE_FP4_E8M0, _qdq.FP4_E8M0_BLOCK, cos, sin, pos, out3=out, nonfinite=nonfinite, **extra)
    return out


def index_q_chain_torch(iq, cos, sin, pos, out, nonfinite=None, hw=None, hw_scale=1.0) -> torch.Tensor:
    """`index_q_chain` as the chain of the torch twins (any device); same contract."""
    _check_index_q(iq, cos, sin, pos, out, nonfinite, hw, hw_scale)
    m, H, d = iq.shape
    _rope.apply_rope_torch(iq, cos, sin, pos, out=out)
    flat = out.view(m * H, d) if out.is_contiguous() else out.reshape(m * H, d)
    res = _qdq.fp4_e8m0_qdq_torch(flat, nonfinite=nonfinite)
    out.copy_(res.view(m, H, d))
    if hw is not None:
        hw.mul_(float(hw_scale))
    return out
