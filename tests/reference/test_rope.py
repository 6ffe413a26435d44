import math

import pytest
import torch

from attnv41.golden import GoldenFile
from attnv41.reference.rope import apply_rope, rope_freqs, rope_table, yarn_range
from helpers import golden_path


def test_yarn_hand_check():
    """attention-v41.md §3: θ=160000, 64 dims → low 15, high 25 and four ω' values."""
    assert yarn_range(64, 160000.0, 65536, 32, 1) == (15, 25)
    w = rope_freqs(64, 160000.0, (16, 65536, 32, 1))
    for k, want in [(16, 2.265625e-3), (20, 2.969778e-4), (24, 1.953125e-5), (31, 5.680529e-7)]:
        assert w[k].item() == pytest.approx(want, rel=2e-6), k
    plain = rope_freqs(64, 160000.0)
    assert torch.equal(w[:15], plain[:15])  # below the ramp: untouched
    assert torch.allclose(w[25:], plain[25:] / 16)  # above it: divided by the factor


@pytest.mark.parametrize("name", ["tiny", "headdim"])
def test_tables_equal_golden(name):
    g = GoldenFile(golden_path(name))
    c = g.cfg
    plain = rope_table(c.max_seq, rope_freqs(c.rope_dim, c.rope_theta))
    yarn = rope_table(
        c.max_seq,
        rope_freqs(c.rope_dim, c.compress_rope_theta, (c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow)),
    )
    for kind, (cos, sin) in (("plain", plain), ("yarn", yarn)):
        assert torch.equal(cos, g.tensor(f"rope/{kind}/cos")), kind
        assert torch.equal(sin, g.tensor(f"rope/{kind}/sin")), kind


def test_interleaved_pairs_hand_check():
    """A row [.., 1, 0, 0, 1] rotated at angle φ: pairs (2k, 2k+1) are complex numbers."""
    freqs = torch.tensor([math.pi / 2, math.pi])  # two pairs
    cos, sin = rope_table(2, freqs)
    x = torch.tensor([[[7.0, 1.0, 0.0, 0.0, 1.0]]]).bfloat16()  # one leading value, rope_dim 4
    y = apply_rope(x, cos, sin, torch.tensor([1]))
    # pair 0: (1 + 0i)·e^{iπ/2} = i → (0, 1); pair 1: (0 + 1i)·e^{iπ} = −i → (0, −1)
    assert torch.allclose(y.float(), torch.tensor([[[7.0, 0.0, 1.0, 0.0, -1.0]]]), atol=1e-6)
    back = apply_rope(y, cos, sin, torch.tensor([1]), inverse=True)
    assert torch.allclose(back.float(), x.float(), atol=1e-6)


def test_inverse_undoes_forward_within_bf16():
    gen = torch.Generator().manual_seed(7)
    cos, sin = rope_table(301, rope_freqs(16, 10000.0))
    x = torch.randn(301, 3, 48, generator=gen).bfloat16()
    pos = torch.arange(301)
    back = apply_rope(apply_rope(x, cos, sin, pos), cos, sin, pos, inverse=True)
    assert torch.equal(back[..., :32], x[..., :32])  # leading values untouched
    # two bf16 roundings of a norm-preserving rotation: ≤ 2 ulps of the pair's magnitude
    mag = x[..., 32:].float().unflatten(-1, (8, 2)).norm(dim=-1).repeat_interleave(2, -1)
    assert ((back[..., 32:].float() - x[..., 32:].float()).abs() <= mag * 2**-7 + 1e-30).all()
