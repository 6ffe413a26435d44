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
from helpers import interp_subset, paged_table

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
    [
        dict(sub=4),
        dict(sub=3, block_l=32),
        dict(block_l=128, num_warps=8),
        dict(skip=False),
        dict(skip=False, sub=3, num_warps=2),
        dict(keys_m=False),
        dict(keys_m=False, sub=3, block_l=32, num_warps=2),
        dict(keys_m=False, block_l=128, num_warps=8, skip=False),
        dict(inner_cvt=False),
        dict(sub_packed=4),
        dict(scale_word=False),
        dict(lut=True),
        dict(epi2=True),
        dict(lut=True, epi2=True, sub_packed=2),
    ],
    ids=[
        "sub4",
        "sub3-32",
        "bl128",
        "noskip",
        "noskip-sub3-w2",
        "hm",
        "hm-sub3-32-w2",
        "hm-bl128-noskip",
        "nan-select",
        "sub-packed4",
        "scale-tile",
        "lut",
        "epi2",
        "lut-epi2-sub2",
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_launch_shapes_keep_the_bits(tune, packed, device):
    """Other launch shapes (keys per block, blocks per program as a loop, warps): every
    score's bytes as the production shape's of the same orientation (keys_m=False: the
    heads as the MMA's rows, whose head sums may run in another fp32 order), paged and contiguous,
    bf16 and packed keys; widths that leave a program's last blocks past L; blocks wholly
    past a token's visible rows stored −∞ without the dot (production) or after it
    (skip=False)."""
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, 9, d=64, width=150)
    if packed:
        pool = pack(fp4_e8m0_qdq(pool.cpu()), "fp4_e8m0").to(device)
    orient = {"keys_m": tune.get("keys_m", True)}
    base = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, **orient)
    got = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, **tune)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), f"paged {tune}"
    keys = _contiguous(pool, table.clamp_min(0), 0, rows[0], B)
    base = I.index_scores(iq, w, keys, vis.clamp_max(rows[0]), **orient)
    got = I.index_scores(iq, w, keys, vis.clamp_max(rows[0]), **tune)
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), f"contiguous {tune}"


@pytest.mark.parametrize("form", [{}, {"epi2": True}, {"epi2": True, "lut": True}], ids=["inner", "epi2", "epi2-lut"])
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_inner_roundings_keep_the_bits_with_nan_and_inf(packed, form, device):
    """The epilogue's inner roundings without the NaN select (`inner_cvt`, production) and
    in bf16 pairs (`epi2`) store the bytes of the select form (`inner_cvt=False`) where the
    dots overflow to ±inf, where inf meets a zero weight (NaN products), where a weight is
    NaN or ±inf, on −0 dots, and on dots of 2^-140 and −2^-140 (below bf16's smallest
    subnormal: they round to ±0 before the max with 0)."""
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, 5, d=64, width=16)
    iq, w, pool = iq.cpu(), w.cpu(), pool.cpu()
    pool[2, :] = 0.0
    pool[2, 0] = -(2.0**-70)  # dots of −2^-140 (fp32 subnormals) with iq[·, ·, 0] = 2^-70
    pool[3, :] = 0.0
    pool[3, 0] = 2.0**-70
    pool = fp4_e8m0_qdq(pool)
    pool[0] = fp4_e8m0_qdq(torch.full((64,), 1.0e38).to(BF))  # overflowing dots with large queries
    pool[1] = -0.0  # −0 dots
    iq = fp4_e8m0_qdq(iq)
    iq[:, :, 0] = 2.0**-70  # every token: its dots with pool rows 2 and 3 are ∓2^-140
    iq[0, 0] = fp4_e8m0_qdq(torch.full((64,), 1.0e38).to(BF))
    iq[1, 1] = fp4_e8m0_qdq(torch.full((64,), -1.0e38).to(BF))
    w[0, 0] = 0.0  # inf · 0
    w[1, 2] = float("nan")
    w[2, 3] = float("inf")
    w[3, 0] = float("-inf")
    if packed:
        pool = pack(pool, "fp4_e8m0")
    iq, w, pool = iq.to(device), w.to(device), pool.to(device)
    vis = vis.clamp_min(2)
    base = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, inner_cvt=False)
    got = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, **form)
    assert base.float().isnan().any() and base.float().isinf().any(), "the case must reach NaN and inf"
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16))


# the interpreter reads packed words without the PTX, so one_word changes nothing there
# (its cases: row0 alone), and 64-64 takes 32-32's steps
@pytest.mark.parametrize("tune", interp_subset(["row0", "one_word", "row0,one_word"], ["row0"]))
@pytest.mark.parametrize(
    "B,block_l", interp_subset([(32, 32), (64, 64), (128, 32), (16, 32)], [(32, 32), (128, 32), (16, 32)])
)
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_row0_and_one_word_keep_the_bits(tune, B, block_l, tokens, packed, device):
    """`row0` (a block of keys within one table block: its entry read once, the rows'
    pointers the first one's plus offsets; where B is a multiple of block_l, else the
    per-row form: 16-32) and `one_word` (packed keys' code words one per thread; on the
    GPU only, the interpreter reads words without the PTX): every score's bytes as the
    production launch's, one token per program and four (one slot's groups sharing the
    keys, and groups across slots), rows that end inside a block and tokens that see none,
    unallocated table entries (−1) past the visible rows never read."""
    tune = dict.fromkeys(tune.split(","), True)
    gen = torch.Generator().manual_seed(B + block_l + tokens)
    lens, rows = (4, 1, 3), (B * 2 + 5, 0, B + 1)
    width = B * 3
    table, n_blocks = paged_table(gen, rows, B, width, spare=2)
    pool = fp4_e8m0_qdq(torch.randn(n_blocks * B, 64, generator=gen).to(BF))
    if packed:
        pool = pack(pool, "fp4_e8m0")
    T = sum(lens)
    iq = torch.randn(T, 4, 64, generator=gen).to(BF)
    w = torch.randn(T, 4, generator=gen).to(BF)
    tok_slot = torch.cat([torch.full((n,), s_, dtype=torch.int32) for s_, n in enumerate(lens)])
    vis = torch.cat([torch.linspace(0, r, n).round().to(torch.int32) for n, r in zip(lens, rows)])
    args = [t.to(device) for t in (iq, w, pool, table, tok_slot)] + [B, vis.to(device), width]
    base = I.index_scores_paged(*args, block_l=block_l, tokens=tokens)
    got = I.index_scores_paged(*args, block_l=block_l, tokens=tokens, **tune)
    assert not torch.isnan(base.float()).any()
    assert torch.equal(got.cpu().view(torch.int16), base.cpu().view(torch.int16)), f"{tune}"
    one = I.index_scores_paged(*args, block_l=block_l)
    assert torch.equal(got.cpu().view(torch.int16), one.cpu().view(torch.int16)), "tokens: the bits of one per program"


def test_unknown_tune_key(device):
    (iq, w, pool, table, tok_slot, vis), lens, rows, B, width = _case(device, 1)
    with pytest.raises(
        ValueError,
        match=r"tune keys \['blockl'\]; allowed: \['block_l', 'epi2', 'fp4_asm', 'gluon', 'inner_cvt', 'keys_m', 'lut', 'maxnreg_packed', 'num_stages', 'num_warps', 'one_word', 'row0', 'scale_word', 'skip', 'sub', 'sub_packed', 'sub_tokens'\]",
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
