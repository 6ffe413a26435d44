"""The index scores' `tokens` launch option (several consecutive tokens per program, each
block of keys loaded once for a group of one sequence's tokens): every score's bytes are
those of one token per program, contiguous and paged (groups of one slot share their key
loads, groups of several score each token alone), bf16 and packed keys, visible counts
from 0 to past the keys, m not a multiple of `tokens`, under other launch shapes; the
torch twins take the option and ignore it; bad values are refused before anything is
written."""

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e8m0_qdq
from helpers import paged_table

BF = torch.bfloat16


def _same(got, exp, what):
    assert torch.equal(got.cpu().view(torch.int16), exp.cpu().view(torch.int16)), what


def _prompt(gen, m, L, H=4, d=64, packed=False):
    """A prompt tile's inputs: m tokens with ascending visible counts (a causal prefill,
    the first ones seeing none), keys [L, d] (packed: V4.1's fp4_e8m0 rows)."""
    keys = fp4_e8m0_qdq(torch.randn(L, d, generator=gen).to(BF))
    if packed:
        keys = pack(keys, "fp4_e8m0")
    iq = torch.randn(m, H, d, generator=gen).to(BF)
    w = torch.randn(m, H, generator=gen).to(BF)
    vis = torch.linspace(-3, L + 2, m).round().clamp_min(0).to(torch.int32)  # 0 … past L
    return iq, w, keys, vis


@pytest.mark.parametrize("tokens", [2, 4, 8])
@pytest.mark.parametrize("m", [1, 7, 13])
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_contiguous_tokens_keep_the_bits(tokens, m, packed, device):
    gen = torch.Generator().manual_seed(100 * tokens + m)
    iq, w, keys, vis = (t.to(device) for t in _prompt(gen, m, 150, packed=packed))
    base = I.index_scores(iq, w, keys, vis)
    got = I.index_scores(iq, w, keys, vis, tokens=tokens)
    _same(got, base, f"tokens={tokens}, m={m}")
    out = torch.full_like(base, float("nan"))
    I.index_scores(iq, w, keys, vis, out=out, tokens=tokens)
    _same(out, base, "into out")


@pytest.mark.parametrize(
    "tune",
    [dict(sub_tokens=3, block_l=32), dict(skip=False), dict(keys_m=False), dict(sub_tokens=2, num_warps=2)],
    ids=["sub3-32", "noskip", "hm", "sub2-w2"],
)
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_tokens_under_other_launch_shapes(tune, packed, device):
    gen = torch.Generator().manual_seed(7)
    iq, w, keys, vis = (t.to(device) for t in _prompt(gen, 11, 200, packed=packed))
    base = I.index_scores(iq, w, keys, vis, **tune)
    _same(I.index_scores(iq, w, keys, vis, tokens=4, **tune), base, f"{tune}")


def _paged(gen, lens, rows, packed, B=4, width=40, H=4, d=64):
    table, n_blocks = paged_table(gen, rows, B, width, spare=3)
    pool = fp4_e8m0_qdq(torch.randn(n_blocks * B, d, generator=gen).to(BF))
    if packed:
        pool = pack(pool, "fp4_e8m0")
    T = sum(lens)
    iq = torch.randn(T, H, d, generator=gen).to(BF)
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.cat([torch.full((n,), s, dtype=torch.int32) for s, n in enumerate(lens)])
    # each sequence's tokens ascending up to all its rows (a prompt chunk), one sequence
    # with a token that sees none
    vis = torch.cat([torch.linspace(0, r, n).round().to(torch.int32) for n, r in zip(lens, rows)])
    return iq, w, pool, table, tok_slot, vis, B, width


@pytest.mark.parametrize(
    "lens, rows",
    [((9,), (37,)), ((3, 6, 1, 5), (11, 40, 3, 26)), ((1, 1, 1, 1, 1), (5, 9, 0, 40, 17))],
    ids=["one-slot", "mixed", "decode-like"],
)
@pytest.mark.parametrize("tokens", [2, 4])
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_paged_tokens_keep_the_bits(lens, rows, tokens, packed, device):
    """Groups of one slot share their keys (one-slot; mixed, where a group lies within a
    sequence), groups of several slots score each token alone (mixed, decode-like);
    unallocated table entries (−1) past every visible row are never read."""
    gen = torch.Generator().manual_seed(sum(rows) + tokens)
    iq, w, pool, table, tok_slot, vis, B, width = _paged(gen, lens, rows, packed)
    iq, w, pool, table, tok_slot, vis = (t.to(device) for t in (iq, w, pool, table, tok_slot, vis))
    base = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width)
    got = I.index_scores_paged(iq, w, pool, table, tok_slot, B, vis, width, tokens=tokens)
    _same(got, base, f"tokens={tokens}")


