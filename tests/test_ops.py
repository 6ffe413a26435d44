"""`attnv41.ops`: the kernels as torch.library custom ops. Each against the reference on
fresh random inputs (CPU: the twins, bit for bit), over bf16 and V4.1's packed pools
(the same bits), `torch.library.opcheck` (schema, fake tensors, autograd registration,
AOT dispatch), and a `torch.compile` of a decode layer's cache-side work through them
(fullgraph) equal to eager. A whole stack assembled from the ops: test_ops_engine.py."""

import pytest
import torch

import attnv41.ops  # noqa: F401  (registers torch.ops.attnv41.*)
from attnv41.packed import pack, row_bytes, unpack
from attnv41.reference import indexer as ref_idx
from attnv41.reference.compressor import compress_pool as ref_pool
from attnv41.reference.norm import rms_norm
from attnv41.reference.qdq import fp4_e4m3_qdq, fp4_e8m0_qdq, fp8_qdq
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


def _packed_attn_args(seed=0, m=3, H=4, D=64, n_win=10, n_comp=20, K=24):
    """`_attn_args` with rows on V4.1's grids (window fp8, compressed fp4), and their packed
    pools."""
    q, win, comp, sel, off, sink, scale = _attn_args(seed, m, H, D, n_win, n_comp, K)
    win, comp = fp8_qdq(win), fp4_e4m3_qdq(comp)
    return (q, win, comp, sel, off, sink, scale), (pack(win, "fp8_e8m0"), pack(comp, "fp4_e4m3"))


def test_sparse_attn_over_packed_pools_gives_the_bf16_pools_bits():
    (q, win, comp, sel, off, sink, scale), (pw, pc) = _packed_attn_args(5)
    exp = OPS.sparse_attn(q, win, comp, sel, off, sink, scale)
    assert torch.equal(exp, ref_attn(q, torch.cat([win, comp]), sel, sink, scale))
    got = OPS.sparse_attn(q, pw, pc, sel, off, sink, scale)
    assert torch.equal(got.view(torch.int16), exp.view(torch.int16)), "o over packed pools"
    # a window-only layer: an empty compressed pool of the packed width
    only_win = torch.where(sel < off, sel, -1)
    assert torch.equal(
        OPS.sparse_attn(q, pw, pc[:0], only_win, off, sink, scale),
        OPS.sparse_attn(q, win, comp[:0], only_win, off, sink, scale),
    )


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_sparse_attn_out_writes_o_and_its_inverse_rope(packed):
    """Into the caller's buffers: `sparse_attn`'s o and `rope(o, inverse=True)`, bit for bit."""
    (q, win, comp, sel, off, sink, scale), (pw, pc) = _packed_attn_args(8)
    if packed:
        win, comp = pw, pc
    cos, sin = rope_table(64, rope_freqs(16, 10000.0))
    pos = torch.tensor([4, 0, 63])
    out, out_rot = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    assert OPS.sparse_attn_out(q, win, comp, sel, off, sink, scale, cos, sin, pos, out, out_rot) is None
    o = OPS.sparse_attn(q, win, comp, sel, off, sink, scale)
    assert torch.equal(out.view(torch.int16), o.view(torch.int16)), "out"
    assert torch.equal(out_rot, apply_rope(o, cos, sin, pos, inverse=True)), "out_rot"


def test_sparse_attn_prefill_equals_the_reference_over_either_compressed_pool():
    """The prefill regime's op: a prompt's own bf16 rows and a bf16 or packed compressed
    pool; on the CPU the reference's bits (as `sparse_attn`'s)."""
    (q, win, comp, sel, off, sink, scale), (_, pc) = _packed_attn_args(6)
    exp = ref_attn(q, torch.cat([win, comp]), sel, sink, scale)
    for c in (comp, pc):
        got = OPS.sparse_attn_prefill(q, win, c, sel, off, sink, scale)
        assert torch.equal(got.view(torch.int16), exp.view(torch.int16)), f"comp {c.dtype}"
    only_win = torch.where(sel < off, sel, -1)
    assert torch.equal(
        OPS.sparse_attn_prefill(q, win, win[:0], only_win, off, sink, scale),
        ref_attn(q, win, only_win, sink, scale),
    )


