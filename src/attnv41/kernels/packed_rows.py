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

`fp4_rows_bf16` gives the bf16 tile a dot reads straight from the words (WORDS = 2, 3 or 4, compiled;
4: `_fp4_rows_bf16_lut`, each word's eight values by prmt table lookups in column order, one
bf16x2 multiply per two values, the scales as whole words of four):
PTX that builds two bf16 values per 32-bit register with integer ops and two exact bf16x2
multiplies, about 3 instructions per value where the fp32 form takes about 9 (nibble
extraction, the e2m1 bit trick, the scale multiply, the cvt to bf16). The same values,
so the same bits (tests/kernels/test_packed_rows.py checks every nibble and scale byte).
"""

from __future__ import annotations

import torch

from ._triton import (
    HAVE_TRITON,
    PACKED_MIN_CAPABILITY,
    check_kernel_device,
    device_capability,
    interpreting,
    tl,
    triton,
)

__all__ = ["fp4_words_ok", "fp4_words_mode", "fp8_e8m0_rows", "fp4_rows", "fp4_rows_bf16"]


def fp4_words_ok(rows: torch.Tensor) -> bool:
    """Whether packed fp4 rows (uint8 [N, bytes]) may be read as 32-bit words: the data
    pointer and the row stride multiples of 4 bytes (every row starts 4-byte aligned)."""
    return rows.data_ptr() % 4 == 0 and (rows.shape[0] <= 1 or rows.stride(0) % 4 == 0)


def fp4_words_mode(
    rows: torch.Tensor,
    asm: bool = True,
    scale_word: bool = False,
    lut: bool = False,
    d: int = 0,
    block: int = 0,
    one_word: bool = False,
) -> int:
    """The loaders' WORDS for packed fp4 rows: 0 byte by byte (rows not 4-byte aligned), 1
    as words, 2 as words with `fp4_rows_bf16`'s PTX (asm, compiled kernels: not under the
    interpreter, whose Triton has no inline assembly), 3 as 2 with a tile's four scale
    bytes read as one word where a tile has four (scale_word; `fp4_rows_bf16`), 4 the
    table-lookup PTX over scale words (lut, where the rows' d values make whole scale
    words of 4 blocks of `block`: d a multiple of 4 · block; else as without lut), 5 as 3
    with the code words laid out one per thread (one_word with scale_word; `fp4_rows_bf16`).
    The kernels' tiles must then be multiples of 4 · block columns (their callers' shapes)."""
    if not fp4_words_ok(rows):
        return 0
    if not asm or interpreting():
        return 1
    if rows.device.type == "cuda" and device_capability(rows.device) < PACKED_MIN_CAPABILITY:
        check_kernel_device(rows.device, "packed rows", packed=True)  # the PTX below multiplies bf16 pairs
    if lut and block > 0 and d > 0 and d % (4 * block) == 0:
        return 4
    if scale_word:
        return 5 if one_word else 3
    return 2


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

    # PTX of `fp4_rows_bf16`, two words per instance (pack=2; the same op on each): $8, $9
    # the words a, b; $10 their two scales (bf16 pair); $j (j = 0 … 7) nibble j of a (low
    # half) and of b (high half) as bf16. For byte p of both words, y = [a.byte p, ·,
    # b.byte p, ·] (prmt); a nibble at bits 0-3 and 16-19 of a register goes to bf16 bits
    # as magnitude << 6 and sign << 12 (the high nibbles, at 4-7 and 20-23: << 2 and
    # << 8), which is the value · 2^-126 (index 1, 0.5, the subnormal 2^-127): multiplied
    # by 2^126 (0x7E80) and by the scale, both exact in bf16 (bf16x2 multiplies keep
    # subnormals).
    # one output register from y: shifts sm (magnitude bits) and ss (sign bit) place a nibble pair
    _FP4_HALF = """
    shl.b32 u, y, {sm};
    and.b32 u, u, 0x01C001C0;
    shl.b32 v, y, {ss};
    and.b32 v, v, 0x80008000;
    or.b32 u, u, v;
    mul.rn.bf16x2 u, u, k;
    mul.rn.bf16x2 ${out}, u, $10;"""

    def _fp4_pair(p: int) -> str:
        sel = hex(((4 + p) << 12) | ((4 + p) << 8) | (p << 4) | p)
        low = _FP4_HALF.format(sm=6, ss=12, out=2 * p)  # low nibbles (bits 0-3, 16-19)
        high = _FP4_HALF.format(sm=2, ss=8, out=2 * p + 1)  # high nibbles (bits 4-7, 20-23)
        return f"\n    prmt.b32 y, $8, $9, {sel};{low}{high}\n"

    _FP4_ASM = tl.constexpr(
        "{\n.reg .b32 y, u, v, k;\nmov.b32 k, 0x7E807E80;\n" + "".join(_fp4_pair(p) for p in range(4)) + "}"
    )

    # `_fp4_rows_bf16_sw`'s PTX: `_FP4_ASM` with each word's scale taken from its row's
    # scale word ($10, $11 for words a, b: the four scale bytes of the tile) by a bit shift
    # ($12, $13: 8 · the word's scale index), so the scales need no tile of their own. The
    # bytes e_a, e_b become the bf16 pair s: e8m0 as bf16's exponent field (e << 7); e4m3
    # as its bits << 4, which is the value · 2^-120 (subnormals too), times 2^120 (exact).
    _FP4_SW_HEAD = (
        "{\n.reg .b32 y, u, v, k, sa, sb, s;\nmov.b32 k, 0x7E807E80;\n"
        "shr.b32 sa, $10, $12;\nshr.b32 sb, $11, $13;\nprmt.b32 s, sa, sb, 0x0400;\n"
    )
    _FP4_SW_BODY = "".join(_fp4_pair(p) for p in range(4)).replace("$10", "s") + "}"
    _FP4_SW_E8M0 = tl.constexpr(_FP4_SW_HEAD + "shl.b32 s, s, 7;\nand.b32 s, s, 0x7F807F80;\n" + _FP4_SW_BODY)
    _FP4_SW_E4M3 = tl.constexpr(
        _FP4_SW_HEAD
        + "shl.b32 s, s, 4;\nand.b32 s, s, 0x07F007F0;\nmov.b32 sa, 0x7B807B80;\nmul.rn.bf16x2 s, s, sa;\n"
        + _FP4_SW_BODY
    )

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
        pointers base [R]; 0 where not ok [R] or past D. c0 and C multiples of 8. WORDS
        (nonzero): the rows start 4-byte aligned (`fp4_words_ok`), codes read as words."""
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

    @triton.jit
    def fp4_rows_bf16(base, ok, c0, D, C: tl.constexpr, BLOCK: tl.constexpr, E8M0: tl.constexpr, WORDS: tl.constexpr):
        """`fp4_rows(...).to(bf16)`, bit for bit: [R, C] bf16. WORDS = 2, 3 or 5
        (`fp4_words_mode`; CUDA only): the words' values built in bf16 by `_FP4_ASM`, at 3
        and 5 with the scales as one word per row where C = 4 · BLOCK (`_fp4_rows_bf16_sw`;
        c0 then a multiple of C); else the fp32 form."""
        if WORDS == 4 and C % (4 * BLOCK) == 0:  # (c0 a multiple of C: the callers' chunks)
            v = _fp4_rows_bf16_lut(base, ok, c0, D, C, BLOCK, E8M0)
        elif (WORDS == 3 or WORDS == 5) and C == 4 * BLOCK:
            v = _fp4_rows_bf16_sw(base, ok, c0, D, C, BLOCK, E8M0, WORDS == 5)
        elif WORDS >= 2:  # (4 and 5 with a tile of other shape: as 2)
            R: tl.constexpr = base.shape[0]
            w = c0 // 8 + tl.arange(0, C // 8)
            m = ok[:, None] & (w * 8 < D)[None, :]
            words = tl.load(base.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=m, other=0)
            # the scales as [C/BLOCK] contiguous bytes, each repeated for its BLOCK/8 words by
            # joins: a scale pointer per word (w·8 // BLOCK) has no contiguity, and Triton then
            # lays the words out one per thread across rows, so that the bf16 tile reached
            # shared memory by 16-bit stores (the offline sm_90 compile: 66 STS.U16 in the
            # index kernel, 64 in the attention's logits kernel; now none)
            bi = c0 // BLOCK + tl.arange(0, C // BLOCK)
            sb = tl.load(base[:, None] + D // 2 + bi[None, :], mask=ok[:, None] & (bi * BLOCK < D)[None, :], other=0)
            if E8M0:  # 2^(e − 127) is bf16's exponent field e
                sc = (sb.to(tl.int16) << 7).to(tl.bfloat16, bitcast=True)
            else:
                sc = e4m3_value(sb).to(tl.bfloat16)
            tl.static_assert(BLOCK == 16 or BLOCK == 32)
            sc = tl.join(sc, sc)  # [R, C/BLOCK, 2]
            if BLOCK == 32:
                sc = tl.join(sc, sc)  # [R, C/BLOCK, 2, 2]
            sc = tl.reshape(sc, (R, C // 8))
            o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
                _FP4_ASM,
                "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r",
                [words, sc],
                dtype=(tl.bfloat16,) * 8,
                is_pure=True,
                pack=2,
            )
            # nibble j = 4h + 2b + n of word w is column 8w + j: joins from the slowest axis
            v = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
            v = tl.reshape(v, (R, C))
            # a register move (ptxas drops it) that Triton 3.6's dot-operand pass cannot see
            # through: a dot reading the reshape of joins directly fails to compile there
            v = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=2)
        else:
            v = fp4_rows(base, ok, c0, D, C, BLOCK, E8M0, WORDS).to(tl.bfloat16)
        return v

    # `_fp4_rows_bf16_lut`'s PTX, one word per instance: $8 the word (nibble j: value j), $9
    # the scale word holding its block's scale byte, $10 the byte's selector (below); out
    # $0 … $7 the eight values as bf16 in column order. A nibble's magnitude index (its
    # low three bits) selects its bf16 value's high and low bytes from two 8-byte tables
    # (prmt: four lookups per instruction, the values 0, 0.5, 1, 1.5, 2, 3, 4, 6 exactly);
    # the sign bits (nibble j's bit 3, word bit 4j + 3) reach bit 7 of high byte j by one
    # prmt per four values over the word and the word << 4 (bit 7 of their bytes: word
    # bits 8i + 7 and 8i + 3); one prmt interleaves the low and high bytes of two values
    # into a bf16 pair, and one exact bf16x2 multiply applies the scale.
    # The scale pair s from the scale word: e8m0 byte e at bits 8-15 and 24-31 (prmt), >> 1
    # (bf16's exponent field e: 2^(e − 127)); e4m3 at bits 0-7 and 16-23, << 4 and its sign
    # dropped (the value · 2^-120, subnormals too), times 2^120 (exact). $11: 0x3210 in its
    # low half (prmt's identity selector) and a runtime value in its high half, which prmt
    # ignores: the tables' first halves pass through one prmt each, so that ptxas holds
    # them in registers instead of copying them out of uniform registers before every
    # lookup (offline sm_90, the paged index launch at B = 64: 26 such copies per loop).
    _FP4_LUT_HEAD = (
        "{\n.reg .b32 m, mh, ws, h0, h1, l0, l1, s0, s1, r, s, z, ta, tb, tc, td;\n"
        "mov.b32 z, 0;\nmov.b32 ta, 0x3F3F3F00;\nmov.b32 tb, 0x40404040;\n"
        "mov.b32 tc, 0xC0800000;\nmov.b32 td, 0xC0804000;\n"
        "prmt.b32 ta, ta, z, $11;\nprmt.b32 tc, tc, z, $11;\n"
        "prmt.b32 s, $9, z, $10;\n"
    )

    def fp4_lut_body(scales=("s", "s", "s", "s")) -> str:
        """`_FP4_LUT_*`'s body: value pair k (nibbles 2k, 2k + 1) multiplied by the bf16x2
        register scales[k] (the head's `s` for all four in `_FP4_LUT_*`)."""
        return (
            "and.b32 m, $8, 0x77777777;\nshr.b32 mh, m, 16;\n"
            "prmt.b32 h0, ta, tb, m;\nprmt.b32 h1, ta, tb, mh;\nprmt.b32 l0, tc, td, m;\nprmt.b32 l1, tc, td, mh;\n"
            "shl.b32 ws, $8, 4;\nprmt.b32 s0, ws, $8, 0x5140;\nprmt.b32 s1, ws, $8, 0x7362;\n"
            "and.b32 s0, s0, 0x80808080;\nand.b32 s1, s1, 0x80808080;\nor.b32 h0, h0, s0;\nor.b32 h1, h1, s1;\n"
            + "".join(
                f"prmt.b32 r, {lo}, {hi}, {sel};\nmul.rn.bf16x2 r, r, {sc};\nmov.b32 {{${2 * k}, ${2 * k + 1}}}, r;\n"
                for k, (lo, hi, sel, sc) in enumerate(
                    [
                        ("l0", "h0", "0x5140", scales[0]),
                        ("l0", "h0", "0x7362", scales[1]),
                        ("l1", "h1", "0x5140", scales[2]),
                        ("l1", "h1", "0x7362", scales[3]),
                    ]
                )
            )
            + "}"
        )

    _FP4_LUT_BODY = fp4_lut_body()
    _FP4_LUT_E8M0 = tl.constexpr(_FP4_LUT_HEAD + "shr.b32 s, s, 1;\n" + _FP4_LUT_BODY)
    _FP4_LUT_E4M3 = tl.constexpr(
        _FP4_LUT_HEAD
        + "shl.b32 s, s, 4;\nand.b32 s, s, 0x07F007F0;\nmov.b32 r, 0x7B807B80;\nmul.rn.bf16x2 s, s, r;\n"
        + _FP4_LUT_BODY
    )

    @triton.jit
    def _fp4_rows_bf16_lut(base, ok, c0, D, C: tl.constexpr, BLOCK: tl.constexpr, E8M0: tl.constexpr):
        """`fp4_rows_bf16` at WORDS = 4 (`fp4_words_mode`: D a multiple of 4 · BLOCK; C too,
        and c0): each row's scales as 32-bit words (four scales each, every one within the
        row), each code word's eight values built by `_FP4_LUT_*` straight into bf16 in
        column order (no pairs of words to regroup). The same values, so the same bits."""
        R: tl.constexpr = base.shape[0]
        NW: tl.constexpr = C // (4 * BLOCK)  # scale words in the tile
        tl.static_assert(NW * 4 * BLOCK == C)
        w = c0 // 8 + tl.arange(0, C // 8)
        m = ok[:, None] & (w * 8 < D)[None, :]
        words = tl.load(base.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=m, other=0)
        si = c0 // (4 * BLOCK) + tl.arange(0, NW)
        sw = tl.load(
            (base + D // 2).to(tl.pointer_type(tl.int32))[:, None] + si[None, :],
            mask=ok[:, None] & (si * (4 * BLOCK) < D)[None, :],
            other=0,
        )
        # [R, C/8] each code word's scale word, and the selector of its byte b in it
        sw = tl.reshape(tl.broadcast_to(sw[:, :, None], (R, NW, BLOCK // 2)), (R, C // 8))
        b = (w * 8 // BLOCK) % 4
        if E8M0:
            sel = 0x0404 | (b << 4) | (b << 12)
        else:
            sel = 0x4040 | b | (b << 8)
        sel = tl.broadcast_to(sel[None, :], (R, C // 8))
        # (the high half: a runtime value prmt ignores, see `_FP4_LUT_HEAD`)
        ident = tl.broadcast_to((0x3210 | (ok.to(tl.int32) << 16))[:, None], (R, C // 8))
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            _FP4_LUT_E8M0 if E8M0 else _FP4_LUT_E4M3,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r",
            [words, sw, sel, ident],
            dtype=(tl.bfloat16,) * 8,
            is_pure=True,
            pack=1,
        )
        v = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
        v = tl.reshape(v, (R, C))
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=2)

    @triton.jit
    def _fp4_rows_bf16_sw(
        base, ok, c0, D, C: tl.constexpr, BLOCK: tl.constexpr, E8M0: tl.constexpr, ONE_WORD: tl.constexpr
    ):
        """`fp4_rows_bf16` at WORDS = 3 (and 5: ONE_WORD) of a tile with four scale bytes (C =
        4 · BLOCK; c0 a multiple of C, so they start 4-byte aligned): the four scales as one
        32-bit load per row, broadcast over the row's words, each word's byte picked inside
        the PTX. The same values, so the same bits. (The scale tile of joins at WORDS = 2 has
        another layout than the words: the offline sm_90 compile sends the words through
        shared memory to meet it.)"""
        R: tl.constexpr = base.shape[0]
        w = c0 // 8 + tl.arange(0, C // 8)
        m = ok[:, None] & (w * 8 < D)[None, :]
        if ONE_WORD:
            # Triton's coalescing gives a thread as many contiguous words as its 16-byte
            # vector holds (four: [1, 4] over [8, 4] threads; the rows are only 4-byte
            # aligned, so four 4-byte loads), which spreads a warp over 8 rows (a third of
            # each 32-byte sector used) and, once the values are built, makes each
            # quarter-warp's 16-byte shared stores of the bf16 tile meet two ways in the same
            # banks. One word per thread instead ([1, 1] over [2, 16]: a warp reads two whole
            # rows; a quarter-warp stores 128 contiguous bytes of one row): the word index
            # through a register move (no contiguity known) and the load over the transposed
            # [C/8, R] tensor, so that the order, which ties then break towards the first
            # axis, puts the words fastest; the transpose back is a relabelling (the same
            # layout).
            wo = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [w], dtype=tl.int32, is_pure=True, pack=1)
            p = base.to(tl.pointer_type(tl.int32))[None, :] + wo[:, None]
            words = tl.trans(tl.load(p, mask=tl.trans(m), other=0))
        else:
            words = tl.load(base.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=m, other=0)
        sw = tl.load((base + D // 2 + c0 // BLOCK).to(tl.pointer_type(tl.int32)), mask=ok, other=0)
        sw = tl.broadcast_to(sw[:, None], (R, C // 8))
        sh = tl.broadcast_to(((w * 8 // BLOCK - c0 // BLOCK) * 8)[None, :], (R, C // 8))
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            _FP4_SW_E8M0 if E8M0 else _FP4_SW_E4M3,
            "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r",
            [words, sw, sh],
            dtype=(tl.bfloat16,) * 8,
            is_pure=True,
            pack=2,
        )
        v = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
        v = tl.reshape(v, (R, C))
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=2)
