"""kernels.sparse_attn against its twin reference.sparse_attn.sparse_attn (on the rows
cat(win[:offset], comp)), on CUDA when present, else on Triton's CPU interpreter.

Tolerance: the output is bf16. The kernel and the twin follow the same order (64-entry
blocks, bf16 probabilities, sink last), so they differ only by fp32 summation order (the
dot products, the row sums) and, on the GPU, by tl.exp's approximation; that can move a
bf16 probability or the bf16 output across one rounding boundary. |diff| ≤ 2^-8·max|ref|
+ 1e-6 allows that one bf16 rounding (half an ulp of |o| ≤ max|ref| is 2^-9·max|ref|, a
whole one 2^-8·max|ref|) and nothing more; the 1e-6 covers outputs that are all ~0
(a dominant sink).
"""

from __future__ import annotations

import math

import pytest
import torch

from attnv41.kernels.sparse_attn import BLOCK_K, sparse_attn, sparse_attn_torch
from attnv41.reference.sparse_attn import sparse_attn as sparse_attn_ref

REL = 2.0**-8
ABS = 1e-6


def _inputs(seed, m, H, D, K, Nw, offset, Nc, device, absent=0.3, sink_value=None):
    """Fresh seeded inputs; sel draws from [0, offset + Nc) with `absent` of its entries −1,
    row 0 entirely −1 and row 1 holding one present entry, in its last slot (m > 2, K > 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = (2 * torch.randn(m, H, D, generator=gen)).to(torch.bfloat16)
    win = torch.randn(Nw, D, generator=gen).to(torch.bfloat16)
    comp = torch.randn(Nc, D, generator=gen).to(torch.bfloat16)
    n_rows = offset + Nc
    sel = torch.randint(0, max(n_rows, 1), (m, K), generator=gen, dtype=torch.int32)
    sel[torch.rand(m, K, generator=gen) < absent] = -1
    if n_rows == 0:
        sel.fill_(-1)
    if m > 2 and K > 0:
        sel[0] = -1
        sel[1] = -1
        sel[1, -1] = n_rows - 1
    if sink_value is None:
        sink = 2 * torch.randn(H, generator=gen)
    else:
        sink = torch.full((H,), float(sink_value))
    return [x.to(device) for x in (q, win, comp, sel, sink)]


def _reference(q, win, comp, sel, offset, sink, scale):
    rows = torch.cat([win[:offset], comp])
    if rows.shape[0] == 0:
        rows = win.new_zeros(1, win.shape[1])  # every entry is −1; the twin still gathers row 0
    return sparse_attn_ref(q, rows, sel, sink, scale)


def _assert_close(name, got, ref):
    assert not torch.isnan(got.float()).any(), f"{name}: NaN in the kernel's output"
    assert not torch.isnan(ref.float()).any(), f"{name}: NaN in the reference"
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape, f"{name}: {got.dtype} {tuple(got.shape)}"
    err = (got.float() - ref.float()).abs()
    tol = REL * ref.float().abs().max().item() + ABS
    n_bad = int((err > tol).sum())
    assert n_bad == 0, f"{name}: max |diff| {err.max().item():.3g} > tol {tol:.3g} at {n_bad} elements"


def _bits(x):
    return x.view(torch.int16)


CASES = [
    # id, m, H, D, K, Nw, offset, Nc
    pytest.param(1, 2, 32, 1, 6, 6, 9, id="m1-H2-D32-K1"),
    pytest.param(7, 4, 64, 13, 10, 7, 20, id="m7-H4-D64-K13-offset<Nw"),
    pytest.param(13, 2, 32, 70, 16, 16, 40, id="m13-H2-D32-K70"),
    pytest.param(7, 4, 32, 130, 24, 20, 90, id="m7-H4-D32-K130"),
    pytest.param(13, 4, 64, 130, 40, 33, 0, id="m13-H4-D64-K130-Nc0"),
    pytest.param(7, 2, 64, 70, 5, 0, 50, id="m7-H2-D64-K70-comp-only"),
]


@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", CASES)
def test_matches_reference(device, m, H, D, K, Nw, offset, Nc):
    q, win, comp, sel, sink = _inputs(m * 1000 + K, m, H, D, K, Nw, offset, Nc, device)
    scale = D**-0.5
    got = sparse_attn(q, win, comp, sel, offset, sink, scale)
    ref = _reference(q, win, comp, sel, offset, sink, scale)
    _assert_close("o", got, ref)
    if m > 2:
        assert torch.equal(got[0], torch.zeros_like(got[0])), "o[0] (all −1): not exactly 0"


@pytest.mark.parametrize("sink_value", [30.0, -30.0], ids=["sink+30", "sink-30"])
def test_sink_extremes(device, sink_value):
    m, H, D, K, Nw, offset, Nc = 7, 4, 32, 70, 12, 9, 30
    q, win, comp, sel, sink = _inputs(11, m, H, D, K, Nw, offset, Nc, device, sink_value=sink_value)
    sink[::2] = -sink_value  # heads with the opposite extreme
    got = sparse_attn(q, win, comp, sel, offset, sink, D**-0.5)
    ref = _reference(q, win, comp, sel, offset, sink, D**-0.5)
    _assert_close(f"o (sink ±{abs(sink_value)})", got, ref)
    # Per head: a +30 sink drowns the keys (|o| ~ e^-25), a −30 sink vanishes.
    for h in range(H):
        _assert_close(f"o[:, {h}] (sink {sink[h].item()})", got[:, h], ref[:, h])


@pytest.mark.parametrize(
    "m, H, D, K",
    [
        pytest.param(7, 2, 32, 13, id="K13->77"),
        pytest.param(5, 4, 64, 64, id="K64->128"),
        pytest.param(13, 2, 32, 130, id="K130->194"),
    ],
)
def test_minus_one_padding_keeps_bits(device, m, H, D, K):
    q, win, comp, sel, sink = _inputs(7 + K, m, H, D, K, 10, 8, 70, device)
    got = sparse_attn(q, win, comp, sel, 8, sink, D**-0.5)
    pad = torch.full((m, BLOCK_K), -1, dtype=torch.int32, device=device)
    got_pad = sparse_attn(q, win, comp, torch.cat([sel, pad], 1), 8, sink, D**-0.5)
    n_diff = int((_bits(got) != _bits(got_pad)).sum())
    assert n_diff == 0, f"o: {n_diff} elements changed when sel gained {BLOCK_K} −1 entries"


@pytest.mark.parametrize("K", [0, 1, 70], ids=["K0", "K1", "K70"])
@pytest.mark.parametrize("sink_value", [30.0, -30.0], ids=["sink+30", "sink-30"])
def test_all_absent_is_zero(device, K, sink_value):
    m, H, D = 7, 4, 32
    q, win, comp, sel, sink = _inputs(3, m, H, D, K, 6, 6, 10, device, sink_value=sink_value)
    sel.fill_(-1)
    sel[:, ::3] = -7  # any negative entry is absent
    out = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn(q, win, comp, sel, 6, sink, D**-0.5, out=out)
    assert not torch.isnan(got.float()).any(), "o: NaN with every entry absent"
    assert torch.equal(got, torch.zeros_like(got)), f"o: max |o| {got.float().abs().max().item():.3g}, want exactly 0"


def test_out_in_place_and_strides(device):
    m, H, D, K, Nw, offset, Nc = 7, 4, 32, 70, 12, 10, 40
    q, win, comp, sel, sink = _inputs(5, m, H, D, K, Nw, offset, Nc, device)
    want = sparse_attn(q, win, comp, sel, offset, sink, D**-0.5)
    # Non-contiguous views of every operand, and out poisoned with NaN inside a wider buffer.
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)  # stride(2) = H
    win_w = torch.cat([win, win], 1)[:, :D]
    comp_w = torch.cat([comp, comp], 1)[:, D:]
    sel_w = torch.cat([sel, sel], 1)[:, :K]
    buf = torch.full((m, H, 2 * D), float("nan"), dtype=torch.bfloat16, device=device)
    out = buf[:, :, :D]
    got = sparse_attn(q_t, win_w, comp_w, sel_w, offset, sink, D**-0.5, out=out)
    assert got is out, "sparse_attn(out=...) must return out itself"
    assert torch.equal(_bits(got), _bits(want)), "o: strided operands changed the result"
    assert torch.isnan(buf[:, :, D:].float()).all(), "out: wrote outside its view"


@pytest.mark.parametrize(
    "sink_value, weight",
    [pytest.param(0.0, 0.5, id="sink0-half"), pytest.param(math.log(3.0), 0.25, id="sinkln3-quarter")],
)
def test_spec_check(device, sink_value, weight):
    """§7's check: one key with logit 0 and sink 0 → weight ½; sink ln 3 → weight ¼."""
    m, H, D = 2, 2, 32
    gen = torch.Generator().manual_seed(17)
    win = torch.randn(3, D, generator=gen).to(torch.bfloat16).to(device)
    q = torch.zeros(m, H, D, dtype=torch.bfloat16, device=device)
    sel = torch.tensor([[2, -1, -1], [-1, 0, -1]], dtype=torch.int32, device=device)
    sink = torch.full((H,), sink_value, device=device)
    got = sparse_attn(q, win, win[:0], sel, 3, sink, D**-0.5)
    want = torch.stack([win[2], win[0]])[:, None, :].expand(m, H, D) * weight
    assert torch.equal(got, want.to(torch.bfloat16)), f"o: max |diff| {(got.float() - want.float()).abs().max():.3g}"


