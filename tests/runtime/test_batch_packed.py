"""`kv_format="packed"`: a batch whose rings, compressed rows and index keys are stored in
V4.1's byte formats gives the bytes of the same batch over bf16 caches, in every output
and in every cache row (unpacked), through prompts, decode tokens, chunks, restarts,
verifies with rollbacks and graph-driver steps (CPU)."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.runtime import BatchGraphs, BatchV41, SeqPool
from attnv41.weights import AttnV41LayerWeights
from helpers import random_inputs, random_weights, small_cfg
from runtime.test_batch import RATIOS, _schedule


def _pair(ratios, window, seed, n_slots, block_rows):
    cfg = small_cfg(window=window, index_topk=6, compress_ratios=ratios, max_seq=64, max_tokens=64)
    w = random_weights(cfg, seed)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    xs = [random_inputs(cfg, 64, seed + 100 + k) for k in range(n_slots)]
    mk = lambda f: BatchV41(cfg, n_slots=n_slots, block_rows=block_rows, kv_format=f)  # noqa: E731
    return cfg, wts, xs, mk("bf16"), mk("packed")


def _same_caches(cfg, a, b):
    for sl in range(a.pool.n_slots):
        n = a.pool.length[sl]
        for i in cfg.kv_source_layers:
            L = -(-n // cfg.roles[i].ratio)
            for keys in (False, True):
                u, v = a.pool.cache_rows(i, sl, L, keys), b.pool.cache_rows(i, sl, L, keys)
                assert torch.equal(u.view(torch.int16), v.view(torch.int16)), f"slot {sl} L{i} keys={keys}"
        W = cfg.window
        rows = torch.arange(sl * W, (sl + 1) * W)
        for i in range(cfg.n_layers):
            assert torch.equal(
                a.pool.window_rows(i, rows).view(torch.int16), b.pool.window_rows(i, rows).view(torch.int16)
            )


@settings(max_examples=8, deadline=None)
@given(
    ratios=st.sampled_from(RATIOS),
    window=st.sampled_from([4, 8]),
    block_rows=st.sampled_from([1, 4]),
    seed=st.integers(0, 10_000),
)
def test_packed_caches_give_the_bytes_of_bf16_caches(ratios, window, block_rows, seed):
    cfg, wts, xs, a, b = _pair(ratios, window, seed, 3, block_rows)
    rng = random.Random(seed)
    for j, (slots, starts, lens) in enumerate(_schedule(rng, 3, 8)):
        # the schedule's starts ignore the rollbacks (which only shorten): continue where
        # each slot is now
        starts = [0 if s == 0 else a.pool.length[sl] for sl, s in zip(slots, starts)]
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        oa, ob = a.step(wts, bx, slots, starts, lens), b.step(wts, bx, slots, starts, lens)
        for i in range(cfg.n_layers):
            assert torch.equal(oa[i].view(torch.int16), ob[i].view(torch.int16)), f"step {j} L{i}"
        for sl, s, m in zip(slots, starts, lens):  # a verify of 2..window tokens: roll half of them back
            if s > 0 and 2 <= m <= window and rng.random() < 0.5:
                p = s + rng.randint(0, m)
                a.rollback(sl, p)
                b.rollback(sl, p)
    _same_caches(cfg, a, b)
    # decode steps through the graph driver (its body eagerly on the CPU), padded
    ga, gb = BatchGraphs(a, wts, sizes=(4,), bucket_min=8), BatchGraphs(b, wts, sizes=(4,), bucket_min=8)
    live = [s for s in range(3) if 0 < a.pool.length[s] < 60]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        if not live:
            break
        x = torch.randn(cfg.n_layers, len(live), cfg.dim, generator=gen).to(torch.bfloat16)
        ya, yb = ga.step(x, live), gb.step(x, live)
        assert torch.equal(ya.view(torch.int16), yb.view(torch.int16))
    _same_caches(cfg, a, b)


def test_packed_pool_bytes():
    cfg = small_cfg(window=8, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=64, max_tokens=16)
    p, q = SeqPool(cfg, 2, kv_format="packed"), SeqPool(cfg, 2)
    assert p.ring[0].dtype == torch.uint8 and p.ring[0].shape[1] == cfg.head_dim + cfg.head_dim // 32
    assert p.compress_kv[1].shape[1] == cfg.head_dim // 2 + cfg.head_dim // 16
    assert p.index_k[1].shape[1] == cfg.index_head_dim // 2 + cfg.index_head_dim // 32
    nbytes = lambda pool: sum(
        t.numel() * t.element_size() for t in (*pool.ring, *pool.compress_kv.values(), *pool.index_k.values())
    )  # noqa: E731
    assert nbytes(p) * 3 < nbytes(q)
    with pytest.raises(ValueError, match="kv_format = 'fp8'; allowed: 'bf16', 'packed'"):
        SeqPool(cfg, 2, kv_format="fp8")


@pytest.mark.gpu
def test_packed_caches_on_cuda():
    """On CUDA (the Triton kernels reading packed rows in place): a schedule of prompts,
    chunks and decode tokens gives the bytes of the bf16-cache batch."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(window=8, index_topk=6, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=64, max_tokens=64)
    w = random_weights(cfg, 5)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg, device="cuda") for i in range(cfg.n_layers)]
    xs = [random_inputs(cfg, 64, 105 + k) for k in range(3)]
    a = BatchV41(cfg, "cuda", n_slots=3, block_rows=4)
    b = BatchV41(cfg, "cuda", n_slots=3, block_rows=4, kv_format="packed")
    for j, (slots, starts, lens) in enumerate(_schedule(random.Random(5), 3, 8)):
        bx = [
            torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]).cuda()
            for i in range(cfg.n_layers)
        ]
        oa, ob = a.step(wts, bx, slots, starts, lens), b.step(wts, bx, slots, starts, lens)
        for i in range(cfg.n_layers):
            assert torch.equal(oa[i].view(torch.int16), ob[i].view(torch.int16)), f"step {j} L{i}"
    _same_caches(cfg, a, b)
