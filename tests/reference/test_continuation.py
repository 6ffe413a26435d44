"""Continuations in the reference: m > 1 tokens after position 0 (a chunk of a prompt,
or draft tokens to verify) present every token's window as decode does, so each token
equals the token-by-token decode bit for bit, whatever the chunking; and a prompt whose
first chunk holds at least min(n, window) tokens equals the one-shot prefill bit for
bit (the two basic regimes only differ on the first window − 1 positions, where the
released prefill puts its −1 entries last and decode first: attention-v41.md §4.5)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.reference.layer import RefStack, _window_selection
from helpers import random_inputs, random_weights, small_cfg, split_sizes

FIELDS = ("q", "o", "out")


def _cfg(window, topk, ratios, n):
    return small_cfg(
        window=window, index_topk=topk, compress_ratios=ratios, head_dim=64, rope_dim=16, max_seq=n, max_tokens=n
    )


def _chunked(cfg, w, xs, chunks, index_keys="own"):
    """Run the prompt in `chunks` (sizes); returns per-token traces [(layer trace, row)]
    per position, and the stack."""
    ref = RefStack(cfg, w, index_keys=index_keys)
    per_pos, s = {}, 0
    for c in chunks:
        tr = ref.step([x[s : s + c] for x in xs], s)
        for t in range(c):
            per_pos[s + t] = [(tr[i], t) for i in range(cfg.n_layers)]
        s += c
    return per_pos, ref


def _positions(trace, row, width_win):
    """The selection of one token as (window positions, compressed rows), in order."""
    sel = trace.sel[row].tolist()
    return sel[:width_win], sel[width_win:]


def _assert_states_equal(a: RefStack, b: RefStack):
    for i, (x, y) in enumerate(zip(a.states, b.states)):
        assert x.n_rows == y.n_rows, f"L{i} n_rows"
        for k in ("ring", "comp_a", "comp_g", "compress_kv", "index_k"):
            if getattr(x, k) is not None:
                assert torch.equal(getattr(x, k), getattr(y, k)), f"L{i} {k}"


def _chunks_strategy(n):
    return st.lists(st.integers(1, n), min_size=1, max_size=8).map(lambda cs: split_sizes(cs, n))


GEOMETRIES = [
    (8, 6, (0, 2, 2, 1, 1, 1)),
    (16, 8, (0, 4, 4, 1, 1, 1)),
    (8, 6, (0, 4, 4, 2, 2, 2)),
    (80, 16, (0, 2, 2, 1, 1, 1)),  # two softmax blocks in the window part
]


@settings(max_examples=20, deadline=None)
@given(geo=st.sampled_from(GEOMETRIES), data=st.data(), seed=st.integers(0, 1000))
def test_continuation_equals_token_by_token_decode(geo, data, seed):
    window, topk, ratios = geo
    n = data.draw(st.integers(2, 100))
    first = data.draw(st.integers(1, n - 1))
    chunks = [first] + data.draw(_chunks_strategy(n - first))
    cfg = _cfg(window, topk, ratios, 100)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, n, seed + 1)
    per_pos, chunked = _chunked(cfg, w, xs, chunks)
    dec = RefStack(cfg, w)
    dec.step([x[:first] for x in xs], 0)
    for p in range(first, n):
        steps = dec.step([x[p : p + 1] for x in xs], p)
        for i, (tr, row) in enumerate(per_pos[p]):
            for f in FIELDS:
                assert torch.equal(getattr(tr, f)[row], getattr(steps[i], f)[0]), f"p{p} L{i} {f} ({chunks})"
            # the same rows in the same columns: window positions, then compressed rows
            win_c = _window_positions(tr, row, p, chunk_start(chunks, p), window)
            win_d = _window_positions(steps[i], 0, p, p, window)
            assert win_c == win_d, f"p{p} L{i} window columns"
            off_c = tr.kv_win.shape[0]
            comp_c = [v - off_c if v >= 0 else -1 for v in tr.sel[row, window:].tolist()]
            comp_d = [v - window if v >= 0 else -1 for v in steps[i].sel[0, window:].tolist()]
            k = max(len(comp_c), len(comp_d))
            pad = [-1] * k
            assert (comp_c + pad)[:k] == (comp_d + pad)[:k], f"p{p} L{i} compressed selection"
    _assert_states_equal(chunked, dec)


def _window_positions(trace, row, p, s, window):
    """The positions in a token's window columns: a one-token call's (decode) ring slots
    hold positions p−W+1+c; a continuation's entries index its context rows from
    max(0, s−W+1)."""
    vals = trace.sel[row, :window].tolist()
    if trace.sel.shape[0] == 1 and s == p:
        return [-1 if v < 0 else p - window + 1 + c for c, v in enumerate(vals)]
    return [-1 if v < 0 else v + max(0, s - window + 1) for v in vals]


def chunk_start(chunks, p):
    s = 0
    for c in chunks:
        if p < s + c:
            return s
        s += c
    raise AssertionError(p)


@settings(max_examples=15, deadline=None)
@given(geo=st.sampled_from(GEOMETRIES), data=st.data(), seed=st.integers(0, 1000))
def test_chunked_prefill_equals_one_shot_when_the_first_chunk_covers_the_window(geo, data, seed):
    window, topk, ratios = geo
    n = data.draw(st.integers(1, 100))
    first = data.draw(st.integers(min(n, window), n))
    chunks = [first] + (data.draw(_chunks_strategy(n - first)) if n > first else [])
    cfg = _cfg(window, topk, ratios, 100)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, n, seed + 1)
    per_pos, chunked = _chunked(cfg, w, xs, chunks)
    one = RefStack(cfg, w)
    whole = one.step(xs, 0)
    for p in range(n):
        for i, (tr, row) in enumerate(per_pos[p]):
            for f in FIELDS:
                assert torch.equal(getattr(tr, f)[row], getattr(whole[i], f)[p]), f"p{p} L{i} {f} ({chunks})"
    for i in range(cfg.n_layers):
        if whole[i].compress_kv is not None:
            L = whole[i].compress_kv.shape[0]
            assert torch.equal(chunked.states[i].compress_kv[:L], whole[i].compress_kv), f"L{i} rows"
            assert torch.equal(chunked.states[i].index_k[:L], whole[i].index_k), f"L{i} keys"
    _assert_states_equal(chunked, one)


def test_early_tokens_of_a_later_chunk_take_the_decode_layout():
    """The one place the regimes differ: a token at p < window − 1 in a later chunk has
    decode's bits, not the one-shot prefill's (which puts its −1 entries last); both are
    the basic regimes' results for that token. Pinned so the difference stays where
    the docstrings say it is."""
    cfg = _cfg(80, 16, (0, 2, 2, 1, 1, 1), 100)
    w, xs = random_weights(cfg, 5), random_inputs(cfg, 90, 6)
    per_pos, _ = _chunked(cfg, w, xs, [10, 80])
    whole = RefStack(cfg, w).step(xs, 0)
    differs = [
        p
        for p in range(10, 90)
        if not all(torch.equal(tr.o[row], whole[i].o[p]) for i, (tr, row) in enumerate(per_pos[p]))
    ]
    assert differs, "expected some early token of the second chunk to differ from the one-shot prefill"
    assert max(differs) < cfg.window - 1


@pytest.mark.parametrize("p, m", [(1, 3), (5, 4), (7, 9), (30, 2)])
def test_window_selection_of_a_continuation_is_the_decode_layout(p, m):
    cfg = small_cfg(window=8)
    W = cfg.window
    cont = _window_selection(cfg, m, p, "cpu")
    base = max(0, p - W + 1)
    for t in range(m):
        dec = _window_selection(cfg, 1, p + t, "cpu")[0]
        # decode's ring slots hold positions p+t−W+1 … p+t in these columns (−1 where negative)
        pos_d = [-1 if v < 0 else p + t - W + 1 + c for c, v in enumerate(dec.tolist())]
        pos_c = [-1 if v < 0 else v + base for v in cont[t].tolist()]
        assert pos_c == pos_d
