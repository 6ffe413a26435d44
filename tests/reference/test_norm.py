"""The reference RMSNorm (attnv41.reference.norm.rms_norm) against hand values where eps
matters: `y = w·v / sqrt(mean(v²) + eps)`, eps inside the square root (issue 10)."""

from __future__ import annotations

import zlib

import pytest

from attnv41.reference import norm as R
from norm_cases import EPS_CASES, assert_hand_value, eps_case


@pytest.mark.parametrize("width", [1, 64, 301], ids=lambda w: f"w{w}")
@pytest.mark.parametrize("kind, eps, exact", EPS_CASES)
def test_eps_inside_the_square_root(kind, eps, exact, width):
    x, w, y = eps_case(kind, eps, exact, rows=3, width=width, seed=zlib.crc32(f"{kind}-{eps}-{width}".encode()))
    assert_hand_value(f"reference rms_norm {kind} eps {eps:g}", R.rms_norm(x, w, eps), y)
    assert_hand_value(f"reference rms_norm {kind} eps {eps:g} bf16 w", R.rms_norm(x, w.bfloat16(), eps), y)
