"""Reindex layers over their candidates only (`runtime.ops.compacts`): once a bucket is
wider than the candidate mask, a reindex layer scores the rows of the kept blocks the
candidate source wrote (ascending ids) and maps its top-k back to positions. On the CPU the
torch twins run it when a table asks for it (TORCH_OPS does not): every traced value, the
reindex layers' recorded scores (the gathered scores at their positions) included, equals
the reference bit for bit, single-sequence (eager and device-driven decode) and batched."""

import dataclasses
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from attnv41.runtime import ops as runtime_ops
from attnv41.runtime.batch import BatchV41
from attnv41.runtime.batch_graphs import BatchGraphs
from attnv41.runtime.graphs import DecodeGraphs
from attnv41.runtime.ops import TORCH_OPS, compacts
from helpers import assert_same_run, random_inputs, random_weights, small_cfg
from runtime.test_batch import _run, _schedule, _setup

COMPACT = dataclasses.replace(TORCH_OPS, name="torch-compact", compact_reindex=True)


def _counting():
    """COMPACT with a count of the top-k calls that took the gathered form."""
    calls = []

    def topk_fixed(*a, **kw):
        calls.append(kw.get("ids") is not None)
        return TORCH_OPS.topk_fixed(*a, **kw)

    return dataclasses.replace(COMPACT, topk_fixed=topk_fixed), calls


def _same_traced_steps(cfg, wts, xs, sched, bt, full):
    """The schedule's steps through two batches layer by layer: the same outputs, and slot
    1's trace (scores at their positions, candidates, selections) the same."""
    bt.trace_slot = full.trace_slot = 1
    for slots, starts, lens in sched:
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        sa, sb = bt.begin(slots, starts, lens), full.begin(slots, starts, lens)
        for i in range(cfg.n_layers):
            assert torch.equal(bt.forward(wts[i], bx[i], sa), full.forward(wts[i], bx[i], sb)), f"{slots} L{i}"
            if 1 in slots:
                for k in full.trace:
                    x, y = bt.trace[k], full.trace[k]
                    assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f"trace {k} L{i}"


def test_which_geometries_and_widths_compact():
    cfg = small_cfg(cand_blocks=4, cand_block=2, index_topk=6)  # 8 candidate positions
    assert not compacts(TORCH_OPS, cfg, 100), "TORCH_OPS keeps the full form"
    assert [compacts(COMPACT, cfg, w) for w in (7, 8, 9, 64)] == [False, False, True, True]
    assert compacts(COMPACT, small_cfg(cand_blocks=4, cand_block=2, index_topk=7), 9)
    assert not compacts(COMPACT, small_cfg(cand_blocks=4, cand_block=2, index_topk=8), 9), "top-k past the promise"
    runtime_ops.COMPACT_REINDEX = False
    try:
        assert not compacts(COMPACT, cfg, 64)
    finally:
        runtime_ops.COMPACT_REINDEX = True


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 40),
    decode_steps=st.integers(1, 10),
    cand=st.sampled_from([(4, 2, 6), (2, 4, 5), (3, 1, 3), (4, 2, 9)]),
    ratios=st.sampled_from([(0, 2, 2, 1, 1, 1), (0, 1, 1, 1, 1, 1), (0, 4, 4, 2, 2, 2)]),
    index_keys=st.sampled_from(["own", "released"]),
    bucket_min=st.sampled_from([1, 4, 64]),
    seed=st.integers(0, 10_000),
)
def test_compact_reindex_equals_the_reference_bit_for_bit(n, decode_steps, cand, ratios, index_keys, bucket_min, seed):
    """(cand_blocks, cand_block, index_topk): the last case has a top-k wider than the
    promise allows, so its reindex layers keep the full form (still equal)."""
    cb_n, cb, topk = cand
    cfg = small_cfg(cand_blocks=cb_n, cand_block=cb, index_topk=topk, compress_ratios=ratios, max_seq=56, max_tokens=56)
    w = random_weights(cfg, seed)
    xs = random_inputs(cfg, n + decode_steps, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=bucket_min, ops=COMPACT)
    for i in range(cfg.n_layers):
        assert_same_run(ref.layer(i, xs[i][:n], 0), rt.layer(i, xs[i][:n], 0), f"prefill L{i}")
    for p in range(n, n + decode_steps):
        for i in range(cfg.n_layers):
            assert_same_run(ref.layer(i, xs[i][p : p + 1], p), rt.layer(i, xs[i][p : p + 1], p), f"decode{p} L{i}")


