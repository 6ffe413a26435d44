"""Bad calls to the public entry points (a 2026-12-04 audit): each raises a clear error
naming the value and what is allowed, before anything changes, and the corrected call
then gives the bytes of a run that never saw the bad one. CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnv41.runtime import AttnV41, BatchGraphs, BatchV41, RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs, _Captured
from attnv41.weights import AttnV41LayerWeights
from helpers import random_inputs, random_weights, small_cfg

PREFILL = 13


@pytest.fixture(scope="module")
def setup():
    cfg = small_cfg()
    w = random_weights(cfg, 21)
    xs = random_inputs(cfg, 24, 22)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], d, cfg=cfg) for i, d in enumerate(w)]
    return cfg, w, xs, wts


def _stack(setup) -> RuntimeStack:
    cfg, w, xs, _ = setup
    rt = RuntimeStack(cfg, w)
    rt.step([x[:PREFILL] for x in xs], 0)
    return rt


def _state_bytes(rt: RuntimeStack) -> list:
    got = [{k: v.clone() for k, v in s.tensors().items()} | {"n": (s.n_rows, s.next_pos)} for s in rt.states]
    return got + [rt.shared.snapshot()]


def _same(a: list, b: list) -> None:
    for da, db in zip(a, b):
        for k in da:
            va, vb = da[k], db[k]
            assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb, k


def test_stack_step_checks_every_layer_before_the_first(setup):
    """A bad input of layer 3 (or too few inputs) is refused before layer 0 runs: the
    state is unchanged and the corrected step equals a clean run's."""
    cfg, _, xs, _ = setup
    rt, clean = _stack(setup), _stack(setup)
    good = [x[PREFILL : PREFILL + 1] for x in xs]
    before = _state_bytes(rt)
    bad = list(good)
    bad[3] = bad[3].float()
    with pytest.raises(TypeError, match=r"xs\[3\]: x.dtype = torch.float32; allowed: torch.bfloat16"):
        rt.step(bad, PREFILL)
    with pytest.raises(ValueError, match=rf"xs is a list of 5; allowed: a sequence of n_layers = {cfg.n_layers}"):
        rt.step(good[:5], PREFILL)
    with pytest.raises(ValueError, match=r"xs rows per layer \[1, 1, 2, 1, 1, 1\]; allowed: the same m"):
        rt.step(good[:2] + [xs[2][PREFILL : PREFILL + 2]] + good[3:], PREFILL)
    _same(before, _state_bytes(rt))
    got = rt.step(good, PREFILL, keep=True)
    want = clean.step(good, PREFILL, keep=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_non_contiguous_inputs_give_the_contiguous_bytes(setup):
    """x as a column slice of a wider tensor (unit stride broken): the same bytes."""
    _, _, xs, _ = setup
    a, b = _stack(setup), _stack(setup)
    wide = [torch.stack([x[PREFILL], x[PREFILL]], dim=1).view(1, -1)[:, ::2] for x in xs]
    assert wide[0].stride(-1) == 2 and torch.equal(wide[0], xs[0][PREFILL : PREFILL + 1])
    got = a.step(wide, PREFILL, keep=True)
    want = b.step([x[PREFILL : PREFILL + 1] for x in xs], PREFILL, keep=True)
    assert all(torch.equal(u, v) for u, v in zip(got, want))


def _batch(cfg, wts, xs) -> BatchV41:
    bt = BatchV41(cfg, n_slots=2, block_rows=8)
    bt.step(wts, [x[:PREFILL] for x in xs], [0], [0], [PREFILL])
    bt.step(wts, [x[PREFILL : PREFILL + 4] for x in xs], [0], [PREFILL], [4])  # a verify call: rollback-able
    return bt


def test_batch_step_checks_weights_and_inputs_before_begin(setup):
    """`BatchV41.step` with plain weight dicts, a short input list or a wrong row count is
    refused before `begin`: the slot's undo log survives (its rollback still works) and
    the pool is unchanged."""
    cfg, w, xs, wts = setup
    bt = _batch(cfg, wts, xs)
    nxt = [x[PREFILL + 4 : PREFILL + 5] for x in xs]
    length = list(bt.pool.length)
    for weights, inputs, msg, exc in (
        (w, nxt, r"layer 0: weights are a dict; allowed: AttnV41LayerWeights", TypeError),
        (wts, nxt[:4], rf"xs is a list of 4; allowed: a sequence of n_layers = {cfg.n_layers}", ValueError),
        (wts[:1] * cfg.n_layers, nxt, r"layer 1: weights of layer 0; allowed: layer 1's", ValueError),
        (
            wts,
            [xs[i][:2] for i in range(cfg.n_layers)],
            r"xs\[0\] has 2 rows; allowed: the step's 1 tokens",
            ValueError,
        ),
    ):
        with pytest.raises(exc, match=msg):
            bt.step(weights, inputs, [0], [PREFILL + 4], [1])
        assert bt.pool.length == length and bt._step.next_layer == cfg.n_layers
    bt.rollback(0, PREFILL + 2)  # the undo log of the verify call is still there
    assert bt.pool.length[0] == PREFILL + 2


def test_batch_forward_without_begin_and_release_during_a_step(setup):
    cfg, _, xs, wts = setup
    bt = BatchV41(cfg, n_slots=2, block_rows=8)
    with pytest.raises(ValueError, match=r"layer 0 of a NoneType; allowed: none \(call begin\)"):
        bt.forward(wts[0], xs[0][:3], None)
    with pytest.raises(TypeError, match="weights are a dict"):
        bt.forward(dict(wts[0].tensors), xs[0][:3], None)
    bt.step(wts, [x[:PREFILL] for x in xs], [1], [0], [PREFILL])
    st = bt.begin([1], [PREFILL], [1])
    for i in range(3):
        bt.forward(wts[i], xs[i][PREFILL : PREFILL + 1], st)
    for call in (lambda: bt.pool.release(1), lambda: bt.pool.assume(1, 3)):
        with pytest.raises(ValueError, match=r"\(slot 1\) while a step of slots \[1\] runs; allowed: between steps"):
            call()
    bt.pool.release(0)  # a slot outside the step
    for i in range(3, cfg.n_layers):
        bt.forward(wts[i], xs[i][PREFILL : PREFILL + 1], st)
    assert bt.pool.length[1] == PREFILL + 1 and bt.pool.blocks_of[1][1]
    bt.pool.release(1)  # between steps
    assert bt.pool.length[1] == 0


def test_capture_refuses_to_overwrite_undo_buffers_a_rollback_needs(setup):
    """A graph verify step's undo buffers belong to the persistent step of its size;
    capturing graphs of that size while the slot may still roll back is refused (nothing
    changes): the rollback and the steps after it give the bytes of a run without the
    capture attempts, and the capture works after the slot's next step."""
    cfg = small_cfg(max_seq=128)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], d, cfg=cfg) for i, d in enumerate(random_weights(cfg, 3))]

    def run(try_capture: bool) -> torch.Tensor:
        bt = BatchV41(cfg, n_slots=2, block_rows=4)
        g = BatchGraphs(bt, wts, sizes=(4,), bucket_min=8)
        gen = torch.Generator().manual_seed(0)

        def x(t):
            return torch.randn(cfg.n_layers, t, cfg.dim, generator=gen).bfloat16()

        bt.step(wts, list(x(12)), [0], [0], [12])
        g.step(x(3), [0], [3])
        if try_capture:
            with pytest.raises(ValueError, match=r"size 4: their warm-up would overwrite the undo buffers of slot 0"):
                g.capture([16, 32], kinds=("cont",))
            assert g.capture([16, 32], kinds=("decode",)) == 0  # decode steps keep no undo buffers (CPU: 0)
        bt.rollback(0, 13)
        if try_capture:  # a slot may roll back again inside its last call: still refused
            with pytest.raises(ValueError, match=r"undo buffers of slot 0's last step"):
                g.capture([16, 32], kinds=("cont",))
        y = g.step(x(1), [0]).clone()
        if try_capture:  # after the slot's next step
            g.capture([16, 32], kinds=("cont",))
        return torch.cat([y, g.step(x(2), [0], [2]).clone()], dim=1)

    assert torch.equal(run(False), run(True))


