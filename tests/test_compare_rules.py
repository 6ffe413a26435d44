"""The element comparisons of `attnv41.testing` pinned against the golden README's numbers.

Each rule is exercised on both sides of its bound: an error planted at 0.9x what the
README allows passes, at 1.5x it fails; a NaN on either side never passes. The bounds are
written out here from the README ("How to compare"), not read from `testing`, so that a
changed constant or a dropped check in the module turns a test red."""

import math

import pytest
import torch

from attnv41.testing import compare_bf16, compare_exact, compare_quantized, compare_selection

README_REL = 2.0**-7  # |got − ref| ≤ max|ref|·2^−7 + 1e−4
README_ABS = 1e-4

SHAPES = {"row": (1, 64), "matrix": (7, 48), "heads": (5, 3, 32)}


def _ref(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _tol(ref):
    return ref.double().abs().max().item() * README_REL + README_ABS


def _plant(ref, factor, seed, n=1):
    """`ref` in fp64 with `n` random elements moved by `factor` x the README tolerance."""
    g = torch.Generator().manual_seed(seed + 1)
    got = ref.double().clone()
    flat = got.view(-1)
    idx = torch.randperm(flat.numel(), generator=g)[:n]
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    flat[idx] += sign * factor * _tol(ref)
    return got


def _with_nan(t, seed):
    t = t.double().clone()
    g = torch.Generator().manual_seed(seed + 2)
    t.view(-1)[torch.randint(t.numel(), (1,), generator=g)] = float("nan")
    return t


# ---------------------------------------------------------------- compare_bf16


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("factor, ok", [(0.9, True), (1.5, False)], ids=["0.9x_passes", "1.5x_fails"])
def test_bf16_tolerance(shape, factor, ok):
    seed = int(torch.randint(1 << 30, ()))
    ref = _ref(shape, seed)
    c = compare_bf16("t", _plant(ref, factor, seed), ref)
    assert c.ok is ok, (c, seed)
    assert c.name == "t"
    assert c.ratio == pytest.approx(factor, rel=1e-6), (c, seed)


@pytest.mark.parametrize("side", ["ours", "reference"])
def test_bf16_nan_fails(side):
    seed = int(torch.randint(1 << 30, ()))
    ref = _ref((6, 40), seed)
    got = ref.double()
    if side == "ours":
        got = _with_nan(got, seed)
    else:
        ref = _with_nan(ref, seed)
    c = compare_bf16("t", got, ref)
    assert not c.ok and "NaN" in c.detail, c


@pytest.mark.parametrize("factor, ok", [(0.9, True), (1.5, False)], ids=["0.9x_passes", "1.5x_fails"])
def test_bf16_allowance_is_per_entry(factor, ok):
    """An entry over the tolerance passes only within its own allowance (tol + bound)."""
    seed = int(torch.randint(1 << 30, ()))
    ref = _ref((4, 30), seed)
    tol = _tol(ref)
    allowance = torch.zeros(4, 30, dtype=torch.float64)
    allowance[2, 7] = 3 * tol
    got = ref.double().clone()
    got[2, 7] += factor * 4 * tol  # the allowed error there is tol + 3·tol
    c = compare_bf16("t", got, ref, allowance=allowance)
    assert c.ok is ok, c
    assert c.excused == (1 if ok else 0) and c.rows == ([2] if ok else [])
    # the same error where no allowance was computed fails at any factor above 1
    got2 = ref.double().clone()
    got2[1, 7] += 1.5 * tol
    assert not compare_bf16("t", got2, ref, allowance=allowance).ok


# ---------------------------------------------------------------- compare_quantized


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
@pytest.mark.parametrize("factor, ok", [(0.9, True), (1.5, False)], ids=["0.9x_passes", "1.5x_fails"])
def test_quantized_tolerance(fmt, factor, ok):
    """Errors within the tolerance pass everywhere; over it, only isolated elements (at most
    1% of them, and at least 2) may be excused as one quantization step: planted on 10% of
    the elements, 1.5x fails."""
    seed = int(torch.randint(1 << 30, ()))
    ref = _ref((8, 64), seed)
    got = _plant(ref, factor, seed, n=ref.numel() // 10)
    c = compare_quantized("t", got, ref, fmt)
    assert c.ok is ok, (c, seed)


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
@pytest.mark.parametrize("steps, ok", [(1.0, True), (1.5, False)], ids=["one_step_passes", "1.5_steps_fails"])
def test_quantized_one_step(fmt, steps, ok):
    """One element one quantization step away passes (README: isolated elements may cross a
    rounding boundary); 1.5 steps fails. Steps: e4m3 2^(floor(log2|v|)−2) (counted
    generously), e2m1 the element's own magnitude (neighbouring codes)."""
    ref = torch.full((4, 32), 0.5, dtype=torch.bfloat16)
    v = 3.0
    ref[1, 3] = v
    step = 2.0 ** (math.floor(math.log2(v)) - 2) if fmt == "fp8" else v
    got = ref.double().clone()
    got[1, 3] = v - steps * step  # fp4, 1.5 steps: −v/2, farther from v than either magnitude
    c = compare_quantized("t", got, ref, fmt)
    assert c.ok is ok, c


@pytest.mark.parametrize("side", ["ours", "reference"])
@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_quantized_nan_fails(fmt, side):
    seed = int(torch.randint(1 << 30, ()))
    ref = _ref((3, 64), seed)
    got = ref.double()
    if side == "ours":
        got = _with_nan(got, seed)
    else:
        ref = _with_nan(ref, seed)
    c = compare_quantized("t", got, ref, fmt)
    assert not c.ok and "NaN" in c.detail, c


# ---------------------------------------------------------------- compare_exact


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool], ids=["int32", "uint8", "bool"])
def test_exact(dtype):
    seed = int(torch.randint(1 << 30, ()))
    g = torch.Generator().manual_seed(seed)
    ref = torch.randint(0, 2, (5, 9), generator=g).to(dtype)
    assert compare_exact("t", ref.clone(), ref).ok
    bad = ref.clone()
    bad[3, 4] = 1 - int(bad[3, 4]) if dtype != torch.bool else ~bad[3, 4]
    c = compare_exact("t", bad, ref)
    assert not c.ok and "1 entries differ" in c.detail, c


