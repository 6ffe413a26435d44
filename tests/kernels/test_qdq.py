"""Triton qdq kernels vs their reference twins (attnv41.reference.qdq), bit for bit.

References run on the CPU (the contract), kernels on `device` (CUDA, else the interpreter).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from attnv41.kernels import qdq as K
from attnv41.reference import qdq as R

# name -> (kernel, torch fallback, reference, block)
OPS = {
    "fp8": (K.fp8_qdq, K.fp8_qdq_torch, R.fp8_qdq, 32),
    "fp4_e8m0": (K.fp4_e8m0_qdq, K.fp4_e8m0_qdq_torch, R.fp4_e8m0_qdq, 32),
    "fp4_e4m3": (K.fp4_e4m3_qdq, K.fp4_e4m3_qdq_torch, R.fp4_e4m3_qdq, 16),
}
# fp4_e4m3's scale leaves e4m3's range past amax = 2688: its largest random magnitude is 2^8,
# and its inputs are clamped to ±2688 (torch ≥ 2.13 saturates the cast there, older gives NaN).
SCALES = {"fp8": (2.0**-20, 1.0, 2.0**10), "fp4_e8m0": (2.0**-20, 1.0, 2.0**10), "fp4_e4m3": (2.0**-20, 1.0, 2.0**8)}
CASES = [
    pytest.param(op, w, r, id=f"{op}-w{w}-r{r}")
    for op in OPS
    for w in ((16, 32, 48, 64, 512) if op == "fp4_e4m3" else (32, 64, 512))
    for r in (1, 7, 13)
]


def reference(op: str, x: torch.Tensor) -> torch.Tensor:
    _, _, ref, block = OPS[op]
    return ref(x.cpu(), block)


def assert_bits_equal(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    got = got.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype == torch.bfloat16, f"{name}: {got.shape} {got.dtype}"
    assert not torch.isnan(ref.float()).any(), f"{name}: NaN in the reference"
    assert not torch.isnan(got.float()).any(), f"{name}: NaN in the kernel output"
    diff = got.view(torch.int16) != ref.view(torch.int16)
    if diff.any():
        i = diff.nonzero()[0].tolist()
        err = (got.float() - ref.float()).abs().max().item()
        pytest.fail(
            f"{name}: {int(diff.sum())} of {diff.numel()} values differ, max |err| {err:.3g}; "
            f"first at {i}: got {got[tuple(i)].item()!r}, reference {ref[tuple(i)].item()!r}"
        )


@pytest.mark.parametrize("op,width,rows", CASES)
def test_random_vs_reference(op, width, rows, device):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op}-{width}-{rows}".encode()))
    kernel = OPS[op][0]
    for scale in SCALES[op]:
        x = (torch.randn(rows, width, generator=gen) * scale).to(torch.bfloat16)
        # Half the blocks get a wide dynamic range (values spread over 2^±8).
        x[:, : width // 2] *= torch.exp2(torch.randint(-8, 9, (rows, width // 2), generator=gen)).to(torch.bfloat16)
        if op == "fp4_e4m3":
            x = x.clamp(-2688.0, 2688.0)  # beyond 6·448 the reference's scale is torch-version dependent
        out = torch.full_like(x, float("nan"), device=device)  # poisoned: every value must be written
        got = kernel(x.to(device), out=out)
        assert got is out
        assert_bits_equal(f"{op} scale {scale:g}", got, reference(op, x))


def _hostile_blocks(op: str) -> list[list[float]]:
    """Blocks (each at most one block long, zero-padded) that hit rounding ties and edges."""
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    blocks = [
        [0.0],  # all zeros: amax takes its floor
        [-0.0, -0.0, 0.0],  # negative zero kept
        [0.0] * 5 + [-3.0],  # a single nonzero
        [0.0] * 9 + [1e-30],
        [6.0, *mids, *[-m for m in mids], -0.0],  # s = 1 (s = 1 for e8m0 and e4m3): every e2m1 tie
        [7.0, 1.0, -3.5],  # spec check: fp4_e4m3 s = 1.125, codes [6, 1, -3]
        [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.3, -2.9, 0.1, -0.74, 4.4, -6],  # spec check
        [3.0, 0.01, -1.0, 0.3],  # spec check: fp8 s = 2^-7
    ]
    for k in (-12, 0, 7):  # the e2m1 ties at other power-of-two scales
        blocks.append([2.0**k * v for v in (6.0, *mids, *[-m for m in mids])])
    if op == "fp8":
        for k in (-10, 0, 5):  # amax exactly 448·2^k
            blocks.append([448.0 * 2**k, -448.0 * 2**k, 1.0 * 2**k, 0.5 * 2**k])
        # s = 1: ties between e4m3 neighbours (normal and subnormal), the top binade
        blocks.append(
            [448.0, 432.0, 1.0625, 1.1875, -1.0625, 5 * 2.0**-10, 7 * 2.0**-10, -3 * 2.0**-10, 2.0**-10]
            + [2.0**-12, 2.0**-7, 2.0**-6, 15 * 2.0**-10, 0.0146484375, 232.0, 240.0, 248.0, -0.0]
        )
        blocks.append([3.0e38, -1.0, 1e-3])  # largest scale
        blocks.append([1e-5, -3e-6, 1e-38])  # below the 1e-4 amax floor
    elif op == "fp4_e8m0":
        blocks.append([2.0**-130, -(2.0**-132), 3 * 2.0**-133])  # bf16 subnormals, s = 2^-126 floor
        blocks.append([6 * 2.0**-126, 2.0**-127, -(2.0**-128)])  # amax at the floor exactly
        blocks.append([2.0e38, -1.0, 1e30])
    else:
        s = 1.125  # a non-power-of-two scale: v/s hits every tie exactly
        blocks.append([6 * s, *[m * s for m in mids], *[-m * s for m in mids]])
        # e4m3-subnormal scales (amax/6 < 2^-6), incl. amax/6 = 3·2^-10, a tie between 2^-9 and 2^-8
        blocks.append([18 * 2.0**-10, 3 * 2.0**-10, -(9 * 2.0**-10)])
        blocks.append([0.05, -0.01, 0.0234375])
        blocks.append([0.01171875, 2.0**-12])  # amax at the 6·2^-9 floor exactly
        blocks.append([1e-6, -1e-7])  # below the floor
        blocks.append([2688.0, -100.0, 2.0])  # s = 448, the largest scale
        blocks.append([186 * 2.0**-10, 1.0 * 2.0**-4])  # amax/6 = 31·2^-10: a tie, rounds up to 2^-5
        blocks.append([45 * 2.0**-9, -(2.0**-7)])  # amax/6 = 7.5·2^-9: a subnormal tie, rounds up to 2^-6
    return blocks


@pytest.mark.parametrize("op", list(OPS))
def test_hostile_blocks(op, device):
    kernel, _, _, block = OPS[op]
    blocks = _hostile_blocks(op)
    x = torch.zeros(len(blocks), 2 * block)
    for i, b in enumerate(blocks):
        assert len(b) <= block
        x[i, block : block + len(b)] = torch.tensor(b)  # second block of the row; the first stays zero
        x[i, : len(b)] = -torch.tensor(b[::-1])
    x = x.to(torch.bfloat16)
    got = kernel(x.to(device))
    assert_bits_equal(f"{op} hostile", got, reference(op, x))


def test_spec_checks(device):
    """The worked examples of attention-v41.md §3."""
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([3.0, 0.01, -1.0, 0.3])
    got = K.fp8_qdq(x.to(torch.bfloat16).to(device)).cpu().float()
    assert torch.equal(got[0, :4], torch.tensor([3.0, 0.009765625, -1.0, 0.3125])), got[0, :4]
    x = torch.zeros(1, 16)
    x[0, :3] = torch.tensor([7.0, 1.0, -3.5])
    got = K.fp4_e4m3_qdq(x.to(torch.bfloat16).to(device)).cpu().float()
    assert torch.equal(got[0, :3], torch.tensor([6.0, 1.0, -3.0]) * 1.125), got[0, :3]


@pytest.mark.parametrize("op", list(OPS))
def test_in_place_and_strided_rows(op, device):
    kernel, _, _, block = OPS[op]
    gen = torch.Generator().manual_seed(7)
    base = torch.randn(5, 3 * block, generator=gen).to(torch.bfloat16)
    want = reference(op, base[:, block:])
    x = base.to(device)
    view = x[:, block:]  # row stride 3·block, width 2·block
    got = kernel(view, out=view)
    assert got is view
    assert_bits_equal(f"{op} in place", view, want)
    assert torch.equal(x[:, :block].cpu(), base[:, :block]), "values outside the view untouched"


@pytest.mark.parametrize("op", list(OPS))
def test_torch_fallback(op, device):
    _, fallback, _, block = OPS[op]
    x = torch.randn(3, 2 * block, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = torch.empty_like(x)
    assert fallback(x, out=out) is out
    assert_bits_equal(f"{op} torch fallback", out, reference(op, x))
    assert_bits_equal(f"{op} torch fallback, new out", fallback(x), reference(op, x))


def test_empty_rows(device):
    x = torch.empty(0, 32, dtype=torch.bfloat16, device=device)
    assert K.fp8_qdq(x).shape == (0, 32)


@pytest.mark.parametrize(
    "op,args,match",
    [
        pytest.param("fp8", dict(x=torch.zeros(2, 40)), r"x\.dtype", id="dtype"),
        pytest.param(
            "fp8",
            dict(x=torch.zeros(2, 40, dtype=torch.bfloat16)),
            r"x\.shape\[-1\] = 40.*multiple of 32",
            id="fp8-width",
        ),
        pytest.param(
            "fp4_e8m0",
            dict(x=torch.zeros(2, 16, dtype=torch.bfloat16)),
            r"x\.shape\[-1\] = 16.*multiple of 32",
            id="e8m0-width",
        ),
        pytest.param(
            "fp4_e4m3",
            dict(x=torch.zeros(2, 24, dtype=torch.bfloat16)),
            r"x\.shape\[-1\] = 24.*multiple of 16",
            id="e4m3-width",
        ),
        pytest.param("fp8", dict(x=torch.zeros(2, 2, 32, dtype=torch.bfloat16)), r"x\.dim\(\) = 3", id="3d"),
        pytest.param("fp8", dict(x=torch.zeros(64, 2, dtype=torch.bfloat16).t()), r"x\.stride\(-1\) = 2", id="stride"),
        pytest.param(
            "fp8",
            dict(x=torch.zeros(2, 32, dtype=torch.bfloat16), out=torch.zeros(2, 64, dtype=torch.bfloat16)),
            r"out\.shape = \(2, 64\)",
            id="out-shape",
        ),
        pytest.param(
            "fp8",
            dict(x=torch.zeros(2, 32, dtype=torch.bfloat16), out=torch.zeros(2, 32)),
            r"out\.dtype",
            id="out-dtype",
        ),
    ],
)
def test_validation(op, args, match, device):
    kernel, fallback, _, _ = OPS[op]
    args = {k: v.to(device) for k, v in args.items()}
    with pytest.raises(ValueError, match=match):
        kernel(**args)
    with pytest.raises(ValueError, match=match):
        fallback(**{k: v.cpu() for k, v in args.items()})


@pytest.mark.parametrize("op", list(OPS), ids=list(OPS))
@pytest.mark.parametrize("rows", [1, 7, 130], ids=["r1", "r7", "r130"])
def test_nonfinite_count_matches_the_twin_and_adds_up(op, rows, device):
    """`nonfinite=`: the kernel adds the number of NaN/±inf inputs, exactly the twin's
    count, across programs (130 rows span several programs), on top of what was there;
    the round trip itself is unchanged by counting."""
    kernel, twin, _, block = OPS[op]
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 4 * block, generator=g).bfloat16()
    flat = x.view(-1)
    where = torch.randperm(flat.numel(), generator=g)[: 3 + rows // 2]
    flat[where[0::3]] = float("nan")
    flat[where[1::3]] = float("inf")
    flat[where[2::3]] = float("-inf")
    want = where.numel()
    for fn, dev in ((kernel, device), (twin, "cpu")):
        count = torch.full((1,), 5, dtype=torch.int64, device=dev)
        out = fn(x.to(dev), nonfinite=count)
        assert int(count.item()) == 5 + want, f"{fn.__name__}: counted {int(count.item()) - 5}, want {want}"
        plain = fn(x.to(dev))
        assert torch.equal(out.view(torch.int16), plain.view(torch.int16)), (
            f"{fn.__name__}: counting changed the output"
        )
    clean = torch.randn(rows, 4 * block, generator=g).bfloat16().to(device)
    count = torch.zeros(1, dtype=torch.int64, device=device)
    kernel(clean, nonfinite=count)
    assert int(count.item()) == 0


@pytest.mark.parametrize(
    "bad, msg",
    [
        (torch.zeros(1, dtype=torch.int32), "int64 tensor of one element"),
        (torch.zeros(2, dtype=torch.int64), "one element"),
    ],
    ids=["int32", "two_elements"],
)
def test_nonfinite_counter_is_validated(bad, msg):
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    for fn in (K.fp8_qdq, K.fp8_qdq_torch):
        with pytest.raises(ValueError, match=msg):
            fn(x, nonfinite=bad)


# ------------------------------------------------------- fp8 round trip in tc_fp8's column order


@pytest.mark.parametrize("rows,width", [(1, 128), (3, 384), (70, 1280)], ids=["r1-w128", "r3-w384", "r70-w1280"])
def test_fp8_rename_stores_the_round_trip_in_the_renamed_order(rows, width, device):
    """`fp8_qdq(x, rename=True)` equals `rename_cols(fp8_qdq(x))` bit for bit (the reference
    round trip, then `tc_fp8`'s column order), kernel and twin, strided rows included; the
    scale blocks are the physical 32-value blocks (renaming comes after quantizing)."""
    from attnv41.kernels.tc_fp8 import rename_cols

    gen = torch.Generator().manual_seed(rows * width)
    base = (torch.randn(rows, width + 32, generator=gen) * 3).to(torch.bfloat16)
    base[:, : width // 2] *= torch.exp2(torch.randint(-8, 9, (rows, width // 2), generator=gen)).to(torch.bfloat16)
    want = rename_cols(R.fp8_qdq(base[:, :width].contiguous(), 32))
    x = base.to(device)[:, :width]  # row stride width + 32
    got = K.fp8_qdq(x, rename=True)
    assert_bits_equal("fp8 rename", got, want)
    out = torch.full((rows, width), 7.0, dtype=torch.bfloat16)
    assert K.fp8_qdq_torch(base[:, :width], out=out, rename=True) is out
    assert_bits_equal("fp8 rename twin", out, want)
    count = torch.zeros(1, dtype=torch.int64, device=device)
    K.fp8_qdq(x, nonfinite=count, rename=True)
    assert int(count.item()) == 0


def test_fp8_rename_is_validated(device):
    x = torch.zeros(2, 96, dtype=torch.bfloat16, device=device)
    for fn in (K.fp8_qdq, K.fp8_qdq_torch):
        with pytest.raises(ValueError, match=r"x.shape\[-1\] = 96; allowed with rename: a multiple of 128"):
            fn(x.cpu() if fn is K.fp8_qdq_torch else x, rename=True)
    x = torch.zeros(2, 128, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="out is x"):
        K.fp8_qdq(x, out=x, rename=True)
