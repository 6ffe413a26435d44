"""FP8 weights in the decode GEMV (`gemv.gemv(..., scales=)`, kernels/gemv_fp8.py) against
its order twin (`gemv.gemv_torch`: equal bits, on the GPU and in the interpreter) and the
released math (`reference.fp8.fp8_linear`), on fresh random inputs.

Tolerance against the reference, per output: one bf16 ulp of the reference plus
K·2^-24·A, A = Σ|qx·qw|·sx·sw (fp64). Both sum the same exact terms (the activation
quantized as `act_quant`, products of e4m3 values and powers of two); the kernel in
another fp32 order (at most K rounded additions, each off by at most 2^-24 of a partial
sum bounded by A; the reference's are fewer), so the two bf16 roundings differ by at most
one ulp plus that.

m-invariance, launch-shape independence and fused-vs-alone compare bytes.
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch

from attnv41.kernels import fp8_linear as F
from attnv41.kernels import gemv as G
from attnv41.kernels import qdq
from attnv41.reference.fp8 import act_quant, e8m0_to_float, fp8_linear

BF, FP8 = torch.bfloat16, torch.float8_e4m3fn
CASES = [  # (m, N, K): one chunk, a split, a ragged N and K tail, several token blocks
    (1, 64, 256),
    (1, 40, 1280),
    (3, 33, 96),
    # the interpreter: 2 chunks of K (still split: the FP8 program target), 96 programs instead of 384
    (5, 96, 2048) if torch.cuda.is_available() else (5, 96, 512),
    (16, 32, 512),
]


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _inputs(gen, m, N, K, lo=118, hi=126):
    x = (torch.randn(m, K, generator=gen) * torch.exp2(torch.randint(-6, 7, (m, K), generator=gen).float())).to(BF)
    w = (torch.randn(N, K, generator=gen) * 64).clamp(-448, 448).to(FP8)
    s = torch.randint(lo, hi, (-(-N // 32), K // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return x, w, s


def _bound(x, w, s, ref):
    qx, sx = act_quant(x)
    sw = e8m0_to_float(s).repeat_interleave(32, 0)[: w.shape[0]]
    nb = x.shape[1] // 32
    a = torch.einsum("mbk,nbk->mnb", qx.double().abs().view(-1, nb, 32), w.double().abs().view(-1, nb, 32))
    A = (a * sx.double()[:, None, :] * sw.double()[None]).sum(-1)
    ulp = torch.exp2(torch.floor(torch.log2(ref.double().abs().clamp_min(2.0**-126))) - 7)
    return ulp + x.shape[1] * 2.0**-24 * A


def _same_bits(name, a, b):
    a, b = a.cpu().view(torch.int16), b.cpu().view(torch.int16)
    if not torch.equal(a, b):
        n = int((a != b).sum())
        i = tuple((a != b).nonzero()[0].tolist())
        pytest.fail(f"{name}: {n} of {a.numel()} outputs differ; first at {i}")


def _run(x, w, s, device, **kw):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=BF, device=device)
    G.gemv(x.to(device), (w.to(device),), (out,), (s.to(device),), **kw)
    return out


@pytest.mark.parametrize("m,N,Kd", CASES, ids=[f"m{m}-N{n}-K{k}" for m, n, k in CASES])
def test_vs_twin_and_reference(m, N, Kd, device):
    assert (G.plan(N, Kd, FP8)[1] > 1) == (Kd > 256), "one segment at one chunk, split above"
    x, w, s = _inputs(_gen("twins", m, N, Kd), m, N, Kd)
    got = _run(x, w, s, device)
    assert not torch.isnan(got.float()).any(), "NaN in the kernel output (not written?)"
    twin = torch.empty(m, N, dtype=BF)
    G.gemv_torch(x, (w,), (twin,), (s,))
    _same_bits("gemv vs gemv_torch", got, twin)
    ref = fp8_linear(x, w, s)
    err = (got.cpu().double() - ref.double()).abs()
    bound = _bound(x, w, s, ref)
    assert (err <= bound).all(), (
        f"{int((err > bound).sum())} outputs off the reference; worst {(err / bound).max():.3g}"
    )


# the split case on the interpreter: 2 chunks of K (a quarter of the programs)
SPLIT_K = 2048 if torch.cuda.is_available() else 512


@pytest.mark.parametrize("Kd", [256, SPLIT_K], ids=["K256-one-segment", f"K{SPLIT_K}-split"])
def test_rows_independent_of_m_and_launch_shape(Kd, device, monkeypatch):
    """A token's bits: the same at m = 1 and inside m = 16, and for every row tile (BN8 = 8,
    16, 32) and warp count the launch may take."""
    assert (G.plan(64, Kd, FP8)[1] > 1) == (Kd > 256), "one segment at one chunk, split above"
    x, w, s = _inputs(_gen("m", Kd), 16, 64, Kd)
    full = _run(x, w, s, device)
    for t in (0, 7, 15):
        _same_bits(f"token {t} alone vs in m = 16", _run(x[t : t + 1], w, s, device), full[t : t + 1])
    for acc8, warps in ((8, 4), (16, 1), (32, 8)):
        monkeypatch.setattr(G, "_ACC_ROWS8", acc8)
        monkeypatch.setattr(G, "_WARPS8", warps)
        _same_bits(f"BN8 = {acc8}, {warps} warps", _run(x[:1], w, s, device), full[:1])


def test_lane_tree_order_is_kept(device):
    """Lanes 0-3 carry the terms 2^16, 2^-8, −2^16, 2^-8: the lane tree's (a0 + a1) +
    (a2 + a3) gives 2^-8 (2^16 + 2^-8 rounds to 2^16), another pairing 2^-7 or 0. Random
    inputs rarely tell the pairings apart after the bf16 rounding."""
    K, N = 512, 32
    x = torch.zeros(1, K)
    x[0, :4] = torch.tensor([256.0, 2.0**-4, 256.0, 2.0**-4])
    w = torch.zeros(N, K)
    w[:, :4] = torch.tensor([256.0, 2.0**-4, -256.0, 2.0**-4])
    s = torch.full((1, K // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    got = _run(x.to(BF), w.to(FP8), s, device)
    assert torch.equal(got.cpu().float(), torch.full((1, N), 2.0**-8)), got[0, :4]


def test_fused_with_bf16_weights_equals_alone(device):
    """x → two fp8 weights and a bf16 one in one launch: each output's bits as alone."""
    gen = _gen("fused")
    x, w1, s1 = _inputs(gen, 2, 96, 512)
    _, w2, s2 = _inputs(gen, 2, 40, 512)
    wb = torch.randn(32, 512, generator=gen).to(BF)
    outs = tuple(torch.full((2, n), float("nan"), dtype=BF, device=device) for n in (96, 40, 32))
    dv = [t.to(device) for t in (x, w1, s1, w2, s2, wb)]
    G.gemv(dv[0], (dv[1], dv[3], dv[5]), outs, (dv[2], dv[4], None))
    _same_bits("fp8 weight 1 fused vs alone", outs[0], _run(x, w1, s1, device))
    _same_bits("fp8 weight 2 fused vs alone", outs[1], _run(x, w2, s2, device))
    alone = torch.empty(2, 32, dtype=BF, device=device)
    G.gemv(dv[0], (dv[5],), (alone,))
    _same_bits("bf16 weight fused vs alone", outs[2], alone)


