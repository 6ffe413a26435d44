"""The runtime's contract on bad calls (issue 10): every bad call of the decode split,
the graph driver and the eager path raises a clear error before any state is written,
and a corrected retry then works and gives the same bytes as an undisturbed run."""

import pytest
import torch

from attnv41.runtime import AttnV41, RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from helpers import random_inputs, random_weights, small_cfg

PREFILL = 13


@pytest.fixture(scope="module")
def setup():
    cfg = small_cfg()
    return cfg, random_weights(cfg, 21), random_inputs(cfg, 24, 22)


def _stack(setup, steps: int = 1, **kw) -> RuntimeStack:
    """A stack after the 13-token prefill and `steps` decode steps through forward."""
    cfg, w, xs = setup
    rt = RuntimeStack(cfg, w, **kw)
    rt.step([x[:PREFILL] for x in xs], 0)
    for p in range(PREFILL, PREFILL + steps):
        rt.step([x[p : p + 1] for x in xs], p)
    return rt


def _snapshot(rt: RuntimeStack):
    states = [{k: v.clone() for k, v in s.tensors().items()} | {"n": (s.n_rows, s.next_pos)} for s in rt.states]
    return states, rt.shared.snapshot()


def _assert_unchanged(before, rt: RuntimeStack):
    (sa, ha), (sb, hb) = before, _snapshot(rt)
    for i, (a, b) in enumerate(zip(sa, sb)):
        for k in a:
            same = torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
            assert same, f"layer {i} state {k} changed"
    for k in ha:
        same = torch.equal(ha[k], hb[k]) if isinstance(ha[k], torch.Tensor) else ha[k] == hb[k]
        assert same, f"shared {k} changed: {ha[k]} -> {hb[k]}"


def _split_step(rt: RuntimeStack, xs, p: int) -> list[torch.Tensor]:
    """One decode step: capturable layers through decode_prep/decode_body, sources through forward."""
    attn, outs = rt.attn, []
    for i in range(rt.cfg.n_layers):
        x = xs[i][p : p + 1]
        if attn.decode_capturable(rt.weights[i]):
            rows = attn.decode_prep(rt.weights[i], rt.shared, p)
            outs.append(attn.decode_body(rt.weights[i], rt.states[i], x, rows).clone())
        else:
            outs.append(rt.layer(i, x, p).out.clone())
    return outs


def _assert_retry_matches(setup, rt: RuntimeStack, p: int):
    """The next step through the split path equals a clean stack's forward step, bytes and rings."""
    xs = setup[2]
    clean = _stack(setup, steps=p - PREFILL)
    want = clean.step([x[p : p + 1] for x in xs], p, keep=True)
    got = _split_step(rt, xs, p)
    for i, (a, b) in enumerate(zip(want, got)):
        assert torch.equal(a, b), f"retry p{p} L{i}: out differs"
        assert torch.equal(clean.states[i].ring, rt.states[i].ring), f"retry p{p} L{i}: ring differs"


# ------------------------------------------------------------------ item 1: positions
@pytest.mark.parametrize("pos", [13, 15, 10], ids=["repeated", "skipped", "earlier"])
def test_decode_prep_at_a_wrong_position_is_refused(setup, pos):
    rt = _stack(setup)  # prefill 0..12, step 13 on all layers
    attn, w, xs = rt.attn, rt.weights, setup[2]
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=rf"layer 0: start_pos = {pos}; allowed: 0 \(a new sequence\) or 14"):
        rb = attn.decode_prep(w[0], rt.shared, pos)
        attn.decode_body(w[0], rt.states[0], xs[0][pos : pos + 1], rb)
    _assert_unchanged(before, rt)
    assert rt.states[0].next_pos == 14
    _assert_retry_matches(setup, rt, 14)


# ------------------------------------------------------------------ item 2: body without its prep
def test_decode_body_without_any_prep_is_refused(setup):
    rt = _stack(setup)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=r"decode_body of layer 0 without its decode_prep \(last prepared: none\)"):
        rt.attn.decode_body(rt.weights[0], rt.states[0], setup[2][0][14:15], None)
    _assert_unchanged(before, rt)
    _assert_retry_matches(setup, rt, 14)