def test_index_topk_over_packed_keys_gives_the_bf16_keys_bits():
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(6)
    keys = fp4_e8m0_qdq(keys)
    packed = pack(keys, "fp4_e8m0")
    for fn, extra in ((OPS.index_scores, ()), (OPS.index_topk, (k, 3))):
        a = fn(iq, w, keys, table, tok_slot, vis, B, width, *extra)
        b = fn(iq, w, packed, table, tok_slot, vis, B, width, *extra)
        assert torch.equal(a.view(torch.int16) if a.dtype == BF else a, b.view(torch.int16) if b.dtype == BF else b)


def _chain_args(seed, m=4, D=64, n_pool=6):
    g = _gen(seed)
    x = torch.randn(m, D, generator=g).to(BF) * 3
    norm_w = 1 + 0.1 * torch.randn(D, generator=g)
    cos, sin = rope_table(64, rope_freqs(16, 10000.0))
    pos = torch.tensor([3, 17, 40, 63][:m])
    slots = torch.tensor([4, -1, 0, 2][:m])
    return x, norm_w, cos, sin, pos, slots, n_pool


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_kv_rows_and_index_key_rows_write_by_slot_mapping(packed):
    """The window rows (§4.3) and index keys (§6.1), the reference's values at their slots,
    −1 writing nothing; packed pools hold the same values."""
    x, norm_w, cos, sin, pos, slots, n = _chain_args(7)
    D = x.shape[1]
    for op, qdq, fmt, returns in (
        (OPS.kv_rows, fp8_qdq, "fp8_e8m0", True),
        (OPS.index_key_rows, fp4_e8m0_qdq, "fp4_e8m0", False),
    ):
        exp_rows = qdq(apply_rope(rms_norm(x, norm_w, 1e-6), cos, sin, pos))
        pool = torch.full((n, row_bytes(fmt, D)), 7, dtype=torch.uint8) if packed else torch.full((n, D), 7.0).to(BF)
        before = pool.clone()
        got = op(x, norm_w, 1e-6, cos, sin, pos, slots, pool)
        if returns:
            assert torch.equal(got, exp_rows), f"{fmt}: the returned rows"
        else:
            assert got is None
        kept = slots >= 0
        rows = pool[slots[kept]]
        assert torch.equal(unpack(rows, fmt, D) if packed else rows, exp_rows[kept]), f"{fmt}: rows at their slots"
        untouched = [r for r in range(n) if r not in set(slots[kept].tolist())]
        assert torch.equal(pool[untouched], before[untouched]), f"{fmt}: rows no token maps to"


@pytest.mark.parametrize(
    "bad,message",
    [
        ("width", "cache.shape = \\(6, 60\\); allowed: \\[rows >= 1, 66\\] \\(packed fp8_e8m0\\)"),
        ("dtype", "cache.dtype = torch.float32; allowed: torch.bfloat16 or torch.uint8"),
        ("slots", "slot_mapping.dtype = torch.float32; allowed: torch.int32 or torch.int64"),
        ("count", "slot_mapping.shape = \\(3,\\); allowed: \\[4\\] \\(one per token\\)"),
    ],
)
def test_row_writers_refuse_bad_pools_by_their_own_names_and_write_nothing(bad, message):
    x, norm_w, cos, sin, pos, slots, n = _chain_args(10)
    D = x.shape[1]
    pool = {
        "width": torch.full((n, 60), 7, dtype=torch.uint8),
        "dtype": torch.full((n, D), 7.0),
    }.get(bad, torch.full((n, row_bytes("fp8_e8m0", D)), 7, dtype=torch.uint8))
    slots = {"slots": slots.float(), "count": slots[:3]}.get(bad, slots)
    before = pool.clone()
    with pytest.raises(ValueError, match=message):
        OPS.kv_rows(x, norm_w, 1e-6, cos, sin, pos, slots, pool)
    assert torch.equal(pool, before), "a refused call writes nothing"


