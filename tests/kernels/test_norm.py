"""Triton rms_norm vs its reference twin (attnv41.reference.norm.rms_norm).

Not bit for bit: the kernel reduces the sum of squares in another order than torch and
rounds 1/sqrt differently from torch.rsqrt, so the fp32 value before the bf16 rounding
may differ by a few fp32 ulps and, near a bf16 rounding boundary, the result by one bf16
ulp. Each value must lie within one bf16 ulp (counted on the bit patterns, which is
exact at binade edges where 2^-8·|ref| is not), and at most 1% of them may differ at all
(a systematic error, e.g. truncating instead of rounding, would move far more).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from attnv41.kernels import norm as K
from attnv41.reference import norm as R
from norm_cases import EPS_CASES, assert_hand_value, eps_case

CASES = [
    pytest.param(w, r, wdt, id=f"w{w}-r{r}-{str(wdt).removeprefix('torch.')}")
    for w in (1, 64, 301, 1280)
    for r in (1, 7, 13)
    for wdt in (torch.float32, torch.bfloat16)
]


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns as integers that count ulps across the whole line (±0 → 0)."""
    b = bits.to(torch.int32)
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def assert_within_one_ulp(name: str, got: torch.Tensor, ref: torch.Tensor, max_frac: float = 0.01) -> None:
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype == torch.bfloat16, f"{name}: {got.shape} {got.dtype}"
    assert not torch.isnan(ref.float()).any(), f"{name}: NaN in the reference"
    assert not torch.isnan(got.float()).any(), f"{name}: NaN in the kernel output"
    ulps = (_ordered(got.view(torch.int16)) - _ordered(ref.view(torch.int16))).abs()
    worst, n_diff = int(ulps.max()) if ulps.numel() else 0, int((ulps > 0).sum())
    err = (got.float() - ref.float()).abs().max().item() if ulps.numel() else 0.0
    msg = f"{name}: worst {worst} bf16 ulps, {n_diff} of {ulps.numel()} values differ, max |err| {err:.3g}"
    assert worst <= 1, msg
    assert n_diff <= max(1, max_frac * ulps.numel()), msg


@pytest.mark.parametrize("width,rows,wdtype", CASES)
def test_random_vs_reference(width, rows, wdtype, device):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{width}-{rows}-{wdtype}".encode()))
    weight = (1 + 0.3 * torch.randn(width, generator=gen)).to(wdtype)
    for scale in (2.0**-20, 1.0, 2.0**10):
        for eps in (1e-6, 1e-20):
            x = (torch.randn(rows, width, generator=gen) * scale).to(torch.bfloat16)
            out = torch.full_like(x, float("nan"), device=device)  # poisoned: every value must be written
            got = K.rms_norm(x.to(device), weight.to(device), eps, out=out)
            assert got is out
            assert_within_one_ulp(f"rms_norm scale {scale:g} eps {eps:g}", got, R.rms_norm(x, weight, eps))


def test_wide_rows_loop_over_chunks(device):
    """Rows wider than one chunk (_MAX_BLOCK) take the two-pass loop."""
    width = K._MAX_BLOCK + 904
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, width, generator=gen).to(torch.bfloat16)
    weight = torch.randn(width, generator=gen)
    got = K.rms_norm(x.to(device), weight.to(device), 1e-6)
    assert_within_one_ulp("rms_norm wide", got, R.rms_norm(x, weight, 1e-6))


def test_hostile_rows(device):
    width = 48
    x = torch.zeros(6, width)
    x[1, 17] = -3.0  # a single nonzero
    x[2, :] = -0.0  # negative zeros
    x[3, ::2] = 2.0**-60  # tiny: mean(v²) far below eps
    x[4, :] = torch.linspace(-(2.0**40), 2.0**40, width)  # large
    x[5, :] = 1.0  # every value the same: y = w/sqrt(1 + eps)
    x = x.to(torch.bfloat16)
    weight = torch.linspace(-2, 2, width)
    for eps in (1e-6, 1e-20):
        got = K.rms_norm(x.to(device), weight.to(device), eps)
        assert_within_one_ulp(f"rms_norm hostile eps {eps:g}", got, R.rms_norm(x, weight, eps), max_frac=0.05)


def test_in_place_and_strided_rows(device):
    gen = torch.Generator().manual_seed(5)
    base = torch.randn(7, 96, generator=gen).to(torch.bfloat16)
    weight = torch.randn(64, generator=gen).to(torch.bfloat16)
    want = R.rms_norm(base[:, 32:], weight, 1e-6)
    x = base.to(device)
    view = x[:, 32:]  # row stride 96, width 64
    assert K.rms_norm(view, weight.to(device), 1e-6, out=view) is view
    assert_within_one_ulp("rms_norm in place", view, want)
    assert torch.equal(x[:, :32].cpu(), base[:, :32]), "values outside the view untouched"


