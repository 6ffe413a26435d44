"""attnv41.stages: the stage-wise strict check of the runtime's `o` and `out` against the
reference run on the runtime's own inputs (on the CPU: the Triton kernels under the
interpreter, and the torch twins)."""

import dataclasses

import pytest
import torch

from attnv41.reference.layer import RefStack
from attnv41.runtime import RuntimeStack
from attnv41.stages import StageChecker, output_projection
from helpers import random_inputs, random_weights, small_cfg


def _cfg():
    return small_cfg(window=8, index_topk=6, max_seq=32, max_tokens=32)


def test_output_projection_is_the_reference_layers():
    """The stage's projection reproduces `reference/layer.py` §8 bit for bit from its o."""
    cfg = _cfg()
    w = random_weights(cfg, 3)
    xs = random_inputs(cfg, 12, 4)
    ref = RefStack(cfg, w)
    chk = StageChecker(cfg)
    for p, m in ((0, 10), (10, 1), (11, 1)):
        for i in range(cfg.n_layers):
            tr = ref.layer(i, xs[i][p : p + m], p)
            cos, sin = chk.tables.for_ratio(cfg.roles[i].ratio)
            got = output_projection(cfg, w[i], tr.o, cos, sin, torch.arange(p, p + m))
            n_diff = int((got.view(torch.int16) != tr.out.view(torch.int16)).sum())
            assert n_diff == 0, f"pos {p} L{i} out: {n_diff} elements differ from the reference layer"


def _run_stack(cfg, ops, n=9, steps=3, seed=11):
    """Every layer call of a prefill and `steps` decode steps, stage-checked as it runs."""
    w = random_weights(cfg, seed)
    xs = random_inputs(cfg, n + steps, seed + 1)
    rt = RuntimeStack(cfg, w, ops=ops)
    chk = StageChecker(cfg)
    for p, m in [(0, n)] + [(n + s, 1) for s in range(steps)]:
        for i in range(cfg.n_layers):
            run = rt.layer(i, xs[i][p : p + m], p)
            chk.check(i, rt.weights[i], run, p)
    return rt, chk


@pytest.mark.parametrize("ops", ["triton", "torch"])
def test_runtime_passes_stage_checks(ops):
    cfg = _cfg()
    n, steps = 9, 3
    _, chk = _run_stack(cfg, ops, n, steps)
    t = chk.tally
    assert t.ok, "\n".join(t.failures)
    calls = cfg.n_layers * (1 + steps)
    assert t.calls == calls
    per_token = {"o": cfg.n_heads * cfg.head_dim, "out": cfg.dim}
    for stage, k in per_token.items():
        assert t.values[stage] == cfg.n_layers * (n + steps) * k, f"{stage}: {t.values[stage]} values compared"
        assert t.excused[stage] == 0, f"{stage}: {t.excused[stage]} values excused"
    if ops == "torch":  # the CPU twins are the reference's own rounding: bit for bit
        assert t.worst == {"o": 0.0, "out": 0.0}, t.worst
    assert t.summary()["compared"] == t.values


@pytest.fixture(scope="module")
def one_run():
    """A runtime decode call of a ratio>0 layer (window and compressed rows both read),
    on the Triton kernels under the interpreter, cloned out of the workspaces."""
    cfg = _cfg()
    w = random_weights(cfg, 21)
    xs = random_inputs(cfg, 14, 22)
    rt = RuntimeStack(cfg, w, ops="triton")
    rt.step([x[:13] for x in xs], 0)
    layer = 4
    for i in range(layer):
        rt.layer(i, xs[i][13:14], 13)
    run = rt.layer(layer, xs[layer][13:14], 13)
    assert run.n_comp > 0 and (run.idx >= run.offset).any(), "the example must read compressed rows"
    clone = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    clone = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in clone.items()}
    return cfg, rt.weights[layer], layer, dataclasses.replace(run, **clone)


def _plant(t, frac):
    """A copy of t with one element moved by `frac`·max|t| (+ 0.01)."""
    bad = t.clone()
    flat = bad.view(-1)
    j = flat.numel() // 2 + 1
    flat[j] = (flat[j].float() + frac * t.float().abs().max() + 0.01).to(t.dtype)
    return bad


def test_clean_run_passes(one_run):
    cfg, w, layer, run = one_run
    cmps = StageChecker(cfg).check(layer, w, run, 13)
    assert [c.name for c in cmps] == ["o", "out"] and all(c.ok for c in cmps), [str(c) for c in cmps]


@pytest.mark.parametrize(
    "field, frac, fails",
    [
        pytest.param("o", 0.05, {"o", "out"}, id="o-off-5pct"),  # out is judged on our (wrong) o: it moves too
        pytest.param("o", 0.02, {"o"}, id="o-off-2pct"),  # just past 2^-7: o fails
        pytest.param("out", 0.05, {"out"}, id="out-off-5pct"),
        pytest.param("o", float("nan"), {"o", "out"}, id="o-nan"),
    ],
)
def test_planted_error_fails(one_run, field, frac, fails):
    cfg, w, layer, run = one_run
    bad = dataclasses.replace(run, **{field: _plant(getattr(run, field), frac)})
    chk = StageChecker(cfg)
    cmps = {c.name: c for c in chk.check(layer, w, bad, 13)}
    failed = {n for n, c in cmps.items() if not c.ok}
    assert fails <= failed, {n: str(c) for n, c in cmps.items()}
    assert field in failed and not chk.tally.ok and chk.tally.failures
