"""decode_prep + decode_body equals forward byte for byte (CPU: the split path eagerly)."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from helpers import NoStream, random_inputs, random_weights, small_cfg


def _pair(cfg, seed):
    w = random_weights(cfg, seed)
    return RuntimeStack(cfg, w), RuntimeStack(cfg, w)


@pytest.mark.parametrize(
    "n, steps, ratios",
    [(13, 8, (0, 2, 2, 1, 1, 1)), (1, 12, (0, 2, 2, 1, 1, 1)), (5, 9, (0, 4, 4, 1, 1, 1)), (20, 3, (0, 2, 2, 1, 1, 1))],
    ids=["odd_prefill_wrap", "first_decode_after_one", "ratio4_early_empty_selection", "long_prefill"],
)
@pytest.mark.parametrize("index_keys", ["own", "released"])
def test_split_equals_forward_bytes(n, steps, ratios, index_keys):
    """Positions cover the window wrap (window 8), ratio-2 group completion (odd p) and
    non-completion (even p), the first decode after prefill, and ratio-4 steps whose
    compressed selection is still empty."""
    cfg = small_cfg(compress_ratios=ratios, max_seq=48, max_tokens=48)
    w = random_weights(cfg, 31)
    a = RuntimeStack(cfg, w, index_keys=index_keys)
    b = RuntimeStack(cfg, w, index_keys=index_keys)
    xs = random_inputs(cfg, n + steps, 32)
    for s in (a, b):
        s.step([x[:n] for x in xs], 0)
    attn = b.attn
    for p in range(n, n + steps):
        for i in range(cfg.n_layers):
            x = xs[i][p : p + 1]
            ref = a.layer(i, x, p).out.clone()
            assert attn.decode_capturable(b.weights[i])
            rows_b = attn.decode_prep(b.weights[i], b.shared, p)
            got = attn.decode_body(b.weights[i], b.states[i], x, rows_b)
            assert torch.equal(ref, got), f"p{p} L{i}"
            assert torch.equal(a.states[i].ring, b.states[i].ring), f"p{p} L{i} ring"


def test_fixed_width_and_class_buffers():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    widths = [rt.attn.decode_fixed_topk(w) for w in rt.weights]
    assert widths == [8, 14, 14, 14, 14, 14]
    assert all(rt.attn.decode_capturable(w) for w in rt.weights)  # every role, sources included
    plan = rt.attn.plan
    assert plan.sel.shape == (3, 1, 14) and plan.sel0.shape == (1, 8)  # one row per index source: 1, 3, 5
    assert [plan.sel_slot(i) for i in range(1, 6)] == [0, 0, 1, 1, 2]


def test_prep_uploads_only_what_changed():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    xs = random_inputs(cfg, 14, 2)
    rt.step([x[:13] for x in xs], 0)
    attn = rt.attn
    attn.decode_prep_role(False, rt.shared, 13)
    before = attn.plan.sel0.clone()
    assert before.tolist() == [[6, 7, 0, 1, 2, 3, 4, 5]]  # window 8 at p = 13: oldest first
    attn.plan.sel0.fill_(7)  # poison: an unchanged prep must not rewrite it
    attn.decode_prep_role(False, rt.shared, 13)
    assert (attn.plan.sel0 == 7).all()
    attn.invalidate_decode_uploads()
    attn.decode_prep_role(False, rt.shared, 13)
    assert torch.equal(attn.plan.sel0, before)
    assert attn.dec_pos.item() == 13


def test_split_errors():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    xs = random_inputs(cfg, 14, 2)
    rt.step([x[:13] for x in xs], 0)
    attn, w, sh = rt.attn, rt.weights, rt.shared
    for bad in (0, 64, -3):
        with pytest.raises(ValueError, match=r"start_pos = .*; allowed: 1\.\.63"):
            attn.decode_prep_role(False, sh, bad)
    attn.decode_prep(w[0], sh, 13)
    with pytest.raises(ValueError, match="rows_b must be None"):
        attn.decode_body(w[0], rt.states[0], xs[0][13:14], sh.compress_kv)
    with pytest.raises(ValueError, match="allowed: 1..1"):
        attn.decode_body(w[0], rt.states[0], xs[0][:2], None)
    attn.decode_body(w[0], rt.states[0], xs[0][13:14], None)
    rows = attn.decode_prep(w[1], sh, 13)  # a kv source: its own cache
    assert rows is rt.states[1].compress_kv
    with pytest.raises(ValueError, match="layer 1 has ratio 2: rows_b = .*; allowed: the .* rows decode_prep returned"):
        attn.decode_body(w[1], rt.states[1], xs[1][13:14], rt.states[3].compress_kv)
    attn.decode_body(w[1], rt.states[1], xs[1][13:14], rows)
    with pytest.raises(ValueError, match="allowed: layer 2 at start_pos 13"):
        attn.decode_prep(w[3], sh, 13)
    # a kv source's state must be registered by this sequence's prefill
    other = RuntimeStack(cfg, rt.weights)
    other.step([x[:13] for x in xs], 0)
    other.shared.sources.clear()
    other.attn.decode_body(w[0], other.states[0], xs[0][13:14], other.attn.decode_prep(w[0], other.shared, 13))
    with pytest.raises(ValueError, match="layer 1 is a kv source whose state was not prefilled in this sequence"):
        other.attn.decode_prep(w[1], other.shared, 13)


def _split_matches_forward(a, b, xs, p0: int, p1: int) -> None:
    """Positions p0 … p1 − 1: each layer's decode_prep / decode_body on stack b gives the
    bytes of forward (`layer`) on stack a."""
    for p in range(p0, p1):
        for i in range(a.cfg.n_layers):
            x = xs[i][p : p + 1]
            ref = a.layer(i, x, p).out.clone()
            got = b.attn.decode_body(b.weights[i], b.states[i], x, b.attn.decode_prep(b.weights[i], b.shared, p))
            assert torch.equal(ref, got), f"p{p} L{i}"


def test_side_stream_flag_keeps_cpu_steps(monkeypatch):
    """`decode.SIDE_STREAM` acts only inside a CUDA graph capture: a CPU runtime has no second
    stream, and its split steps stay equal to forward byte for byte with the flag on (the
    CUDA form: tests/runtime/test_gpu.py's graph replays)."""
    from attnv41.runtime import decode

    monkeypatch.setattr(decode, "SIDE_STREAM", True)
    cfg = small_cfg(compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=32, max_tokens=32)
    a, b = _pair(cfg, 41)
    assert b.attn._side is None and b.attn._side_stream() is None
    xs = random_inputs(cfg, 12, 42)
    for s in (a, b):
        s.step([x[:9] for x in xs], 0)
    _split_matches_forward(a, b, xs, 9, 12)


@pytest.mark.parametrize("index_keys", ["own", "released"])
@pytest.mark.parametrize("wkv, index", [(True, True), (False, True), (True, False)])
def test_side_stream_forks_keep_the_bytes(monkeypatch, index_keys, wkv, index):
    """The second stream's forks (`SIDE_WKV`: wkv's product alone before the window row's
    chain; `SIDE_INDEX`: an index source's index queries projected alone and its index path
    run from q's norm on; the kv sources' compressor step first) taken on the CPU, where a
    fork runs at once on the one stream: the same bytes as forward at every layer and step.
    This checks the forks' dataflow (what each computes and from what); whether two CUDA
    streams keep their order is the GPU replay tests' part."""
    from attnv41.runtime import decode

    monkeypatch.setattr(decode, "SIDE_WKV", wkv)
    monkeypatch.setattr(decode, "SIDE_INDEX", index)
    cfg = small_cfg(compress_ratios=(0, 2, 2, 1, 1, 1), max_seq=32, max_tokens=32)
    w = random_weights(cfg, 43)
    a, b = RuntimeStack(cfg, w, index_keys=index_keys), RuntimeStack(cfg, w, index_keys=index_keys)
    side = NoStream()
    forks = []
    monkeypatch.setattr(b.attn, "_side_stream", lambda: side)
    monkeypatch.setattr(b.attn, "_beside", lambda s, fn, *args: (forks.append(fn), fn(*args)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: side)
    xs = random_inputs(cfg, 14, 44)
    for s in (a, b):
        s.step([x[:9] for x in xs], 0)
    _split_matches_forward(a, b, xs, 9, 14)
    names = {getattr(f, "__name__", "") for f in forks}
    assert ("_kv_proj_row" in names) == wkv and ("_kv_row" in names) != wkv
    assert ("index" in names) == index and "_compress_step" in names


def test_side_stream_refuses_counter_split_forms(monkeypatch):
    """Under capture with `SIDE_STREAM` on, the second stream is refused (ValueError naming
    the forms) while a split form other than "launch" is set: its arrival counters would be
    shared by kernels running at once on two streams."""
    from attnv41.kernels import gemv, tc_mm
    from attnv41.runtime import decode

    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    side = object()  # stands for the CUDA stream a GPU runtime holds
    monkeypatch.setattr(rt.attn, "_side", side)
    monkeypatch.setattr(decode.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert decode.SIDE_STREAM and rt.attn._side_stream() is side  # on by default
    monkeypatch.setattr(decode, "SIDE_STREAM", False)
    assert rt.attn._side_stream() is None
    monkeypatch.setattr(decode, "SIDE_STREAM", True)
    monkeypatch.setattr(gemv, "_SPLIT_FORM", "counter")
    with pytest.raises(ValueError, match=r"split forms \{'gemv': 'counter', 'tc_mm': 'launch'\}; allowed: 'launch'"):
        rt.attn._side_stream()
    monkeypatch.setattr(gemv, "_SPLIT_FORM", "launch")
    monkeypatch.setattr(tc_mm, "_SPLIT_FORM", "counter")
    with pytest.raises(ValueError, match="'tc_mm': 'counter'"):
        rt.attn._side_stream()
