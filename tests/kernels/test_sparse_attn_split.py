"""kernels.sparse_attn_split (the decode regime's flash-decoding order) against its twin
reference.sparse_attn.sparse_attn_split, and that twin against the fused order
(reference.sparse_attn.sparse_attn), on CUDA when present, else on the interpreter.

Tolerances: the kernel and its twin follow the same order (splits of SPLIT entries,
64-entry blocks, bf16 probabilities against the split's max, in-order combine), so they
differ by fp32 summation order and tl.exp only: one bf16 rounding of the output,
|diff| ≤ 2^-8·max|ref| + 1e-6 (as tests/kernels/test_sparse_attn.py argues). The split
and fused orders round the probabilities against different maxima: each can move a bf16
p by half an ulp in another direction, which moves o by at most 2^-9 of its scale on top
of the output's own rounding; 2^-7·max|ref| allows both roundings and nothing more.
"""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels.sparse_attn import BLOCK_K
from attnv41.kernels.sparse_attn_split import SPLIT, sparse_attn_split, sparse_attn_split_torch
from attnv41.reference.sparse_attn import sparse_attn_split as split_ref
from kernels.test_sparse_attn import BAD, _assert_close, _inputs, _reference, _valid


def _bits(x):
    return x.view(torch.int16)


def _split_reference(q, win, comp, sel, offset, sink, scale):
    rows = torch.cat([win[:offset], comp])
    if rows.shape[0] == 0:
        rows = win.new_zeros(1, win.shape[1])
    return split_ref(q, rows, sel, sink, scale, SPLIT)


CASES = [
    # id, m, H, D, K, Nw, offset, Nc
    pytest.param(1, 2, 32, 1, 6, 6, 9, id="m1-H2-D32-K1"),
    pytest.param(7, 4, 64, 13, 10, 7, 20, id="m7-H4-D64-K13"),
    pytest.param(3, 2, 32, 200, 16, 16, 90, id="m3-H2-D32-K200-4splits"),
    pytest.param(5, 4, 256, 130, 24, 20, 90, id="m5-H4-D256-K130-2slices"),
    pytest.param(3, 4, 48, 70, 40, 33, 0, id="m3-H4-D48-K70-Nc0"),
    pytest.param(3, 2, 64, 70, 5, 0, 50, id="m3-H2-D64-comp-only"),
]


@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", CASES)
def test_matches_split_twin(device, m, H, D, K, Nw, offset, Nc):
    q, win, comp, sel, sink = _inputs(m * 1000 + K + D, m, H, D, K, Nw, offset, Nc, device)
    scale = D**-0.5
    out = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=out)
    assert got is out, "sparse_attn_split(out=...) must return out itself"
    _assert_close("o (kernel vs split twin)", got, _split_reference(q, win, comp, sel, offset, sink, scale))
    if m > 2:
        assert torch.equal(got[0], torch.zeros_like(got[0])), "o[0] (all −1): not exactly 0"


@pytest.mark.parametrize("seed", range(4))
def test_split_twin_near_fused(seed):
    """The two orders (split, fused) agree within the two roundings the module docstring names."""
    m, H, D, K = 6, 4, 64, 300
    q, win, comp, sel, sink = _inputs(seed, m, H, D, K, 20, 16, 200, "cpu")
    a = _split_reference(q, win, comp, sel, 16, sink, D**-0.5)
    b = _reference(q, win, comp, sel, 16, sink, D**-0.5)
    err = (a.float() - b.float()).abs().max().item()
    tol = 2.0**-7 * b.float().abs().max().item() + 1e-6
    assert err <= tol, f"o: split vs fused order max |diff| {err:.3g} > {tol:.3g}"
    assert not torch.isnan(a.float()).any(), "o (split twin): NaN"


def test_token_bits_independent_of_m(device):
    """A token's bytes do not depend on the other tokens of the call (m = 1, 2, 7)."""
    q, win, comp, sel, sink = _inputs(41, 7, 4, 64, 200, 16, 12, 80, device)
    full = sparse_attn_split(q, win, comp, sel, 12, sink, 0.125)
    for m in (1, 2):
        for t0 in range(0, 7 - m + 1, 3):
            part = sparse_attn_split(q[t0 : t0 + m], win, comp, sel[t0 : t0 + m], 12, sink, 0.125)
            n = int((_bits(part) != _bits(full[t0 : t0 + m])).sum())
            assert n == 0, f"o: tokens {t0}..{t0 + m - 1} changed {n} elements at m = {m} vs m = 7"


