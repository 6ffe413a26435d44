"""The Triton FP8 linear (`kernels.fp8_linear.fp8_mm`) against its exact twin
(`reference.fp8.fp8_linear`, the released math) on fresh random inputs.

Tolerance, per output: one bf16 ulp of the reference plus K·2^-24 of the sum of the
absolute values of its terms (A = Σ |qx·qw|·sx·sw, in fp64). The kernel quantizes the
activation exactly as the reference and its products are exact; it differs only in fp32
summation order (at most K additions, each rounding by at most 2^-24 of a partial sum
bounded by A, where the reference sums each 32-term block exactly). The two bf16
roundings then differ by at most one ulp.

In the decode launch (split or not, either form of adding a split's partials) a token's
bits must not depend on m: rows are compared across m exactly.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from attnv41.kernels import fp8_linear as K
from attnv41.kernels import gemv as G
from attnv41.reference.fp8 import act_quant, e8m0_to_float, fp8_linear
from attnv41.reference.qdq import fp8_qdq

CASES = [  # (m, N, K): decode (m <= 16) with and without a split, prefill, ragged N
    (1, 64, 128),
    (1, 40, 1024),
    (5, 100, 256),
    (16, 33, 1024 if torch.cuda.is_available() else 512),  # the interpreter: 2 chunks (still split), half the programs
    (17, 64, 256),
    (40, 130, 160),
]


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _weights(gen, N, K, lo=120, hi=128):
    w = (torch.randn(N, K, generator=gen) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    s = torch.randint(lo, hi, (-(-N // 32), K // 32), generator=gen, dtype=torch.uint8)
    return w, s.view(torch.float8_e8m0fnu)


def _bound(x, w, s, ref):
    """Per output: ulp_bf16(ref) + K·2^-24·Σ|terms| (module doc)."""
    qx, sx = act_quant(x)
    sw = e8m0_to_float(s).repeat_interleave(32, 0)[: w.shape[0]]  # [N, nkb]
    nb = x.shape[1] // 32
    a = torch.einsum(
        "mbk,nbk->mnb", qx.double().abs().view(-1, nb, 32), w.double().abs().view(-1, nb, 32)
    )  # [m, N, nb]
    A = (a * sx.double()[:, None, :] * sw.double()[None]).sum(-1)
    r = ref.double().abs()
    ulp = torch.exp2(torch.floor(torch.log2(r.clamp_min(2.0**-126))) - 7)
    return ulp + x.shape[1] * 2.0**-24 * A


def _run(x, w, s, device):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), dtype=torch.bfloat16, device=device)
    got = K.fp8_mm(x.to(device), w.to(device), s.to(device), out=out)
    assert got is out
    return out.cpu()


def _assert_close(name, got, ref, bound):
    assert not torch.isnan(got.float()).any(), f"{name}: NaN in the kernel output"
    assert not torch.isnan(ref.float()).any(), f"{name}: NaN in the reference"
    err = (got.double() - ref.double()).abs()
    bad = err > bound
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        pytest.fail(
            f"{name}: {int(bad.sum())} of {err.numel()} outputs off; first at {i}: got {got[i].item()!r}, "
            f"reference {ref[i].item()!r}, bound {bound[i].item():.3g}"
        )


@pytest.mark.parametrize("m,N,Kd", CASES, ids=[f"m{m}-N{n}-K{k}" for m, n, k in CASES])
@pytest.mark.parametrize("mag", [2.0**-20, 1.0, 2.0**20], ids=["tiny", "unit", "huge"])
def test_random_vs_reference(m, N, Kd, mag, device):
    if m <= K.DECODE_MAX_M:  # the decode GEMV: one segment at one chunk, split above
        assert (G.plan(N, Kd, G.FP8)[1] > 1) == (Kd > 256)
    gen = _gen(m, N, Kd, mag)
    x = torch.randn(m, Kd, generator=gen) * mag
    # a wide dynamic range inside rows: half the blocks spread over 2^±10
    x[:, : Kd // 2] *= torch.exp2(torch.randint(-10, 11, (m, Kd // 2), generator=gen).float())
    x = x.to(torch.bfloat16)
    w, s = _weights(gen, N, Kd, lo=97, hi=138)  # weight scales 2^-30 .. 2^10
    ref = fp8_linear(x, w, s)
    _assert_close("fp8_mm out", _run(x, w, s, device), ref, _bound(x, w, s, ref))


@pytest.mark.parametrize("Kd", [128, 512], ids=["K128", "K512-split"])
def test_decode_rows_independent_of_m(Kd, device):
    """In the decode launch (m <= 16, split or not) a token's bits never depend on m or on
    its place in the call; the prefill launch (m > 16, cuBLAS) agrees within the bound."""
    gen = _gen("m", Kd)
    # the interpreter: 40 rows (2 scale blocks, a ragged row tile), 44 % of the programs
    N, M = (96 if torch.cuda.is_available() else 40), 40
    assert (G.plan(N, Kd, G.FP8)[1] > 1) == (Kd > 256), "one segment at one chunk, split above"
    x = torch.randn(M, Kd, generator=gen).to(torch.bfloat16)
    w, s = _weights(gen, N, Kd)
    one = torch.cat([_run(x[i : i + 1], w, s, device) for i in range(K.DECODE_MAX_M)])
    for m in (2, 7, 16):
        part = _run(x[:m], w, s, device)
        diff = part.view(torch.int16) != one[:m].view(torch.int16)
        assert not diff.any(), f"m = {m}: {int(diff.sum())} outputs differ from the same rows run one at a time"
    rev = _run(x[:16].flip(0), w, s, device).flip(0)
    assert torch.equal(rev.view(torch.int16), one.view(torch.int16)), "row order changes bits"
    full = _run(x, w, s, device)
    ref = fp8_linear(x, w, s)
    _assert_close("prefill launch", full, ref, _bound(x, w, s, ref))


def test_identity_weight_is_the_activation_round_trip(device):
    """With W = I (scale 2^0) every output is one product: the kernel's activation
    quantization is checked exactly against the reference's round trip. Rows: random,
    all zero, negative zero, a block with one huge value (saturation / scale rule), values
    below the amax floor, and the largest bf16 magnitudes."""
    Kd = 64
    gen = _gen("eye")
    x = torch.randn(8, Kd, generator=gen)
    x[1] = 0.0
    x[2] = -0.0
    x[3, :32] = torch.linspace(-1e-3, 1e-3, 32)
    x[3, 5] = 448.0 * 2.0**10 + 2.0**10  # rounds the scale up: the block max maps below 448
    x[4] = torch.randn(Kd, generator=gen) * 1e-7  # amax under the 1e-4 floor
    x[5] = torch.randn(Kd, generator=gen).clamp(-3, 3) * 1e38  # near the bf16 top (finite)
    x[6, ::2] = -x[6, ::2].abs()
    x = x.to(torch.bfloat16)
    w = torch.eye(Kd).to(torch.float8_e4m3fn)
    s = torch.full((Kd // 32, Kd // 32), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    got = _run(x, w, s, device)
    ref = fp8_linear(x, w, s)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), (
        f"{int((got.view(torch.int16) != ref.view(torch.int16)).sum())} outputs differ from the exact reference"
    )
    assert torch.equal(got.float(), fp8_qdq(x).float()), "W = I does not give the fp8 round trip of x"
    assert torch.equal(got[1].view(torch.int16), torch.zeros(Kd, dtype=torch.int16)), "all-zero row: not +0"


def test_every_weight_code(device):
    """Every finite e4m3 code (subnormals, ±0, ±448) in the weight, at m = 1 and 5."""
    Kd, N = 256, 64
    gen = _gen("codes")
    codes = torch.arange(256, dtype=torch.uint8).masked_fill((torch.arange(256) & 0x7F) == 0x7F, 0)
    w = codes[torch.randperm(256, generator=gen)].repeat(N, 1)[:, :Kd]
    w[1:] = w[1:, torch.randperm(Kd, generator=gen)]
    w = w.view(torch.float8_e4m3fn)
    s = torch.randint(118, 126, (N // 32, Kd // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    for m in (1, 5):
        x = torch.randn(m, Kd, generator=gen).to(torch.bfloat16)
        ref = fp8_linear(x, w, s)
        _assert_close(f"every code, m={m}", _run(x, w, s, device), ref, _bound(x, w, s, ref))


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply")  # byte 254: inf, on purpose
@pytest.mark.parametrize("N", [64, 100], ids=["N64", "N100-ragged"])
def test_dequant_equals_the_reference(N, device):
    """`dequant_bf16` (the prefill weight) against `reference.fp8.dequant_weight`, bit for bit,
    over every e4m3 code and scale bytes 0 (2^-127: bf16 subnormals), 1..254 (overflow to inf)."""
    from attnv41.reference.fp8 import dequant_weight

    Kd = 256
    gen = _gen("dequant", N)
    codes = torch.randint(0, 256, (N, Kd), generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN codes (the loaders reject non-finite weights)
    codes[0, :256] = torch.arange(256, dtype=torch.uint8).masked_fill((torch.arange(256) & 0x7F) == 0x7F, 0)
    w = codes.view(torch.float8_e4m3fn)
    s = torch.randint(0, 255, (-(-N // 32), Kd // 32), generator=gen, dtype=torch.uint8)
    s[0, :3] = torch.tensor([0, 1, 254], dtype=torch.uint8)
    got = K.dequant_bf16(w.to(device), s.to(device)).cpu()
    ref = dequant_weight(w, s)
    diff = got.view(torch.int16) != ref.view(torch.int16)
    assert not diff.any(), f"{int(diff.sum())} weights differ; first at {diff.nonzero()[0].tolist()}"


@pytest.mark.parametrize(
    "what,kw,msg",
    [
        ("x dtype", dict(x=torch.zeros(2, 64)), r"x: torch.float32; allowed: a 2-D torch.bfloat16"),
        ("w dtype", dict(w=torch.zeros(32, 64, dtype=torch.bfloat16)), r"w: torch.bfloat16; allowed: a 2-D"),
        ("K", dict(x=torch.zeros(2, 48, dtype=torch.bfloat16)), r"allowed: the same K"),
        ("scale shape", dict(scale=torch.zeros(2, 2, dtype=torch.uint8)), r"scale.shape = \(2, 2\); allowed: \(1, 2\)"),
        ("scale dtype", dict(scale=torch.zeros(1, 2)), r"scale.dtype = torch.float32; allowed"),
        ("out shape", dict(out=torch.zeros(2, 31, dtype=torch.bfloat16)), r"allowed: torch.bfloat16 \(2, 32\)"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_inputs_rejected(what, kw, msg, device):
    args = dict(
        x=torch.ones(2, 64, dtype=torch.bfloat16),
        w=torch.ones(32, 64).to(torch.float8_e4m3fn),
        scale=torch.full((1, 2), 127, dtype=torch.uint8),
        out=torch.full((2, 32), 7.0, dtype=torch.bfloat16),
    )
    args.update(kw)
    args = {k: v.to(device) for k, v in args.items()}
    before = args["out"].clone()
    with pytest.raises(ValueError, match=msg):
        K.fp8_mm(args["x"], args["w"], args["scale"], out=args["out"])
    assert torch.equal(args["out"], before), f"{what}: out written before the refusal"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, pytest.param(300, marks=pytest.mark.gpu_full)], ids=["m1", "m4", "m300"])
def test_flash_shapes_deterministic_and_graph_replay(m):
    """At the V4.1-Flash shapes: within the bound of the exact twin, the same bits on every
    call, and a CUDA graph of the call (the decode split and its counters included)
    replays to the same bits, three times."""
    dev = torch.device("cuda")
    K.prepare(dev)
    for N, Kd in ((1280, 5120), (512, 5120), (32768, 1280), (5120, 8192), (4096, 1280)):
        gen = _gen("flash", m, N, Kd)
        x = torch.randn(m, Kd, generator=gen).to(torch.bfloat16)
        w, s = _weights(gen, N, Kd)
        xd, wd, sd = x.to(dev), w.to(dev), s.to(dev)
        out = torch.empty(m, N, dtype=torch.bfloat16, device=dev)
        K.fp8_mm(xd, wd, sd, out=out)
        first = out.clone()
        rows = slice(0, min(m, 8))  # the exact twin on the CPU, on a few rows
        ref = fp8_linear(x[rows], w, s)
        _assert_close(f"N={N} K={Kd} m={m}", first[rows].cpu(), ref, _bound(x[rows], w, s, ref))
        for _ in range(3):
            K.fp8_mm(xd, wd, sd, out=out)
            assert torch.equal(out.view(torch.int16), first.view(torch.int16)), f"N={N} K={Kd}: not deterministic"
        g = torch.cuda.CUDAGraph()
        out.zero_()
        with torch.cuda.graph(g):
            K.fp8_mm(xd, wd, sd, out=out)
        for _ in range(3):
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out.view(torch.int16), first.view(torch.int16)), f"N={N} K={Kd}: replay differs"