@pytest.mark.parametrize("width,rows", [(1280, 1), (96, 5), (K._MAX_BLOCK + 928, 2)], ids=["w1280", "w96", "chunked"])
def test_round_trip_output_is_fp8_qdq_of_the_result(width, rows, device):
    """`qdq_out` gets `fp8_qdq(out)` bit for bit (the kernel's own bf16 result, quantized per
    32 values), the result itself unchanged by asking for it; the twin likewise."""
    from attnv41.kernels import qdq

    gen = torch.Generator().manual_seed(zlib.crc32(f"qdq{width}".encode()))
    x = (torch.randn(rows, width, generator=gen) * 3).to(torch.bfloat16).to(device)
    weight = torch.randn(width, generator=gen).to(device)
    plain = K.rms_norm(x, weight, 1e-6)
    q = torch.full_like(x, float("nan"))
    out = K.rms_norm(x, weight, 1e-6, qdq_out=q)
    assert torch.equal(out.view(torch.int16), plain.view(torch.int16))
    want = qdq.fp8_qdq_torch(out.cpu())
    assert torch.equal(q.cpu().view(torch.int16), want.view(torch.int16))
    q2 = torch.full_like(x, float("nan")).cpu()
    out2 = K.rms_norm_torch(x.cpu(), weight.cpu(), 1e-6, qdq_out=q2)
    assert torch.equal(q2.view(torch.int16), qdq.fp8_qdq_torch(out2).view(torch.int16))


@pytest.mark.parametrize(
    "width,rows", [(1280, 3), (128, 1), (K._MAX_BLOCK + 1024, 2)], ids=["w1280", "w128", "chunked"]
)
def test_renamed_round_trip_is_the_gluon_products_input(width, rows, device):
    """`qdq_rename`: `qdq_out` holds the same values as without it, each at `tc_fp8`'s renamed
    column (`rename_cols`; the map checked here against a hand-built permutation), and equals
    `qdq.fp8_qdq(out, rename=True)` bit for bit; the result itself is unchanged. The twin
    likewise (exact against the reference)."""
    from attnv41.kernels import qdq
    from attnv41.kernels.tc_fp8 import rename_cols

    gen = torch.Generator().manual_seed(zlib.crc32(f"qdq-rename{width}".encode()))
    x = (torch.randn(rows, width, generator=gen) * 3).to(torch.bfloat16).to(device)
    weight = torch.randn(width, generator=gen).to(device)
    q_plain, q_ren = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    out = K.rms_norm(x, weight, 1e-6, qdq_out=q_plain)
    out_r = K.rms_norm(x, weight, 1e-6, qdq_out=q_ren, qdq_rename=True)
    assert torch.equal(out.view(torch.int16), out_r.view(torch.int16))
    # physical column 32q + 4s + 2h + p of each 128 lands at logical column 16s + 8h + 2q + p
    dest = torch.empty(width, dtype=torch.long)
    for c in range(width):
        base, j = c - c % 128, c % 128
        qq, s_, h, p = j // 32, (j % 32) // 4, (j % 4) // 2, j % 2
        dest[c] = base + 16 * s_ + 8 * h + 2 * qq + p
    assert sorted(dest.tolist()) == list(range(width))
    want = torch.empty_like(q_plain.cpu())
    want[:, dest] = q_plain.cpu()
    assert torch.equal(q_ren.cpu().view(torch.int16), want.view(torch.int16))
    assert torch.equal(want, rename_cols(q_plain.cpu()))
    assert torch.equal(q_ren.cpu().view(torch.int16), qdq.fp8_qdq_torch(out.cpu(), rename=True).view(torch.int16))
    q2 = torch.full_like(x, float("nan")).cpu()
    out2 = K.rms_norm_torch(x.cpu(), weight.cpu(), 1e-6, qdq_out=q2, qdq_rename=True)
    assert torch.equal(q2.view(torch.int16), rename_cols(qdq.fp8_qdq_torch(out2)).view(torch.int16))


def test_rename_needs_a_round_trip_of_whole_chunks(device):
    """`qdq_rename` without `qdq_out`, with a width not a multiple of 128, or not a bool:
    ValueError naming it, nothing written."""
    x = torch.ones(2, 96, dtype=torch.bfloat16, device=device)
    w = torch.ones(96, device=device)
    out = torch.full_like(x, 5.0)
    q = torch.full_like(x, 5.0)
    for fn in (K.rms_norm, K.rms_norm_torch):
        with pytest.raises(ValueError, match="qdq_rename = True with qdq_out None"):
            fn(x, w, 1e-6, out=out, qdq_rename=True)
        with pytest.raises(ValueError, match=r"x.shape\[-1\] = 96; allowed with qdq_rename: a multiple of 128"):
            fn(x, w, 1e-6, out=out, qdq_out=q, qdq_rename=True)
        with pytest.raises(ValueError, match="qdq_rename = 1; allowed: True or False"):
            fn(x, w, 1e-6, out=out, qdq_out=q, qdq_rename=1)
        assert (out == 5.0).all() and (q == 5.0).all(), "written before the error"


