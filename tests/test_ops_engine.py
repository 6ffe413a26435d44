"""A V4.1 stack assembled from `attnv41.ops` over engine-owned paged pools
(`examples/paged_engine.py`): prompts from position 0, continuation chunks and decode
steps of several sequences at their own positions, every layer role, bf16 and packed
pools, bf16 and FP8 weights. On the CPU each token's attention and output equal the
reference stack's (one sequence at a time) bit for bit; on CUDA packed pools give the bf16
pools' bits and the outputs lie within the bf16 tolerance of the reference's."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from attnv41.golden import GoldenFile, bundled_golden_path
from attnv41.packed import unpack
from attnv41.synthetic import random_weights
from helpers import REPO

BF = torch.bfloat16
_spec = importlib.util.spec_from_file_location("paged_engine", REPO / "examples" / "paged_engine.py")
paged_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paged_engine)

# A window and top-k wide enough that a selection spans two of the attention's 64-entry
# blocks, with prompts from 0 long enough (30 and 45 tokens) that their layout (each token's
# own chunk rows, then the top-k) differs from decode's in which entries share a block: a
# prompt run in the decode layout gives other bits here (the tiny geometry's 14 entries
# always fit one block).
WIDE = dict(window=40, index_topk=30, max_seq=128)
WIDE_CHUNKS = {0: [(0, 30)], 2: [(1, 3)], 5: [(1, 20)], 9: [(2, 45)], 14: [(0, 7)]}


def _setup(weights: str, **geometry):
    gold = GoldenFile(bundled_golden_path())
    cfg = dataclasses.replace(gold.cfg, **geometry)
    if weights == "golden":
        return cfg, [gold.weights(i) for i in range(cfg.n_layers)]
    cfg = dataclasses.replace(cfg, q_rank=32)  # every FP8 linear's in-dim a multiple of 32
    return cfg, random_weights(cfg, 3, weights="fp8")


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
@pytest.mark.parametrize("weights", ["golden", "fp8"])
def test_engine_assembled_stack_equals_the_reference(weights, kv_format):
    """40 steps of `paged_engine.CHUNKS`: the window (8) wraps, a prompt longer than the
    window, ratio-2 groups completed inside chunks and across calls, the candidate mask
    biting (L > cand_blocks · cand_block = 8) and applied by the reindex layer."""
    cfg, w = _setup(weights)
    assert paged_engine.compare_with_reference(cfg, w, kv_format, steps=40) == 0.0


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
def test_engine_assembled_stack_over_two_attention_blocks(kv_format):
    cfg, w = _setup("golden", **WIDE)
    assert paged_engine.compare_with_reference(cfg, w, kv_format, steps=24, chunks=WIDE_CHUNKS, max_chunk=48) == 0.0


def test_packed_pools_hold_the_bf16_pools_values():
    """After the same calls, every pool row the two engines wrote holds the same values."""
    cfg, w = _setup("golden")
    a = paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format="bf16")
    b = paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format="packed")
    for kind, who, pos, xs in paged_engine.schedule(cfg, 30):
        for eng in (a, b):
            (eng.prefill if kind == "prefill" else eng.step)(xs, who, pos)
    D, d = cfg.head_dim, cfg.index_head_dim
    pairs = [(x, y, "fp8_e8m0", D) for x, y in zip(a.win, b.win)]
    for i in a.src:
        pairs += [(a.src[i].comp, b.src[i].comp, "fp4_e4m3", D), (a.src[i].keys, b.src[i].keys, "fp4_e8m0", d)]
    for x, y, fmt, width in pairs:
        written = (y != 0).any(dim=1)  # a packed row never written is all zero bytes (written: a scale byte)
        assert written.any()
        assert torch.equal(unpack(y[written], fmt, width).view(torch.int16), x[written].view(torch.int16)), fmt


@pytest.mark.gpu
def test_engine_assembled_stack_on_cuda():
    """CUDA: the outputs within the bf16 tolerance of the reference's (the kernels sum in
    other orders; bf16 weights: with FP8 ones an ulp moved upstream of wo_b may move a whole
    `out` row by an e4m3 step, which `attnv41 check` excuses by its own rule), and packed
    pools give the bf16 pools' bits (o, out), FP8 weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg, w = _setup("golden")
    for kv_format in ("bf16", "packed"):
        paged_engine.compare_with_reference(cfg, w, kv_format, device="cuda", steps=30)
    cfg, w = _setup("fp8")
    engines = [paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format=f, device="cuda") for f in ("bf16", "packed")]
    for n, (kind, who, pos, xs) in enumerate(paged_engine.schedule(cfg, 30)):
        xs = [x.cuda() for x in xs]
        bf, pk = ((e.prefill if kind == "prefill" else e.step)(xs, who, pos) for e in engines)
        for i in range(cfg.n_layers):
            for name in ("o", "out"):
                same = torch.equal(bf[i][name].view(torch.int16), pk[i][name].view(torch.int16))
                assert same, f"call {n} ({kind}), layer {i}: {name} over packed pools"


