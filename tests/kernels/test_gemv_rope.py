"""The decode GEMV's RoPE epilogue (`gemv.gemv(..., rope=)`, step 5 of kernels/gemv.py):
output i stored rotated exactly as `rope.apply_rope` rotates it after a plain call. Bits
compared (the epilogue runs the rope op's fp32 expressions, without FMA contraction), for
bf16 and FP8 weights, one segment and split K, fused with a weight that is not rotated,
on CUDA when present, else on the interpreter; the twins and the non-GEMV paths apply the
rope op after the product."""

from __future__ import annotations

import re
import zlib

import pytest
import torch

from attnv41.kernels import gemv as G
from attnv41.kernels import rope as R

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _bits(t):
    return t.cpu().view(torch.int16)


def _weight(gen, N, K, fp8):
    if not fp8:
        return torch.randn(N, K, generator=gen).to(BF), None
    w = (torch.randn(N, K, generator=gen) * 64).clamp(-448, 448).to(FP8)
    s = torch.randint(118, 124, (-(-N // 32), K // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return w, s


def _tables(gen, half, device, n_pos=70):
    ang = torch.rand(n_pos, half, generator=gen) * 6
    return ang.cos().to(device), ang.sin().to(device)


# the split K of two cases on the interpreter: 2 chunks (a quarter of the programs)
SPLIT_K = 2048 if torch.cuda.is_available() else 512
CASES = [  # m, heads, head_dim, half, K, fp8: one segment, split K, a tail narrower than the tile
    (1, 4, 64, 8, 256, False),
    (1, 2, 64, 16, SPLIT_K, False),
    (3, 3, 32, 4, 512, True),
    (1, 4, 64, 32, SPLIT_K, True),
]


@pytest.mark.parametrize(
    "m,H,D,half,K,fp8",
    CASES,
    ids=[f"m{c[0]}-H{c[1]}-D{c[2]}-h{c[3]}-K{c[4]}-{'fp8' if c[5] else 'bf16'}" for c in CASES],
)
def test_epilogue_is_the_rope_op_after(m, H, D, half, K, fp8, device):
    gen = _gen("rope", m, H, D, half, K, fp8)
    x = torch.randn(m, K, generator=gen).to(BF).to(device)
    w, s = (t if t is None else t.to(device) for t in _weight(gen, H * D, K, fp8))
    w2, s2 = (t if t is None else t.to(device) for t in _weight(gen, 40, K, fp8))
    assert (G.plan(H * D, K, w.dtype)[1] > 1) == (K > 256), "one segment at one chunk, split above"
    cos, sin = _tables(gen, half, device)
    pos = torch.randint(0, 70, (m,), generator=gen, dtype=torch.int32).to(device)
    plain = (torch.empty(m, H * D, dtype=BF, device=device), torch.empty(m, 40, dtype=BF, device=device))
    G.gemv(x, (w, w2), plain, (s, s2))
    want = R.apply_rope(plain[0].view(m, H, D), cos, sin, pos).view(m, H * D)
    got = (torch.full_like(plain[0], float("nan")), torch.full_like(plain[1], float("nan")))
    G.gemv(x, (w, w2), got, (s, s2), rope=(0, D, cos, sin, pos))
    assert torch.equal(_bits(got[0]), _bits(want)), "rotated output differs from gemv then apply_rope"
    assert torch.equal(_bits(got[1]), _bits(plain[1])), "the other weight's output changed"
    # the twins: the kernel's order, then the rope op's twin
    xc, wc, w2c = x.cpu(), w.cpu(), w2.cpu()
    sc, s2c = (None if t is None else t.cpu() for t in (s, s2))
    twin = (torch.empty(m, H * D, dtype=BF), torch.empty(m, 40, dtype=BF))
    G.gemv_torch(xc, (wc, w2c), twin, (sc, s2c), rope=(0, D, cos.cpu(), sin.cpu(), pos.cpu()))
    assert torch.equal(_bits(twin[0]), _bits(want)), "gemv_torch with rope"
    exact = (torch.empty(m, H * D, dtype=BF), torch.empty(m, 40, dtype=BF))
    G.mm_many_exact(xc, (wc, w2c), exact, (sc, s2c), rope=(0, D, cos.cpu(), sin.cpu(), pos.cpu()))
    base = (torch.empty(m, H * D, dtype=BF), torch.empty(m, 40, dtype=BF))
    G.mm_many_exact(xc, (wc, w2c), base, (sc, s2c))
    R.apply_rope_torch(base[0].view(m, H, D), cos.cpu(), sin.cpu(), pos.cpu(), out=base[0].view(m, H, D))
    assert torch.equal(_bits(exact[0]), _bits(base[0])), "mm_many_exact with rope"


BAD = [
    ("index out of range", dict(i=2), "rope i = 2"),
    ("head width not dividing N", dict(D=48), "rope head_dim = 48"),
    ("odd head width", dict(D=7), "rope head_dim = 7"),
    ("positions of another length", dict(pos="short"), "pos.shape"),
    ("not a tuple", dict(kind="list"), "rope = list"),
]


@pytest.mark.parametrize("what,edit,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_rope_rejected(what, edit, msg, device):
    gen = _gen("bad")
    x = torch.randn(2, 256, generator=gen).to(BF).to(device)
    w = torch.randn(128, 256, generator=gen).to(BF).to(device)
    cos, sin = _tables(gen, 8, device)
    pos = torch.zeros(2, dtype=torch.int32, device=device)
    out = torch.full((2, 128), 7.0, dtype=BF, device=device)
    i, D = edit.get("i", 0), edit.get("D", 64)
    if edit.get("pos") == "short":
        pos = pos[:1]
    rope = [i, D, cos, sin, pos] if edit.get("kind") == "list" else (i, D, cos, sin, pos)
    for fn in (G.gemv, G.gemv_torch, G.mm_many):
        with pytest.raises(ValueError, match=re.escape(msg)):
            fn(x, (w,), (out,), rope=rope)
        assert (out == 7.0).all(), f"{what}: output written before the error"


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_flash_wq_b_on_cuda(fp8):
    """wq_b at the Flash shape (64 heads × 512, RoPE on the last 64, K = 1280) with the
    index queries fused, as the runtime calls it: the rope op's bits, from a CUDA graph too."""
    dev = torch.device("cuda")
    G.prepare(dev)
    gen = _gen("flash", fp8)
    x = torch.randn(1, 1280, generator=gen).to(BF).to(dev)
    w, s = (t if t is None else t.to(dev) for t in _weight(gen, 32768, 1280, fp8))
    w2, s2 = (t if t is None else t.to(dev) for t in _weight(gen, 4096, 1280, fp8))
    cos, sin = _tables(gen, 32, dev, n_pos=4096)
    pos = torch.tensor([4000], dtype=torch.int32, device=dev)
    plain = (torch.empty(1, 32768, dtype=BF, device=dev), torch.empty(1, 4096, dtype=BF, device=dev))
    G.gemv(x, (w, w2), plain, (s, s2))
    want = R.apply_rope(plain[0].view(1, 64, 512), cos, sin, pos).view(1, -1)
    got = (torch.empty_like(plain[0]), torch.empty_like(plain[1]))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        G.gemv(x, (w, w2), got, (s, s2), rope=(0, 512, cos, sin, pos))
    for o in got:
        o.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(_bits(got[0]), _bits(want)), "graph-replayed rope epilogue differs from apply_rope"
    assert torch.equal(_bits(got[1]), _bits(plain[1]))


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_rotated_token_independent_of_m(fp8, device):
    """A token's rotated output: the same bytes alone and inside m = 5 (positions per token)."""
    gen = _gen("m", fp8)
    H, D, half, K = 2, 64, 16, 512
    x = torch.randn(5, K, generator=gen).to(BF).to(device)
    w, s = (t if t is None else t.to(device) for t in _weight(gen, H * D, K, fp8))
    cos, sin = _tables(gen, half, device)
    pos = torch.tensor([3, 60, 0, 17, 42], dtype=torch.int32, device=device)
    full = torch.empty(5, H * D, dtype=BF, device=device)
    G.gemv(x, (w,), (full,), (s,), rope=(0, D, cos, sin, pos))
    for t in (0, 3, 4):
        one = torch.empty(1, H * D, dtype=BF, device=device)
        G.gemv(x[t : t + 1], (w,), (one,), (s,), rope=(0, D, cos, sin, pos[t : t + 1]))
        assert torch.equal(_bits(one), _bits(full[t : t + 1])), f"token {t} alone vs in m = 5"