def test_compress_rows_into_a_packed_pool_and_minus_one():
    a, gate, norm_w, cos, sin, row_pos, row, cache = _compress_args(2)
    pooled = OPS.compress_pool(a, gate).to(BF)
    row = torch.tensor([5, -1, 9])
    packed = torch.zeros(12, row_bytes("fp4_e4m3", cache.shape[1]), dtype=torch.uint8)
    lat_a = OPS.compress_rows(pooled, norm_w, 1e-6, cos, sin, row_pos, row, cache)
    lat_b = OPS.compress_rows(pooled, norm_w, 1e-6, cos, sin, row_pos, row, packed)
    assert torch.equal(lat_a, lat_b)
    exp = fp4_e4m3_qdq(apply_rope(rms_norm(pooled, norm_w, 1e-6), cos, sin, row_pos))
    assert torch.equal(cache[[5, 9]], exp[[0, 2]])
    assert torch.equal(unpack(packed[[5, 9]], "fp4_e4m3", cache.shape[1]), exp[[0, 2]])
    assert not cache[[r for r in range(12) if r not in (5, 9)]].any(), "row −1 writes nothing"
    assert not packed[[r for r in range(12) if r not in (5, 9)]].any()


def test_index_queries_rms_norm_and_rope_equal_the_reference():
    g = _gen(8)
    iq = torch.randn(3, 2, 32, generator=g).to(BF)
    cos, sin = rope_table(64, rope_freqs(16, 10000.0))
    pos = torch.tensor([0, 9, 63])
    assert torch.equal(OPS.index_queries(iq, cos, sin, pos), fp4_e8m0_qdq(apply_rope(iq, cos, sin, pos)))
    x = torch.randn(5, 48, generator=g).to(BF)
    w = 1 + 0.1 * torch.randn(48, generator=g)
    assert torch.equal(OPS.rms_norm(x, w, 1e-6), rms_norm(x, w, 1e-6))
    q = torch.randn(3, 4, 32, generator=g).to(BF)
    for inverse in (False, True):
        assert torch.equal(OPS.rope(q, cos, sin, pos, inverse), apply_rope(q, cos, sin, pos, inverse=inverse))


