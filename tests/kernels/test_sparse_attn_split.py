"""kernels.sparse_attn_split (the decode regime's block-split attention) against its twin,
the reference order `reference.sparse_attn.sparse_attn`, and against the fused kernel, on
CUDA when present, else on the interpreter.

Tolerance: the split keeps the reference's order (64-entry blocks, bf16 probabilities
against the running max, the recurrence, the sink last), so it differs only by fp32
summation order and tl.exp, which can move the bf16 output across one rounding boundary:
|diff| ≤ 2^-8·max|ref| + 1e-6, as tests/kernels/test_sparse_attn.py argues for the fused
kernel.
"""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels.sparse_attn import BLOCK_K, sparse_attn
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, _counters, sparse_attn_split, sparse_attn_split_torch
from helpers import interp_subset
from kernels.test_sparse_attn import BAD, _assert_close, _inputs, _reference, _valid


def _bits(x):
    return x.view(torch.int16)


def _tokens(device, m: int) -> int:
    """The token count m of a test's `_inputs`; on the interpreter at most 3: its all-absent
    token, its one-entry token and a random one (the tokens past it, each a row of
    programs, run through the random one's steps)."""
    return m if device == "cuda" else min(m, 3)


CASES = [
    # id, m, H, D, K, Nw, offset, Nc
    pytest.param(1, 2, 32, 1, 6, 6, 9, id="m1-H2-D32-K1"),
    pytest.param(7, 4, 64, 13, 10, 7, 20, id="m7-H4-D64-K13"),
    pytest.param(3, 2, 32, 200, 16, 16, 90, id="m3-H2-D32-K200-4splits"),
    pytest.param(5, 4, 256, 130, 24, 20, 90, id="m5-H4-D256-K130-2slices"),
    pytest.param(3, 4, 48, 70, 40, 33, 0, id="m3-H4-D48-K70-Nc0"),
    pytest.param(3, 2, 64, 70, 5, 0, 50, id="m3-H2-D64-comp-only"),
]


@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", CASES)
def test_matches_split_twin(device, m, H, D, K, Nw, offset, Nc):
    m = _tokens(device, m)
    q, win, comp, sel, sink = _inputs(m * 1000 + K + D, m, H, D, K, Nw, offset, Nc, device)
    scale = D**-0.5
    out = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split(q, win, comp, sel, offset, sink, scale, out=out)
    assert got is out, "sparse_attn_split(out=...) must return out itself"
    _assert_close("o (kernel vs reference order)", got, _reference(q, win, comp, sel, offset, sink, scale))
    _assert_close("o (kernel vs fused kernel)", got, sparse_attn(q, win, comp, sel, offset, sink, scale))
    if m > 2:
        assert torch.equal(got[0], torch.zeros_like(got[0])), "o[0] (all −1): not exactly 0"


def test_token_bits_independent_of_m(device):
    """A token's bytes do not depend on the other tokens of the call (m = 1, 2, 7)."""
    q, win, comp, sel, sink = _inputs(41, 7, 4, 64, 200, 16, 12, 80, device)
    full = sparse_attn_split(q, win, comp, sel, 12, sink, 0.125)
    for m in (1, 2):
        for t0 in range(0, 7 - m + 1, 3):
            part = sparse_attn_split(q[t0 : t0 + m], win, comp, sel[t0 : t0 + m], 12, sink, 0.125)
            n = int((_bits(part) != _bits(full[t0 : t0 + m])).sum())
            assert n == 0, f"o: tokens {t0}..{t0 + m - 1} changed {n} elements at m = {m} vs m = 7"


@pytest.mark.parametrize("extra", [BLOCK_K, 3 * BLOCK_K + 5], ids=["+64", "+197"])
def test_minus_one_padding_keeps_bits(device, extra):
    m = _tokens(device, 5)
    q, win, comp, sel, sink = _inputs(9, m, 2, 32, 130, 10, 8, 70, device)
    got = sparse_attn_split(q, win, comp, sel, 8, sink, 0.2)
    pad = torch.full((m, extra), -1, dtype=torch.int32, device=device)
    got_pad = sparse_attn_split(q, win, comp, torch.cat([sel, pad], 1), 8, sink, 0.2)
    n = int((_bits(got) != _bits(got_pad)).sum())
    assert n == 0, f"o: {n} elements changed when sel gained {extra} −1 entries"


