"""The decode GEMV's other forms of adding a split weight's partials (`gemv._SPLIT_FORM`:
"release", the arrival counter's atomics with release / acquire semantics split; "launch",
the GEMV's programs store their partials and `_sum_kernel` / `_group_sum_kernel` add them
in a launch of their own) against the counter (production) and the order twins, byte for
byte: the same steps 3-5 of kernels/gemv.py in the same order. Fused weights (split and
not, bf16, fp32 and FP8, x and xq), the RoPE epilogue on a split output, m = 1 and m > 1
(several token blocks, a ragged last one), group_gemv over bf16 and FP8-stored weights; on
CUDA when present, else on the interpreter (where the atomics' semantics are not
exercised: the CUDA tests are the ones that see a missing acquire or release)."""

from __future__ import annotations

import zlib

import pytest
import torch

from attnv41.kernels import gemv as G
from attnv41.kernels import qdq
from attnv41.kernels import rope as R
from helpers import interp_subset

BF, F32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _same(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got, want = got.cpu(), want.cpu()
    view = torch.int16 if got.dtype == BF else torch.int32
    diff = got.view(view) != want.view(view)
    assert not diff.any(), f"{name}: {int(diff.sum())} of {diff.numel()} outputs differ in bits"


def _fp8(gen, N, K):
    w = (torch.randn(N, K, generator=gen) * 64).clamp(-448, 448).to(FP8)
    s = torch.randint(118, 124, (-(-N // 32), K // 32), generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return w, s


# "release" on CUDA only: the interpreter ignores atomics' semantics, so there it runs the
# counter's steps (what it is compared with); "launch" (production) everywhere
FORMS = pytest.mark.parametrize("form", interp_subset(["release", "launch"], ["launch"]))


def _both(monkeypatch, fn, form):
    """fn() under the counter, then under `form`: (counter outputs, the form's outputs)."""
    monkeypatch.setattr(G, "_SPLIT_FORM", "counter")
    a = fn()
    monkeypatch.setattr(G, "_SPLIT_FORM", form)
    b = fn()
    return a, b


@FORMS
@pytest.mark.parametrize("m", [1, 5], ids=["m1", "m5"])
def test_fused_weights(m, form, device, monkeypatch):
    K = 1024  # 4 chunks of bf16 / FP8, 8 of fp32: split at these N (few row tiles)
    monkeypatch.setattr(G, "_SEG_CHUNKS_FP8", 2)  # FP8: 2 segments of 2 chunks (production's 5: one segment)
    # rows of the bf16, fp32 and FP8 weights; the interpreter: about half (104 programs a
    # launch at m = 5 instead of 240), each weight still several row tiles at m = 5
    n16, n32, n8 = (40, 24, 64) if device == "cuda" else (20, 8, 32)
    gen = _gen("fused", m)
    x = torch.randn(m, K, generator=gen).to(BF)
    w8, s8 = _fp8(gen, n8, K)
    weights = (torch.randn(n16, K, generator=gen).to(BF), torch.randn(n32, K, generator=gen), w8)
    scales = (None, None, s8)
    for w in weights:
        assert G.plan(w.shape[0], K, w.dtype)[1] > 1, "every weight here should be split"
    short = torch.randn(9, 256, generator=gen).to(BF)  # one chunk: never split

    def run(xq):
        outs = tuple(torch.full((m, w.shape[0]), float("nan"), dtype=F32 if w.dtype == F32 else BF, device=device)
                     for w in weights)  # fmt: skip
        G.gemv(
            x.to(device), tuple(w.to(device) for w in weights), outs,
            tuple(None if s is None else s.to(device) for s in scales), xq=None if xq is None else xq.to(device),
        )  # fmt: skip
        return [o.cpu() for o in outs]

    for xq in (None, qdq.fp8_qdq(x.to(device)).cpu()):
        counter, other = _both(monkeypatch, lambda xq=xq: run(xq), form)
        twins = tuple(torch.empty(m, w.shape[0], dtype=F32 if w.dtype == F32 else BF) for w in weights)
        G.gemv_torch(x, weights, twins, scales, xq=xq)
        for i in range(len(weights)):
            assert not torch.isnan(other[i].float()).any(), f"out[{i}] not written"
            _same(f"xq={xq is not None} out[{i}] form vs counter", other[i], counter[i])
            if weights[i].dtype != F32:  # fp32 weights: the interpreter rounds the products (within bounds only)
                _same(f"xq={xq is not None} out[{i}] form vs gemv_torch", other[i], twins[i])
    # a launch whose only weight is not split takes no second launch and keeps its bits
    one = lambda: G.gemv(short[:1].to(device), (short.to(device),), (torch.empty(1, 9, dtype=BF, device=device),))[
        0
    ].cpu()  # noqa: E731
    a, b = _both(monkeypatch, one, form)
    _same("unsplit weight", b, a)


@FORMS
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_rope_on_a_split_output(fp8, form, device, monkeypatch):
    m, D, half = 3, 64, 16
    # the interpreter: 2 heads and 2 chunks of K (64 programs a launch instead of 512), still split
    H, K = (4, 2048) if device == "cuda" else (2, 512)
    gen = _gen("rope", fp8)
    x = torch.randn(m, K, generator=gen).to(BF)
    w, s = _fp8(gen, H * D, K) if fp8 else (torch.randn(H * D, K, generator=gen).to(BF), None)
    assert G.plan(H * D, K, w.dtype)[1] > 1
    ang = torch.rand(40, half, generator=gen) * 6
    cos, sin = ang.cos(), ang.sin()
    pos = torch.tensor([3, 17, 39], dtype=torch.int32)

    def run():
        out = torch.full((m, H * D), float("nan"), dtype=BF, device=device)
        G.gemv(
            x.to(device), (w.to(device),), (out,), None if s is None else (s.to(device),),
            rope=(0, D, cos.to(device), sin.to(device), pos.to(device)),
        )  # fmt: skip
        return out.cpu()

    counter, other = _both(monkeypatch, run, form)
    _same("rope: form vs counter", other, counter)
    plain = torch.empty(m, H * D, dtype=BF)
    G.gemv_torch(x, (w,), (plain,), None if s is None else (s,))
    want = R.apply_rope_torch(plain.view(m, H, D), cos, sin, pos).reshape(m, H * D)
    _same("rope: form vs gemv_torch then apply_rope", other, want)


@FORMS
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("m", [1, 6], ids=["m1", "m6"])
def test_group_gemv(m, fp8, form, device, monkeypatch):
    # 3 chunks of 256 (the last one 128 wide): split; the interpreter: 2 groups of 32 rows and
    # 2 chunks (the last one 64 wide), 64 programs a launch at m = 6 instead of 432
    Gn, r, gw = (3, 96, 640) if device == "cuda" else (2, 32, 320)
    monkeypatch.setattr(G, "_SEG_CHUNKS_FP8", 1)  # FP8: one chunk per segment (production's 5: one segment)
    gen = _gen("group", m, fp8)
    o = torch.randn(m, Gn, gw, generator=gen).to(BF)
    if fp8:
        w8, sc = _fp8(gen, Gn * r, gw)
        w, scale = w8.view(Gn, r, gw), sc.view(torch.uint8)
    else:
        w, scale = torch.randn(Gn, r, gw, generator=gen).to(BF), None
    assert G.plan(Gn * r, gw, w.dtype)[1] > 1 and gw % G._BK[w.dtype], "split, with a ragged last chunk"

    def run():
        out = torch.full((m, Gn, r), float("nan"), dtype=BF, device=device)
        G.group_gemv(o.to(device), w.to(device), out, None if scale is None else scale.to(device))
        return out.cpu()

    counter, other = _both(monkeypatch, run, form)
    assert not torch.isnan(other.float()).any(), "outputs not written"
    _same("group: form vs counter", other, counter)
    _same(
        "group: form vs group_gemv_torch",
        other,
        G.group_gemv_torch(o, w, torch.empty(m, Gn, r, dtype=BF), scale),
    )


@pytest.mark.gpu
@FORMS
@pytest.mark.parametrize("target", [None, 16384], ids=["production-plan", "fp8-one-chunk"])
def test_flash_shapes_on_cuda(target, form, monkeypatch):
    """V4.1-Flash wo_b (FP8 [5120, 8192], x quantized in the programs) and wo_a (8 groups of
    FP8 [1024, 4096]) at m = 1: each form gives the counter's bytes and the twins',
    eagerly and replayed from a CUDA graph, at the production plan and with the FP8 weights
    at one chunk per program (the rule alone: no `_PLAN_SEGS`; production splits wo_b in 8)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    G.prepare(dev)
    monkeypatch.setattr(G, "_TARGET_PROGRAMS_FP8", target)
    if target is not None:
        monkeypatch.setattr(G, "_SEG_CHUNKS_FP8", None)
        monkeypatch.setattr(G, "_PLAN_SEGS", {})  # wo_b at one chunk per program too (production: 8 segments)
    gen = _gen("flash")
    x = torch.randn(1, 8192, generator=gen).to(BF).to(dev)
    w, s = (t.to(dev) for t in _fp8(gen, 5120, 8192))
    o = torch.randn(1, 8, 4096, generator=gen).to(BF).to(dev)
    wa, sa = _fp8(gen, 8 * 1024, 4096)
    wa, sa = wa.view(8, 1024, 4096).to(dev), sa.view(torch.uint8).to(dev)
    out_b = torch.empty(1, 5120, dtype=BF, device=dev)
    out_a = torch.empty(1, 8, 1024, dtype=BF, device=dev)

    def run():
        out_b.fill_(float("nan"))
        out_a.fill_(float("nan"))
        G.gemv(x, (w,), (out_b,), (s,))
        G.group_gemv(o, wa, out_a, sa)
        return out_b.clone(), out_a.clone()

    (cb, ca), (sb, sa_) = _both(monkeypatch, run, form)
    _same("wo_b: form vs counter", sb, cb)
    _same("wo_a: form vs counter", sa_, ca)
    twin_b = torch.empty_like(out_b)
    G.gemv_torch(x, (w,), (twin_b,), (s,))
    _same("wo_b vs gemv_torch", sb, twin_b)
    _same("wo_a vs group_gemv_torch", sa_, G.group_gemv_torch(o, wa, torch.empty_like(out_a), sa))
    graph = torch.cuda.CUDAGraph()  # the form is still set (`_both`)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(dev).wait_stream(side)
    with torch.cuda.graph(graph):
        G.gemv(x, (w,), (out_b,), (s,))
        G.group_gemv(o, wa, out_a, sa)
    for _ in range(3):
        out_b.fill_(float("nan"))
        out_a.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(dev)
        _same("wo_b replayed", out_b, sb)
        _same("wo_a replayed", out_a, sa_)


@pytest.mark.parametrize("form", ["counter", "launch"])
def test_plan_override_is_followed_by_kernel_and_twins(form, device, monkeypatch):
    """`_PLAN_SEGS` (production's per-shape splits; patched here): a listed shape takes its
    split count, the other shapes and dtypes keep the rule's; gemv and group_gemv follow it
    (their bytes equal their twins', which read the same plan) and it is the sums' order (an
    fp32 weight's bits move with it); a count that does not divide the chunks is refused,
    naming the allowed."""
    monkeypatch.setattr(G, "_SPLIT_FORM", form)
    K = 2048 if device == "cuda" else 1024  # 8 chunks of 256 (FP8 / bf16); the interpreter: 4, 58 % of the programs
    chunks = K // 256
    rule = G.plan(64, K, FP8)
    assert rule == (256, chunks) and G.plan(64, K, F32) == (128, 2 * chunks)  # one chunk per program at these sizes
    gen = _gen("override", form)
    x = torch.randn(1, K, generator=gen).to(BF)
    w8, s8 = _fp8(gen, 64, K)
    o = torch.randn(1, 2, K, generator=gen).to(BF)
    wa, sa = _fp8(gen, 2 * 32, K)
    wa, sa = wa.view(2, 32, K), sa.view(torch.uint8)
    wb = torch.randn(64, K, generator=gen)  # fp32: its output keeps the fp32 sum's bits

    def run():
        out = torch.full((1, 64), float("nan"), dtype=BF, device=device)
        out_b = torch.full((1, 64), float("nan"), dtype=F32, device=device)
        G.gemv(x.to(device), (w8.to(device), wb.to(device)), (out, out_b), (s8.to(device), None))
        out_a = torch.full((1, 2, 32), float("nan"), dtype=BF, device=device)
        G.group_gemv(o.to(device), wa.to(device), out_a, sa.to(device))
        twin, twin_b = G.gemv_torch(
            x, (w8, wb), (torch.empty(1, 64, dtype=BF), torch.empty(1, 64, dtype=F32)), (s8, None)
        )
        if out_b.device.type == "cpu":  # the twin rounds fp32 products as the interpreter does (the GPU's fma does not)
            _same("gemv (fp32 weight) vs its twin", out_b, twin_b)
        twin_a = G.group_gemv_torch(o, wa, torch.empty(1, 2, 32, dtype=BF), sa)
        _same("gemv vs its twin", out, twin)
        _same("group_gemv vs its twin", out_a, twin_a)
        return out.cpu(), out_a.cpu(), out_b.cpu()

    base = run()
    bf_rule = G.plan(64, K, BF)
    for segs in (1, chunks // 2, chunks):
        monkeypatch.setattr(G, "_PLAN_SEGS", {(64, K, FP8): segs, (64, K, F32): 2})
        assert G.plan(64, K, FP8) == (256, segs)
        assert G.plan(64, K, F32) == (128, 2)
        assert G.plan(64, K, BF) == bf_rule, "another dtype of the shape keeps the rule"
        assert G.plan(32, K, FP8) == rule, "an unlisted shape keeps the rule"
        got = run()
        # the fp32 weight's order changed (16 segments, 8 on the interpreter, → 2), so on these values some bits do
        # (the FP8 weight's terms, exact in fp32, may add to the same bits in any order)
        assert not torch.equal(got[2].view(torch.int32), base[2].view(torch.int32)), "the same fp32 bits"
    for bad in (3, 0, 16, True, 2.0):
        monkeypatch.setattr(G, "_PLAN_SEGS", {(64, K, FP8): bad})
        with pytest.raises(ValueError, match=rf"allowed: a divisor of the {chunks} chunks of 256 columns"):
            G.plan(64, K, FP8)
