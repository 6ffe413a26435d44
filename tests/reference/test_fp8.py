"""The released FP8 linear (`reference/fp8.py`) against hand checks and plain float64 /
numpy-float32 formulas written independently of it."""

import math

import numpy as np
import pytest
import torch

from attnv41.reference.fp8 import act_quant, dequant_weight, e4m3_sat, e8m0_to_float, fp8_linear, quant_weight
from attnv41.reference.qdq import fp8_qdq

F32_INV448 = float(np.float32(1.0 / 448.0))


def _scale64(amax: float) -> float:
    """2^ceil(log2(p)) with p = fp32(max(amax, fp32(1e-4)) · fp32(1/448)), in float64."""
    p = float(np.float32(max(amax, float(np.float32(1e-4)))) * np.float32(F32_INV448))
    return 2.0 ** math.ceil(math.log2(p))


def test_spec_hand_check():
    """attention-v41.md §3: [3.0, 0.01, −1.0, 0.3, 0…] → s = 2^−7 → [3.0, 0.009765625, −1.0, 0.3125, 0…]."""
    v = torch.zeros(1, 32)
    v[0, :4] = torch.tensor([3.0, 0.01, -1.0, 0.3])
    q, s = act_quant(v.bfloat16())
    assert s.tolist() == [[2.0**-7]]
    assert (q * s)[0, :4].tolist() == [3.0, 0.009765625, -1.0, 0.3125]
    assert (q[0, 4:] == 0).all()


@pytest.mark.parametrize("log_mag", [-30, -14, -6, 0, 3, 9, 20], ids=lambda e: f"mag2^{e}")
def test_scale_rule_against_float64(log_mag):
    g = torch.Generator().manual_seed(1000 + log_mag)
    x = (torch.randn(7, 96, generator=g) * 2.0**log_mag).bfloat16()
    q, s = act_quant(x)
    amax = x.float().abs().unflatten(-1, (3, 32)).amax(-1)
    want = torch.tensor([[_scale64(a) for a in row] for row in amax.tolist()])
    assert torch.equal(s.double(), want.double()), "scale s"
    # q: x/s rounded to nearest-even e4m3 (exact division by a power of two), never past 448
    xs = (x.double().unflatten(-1, (3, 32)) / want[..., None]).flatten(-2)
    assert torch.equal(q.double(), e4m3_sat(xs.float()).double()), "e4m3 codes q"
    assert q.abs().max().item() <= 448.0
    assert torch.equal((q * s.repeat_interleave(32, -1)).bfloat16(), fp8_qdq(x)), "q·s equals fp8_qdq"


@pytest.mark.parametrize(
    "amax,scale",
    [(0.0, 2.0**-22), (1e-7, 2.0**-22), (9.99e-5, 2.0**-22), (1e-3, 2.0**-18)],
    ids=["zero", "below_floor", "just_below_floor", "above_floor"],
)
def test_amax_floor(amax, scale):
    """amax is floored at 1e−4: 1e−4·fp32(1/448) ≈ 2^−22.09 → s = 2^−22."""
    x = torch.zeros(1, 32)
    x[0, 5] = amax
    q, s = act_quant(x.bfloat16())
    assert s.item() == scale == _scale64(float(x.bfloat16().float().abs().max()))
    assert torch.isfinite(q).all()


def test_all_zero_row_and_negative_zero():
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    x[1] = -0.0
    q, s = act_quant(x)
    assert (s == 2.0**-22).all(), "scale of zero blocks"
    assert (q == 0).all()
    assert not torch.signbit(q[0]).any(), "+0 stays +0"
    assert torch.signbit(q[1]).all(), "−0 stays −0"
    w = torch.randn(32, 64).to(torch.float8_e4m3fn)
    sc = torch.full((1, 2), 127, dtype=torch.uint8)
    y = fp8_linear(x, w, sc)
    assert (y == 0).all() and not torch.isnan(y).any(), "zero rows give zero outputs"


