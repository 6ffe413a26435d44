"""The batch-invariant tensor-core matmuls (`kernels.tc_mm`) against the fp64 product on
fresh random inputs, and their invariance: a row's bytes are the same whatever m and the
other rows are.

Tolerance against fp64, per output, with A = Σ_k |w[n, k]·x[t, k]|: products of bf16 are
exact in fp32; the K terms are summed in fp32 by the tensor cores (an order inside each
MMA the hardware fixes, possibly truncating), the chunk chain and the segment sum, so
|S' − S| ≤ E = 2·K·2^-24·A (one unit of truncation per addition, at most K additions
deep). The output and the reference each round once to bf16 (half an ulp ≤ 2^-8·|v|):
|out − ref| ≤ 2^-7·|ref| + 1.01·E + 2^-133.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from attnv41.kernels import tc_mm as TC

BF = torch.bfloat16


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _rand(gen, shape, spread: int = 4) -> torch.Tensor:
    v = torch.randn(*shape, generator=gen) * torch.exp2(
        torch.randint(-spread, spread + 1, shape, generator=gen).float()
    )
    return v.to(BF)


def _within(out, x, w, where):
    ref = x.double() @ w.double().t()
    A = x.double().abs() @ w.double().abs().t()
    K = x.shape[1]
    tol = 2.0**-7 * ref.abs() + 1.01 * 2 * K * 2.0**-24 * A + 2.0**-133
    o = out.double().cpu()
    assert not torch.isnan(o).any(), where
    bad = (o - ref.cpu()).abs() > tol.cpu()
    assert not bad.any(), f"{where}: {int(bad.sum())} outputs past the bound"


# (m, N, K): K a multiple of BK and not; N a multiple of BN and not; split and unsplit plans
SHAPES = [(1, 64, 128), (3, 40, 96), (17, 70, 200), (33, 128, 64)]


@pytest.mark.parametrize("m,N,K", SHAPES)
def test_tc_mm_within_the_bound_of_the_exact_product(device, m, N, K):
    g = _gen("tc", m, N, K)
    x, w = _rand(g, (m, K)), _rand(g, (N, K))
    out = torch.full((m, N), float("nan"), dtype=BF, device=device)
    TC.tc_mm(x.to(device), w.to(device), out)
    _within(out, x, w, f"m={m} N={N} K={K} segs={TC.plan(N, K)}")
    twin = TC.tc_mm_torch(x, w, torch.empty(m, N, dtype=BF))
    _within(twin, x, w, "twin")


@pytest.mark.parametrize("N,K", [(70, 200), (64, 128)])
def test_tc_mm_rows_do_not_depend_on_m_or_the_other_rows(device, N, K):
    """A row's bytes: alone (m = 1), among 37 rows, and among 37 other random rows."""
    g = _gen("inv", N, K)
    x, w = _rand(g, (37, K)).to(device), _rand(g, (N, K)).to(device)
    full = TC.tc_mm(x, w, torch.empty(37, N, dtype=BF, device=device))
    other = _rand(g, (37, K)).to(device)
    for t in (0, 5, 16, 36):
        one = TC.tc_mm(x[t : t + 1], w, torch.empty(1, N, dtype=BF, device=device))
        assert torch.equal(one[0], full[t]), f"row {t}: alone vs m = 37"
        mixed = other.clone()
        mixed[20] = x[t]
        got = TC.tc_mm(mixed, w, torch.empty(37, N, dtype=BF, device=device))
        assert torch.equal(got[20], full[t]), f"row {t}: at row 20 among others vs its own place"


