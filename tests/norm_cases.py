"""Hand checks of RMSNorm's eps placement, shared by the reference and kernel tests.

Every golden file uses eps = 1e-20, far below mean(v²) for any row they hold, so a
misplaced eps (outside the square root, or added after the division) is invisible to
them. Here the rows are chosen so that mean(v²) is comparable to eps and the spec's
`y = w·v / sqrt(mean(v²) + eps)` differs by far more than a bf16 ulp from the wrong
placements (asserted on the cases themselves, so no case can pass vacuously)."""

from __future__ import annotations

import math

import pytest
import torch


def _row(kind: str, width: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "const_1e-3":
        return torch.full((width,), 1e-3)  # mean(v²) ≈ 1e-6 = eps: y ≈ 0.7071·w
    if kind == "const_2^-10":
        return torch.full((width,), 2.0**-10)  # mean(v²) = 2^-20, eps = 3·2^-20: y = w/2 exactly
    signs = torch.where(torch.rand(width, generator=gen) < 0.5, -1.0, 1.0)
    return signs * (0.5 + torch.rand(width, generator=gen)) * 1e-3  # mixed signs and magnitudes


# (row kind, eps, the hand value of y/w for constant rows or None)
EPS_CASES = [
    pytest.param("const_1e-3", 1e-6, None, id="const_1e-3-eps1e-6"),
    pytest.param("const_2^-10", 3 * 2.0**-20, 0.5, id="const_2^-10-eps3x2^-20"),
    pytest.param("mixed_1e-3", 1e-6, None, id="mixed_1e-3-eps1e-6"),
    pytest.param("mixed_1e-3", 4e-6, None, id="mixed_1e-3-eps4e-6"),
]


def eps_case(kind: str, eps: float, exact: float | None, rows: int, width: int, seed: int):
    """(x bf16 [rows, width], w fp32 [width], y float64 [rows, width]) with y the spec's value
    computed in float64 from the bf16 inputs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.stack([_row(kind, width, gen) for _ in range(rows)]).to(torch.bfloat16)
    w = (1 + 0.5 * torch.randn(width, generator=gen)).to(torch.bfloat16).float()
    v = x.double()
    ms = v.square().mean(-1, keepdim=True)
    y = w.double() * v / torch.sqrt(ms + eps)
    if kind == "const_1e-3":
        assert abs((y / (w.double() * v.sign())).mean().item() - 1 / math.sqrt(2)) < 1e-3, "the case's premise"
    if exact is not None:
        assert torch.equal(y, w.double() * v.sign() * exact), "the case's premise"
    # The wrong placements move every value by >= 10%, i.e. dozens of bf16 ulps.
    for wrong in (w.double() * v / (torch.sqrt(ms) + eps), w.double() * v / torch.sqrt(ms) + eps):
        assert ((wrong - y).abs() > 0.1 * y.abs()).all(), "eps must matter in this case"
    return x, w, y


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    b = bits.to(torch.int32)
    mag = b & 0x7FFF
    return torch.where(b < 0, -mag, mag)


def assert_hand_value(name: str, got: torch.Tensor, y: torch.Tensor) -> None:
    """Each bf16 value of `got` within one bf16 ulp of the float64 `y` rounded to bf16
    (fp32 arithmetic may land one ulp away at a rounding boundary, never further)."""
    got = got.cpu()
    assert got.dtype == torch.bfloat16 and got.shape == y.shape, f"{name}: {got.dtype} {tuple(got.shape)}"
    assert torch.isfinite(got.float()).all(), f"{name}: non-finite output"
    want = y.to(torch.bfloat16)
    ulps = (_ordered(got.view(torch.int16)) - _ordered(want.view(torch.int16))).abs()
    i = int(ulps.argmax())
    assert int(ulps.max()) <= 1, (
        f"{name}: {int(ulps.max())} bf16 ulps from the hand value at flat index {i} "
        f"(got {got.flatten()[i].item():.6g}, want {y.flatten()[i].item():.6g}, "
        f"ratio {got.flatten()[i].item() / y.flatten()[i].item():.4f})"
    )