@pytest.mark.parametrize(
    "m, H, D, K, Nw, offset, Nc",
    [
        pytest.param(7, 4, 32, 70, 12, 10, 40, id="both-sources"),
        pytest.param(7, 2, 32, 13, 9, 9, 0, id="Nc0"),
        pytest.param(3, 2, 32, 5, 0, 0, 0, id="no-rows"),
    ],
)
def test_torch_fallback(device, m, H, D, K, Nw, offset, Nc):
    q, win, comp, sel, sink = _inputs(23, m, H, D, K, Nw, offset, Nc, device)
    if Nc == 0:
        comp = torch.empty(0, D, dtype=torch.float32, device=device)  # any tensor with D columns
    out = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_torch(q, win, comp, sel, offset, sink, D**-0.5, out=out)
    assert got is out, "sparse_attn_torch(out=...) must return out itself"
    rows = torch.cat([win[:offset], comp.to(torch.bfloat16)])
    if rows.shape[0] > 0:
        assert torch.equal(got, sparse_attn_ref(q, rows, sel, sink, D**-0.5)), "o: fallback differs from the twin"
    else:
        assert torch.equal(got, torch.zeros_like(got)), "o: no rows, want exactly 0"
    _assert_close("o (kernel vs fallback)", sparse_attn(q, win, comp, sel, offset, sink, D**-0.5), got)


