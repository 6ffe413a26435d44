"""`BatchV41.fork`: a sequence continued in several slots, its compressed-KV and index-key
blocks shared (copy on write). Every slot's outputs and cache rows equal those of its own
sequence run alone (`RuntimeStack`, copied at the fork) bit for bit, whatever its sharers
do; the block counts stay consistent (`SeqPool.refs`); refused forks change nothing."""

import copy
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.packed import unpack
from attnv41.runtime import RuntimeStack
from attnv41.runtime.batch import BatchV41
from attnv41.runtime.batch_graphs import BatchGraphs
from attnv41.synthetic import random_inputs
from attnv41.weights import AttnV41LayerWeights
from helpers import pool_snapshot, random_weights, same_pool, small_cfg

RATIOS = [(0, 2, 2, 1, 1, 1), (0, 4, 4, 2, 2, 2), (0, 1, 1, 1, 1, 1)]


def _setup(ratios, seed, n_slots, block_rows, kv_format="bf16", index_keys="own", blocks=None):
    cfg = small_cfg(window=8, index_topk=6, compress_ratios=ratios, max_seq=64, max_tokens=64)
    w = random_weights(cfg, seed)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg) for i in range(cfg.n_layers)]
    bt = BatchV41(
        cfg, n_slots=n_slots, block_rows=block_rows, kv_format=kv_format, index_keys=index_keys, blocks=blocks
    )
    return cfg, w, wts, bt


def check_blocks(pool) -> None:
    """Every block's count is the number of slot tables holding it; the free list holds
    exactly the blocks nobody holds, once each; the device tables match the host's lists."""
    for r in pool.ratios:
        held = [0] * pool.n_blocks[r]
        for sl in range(pool.n_slots):
            mine = pool.blocks_of[r][sl]
            for b in mine:
                held[b] += 1
            row = pool.tables[r][sl].tolist()
            assert row[: len(mine)] == mine and all(v == -1 for v in row[len(mine) :]), f"ratio {r} slot {sl} table"
        assert held == pool.refs[r], f"ratio {r} counts"
        free = pool.free_blocks[r]
        assert len(set(free)) == len(free) and set(free) == {b for b, n in enumerate(held) if n == 0}, f"ratio {r}"


class Model:
    """Each slot's sequence alone: a `RuntimeStack` fed the same calls (a fork copies it)."""

    def __init__(self, cfg, w, bt, seed):
        self.cfg, self.w, self.bt = cfg, w, bt
        self.seqs: dict[int, RuntimeStack] = {}
        self.length = [0] * bt.pool.n_slots
        self.gen = seed

    def step(self, slots, lens, starts=None, driver=None):
        cfg = self.cfg
        starts = [self.length[s] for s in slots] if starts is None else starts
        self.gen += 1
        xs = [random_inputs(cfg, m, self.gen * 100 + k) for k, m in enumerate(lens)]
        bx = [torch.cat([x[i] for x in xs]) for i in range(cfg.n_layers)]
        if driver is None:
            outs = self.bt.step(self.bt_wts, bx, slots, starts, lens)
        else:
            y = driver.step(torch.stack(bx), slots, lens, starts)
            outs = [y[i] for i in range(cfg.n_layers)]
        o = 0
        for sl, s, m, x in zip(slots, starts, lens, xs):
            if s == 0:
                self.seqs[sl] = RuntimeStack(
                    cfg, self.w, index_keys=self.bt.index_keys, kv_format=self.bt.pool.kv_format
                )
            ref = self.seqs[sl].step(x, s, keep=True)
            for i in range(cfg.n_layers):
                assert torch.equal(ref[i], outs[i][o : o + m]), f"slot {sl} [{s}, {s + m}) L{i}"
            o += m
            self.length[sl] = s + m

    def fork(self, src, dsts):
        self.bt.fork(src, dsts)
        for d in [dsts] if isinstance(dsts, int) else dsts:
            self.seqs[d] = copy.deepcopy(self.seqs[src])
            self.length[d] = self.length[src]

    def check_caches(self):
        pool = self.bt.pool
        for sl, rt in self.seqs.items():
            assert pool.length[sl] == self.length[sl]
            for i in self.cfg.kv_source_layers:
                n = rt.states[i].n_rows
                assert torch.equal(pool.cache_rows(i, sl, n), _rows(rt, i, n)), f"slot {sl} L{i} rows"
                assert torch.equal(pool.cache_rows(i, sl, n, keys=True), _rows(rt, i, n, True)), f"slot {sl} L{i} keys"
        check_blocks(pool)


def _model(cfg, w, wts, bt, seed):
    m = Model(cfg, w, bt, seed)
    m.bt_wts = wts
    return m