def test_decode_body_with_another_layers_prep_is_refused(setup):
    """Layer 0 prepared and run; a body of layer 4 (skipping layers 1-3) and a second body
    of layer 0 are refused, the ring of layer 4 untouched; the step then completes."""
    rt = _stack(setup)
    attn, w, st, xs = rt.attn, rt.weights, rt.states, setup[2]
    rb = attn.decode_prep(w[0], rt.shared, 14)
    attn.decode_body(w[0], st[0], xs[0][14:15], rb)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=r"decode_body of layer 4 without its decode_prep \(last prepared: layer 0"):
        attn.decode_body(w[4], st[4], xs[4][14:15], rt.shared.compress_kv)
    with pytest.raises(ValueError, match="decode_body of layer 0 at start_pos 14 already ran"):
        attn.decode_body(w[0], st[0], xs[0][14:15], None)
    with pytest.raises(ValueError, match="layer 4 at start_pos 14 .*allowed: layer 1 at start_pos 14"):
        attn.decode_prep(w[4], rt.shared, 14)
    _assert_unchanged(before, rt)
    clean = _stack(setup, steps=1)
    want = clean.step([x[14:15] for x in xs], 14, keep=True)
    for i in range(1, 6):
        x = xs[i][14:15]
        if attn.decode_capturable(w[i]):
            out = attn.decode_body(w[i], st[i], x, attn.decode_prep(w[i], rt.shared, 14))
        else:
            out = rt.layer(i, x, 14).out
        assert torch.equal(out, want[i]), f"L{i}"
    _assert_retry_matches(setup, rt, 15)


def test_forward_may_run_a_prepared_step_and_prep_may_repeat(setup):
    """A prepared but unrun step can be prepared again or run through forward instead."""
    rt = _stack(setup)
    attn, w, xs = rt.attn, rt.weights, setup[2]
    attn.decode_prep(w[0], rt.shared, 14)
    attn.decode_prep(w[0], rt.shared, 14)
    clean = _stack(setup)
    want = clean.layer(0, xs[0][14:15], 14).out
    assert torch.equal(rt.layer(0, xs[0][14:15], 14).out, want)
    with pytest.raises(ValueError, match="without its decode_prep"):
        attn.decode_body(w[0], rt.states[0], xs[0][14:15], None)  # forward took the prepared step


# ------------------------------------------------------------------ item 3: rows_b
def _other_sequence_rows(setup):
    return _stack(setup).shared.compress_kv


ROWS = {
    "short": lambda rt: rt.shared.compress_kv[:5],
    "another_sequence": None,  # filled in the test (another stack's cache)
    "other_ratio": lambda rt: rt.states[1].compress_kv,  # the ratio-2 kv source's cache at a ratio-1 layer
    "none": lambda rt: None,
    "not_a_tensor": lambda rt: [1, 2],
}


@pytest.mark.parametrize("case", list(ROWS), ids=list(ROWS))
def test_decode_body_with_wrong_rows_is_refused_before_any_write(setup, case):
    rt = _stack(setup)
    attn, w, st, xs = rt.attn, rt.weights, rt.states, setup[2]
    for i in range(4):  # layers 0..3 of step 14
        x = xs[i][14:15]
        if attn.decode_capturable(w[i]):
            attn.decode_body(w[i], st[i], x, attn.decode_prep(w[i], rt.shared, 14))
        else:
            rt.layer(i, x, 14)
    good = attn.decode_prep(w[4], rt.shared, 14)
    rows = _other_sequence_rows(setup) if case == "another_sequence" else ROWS[case](rt)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match="layer 4 has ratio 1: rows_b = .*; allowed: the .* rows decode_prep returned"):
        attn.decode_body(w[4], st[4], xs[4][14:15], rows)
    _assert_unchanged(before, rt)
    attn.decode_body(w[4], st[4], xs[4][14:15], good)  # the retry with the right rows
    rt.layer(5, xs[5][14:15], 14)
    _assert_retry_matches(setup, rt, 15)


def test_decode_body_with_a_state_of_another_sequence_is_refused(setup):
    rt, other = _stack(setup), _stack(setup)
    attn = rt.attn
    rb = attn.decode_prep(rt.weights[0], rt.shared, 14)
    before = _snapshot(rt)
    with pytest.raises(
        ValueError,
        match=r"layer 0: its state belongs to sequence #\d+, but the last decode_prep .*; allowed: the state prefilled",
    ):
        attn.decode_body(rt.weights[0], other.states[0], setup[2][0][14:15], rb)
    with pytest.raises(ValueError, match="never prefilled"):
        attn.decode_body(rt.weights[0], attn.new_layer_state(0), setup[2][0][14:15], rb)
    _assert_unchanged(before, rt)


