"""The decode attention's logits over packed rows in Gluon (`kernels.sparse_attn_logits_gluon`,
`sparse_attn_split`'s `gluon_logits` option): on an sm_90 GPU, the attention's bytes (o and
its inverse RoPE) equal the Triton logits kernel's at the batched runtime's launch shape
and equal those over the bf16 rows, at the Flash geometry and narrow ones, blocks of one
format, of both and of absent entries, a token with nothing selected, unaligned rows (the
option then stays with the Triton kernel), and under CUDA-graph replay with rewritten
selections. Offline (CPU): `test_sparse_attn_logits_gluon_sass.py`."""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import sparse_attn_logits_gluon as LG
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_split
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq
from kernels.test_sparse_attn_packed import _case, _unaligned

BF = torch.bfloat16


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and LG.HAVE_GLUON


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU with Gluon")]


def _bits(t):
    return t.cpu().view(torch.int16)


def _flash_case(seed, m=6, H=64, D=512, n_win=128, Nc=3000, K=640):
    """The runtime's selection order at the Flash geometry: window entries first (n_win of
    them; fewer than 128 make a block of both formats), then compressed ones, then −1."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(m, H, D, generator=g).to(BF)
    win = fp8_qdq(
        (torch.randn(128, D, generator=g) * torch.exp2(torch.randint(-6, 6, (128, 1), generator=g).float())).to(BF)
    )
    comp_scale = torch.exp2(torch.randint(-14, 3, (Nc, 1), generator=g).float())
    comp = fp4_e4m3_qdq((torch.randn(Nc, D, generator=g) * comp_scale).to(BF))
    sel = torch.full((m, K), -1, dtype=torch.int32)
    for t in range(m):
        nw = n_win - 7 * t  # 128, 121, …: the later tokens' second block mixes both formats
        sel[t, :nw] = torch.randperm(128, generator=g)[:nw].to(torch.int32)
        nc = K - nw - 13 * t
        sel[t, nw : nw + nc] = 128 + torch.randperm(Nc, generator=g)[:nc].to(torch.int32)
    sel[-1] = -1  # a token with nothing selected
    sink = torch.randn(H, generator=g)
    pw, pc = pack(win, "fp8_e8m0"), pack(comp, "fp4_e4m3")
    return [t.cuda() for t in (q, win, comp, pw, pc, sel, sink)]


def _run(q, w, c, sel, offset, sink, **tune):
    m, H, D = q.shape
    half = 32 if D >= 256 else 8
    gen = torch.Generator().manual_seed(7)
    cos = torch.rand(400, half, generator=gen).cuda()
    sin = torch.rand(400, half, generator=gen).cuda()
    pos = torch.randint(0, 400, (m,), generator=gen, dtype=torch.int32).cuda()
    o_rot = torch.empty(m, H, D, dtype=BF, device="cuda")
    o = sparse_attn_split(q, w, c, sel, offset, sink, D**-0.5, rot=(cos, sin, pos, o_rot), **tune)
    torch.cuda.synchronize()
    return o, o_rot


@pytest.mark.parametrize("q_stages", [0, 2])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("H, D", [(64, 512), (8, 128), (16, 256)], ids=["flash", "narrow128", "narrow256"])
def test_same_bytes_as_the_triton_logits(seed, H, D, q_stages):
    opt = dict(q_stages=q_stages, maxnreg=128 if q_stages else None)
    q, win, comp, pw, pc, sel, sink = _flash_case(seed, H=H, D=D)
    assert LG.logits_gluon_ok(q, pw, pc)
    base = _run(q, pw, pc, sel, 128, sink, **BATCH_TUNE)
    bf16 = _run(q, win, comp, sel, 128, sink, **BATCH_TUNE)
    got = _run(q, pw, pc, sel, 128, sink, **dict(BATCH_TUNE, gluon_logits=opt))
    for a, b, what in ((base, bf16, "Triton packed vs bf16 rows"), (got, base, "Gluon vs Triton logits")):
        for x, y, name in zip(a, b, ("o", "o_rot"), strict=True):
            assert torch.equal(_bits(x), _bits(y)), f"{what}: {name} differs in {int((_bits(x) != _bits(y)).sum())}"
    assert not got[0][:-1].float().isnan().any()


@pytest.mark.parametrize("q_stages", [0, 2])
@pytest.mark.parametrize("layout", ["random", "runtime"])
def test_mixed_and_absent_entries(layout, q_stages):
    """`test_sparse_attn_packed`'s cases: every block mixing window, compressed, absent and
    out-of-range entries (random), or the runtime's order with an all-absent block."""
    q, win, comp, pw, pc, sel, sink = _case("cuda", 1, m=5, H=8, D=128, K=200, layout=layout)
    assert LG.logits_gluon_ok(q, pw, pc)
    base = _run(q, pw, pc, sel, win.shape[0], sink, **BATCH_TUNE)
    got = _run(q, pw, pc, sel, win.shape[0], sink, **dict(BATCH_TUNE, gluon_logits=dict(q_stages=q_stages)))
    for x, y in zip(got, base, strict=True):
        assert torch.equal(_bits(x), _bits(y))


