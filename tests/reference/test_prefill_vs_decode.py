"""In `own` mode a prompt run as one prefill and the same prompt run token by token
agree: the same selections, and outputs within a derived bound.

Why not bit for bit: the two regimes present the window rows to the online softmax in
different slots (prefill: the chunk's rows, −1 after t; decode: the ring oldest first,
−1 for unwritten slots first), so with more than 64 entries the blocks of 64 differ and
the bf16 probabilities are rounded against different running maxima.

The bound. Both runs see bit-identical q, window rows, compressed rows and selections
(asserted first). Each run's o is `bf16(Σ_j w̃_j R_j)` where every weight carries one
bf16 rounding (relative 2^-9) and the result one more, so
`|o_run − o_exact| ≤ 2^-9·max|R| + 2^-9·|o|` and between runs
`|Δo| ≤ 2^-8·max|R| + 2^-8·max(|o_a|, |o_b|)`. The inverse rotation mixes two
components of a pair (`|Δ| ≤ |Δa| + |Δb|`) and rounds (2^-8 between runs); each of
the two output projections adds `|W|·|Δ input| + 2^-8·|result|`.
"""

import pytest
import torch

from attnv41.reference.layer import RefStack
from attnv41.reference.rope import apply_rope
from helpers import random_inputs, random_weights, small_cfg


def _bound_out(cfg, w, o_a, o_b, rows_max, cos, sin, pos, out_a, out_b):
    do = 2**-8 * rows_max + 2**-8 * torch.maximum(o_a.abs(), o_b.abs())  # [m, H, D]
    ra = apply_rope(o_a, cos, sin, pos, inverse=True).double()
    half = cfg.rope_dim // 2
    tail = do[..., -cfg.rope_dim :].unflatten(-1, (half, 2)).sum(-1, keepdim=True).expand(*do.shape[:-1], half, 2)
    drot = torch.cat([do[..., : -cfg.rope_dim], tail.flatten(-2)], -1) + 2**-8 * ra.abs()
    G = cfg.groups
    wa = w["wo_a.weight"].double().abs().view(G, cfg.o_rank, cfg.group_width)
    u = torch.einsum(
        "mgk,grk->mgr", ra.reshape(-1, G, cfg.group_width), w["wo_a.weight"].double().view(G, cfg.o_rank, -1)
    )
    du = torch.einsum("mgk,grk->mgr", drot.reshape(-1, G, cfg.group_width), wa) + 2**-8 * u.abs()
    du = du.reshape(du.shape[0], -1)
    dout = du @ w["wo_b.weight"].double().abs().t() + 2**-8 * torch.maximum(out_a.abs(), out_b.abs())
    return do, dout


@pytest.mark.parametrize(
    "n, window, topk, ratios",
    [(37, 8, 6, (0, 2, 2, 1, 1, 1)), (150, 80, 16, (0, 2, 2, 1, 1, 1)), (61, 16, 8, (0, 4, 4, 1, 1, 1))],
    ids=["tiny_geometry", "two_softmax_blocks", "ratio4"],
)
def test_prefill_equals_token_by_token(n, window, topk, ratios):
    cfg = small_cfg(
        window=window, index_topk=topk, compress_ratios=ratios, head_dim=64, rope_dim=16, max_seq=160, max_tokens=160
    )
    w = random_weights(cfg, 11)
    xs = random_inputs(cfg, n, 12)
    pre = RefStack(cfg, w).step(xs, 0)
    dec = RefStack(cfg, w)
    steps = [dec.step([x[t : t + 1] for x in xs], t) for t in range(n)]
    pos = torch.arange(n)
    for i, role in enumerate(cfg.roles):
        a = pre[i]
        q_b = torch.cat([s[i].q for s in steps])
        assert torch.equal(a.q, q_b), f"L{i} q"
        wc = min(n, window)
        for t in range(n):
            b = steps[t][i]
            bw = 1 if t == 0 else window  # step 0 is a one-token prefill: chunk rows, offset 1
            # window rows: prefill chunk rows t−W+1..t equal the ring's rows at step t
            wa = [v for v in a.sel[t, :wc].tolist() if v >= 0]
            wb = [int(v) for v in b.sel[0, :bw].tolist() if v >= 0]
            assert torch.equal(a.kv_win[wa], b.kv_win[wb]), f"L{i} t{t} window rows"
            if role.ratio:
                ca = [v - n for v in a.sel[t, wc:].tolist() if v >= 0]
                cb = [v - bw for v in b.sel[0, bw:].tolist() if v >= 0]
                assert ca == cb, f"L{i} t{t} selection {ca} vs {cb}"
        if role.is_kv_source:
            assert torch.equal(a.compress_kv, steps[-1][i].compress_kv), f"L{i} compressed rows"
            assert torch.equal(a.index_k, steps[-1][i].index_k), f"L{i} index keys"
        o_b = torch.cat([s[i].o for s in steps])
        out_b = torch.cat([s[i].out for s in steps])
        rows_max = a.kv_win.double().abs().max()
        if role.ratio:
            rows_max = torch.maximum(
                rows_max, steps[-1][1 if role.ratio == ratios[1] else 3].compress_kv.double().abs().max()
            )
        cos, sin = dec.tables.for_ratio(role.ratio)
        do, dout = _bound_out(
            cfg, w[i], a.o.double(), o_b.double(), rows_max, cos, sin, pos, a.out.double(), out_b.double()
        )
        assert ((a.o.double() - o_b.double()).abs() <= do).all(), f"L{i} o"
        assert ((a.out.double() - out_b.double()).abs() <= dout).all(), f"L{i} out"
        assert not torch.isnan(a.out.float()).any()
