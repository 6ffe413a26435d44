"""Inputs to `BatchV41` / `BatchGraphs` on the CPU: a rollback after the slot's sequence
was released, assumed or restarted is refused (its undo log went with the sequence);
inputs and weights that require grad run as plain tensors (the same bytes, no autograd
history); bad metadata types, a bad `blocks` and a layer call after a finished step are
refused with messages naming the value and what is allowed, and change nothing."""

import pytest
import torch

from attnv41.runtime import BatchGraphs, BatchV41
from attnv41.weights import AttnV41LayerWeights
from helpers import pool_snapshot, random_inputs, random_weights, same_pool, small_cfg

P = 13  # prompt length of slot 0


@pytest.fixture(scope="module")
def setup():
    cfg = small_cfg(window=8, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=64, max_tokens=64)
    w = random_weights(cfg, 7)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    xs = [random_inputs(cfg, 40, 107 + k) for k in range(2)]  # per slot, per layer [40, dim]
    return cfg, wts, xs


def _batch(cfg) -> BatchV41:
    return BatchV41(cfg, n_slots=2, block_rows=4)


def _xs(cfg, xs, calls):
    """A step's per-layer inputs for calls (slot, start, count)."""
    return [torch.cat([xs[sl][i][s : s + m] for sl, s, m in calls]) for i in range(cfg.n_layers)]


def _run(bt, cfg, wts, xs, calls, grad=False):
    """One `step` of calls (slot, start, count); `grad`: inputs that require grad."""
    bx = _xs(cfg, xs, calls)
    if grad:
        bx = [x.clone().requires_grad_(True) for x in bx]
    return bt.step(wts, bx, [c[0] for c in calls], [c[1] for c in calls], [c[2] for c in calls])


def _verified(cfg, wts, xs, logged: bool) -> BatchV41:
    """Slot 0: a prompt of P tokens, then 4 draft tokens verified (an undo log kept): in a
    continuation step of its own (device undo buffers) or, `logged`, beside a prompt in
    slot 1 (the host-planned path's per-slot log)."""
    bt = _batch(cfg)
    _run(bt, cfg, wts, xs, [(0, 0, P)])
    _run(bt, cfg, wts, xs, [(0, P, 4)] + ([(1, 0, 3)] if logged else []))
    assert ("cont" in bt.undo[0]) is not logged
    return bt


GONE = "slot 0: rollback to 15: the slot was released, assumed or forked into after its last step, whose undo log went with"


@pytest.mark.parametrize("logged", [False, True], ids=["cont", "logged"])
def test_rollback_after_release_or_assume_is_refused(setup, logged):
    """assume, release, release then assume: each starts a new sequence in the slot, so
    rollback and rollback_many into the old one's last step are refused (only its own
    length, no change, is allowed) and change nothing."""
    cfg, wts, xs = setup
    bt = _verified(cfg, wts, xs, logged)
    for new_seq, end in (
        (lambda: bt.pool.assume(0, 17), 17),
        (lambda: bt.pool.release(0), 0),
        (lambda: bt.pool.assume(0, 17), 17),
    ):
        new_seq()
        before = pool_snapshot(bt)
        for call in (lambda: bt.rollback(0, 15), lambda: bt.rollback_many([0], [15])):
            with pytest.raises(ValueError) as e:
                call()
            assert GONE in str(e.value) and f"allowed: pos = {end} (no change)" in str(e.value), str(e.value)
            same_pool(before, pool_snapshot(bt))
        bt.rollback(0, end)  # no change: allowed
        same_pool(before, pool_snapshot(bt))
    _run(bt, cfg, wts, xs, [(1, 0, 2)])  # another slot's step: the dead log's copies go, the refusal stays
    assert bt.undo[0] == {"seq": bt.undo[0]["seq"]} and bt.undo[0]["seq"] != bt.pool.seq_ids[0]
    with pytest.raises(ValueError, match=GONE):
        bt.rollback(0, 15)


