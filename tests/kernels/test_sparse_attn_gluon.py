"""kernels.sparse_attn_gluon (the one-pass decode attention in Gluon) against the Triton
two-kernel form it must equal byte for byte (`sparse_attn_split` with `BATCH_TUNE`), and
against the reference order within the split's tolerance (tests/kernels/test_sparse_attn.py).

Gluon does not run under TRITON_INTERPRET: without a GPU these tests check the argument
errors (the offline sm_90 compile: test_sparse_attn_gluon_sass.py); the bytes are checked
on the GPU (quick tier). `sparse_attn_batch` takes the
Gluon kernel, when switched on, for calls of at least `_GLUON["min_m"]` tokens.
"""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import sparse_attn_split as split
from attnv41.kernels.sparse_attn_gluon import GLUON_TUNE, sparse_attn_gluon
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, gluon_attn_ok, sparse_attn_batch, sparse_attn_split
from kernels.test_sparse_attn import _assert_close, _inputs, _reference

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="Gluon kernels run only on a CUDA GPU")


def _bits(x):
    return x.view(torch.int16)


def _rot_tables(m, D, device, seed):
    half = min(32, D // 4)
    gen = torch.Generator().manual_seed(seed)
    ang = torch.rand(100, half, generator=gen) * 6
    pos = torch.randint(0, 100, (m,), generator=gen, dtype=torch.int32)
    return ang.cos().to(device), ang.sin().to(device), pos.to(device)


# ---------------------------------------------------------------- without a GPU


def test_argument_errors_name_the_value():
    q, win, comp, sel, sink = _inputs(3, 2, 4, 32, 20, 8, 8, 10, "cpu")
    with pytest.raises(ValueError, match="tune keys"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1, warps=8)
    with pytest.raises(ValueError, match="nsplit = 3"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1, nsplit=3)
    with pytest.raises(ValueError, match="stages = 1"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1, stages=1)
    with pytest.raises(ValueError, match="ch = 48"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1, ch=48)
    q80, *_ = _inputs(3, 2, 80, 32, 20, 8, 8, 10, "cpu")
    with pytest.raises(ValueError, match=r"heads\) = 80"):
        sparse_attn_gluon(q80, win, comp, sel, 8, torch.zeros(80), 0.1)
    packed = torch.zeros(8, 32, dtype=torch.uint8)
    with pytest.raises(ValueError):
        sparse_attn_gluon(q, packed, packed, sel, 8, sink, 0.1)


def test_stages_bounded_by_shared_memory():
    q, win, comp, sel, sink = _inputs(4, 2, 4, 512, 20, 8, 8, 10, "cpu")
    with pytest.raises(ValueError, match=r"stages = 3; allowed: 2 … 2 at D = 512"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1, stages=3)


@pytest.mark.skipif(CUDA, reason="checks the error without a GPU")
def test_needs_a_gpu():
    q, win, comp, sel, sink = _inputs(5, 2, 4, 32, 20, 8, 8, 10, "cpu")
    with pytest.raises(RuntimeError, match="sparse_attn_gluon"):
        sparse_attn_gluon(q, win, comp, sel, 8, sink, 0.1)
    assert not gluon_attn_ok(q, win), "the Gluon kernel chosen for CPU tensors"


# ---------------------------------------------------------------- on the GPU

GPU_CASES = [
    # id, m, H, D, K, Nw, offset, Nc
    pytest.param(1, 64, 512, 640, 128, 128, 4096, id="flash-m1"),
    pytest.param(2, 64, 512, 640, 128, 128, 4096, id="flash-m2"),
    pytest.param(7, 64, 512, 600, 128, 100, 2000, id="flash-m7-K600"),
    pytest.param(64, 64, 512, 640, 128, 128, 8192, id="flash-m64"),
    pytest.param(5, 8, 512, 200, 40, 40, 300, id="headdim-m5"),
    pytest.param(9, 4, 32, 70, 16, 16, 50, id="tiny-m9"),
    pytest.param(3, 16, 64, 13, 10, 7, 20, id="H16-D64-K13"),
    pytest.param(4, 64, 512, 300, 64, 64, 0, id="flash-Nc0"),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("m, H, D, K, Nw, offset, Nc", GPU_CASES)
def test_same_bytes_as_the_triton_kernels(m, H, D, K, Nw, offset, Nc):
    q, win, comp, sel, sink = _inputs(m * 31 + K + D, m, H, D, K, Nw, offset, Nc, "cuda")
    cos, sin, pos = _rot_tables(m, D, "cuda", K)
    scale = D**-0.5
    got_r = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = torch.full((m, H, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = sparse_attn_gluon(q, win, comp, sel, offset, sink, scale, out=out, rot=(cos, sin, pos, got_r))
    assert got is out, "sparse_attn_gluon(out=...) must return out itself"
    want_r = torch.empty_like(got_r)
    want = sparse_attn_split(q, win, comp, sel, offset, sink, scale, rot=(cos, sin, pos, want_r), **BATCH_TUNE)
    torch.cuda.synchronize()
    n = int((_bits(got) != _bits(want)).sum())
    assert n == 0, f"o: {n} of {got.numel()} elements differ from the Triton kernels"
    n = int((_bits(got_r) != _bits(want_r)).sum())
    assert n == 0, f"o_rot: {n} of {got_r.numel()} elements differ from the Triton kernels"
    _assert_close("o (Gluon vs reference order)", got, _reference(q, win, comp, sel, offset, sink, scale))
    plain = sparse_attn_gluon(q, win, comp, sel, offset, sink, scale)
    assert torch.equal(_bits(plain), _bits(got)), "o without rot differs from o with it"


@gpu
@pytest.mark.gpu
def test_launch_shapes_give_the_same_bytes():
    """nsplit (programs per token), ch (the gathers' column chunks) and PDL move no bit."""
    q, win, comp, sel, sink = _inputs(77, 6, 64, 512, 640, 128, 128, 4096, "cuda")
    base = sparse_attn_gluon(q, win, comp, sel, 128, sink, 512**-0.5)
    for tune in ({"nsplit": 4}, {"nsplit": 1}, {"ch": 64}, {"ch": 512}, {"pdl": False}):
        o = sparse_attn_gluon(q, win, comp, sel, 128, sink, 512**-0.5, **tune)
        n = int((_bits(o) != _bits(base)).sum())
        assert n == 0, f"{tune}: {n} elements differ from {GLUON_TUNE}"


@gpu
@pytest.mark.gpu
def test_graph_replay_equals_eager_and_reads_rewritten_inputs():
    q, win, comp, sel, sink = _inputs(78, 16, 64, 512, 640, 128, 128, 4096, "cuda")
    q2, win2, comp2, sel2, _ = _inputs(79, 16, 64, 512, 640, 128, 128, 4096, "cuda")
    qb, wb, cb, sb = q.clone(), win.clone(), comp.clone(), sel.clone()
    out = torch.empty_like(q)
    sparse_attn_gluon(qb, wb, cb, sb, 128, sink, 0.05, out=out)  # compiled before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        sparse_attn_gluon(qb, wb, cb, sb, 128, sink, 0.05, out=out)
    for src in ((q, win, comp, sel), (q2, win2, comp2, sel2)):
        for dst, x in zip((qb, wb, cb, sb), src):
            dst.copy_(x)
        g.replay()
        eager = sparse_attn_gluon(*src[:3], src[3], 128, sink, 0.05)
        torch.cuda.synchronize()
        assert torch.equal(_bits(out), _bits(eager)), "graph replay differs from the eager call"


@gpu
@pytest.mark.gpu
def test_batch_wrapper_takes_gluon_from_its_threshold(monkeypatch):
    """Switched on (`ATTNV41_GLUON_ATTN=1`), `sparse_attn_batch` runs the Gluon kernel on an
    sm_90 GPU for m ≥ _GLUON["min_m"] over bf16 rows (the Triton kernels below it and over
    packed rows); the bytes agree."""
    monkeypatch.setitem(split._GLUON, "on", True)
    m = split._GLUON["min_m"]
    q, win, comp, sel, sink = _inputs(80, m, 64, 512, 640, 128, 128, 4096, "cuda")
    if torch.cuda.get_device_capability()[0] != 9:
        assert not gluon_attn_ok(q, win)
        pytest.skip("the Gluon kernel is Hopper's (sm_90)")
    assert gluon_attn_ok(q, win), "sm_90, bf16 rows, 64 heads: the Gluon kernel must be eligible"
    assert not gluon_attn_ok(q, win.view(torch.uint8)), "packed rows are the Triton kernels'"
    got = sparse_attn_batch(q, win, comp, sel, 128, sink, 0.05)
    want = sparse_attn_split(q, win, comp, sel, 128, sink, 0.05, **BATCH_TUNE)
    assert torch.equal(_bits(got), _bits(want)), "sparse_attn_batch (Gluon) differs from the Triton kernels"
