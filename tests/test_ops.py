"""`attnv41.ops`: the kernels as torch.library custom ops. Each against the reference on
fresh random inputs (CPU: the twins, bit for bit), `torch.library.opcheck` (schema,
fake tensors, autograd registration, AOT dispatch), and a `torch.compile` of a decode
layer's cache-side work through them (fullgraph) equal to eager."""

import pytest
import torch

import attnv41.ops  # noqa: F401  (registers torch.ops.attnv41.*)
from attnv41.reference import indexer as ref_idx
from attnv41.reference.compressor import compress_pool as ref_pool
from attnv41.reference.norm import rms_norm
from attnv41.reference.qdq import fp4_e4m3_qdq
from attnv41.reference.rope import apply_rope, rope_freqs, rope_table
from attnv41.reference.sparse_attn import sparse_attn as ref_attn
from helpers import paged_table

OPS = torch.ops.attnv41
BF = torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _attn_args(seed=0, m=3, H=4, D=64, n_win=10, n_comp=20, K=24):
    g = _gen(seed)
    q = torch.randn(m, H, D, generator=g).to(BF)
    win = torch.randn(n_win, D, generator=g).to(BF)
    comp = torch.randn(n_comp, D, generator=g).to(BF)
    sel = torch.randint(-1, n_win + n_comp, (m, K), generator=g, dtype=torch.int32)
    sink = torch.randn(H, generator=g)
    return q, win, comp, sel, n_win, sink, D**-0.5


def _paged_args(seed=0, lens=(2, 1, 3), rows=(7, 12, 3), B=4, H=2, d=32, width=12, k=5):
    g = _gen(seed)
    table, n_blocks = paged_table(g, rows, B, width)
    keys = torch.randn(n_blocks * B, d, generator=g).to(BF)
    T = sum(lens)
    iq = torch.randn(T, H, d, generator=g).to(BF)
    w = torch.randn(T, H, generator=g).to(BF)
    tok_slot = torch.cat([torch.full((m,), s, dtype=torch.int32) for s, m in enumerate(lens)])
    vis = torch.cat([torch.full((m,), r, dtype=torch.int32) for m, r in zip(lens, rows)])
    vis[1] -= 2
    return iq, w, keys, table, tok_slot, vis, B, width, k, lens, rows


def test_sparse_attn_equals_the_reference():
    q, win, comp, sel, off, sink, scale = _attn_args()
    got = OPS.sparse_attn(q, win, comp, sel, off, sink, scale)
    exp = ref_attn(q, torch.cat([win, comp]), sel, sink, scale)
    assert torch.equal(got, exp)


