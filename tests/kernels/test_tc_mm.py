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
from helpers import interp_subset

BF = torch.bfloat16
PRODUCTION_MIN_SEG_PRODUCTS = TC._MIN_SEG_PRODUCTS


@pytest.fixture(autouse=True)
def _short_segments(monkeypatch):
    """Segments of any length (`plan`'s rule without its floor), so that the small shapes
    of these tests still split K and exercise the ordered split-K sum; the production
    floor is checked by `test_plan_is_a_constant_of_the_shape_and_kind`."""
    monkeypatch.setattr(TC, "_MIN_SEG_PRODUCTS", 1)


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


def test_tc_group_mm_fp8_stored_weight_gives_its_bf16_bits(device):
    """wo_a as the checkpoint stores it (e4m3 + e8m0 block scales), o not quantized: the
    bytes of the same call on the weight's exact bf16 dequantization (the same operands,
    plan and order), from a strided view; each row alone the same."""
    from attnv41.reference.fp8 import dequant_weight, quant_weight

    g = _gen("group-fp8")
    m, G, gw, r = 5, 3, 96, 64
    big = _rand(g, (m, G * gw + 8)).to(device)
    o = big[:, : G * gw].view(m, G, gw)
    q, sc = quant_weight(_rand(g, (G * r, gw)))
    deq = dequant_weight(q, sc).view(G, r, gw)
    q = q.view(G, r, gw)
    got = TC.tc_group_mm(o, q.to(device), torch.full((m, G, r), float("nan"), dtype=BF, device=device), sc.to(device))
    want = TC.tc_group_mm(o, deq.to(device), torch.full((m, G, r), float("nan"), dtype=BF, device=device))
    assert not torch.isnan(got.float()).any(), "NaN in the output"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "FP8-stored wo_a vs its bf16: bits differ"
    one = TC.tc_group_mm(
        o[3:4].contiguous(), q.to(device), torch.empty(1, G, r, dtype=BF, device=device), sc.to(device)
    )
    assert torch.equal(one[0], got[3]), "row 3 alone vs among 5"
    twin = TC.tc_group_mm_torch(o.cpu(), q, torch.empty(m, G, r, dtype=BF), sc)
    assert torch.equal(twin, TC.tc_group_mm_torch(o.cpu(), deq, torch.empty(m, G, r, dtype=BF))), "twin"
    with pytest.raises(ValueError, match=r"allowed: r and gw multiples of 32"):
        TC.tc_group_mm(
            o, q[:, :48].contiguous().to(device), torch.empty(m, G, 48, dtype=BF, device=device), sc.to(device)
        )


