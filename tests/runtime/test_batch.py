"""Batched steps (`BatchV41` over a `SeqPool`) on the CPU: each sequence's outputs and
cache rows equal its own single-sequence run (`RuntimeStack`, the same chunking) bit for
bit, whatever else is in the batch; paged placement changes nothing; bad metadata is
refused with the allowed range and changes nothing."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.runtime import RuntimeStack
from attnv41.runtime.batch import BatchV41
from attnv41.weights import AttnV41LayerWeights
from helpers import pool_snapshot, random_inputs, random_weights, same_pool, small_cfg

RATIOS = [(0, 2, 2, 1, 1, 1), (0, 4, 4, 2, 2, 2), (0, 4, 4, 1, 1, 1), (0, 1, 1, 1, 1, 1)]


def _setup(ratios, window, seed, n_slots, block_rows, blocks=None, topk=6, index_keys="own"):
    cfg = small_cfg(window=window, index_topk=topk, compress_ratios=ratios, max_seq=64, max_tokens=64)
    w = random_weights(cfg, seed)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    xs = [random_inputs(cfg, 64, seed + 100 + k) for k in range(n_slots)]
    bt = BatchV41(cfg, n_slots=n_slots, block_rows=block_rows, blocks=blocks, index_keys=index_keys)
    return cfg, w, wts, xs, bt


def _schedule(rng, n_slots, steps, max_len=60):
    """Steps of (slots, starts, lens): random subsets, prefills of 1-12 tokens, decode
    tokens, chunks and verify-sized calls, and restarts of a slot at 0."""
    length, out = [0] * n_slots, []
    for _ in range(steps):
        slots = rng.sample(range(n_slots), rng.randint(1, n_slots))
        starts, lens = [], []
        for sl in slots:
            restart = length[sl] and rng.random() < 0.1
            s = 0 if restart else length[sl]
            m = rng.randint(1, 12) if s == 0 else rng.choice([1, 1, 1, 2, 3, 5, 9])
            m = max(1, min(m, max_len - s))
            if s + m > max_len:
                s, m = 0, rng.randint(1, 12)
            starts.append(s)
            lens.append(m)
            length[sl] = s + m
        out.append((slots, starts, lens))
    return out


def _run(cfg, w, wts, xs, bt, schedule, compare=True):
    """Run the schedule batched; with `compare`, each sequence also alone. Returns the
    batched outputs per step."""
    seqs = {}
    got = []
    for slots, starts, lens in schedule:
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        outs = bt.step(wts, bx, slots, starts, lens)
        got.append(outs)
        if not compare:
            continue
        o = 0
        for sl, s, m in zip(slots, starts, lens):
            if s == 0:
                seqs[sl] = RuntimeStack(cfg, w, index_keys=bt.index_keys)
            ref = seqs[sl].step([x[s : s + m] for x in xs[sl]], s, keep=True)
            for i in range(cfg.n_layers):
                assert torch.equal(ref[i], outs[i][o : o + m]), f"slot {sl} [{s}, {s + m}) L{i}"
            o += m
    if compare:
        for sl, rt in seqs.items():
            for i in cfg.kv_source_layers:
                n = rt.states[i].n_rows
                assert torch.equal(bt.pool.cache_rows(i, sl, n), rt.states[i].compress_kv[:n]), f"slot {sl} L{i} rows"
                assert torch.equal(bt.pool.cache_rows(i, sl, n, keys=True), rt.states[i].index_k[:n]), f"L{i} keys"
    return got


@settings(max_examples=12, deadline=None)
@given(
    ratios=st.sampled_from(RATIOS),
    window=st.sampled_from([4, 8, 16]),
    block_rows=st.sampled_from([1, 3, 4, 64]),
    seed=st.integers(0, 10_000),
)
def test_batched_equals_each_sequence_alone(ratios, window, block_rows, seed):
    cfg, w, wts, xs, bt = _setup(ratios, window, seed, 4, block_rows)
    _run(cfg, w, wts, xs, bt, _schedule(random.Random(seed), 4, 8))


@settings(max_examples=10, deadline=None)
@given(
    ratios=st.sampled_from(RATIOS),
    window=st.sampled_from([4, 8]),
    block_rows=st.sampled_from([1, 4]),
    seed=st.integers(0, 10_000),
)
def test_released_keys_equal_each_sequence_alone(ratios, window, block_rows, seed):
    """index_keys="released": each sequence scores the keys its own history published
    last (attention-v41.md §9), whatever the other sequences' positions, so its bytes
    equal its single-sequence run in released mode (prompts, decode tokens, chunks,
    restarts)."""
    cfg, w, wts, xs, bt = _setup(ratios, window, seed, 4, block_rows, index_keys="released")
    _run(cfg, w, wts, xs, bt, _schedule(random.Random(seed), 4, 8))


def test_released_keys_follow_each_sequence():
    """At the golden geometry's roles (a ratio-2 Full layer before a ratio-1 one): a
    decode token that completes no ratio-2 group scores the ratio-1 layer's keys, one
    that completes one its own, so one step holds both owners; the trace names each."""
    cfg, w, wts, xs, bt = _setup((0, 2, 0, 1, 0, 1), 8, 5, 2, 4, index_keys="released")
    i = next(r.layer for r in cfg.roles if r.ratio == 2 and r.is_kv_source and r.is_index_source)
    later = next(r.layer for r in cfg.roles if r.ratio == 1 and r.is_kv_source and r.is_index_source)
    # decode at position 6 (7 tokens: no new ratio-2 group) and 7 (8 tokens: group 3 completes)
    sched = [([0, 1], [0, 0], [6, 7]), ([0, 1], [6, 7], [1, 1])]
    _run(cfg, w, wts, xs, bt, sched[:1])
    step = bt.begin(*sched[1])
    assert step.keys_plan[0][i] == [later, i], step.keys_plan[0][i]
    bx = [torch.cat([xs[sl][k][s : s + m] for sl, s, m in zip(*sched[1])]) for k in range(cfg.n_layers)]
    for k in range(cfg.n_layers):
        bt.forward(wts[k], bx[k], step)
    assert bt.keys_owner == [later, later]


def test_released_keys_past_the_publisher_are_refused():
    """A ratio-2 Full layer after a ratio-4 one published last would score 2 keys of a
    cache holding 1 (the released code reads an unwritten row there): begin refuses it,
    naming both layers, and nothing changes (lengths, owners, blocks)."""
    cfg, w, wts, xs, bt = _setup((0, 2, 2, 4, 4, 4), 4, 1, 1, 4, index_keys="released")
    _run(cfg, w, wts, xs, bt, [([0], [0], [4])], compare=False)
    before = (list(bt.pool.length), list(bt.keys_owner), {r: list(b) for r, b in bt.pool.free_blocks.items()})
    with pytest.raises(
        ValueError, match=r"slot 0: layer 1 at start_pos 4 would score 2 index keys of layer 3, which holds 1"
    ):
        bt.begin([0], [4], [1])
    after = (list(bt.pool.length), list(bt.keys_owner), {r: list(b) for r, b in bt.pool.free_blocks.items()})
    assert after == before


def test_released_keys_of_an_assumed_sequence_are_one_calls():
    """`SeqPool.assume` gives a slot a sequence without history: its released-key owner is
    the one one call of its tokens leaves (real prefills in other slots: 3 tokens leave the
    ratio-2 publisher, 4 the ratio-4 one, 1 none), not the slot's previous sequence's; a
    step then runs from it."""
    cfg, w, wts, xs, bt = _setup((0, 2, 2, 4, 4, 4), 4, 1, 3, 4, index_keys="released")
    pub = [r.layer for r in cfg.roles if r.ratio and r.is_kv_source and r.is_index_source]
    assert [cfg.roles[k].ratio for k in pub] == [2, 4], pub
    _run(cfg, w, wts, xs, bt, [([0, 1], [0, 0], [3, 4])], compare=False)
    assert bt.keys_owner[:2] == pub
    for n, want in ((1, None), (3, pub[0]), (4, pub[1])):
        bt.pool.assume(2, n)
        assert bt._owner_at(2, n) == want, n
    bt.pool.assume(1, 3)  # slot 1's sequence owned pub[1]; the assumed one's is one call's
    assert bt._owner_at(1, 3) == pub[0]
    bt.pool.assume(2, 3)
    step = bt.begin([2], [3], [1])  # token 3 completes a group of both publishers
    assert step.keys_plan[1] == [pub[1]]
    for k in range(cfg.n_layers):
        bt.forward(wts[k], xs[2][k][3:4], step)
    assert bt.keys_owner[2] == pub[1] and bt._owner_at(2, 4) == pub[1]
    bt.pool.release(2)
    assert bt._owner_at(2, 0) is None


def test_released_keys_refusals():
    cfg, w, wts, xs, bt = _setup((0, 2, 0, 1, 0, 1), 8, 5, 2, 4, index_keys="released")
    _run(cfg, w, wts, xs, bt, [([0], [0], [6]), ([0], [6], [3])], compare=False)
    with pytest.raises(
        ValueError, match=r"slot 0: rollback to 7 with index_keys = 'released'; allowed: 'own', or pos = 9"
    ):
        bt.rollback(0, 7)
    with pytest.raises(ValueError, match=r"slot 0: rollback to 8 with index_keys = 'released'"):
        bt.rollback_many([0], [8])
    bt.rollback(0, 9)  # the no-op is allowed in every mode
    bt.rollback_many([0], [9])
    assert bt.pool.length[0] == 9
    with pytest.raises(ValueError, match=r"index_keys = 'shared'; allowed: \('own', 'released'\)"):
        BatchV41(cfg, n_slots=1, index_keys="shared")


def test_paged_placement_changes_nothing():
    """The same schedule over a pool whose blocks are handed out in a scrambled order
    gives the same bytes as in-order placement."""
    sched = _schedule(random.Random(3), 3, 10)
    cfg, w, wts, xs, a = _setup((0, 2, 2, 1, 1, 1), 8, 3, 3, 2)
    *_, b = _setup((0, 2, 2, 1, 1, 1), 8, 3, 3, 2)
    for r in b.pool.free_blocks:
        random.Random(r).shuffle(b.pool.free_blocks[r])
    ga, gb = _run(cfg, w, wts, xs, a, sched, compare=False), _run(cfg, w, wts, xs, b, sched, compare=False)
    assert any(not torch.equal(a.pool.tables[r], b.pool.tables[r]) for r in a.pool.ratios)
    for sa, sb in zip(ga, gb):
        assert all(torch.equal(u, v) for u, v in zip(sa, sb))


_MID = [([0, 1], [0, 0], [9, 5]), ([1, 0], [5, 9], [1, 2])]  # mid_batch's steps


@pytest.fixture
def mid_batch():
    cfg, w, wts, xs, bt = _setup((0, 2, 2, 1, 1, 1), 8, 5, 3, 4, blocks={2: 15, 1: 15})  # >= max_tokens rows
    _run(cfg, w, wts, xs, bt, _MID, compare=False)
    return cfg, wts, xs, bt


def _x(cfg, T):
    return [torch.zeros(T, cfg.dim, dtype=torch.bfloat16) for _ in range(cfg.n_layers)]


REFUSED = {
    "slot_out_of_range": (lambda bt, cfg, wts: bt.begin([3], [0], [1]), "slot = 3; allowed: 0..2"),
    "slot_twice": (lambda bt, cfg, wts: bt.begin([1, 1], [6, 6], [1, 1]), "slots [1] appear twice"),
    "skipped_position": (
        lambda bt, cfg, wts: bt.begin([0], [12], [1]),
        "start = 12; allowed: 0 (a new sequence) or 11",
    ),
    "empty_slot_continued": (
        lambda bt, cfg, wts: bt.begin([2], [5], [1]),
        "slot 2: start = 5, but the slot holds no sequence; allowed: 0 (a new sequence)",
    ),
    "zero_tokens": (lambda bt, cfg, wts: bt.begin([0], [11], [0]), "lens = 0; allowed: >= 1"),
    "past_max_seq": (lambda bt, cfg, wts: bt.begin([0], [11], [60]), "positions 11..70; allowed: 0..63"),
    "too_many_tokens": (
        lambda bt, cfg, wts: bt.begin([2, 0], [0, 0], [40, 30]),
        "70 tokens in the step; allowed: 1..64",
    ),
    "counts_differ": (lambda bt, cfg, wts: bt.begin([0, 1], [11], [1, 1]), "2 slots, 1 starts, 2 lens"),
    "not_ints": (lambda bt, cfg, wts: bt.begin([0], [11.0], [1]), "starts = [11.0]; allowed: a list of ints"),
    "out_of_blocks": (
        lambda bt, cfg, wts: bt.begin([2], [0], [44]),
        "the step needs 11 more blocks of ratio 1; allowed: at most the 10 free",
    ),
    "layer_out_of_order": (
        lambda bt, cfg, wts: bt.forward(wts[1], _x(cfg, 1)[1], bt.begin([0], [11], [1])),
        "layer 1 of a step; allowed: layer 0 of the last begin",
    ),
    "rows_differ": (
        lambda bt, cfg, wts: bt.forward(wts[0], _x(cfg, 2)[0], bt.begin([0], [11], [1])),
        "x has 2 rows; allowed: the step's 1 tokens",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_bad_metadata_is_refused_and_changes_nothing(mid_batch, case):
    cfg, wts, xs, bt = mid_batch
    call, msg = REFUSED[case]
    before = pool_snapshot(bt)
    with pytest.raises((ValueError, TypeError)) as e:
        call(bt, cfg, wts)
    assert msg in str(e.value), str(e.value)
    same_pool(before, pool_snapshot(bt))


def test_begin_during_a_step_is_refused(mid_batch):
    cfg, wts, xs, bt = mid_batch
    stp = bt.begin([0], [11], [1])
    bt.forward(wts[0], _x(cfg, 1)[0], stp)
    with pytest.raises(ValueError, match="begin during a step \\(layer 1 runs next\\); allowed: after layer 5"):
        bt.begin([1], [6], [1])


def test_release_returns_the_blocks(mid_batch):
    cfg, wts, xs, bt = mid_batch
    free = {r: len(v) for r, v in bt.pool.free_blocks.items()}
    owned = {r: len(bt.pool.blocks_of[r][0]) for r in bt.pool.ratios}
    bt.pool.release(0)
    assert bt.pool.length[0] == 0
    assert {r: len(v) for r, v in bt.pool.free_blocks.items()} == {r: free[r] + owned[r] for r in free}
    assert all((bt.pool.tables[r][0] == -1).all() for r in bt.pool.ratios)
    bt.pool.release(0)  # an empty slot: allowed, nothing to return
    assert bt.pool.length[0] == 0 and {r: len(v) for r, v in bt.pool.free_blocks.items()} == {
        r: free[r] + owned[r] for r in free
    }


def test_cancel_drops_a_step_before_its_first_layer(mid_batch):
    """`cancel` drops a begun step that ran no layer: its slots may be released, and the
    next steps give the bytes of a twin that never began it; once a layer ran it is
    refused, and without a step it does nothing."""
    cfg, wts, xs, bt = mid_batch
    tw = _setup((0, 2, 2, 1, 1, 1), 8, 5, 3, 4, blocks={2: 15, 1: 15})
    _run(*tw, _MID, compare=False)
    st = bt.begin([0, 1], [11, 6], [1, 1])
    with pytest.raises(ValueError, match=r"release\(slot 1\) while a step of slots \[0, 1\] runs; .*cancel\(\) first"):
        bt.pool.release(1)
    bt.cancel()
    with pytest.raises(ValueError, match=r"layer 0 of a step; allowed: none \(call begin\)"):
        bt.forward(wts[0], _x(cfg, 2)[0], st)
    bt.pool.release(1)
    tw[-1].pool.release(1)
    bt.cancel()  # no step: nothing to do
    nxt = [([0, 1], [11, 0], [1, 3])]
    got, want = _run(cfg, None, wts, xs, bt, nxt, compare=False), _run(*tw, nxt, compare=False)
    assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))
    st = bt.begin([0], [12], [1])
    bt.forward(wts[0], _x(cfg, 1)[0], st)
    with pytest.raises(ValueError, match=r"cancel after layer 0 of the step ran; allowed: before its first layer"):
        bt.cancel()


def test_forward_into_the_callers_out(mid_batch):
    """`forward(..., out=)` writes the layer's output into the caller's tensor and returns
    it, with the bytes of the runtime's own buffer (a twin without out); a bad out is
    refused before the layer runs, and the step goes on."""
    cfg, wts, xs, bt = mid_batch
    tw = _setup((0, 2, 2, 1, 1, 1), 8, 5, 3, 4, blocks={2: 15, 1: 15})
    _run(*tw, _MID, compare=False)
    twin = tw[-1]
    slots, starts, lens = [0, 1, 2], [11, 6, 0], [1, 2, 4]
    x = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
    sa, sb = bt.begin(slots, starts, lens), twin.begin(slots, starts, lens)
    T = sum(lens)
    bad = {
        "a list": ([0.0] * T, "out is a list; allowed: None or a contiguous bf16 [7, 64] tensor on cpu"),
        "fp32": (torch.zeros(T, cfg.dim), "out is torch.float32 [7, 64] on cpu; allowed"),
        "shape": (torch.zeros(T + 1, cfg.dim, dtype=torch.bfloat16), "[8, 64] on cpu; allowed: a contiguous bf16 [7"),
        "strided": (torch.zeros(cfg.dim, T, dtype=torch.bfloat16).t(), "[7, 64] on cpu, not contiguous; allowed"),
        "device": (torch.zeros(T, cfg.dim, dtype=torch.bfloat16, device="meta"), "on meta; allowed"),
        "x itself": (x[0], "out shares x's memory; allowed: a buffer of its own"),
    }
    for name, (o, msg) in bad.items():
        with pytest.raises(ValueError) as e:
            bt.forward(wts[0], x[0], sa, out=o)
        assert msg in str(e.value), (name, str(e.value))
    for i in range(cfg.n_layers):
        buf = torch.full((T, cfg.dim), float("nan"), dtype=torch.bfloat16)
        got = bt.forward(wts[i], x[i], sa, out=buf)
        want = twin.forward(wts[i], x[i], sb)
        assert got is buf and torch.equal(buf.view(torch.int16), want.view(torch.int16)), f"layer {i}"
    same_pool(pool_snapshot(bt), pool_snapshot(twin))


@pytest.mark.gpu
def test_batched_on_cuda_matches_the_cpu():
    """A schedule of mixed steps on CUDA against the same on the CPU, within the bf16
    tolerance (selections may differ at near-ties on the GPU: a tiny config with few
    rows per block keeps that rare; a failure names the step, slot and layer)."""
    from attnv41.testing import compare_bf16

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(window=8, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=64, max_tokens=64)
    w = random_weights(cfg, 41)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    wg = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg, device="cuda") for i in range(cfg.n_layers)]
    xs = [random_inputs(cfg, 64, 141 + k) for k in range(4)]
    cpu, gpu = BatchV41(cfg, n_slots=4, block_rows=4), BatchV41(cfg, "cuda", n_slots=4, block_rows=4)
    for j, (slots, starts, lens) in enumerate(_schedule(random.Random(41), 4, 8)):
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        oc = cpu.step(wts, bx, slots, starts, lens)
        og = gpu.step(wg, [x.cuda() for x in bx], slots, starts, lens)
        for i in range(cfg.n_layers):
            c = compare_bf16(f"step {j} L{i}", og[i].cpu(), oc[i])
            assert c.ok, c


@settings(max_examples=10, deadline=None)
@given(ratios=st.sampled_from(RATIOS), block_rows=st.sampled_from([1, 4]), seed=st.integers(0, 10_000))
def test_batched_verify_and_rollback_equal_each_sequence_alone(ratios, block_rows, seed):
    """Steps where slots verify 2..window draft tokens and then roll back to a random
    position inside them (others decode meanwhile), against each sequence alone with
    `RuntimeStack.rollback`: the same bytes in every output and in the cache rows."""
    rng = random.Random(seed)
    cfg, w, wts, xs, bt = _setup(ratios, 8, seed, 3, block_rows)
    seqs = [RuntimeStack(cfg, w) for _ in range(3)]
    length = [0, 0, 0]
    for j in range(9):
        slots = rng.sample(range(3), rng.randint(1, 3))
        starts, lens = [], []
        for sl in slots:
            m = rng.randint(1, 9) if length[sl] == 0 else rng.choice([1, 2, 3, 5, 8])
            m = min(m, 60 - length[sl])
            starts.append(length[sl])
            lens.append(max(m, 1))
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        outs = bt.step(wts, bx, slots, starts, lens)
        o = 0
        for sl, s, m in zip(slots, starts, lens):
            ref = seqs[sl].step([x[s : s + m] for x in xs[sl]], s, keep=True)
            for i in range(cfg.n_layers):
                assert torch.equal(ref[i], outs[i][o : o + m]), f"step {j} slot {sl} L{i}"
            o += m
            length[sl] = s + m
            if s > 0 and m >= 2 and rng.random() < 0.7:
                back = rng.randint(s, s + m)
                bt.rollback(sl, back)
                seqs[sl].rollback(back)
                length[sl] = back
                assert bt.pool.length[sl] == back


def test_batched_rollback_refusals(mid_batch):
    cfg, wts, xs, bt = mid_batch  # slot 0 at 11 (its last step: 2 tokens at 9), slot 1 at 6 (1 token)
    before = pool_snapshot(bt)
    for call, msg in (
        (lambda: bt.rollback(0, 8), "slot 0: pos = 8; allowed: 9..11"),
        (lambda: bt.rollback(0, 12), "slot 0: pos = 12; allowed: 9..11"),
        (lambda: bt.rollback(1, 5), "slot 1: rollback to 5: its last step kept no undo log; allowed: pos = 6"),
        (lambda: bt.rollback(2, 1), "slot 2: rollback to 1: its last step kept no undo log; allowed: pos = 0"),
        (lambda: bt.rollback(3, 0), "slot = 3; allowed: 0..2"),
        (lambda: bt.rollback(0, 9.0), "pos = 9.0 is a float; allowed: int"),
    ):
        with pytest.raises((ValueError, TypeError)) as e:
            call()
        assert msg in str(e.value), str(e.value)
        same_pool(before, pool_snapshot(bt))
    stp = bt.begin([1], [6], [1])
    bt.forward(wts[0], _x(cfg, 1)[0], stp)
    with pytest.raises(ValueError, match="rollback during a step \\(layer 1 runs next\\)"):
        bt.rollback(0, 10)


@settings(max_examples=8, deadline=None)
@given(ratios=st.sampled_from(RATIOS), block_rows=st.sampled_from([1, 4]), seed=st.integers(0, 10_000))
def test_fixed_shape_steps_equal_each_sequence_alone(ratios, block_rows, seed):
    """Steps begun with a context bucket (index widths bucket // ratio), and decode-only
    steps (the fixed-shape compressor: every group pooled, in progress or not): the same
    bytes as each sequence alone."""
    cfg, w, wts, xs, bt = _setup(ratios, 8, seed, 3, block_rows)
    rng = random.Random(seed)
    seqs = [RuntimeStack(cfg, w) for _ in range(3)]
    length = [0, 0, 0]
    for j in range(10):
        if j == 0 or rng.random() < 0.3:
            slots = rng.sample(range(3), rng.randint(1, 3))
            lens = [rng.randint(1, 6) if length[sl] == 0 else rng.choice([1, 3]) for sl in slots]
        else:
            slots = [sl for sl in range(3) if length[sl] > 0]
            lens = [1] * len(slots)
        starts = [length[sl] for sl in slots]
        bucket = 16 * -(-max(s + m for s, m in zip(starts, lens)) // 16)
        bx = [torch.cat([xs[sl][i][s : s + m] for sl, s, m in zip(slots, starts, lens)]) for i in range(cfg.n_layers)]
        step = bt.begin(slots, starts, lens, bucket=bucket)
        outs = [bt.forward(wts[i], bx[i], step).clone() for i in range(cfg.n_layers)]
        o = 0
        for sl, s, m in zip(slots, starts, lens):
            ref = seqs[sl].step([x[s : s + m] for x in xs[sl]], s, keep=True)
            for i in range(cfg.n_layers):
                assert torch.equal(ref[i], outs[i][o : o + m]), f"step {j} ({step.decode_only}) slot {sl} L{i}"
            o += m
            length[sl] = s + m
    top = length[0] + 1
    with pytest.raises(ValueError, match=f"bucket = {top - 1}; allowed: {top}..64"):
        bt.begin([0], [length[0]], [1], bucket=top - 1)
