import math

import pytest
import torch

from attnv41.reference.sparse_attn import sparse_attn, sparse_attn_exact


def _one_key(logit: float, sink: float):
    """One head, one key R = e0·v with q chosen so that τ·q·R = logit."""
    D = 32
    R = torch.zeros(1, D)
    R[0, 0] = 2.0
    q = torch.zeros(1, 1, D)
    q[0, 0, 0] = logit / (2.0 * D**-0.5)
    return q.bfloat16(), R.bfloat16(), torch.tensor([[0]]), torch.tensor([sink])


@pytest.mark.parametrize("fn", [sparse_attn, sparse_attn_exact], ids=["released_order", "exact"])
@pytest.mark.parametrize("sink, weight", [(0.0, 0.5), (math.log(3.0), 0.25)], ids=["sink0", "sink_ln3"])
def test_sink_hand_check(fn, sink, weight):
    """attention-v41.md §7: one key with logit 0 and sink 0 → weight ½; sink ln 3 → ¼."""
    q, R, sel, s = _one_key(0.0, sink)
    o = fn(q, R, sel, s, 32**-0.5)
    assert o[0, 0, 0].item() == pytest.approx(2.0 * weight, rel=2**-8)


def test_all_absent_gives_exact_zero():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 2, 32, generator=gen).bfloat16()
    R = torch.randn(5, 32, generator=gen).bfloat16()
    sel = torch.full((3, 130), -1)
    o = sparse_attn(q, R, sel, torch.tensor([0.3, -2.0]), 32**-0.5)
    assert torch.equal(o, torch.zeros_like(o)) and not torch.isnan(o.float()).any()


@pytest.mark.parametrize("m, n_rows, K", [(7, 13, 20), (13, 301, 150), (1, 200, 193)], ids=str)
def test_released_order_within_bound_of_exact(m, n_rows, K):
    """bf16 probabilities (relative error ≤ 2^-9 each) and the final bf16 rounding
    (≤ 2^-9·|o|) bound the error: |o − o_exact| ≤ 2^-9·max|R| + 2^-8·|o_exact| per element
    (the fp32 accumulation adds ~K·2^-24, far below)."""
    gen = torch.Generator().manual_seed(m * 1000 + K)
    q = torch.randn(m, 4, 64, generator=gen).bfloat16()
    R = torch.randn(n_rows, 64, generator=gen).bfloat16()
    sel = torch.randint(-1, n_rows, (m, K), generator=gen)
    sink = torch.randn(4, generator=gen)
    o = sparse_attn(q, R, sel, sink, 64**-0.5).double()
    ex = sparse_attn_exact(q, R, sel, sink, 64**-0.5)
    rmax = R.double().abs().max()
    assert ((o - ex).abs() <= 2**-9 * rmax + 2**-8 * ex.abs()).all()


def test_minus_one_padding_does_not_change_a_bit():
    """Appending −1 entries to a selection (a wider launch) leaves every output bit."""
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(5, 2, 32, generator=gen).bfloat16()
    R = torch.randn(40, 32, generator=gen).bfloat16()
    sel = torch.randint(0, 40, (5, 30), generator=gen)
    sink = torch.randn(2, generator=gen)
    a = sparse_attn(q, R, sel, sink, 32**-0.5)
    padded = torch.cat([sel, torch.full((5, 100), -1)], dim=1)
    assert torch.equal(a, sparse_attn(q, R, padded, sink, 32**-0.5))


def test_sink_not_scaled_by_tau():
    """A sink far above every logit takes almost all the weight only if it is used unscaled."""
    q, R, sel, _ = _one_key(0.0, 0.0)
    o = sparse_attn(q, R, sel, torch.tensor([10.0]), 32**-0.5)
    # unscaled: weight 1/(1+e^10) ≈ 4.5e-5; scaled by τ it would be 1/(1+e^1.77) ≈ 0.146
    assert o[0, 0, 0].item() == pytest.approx(2.0 / (1 + math.exp(10.0)), rel=2**-7)