def test_plan_is_a_constant_of_the_shape_and_kind(monkeypatch):
    # without the floor (this module's fixture): the smallest divisor reaching 128 programs
    assert TC.plan(1024, 4096) == 8  # 16 tiles × 8 segments ≥ 128
    assert TC.plan(32768, 1024) == 1
    assert TC.plan(40, 200) == 2  # 2 chunks: all of them
    assert TC.plan(40, 96) == 1
    assert TC.plan(4096, 8192) == 2
    # the production floor: every segment keeps >= 10 chunk products (3 per fp32 chunk)
    monkeypatch.setattr(TC, "_MIN_SEG_PRODUCTS", PRODUCTION_MIN_SEG_PRODUCTS)
    assert PRODUCTION_MIN_SEG_PRODUCTS == 10
    flash = {  # V4.1-Flash projections (N, K, products): segments
        "wq_a": ((1280, 5120, 1), 4),  # 20 tiles; 8 without the floor
        "wkv": ((512, 5120, 1), 4),  # 8 tiles; 20 without the floor
        "indexer.wq_b": ((4096, 1280, 1), 1),  # 10 chunks; 2 without the floor
        "wq_b": ((32768, 1280, 1), 1),
        "wo_b": ((5120, 8192, 1), 2),
        "wo_a (8 groups)": ((8 * 1024, 4096, 1), 1),
        "compressor (fp32)": ((1024, 5120, 3), 8),  # 3 products per chunk: the floor allows 12
    }
    for name, ((N, K, p), segs) in flash.items():
        assert TC.plan(N, K, p) == segs, name
        chunks = -(-K // TC.BK)
        assert chunks % segs == 0 and (segs == 1 or chunks // segs * p >= 10), name
    assert TC.plan(40, 200) == 1  # 2 chunks of one product: one segment
    assert TC.plan(64, 96 * 128, 3) == 24  # 1 tile, none reaches 128: the largest divisor of 96 the floor allows (≤ 28)
    # other targets and floors (tc_fp8's tune keys progs, minseg): wo_b
    assert TC.plan(5120, 8192, 1, 528) == 4  # 80 tiles; the floor of 10 allows 1, 2, 4 of 64 chunks
    assert TC.plan(5120, 8192, 1, 528, 4) == 8  # floor 4: up to 16; 8 segments reach 640 programs
    assert TC.plan(5120, 8192, 1, 64) == 1
    # the two split levels (fine, outer) of the production rules: FP8 linears and group
    # weights (wo_a, either dtype) split finely over the coarse rule; bf16, fp32 one level
    levels = {
        ("wq_a", "fp8"): ((1280, 5120), (8, 4)),
        ("wkv", "fp8"): ((512, 5120), (8, 4)),
        ("indexer.wq_b", "fp8"): ((4096, 1280), (2, 1)),
        ("wq_b", "fp8"): ((32768, 1280), (1, 1)),
        ("wo_b", "fp8"): ((5120, 8192), (8, 2)),
        ("wq_a", "bf16"): ((1280, 5120), (4, 4)),
        ("wo_b", "bf16"): ((5120, 8192), (2, 2)),
        ("wo_a", "group"): ((8 * 1024, 4096), (4, 1)),
        ("compressor", "fp32"): ((1024, 5120), (8, 8)),
    }
    for (name, kind), ((N, K), want) in levels.items():
        assert TC.split_levels(N, K, kind) == want, (name, kind)
    # the fine count is a multiple of the coarse one (large calls keep its parallelism):
    # [5120, 5120] FP8, coarse 2; the fine rule alone would give 5 (gcd 1)
    assert TC.plan(5120, 5120) == 2 and TC.plan(5120, 5120, 1, 396, 5) == 5
    assert TC.split_levels(5120, 5120, "fp8") == (8, 2)  # 80 tiles: 4 gives 320 programs, 8 gives 640
    for N in (40, 512, 1280, 4096, 5120, 32768):
        for K in (1024, 1280, 4096, 5120, 7168, 8192):
            for kind in ("fp8", "group", "bf16", "fp32"):
                fine, outer = TC.split_levels(N, K, kind)
                assert (
                    fine % outer == 0
                    and -(-K // TC.BK) % fine == 0
                    and outer == TC.plan(N, K, 3 if kind == "fp32" else 1)
                )


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
    """The batched runtime's `mm_many` (`mm_many_batch`): a bf16 weight with rope and an
    fp32 weight in one call; m = 37 rows equal 37 one-token calls byte for byte, and the
    rotated output equals the product then the rope op."""
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
            _same_row_bytes(got[i][t : t + 1], one[i], device, f"row {t} out[{i}]", x[t : t + 1], weights[i], i == 0)
    plain = TC.tc_mm(x, weights[0], torch.empty(m, 32, dtype=BF, device=device))
    rot = R.apply_rope(plain.view(m, -1, 16), cos, sin, pos, out=torch.empty(m, 2, 16, dtype=BF, device=device))
    assert torch.equal(got[0].cpu(), rot.view(m, 32).cpu())
    assert torch.equal(TC.mm_batch(x, weights[1], outs(m)[1]).cpu(), got[1].cpu())


def _same_row_bytes(got, want, device, where, x, w, rotated=False) -> None:
    """A row's output in one call against the same row in another: byte for byte on the GPU.
    Under the interpreter tl.dot is numpy's matmul, and OpenBLAS (on AMD EPYC cores, for
    K ≥ 128) sums a row's products in an order that depends on the row's position in the
    tile, so there the check is the summation-order bound instead (it still catches a
    wrong row or column): |got − want| ≤ 2·E + (2^-7·|want| for bf16 outputs), with E =
    1.01·2·3K·2^-24·A, A = Σ_k |x·w| (three bf16 parts of an fp32 weight; the row's
    largest A when `rotated`, the rope mixing two columns)."""
    if device == "cuda":
        assert torch.equal(got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)), where
        return
    g, r = got.double().cpu(), want.double().cpu()
    A = x.double().abs().cpu() @ w.double().abs().cpu().t()
    if rotated:
        A = A.amax(dim=1, keepdim=True).expand_as(A)
    tol = 2 * 1.01 * 2 * 3 * x.shape[1] * 2.0**-24 * A + 2.0**-140
    if got.dtype == BF:
        tol = tol + 2.0**-7 * r.abs()
    assert not torch.isnan(g).any(), f"{where}: NaN"
    bad = (g - r).abs() > tol
    assert not bad.any(), f"{where}: {int(bad.sum())} outputs past the summation-order bound"


# ------------------------------------------------------------------ fp32 and FP8 weights


def _within_f32(out, x, w, where):
    """fp32 out (no rounding): w split into three exact bf16 parts, 3K exact products summed
    in fp32: |out − ref| ≤ 1.01·2·3K·2^-24·A + 2^-140."""
    ref = x.double() @ w.double().t()
    A = x.double().abs() @ w.double().abs().t()
    tol = 1.01 * 2 * 3 * x.shape[1] * 2.0**-24 * A + 2.0**-140
    o = out.double().cpu()
    assert out.dtype == torch.float32 and not torch.isnan(o).any(), where
    bad = (o - ref).abs() > tol
    assert not bad.any(), f"{where}: {int(bad.sum())} outputs past the bound, worst {float((o - ref).abs().max())}"


@pytest.mark.parametrize("m,N,K", [(1, 64, 128), (5, 40, 96), (17, 70, 1024)])
def test_tc_mm_fp32_weights_within_the_bound(device, m, N, K):
    g = _gen("f32", m, N, K)
    x = _rand(g, (m, K))
    w = (torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-6, 7, (N, K), generator=g).float())).float()
    out = torch.full((m, N), float("nan"), dtype=torch.float32, device=device)
    TC.tc_mm(x.to(device), w.to(device), out)
    _within_f32(out, x, w, f"m={m} N={N} K={K} segs={TC.plan(N, K)}")
    twin = TC.tc_mm_torch(x, w, torch.empty(m, N, dtype=torch.float32))
    _within_f32(twin, x, w, "twin")


def _fp8_weight(g, N, K):
    from attnv41.reference.fp8 import quant_weight

    return quant_weight(_rand(g, (N, K), spread=3).float())


@pytest.mark.parametrize("m,N,K", [(1, 64, 128), (3, 40, 96), (17, 70, 1024)])
def test_tc_mm_fp8_weights_against_the_released_linear(device, m, N, K):
    """FP8 weights: against `reference.fp8.fp8_linear` (exact 32-term block sums, an fp32
    chain) and the fp64 product of the same exact operands. Both round once to bf16; the
    sums differ by at most 2·K·2^-24·A (A = Σ|xq·W|): |out − ref| ≤ 2^-7·|ref| + 1.01·E."""
    from attnv41.kernels import qdq
    from attnv41.reference.fp8 import dequant_weight, fp8_linear

    g = _gen("fp8", m, N, K)
    x = _rand(g, (m, K))
    w, sc = _fp8_weight(g, N, K)
    xq = qdq.fp8_qdq_torch(x)
    out = torch.full((m, N), float("nan"), dtype=BF, device=device)
    TC.tc_mm(xq.to(device), w.to(device), out, sc.to(device))
    ref = fp8_linear(x, w, sc)
    W = dequant_weight(w, sc).double()
    A = xq.double().abs() @ W.abs().t()
    tol = 2.0**-7 * ref.double().abs() + 1.01 * 2 * K * 2.0**-24 * A + 2.0**-133
    o = out.double().cpu()
    assert not torch.isnan(o).any()
    bad = (o - ref.double()).abs() > tol
    assert not bad.any(), f"m={m} N={N} K={K}: {int(bad.sum())} outputs past the bound"
    exact = (xq.double() @ W.t()).to(BF).double()  # the fp64 product of the operands, rounded once
    assert ((o - exact).abs() <= tol).all()


