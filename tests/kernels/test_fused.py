"""`kernels.fused` against the chains it replaces: (a) the single-op Triton kernels, bit for
bit everywhere (outputs, cache rows, the non-finite counter); (b) the torch twins (on the
CPU, the contract), bit for bit wherever `rms_norm` and `rms_norm_torch` agree (they may
differ by one bf16 ulp by design, see kernels/norm.py): always on inputs whose sum of
squares is exact in any order, row by row on plain random inputs.

Non-finite values: the Triton qdq kernels and their torch twins already disagree on a block
holding a NaN (different NaN bits, and the torch twin turns the whole block to NaN where
the kernel quantizes the rest), so (b) compares such blocks' counters and NaN positions
only through (a): the fused kernel must do what the Triton chain does, NaN bits included.
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch

from attnv41.kernels import fused as F
from attnv41.kernels import norm, qdq, ring, rope
from attnv41.reference.rope import rope_freqs, rope_table

MAX_SEQ = 301
D, ROPE, DK = 512, 64, 128  # Flash geometry: head_dim, rope_dim, index_head_dim
WINDOW = 4  # small, so that positions wrap and m = 3 can exceed it
BF = torch.bfloat16

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on NaN inside the interpreter


def _tables(device, yarn: bool = False):
    freqs = rope_freqs(ROPE, 10000.0, (4.0, 64, 32.0, 1.0) if yarn else None)
    cos, sin = rope_table(MAX_SEQ, freqs)
    return cos.to(device), sin.to(device)


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _rows(gen, m: int, width: int, kind: str) -> torch.Tensor:
    """bf16 `[m, width]` inputs of a named kind."""
    if kind == "exact":  # small integers · 2^e: the sum of squares is exact in any order
        x = torch.randint(-15, 16, (m, width), generator=gen).float()
        return (x * torch.exp2(torch.randint(-12, 12, (m, 1), generator=gen).float())).to(BF)
    x = torch.randn(m, width, generator=gen) * torch.exp2(torch.randint(-10, 10, (m, 1), generator=gen).float())
    x = x.to(BF)
    if kind == "nonfinite":  # per row: inf in the lead, -inf in the rope tail, a NaN; the rest as is
        x[0, 3] = float("inf")
        if m > 1:
            x[1, width - 5] = float("-inf")
        if m > 2:
            x[2, 17] = float("nan")
    elif kind == "nan_even":  # a block whose even values are all NaN and odd ones finite
        x[0, 0:32:2] = float("nan")
    elif kind == "overflow":  # squares overflow: the norm gives zeros
        x[:, :4] = 3e38
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().view(torch.int16)


def assert_same_bytes(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, f"{name}: {got.dtype} {tuple(got.shape)}"
    diff = _bits(got) != _bits(ref)
    if diff.any():
        i = diff.nonzero()[0].tolist()
        pytest.fail(
            f"{name}: {int(diff.sum())} of {diff.numel()} values differ; first at {i}: "
            f"got {got.cpu()[tuple(i)].item()!r}, chain {ref.cpu()[tuple(i)].item()!r}"
        )


def assert_same_count(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.item() == ref.item(), f"{name}: non-finite counter {got.item()} vs the chain's {ref.item()}"


def _poisoned(shape, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=BF, device=device)


def _cache(gen, rows: int, width: int, device) -> torch.Tensor:
    """A cache holding random rows: slots not written must keep them."""
    return torch.randn(rows, width, generator=gen).to(BF).to(device)


def _counter(device) -> torch.Tensor:
    return torch.full((1,), 7, dtype=torch.int64, device=device)  # not zero: the chains add to it


def _norm_agrees(x, w, eps) -> torch.Tensor:
    """[m] bool: rows where Triton's rms_norm equals the torch twin (CPU) bit for bit."""
    t = norm.rms_norm(x, w, eps)
    c = norm.rms_norm_torch(x.cpu(), w.cpu(), eps)
    return (_bits(t) == _bits(c)).all(dim=1)


# ---------------------------------------------------------------------- kv_chain