def test_candidate_mask_and_masked_topk_equal_the_reference():
    """§6.5-§6.6 on held scores, ties included (scores drawn from a few values)."""
    g = _gen(9)
    m, L = 4, 37
    scores = torch.randint(-3, 4, (m, L), generator=g).to(BF)
    vis = torch.tensor([37, 20, 1, 0])
    scores[torch.arange(L)[None, :] >= vis[:, None]] = float("-inf")
    mask = OPS.candidate_mask(scores, vis, 3, 4)
    assert torch.equal(mask, ref_idx.candidate_mask(scores, vis, 3, 4))
    for k, msk in ((5, None), (5, mask), (37, mask)):
        got = OPS.topk(scores, vis, k, 11, msk)
        masked = scores if msk is None else scores.masked_fill(~msk, float("-inf"))
        assert torch.equal(got, ref_idx.topk_select(masked, vis, k, 11)), f"k = {k}, mask: {msk is not None}"
    with pytest.raises(ValueError, match="topk: mask must be None or torch.bool of shape \\[4, 37\\]"):
        OPS.topk(scores, vis, 5, 0, mask[:, :3])


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_index_topk_over_candidates_equals_the_masked_index_topk(dev):
    """A reindex layer's selection over its candidates only (`candidate_ids` →
    `index_topk_candidates`) against the full form: `index_scores`, the candidate mask
    from the candidate source's scores, the masked `topk`; bf16 and packed keys; on the
    CPU (the twins) and on CUDA (the Triton kernels)."""
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    g = _gen(12)
    lens, rows, B, H, d, width, k, cb, C = (2, 3), (37, 30), 4, 2, 32, 40, 5, 2, 6  # 12 candidate positions
    table, n_blocks = paged_table(g, rows, B, width)
    keys = fp4_e8m0_qdq(torch.randn(n_blocks * B, d, generator=g).to(BF))
    T = sum(lens)
    iq = [fp4_e8m0_qdq(torch.randn(T, H, d, generator=g).to(BF)) for _ in range(2)]
    w = [torch.randn(T, H, generator=g).to(BF) for _ in range(2)]
    tok_slot = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    vis = torch.tensor([37, 36, 30, 11, 29], dtype=torch.int32)
    iq, w = [t.to(dev) for t in iq], [t.to(dev) for t in w]
    keys, table, tok_slot, vis = keys.to(dev), table.to(dev), tok_slot.to(dev), vis.to(dev)
    for pool in (keys, pack(keys, "fp4_e8m0")):
        src = OPS.index_scores(iq[0], w[0], pool, table, tok_slot, vis, B, width)  # the candidate source's
        ids = OPS.candidate_ids(src, vis, C, cb)
        mask = OPS.candidate_mask(src, vis, C, cb)
        assert ids.shape == (T, C)
        for t in range(T):  # the kept blocks ascending, then n_blocks
            kept = torch.nonzero(mask[t, ::cb].cpu()).flatten().to(torch.int32).to(dev)
            assert torch.equal(ids[t, : kept.numel()], kept) and (ids[t, kept.numel() :] == -(-width // cb)).all()
        full = OPS.index_scores(iq[1], w[1], pool, table, tok_slot, vis, B, width)
        want = OPS.topk(full, vis, k, 9, mask)
        got = OPS.index_topk_candidates(iq[1], w[1], pool, table, tok_slot, vis, B, width, ids, cb, k, 9)
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="k = 13; allowed: 1..12"):
        OPS.index_topk_candidates(iq[1], w[1], keys, table, tok_slot, vis, B, width, ids, cb, 13, 0)


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_index_ops_take_the_tokens_launch_option(dev):
    """`tokens` (consecutive tokens per program) leaves every score and selection as they
    are; a value the kernels do not take is refused."""
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = (
        a.to(dev) if isinstance(a, torch.Tensor) else a for a in _paged_args(1)
    )
    args = (iq, w, keys, table, tok_slot, vis, B, width)
    base, top = OPS.index_scores(*args), OPS.index_topk(*args, k, 5)
    for tokens in (2, 16):
        assert torch.equal(OPS.index_scores(*args, tokens).view(torch.int16), base.view(torch.int16)), tokens
        assert torch.equal(OPS.index_topk(*args, k, 5, tokens), top), tokens
    with pytest.raises(ValueError, match="tokens = 3; allowed: 1, 2, 4, 8 or 16"):
        OPS.index_scores(*args, 3)
    with pytest.raises(ValueError, match="tokens = 0; allowed"):
        OPS.index_topk(*args, k, 5, 0)


def _opcheck(op, args):
    torch.library.opcheck(op, args)


def test_opcheck_every_op():
    q, win, comp, sel, off, sink, scale = _attn_args(1)
    _opcheck(OPS.sparse_attn.default, (q, win, comp, sel, off, sink, scale))
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(1)
    _opcheck(OPS.index_scores.default, (iq, w, keys, table, tok_slot, vis, B, width))
    _opcheck(OPS.index_topk.default, (iq, w, keys, table, tok_slot, vis, B, width, k, 7))
    _opcheck(OPS.index_scores.default, (iq, w, keys, table, tok_slot, vis, B, width, 16))
    _opcheck(OPS.index_topk.default, (iq, w, keys, table, tok_slot, vis, B, width, k, 7, 4))
    _opcheck(OPS.cache_write.default, (torch.zeros(6, 8, dtype=BF), torch.ones(2, 8, dtype=BF), torch.tensor([4, -1])))
    a, gate, norm_w, cos, sin, row_pos, row, cache = _compress_args(1)
    _opcheck(OPS.compress_pool.default, (a, gate))
    _opcheck(OPS.compress_rows.default, (ref_pool(a, gate).to(BF), norm_w, 1e-6, cos, sin, row_pos, row, cache))
    packed = torch.zeros(cache.shape[0], row_bytes("fp4_e4m3", cache.shape[1]), dtype=torch.uint8)
    _opcheck(OPS.compress_rows.default, (ref_pool(a, gate).to(BF), norm_w, 1e-6, cos, sin, row_pos, row, packed))
    (q, *_), (pw, pc) = _packed_attn_args(1)
    _opcheck(OPS.sparse_attn.default, (q, pw, pc, sel, off, sink, scale))
    _opcheck(OPS.sparse_attn_prefill.default, (q, win, pc, sel, off, sink, scale))
    ct, st = rope_table(64, rope_freqs(16, 10000.0))
    pos3 = torch.tensor([1, 9, 30])
    for wp, cp in ((win, comp), (pw, pc)):
        _opcheck(
            OPS.sparse_attn_out.default,
            (q, wp, cp, sel, off, sink, scale, ct, st, pos3, torch.empty_like(q), torch.empty_like(q)),
        )
    x, cw, cos, sin, pos, slots, n = _chain_args(1)
    D = x.shape[1]
    for pool in (torch.zeros(n, D, dtype=BF), torch.zeros(n, row_bytes("fp8_e8m0", D), dtype=torch.uint8)):
        _opcheck(OPS.kv_rows.default, (x, cw, 1e-6, cos, sin, pos, slots, pool))
    _opcheck(OPS.index_key_rows.default, (x, cw, 1e-6, cos, sin, pos, slots, torch.zeros(n, D, dtype=BF)))
    _opcheck(OPS.index_queries.default, (x.view(4, 2, 32), cos, sin, pos))
    _opcheck(OPS.rms_norm.default, (x, cw, 1e-6))
    _opcheck(OPS.rope.default, (x.view(4, 2, 32), cos, sin, pos, True))
    scores = torch.randn(3, 10).to(BF)
    vis = torch.tensor([10, 4, 0])
    _opcheck(OPS.candidate_mask.default, (scores, vis, 2, 3))
    _opcheck(OPS.topk.default, (scores, vis, 4, 1, scores > 0))
    _opcheck(OPS.topk.default, (scores, vis, 4, 1))
    _opcheck(OPS.candidate_ids.default, (scores, vis, 2, 3))
    ids = OPS.candidate_ids(scores, vis, 2, 3)
    iq, w, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(1)
    ids = torch.tensor([[0, 2], [1, 3], [0, 1], [2, 3], [1, 2], [0, 3]], dtype=torch.int32)[: iq.shape[0]]
    _opcheck(OPS.index_topk_candidates.default, (iq, w, keys, table, tok_slot, vis, B, width, ids, 3, 4, 7))


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


def _packed_layer(device="cpu", seed=12):
    """A decode layer's work between its projections, over packed pools: q's RoPE, the
    window rows, index queries, scores, the candidate mask, the masked top-k translated to
    pool rows, the attention into buffers with o's inverse RoPE. Returns (layer, its
    window pool, a maker of its inputs)."""
    iq_in, hw, keys, table, tok_slot, vis, B, width, k, *_ = _paged_args(seed, rows=(7, 12, 3))
    g = _gen(seed)
    T, H, D, W = iq_in.shape[0], 4, 64, 4
    cos, sin = rope_table(64, rope_freqs(16, 10000.0))
    win = pack(fp8_qdq(torch.randn(T * W, D, generator=g).to(BF)), "fp8_e8m0")  # a ring of W rows per token
    comp = pack(fp4_e4m3_qdq(torch.randn(keys.shape[0], D, generator=g).to(BF)), "fp4_e4m3")
    keys = pack(fp4_e8m0_qdq(keys), "fp4_e8m0")
    kv_norm = 1 + 0.1 * torch.randn(D, generator=g)
    sink = torch.randn(H, generator=g)
    tables = [t.to(device) for t in (cos, sin, table, tok_slot, vis, kv_norm, sink, comp, keys)]
    cos, sin, table, tok_slot, vis, kv_norm, sink, comp, keys = tables
    off = win.shape[0]

    def layer(win, q_pre, kv_pre, iq_pre, hw, pos):
        q = OPS.rope(q_pre, cos, sin, pos)
        # each token its own ring (distinct slots: two tokens writing one row would race)
        t = torch.arange(pos.shape[0], device=pos.device)
        OPS.kv_rows(kv_pre, kv_norm, 1e-6, cos, sin, pos, t * W + pos % W, win)
        ring = (torch.arange(W, device=pos.device)[None, :] + pos[:, None] + 1) % W
        win_sel = t[:, None] * W + ring
        iq = OPS.index_queries(iq_pre, cos, sin, pos)
        scores = OPS.index_scores(iq, hw, keys, table, tok_slot, vis, B, width)
        top = OPS.topk(scores, vis, k, 0, OPS.candidate_mask(scores, vis, 2, 2))
        j = top.clamp_min(0).long()
        phys = table[tok_slot.long()[:, None], j // B].long() * B + j % B + off
        sel = torch.cat([win_sel, torch.where(top >= 0, phys, -1)], dim=1).to(torch.int32)
        o, o_rot = torch.empty_like(q), torch.empty_like(q)
        OPS.sparse_attn_out(q, win, comp, sel, off, sink, D**-0.5, cos, sin, pos, o, o_rot)
        return o_rot

    def inputs(seed):
        gi = _gen(seed)
        t = (
            torch.randn(T, H, D, generator=gi).to(BF),
            torch.randn(T, D, generator=gi).to(BF) * 2,
            torch.randn(T, 2, 32, generator=gi).to(BF),
            torch.randn(T, 2, generator=gi).to(BF),
            torch.randint(5, 60, (T,), generator=gi),
        )
        return [x.to(device) for x in t]

    return layer, win.to(device), inputs


def test_torch_compile_fullgraph_of_a_layer_over_packed_pools():
    layer, win, inputs = _packed_layer()
    args = inputs(1)
    w_eager, w_comp = win.clone(), win.clone()
    eager = layer(w_eager, *args)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)(w_comp, *args)
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))
    assert torch.equal(w_eager, w_comp), "the window pool's written rows"


