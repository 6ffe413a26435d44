"""`index_scores_paged`: the tokens of several sequences scored in one launch over a
paged key pool equal, byte for byte, `index_scores` of each sequence over its keys laid
out contiguously (the kernel's bits do not depend on where a key row lives); the torch
twin equals the reference per sequence; unallocated table entries past a token's visible
rows are never read."""

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.packed import pack
from attnv41.reference import indexer as ref
from attnv41.reference.qdq import fp4_e8m0_qdq
from helpers import paged_table

BF = torch.bfloat16


def _case(device, seed=0, H=4, d=64, B=4, lens=(1, 3, 2), rows=(5, 13, 9), width=16):
    gen = torch.Generator().manual_seed(seed)
    table, n_blocks = paged_table(gen, rows, B, width, spare=3)
    pool = torch.randn(n_blocks * B, d, generator=gen).to(BF)
    T = sum(lens)
    iq = torch.randn(T, H, d, generator=gen).to(BF)
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.cat([torch.full((m,), s_, dtype=torch.int32) for s_, m in enumerate(lens)])
    vis = torch.cat([torch.randint(0, r + 1, (m,), generator=gen) for m, r in zip(lens, rows)]).to(torch.int32)
    vis[0] = rows[0]  # one token sees all its sequence's rows
    dev = [t.to(device) for t in (iq, w, pool, table, tok_slot, vis)]
    return dev, lens, rows, B, width


def _contiguous(pool, table, s_, n, B):
    j = torch.arange(n, device=pool.device)
    return pool[table[s_, j // B].long() * B + j % B]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paged_equals_each_sequence_alone(seed, device):
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, seed)
    out = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width)
    a = 0
    for s_, (m, r) in enumerate(zip(lens, rows)):
        keys = _contiguous(pool, table, s_, r, B)
        one = I.index_scores(iq[a : a + m], w[a : a + m], keys, vis[a : a + m])
        assert torch.equal(out[a : a + m, :r].cpu().view(torch.int16), one.cpu().view(torch.int16)), f"seq {s_}"
        assert torch.isneginf(out[a : a + m, r:].float()).all(), "past a sequence's rows: −∞"
        a += m


@pytest.mark.parametrize(
    "tune",
    [dict(sub=2), dict(sub=3, block_l=32), dict(block_l=128, num_warps=8), dict(tok=4), dict(tok=3, sub=2)],
    ids=["sub2", "sub3-32", "bl128", "tok4", "tok3-sub2"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_launch_shapes_keep_the_bits(tune, packed, device):
    """Other launch shapes (keys per block, blocks per program as a loop, warps): every
    score's bytes as the production shape's, paged and contiguous, bf16 and packed keys;
    widths that leave a program's last blocks past L; several tokens per program (the
    prefill regime's form), whose programs here mix sequences (a token of another sequence
    than the program's first reads its own keys) and end past the last token."""
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, 9, d=64, width=150)
    if packed:
        pool = pack(fp4_e8m0_qdq(pool.cpu()), "fp4_e8m0").to(device)
    base = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width)
    got = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, **tune)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), f"paged {tune}"
    keys = _contiguous(pool, table.clamp_min(0), 0, rows[0], B)
    base = I.index_scores(iq, w, keys, vis.clamp_max(rows[0]))
    got = I.index_scores(iq, w, keys, vis.clamp_max(rows[0]), **tune)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), f"contiguous {tune}"


def test_unknown_tune_key(device):
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, 1)
    with pytest.raises(
        ValueError, match=r"tune keys \['blockl'\]; allowed: \['block_l', 'num_stages', 'num_warps', 'sub', 'tok'\]"
    ):
        I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, blockl=32)


def test_twin_equals_the_reference(device):
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case("cpu", 5)
    got = I.index_scores_paged_torch(iq, w, pool, table, tok_slot, B, vis, width)
    a = 0
    for s_, m in enumerate(lens):
        keys = _contiguous(pool, table.clamp_min(0), s_, width, B)
        exp = ref.index_scores(iq[a : a + m], w[a : a + m], keys, vis[a : a + m])
        assert torch.equal(got[a : a + m], exp), f"seq {s_}"
        a += m