@pytest.mark.parametrize("sink_value", [30.0, -30.0], ids=["sink+30", "sink-30"])
def test_all_absent_and_sink_extremes(device, sink_value):
    m, H, D, K = _tokens(device, 5), 4, 32, 140
    q, win, comp, sel, sink = _inputs(3, m, H, D, K, 6, 6, 10, device, sink_value=sink_value)
    sink[::2] = -sink_value
    got = sparse_attn_split(q, win, comp, sel, 6, sink, D**-0.5)
    _assert_close("o (sink extremes)", got, _reference(q, win, comp, sel, 6, sink, D**-0.5))
    sel.fill_(-1)
    sel[:, ::3] = -7
    z = sparse_attn_split(q, win, comp, sel, 6, sink, D**-0.5)
    assert torch.equal(z, torch.zeros_like(z)), f"o: all absent, max |o| {z.float().abs().max().item():.3g}"


def test_many_heads_blocks(device):
    """H > 64: the heads are cut into blocks of 64 (one program per block and split)."""
    q, win, comp, sel, sink = _inputs(5, 2, 80, 16, 70, 8, 8, 30, device)
    got = sparse_attn_split(q, win, comp, sel, 8, sink, 0.25)
    _assert_close("o (H = 80)", got, _reference(q, win, comp, sel, 8, sink, 0.25))


def test_strided_operands(device):
    m, H, D, K, Nw, offset, Nc = 3, 4, 32, 70, 12, 10, 40
    q, win, comp, sel, sink = _inputs(5, m, H, D, K, Nw, offset, Nc, device)
    want = sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)
    win_w = torch.cat([win, win], 1)[:, :D]
    comp_w = torch.cat([comp, comp], 1)[:, D:]
    sel_w = torch.cat([sel, sel], 1)[:, :K]
    buf = torch.full((m, H, 2 * D), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split(q_t, win_w, comp_w, sel_w, offset, sink, D**-0.5, out=buf[:, :, :D])
    assert torch.equal(_bits(got), _bits(want)), "o: strided operands changed the result"
    assert torch.isnan(buf[:, :, D:].float()).all(), "out: wrote outside its view"


def test_torch_twin(device):
    q, win, comp, sel, sink = _inputs(23, 3, 2, 32, 130, 9, 9, 40, device)
    out = torch.full((3, 2, 32), float("nan"), dtype=torch.bfloat16, device=device)
    got = sparse_attn_split_torch(q, win, comp, sel, 9, sink, 0.3, out=out)
    assert got is out
    assert torch.equal(got, _reference(q, win, comp, sel, 9, sink, 0.3)), "twin differs from the reference"


@pytest.mark.parametrize("arg, bad, match", BAD)
def test_validation(device, arg, bad, match):
    args = _valid(device)
    args[arg] = bad(args)
    with pytest.raises(ValueError, match=match):
        sparse_attn_split(**args)


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param(dict(dk=16, bh=16), id="dk16-bh16"),
        pytest.param(dict(comb_h=32, comb_d=16, stages_b=1), id="combine-32x16"),
        pytest.param(dict(comb_h=32, comb_d=16, combine="blocks", warps_pv=8), id="blocks-32x16"),
        pytest.param(dict(combine="loop"), id="loop"),
        pytest.param(BATCH_TUNE, id="batch-runtime"),
        pytest.param(dict(keys_m=True), id="keys-m"),
        pytest.param(dict(BATCH_TUNE, keys_m=True), id="batch-keys-m"),
        pytest.param(dict(keys_m=True, bh=16, dk=32), id="keys-m-bh16-dk32"),
        pytest.param(dict(rsplit=4), id="rsplit4"),
        pytest.param(dict(BATCH_TUNE, warps_b=4), id="batch-combine-4-warps"),
        pytest.param(dict(rsplit=2, combine="loop", keys_m=True), id="rsplit2-loop-keys-m"),
        pytest.param(dict(combine="blocks", early_rows=False), id="blocks-without-early-rows"),
        pytest.param(dict(combine="blocks", counter_release=True), id="blocks-counter-release"),
    ],
)
def test_tuning_variants(device, tune):
    """The tuning script's alternatives (tile shapes only) keep the reference order."""
    m, H, D, K = 3, 20, 64, 200
    if device != "cuda":  # the interpreter: three blocks, the last ragged, as 200's four
        K = 130
    q, win, comp, sel, sink = _inputs(77, m, H, D, K, 16, 12, 90, device)
    got = sparse_attn_split(q, win, comp, sel, 12, sink, 0.125, **tune)
    _assert_close(f"o ({tune})", got, _reference(q, win, comp, sel, 12, sink, 0.125))


