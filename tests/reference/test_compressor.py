import torch

from attnv41.reference.compressor import compress_pool
from attnv41.reference.layer import RefStack
from helpers import random_inputs, random_weights, small_cfg


def test_pool_is_per_channel_softmax():
    a = torch.tensor([[[1.0, 10.0], [3.0, -2.0]]])  # [1 group, r=2, 2 channels]
    g = torch.tensor([[[0.0, 5.0], [0.0, -5.0]]])
    p = compress_pool(a, g)
    w = torch.sigmoid(torch.tensor(10.0)).item()  # channel 1: softmax(5, −5)
    assert torch.allclose(p, torch.tensor([[2.0, 10.0 * w - 2.0 * (1 - w)]]))


def test_decode_state_holds_the_prefill_remainder():
    """After a prefill of m tokens the ratio-2 state holds the m % 2 remainder token; the
    next decode completes the group, which equals the group of a longer prefill."""
    cfg = small_cfg()
    w = random_weights(cfg, 3)
    xs = random_inputs(cfg, 14, 4)
    a = RefStack(cfg, w)
    a.step([x[:13] for x in xs], 0)
    st = a.states[1]
    assert st.n_rows == 6
    assert torch.isfinite(st.comp_g[0]).all() and torch.isinf(st.comp_g[1]).all()  # token 12 in slot 0
    a.step([x[13:14] for x in xs], 13)
    assert a.states[1].n_rows == 7
    b = RefStack(cfg, w)
    b.step(xs, 0)
    assert torch.equal(a.states[1].compress_kv[:7], b.states[1].compress_kv[:7])
    assert torch.equal(a.states[1].index_k[:7], b.states[1].index_k[:7])
