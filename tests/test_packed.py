"""V4.1's packed row formats (`attnv41.packed`): every row a round trip produces packs
and unpacks to the same bits (hypothesis over rows of wide dynamic range, and every code
times every scale of each format); the byte layout on hand-made rows; rows off the grid
are refused; the whole model's KV bytes per token."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.config import v41_flash
from attnv41.packed import FORMATS, kv_bytes_per_token, pack, row_bytes, unpack
from attnv41.reference.qdq import fp4_e4m3_qdq, fp4_e8m0_qdq, fp8_qdq

BF = torch.bfloat16
QDQ = {"fp8_e8m0": fp8_qdq, "fp4_e4m3": fp4_e4m3_qdq, "fp4_e8m0": fp4_e8m0_qdq}


def _bits(t):
    return t.view(torch.int16)


def _same_bits(a, b, where=""):
    assert torch.equal(_bits(a), _bits(b)), where


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(sorted(FORMATS)),
    seed=st.integers(0, 2**31 - 1),
    spread=st.integers(0, 60),
    center=st.integers(-100, 100),
    zeros=st.floats(0, 1),
)
def test_round_trip_rows_pack_and_unpack_to_the_same_bits(fmt, seed, spread, center, zeros):
    """Rows of 4 × 64 values: normal draws times 2^U(center − spread, center + spread)
    (clamped to bf16's range), some zeroed and some negative zeros, through the format's
    round trip; then pack → unpack gives those bits back."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 64, generator=g)
    e = torch.randint(-spread, spread + 1, (4, 64), generator=g) + center
    x = x * torch.exp2(e.clamp(-130, 120).float())
    x = torch.where(torch.rand(4, 64, generator=g) < zeros, torch.zeros_like(x), x)
    x[0, :8] = -0.0
    v = QDQ[fmt](x.to(BF))
    p = pack(v, fmt)
    assert p.dtype == torch.uint8 and p.shape == (4, row_bytes(fmt, 64))
    _same_bits(unpack(p, fmt, 64), v)


def _e4m3_values():
    """Every finite e4m3 value (254 bit patterns: all but the two NaNs)."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    v = b.view(torch.float8_e4m3fn).float()
    return v[torch.isfinite(v)]


def test_fp8_every_code_at_every_scale():
    """Blocks of 32: the largest code 448 first, then 31 of the 254 codes in turn, at
    scales 2^-22 … 2^110: the packed codes are the codes, the scale byte the exponent,
    and unpack gives the values."""
    codes = _e4m3_values()
    for k in range(-22, 111, 11):
        s = 2.0**k
        rows = []
        for j in range(0, codes.numel(), 31):
            c = codes[j : j + 31]
            c = torch.cat([torch.tensor([448.0]), c, torch.zeros(31 - c.numel())])
            rows.append(c)
        blocks = torch.stack(rows)
        v = (blocks * s).to(BF)
        _same_bits(fp8_qdq(v), v, f"on the grid at 2^{k}")
        p = pack(v.reshape(-1, 32), "fp8_e8m0")
        assert torch.equal(p[:, :32].view(torch.float8_e4m3fn).float(), blocks), f"codes at 2^{k}"
        assert (p[:, 32] == k + 127).all(), f"scale byte at 2^{k}"
        _same_bits(unpack(p, "fp8_e8m0", 32), v.reshape(-1, 32))


def test_fp4_every_code_at_every_scale():
    """fp4_e4m3: every positive finite e4m3 scale (2^-9 … 448) with the 16 nibbles (6 first
    so the scale is the block's own); fp4_e8m0: every exponent −126 … 125 likewise."""
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    nibbles = torch.arange(16)
    vals = torch.where(nibbles >= 8, -grid[nibbles % 8], grid[nibbles % 8])  # nibble 8: −0
    e4 = _e4m3_values()
    for fmt, scales in (("fp4_e4m3", e4[e4 > 0]), ("fp4_e8m0", torch.exp2(torch.arange(-126, 126).double()).float())):
        B = FORMATS[fmt].block
        order = (
            torch.cat([torch.tensor([6]), nibbles])[:B]
            if B == 16
            else torch.cat([torch.tensor([6]), nibbles, nibbles[:15]])
        )
        code_vals = vals[order]
        v = (code_vals[None, :] * scales[:, None]).to(BF)  # one block per scale
        _same_bits(QDQ[fmt](v), v, f"{fmt} on the grid")
        p = pack(v, fmt)
        lo, hi = p[:, : B // 2] & 15, p[:, : B // 2] >> 4
        got = torch.stack([lo, hi], -1).reshape(-1, B).long()
        assert torch.equal(got, order[None, :].expand_as(got)), f"{fmt} nibbles"
        if fmt == "fp4_e4m3":
            assert torch.equal(p[:, B // 2].view(torch.float8_e4m3fn).float(), scales)
        else:
            assert torch.equal(p[:, B // 2].long(), torch.arange(-126, 126) + 127)
        _same_bits(unpack(p, fmt, B), v)


def test_fp4_e4m3_subnormal_scale_block():
    """amax/6 = 1.5·2^-9 rounds (ties to even) to the scale 2·2^-9, so the block's largest
    code is 4, not 6: the scale from the packed values' maximum would be 2^-9 and could not
    represent them; pack finds the block's scale and the round trip is exact."""
    x = torch.zeros(16)
    x[0], x[1] = 9 * 2.0**-9, -1 * 2.0**-9
    v = fp4_e4m3_qdq(x.to(BF))
    assert float(v[0]) == 8 * 2.0**-9  # code 4 at scale 2·2^-9
    _same_bits(unpack(pack(v, "fp4_e4m3"), "fp4_e4m3", 16), v)


def test_byte_layout_by_hand():
    """The spec's example block [7, 1, −3.5] (block 16): scale 1.125, codes [6, 1, −3]."""
    x = torch.zeros(16)
    x[:3] = torch.tensor([7.0, 1.0, -3.5])
    v = fp4_e4m3_qdq(x.to(BF))
    p = pack(v, "fp4_e4m3")
    assert p.tolist()[:2] == [0x7 | (0x2 << 4), 0xD]  # values 0, 1: 6 (index 7), 1 (index 2); 2, 3: −3 (8 + 5), 0
    assert p[8].view(torch.float8_e4m3fn).item() == 1.125 and p.shape == (9,)
    f8 = pack(fp8_qdq(torch.tensor([3.0, 0.01, -1.0, 0.3] + [0.0] * 28).to(BF)), "fp8_e8m0")
    assert f8[32].item() == 127 - 7  # s = 2^-7
    assert f8[:4].view(torch.float8_e4m3fn).float().tolist() == [384.0, 1.25, -128.0, 40.0]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_rows_off_the_grid_are_refused(fmt):
    v = torch.linspace(-3.3, 2.9, 64).to(BF).reshape(2, 32)
    v[1] = QDQ[fmt](v[1:2])[0]
    v[0] = QDQ[fmt](v[0:1])[0]
    v[1, 5] = float(v[1, 5]) * 1.0078125 + 1e-3  # off the grid
    with pytest.raises(ValueError, match=f"row 1, block .*: values not on the {fmt} grid"):
        pack(v, fmt)
    with pytest.raises(ValueError, match="allowed: a positive multiple"):
        pack(v[:, :20], fmt)
    with pytest.raises(ValueError, match="allowed: uint8"):
        unpack(torch.zeros(3, dtype=torch.uint8), fmt, 32)


def test_kv_bytes_per_token_flash():
    cfg = v41_flash()
    p, b = kv_bytes_per_token(cfg, "packed"), kv_bytes_per_token(cfg, "bf16")
    # kv sources: three of ratio 2 (a row per 2 tokens) and one of ratio 1; a compressed
    # row 288 B and an index key 68 B packed, 1,024 and 256 B in bf16
    assert p["per_token"] == 3 * (288 + 68) / 2 + (288 + 68) == 890
    assert b["per_token"] == 3 * (1024 + 256) / 2 + 1280 == 3200
    assert p["window_per_sequence"] == 40 * 128 * 528
    with pytest.raises(ValueError, match="kv_format = 'fp8'; allowed"):
        kv_bytes_per_token(cfg, "fp8")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_unchecked_pack_gives_the_same_bytes(fmt):
    """`check=False` (the runtime's cache writes: no host sync) packs round-trip rows to the
    bytes the checked form gives, the subnormal-scale block of fp4_e4m3 included."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 64, generator=g) * torch.exp2(torch.randint(-30, 30, (6, 64), generator=g).float())
    x[5] = 0
    x[5, 0], x[5, 1] = 9 * 2.0**-9, -(2.0**-9)
    v = QDQ[fmt](x.to(BF))
    assert torch.equal(pack(v, fmt, check=False), pack(v, fmt))