@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", CASES)
@pytest.mark.parametrize("rsplit", interp_subset([2, 4], [4]))  # (interpreter: the ends of 1, 2, 4; 1 in every case)
def test_row_split_logits_give_the_same_bytes(device, m, H, D, K, Nw, offset, Nc, rsplit):
    """The logits kernel over sub-blocks of 64 / rsplit rows (`rsplit`): each logit the same
    row's dot, each block's max the max of its sub-blocks' maxima, so the same bytes as one
    program per block, through both combines (and under the interpreter: its fp64 dots)."""
    m = _tokens(device, m)
    q, win, comp, sel, sink = _inputs(m * 31 + K, m, H, D, K, Nw, offset, Nc, device)
    for combine in ("loop", "blocks"):
        a = sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5, combine=combine)
        b = sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5, combine=combine, rsplit=rsplit)
        n = int((_bits(a) != _bits(b)).sum())
        assert n == 0, f"o ({combine}): {n} of {a.numel()} elements differ with rsplit = {rsplit}"
    assert int(_counters.buffer(torch.device(device)).abs().sum()) == 0, "counters left set"


@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", CASES)
def test_block_combine_equals_loop_combine(device, m, H, D, K, Nw, offset, Nc):
    """The combines (block-parallel and sequential) give the same bytes: Σp as the same
    tree, the same dot tile; the wrapper may pick either by m. With the rope epilogue."""
    m = _tokens(device, m)
    q, win, comp, sel, sink = _inputs(m * 77 + K, m, H, D, K, Nw, offset, Nc, device)
    gen = torch.Generator().manual_seed(K)
    ang = torch.rand(40, 8, generator=gen) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, 40, (m,), generator=gen, dtype=torch.int32).to(device)
    got = {}
    for combine in ("loop", "blocks"):
        o_rot = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
        o = sparse_attn_split(q, win, comp, sel, offset, sink, D**-0.5, rot=(cos, sin, pos, o_rot), combine=combine)
        got[combine] = (o, o_rot)
    for i, name in enumerate(("o", "o_rot")):
        a, b = got["loop"][i], got["blocks"][i]
        n = int((_bits(a) != _bits(b)).sum())
        assert n == 0, f"{name}: {n} of {a.numel()} elements differ between the loop and block combines"
    assert int(_counters.buffer(torch.device(device)).abs().sum()) == 0, "counters left set"


@pytest.mark.parametrize(
    "tune, match",
    [
        (dict(combine="tree"), r"combine = 'tree'; allowed: 'auto', 'blocks', 'loop'"),
        (dict(warps_c=8), r"tune keys \['warps_c'\]; allowed: .*'warps_b'.*and 'only_logits'"),
        *[(dict(rsplit=bad), rf"rsplit = {bad}; allowed: 1, 2, 4") for bad in (3, 8, 0)],
    ],
    ids=["combine", "unknown-key", "rsplit-3", "rsplit-8", "rsplit-0"],
)
def test_launch_options_are_checked(device, tune, match):
    """A bad launch option raises, naming the value and the allowed ones, before any write."""
    q, win, comp, sel, sink = _inputs(1, 2, 2, 32, 5, 4, 4, 6, device)
    out = torch.full((2, 2, 32), float("nan"), dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match=match):
        sparse_attn_split(q, win, comp, sel, 4, sink, 0.1, out=out, **tune)
    assert torch.isnan(out.float()).all(), "out: written by a call that raised"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core dot's bits on the GPU")
@pytest.mark.parametrize("m", [1, 3, 8], ids=["m1", "m3", "m8"])
def test_block_combine_equals_loop_combine_at_flash_shapes(m):
    """At the Flash shapes (64 heads × 512, 640 entries) on the GPU: the same bytes, and the
    block form's counters back at zero after the call."""
    q, win, comp, sel, sink = _inputs(17 + m, m, 64, 512, 640, 128, 128, 4096, "cuda", absent=0.0)
    a = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, combine="loop")
    b = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, combine="blocks")
    n = int((_bits(a) != _bits(b)).sum())
    assert n == 0, f"o: {n} of {a.numel()} elements differ between the loop and block combines"
    assert int(_counters.buffer(torch.device("cuda")).abs().sum()) == 0, "counters left set"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core dot's bits on the GPU")
