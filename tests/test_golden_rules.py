"""The golden comparison rules accept an implementation whose GEMMs round differently
(as cuBLAS does against the fp64 reference) and still catch wrong math.

The index path is where one-ulp GEMM differences become large: fp4 quantization of the
index queries and keys turns them into whole quantization steps. Here the CPU runtime's
index-path projections are jittered by one bf16 ulp on 3% of their outputs."""

import dataclasses

import torch

from attnv41.golden import GoldenFile, replay
from attnv41.kernels import linear
from attnv41.runtime.ops import TORCH_OPS
from attnv41.runtime.stack import RuntimeStack
from helpers import golden_path


def _jittered_impl(frac: float, shapes: set[tuple[int, int]]):
    gen = torch.Generator().manual_seed(0)

    def mm(x, w, out):
        linear.mm_exact(x, w, out)
        if out.dtype == torch.bfloat16 and tuple(w.shape) in shapes:
            flip = torch.rand(out.shape, generator=gen) < frac
            step = torch.where(torch.rand(out.shape, generator=gen) < 0.5, 1, -1).to(torch.int16)
            bits = out.view(torch.int16)
            bits[flip] += step[flip]
        return out

    ops = dataclasses.replace(TORCH_OPS, name="jittered", mm=mm)
    return lambda cfg, w, ik, dev: RuntimeStack(cfg, w, device=dev, index_keys=ik, ops=ops)


def _index_shapes(cfg):
    return {
        (cfg.index_heads * cfg.index_head_dim, cfg.q_rank),  # indexer.wq_b
        (cfg.index_head_dim, cfg.head_dim),  # indexer.wk
        (cfg.index_heads, cfg.dim),  # indexer.weights_proj
    }


def test_ulp_jitter_in_the_index_path_passes():
    g = GoldenFile(golden_path("headdim"))
    rep = replay(g, "released", _jittered_impl(0.03, _index_shapes(g.cfg)), impl_name="jittered")
    assert rep.ok, "\n".join(rep.failures())
    # the jitter did reach the scores: some rows were judged by our own scores
    assert any(c.name == "index_score" and c.excused for lr in rep.layers for c in lr.cmps)


def test_wrong_head_weight_scale_still_fails():
    """Doubling the index head weights (a plausible bug) changes scores by far more than
    the fp4-step allowance."""
    g = GoldenFile(golden_path("headdim"))

    def mm(x, w, out):
        linear.mm_exact(x, w, out)
        if tuple(w.shape) == (g.cfg.index_heads, g.cfg.dim):
            out.mul_(4)
        return out

    ops = dataclasses.replace(TORCH_OPS, name="broken", mm=mm)
    rep = replay(g, "released", lambda cfg, w, ik, dev: RuntimeStack(cfg, w, device=dev, index_keys=ik, ops=ops))
    assert not rep.ok
    assert any("index_score" in f for f in rep.failures())