def test_fp8_entry_points_quantize_once_and_keep_rows_invariant(device):
    """`fp8_mm_batch` without xq equals `tc_mm` on `fp8_qdq(x)` byte for byte, and with xq
    given the same; each of 37 rows equals its one-token call; an FP8 weight beside a bf16
    and an fp32 one in `mm_many_batch` gives the same bytes as alone."""
    from attnv41.kernels import qdq

    g = _gen("fp8-entry")
    m, N, K = 37, 96, 256
    x = _rand(g, (m, K)).to(device)
    w, sc = (t.to(device) for t in _fp8_weight(g, N, K))
    xq = qdq.fp8_qdq(x.clone())
    full = TC.fp8_mm_batch(x, w, sc, torch.empty(m, N, dtype=BF, device=device))
    direct = TC.tc_mm(xq, w, torch.empty(m, N, dtype=BF, device=device), sc)
    assert torch.equal(full.cpu(), direct.cpu())
    given = TC.fp8_mm_batch(x, w, sc, torch.empty(m, N, dtype=BF, device=device), xq=xq)
    assert torch.equal(full.cpu(), given.cpu())
    for t in (0, 16, 36):
        one = TC.fp8_mm_batch(x[t : t + 1], w, sc, torch.empty(1, N, dtype=BF, device=device))
        assert torch.equal(one[0].cpu(), full[t].cpu()), f"row {t}"
    wb, wf = _rand(g, (32, K)).to(device), _rand(g, (24, K)).float().to(device)
    outs = [torch.empty(m, n, dtype=d, device=device) for n, d in ((32, BF), (N, BF), (24, torch.float32))]
    got = TC.mm_many_batch(x, (wb, w, wf), outs, (None, sc, None))
    assert torch.equal(got[1].cpu(), full.cpu())
    assert torch.equal(got[0].cpu(), TC.tc_mm(x, wb, torch.empty(m, 32, dtype=BF, device=device)).cpu())
    assert torch.equal(got[2].cpu(), TC.tc_mm(x, wf, torch.empty(m, 24, dtype=torch.float32, device=device)).cpu())


def test_split_k_counters_return_to_zero(device):
    """A split call (8 segments) leaves every arrival counter at zero (the next call, or a
    graph replay, starts from them), and two calls give the same bytes."""
    g = _gen("split8")
    x, w = _rand(g, (70, 1024)).to(device), _rand(g, (64, 1024)).to(device)
    assert TC.plan(64, 1024) == 8
    a = TC.tc_mm(x, w, torch.empty(70, 64, dtype=BF, device=device))
    b = TC.tc_mm(x, w, torch.empty(70, 64, dtype=BF, device=device))
    assert torch.equal(a.cpu(), b.cpu())
    _within(a, x.cpu(), w.cpu(), "segs=8")
    assert int(TC._counters.buffer(torch.device(device)).abs().sum()) == 0


def test_one_launch_of_split_weights_gives_each_weight_its_alone_bytes(device, monkeypatch):
    """`mm_many_batch` runs all its weights in one launch (`_tc_many_kernel`): with K split
    for each (4, 8 and 8 segments: partials and arrival counters per weight, two row tiles
    of m = 70), a bf16, an FP8 and an fp32 weight give the bytes of `tc_mm` with each
    alone, and leave every counter at zero; an argument error raises before any launch."""
    from attnv41.kernels import qdq

    g = _gen("many-split")
    m, K = 70, 1024
    Nb, N8 = 2048, 96  # bf16: 32 weight tiles, where 4 segments reach `_TARGET_PROGRAMS` (2 do not)
    # the interpreter: the same segments from 2 tiles and 1 under a target of 8 (a sixth of the programs)
    if device != "cuda":
        monkeypatch.setattr(TC, "_TARGET_PROGRAMS", 8)
        Nb, N8 = 128, 40
    x = _rand(g, (m, K)).to(device)
    w8, sc = (t.to(device) for t in _fp8_weight(g, N8, K))
    wb, wf = _rand(g, (Nb, K)).to(device), _rand(g, (40, K)).float().to(device)
    assert [TC.plan(n, K) for n in (Nb, N8, 40)] == [4, 8, 8]
    outs = [
        torch.full((m, n), float("nan"), dtype=d, device=device) for n, d in ((Nb, BF), (N8, BF), (40, torch.float32))
    ]
    got = TC.mm_many_batch(x, (wb, w8, wf), outs, (None, sc, None))
    alone = (
        TC.tc_mm(x, wb, torch.empty(m, Nb, dtype=BF, device=device)),
        TC.tc_mm(qdq.fp8_qdq(x.clone()), w8, torch.empty(m, N8, dtype=BF, device=device), sc),
        TC.tc_mm(x, wf, torch.empty(m, 40, dtype=torch.float32, device=device)),
    )
    for i, (a, b) in enumerate(zip(got, alone)):
        assert torch.equal(a.cpu(), b.cpu()), f"weight {i}"
    assert int(TC._counters.buffer(torch.device(device)).abs().sum()) == 0
    before = [o.clone() for o in outs]
    with pytest.raises(ValueError, match="out.shape = \\(70, 39\\); allowed: \\(70, 40\\)"):
        TC.mm_many_batch(x, (wb, wf), (outs[0], outs[2][:, :39]))
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(outs, before))


