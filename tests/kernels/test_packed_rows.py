"""The packed-row loaders (`kernels/packed_rows.py`) alone: every code of each format
under many scales, read in column slices, equal bit for bit to `attnv41.packed.unpack`;
fp4 rows both as 32-bit words (4-byte aligned rows) and byte by byte (rows at an odd
address); masked rows read as +0. On the GPU the window codes go through the hardware
e4m3 conversion, on the CPU through the interpreter's emulation. `fp4_rows_bf16` the same
way: on the GPU its PTX form (words), on the CPU its fp32 form."""

import pytest
import torch

from attnv41.kernels._triton import HAVE_TRITON, interpreting, tl, triton
from attnv41.kernels.packed_rows import fp4_words_mode, fp4_words_ok
from attnv41.packed import FORMATS, row_bytes, unpack

if HAVE_TRITON:
    from attnv41.kernels.packed_rows import fp4_rows, fp4_rows_bf16, fp8_e8m0_rows

    @triton.jit
    def _read_kernel(
        p_ptr,
        out_ptr,
        n,
        stride,
        D: tl.constexpr,
        C: tl.constexpr,
        R: tl.constexpr,
        FMT: tl.constexpr,
        WORDS: tl.constexpr,
        BF16: tl.constexpr,
    ):
        """out[r, :] = row r's values, read in slices of C columns; row r is masked off (must
        read as +0) where r % 7 == 3. BF16: fp4 rows by `fp4_rows_bf16` (WORDS = 2: its PTX form)."""
        r = tl.program_id(0) * R + tl.arange(0, R)
        ok = (r < n) & (r % 7 != 3)  # row 3 of every 7 masked: must read as +0
        base = p_ptr + r.to(tl.int64) * stride
        for c0 in range(0, D, C):
            if FMT == 0:
                v = fp8_e8m0_rows(base, ok, c0, D, C)
            elif BF16:
                v = fp4_rows_bf16(base, ok, c0, D, C, 16 if FMT == 1 else 32, FMT == 2, WORDS)
            elif FMT == 1:
                v = fp4_rows(base, ok, c0, D, C, 16, False, WORDS)
            else:
                v = fp4_rows(base, ok, c0, D, C, 32, True, WORDS)
            cols = c0 + tl.arange(0, C)
            tl.store(
                out_ptr + r[:, None] * D + cols[None, :], v.to(tl.bfloat16), mask=(r < n)[:, None] & (cols < D)[None, :]
            )


def _rows(fmt: str, D: int, n: int, seed: int) -> torch.Tensor:
    """n packed rows of random codes covering every code, with scales spread over the
    range whose values stay normal in bf16 (e8m0 27..200; e4m3 every positive finite
    scale, subnormal ones included)."""
    f = FORMATS[fmt]
    g = torch.Generator().manual_seed(seed)
    nc = D // 2 if f.fp4 else D
    codes = torch.randint(0, 256, (n, nc), generator=g, dtype=torch.int32)
    if not f.fp4:  # e4m3: no NaN pattern (0x7F, 0xFF)
        codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
        codes.view(-1)[:254] = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F])
    else:
        codes.view(-1)[:256] = torch.arange(256)  # every pair of nibbles
    ns = D // f.block
    if f.e8m0:
        scales = torch.randint(27, 201, (n, ns), generator=g, dtype=torch.int32)
    else:
        scales = torch.randint(1, 127, (n, ns), generator=g, dtype=torch.int32)  # every positive finite e4m3
        scales.view(-1)[:126] = torch.arange(1, 127)
    p = torch.cat([codes, scales], dim=1).to(torch.uint8)
    assert p.shape == (n, row_bytes(fmt, D))
    return p


def _odd(x: torch.Tensor) -> torch.Tensor:
    buf = torch.empty(x.numel() + 1, dtype=torch.uint8, device=x.device)[1:].view(x.shape)
    buf.copy_(x)
    return buf


_FP4_CASES = [
    ("fp4_e4m3", 64, True),  # 36-byte rows
    ("fp4_e4m3", 64, False),
    ("fp4_e4m3", 512, True),  # 288-byte rows: V4.1-Flash's compressed rows
    ("fp4_e8m0", 128, True),  # 68-byte rows: V4.1-Flash's index keys
    ("fp4_e8m0", 64, False),  # 34-byte rows: never 4-byte aligned
]
_CASES = [(*c, False) for c in [("fp8_e8m0", 64, None), ("fp8_e8m0", 512, None), *_FP4_CASES]]
_CASES += [(*c, True) for c in _FP4_CASES]  # fp4_rows_bf16 (on the GPU: its PTX form for words)