def _rows(rt, i, n, keys=False):
    """A `RuntimeStack` layer's first n cache rows, bf16 (packed rows unpacked)."""
    st = rt.states[i]
    got = (st.index_k if keys else st.compress_kv)[:n]
    if got.dtype != torch.uint8:
        return got
    D = rt.cfg.index_head_dim if keys else rt.cfg.head_dim
    return unpack(got, "fp4_e8m0" if keys else "fp4_e4m3", D)


@settings(max_examples=14, deadline=None)
@given(
    ratios=st.sampled_from(RATIOS),
    block_rows=st.sampled_from([1, 4]),
    kv_format=st.sampled_from(["bf16", "packed"]),
    index_keys=st.sampled_from(["own", "released"]),
    seed=st.integers(0, 10_000),
)
def test_forked_slots_equal_their_sequences_alone(ratios, block_rows, kv_format, index_keys, seed):
    """Random steps over 4 slots with forks in between (prompts, decode tokens, verify-sized
    calls and rollbacks, restarts, forks into busy and free slots): each slot's outputs and
    cache rows equal its own sequence's run alone, the blocks' counts stay consistent."""
    rng = random.Random(seed)
    cfg, w, wts, bt = _setup(ratios, seed, 4, block_rows, kv_format, index_keys)
    md = _model(cfg, w, wts, bt, seed)
    md.step([0], [rng.randint(1, 12)])
    for _ in range(8):
        held = [s for s in range(4) if md.length[s] > 0]
        if rng.random() < 0.4:
            src = rng.choice(held)
            dsts = rng.sample([s for s in range(4) if s != src], rng.randint(1, 2))
            before = {r: set(b) for r, b in bt.pool.free_blocks.items()}
            md.fork(src, dsts)
            for r, b in bt.pool.free_blocks.items():  # a fork takes no block (a busy dst returns its own)
                assert before[r] <= set(b)
            md.check_caches()
            continue
        slots = rng.sample(range(4), rng.randint(1, 4))
        starts, lens = [], []
        for sl in slots:
            n = md.length[sl]
            if n == 0 or n > 50 or rng.random() < 0.08:
                starts.append(0)
                lens.append(rng.randint(1, 10))
            else:
                starts.append(n)
                lens.append(rng.choice([1, 1, 1, 2, 3, 5]))
        md.step(slots, lens, starts)
        if index_keys == "own":
            for sl, s, m in zip(slots, starts, lens):
                if s > 0 and m >= 2 and rng.random() < 0.5:
                    back = rng.randint(s, s + m)
                    bt.rollback(sl, back)
                    md.seqs[sl].rollback(back)
                    md.length[sl] = back
        md.check_caches()


def test_a_fork_shares_blocks_and_copies_on_write():
    """After a fork both slots hold the same blocks (no free block taken); the first step
    of either copies only the block it writes into; releasing both returns every block."""
    cfg, w, wts, bt = _setup((0, 1, 1, 1, 1, 1), 3, 3, 4)
    md = _model(cfg, w, wts, bt, 3)
    md.step([0], [22])  # ratio 1: 22 rows, 6 blocks of 4 (the last half full)
    pool = bt.pool
    free0 = len(pool.free_blocks[1])
    md.fork(0, [1, 2])
    assert pool.blocks_of[1][1] == pool.blocks_of[1][0] == pool.blocks_of[1][2]
    assert len(pool.free_blocks[1]) == free0 and all(pool.refs[1][b] == 3 for b in pool.blocks_of[1][0])
    md.step([1], [1])  # position 22: row 22, block 5 (shared, copied)
    assert pool.blocks_of[1][1][:5] == pool.blocks_of[1][0][:5]
    assert pool.blocks_of[1][1][5] != pool.blocks_of[1][0][5]
    assert len(pool.free_blocks[1]) == free0 - 1
    md.step([0, 2], [2, 1])  # 0 writes rows 22, 23 into block 5 (still shared by 0 and 2): copies too
    assert len({pool.blocks_of[1][s][5] for s in range(3)}) == 3
    assert len(pool.free_blocks[1]) == free0 - 2
    md.step([2], [3])  # block 5 is now 2's alone: written in place; rows 23..24 grow block 6
    assert len(pool.free_blocks[1]) == free0 - 3
    md.check_caches()
    for s in range(3):
        pool.release(s)
    check_blocks(pool)
    assert len(pool.free_blocks[1]) == pool.n_blocks[1]


