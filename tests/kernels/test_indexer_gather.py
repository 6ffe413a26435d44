"""The index scores' gathered form (`ids`, `cand_block`: a reindex layer scoring only the
rows of its kept candidate blocks): every entry has the bytes of its row in the full form,
−∞ where the row is past the token's visible rows or the keys (padding ids included), for
bf16 and packed keys, contiguous and paged, under the production and other launch shapes;
the torch twins agree; bad ids are refused before anything is written."""

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e8m0_qdq
from helpers import paged_table

BF = torch.bfloat16


def _ids(gen, m, n_blocks, nc, pad_tail=True):
    """int32 [m, nc]: per token an ascending draw of distinct blocks of n_blocks (fewer for
    some tokens: the rest the padding id n_blocks), as the candidate source publishes."""
    out = torch.full((m, nc), n_blocks, dtype=torch.int32)
    for t in range(m):
        k = min(nc, n_blocks) if (t % 3 or not pad_tail) else max(1, min(nc, n_blocks) // 2)
        out[t, :k] = torch.randperm(n_blocks, generator=gen)[:k].sort().values.to(torch.int32)
    return out


def _keys(gen, L, d, packed):
    k = fp4_e8m0_qdq(torch.randn(L, d, generator=gen).to(BF))
    return (pack(k, "fp4_e8m0"), k) if packed else (k, k)


def _expected(full, ids, cb, vis, nk):
    e = torch.arange(ids.shape[1] * cb)
    rows = ids.long()[:, e // cb] * cb + e % cb
    live = rows < vis.long().clamp(max=nk)[:, None]
    g = torch.gather(full.float(), 1, torch.where(live, rows, 0))
    return torch.where(live, g, torch.full_like(g, float("-inf")))


def _same(a, b, what):
    assert torch.equal(a.cpu().view(torch.int16), b.cpu().to(BF).view(torch.int16)), what


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
@pytest.mark.parametrize(
    "tune", [{}, dict(skip=False), dict(keys_m=False, sub=3, block_l=32)], ids=["prod", "noskip", "hm-sub3-32"]
)
def test_gathered_entries_are_the_full_form_bytes(packed, tune, device):
    gen = torch.Generator().manual_seed(3)
    m, H, d, L, cb, nc = 5, 4, 64, 150, 4, 12  # 38 blocks of 4 (the last partial), 12 kept
    keys, _ = _keys(gen, L, d, packed)
    iq = fp4_e8m0_qdq(torch.randn(m, H, d, generator=gen).to(BF))
    w = torch.randn(m, H, generator=gen).to(BF)
    vis = torch.tensor([150, 149, 77, 1, 0], dtype=torch.int32)
    ids = _ids(gen, m, -(-L // cb), nc)
    ids[0, -1] = -(-L // cb) - 1  # the last, partial block kept
    dv = [t.to(device) for t in (iq, w, keys, vis, ids)]
    full = I.index_scores(*dv[:4], **tune)
    got = I.index_scores(*dv[:4], ids=dv[4], cand_block=cb, **tune)
    assert got.shape == (m, nc * cb)
    _same(got, _expected(full.cpu(), ids, cb, vis, L), "gathered == full at each entry's row")
    twin = I.index_scores_torch(iq, w, keys, vis, ids=ids, cand_block=cb)
    _same(twin, _expected(I.index_scores_torch(iq, w, keys, vis), ids, cb, vis, L), "twin")
    if device == "cpu":  # the interpreter's bytes are the reference's here (exact sums of grid values)
        assert torch.isfinite(got[0, :8].float()).all()


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_gathered_paged_entries_are_the_full_form_bytes(packed, device):
    gen = torch.Generator().manual_seed(5)
    B, width, rows, lens, H, d, cb, nc = 4, 40, (37, 13, 40), (2, 1, 3), 4, 64, 4, 6
    table, n_blocks = paged_table(gen, rows, B, width, spare=3)
    pool, _ = _keys(gen, n_blocks * B, d, packed)
    T = sum(lens)
    iq = fp4_e8m0_qdq(torch.randn(T, H, d, generator=gen).to(BF))
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.cat([torch.full((m,), s_, dtype=torch.int32) for s_, m in enumerate(lens)])
    vis = torch.tensor([37, 20, 13, 40, 39, 5], dtype=torch.int32)
    ids = _ids(gen, T, -(-width // cb), nc)
    dv = [t.to(device) for t in (iq, w, pool, table, tok_slot)]
    v, i = vis.to(device), ids.to(device)
    full = I.index_scores_paged(*dv, B, v, width)
    got = I.index_scores_paged(*dv, B, v, width, ids=i, cand_block=cb)
    _same(got, _expected(full.cpu(), ids, cb, vis, width), "paged gathered == paged full")
    twin = I.index_scores_paged_torch(iq, w, pool, table, tok_slot, B, vis, width, ids=ids, cand_block=cb)
    _same(
        twin,
        _expected(I.index_scores_paged_torch(iq, w, pool, table, tok_slot, B, vis, width), ids, cb, vis, width),
        "twin",
    )


def test_gathered_over_no_keys_is_all_neg_inf(device):
    iq = torch.zeros(2, 2, 32, dtype=BF, device=device)
    w = torch.zeros(2, 2, dtype=BF, device=device)
    keys = torch.zeros(0, 32, dtype=BF, device=device)
    vis = torch.zeros(2, dtype=torch.int32, device=device)
    ids = torch.zeros(2, 3, dtype=torch.int32, device=device)
    out = I.index_scores(iq, w, keys, vis, ids=ids, cand_block=2)
    assert out.shape == (2, 6) and torch.isneginf(out.float()).all()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(ids=torch.zeros(3, 2, dtype=torch.int64), cand_block=2), "ids = torch.int64"),
        (dict(ids=torch.zeros(2, 2, dtype=torch.int32), cand_block=2), r"m = 3"),
        (dict(ids=torch.zeros(3, 2, dtype=torch.int32), cand_block=0), "cand_block = 0"),
        (dict(ids=torch.zeros(3, 2, dtype=torch.int32), cand_block=2, out=torch.empty(3, 5, dtype=BF)), r"\[3, 4\]"),
    ],
    ids=["dtype", "rows", "cand-block", "out-width"],
)
def test_bad_gather_arguments_are_refused(kw, match):
    iq = torch.zeros(3, 2, 32, dtype=BF)
    w = torch.zeros(3, 2, dtype=BF)
    keys = torch.zeros(8, 32, dtype=BF)
    vis = torch.zeros(3, dtype=torch.int32)
    for fn in (I.index_scores_torch, I.index_scores):
        with pytest.raises(ValueError, match=match):
            fn(iq, w, keys, vis, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_flash_reindex_over_candidates_equals_the_masked_full_form(packed):
    """At the Flash index geometry over 40,000 keys (past the 16,384-position mask): the
    candidate source's mask and ids from real scores, a reindex layer's gathered scores
    (the full scores' bytes at their rows) and its mapped top-k (the masked full top-k)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    from attnv41.kernels import topk
    from attnv41.synthetic import PRESETS

    cfg = PRESETS["flash"](max_tokens=8, max_seq=65536)
    H, d, C, cb, K = cfg.index_heads, cfg.index_head_dim, cfg.cand_blocks, cfg.cand_block, cfg.index_topk
    gen = torch.Generator().manual_seed(9)
    m, L = 3, 40000
    keys, _ = _keys(gen, L, d, packed)
    iq = fp4_e8m0_qdq(torch.randn(2, m, H, d, generator=gen).to(BF))
    w = torch.randn(2, m, H, generator=gen).to(BF)
    vis = torch.tensor([40000, 39999, 20001], dtype=torch.int32)
    keys, iq, w, vis = keys.cuda(), iq.cuda(), w.cuda(), vis.cuda()
    src = I.index_scores(iq[0], w[0], keys, vis)  # the candidate source's scores
    mask = torch.empty(m, L, dtype=torch.bool, device="cuda")
    ids = torch.empty(m, C, dtype=torch.int32, device="cuda")
    topk.candidate_mask_fixed(src, vis, C, cb, mask, ids_out=ids)
    full = I.index_scores(iq[1], w[1], keys, vis)  # the reindex layer's, full form
    got = I.index_scores(iq[1], w[1], keys, vis, ids=ids, cand_block=cb)
    _same(got, _expected(full.cpu(), ids.cpu(), cb, vis.cpu(), L), "gathered == full at each entry's row")
    want = torch.empty(m, K, dtype=torch.int32, device="cuda")
    topk.topk_fixed(full.masked_fill(~mask, float("-inf")), vis, K, 128, want)
    sel = torch.empty(m, K, dtype=torch.int32, device="cuda")
    topk.topk_fixed(got, vis, K, 128, sel, ids=ids, cand_block=cb)
    assert torch.equal(sel, want)
