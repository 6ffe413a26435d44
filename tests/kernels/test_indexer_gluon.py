"""The Gluon index scores over packed keys (`kernels.indexer_gluon`): on the GPU, every
score's bytes equal the Triton kernel's (`indexer.index_scores_paged` over the same packed
keys and over their bf16 values), at the Flash index geometry and a narrow one, over paged
pools with blocks of 16, 64 and 128 rows, tokens with nothing, part or all of their rows
visible, widths past the last block, NaN and inf weights and overflowing dots, every launch
shape, PDL and CUDA-graph replay; the runtime's `gluon` option. On the CPU: its refusals
(the kernel itself is compiled offline in `test_indexer_gluon_sass.py`)."""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.kernels import indexer_gluon as G
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e8m0_qdq
from helpers import paged_table

BF = torch.bfloat16
# the forms before `afrag` became the default (fifty-first entry): cp.async stages, and the
# direct loads through a shared-memory tile
STAGED = dict(stages=4, afrag=False, slice_out=False)
DIRECT = dict(stages=0, afrag=False, slice_out=False)


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and G.HAVE_GLUON


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU with Gluon")]
ROWS = (300, 64, 0, 1000, 129)


def _case(seed=0, H=32, B=64, rows=ROWS, width=1100, per_seq=2, extremes=False):
    """Packed and bf16 pools holding the same keys on the fp4_e8m0 grid, a scattered block
    table, per_seq tokens per sequence with visible counts from 0 to all rows."""
    d = 128
    gen = torch.Generator().manual_seed(seed)
    table, n_blocks = paged_table(gen, rows, B, width, spare=3)
    pool = fp4_e8m0_qdq(torch.randn(n_blocks * B, d, generator=gen).to(BF))
    iq = fp4_e8m0_qdq(torch.randn(len(rows) * per_seq, H, d, generator=gen).to(BF))
    w = torch.randn(len(rows) * per_seq, H, generator=gen).to(BF)
    slot = torch.arange(len(rows), dtype=torch.int32).repeat_interleave(per_seq)
    vis = torch.stack([torch.randint(0, r + 1, (), generator=gen) for r in rows for _ in range(per_seq)])
    vis = vis.to(torch.int32)
    vis[0] = rows[0]  # one token sees all its sequence's rows
    if extremes:
        big = fp4_e8m0_qdq(torch.full((d,), 1.0e38).to(BF))
        r0 = int(table[0, 0]) * B
        pool[r0] = big  # dots that overflow to inf with large queries
        pool[r0 + 1] = -0.0
        iq[0, 0] = big
        iq[1, 1] = -big
        w[0, 0] = 0.0  # inf · 0
        w[1, 2] = float("nan")
        w[0, 3] = float("inf")
        w[1, 0] = float("-inf")
    dev = "cuda"
    packed = pack(pool, "fp4_e8m0").to(dev)
    return [t.to(dev) for t in (iq, w, packed, pool, table, slot, vis)] + [B, width]


def _bits(t):
    return t.cpu().view(torch.int16)


@pytest.mark.parametrize("heads", [32, 8], ids=["flash", "narrow"])
@pytest.mark.parametrize("B", [64, 16, 128])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_bytes_as_the_triton_kernel(seed, B, heads):
    iq, w, packed, pool, table, slot, vis, B, width = _case(seed, H=heads, B=B)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
    over_bf16 = I.index_scores_paged(iq, w, pool, table, slot, B, vis, width, gluon=False)
    assert torch.equal(_bits(base), _bits(over_bf16)), "the Triton kernel: packed keys give the bf16 keys' bytes"
    staged = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, **STAGED)
    assert torch.equal(_bits(staged), _bits(base)), "the cp.async form"
    got = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width)  # the default: afrag
    torch.cuda.synchronize()
    assert torch.equal(_bits(got), _bits(base)), f"{int((_bits(got) != _bits(base)).sum())} scores differ"
    assert not torch.isnan(got.float()).any()
    # the A-fragment form, with one table entry per block where the pool blocks allow it (B 64, 128)
    af = G.index_scores_paged_gluon(
        iq, w, packed, table, slot, B, vis, width, stages=0, afrag=True, slice_out=True, row0=True
    )
    assert torch.equal(_bits(af), _bits(base)), f"afrag: {int((_bits(af) != _bits(base)).sum())} scores differ"