def test_runtime_entry_points(device):
    """`fp8_linear.fp8_mm` at m ≤ 16 is this launch; `mm_many` with scales equals the
    separate calls; `mm_many_exact` (the CPU runtime) is the reference bit for bit."""
    x, w, s = _inputs(_gen("entry"), 3, 64, 512)
    xd, wd, sd = x.to(device), w.to(device), s.to(device)
    out = torch.empty(3, 64, dtype=BF, device=device)
    F.fp8_mm(xd, wd, sd, out)
    _same_bits("fp8_mm vs gemv", out, _run(x, w, s, device))
    got = (torch.empty(3, 64, dtype=BF),)
    G.mm_many_exact(x, (w,), got, (s,))
    _same_bits("mm_many_exact vs the reference", got[0], fp8_linear(x, w, s))
    many = (torch.empty(1, 64, dtype=BF, device=device),)
    G.mm_many(xd[:1], (wd,), many, (sd,))
    _same_bits("mm_many m = 1 vs fp8_mm", many[0], out[:1])


def test_every_weight_code_and_extreme_scales(device):
    """All 254 finite e4m3 codes of the weight (with −0) and scales from 2^-20 to 2^4."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # not NaN
    w = codes.view(FP8)[:, None].repeat(1, 256)[:, torch.randperm(256, generator=_gen("perm"))]
    w = w[:, :256].contiguous()
    gen = _gen("codes")
    x = torch.randn(2, 256, generator=gen).to(BF)
    s = torch.randint(107, 131, (-(-w.shape[0] // 32), 8), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    got = _run(x, w, s, device)
    twin = torch.empty_like(got, device="cpu")
    G.gemv_torch(x, (w,), (twin,), (s,))
    _same_bits("every code vs gemv_torch", got, twin)
    ref = fp8_linear(x, w, s)
    assert ((got.cpu().double() - ref.double()).abs() <= _bound(x, w, s, ref)).all()


# m5-split on the interpreter: 32 rows and 2 chunks of K, 32 programs a launch instead of 384
XQ_CASES = [(1, 40, 1280), (5, 96, 2048) if torch.cuda.is_available() else (5, 32, 512)]


@pytest.mark.parametrize("m,N,Kd", XQ_CASES, ids=["m1-split5", "m5-split"])
def test_round_trip_input_gives_the_same_bits(m, N, Kd, device):
    """`xq = fp8_qdq(x)` made outside (the producer's round trip): the fp8 weights read it
    instead of quantizing x, with the same bits, fused with a bf16 weight (which reads x)
    and through the runtime's entry points."""
    from attnv41.reference.qdq import fp8_qdq

    assert G.plan(N, Kd, FP8)[1] > 1, "both split (m1: 5 segments, by the FP8 program target)"
    gen = _gen("xq", m, N, Kd)
    x, w, s = _inputs(gen, m, N, Kd)
    wb = torch.randn(24, Kd, generator=gen).to(BF)
    xq = fp8_qdq(x, 32)
    base = _run(x, w, s, device)
    _same_bits("xq vs in-kernel quantization", _run(x, w, s, device, xq=xq.to(device)), base)
    dv = [t.to(device) for t in (x, xq, w, s, wb)]
    outs = (torch.full((m, N), float("nan"), dtype=BF, device=device), torch.empty(m, 24, dtype=BF, device=device))
    G.gemv(dv[0], (dv[2], dv[4]), outs, (dv[3], None), xq=dv[1])
    _same_bits("fused fp8 weight with xq", outs[0], base)
    alone = torch.empty(m, 24, dtype=BF, device=device)
    G.gemv(dv[0], (dv[4],), (alone,))
    _same_bits("fused bf16 weight (reads x, not xq)", outs[1], alone)
    out = torch.empty(m, N, dtype=BF, device=device)
    F.fp8_mm(dv[0], dv[2], dv[3], out, xq=dv[1])
    _same_bits("fp8_mm with xq", out, base)
    got = (torch.empty(m, N, dtype=BF),)
    G.mm_many_exact(x, (w,), got, (s,), xq=xq)
    _same_bits("mm_many_exact with xq vs the reference", got[0], fp8_linear(x, w, s))


BAD_XQ = [
    ("xq of another shape", "shape", "xq:"),
    ("xq not bf16", "dtype", "xq:"),
    ("xq without an fp8 weight", "bf16-only", "no weight is torch.float8_e4m3fn"),
    ("xq with a strided last dim", "stride", "xq.stride(-1)"),
]


@pytest.mark.parametrize("what,edit,msg", BAD_XQ, ids=[b[0] for b in BAD_XQ])
def test_bad_round_trip_input_rejected(what, edit, msg, device):
    x, w, s = (t.to(device) for t in _inputs(_gen("bad-xq"), 2, 32, 256))
    out = torch.full((2, 32), 7.0, dtype=BF, device=device)
    weights, scales, xq = (w,), (s,), x.clone()
    if edit == "shape":
        xq = x[:1].clone()
    elif edit == "dtype":
        xq = x.float()
    elif edit == "bf16-only":
        weights, scales = (torch.zeros(32, 256, dtype=BF, device=device),), (None,)
    elif edit == "stride":
        xq = torch.zeros(256, 2, dtype=BF, device=device).t()
    for call in (
        lambda: G.gemv(x, weights, (out,), scales, xq=xq),
        lambda: G.gemv_torch(x, weights, (out,), scales, xq=xq),
        lambda: G.mm_many(x, weights, (out,), scales, xq=xq),
    ):
        with pytest.raises(ValueError, match=re.escape(msg)):
            call()
        assert (out == 7.0).all(), f"{what}: the output was written before the error"


BAD = [
    ("scale for a bf16 weight", "bf16-scale", "scales[0]"),
    ("fp8 weight without scale", "no-scale", "scales[0]"),
    ("scale of the wrong shape", "shape", "scales[0]"),
    ("scale of the wrong dtype", "dtype", "scales[0]"),
    ("K not a multiple of 32", "k", "multiple of 32"),
    ("fp32 output of an fp8 weight", "out", "outs[0]"),
    ("scales not one per weight", "count", "scales"),
]


@pytest.mark.parametrize("what,edit,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_rejected(what, edit, msg, device):
    x, w, s = (t.to(device) for t in _inputs(_gen("bad"), 1, 32, 256))
    out = torch.full((1, 32), 7.0, dtype=BF, device=device)
    weights, outs, scales = (w,), (out,), (s,)
    if edit == "bf16-scale":
        weights = (torch.zeros(32, 256, dtype=BF, device=device),)
    elif edit == "no-scale":
        scales = (None,)
    elif edit == "shape":
        scales = (s[:, :4].contiguous(),)
    elif edit == "dtype":
        scales = (s.view(torch.uint8).float(),)
    elif edit == "k":
        x, weights, scales = x[:, :240], (w[:, :240].contiguous(),), (s[:, :7].contiguous(),)
    elif edit == "out":
        outs = (torch.full((1, 32), 7.0, dtype=torch.float32, device=device),)
    elif edit == "count":
        scales = (s, s)
    with pytest.raises(ValueError, match=re.escape(msg)):
        G.gemv(x, weights, outs, scales)
    assert (outs[0] == 7.0).all(), f"{what}: the output was written before the error"


FLASH = {"wq_a": (5120, 1280), "wkv": (5120, 512), "wq_b": (1280, 32768), "wo_b": (8192, 5120)}  # name: (K, N)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, pytest.param(16, marks=pytest.mark.gpu_full)], ids=["m1", "m16"])
def test_flash_shapes_on_cuda(m):
    """At the V4.1-Flash shapes on the GPU: the order twin's bits, the bound against the
    reference (2 tokens), the last token alone = inside m, equal bits on a second call and
    from a CUDA graph replay."""
    dev = torch.device("cuda")
    F.prepare(dev)
    for name, (Kd, N) in FLASH.items():
        x, w, s = (t.to(dev) for t in _inputs(_gen("flash", name, m), m, N, Kd, lo=116, hi=124))
        first = _run(x, w, s, dev)
        twin = torch.empty_like(first)
        G.gemv_torch(x, (w,), (twin,), (s,))
        _same_bits(f"{name} vs gemv_torch", first, twin)
        ref = fp8_linear(x[:2].cpu(), w.cpu(), s.cpu())
        assert ((first[:2].cpu().double() - ref.double()).abs() <= _bound(x[:2].cpu(), w.cpu(), s.cpu(), ref)).all()
        _same_bits(f"{name} last token alone", _run(x[m - 1 :], w, s, dev), first[m - 1 :])
        out = torch.empty_like(first)
        G.gemv(x, (w,), (out,), (s,))
        _same_bits(f"{name} second call", out, first)
        G.gemv(x, (w,), (out,), (s,), xq=qdq.fp8_qdq(x))
        _same_bits(f"{name} from the round trip xq", out, first)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            G.gemv(x, (w,), (out,), (s,))
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        _same_bits(f"{name} graph replay", out, first)
