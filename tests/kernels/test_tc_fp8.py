"""kernels.tc_fp8 (the FP8 linear with the weight as the register operand, Gluon; not wired
into the runtime) against the exact product and the released FP8 linear, and its batch
invariance.

Gluon does not run under TRITON_INTERPRET: without a GPU these tests check the column
renaming (`rename_cols`) and the argument errors; the offline sm_90 compile is
test_tc_fp8_sass.py; the numerics run on the GPU (quick tier).
"""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import qdq
from attnv41.kernels import tc_fp8 as F
from attnv41.reference.fp8 import dequant_weight, fp8_linear, quant_weight

CUDA = torch.cuda.is_available()
BF = torch.bfloat16


def _weight(g, N, K):
    w, sc = quant_weight(torch.randn(N, K, generator=g) * 0.05)
    return w, sc.view(torch.uint8)


# ---------------------------------------------------------------- without a GPU


def test_rename_cols_puts_each_physical_column_at_its_logical_place():
    """Logical column 16s + 8h + 2q + p of each 128-column chunk holds physical column
    32q + 4s + 2h + p (the module doc): thread q's 32 contiguous bytes are its operand
    columns, and one FP8 scale block."""
    K = 384
    x = torch.arange(K, dtype=torch.float64).repeat(2, 1)
    r = F.rename_cols(x)
    for c in range(K // 128):
        for s in range(8):
            for h in range(2):
                for q in range(4):
                    for p in range(2):
                        logical = c * 128 + 16 * s + 8 * h + 2 * q + p
                        assert r[1, logical] == c * 128 + 32 * q + 4 * s + 2 * h + p
    # a permutation within each chunk: the same product with the weight renamed alike
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, K, generator=g, dtype=torch.float64), torch.randn(5, K, generator=g, dtype=torch.float64)
    assert torch.allclose(F.rename_cols(a) @ F.rename_cols(b).t(), a @ b.t(), rtol=1e-12, atol=1e-12)
    # each thread's logical columns (lane q, all s, h, p) are one 32-column scale block
    for q in range(4):
        cols = sorted(int(r[0, 16 * s + 8 * h + 2 * q + p]) for s in range(8) for h in range(2) for p in range(2))
        assert cols == list(range(32 * q, 32 * q + 32))


def test_argument_errors_name_the_value():
    g = torch.Generator().manual_seed(1)
    w, sc = _weight(g, 64, 256)
    x = torch.zeros(2, 256, dtype=BF)
    out = torch.zeros(2, 64, dtype=BF)
    with pytest.raises(ValueError, match="tune keys"):
        F.tc_fp8(x, w, sc, out, warps=8)
    with pytest.raises(ValueError, match="stages"):
        F.tc_fp8(x, w, sc, out, stages=7)
    with pytest.raises(ValueError, match="xm"):
        F.tc_fp8(x, w, sc, out, xm=3)
    with pytest.raises(ValueError, match="xr"):
        F.tc_fp8(x, w, sc, out, xr=12)
    with pytest.raises(ValueError, match="ws 0, 1 or 2"):
        F.tc_fp8(x, w, sc, out, ws=2, stages=3)
    with pytest.raises(ValueError, match="maxnreg"):
        F.tc_fp8(x, w, sc, out, maxnreg=100)
    with pytest.raises(ValueError, match="bt 0, 8, 16, 32 or 64"):
        F.tc_fp8(x, w, sc, out, bt=12)
    with pytest.raises(ValueError, match=r"progs 1 … 4096, minseg 1 … 64"):
        F.tc_fp8(x, w, sc, out, minseg=0)
    with pytest.raises(ValueError, match=r"segs = 3; allowed: 0 \(tc_mm.plan\) or a divisor of K / 128 = 2"):
        F.tc_fp8(x, w, sc, out, segs=3)
    with pytest.raises(ValueError, match=r"tune values \{'stages': 4.0\}; allowed: ints"):
        F.tc_fp8(x, w, sc, out, stages=4.0)
    with pytest.raises(ValueError, match=r"tune values \{'segs': True\}; allowed: ints"):
        F.tc_fp8(x, w, sc, out, segs=True)
    # a weight view starting 4 bytes in (contiguous, so tc_mm takes it): its copies are 16-byte
    wide = torch.zeros(64 * 256 + 4, dtype=torch.uint8)
    wide[4:] = w.view(torch.uint8).flatten()
    w4 = wide[4:].view(torch.float8_e4m3fn).view(64, 256)
    with pytest.raises(ValueError, match=r"weight 0: data_ptr\(\) % 16 = 4, its scale's % 4 = 0; allowed: 0 and 0"):
        F.tc_fp8(x, w4, sc, out)
    w160, sc160 = _weight(g, 64, 160)
    with pytest.raises(ValueError, match=r"\(K\) = 160; allowed: a multiple of 128"):
        F.tc_fp8(torch.zeros(2, 160, dtype=BF), w160, sc160, out)
    with pytest.raises(ValueError, match="out.shape"):
        F.tc_fp8(x, w, sc, torch.zeros(3, 64, dtype=BF))
    with pytest.raises(ValueError, match="scale"):
        F.tc_fp8(x, w, sc[:1], out)
    if not CUDA:  # valid arguments on the CPU: a clear error, not a launch
        with pytest.raises(RuntimeError, match="tc_fp8"):
            F.tc_fp8(x, w, sc, out)