@pytest.mark.parametrize(
    "v,want",
    [(448.0, 448.0), (464.0, 448.0), (500.0, 448.0), (-1e6, -448.0), (1.0625, 1.0), (1.1875, 1.25), (-0.0, -0.0)],
    ids=["max", "past_max_tie", "past_max", "neg_huge", "tie_down_even", "tie_up_even", "neg_zero"],
)
def test_e4m3_saturation_and_ties(v, want):
    got = e4m3_sat(torch.tensor([v])).item()
    assert got == want and math.copysign(1, got) == math.copysign(1, want)


def test_block_max_maps_to_448_exactly():
    """amax = 448·2^k: the scale is exactly 2^k and the max element is code 448, not NaN."""
    x = torch.full((1, 32), 0.5)
    x[0, 3] = -448.0 * 2.0**-3
    q, s = act_quant(x.bfloat16())
    assert s.item() == 2.0**-3
    assert q[0, 3].item() == -448.0


@pytest.mark.parametrize("K", [31, 48, 100], ids=lambda k: f"K{k}")
def test_k_not_multiple_of_32_is_rejected(K):
    with pytest.raises(ValueError, match=rf"K = {K} .*allowed: a multiple of the block size 32"):
        act_quant(torch.ones(2, K, dtype=torch.bfloat16))
    w = torch.ones(32, K).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=rf"in = {K}; allowed: a multiple of the block size 32"):
        fp8_linear(
            torch.ones(2, K, dtype=torch.bfloat16), w, torch.full((1, math.ceil(K / 32)), 127, dtype=torch.uint8)
        )


def test_bad_inputs_are_rejected():
    w = torch.ones(32, 64).to(torch.float8_e4m3fn)
    good = torch.full((1, 2), 127, dtype=torch.uint8)
    with pytest.raises(TypeError, match="allowed: torch.bfloat16"):
        act_quant(torch.ones(1, 64))
    with pytest.raises(ValueError, match=r"scale shape = \(2, 2\); allowed: \(1, 2\)"):
        fp8_linear(torch.ones(1, 64, dtype=torch.bfloat16), w, torch.full((2, 2), 127, dtype=torch.uint8))
    with pytest.raises(ValueError, match="0xFF"):
        fp8_linear(torch.ones(1, 64, dtype=torch.bfloat16), w, torch.full((1, 2), 255, dtype=torch.uint8))
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_linear(torch.ones(1, 64, dtype=torch.bfloat16), w.bfloat16(), good)
    with pytest.raises(ValueError, match="x last dim = 32; allowed: 64"):
        fp8_linear(torch.ones(1, 32, dtype=torch.bfloat16), w, good)