def test_compact_decode_steps_equal_the_full_form_bytes():
    """Decode steps (the device-driven kernels a graph captures, run eagerly) with and
    without the compact form, across buckets past the mask's width: the same outputs."""
    cfg = small_cfg(max_seq=64, max_tokens=64)
    w, xs = random_weights(cfg, 11), random_inputs(cfg, 60, 12)
    ops, calls = _counting()
    a, b = RuntimeStack(cfg, w, ops=ops, bucket_min=4), RuntimeStack(cfg, w, bucket_min=4)
    a.step([x[:5] for x in xs], 0), b.step([x[:5] for x in xs], 0)
    for p in range(5, 60):
        ya, yb = a.step([x[p : p + 1] for x in xs], p, keep=True), b.step([x[p : p + 1] for x in xs], p, keep=True)
        for i in range(cfg.n_layers):
            assert torch.equal(ya[i], yb[i]), f"p {p} L{i}"
    assert sum(calls) >= 40, f"{sum(calls)} of {len(calls)} top-k calls gathered"  # layer 5 from p ≈ 8 on


@pytest.mark.parametrize("seed", [3, 4])
def test_batched_compact_reindex_equals_each_sequence_alone(seed):
    """BatchV41 with the compact form against each sequence's own (full-form) run; the
    traced slot's record equals the full-form batch's."""
    sched = _schedule(random.Random(seed), 3, 10)
    cfg, w, wts, xs, _ = _setup((0, 2, 2, 1, 1, 1), 8, seed, 3, 4)
    ops, calls = _counting()
    bt = BatchV41(cfg, n_slots=3, block_rows=4, ops=ops)
    _run(cfg, w, wts, xs, bt, sched)
    assert sum(calls) > 0, "no step took the compact form"
    bt = BatchV41(cfg, n_slots=3, block_rows=4, ops=COMPACT)
    full = BatchV41(cfg, n_slots=3, block_rows=4)
    _same_traced_steps(cfg, wts, xs, sched, bt, full)


def test_decode_driver_with_the_compact_form_passes_its_oracle():
    """DecodeGraphs (on the CPU the whole step eagerly) over the compact form: its oracle
    (eager forward on saved state: outputs, caches, scores, selections, mask, kept ids)
    passes at every step, and the outputs equal the full form's driver."""
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, 41), random_inputs(cfg, 40, 42)
    ops, calls = _counting()
    a, b = RuntimeStack(cfg, w, bucket_min=4, ops=ops), RuntimeStack(cfg, w, bucket_min=4)
    for s in (a, b):
        s.step([x[:11] for x in xs], 0)
    da, db = DecodeGraphs(a, oracle=True), DecodeGraphs(b)
    for p in range(11, 40):
        ya, yb = da.step([x[p : p + 1] for x in xs], p), db.step([x[p : p + 1] for x in xs], p)
        for i in range(cfg.n_layers):
            assert torch.equal(ya[i], yb[i]), f"p{p} L{i}"
            role = cfg.roles[i]
            if role.is_index_source and (p + 1) // role.ratio > 0:  # what the golden split replay records
                sa = a.attn.decode_index_score(role, da._keys[i], p)
                sb = b.attn.decode_index_score(role, db._keys[i], p)
                assert torch.equal(sa.view(torch.int16), sb.view(torch.int16)), f"p{p} L{i} scores"
    assert da.oracle_checks == 29 and any(calls)