@pytest.mark.gpu
def test_a_layer_over_packed_pools_as_a_cuda_graph():
    """The same layer captured in a CUDA graph (after one eager warm-up call), its inputs
    rewritten in place before each replay: replay == eager byte for byte, pools included."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    layer, win, inputs = _packed_layer("cuda")
    static = inputs(1)
    w_graph = win.clone()
    layer(w_graph.clone(), *static)  # warm-up: compiles and allocates outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(w_graph, *static)
    w_eager = win.clone()
    for seed in (2, 3, 4):
        fresh = inputs(seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        exp = layer(w_eager, *fresh)
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), exp.view(torch.int16)), f"inputs {seed}: o_rot"
        assert torch.equal(w_graph, w_eager), f"inputs {seed}: the window pool"


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
    gpu = OPS.sparse_attn_prefill(
        *(t.cuda() if isinstance(t, torch.Tensor) else t for t in (q, win, comp, sel, off, sink)), scale
    )
    c = compare_bf16("sparse_attn_prefill", gpu.cpu(), cpu)
    assert c.ok, c
    args = _paged_args(4)[:9]
    dev = [t.cuda() if isinstance(t, torch.Tensor) else t for t in args]
    assert torch.equal(OPS.index_topk(*dev, 3).cpu(), OPS.index_topk(*args, 3))
    cache, rows, slots = torch.zeros(9, 64, dtype=BF), torch.randn(3, 64).to(BF), torch.tensor([8, -1, 2])
    OPS.cache_write(cache, rows, slots)
    cg = torch.zeros(9, 64, dtype=BF, device="cuda")
    OPS.cache_write(cg, rows.cuda(), slots.cuda())
    assert torch.equal(cg.cpu(), cache)
