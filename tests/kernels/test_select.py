"""`kernels.select.topk_fixed` / `candidate_mask_fixed` against the reference's
`topk_select` / `candidate_mask` (reference/indexer.py), compared exactly (torch.equal).

Hostile scores: heavy ties (a handful of values), +0/−0 mixes, −∞ holes inside the
visible range, NaN of both signs and several payloads, visible = 0 and visible = Lb.
Also the bucket independence the captured decode step relies on: run at a bucket width
Lb over scores that are −∞ past the visible rows, the result restricted to L columns is
the reference's on scores[:, :L] (padded with −1 for the top-k)."""

import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.kernels.select import (
    candidate_blocks,
    candidate_mask_fixed,
    candidate_mask_of_blocks,
    score_order_key,
    topk_fixed,
)
from attnv41.reference import indexer as ref

MODES = ["randn", "ties", "signed_zeros", "neg_inf_holes", "nan", "all_neg_inf"]
# bf16 bit patterns of NaNs: positive and negative sign, quiet and signalling payloads
NAN_BITS = [0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF]


def _scores(gen: torch.Generator, m: int, Lb: int, mode: str) -> torch.Tensor:
    """bf16 [m, Lb] scores of one hostile kind (no −∞ masking past visible: callers add it)."""
    if mode == "randn":
        return torch.randn(m, Lb, generator=gen).bfloat16()
    if mode == "all_neg_inf":
        return torch.full((m, Lb), float("-inf")).bfloat16()
    pool = {
        "ties": [-2.0, -1.0, 0.5, 1.0, 3.0],
        "signed_zeros": [0.0, -0.0, 1.0, -1.0],
        "neg_inf_holes": [float("-inf"), 0.0, -0.0, 1.0, 2.0, float("inf")],
        "nan": [0.0, -0.0, 1.0, float("-inf"), float("inf")],
    }[mode]
    vals = torch.tensor(pool).bfloat16()
    s = vals[torch.randint(0, len(pool), (m, Lb), generator=gen)]
    if mode == "nan":
        nan = torch.tensor(NAN_BITS, dtype=torch.int32).to(torch.int16)  # wraps to the bit patterns
        where = torch.rand(m, Lb, generator=gen) < 0.15
        pick = nan[torch.randint(0, len(NAN_BITS), (m, Lb), generator=gen)]
        s = torch.where(where, pick, s.view(torch.int16)).view(torch.bfloat16)
    return s


def _visible(gen: torch.Generator, m: int, hi: int, dtype: torch.dtype) -> torch.Tensor:
    """visible in 0..hi, with 0 and hi forced into the first rows when there are several."""
    vis = torch.randint(0, hi + 1, (m,), generator=gen)
    if m >= 2:
        vis[0], vis[1] = 0, hi
    elif m == 1 and torch.rand((), generator=gen) < 0.5:
        vis[0] = hi
    return vis.to(dtype)