def test_fp32_and_fp8_arguments_are_checked(device):
    x = torch.zeros(2, 64, dtype=BF, device=device)
    w8 = torch.zeros(32, 64, dtype=torch.float8_e4m3fn, device=device)
    sc = torch.full((1, 2), 127, dtype=torch.uint8, device=device)
    with pytest.raises(
        ValueError, match="w: \\(32, 64\\) torch.float8_e4m3fn; allowed: a 2-D torch.bfloat16 or torch.float32"
    ):
        TC.tc_mm(x, w8, torch.zeros(2, 32, dtype=BF, device=device))
    with pytest.raises(
        ValueError, match="scale: \\(1, 1\\) torch.uint8; allowed: a contiguous float8_e8m0fnu or uint8 \\(1, 2\\)"
    ):
        TC.tc_mm(x, w8, torch.zeros(2, 32, dtype=BF, device=device), sc[:, :1])
    with pytest.raises(ValueError, match="out: \\(2, 32\\) torch.bfloat16; allowed: a 2-D torch.float32"):
        TC.tc_mm(x, torch.zeros(32, 64, device=device), torch.zeros(2, 32, dtype=BF, device=device))
    with pytest.raises(ValueError, match="xq: given, but no weight is torch.float8_e4m3fn"):
        TC.mm_many_batch(x, (w8.float(),), (torch.zeros(2, 32, device=device),), xq=x)


def test_split3_parts_sum_to_the_fp32_weight_exactly(device):
    """`_split3`: hi + mid + lo == v exactly (in fp64) and each part a bf16 value, over
    fp32 values with every mantissa pattern class and exponents 2^-90..2^90."""
    from attnv41.kernels._triton import tl, triton

    @triton.jit
    def _parts(v_ptr, o_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        hi, mid, lo = TC._split3(tl.load(v_ptr + i, mask=ok, other=0.0))
        tl.store(o_ptr + i, hi, mask=ok)
        tl.store(o_ptr + n + i, mid, mask=ok)
        tl.store(o_ptr + 2 * n + i, lo, mask=ok)

    g = _gen("split3")
    n = 4096
    bits = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int32)
    bits[:4] = torch.tensor([0, (1 << 23) - 1, 1 << 15, (1 << 16) - 1])  # all zeros, all ones, the rounding edges
    exp = torch.randint(127 - 90, 127 + 91, (n,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    v = (sign | (exp << 23) | bits).view(torch.float32)
    parts = torch.empty(3 * n, dtype=BF, device=device)
    _parts[(n // 1024,)](v.to(device), parts, n, BLOCK=1024)
    p = parts.view(3, n).double().cpu()
    assert torch.equal(p.sum(0), v.double()), "hi + mid + lo != v"


ROPE_CASES = [  # m, heads, head_dim, half, K, fp8: one segment and split K (this module's fixture), two row tiles
    (1, 4, 64, 8, 256, False),
    (3, 2, 128, 32, 1024, False),
    (70, 2, 64, 16, 512, True),
]
if not torch.cuda.is_available():  # the interpreter: K split in fewer chunks (4 and 3 segments: fewer programs)
    ROPE_CASES[1:] = [(3, 2, 128, 32, 512, False), (70, 2, 64, 16, 384, True)]


@pytest.mark.parametrize(
    "m,H,D,half,K,fp8",
    ROPE_CASES,
    ids=[f"m{c[0]}-H{c[1]}-D{c[2]}-h{c[3]}-K{c[4]}-{'fp8' if c[5] else 'bf16'}" for c in ROPE_CASES],
)
def test_rope_epilogue_is_the_rope_op_after(device, m, H, D, half, K, fp8):
    """`mm_many_batch(..., rope=)` stores output i rotated in the store (the decode GEMV's
    epilogue, `gemv._store`): the bytes of the same call without it, then `rope.apply_rope`;
    the other weight of the launch unchanged; with split K (segments here: the fixture's)."""
    from attnv41.kernels import qdq
    from attnv41.kernels import rope as R

    g = _gen("tc-rope", m, H, D, half, K, fp8)
    x = _rand(g, (m, K)).to(device)
    if fp8:
        w, sc = (t.to(device) for t in _fp8_weight(g, H * D, K))
        xq = qdq.fp8_qdq(x.clone())
    else:
        w, sc, xq = _rand(g, (H * D, K)).to(device), None, None
    w2 = _rand(g, (40, K)).to(device)
    ang = torch.rand(90, half, generator=g) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, 90, (m,), generator=g, dtype=torch.int32).to(device)
    assert TC.plan(H * D, K) > 1 or K <= 256, "the cases split K"
    plain = (torch.empty(m, H * D, dtype=BF, device=device), torch.empty(m, 40, dtype=BF, device=device))
    TC.mm_many_batch(x, (w, w2), plain, (sc, None), xq=xq)
    want = R.apply_rope(plain[0].view(m, H, D), cos, sin, pos).view(m, H * D)
    got = (torch.full_like(plain[0], float("nan")), torch.full_like(plain[1], float("nan")))
    TC.mm_many_batch(x, (w, w2), got, (sc, None), xq=xq, rope=(0, D, cos, sin, pos))
    assert torch.equal(got[0].cpu().view(torch.int16), want.cpu().view(torch.int16)), "rotated != mm then apply_rope"
    assert torch.equal(got[1].cpu(), plain[1].cpu()), "the other weight's output changed"
    assert int(TC._counters.buffer(torch.device(device)).abs().sum()) == 0
    with pytest.raises(ValueError, match="rope i = 2"):
        TC.mm_many_batch(x, (w, w2), got, (sc, None), xq=xq, rope=(2, D, cos, sin, pos))


@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp8"])
def test_rows_past_one_row_tile_keep_their_one_token_bits(device, kind):
    """Calls of more than BM rows (verify steps: B·k tokens): a row's bytes among 200 rows
    (four row tiles, the last partial) equal its bytes in calls of 1, 64, 65 and 128 rows
    from either end, through `tc_mm` and `mm_many_batch` (with rope), split K and not."""
    from attnv41.kernels import qdq

    g = _gen("large-tiles", kind)
    N, K = (40, 1024) if kind != "bf16" else (96, 256)
    if device != "cuda":  # the interpreter: 2 chunks (a quarter of fp32's and FP8's), one weight tile (half of bf16's)
        N, K = (40 if kind != "bf16" else 48), 256
    assert TC.plan(N, K, 3 if kind == "fp32" else 1) > 1, "split K"
    x = _rand(g, (200, K)).to(device)
    sc = None
    if kind == "fp8":
        w, sc = (t.to(device) for t in _fp8_weight(g, N, K))
        x = qdq.fp8_qdq(x.clone())
    elif kind == "fp32":
        w = (torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-6, 7, (N, K), generator=g).float())).to(device)
    else:
        w = _rand(g, (N, K)).to(device)
    dt = torch.float32 if kind == "fp32" else BF
    w_val = w
    if kind == "fp8":
        from attnv41.reference.fp8 import dequant_weight

        w_val = dequant_weight(w.cpu(), sc.cpu())
    rope = None
    if kind == "bf16":
        cos = (torch.rand(64, 4, generator=g) * 2 - 1).to(device)
        sin = (torch.rand(64, 4, generator=g) * 2 - 1).to(device)
        pos = torch.randint(0, 64, (200,), generator=g).to(device)
        rope = (0, 16, cos, sin, pos)

    def call(rows, many):
        out = torch.full((len(rows), N), float("nan"), dtype=dt, device=device)
        if not many:
            return TC.tc_mm(x[rows], w, out, sc)
        r = None if rope is None else (*rope[:4], rope[4][rows])
        return TC.mm_many_batch(x[rows], (w,), (out,), (sc,), xq=x[rows] if sc is not None else None, rope=r)[0]

    for many in (False, True):
        ref = call(list(range(200)), many)
        assert not torch.isnan(ref.float()).any()
        for m in (1, 64, 65, 128):
            for lo in (0, 200 - m):
                got = call(list(range(lo, lo + m)), many)
                where = f"{kind} many={many} rows {lo}..{lo + m - 1}"
                _same_row_bytes(got, ref[lo : lo + m], device, where, x[lo : lo + m], w_val, rope is not None and many)


# ------------------------------------------------ the development switch FP8_GLUON (tc_fp8)


def test_fp8_gluon_switch_needs_cuda(device, monkeypatch):
    """`FP8_GLUON` set: on the interpreter a clear error naming the switch, not the Triton
    path (no silent fallback); bf16-only calls are untouched."""
    if device != "cpu":
        pytest.skip("the interpreter's case")
    from attnv41.kernels import qdq

    g = _gen("fp8-gluon-cpu")
    K = 256
    x = _rand(g, (2, K))
    w, sc = _fp8_weight(g, 64, K)
    monkeypatch.setattr(TC, "FP8_GLUON", {})
    with pytest.raises(RuntimeError, match="FP8_GLUON"):
        TC.fp8_mm_batch(x, w, sc, torch.empty(2, 64, dtype=BF), xq=qdq.fp8_qdq(x.clone()))
    wb = _rand(g, (32, K))
    got = TC.mm_batch(x, wb, torch.empty(2, 32, dtype=BF))
    monkeypatch.setattr(TC, "FP8_GLUON", None)
    assert torch.equal(got, TC.mm_batch(x, wb, torch.empty(2, 32, dtype=BF)))


def test_batch_norm_renames_the_round_trip_under_the_switch(device, monkeypatch):
    """`rms_norm_batch` (the batched runtime's `ops.rms_norm`): `norm.rms_norm`'s bytes; its
    `qdq_out` in natural order with `FP8_GLUON` off and in `tc_fp8`'s renamed order with it on
    (the order `mm_many_batch` then reads a producer's `xq` in); no round trip asked, no change."""
    from attnv41.kernels import norm
    from attnv41.kernels.tc_fp8 import rename_cols

    g = _gen("norm-batch-rename")
    x, wn = _rand(g, (3, 256)).to(device), (torch.rand(256, generator=g) + 0.5).to(device)
    q_want = torch.empty_like(x)
    want = norm.rms_norm(x, wn, 1e-6, qdq_out=q_want)
    for switch, q_exp in ((None, q_want), ({}, rename_cols(q_want))):
        monkeypatch.setattr(TC, "FP8_GLUON", switch)
        q = torch.full_like(x, float("nan"))
        got = TC.rms_norm_batch(x, wn, 1e-6, out=torch.empty_like(x), qdq_out=q)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), switch
        assert torch.equal(q.view(torch.int16), q_exp.view(torch.int16)), switch
        assert torch.equal(TC.rms_norm_batch(x, wn, 1e-6).view(torch.int16), want.view(torch.int16)), switch