def test_index_topk_equals_the_reference_per_sequence():
    iq, w, keys, table, tok_slot, vis, B, width, k, lens, rows = _paged_args()
    scores = OPS.index_scores(iq, w, keys, table, tok_slot, vis, B, width)
    got = OPS.index_topk(iq, w, keys, table, tok_slot, vis, B, width, k, 100)
    a = 0
    for s, (m, r) in enumerate(zip(lens, rows)):
        jj = torch.arange(r)
        mine = keys[table[s, jj // B].long() * B + jj % B]
        exp_s = ref_idx.index_scores(iq[a : a + m], w[a : a + m], mine, vis[a : a + m])
        assert torch.equal(scores[a : a + m, :r], exp_s), f"scores of sequence {s}"
        kk = min(k, r)
        exp = ref_idx.topk_select(exp_s, vis[a : a + m], kk, 100)
        assert torch.equal(got[a : a + m, :kk], exp), f"top-k of sequence {s}"
        assert (got[a : a + m, kk:] == -1).all()
        a += m
    with pytest.raises(ValueError, match="k = 13; allowed: 1..12"):
        OPS.index_topk(iq, w, keys, table, tok_slot, vis, B, width, 13, 0)


def test_cache_write_skips_minus_one():
    g = _gen(3)
    cache = torch.randn(10, 8, generator=g).to(BF)
    rows = torch.randn(4, 8, generator=g).to(BF)
    slots = torch.tensor([7, -1, 0, 3])
    exp = cache.clone()
    exp[7], exp[0], exp[3] = rows[0], rows[2], rows[3]
    OPS.cache_write(cache, rows, slots)
    assert torch.equal(cache, exp)


def _compress_args(seed=0, n=3, r=4, D=64):
    g = _gen(seed)
    a = torch.randn(n, r, D, generator=g)
    gate = torch.randn(n, r, D, generator=g)
    cos, sin = rope_table(64, rope_freqs(16, 10000.0))
    norm_w = 1 + 0.1 * torch.randn(D, generator=g)
    cache = torch.zeros(12, D, dtype=BF)
    row = torch.tensor([5, 6, 9])
    return a, gate, norm_w, cos, sin, row * r, row, cache


def test_compressor_ops_equal_the_reference():
    a, gate, norm_w, cos, sin, row_pos, row, cache = _compress_args()
    pooled = OPS.compress_pool(a, gate)
    assert torch.equal(pooled, ref_pool(a, gate))
    latent = OPS.compress_rows(pooled.to(BF), norm_w, 1e-6, cos, sin, row_pos, row, cache)
    exp_lat = rms_norm(pooled.to(BF), norm_w, 1e-6)
    assert torch.equal(latent, exp_lat)
    exp_rows = fp4_e4m3_qdq(apply_rope(exp_lat, cos, sin, row_pos))
    assert torch.equal(cache[row], exp_rows)
    assert not cache[[0, 1, 2, 3, 4, 7, 8, 10, 11]].any()


def _opcheck(op, args):
    torch.library.opcheck(op, args)


def test_opcheck_every_op():
    q, win, comp, sel, off, sink, scale = _attn_args(1)
    _opcheck(OPS.sparse_attn.default, (q, win, comp, sel, off, sink, scale))
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(1)
    _opcheck(OPS.index_scores.default, (iq, w, keys, table, tok_slot, vis, B, width))
    _opcheck(OPS.index_topk.default, (iq, w, keys, table, tok_slot, vis, B, width, k, 7))
    _opcheck(OPS.cache_write.default, (torch.zeros(6, 8, dtype=BF), torch.ones(2, 8, dtype=BF), torch.tensor([4, -1])))
    a, gate, norm_w, cos, sin, row_pos, row, cache = _compress_args(1)
    _opcheck(OPS.compress_pool.default, (a, gate))
    _opcheck(OPS.compress_rows.default, (ref_pool(a, gate).to(BF), norm_w, 1e-6, cos, sin, row_pos, row, cache))


def test_torch_compile_fullgraph_equals_eager():
    """A layer's cache-side decode work: write the step's rows, select, attend."""
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(2)
    T = iq.shape[0]
    g = _gen(9)
    H, D = 4, 32
    q = torch.randn(T, H, D, generator=g).to(BF)
    ring = torch.randn(16, D, generator=g).to(BF)
    comp = torch.randn(keys.shape[0], D, generator=g).to(BF)
    kv = torch.randn(T, D, generator=g).to(BF)
    slots = torch.arange(T, dtype=torch.int64) * 2
    win_sel = slots[:, None].to(torch.int32).expand(T, 4).contiguous()
    sink = torch.randn(H, generator=g)

    def layer(ring, q, kv):
        torch.ops.attnv41.cache_write(ring, kv, slots)
        top = torch.ops.attnv41.index_topk(iq, w, keys, table, tok_slot, vis, B, width, k, 16)
        sel = torch.cat([win_sel, top], dim=1)
        return torch.ops.attnv41.sparse_attn(q, ring, comp, sel, 16, sink, D**-0.5)

    r_eager, r_comp = ring.clone(), ring.clone()
    eager = layer(r_eager, q, kv)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(r_comp, q, kv)
    assert torch.equal(eager, compiled)
    assert torch.equal(r_eager, r_comp)


@pytest.mark.gpu
def test_ops_on_cuda_match_the_cpu():
    """Each op on CUDA against its CPU twin: selections and cache writes exact (random
    scores: no ties at the cut), attention within the bf16 tolerance."""
    from attnv41.testing import compare_bf16

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    q, win, comp, sel, off, sink, scale = _attn_args(4, D=128)
    cpu = OPS.sparse_attn(q, win, comp, sel, off, sink, scale)
    gpu = OPS.sparse_attn(
        *(t.cuda() if isinstance(t, torch.Tensor) else t for t in (q, win, comp, sel, off, sink)), scale
    )
    c = compare_bf16("sparse_attn", gpu.cpu(), cpu)
    assert c.ok, c
    args = _paged_args(4)[:9]
    dev = [t.cuda() if isinstance(t, torch.Tensor) else t for t in args]
    assert torch.equal(OPS.index_topk(*dev, 3).cpu(), OPS.index_topk(*args, 3))
    cache, rows, slots = torch.zeros(9, 64, dtype=BF), torch.randn(3, 64).to(BF), torch.tensor([8, -1, 2])
    OPS.cache_write(cache, rows, slots)
    cg = torch.zeros(9, 64, dtype=BF, device="cuda")
    OPS.cache_write(cg, rows.cuda(), slots.cuda())
    assert torch.equal(cg.cpu(), cache)
