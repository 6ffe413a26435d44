"""A V4.1 stack assembled from `attnv41.ops` over engine-owned paged pools
(`examples/paged_engine.py`): several sequences at their own positions decoded side by
side, every layer role, bf16 and packed pools, bf16 and FP8 weights. On the CPU each
token's attention and output equal the reference stack's (one sequence at a time) bit for
bit; on CUDA packed pools give the bf16 pools' bits and the outputs lie within the bf16
tolerance of the CPU's."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from attnv41.golden import GoldenFile, bundled_golden_path
from attnv41.packed import unpack
from attnv41.reference.layer import RefStack
from attnv41.synthetic import random_weights
from helpers import REPO

BF = torch.bfloat16
_spec = importlib.util.spec_from_file_location("paged_engine", REPO / "examples" / "paged_engine.py")
paged_engine = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paged_engine)


def _setup(weights: str):
    gold = GoldenFile(bundled_golden_path())
    if weights == "golden":
        return gold.cfg, [gold.weights(i) for i in range(gold.cfg.n_layers)]
    cfg = dataclasses.replace(gold.cfg, q_rank=32)  # every FP8 linear's in-dim a multiple of 32
    return cfg, random_weights(cfg, 3, weights="fp8")


def _schedule(cfg, steps: int, starts=(0, 4, 9)):
    """Per step: the sequences that decode (sequence s from step starts[s]) and their
    positions, and each layer's inputs for them."""
    gen = torch.Generator().manual_seed(11)
    for step in range(steps):
        seqs = [s for s, a in enumerate(starts) if 0 <= step - a < cfg.max_seq]
        pos = [step - starts[s] for s in seqs]
        yield seqs, pos, [torch.randn(len(seqs), cfg.dim, generator=gen).to(BF) for _ in range(cfg.n_layers)]


@pytest.mark.parametrize("kv_format", ["bf16", "packed"])
@pytest.mark.parametrize("weights", ["golden", "fp8"])
def test_engine_assembled_stack_equals_the_reference(weights, kv_format):
    """40 steps: the window wraps (W = 8), ratio-2 groups complete on alternate steps, the
    candidate mask bites (L > cand_blocks · cand_block = 8) and reindex layers apply it."""
    cfg, w = _setup(weights)
    eng = paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format=kv_format, block_rows=4)
    refs = [RefStack(cfg, w) for _ in range(3)]
    for step, (seqs, pos, xs) in enumerate(_schedule(cfg, 40)):
        got = eng.step(xs, seqs, pos)
        for t, (s, p) in enumerate(zip(seqs, pos)):
            exp = refs[s].step([x[t : t + 1] for x in xs], p)
            for i in range(cfg.n_layers):
                for n in ("o", "out"):
                    a, b = got[i][n][t : t + 1], getattr(exp[i], n)
                    where = f"step {step}, sequence {s} at {p}, layer {i} ({cfg.roles[i].name}): {n}"
                    assert torch.equal(a.view(torch.int16), b.view(torch.int16)), where


def test_packed_pools_hold_the_bf16_pools_values():
    """After the same steps, every pool row the two engines wrote holds the same values."""
    cfg, w = _setup("golden")
    a = paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format="bf16")
    b = paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format="packed")
    for seqs, pos, xs in _schedule(cfg, 20):
        a.step(xs, seqs, pos)
        b.step(xs, seqs, pos)
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
    """CUDA: packed pools give the bf16 pools' bits (o, out); the outputs within the bf16
    tolerance of the CPU engine's (the kernels sum in other orders)."""
    from attnv41.testing import compare_bf16

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (run on the device machine)")
    cfg, w = _setup("fp8")
    cpu = paged_engine.PagedV41(cfg, w, n_seqs=3)
    gpus = [paged_engine.PagedV41(cfg, w, n_seqs=3, kv_format=f, device="cuda") for f in ("bf16", "packed")]
    for step, (seqs, pos, xs) in enumerate(_schedule(cfg, 30)):
        exp = cpu.step(xs, seqs, pos)
        bf, pk = (g.step([x.cuda() for x in xs], seqs, pos) for g in gpus)
        for i in range(cfg.n_layers):
            for n in ("o", "out"):
                where = f"step {step}, layer {i}: {n}"
                assert torch.equal(bf[i][n].view(torch.int16), pk[i][n].view(torch.int16)), f"{where}, packed"
                c = compare_bf16(where, bf[i][n].cpu(), exp[i][n])
                assert c.ok, c
