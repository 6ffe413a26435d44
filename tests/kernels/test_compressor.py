"""`kernels.compressor.compress_pool` against its twin `reference.compressor.compress_pool`.

Tolerance, per group j and channel c: `|diff| ≤ 2^-17 · max_i |a[j, i, c]|`. The output
is a convex combination of the r values, so an error δ relative in each softmax weight
moves it by at most δ·max|a|. On CUDA `tl.exp` is `ex2.approx` of `x·log2 e`: about
2 ulps plus `|x|·2^-24` from rounding the argument, which for any weight that is not
negligible (|x| ≲ 20, e^-20 ≈ 2e-9) is ≤ 2^-19; division, the softmax sum and the
r-term sum (any order) add a few 2^-24. 2^-17 (≈ 7.6e-6) is twice that bound; a wrong
softmax axis, a missed token or padding leaking in is off by far more.
"""

import math
import re

import pytest
import torch

from attnv41.kernels.compressor import compress_pool, compress_pool_torch
from attnv41.reference.compressor import compress_pool as ref_compress_pool

REL = 2.0**-17


def _inputs(seed: int, n: int, r: int, D: int, device, gate_scale: float = 3.0):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, r, D, generator=gen).to(device)
    g = (torch.randn(n, r, D, generator=gen) * gate_scale).to(device)
    return a, g


def _assert_pool_close(name: str, got: torch.Tensor, ref: torch.Tensor, a: torch.Tensor) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN in the kernel's output"
    assert not torch.isnan(ref).any(), f"{name}: NaN in the reference (bad test input)"
    err = (got.cpu().double() - ref.cpu().double()).abs()
    tol = REL * a.cpu().double().abs().amax(dim=1) + 1e-30
    worst = (err / tol).max().item()
    assert worst <= 1.0, f"{name}: error {worst:.3g}× the tolerance (max abs {err.max().item():.3g})"


# (n, r, D)
SHAPES = [
    pytest.param(1, 2, 32, id="n1-r2-d32"),
    pytest.param(7, 2, 64, id="n7-r2-d64"),
    pytest.param(13, 4, 32, id="n13-r4-d32"),
    pytest.param(7, 4, 40, id="n7-r4-d40"),
    pytest.param(7, 3, 64, id="n7-r3-d64-padded"),
    pytest.param(1, 128, 64, id="n1-r128-d64"),
    pytest.param(3, 100, 32, id="n3-r100-d32-padded"),
    pytest.param(2, 4, 1000, id="n2-r4-d1000-multiblock"),
]


@pytest.mark.parametrize("n,r,D", SHAPES)
def test_matches_reference(device, n, r, D):
    a, g = _inputs(n * 1000 + r * 10 + D, n, r, D, device)
    _assert_pool_close("compress_pool", compress_pool(a, g), ref_compress_pool(a, g), a)


def _hostile(kind: str, device):
    a, g = _inputs(9, 7, 4, 32, device)
    if kind == "wide-gates":  # exp underflows for all but the largest score
        g = g * 30
    elif kind == "equal-gates":  # a plain mean
        g = torch.full_like(g, 2.5)
    elif kind == "huge-gates":  # max subtraction must keep exp finite
        g = g + 1e30
        g[:, 0] = 1e30 + 1e24
    elif kind == "some-neg-inf":  # a −∞ score weighs its value 0 (never all −∞ in a channel)
        g[:, 1:3] = float("-inf")
        a[:, 1:3] = 1e30
    return a, g


@pytest.mark.parametrize("kind", ["wide-gates", "equal-gates", "huge-gates", "some-neg-inf"])
def test_hostile_gates(device, kind):
    a, g = _hostile(kind, device)
    ref = ref_compress_pool(a, g)
    got = compress_pool(a, g)
    if kind == "some-neg-inf":  # the 1e30 values must not leak in; compare against the live values
        _assert_pool_close(kind, got, ref, a[:, [0, 3]])
    else:
        _assert_pool_close(kind, got, ref, a)


def test_out_and_strided_inputs(device):
    """out given (poisoned with NaN); a and g views (r tokens picked from a larger buffer)."""
    big_a, big_g = _inputs(11, 7, 6, 48, device)
    a, g = big_a[:, 1:5, 8:40], big_g[:, 1:5, 8:40]
    out = torch.full((7, 32), float("nan"), device=device)
    assert compress_pool(a, g, out=out) is out
    _assert_pool_close("compress_pool out=", out, ref_compress_pool(a, g), a)


def test_torch_fallback_matches_reference():
    a, g = _inputs(4, 7, 4, 32, "cpu")
    ref = ref_compress_pool(a, g)
    assert torch.equal(compress_pool_torch(a, g), ref)
    out = torch.full_like(ref, math.nan)
    assert compress_pool_torch(a, g, out=out) is out
    assert torch.equal(out, ref)


def _bad_cases():
    a = torch.zeros(3, 4, 32)
    return [
        pytest.param((a.double(), a, None), "a.dtype", id="a-dtype"),
        pytest.param((a, a.bfloat16(), None), "g.dtype", id="g-dtype"),
        pytest.param((a[0], a[0], None), "a.dim()", id="a-dim"),
        pytest.param((a, a[:, :2], None), "g.shape", id="g-shape"),
        pytest.param((a[:, :1], a[:, :1], None), "compress ratio", id="r1"),
        pytest.param((torch.zeros(3, 129, 4), torch.zeros(3, 129, 4), None), "compress ratio", id="r129"),
        pytest.param((a, a, torch.zeros(3, 16)), "out", id="out-shape"),
        pytest.param((a[..., ::2], a[..., ::2], None), "a.stride(2)", id="a-stride"),
    ]


@pytest.mark.parametrize("fn", [compress_pool, compress_pool_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("args,name", _bad_cases())
def test_validation(fn, args, name):
    a, g, out = args
    with pytest.raises(ValueError, match=re.escape(name)):
        fn(a, g, out=out)
