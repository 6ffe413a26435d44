"""Triton loaders of V4.1's packed cache rows (`attnv41.packed`), dequantized exactly to
fp32 as they are read: the one place the kernels that read packed rows (sparse attention
in both regimes, index scoring) turn bytes into values.

A tile is a slice of C columns c0 … c0 + C − 1 of R rows given by their byte pointers.
The loads are shaped so that one instruction brings many values (the rows are read once
per step, so their load instructions, not the bytes, set the cost of a naive per-value
gather: one byte load per value and one per scale, 16x the bf16 tile's instructions):

- `fp8_e8m0_rows`: the codes as [R, C/32, 32] (32 contiguous bytes per scale block:
  vector loads), one scale byte per block, broadcast.
- `fp4_rows`: with WORDS, the codes as 32-bit words [R, C/8] (eight e2m1 nibbles each,
  value 8w + j in nibble j: little-endian, the low nibble first) and one scale byte per
  word; the host sets WORDS only when every row starts 4-byte aligned (`fp4_words_ok`),
  else one byte per value (C values, the nibble by the column's parity).

The values are code · scale, exact in fp32 and in bf16 (`attnv41.packed`), so a kernel
that rounds them to bf16 sees the unpacked rows' values bit for bit.
"""

from __future__ import annotations

import torch

from ._triton import HAVE_TRITON, tl, triton

__all__ = ["fp4_words_ok", "fp8_e8m0_rows", "fp4_rows"]


def fp4_words_ok(rows: torch.Tensor) -> bool:
    """Whether packed fp4 rows (uint8 [N, bytes]) may be read as 32-bit words: the data
    pointer and the row stride multiples of 4 bytes (every row starts 4-byte aligned)."""
    return rows.data_ptr() % 4 == 0 and (rows.shape[0] <= 1 or rows.stride(0) % 4 == 0)


if HAVE_TRITON:
    from ._triton import e2m1_value, e4m3_value, e8m0_scale

    @triton.jit
    def fp8_e8m0_rows(base, ok, c0, D, C: tl.constexpr):
        """[R, C] fp32: columns c0 … c0 + C − 1 of fp8_e8m0 rows (D e4m3 code bytes, then
        D/32 e8m0 scale bytes) at byte pointers base [R]; 0 where not ok [R] or past D.
        c0 and C multiples of 32 (D is)."""
        R: tl.constexpr = base.shape[0]
        # [C] codes of the slice (contiguous: vector loads), [C/32] its scale blocks
        col = c0 + tl.arange(0, C)
        b = c0 // 32 + tl.arange(0, C // 32)
        codes = tl.load(base[:, None] + col[None, :], mask=ok[:, None] & (col < D)[None, :], other=0)
        e = tl.load(base[:, None] + D + b[None, :], mask=ok[:, None] & (b * 32 < D)[None, :], other=0)
        v = tl.reshape(e4m3_value(codes), (R, C // 32, 32)) * e8m0_scale(e.to(tl.int32))[:, :, None]
        return tl.reshape(v, (R, C))

    @triton.jit
    def _fp4_scale(sb, E8M0: tl.constexpr):
        """uint8 scale bytes → fp32 scales (e8m0: 2^(e − 127); else e4m3; a 0 byte → 0)."""
        if E8M0:
            s = e8m0_scale(sb.to(tl.int32))
        else:
            s = e4m3_value(sb)
        return s

    @triton.jit
    def fp4_rows(base, ok, c0, D, C: tl.constexpr, BLOCK: tl.constexpr, E8M0: tl.constexpr, WORDS: tl.constexpr):
        """[R, C] fp32: columns c0 … c0 + C − 1 of fp4 rows (D/2 code bytes, value 2i in
        the low nibble of byte i, then D/BLOCK scale bytes, e8m0 if E8M0 else e4m3) at byte
        pointers base [R]; 0 where not ok [R] or past D. c0 and C multiples of 8. WORDS:
        the rows start 4-byte aligned (`fp4_words_ok`), codes read as words."""
        R: tl.constexpr = base.shape[0]
        if WORDS:
            # [C/8] word w of the row (columns 8w … 8w + 7), [8] nibble j of a word
            w = c0 // 8 + tl.arange(0, C // 8)
            m = ok[:, None] & (w * 8 < D)[None, :]
            words = tl.load(base.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=m, other=0)
            sb = tl.load(base[:, None] + D // 2 + (w * 8 // BLOCK)[None, :], mask=m, other=0)
            # the word's eight nibbles by three joins (each new axis last and within a
            # thread): halves h, bytes b, nibbles n → [R, C/8, 2, 2, 2], column 8w + 4h + 2b + n
            h = tl.join(words & 0xFFFF, (words >> 16) & 0xFFFF)
            b = tl.join(h & 0xFF, h >> 8)
            nib = tl.join(b & 15, b >> 4)
            v = e2m1_value(nib) * _fp4_scale(sb, E8M0)[:, :, None, None, None]
            v = tl.reshape(v, (R, C))
        else:
            col = c0 + tl.arange(0, C)
            m = ok[:, None] & (col < D)[None, :]
            cb = tl.load(base[:, None] + (col // 2)[None, :], mask=m, other=0).to(tl.int32)
            nib = (cb >> (4 * (col % 2))[None, :]) & 15
            sb = tl.load(base[:, None] + D // 2 + (col // BLOCK)[None, :], mask=m, other=0)
            v = e2m1_value(nib) * _fp4_scale(sb, E8M0)
        return v