@pytest.mark.gpu
def test_fp8_gluon_switch_routes_fp8_weights(monkeypatch):
    """`FP8_GLUON` set on CUDA: `mm_many_batch`'s FP8 weight gives `tc_fp8_many`'s bytes on x's
    renamed round trip (RoPE in its store included), the bf16 weight beside it `tc_mm`'s own."""
    from attnv41.kernels import qdq, tc_fp8

    dev = torch.device("cuda")
    g = _gen("fp8-gluon")
    m, K, H, D, half = 9, 1280, 2, 128, 16
    x = _rand(g, (m, K)).to(dev)
    w8, sc = (t.to(dev) for t in _fp8_weight(g, H * D, K))
    wb = _rand(g, (96, K)).to(dev)
    ang = torch.rand(40, half, generator=g) * 6
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)
    pos = torch.randint(0, 40, (m,), generator=g, dtype=torch.int32).to(dev)
    monkeypatch.setattr(TC, "FP8_GLUON", {"stages": 3})
    outs = (torch.empty(m, H * D, dtype=BF, device=dev), torch.empty(m, 96, dtype=BF, device=dev))
    TC.mm_many_batch(x, (w8, wb), outs, (sc, None), rope=(0, D, cos, sin, pos))
    want8 = tc_fp8.tc_fp8(
        qdq.fp8_qdq(x.clone(), rename=True), w8, sc, torch.empty_like(outs[0]), rope=(D, cos, sin, pos), stages=3
    )
    # a producer's round trip (renamed, as `rms_norm_batch` makes it under the switch): the same bytes, no qdq here
    xq = qdq.fp8_qdq(x.clone(), rename=True)
    outs2 = tuple(torch.full_like(o, float("nan")) for o in outs)
    TC.mm_many_batch(x, (w8, wb), outs2, (sc, None), xq=xq, rope=(0, D, cos, sin, pos))
    monkeypatch.setattr(TC, "FP8_GLUON", None)
    wantb = TC.mm_batch(x, wb, torch.empty_like(outs[1]))
    assert torch.equal(outs[0].view(torch.int16), want8.view(torch.int16))
    assert torch.equal(outs[1].view(torch.int16), wantb.view(torch.int16))
    for o, o2 in zip(outs, outs2):
        assert torch.equal(o.view(torch.int16), o2.view(torch.int16))