# (m, positions): positions past the window wrap; m = 3 > window 2 drops the first row
KV_CASES = [
    pytest.param(1, [0], WINDOW, id="m1-p0"),
    pytest.param(1, [MAX_SEQ - 1], WINDOW, id="m1-plast-wrap"),
    pytest.param(3, [5, 6, 7], WINDOW, id="m3-wrap"),
    pytest.param(3, [9, 10, 11], 2, id="m3-over-window"),
]
KINDS = ["random", "exact", "nonfinite", "overflow"]


def _kv_triton_chain(x, w, eps, cos, sin, pos, kv, rg, cnt):
    m = x.shape[0]
    norm.rms_norm(x, w, eps, out=kv)
    rope.apply_rope(kv.view(m, 1, D), cos, sin, pos, out=kv.view(m, 1, D))
    qdq.fp8_qdq(kv, out=kv, nonfinite=cnt)
    ring.ring_write(rg, kv, pos)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m,positions,window", KV_CASES)
def test_kv_chain(m, positions, window, kind, device):
    gen = _gen("kv", m, positions, window, kind)
    x = _rows(gen, m, D, kind).to(device)
    w = (1 + 0.3 * torch.randn(D, generator=gen)).to(device)
    pos = torch.tensor(positions, dtype=torch.int32 if m == 1 else torch.int64, device=device)
    cos, sin = _tables(device)
    ring0 = _cache(gen, window, D, device)
    eps = 1e-6

    kv_a, rg_a, cnt_a = _poisoned((m, D), device), ring0.clone(), _counter(device)
    _kv_triton_chain(x, w, eps, cos, sin, pos, kv_a, rg_a, cnt_a)
    kv, rg, cnt = _poisoned((m, D), device), ring0.clone(), _counter(device)
    assert F.kv_chain(x, w, eps, cos, sin, pos, kv, rg, cnt) is kv
    assert_same_bytes("kv_out vs Triton chain", kv, kv_a)
    assert_same_bytes("ring vs Triton chain", rg, rg_a)
    assert_same_count("kv_chain", cnt, cnt_a)

    # (b) the torch chain, on the CPU
    cpu = [t.cpu() for t in (x, w, cos, sin, pos)]
    kv_b, rg_b, cnt_b = _poisoned((m, D), "cpu"), ring0.cpu(), _counter("cpu")
    F.kv_chain_torch(*cpu[:1], cpu[1], eps, *cpu[2:], kv_b, rg_b, cnt_b)
    assert_same_count("kv_chain vs torch chain", cnt, cnt_b)
    if kind == "nonfinite":
        return  # NaN blocks: the qdq twins differ (module docstring)
    agree = _norm_agrees(x, w, eps)
    if kind == "exact":
        assert agree.all(), "rms_norm and its twin differ on exactly summable rows"
    assert_same_bytes("kv_out vs torch chain", kv[agree.to(device)], kv_b[agree])
    slots = [p % window for i, p in enumerate(positions) if i >= m - min(m, window) and agree[i]]
    assert_same_bytes("ring vs torch chain", rg[slots], rg_b[slots])


def test_kv_chain_without_a_ring(device):
    """ring=None (the batched step writes its rings after attention): the same rows and
    count, no cache write, in both forms."""
    gen = _gen("kv-no-ring")
    x = _rows(gen, 5, D, "random").to(device)
    w = (1 + 0.3 * torch.randn(D, generator=gen)).to(device)
    pos = torch.tensor([7, 8, 9, 10, 11], device=device)
    cos, sin = _tables(device)
    kv_a, rg, cnt_a = _poisoned((5, D), device), _cache(gen, WINDOW, D, device), _counter(device)
    F.kv_chain(x, w, 1e-6, cos, sin, pos, kv_a, rg, cnt_a)
    kv, cnt = _poisoned((5, D), device), _counter(device)
    assert F.kv_chain(x, w, 1e-6, cos, sin, pos, kv, None, cnt) is kv
    assert_same_bytes("kv_out without a ring", kv, kv_a)
    assert_same_count("kv_chain without a ring", cnt, cnt_a)
    kv_t = _poisoned((5, D), "cpu")
    F.kv_chain_torch(x.cpu(), w.cpu(), 1e-6, cos.cpu(), sin.cpu(), pos.cpu(), kv_t, None, None)
    ref = _poisoned((5, D), "cpu")
    F.kv_chain_torch(x.cpu(), w.cpu(), 1e-6, cos.cpu(), sin.cpu(), pos.cpu(), ref, rg.cpu().clone(), None)
    assert_same_bytes("torch kv_out without a ring", kv_t, ref)


