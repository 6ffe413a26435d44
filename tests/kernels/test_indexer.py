"""`kernels.indexer.index_scores` against its twin `reference.indexer.index_scores`.

Both round the same way (dot → bf16, ReLU, × weight → bf16, fp32 head sum → bf16), but
the fp32 sums may run in another order, so a dot or a head sum can round to the other
bf16 neighbour. Allowed: `|diff| ≤ 2^-7·max|ref| + 1e-6` over finite entries; the −∞
pattern must be identical; no NaN. With small-integer inputs every fp32 sum is exact
in any order, so there the kernel must equal the reference bit for bit.
"""

import re

import pytest
import torch

from attnv41.kernels.indexer import index_scores, index_scores_torch
from attnv41.reference.indexer import index_scores as ref_index_scores


def _inputs(seed: int, m: int, H: int, d: int, L: int, device, vis_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    iq = torch.randn(m, H, d, generator=gen).bfloat16().to(device)
    weights = (torch.randn(m, H, generator=gen) * d**-0.5).bfloat16().to(device)
    keys = torch.randn(L, d, generator=gen).bfloat16().to(device)
    visible = torch.randint(0, L + 1, (m,), generator=gen)
    visible[0] = L  # one row sees everything, one (if m > 1) sees nothing
    if m > 1:
        visible[1] = 0
    return iq, weights, keys, visible.to(vis_dtype).to(device)


def _assert_scores_close(name: str, got: torch.Tensor, ref: torch.Tensor, exact: bool = False) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN in the kernel's scores"
    g, r = got.cpu().double(), ref.cpu().double()
    gi, ri = torch.isinf(g), torch.isinf(r)
    assert torch.equal(gi, ri), f"{name}: ±inf pattern differs in {int((gi != ri).sum())} entries"
    assert torch.equal(g[ri], r[ri]), f"{name}: an infinity has the wrong sign"
    fin = ~ri
    if not fin.any():
        return
    err = (g[fin] - r[fin]).abs()
    if exact:
        assert int((err > 0).sum()) == 0, (
            f"{name}: {int((err > 0).sum())} scores differ (exact inputs), max {err.max():.3g}"
        )
        return
    tol = 2.0**-7 * r[fin].abs().max().item() + 1e-6
    assert err.max().item() <= tol, f"{name}: max error {err.max().item():.3g} > tolerance {tol:.3g}"


# (m, H, d, L)
SHAPES = [
    pytest.param(1, 2, 32, 1, id="m1-h2-d32-L1"),
    pytest.param(1, 4, 128, 70, id="m1-h4-d128-L70"),
    pytest.param(7, 2, 32, 13, id="m7-h2-d32-L13"),
    pytest.param(7, 4, 96, 70, id="m7-h4-d96-L70"),
    pytest.param(13, 4, 32, 70, id="m13-h4-d32-L70"),
    pytest.param(13, 2, 64, 13, id="m13-h2-d64-L13"),
    pytest.param(7, 32, 128, 13, id="m7-h32-d128-L13"),
    pytest.param(7, 17, 32, 70, id="m7-h17-d32-L70"),
]


# the production shape (keys as the MMA's rows, the heads' sum within a thread), and the
# heads as the MMA's rows (keys_m=False)
ORIENT = [pytest.param({}, id="keys-m"), pytest.param(dict(keys_m=False), id="heads-m")]


@pytest.mark.parametrize("tune", ORIENT)
@pytest.mark.parametrize("m,H,d,L", SHAPES)
def test_matches_reference(device, m, H, d, L, tune):
    iq, w, keys, vis = _inputs(m * 1000 + H * 100 + L, m, H, d, L, device)
    got = index_scores(iq, w, keys, vis, **tune)
    _assert_scores_close("index_scores", got, ref_index_scores(iq, w, keys, vis))


# (values of iq and keys in −v..v, d, weight exponents in lo..hi, continuous?)
EXACT = [
    # dots are small integers (exact in bf16); weights any bf16 in ±[1/4, 4]: the
    # product's rounding to bf16 matters
    pytest.param(2, 64, -2.0, 2.0, True, id="product-rounding"),
    # dots up to 4608: their rounding to bf16 matters (then the product's rounding is a
    # double rounding); weights any bf16 in ±[1/2, 2]
    pytest.param(6, 128, -1.0, 1.0, True, id="dot-rounding"),
]


@pytest.mark.parametrize("tune", ORIENT)
@pytest.mark.parametrize("v,d,lo,hi,continuous", EXACT)
@pytest.mark.parametrize("m,H,L", [(7, 4, 70), (13, 2, 13)], ids=["m7-h4-L70", "m13-h2-L13"])
def test_exact_on_small_integers(device, m, H, L, v, d, lo, hi, continuous, tune):
    """Integer iq and keys and weights of bounded exponent keep every fp32 sum exact in any
    order (all bits lie within 24 consecutive powers of two), so each rounding step
    (dot → bf16, product → bf16, head sum → bf16) must match the reference bit for bit."""
    gen = torch.Generator().manual_seed(5)
    iq = torch.randint(-v, v + 1, (m, H, d), generator=gen).bfloat16().to(device)
    keys = torch.randint(-v, v + 1, (L, d), generator=gen).bfloat16().to(device)
    sign = torch.randint(0, 2, (m, H), generator=gen) * 2 - 1
    e = torch.rand(m, H, generator=gen) * (hi - lo) + lo
    w = (sign * torch.exp2(e if continuous else e.round())).bfloat16().to(device)
    vis = torch.full((m,), L, dtype=torch.int32, device=device)
    ref = ref_index_scores(iq, w, keys, vis)
    _assert_scores_close("index_scores exact", index_scores(iq, w, keys, vis, **tune), ref, exact=True)


@pytest.mark.parametrize("vis_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_out_and_strided_inputs(device, vis_dtype):
    """out given (poisoned with NaN); iq and keys views with row strides larger than d."""
    m, H, d, L = 7, 4, 32, 70
    iq_big, w, keys_big, vis = _inputs(17, m, H, d + 32, L, device, vis_dtype)
    iq, keys = iq_big[:, :, 16 : 16 + d], keys_big[:, :d]
    w = w * 4
    out = torch.full((m, L), float("nan"), dtype=torch.bfloat16, device=device)
    assert index_scores(iq, w, keys, vis, out=out) is out
    _assert_scores_close("index_scores out=", out, ref_index_scores(iq, w, keys, vis))


def test_nothing_visible(device):
    iq, w, keys, _ = _inputs(3, 7, 2, 32, 13, device)
    vis = torch.zeros(7, dtype=torch.int64, device=device)
    got = index_scores(iq, w, keys, vis)
    assert torch.isneginf(got).all(), "with L_t = 0 every score must be −inf"


def test_torch_fallback_matches_reference():
    iq, w, keys, vis = _inputs(4, 7, 4, 32, 13, "cpu")
    ref = ref_index_scores(iq, w, keys, vis)
    assert torch.equal(index_scores_torch(iq, w, keys, vis), ref)
    out = torch.full_like(ref, float("nan"))
    assert index_scores_torch(iq, w, keys, vis, out=out) is out
    assert torch.equal(out, ref)


def _bad_cases():
    iq = torch.zeros(3, 2, 32, dtype=torch.bfloat16)
    w = torch.zeros(3, 2, dtype=torch.bfloat16)
    keys = torch.zeros(5, 32, dtype=torch.bfloat16)
    vis = torch.zeros(3, dtype=torch.int32)
    return [
        pytest.param((iq.float(), w, keys, vis, None), "iq.dtype", id="iq-dtype"),
        pytest.param((iq[0], w, keys, vis, None), "iq.dim()", id="iq-dim"),
        pytest.param((iq[..., :16], w, keys[:, :16], vis, None), "index_head_dim", id="d-not-32k"),
        pytest.param((iq.new_zeros(3, 2, 288), w, keys, vis, None), "index_head_dim", id="d-too-wide"),
        pytest.param((iq.new_zeros(3, 65, 32), w.new_zeros(3, 65), keys, vis, None), "(H)", id="too-many-heads"),
        pytest.param((iq, w.float(), keys, vis, None), "weights.dtype", id="w-dtype"),
        pytest.param((iq, w[:, :1], keys, vis, None), "weights.shape", id="w-shape"),
        pytest.param((iq, w, keys[:, :16], vis, None), "keys.shape", id="keys-width"),
        pytest.param((iq, w, keys, vis.float(), None), "visible.dtype", id="vis-dtype"),
        pytest.param((iq, w, keys, vis[:1], None), "visible.shape", id="vis-shape"),
        pytest.param((iq, w, keys, vis, torch.zeros(3, 4, dtype=torch.bfloat16)), "out", id="out-shape"),
    ]


@pytest.mark.parametrize("fn", [index_scores, index_scores_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("args,name", _bad_cases())
def test_validation(fn, args, name):
    iq, w, keys, vis, out = args
    with pytest.raises(ValueError, match=re.escape(name)):
        fn(iq, w, keys, vis, out=out)
