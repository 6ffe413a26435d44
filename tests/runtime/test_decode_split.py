"""decode_prep + decode_body equals forward byte for byte (CPU: the split path eagerly)."""

import pytest
import torch

from attnv41.runtime import RuntimeStack
from helpers import random_inputs, random_weights, small_cfg


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
            if attn.decode_capturable(b.weights[i]):
                rows_b = attn.decode_prep(b.weights[i], b.shared, p)
                got = attn.decode_body(b.weights[i], b.states[i], x, rows_b)
            else:
                got = b.layer(i, x, p).out
            assert torch.equal(ref, got), f"p{p} L{i}"
            assert torch.equal(a.states[i].ring, b.states[i].ring), f"p{p} L{i} ring"


def test_fixed_width_and_class_buffers():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    widths = [rt.attn.decode_fixed_topk(w) for w in rt.weights]
    assert widths == [8, 14, 14, 14, 14, 14]
    assert [rt.attn.decode_capturable(w) for w in rt.weights] == [True, False, True, False, True, False]
    assert rt.attn.dec_sel[True].shape == (1, 14) and rt.attn.dec_sel[False].shape == (1, 8)


def test_prep_uploads_only_what_changed():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    xs = random_inputs(cfg, 14, 2)
    rt.step([x[:13] for x in xs], 0)
    attn = rt.attn
    attn.decode_prep_role(False, rt.shared, 13)
    before = attn.dec_sel[False].clone()
    attn.dec_sel[False].fill_(7)  # poison: an unchanged prep must not rewrite it
    attn.decode_prep_role(False, rt.shared, 13)
    assert (attn.dec_sel[False] == 7).all()
    attn.invalidate_decode_uploads()
    attn.decode_prep_role(False, rt.shared, 13)
    assert torch.equal(attn.dec_sel[False], before)
    assert attn.dec_pos.item() == 13


def test_split_errors():
    cfg = small_cfg()
    rt, _ = _pair(cfg, 1)
    xs = random_inputs(cfg, 14, 2)
    rt.step([x[:13] for x in xs], 0)
    attn, w, sh = rt.attn, rt.weights, rt.shared
    with pytest.raises(ValueError, match="kv source: its decode step is not capturable"):
        attn.decode_prep(w[1], sh, 13)
    with pytest.raises(ValueError, match="index source"):
        attn.decode_prep(w[5], sh, 13)
    for bad in (0, 64, -3):
        with pytest.raises(ValueError, match=r"start_pos = .*; allowed: 1\.\.63"):
            attn.decode_prep_role(False, sh, bad)
    attn.decode_prep(w[0], sh, 13)
    with pytest.raises(ValueError, match="rows_b must be None"):
        attn.decode_body(w[0], rt.states[0], xs[0][13:14], sh.compress_kv)
    with pytest.raises(ValueError, match="allowed: 1..1"):
        attn.decode_body(w[0], rt.states[0], xs[0][:2], None)
    with pytest.raises(ValueError, match="source layer"):
        attn.decode_body(w[1], rt.states[1], xs[1][13:14], sh.compress_kv)
    # a reuse layer before its index source ran this step: no selection published
    rt.layer(0, xs[0][13:14], 13)
    with pytest.raises(ValueError, match="allowed: layer 1 at start_pos 13"):
        attn.decode_prep(w[2], sh, 13)