@pytest.mark.parametrize(
    "m, tune",
    [(1, {}), (1, dict(bh=16)), (8, {}), (64, BATCH_TUNE)],
    ids=["m1", "m1-bh16", "m8", "m64-batch"],
)
def test_keys_major_logits_give_the_same_bytes_at_flash_shapes(m, tune):
    """The logits as rows · qᵀ (`keys_m`: the rows the MMA's A operand) and as q · rowsᵀ:
    each logit the same products summed over the same chunks of D, so the same bytes at
    the Flash shapes (a launch shape may switch between them without moving a bit)."""
    q, win, comp, sel, sink = _inputs(29 + m, m, 64, 512, 640, 128, 128, 4096, "cuda", absent=0.0)
    a = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, **tune)
    b = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, **{**tune, "keys_m": True})
    n = int((_bits(a) != _bits(b)).sum())
    assert n == 0, f"o: {n} of {a.numel()} elements differ between keys_m and heads-major logits"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the tensor-core dot's bits on the GPU")
@pytest.mark.parametrize(
    "m, tune",
    [(1, {}), (1, dict(bh=16)), (1, dict(keys_m=True)), (8, {}), (64, BATCH_TUNE)],
    ids=["m1", "m1-bh16", "m1-keys-m", "m8", "m64-batch"],
)
@pytest.mark.parametrize("rsplit", [2, 4])
def test_row_split_logits_give_the_same_bytes_at_flash_shapes(m, tune, rsplit):
    """At the Flash shapes on the GPU, `rsplit` (the MMA over 64 / rsplit rows instead of
    64) gives the production bytes: a launch shape may take it without moving a bit."""
    q, win, comp, sel, sink = _inputs(41 + m, m, 64, 512, 640, 128, 128, 4096, "cuda", absent=0.0)
    a = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, **tune)
    b = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, **{**tune, "rsplit": rsplit})
    n = int((_bits(a) != _bits(b)).sum())
    assert n == 0, f"o: {n} of {a.numel()} elements differ with rsplit = {rsplit}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the fused kernel's bits on the GPU")
def test_differs_from_fused_only_in_fp32_order():
    """At the Flash shapes the split and the fused kernel round each block's probabilities
    against the same running max: their outputs differ (fp32 summation order only) in a
    small fraction of elements (6e-5 for an earlier three-kernel form), within one bf16
    rounding. (A split that rounded against per-split maxima moved FP8 `out` rows past the
    golden tolerance.)"""
    q, win, comp, sel, sink = _inputs(5, 4, 64, 512, 640, 128, 128, 4096, "cuda", absent=0.0)
    a = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5)
    b = sparse_attn(q, win, comp, sel, 128, sink, 512**-0.5)
    diff = (a.float() - b.float()).abs()
    frac = float((diff > 0).float().mean())
    tol = 2.0**-8 * b.float().abs().max().item()
    assert frac < 0.01, f"o: {frac:.2%} of elements differ from the fused kernel"
    assert diff.max().item() <= tol, f"o: max diff {diff.max().item():.3g} > {tol:.3g} (one bf16 rounding)"


ROPE_SHAPES = [(1, 4, 64, 8), (3, 20, 128, 32), (2, 2, 32, 16), (1, 2, 48, 16)]  # m, H, D, half
# the interpreter: D 64 with a 32-column tail (half the slices), the lead and the tail still over 2 d16 slices each
if not torch.cuda.is_available():
    ROPE_SHAPES[1] = (3, 20, 64, 16)