# ------------------------------------------------------------------ item 4: no wedge
def test_out_of_turn_layer_is_refused_and_the_step_can_finish(setup):
    rt = _stack(setup)
    xs = setup[2]
    for i in range(3):
        rt.layer(i, xs[i][14:15], 14)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=r"layer 0 at start_pos 15 .*allowed: layer 3 at start_pos 14"):
        rt.layer(0, xs[0][15:16], 15)
    with pytest.raises(ValueError, match=r"layer 0 at start_pos 15 .*allowed: layer 3 at start_pos 14"):
        rt.attn.decode_prep(rt.weights[0], rt.shared, 15)
    with pytest.raises(ValueError, match=r"layer 3 at start_pos 15 .*allowed: layer 3 at start_pos 14"):
        rt.layer(3, xs[3][15:16], 15)
    _assert_unchanged(before, rt)
    for i in range(3, 6):
        rt.layer(i, xs[i][14:15], 14)
    _assert_retry_matches(setup, rt, 15)


def test_a_prefill_layer_with_another_token_count_is_refused(setup):
    cfg, w, xs = setup
    rt = RuntimeStack(cfg, w)
    rt.layer(0, xs[0][:PREFILL], 0)
    with pytest.raises(
        ValueError, match=r"layer 1 at start_pos 0 \(m = 12\); allowed: layer 1 at start_pos 0 with m = 13"
    ):
        rt.layer(1, xs[1][: PREFILL - 1], 0)


# ------------------------------------------------------------------ item 5: all-or-nothing step
BAD_STEPS = {
    "state_of_another_sequence": lambda rt, other: setattr_list(rt.states, 4, other.states[4]),
    "state_of_another_layer": lambda rt, other: setattr_list(rt.states, 4, rt.states[2]),
    "fresh_state": lambda rt, other: setattr_list(rt.states, 4, rt.attn.new_layer_state(4)),
    "weights_of_another_layer": lambda rt, other: setattr_list(rt.weights, 4, rt.weights[2]),
}


def setattr_list(lst, i, v):
    old = lst[i]
    lst[i] = v
    return old


@pytest.mark.parametrize("case", list(BAD_STEPS), ids=list(BAD_STEPS))
def test_graph_driver_step_is_all_or_nothing(setup, case):
    rt, other = _stack(setup), _stack(setup)
    drv = DecodeGraphs(rt)
    xs = setup[2]
    lst = rt.weights if case.startswith("weights") else rt.states
    good = BAD_STEPS[case](rt, other)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match="layer 4|state of layer"):
        drv.step([x[14:15] for x in xs], 14)
    _assert_unchanged(before, rt)
    lst[4] = good
    clean = _stack(setup)
    want = clean.step([x[14:15] for x in xs], 14, keep=True)
    got = drv.step([x[14:15] for x in xs], 14)
    for i in range(6):
        assert torch.equal(want[i], got[i]), f"L{i}"


@pytest.mark.parametrize(
    "bad",
    [
        lambda xs: [x[14:15] for x in xs[:5]],
        lambda xs: [x[14:16] for x in xs],
        lambda xs: [x[14:15].float() for x in xs],
    ],
    ids=["five_inputs", "two_rows", "float32"],
)
def test_graph_driver_rejects_bad_inputs_before_any_layer(setup, bad):
    rt = _stack(setup)
    drv = DecodeGraphs(rt)
    before = _snapshot(rt)
    with pytest.raises((ValueError, TypeError), match="allowed"):
        drv.step(bad(setup[2]), 14)
    _assert_unchanged(before, rt)


# ------------------------------------------------------------------ item 10: config, geometry, replaced weights
def test_state_and_shared_of_another_config_are_refused(setup):
    cfg, w, xs = setup
    rt = RuntimeStack(cfg, w)
    wide = AttnV41(cfg.replace(window=16))
    with pytest.raises(ValueError, match=r"layer 0's state was built for another config \(window=16 \(runtime: 8\)"):
        rt.attn.forward(rt.weights[0], wide.new_layer_state(0), rt.shared, xs[0][:PREFILL], 0)
    with pytest.raises(ValueError, match=r"the shared state was built for another config \(window=16"):
        rt.attn.forward(rt.weights[0], rt.states[0], wide.new_shared(), xs[0][:PREFILL], 0)
    st = rt.states[0]
    st.ring = torch.zeros(16, cfg.head_dim, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"state ring \(16, 32\) .*; allowed: \(8, 32\)"):
        rt.attn.forward(rt.weights[0], st, rt.shared, xs[0][:PREFILL], 0)


def test_weights_replaced_after_first_use_are_checked_again(setup):
    rt = _stack(setup)
    w0 = rt.weights[0]
    good = w0.tensors["attn.wq_a.weight"]
    w0.tensors["attn.wq_a.weight"] = good[:, :32].contiguous()
    before = _snapshot(rt)
    with pytest.raises(ValueError, match=r"attn.wq_a.weight.shape = \(16, 32\); allowed: \(16, 64\)"):
        rt.layer(0, setup[2][0][14:15], 14)
    w0.tensors["attn.wq_a.weight"] = good.float()
    with pytest.raises(TypeError, match="attn.wq_a.weight.dtype = torch.float32"):
        rt.layer(0, setup[2][0][14:15], 14)
    _assert_unchanged(before, rt)
    w0.tensors["attn.wq_a.weight"] = good
    _assert_retry_matches(setup, rt, 14)


