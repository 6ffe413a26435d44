"""Index scores over V4.1's packed index keys (fp4_e8m0 rows, `attnv41.packed`), the
kernel dequantizing them in place: the same bytes as over the bf16 keys they pack, for
the contiguous and the paged forms, and for the torch twins."""

import pytest
import torch

from attnv41.kernels import indexer as I
from attnv41.packed import pack, row_bytes
from attnv41.reference.qdq import fp4_e8m0_qdq
from helpers import paged_table

BF = torch.bfloat16


def _bits(t):
    return t.cpu().view(torch.int16)


def _keys(gen, n, d):
    """Keys as the runtime stores them: on the fp4_e8m0 grid, wide dynamic range, some −0."""
    k = torch.randn(n, d, generator=gen) * torch.exp2(torch.randint(-8, 9, (n, 1), generator=gen).float())
    k[0, :5] = -0.0
    return fp4_e8m0_qdq(k.to(BF))


# a register cap over packed keys (`maxnreg_packed`, a launch option): the same bytes
CAPS = [
    pytest.param({}, id="production"),
    pytest.param({"maxnreg_packed": 64}, id="cap64"),
    pytest.param({"maxnreg_packed": None}, id="uncapped"),
    pytest.param({"scale_word": False}, id="scale-tile"),
    pytest.param({"lut": True}, id="lut"),
    pytest.param({"lut": True, "epi2": True}, id="lut-epi2"),
]


@pytest.mark.parametrize("tune", CAPS)
@pytest.mark.parametrize("H,d", [(4, 64), (3, 128)])
def test_packed_keys_give_the_same_scores(device, H, d, tune):
    gen = torch.Generator().manual_seed(H * d)
    m, L = 5, 150
    keys = _keys(gen, L, d)
    iq = fp4_e8m0_qdq(torch.randn(m, H, d, generator=gen).to(BF))
    w = torch.randn(m, H, generator=gen).to(BF)
    vis = torch.tensor([150, 1, 0, 77, 64], dtype=torch.int32)
    p = pack(keys, "fp4_e8m0")
    assert p.shape == (L, row_bytes("fp4_e8m0", d))
    dev = [t.to(device) for t in (iq, w, keys, p, vis)]
    plain = I.index_scores(dev[0], dev[1], dev[2], dev[4])
    packed = I.index_scores(dev[0], dev[1], dev[3], dev[4], **tune)
    assert torch.equal(_bits(packed), _bits(plain))
    twin = I.index_scores_torch(iq, w, p, vis)
    assert torch.equal(_bits(twin), _bits(I.index_scores_torch(iq, w, keys, vis)))


@pytest.mark.parametrize("tune", CAPS)
@pytest.mark.parametrize("d", [64, 128])  # rows of 34 bytes (read by bytes), 68 (by 32-bit words)
def test_packed_paged_pool_gives_the_same_scores(device, d, tune):
    gen = torch.Generator().manual_seed(11)
    H, B, rows, lens, width = 4, 4, (5, 13, 9), (1, 3, 2), 16
    table, n_blocks = paged_table(gen, rows, B, width, spare=3)
    pool = _keys(gen, n_blocks * B, d)
    T = sum(lens)
    iq = torch.randn(T, H, d, generator=gen).to(BF)
    w = torch.randn(T, H, generator=gen).to(BF)
    tok_slot = torch.cat([torch.full((m,), s, dtype=torch.int32) for s, m in enumerate(lens)])
    vis = torch.cat([torch.randint(0, r + 1, (m,), generator=gen) for m, r in zip(lens, rows)]).to(torch.int32)
    vis[0] = rows[0]
    args = [t.to(device) for t in (iq, w, pool, pack(pool, "fp4_e8m0"), table, tok_slot, vis)]
    plain = I.index_scores_paged(args[0], args[1], args[2], args[4], args[5], B, args[6], width)
    # the Triton kernel with the case's launch shape, then the runtime's default (on an sm_90 GPU at
    # d = 128: the Gluon kernel, `indexer._PAGED_TUNE["gluon"]`)
    packed = I.index_scores_paged(args[0], args[1], args[3], args[4], args[5], B, args[6], width, **tune, gluon=False)
    assert torch.equal(_bits(packed), _bits(plain))
    default = I.index_scores_paged(args[0], args[1], args[3], args[4], args[5], B, args[6], width)
    assert torch.equal(_bits(default), _bits(plain))
    twin = I.index_scores_paged_torch(iq, w, pack(pool, "fp4_e8m0"), table, tok_slot, B, vis, width)
    assert torch.equal(_bits(twin), _bits(I.index_scores_paged_torch(iq, w, pool, table, tok_slot, B, vis, width)))


def test_packed_keys_of_the_wrong_width_are_refused(device):
    iq = torch.zeros(2, 4, 64, dtype=BF, device=device)
    w = torch.zeros(2, 4, dtype=BF, device=device)
    vis = torch.zeros(2, dtype=torch.int32, device=device)
    bad = torch.zeros(10, 33, dtype=torch.uint8, device=device)
    with pytest.raises(
        ValueError, match="keys.shape = \\(10, 33\\); allowed: \\[L, 34\\] \\(packed fp4_e8m0 rows of d = 64\\)"
    ):
        I.index_scores(iq, w, bad, vis)
    with pytest.raises(ValueError, match="keys.dtype = torch.float32; allowed: torch.bfloat16, or torch.uint8"):
        I.index_scores(iq, w, bad.float(), vis)