@pytest.mark.parametrize(
    "tune",
    [
        dict(STAGED, sub=1, stages=2),
        dict(STAGED, sub=2, stages=3),
        dict(STAGED, sub=16, stages=6),
        dict(pdl=False),
        dict(STAGED, mid=True),
        dict(STAGED, mid=True, sub=4, stages=2),
        dict(maxnreg=80),
        dict(STAGED, one_word=True),
        dict(STAGED, one_word=True, mid=True, sub=16, stages=6),
        dict(DIRECT),
        dict(DIRECT, sub=1, maxnreg=72),
        dict(DIRECT, sub=32, pdl=False),
        dict(stages=0, afrag=True),
        dict(stages=0, afrag=True, slice_out=True),
        dict(stages=0, afrag=True, slice_out=True, sub=1, pdl=False),
        dict(stages=0, afrag=True, slice_out=True, sub=32, maxnreg=80),
        dict(stages=0, afrag=True, slice_out=True, row0=True, sub=4),
        dict(stages=0, afrag=True, slice_out=True, ahead=True),
        dict(stages=0, afrag=True, ahead=True, row0=True, sub=2),
    ],
    ids=[
        "sub1-st2",
        "sub2-st3",
        "sub16-st6",
        "nopdl",
        "mid",
        "mid-sub4-st2",
        "cap80",
        "one-word",
        "one-word-mid",
        "direct",
        "direct-sub1-cap72",
        "direct-sub32-nopdl",
        "afrag",
        "afrag-slice-out",
        "afrag-slice-out-sub1-nopdl",
        "afrag-slice-out-sub32-cap80",
        "afrag-slice-out-row0-sub4",
        "afrag-slice-out-ahead",
        "afrag-ahead-row0-sub2",
    ],  # fmt: skip
)
def test_launch_shapes_keep_the_bytes(tune):
    iq, w, packed, pool, table, slot, vis, B, width = _case(3, rows=(2000, 5, 700), width=2050, per_seq=3)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
    got = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, **tune)
    assert torch.equal(_bits(got), _bits(base)), f"{tune}"


@pytest.mark.parametrize(
    "tune",
    [
        dict(STAGED),
        dict(STAGED, one_word=True),
        dict(DIRECT),
        {},
        dict(stages=0, afrag=True, slice_out=True, ahead=True),
    ],
    ids=["word-pairs", "one-word", "direct", "default-afrag", "afrag-ahead"],
)
def test_nan_inf_and_overflow_keep_the_bytes(tune):
    """Dots that overflow to ±inf, inf times a zero weight, NaN and ±inf weights, −0 dots:
    the Triton kernel's bytes, through either conversion of the code words."""
    iq, w, packed, pool, table, slot, vis, B, width = _case(5, extremes=True)
    vis[:2] = vis[:2].clamp_min(2)  # the first sequence's tokens see its rows 0 and 1 (the extremes)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
    assert base.float().isnan().any() and base.float().isinf().any(), "the case must reach NaN and inf"
    got = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, **tune)
    assert torch.equal(_bits(got), _bits(base))


@pytest.mark.parametrize("tune", [dict(stages=0, afrag=True), dict(stages=0, afrag=True, ahead=True, row0=True)])
def test_zero_code_words_keep_the_bytes(tune):
    """Rows whose code words are zero at several positions (eight zero values each, in
    every other word and in whole halves of rows): a thread then holds equal words at
    different positions, whose quad transposes still take their own partners' bytes."""
    iq, w, packed, pool, table, slot, vis, B, width = _case(13)
    pool = pool.cpu().clone()
    gen = torch.Generator().manual_seed(13)
    rows = torch.randperm(pool.shape[0], generator=gen)[: pool.shape[0] // 2]
    pool.view(pool.shape[0], 16, 8)[rows[::2], ::2] = 0.0  # every other word of these rows
    pool[rows[1::2], 64:] = 0.0  # the second half of these
    packed = pack(pool, "fp4_e8m0").to(packed.device)
    pool = pool.to(packed.device)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
    assert torch.equal(_bits(base), _bits(I.index_scores_paged(iq, w, pool, table, slot, B, vis, width, gluon=False)))
    got = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, **tune)
    assert torch.equal(_bits(got), _bits(base)), f"{int((_bits(got) != _bits(base)).sum())} scores differ"