def _mask_past_visible(scores: torch.Tensor, vis: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(scores.shape[1])[None, :]
    return scores.masked_fill(cols >= vis[:, None], float("-inf"))


def _random_case(seed: int, m: int, L: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The hypothesis tests' inputs: scores of `mode` and int64 visible counts, the scores
    masked past the visible count in half the cases."""
    gen = torch.Generator().manual_seed(seed)
    scores = _scores(gen, m, L, mode)
    vis = _visible(gen, m, L, torch.int64)
    if torch.rand((), generator=gen) < 0.5:
        scores = _mask_past_visible(scores, vis)
    return scores, vis


def _equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{name}: {got.dtype} {tuple(got.shape)} vs reference {want.dtype} {tuple(want.shape)}"
    )
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:5].tolist()
        raise AssertionError(f"{name}: {int((got != want).sum())} entries differ from the reference, first at {bad}")


def _run_topk(scores, vis, k, offset, device):
    out = torch.full((scores.shape[0], k), -7, dtype=torch.int32, device=device)  # poison: every entry is written
    res = topk_fixed(scores.to(device), vis.to(device), k, offset, out)
    assert res is out
    return out.cpu()


def _run_mask(scores, vis, blocks, bs, device):
    out = torch.ones(scores.shape, dtype=torch.bool, device=device)  # poison: every entry is written
    res = candidate_mask_fixed(scores.to(device), vis.to(device), blocks, bs, out)
    assert res is out
    return out.cpu()


# ---------------------------------------------------------------- the score order key


def test_order_key_matches_torch_sort_on_every_bf16():
    """All 65536 bf16 bit patterns: along torch's stable descending sort the keys never
    increase, and two neighbours share a key exactly when the sort ties them (±0, NaNs)."""
    vals = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    order = torch.sort(vals.float(), descending=True, stable=True)
    keys = score_order_key(vals)[order.indices]
    assert bool((keys[1:] <= keys[:-1]).all()), "order key: not monotone along torch.sort"
    a, b = order.values[:-1], order.values[1:]
    tie = (a == b) | (a.isnan() & b.isnan())
    _equal("order key ties", keys[1:] == keys[:-1], tie)
    assert int(keys.max()) == 0xFFC0 and int(keys.min()) == 0x7F, "order key: NaN / −∞ keys"


# ---------------------------------------------------------------- topk_fixed


TOPK_CASES = [  # (m, Lb, k): k below, at and above the visible counts drawn in 0..Lb
    pytest.param(1, 1, 1, id="m1-Lb1-k1"),
    pytest.param(1, 7, 3, id="m1-Lb7-k3"),
    pytest.param(2, 13, 13, id="m2-Lb13-k=Lb"),
    pytest.param(3, 64, 5, id="m3-Lb64-k5"),
    pytest.param(4, 301, 128, id="m4-Lb301-k128"),
    pytest.param(4, 3000, 512, id="m4-Lb3000-k512"),
    pytest.param(2, 2049, 2048, id="m2-Lb2049-k2048"),
]


@pytest.mark.parametrize("m,Lb,k", TOPK_CASES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("vis_dtype", [torch.int32, torch.int64], ids=["vis32", "vis64"])
def test_topk_fixed_matches_reference(device, m, Lb, k, mode, vis_dtype):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{m},{Lb},{k},{mode}".encode()))
    scores = _scores(gen, m, Lb, mode)
    vis = _visible(gen, m, Lb, vis_dtype)
    for name, s in (("unmasked", scores), ("masked", _mask_past_visible(scores, vis))):
        _equal(f"topk {name}", _run_topk(s, vis, k, 11, device), ref.topk_select(s, vis, k, 11))


def test_topk_fixed_tail_is_minus_one_when_visible_below_k(device):
    """visible < k: all visible positions ascending, then −1 (the lowest −∞ entries fill it)."""
    scores = torch.tensor([[3.0, -0.0, 0.0, 5.0, float("-inf"), 1.0, 2.0, 2.0]]).bfloat16()
    got = _run_topk(_mask_past_visible(scores, torch.tensor([3])), torch.tensor([3]), 6, 100, device)
    assert got.tolist() == [[100, 101, 102, -1, -1, -1]], f"topk: {got.tolist()}"


def test_topk_fixed_ties_take_lower_positions(device):
    """−0 and +0 tie, NaNs of both signs tie above +∞; the lower position wins each tie."""
    bits = torch.tensor([[0x0000, 0x8000, 0x0000, 0xFFC0, 0x7F80, 0x7FC1, 0x3F80, 0x8000]], dtype=torch.int32)
    scores = bits.to(torch.int16).view(torch.bfloat16)  # +0 −0 +0 −NaN +∞ NaN 1 −0
    vis = torch.tensor([8])
    got = _run_topk(scores, vis, 5, 0, device)
    assert got.tolist() == [[0, 3, 4, 5, 6]], f"topk: {got.tolist()}"
    _equal("topk ties", got, ref.topk_select(scores, vis, 5, 0))


def test_topk_fixed_writes_a_row_strided_view(device):
    """out may be a column slice of a wider buffer: only that slice is written."""
    gen = torch.Generator().manual_seed(5)
    scores, vis = _scores(gen, 3, 50, "ties"), torch.tensor([50, 17, 0])
    buf = torch.full((3, 40), -9, dtype=torch.int32, device=device)
    view = buf[:, 8:28]
    assert topk_fixed(scores.to(device), vis.to(device), 20, 4, view) is view
    _equal("topk in the view", view.cpu(), ref.topk_select(scores, vis, 20, 4))
    rest = torch.cat([buf[:, :8], buf[:, 28:]], dim=1).cpu()
    assert bool((rest == -9).all()), "topk: wrote outside its view"


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    Lb=st.one_of(st.integers(1, 40), st.integers(1, 3000)),
    k_frac=st.floats(0.0, 1.0),
    offset=st.integers(0, 5000),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_fixed_matches_reference_hypothesis(m, Lb, k_frac, offset, mode, seed):
    k = max(1, round(k_frac * Lb))
    scores, vis = _random_case(seed, m, Lb, mode)
    _equal("topk", _run_topk(scores, vis, k, offset, "cpu"), ref.topk_select(scores, vis, k, offset))


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    L=st.one_of(st.integers(1, 40), st.integers(1, 3000)),
    blocks=st.integers(1, 40),
    bs=st.one_of(st.integers(1, 8), st.integers(1, 300)),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_candidate_blocks_expand_to_the_reference_mask(m, L, blocks, bs, mode, seed):
    """The compact form (kept block ids, a prefill tiled over tokens keeps it) expands to the
    reference mask bit for bit, NaN blocks and −∞ blocks (not kept) included."""
    scores, vis = _random_case(seed, m, L, mode)
    n_blocks = -(-L // bs)
    ids = torch.full((m, min(blocks, n_blocks)), -7, dtype=torch.int32)
    assert candidate_blocks(scores, vis, blocks, bs, out=ids) is ids
    assert ((ids >= 0) & (ids <= n_blocks)).all(), ids
    _equal("mask of blocks", candidate_mask_of_blocks(ids, L, bs), ref.candidate_mask(scores, vis, blocks, bs))
    with pytest.raises(ValueError, match="allowed: int32"):
        candidate_blocks(scores, vis, blocks, bs, out=ids[:, :0])


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    Lb=st.one_of(st.integers(1, 40), st.integers(1, 3000)),
    L_frac=st.floats(0.0, 1.0),
    k_frac=st.floats(0.0, 1.0),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_fixed_is_bucket_independent(m, Lb, L_frac, k_frac, mode, seed):
    """Over [m, Lb] with −∞ past visible ≤ L: equals the reference on scores[:, :L] with
    k_ref = min(k, L), padded with −1 to k (k ranges over 1..Lb, so below, at and above L)."""
    gen = torch.Generator().manual_seed(seed)
    L = max(1, round(L_frac * Lb))
    k = max(1, round(k_frac * Lb))
    vis = _visible(gen, m, L, torch.int32)
    scores = _mask_past_visible(_scores(gen, m, Lb, mode), vis)
    want = torch.full((m, k), -1, dtype=torch.int32)
    want[:, : min(k, L)] = ref.topk_select(scores[:, :L], vis, min(k, L), 9)
    _equal("topk bucket", _run_topk(scores, vis, k, 9, "cpu"), want)


# ---------------------------------------------------------------- candidate_mask_fixed


MASK_CASES = [  # (m, Lb, cand_blocks, cand_block)
    pytest.param(1, 1, 1, 1, id="m1-Lb1-b1x1"),
    pytest.param(1, 10, 1, 4, id="m1-Lb10-b1x4"),
    pytest.param(2, 13, 3, 4, id="m2-Lb13-b3x4-partial"),
    pytest.param(3, 64, 100, 8, id="m3-Lb64-b100x8-all"),
    pytest.param(4, 301, 5, 7, id="m4-Lb301-b5x7"),
    pytest.param(4, 3000, 16, 64, id="m4-Lb3000-b16x64"),
    pytest.param(2, 2048, 7, 128, id="m2-Lb2048-b7x128-exact"),
]


@pytest.mark.parametrize("m,Lb,blocks,bs", MASK_CASES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("vis_dtype", [torch.int32, torch.int64], ids=["vis32", "vis64"])
def test_candidate_mask_fixed_matches_reference(device, m, Lb, blocks, bs, mode, vis_dtype):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{m},{Lb},{blocks},{bs},{mode}".encode()))
    scores = _scores(gen, m, Lb, mode)
    vis = _visible(gen, m, Lb, vis_dtype)
    for name, s in (("unmasked", scores), ("masked", _mask_past_visible(scores, vis))):
        _equal(f"mask {name}", _run_mask(s, vis, blocks, bs, device), ref.candidate_mask(s, vis, blocks, bs))


def test_candidate_mask_fixed_nan_block_takes_a_place_unkept(device):
    """As the reference: a NaN block sorts above the pinned +∞ block, takes the one place
    and is not kept (NaN > −∞ is False) — so nothing is kept."""
    scores = torch.tensor([[float("nan"), 0.0, 1.0, 2.0]]).bfloat16()
    vis = torch.tensor([4])
    got = _run_mask(scores, vis, 1, 2, device)
    _equal("mask nan", got, ref.candidate_mask(scores, vis, 1, 2))
    assert not got.any(), f"mask nan: {got.tolist()}"


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    Lb=st.one_of(st.integers(1, 40), st.integers(1, 3000)),
    blocks=st.integers(1, 40),
    bs=st.one_of(st.integers(1, 8), st.integers(1, 300)),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_candidate_mask_fixed_matches_reference_hypothesis(m, Lb, blocks, bs, mode, seed):
    scores, vis = _random_case(seed, m, Lb, mode)
    _equal("mask", _run_mask(scores, vis, blocks, bs, "cpu"), ref.candidate_mask(scores, vis, blocks, bs))


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    Lb=st.one_of(st.integers(1, 40), st.integers(1, 3000)),
    L_frac=st.floats(0.0, 1.0),
    blocks=st.integers(1, 40),
    bs=st.one_of(st.integers(1, 8), st.integers(1, 300)),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**31 - 1),
)
def test_candidate_mask_fixed_is_bucket_independent(m, Lb, L_frac, blocks, bs, mode, seed):
    """Over [m, Lb] with −∞ past visible ≤ L, the first L columns equal the reference on scores[:, :L]."""
    gen = torch.Generator().manual_seed(seed)
    L = max(1, round(L_frac * Lb))
    vis = _visible(gen, m, L, torch.int32)
    scores = _mask_past_visible(_scores(gen, m, Lb, mode), vis)
    got = _run_mask(scores, vis, blocks, bs, "cpu")
    _equal("mask bucket", got[:, :L], ref.candidate_mask(scores[:, :L], vis, blocks, bs))
    # a kept block is kept whole, so the block straddling L may mark columns past L; none beyond it
    assert not got[:, -(-L // bs) * bs :].any(), "mask bucket: a block wholly past L is kept"


# ---------------------------------------------------------------- argument checks


def _args(**over):
    base = dict(
        scores=torch.zeros(2, 10).bfloat16(),
        visible=torch.tensor([3, 10]),
        k=4,
        offset=0,
        out=torch.full((2, 4), -9, dtype=torch.int32),
    )
    base.update(over)
    return base


TOPK_BAD = [
    pytest.param(dict(scores=torch.zeros(2, 10)), "scores must be bf16", id="scores-fp32"),
    pytest.param(dict(scores=torch.zeros(2, 10, 1).bfloat16()), "scores must be bf16", id="scores-3d"),
    pytest.param(dict(visible=torch.tensor([3.0, 1.0])), "visible must be int32/int64", id="visible-float"),
    pytest.param(dict(visible=torch.tensor([3])), "visible must be int32/int64", id="visible-shape"),
    pytest.param(dict(k=0), r"k = 0; allowed: 1\.\.10", id="k-0"),
    pytest.param(dict(k=11), r"k = 11; allowed: 1\.\.10", id="k-over-Lb"),
    pytest.param(dict(k=2.0), "k must be an int", id="k-float"),
    pytest.param(dict(offset=-1), "offset = -1; allowed: 0", id="offset-neg"),
    pytest.param(dict(out=torch.zeros(2, 4, dtype=torch.int64)), "out must be torch.int32", id="out-int64"),
    pytest.param(
        dict(out=torch.zeros(2, 5, dtype=torch.int32)), r"out must be torch.int32 of shape \[2, 4\]", id="out-k"
    ),
    pytest.param(
        dict(out=torch.zeros(3, 4, dtype=torch.int32)), r"out must be torch.int32 of shape \[2, 4\]", id="out-m"
    ),
]


@pytest.mark.parametrize("over,msg", TOPK_BAD)
def test_topk_fixed_rejects_bad_arguments(over, msg):
    a = _args(**over)
    before = a["out"].clone()
    with pytest.raises((ValueError, TypeError), match=msg):
        topk_fixed(**a)
    assert torch.equal(a["out"], before), "topk: out written before the argument check"
    good = _args()  # a retry with correct arguments works
    _equal("topk retry", topk_fixed(**good), ref.topk_select(good["scores"], good["visible"], 4, 0))


MASK_BAD = [
    pytest.param(dict(cand_blocks=0), r"cand_blocks = 0; allowed: 1\.\.", id="blocks-0"),
    pytest.param(dict(cand_block=0), r"cand_block = 0; allowed: 1\.\.", id="block-0"),
    pytest.param(dict(cand_block=True), "cand_block must be an int", id="block-bool"),
    pytest.param(dict(out=torch.zeros(2, 10, dtype=torch.uint8)), "out must be torch.bool", id="out-uint8"),
    pytest.param(dict(out=torch.zeros(2, 9, dtype=torch.bool)), r"shape \[2, 10\]", id="out-width"),
    pytest.param(dict(scores=torch.zeros(2, 10).half()), "scores must be bf16", id="scores-fp16"),
]


@pytest.mark.parametrize("over,msg", MASK_BAD)
def test_candidate_mask_fixed_rejects_bad_arguments(over, msg):
    a = dict(
        scores=torch.zeros(2, 10).bfloat16(),
        visible=torch.tensor([3, 10], dtype=torch.int32),
        cand_blocks=2,
        cand_block=4,
        out=torch.ones(2, 10, dtype=torch.bool),
    )
    a.update(over)
    before = a["out"].clone()
    with pytest.raises((ValueError, TypeError), match=msg):
        candidate_mask_fixed(**a)
    assert torch.equal(a["out"], before), "mask: out written before the argument check"


# ---------------------------------------------------------------- CUDA graph capture


@pytest.mark.gpu
def test_fixed_selections_capture_in_a_cuda_graph():
    """Captured once at a bucket width, replayed over fresh scores and visible counts
    (including visible = 0 and Lb): no host sync, results equal to the reference."""
    dev, m, Lb, k = "cuda", 4, 3000, 512
    scores = torch.zeros(m, Lb, dtype=torch.bfloat16, device=dev)
    vis = torch.zeros(m, dtype=torch.int32, device=dev)
    top = torch.full((m + 2, k + 3), -9, dtype=torch.int32, device=dev)[1 : m + 1, 2 : k + 2]
    mask = torch.empty(m, Lb, dtype=torch.bool, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture (allocator, lazy init)
        topk_fixed(scores, vis, k, 7, top)
        candidate_mask_fixed(scores, vis, 16, 64, mask)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            topk_fixed(scores, vis, k, 7, top)
            candidate_mask_fixed(scores, vis, 16, 64, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed, mode in enumerate(MODES):
        gen = torch.Generator().manual_seed(seed)
        s = _scores(gen, m, Lb, mode)
        v = _visible(gen, m, Lb, torch.int32)
        s = _mask_past_visible(s, v) if seed % 2 else s
        scores.copy_(s)
        vis.copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        _equal(f"graph topk {mode}", top.cpu(), ref.topk_select(s, v, k, 7))
        _equal(f"graph mask {mode}", mask.cpu(), ref.candidate_mask(s, v, 16, 64))


# ---------------------------------------------------------------- the Triton top-k (kernels/topk.py)


TRITON_CASES = [  # (m, Lb, k, tile): small tiles put ties, −∞ runs and the k-th key across tile edges
    pytest.param(1, 1, 1, 1024, id="m1-Lb1-k1"),
    pytest.param(2, 7, 3, 1024, id="m2-Lb7-k3"),
    pytest.param(3, 13, 13, 1024, id="m3-Lb13-k=Lb"),
    pytest.param(4, 40, 17, 16, id="m4-Lb40-k17-tile16"),
    pytest.param(2, 301, 100, 32, id="m2-Lb301-k100-tile32"),
    pytest.param(2, 1100, 700, 1024, id="m2-Lb1100-k700-2tiles"),
]


@pytest.mark.parametrize("m,Lb,k,tile", TRITON_CASES)
@pytest.mark.parametrize("mode", MODES)
def test_triton_topk_fixed_matches_torch(device, monkeypatch, m, Lb, k, tile, mode):
    topk = pytest.importorskip("attnv41.kernels.topk")
    monkeypatch.setattr(topk, "_BLOCK", tile)
    monkeypatch.setattr(topk, "_ROW_WIDTH", 0)  # the tiled passes (test_topk.py runs both forms)
    gen = torch.Generator().manual_seed(zlib.crc32(f"triton,{m},{Lb},{k},{mode}".encode()))
    scores = _scores(gen, m, Lb, mode)
    vis = _visible(gen, m, Lb, torch.int32 if Lb % 2 else torch.int64)
    if Lb % 3 == 0:
        scores = _mask_past_visible(scores, vis)
    buf = torch.full((m + 1, k + 2), -9, dtype=torch.int32, device=device)
    out = buf[1:, 1 : k + 1]  # a view strided in dim 0: the rest of buf must stay untouched
    assert topk.topk_fixed(scores.to(device), vis.to(device), k, 13, out) is out
    want = torch.full((m, k), -9, dtype=torch.int32, device=device)
    topk_fixed(scores.to(device), vis.to(device), k, 13, want)
    _equal("triton topk vs torch", out.cpu(), want.cpu())
    _equal("triton topk vs reference", out.cpu(), ref.topk_select(scores, vis, k, 13))
    assert bool((buf[0] == -9).all() and (buf[:, 0] == -9).all() and (buf[:, k + 1] == -9).all()), (
        "triton topk: wrote outside out"
    )


def test_triton_topk_fixed_rejects_bad_arguments():
    topk = pytest.importorskip("attnv41.kernels.topk")
    a = _args(k=11)
    before = a["out"].clone()
    with pytest.raises(ValueError, match=r"k = 11; allowed: 1\.\.10"):
        topk.topk_fixed(**a)
    assert torch.equal(a["out"], before), "triton topk: out written before the argument check"
