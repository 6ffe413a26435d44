"""`kernels.rope.apply_rope` against its twin `reference.rope.apply_rope`: bit for bit.

The brief allowed one bf16 ulp on the interpreter, for an fp32 fma contraction there;
none happens (numpy rounds each product), and on CUDA the wrapper compiles with
`enable_fp_fusion=False`, so both evaluate `a·c − b·s` with the reference's roundings.
The final fp32 → bf16 rounding is the kernel's own bit arithmetic (the interpreter's cast
truncates). So equality is required everywhere; `_assert_rope_close` reports ulps.
"""

import re

import pytest
import torch

from attnv41.kernels.rope import apply_rope, apply_rope_torch
from attnv41.reference.rope import apply_rope as ref_apply_rope
from attnv41.reference.rope import rope_freqs, rope_table
from attnv41.testing import bf16_ulp

MAX_SEQ = 301


def _tables(rope_dim: int, yarn: bool, device):
    freqs = rope_freqs(rope_dim, 40000.0, (4.0, 64, 32.0, 1.0) if yarn else None)
    cos, sin = rope_table(MAX_SEQ, freqs)
    return cos.to(device), sin.to(device)


def _inputs(seed: int, shape, device, pos_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=gen) * 3).bfloat16().to(device)
    pos = torch.randint(0, MAX_SEQ, (shape[0],), generator=gen).to(pos_dtype).to(device)
    pos[0] = MAX_SEQ - 1  # the table's last row
    return x, pos


def _assert_rope_close(name: str, got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}"
    assert not torch.isnan(got).any(), f"{name}: NaN in the kernel's output"
    g, r = got.cpu().double(), ref.cpu().double()
    n = int((g != r).sum())
    if n:
        ulps = ((g - r).abs() / torch.maximum(bf16_ulp(g), bf16_ulp(r))).max().item()
        raise AssertionError(f"{name}: {n} values differ from the reference, worst {ulps:.3g} bf16 ulps")


# (m, n_vec, width, rope_dim); n_vec None = a 2-D x [m, width]
SHAPES = [
    pytest.param(1, 1, 32, 8, id="m1-v1-w32-r8"),
    pytest.param(7, 2, 40, 16, id="m7-v2-w40-r16"),
    pytest.param(13, 3, 64, 64, id="m13-v3-w64-r64-nolead"),
    pytest.param(7, 4, 48, 12, id="m7-v4-w48-r12-oddhalf"),
    pytest.param(13, None, 32, 8, id="m13-2d-w32-r8"),
    pytest.param(7, 17, 136, 8, id="m7-v17-w136-r8-multiblock"),
]


@pytest.mark.parametrize("m,n_vec,width,rope_dim", SHAPES)
@pytest.mark.parametrize("inverse", [False, True], ids=["fwd", "inv"])
@pytest.mark.parametrize("yarn", [False, True], ids=["plain", "yarn"])
def test_matches_reference(device, m, n_vec, width, rope_dim, inverse, yarn):
    shape = (m, width) if n_vec is None else (m, n_vec, width)
    x, pos = _inputs(m * 31 + width, shape, device)
    cos, sin = _tables(rope_dim, yarn, device)
    got = apply_rope(x, cos, sin, pos, inverse=inverse)
    ref = ref_apply_rope(x, cos, sin, pos, inverse)
    _assert_rope_close("rope", got, ref)
    lead = width - rope_dim
    assert torch.equal(got[..., :lead], x[..., :lead]), "leading values must pass through unchanged"


@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_in_place_and_out(device, pos_dtype):
    x, pos = _inputs(5, (13, 2, 40), device, pos_dtype)
    cos, sin = _tables(16, True, device)
    ref = ref_apply_rope(x, cos, sin, pos)
    # out given, poisoned with NaN: every value must be written
    out = torch.full_like(x, float("nan"))
    assert apply_rope(x, cos, sin, pos, out=out) is out
    _assert_rope_close("rope out=", out, ref)
    # in place: out is x
    y = x.clone()
    assert apply_rope(y, cos, sin, pos, out=y) is y
    assert torch.equal(y, out), "in-place result differs from the out-of-place one"


def test_strided_heads(device):
    """x a view with a non-unit head stride (every other head of a larger tensor)."""
    big, pos = _inputs(9, (7, 6, 40), device)
    x = big[:, ::2, :]
    cos, sin = _tables(8, False, device)
    _assert_rope_close("rope strided", apply_rope(x, cos, sin, pos), ref_apply_rope(x, cos, sin, pos))


def test_inverse_round_trip(device):
    x, pos = _inputs(11, (13, 2, 32), device)
    cos, sin = _tables(16, True, device)
    back = apply_rope(apply_rope(x, cos, sin, pos), cos, sin, pos, inverse=True)
    ref = ref_apply_rope(ref_apply_rope(x, cos, sin, pos), cos, sin, pos, inverse=True)
    _assert_rope_close("rope round trip", back, ref)


def test_torch_fallback_matches_reference():
    x, pos = _inputs(3, (7, 2, 40), "cpu")
    cos, sin = _tables(16, False, "cpu")
    ref = ref_apply_rope(x, cos, sin, pos, True)
    assert torch.equal(apply_rope_torch(x, cos, sin, pos, inverse=True), ref)
    out = torch.full_like(x, float("nan"))
    assert apply_rope_torch(x, cos, sin, pos, inverse=True, out=out) is out
    assert torch.equal(out, ref)


def _bad_cases():
    x = torch.zeros(3, 2, 16, dtype=torch.bfloat16)
    cos = torch.zeros(10, 4)
    pos = torch.zeros(3, dtype=torch.int64)
    return [
        pytest.param((x.float(), cos, cos, pos, None), "x.dtype", id="x-dtype"),
        pytest.param((x[0, 0], cos, cos, pos, None), "x.dim()", id="x-dim"),
        pytest.param((x, cos.double(), cos, pos, None), "cos.dtype", id="cos-dtype"),
        pytest.param((x, torch.zeros(10, 8)[:, ::2], cos, pos, None), "cos.stride(1)", id="cos-stride"),
        pytest.param((x, cos, cos[:, :2], pos, None), "sin.shape", id="sin-shape"),
        pytest.param((x, torch.zeros(10, 9), torch.zeros(10, 9), pos, None), "rope_dim", id="rope-too-wide"),
        pytest.param((x, cos, cos, pos.float(), None), "pos.dtype", id="pos-dtype"),
        pytest.param((x, cos, cos, pos[:2], None), "pos.shape", id="pos-shape"),
        pytest.param((x, cos, cos, pos, x[:, :1]), "out", id="out-shape"),
        pytest.param((x[..., ::2], cos[:, :2], cos[:, :2], pos, None), "x.stride", id="x-stride"),
    ]


@pytest.mark.parametrize("fn", [apply_rope, apply_rope_torch], ids=["triton", "torch"])
@pytest.mark.parametrize("args,name", _bad_cases())
def test_validation(fn, args, name):
    x, cos, sin, pos, out = args
    with pytest.raises(ValueError, match=re.escape(name)):
        fn(x, cos, sin, pos, out=out)
