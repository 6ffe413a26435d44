"""The decode-split contract on CUDA, where decode_body is captured: a user's own CUDA
graph of decode_body replays after decode_prep with the order kept, the non-finite
counter counts inside replays, and a bad graph-driver step changes nothing."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from attnv41.runtime.graphs import DecodeGraphs
from helpers import random_inputs, random_weights, small_cfg

pytestmark = pytest.mark.gpu

PREFILL = 13


def _pair(steps_total: int):
    cfg = small_cfg(max_seq=64, max_tokens=64)
    w = random_weights(cfg, 51)
    xs = [x.cuda() for x in random_inputs(cfg, steps_total, 52)]
    a, b = RuntimeStack(cfg, w, device="cuda"), RuntimeStack(cfg, w, device="cuda")
    for s in (a, b):
        s.step([x[:PREFILL] for x in xs], 0)
    return cfg, xs, a, b


def test_user_captured_decode_body_replays_in_order():
    """Every layer's decode_body (sources included) captured once by hand (warm-up, then
    capture), then replayed after each step's decode_prep: equals eager forward byte for
    byte (outputs and rings; caches through the later layers that read them), and the
    order checks neither refuse the replayed steps nor let a bad call through."""
    end = PREFILL + 12
    cfg, xs, ref, rt = _pair(end)
    attn = rt.attn
    x_static = {i: torch.zeros(1, cfg.dim, dtype=torch.bfloat16, device="cuda") for i in range(cfg.n_layers)}
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    nan_step = PREFILL + 7
    for p in range(PREFILL, end):
        want = ref.step([x[p : p + 1] for x in xs], p, keep=True)
        for i in range(cfg.n_layers):
            x = xs[i][p : p + 1]
            if i == 0 and p == nan_step:
                x = x.clone()
                x[0, 1] = float("nan")
            assert attn.decode_capturable(rt.weights[i])
            rows = attn.decode_prep(rt.weights[i], rt.shared, p)
            x_static[i].copy_(x)
            if i not in graphs:
                # warm-up: this very step, once (a source's step is not idempotent: a
                # completing compressor group resets its gate scores), then capture
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    attn.decode_body(rt.weights[i], rt.states[i], x_static[i], rows)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    attn.decode_body(rt.weights[i], rt.states[i], x_static[i], rows)
                graphs[i] = g
            else:
                graphs[i].replay()
            got = attn.out[:1]
            if i == 0 and p >= nan_step:
                continue  # layer 0's ring holds the NaN row from here on
            assert torch.equal(got.view(torch.int16), want[i].view(torch.int16)), f"p{p} L{i}"
        if p < nan_step:
            for i in range(cfg.n_layers):
                assert torch.equal(ref.states[i].ring, rt.states[i].ring), f"p{p} L{i} ring"
                if ref.states[i].compress_kv is not None:
                    L = (p + 1) // cfg.compress_ratios[i]
                    assert torch.equal(ref.states[i].compress_kv[:L], rt.states[i].compress_kv[:L]), f"p{p} L{i}"
                if ref.states[i].comp_g is not None:
                    assert torch.equal(ref.states[i].comp_g, rt.states[i].comp_g), f"p{p} L{i} comp_g"
    # The replay counted the NaN row once (the warm-up ran at another step, on finite values).
    assert attn.nonfinite_count() == cfg.head_dim
    # The sequence's order state followed the replays: layer 0 at `end` is next, `end - 1` is refused.
    with pytest.raises(ValueError, match=rf"allowed: 0 \(a new sequence\) or {end}"):
        attn.decode_prep(rt.weights[0], rt.shared, end - 1)


def test_graph_driver_bad_step_changes_nothing_on_cuda():
    cfg, xs, ref, rt = _pair(PREFILL + 3)
    drv = DecodeGraphs(rt)
    assert drv.use_graphs
    p = PREFILL
    drv.step([x[p : p + 1] for x in xs], p)
    ref.step([x[p : p + 1] for x in xs], p)
    p += 1
    rings = [s.ring.clone() for s in rt.states]
    good = rt.states[4]
    rt.states[4] = rt.attn.new_layer_state(4)
    with pytest.raises(ValueError, match="layer 4: its state belongs to no sequence"):
        drv.step([x[p : p + 1] for x in xs], p)
    rt.states[4] = good
    for i, s in enumerate(rt.states):
        assert torch.equal(s.ring, rings[i]), f"L{i} ring written by a refused step"
    want = ref.step([x[p : p + 1] for x in xs], p, keep=True)
    got = drv.step([x[p : p + 1] for x in xs], p)
    for i in range(cfg.n_layers):
        assert torch.equal(got[i], want[i]), f"L{i}"


def test_user_multi_layer_capture_replays_in_order():
    """A run of two capturable layers (3 and 4, between sources 2 and 5) captured by hand
    into ONE graph: the first step runs each layer eagerly after its decode_prep (the
    warm-up), then both bodies are captured together (capture needs no prepared step);
    every later step calls decode_prep for 3 and 4 in order and replays once. Outputs and
    rings equal eager forward byte for byte, and the order checks keep up."""
    cfg = small_cfg(
        compress_ratios=(0, 0, 2, 2, 2, 1),
        kv_source_layers=(2, 5),
        index_source_layers=(2, 5),
        candidate_source_layer=None,
        max_seq=64,
        max_tokens=64,
    )
    w = random_weights(cfg, 61)
    xs = [x.cuda() for x in random_inputs(cfg, PREFILL + 8, 62)]
    ref, rt = RuntimeStack(cfg, w, device="cuda"), RuntimeStack(cfg, w, device="cuda")
    for s in (ref, rt):
        s.step([x[:PREFILL] for x in xs], 0)
    attn, run = rt.attn, (3, 4)
    x_static = {i: torch.zeros(1, cfg.dim, dtype=torch.bfloat16, device="cuda") for i in run}
    outs = {i: torch.zeros(1, cfg.dim, dtype=torch.bfloat16, device="cuda") for i in run}
    graph = None
    for p in range(PREFILL, PREFILL + 8):
        want = ref.step([x[p : p + 1] for x in xs], p, keep=True)
        for i in (0, 1, 2):
            x = xs[i][p : p + 1]
            if attn.decode_capturable(rt.weights[i]):
                got = attn.decode_body(rt.weights[i], rt.states[i], x, attn.decode_prep(rt.weights[i], rt.shared, p))
            else:
                got = rt.layer(i, x, p).out
            assert torch.equal(got, want[i]), f"p{p} L{i}"
        for i in run:
            x_static[i].copy_(xs[i][p : p + 1])
        if graph is None:
            rows = {}
            for i in run:  # warm-up: this step, eagerly
                rows[i] = attn.decode_prep(rt.weights[i], rt.shared, p)
                outs[i].copy_(attn.decode_body(rt.weights[i], rt.states[i], x_static[i], rows[i]))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in run:
                    outs[i].copy_(attn.decode_body(rt.weights[i], rt.states[i], x_static[i], rows[i]))
        else:
            for i in run:
                attn.decode_prep(rt.weights[i], rt.shared, p)
            graph.replay()
        for i in run:
            assert torch.equal(outs[i], want[i]), f"p{p} L{i}"
        assert torch.equal(rt.layer(5, xs[5][p : p + 1], p).out, want[5]), f"p{p} L5"
        for i in range(cfg.n_layers):
            assert torch.equal(ref.states[i].ring, rt.states[i].ring), f"p{p} L{i} ring"


@pytest.mark.parametrize("index_keys", ["own", "released"])
def test_results_do_not_depend_on_the_bucket(index_keys):
    """Numerics contract: a token's result does not depend on the context bucket. Two
    stacks, whole-step graphs with buckets 4 … 64 (bucket_min 4) and one bucket (64 = max_seq):
    outputs, rings, caches and the selections are equal byte for byte at every step."""
    cfg = small_cfg(max_seq=64, max_tokens=64)
    w = random_weights(cfg, 71)
    xs = [x.cuda() for x in random_inputs(cfg, 60, 72)]
    a = RuntimeStack(cfg, w, device="cuda", index_keys=index_keys, bucket_min=4)
    b = RuntimeStack(cfg, w, device="cuda", index_keys=index_keys, bucket_min=1024)
    for s in (a, b):
        s.step([x[:3] for x in xs], 0)
    da, db = DecodeGraphs(a), DecodeGraphs(b)
    for p in range(3, 60):
        ya = da.step([x[p : p + 1] for x in xs], p).clone()
        yb = db.step([x[p : p + 1] for x in xs], p)
        assert torch.equal(ya.view(torch.int16), yb.view(torch.int16)), f"p{p}"
        assert torch.equal(a.attn.plan.sel, b.attn.plan.sel), f"p{p} selections"
    for i in range(cfg.n_layers):
        assert torch.equal(a.states[i].ring, b.states[i].ring), f"L{i} ring"
        if a.states[i].compress_kv is not None:
            assert torch.equal(a.states[i].compress_kv, b.states[i].compress_kv), f"L{i} ckv"
            assert torch.equal(a.states[i].index_k, b.states[i].index_k), f"L{i} keys"
    assert len({a.attn.bucket(p) for p in range(3, 60)}) == 5 and da.captures >= 5
