"""The single-sequence runtime (`AttnV41`, `RuntimeStack`, `DecodeGraphs`) with caches in
V4.1's packed byte formats (`kv_format="packed"`): window ring fp8_e8m0, compressed rows
fp4_e4m3, index keys fp4_e8m0. The values are the bf16 caches' (lossless), so on the CPU
every output and every trace field equals the bf16-cache run bit for bit, through
prefills, continuations, decode steps, the device-driven decode step and rollbacks
(hypothesis); the golden files pass with packed caches; bad formats are refused. On CUDA
packed and bf16 caches give the same bytes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnv41.golden import GoldenFile, replay, runtime_impl, runtime_split_impl
from attnv41.packed import row_bytes
from attnv41.runtime import AttnV41, RuntimeStack
from attnv41.runtime.attn import INDEX_TILE_ENTRIES
from attnv41.runtime.graphs import DecodeGraphs
from helpers import golden_path, random_inputs, random_weights, small_cfg, split_sizes

RATIOS = [(0, 2, 2, 1, 1, 1), (0, 4, 4, 1, 1, 1), (0, 4, 4, 2, 2, 2)]
TRACE = ("q", "kv_win", "sel", "o", "out", "compress_kv", "index_k", "index_score", "candidates", "rows_comp")


def _same_run(a, b, where):
    for n in TRACE:
        x, y = getattr(a, n), getattr(b, n)
        assert (x is None) == (y is None), f"{where} {n}"
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f"{where} {n}"
    assert a.index_k_owner == b.index_k_owner, where


def _same_state(a, b, where):
    for sa, sb in zip(a.states, b.states):
        for name in ("ring", "compress_kv", "index_k"):
            if getattr(sa, name) is not None:
                assert torch.equal(sa.values(name), sb.values(name)), f"{where} L{sa.role.layer} {name}"
        assert sa.n_rows == sb.n_rows and sa.next_pos == sb.next_pos, where


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(2, 56),
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=6),
    ratios=st.sampled_from(RATIOS),
    index_keys=st.sampled_from(["own", "released"]),
    rollback=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_packed_caches_equal_bf16_caches_bit_for_bit(n, sizes, ratios, index_keys, rollback, seed):
    cfg = small_cfg(compress_ratios=ratios, max_seq=64, max_tokens=64)
    w, xs = random_weights(cfg, seed), random_inputs(cfg, 64, seed + 1)
    a = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=4)
    b = RuntimeStack(cfg, w, index_keys=index_keys, bucket_min=4, kv_format="packed")
    assert b.states[1].ring.dtype == torch.uint8 and b.states[1].ring.shape[1] == row_bytes("fp8_e8m0", 32)
    s = 0
    for c in split_sizes(sizes, n):
        for i in range(cfg.n_layers):
            _same_run(a.layer(i, xs[i][s : s + c], s), b.layer(i, xs[i][s : s + c], s), f"[{s}, {s + c}) L{i}")
        _same_state(a, b, f"after [{s}, {s + c})")
        if rollback and index_keys == "own" and s > 0 and 2 <= c <= cfg.window:
            a.rollback(s + 1)
            b.rollback(s + 1)
            _same_state(a, b, f"rolled back to {s + 1}")
            c = 1
        s += c
    # the device-driven decode step (CUDA graphs on a GPU; the same step eagerly here)
    ga, gb = DecodeGraphs(a), DecodeGraphs(b)
    for p in range(s, min(s + 3, cfg.max_seq)):
        ya, yb = ga.step([x[p : p + 1] for x in xs], p), gb.step([x[p : p + 1] for x in xs], p)
        for i in range(cfg.n_layers):
            assert torch.equal(ya[i], yb[i]), f"graph step {p} L{i}"
    _same_state(a, b, "after the graph steps")


@pytest.mark.parametrize("name", ["tiny", "headdim", "fp8"])
@pytest.mark.parametrize("make", [runtime_impl, runtime_split_impl], ids=["forward", "split"])
def test_golden_files_pass_with_packed_caches(name, make):
    golden = GoldenFile(golden_path(name))

    def packed(*a, **k):
        return make(*a, **k, kv_format="packed")

    packed.weights_dtypes = make.weights_dtypes
    for variant in ("released", "intended"):
        rep = replay(golden, variant, packed, device="cpu", impl_name="packed")
        assert rep.ok and not rep.problems(), (variant, rep.failures(), rep.problems())


def test_bad_formats_are_refused():
    cfg = small_cfg()
    with pytest.raises(ValueError, match="kv_format = 'fp8'; allowed: 'bf16', 'packed'"):
        AttnV41(cfg, kv_format="fp8")
    w, xs = random_weights(cfg, 1), random_inputs(cfg, 4, 2)
    packed, plain = RuntimeStack(cfg, w, kv_format="packed"), RuntimeStack(cfg, w)
    with pytest.raises(ValueError, match="state kv_format = 'bf16'; allowed: 'packed'"):
        packed.attn.forward(packed.weights[0], plain.states[0], packed.shared, xs[0][:2], 0)
    assert plain.states[0].next_pos == 0 and packed.shared.last_layer == -1


@pytest.mark.gpu
def test_packed_caches_on_cuda_give_the_bf16_bytes():
    """On CUDA: prefill, continuation, eager decode and DecodeGraphs steps with packed
    caches give the bf16-cache run's bytes (the kernels dequantize exactly)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = small_cfg(compress_ratios=(0, 4, 4, 1, 1, 1), max_seq=128, max_tokens=96)
    w, xs = random_weights(cfg, 51), random_inputs(cfg, 128, 52)
    a, b = RuntimeStack(cfg, w, device="cuda"), RuntimeStack(cfg, w, device="cuda", kv_format="packed")
    for s, m in ((0, 61), (61, 9), (70, 1), (71, 1)):
        for i in range(cfg.n_layers):
            x = xs[i][s : s + m].cuda()
            _same_run(a.layer(i, x, s), b.layer(i, x, s), f"[{s}, {s + m}) L{i}")
    ga, gb = DecodeGraphs(a), DecodeGraphs(b)
    for p in range(72, 80):
        ya = ga.step([x[p : p + 1].cuda() for x in xs], p)
        yb = gb.step([x[p : p + 1].cuda() for x in xs], p)
        for i in range(cfg.n_layers):
            assert torch.equal(ya[i], yb[i]), f"graph step {p} L{i}"
    _same_state(a, b, "end")