def test_kv_chain_in_place(device):
    """kv_out may be kv_pre itself."""
    gen = _gen("kv-in-place")
    x = _rows(gen, 3, D, "random").to(device)
    w = torch.randn(D, generator=gen).to(BF).to(device)  # bf16 weights too
    pos = torch.tensor([3, 4, 5], device=device)
    cos, sin = _tables(device, yarn=True)
    ring0 = _cache(gen, WINDOW, D, device)
    kv_a, rg_a = _poisoned((3, D), device), ring0.clone()
    _kv_triton_chain(x, w, 1e-20, cos, sin, pos, kv_a, rg_a, None)
    y, rg = x.clone(), ring0.clone()
    F.kv_chain(y, w, 1e-20, cos, sin, pos, y, rg)
    assert_same_bytes("kv in place", y, kv_a)
    assert_same_bytes("ring in place", rg, rg_a)


def test_zero_tokens(device):
    cos, sin = _tables(device)
    rg = torch.zeros(WINDOW, D, dtype=BF, device=device)
    cnt = _counter(device)
    empty = torch.empty(0, D, dtype=BF, device=device)
    F.kv_chain(
        empty, torch.ones(D, device=device), 1e-6, cos, sin, empty.new_zeros(0, dtype=torch.int64), empty, rg, cnt
    )
    assert not rg.any() and cnt.item() == 7


# ---------------------------------------------------------------------- compressed rows and index keys

ROW_CASES = [
    pytest.param(1, [40], [10], 16, id="m1"),
    pytest.param(3, [4, 8, 12], [1, 2, 3], 16, id="m3"),
    pytest.param(3, [96, 100, 104], [24, 25, 26], 2, id="m3-over-cache"),  # slot = row % rows
]


@pytest.mark.parametrize("kind", ["random", "exact", "nonfinite"])
@pytest.mark.parametrize("m,row_pos,rows,n_cache", ROW_CASES)
def test_compress_kv_chain(m, row_pos, rows, n_cache, kind, device):
    gen = _gen("ckv", m, row_pos, kind)
    x = _rows(gen, m, D, kind).to(device)
    w = (1 + 0.3 * torch.randn(D, generator=gen)).to(device)
    rp = torch.tensor(row_pos, dtype=torch.int32, device=device)
    row = torch.tensor(rows, dtype=torch.int32, device=device)
    cos, sin = _tables(device, yarn=True)
    cache0 = _cache(gen, n_cache, D, device)
    eps = 1e-6

    lat_a, ck_a, cnt_a = _poisoned((m, D), device), cache0.clone(), _counter(device)
    norm.rms_norm(x, w, eps, out=lat_a)
    staged = qdq.fp4_e4m3_qdq(rope.apply_rope(lat_a.view(m, 1, D), cos, sin, rp).view(m, D), nonfinite=cnt_a)
    ring.ring_write(ck_a, staged, row)
    lat, ck, cnt = _poisoned((m, D), device), cache0.clone(), _counter(device)
    assert F.compress_kv_chain(x, w, eps, cos, sin, rp, row, lat, ck, cnt) is lat
    assert_same_bytes("latent vs Triton chain", lat, lat_a)
    assert_same_bytes("compress_kv vs Triton chain", ck, ck_a)
    assert_same_count("compress_kv_chain", cnt, cnt_a)

    cpu = [t.cpu() for t in (x, w, cos, sin, rp, row)]
    lat_b, ck_b, cnt_b = _poisoned((m, D), "cpu"), cache0.cpu(), _counter("cpu")
    F.compress_kv_chain_torch(cpu[0], cpu[1], eps, *cpu[2:], lat_b, ck_b, cnt_b)
    assert_same_count("compress_kv_chain vs torch chain", cnt, cnt_b)
    if kind == "nonfinite":
        return
    agree = _norm_agrees(x, w, eps)
    if kind == "exact":
        assert agree.all(), "rms_norm and its twin differ on exactly summable rows"
    assert_same_bytes("latent vs torch chain", lat[agree.to(device)], lat_b[agree])
    slots = [r % n_cache for i, r in enumerate(rows) if i >= m - min(m, n_cache) and agree[i]]
    assert_same_bytes("compress_kv vs torch chain", ck[slots], ck_b[slots])


