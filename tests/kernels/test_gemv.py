"""The decode GEMVs (`kernels.gemv.gemv`, `group_gemv`) against the fp64 twins
(`linear.mm_exact`, `group_mm_exact`) and against their own order twin (`gemv_torch`,
`group_gemv_torch`), on fresh random inputs.

Tolerance against the fp64 twin, per output, with A = Σ_k |w[n, k]·x[t, k]| (fp64): the
kernel's fp32 sum S' of exact products (bf16 × bf16, and fp32 × bf16 in the GPU's fma)
passes each term through at most d = IPS + log2(BK) + SEGS rounded additions (the lane
chain, the lane tree, the segment sum; `plan` gives BK, SEGS, IPS = ceil(K/BK)/SEGS), one
more where the interpreter rounds an fp32 product, so |S' − S| ≤ E = 1.01·d·2^-24·A.
- bf16 outputs: both sides round once to bf16 (each by at most half an ulp, and an ulp
  is at most 2^-7 of the value): |out − ref| ≤ 2^-7·|ref| + 1.01·E + 2^-133.
- fp32 outputs: only the reference rounds: |out − ref| ≤ 2^-23·|ref| + 1.01·E + 2^-149.
Against the order twin the bits must be equal (bf16 weights everywhere; fp32 weights in
the interpreter, whose fma rounds the product as the twin does).

m-invariance, fused-vs-alone and token-order tests compare bytes.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

from attnv41.kernels import gemv as G
from attnv41.kernels import linear
from attnv41.kernels._triton import interpreting

BF, F32 = torch.bfloat16, torch.float32


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == BF else t.view(torch.int32)


def _rand(gen, shape, dtype, spread: int = 6) -> torch.Tensor:
    """Normal values times 2^U(-spread, spread): a wide dynamic range inside each row."""
    v = torch.randn(*shape, generator=gen) * torch.exp2(
        torch.randint(-spread, spread + 1, shape, generator=gen).float()
    )
    return v.to(dtype)


def _poisoned(m: int, N: int, dtype, device) -> torch.Tensor:
    return torch.full((m, N), float("nan"), dtype=dtype, device=device)


def _bound(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, p: tuple[int, int]) -> torch.Tensor:
    """Per output the module doc's tolerance for a weight run with plan p = (BK, SEGS)."""
    bk, segs = p
    ips = -(-x.shape[-1] // bk) // segs
    d = ips + int(math.log2(bk)) + segs + (1 if w.dtype == F32 else 0)
    A = x.double().abs() @ w.double().abs().t()
    E = 1.01 * d * 2.0**-24 * A
    r = ref.double().abs()
    if ref.dtype == BF:
        return 2.0**-7 * r + 1.01 * E + 2.0**-133
    return 2.0**-23 * r + 1.01 * E + 2.0**-149


def _assert_close(name: str, got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    got, ref = got.cpu(), ref.cpu()
    assert not torch.isnan(got.float()).any(), f"{name}: NaN in the kernel output (poisoned output not written?)"
    assert not torch.isnan(ref.float()).any(), f"{name}: NaN in the reference"
    err = (got.double() - ref.double()).abs()
    bad = err > bound
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        pytest.fail(
            f"{name}: {int(bad.sum())} of {err.numel()} outputs off; first at {i}: got {got[i].item()!r}, "
            f"reference {ref[i].item()!r}, bound {bound[i].item():.3g}; worst error/bound "
            f"{(err / bound).max().item():.3g}"
        )


def _assert_same_bits(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    diff = _bits(got) != _bits(want)
    if diff.any():
        i = tuple(diff.nonzero()[0].tolist())
        pytest.fail(
            f"{name}: {int(diff.sum())} of {diff.numel()} outputs differ in bits; first at {i}: "
            f"{got[i].item()!r} vs {want[i].item()!r}"
        )


def _run(x, weights, device):
    """gemv on `device` into NaN-poisoned outputs; the outputs on the CPU."""
    outs = tuple(_poisoned(x.shape[0], w.shape[0], w.dtype, device) for w in weights)
    got = G.gemv(x.to(device), tuple(w.to(device) for w in weights), outs)
    assert isinstance(got, tuple) and all(a is b for a, b in zip(got, outs)), "gemv must return its outs"
    return [o.cpu() for o in outs]


def _order_twin(x, weights):
    outs = tuple(torch.empty(x.shape[0], w.shape[0], dtype=w.dtype) for w in weights)
    return list(G.gemv_torch(x, weights, outs))


def _check_against_twins(name, x, weights, got) -> None:
    exact_fp32 = interpreting()  # the GPU's fma keeps fp32 products exact: within the bound only
    for i, (w, g, o) in enumerate(zip(weights, got, _order_twin(x, weights))):
        ref = linear.mm_exact(x, w, torch.empty_like(g))
        _assert_close(
            f"{name} out[{i}] vs mm_exact", g, ref, _bound(x, w, ref, G.plan(w.shape[0], x.shape[1], w.dtype))
        )
        if w.dtype == BF or exact_fp32:
            _assert_same_bits(f"{name} out[{i}] vs gemv_torch", g, o)


CASES = [  # (m, K, [(N, dtype), ...])
    (1, 96, [(13, BF)]),
    (1, 256, [(64, F32)]),
    (2, 512, [(40, BF), (7, F32)]),
    (5, 1000, [(33, BF)]),
    (7, 384, [(16, BF), (24, F32), (1, BF)]),
    (16, 128, [(20, BF), (9, F32)]),
]


@pytest.mark.parametrize(
    "m,Kd,spec", CASES, ids=[f"m{m}-K{k}-" + "+".join(f"{n}{str(d)[6:]}" for n, d in s) for m, k, s in CASES]
)
def test_vs_twins(m, Kd, spec, device):
    gen = _gen("twins", m, Kd, spec)
    x = _rand(gen, (m, Kd), BF)
    weights = tuple(_rand(gen, (N, Kd), dt) for N, dt in spec)
    _check_against_twins(f"m={m} K={Kd}", x, weights, _run(x, weights, device))


@pytest.mark.parametrize("dtype", [BF, F32], ids=["bf16", "fp32"])
def test_split_segments_of_several_chunks(dtype, device, monkeypatch):
    """Narrow chunks and a low program target force SEGS > 1 with several chunks per
    segment and a ragged tail (K = 180: 6 chunks of 32, the last one 20 wide)."""
    monkeypatch.setitem(G._BK, BF, 32)
    monkeypatch.setitem(G._BK, F32, 32)
    monkeypatch.setattr(G, "_TARGET_PROGRAMS", 6)
    m, Kd, N = 3, 180, 40
    assert G.plan(N, Kd, dtype) == (32, 2), "the plan this test means to exercise"
    gen = _gen("split", dtype)
    x = _rand(gen, (m, Kd), BF)
    w = _rand(gen, (N, Kd), dtype)
    _check_against_twins("split", x, (w,), _run(x, (w,), device))


# the split case on the interpreter: 2 chunks of K (half the programs)
SPLIT_K = 1024 if torch.cuda.is_available() else 512


@pytest.mark.parametrize("Kd", [256, SPLIT_K], ids=["K256-one-segment", f"K{SPLIT_K}-split"])
def test_rows_independent_of_m(Kd, device):
    """A token's bytes do not depend on m (1, 2, 7, 16: different token blocks and tile
    shapes), on its place in the call, or on the other tokens (one of them NaN)."""
    assert (G.plan(40, Kd, BF)[1] > 1) == (Kd > 256), "the bf16 weight: one segment at one chunk, split above"
    gen = _gen("m", Kd)
    weights = (_rand(gen, (40, Kd), BF), _rand(gen, (12, Kd), F32))
    x = _rand(gen, (G.DECODE_MAX_M, Kd), BF)
    alone = [_run(x[t : t + 1], weights, device) for t in range(G.DECODE_MAX_M)]
    for m in (2, 7, 16):
        got = _run(x[:m], weights, device)
        for i in range(len(weights)):
            _assert_same_bits(f"m={m} out[{i}]", got[i], torch.cat([a[i] for a in alone[:m]]))
    rev = _run(x.flip(0), weights, device)
    for i in range(len(weights)):
        _assert_same_bits(f"reversed tokens out[{i}]", rev[i].flip(0), torch.cat([a[i] for a in alone]))
    xn = x[:7].clone()
    xn[3, 5] = float("nan")
    got = _run(xn, weights, device)
    for i in range(len(weights)):
        assert torch.isnan(got[i][3].float()).all(), f"out[{i}]: a NaN in token 3 must reach all its outputs"
        keep = [0, 1, 2, 4, 5, 6]
        _assert_same_bits(f"NaN neighbour out[{i}]", got[i][keep], torch.cat([alone[t][i] for t in keep]))


@pytest.mark.parametrize("m", [1, 5], ids=["m1", "m5"])
def test_fused_equals_alone(m, device):
    """Each output of a fused launch has the bytes of a launch with that weight alone,
    whatever the other weights (dtypes, shapes, split or not) and their order."""
    Kd = 512
    gen = _gen("fused", m)
    x = _rand(gen, (m, Kd), BF)
    weights = (_rand(gen, (40, Kd), BF), _rand(gen, (24, Kd), F32), _rand(gen, (13, Kd), BF), _rand(gen, (3, Kd), F32))
    fused = _run(x, weights, device)
    for i, w in enumerate(weights):
        _assert_same_bits(f"fused out[{i}] vs alone", fused[i], _run(x, (w,), device)[0])
    order = [2, 0, 3, 1]
    perm = _run(x, tuple(weights[i] for i in order), device)
    for j, i in enumerate(order):
        _assert_same_bits(f"permuted out[{i}]", perm[j], fused[i])


def test_strided_views(device):
    """x a row view of a wider buffer, outputs column slices of wider buffers: the same
    bytes as contiguous tensors, and the columns around them untouched."""
    m, Kd = 4, 256
    gen = _gen("strided")
    big_x = _rand(gen, (m, Kd + 64), BF)
    x = big_x[:, 32 : 32 + Kd]
    weights = (_rand(gen, (24, Kd), BF), _rand(gen, (16, Kd), F32))
    bufs = [torch.full((m, w.shape[0] + 11), 7.0, dtype=w.dtype, device=device) for w in weights]
    outs = tuple(b[:, 5 : 5 + w.shape[0]] for b, w in zip(bufs, weights))
    outs[0].fill_(float("nan"))
    outs[1].fill_(float("nan"))
    G.gemv(big_x.to(device)[:, 32 : 32 + Kd], tuple(w.to(device) for w in weights), outs)
    want = _run(x.contiguous(), weights, device)
    for i, (b, w) in enumerate(zip(bufs, weights)):
        _assert_same_bits(f"strided out[{i}]", outs[i], want[i])
        rest = torch.cat([b[:, :5], b[:, 5 + w.shape[0] :]], dim=1).cpu()
        assert (rest == 7.0).all(), f"out[{i}]: columns outside the view written"


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply", "ignore:invalid value encountered in multiply")
def test_special_values(device):
    """Zero products give +0; an inf weight gives ±inf against a nonzero x and NaN against
    a zero one; a sum past the fp32 range is inf; an exact large result stays exact."""
    Kd = 128
    x = torch.zeros(3, Kd, dtype=BF)
    x[1, 0] = 1.0
    x[2, :] = 2.0**100
    w = torch.zeros(4, Kd, dtype=BF)
    w[1, 0] = float("inf")
    w[2, :] = 2.0**100  # against x[2]: 128 · 2^200, past fp32 and bf16
    w[3, 1] = -3.0
    got = _run(x, (w,), device)[0]
    assert torch.equal(_bits(got[0, [0, 2, 3]]), torch.zeros(3, dtype=torch.int16)), f"zero products: {got[0]}"
    assert torch.isnan(got[0, 1].float()), "inf · 0 must give NaN"
    assert got[1, 1].item() == float("inf") and got[1, 2].item() == 2.0**100, f"row 1: {got[1]}"
    assert got[2, 2].item() == float("inf"), f"overflow: {got[2, 2].item()} is not inf"
    assert got[2, 3].item() == -3.0 * 2.0**100, f"exact: {got[2, 3].item()}"


@pytest.mark.parametrize("m", [1, 3], ids=["m1", "m3"])
def test_group_gemv(m, device):
    """o a view of a [m, H, D] tensor with H·D = G·gw (and a sliced one), out a slice of
    a wider buffer: against group_mm_exact (the bound) and the order twin (the bits)."""
    Gn, r, gw, H = 4, 24, 320, 8
    gen = _gen("group", m)
    heads = _rand(gen, (m, H + 1, Gn * gw // H), BF)  # one head more: o_view has a row stride > G·gw
    o_view = heads[:, 1:].view(m, Gn, gw)  # strides ((H + 1)·D, gw, 1)
    o = o_view.contiguous()
    w = _rand(gen, (Gn, r, gw), BF)
    for name, src in (("view", o_view), ("copy", o)):
        buf = torch.full((m, Gn, r + 3), 7.0, dtype=BF, device=device)
        out = buf[:, :, 2 : 2 + r]
        out.fill_(float("nan"))
        assert G.group_gemv(src.to(device), w.to(device), out) is out
        ref = linear.group_mm_exact(src, w, torch.empty(m, Gn, r, dtype=BF))
        p = G.plan(Gn * r, gw, BF)
        for g in range(Gn):
            _assert_close(f"{name} group {g}", out[:, g], ref[:, g], _bound(src[:, g], w[g], ref[:, g], p))
        twin = G.group_gemv_torch(src, w, torch.empty(m, Gn, r, dtype=BF))
        _assert_same_bits(f"{name} vs group_gemv_torch", out, twin)
        assert (buf[:, :, :2].cpu() == 7.0).all() and (buf[:, :, 2 + r :].cpu() == 7.0).all(), "padding written"


def test_group_rows_independent_of_m(device):
    Gn, r, gw = 2, 16, 512
    gen = _gen("group-m")
    o = _rand(gen, (9, Gn, gw), BF)
    w = _rand(gen, (Gn, r, gw), BF)

    def run(src):
        out = torch.full((src.shape[0], Gn, r), float("nan"), dtype=BF, device=device)
        return G.group_gemv(src.to(device), w.to(device), out).cpu()

    alone = torch.cat([run(o[t : t + 1]) for t in range(9)])
    _assert_same_bits("group m=9", run(o), alone)


def _fp8_group_weight(gen, Gn: int, r: int, gw: int):
    """(e4m3 [Gn, r, gw], e8m0 scale [Gn·r/32, gw/32], its exact bf16 [Gn, r, gw]): a bf16
    weight of wide range put through the checkpoint's block quantization."""
    from attnv41.reference.fp8 import dequant_weight, quant_weight

    q, sc = quant_weight(_rand(gen, (Gn * r, gw), BF))
    return q.view(Gn, r, gw), sc, dequant_weight(q, sc).view(Gn, r, gw)


@pytest.mark.parametrize("m", [1, 3], ids=["m1", "m3"])
def test_group_gemv_fp8_stored_weight(m, device):
    """wo_a as the checkpoint stores it (e4m3 + e8m0 block scales): the bits of the order
    twin (terms o·sw·w), within the bound of the exact product with the weight's bf16
    dequantization (the same values), from a strided view of o; gw not a multiple of BK
    (the tail chunk masked)."""
    Gn, r, gw, H = 3, 32, 320, 6
    gen = _gen("group-fp8", m)
    heads = _rand(gen, (m, H + 1, Gn * gw // H), BF)
    o_view = heads[:, 1:].view(m, Gn, gw)
    q, sc, deq = _fp8_group_weight(gen, Gn, r, gw)
    for name, src in (("view", o_view), ("copy", o_view.contiguous())):
        out = torch.full((m, Gn, r), float("nan"), dtype=BF, device=device)
        assert G.group_gemv(src.to(device), q.to(device), out, sc.to(device)) is out
        ref = linear.group_mm_exact(src, deq, torch.empty(m, Gn, r, dtype=BF))
        exact = linear.group_mm_exact(src, q, torch.empty(m, Gn, r, dtype=BF), sc)
        _assert_same_bits(f"{name}: group_mm_exact with the scale vs on the bf16", exact, ref)
        p = G.plan(Gn * r, gw, G.FP8)
        for g in range(Gn):
            _assert_close(f"{name} group {g}", out[:, g], ref[:, g], _bound(src[:, g], deq[g], ref[:, g], p))
        twin = G.group_gemv_torch(src, q, torch.empty(m, Gn, r, dtype=BF), sc)
        _assert_same_bits(f"{name} vs group_gemv_torch", out, twin)
    alone = torch.cat(
        [
            G.group_gemv(o_view[t : t + 1].to(device), q.to(device), torch.empty(1, Gn, r, dtype=BF, device=device),
                         sc.to(device)).cpu()
            for t in range(m)
        ]
    )  # fmt: skip
    _assert_same_bits("rows alone vs together", out, alone)
    got = G.group_mm_auto(
        o_view.to(device), q.to(device), torch.empty(m, Gn, r, dtype=BF, device=device), sc.to(device)
    )
    if torch.device(device).type == "cuda" and m <= G.AUTO_MAX_M:
        _assert_same_bits("group_mm_auto (the GEMV)", got, out)
    else:  # dequantized for cuBLAS (on the CPU: torch's bmm)
        want = linear.group_mm(o_view.to(device), deq.to(device), torch.empty(m, Gn, r, dtype=BF, device=device))
        _assert_same_bits("group_mm_auto (dequantized)", got, want)


@pytest.mark.parametrize(
    "what, change, msg",
    [
        ("bf16 weight with a scale", "bf16", r"w: torch\.bfloat16 \(3, 32, 64\); allowed: a 3-D torch\.float8_e4m3fn"),
        ("scale shape", "short", r"scales\[0\]: torch\.float8_e8m0fnu \(2, 2\)"),
        ("r not a multiple of 32", "r", r"allowed: r and gw multiples of 32"),
    ],
    ids=["bf16-with-scale", "scale-shape", "r-block"],
)
def test_group_gemv_fp8_bad_inputs_rejected(what, change, msg, device):
    gen = _gen("group-fp8-bad", what)
    q, sc, deq = _fp8_group_weight(gen, 3, 32, 64)
    o = _rand(gen, (1, 3, 64), BF).to(device)
    out = torch.full((1, 3, 32), float("nan"), dtype=BF, device=device)
    w = q
    if change == "bf16":
        w = deq
    elif change == "short":
        sc = sc[:2].contiguous()
    elif change == "r":
        q2, sc = _fp8_group_weight(gen, 3, 16, 64)[:2]
        w = q2
        out = torch.full((1, 3, 16), float("nan"), dtype=BF, device=device)
    with pytest.raises(ValueError, match=msg):
        G.group_gemv(o, w.to(device), out, sc.to(device))
    assert torch.isnan(out.float()).all(), f"{what}: out written before the check"


@pytest.mark.parametrize("m", [1, 3, 17], ids=["m1-gemv", "m3-blas", "m17-blas"])
def test_runtime_entry_points(m, device):
    """`mm_auto` / `mm_many` / `group_mm_auto`: the fused GEMV for one token (AUTO_MAX_M) on
    CUDA (its bits), `linear.mm` / `group_mm` otherwise (theirs); `mm_many_exact` is
    `linear.mm_exact` per weight at any m."""
    Kd = 256
    gen = _gen("entry", m)
    x = _rand(gen, (m, Kd), BF).to(device)
    weights = (_rand(gen, (24, Kd), BF).to(device), _rand(gen, (8, Kd), F32).to(device))
    decode = x.is_cuda and m <= G.AUTO_MAX_M

    def fresh():
        return tuple(torch.full((m, w.shape[0]), float("nan"), dtype=w.dtype, device=device) for w in weights)

    want = fresh()
    for w, o in zip(weights, want):
        G.gemv(x, (w,), (o,)) if decode else linear.mm(x, w, o)
    got = G.mm_many(x, weights, fresh())
    for i in range(2):
        _assert_same_bits(f"mm_many out[{i}]", got[i], want[i])
        one = G.mm_auto(x, weights[i], fresh()[i])
        _assert_same_bits(f"mm_auto out[{i}]", one, want[i])
    exact = G.mm_many_exact(x, weights, fresh())
    for i, w in enumerate(weights):
        _assert_same_bits(f"mm_many_exact out[{i}]", exact[i], linear.mm_exact(x, w, torch.empty_like(exact[i])))
    o = _rand(gen, (m, 2, Kd), BF).to(device)
    wg = _rand(gen, (2, 16, Kd), BF).to(device)
    want_g = torch.empty(m, 2, 16, dtype=BF, device=device)
    G.group_gemv(o, wg, want_g) if decode else linear.group_mm(o, wg, want_g)
    _assert_same_bits("group_mm_auto", G.group_mm_auto(o, wg, torch.empty_like(want_g)), want_g)


def test_plan_is_a_constant_of_the_shape():
    """The production plans of the V4.1-Flash weights (their bits: changing one is a
    numerics change), each a whole number of chunks per segment."""
    flash = {
        (1280, 5120, BF): (256, 20),  # wq_a
        (512, 5120, BF): (256, 20),  # wkv, compressor.wkv (ratio 1)
        (32, 5120, BF): (256, 20),  # indexer.weights_proj
        (512, 5120, F32): (128, 40),  # compressor.wkv / wgate (ratio >= 2)
        (32768, 1280, BF): (256, 1),  # wq_b
        (4096, 1280, BF): (256, 5),  # indexer.wq_b
        (5120, 8192, BF): (256, 4),  # wo_b
        (8 * 1024, 4096, BF): (256, 2),  # wo_a, grouped
    }
    F8 = torch.float8_e4m3fn  # FP8: one chunk per program, but the shapes in `_PLAN_SEGS`
    flash |= {
        (1280, 5120, F8): (256, 20),  # wq_a (with wkv: the x launch)
        (512, 5120, F8): (256, 20),  # wkv
        (32768, 1280, F8): (256, 1),  # wq_b
        (4096, 1280, F8): (256, 1),  # indexer.wq_b
        (5120, 8192, F8): (256, 8),  # wo_b
        (8 * 1024, 4096, F8): (256, 16),  # wo_a, grouped
    }
    for (N, Kd, dt), want in flash.items():
        got = G.plan(N, Kd, dt)
        assert got == want, f"plan({N}, {Kd}, {dt}) = {got}; pinned {want}"
        assert (-(-Kd // got[0])) % got[1] == 0, f"plan({N}, {Kd}): segments of whole chunks"
    with pytest.raises(ValueError, match=r"dtype = torch.float16; allowed"):
        G.plan(8, 8, torch.float16)


def _gemv_args(device):
    return dict(
        x=torch.ones(2, 64, dtype=BF, device=device),
        weights=(torch.ones(32, 64, dtype=BF, device=device), torch.ones(8, 64, dtype=F32, device=device)),
        outs=(torch.full((2, 32), 7.0, dtype=BF, device=device), torch.full((2, 8), 7.0, dtype=F32, device=device)),
    )


BAD = [
    ("x dtype", lambda a: a.update(x=a["x"].float()), r"x: torch.float32 \(2, 64\); allowed: a 2-D torch.bfloat16"),
    ("x 1-D", lambda a: a.update(x=a["x"][0]), r"x: .*; allowed: a 2-D torch.bfloat16"),
    ("m = 17", lambda a: a.update(x=torch.ones(17, 64, dtype=BF, device=a["x"].device)), r"m = 17; allowed: 1..16"),
    ("m = 0", lambda a: a.update(x=a["x"][:0]), r"m = 0; allowed: 1..16"),
    ("x stride", lambda a: a.update(x=torch.ones(64, 2, dtype=BF, device=a["x"].device).t()), r"x.stride\(-1\) = 2"),
    ("K", lambda a: a.update(x=torch.ones(2, 48, dtype=BF, device=a["x"].device)), r"allowed: \[N, 48\]"),
    ("w dtype", lambda a: a.update(weights=(a["weights"][0].half(), a["weights"][1])), r"weights\[0\]: torch.float16"),
    ("w strided", lambda a: a.update(weights=(a["weights"][0], a["weights"][1].t().contiguous().t())), "contiguous"),
    ("w device", lambda a: a.update(weights=(a["weights"][0].to("meta"), a["weights"][1])), r"weights\[0\].device"),
    ("no weights", lambda a: a.update(weights=(), outs=()), r"len\(weights\) = 0; allowed: 1..6"),
    ("7 weights", lambda a: a.update(weights=a["weights"][:1] * 7, outs=a["outs"][:1] * 7), r"= 7; allowed: 1..6"),
    ("a tensor", lambda a: a.update(weights=a["weights"][0]), r"weights: Tensor; allowed: a tuple"),
    ("outs count", lambda a: a.update(outs=a["outs"][:1]), r"len\(outs\) = 1; allowed: 2"),
    (
        "out dtype",
        lambda a: a.update(outs=(a["outs"][0], a["outs"][1].bfloat16())),
        r"outs\[1\]: .*allowed: torch.float32",
    ),
    ("out shape", lambda a: a.update(outs=(a["outs"][0][:, :31], a["outs"][1])), r"allowed: torch.bfloat16 \(2, 32\)"),
]


@pytest.mark.parametrize("what,edit,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_rejected(what, edit, msg, device):
    a = _gemv_args(device)
    edit(a)
    before = [o.clone() for o in a["outs"]] if isinstance(a["outs"], tuple) else []
    with pytest.raises(ValueError, match=msg):
        G.gemv(a["x"], a["weights"], a["outs"])
    for o, b in zip(a["outs"], before):
        assert torch.equal(o, b), f"{what}: an output written before the refusal"


GROUP_BAD = [
    ("o 2-D", dict(o=torch.ones(2, 64, dtype=BF)), r"o: .*allowed: a 3-D torch.bfloat16"),
    ("w groups", dict(w=torch.ones(3, 16, 64, dtype=BF)), r"w.shape = \(3, 16, 64\); allowed: \[2, r >= 1, 64\]"),
    ("w dtype", dict(w=torch.ones(2, 16, 64)), r"w: torch.float32 .*allowed: a 3-D torch.bfloat16"),
    ("out shape", dict(out=torch.full((2, 2, 15), 7.0, dtype=BF)), r"out: .*allowed: torch.bfloat16 \(2, 2, 16\)"),
    ("m = 17", dict(o=torch.ones(17, 2, 64, dtype=BF)), r"m = 17; allowed: 1..16"),
]


@pytest.mark.parametrize("what,kw,msg", GROUP_BAD, ids=[b[0] for b in GROUP_BAD])
def test_group_bad_inputs_rejected(what, kw, msg, device):
    a = dict(
        o=torch.ones(2, 2, 64, dtype=BF), w=torch.ones(2, 16, 64, dtype=BF), out=torch.full((2, 2, 16), 7.0, dtype=BF)
    )
    a.update(kw)
    a = {k: v.to(device) for k, v in a.items()}
    before = a["out"].clone()
    with pytest.raises(ValueError, match=msg):
        G.group_gemv(a["o"], a["w"], a["out"])
    assert torch.equal(a["out"], before), f"{what}: out written before the refusal"


FLASH = {  # name: (K, [(N, dtype), ...]) as the runtime fuses them
    "x->wq_a+wkv+weights_proj+compressor": (5120, [(1280, BF), (512, BF), (32, BF), (512, F32), (512, F32)]),
    "cq->wq_b+indexer.wq_b": (1280, [(32768, BF), (4096, BF)]),
    "wo_b": (8192, [(5120, BF)]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, pytest.param(16, marks=pytest.mark.gpu_full)], ids=["m1", "m16"])
def test_flash_shapes_on_cuda(m):
    """At the V4.1-Flash shapes on the GPU: the bound against mm_exact (a few tokens),
    the bits of the order twin (bf16 weights), fused = alone, m = 1 rows = m rows, the
    same bits on every call, and a CUDA graph of the call replaying to them."""
    dev = torch.device("cuda")
    G.prepare(dev)
    for name, (Kd, spec) in FLASH.items():
        gen = _gen("flash", name, m)
        x = _rand(gen, (m, Kd), BF, spread=2)
        weights = tuple(_rand(gen, (N, Kd), dt, spread=2) for N, dt in spec)
        xd, wd = x.to(dev), tuple(w.to(dev) for w in weights)
        outs = tuple(torch.full((m, w.shape[0]), float("nan"), dtype=w.dtype, device=dev) for w in weights)
        G.gemv(xd, wd, outs)
        first = [o.clone() for o in outs]
        rows = slice(0, min(m, 4))
        for i, (w, o) in enumerate(zip(wd, first)):
            ref = linear.mm_exact(x[rows], weights[i], torch.empty(o[rows].shape, dtype=o.dtype))
            _assert_close(f"{name} out[{i}]", o[rows], ref, _bound(x[rows], weights[i], ref, G.plan(*w.shape, w.dtype)))
            if w.dtype == BF:
                twin = G.gemv_torch(xd, (w,), (torch.empty_like(o),))[0]
                _assert_same_bits(f"{name} out[{i}] vs gemv_torch", o, twin)
            alone = (torch.empty_like(o),)
            G.gemv(xd, (w,), alone)
            _assert_same_bits(f"{name} out[{i}] fused vs alone", o, alone[0])
            one = (torch.empty_like(o[:1]),)
            G.gemv(xd[m - 1 :], (w,), one)
            _assert_same_bits(f"{name} out[{i}] last token alone", o[m - 1 :], one[0])
        for _ in range(3):
            G.gemv(xd, wd, outs)
            for i, (o, f) in enumerate(zip(outs, first)):
                _assert_same_bits(f"{name} out[{i}] repeat", o, f)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            G.gemv(xd, wd, outs)
        for _ in range(3):
            for o in outs:
                o.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            for i, (o, f) in enumerate(zip(outs, first)):
                _assert_same_bits(f"{name} out[{i}] graph replay", o, f)
    # wo_a: G = 8 groups of [1024, 4096], o a view of the [m, 64, 512] attention output
    gen = _gen("flash-wo_a", m)
    o = _rand(gen, (m, 64, 512), BF, spread=2).to(dev).view(m, 8, 4096)
    w = _rand(gen, (8, 1024, 4096), BF, spread=2).to(dev)
    out = torch.full((m, 8, 1024), float("nan"), dtype=BF, device=dev)
    G.group_gemv(o, w, out)
    _assert_same_bits("wo_a vs group_gemv_torch", out, G.group_gemv_torch(o, w, torch.empty_like(out)))
    ref = linear.group_mm_exact(o[:1].cpu(), w.cpu(), torch.empty(1, 8, 1024, dtype=BF))
    p = G.plan(8 * 1024, 4096, BF)
    for g_ in range(8):
        _assert_close(f"wo_a group {g_}", out[:1, g_], ref[:, g_], _bound(o[:1, g_].cpu(), w[g_].cpu(), ref[:, g_], p))
    # wo_a stored as the checkpoint's e4m3 + scales: the order twin's bits, the bound against
    # its bf16, each token alone, and a graph replay
    q, sc, deq = _fp8_group_weight(gen, 8, 1024, 4096)
    qd, scd = q.to(dev), sc.to(dev)
    out8 = torch.full((m, 8, 1024), float("nan"), dtype=BF, device=dev)
    G.group_gemv(o, qd, out8, scd)
    _assert_same_bits("wo_a fp8 vs group_gemv_torch", out8, G.group_gemv_torch(o, qd, torch.empty_like(out8), scd))
    ref8 = linear.group_mm_exact(o[:1].cpu(), deq, torch.empty(1, 8, 1024, dtype=BF))
    p8 = G.plan(8 * 1024, 4096, G.FP8)
    for g_ in range(8):
        _assert_close(
            f"wo_a fp8 group {g_}", out8[:1, g_], ref8[:, g_], _bound(o[:1, g_].cpu(), deq[g_], ref8[:, g_], p8)
        )
    last = G.group_gemv(o[m - 1 :], qd, torch.empty(1, 8, 1024, dtype=BF, device=dev), scd)
    _assert_same_bits("wo_a fp8 last token alone", last, out8[m - 1 :])
    _assert_replay_same("wo_a fp8 graph replay", out8, lambda: G.group_gemv(o, qd, out8, scd))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 128], ids=["m1", "m3", "m128"])
def test_group_mm_auto_fp8_captured(m):
    """`group_mm_auto` with wo_a stored FP8, at m = 1 (the GEMV) and beyond it (dequantized
    for cuBLAS, the single-sequence runtime's prefill): a CUDA graph captures the call (no
    read of the scale bytes back to the host) and its replay gives the eager bytes, which
    equal those of cuBLAS on the weight's exact bf16."""
    dev = torch.device("cuda")
    gen = _gen("group-fp8-captured", m)
    Gn, r, gw = 2, 64, 256
    o = _rand(gen, (m, Gn, gw), BF).to(dev)
    q, sc, deq = _fp8_group_weight(gen, Gn, r, gw)
    qd, scd = q.to(dev), sc.to(dev)
    out = torch.full((m, Gn, r), float("nan"), dtype=BF, device=dev)
    G.group_mm_auto(o, qd, out, scd)
    if m > G.AUTO_MAX_M:
        want = linear.group_mm(o, deq.to(dev), torch.empty_like(out))
        _assert_same_bits("eager vs cuBLAS on the bf16 weight", out, want)
    _assert_replay_same("graph replay vs eager", out, lambda: G.group_mm_auto(o, qd, out, scd))


def _assert_replay_same(name: str, out: torch.Tensor, call) -> None:
    """`call` (which writes `out`) captured in a CUDA graph: its replay, into an `out`
    poisoned with NaN, gives the bytes `out` holds now (the eager call's)."""
    first = out.clone()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        call()
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    _assert_same_bits(name, out, first)
