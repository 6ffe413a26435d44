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


@pytest.mark.parametrize("width", [15, 16, 22, 63, 64, 65, 130], ids=lambda w: f"14->{w}")
def test_minus_one_padding_keeps_bytes_at_any_width(width):
    """A 14-entry selection padded with −1 to a wider launch gives the same bytes. Before
    the last block was padded to 64 entries, these inputs (found by search) lost one bit
    at width 16: the CPU's fp32 row sum and row product change their order with length
    (the stack-level case: issue 10 item 18)."""
    gen = torch.Generator().manual_seed(117)
    m, H, D, w = 8, 4, 32, 14
    q = torch.randn(m, H, D, generator=gen).bfloat16()
    R = torch.randn(30, D, generator=gen).bfloat16()
    sel = torch.randint(0, 30, (m, w), generator=gen).int()
    sink = torch.randn(H, generator=gen)
    a = sparse_attn(q, R, sel, sink, D**-0.5)
    padded = torch.cat([sel, torch.full((m, width - w), -1, dtype=sel.dtype)], dim=1)
    b = sparse_attn(q, R, padded, sink, D**-0.5)
    n_diff = int((a.view(torch.int16) != b.view(torch.int16)).sum())
    assert n_diff == 0, f"o: {n_diff} elements changed from width {w} to {width}"


@pytest.mark.parametrize("seed", range(4), ids=lambda s: f"seed{s}")
def test_minus_one_padding_keeps_bytes_random_widths(seed):
    """Fresh selections of random width (some entries −1), padded to several wider launches."""
    gen = torch.Generator().manual_seed(1000 + seed)
    m, H, D, n_rows = 13, 4, 32, 50
    q = torch.randn(m, H, D, generator=gen).bfloat16()
    R = torch.randn(n_rows, D, generator=gen).bfloat16()
    sink = torch.randn(H, generator=gen)
    for w in torch.randint(1, 80, (6,), generator=gen).tolist():
        sel = torch.randint(-1, n_rows, (m, w), generator=gen).int()
        a = sparse_attn(q, R, sel, sink, D**-0.5)
        for extra in (1, 5, 8, 17, 64):
            padded = torch.cat([sel, torch.full((m, extra), -1, dtype=sel.dtype)], dim=1)
            b = sparse_attn(q, R, padded, sink, D**-0.5)
            n_diff = int((a.view(torch.int16) != b.view(torch.int16)).sum())
            assert n_diff == 0, f"o: {n_diff} elements changed from width {w} to {w + extra}"


def test_sink_not_scaled_by_tau():
    """A sink far above every logit takes almost all the weight only if it is used unscaled."""
    q, R, sel, _ = _one_key(0.0, 0.0)
    o = sparse_attn(q, R, sel, torch.tensor([10.0]), 32**-0.5)
    # unscaled: weight 1/(1+e^10) ≈ 4.5e-5; scaled by τ it would be 1/(1+e^1.77) ≈ 0.146
    assert o[0, 0, 0].item() == pytest.approx(2.0 / (1 + math.exp(10.0)), rel=2**-7)