def test_a_new_sequence_after_release_rolls_back_as_in_a_fresh_batch(setup):
    """After release, a new prompt in the slot (no rollback into it: no log), a verify, a
    rollback and a decode token: the same bytes and lengths as a fresh batch running
    only those."""
    cfg, wts, xs = setup
    bt = _verified(cfg, wts, xs, False)
    bt.pool.release(0)
    fresh = _batch(cfg)
    other = [xs[1], xs[0]]  # another sequence's inputs in slot 0
    for b in (bt, fresh):
        b.got = [_run(b, cfg, wts, other, [(0, 0, 5)])]
        before = pool_snapshot(b)
        with pytest.raises(ValueError, match="slot 0: rollback to 3: its last step kept no undo log; allowed: pos = 5"):
            b.rollback(0, 3)
        same_pool(before, pool_snapshot(b))
        b.got.append(_run(b, cfg, wts, other, [(0, 5, 5)]))
        b.rollback(0, 7)
        b.got.append(_run(b, cfg, wts, other, [(0, 7, 1)]))
    assert bt.pool.length == fresh.pool.length == [8, 0]
    for ga, gb in zip(bt.got, fresh.got):
        assert all(torch.equal(u, v) for u, v in zip(ga, gb))


def test_graph_capture_after_release_ignores_the_old_undo_log(setup):
    """A verify step of `BatchGraphs` keeps its undo log in the size's step buffers, so a
    warm-up of that size is refused while the slot may roll back; once the slot is
    released the log is gone: rollback refused, capture allowed."""
    cfg, wts, xs = setup
    bt = _batch(cfg)
    _run(bt, cfg, wts, xs, [(0, 0, P)])
    g = BatchGraphs(bt, wts, sizes=(4,))
    g.step(torch.stack(_xs(cfg, xs, [(0, P, 3)])), [0], [3])
    with pytest.raises(ValueError, match="capture of 'cont' graphs of size 4: their warm-up would overwrite"):
        g.capture([64], kinds=("cont",))
    bt.pool.release(0)
    with pytest.raises(ValueError, match="slot 0: rollback to 14: the slot was released, assumed or forked into"):
        bt.rollback(0, 14)
    assert g.capture([64], kinds=("cont",)) == 0  # the CPU: pad steps run, nothing captured


def _grad_weights(wts):
    """The same weights as `torch.nn.Parameter`s requiring grad (floating tensors)."""
    return [
        AttnV41LayerWeights(
            w.role,
            {
                k: torch.nn.Parameter(t.clone(), requires_grad=t.is_floating_point()) if t.is_floating_point() else t
                for k, t in w.tensors.items()
            },
        )
        for w in wts
    ]


def test_inputs_and_weights_requiring_grad_run_as_plain_tensors(setup):
    """A decode step and a verify step with xs requiring grad and Parameter weights, a
    layer-by-layer decode step (`forward`) with them, then a plain step: the same bytes
    as a fresh batch with only plain calls; no output carries autograd history; no slot
    is marked failed."""
    cfg, wts, xs = setup
    gw = _grad_weights(wts)
    assert any(t.requires_grad for t in gw[1].tensors.values())
    a, b = _batch(cfg), _batch(cfg)
    for j, calls in enumerate([[(0, 0, P)], [(0, P, 1)], [(0, P + 1, 3)], [(0, P + 4, 1)], [(0, P + 5, 1)]]):
        if j == 3:  # forward itself, layer by layer
            x = _xs(cfg, xs, calls)
            st = a.begin([0], [P + 4], [1])
            oa = [a.forward(gw[i], x[i].clone().requires_grad_(True), st).clone() for i in range(cfg.n_layers)]
        else:
            grad = j in (1, 2)
            oa = _run(a, cfg, gw if grad else wts, xs, calls, grad=grad)
        ob = _run(b, cfg, wts, xs, calls)
        assert not any(o.requires_grad for o in oa), f"step {j}"
        assert all(torch.equal(u, v) for u, v in zip(oa, ob)), f"step {j}"
        assert a.pool.failed == {} and a.pool.length == b.pool.length
    same_pool(pool_snapshot(a), pool_snapshot(b))