# ------------------------------------------------------------------ item 11: non-finite values
def _poisoned(xs, layer: int, row: int):
    bad = [x.clone() for x in xs]
    bad[layer][row, 3] = float("nan")
    bad[layer][row, 5] = float("inf")
    return bad


def test_nonfinite_counter_counts_cache_writes_without_a_sync(setup):
    cfg, w, xs = setup
    rt = _stack(setup, steps=2)
    assert rt.attn.nonfinite_count() == 0
    bad = _poisoned(xs, 3, 15)  # a ratio-1 kv source: ring, compressed row and index key
    rt.step([x[15:16] for x in bad], 15)
    n = rt.attn.nonfinite_count()
    # the NaN spreads through the RMSNorm to the whole kv row (head_dim values), then the
    # compressed row (head_dim) and its index key (index_head_dim)
    assert n == 2 * cfg.head_dim + cfg.index_head_dim, n
    rt.attn.reset_nonfinite()
    assert rt.attn.nonfinite_count() == 0


@pytest.mark.parametrize("oracle", [False, True], ids=["plain", "oracle"])
def test_nonfinite_counter_in_the_graph_driver(setup, oracle):
    """Counted once per step, also when the oracle runs the step twice."""
    rt = _stack(setup)
    drv = DecodeGraphs(rt, oracle=oracle)
    drv.step([x[14:15] for x in _poisoned(setup[2], 0, 14)], 14)  # layer 0: captured class
    assert rt.attn.nonfinite_count() == rt.cfg.head_dim


def test_check_finite_raises_before_any_write(setup):
    rt = _stack(setup, check_finite=True)
    bad = _poisoned(setup[2], 0, 14)
    before = _snapshot(rt)
    with pytest.raises(ValueError, match="layer 0 at start_pos 14: x holds 2 non-finite values; allowed: finite"):
        rt.layer(0, bad[0][14:15], 14)
    rb = rt.attn.decode_prep(rt.weights[0], rt.shared, 14)
    with pytest.raises(ValueError, match="x holds 2 non-finite values"):
        rt.attn.decode_body(rt.weights[0], rt.states[0], bad[0][14:15], rb)
    with pytest.raises(ValueError, match="x holds 2 non-finite values"):
        DecodeGraphs(rt).step([x[14:15] for x in bad], 14)
    snap_now = _snapshot(rt)
    # decode_prep advanced the order state (its body may replay from a graph); nothing else changed
    assert snap_now[1]["last_layer"] == 0
    rt.shared.last_layer, rt.shared.step_pos, rt.shared.step_end = 5, 13, 14
    rt.shared.calls = before[1]["calls"]
    rt.shared.prepared = before[1]["prepared"]  # the prep's record (it may be prepared again)
    _assert_unchanged(before, rt)
    assert rt.attn.nonfinite_count() == 0
    with pytest.raises(TypeError, match="check_finite = 1; allowed: True or False"):
        AttnV41(rt.cfg, check_finite=1)


# ------------------------------------------------------------------ item 13: after free()
def test_every_call_after_free_names_free(setup):
    rt = _stack(setup)
    attn = rt.attn
    attn.free()
    for call in (
        lambda: attn.decode_fixed_topk(rt.weights[0]),
        lambda: attn.decode_prep(rt.weights[0], rt.shared, 14),
        lambda: attn.decode_body(rt.weights[0], rt.states[0], setup[2][0][14:15], None),
        lambda: attn.nonfinite_count(),
        lambda: rt.layer(0, setup[2][0][14:15], 14),
    ):
        with pytest.raises(RuntimeError, match=r"after free\(\)"):
            call()


def test_the_runtime_keeps_no_dropped_weights_alive(setup):
    """Validation marks live on the weights object: a runtime that checked weights once
    does not hold them (GPU memory) after the caller dropped them."""
    import gc
    import weakref

    from attnv41.weights import AttnV41LayerWeights

    cfg, w, xs = setup
    rt = _stack(setup)
    w0 = AttnV41LayerWeights.from_state_dict(cfg.roles[0], {k: v.clone() for k, v in w[0].items()}, cfg=cfg)
    rb = rt.attn.decode_prep(w0, rt.shared, 14)
    rt.attn.decode_body(w0, rt.states[0], xs[0][14:15], rb)
    ref = weakref.ref(w0.tensors["attn.wq_a.weight"])
    del w0
    gc.collect()
    assert ref() is None