@pytest.mark.parametrize("kind", ["random", "exact", "nonfinite"])
@pytest.mark.parametrize("m,row_pos,rows,n_cache", ROW_CASES)
def test_index_k_chain(m, row_pos, rows, n_cache, kind, device):
    gen = _gen("ik", m, row_pos, kind)
    kp = _rows(gen, m, DK, kind).to(device)
    w = (1 + 0.3 * torch.randn(DK, generator=gen)).to(BF).to(device)
    rp = torch.tensor(row_pos, dtype=torch.int64, device=device)
    row = torch.tensor(rows, dtype=torch.int64, device=device)
    cos, sin = _tables(device, yarn=True)
    cache0 = _cache(gen, n_cache, DK, device)
    eps = 1e-6

    ik_a, cnt_a = cache0.clone(), _counter(device)
    kr = norm.rms_norm(kp, w, eps)
    rope.apply_rope(kr.view(m, 1, DK), cos, sin, rp, out=kr.view(m, 1, DK))
    ring.ring_write(ik_a, qdq.fp4_e8m0_qdq(kr, nonfinite=cnt_a), row)
    ik, cnt = cache0.clone(), _counter(device)
    assert F.index_k_chain(kp, w, eps, cos, sin, rp, row, ik, cnt) is ik
    assert_same_bytes("index_k vs Triton chain", ik, ik_a)
    assert_same_count("index_k_chain", cnt, cnt_a)

    cpu = [t.cpu() for t in (kp, w, cos, sin, rp, row)]
    ik_b, cnt_b = cache0.cpu(), _counter("cpu")
    F.index_k_chain_torch(cpu[0], cpu[1], eps, *cpu[2:], ik_b, cnt_b)
    assert_same_count("index_k_chain vs torch chain", cnt, cnt_b)
    if kind == "nonfinite":
        return
    agree = _norm_agrees(kp, w, eps)
    if kind == "exact":
        assert agree.all(), "rms_norm and its twin differ on exactly summable rows"
    slots = [r % n_cache for i, r in enumerate(rows) if i >= m - min(m, n_cache) and agree[i]]
    assert_same_bytes("index_k vs torch chain", ik[slots], ik_b[slots])


# ---------------------------------------------------------------------- index queries

HEADS = 3  # the interpreter runs one program per (token, head): few heads keep it quick


@pytest.mark.parametrize("kind", ["random", "nonfinite", "nan_even"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "out"])
@pytest.mark.parametrize(
    "m,positions", [pytest.param(1, [MAX_SEQ - 1], id="m1"), pytest.param(3, [0, 7, 200], id="m3")]
)
def test_index_q_chain(m, positions, in_place, kind, device):
    gen = _gen("iq", m, positions, in_place, kind)
    iq = _rows(gen, m * HEADS, DK, kind).view(m, HEADS, DK).to(device)
    pos = torch.tensor(positions, device=device)
    cos, sin = _tables(device)

    a = iq.clone()
    rope.apply_rope(a, cos, sin, pos, out=a)
    cnt_a = _counter(device)
    qdq.fp4_e8m0_qdq(a.view(m * HEADS, DK), out=a.view(m * HEADS, DK), nonfinite=cnt_a)
    src = iq.clone()
    out = src if in_place else _poisoned(iq.shape, device)
    cnt = _counter(device)
    assert F.index_q_chain(src, cos, sin, pos, out, cnt) is out
    assert_same_bytes("iq vs Triton chain", out, a)
    assert_same_count("index_q_chain", cnt, cnt_a)
    if not in_place:
        assert_same_bytes("iq input untouched", src, iq)

    b = iq.cpu()
    cnt_b = _counter("cpu")
    F.index_q_chain_torch(b, cos.cpu(), sin.cpu(), pos.cpu(), b, cnt_b)
    assert_same_count("index_q_chain vs torch chain", cnt, cnt_b)
    if kind == "random":  # no norm: bit for bit with the torch chain
        assert_same_bytes("iq vs torch chain", out, b)