@pytest.mark.parametrize(
    "tune",
    [
        pytest.param({}, id="single"),
        pytest.param(BATCH_TUNE, id="batch"),
        pytest.param(dict(comb_d=16, combine="loop"), id="d16-loop"),
        pytest.param(dict(comb_d=16, combine="blocks"), id="d16-blocks"),
    ],
)
@pytest.mark.parametrize("m, H, D, half", ROPE_SHAPES, ids=str)
def test_inverse_rope_epilogue_is_the_rope_op(device, m, H, D, half, tune):
    """`rot=(cos, sin, pos, o_rot)` writes apply_rope(o, inverse=True) bit for bit (the Triton
    op and its torch twin), and o itself unchanged; with column slices narrower than the
    rope tail (d16: the tail over several programs) and wider (batch: 128 columns, D
    shorter than a slice; D = 48 a partial slice)."""
    from attnv41.kernels.rope import apply_rope, apply_rope_torch

    K = 130 if device == "cuda" else 65  # the interpreter: two blocks, the last ragged, as 130's three
    q, win, comp, sel, sink = _inputs(31 + D, m, H, D, K, 16, 12, 60, device)
    gen = torch.Generator().manual_seed(3)
    ang = torch.rand(50, half, generator=gen) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, 50, (m,), generator=gen, dtype=torch.int32).to(device)
    o_rot = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device=device)
    o = sparse_attn_split(q, win, comp, sel, 12, sink, 0.1, rot=(cos, sin, pos, o_rot), **tune)
    plain = sparse_attn_split(q, win, comp, sel, 12, sink, 0.1, **tune)
    assert torch.equal(_bits(o), _bits(plain)), "o: changed by the rope epilogue"
    want = apply_rope(o, cos, sin, pos, inverse=True)
    assert torch.equal(_bits(o_rot), _bits(want)), "o_rot differs from apply_rope(o, inverse=True)"
    assert torch.equal(_bits(want), _bits(apply_rope_torch(o, cos, sin, pos, inverse=True))), "rope twin differs"
    o_rot2 = torch.empty_like(o_rot)
    o2 = sparse_attn_split_torch(q, win, comp, sel, 12, sink, 0.1, rot=(cos, sin, pos, o_rot2))
    assert torch.equal(_bits(o_rot2), _bits(apply_rope_torch(o2, cos, sin, pos, inverse=True))), "twin's o_rot"


def test_rot_validation(device):
    q, win, comp, sel, sink = _inputs(1, 2, 2, 32, 5, 4, 4, 6, device)
    cos = torch.ones(8, 4, device=device)
    pos = torch.zeros(2, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"rot o_rot = .*allowed: bf16 \[2, 2, 32\]"):
        sparse_attn_split(q, win, comp, sel, 4, sink, 0.1, rot=(cos, cos, pos, q[:1]))
    with pytest.raises(ValueError, match=r"rot = list; allowed: None or a tuple"):
        sparse_attn_split(q, win, comp, sel, 4, sink, 0.1, rot=[cos, cos, pos, q])
    with pytest.raises(ValueError, match=r"pos.shape"):
        sparse_attn_split(q, win, comp, sel, 4, sink, 0.1, rot=(cos, cos, pos[:1], torch.empty_like(q)))
    q, win, comp, sel, sink = _inputs(1, 2, 2, 33, 5, 4, 4, 6, device)
    with pytest.raises(ValueError, match=r"rot with q.shape\[2\] \(D\) = 33; allowed: an even D"):
        sparse_attn_split(q, win, comp, sel, 4, sink, 0.1, rot=(cos, cos, pos, torch.empty_like(q)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="programmatic dependent launch on the GPU")
@pytest.mark.parametrize("m", [1, 2], ids=["m1", "m2"])
def test_early_rows_give_the_same_bytes_at_flash_shapes(m):
    """`early_rows` (production: the block combine gathers its rows while the logits kernel
    runs, under PDL): the same loads and arithmetic, so the bytes without it at the Flash shapes, in
    eager calls and in graph replays after the inputs changed (a gather before the wait
    must see the selection and rows written before the call)."""
    q, win, comp, sel, sink = _inputs(53 + m, m, 64, 512, 640, 128, 128, 4096, "cuda", absent=0.0)
    a = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, combine="blocks", early_rows=False)
    b = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, combine="blocks", early_rows=True)
    n = int((_bits(a) != _bits(b)).sum())
    assert n == 0, f"o: {n} of {a.numel()} elements differ with early_rows"
    out = torch.empty_like(a)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, out=out, combine="blocks", early_rows=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        # the inputs rewritten by a kernel right before the attention, as a step's top-k and ring write do
        sel.copy_(sel.flip(-1))
        win.mul_(-1)
        sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, out=out, combine="blocks", early_rows=True)
    for _ in range(3):
        g.replay()
        want = sparse_attn_split(q, win, comp, sel, 128, sink, 512**-0.5, combine="blocks", early_rows=False)
        n = int((_bits(out) != _bits(want)).sum())
        assert n == 0, f"o: {n} of {want.numel()} elements differ in the replay with early_rows"
