import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.reference.indexer import candidate_mask, index_scores, topk_select, visible_rows
from attnv41.reference.layer import RefStack
from helpers import random_inputs, random_weights, small_cfg


def test_visible_rows_rule():
    """Row j is visible once token j·r + r − 1 is processed: L_t = ⌊(t+1)/r⌋."""
    pos = torch.arange(10)
    assert visible_rows(pos, 2).tolist() == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert visible_rows(pos, 1).tolist() == list(range(1, 11))
    assert visible_rows(pos, 4).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]


def test_topk_tie_rule_and_order():
    scores = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5, float("-inf")]])
    # k = 3 of {1: 2, 2: 2, 3: 2}: the tie at the k-th value is broken toward lower positions
    assert topk_select(scores, torch.tensor([5]), 3, 100).tolist() == [[101, 102, 103]]
    assert topk_select(scores, torch.tensor([5]), 2, 100).tolist() == [[101, 102]]
    # positions ≥ L_t become −1 and gather at the end (ascending order puts them last)
    assert topk_select(scores, torch.tensor([2]), 4, 10).tolist() == [[10, 11, -1, -1]]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 9),
    L=st.integers(1, 40),
    k=st.integers(1, 12),
    offset=st.integers(0, 50),
    seed=st.integers(0, 2**31 - 1),
    ratio=st.sampled_from([1, 2, 4]),
)
def test_topk_selects_only_visible_sorted(m, L, k, offset, seed, ratio):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, L * ratio, (m,), generator=gen)
    vis = visible_rows(pos, ratio).clamp_max(L)
    raw = torch.randint(-3, 4, (m, L), generator=gen).float()  # many ties
    scores = raw.masked_fill(torch.arange(L)[None] >= vis[:, None], float("-inf"))
    k = min(k, L)
    sel = topk_select(scores, vis, k, offset)
    for t in range(m):
        row = sel[t].tolist()
        present = [v - offset for v in row if v >= 0]
        assert present == sorted(present) and all(0 <= j < vis[t] for j in present)
        assert row[len(present) :] == [-1] * (k - len(present))  # −1 only at the tail
        assert len(present) == min(k, int(vis[t]))
        if present:  # every visible position scoring above the lowest chosen score is chosen
            lo = min(raw[t, j] for j in present)
            assert all(j in present for j in range(int(vis[t])) if raw[t, j] > lo)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 6),
    L=st.integers(1, 60),
    blocks=st.integers(1, 6),
    bs=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
)
def test_candidate_mask_properties(m, L, blocks, bs, seed):
    gen = torch.Generator().manual_seed(seed)
    vis = torch.randint(0, L + 1, (m,), generator=gen)
    scores = torch.randn(m, L, generator=gen).bfloat16()
    scores = scores.masked_fill(torch.arange(L)[None] >= vis[:, None], float("-inf"))
    mask = candidate_mask(scores, vis, blocks, bs)
    n_blocks = -(-L // bs)
    for t in range(m):
        v = int(vis[t])
        kept = [b for b in range(n_blocks) if mask[t, b * bs]]
        assert all(bool(mask[t, b * bs : (b + 1) * bs].all()) for b in kept)  # whole blocks
        assert len(kept) <= min(blocks, n_blocks)
        if v == 0:
            assert not mask[t].any()
            continue
        assert (v - 1) // bs in kept  # the block holding the newest visible row is pinned
        assert all(b * bs < v for b in kept)  # no block of invisible rows only
        # kept blocks outrank dropped visible blocks (ties allowed)
        bmax = [scores[t, b * bs : min(L, (b + 1) * bs)].float().max().item() for b in range(n_blocks)]
        dropped = [b for b in range(n_blocks) if b not in kept and b * bs < v]
        unpinned = [b for b in kept if b != (v - 1) // bs]
        if dropped and unpinned:
            assert min(bmax[b] for b in unpinned) >= max(bmax[b] for b in dropped)
        if not dropped:
            assert len(kept) == len({b for b in range(n_blocks) if b * bs < v})


def test_index_scores_relu_and_head_weights():
    iq = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]).bfloat16()  # [1, 2 heads, 2]
    keys = torch.tensor([[2.0, -1.0], [-1.0, 3.0]]).bfloat16()  # [2, 2]
    w = torch.tensor([[0.5, -1.0]]).bfloat16()
    s = index_scores(iq, w, keys, torch.tensor([2]))
    # key 0: 0.5·relu(2) − 1·relu(−1) = 1; key 1: 0.5·relu(−1) − 1·relu(3) = −3
    assert s.float().tolist() == [[1.0, -3.0]]
    s1 = index_scores(iq, w, keys, torch.tensor([1]))
    assert s1.float().tolist() == [[1.0, float("-inf")]]


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 1000), window=st.sampled_from([4, 8, 16]))
def test_prefill_visibility_of_every_layer(n, seed, window):
    """Which rows a query may see: window rows max(0, t−W+1)…t of the chunk, compressed
    rows j < ⌊(t+1)/r⌋ of its layer's ratio."""
    cfg = small_cfg(window=window)
    stack = RefStack(cfg, random_weights(cfg, seed))
    traces = stack.step(random_inputs(cfg, n, seed + 1), 0)
    wc = min(n, window)
    for role, tr in zip(cfg.roles, traces):
        for t in range(n):
            win = [v for v in tr.sel[t, :wc].tolist() if v >= 0]
            assert win == list(range(max(0, t - window + 1), t + 1))
            comp = [v - n for v in tr.sel[t, wc:].tolist() if v >= 0]
            L_t = (t + 1) // role.ratio if role.ratio else 0
            assert all(0 <= j < L_t for j in comp), (role.name, t, comp, L_t)
            if role.ratio:
                assert len(comp) == min(cfg.index_topk, L_t)