# Flash's head-weight scale (a power of two) and one that rounds in fp32 and in bf16
HW_SCALES = [128**-0.5 * 32**-0.5, 128**-0.5 * 3**-0.5]


@pytest.mark.parametrize("scale", HW_SCALES, ids=["flash", "inexact"])
@pytest.mark.parametrize("kind", ["random", "nonfinite"])
def test_index_q_chain_scales_head_weights(kind, scale, device):
    """`hw=`: the head weights scaled in place in the chain's launch, bit for bit as
    `hw.mul_(scale)` on CPU bf16 (and the queries as without it); the torch twin the same."""
    m = 3
    gen = _gen("iq hw", kind, scale)
    iq = _rows(gen, m * HEADS, DK, "random").view(m, HEADS, DK).to(device)
    hw = _rows(gen, m, HEADS, "random")
    if kind == "nonfinite":
        hw[0, 1], hw[1, 0], hw[2, 1] = float("inf"), float("-inf"), float("nan")
    hw[0, 0] = 3e38  # overflows to inf when scaled up, rounds when scaled down
    hw[1, 1] = 1e-40  # a bf16 subnormal
    hw[2, 2] = float("nan")
    pos = torch.tensor([0, 7, 200], device=device)
    cos, sin = _tables(device)
    want_q = F.index_q_chain_torch(iq.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), iq.cpu().clone())
    want_hw = hw.clone().mul_(scale)
    for big in (False, True):
        s = scale * 2.0**100 if big else scale
        if big:
            want_hw = hw.clone().mul_(s)
        got_hw, got_q = hw.clone().to(device), iq.clone()
        assert F.index_q_chain(got_q, cos, sin, pos, got_q, hw=got_hw, hw_scale=s) is got_q
        assert_same_bytes("hw scaled in the chain vs hw.mul_", got_hw, want_hw)
        if not big:
            assert_same_bytes("iq beside hw", got_q, want_q.to(device))
        twin = hw.clone()
        F.index_q_chain_torch(iq.cpu(), cos.cpu(), sin.cpu(), pos.cpu(), iq.cpu().clone(), hw=twin, hw_scale=s)
        assert_same_bytes("hw by the torch twin vs hw.mul_", twin, want_hw)


# ---------------------------------------------------------------------- bad arguments


def _kv_args(device):
    gen = _gen("bad")
    cos, sin = _tables(device)
    return dict(
        kv_pre=_rows(gen, 2, D, "random").to(device),
        norm_w=torch.ones(D, device=device),
        eps=1e-6,
        cos=cos,
        sin=sin,
        pos=torch.tensor([1, 2], device=device),
        kv_out=torch.zeros(2, D, dtype=BF, device=device),
        ring=torch.zeros(WINDOW, D, dtype=BF, device=device),
        nonfinite=torch.zeros(1, dtype=torch.int64, device=device),
    )


KV_BAD = [
    ("kv_pre", lambda a: a["kv_pre"].float(), "kv_pre.dtype"),
    ("kv_pre", lambda a: a["kv_pre"][0], "kv_pre.dim()"),
    ("kv_pre", lambda a: a["kv_pre"][:, :500], "kv_pre.shape[1]"),
    ("kv_pre", lambda a: torch.zeros(2, 8192, dtype=BF), "kv_pre.shape[1]"),
    ("kv_pre", lambda a: a["kv_pre"].repeat(1, 2)[:, ::2], "kv_pre.stride(-1)"),
    ("norm_w", lambda a: a["norm_w"][:-32], "norm_w.shape"),
    ("norm_w", lambda a: a["norm_w"].long(), "norm_w.dtype"),
    ("eps", lambda a: float("nan"), "eps"),
    ("eps", lambda a: -1e-6, "eps"),
    ("eps", lambda a: True, "eps"),
    ("cos", lambda a: a["cos"].double(), "cos.dtype"),
    ("sin", lambda a: a["sin"][:, :-1], "sin.shape"),
    ("cos", lambda a: torch.zeros(MAX_SEQ, D, device=a["cos"].device), "sin.shape"),
    ("pos", lambda a: a["pos"].float(), "pos.dtype"),
    ("pos", lambda a: a["pos"][:1], "pos.shape"),
    ("kv_out", lambda a: a["kv_out"][:1], "kv_out.shape"),
    ("kv_out", lambda a: a["kv_out"].float(), "kv_out.dtype"),
    ("ring", lambda a: a["ring"][:, :256], "ring.shape"),
    ("ring", lambda a: a["ring"][:0], "ring.shape"),
    ("ring", lambda a: a["ring"].float(), "ring.dtype"),
    ("nonfinite", lambda a: a["nonfinite"].int(), "nonfinite"),
    ("nonfinite", lambda a: torch.zeros(2, dtype=torch.int64), "nonfinite"),
]


