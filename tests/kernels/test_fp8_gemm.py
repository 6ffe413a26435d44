"""The prefill FP8 GEMM (`kernels.fp8_gemm.fp8_gemm`) on the activation's exact round trip,
against the exact twin `reference.fp8.fp8_linear` of the unquantized activation.

Tolerance, per output, as in test_fp8_linear.py: one bf16 ulp of the reference plus
K·2^-24·Σ|terms| (the products are exact, only the fp32 summation order differs). Every
config of SWEEP_CONFIGS is checked; a row's bits must not depend on m or on the other rows.
"""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import fp8_gemm as G
from attnv41.reference.fp8 import fp8_linear
from attnv41.reference.qdq import fp8_qdq
from kernels.test_fp8_linear import _assert_close, _bound, _gen, _weights  # the same bound and inputs

CASES = [(17, 64, 64), (40, 100, 160), (33, 130, 256)]  # (m, N, K): ragged m, N and K tails


def _x(gen, m, Kd, mag=1.0):
    x = torch.randn(m, Kd, generator=gen) * mag
    x[:, : Kd // 2] *= torch.exp2(torch.randint(-10, 11, (m, Kd // 2), generator=gen).float())
    return x.to(torch.bfloat16)


def _run(x, w, s, device, cfg=None, pad=0):
    """fp8_gemm on fp8_qdq(x) into a NaN-poisoned out (row stride N + pad); the pad must stay NaN."""
    buf = torch.full((x.shape[0], w.shape[0] + pad), float("nan"), dtype=torch.bfloat16, device=device)
    out = buf[:, : w.shape[0]]
    got = G.fp8_gemm(fp8_qdq(x).to(device), w.to(device), s.to(device), out, cfg=cfg)
    assert got is out
    assert torch.isnan(buf[:, w.shape[0] :].float()).all(), "written past N"
    return out.cpu()


@pytest.mark.parametrize("m,N,Kd", CASES, ids=[f"m{m}-N{n}-K{k}" for m, n, k in CASES])
@pytest.mark.parametrize("mag", [2.0**-20, 1.0, 2.0**20], ids=["tiny", "unit", "huge"])
def test_random_vs_reference(m, N, Kd, mag, device):
    gen = _gen("gemm", m, N, Kd, mag)
    x = _x(gen, m, Kd, mag)
    w, s = _weights(gen, N, Kd, lo=97, hi=138)
    ref = fp8_linear(x, w, s)
    _assert_close("fp8_gemm out", _run(x, w, s, device, pad=3), ref, _bound(x, w, s, ref))


@pytest.mark.parametrize("lo,hi", [(98, 103), (147, 153)], ids=["bytes~100", "bytes~150"])
def test_extreme_scales_and_zero_rows(lo, hi, device):
    """Weight scales 2^-29..2^-25 or 2^20..2^25; an all-zero row, a −0 row, signed zeros."""
    m, N, Kd = 20, 70, 128
    gen = _gen("extreme", lo)
    x = _x(gen, m, Kd)
    x[1] = 0.0
    x[2] = -0.0
    x[3, ::3] = -0.0
    w, s = _weights(gen, N, Kd, lo=lo, hi=hi)
    ref = fp8_linear(x, w, s)
    got = _run(x, w, s, device)
    _assert_close("extreme scales", got, ref, _bound(x, w, s, ref))
    zero = torch.zeros(2, N, dtype=torch.int16)
    assert torch.equal(got[1:3].view(torch.int16), zero), "zero rows: not +0"


@pytest.mark.parametrize("cfg", G.SWEEP_CONFIGS, ids=[str(i) for i in range(len(G.SWEEP_CONFIGS))])
def test_every_sweep_config(cfg, device):
    for m, N, Kd in CASES[1:]:
        gen = _gen("cfg", m, N, Kd)
        x = _x(gen, m, Kd)
        w, s = _weights(gen, N, Kd, lo=110, hi=135)
        ref = fp8_linear(x, w, s)
        _assert_close(f"{cfg} m{m}-N{N}-K{Kd}", _run(x, w, s, device, cfg=cfg, pad=5), ref, _bound(x, w, s, ref))


@pytest.mark.parametrize("cfg", [None, G.GemmConfig(16, 32, 32, 4, 2), (16, 64, 64, 4, 2, 2, True)], ids=str)
def test_rows_independent_of_m(cfg, device):
    """The same rows give the same bytes whatever m and whatever the other rows hold
    (small tiles: several row tiles and a group swizzle in play)."""
    gen = _gen("rows")
    N, Kd, M = 100, 160, 40
    x = _x(gen, M, Kd)
    w, s = _weights(gen, N, Kd)
    full = _run(x, w, s, device, cfg=cfg).view(torch.int16)
    for m in (17, 33):
        part = _run(x[:m], w, s, device, cfg=cfg).view(torch.int16)
        assert torch.equal(part, full[:m]), f"m = {m}: {int((part != full[:m]).sum())} outputs differ"
    other = torch.cat([x[:17], _x(_gen("other"), M - 17, Kd)])
    mixed = _run(other, w, s, device, cfg=cfg).view(torch.int16)
    assert torch.equal(mixed[:17], full[:17]), "other rows change a row's bits"
    if cfg is None:
        assert G.config(N, Kd) == G.DEFAULT_CONFIG
        again = _run(x, w, s, device, cfg=G.config(N, Kd)).view(torch.int16)
        assert torch.equal(again, full)


def test_m_zero_returns_out(device):
    out = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    w = torch.ones(64, 64).to(torch.float8_e4m3fn).to(device)
    s = torch.full((2, 2), 127, dtype=torch.uint8, device=device)
    assert G.fp8_gemm(torch.empty(0, 64, dtype=torch.bfloat16, device=device), w, s, out) is out


@pytest.mark.parametrize(
    "what,kw,msg",
    [
        ("xq dtype", dict(xq=torch.zeros(2, 64)), r"xq: torch.float32 \(2, 64\); allowed: a 2-D torch.bfloat16"),
        ("w dtype", dict(w=torch.zeros(32, 64, dtype=torch.bfloat16)), r"w: torch.bfloat16 .*float8_e4m3fn"),
        ("w strided", dict(w=torch.ones(64, 32).to(torch.float8_e4m3fn).t()), r"w is not contiguous"),
        ("K", dict(xq=torch.zeros(2, 96, dtype=torch.bfloat16)), r"allowed: the same K"),
        (
            "K%32",
            dict(xq=torch.zeros(2, 48, dtype=torch.bfloat16), w=torch.zeros(32, 48).to(torch.float8_e4m3fn)),
            r"a multiple of 32",
        ),
        ("sw shape", dict(sw=torch.zeros(2, 2, dtype=torch.uint8)), r"sw.shape = \(2, 2\); allowed: \(1, 2\)"),
        ("sw dtype", dict(sw=torch.zeros(1, 2)), r"sw: torch.float32 \(1, 2\); allowed: torch.uint8"),
        ("out shape", dict(out=torch.zeros(2, 31, dtype=torch.bfloat16)), r"allowed: torch.bfloat16 \(2, 32\)"),
        ("out dtype", dict(out=torch.zeros(2, 32)), r"out: torch.float32 \(2, 32\)"),
        ("out cols", dict(out=torch.zeros(32, 2, dtype=torch.bfloat16).t()), r"out.stride\(1\) = 2; allowed: 1"),
        ("xq cols", dict(xq=torch.zeros(64, 2, dtype=torch.bfloat16).t()), r"xq.stride\(1\) = 2; allowed: 1"),
        ("cfg BK", dict(cfg=(128, 128, 48)), r"BK a power of two >= 32"),
        ("cfg BM", dict(cfg=G.GemmConfig(BM=8)), r"BM, BN powers of two >= 16"),
        ("cfg warps", dict(cfg=G.GemmConfig(num_warps=3)), r"num_warps and group_m powers of two"),
        ("cfg type", dict(cfg=[128, 128, 64]), r"cfg = list; allowed"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_arguments_rejected(what, kw, msg, device):
    args = dict(
        xq=torch.ones(2, 64, dtype=torch.bfloat16),
        w=torch.ones(32, 64).to(torch.float8_e4m3fn),
        sw=torch.full((1, 2), 127, dtype=torch.uint8),
        out=torch.full((2, 32), 7.0, dtype=torch.bfloat16),
    )
    cfg = kw.pop("cfg", None)
    args.update(kw)
    args = {k: v.to(device) for k, v in args.items()}
    before = args["out"].clone()
    with pytest.raises(ValueError, match=msg):
        G.fp8_gemm(args["xq"], args["w"], args["sw"], args["out"], cfg=cfg)
    assert torch.equal(args["out"], before), f"{what}: out written before the refusal"
