"""Continuations (m > 1 tokens after position 0) and rollback in the runtime, on the
CPU: bit for bit against the reference through random chunkings; speculative
decoding's verify-then-rollback equals decoding the accepted tokens one by one; the
decode split and continuations interleave; refused rollbacks name the allowed range
and change nothing."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from helpers import assert_same_run as _assert_same
from helpers import random_inputs, random_weights, small_cfg, split_sizes
from helpers import same_snapshot as _same_snapshot
from helpers import stack_snapshot as _snapshot

RATIOS = [(0, 2, 2, 1, 1, 1), (0, 4, 4, 1, 1, 1), (0, 4, 4, 2, 2, 2), (0, 1, 1, 1, 1, 1)]


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 48),
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=8),
    window=st.sampled_from([4, 8, 16]),
    topk=st.sampled_from([2, 6, 9]),
    ratios=st.sampled_from(RATIOS),
    index_keys=st.sampled_from(["own", "released"]),
    seed=st.integers(0, 10_000),
)
def test_runtime_continuations_equal_reference_bit_for_bit(n, sizes, window, topk, ratios, index_keys, seed):
    """Every trace field of every call (window rows, selections, scores, compressed rows,
    o, out), for a prompt in random chunks (some of one token: decode steps)."""
    cfg = small_cfg(window=window, index_topk=topk, compress_ratios=ratios, max_seq=48, max_tokens=48)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, n, seed + 1)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=4)
    s = 0
    for c in split_sizes(sizes, n):
        for i in range(cfg.n_layers):
            _assert_same(ref.layer(i, xs[i][s : s + c], s), rt.layer(i, xs[i][s : s + c], s), f"[{s}, {s + c}) L{i}")
        s += c


def _outs(rt, xs, s, m):
    return rt.step([x[s : s + m] for x in xs], s, keep=True)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(1, 30),
    k=st.integers(2, 8),
    data=st.data(),
    ratios=st.sampled_from(RATIOS),
    seed=st.integers(0, 10_000),
)
def test_verify_then_rollback_equals_decoding_the_accepted_tokens(n, k, data, ratios, seed):
    """Speculative decoding: k tokens verified in one call, the first j accepted, the
    sequence rolled back to n + j; then decode. Against a run that decodes the j
    accepted tokens one by one: the accepted tokens' outputs and every later output are
    the same bytes. A second verify is rolled back twice (a partial group, then its start)."""
    j = data.draw(st.integers(0, k))
    cfg = small_cfg(window=8, compress_ratios=ratios, max_seq=64, max_tokens=64)
    w, xs, drafts = random_weights(cfg, seed), random_inputs(cfg, 64, seed + 1), random_inputs(cfg, 64, seed + 2)
    a, b = RuntimeStack(cfg, w), RuntimeStack(cfg, w)
    _outs(a, xs, 0, n)
    _outs(b, xs, 0, n)
    verify = a.step([torch.cat([x[n : n + j], d[n + j : n + k]]) for x, d in zip(xs, drafts)], n, keep=True)
    a.rollback(n + j)
    for p in range(n, n + j):
        ob = _outs(b, xs, p, 1)
        for i in range(cfg.n_layers):
            assert torch.equal(ob[i][0], verify[i][p - n]), f"accepted p{p} L{i}"
    p = n + j
    for q in range(p, p + 6):
        oa, ob = _outs(a, xs, q, 1), _outs(b, xs, q, 1)
        assert all(torch.equal(u, v) for u, v in zip(oa, ob)), f"after the rollback, p{q}"
    p += 6
    _outs(a, drafts, p, 5)
    a.rollback(p + 3)
    a.rollback(p)
    for q in range(p, p + 5):
        oa, ob = _outs(a, xs, q, 1), _outs(b, xs, q, 1)
        assert all(torch.equal(u, v) for u, v in zip(oa, ob)), f"after the second rollback, p{q}"


def test_continuation_then_decode_split_equals_forward():
    """decode_prep/decode_body after a continuation and after a rollback give forward's bytes."""
    cfg = small_cfg(window=8, max_seq=64, max_tokens=64)
    w, xs = random_weights(cfg, 7), random_inputs(cfg, 64, 8)
    a, b = RuntimeStack(cfg, w), RuntimeStack(cfg, w)
    for rt in (a, b):
        _outs(rt, xs, 0, 11)
        _outs(rt, xs, 11, 6)
        rt.rollback(14)
    for p in range(14, 20):
        ob = _outs(b, xs, p, 1)
        for i in range(cfg.n_layers):
            wi = a.weights[i]
            rows = a.attn.decode_prep(wi, a.shared, p)
            out = a.attn.decode_body(wi, a.states[i], xs[i][p : p + 1], rows)
            assert torch.equal(out, ob[i]), f"p{p} L{i}"


def _stack():
    cfg = small_cfg(window=8, max_seq=64, max_tokens=64)
    w, xs = random_weights(cfg, 21), random_inputs(cfg, 64, 22)
    rt = RuntimeStack(cfg, w)
    _outs(rt, xs, 0, 13)
    return rt, xs


def _after_verify():
    rt, xs = _stack()
    _outs(rt, xs, 13, 5)
    return rt, xs