def test_unaligned_rows_and_d64_stay_with_the_triton_kernel():
    """Rows at odd addresses, and D = 64 (66-byte window rows: not 4-byte aligned): the
    option leaves them to the Triton kernel."""
    q, win, comp, pw, pc, sel, sink = _case("cuda", 2)
    assert q.shape[2] == 64 and not LG.logits_gluon_ok(q, pw, pc)
    pw, pc = _unaligned(pw), _unaligned(pc)
    assert not LG.logits_gluon_ok(q, pw, pc)
    base = _run(q, pw, pc, sel, win.shape[0], sink, **BATCH_TUNE)
    got = _run(q, pw, pc, sel, win.shape[0], sink, **dict(BATCH_TUNE, gluon_logits=True))
    assert torch.equal(_bits(got[0]), _bits(base[0]))


def test_graph_replay_with_rewritten_selections():
    q, win, comp, pw, pc, sel, sink = _flash_case(3, m=4)
    tune = dict(BATCH_TUNE, gluon_logits=True)
    out = torch.empty_like(q)
    D = q.shape[2]
    sparse_attn_split(q, pw, pc, sel, 128, sink, D**-0.5, out=out, **tune)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_attn_split(q, pw, pc, sel, 128, sink, D**-0.5, out=out, **tune)
    for seed in (11, 12):
        _, _, _, _, _, new_sel, _ = _flash_case(seed, m=4)
        sel.copy_(new_sel)
        q.copy_(torch.randn(q.shape, generator=torch.Generator().manual_seed(seed)).to(BF))
        g.replay()
        torch.cuda.synchronize()
        eager = sparse_attn_split(q, pw, pc, sel, 128, sink, D**-0.5, **BATCH_TUNE)
        assert torch.equal(_bits(out), _bits(eager)), f"replay {seed}"


def test_the_kernel_alone_refuses_what_it_does_not_take():
    q, win, comp, pw, pc, sel, sink = _flash_case(4, m=2)
    s_buf = torch.empty(2, 10, 64, 64, device="cuda")
    bm = torch.empty(2, 10, 64, device="cuda")
    with pytest.raises(ValueError, match="tune keys"):
        LG.logits_gluon(q, pw, pc, sel, 128, pc.shape[0], 0.1, s_buf, bm, bogus=1)
    with pytest.raises(ValueError, match="maxnreg = 300"):
        LG.logits_gluon(q, pw, pc, sel, 128, pc.shape[0], 0.1, s_buf, bm, maxnreg=300)
    with pytest.raises(ValueError, match="q_stages = 3"):
        LG.logits_gluon(q, pw, pc, sel, 128, pc.shape[0], 0.1, s_buf, bm, q_stages=3)
    with pytest.raises(ValueError, match="needs packed rows"):
        LG.logits_gluon(q, win, comp, sel, 128, comp.shape[0], 0.1, s_buf, bm)