def test_graph_steps_with_inputs_requiring_grad(setup):
    """`BatchGraphs.step` (eager on the CPU) with xs requiring grad and Parameter
    weights: the plain graph step's bytes, no autograd history."""
    cfg, wts, xs = setup
    a, b = _batch(cfg), _batch(cfg)
    for bt in (a, b):
        _run(bt, cfg, wts, xs, [(0, 0, P), (1, 0, 6)])
    ga, gb = BatchGraphs(a, _grad_weights(wts), sizes=(4,)), BatchGraphs(b, wts, sizes=(4,))
    for calls in ([(0, P, 3), (1, 6, 1)], [(0, P + 3, 1)]):
        x = torch.stack(_xs(cfg, xs, calls))
        slots, lens = [c[0] for c in calls], [c[2] for c in calls]
        ya = ga.step(x.clone().requires_grad_(True), slots, lens)
        yb = gb.step(x, slots, lens)
        assert not ya.requires_grad
        assert torch.equal(ya, yb)
    assert a.pool.failed == {} and a.pool.length == b.pool.length == [P + 4, 7]
    same_pool(pool_snapshot(a, real=True), pool_snapshot(b, real=True))


BAD_STEPS = [
    ([0], [P], ["1"], TypeError, "lens = ['1']; allowed: a list of ints"),
    ([0], [P], [True], TypeError, "lens = [True]; allowed: a list of ints"),
    ([0], [float(P)], [1], TypeError, f"starts = [{float(P)}]; allowed: a list of ints"),
    (["0"], [P], [1], TypeError, "slots = ['0']; allowed: a list of ints"),
    ([0], [P], 1, TypeError, "lens = 1; allowed: a list of ints"),
    ([0], [P], [-1], ValueError, "slot 0: lens = -1; allowed: >= 1"),
    ([0], [P], [1, 1], ValueError, "1 slots, 1 starts, 2 lens; allowed: the same count"),
]


def test_bad_calls_are_named_and_change_nothing(setup):
    """Bad step metadata (before any arithmetic on it) and a layer call after a finished
    step: refused naming the value and what is allowed; nothing changed (the pool, and
    the next valid step's bytes against a fresh batch's)."""
    cfg, wts, xs = setup
    bt, fresh = _batch(cfg), _batch(cfg)
    for b in (bt, fresh):
        _run(b, cfg, wts, xs, [(0, 0, P)])
    x = _xs(cfg, xs, [(0, P, 1)])
    before = pool_snapshot(bt)
    for slots, starts, lens, exc, msg in BAD_STEPS:
        with pytest.raises(exc) as e:
            bt.step(wts, x, slots, starts, lens)
        assert msg in str(e.value), str(e.value)
        same_pool(before, pool_snapshot(bt))
    with pytest.raises(ValueError) as e:
        bt.forward(wts[0], x[0], bt._step)
    msg = "layer 0 of a step; allowed: none (the last begin's step is complete: all 6 layers ran; begin a new step)"
    assert msg in str(e.value), str(e.value)
    same_pool(before, pool_snapshot(bt))
    got, want = _run(bt, cfg, wts, xs, [(0, P, 1)]), _run(fresh, cfg, wts, xs, [(0, P, 1)])
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    assert bt.pool.length == fresh.pool.length == [P + 1, 0]


@pytest.mark.parametrize(
    "blocks, msg",
    [
        (5, "blocks = 5; allowed: None (enough for every slot at max_seq) or a dict {ratio: block count} over the kv"),
        ([(2, 4)], "blocks = [(2, 4)]; allowed: None"),
    ],
)
def test_blocks_must_be_a_dict(setup, blocks, msg):
    cfg, _, _ = setup
    with pytest.raises(TypeError) as e:
        BatchV41(cfg, n_slots=1, blocks=blocks)
    assert msg in str(e.value), str(e.value)


# ------------------------------------------------ lifecycle (2026-12-04 audit, third round)


def _tight(cfg, wts, xs) -> BatchV41:
    """Slot 0 at 20 tokens, slot 1 at 8, blocks of 4 rows, 8 of ratio 1 and 4 of ratio 2:
    one ratio-1 block and no ratio-2 block left (max_tokens 20: a pool must hold a step's
    rows, 4 blocks and the spare one)."""
    bt = BatchV41(cfg.replace(max_tokens=20), n_slots=2, block_rows=4, blocks={1: 8, 2: 4})
    _run(bt, cfg, wts, xs, [(0, 0, 20)])
    _run(bt, cfg, wts, xs, [(1, 0, 8)])
    assert {r: len(f) for r, f in bt.pool.free_blocks.items()} == {1: 1, 2: 0}
    return bt