def test_e8m0_bytes():
    b = torch.tensor([0, 1, 126, 127, 128, 254], dtype=torch.uint8)
    assert e8m0_to_float(b).double().tolist() == [2.0**-127, 2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert torch.equal(e8m0_to_float(b.view(torch.float8_e8m0fnu)), e8m0_to_float(b))


def test_e8m0_unchecked_same_values():
    """`check=False` (scales checked at load; no host read, so CUDA graphs capture it): the
    same fp32 bits for every valid byte, and the same dequantized weight; the checked call
    still rejects 0xFF."""
    b = torch.arange(255, dtype=torch.uint8)
    assert torch.equal(e8m0_to_float(b, check=False).view(torch.int32), e8m0_to_float(b).view(torch.int32))
    with pytest.raises(ValueError, match=r"s: byte 0xFF \(NaN\) at block \[1\]; allowed: 0x00..0xFE"):
        e8m0_to_float(torch.tensor([3, 255], dtype=torch.uint8), "s")
    w, sc = _random_fp8(40, 64, 6)
    got = dequant_weight(w, sc, check=False)
    assert torch.equal(got.view(torch.int16), dequant_weight(w, sc).view(torch.int16))


def _random_fp8(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=g) * 3).to(torch.float8_e4m3fn)
    sc = torch.randint(118, 132, (math.ceil(N / 32), K // 32), generator=g, dtype=torch.uint8)
    return w, sc


def test_dequant_weight_against_float64():
    w, sc = _random_fp8(40, 64, 5)  # 40 rows: a half-filled last block row
    want = np.zeros((40, 64))
    wf, sb = w.double().numpy(), sc.numpy().astype(np.int64)
    for n in range(40):
        for k in range(64):
            want[n, k] = wf[n, k] * 2.0 ** (sb[n // 32, k // 32] - 127)
    assert torch.equal(dequant_weight(w, sc).double(), torch.from_numpy(want)), "dequantized W"


def _loop_oracle(x: torch.Tensor, w: torch.Tensor, sc: torch.Tensor) -> np.ndarray:
    """The documented order, written with scalars: per block an exact sum (Python floats
    of e4m3 products are exact, and the block sum of 32 stays below 2^53 units of 2^−18)
    rounded to fp32, then fp32 accumulation block by block; bf16 at the end."""
    m, K = x.shape
    N = w.shape[0]
    xf = x.float().numpy()
    wf = w.float().numpy()
    sb = sc.numpy().astype(np.int64)
    out = np.zeros((m, N), dtype=np.float32)
    for i in range(m):
        for n in range(N):
            acc = np.float32(0.0)
            for b in range(K // 32):
                blk = xf[i, b * 32 : (b + 1) * 32]
                amax = max(float(np.abs(blk).max()), float(np.float32(1e-4)))
                sx = _scale64(amax)
                qx = [float(np.float32(v / sx)) for v in blk]
                qx = e4m3_sat(torch.tensor(qx)).double().tolist()
                part = np.float32(sum(a * float(c) for a, c in zip(qx, wf[n, b * 32 : (b + 1) * 32].tolist())))
                sw = 2.0 ** (sb[n // 32, b] - 127)
                acc = np.float32(acc + np.float32(np.float32(part * np.float32(sx)) * np.float32(sw)))
            out[i, n] = acc
    return out


@pytest.mark.parametrize("shape", [(3, 40, 96), (2, 64, 32)], ids=["m3_N40_K96", "m2_N64_K32"])
def test_fp8_linear_against_loop_oracle(shape):
    m, N, K = shape
    g = torch.Generator().manual_seed(m * 1000 + N + K)
    x = (torch.randn(m, K, generator=g) * torch.logspace(-3, 2, K)).bfloat16()
    w, sc = _random_fp8(N, K, K)
    got = fp8_linear(x, w, sc)
    want = torch.from_numpy(_loop_oracle(x, w, sc)).bfloat16()
    assert not torch.isnan(got).any()
    assert torch.equal(got, want), "fp8_linear y against the documented order"


def test_fp8_linear_against_wide_gemm():
    """Against the spec's formulation: dequantize W, round-trip x through fp8 per 32
    columns, an exact (float64) GEMM, one bf16 rounding. The two differ only where fp32
    accumulation crosses a bf16 rounding boundary: at most one ulp, rarely."""
    g = torch.Generator().manual_seed(77)
    x = torch.randn(64, 256, generator=g).bfloat16()
    w, sc = _random_fp8(96, 256, 3)
    got = fp8_linear(x, w, sc)
    want = (fp8_qdq(x).double() @ dequant_weight(w, sc).double().t()).bfloat16()
    ulp = torch.exp2(torch.floor(torch.log2(want.double().abs().clamp_min(2.0**-126))) - 7)
    diff = (got.double() - want.double()).abs()
    assert not torch.isnan(got).any()
    assert (diff <= ulp).all(), f"y: max diff {(diff / ulp).max().item()} ulps"
    assert (diff > 0).sum().item() <= got.numel() // 100, "y: more than 1% of outputs off by an ulp"


def test_leading_dims_kept():
    x = torch.randn(2, 3, 64).bfloat16()
    w, sc = _random_fp8(32, 64, 9)
    y = fp8_linear(x, w, sc)
    assert y.shape == (2, 3, 32) and y.dtype == torch.bfloat16
    assert torch.equal(y, fp8_linear(x.reshape(6, 64), w, sc).reshape(2, 3, 32))


def _einsum_fp8_linear(x: torch.Tensor, w: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """The formula `fp8_linear` used before its K-block loop: every block product of
    every (row, output) pair at once, [m, N, K/32] in fp64, then the same fp32 steps."""
    K = w.shape[1]
    qx, sx = act_quant(x.reshape(-1, K))
    nb = K // 32
    part = torch.einsum("mbk,nbk->mnb", qx.double().view(-1, nb, 32), w.double().view(-1, nb, 32)).float()
    sw = e8m0_to_float(sc).repeat_interleave(32, 0)[: w.shape[0]]
    acc = torch.zeros(part.shape[:2], dtype=torch.float32)
    for b in range(nb):
        acc = acc + (part[:, :, b] * sx[:, b : b + 1]) * sw[None, :, b]
    return acc.to(torch.bfloat16).reshape(*x.shape[:-1], w.shape[0])


@pytest.mark.parametrize(
    "lead, N, K",
    [((5,), 40, 96), ((2, 3), 64, 256), ((1,), 33, 32), ((4, 1, 2), 96, 160)],
    ids=["m5_N40_K96", "lead2x3_N64_K256", "m1_N33_K32", "lead4x1x2_N96_K160"],
)
def test_block_loop_equals_the_einsum_formula(lead, N, K):
    """The K-block loop (memory m·N) is bit for bit the former [m, N, K/32] einsum."""
    g = torch.Generator().manual_seed(N * 7 + K)
    x = (torch.randn(*lead, K, generator=g) * torch.logspace(-4, 3, K)).bfloat16()
    w, sc = _random_fp8(N, K, N + K)
    got = fp8_linear(x, w, sc)
    want = _einsum_fp8_linear(x, w, sc)
    assert got.shape == (*lead, N) and not torch.isnan(got).any(), "y: shape or NaN"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "y: differs from the einsum formula"


# ---------------------------------------------------------------------------- quant_weight
def test_quant_weight_hand_block():
    """One 32×32 block: amax 3.0 → 3·fp32(1/448) ≈ 2^−7.2 → s = 2^−7 (byte 120); 3.0 → 384,
    −1.0 → −128, 0.3 → 38.4 → 40 (e4m3 steps of 4 in [32, 64)), zeros stay zeros."""
    w = torch.zeros(32, 32)
    w[0, 0], w[5, 7], w[1, 1], w[31, 31] = 3.0, -1.0, 0.3, -0.0
    q, sc = quant_weight(w)
    assert q.dtype == torch.float8_e4m3fn and sc.dtype == torch.float8_e8m0fnu and sc.shape == (1, 1)
    assert sc.view(torch.uint8).item() == 120, "scale byte"
    qf = q.float()
    assert (qf[0, 0].item(), qf[5, 7].item(), qf[1, 1].item()) == (384.0, -128.0, 40.0), "e4m3 codes"
    assert (qf != 0).sum().item() == 3, "every other code is zero"
    assert torch.signbit(qf[31, 31]).item(), "−0 stays −0"
    assert dequant_weight(q, sc)[1, 1].item() == 40 * 2.0**-7


@pytest.mark.parametrize(
    "amax, byte",
    [(0.0, 105), (1e-6, 105), (448.0 * 2.0**-3, 124), (448.0 * 2.0**-3 * 1.01, 125), (1e30, 127 + 91)],
    ids=["zero_block", "below_floor", "amax_448x2^-3", "just_above", "huge"],
)
def test_quant_weight_scale_rule(amax, byte):
    """s = 2^ceil(log2(max(amax, 1e−4) · fp32(1/448))): the floor gives 2^−22 (byte 105),
    amax = 448·2^−3 gives exactly 2^−3 and code 448 (saturation never needed, never NaN)."""
    w = torch.zeros(32, 64)
    w[7, 40] = -amax
    w[3, 3] = 1.0  # the first block: amax 1 → 2^−8 (byte 119)
    q, sc = quant_weight(w)
    assert sc.view(torch.uint8).tolist() == [[119, byte]], "scale bytes"
    assert byte == 127 + math.ceil(math.log2(float(np.float32(max(amax, 1e-4)) * np.float32(F32_INV448))))
    qf = q.float()
    assert not torch.isnan(qf).any() and qf.abs().max().item() <= 448.0, "codes"
    if amax == 448.0 * 2.0**-3:
        assert qf[7, 40].item() == -448.0


@pytest.mark.parametrize("N", [40, 1, 65], ids=["N40", "N1", "N65"])
def test_quant_weight_ragged_rows(N):
    """N not a multiple of 32: ceil(N/32) block rows, the last one's amax over its rows only."""
    g = torch.Generator().manual_seed(N)
    w = (torch.randn(N, 96, generator=g) * torch.logspace(-2, 2, N)[:, None]).bfloat16()
    q, sc = quant_weight(w)
    R = -(-N // 32)
    assert q.shape == (N, 96) and sc.shape == (R, 3), "shapes"
    wf = w.double()
    for r in range(R):
        for c in range(3):
            amax = wf[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32].abs().max().item()
            s = _scale64(amax)
            assert sc.view(torch.uint8)[r, c].item() == 127 + round(math.log2(s)), f"scale [{r}, {c}]"
            blk = wf[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32]
            want = e4m3_sat((blk / s).float())
            assert torch.equal(q[r * 32 : (r + 1) * 32, c * 32 : (c + 1) * 32].float(), want), f"codes [{r}, {c}]"


@pytest.mark.parametrize("shape", [(64, 128), (45, 96), (7, 32)], ids=["64x128", "45x96", "7x32"])
def test_quant_weight_round_trip(shape):
    """Weights that are e4m3 values times one power of two per block come back exactly;
    any weight comes back within e4m3's precision."""
    w8, sc0 = _random_fp8(*shape, seed=shape[0])
    w = dequant_weight(w8, sc0)  # bf16, e4m3 per block
    assert torch.equal(dequant_weight(*quant_weight(w)), w), "round trip of a representable weight"
    assert torch.equal(dequant_weight(*quant_weight(w.float())), w), "the same from fp32"
    g = torch.Generator().manual_seed(3)
    v = torch.randn(*shape, generator=g).bfloat16()
    back = dequant_weight(*quant_weight(v)).double()
    amax = v.double().abs().max().item()
    assert ((back - v.double()).abs() <= amax * 2.0**-4).all(), "round trip of a random weight"


@pytest.mark.parametrize(
    "w, exc, msg",
    [
        (torch.zeros(32), ValueError, r"shape \(32,\); allowed: a 2-D weight"),
        (torch.zeros(32, 48), ValueError, r"shape \[32, 48\]; allowed: .*multiple of 32"),
        (torch.zeros(0, 32), ValueError, r"shape \[0, 32\]; allowed: out >= 1"),
        (torch.zeros(32, 32, dtype=torch.float64), TypeError, "dtype = torch.float64; allowed"),
        (torch.full((32, 32), float("nan")), ValueError, r"non-finite value at \[0, 0\]"),
    ],
    ids=["1d", "K48", "N0", "fp64", "nan"],
)
def test_quant_weight_rejects_bad_input(w, exc, msg):
    with pytest.raises(exc, match=msg):
        quant_weight(w, name="wq_a")