@pytest.mark.parametrize(
    "kw,match",
    [
        pytest.param(dict(qdq_out=torch.zeros(2, 32, dtype=torch.bfloat16)), r"qdq_out: ", id="shape"),
        pytest.param(dict(qdq_out=torch.zeros(2, 64)), r"qdq_out: ", id="dtype"),
        pytest.param("x", r"shares storage with x", id="aliases-x"),
    ],
)
def test_round_trip_output_validation(kw, match, device):
    x = X.clone().to(device)
    out = torch.full_like(x, 5.0)
    kw = dict(qdq_out=x) if kw == "x" else {k: v.to(device) for k, v in kw.items()}
    for fn in (K.rms_norm, K.rms_norm_torch):
        with pytest.raises(ValueError, match=match):
            fn(x, W.to(device), 1e-6, out=out, **kw)
        assert (out == 5.0).all(), "out written before the error"
    with pytest.raises(ValueError, match="a multiple of 32"):
        K.rms_norm(x[:, :40], W[:40].to(device), 1e-6, qdq_out=torch.empty(2, 40, dtype=torch.bfloat16, device=device))


def test_torch_fallback(device):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4, 40, generator=gen).to(torch.bfloat16)
    weight = torch.randn(40, generator=gen)
    out = torch.empty_like(x)
    assert K.rms_norm_torch(x, weight, 1e-6, out=out) is out
    assert torch.equal(out, R.rms_norm(x, weight, 1e-6))
    assert torch.equal(K.rms_norm_torch(x, weight, 1e-6), R.rms_norm(x, weight, 1e-6))


def test_empty_rows(device):
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    assert K.rms_norm(x, torch.ones(64, device=device), 1e-6).shape == (0, 64)


X = torch.zeros(2, 64, dtype=torch.bfloat16)
W = torch.ones(64)


@pytest.mark.parametrize(
    "args,match",
    [
        pytest.param(dict(x=X.float(), weight=W, eps=1e-6), r"x\.dtype", id="x-dtype"),
        pytest.param(dict(x=X[None], weight=W, eps=1e-6), r"x\.dim\(\) = 3", id="x-3d"),
        pytest.param(dict(x=X.t(), weight=torch.ones(2), eps=1e-6), r"x\.stride\(-1\) = 64", id="x-stride"),
        pytest.param(dict(x=X, weight=torch.ones(32), eps=1e-6), r"weight\.shape = \(32,\)", id="weight-shape"),
        pytest.param(dict(x=X, weight=W.half(), eps=1e-6), r"weight\.dtype", id="weight-dtype"),
        pytest.param(dict(x=X, weight=W, eps=-1.0), r"eps = -1\.0", id="eps-negative"),
        pytest.param(dict(x=X, weight=W, eps=float("nan")), r"eps = nan", id="eps-nan"),
        pytest.param(
            dict(x=X, weight=W, eps=1e-6, out=torch.zeros(2, 32, dtype=torch.bfloat16)), r"out\.shape", id="out-shape"
        ),
        pytest.param(dict(x=X, weight=W, eps=1e-6, out=torch.zeros(2, 64)), r"out\.dtype", id="out-dtype"),
    ],
)
def test_validation(args, match, device):
    moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    with pytest.raises(ValueError, match=match):
        K.rms_norm(**moved)
    with pytest.raises(ValueError, match=match):
        K.rms_norm_torch(**args)


# ---------------------------------------------------------------------------- eps placement (issue 10)
@pytest.mark.parametrize(
    "width", [64, 301, K._MAX_BLOCK + 904], ids=["w64", "w301", "chunked"]
)  # the last takes the kernel's two-pass loop over chunks
@pytest.mark.parametrize("kind, eps, exact", EPS_CASES)
def test_eps_inside_the_square_root(kind, eps, exact, width, device):
    """Hand values where eps matters (golden files use eps = 1e-20, which hides it), for
    the Triton kernel (both of its code paths) and the torch twin."""
    x, w, y = eps_case(kind, eps, exact, rows=2, width=width, seed=zlib.crc32(f"{kind}-{eps}-{width}".encode()))
    for wdt in (torch.float32, torch.bfloat16):
        name = f"{kind} eps {eps:g} w {str(wdt).removeprefix('torch.')}"
        out = torch.full_like(x, float("nan"), device=device)  # poisoned: every value must be written
        assert_hand_value(f"rms_norm (Triton) {name}", K.rms_norm(x.to(device), w.to(wdt).to(device), eps, out=out), y)
        twin = K.rms_norm_torch(x, w.to(wdt), eps)
        assert_hand_value(f"rms_norm_torch {name}", twin, y)
        assert torch.equal(twin, R.rms_norm(x, w.to(wdt), eps)), (
            f"rms_norm_torch {name}: not bit-exact with the reference"
        )