def test_a_step_counts_the_copies_it_needs():
    """A step into shared blocks that cannot get its copies is refused, naming the count,
    and changes nothing; the same step after a release runs."""
    cfg, w, wts, bt = _setup((0, 1, 1, 1, 1, 1), 4, 3, 4, blocks={1: 16})
    md = _model(cfg, w, wts, bt, 4)
    md.step([0], [30])  # 8 blocks
    md.fork(0, [1])
    md.step([2], [30])  # the other 8
    before = pool_snapshot(bt)
    with pytest.raises(
        ValueError, match="the step needs 1 more blocks of ratio 1; allowed: at most the 0 free \\(it counts"
    ):
        bt.begin([1], [30], [1])
    same_pool(before, pool_snapshot(bt))
    bt.pool.release(2)
    md.seqs.pop(2)
    md.length[2] = 0
    md.step([1, 0], [1, 2])
    md.check_caches()


def test_a_restart_frees_only_unshared_blocks():
    """A slot starting a new sequence lets its blocks go: those its fork still holds stay."""
    cfg, w, wts, bt = _setup((0, 1, 1, 1, 1, 1), 5, 2, 4)
    md = _model(cfg, w, wts, bt, 5)
    md.step([0], [16])
    md.fork(0, 1)
    md.step([0], [3], [0])  # slot 0 restarts: its 4 blocks stay with slot 1
    md.step([1], [2])
    md.check_caches()


def test_fork_into_a_slot_drops_its_sequence_and_undo_log():
    cfg, w, wts, bt = _setup((0, 2, 2, 1, 1, 1), 6, 3, 4)
    md = _model(cfg, w, wts, bt, 6)
    md.step([0, 1], [9, 5])
    md.step([1, 0], [1, 3])  # slot 0: a continuation of 3 (an undo log)
    md.fork(1, 0)
    with pytest.raises(ValueError, match="slot 0: rollback to 10: the slot was released, assumed or forked into"):
        bt.rollback(0, 10)
    bt.rollback(0, 6)  # the no-op: its length
    md.step([0, 1], [2, 2])
    md.check_caches()


def _refusals(bt):
    return (
        (lambda: bt.fork(0, [0]), ValueError, "dsts [0] hold src = 0; allowed: slots other than src"),
        (lambda: bt.fork(0, [1, 1]), ValueError, "dsts [1] appear twice"),
        (lambda: bt.fork(2, [1]), ValueError, "fork of slot 2, which holds no sequence"),
        (lambda: bt.fork(3, [1]), ValueError, "slot = 3; allowed: 0..2"),
        (lambda: bt.fork(0, [1, 3]), ValueError, "slot = 3; allowed: 0..2"),
        (lambda: bt.fork(0, "1"), TypeError, "dsts is a str; allowed: a slot (int) or a list of slots"),
        (lambda: bt.fork(0, [True]), TypeError, "slot"),
        (lambda: bt.fork(1.0, [2]), TypeError, "slot"),
    )


def test_fork_refusals_change_nothing():
    cfg, w, wts, bt = _setup((0, 2, 2, 1, 1, 1), 7, 3, 4)
    md = _model(cfg, w, wts, bt, 7)
    md.step([0, 1], [9, 5])
    before = pool_snapshot(bt)
    for call, exc, msg in _refusals(bt):
        with pytest.raises(exc) as e:
            call()
        assert msg in str(e.value), str(e.value)
        same_pool(before, pool_snapshot(bt))
    stp = bt.begin([0], [9], [1])
    with pytest.raises(ValueError, match="fork\\(slot 0\\) while a step of slots \\[0\\] runs"):
        bt.fork(0, [2])
    bt.forward(wts[0], random_inputs(cfg, 1, 1)[0], stp)
    with pytest.raises(ValueError, match="fork\\(slot 0\\) while a step"):
        bt.fork(1, [0])
    for i in range(1, cfg.n_layers):
        bt.forward(wts[i], random_inputs(cfg, 1, 1)[i], stp)
    bt.pool.failed[1] = (1, 3)  # as a step that raised in layer 3 leaves it
    with pytest.raises(ValueError, match="fork of slot 1: its step 1 \\(in layer 3\\) raised part-way"):
        bt.fork(1, [2])


def test_fork_then_graph_steps_equal_each_sequence_alone():
    """`BatchGraphs` steps after forks (on the CPU the same body runs eagerly)."""
    cfg, w, wts, bt = _setup((0, 2, 2, 1, 1, 1), 8, 4, 4)
    md = _model(cfg, w, wts, bt, 8)
    g = BatchGraphs(bt, wts, sizes=(1, 2, 4, 8))
    md.step([0], [7], [0], driver=g)
    md.fork(0, [1, 2, 3])
    md.step([0, 1, 2, 3], [1, 1, 1, 1], driver=g)
    md.step([3, 1], [2, 1], driver=g)
    md.fork(3, 0)
    md.step([0, 1, 2, 3], [1, 1, 1, 1], driver=g)
    md.check_caches()