def test_a_restarting_slot_frees_its_blocks_whatever_the_slot_order(setup):
    """Slot 1 grows (8 → 9: a block of each ratio) while slot 0 restarts (its blocks are the
    ones slot 1 needs): the step is valid in either slot order. Before, with slot 1 listed
    first, it raised IndexError after taking the last ratio-1 block. Each sequence's
    output rows are the same bytes in both orders (batch invariance)."""
    cfg, wts, xs = setup
    got = {}
    for order in ([(1, 8, 1), (0, 0, 4)], [(0, 0, 4), (1, 8, 1)]):
        bt = _tight(cfg, wts, xs)
        ys = [y.clone() for y in _run(bt, cfg, wts, xs, order)]
        rows = {}
        o = 0
        for sl, _, m in order:
            rows[sl] = [y[o : o + m] for y in ys]
            o += m
        got[tuple(c[0] for c in order)] = rows
        assert bt.pool.length == [4, 9]
    a, b = got[(1, 0)], got[(0, 1)]
    for sl in (0, 1):
        assert all(torch.equal(u, v) for u, v in zip(a[sl], b[sl])), f"slot {sl}"


def test_a_begun_step_that_ran_no_layer_is_dropped_by_the_next_begin(setup):
    """begin, then (no layer run) a step restarting that step's slot and another one: the
    unrun step is dropped (it wrote nothing), the new step runs, its forward is refused
    afterwards, and the untouched slot keeps its sequence. Before, the new step released
    slot 1, then raised releasing slot 0 (in the unrun step), losing slot 1's sequence."""
    cfg, wts, xs = setup
    bt, clean = _batch(cfg), _batch(cfg)
    for b in (bt, clean):
        _run(b, cfg, wts, xs, [(0, 0, 12), (1, 0, 10)])
    unrun = bt.begin([0], [12], [1])
    a = [y.clone() for y in _run(bt, cfg, wts, xs, [(1, 0, 5), (0, 0, 5)])]
    b = [y.clone() for y in _run(clean, cfg, wts, xs, [(1, 0, 5), (0, 0, 5)])]
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and bt.pool.length == clean.pool.length == [5, 5]
    with pytest.raises(ValueError, match=r"layer 0 of a step; allowed: none \(the last begin's step is complete"):
        bt.forward(wts[0], xs[0][0][12:13], unrun)


def test_batch_calls_after_the_runtime_is_freed_are_refused(setup):
    """attn.free() under a BatchV41: begin, step, BatchGraphs.step and rollback raise
    naming it before anything changes (before: TypeError inside layer 0, the slot marked
    failed and its undo log dropped)."""
    cfg, wts, xs = setup
    bt = _verified(cfg, wts, xs, logged=False)
    g = BatchGraphs(bt, wts, sizes=(1,))
    before = pool_snapshot(bt)
    bt.attn.free()
    msg = r"BatchV41\.{} after its runtime was freed \(attn\.free\(\)\)"
    with pytest.raises(RuntimeError, match=msg.format("begin")):
        _run(bt, cfg, wts, xs, [(0, P + 4, 1)])
    with pytest.raises(RuntimeError, match=msg.format("begin")):
        g.step(torch.stack(_xs(cfg, xs, [(0, P + 4, 1)])), [0])
    with pytest.raises(RuntimeError, match=msg.format("rollback")):
        bt.rollback(0, P + 1)
    same_pool(before, pool_snapshot(bt))
    assert not bt.pool.failed and bt.undo[0]["done"]
    for call in (lambda: bt.attn.new_layer_state(0), bt.attn.new_shared):
        with pytest.raises(RuntimeError, match=r"after free\(\)"):
            call()


def test_a_pool_holds_a_steps_rows(setup):
    """A step writes a pool row per token and the cache writes keep a step's last `rows`
    writes, so a pool smaller than max_tokens rows dropped the first tokens' compressed rows
    (a differential fuzzer: out off by up to 2.7 against the reference). Explicit blocks
    below that are refused naming the bound; the default is never below it."""
    cfg, _, _ = setup
    small = cfg.replace(max_seq=8, max_tokens=8)
    with pytest.raises(ValueError, match=r"blocks\[2\] = 4; allowed: an int >= 7 \(with the spare block, at least "):
        BatchV41(small, n_slots=1, block_rows=1, blocks={2: 4})
    bt = BatchV41(small, n_slots=1, block_rows=1)
    assert all((n + 1) * 1 >= small.max_tokens for n in bt.pool.n_blocks.values())