def _batched_graph_steps(cfg, wts, xs, device, kv_format="bf16", ops=None, tile_entries=None):
    """12 BatchGraphs decode steps of 3 sequences prefilled to 30, 45 and 60 tokens (the
    prompts' index scores in tiles of tile_entries when given)."""
    bt = BatchV41(cfg, device=device, n_slots=3, block_rows=4, kv_format=kv_format, ops=ops)
    if tile_entries:
        bt.attn.index_tile_entries = tile_entries
    lens = [30, 45, 60]
    for sl, n in enumerate(lens):
        bt.step(wts, [x[:n] for x in xs], [sl], [0], [n])
    g = BatchGraphs(bt, wts, sizes=(3,))
    got = []
    for k in range(12):
        xb = torch.stack([xs[i][[lens[0] + k, lens[1] + k, lens[2] + k]] for i in range(cfg.n_layers)])
        got.append(g.step(xb, [0, 1, 2]).clone())
    return torch.stack(got)


def test_batched_graph_steps_with_the_compact_form_equal_the_full_form():
    """BatchGraphs (on the CPU its steps eagerly) with the compact form: the full form's bytes."""
    cfg = small_cfg(max_seq=96, max_tokens=96)
    w, xs = random_weights(cfg, 7), random_inputs(cfg, 90, 8)
    wts = RuntimeStack(cfg, w).weights
    ops, calls = _counting()
    assert torch.equal(_batched_graph_steps(cfg, wts, xs, "cpu", ops=ops), _batched_graph_steps(cfg, wts, xs, "cpu"))
    assert any(calls)