def test_split_k_workspace_past_int32_offsets_is_refused(device):
    """The split-K workspace is addressed with int32 offsets: a call needing 2³¹ values or
    more raises before anything is allocated or launched (stride-0 views: no memory)."""
    m, N, K = 1 << 22, 64, 1024
    assert TC.plan(N, K) == 8  # 8 · m · N = 2³¹ values
    x = torch.zeros(1, K, dtype=BF, device=device).expand(m, K)
    w = torch.zeros(N, K, dtype=BF, device=device)
    out = torch.zeros(1, N, dtype=BF, device=device).expand(m, N)
    msg = rf"m = {m}: split-K workspace of {1 << 31} fp32 values; allowed: < 2\^31"
    with pytest.raises(ValueError, match=msg):
        TC.tc_mm(x, w, out)
    with pytest.raises(ValueError, match=msg):
        TC.mm_many_batch(x, (w,), (out,))
    TC._check_part(m - 1, 8 * (m - 1) * N)  # one row fewer fits


@pytest.mark.gpu
def test_fp8_gluon_switch_checks_both_launches_first(monkeypatch):
    """Under `FP8_GLUON` a call whose second launch (the bf16 weights) would exceed its
    split-K workspace raises before the first (the FP8 weights) writes anything."""
    dev = torch.device("cuda")
    g = _gen("fp8-gluon-limits")
    m, K = 1 << 22, 1024
    x = _rand(g, (1, K)).to(dev).expand(m, K)
    w8, sc = (t.to(dev) for t in _fp8_weight(g, 64, K))
    wb = _rand(g, (64, K)).to(dev)
    out8 = torch.full((1, 64), float("nan"), dtype=BF, device=dev).expand(m, 64)
    outb = torch.full((1, 64), float("nan"), dtype=BF, device=dev).expand(m, 64)
    monkeypatch.setattr(TC, "FP8_GLUON", {})
    with pytest.raises(ValueError, match="split-K workspace"):
        TC.mm_many_batch(x, (w8, wb), (out8, outb), (sc, None))
    assert torch.isnan(out8[:1].float()).all() and torch.isnan(outb[:1].float()).all()


# ------------------------------------------------ two split levels (fine and coarse programs)


def _levels(monkeypatch, fine_target: int, coarse_target: int = 2) -> None:
    """Every kind split finely (`_FINE_PLAN`: fine_target programs, segments of any length)
    over a coarse rule of `coarse_target` programs."""
    monkeypatch.setattr(TC, "_TARGET_PROGRAMS", coarse_target)
    monkeypatch.setattr(TC, "_FINE_PLAN", {k: (fine_target, 1) for k in ("bf16", "fp32", "fp8", "group")})


def _two_level_call(device, kind, m, gen, K=1024):
    """A call of m rows of `kind` (bf16, fp32, fp8 through `mm_many_batch` with a second
    weight and rope on the first; group through `tc_group_mm`) over K columns (1024: 8
    chunks): a function of the mode (`_FINE_MAX_M`) returning the outputs, and the weights'
    (x, w) for the bound."""
    from attnv41.kernels import qdq
    from attnv41.reference.fp8 import dequant_weight

    N = 48  # one weight tile
    if kind == "group":
        G = 3
        o = _rand(gen, (m, G, K)).to(device)
        w = _rand(gen, (G, N, K)).to(device)

        def run():
            return (TC.tc_group_mm(o, w, torch.full((m, G, N), float("nan"), dtype=BF, device=device)),)

        return run, [(o[:, k], w[k]) for k in range(G)]
    x = _rand(gen, (m, K)).to(device)
    if kind == "fp8":
        w, sc = (t.to(device) for t in _fp8_weight(gen, N, K))
        x = qdq.fp8_qdq(x.clone())
        wv = dequant_weight(w.cpu(), sc.cpu())
    elif kind == "fp32":
        w, sc = (
            (torch.randn(N, K, generator=gen) * torch.exp2(torch.randint(-6, 7, (N, K), generator=gen).float())),
            None,
        )
        w, wv = w.to(device), w
    else:
        w, sc = _rand(gen, (N, K)).to(device), None
        wv = w
    w2 = _rand(gen, (72, K)).to(device)  # a second weight in the same launch: 2 tiles
    dt = torch.float32 if kind == "fp32" else BF
    rope = None
    if kind == "bf16":
        cos = (torch.rand(64, 4, generator=gen) * 2 - 1).to(device)
        sin = (torch.rand(64, 4, generator=gen) * 2 - 1).to(device)
        rope = (0, 16, cos, sin, torch.randint(0, 64, (m,), generator=gen).to(device))

    def run():
        outs = (
            torch.full((m, N), float("nan"), dtype=dt, device=device),
            torch.full((m, 72), float("nan"), dtype=BF, device=device),
        )
        xq = x if sc is not None else None
        many = TC.mm_many_batch(x, (w, w2), outs, (sc, None), xq=xq, rope=rope)
        alone = TC.tc_mm(x, w, torch.full((m, N), float("nan"), dtype=dt, device=device), sc)
        return (*many, alone)

    return run, [(x, wv), (x, w2), (x, wv)]


