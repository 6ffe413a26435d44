"""A prefill or continuation whose index scores (m tokens × L keys) pass
`AttnV41.index_tile_entries` is scored in tiles of tokens (no `[m, L]` buffer: what lets a
chunk run at a 1M-token context). The bits are the untiled call's: on the CPU every trace
field equals the reference's (hypothesis over prompts, chunkings, tile sizes, ratios and
index-key modes); the published candidates (kept block ids) expand to the reference's
mask; on CUDA tiled and untiled runs give the same bytes."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.kernels.select import candidate_mask_of_blocks
from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from helpers import random_inputs, random_weights, small_cfg, split_sizes
from runtime.test_batch import _run, _schedule, _setup

RATIOS = [(0, 2, 2, 1, 1, 1), (0, 4, 4, 1, 1, 1), (0, 1, 1, 1, 1, 1)]
SAME = ("q", "kv_win", "sel", "o", "out", "compress_kv", "index_k")  # the tiled run records no scores, no mask


def _tiled(cfg, w, tile_entries, **kw):
    rt = RuntimeStack(cfg, w, **kw)
    rt.attn.index_tile_entries = tile_entries
    return rt


def _same(a, b, where):
    for n in SAME:
        x, y = getattr(a, n), getattr(b, n)
        assert (x is None) == (y is None), f"{where} {n}"
        if x is not None:
            x, y = x.cpu(), y.cpu()
            assert x.shape == y.shape and torch.equal(x.to(y.dtype), y), f"{where} {n}"
    assert a.index_k_owner == b.index_k_owner, where


def _mask(rt, L):
    c = rt.shared.candidates
    return c if c.dtype == torch.bool else candidate_mask_of_blocks(c, L, rt.cfg.cand_block)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 48),
    sizes=st.lists(st.integers(1, 24), min_size=1, max_size=4),
    tile_entries=st.sampled_from([1, 5, 40, 200]),
    ratios=st.sampled_from(RATIOS),
    index_keys=st.sampled_from(["own", "released"]),
    seed=st.integers(0, 10_000),
)
def test_tiled_index_equals_the_reference_bit_for_bit(n, sizes, tile_entries, ratios, index_keys, seed):
    cfg = small_cfg(compress_ratios=ratios, max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, n, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = _tiled(cfg, w, tile_entries, index_keys=index_keys, bucket_min=4)
    s = 0
    for c in split_sizes(sizes, n):
        for i in range(cfg.n_layers):
            a = ref.layer(i, xs[i][s : s + c], s)
            _same(a, rt.layer(i, xs[i][s : s + c], s), f"[{s}, {s + c}) L{i}")
            if i == cfg.candidate_source_layer and c > 1 and a.candidates is not None:
                assert torch.equal(_mask(rt, a.candidates.shape[1]), a.candidates), f"[{s}, {s + c}) candidates"
        s += c


def test_tiles_are_used_and_publish_block_ids():
    """One token per tile: the candidate source publishes kept block ids (int32, at most
    cand_blocks per token), the run records no scores; a decode step after it runs."""
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, 5), random_inputs(cfg, 40, 6)
    rt, full = _tiled(cfg, w, 1), RuntimeStack(cfg, w)
    runs = [rt.layer(i, xs[i][:39], 0) for i in range(cfg.n_layers)]
    want = [full.layer(i, xs[i][:39], 0) for i in range(cfg.n_layers)]
    i = cfg.candidate_source_layer
    cand = rt.shared.candidates
    assert cand.dtype == torch.int32 and cand.shape == (39, cfg.cand_blocks), cand.shape
    assert runs[i].index_score is None and runs[i].candidates is None
    L = want[i].candidates.shape[1]
    assert torch.equal(candidate_mask_of_blocks(cand, L, cfg.cand_block), want[i].candidates)
    for a, b in zip(want, runs):
        _same(a, b, "prefill")
    for i in range(cfg.n_layers):
        _same(full.layer(i, xs[i][39:40], 39), rt.layer(i, xs[i][39:40], 39), f"decode L{i}")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_tile_entries_are_refused(bad):
    from attnv41.runtime import AttnV41

    with pytest.raises(ValueError, match="index_tile_entries = .*; allowed: an int >= 1"):
        AttnV41(small_cfg(), index_tile_entries=bad)


@pytest.mark.gpu
def test_tiled_index_on_cuda_gives_the_untiled_bytes():
    """On CUDA (index_scores: one program per token; mask and top-k row-wise): a prefill
    and a continuation in tiles of 1 and 3 tokens give the untiled run's bytes."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(compress_ratios=(0, 4, 4, 1, 1, 1), max_seq=96, max_tokens=96)
    w, xs = random_weights(cfg, 41), random_inputs(cfg, 96, 42)
    stacks = [RuntimeStack(cfg, w, device="cuda")] + [_tiled(cfg, w, e, device="cuda") for e in (1, 3 * 40)]
    for s, m in ((0, 61), (61, 30), (91, 1)):
        runs = [[rt.layer(i, xs[i][s : s + m].cuda(), s) for i in range(cfg.n_layers)] for rt in stacks]
        for other in runs[1:]:
            for i in range(cfg.n_layers):
                _same(runs[0][i], other[i], f"[{s}, {s + m}) L{i}")


@settings(max_examples=8, deadline=None)
@given(
    tile_entries=st.sampled_from([1, 7, 60]),
    ratios=st.sampled_from(RATIOS),
    seed=st.integers(0, 10_000),
)
def test_batched_steps_in_tiles_equal_each_sequence_alone(tile_entries, ratios, seed):
    """BatchV41 scores a step's tokens in tiles past index_tile_entries: every sequence's
    outputs and cache rows still equal its own single-sequence run, and the traced
    slot's record (what `check --batch` compares: scores, candidates, selections) is the
    untiled step's, layer by layer."""
    sched = _schedule(random.Random(seed), 3, 8)
    cfg, w, wts, xs, bt = _setup(ratios, 8, seed, 3, 4)
    *_, full = _setup(ratios, 8, seed, 3, 4)
    bt.attn.index_tile_entries = tile_entries
    _run(cfg, w, wts, xs, bt, sched)  # against each sequence alone
    cfg, w, wts, xs, bt = _setup(ratios, 8, seed, 3, 4)
    bt.attn.index_tile_entries = tile_entries
    bt.trace_slot = full.trace_slot = 1
    for slots, starts, lens in sched:
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        sa, sb = bt.begin(slots, starts, lens), full.begin(slots, starts, lens)
        for i in range(cfg.n_layers):
            ya, yb = bt.forward(wts[i], bx[i], sa), full.forward(wts[i], bx[i], sb)
            assert torch.equal(ya, yb), f"{slots} {starts} {lens} L{i}"
            if 1 in slots:
                assert bt.trace.keys() == full.trace.keys(), i
                for k, v in full.trace.items():
                    u = bt.trace[k]
                    same = torch.equal(u, v) if isinstance(v, torch.Tensor) else u == v
                    assert same, f"{slots} {starts} {lens} L{i} trace {k}"