# ---------------------------------------------------------------- on the GPU

SHAPES = [(64, 256), (96, 384), (1280, 5120), (5120, 8192), (4096, 1280)]
# The warp-specialized forms have not run on a GPU yet (a wrong barrier phase or register request
# would hang, not fail): full tier only, and `scripts/dev_tc_fp8.sh probe` (under a time
# limit), until a run has passed.
_WS = [pytest.mark.gpu_full]
TUNES = [
    pytest.param(t, id="-".join(f"{k}{v}" for k, v in t.items()) or "default", marks=_WS if t.get("ws") else [])
    for t in (
        {},
        {"stages": 3},
        {"xm": 1},
        {"xr": 64},
        {"bt": 8},  # fewer token rows per tile: the same bits (bt 0 may then pick it by m)
        {"bt": 0},
        {"bt": 16, "xr": 64},
        {"bt": 8, "xm": 1},
        {"ws": 1, "stages": 3, "maxnreg": 128},
        {"ws": 2},
        {"ws": 1, "bt": 8, "stages": 4, "maxnreg": 128},
    )
]


@pytest.mark.gpu
@pytest.mark.parametrize("tune", TUNES)
@pytest.mark.parametrize("N,K", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_within_the_bound_of_the_exact_product_and_batch_invariant(N, K, tune):
    """Each output within one bf16 rounding plus fp32 summation of the exact product
    (fp64), no NaN; every row of an m = 130 call (three row tiles, the last partial) equal
    byte for byte to that row alone and in calls of 2 and 7 rows; rows past m never written."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(N + K)
    w, sc = (t.to(dev) for t in _weight(g, N, K))
    m = 130
    x = qdq.fp8_qdq(torch.randn(m, K, generator=g).to(BF).to(dev))
    xr = F.rename_cols(x)
    out = torch.full((m + 3, N), float("nan"), dtype=BF, device=dev)
    F.tc_fp8(xr, w, sc, out[:m], **tune)
    assert torch.isnan(out[m:].float()).all(), "rows past m written"
    got = out[:m].double()
    assert torch.isfinite(got).all()
    wd = dequant_weight(w, sc).double()
    exact = x.double() @ wd.t()
    bound = exact.abs() * 2.0**-8 + (x.double().abs() @ wd.abs().t()) * K * 2.0**-23
    worst = float(((got - exact).abs() / bound).max())
    assert worst <= 1.0, f"worst error {worst:.3f} of the bound"
    if tune and tune.get("ws", 0) in (0, 1):  # another one-chain form: the default form's bits
        base = F.tc_fp8(xr, w, sc, torch.empty(m, N, dtype=BF, device=dev))
        assert torch.equal(base.view(torch.int16), out[:m].view(torch.int16)), "bits differ from the default form"
    # x's boxes of 16 rows (the default xr): 1, 2, 3 and 4 of a tile's loaded
    for sub in ((0, 1), (5, 7), (63, 65), (129, 130), (0, 7), (3, 30), (0, 40), (1, 130)):
        part = F.tc_fp8(xr[sub[0] : sub[1]], w, sc, torch.empty(sub[1] - sub[0], N, dtype=BF, device=dev), **tune)
        assert torch.equal(part.view(torch.int16), out[sub[0] : sub[1]].view(torch.int16)), f"rows {sub}"


@pytest.mark.gpu
def test_against_the_released_fp8_linear():
    """Against `reference.fp8.fp8_linear` (the released math on the unquantized input) at a
    Flash shape: within one bf16 ulp plus the fp32 summation bound of the exact product."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(7)
    N, K, m = 1280, 5120, 9
    w, sc = _weight(g, N, K)
    x = torch.randn(m, K, generator=g).to(BF)
    ref = fp8_linear(x, w, sc).double()
    xq = qdq.fp8_qdq(x.to(dev))
    got = F.tc_fp8(F.rename_cols(xq), w.to(dev), sc.to(dev), torch.empty(m, N, dtype=BF, device=dev)).double().cpu()
    wd = dequant_weight(w, sc).double()
    mag = xq.double().cpu().abs() @ wd.abs().t()
    ulp = ref.abs().clamp_min(2.0**-126) * 2.0**-7
    assert torch.isfinite(got).all()
    assert bool(((got - ref).abs() <= ulp + mag * K * 2.0**-23).all())


ROPE_CASES = [  # m, heads, head_dim, half, K, tune: one segment, split K, two consumers, a Flash head
    pytest.param(3, 2, 128, 32, 1024, {}, id="m3-D128-K1024"),
    pytest.param(70, 2, 64, 16, 1024, {"segs": 2}, id="m70-D64-K1024-segs2"),
    pytest.param(5, 4, 64, 8, 512, {"ws": 2}, marks=_WS, id="m5-D64-K512-ws2"),
    pytest.param(2, 2, 512, 32, 1280, {}, id="m2-D512-K1280"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m,H,D,half,K,tune", ROPE_CASES)
def test_rope_epilogue_is_the_rope_op_after(m, H, D, half, K, tune):
    """`tc_fp8(..., rope=)` stores its output rotated: the bytes of the same call without it,
    then `rope.apply_rope` (the rope op's bits, as `tc_mm`'s epilogue gives them)."""
    from attnv41.kernels import rope as R

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(m * 1000 + D + K)
    w, sc = (t.to(dev) for t in _weight(g, H * D, K))
    xr = qdq.fp8_qdq(torch.randn(m, K, generator=g).to(BF).to(dev), rename=True)
    ang = torch.rand(90, half, generator=g) * 6
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)
    pos = torch.randint(0, 90, (m,), generator=g, dtype=torch.int32).to(dev)
    plain = F.tc_fp8(xr, w, sc, torch.empty(m, H * D, dtype=BF, device=dev), **tune)
    want = R.apply_rope(plain.view(m, H, D), cos, sin, pos).view(m, H * D)
    got = F.tc_fp8(xr, w, sc, torch.full_like(plain, float("nan")), rope=(D, cos, sin, pos), **tune)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16)), "rotated != tc_fp8 then apply_rope"