@pytest.mark.gpu
def test_engine_decode_step_as_a_cuda_graph():
    """The example's decode step over packed pools, given device tensors (bf16 weights),
    captured once after the prompts: replays with new inputs and positions advanced on the
    device equal eager steps of a twin engine byte for byte, outputs and every pool."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg, w = _setup("golden")
    graphed, eager = (paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format="packed", device="cuda") for _ in range(2))
    gen = torch.Generator().manual_seed(5)

    def inputs(m):
        return [torch.randn(m, cfg.dim, generator=gen).to(BF).cuda() for _ in range(cfg.n_layers)]

    for s, m in ((0, 5), (1, 11), (2, 3)):
        xs = inputs(m)
        graphed.prefill(xs, s, 0)
        eager.prefill(xs, s, 0)
    seqs = torch.tensor([0, 1, 2], device="cuda")
    pos = torch.tensor([5, 11, 3], device="cuda")
    xs = inputs(3)
    graphed.step(xs, seqs, pos)  # warm-up outside the capture (both engines take the step)
    eager.step(xs, seqs, pos.clone())
    pos += 1
    static = inputs(3)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = graphed.step(static, seqs, pos)
    for n in range(20):
        fresh = inputs(3)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        exp = eager.step(fresh, seqs, pos.clone())
        torch.cuda.synchronize()
        for i in range(cfg.n_layers):
            for name in ("o", "out"):
                assert torch.equal(outs[i][name].view(torch.int16), exp[i][name].view(torch.int16)), f"{n}: {i} {name}"
        pos += 1
    pools = [(a, b) for a, b in zip(graphed.win, eager.win)]
    for i in graphed.src:
        pools += [(graphed.src[i].comp, eager.src[i].comp), (graphed.src[i].keys, eager.src[i].keys)]
    assert all(torch.equal(a, b) for a, b in pools), "the pools after the replays"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_engine_random_geometry_and_schedule(seed):
    """Random windows, top-k widths, candidate blocks, block sizes, pool formats and chunk
    schedules (prompts and continuations of random lengths between decode steps): the
    reference's bits on the CPU."""
    import random

    rng = random.Random(seed)
    geometry = dict(
        window=rng.choice([4, 8, 16, 24]),
        index_topk=rng.choice([3, 6, 16]),
        cand_blocks=rng.choice([1, 2, 4]),
        cand_block=rng.choice([1, 2, 5]),
        max_seq=rng.choice([48, 64]),
        max_tokens=48,
    )
    cfg, w = _setup(rng.choice(["golden", "fp8"]), **geometry)
    max_chunk = rng.choice([4, 12, 20])
    chunks: dict[int, list] = {}
    for s in range(3):
        chunks.setdefault(rng.randrange(6), []).append((s, rng.randint(1, max_chunk)))  # the prompt
        for _ in range(2):
            chunks.setdefault(rng.randrange(8, 30), []).append((s, rng.randint(1, max_chunk)))
    for step in chunks:  # one chunk per sequence and step; a prompt before the sequence's later chunks
        seen, kept = set(), []
        for s, m in chunks[step]:
            if s not in seen:
                seen.add(s)
                kept.append((s, m))
        chunks[step] = kept
    kv_format = rng.choice(["bf16", "packed"])
    where = f"{geometry}, max_chunk {max_chunk}, {kv_format}, chunks {chunks}"
    try:
        paged_engine.compare_with_reference(
            cfg, w, kv_format, steps=34, block_rows=rng.choice([1, 3, 4]), chunks=chunks, max_chunk=max_chunk
        )
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None