@pytest.mark.parametrize("fmt,D,words,bf16", _CASES)
def test_loaders_equal_unpack_on_every_code(device, fmt, D, words, bf16):
    n = 80
    p = _rows(fmt, D, n, seed=D + len(fmt)).to(device)
    if words is False:
        p = _odd(p)
    aligned = fp4_words_ok(p)
    if words is not None:
        assert aligned == words
    out = torch.full((n, D), float("nan"), dtype=torch.bfloat16, device=device)
    C = min(D, 128)
    _read_kernel[(triton.cdiv(n, 16),)](
        p, out, n, p.stride(0), D, C=C, R=16, FMT=["fp8_e8m0", "fp4_e4m3", "fp4_e8m0"].index(fmt),
        WORDS=fp4_words_mode(p) if fmt.startswith("fp4") else 0, BF16=bf16,
    )  # fmt: skip
    want = unpack(p.cpu(), fmt, D)
    masked = torch.arange(n) % 7 == 3
    want[masked] = 0.0
    got = out.cpu()
    assert not torch.isnan(got.float()).any()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _assert_bf16_read_equals_unpack(p, fmt, D, C, words, device):
    """`fp4_rows_bf16` over rows p (n, on device) in slices of C columns at WORDS = words:
    no NaN, and bit for bit `unpack` (the kernel's masked rows, r % 7 == 3, as +0)."""
    n = p.shape[0]
    out = torch.full((n, D), float("nan"), dtype=torch.bfloat16, device=device)
    _read_kernel[(triton.cdiv(n, 16),)](
        p, out, n, p.stride(0), D, C=C, R=16, FMT=["fp8_e8m0", "fp4_e4m3", "fp4_e8m0"].index(fmt),
        WORDS=words, BF16=True,
    )  # fmt: skip
    want = unpack(p.cpu(), fmt, D)
    want[torch.arange(n) % 7 == 3] = 0.0
    got = out.cpu()
    assert not torch.isnan(got.float()).any()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize(
    "fmt,D,C",
    [("fp4_e4m3", 512, 64), ("fp4_e4m3", 64, 64), ("fp4_e8m0", 128, 128)],
    ids=["e4m3-512-64", "e4m3-64-64", "e8m0-128"],
)
@pytest.mark.parametrize("one_word", [False, True], ids=["", "one-word"])
def test_scale_word_form_equals_unpack_on_every_code(device, fmt, D, C, one_word):
    """`fp4_rows_bf16` at WORDS = 3 (`fp4_words_mode(..., scale_word=True)`; tiles of four
    scales read as one word per row: on the GPU its PTX picks each code word's scale byte,
    e4m3 scales through their 2^-120 bit placement) and at 5 (one_word: the code words laid
    out one per thread): every code under every scale the loaders' test covers, slice by
    slice; under the interpreter WORDS is 1 (the fp32 form)."""
    n = 80
    p = _rows(fmt, D, n, seed=D + C).to(device)
    words = fp4_words_mode(p, scale_word=True, one_word=one_word)
    assert words == (1 if interpreting() else 5 if one_word else 3)
    _assert_bf16_read_equals_unpack(p, fmt, D, C, words, device)


@pytest.mark.parametrize(
    "fmt,D,C",
    [
        ("fp4_e4m3", 512, 64),
        ("fp4_e4m3", 512, 128),
        ("fp4_e4m3", 64, 64),
        ("fp4_e8m0", 128, 128),
        ("fp4_e8m0", 256, 256),
    ],
    ids=["e4m3-512-64", "e4m3-512-128", "e4m3-64-64", "e8m0-128", "e8m0-256"],
)
def test_lut_form_equals_unpack_on_every_code_and_scale(device, fmt, D, C):
    """`fp4_rows_bf16` at WORDS = 4 (`fp4_words_mode(..., lut=True)`: each code word's eight
    values by table lookups into bf16, its scale byte picked from a scale word; tiles of one
    and of two scale words): every nibble pair under every e8m0 scale 1..254 (values that
    overflow to inf and that are bf16 subnormals included) and every positive finite e4m3
    scale, bit for bit as `unpack`; under the interpreter WORDS is 1 (the fp32 form, over
    the scales `_rows` draws: the interpreter's bf16 cast flushes subnormals)."""
    n = 254
    p = _rows(fmt, D, n, seed=D + C + 1)
    if fmt == "fp4_e8m0" and not interpreting():
        ns = D // 32
        p[:, D // 2 :] = ((torch.arange(n * ns) % 254) + 1).reshape(n, ns).to(torch.uint8)
    p = p.to(device)
    words = fp4_words_mode(p, lut=True, d=D, block=FORMATS[fmt].block)
    assert words == (1 if interpreting() else 4)
    _assert_bf16_read_equals_unpack(p, fmt, D, C, words, device)


def test_lut_mode_needs_whole_scale_words(monkeypatch):
    """WORDS = 4 only where the rows' values make whole words of four scales (d a multiple
    of 4 · block), else the scale-word or pair form; never under the interpreter."""
    import attnv41.kernels.packed_rows as pr

    rows = torch.zeros(8, 68, dtype=torch.uint8)
    monkeypatch.setattr(pr, "interpreting", lambda: False)
    assert pr.fp4_words_mode(rows, lut=True, d=128, block=32) == 4
    assert pr.fp4_words_mode(rows, lut=True, d=96, block=32) == 2
    assert pr.fp4_words_mode(rows, scale_word=True, one_word=True) == 5
    assert pr.fp4_words_mode(rows, one_word=True) == 2  # (one_word goes with scale_word)
    assert pr.fp4_words_mode(rows, scale_word=True, lut=True, d=96, block=32) == 3
    assert pr.fp4_words_mode(rows, lut=True, d=128, block=32, asm=False) == 1
    assert pr.fp4_words_mode(rows[:, 1:], lut=True, d=128, block=32) == 0  # rows not 4-byte aligned
    monkeypatch.setattr(pr, "interpreting", lambda: True)
    assert pr.fp4_words_mode(rows, lut=True, d=128, block=32) == 1
