"""The candidate source's kept blocks as ascending ids (`candidate_mask_fixed(ids_out=)`)
and the top-k over a gathered form (`topk_fixed(ids=)`): the Triton kernels and the torch
twins give the same ints, and over ascending kept blocks the gathered top-k equals the
top-k of the full scores under the candidate mask, ties (lower position first) included."""

import pytest
import torch

from attnv41.kernels import select, topk

BF = torch.bfloat16


def _scores(gen, m, Lb, vis, levels=7):
    """bf16 [m, Lb] with many ties (few distinct values), −∞ past each row's visible count."""
    s = (torch.randint(-levels, levels + 1, (m, Lb), generator=gen).float() / 4).to(BF)
    past = torch.arange(Lb)[None, :] >= vis[:, None]
    return s.masked_fill(past, float("-inf"))


def _mask_ids(mask, cb, keep_n):
    """Ascending kept blocks of a position mask, padded with n_blocks."""
    m, Lb = mask.shape
    n_blocks = -(-Lb // cb)
    out = torch.full((m, keep_n), n_blocks, dtype=torch.int32)
    for t in range(m):
        kept = torch.nonzero(mask[t, ::cb]).flatten()
        out[t, : kept.numel()] = kept.to(torch.int32)
    return out


def _gather(scores, ids, cb, vis):
    e = torch.arange(ids.shape[1] * cb)
    rows = ids.long()[:, e // cb] * cb + e % cb
    live = rows < vis.long()[:, None]
    g = torch.gather(scores, 1, torch.where(live, rows, 0))
    return torch.where(live, g, torch.full_like(g, float("-inf")))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("Lb, cb, C", [(300, 4, 16), (257, 8, 8), (96, 2, 64)], ids=["300-4-16", "257-8-8", "96-2-64"])
def test_kept_ids_and_gathered_topk_equal_the_masked_full_topk(seed, Lb, cb, C, device):
    gen = torch.Generator().manual_seed(seed)
    m, k, off = 6, 9, 128
    n_blocks = -(-Lb // cb)
    keep_n = min(C, n_blocks)
    vis = torch.randint(1, Lb + 1, (m,), generator=gen, dtype=torch.int32)
    vis[0], vis[1] = Lb, 1
    scores = _scores(gen, m, Lb, vis)
    for impl in (select, topk):
        dv = device if impl is topk else "cpu"
        s, v = scores.to(dv), vis.to(dv)
        mask = torch.empty(m, Lb, dtype=torch.bool, device=dv)
        ids = torch.empty(m, keep_n, dtype=torch.int32, device=dv)
        impl.candidate_mask_fixed(s, v, C, cb, mask, ids_out=ids)
        ref_mask = torch.empty(m, Lb, dtype=torch.bool)
        select.candidate_mask_fixed(scores, vis, C, cb, ref_mask)
        assert torch.equal(mask.cpu(), ref_mask), f"{impl.__name__}: the mask with ids_out"
        assert torch.equal(ids.cpu(), _mask_ids(ref_mask, cb, keep_n)), f"{impl.__name__}: ids"
        masked = scores.masked_fill(~ref_mask, float("-inf"))
        kk = min(k, keep_n * cb)
        want = torch.empty(m, kk, dtype=torch.int32)
        select.topk_fixed(masked, vis, kk, off, want)
        g = _gather(scores, ids.cpu(), cb, vis).to(dv)
        finite = (masked > float("-inf")).sum(1) >= kk  # rows where the equality is promised
        # the Triton top-k in both forms: one program per row, the tiled passes
        for form in [{}] if impl is select else [dict(per_row=True), dict(per_row=False, tile=16)]:
            got = torch.empty(m, kk, dtype=torch.int32, device=dv)
            impl.topk_fixed(g, v, kk, off, got, ids=ids, cand_block=cb, **form)
            assert torch.equal(got.cpu()[finite], want[finite]), f"{impl.__name__} {form}: gathered top-k"


def test_taken_blocks_that_are_not_kept_are_named_n_blocks(device):
    """A NaN block takes a place and is not kept; blocks scoring −∞ inside the visible rows
    are taken when too few others are, and not kept: both read as n_blocks, at their slots."""
    Lb, cb, C = 40, 4, 6
    s = torch.full((2, Lb), float("-inf"))
    s[0, :8] = 1.0
    s[0, 12] = float("nan")
    s[0, 30] = 2.0
    s[1, :17] = 0.5  # past its 17 visible positions −∞, as the index scores store
    vis = torch.tensor([Lb, 17], dtype=torch.int32)
    s = s.to(BF)
    res = []
    for impl, dv in ((select, "cpu"), (topk, device)):
        mask = torch.empty(2, Lb, dtype=torch.bool, device=dv)
        ids = torch.empty(2, C, dtype=torch.int32, device=dv)
        impl.candidate_mask_fixed(s.to(dv), vis.to(dv), C, cb, mask, ids_out=ids)
        res.append(ids.cpu())
    assert torch.equal(res[0], res[1])
    n_blocks = Lb // cb
    # row 0's top 6: NaN block 3, the pinned block 9, block 7 (2.0), blocks 0 and 1 (1.0), and
    # the lowest −∞ block, 2; ascending, the two not kept named n_blocks
    assert res[0][0].tolist() == [0, 1, n_blocks, n_blocks, 7, 9]
    assert res[0][1].tolist() == [0, 1, 2, 3, 4, n_blocks]  # 17 visible: blocks 0-4 (5 blocks), one −∞ block


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(ids=torch.zeros(2, 3, dtype=torch.int32), cand_block=4), "Lb = 16"),
        (dict(ids=torch.zeros(2, 4, dtype=torch.int64), cand_block=4), "torch.int32"),
        (dict(ids=torch.zeros(2, 4, dtype=torch.int32), cand_block=0), "cand_block = 0"),
    ],
    ids=["width", "dtype", "cand-block"],
)
def test_bad_gather_ids_are_refused_before_writing(kw, match, device):
    scores = torch.zeros(2, 16, dtype=BF)
    vis = torch.full((2,), 16, dtype=torch.int32)
    for impl, dv in ((select, "cpu"), (topk, device)):
        out = torch.full((2, 3), 7, dtype=torch.int32, device=dv)
        kw2 = {k: (v.to(dv) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
        with pytest.raises((ValueError, TypeError), match=match):
            impl.topk_fixed(scores.to(dv), vis.to(dv), 3, 0, out, **kw2)
        assert (out == 7).all()
    bad = torch.empty(2, 5, dtype=torch.int32)
    with pytest.raises(ValueError, match="ids_out"):
        select.candidate_mask_fixed(scores, vis, 4, 4, torch.empty(2, 16, dtype=torch.bool), ids_out=bad)