def test_runtime_option_and_graph_replay():
    """`index_scores_paged(..., gluon=True)` takes the Gluon kernel (the same bytes); a CUDA
    graph of it replays with rewritten visible counts and keys to the eager bytes."""
    iq, w, packed, pool, table, slot, vis, B, width = _case(7)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
    got = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=True)
    assert I._PAGED_TUNE["gluon"], "the runtime's default (fifty-first entry)"
    assert torch.equal(_bits(got), _bits(base))
    out = torch.empty_like(base)
    G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, out=out)  # compiled before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, out=out)
    for seed in (11, 12):
        gen = torch.Generator().manual_seed(seed)
        new_vis = [int(torch.randint(0, r + 1, (), generator=gen)) for r in ROWS for _ in range(2)]
        vis.copy_(torch.tensor(new_vis, dtype=torch.int32))
        packed.copy_(pack(fp4_e8m0_qdq(torch.randn(packed.shape[0], 128, generator=gen).to(BF)), "fp4_e8m0"))
        g.replay()
        torch.cuda.synchronize()
        eager = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, gluon=False)
        assert torch.equal(_bits(out), _bits(eager)), f"replay {seed}"


@pytest.mark.parametrize(
    "cb, tune",
    [
        (8, dict(STAGED)),
        (4, dict(STAGED)),
        (8, dict(STAGED, one_word=True)),
        (4, dict(DIRECT)),
        (8, {}),
        (4, dict(stages=0, afrag=True, slice_out=False)),
        (8, dict(stages=0, afrag=True, ahead=True, sub=4)),
    ],
    ids=["cb8-staged", "cb4-staged", "cb8-one-word", "cb4-direct", "cb8-default-afrag", "cb4-afrag", "cb8-afrag-ahead"],
)
def test_gathered_form_same_bytes(cb, tune):
    """The reindex layers' gathered form (ids of kept candidate blocks, ascending, padding
    ids n_blocks at the end and in between, a partial last block kept): the Triton kernel's
    bytes through the Gluon kernel and through the runtime's option."""
    iq, w, packed, pool, table, slot, vis, B, width = _case(9)
    gen = torch.Generator().manual_seed(cb)
    n_blocks, nc = -(-width // cb), 40
    ids = torch.full((iq.shape[0], nc), n_blocks, dtype=torch.int32)
    for t in range(iq.shape[0]):
        k = nc if t % 3 else nc // 2
        ids[t, :k] = torch.randperm(n_blocks, generator=gen)[:k].sort().values.to(torch.int32)
    ids[0, 5] = n_blocks  # a taken block that is not kept, inside the list
    ids[1, -1] = n_blocks - 1  # the last, partial block
    ids = ids.to(iq.device)
    base = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, ids=ids, cand_block=cb, gluon=False)
    over_bf16 = I.index_scores_paged(iq, w, pool, table, slot, B, vis, width, ids=ids, cand_block=cb, gluon=False)
    assert torch.equal(_bits(base), _bits(over_bf16))
    got = G.index_scores_paged_gluon(iq, w, packed, table, slot, B, vis, width, ids=ids, cand_block=cb, **tune)
    assert torch.equal(_bits(got), _bits(base)), f"{int((_bits(got) != _bits(base)).sum())} scores differ"
    opt = I.index_scores_paged(iq, w, packed, table, slot, B, vis, width, ids=ids, cand_block=cb, gluon=True)
    assert torch.equal(_bits(opt), _bits(base))