@pytest.mark.parametrize("fn", [F.kv_chain, F.kv_chain_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("name,bad,msg", [pytest.param(*c, id=f"{c[0]}-{i}") for i, c in enumerate(KV_BAD)])
def test_kv_chain_rejects(fn, name, bad, msg, device):
    a = _kv_args(device)
    a[name] = bad(a)
    before = {k: v.clone() for k, v in a.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=re.escape(msg)):
        fn(**a)
    for k, v in before.items():  # checked before anything is written (every value here is finite)
        assert torch.equal(a[k], v), f"{k} was written before the check failed"


def test_cos_wider_than_row_rejected(device):
    a = _kv_args(device)
    wide = torch.zeros(MAX_SEQ, D, device=device)
    a["cos"], a["sin"] = wide, wide.clone()
    with pytest.raises(ValueError, match="rope_dim"):
        F.kv_chain(**a)


def test_other_chains_reject(device):
    cos, sin = _tables(device)
    i32 = dict(dtype=torch.int32, device=device)
    x = torch.zeros(2, D, dtype=BF, device=device)
    w = torch.ones(D, device=device)
    ck = torch.zeros(8, D, dtype=BF, device=device)
    rp, row = torch.zeros(2, **i32), torch.zeros(2, **i32)
    with pytest.raises(ValueError, match="row.shape"):
        F.compress_kv_chain(x, w, 1e-6, cos, sin, rp, row[:1], x.clone(), ck)
    with pytest.raises(ValueError, match="latent.dtype"):
        F.compress_kv_chain(x, w, 1e-6, cos, sin, rp, row, x.float(), ck)
    with pytest.raises(ValueError, match="compress_kv.shape"):
        F.compress_kv_chain_torch(x, w, 1e-6, cos, sin, rp, row, x.clone(), ck[:, :16])
    with pytest.raises(ValueError, match="row_pos.dtype"):
        F.index_k_chain(x[:, :DK], w[:DK], 1e-6, cos, sin, rp.float(), row, ck[:, :DK])
    with pytest.raises(ValueError, match="index_k.shape"):
        F.index_k_chain(x[:, :DK], w[:DK], 1e-6, cos, sin, rp, row, ck)
    iq = torch.zeros(2, 3, DK, dtype=BF, device=device)
    with pytest.raises(ValueError, match="iq.dim"):
        F.index_q_chain(iq[0], cos, sin, rp, iq[0])
    with pytest.raises(ValueError, match="iq.shape"):
        F.index_q_chain(iq[..., :48], cos, sin, rp, iq[..., :48])
    with pytest.raises(ValueError, match="out.shape"):
        F.index_q_chain_torch(iq, cos, sin, rp, iq[:1])
    hw = torch.ones(2, 3, dtype=BF, device=device)
    with pytest.raises(ValueError, match=re.escape("hw.shape = (2, 2)")):
        F.index_q_chain(iq, cos, sin, rp, iq, hw=hw[:, :2])
    with pytest.raises(ValueError, match="hw.dtype"):
        F.index_q_chain_torch(iq, cos, sin, rp, iq, hw=hw.float())
    for bad in (float("nan"), float("inf"), True, "0.5"):
        with pytest.raises(ValueError, match="hw_scale = "):
            F.index_q_chain(iq, cos, sin, rp, iq, hw=hw, hw_scale=bad)
    assert (hw == 1).all()  # refused calls wrote nothing