@pytest.mark.parametrize("side", ["ours", "reference"])
def test_exact_nan_fails(side):
    ref = torch.arange(12, dtype=torch.float32).view(3, 4)
    got = ref.clone()
    if side == "ours":
        got[1, 1] = float("nan")
    else:
        ref = ref.clone()
        ref[1, 1] = float("nan")
    c = compare_exact("t", got, ref)
    assert not c.ok and "NaN" in c.detail, c


# ---------------------------------------------------------------- compare_selection


def _selection_case(seed):
    """One decode row: window part of 4 slots, k = 3 of 8 positions, offset 4. Scores
    strictly decreasing from position 0, so the golden top-3 is {0, 1, 2}."""
    W, k, L = 4, 3, 8
    scores = torch.linspace(2.0, 1.0, L, dtype=torch.float64)[None, :]
    g = torch.Generator().manual_seed(seed)
    scores = scores + torch.rand(1, L, generator=g, dtype=torch.float64) * 1e-3
    scores = torch.sort(scores, descending=True).values
    win = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    ref = torch.cat([win, torch.tensor([[0, 1, 2]], dtype=torch.int32) + W], 1)
    return W, k, L, scores, ref


@pytest.mark.parametrize("factor, ok", [(0.9, True), (1.5, False)], ids=["0.9x_passes", "1.5x_fails"])
def test_selection_swap_slack(factor, ok):
    """A non-tie row may swap the k-th position for one whose golden score lies within the
    row's score error (at least one bf16 ulp of the k-th value) of it."""
    seed = int(torch.randint(1 << 30, ()))
    W, k, L, scores, ref = _selection_case(seed)
    kth = scores[0, k - 1].item()
    ulp = 2.0 ** (math.floor(math.log2(kth)) - 7)
    scores[0, k] = kth - factor * ulp  # the runner-up, factor ulps below the k-th
    got = torch.cat([ref[:, :W], torch.tensor([[0, 1, 3]], dtype=torch.int32) + W], 1)
    vis = torch.tensor([L])
    # without our scores the slack is one ulp of the k-th value
    c = compare_selection("sel", got, ref, W, W, None, scores, None, vis, k)
    assert c.ok is ok, (c, seed)
    assert compare_selection("sel", ref.clone(), ref, W, W, None, scores, None, vis, k).ok


@pytest.mark.parametrize("which", ["ours", "reference"])
def test_selection_nan_scores_fail(which):
    seed = int(torch.randint(1 << 30, ()))
    W, k, L, scores, ref = _selection_case(seed)
    ours = scores.clone()
    (ours if which == "ours" else scores)[0, 5] = float("nan")
    vis = torch.tensor([L])
    c = compare_selection("sel", ref.clone(), ref, W, W, None, scores, ours, vis, k)
    assert not c.ok and "NaN" in c.detail, c


@pytest.mark.parametrize("side", ["ours", "reference"])
def test_selection_nan_entries_fail(side):
    seed = int(torch.randint(1 << 30, ()))
    W, k, L, scores, ref = _selection_case(seed)
    got, ref = ref.double(), ref.double()
    (got if side == "ours" else ref)[0, 5] = float("nan")
    c = compare_selection("sel", got, ref, W, W, None, scores, scores, torch.tensor([L]), k)
    assert not c.ok and "NaN" in c.detail, c


def test_selection_tie_without_golden_scores_uses_ours():
    """A file with `sel_tie` but no `index_score`: a flagged row is judged against our own
    scores (and says so); an unflagged row that differs still fails."""
    W, k, L, scores, ref = _selection_case(3)
    ours = scores.clone()
    ours[0, k] = ours[0, k - 1]  # an exact tie at the k-th value in our scores
    got = torch.cat([ref[:, :W], torch.tensor([[0, 1, 3]], dtype=torch.int32) + W], 1)
    vis = torch.tensor([L])
    tie = torch.ones(1, dtype=torch.uint8)
    c = compare_selection("sel", got, ref, W, W, tie, None, ours, vis, k)
    assert c.ok and c.excused == 1 and "our own scores" in c.detail, c
    # not a valid top-k of our scores: fails
    bad = torch.cat([ref[:, :W], torch.tensor([[0, 1, 5]], dtype=torch.int32) + W], 1)
    assert not compare_selection("sel", bad, ref, W, W, tie, None, ours, vis, k).ok
    # unflagged row: no scores to judge a swap, fails
    c = compare_selection("sel", got, ref, W, W, torch.zeros(1, dtype=torch.uint8), None, ours, vis, k)
    assert not c.ok, c