def _forked_against_twin(dev: str, kv_format: str) -> None:
    """Through `BatchGraphs` (on CUDA captured and replayed): a prompt run once and forked
    into 3 more slots, then decode and verify steps with each slot's own tokens (a second
    fork between them), against a twin batch that ran the prompt in every slot and the
    second fork's history again: every output and every cache row byte for byte (on CUDA:
    the batch-invariance contract)."""
    cfg = small_cfg(window=8, index_topk=6, compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=64, max_tokens=64)
    w = random_weights(cfg, 21)
    wts = [AttnV41LayerWeights.from_state_dict(cfg.roles[i], w[i], cfg=cfg, device=dev) for i in range(6)]
    a, b = (BatchV41(cfg, dev, n_slots=4, block_rows=4, kv_format=kv_format) for _ in range(2))
    ga, gb = BatchGraphs(a, wts, sizes=(1, 2, 4, 8, 16)), BatchGraphs(b, wts, sizes=(1, 2, 4, 8, 16, 32))
    hist = {s: [] for s in range(4)}  # each slot's calls: (start, inputs)

    def x_of(m, seed):
        return [x.to(dev) for x in random_inputs(cfg, m, seed)]

    def both(slots, lens, seed):
        xs = [x_of(m, seed * 10 + k) for k, m in enumerate(lens)]
        bx = torch.stack([torch.cat([x[i] for x in xs]) for i in range(cfg.n_layers)])
        starts = [a.pool.length[s] for s in slots]
        ya, yb = ga.step(bx, slots, lens), gb.step(bx, slots, lens, starts)
        assert torch.equal(ya, yb), f"step of slots {slots}"
        for s, x, p in zip(slots, xs, starts):
            hist[s].append((p, x))

    prompt = x_of(11, 1)
    ga.step(torch.stack(prompt), [0], [11], [0])
    a.fork(0, [1, 2, 3])
    for s in range(4):  # the twin: the prompt in every slot
        gb.step(torch.stack(prompt), [s], [11], [0])
    both([0, 1, 2, 3], [1, 1, 1, 1], 2)
    both([2, 0], [3, 1], 3)
    a.fork(2, [1])
    b.pool.release(1)  # the twin: slot 2's history again in slot 1, call by call
    gb.step(torch.stack(prompt), [1], [11], [0])
    for p, x in hist[2]:
        gb.step(torch.stack(x), [1], [x[0].shape[0]], [p])
    both([0, 1, 2, 3], [1, 1, 1, 1], 4)
    both([1, 3], [2, 1], 5)
    for s in range(4):
        for i in cfg.kv_source_layers:
            n = -(-a.pool.length[s] // cfg.roles[i].ratio)
            for keys in (False, True):
                assert torch.equal(a.pool.cache_rows(i, s, n, keys), b.pool.cache_rows(i, s, n, keys)), (s, i, keys)
    check_blocks(a.pool)


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_forked_graph_steps_equal_unforked_ones(kv_format):
    _forked_against_twin("cpu", kv_format)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_forked_graph_steps_equal_unforked_ones_on_cuda(kv_format):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    _forked_against_twin("cuda", kv_format)


def test_blocks_needed_checks_its_arguments():
    cfg, w, wts, bt = _setup((0, 2, 2, 1, 1, 1), 9, 2, 4)
    p = bt.pool
    assert p.blocks_needed([0, 1], [0, 0], [9, 1]) == {1: (4, p.n_blocks[1]), 2: (3, p.n_blocks[2])}
    for args, exc, msg in (
        (([0], [0], [0]), ValueError, "slot 0: start 0, 0 tokens; allowed: start >= 0, tokens >= 1"),
        (([0], [0], [65]), ValueError, "start + tokens <= 64 (max_seq)"),
        (([0], [5], [1]), ValueError, "slot 0: start = 5; allowed: 0 (a new sequence) or 0 (its next position)"),
        (([0, 0], [0, 0], [1, 1]), ValueError, "slots [0] appear twice in one step"),
        (([2], [0], [1]), ValueError, "slot = 2; allowed: 0..1"),
        (([0], [0, 1], [1]), ValueError, "1 slots, 2 starts, 1 lens"),
        (([0], [0.0], [1]), TypeError, "starts = [0.0]; allowed: a list of ints"),
    ):
        with pytest.raises(exc) as e:
            p.blocks_needed(*args)
        assert msg in str(e.value), str(e.value)