# m: the interpreter takes 1 and 65 (one row tile; two, the last ragged, past `_SUM_MAX_M`, as
# 130's three: a third fewer programs). On CUDA m = 64 and coarse_target = 2 (a middle value
# of each) run in the full tier only: this test's 36 GPU cases took 211 s of one quick-tier
# worker (H100, fiftieth entry; each case compiles its own plans), the tier's longest file.
@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp8", "group"])
@pytest.mark.parametrize(
    "m", [1, pytest.param(64, marks=pytest.mark.gpu_full), 130] if torch.cuda.is_available() else [1, 65]
)
@pytest.mark.parametrize("coarse_target", interp_subset([1, pytest.param(2, marks=pytest.mark.gpu_full), 4], [1, 4]))
def test_fine_and_coarse_programs_give_the_same_bytes(device, monkeypatch, kind, m, coarse_target):
    """Two split levels (module doc): the same call run as one program per fine segment
    (the combine adding the partials in groups) and as one program per coarse segment
    (each adding its fine segments in registers) gives the same bytes, here and on the
    GPU; both within the exact product's bound. 8 chunks, 8 fine segments (group weights:
    3 tiles, 4) in 1, 2 or 4 coarse groups (group weights: 1, 1, 2)."""
    _levels(monkeypatch, 8, coarse_target)
    if m > TC.BM:
        assert m % TC.BM and m > TC._SUM_MAX_M, "row tiles past the first, the last ragged, the counter's sum"
    run, pairs = _two_level_call(device, kind, m, _gen("levels", kind, m, coarse_target))
    w = pairs[0][1]
    wsc = torch.zeros(1) if kind == "fp8" else None
    G, N = (3, 48) if kind == "group" else (1, 48)
    monkeypatch.setattr(TC, "_FINE_MAX_M", dict.fromkeys(("bf16", "fp32", "fp8"), 64))
    fine_plan = TC._weight_plan(w, N, 1024, G, wsc, False, 1, kind == "group")
    coarse_plan = TC._weight_plan(w, N, 1024, G, wsc, False, 10**6, kind == "group")
    assert fine_plan[:3] != coarse_plan[:3], "the two modes are one"
    fine_n = 4 if kind == "group" else 8
    outer = {1: 1, 2: 1, 4: 2}[coarse_target] if kind == "group" else coarse_target
    assert fine_plan[:3] == (fine_n, 1, fine_n // outer), fine_plan  # SEGS, NF, GRP
    assert coarse_plan[:3] == (outer, fine_n // outer, 1), coarse_plan
    monkeypatch.setattr(TC, "_FINE_MAX_M", dict.fromkeys(("bf16", "fp32", "fp8"), 10**9))
    fine = run()
    monkeypatch.setattr(TC, "_FINE_MAX_M", {})
    coarse = run()
    for i, (a, b) in enumerate(zip(fine, coarse)):
        assert not torch.isnan(a.float()).any(), f"{kind} m={m} output {i}: NaN"
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)), f"{kind} m={m} output {i}"
    if kind == "group":
        for k, (o, wk) in enumerate(pairs):
            _within(fine[0][:, k], o.cpu(), wk.cpu(), f"group {k}")
    elif kind != "fp32":  # bf16 rows (output 0 rotated: checked against the one-level call below)
        _within(fine[1], pairs[1][0].cpu(), pairs[1][1].cpu(), f"{kind} m={m} second weight")
        _within(fine[2], pairs[2][0].cpu(), pairs[2][1].cpu(), f"{kind} m={m} alone")
    monkeypatch.setattr(TC, "_FINE_PLAN", {})  # one level (the bits of a kind not listed)
    one = run()
    for i, (a, b) in enumerate(zip(fine, one)):
        x, wv = pairs[i if kind != "group" else 0]
        if kind == "group":
            for k, (o, wk) in enumerate(pairs):
                _same_row_bytes_or_bound(a[:, k], b[:, k], o, wk, f"group {k} vs one level")
        else:
            _same_row_bytes_or_bound(
                a, b, x, wv, f"{kind} m={m} output {i} vs one level", rotated=(i == 0 and kind == "bf16")
            )


def _two_levels(monkeypatch, device, kind) -> int:
    """`_levels` for a test that needs two split levels, not 8 chunks, and the K of its
    `_two_level_call`: 8 fine programs over 2 coarse, K = 1024 on the GPU; on the
    interpreter 4 over 2 and K = 512 (about half the programs), where the weight's 4
    chunks still split into fine segments summed in fewer groups (asserted)."""
    _levels(monkeypatch, 8 if device == "cuda" else 4, 2)
    K = 1024 if device == "cuda" else 512
    rows, key = (3 * 48, "group") if kind == "group" else (48, kind)
    fine, outer = TC.split_levels(rows, K, key)
    assert fine > outer, f"{kind}: one split level at K = {K} ({fine}, {outer})"
    return K


def _same_row_bytes_or_bound(a, b, x, w, where, rotated=False) -> None:
    """Two summation orders of the same products: within twice the fp32 summation-order
    bound of each other (`_same_row_bytes`' CPU rule), whatever the device."""
    _same_row_bytes(a, b, "cpu", where, x, w, rotated)


@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp8", "group"])
def test_rows_keep_their_one_token_bits_across_the_two_modes(device, monkeypatch, kind):
    """`_FINE_MAX_M` 64 for every dtype: calls of 1, 64 rows (fine programs) and 65, 130 rows
    (coarse programs): a row's bytes are the same in each (GPU; on the interpreter, within
    the summation-order bound: its matmul's order depends on a row's position)."""
    K = _two_levels(monkeypatch, device, kind)
    monkeypatch.setattr(TC, "_FINE_MAX_M", dict.fromkeys(("bf16", "fp32", "fp8"), 64))
    gen = _gen("levels-rows", kind)
    run, pairs = _two_level_call(device, kind, 130, gen, K)
    ref = run()
    # the same inputs, fewer rows: rebuild the calls on row subsets through the stored tensors
    x, wv = pairs[0]
    for m in (1, 64, 65):
        for lo in (0, 130 - m):
            rows = slice(lo, lo + m)
            if kind == "group":
                o = torch.stack([p[0] for p in pairs], dim=1)[rows].contiguous()
                Wg = torch.stack([p[1] for p in pairs])
                got = TC.tc_group_mm(o, Wg, torch.empty(m, 3, 48, dtype=BF, device=device))
                for k in range(3):
                    _same_row_bytes(got[:, k], ref[0][rows, k], device, f"group {k} rows {lo}..", o[:, k], pairs[k][1])
                continue
            out = torch.empty(m, 48, dtype=ref[2].dtype, device=device)
            sc = None
            if kind == "fp8":
                from attnv41.reference.fp8 import quant_weight

                q, sc = quant_weight(wv.float())  # the same exact values: e4m3 · e8m0 again
                got = TC.tc_mm(x[rows].contiguous(), q.to(device), out, sc.to(device))
            else:
                wd = wv.to(device) if kind != "fp32" else wv.to(device)
                got = TC.tc_mm(x[rows].contiguous(), wd, out)
            _same_row_bytes(got, ref[2][rows], device, f"{kind} rows {lo}..{lo + m - 1}", x[rows], wv)