@pytest.mark.parametrize(
    "change, msg",
    [
        (dict(width=0), "width = 0; allowed: 1..16"),
        (dict(width=17), "width = 17; allowed: 1..16"),
        (dict(block_rows=0), "block_rows = 0; allowed: an int >= 1"),
        (dict(tok_slot=torch.zeros(2, dtype=torch.int32)), "tok_slot = torch.int32 (2,)"),
        (dict(table=torch.zeros(3, 4)), "block_table = torch.float32"),
    ],
)
def test_bad_arguments(change, msg, device):
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device)
    a = dict(table=table, tok_slot=tok_slot, block_rows=B, width=width)
    a.update({k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in change.items()})
    for fn in (I.index_scores_paged, I.index_scores_paged_torch):
        with pytest.raises(ValueError, match=msg.replace("(", "\\(").replace(")", "\\)")):
            fn(iq, w, pool, a["table"], a["tok_slot"], a["block_rows"], vis, a["width"])


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_prefill_regime_keeps_the_bits(packed, device):
    """`prefill=True` (a prompt chunk: 8 tokens per program sharing each key tile) gives
    every score the bytes of the decode regime's one-token programs: a chunk of one sequence
    (causal visible counts, a token count that leaves the last program part-empty) followed
    by single tokens of two other sequences; contiguous keys as well. Bad `prefill` or `tok`
    values are refused."""
    gen = torch.Generator().manual_seed(11)
    B, d, H = 4, 64, 4
    rows = (37, 9, 14)
    table, n_blocks = paged_table(gen, rows, B, 40, spare=2)
    pool = torch.randn(n_blocks * B, d, generator=gen).to(BF)
    if packed:
        pool = pack(fp4_e8m0_qdq(pool), "fp4_e8m0")
    lens = (19, 1, 1)
    T = sum(lens)
    iq = torch.randn(T, H, d, generator=gen).to(BF)
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.tensor([0] * 19 + [1, 2], dtype=torch.int32)
    vis = torch.tensor([18 + i for i in range(19)] + [9, 14], dtype=torch.int32)  # causal: 18..36
    args = [t.to(device) for t in (iq, w, pool, table, tok_slot)]
    base = I.index_scores_paged(*args[:4], args[4], B, vis.to(device), 40)
    got = I.index_scores_paged(*args[:4], args[4], B, vis.to(device), 40, prefill=True)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), "paged, prefill regime"
    keys = _contiguous(args[2], args[3].clamp_min(0), 0, rows[0], B)
    v0 = vis[:19].to(device)
    base = I.index_scores(args[0][:19], args[1][:19], keys, v0)
    got = I.index_scores(args[0][:19], args[1][:19], keys, v0, prefill=True)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), "contiguous, prefill regime"
    with pytest.raises(ValueError, match=r"prefill = 1; allowed: True or False"):
        I.index_scores(args[0][:19], args[1][:19], keys, v0, prefill=1)
    with pytest.raises(ValueError, match=r"tok = 0; allowed: an int in 1..64"):
        I.index_scores(args[0][:19], args[1][:19], keys, v0, tok=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core dot's bits on the GPU")
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_prefill_regime_keeps_the_bits_at_flash_shapes(packed):
    """At the Flash shapes (32 heads × 128) on the GPU: a 300-token chunk of one sequence over
    20K keys in 64-row blocks, then 5 single tokens of other sequences; the prefill regime
    and its neighbours (4 or 16 tokens per program, 8 warps) give every score the decode
    regime's bytes."""
    gen = torch.Generator().manual_seed(5)
    B, d, H = 64, 128, 32
    rows = (20000, 3000, 5000, 64, 1, 7000)
    table, n_blocks = paged_table(gen, rows, B, 20480, spare=2)
    pool = torch.randn(n_blocks * B, d, generator=gen).to(BF)
    if packed:
        pool = pack(fp4_e8m0_qdq(pool), "fp4_e8m0")
    T = 305
    iq = torch.randn(T, H, d, generator=gen).to(BF)
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.tensor([0] * 300 + [1, 2, 3, 4, 5], dtype=torch.int32)
    vis = torch.tensor([19700 + i for i in range(300)] + [3000, 5000, 64, 1, 7000], dtype=torch.int32)
    a = [t.cuda() for t in (iq, w, pool, table, tok_slot)] + [B, vis.cuda(), 20480]
    base = I.index_scores_paged(*a)
    for kw in (dict(prefill=True), dict(prefill=True, tok=4), dict(prefill=True, tok=16), dict(tok=8, num_warps=8)):
        got = I.index_scores_paged(*a, **kw)
        n = int((got.view(torch.int16) != base.view(torch.int16)).sum())
        assert n == 0, f"{kw}: {n} of {base.numel()} scores differ from the decode regime's"