def test_tc_group_mm_strided_views_and_invariance(device):
    g = _gen("group")
    m, G, gw, r = 19, 3, 96, 40
    big = _rand(g, (m, G * gw + 8)).to(device)
    o = big[:, : G * gw].view(m, G, gw)  # a strided view (row stride G·gw + 8)
    w = _rand(g, (G, r, gw)).to(device)
    outbig = torch.full((m, G * r + 4), float("nan"), dtype=BF, device=device)
    out = outbig[:, : G * r].view(m, G, r)
    TC.tc_group_mm(o, w, out)
    for k in range(G):
        _within(out[:, k], o[:, k].cpu(), w[k].cpu(), f"group {k}")
    one = TC.tc_group_mm(o[7:8].contiguous(), w, torch.empty(1, G, r, dtype=BF, device=device))
    assert torch.equal(one[0], out[7]), "row 7 alone vs among 19"
    assert torch.isnan(outbig[:, G * r :].float()).all(), "wrote past out"
    twin = TC.tc_group_mm_torch(o.cpu(), w.cpu(), torch.empty(m, G, r, dtype=BF))
    for k in range(G):
        _within(twin[:, k], o[:, k].cpu(), w[k].cpu(), f"twin group {k}")


def test_plan_is_a_constant_of_the_shape():
    assert TC.plan(1024, 4096) == 8  # 16 tiles × 8 segments ≥ 128
    assert TC.plan(32768, 1024) == 1
    assert TC.plan(40, 200) == 2  # 2 chunks: all of them
    assert TC.plan(40, 96) == 1
    assert TC.plan(4096, 8192) == 2


def test_bad_shapes_are_refused(device):
    x = torch.zeros(2, 64, dtype=BF, device=device)
    w = torch.zeros(32, 64, dtype=BF, device=device)
    with pytest.raises(ValueError, match="out.shape = \\(2, 31\\); allowed: \\(2, 32\\)"):
        TC.tc_mm(x, w, torch.zeros(2, 31, dtype=BF, device=device))
    with pytest.raises(ValueError, match="allowed: x \\[m >= 1, K\\], w contiguous \\[N, K\\]"):
        TC.tc_mm(x, w[:, :32], torch.zeros(2, 32, dtype=BF, device=device))
    with pytest.raises(ValueError, match="x: \\(2, 64\\) torch.float32; allowed: a 2-D torch.bfloat16"):
        TC.tc_mm(x.float(), w, torch.zeros(2, 32, dtype=BF, device=device))


def test_batch_entry_points_give_each_row_its_one_token_bits(device):
    """The batched runtime's `mm_many` (`mm_many_batch`): a bf16 weight with rope on the
    tensor cores and an fp32 weight through the chunked GEMV in one call; m = 37 rows equal
    37 one-token calls byte for byte, and the rotated output equals the product then the
    rope op."""
    from attnv41.kernels import rope as R

    gen = _gen("batch-entry")
    m, Kd = 37, 256
    x = _rand(gen, (m, Kd)).to(device)
    weights = (_rand(gen, (32, Kd)).to(device), _rand(gen, (12, Kd)).float().to(device))
    cos = (torch.rand(64, 4, generator=gen) * 2 - 1).to(device)
    sin = (torch.rand(64, 4, generator=gen) * 2 - 1).to(device)
    pos = torch.randint(0, 64, (m,), generator=gen).to(device)

    def outs(n):
        return [torch.full((n, w.shape[0]), float("nan"), dtype=w.dtype, device=device) for w in weights]

    got = TC.mm_many_batch(x, weights, outs(m), rope=(0, 16, cos, sin, pos))
    for t in (0, 15, 16, 36):
        one = TC.mm_many_batch(x[t : t + 1], weights, outs(1), rope=(0, 16, cos, sin, pos[t : t + 1]))
        for i in range(2):
            assert torch.equal(got[i][t : t + 1].cpu(), one[i].cpu()), f"row {t} out[{i}]"
    plain = TC.tc_mm(x, weights[0], torch.empty(m, 32, dtype=BF, device=device))
    rot = R.apply_rope(plain.view(m, -1, 16), cos, sin, pos, out=torch.empty(m, 2, 16, dtype=BF, device=device))
    assert torch.equal(got[0].cpu(), rot.view(m, 32).cpu())
    assert torch.equal(TC.mm_batch(x, weights[1], outs(m)[1]).cpu(), got[1].cpu())