def test_rope_argument_is_checked():
    g = torch.Generator().manual_seed(2)
    w, sc = _weight(g, 128, 256)
    x, out = torch.zeros(2, 256, dtype=BF), torch.zeros(2, 128, dtype=BF)
    cos = sin = torch.zeros(8, 4)
    pos = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="rope = list"):
        F.tc_fp8(x, w, sc, out, rope=[64, cos, sin, pos])
    with pytest.raises(ValueError, match="head_dim = 48"):
        F.tc_fp8(x, w, sc, out, rope=(48, cos, sin, pos))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 70])
def test_one_launch_of_several_weights_gives_each_its_alone_bytes(m):
    """`tc_fp8_many`: weights of different shapes and split counts in one launch, the first
    rotated in its store, each output byte-equal to its own `tc_fp8` call."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(m)
    K, D, half = 1280, 128, 16
    shapes = (256, 4096, 64)  # one segment each at K = 1280 (10 chunks)
    ws = [tuple(t.to(dev) for t in _weight(g, n, K)) for n in shapes]
    xr = qdq.fp8_qdq(torch.randn(m, K, generator=g).to(BF).to(dev), rename=True)
    ang = torch.rand(40, half, generator=g) * 6
    cos, sin = ang.cos().to(dev), ang.sin().to(dev)
    pos = torch.randint(0, 40, (m,), generator=g, dtype=torch.int32).to(dev)
    for segs in (0, 2):
        outs = tuple(torch.full((m, n), float("nan"), dtype=BF, device=dev) for n in shapes)
        F.tc_fp8_many(xr, [w for w, _ in ws], outs, [sc for _, sc in ws], rope=(0, D, cos, sin, pos), segs=segs)
        for i, ((w, sc), n) in enumerate(zip(ws, shapes)):
            rope = (D, cos, sin, pos) if i == 0 else None
            alone = F.tc_fp8(xr, w, sc, torch.empty(m, n, dtype=BF, device=dev), rope=rope, segs=segs)
            assert torch.equal(outs[i].view(torch.int16), alone.view(torch.int16)), f"weight {i}, segs {segs}"


def test_several_weights_arguments_are_checked():
    g = torch.Generator().manual_seed(3)
    (w, sc), (w2, sc2) = _weight(g, 64, 256), _weight(g, 32, 256)
    x = torch.zeros(2, 256, dtype=BF)
    outs = (torch.zeros(2, 64, dtype=BF), torch.zeros(2, 32, dtype=BF))
    with pytest.raises(ValueError, match="2 weights, 1 outs"):
        F.tc_fp8_many(x, (w, w2), outs[:1], (sc, sc2))
    with pytest.raises(ValueError, match="ws = 1 with 2 weights"):
        F.tc_fp8_many(x, (w, w2), outs, (sc, sc2), ws=1)
    with pytest.raises(ValueError, match="rope i = 2"):
        F.tc_fp8_many(x, (w, w2), outs, (sc, sc2), rope=(2, 32, torch.zeros(4, 4), torch.zeros(4, 4), torch.zeros(2)))