@pytest.mark.parametrize("extra", [BLOCK_K, 3 * BLOCK_K + 5], ids=["+64", "+197"])
def test_minus_one_padding_keeps_bits(device, extra):
    q, win, comp, sel, sink = _inputs(9, 5, 2, 32, 130, 10, 8, 70, device)
    got = sparse_attn_split(q, win, comp, sel, 8, sink, 0.2)
    pad = torch.full((5, extra), -1, dtype=torch.int32, device=device)
    got_pad = sparse_attn_split(q, win, comp, torch.cat([sel, pad], 1), 8, sink, 0.2)
    n = int((_bits(got) != _bits(got_pad)).sum())
    assert n == 0, f"o: {n} elements changed when sel gained {extra} −1 entries"


@pytest.mark.parametrize("sink_value", [30.0, -30.0], ids=["sink+30", "sink-30"])
def test_all_absent_and_sink_extremes(device, sink_value):
    m, H, D, K = 5, 4, 32, 140
    q, win, comp, sel, sink = _inputs(3, m, H, D, K, 6, 6, 10, device, sink_value=sink_value)
    sink[::2] = -sink_value
    got = sparse_attn_split(q, win, comp, sel, 6, sink, D**-0.5)
    _assert_close("o (sink extremes)", got, _split_reference(q, win, comp, sel, 6, sink, D**-0.5))
    sel.fill_(-1)
    sel[:, ::3] = -7
    z = sparse_attn_split(q, win, comp, sel, 6, sink, D**-0.5)
    assert torch.equal(z, torch.zeros_like(z)), f"o: all absent, max |o| {z.float().abs().max().item():.3g}"


def test_many_heads_blocks(device):
    """H > 64: the heads are cut into blocks of 64 (one program per block and split)."""
    q, win, comp, sel, sink = _inputs(5, 2, 80, 16, 70, 8, 8, 30, device)
    got = sparse_attn_split(q, win, comp, sel, 8, sink, 0.25)
    _assert_close("o (H = 80)", got, _split_reference(q, win, comp, sel, 8, sink, 0.25))


def test_strided_operands(device):
    m, H, D, K, Nw, offset, Nc = 3, 4, 32, 70, 12, 10, 40
    q, win, comp, sel, sink = _inputs(5, m, H, D, K, Nw, offset, Nc, device)
    want = sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)
    win_w = torch.cat([win, win], 1)[:, :D]
    comp_w = torch.cat([comp, comp], 1)[:, D:]
    sel_w = torch.cat([sel, sel], 1)[:, :K]
    buf = torch.full((m, H, 2 * D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split(q_t, win_w, comp_w, sel_w, offset, sink, D**-0.5, out=buf[:, :, :D])
    assert torch.equal(_bits(got), _bits(want)), "o: strided operands changed the result"
    assert torch.isnan(buf[:, :, D:].float()).all(), "out: wrote outside its view"


def test_torch_twin(device):
    q, win, comp, sel, sink = _inputs(23, 3, 2, 32, 130, 9, 9, 40, device)
    out = torch.full((3, 2, 32), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split_torch(q, win, comp, sel, 9, sink, 0.3, out=out)
    assert got is out
    assert torch.equal(got, _split_reference(q, win, comp, sel, 9, sink, 0.3)), "twin differs from the reference"


@pytest.mark.parametrize("arg, bad, match", BAD)
def test_validation(device, arg, bad, match):
    args = _valid(device)
    args[arg] = bad(args)
    with pytest.raises(ValueError, match=match):
        sparse_attn_split(**args)


def test_split_reference_rejects_bad_split():
    q, win, comp, sel, sink = _inputs(1, 2, 2, 32, 5, 4, 4, 6, "cpu")
    with pytest.raises(ValueError, match=r"split = 100; allowed: a positive multiple of 64"):
        split_ref(q, win, sel, sink, 0.1, 100)


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param(dict(bps=2), id="chunked-bps2"),
        pytest.param(dict(bps=3, dk=16, pv_d=32), id="chunked-bps3-dk16"),
        pytest.param(dict(variant="whole", bps=2, pv_d=16), id="whole-bps2"),
    ],
)
def test_tuning_variants_match_their_twin(device, tune):
    """The tuning script's alternatives (other split sizes, chunk widths, the whole-row
    variant) compute the split order of their own split size."""
    m, H, D, K = 3, 4, 64, 200
    q, win, comp, sel, sink = _inputs(77, m, H, D, K, 16, 12, 90, device)
    got = sparse_attn_split(q, win, comp, sel, 12, sink, 0.125, **tune)
    rows = torch.cat([win[:12], comp])
    want = split_ref(q, rows, sel, sink, 0.125, tune["bps"] * BLOCK_K)
    _assert_close(f"o ({tune})", got, want)