def _flip(on: bool):
    runtime_ops.COMPACT_REINDEX = on


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_cuda_graphs_with_the_compact_form_give_the_full_form_bytes(kv_format):
    """On CUDA (the Triton kernels: gathered scores, kept ids, mapped top-k): DecodeGraphs
    replays with the compact form, its oracle on, equal the full form's replays byte for
    byte across buckets past the mask's width; BatchGraphs steps likewise."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(max_seq=96, max_tokens=96)
    w, xs = random_weights(cfg, 7), random_inputs(cfg, 90, 8)
    xs = [x.cuda() for x in xs]
    a = RuntimeStack(cfg, w, device="cuda", bucket_min=16, kv_format=kv_format)
    b = RuntimeStack(cfg, w, device="cuda", bucket_min=16, kv_format=kv_format)
    try:  # the prompt: the reindex layer's prefill over its candidates (a) against the full form (b)
        _flip(True)
        ya = a.step([x[:20] for x in xs], 0, keep=True)
        _flip(False)
        yb = b.step([x[:20] for x in xs], 0, keep=True)
        for i in range(cfg.n_layers):
            assert torch.equal(ya[i], yb[i]), f"prompt L{i}"
    finally:
        _flip(True)
    da, db = DecodeGraphs(a, oracle=True), DecodeGraphs(b)
    assert da.use_graphs
    try:
        for p in range(20, 90):
            _flip(True)
            ya = da.step([x[p : p + 1] for x in xs], p)
            _flip(False)
            yb = db.step([x[p : p + 1] for x in xs], p)
            for i in range(cfg.n_layers):
                assert torch.equal(ya[i], yb[i]), f"p{p} L{i}"
        da.oracle_flush()
        # batched: 3 sequences at mixed positions, graph steps, compact against full
        for tiles in (None, 40):  # 40 entries: the prompts scored a token or two at a time
            _flip(True)
            ya = _batched_graph_steps(cfg, a.weights, xs, "cuda", kv_format, tile_entries=tiles)
            _flip(False)
            yb = _batched_graph_steps(cfg, a.weights, xs, "cuda", kv_format, tile_entries=tiles)
            assert torch.equal(ya, yb), f"tiles {tiles}"
    finally:
        _flip(True)


@settings(max_examples=8, deadline=None)
@given(tile_entries=st.sampled_from([1, 7, 60, 1 << 26]), seed=st.integers(0, 10_000))
def test_batched_compact_reindex_in_tiles_equals_each_sequence_alone(tile_entries, seed):
    """With the step's tokens scored in tiles (a long chunk at a 1M context), the candidate
    source publishes kept block ids, which the reindex layers gather from, tile by tile:
    every sequence's outputs equal its own run's, and the traced record the full form's."""
    sched = _schedule(random.Random(seed), 3, 8)
    cfg, w, wts, xs, _ = _setup((0, 2, 2, 1, 1, 1), 8, seed, 3, 4)
    ops, calls = _counting()
    bt = BatchV41(cfg, n_slots=3, block_rows=4, ops=ops)
    bt.attn.index_tile_entries = tile_entries
    _run(cfg, w, wts, xs, bt, sched)
    assert any(calls), "no step took the compact form"
    bt = BatchV41(cfg, n_slots=3, block_rows=4, ops=ops)
    full = BatchV41(cfg, n_slots=3, block_rows=4)
    bt.attn.index_tile_entries = full.attn.index_tile_entries = tile_entries
    _same_traced_steps(cfg, wts, xs, sched, bt, full)


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(2, 48),
    sizes=st.lists(st.integers(1, 24), min_size=1, max_size=4),
    tile_entries=st.sampled_from([1, 5, 40, 200, 1 << 26]),
    ratios=st.sampled_from([(0, 2, 2, 1, 1, 1), (0, 1, 1, 1, 1, 1)]),
    index_keys=st.sampled_from(["own", "released"]),
    seed=st.integers(0, 10_000),
)
def test_compact_prefill_and_continuations_equal_the_reference(n, sizes, tile_entries, ratios, index_keys, seed):
    """Prompts and continuations of one sequence in chunks, with the index scores in tiles or
    not (the candidate source then publishes its mask or its kept block ids): the reindex
    layers' compact form gives every traced value of the reference bit for bit."""
    from helpers import split_sizes  # noqa: PLC0415

    cfg = small_cfg(compress_ratios=ratios, max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, n, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    ops, calls = _counting()
    rt = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=4, ops=ops)
    rt.attn.index_tile_entries = tile_entries
    s = 0
    for c in split_sizes(sizes, n):
        for i in range(cfg.n_layers):
            a, b = ref.layer(i, xs[i][s : s + c], s), rt.layer(i, xs[i][s : s + c], s)
            if tile_entries < 1 << 26:  # tiled runs record no scores and no mask (as the full form)
                a.index_score = a.index_score if b.index_score is not None else None
                a.candidates = a.candidates if b.candidates is not None else None
            assert_same_run(a, b, f"[{s}, {s + c}) L{i}")
        s += c


@pytest.mark.parametrize("tile_entries", [1, 40, 1 << 26], ids=["tiles-of-1", "tiles", "untiled"])
def test_compact_prefill_takes_the_gathered_form(tile_entries):
    """A 40-token prompt then a 6-token continuation: the reindex layer's top-k takes the
    gathered form, and every traced value (selections, outputs) equals the reference's."""
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, 21), random_inputs(cfg, 46, 22)
    ref = RefStack(cfg, w)
    ops, calls = _counting()
    rt = RuntimeStack(cfg, w, ops=ops)
    rt.attn.index_tile_entries = tile_entries
    for s, m in ((0, 40), (40, 6)):
        for i in range(cfg.n_layers):
            a, b = ref.layer(i, xs[i][s : s + m], s), rt.layer(i, xs[i][s : s + m], s)
            if tile_entries < 1 << 26:
                a.index_score = a.index_score if b.index_score is not None else None
                a.candidates = a.candidates if b.candidates is not None else None
            assert_same_run(a, b, f"[{s}, {s + m}) L{i}")
    # only layer 5 (reindex) takes a fixed top-k in a prompt: gathered, once per tile of each call
    tile = max(1, tile_entries // (cfg.cand_blocks * cfg.cand_block))
    assert all(calls) and len(calls) == -(-40 // tile) + -(-6 // tile), calls
