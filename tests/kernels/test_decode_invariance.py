"""Batch invariance of the decode kernels: a token's bytes do not depend on how many tokens
share the call (m in {1, 2, 7, 64}; the GEMV serves m ≤ 16), for the split sparse
attention, the radix top-k, the candidate mask, the GEMV and the fused kv chain. On CUDA
at Flash-like shapes, on the interpreter at small ones and m up to 7."""

from __future__ import annotations

import pytest
import torch

from attnv41.kernels import fused, gemv, topk
from attnv41.kernels import sparse_attn_split as SAS
from attnv41.kernels.sparse_attn_split import sparse_attn_batch, sparse_attn_split
from attnv41.packed import pack
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq
from helpers import interp_subset

# The last m is the full call the others are compared against. The interpreter runs m = 64
# through the same steps as m = 7: one program (or one per tile, vector) per token on a
# grid axis, the attention's launch choices switch at m = 1 only (`test_sparse_attn_split`
# asserts it), the top-k's tile by m·Lb is the same (`test_selection`), the kv chain writes
# every token's ring row at both (128 rows).
MS = tuple(interp_subset([1, 2, 7, 64], [1, 2, 7]))


def _shapes(device):
    if device == "cuda":
        return dict(H=64, D=512, K=640, Nc=4096, Lb=32768, k=512, N=1280, Kin=5120)
    return dict(H=4, D=64, K=65, Nc=90, Lb=300, k=17, N=24, Kin=256)  # K: two blocks, the last ragged


def _same_rows(name, full, part, m):
    a, b = full[:m].contiguous(), part.contiguous()
    if a.dtype.is_floating_point:  # compare bit patterns (NaN equal to itself, −0 ≠ +0)
        bits = torch.int16 if a.element_size() == 2 else torch.int32
        a, b = a.view(bits), b.view(bits)
    n = int((a != b).sum())
    assert n == 0, f"{name}: {n} elements of the first {m} tokens changed between m = {m} and m = {full.shape[0]}"


@pytest.mark.parametrize("packed", [False, True], ids=["bf16", "packed"])
def test_sparse_attn_split(device, packed):
    """Both decode attentions, o and the rope epilogue's o_rot, over bf16 or packed rows
    (`sparse_attn_split` changes its combine at m = 1: block-parallel, then the loop;
    `sparse_attn_batch` its whole launch shape at m = 1: `_TUNE`, then `BATCH_TUNE`; each
    pair must give the same bytes)."""
    assert SAS._BLOCKS_MAX_M == SAS._BATCH_SMALL_M == 1, "the switches lie between MS[0] and MS[1]"
    s = _shapes(device)
    gen = torch.Generator().manual_seed(1)
    H, D, K, Nc = s["H"], s["D"], s["K"], s["Nc"]
    q = torch.randn(64, H, D, generator=gen).bfloat16().to(device)
    win = torch.randn(128, D, generator=gen).bfloat16()
    comp = torch.randn(Nc, D, generator=gen).bfloat16()
    if packed:
        win = pack(fp8_qdq(win), "fp8_e8m0")
        comp = pack(fp4_e4m3_qdq(comp), "fp4_e4m3")
    win, comp = win.to(device), comp.to(device)
    sel = torch.randint(-1, 128 + Nc, (64, K), generator=gen, dtype=torch.int32).to(device)
    sink = torch.randn(H, generator=gen).to(device)
    ang = torch.rand(100, 32, generator=gen) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, 100, (64,), generator=gen, dtype=torch.int32).to(device)

    def run(fn, m):
        o_rot = torch.empty(m, H, D, dtype=torch.bfloat16, device=device)
        o = fn(q[:m], win, comp, sel[:m], 128, sink, D**-0.5, rot=(cos, sin, pos[:m], o_rot))
        return o, o_rot

    for name, fn in (("sparse_attn_split", sparse_attn_split), ("sparse_attn_batch", sparse_attn_batch)):
        full = run(fn, MS[-1])
        for m in MS[:-1]:
            part = run(fn, m)
            _same_rows(f"{name} o", full[0], part[0], m)
            _same_rows(f"{name} o_rot", full[1], part[1], m)


@pytest.mark.parametrize("what", ["topk", "candidate_mask"])
def test_selection(device, what):
    s = _shapes(device)
    gen = torch.Generator().manual_seed(2)
    Lb = s["Lb"]
    if what == "topk":  # the launch shape of the full call is m = 64's
        assert topk._topk_shape(MS[-1], Lb) == topk._topk_shape(64, Lb)
    scores = (torch.randn(64, Lb, generator=gen) * 4).round().bfloat16().to(device)  # many ties
    vis = torch.randint(1, Lb + 1, (64,), generator=gen, dtype=torch.int32).to(device)

    def run(m):
        if what == "topk":
            out = torch.empty(m, s["k"], dtype=torch.int32, device=device)
            return topk.topk_fixed(scores[:m], vis[:m], s["k"], 128, out)
        out = torch.empty(m, Lb, dtype=torch.bool, device=device)
        return topk.candidate_mask_fixed(scores[:m], vis[:m], 16, 8, out)

    full = run(MS[-1])
    for m in MS[:-1]:
        part = run(m)
        assert torch.equal(full[:m], part), f"{what}: the first {m} rows changed between m = {m} and m = {MS[-1]}"


def test_gemv(device):
    s = _shapes(device)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, s["Kin"], generator=gen).bfloat16().to(device)
    w = (torch.randn(s["N"], s["Kin"], generator=gen) * 0.02).bfloat16().to(device)
    full = gemv.gemv(x, (w,), (torch.empty(16, s["N"], dtype=torch.bfloat16, device=device),))[0]
    for m in (1, 2, 7):
        part = gemv.gemv(x[:m], (w,), (torch.empty(m, s["N"], dtype=torch.bfloat16, device=device),))[0]
        _same_rows("gemv", full, part, m)


def test_kv_chain(device):
    s = _shapes(device)
    gen = torch.Generator().manual_seed(4)
    D = s["D"]
    kv_pre = torch.randn(64, D, generator=gen).bfloat16().to(device)
    norm_w = (1 + 0.1 * torch.randn(D, generator=gen)).bfloat16().to(device)
    ang = torch.rand(200, 32, generator=gen) * 6
    cos, sin = ang.cos().to(device), ang.sin().to(device)
    pos = torch.randint(0, 200, (64,), generator=gen, dtype=torch.int32).to(device)

    def run(m):
        out = torch.empty(m, D, dtype=torch.bfloat16, device=device)
        ring = torch.zeros(128, D, dtype=torch.bfloat16, device=device)
        return fused.kv_chain(kv_pre[:m], norm_w, 1e-6, cos, sin, pos[:m], out, ring)

    full = run(MS[-1])
    for m in MS[:-1]:
        _same_rows("kv_chain", full, run(m), m)