def _long_context_run(cfg, w, device, context, chunk, steps, tile_entries=None):
    """Both cache formats over the same weights: a context of `context` tokens filled as
    the bench fills it (random rows on the formats' grids), a continuation chunk of
    `chunk` tokens (its index scored in tiles: m·L passes index_tile_entries), then
    `steps` decode steps through DecodeGraphs with the oracle (replay == eager bytes).
    Returns each format's outputs."""
    from attnv41.bench.stack import fill_context

    outs = {}
    for kvf in ("bf16", "packed"):
        st = RuntimeStack(cfg, w, device=device, kv_format=kvf)
        if tile_entries is not None:
            st.attn.index_tile_entries = tile_entries
        fill_context(st, context, seed=3)
        gen = torch.Generator(device=device).manual_seed(5)
        x = torch.randn(cfg.n_layers, chunk + steps, cfg.dim, generator=gen, device=device).to(torch.bfloat16)
        got = [y.clone() for y in st.step(list(x[:, :chunk]), context, keep=True)]
        drv = DecodeGraphs(st, oracle=True)
        for p in range(context + chunk, context + chunk + steps):
            got += [y.clone() for y in drv.step(x[:, p - context : p - context + 1], p)]
        assert drv.oracle_checks == steps and st.attn.nonfinite_count() == 0
        outs[kvf] = got
        del st, drv
    return outs


def test_long_context_chunk_and_decode_small():
    """CPU, small geometry: a continuation chunk over a filled context in index tiles, then
    decode steps; packed caches give the bf16 caches' bits."""
    cfg = small_cfg(max_seq=4096, max_tokens=256)
    w = random_weights(cfg, 61)
    outs = _long_context_run(cfg, w, "cpu", 3000, 200, 3, tile_entries=20_000)  # tiles of 6 tokens
    for a, b in zip(outs["bf16"], outs["packed"]):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.gpu_full
def test_flash_at_a_1m_context_on_cuda():
    """Full tier: the 40-layer V4.1-Flash stack at a 1,048,000-token context: a 512-token
    continuation chunk (its index scored in tiles of 64 tokens over 1M keys: no [m, L]
    buffer), then 4 decode steps as CUDA graphs compared byte for byte with eager forward
    (oracle); packed caches give the bf16 caches' bytes."""
    from attnv41.config import v41_flash

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg = v41_flash(max_tokens=512, max_seq=1 << 20)
    w = random_weights(cfg, 62, device="cuda")
    # the index layers' keys: 1,048,000 // r rows (r = 2 or 1): fewer tokens than the chunk's
    # 512 fit the default tile (index_tile_entries // L), so its index is scored in tiles
    assert all(INDEX_TILE_ENTRIES // (1_048_000 // r) < 512 for r in (1, 2)), "tiles at the default"
    outs = _long_context_run(cfg, w, "cuda", 1_048_000, 512, 4)
    for i, (a, b) in enumerate(zip(outs["bf16"], outs["packed"])):
        assert torch.equal(a, b), i