def test_fp8_stored_group_weight_in_fine_programs_gives_the_bf16_coarse_bits(device, monkeypatch):
    """wo_a as FP8 bytes runs fine programs at m <= 64 (production `_FINE_MAX_M`), its bf16
    dequantization coarse ones at every m: the same two-level sums, so the same bytes (here
    3 tiles × 8 chunks: 4 fine segments in 2 groups)."""
    from attnv41.reference.fp8 import dequant_weight, quant_weight

    _levels(monkeypatch, 8, 4)
    assert TC._FINE_MAX_M == {"fp8": TC.BM}
    g = _gen("group-levels")
    m, G, gw, r = 5, 3, 1024, 64
    o = _rand(g, (m, G, gw)).to(device)
    q, sc = quant_weight(_rand(g, (G * r, gw)))
    deq = dequant_weight(q, sc).view(G, r, gw).to(device)
    q = q.view(G, r, gw).to(device)
    assert TC._weight_plan(q, r, gw, G, sc, False, m, True)[:3] == (4, 1, 2)
    assert TC._weight_plan(deq, r, gw, G, None, False, m, True)[:3] == (2, 2, 1)
    got = TC.tc_group_mm(o, q, torch.full((m, G, r), float("nan"), dtype=BF, device=device), sc.to(device))
    want = TC.tc_group_mm(o, deq, torch.full((m, G, r), float("nan"), dtype=BF, device=device))
    assert not torch.isnan(got.float()).any(), "NaN in the output"
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "FP8-stored wo_a vs its bf16: bits differ"


@pytest.mark.parametrize("kind", ["bf16", "fp32", "fp8", "group"])
@pytest.mark.parametrize("m", interp_subset([1, 5, 64, 130], [1, 5, 130]))
@pytest.mark.parametrize("fine_max_m", [0, 10**9], ids=["coarse", "fine"])
def test_sum_launch_gives_the_counter_bytes(device, monkeypatch, kind, m, fine_max_m):
    """`_SPLIT_FORM` "launch" (the partials added by `gemv._sum_kernel` /
    `gemv._group_sum_kernel` in a launch of their own) against the arrival counter: the
    same steps in the same order, so the same bytes, for every kind, through
    `mm_many_batch` (two weights, RoPE on the first), `tc_mm` and `tc_group_mm`, in fine
    programs (partials added in groups) and coarse ones, m of one to three row tiles and a
    sum launch's ragged last token block (m = 5); the launch form touches no counter. (The
    launch at every m here: production takes it up to `_SUM_MAX_M` rows.)"""
    K = _two_levels(monkeypatch, device, kind)
    monkeypatch.setattr(TC, "_SUM_MAX_M", 10**9)
    # the interpreter: 3 sum programs per weight tile, not 33 (m = 5 keeps blocks of 4)
    if device != "cuda" and m > TC.BM:
        monkeypatch.setattr(TC, "_SUM_MB", TC.BM)
        assert m % TC._sum_mb(m), "a ragged last token block"
    monkeypatch.setattr(TC, "_FINE_MAX_M", dict.fromkeys(("bf16", "fp32", "fp8"), fine_max_m))
    run, _ = _two_level_call(device, kind, m, _gen("sum-launch", kind, m), K)
    monkeypatch.setattr(TC, "_SPLIT_FORM", "counter")
    want = run()
    monkeypatch.setattr(TC, "_SPLIT_FORM", "launch")
    TC._counters.buffer(torch.device(device)).fill_(7)  # a launch that used a counter would leave it changed
    got = run()
    assert int((TC._counters.buffer(torch.device(device)) != 7).sum()) == 0, "the launch form touched a counter"
    TC._counters.buffer(torch.device(device)).zero_()
    for i, (a, b) in enumerate(zip(got, want)):
        assert not torch.isnan(a.float()).any(), f"{kind} m={m} output {i}: NaN (a tile not summed)"
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)), f"{kind} m={m} output {i}"


def test_split_form_is_checked(device, monkeypatch):
    """An unknown `_SPLIT_FORM` is refused before anything is launched, naming the value."""
    g = _gen("form")
    x, w = _rand(g, (3, 1024)).to(device), _rand(g, (64, 1024)).to(device)
    assert TC.plan(64, 1024) > 1
    out = torch.full((3, 64), float("nan"), dtype=BF, device=device)
    monkeypatch.setattr(TC, "_SPLIT_FORM", "atomic")
    with pytest.raises(ValueError, match="_SPLIT_FORM = 'atomic'; allowed"):
        TC.tc_mm(x, w, out)
    assert torch.isnan(out.float()).all()


def test_sum_launch_takes_calls_up_to_its_row_bound(device):
    """Production: a split call of at most `_SUM_MAX_M` rows runs the sum launch (no counter
    touched), a larger one the counter (its counters back at zero), with the same bytes for
    the rows they share."""
    g = _gen("sum-bound")
    K, N = 1024, 64
    x, w = _rand(g, (TC._SUM_MAX_M + 1, K)).to(device), _rand(g, (N, K)).to(device)
    assert TC.plan(N, K) > 1 and TC._SPLIT_FORM == "launch"
    buf = TC._counters.buffer(torch.device(device))
    buf.fill_(7)
    small = TC.tc_mm(x[:1].contiguous(), w, torch.empty(1, N, dtype=BF, device=device))
    assert int((buf != 7).sum()) == 0, "a call within the bound used a counter"
    buf.zero_()
    big = TC.tc_mm(x, w, torch.empty(x.shape[0], N, dtype=BF, device=device))
    assert int(buf.abs().sum()) == 0
    assert not torch.isnan(big.float()).any()
    if device == "cuda":  # the interpreter's matmul order depends on a row's position
        assert torch.equal(small.cpu().view(torch.int16), big[:1].cpu().view(torch.int16))
    else:
        _within(small, x[:1].cpu(), w.cpu(), "m = 1")