def _valid(device):
    q, win, comp, sel, sink = _inputs(1, 3, 2, 32, 5, 4, 4, 6, device)
    return dict(q=q, win=win, comp=comp, sel=sel, offset=4, sink=sink, scale=32**-0.5, out=None)


BAD = [
    pytest.param("q", lambda a: a["q"].float(), r"q\.dtype = torch\.float32; allowed: torch\.bfloat16", id="q-dtype"),
    pytest.param("q", lambda a: a["q"][0], r"q\.shape = \(2, 32\)", id="q-2d"),
    pytest.param(
        "q", lambda a: a["q"].new_zeros(3, 2, 513), r"q\.shape\[2\] \(D\) = 513; allowed: 1 ≤ D ≤ 512", id="q-D"
    ),
    pytest.param("win", lambda a: a["win"][:, :16], r"win\.shape = \(4, 16\); allowed: \[Nw, 32\]", id="win-D"),
    pytest.param("win", lambda a: a["win"].half(), r"win\.dtype = torch\.float16", id="win-dtype"),
    pytest.param("comp", lambda a: a["comp"].float(), r"comp\.dtype = torch\.float32", id="comp-dtype"),
    pytest.param("comp", lambda a: a["comp"][:, :8], r"comp\.shape = \(6, 8\)", id="comp-D"),
    pytest.param("sel", lambda a: a["sel"].long(), r"sel\.dtype = torch\.int64; allowed: torch\.int32", id="sel-dtype"),
    pytest.param("sel", lambda a: a["sel"][:2], r"sel\.shape = \(2, 5\); allowed: \[3, K\]", id="sel-m"),
    pytest.param("offset", lambda a: 5, r"offset = 5; allowed: .*0 ≤ offset ≤ Nw = 4", id="offset-big"),
    pytest.param("offset", lambda a: -1, r"offset = -1", id="offset-neg"),
    pytest.param("offset", lambda a: 2.0, r"offset = 2\.0; allowed: a python int", id="offset-float"),
    pytest.param("sink", lambda a: a["sink"][:1], r"sink\.shape = \(1,\); allowed: \[2\]", id="sink-H"),
    pytest.param("sink", lambda a: a["sink"].bfloat16(), r"sink\.dtype = torch\.bfloat16", id="sink-dtype"),
    pytest.param("scale", lambda a: float("nan"), r"scale = nan", id="scale-nan"),
    pytest.param("out", lambda a: a["q"].new_zeros(3, 2, 16), r"out\.shape = \(3, 2, 16\)", id="out-shape"),
    pytest.param("out", lambda a: a["q"].float(), r"out\.dtype = torch\.float32", id="out-dtype"),
]


@pytest.mark.parametrize("fn", [sparse_attn, sparse_attn_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("arg, bad, match", BAD)
def test_validation(device, fn, arg, bad, match):
    args = _valid(device)
    args[arg] = bad(args)
    with pytest.raises(ValueError, match=match):
        fn(**args)


@pytest.mark.parametrize("width", [16, 22, 64, 65, 129], ids=lambda w: f"14->{w}")
def test_torch_twin_padding_keeps_bytes(width):
    """The runtime's CPU op launches at a fixed width (window + index_topk) while the
    reference runs the natural width: a 14-entry selection padded with −1 must give the
    same bytes in both. These inputs (found by search) lost one bit at width 16 before
    the twin padded its last block to 64 entries (issue 10 item 18)."""
    gen = torch.Generator().manual_seed(117)
    m, H, D, w, offset = 8, 4, 32, 14, 10
    q = torch.randn(m, H, D, generator=gen).bfloat16()
    rows = torch.randn(30, D, generator=gen).bfloat16()
    sel = torch.randint(0, 30, (m, w), generator=gen).int()
    sink = torch.randn(H, generator=gen)
    win = torch.cat([rows[:offset], torch.full((6, D), float("nan"), dtype=torch.bfloat16)])  # past offset: unread
    comp = rows[offset:]
    natural = sparse_attn_ref(q, rows, sel, sink, D**-0.5)
    padded = torch.cat([sel, torch.full((m, width - w), -1, dtype=torch.int32)], dim=1)
    got = sparse_attn_torch(q, win, comp, padded, offset, sink, D**-0.5)
    n_diff = int((_bits(got) != _bits(natural)).sum())
    assert n_diff == 0, f"o: {n_diff} elements of the twin at width {width} differ from the reference at width {w}"