REFUSED = {
    "after_prefill": (_stack, lambda rt: rt.rollback(10), "kept no undo log; allowed: pos = 13 (no change)"),
    "after_decode": (
        lambda: (lambda r: (_outs(r[0], r[1], 13, 1), r)[1])(_stack()),
        lambda rt: rt.rollback(13),
        "kept no undo log",
    ),
    "before_the_continuation": (_after_verify, lambda rt: rt.rollback(12), "pos = 12; allowed: 13..18"),
    "past_the_end": (_after_verify, lambda rt: rt.rollback(19), "pos = 19; allowed: 13..18"),
    "past_an_earlier_rollback": (
        lambda: (lambda r: (r[0].rollback(15), r)[1])(_after_verify()),
        lambda rt: rt.rollback(16),
        "pos = 16; allowed: 13..15",
    ),
    "too_long_to_undo": (
        lambda: (lambda r: (_outs(r[0], r[1], 13, 9), r)[1])(_stack()),
        lambda rt: rt.rollback(15),
        "continuation of 2..8 tokens",
    ),
    "mid_step": (
        lambda: (lambda r: (r[0].layer(0, r[1][0][18:19], 18), r)[1])(_after_verify()),
        lambda rt: rt.rollback(15),
        "rollback during a step (layer 0 ran last); allowed: after layer 5",
    ),
    "states_missing": (
        _after_verify,
        lambda rt: rt.attn.rollback(rt.states[:5], rt.shared, 15),
        "states is a list of 5; allowed: the sequence's 6 layer states",
    ),
    "states_out_of_order": (
        _after_verify,
        lambda rt: rt.attn.rollback(rt.states[::-1], rt.shared, 15),
        "state of layer 5 given with weights of layer 0",
    ),
    "pos_not_int": (_after_verify, lambda rt: rt.rollback(15.0), "pos = 15.0 is a float; allowed: int"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_refused_rollback_names_the_range_and_changes_nothing(case):
    make, call, msg = REFUSED[case]
    rt, _ = make()
    before = _snapshot(rt)
    with pytest.raises((ValueError, TypeError)) as e:
        call(rt)
    assert msg in str(e.value), str(e.value)
    _same_snapshot(before, _snapshot(rt))


def test_rollback_needs_own_index_keys():
    cfg = small_cfg(window=8, max_seq=64, max_tokens=64)
    w, xs = random_weights(cfg, 3), random_inputs(cfg, 64, 4)
    rt = RuntimeStack(cfg, w, index_keys="released")
    _outs(rt, xs, 0, 9)
    _outs(rt, xs, 9, 3)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=r"rollback to 10 with index_keys = 'released'; allowed: 'own', or pos = 12"):
        rt.rollback(10)
    _same_snapshot(before, _snapshot(rt))
    rt.rollback(12)  # the no-op is allowed in every mode (an engine that accepted every draft)
    _same_snapshot(before, _snapshot(rt))


def test_rollback_to_the_current_end_is_a_no_op():
    rt, xs = _stack()
    before = _snapshot(rt)
    rt.rollback(13)
    _same_snapshot(before, _snapshot(rt))


# ---------------------------------------------------------------------------- CUDA


def _live_state(rt):
    """The state a later step reads: rings, row counts, the compressor's group in progress
    (its filled slots and which are empty), and the visible cache rows."""
    out = []
    for ls in rt.states:
        d = {"ring": ls.ring.cpu().clone(), "n": (ls.n_rows, ls.next_pos)}
        if ls.role.is_kv_source:
            d["rows"] = ls.compress_kv[: ls.n_rows].cpu().clone()
            d["keys"] = ls.index_k[: ls.n_rows].cpu().clone()
            if ls.comp_a is not None:
                h = ls.next_pos % ls.role.ratio
                d["a"], d["g"] = ls.comp_a[:h].cpu().clone(), ls.comp_g.cpu().clone()
        out.append(d)
    return out


@pytest.mark.gpu
@pytest.mark.gpu_full
def test_rollback_on_cuda_restores_the_state_bit_for_bit():
    """On CUDA: a rejected verify of 7 tokens, rolled back to its start, leaves every live
    state tensor as it was before; then a continuation of 12 tokens and a decode step
    match the CPU runtime within the bf16 tolerance."""
    from attnv41.testing import compare_bf16

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(window=16, compress_ratios=(0, 4, 4, 1, 1, 1), max_seq=96, max_tokens=96)
    w, xs, drafts = random_weights(cfg, 31), random_inputs(cfg, 96, 32), random_inputs(cfg, 96, 33)
    gpu, cpu = RuntimeStack(cfg, w, device="cuda"), RuntimeStack(cfg, w)
    gpu.step([x[:21].cuda() for x in xs], 0)
    cpu.step([x[:21] for x in xs], 0)
    before = _live_state(gpu)
    gpu.step([d[21:28].cuda() for d in drafts], 21)
    gpu.rollback(21)
    after = _live_state(gpu)
    for i, (a, b) in enumerate(zip(before, after)):
        for k in a:
            same = torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
            assert same, f"L{i} {k}"
    for s, m in ((21, 12), (33, 1)):
        og = gpu.step([x[s : s + m].cuda() for x in xs], s, keep=True)
        oc = cpu.step([x[s : s + m] for x in xs], s, keep=True)
        for i in range(cfg.n_layers):
            c = compare_bf16(f"out L{i} [{s}, {s + m})", og[i].cpu(), oc[i])
            assert c.ok, c
