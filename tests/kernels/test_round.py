"""The fp32 → bf16 rounding every kernel stores through (`kernels/_triton.round_bf16`)
against torch's cast, bit for bit (every NaN → 0x7FC0), on hostile bit patterns: the GPU's canonical NaN
0x7FFFFFFF (whose rounding carry once wrapped into the sign bit and came out as −0, so a
NaN row turned into a finite zero row on CUDA only), other NaN payloads, infinities,
overflow, ties and subnormals."""

import pytest
import torch

from attnv41.kernels._triton import HAVE_TRITON, interpreting, tl, triton

if HAVE_TRITON:
    from attnv41.kernels._triton import round_bf16_bits, round_bf16_cvt

    @triton.jit
    def _round_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, CVT: tl.constexpr):
        # [BLOCK]
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < n
        x = tl.load(x_ptr + i, mask=ok, other=0.0)
        if CVT:
            y = round_bf16_cvt(x)
        else:
            y = round_bf16_bits(x)
        tl.store(out_ptr + i, y, mask=ok)


BITS = [
    0x7FFFFFFF,  # the GPU's NaN
    0xFFFFFFFF,  # negative, all payload bits
    0x7FC00000,
    0xFFC00000,
    0x7F800001,  # signalling payload
    0x7FBFFFFF,
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7F7FFFFF,  # largest finite: rounds to +inf
    0xFF7FFFFF,
    0x3F808000,  # a tie, lsb 0: stays
    0x3F818000,  # a tie, lsb 1: rounds up
    0x00000001,  # subnormals
    0x80008000,
    0x00000000,
    0x80000000,
]


@pytest.mark.parametrize("form", ["bits", "cvt"])
def test_round_bf16_matches_torch_on_hostile_bits(device, form):
    """Both forms (`_triton.ROUND_BF16` picks the kernels' one); the hardware conversion
    only on CUDA (the interpreter's cast truncates)."""
    if form == "cvt" and interpreting():
        pytest.skip("the interpreter's fp32 → bf16 cast truncates; the hardware form runs on CUDA")
    g = torch.Generator().manual_seed(7)
    rnd = torch.randint(-(2**31), 2**31 - 1, (4096,), generator=g, dtype=torch.int64)
    bits = torch.tensor([b - 2**32 if b >= 2**31 else b for b in BITS] + rnd.tolist(), dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32)
    out = torch.empty(x.numel(), dtype=torch.bfloat16, device=device)
    _round_kernel[(triton.cdiv(x.numel(), 256),)](x.to(device), out, x.numel(), BLOCK=256, CVT=form == "cvt")
    want = x.to(torch.bfloat16).view(torch.int16)
    got = out.cpu().view(torch.int16)
    nan = torch.isnan(x)  # torch's cast keeps some NaN; ours gives the canonical 0x7FC0
    assert (got[nan] == 0x7FC0).all()
    bad = ((got != want) & ~nan).nonzero().flatten()
    assert bad.numel() == 0, [
        (hex(int(bits[i]) & 0xFFFFFFFF), hex(int(got[i]) & 0xFFFF), hex(int(want[i]) & 0xFFFF)) for i in bad[:8]
    ]


@pytest.mark.parametrize("op", ["rms_norm", "fp8_qdq"], ids=["rms_norm", "fp8_qdq"])
def test_a_nan_row_stays_nan(op, device):
    """A NaN in a row stays NaN through the norm before the caches (on CUDA it once came
    out as a row of −0), so the quantizer that writes the cache sees and counts it. What
    a quantizer then makes of a non-finite value is not specified (the reference's fp4
    turns a NaN into ±0, the GPU's clamp turns it into a finite value): the count is the
    contract."""
    from attnv41.kernels import norm, qdq

    x = torch.randn(3, 64, dtype=torch.bfloat16, device=device)
    x[1, 5] = float("nan")
    if op == "rms_norm":
        y = norm.rms_norm(x, torch.ones(64, device=device), 1e-6)
        assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    else:
        count = torch.zeros(1, dtype=torch.int64, device=device)
        y = qdq.fp8_qdq(x, nonfinite=count)
        assert int(count.item()) == 1
        clean = qdq.fp8_qdq(x[[0, 2]])
        assert torch.equal(y[[0, 2]].view(torch.int16), clean.view(torch.int16))


def test_a_bad_round_switch_is_refused_at_import():
    """`ATTNV41_ROUND_BF16` other than bits / cvt: a ValueError naming it when the kernels
    load, not a silent default."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ATTNV41_ROUND_BF16": "fast"}
    r = subprocess.run(
        [sys.executable, "-c", "import attnv41.kernels._triton"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode != 0
    assert "ATTNV41_ROUND_BF16 = 'fast'; allowed: 'bits', 'cvt'" in r.stderr, r.stderr[-500:]