def test_twins_take_the_option_and_give_the_same_result():
    gen = torch.Generator().manual_seed(3)
    iq, w, keys, vis = _prompt(gen, 5, 30)
    _same(I.index_scores_torch(iq, w, keys, vis, tokens=8), I.index_scores_torch(iq, w, keys, vis), "contiguous")
    iq, w, pool, table, tok_slot, vis, B, width = _paged(gen, (2, 3), (7, 12), False)
    a = (iq, w, pool, table, tok_slot, B, vis, width)
    _same(I.index_scores_paged_torch(*a, tokens=4), I.index_scores_paged_torch(*a), "paged")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(tokens=0), "tokens = 0; allowed: 1, 2, 4, 8 or 16"),
        (dict(tokens=3), r"tokens = 3; allowed: 1, 2, 4, 8 or 16 \(a power of two\)"),
        (dict(tokens=32), "tokens = 32; allowed"),
        (dict(tokens=True), "tokens = True; allowed"),
        (dict(tokens=2.0), "tokens = 2.0; allowed"),
        (dict(tokens=2, ids=torch.zeros(4, 1, dtype=torch.int32), cand_block=8), "tokens = 2 with ids; allowed: 1"),
    ],
)
def test_bad_tokens_are_refused_before_writing(kw, match, device):
    gen = torch.Generator().manual_seed(4)
    iq, w, keys, vis = (t.to(device) for t in _prompt(gen, 4, 20))
    n = 8 if "ids" in kw else 20
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    for fn in (I.index_scores, I.index_scores_torch):
        out = torch.full((4, n), 7.0, dtype=BF, device=device)
        with pytest.raises(ValueError, match=match):
            fn(iq, w, keys, vis, out=out, **kw)
        assert bool((out == 7.0).all()), "out untouched"
    table = torch.arange(5, dtype=torch.int32, device=device)[None].repeat(2, 1)
    slot = torch.zeros(4, dtype=torch.int32, device=device)
    for fn in (I.index_scores_paged, I.index_scores_paged_torch):
        with pytest.raises(ValueError, match=match):
            fn(iq, w, keys, table, slot, 4, vis, 20, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_flash_prompt_tile_on_cuda(packed):
    """The Flash index geometry (32 heads × 128), a 64-token prompt tile over 40,000 keys
    with ascending visible counts, contiguous and paged (64-row blocks, one slot, and two
    sequences' tokens interleaved in groups): tokens 2, 4, 8 and 16 give the bytes of 1."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    from attnv41.synthetic import PRESETS

    cfg = PRESETS["flash"](max_tokens=8, max_seq=65536)
    H, d = cfg.index_heads, cfg.index_head_dim
    gen = torch.Generator().manual_seed(11)
    m, L, B = 64, 40000, 64
    iq, w, keys, _ = _prompt(gen, m, L, H=H, d=d, packed=packed)
    vis = torch.arange(L - m + 1, L + 1, dtype=torch.int32)
    vis[:5] = torch.tensor([0, 1, 63, 64, 20001], dtype=torch.int32)
    iq, w, keys, vis = iq.cuda(), w.cuda(), keys.cuda(), vis.cuda()
    base = I.index_scores(iq, w, keys, vis)
    for tokens in (2, 4, 8, 16):
        _same(I.index_scores(iq, w, keys, vis, tokens=tokens), base, f"contiguous, tokens={tokens}")
    n_blocks = L // B + 2
    perm = torch.randperm(n_blocks, generator=gen).to(torch.int32)
    pool = torch.zeros((n_blocks * B,) + tuple(keys.shape[1:]), dtype=keys.dtype)
    table = torch.full((2, -(-L // B)), -1, dtype=torch.int32)
    for s in range(2):
        table[s] = perm[s : s + table.shape[1]] if s == 0 else perm.flip(0)[: table.shape[1]]
    j = torch.arange(L)
    pool[(table[0, j // B].long() * B + j % B)] = keys.cpu()
    pool, table = pool.cuda(), table.cuda()
    one = torch.zeros(m, dtype=torch.int32, device="cuda")
    base_p = I.index_scores_paged(iq, w, pool, table, one, B, vis, L)
    _same(base_p, base, "paged == contiguous")
    two = (torch.arange(m, device="cuda") // 6 % 2).to(torch.int32)  # groups straddle the two slots
    base_two = I.index_scores_paged(iq, w, pool, table, two, B, vis, L)
    for tokens in (2, 4, 8, 16):
        _same(I.index_scores_paged(iq, w, pool, table, one, B, vis, L, tokens=tokens), base, f"one slot, {tokens}")
        _same(I.index_scores_paged(iq, w, pool, table, two, B, vis, L, tokens=tokens), base_two, f"two, {tokens}")
