"""The decode-step driver: the whole step eagerly on the CPU, buckets, the oracle."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from helpers import random_inputs, random_weights, small_cfg


@pytest.mark.parametrize("index_keys", ["own", "released"])
@pytest.mark.parametrize("bucket_min", [1024, 4], ids=["one_bucket", "buckets_16_32_48"])
def test_driver_equals_forward_and_oracle_passes(index_keys, bucket_min):
    """Positions 11..39 with buckets of 16, 32 and 48 (capped at max_seq) crossed twice:
    the driver equals eager forward on every layer, and the oracle (eager forward on
    saved state against the driver's step: outputs, rings, compressor state, cache rows,
    scores, selections, candidate mask, position) passes at every step."""
    cfg = small_cfg(max_seq=48, max_tokens=48)
    w = random_weights(cfg, 41)
    xs = random_inputs(cfg, 40, 42)
    a = RuntimeStack(cfg, w, index_keys=index_keys)
    b = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=bucket_min)
    for s in (a, b):
        s.step([x[:11] for x in xs], 0)
    drv = DecodeGraphs(b, oracle=True)
    assert not drv.use_graphs  # CPU: the whole step eagerly
    buckets = set()
    for p in range(11, 40):
        want = a.step([x[p : p + 1] for x in xs], p, keep=True)
        got = drv.step([x[p : p + 1] for x in xs], p)
        buckets.add(b.attn.bucket(p))
        for i in range(cfg.n_layers):
            assert torch.equal(want[i], got[i]), f"p{p} L{i}"
            assert torch.equal(a.states[i].ring, b.states[i].ring), f"p{p} L{i} ring"
            if a.states[i].compress_kv is not None:
                L = a.states[i].n_rows
                assert L == b.states[i].n_rows == (p + 1) // cfg.compress_ratios[i]
                assert torch.equal(a.states[i].compress_kv[:L], b.states[i].compress_kv[:L]), f"p{p} L{i} ckv"
                assert torch.equal(a.states[i].index_k[:L], b.states[i].index_k[:L]), f"p{p} L{i} keys"
    assert drv.oracle_checks == 40 - 11
    assert drv.captures == 0
    assert buckets == ({48} if bucket_min == 1024 else {16, 32, 48})


def test_driver_rejects_skipped_positions_and_graphs_on_cpu():
    cfg = small_cfg()
    st = RuntimeStack(cfg, random_weights(cfg, 1))
    xs = random_inputs(cfg, 20, 2)
    st.step([x[:5] for x in xs], 0)
    drv = DecodeGraphs(st)
    with pytest.raises(ValueError, match=r"start_pos = 7; allowed: 0 \(a new sequence\) or 5"):
        drv.step([x[7:8] for x in xs], 7)
    with pytest.raises(ValueError, match="use_graphs = True on cpu"):
        DecodeGraphs(st, use_graphs=True)


@pytest.mark.parametrize(
    "what, name",
    [
        ("out", "2.out"),
        ("ring", "4.ring"),
        ("comp_g", "1.comp_g"),
        ("ckv_row", "3.compress_kv.row"),
        ("sel", "plan.sel"),
        ("cand", "plan.cand"),
        ("scores", "plan.scores"),
        ("pos", "plan.pos"),
    ],
)
@pytest.mark.parametrize("defer", [0, 3], ids=["each_step", "deferred"])
def test_oracle_names_what_the_driver_got_wrong(what, name, defer):
    """The oracle is not vacuous: a driver step that leaves one observable byte different
    from eager forward raises OracleMismatch naming that tensor."""
    from attnv41.runtime.graphs import OracleMismatch

    cfg = small_cfg(max_seq=48, max_tokens=48)
    rt = RuntimeStack(cfg, random_weights(cfg, 71))
    xs = random_inputs(cfg, 20, 72)
    rt.step([x[:13] for x in xs], 0)
    drv = DecodeGraphs(rt, oracle=True, oracle_defer=defer)
    drv.step([x[13:14] for x in xs], 13)  # a good step first
    body = drv._body
    plan = rt.attn.plan

    def wrong(bucket):
        body(bucket)
        {
            "out": lambda: drv.y[2].view(torch.int16).add_(1),
            "ring": lambda: rt.states[4].ring[0].view(torch.int16).add_(1),
            "comp_g": lambda: rt.states[1].comp_g[0].add_(1.0),
            "ckv_row": lambda: rt.states[3].compress_kv[14].view(torch.int16).add_(1),
            "sel": lambda: plan.sel[0, 0, -1].add_(1),
            "cand": lambda: plan.cand[0, 0].logical_not_(),
            "scores": lambda: plan.scores[1, 0, 0].view(torch.int16).add_(1),
            "pos": lambda: plan.pos.add_(1),
        }[what]()

    drv._body = wrong
    if not defer:
        with pytest.raises(OracleMismatch, match=rf"start_pos 14: after replay, differs from eager forward: {name} \("):
            drv.step([x[14:15] for x in xs], 14)
        return
    drv.step([x[14:15] for x in xs], 14)  # deferred: read at the third pending step or a flush
    assert drv.oracle_checks == 0
    with pytest.raises(OracleMismatch, match=r"start_pos 14: after replay, differs from eager forward \(deferred"):
        drv.oracle_flush()


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("index_keys", ["own", "released"])
def test_driver_equals_reference_when_no_keys_are_published_yet(n, index_keys):
    """Full layers of ratio 4 then 2 and a short prefill: in `released` mode the first
    decode steps run with no index keys published at all (nothing visible yet), then
    with another layer's keys; the whole-step driver equals the reference on every layer."""
    from attnv41.reference.layer import RefStack

    cfg = small_cfg(compress_ratios=(0, 4, 4, 2, 2, 2), max_seq=48, max_tokens=48)
    w = random_weights(cfg, 91)
    xs = random_inputs(cfg, 20, 92)
    ref = RefStack(cfg, w, index_keys=index_keys)
    rt = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=4)
    for i in range(cfg.n_layers):
        ref.layer(i, xs[i][:n], 0)
        rt.layer(i, xs[i][:n], 0)
    drv = DecodeGraphs(rt, oracle=True)
    for p in range(n, 20):
        want = [ref.layer(i, xs[i][p : p + 1], p).out for i in range(cfg.n_layers)]
        got = drv.step([x[p : p + 1] for x in xs], p)
        for i in range(cfg.n_layers):
            assert torch.equal(want[i], got[i]), f"p{p} L{i}"
    assert drv.oracle_checks == 20 - n