def test_integer_types_are_named(setup):
    rt = _stack(setup)
    attn = rt.attn
    for call in (
        lambda: attn.decode_prep(rt.weights[0], rt.shared, np.int64(PREFILL)),
        lambda: attn.bucket(torch.tensor(PREFILL)),
        lambda: DecodeGraphs(rt).step([x[PREFILL : PREFILL + 1] for x in setup[2]], np.int64(PREFILL)),
    ):
        with pytest.raises(
            TypeError, match=r"start_pos = .* is a (int64|Tensor); allowed: int \(1\.\..*\) \(int\(start_pos\) converts"
        ):
            call()
    x = setup[2][0][PREFILL : PREFILL + 1]
    with pytest.raises(TypeError, match=r"start_pos = (np\.int64\()?13\)? is a int64; allowed: int \(0\.\.63\)"):
        attn.forward(rt.weights[0], rt.states[0], rt.shared, x, np.int64(PREFILL))
    bt = BatchV41(setup[0], n_slots=2)
    with pytest.raises(TypeError, match=r"slot = (np\.int64\()?0\)? is a int64; allowed: int \(0\.\.1\)"):
        bt.pool.release(np.int64(0))


def test_interleaved_preps_of_two_sequences_name_the_other_and_recover(setup):
    """prep A, prep B, body A: refused naming both sequences; A prepared again then runs,
    and its step gives the bytes of a clean run."""
    cfg, _, xs, wts = setup
    xb = random_inputs(cfg, 24, 77)
    attn = AttnV41(cfg)

    def prefill(inputs):
        st = [attn.new_layer_state(i) for i in range(cfg.n_layers)]
        sh = attn.new_shared()
        for i in range(cfg.n_layers):
            attn.forward(wts[i], st[i], sh, inputs[i][:PREFILL], 0)
        return st, sh

    (sa, ha), (_sb, hb) = prefill(xs), prefill(xb)
    ra = attn.decode_prep(wts[0], ha, PREFILL)
    attn.decode_prep(wts[0], hb, PREFILL)
    with pytest.raises(ValueError, match=r"layer 0: its state belongs to sequence #\d+, but the last decode_prep"):
        attn.decode_body(wts[0], sa[0], xs[0][PREFILL : PREFILL + 1], ra)
    ra = attn.decode_prep(wts[0], ha, PREFILL)  # prepared again: allowed, its body has not run
    got = [attn.decode_body(wts[0], sa[0], xs[0][PREFILL : PREFILL + 1], ra).clone()]
    with pytest.raises(ValueError, match="layer 0 at start_pos 13"):  # ran: not again
        attn.decode_prep(wts[0], ha, PREFILL)
    for i in range(1, cfg.n_layers):
        got.append(attn.forward(wts[i], sa[i], ha, xs[i][PREFILL : PREFILL + 1], PREFILL).out.clone())
    clean = RuntimeStack(cfg, wts)
    clean.step([x[:PREFILL] for x in xs], 0)
    want = clean.step([x[PREFILL : PREFILL + 1] for x in xs], PREFILL, keep=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_unclear_errors_now_name_the_value(setup):
    cfg, w, xs, wts = setup
    attn = AttnV41(cfg)
    with pytest.raises(TypeError, match="weights are a dict; allowed: AttnV41LayerWeights"):
        attn.decode_fixed_topk(w[0])
    rt = _stack(setup)
    assert cfg.roles[0].ratio == 0
    rt.attn.decode_prep(rt.weights[0], rt.shared, PREFILL)
    with pytest.raises(ValueError, match=r"layer 0 has ratio 0: rows_b must be None \(got a int\)"):
        rt.attn.decode_body(rt.weights[0], rt.states[0], xs[0][PREFILL : PREFILL + 1], 5)
    drv = DecodeGraphs(_stack(setup))
    flat = torch.stack([x[PREFILL] for x in xs])  # [n_layers, dim]
    with pytest.raises(ValueError, match=rf"xs.shape = \({cfg.dim}, {cfg.n_layers}\); allowed: \[{cfg.n_layers}, 1"):
        drv.step(flat.t().contiguous(), PREFILL)
    with pytest.raises(ValueError, match=r"layer 0 input: \(2, 32\); allowed"):
        drv.step([x[PREFILL].view(2, -1) for x in xs], PREFILL)
    drv.step(flat, PREFILL)  # [n_layers, dim] is accepted


@pytest.mark.parametrize("device", ["npu", "meta", "cuda:7", 3.5])  # ("gpu" as an id would mark it a GPU test)
def test_bad_devices_are_named(setup, device):
    if torch.cuda.is_available() and device == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(ValueError, match=r"device = .*; allowed"):
        AttnV41(setup[0], device)
    with pytest.raises(ValueError, match=r"device = .*; allowed"):
        BatchV41(setup[0], device, n_slots=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_named(setup):
    with pytest.raises(ValueError, match=r"device = 'cuda': this torch sees no CUDA device; allowed: 'cpu'"):
        AttnV41(setup[0], "cuda")


def test_continue_at_checks_its_arguments(setup):
    cfg = setup[0]
    rt = RuntimeStack(cfg, setup[1])
    with pytest.raises(ValueError, match=rf"next_pos = {cfg.max_seq + 1}; allowed: 1\.\.{cfg.max_seq}"):
        rt.shared.continue_at(rt.states, cfg.max_seq + 1)
    with pytest.raises(ValueError, match=r"states of layers \[0, 1\]; allowed: one per layer"):
        rt.shared.continue_at(rt.states[:2], 5)


def test_a_step_that_raises_inside_a_layer_frees_the_runtime(setup, monkeypatch):
    """A layer raising mid-step (an out-of-memory error, an interrupt) used to leave the
    runtime inside the step: `begin` refused ever after. Now the step is abandoned: the
    other slot's sequence goes on with the bytes of a run that never saw the failure, the
    failed slot refuses to continue (its caches hold part of the step) and takes a new
    sequence, with or without a release first."""
    cfg, _, xs, wts = setup
    bt, clean = BatchV41(cfg, n_slots=2, block_rows=8), BatchV41(cfg, n_slots=2, block_rows=8)
    for r in (bt, clean):
        for sl in (0, 1):
            r.step(wts, [x[:PREFILL] for x in xs], [sl], [0], [PREFILL])
    layer = bt._layer

    def boom(w, x, step, out=None):
        y = layer(w, x, step, out)  # the layer's writes happen, then it raises
        if w.role.layer == 2:
            raise RuntimeError("boom")
        return y

    monkeypatch.setattr(bt, "_layer", boom)
    nxt = [x[PREFILL : PREFILL + 1] for x in xs]
    with pytest.raises(RuntimeError, match="boom"):
        bt.step(wts, nxt, [1], [PREFILL], [1])
    monkeypatch.undo()
    sid = bt._steps
    assert bt.pool.in_step == frozenset() and bt._step is None
    assert bt.pool.failed == {1: (sid, 2)} and bt.pool.length[1] == PREFILL
    with pytest.raises(
        ValueError, match=rf"slot 1: start = {PREFILL}, but its step {sid} \(in layer 2\) raised part-way"
    ):
        bt.begin([1], [PREFILL], [1])
    with pytest.raises(ValueError, match=rf"slot 1: rollback to 5: its step {sid} \(in layer 2\) raised part-way"):
        bt.rollback(1, 5)
    assert bt.pool.length == [PREFILL, PREFILL] and bt._step is None
    for sl in (0, 1):  # slot 0 goes on; slot 1 as a new sequence (no release needed)
        start, xin = (PREFILL, nxt) if sl == 0 else (0, [x[:PREFILL] for x in xs])
        got = bt.step(wts, xin, [sl], [start], [xin[0].shape[0]])
        want = clean.step(wts, xin, [sl], [start], [xin[0].shape[0]])
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert bt.pool.failed == {}
    got = bt.step(wts, nxt, [1], [PREFILL], [1])  # and continues
    assert all(torch.equal(a, b) for a, b in zip(got, clean.step(wts, nxt, [1], [PREFILL], [1])))


def _graph_runtime(cfg, wts, xs):
    """A `BatchV41` with `BatchGraphs` (size 2), slot 0 prefilled; the next decode input."""
    bt = BatchV41(cfg, n_slots=2, block_rows=8)
    g = BatchGraphs(bt, wts, sizes=(2,), bucket_min=16)
    bt.step(wts, [x[:PREFILL] for x in xs], [0], [0], [PREFILL])
    return bt, g, torch.stack([x[PREFILL : PREFILL + 1] for x in xs])


def test_a_graph_step_that_raises_frees_the_runtime(setup, monkeypatch):
    """The same for `BatchGraphs.step`: the step's slot is marked failed, `release` clears
    it, and the next steps give a clean run's bytes."""
    cfg, _, xs, wts = setup
    runs = []
    for fail in (False, True):
        bt, g, x1 = _graph_runtime(cfg, wts, xs)
        if fail:
            monkeypatch.setattr(g, "_body", lambda st: (_ for _ in ()).throw(MemoryError("out of memory")))
            with pytest.raises(MemoryError):
                g.step(x1, [0])
            monkeypatch.undo()
            assert bt.pool.in_step == frozenset() and set(bt.pool.failed) == {0}
            with pytest.raises(ValueError, match=r"slot 0: start = 13, but its step 2 \(in layer 0\) raised part-way"):
                g.step(x1, [0])
            bt.pool.release(0)
            assert bt.pool.failed == {}
        else:
            bt.pool.release(0)
        bt.step(wts, [x[:PREFILL] for x in xs], [0], [0], [PREFILL])
        runs.append(torch.cat([g.step(x1, [0]).clone(), g.step(x1, [0]).clone()], dim=1))
    assert torch.equal(runs[0], runs[1])


def test_a_graph_replay_that_raises_is_reported_as_a_replay(setup, monkeypatch):
    """A replayed step runs every layer at once, so a failure in it (an illegal address
    reported at launch) is recorded as the replay, not as a layer the host never
    reached. The replay path runs on the CPU with a stand-in graph that raises."""
    cfg, _, xs, wts = setup
    bt, g, x1 = _graph_runtime(cfg, wts, xs)

    class Raising:
        def replay(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    baked = tuple(tuple(t.data_ptr() for t in w.tensors.values()) for w in g.weights)
    monkeypatch.setattr(g, "use_graphs", True)
    g._graphs[("decode", 2, 16)] = _Captured(Raising(), baked)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        g.step(x1, [0])
    monkeypatch.undo()
    sid = bt.pool.failed[0][0]
    assert bt.pool.in_step == frozenset() and bt.pool.failed == {0: (sid, "replay")}
    msg = rf"slot 0: start = 13, but its step {sid} \(a CUDA graph replay: the layer is not known\) raised part-way"
    with pytest.raises(ValueError, match=msg):
        g.step(x1, [0])


def test_a_capture_that_raises_leaves_the_runtime_between_steps(setup, monkeypatch):
    """A capture's warm-up runs the persistent step object of its kind and size, which
    may be the runtime's last step: a warm-up raising mid-way used to leave that step
    looking unfinished, and every later `begin` was refused. The steps after it give the
    bytes of a run without the failed capture."""
    cfg, _, xs, wts = setup
    runs = []
    for fail in (False, True):
        bt, g, x1 = _graph_runtime(cfg, wts, xs)
        y = [g.step(x1, [0]).clone()]  # the decode step of size 2: the persistent step capture reuses
        if fail:

            def boom(w, x, step, out=None, layer=bt._layer):
                if w.role.layer == 2:
                    raise MemoryError("out of memory")
                return layer(w, x, step, out)

            monkeypatch.setattr(bt, "_layer", boom)
            with pytest.raises(MemoryError):
                g.capture([16], kinds=("decode",))
            monkeypatch.undo()
        y.append(g.step(x1, [0]).clone())
        runs.append(torch.cat(y, dim=1))
    assert torch.equal(runs[0], runs[1])


def _raise_at(obj, name: str, layer: int, after: bool = True):
    """obj.name wrapped to raise MemoryError once, for `layer` (its first argument's role),
    after (or before) running the original: a failure part-way through a call."""
    orig, done = getattr(obj, name), []

    def wrapped(w, *a, **k):
        hit = not done and w.role.layer == layer
        if hit and not after:
            done.append(1)
            raise MemoryError("out of memory")
        out = orig(w, *a, **k)
        if hit:
            done.append(1)
            raise MemoryError("out of memory")
        return out

    return wrapped


def test_a_layer_call_that_raises_part_way_takes_only_a_new_sequence(setup, monkeypatch):
    """A continuation whose layer 3 raised after writing its window rows: re-running that
    layer used to be offered (and read the ring slots it had overwritten: other bytes).
    Now every call of the sequence but a new one is refused, rollback included; the new
    sequence gives a clean run's bytes."""
    cfg, w, xs, _ = setup
    rt, clean = _stack(setup), _stack(setup)
    cont = [x[PREFILL : PREFILL + 4] for x in xs]
    monkeypatch.setattr(rt.attn, "_qkv", _raise_at(rt.attn, "_qkv", 3))
    with pytest.raises(MemoryError):
        rt.step(cont, PREFILL)
    monkeypatch.undo()
    assert rt.shared.failed == (3, PREFILL)
    msg = rf"its layer 3 call at start_pos {PREFILL} raised part-way, so its caches hold part of that call; allowed: layer 0 at start_pos 0"
    with pytest.raises(ValueError, match=rf"layer 3 at start_pos {PREFILL}: " + msg):
        rt.layer(3, cont[3], PREFILL)
    with pytest.raises(ValueError, match=rf"layer 0 at start_pos {PREFILL}: " + msg):
        rt.step(cont, PREFILL)
    with pytest.raises(ValueError, match=rf"rollback to {PREFILL + 1}: " + msg):
        rt.rollback(PREFILL + 1)
    rt.step([x[:PREFILL] for x in xs], 0)  # a new sequence
    assert rt.shared.failed is None
    got, want = rt.step(cont, PREFILL, keep=True), clean.step(cont, PREFILL, keep=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_decode_body_and_graph_steps_that_raise_take_only_a_new_sequence(setup, monkeypatch):
    """The same for an eager `decode_body` (not run again either) and a `DecodeGraphs`
    step; `continue_at` (the caller vouches for the caches) clears the mark too."""
    cfg, _, xs, wts = setup
    nxt = [x[PREFILL : PREFILL + 1] for x in xs]
    rt = _stack(setup)
    attn = rt.attn
    rows = [attn.decode_prep(wts[i], rt.shared, PREFILL) for i in range(1)]
    attn.decode_body(wts[0], rt.states[0], nxt[0], rows[0])
    r1 = attn.decode_prep(wts[1], rt.shared, PREFILL)
    monkeypatch.setattr(attn, "_decode_kernels", _raise_at(attn, "_decode_kernels", 1, after=False))
    with pytest.raises(MemoryError):
        attn.decode_body(wts[1], rt.states[1], nxt[1], r1)
    monkeypatch.undo()
    assert rt.shared.failed == (1, PREFILL)
    with pytest.raises(ValueError, match=r"decode_body of layer 1 at start_pos 13 already ran"):
        attn.decode_body(wts[1], rt.states[1], nxt[1], r1)
    with pytest.raises(ValueError, match=r"layer 1 at start_pos 13: its layer 1 call at start_pos 13 raised"):
        attn.decode_prep(wts[1], rt.shared, PREFILL)

    rt = _stack(setup)
    drv = DecodeGraphs(rt)
    monkeypatch.setattr(drv, "_body", lambda bucket: (_ for _ in ()).throw(MemoryError("out of memory")))
    with pytest.raises(MemoryError):
        drv.step(nxt, PREFILL)
    monkeypatch.undo()
    assert rt.shared.failed == (None, PREFILL)
    with pytest.raises(ValueError, match=r"layer 0 at start_pos 13: its decode step at start_pos 13 raised part-way"):
        drv.step(nxt, PREFILL)
    rt.shared.continue_at(rt.states, PREFILL)  # the caller vouches for the caches
    assert rt.shared.failed is None
    drv.step(nxt, PREFILL)


def test_a_rollback_that_raises_part_way_takes_only_a_new_sequence(setup, monkeypatch):
    """A rollback whose device work raised (out of memory, an interrupt) leaves the caches
    restored in part: one sequence and a batch slot then take only a new sequence."""
    cfg, _, xs, wts = setup
    rt = _stack(setup)
    rt.step([x[PREFILL : PREFILL + 4] for x in xs], PREFILL)  # a verify call: rollback-able
    real = rt.attn._rollback_states

    def boom(*a):
        real(*a)
        raise KeyboardInterrupt

    monkeypatch.setattr(rt.attn, "_rollback_states", boom)
    with pytest.raises(KeyboardInterrupt):
        rt.rollback(PREFILL + 1)
    monkeypatch.undo()
    assert rt.shared.failed == ("rollback", PREFILL + 1)
    msg = rf"its rollback to {PREFILL + 1} raised part-way, so its caches hold part of that call"
    with pytest.raises(ValueError, match=rf"layer 0 at start_pos {PREFILL + 4}: " + msg):
        rt.step([x[PREFILL + 4 : PREFILL + 5] for x in xs], PREFILL + 4)
    with pytest.raises(ValueError, match=rf"rollback to {PREFILL + 1}: " + msg):
        rt.rollback(PREFILL + 1)
    rt.step([x[:PREFILL] for x in xs], 0)
    assert rt.shared.failed is None

    bt = _batch(cfg, wts, xs)  # slot 0: a prompt, then a verify call of 4 tokens
    sid = bt.last_step[0]
    monkeypatch.setattr(bt, "_rollback_cont", lambda group: (_ for _ in ()).throw(MemoryError("out of memory")))
    with pytest.raises(MemoryError):
        bt.rollback(0, PREFILL + 2)
    monkeypatch.undo()
    assert bt.pool.failed == {0: (sid, "rollback")} and bt.pool.length[0] == PREFILL + 4
    with pytest.raises(ValueError, match=rf"slot 0: start = {PREFILL + 4}, but the rollback after its step {sid}"):
        bt.begin([0], [PREFILL + 4], [1])
    bt.pool.release(0)
    bt.step(wts, [x[:PREFILL] for x in xs], [0], [0], [PREFILL])


# ------------------------------------------------ two sequences on one runtime, layer by layer (2026-12-04 audit)


def _prefilled(attn, cfg, wts, inputs):
    st = [attn.new_layer_state(i) for i in range(cfg.n_layers)]
    sh = attn.new_shared()
    for i in range(cfg.n_layers):
        attn.forward(wts[i], st[i], sh, inputs[i][:PREFILL], 0)
    return st, sh


def _alone(cfg, wts, inputs) -> list:
    """A decode step at PREFILL of a sequence alone on its runtime (the bytes to match)."""
    rt = RuntimeStack(cfg, wts)
    rt.step([x[:PREFILL] for x in inputs], 0)
    return rt.step([x[PREFILL : PREFILL + 1] for x in inputs], PREFILL, keep=True)


def _snap(st, sh) -> list:
    return [{k: v.clone() for k, v in s.tensors().items()} | {"n": (s.n_rows, s.next_pos)} for s in st] + [
        sh.snapshot()
    ]


@pytest.mark.parametrize("split", [False, True], ids=["forward", "prep-body"])
def test_layers_of_two_sequences_interleaved_cannot_mix_their_selections(setup, split):
    """The decode selections live in the runtime's plan, one for every sequence. A's layers
    0-1 (1: an index source), then B's layers 0-1: B's index source would overwrite the
    selection A's layer 2 still reads, so it is refused naming both, and B is unchanged;
    A finishes its step, then B's layer 1 runs: both give the bytes of each alone (before
    the check, A's layers 2, 4, 5 read B's selection and every check passed)."""
    cfg, _, xs, wts = setup
    xb = random_inputs(cfg, 24, 77)
    src = cfg.index_source_layers[0]
    assert src == 1 and cfg.roles[2].ratio > 0 and not cfg.roles[2].is_index_source
    attn = AttnV41(cfg)
    (sa, ha), (sb, hb) = _prefilled(attn, cfg, wts, xs), _prefilled(attn, cfg, wts, xb)

    def run(st, sh, inputs, i):
        x = inputs[i][PREFILL : PREFILL + 1]
        if split:
            return attn.decode_body(wts[i], st[i], x, attn.decode_prep(wts[i], sh, PREFILL)).clone()
        return attn.forward(wts[i], st[i], sh, x, PREFILL).out.clone()

    got_a = [run(sa, ha, xs, 0), run(sa, ha, xs, 1)]
    got_b = [run(sb, hb, xb, 0)]
    before = _snap(sb, hb)
    msg = (
        rf"layer 1 at start_pos {PREFILL} \(sequence #{hb.seq_id}\) would overwrite the decode selection that "
        rf"sequence #{ha.seq_id}'s step at start_pos {PREFILL} still reads \(its layer 2; layer 1 ran last\).*"
        r"allowed: finish that step \(layers 2..5\) first"
    )
    with pytest.raises(ValueError, match=msg):
        run(sb, hb, xb, 1)
    _same(before, _snap(sb, hb))
    got_a += [run(sa, ha, xs, i) for i in range(2, cfg.n_layers)]
    got_b += [run(sb, hb, xb, i) for i in range(1, cfg.n_layers)]
    for got, want in ((got_a, _alone(cfg, wts, xs)), (got_b, _alone(cfg, wts, xb))):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_graph_step_waits_for_the_other_sequences_step(setup):
    """A whole DecodeGraphs step of B while A's step is in progress on the same runtime
    (past its index source) is refused before anything runs; once A's step is complete,
    B's graph step runs and gives B's bytes. A sequence started anew, or dropped, frees
    the plan: its unfinished step is no longer waited for."""
    import copy
    import gc

    cfg, _, xs, wts = setup
    xb = random_inputs(cfg, 24, 77)
    ra = RuntimeStack(cfg, wts)
    ra.step([x[:PREFILL] for x in xs], 0)
    rb = copy.copy(ra)  # the same runtime, B's states and shared state
    rb.states, rb.shared = _prefilled(ra.attn, cfg, wts, xb)
    drv = DecodeGraphs(rb)
    for i in range(2):
        ra.layer(i, xs[i][PREFILL : PREFILL + 1], PREFILL)
    before = _snap(rb.states, rb.shared)
    step_b = [x[PREFILL : PREFILL + 1] for x in xb]
    with pytest.raises(ValueError, match=r"layer 1 at start_pos 13 \(sequence #\d+\) would overwrite"):
        drv.step(step_b, PREFILL)
    _same(before, _snap(rb.states, rb.shared))
    for i in range(2, cfg.n_layers):
        ra.layer(i, xs[i][PREFILL : PREFILL + 1], PREFILL)
    y = drv.step(step_b, PREFILL)
    want = _alone(cfg, wts, xb)
    assert all(torch.equal(y[i], want[i]) for i in range(cfg.n_layers))

    # A mid-step again (its next step), then A started anew: B's next step is no longer refused
    for i in range(2):
        ra.layer(i, xs[i][PREFILL + 1 : PREFILL + 2], PREFILL + 1)
    with pytest.raises(ValueError, match="would overwrite"):
        drv.step([x[PREFILL + 1 : PREFILL + 2] for x in xb], PREFILL + 1)
    ra.step([x[:PREFILL] for x in xs], 0)
    drv.step([x[PREFILL + 1 : PREFILL + 2] for x in xb], PREFILL + 1)
    # A mid-step, then dropped
    for i in range(2):
        ra.layer(i, xs[i][PREFILL : PREFILL + 1], PREFILL)
    with pytest.raises(ValueError, match="would overwrite"):
        drv.step([x[PREFILL + 2 : PREFILL + 3] for x in xb], PREFILL + 2)
    ra.shared = None
    gc.collect()
    drv.step([x[PREFILL + 2 : PREFILL + 3] for x in xb], PREFILL + 2)


def test_inputs_and_weights_that_require_grad_run_without_autograd(setup):
    """An inference runtime: x requiring grad and weights held as `nn.Parameter` run
    under no_grad in forward, decode_body and DecodeGraphs.step (before, an `out=` op
    raised part-way at the candidate layer, leaving the sequence failed) and give the
    plain call's bytes; outputs carry no autograd history."""
    cfg, w, xs, wts = setup
    pw = [{k: torch.nn.Parameter(v.clone(), requires_grad=v.is_floating_point()) for k, v in d.items()} for d in w]
    gx = [x.clone().requires_grad_(True) for x in xs]
    rt, plain = RuntimeStack(cfg, pw), RuntimeStack(cfg, w)
    a = rt.step([x[:PREFILL] for x in gx], 0, keep=True)
    b = plain.step([x[:PREFILL] for x in xs], 0, keep=True)
    assert all(torch.equal(u, v) and not u.requires_grad for u, v in zip(a, b))
    for p in (PREFILL, PREFILL + 1):
        a = rt.step([x[p : p + 1] for x in gx], p, keep=True)
        b = plain.step([x[p : p + 1] for x in xs], p, keep=True)
        assert all(torch.equal(u, v) and not u.requires_grad for u, v in zip(a, b)), p
    p = PREFILL + 2
    rows = rt.attn.decode_prep(rt.weights[0], rt.shared, p)
    y0 = rt.attn.decode_body(rt.weights[0], rt.states[0], gx[0][p : p + 1], rows)
    assert not y0.requires_grad
    got = [y0.clone()] + [rt.layer(i, gx[i][p : p + 1], p).out.clone() for i in range(1, cfg.n_layers)]
    want = plain.step([x[p : p + 1] for x in xs], p, keep=True)
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    y = DecodeGraphs(rt).step([x[p + 1 : p + 2] for x in gx], p + 1)
    want = plain.step([x[p + 1 : p + 2] for x in xs], p + 1, keep=True)
    assert not y.requires_grad and all(torch.equal(y[i], want[i]) for i in range(cfg.n_layers))


def test_more_inputs_named(setup):
    """A sparse x, a non-bool ratio_positive, a layer that is not an int, and
    decode_capturable after free(): named."""
    cfg, _, xs, wts = setup
    rt = _stack(setup)
    for bad in (True, 2.0, "1"):  # True was layer 1
        with pytest.raises(TypeError, match=rf"layer = {bad!r}; allowed: an int 0..{cfg.n_layers - 1}"):
            rt.attn.new_layer_state(bad)
    x = xs[0][PREFILL : PREFILL + 1]
    with pytest.raises(TypeError, match="x.layout = torch.sparse_coo; allowed: torch.strided"):
        rt.attn.forward(wts[0], rt.states[0], rt.shared, x.to_sparse(), PREFILL)
    with pytest.raises(TypeError, match="x.layout = torch.sparse_coo; allowed: torch.strided"):
        rt.attn.decode_body(wts[0], rt.states[0], x.to_sparse(), None)
    for bad in (None, "no", 1):
        with pytest.raises(TypeError, match=rf"ratio_positive = {bad!r}; allowed: True .* or False"):
            rt.attn.decode_prep_role(bad, rt.shared, PREFILL)
    assert rt.attn.plan.pos_at == 0, "the refused calls wrote no position"
    rt.attn.free()
    with pytest.raises(RuntimeError, match=r"AttnV41.decode_capturable after free\(\)"):
        rt.attn.decode_capturable(wts[0])


def test_continue_at_makes_the_undo_log_stale(setup):
    """A verify call keeps an undo log; `continue_at` then hands the caches to the caller
    (a context written straight in): a rollback into the old call is refused (before it
    restored ring slots from the old log: outputs off by up to 5.8)."""
    cfg, _, xs, _ = setup
    rt = _stack(setup)
    rt.step([x[PREFILL : PREFILL + 4] for x in xs], PREFILL)
    rt.rollback(PREFILL + 2)  # the log works before
    rt.shared.continue_at(rt.states, PREFILL + 6)
    with pytest.raises(ValueError, match=rf"rollback to {PREFILL + 1}: the last step .* kept no undo log"):
        rt.rollback(PREFILL + 1)
