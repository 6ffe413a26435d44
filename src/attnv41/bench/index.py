"""Part (d) of `attnv41 bench`: index scores and top-k for one query over 4K to 1M
compressed positions, beside `torch.topk`.

Ours: the runtime's decode ops (`index_scores`, Triton on CUDA; `topk_fixed`, the
fixed-width top-k with the tie rule and the ascending-position output the selection
needs: a Triton radix select on CUDA). The torch
line: `torch.topk` on the same scores (unordered k largest, no position sort, no tie
rule), and the plain-PyTorch score path (`reference.indexer.index_scores`, einsum).
Times: GPU time per call from a CUDA graph over COPIES distinct copies of the inputs (L2
flushed before each replay), and the eager time of one call with its launch ("launch
ms"). Before timing, the selection is compared with `torch.topk`'s as a set (ties at the k-th
score excepted) and our scores with the reference's.
"""

from __future__ import annotations

from functools import partial

import torch

from ..reference import indexer as ref
from ..runtime.ops import ops_for
from .common import Ceilings, Timer, Timing, kernel_row

__all__ = ["bench_index_topk", "INDEX_COLS", "check_selection"]

INDEX_COLS = [
    ("positions", "positions"),
    ("name", "op"),
    ("ms", "GPU ms"),
    ("launch_ms", "launch ms"),
    ("gbps", "GB/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("x_torch", "vs torch"),
]


def check_selection(scores: torch.Tensor, ours: torch.Tensor, k: int) -> None:
    """`ours` (ascending positions, −1 padded) must hold k positions whose scores are the
    k largest: every score above the k-th largest included, the rest ties at it."""
    s = scores.float()[0]
    kth = torch.topk(s, k).values[-1]
    sel = ours[0][ours[0] >= 0].long()
    if sel.numel() != k or sel.unique().numel() != k:
        raise RuntimeError(f"top-k: {sel.numel()} distinct positions selected; expected {k}")
    if not bool((sel[1:] > sel[:-1]).all()):
        raise RuntimeError("top-k: positions are not ascending")
    must = (s > kth).nonzero().flatten()
    if not bool(torch.isin(must, sel).all()):
        raise RuntimeError("top-k: a position scoring above the k-th largest score is missing")
    if not bool((s[sel] >= kth).all()):
        raise RuntimeError("top-k: a selected position scores below the k-th largest score")


def bench_index_topk(
    cfg, device, ceil: Ceilings, lengths=(4096, 16384, 65536, 262144, 1048576), reps: int = 30, seed: int = 0
) -> list[dict]:
    dev = torch.device(device)
    ops = ops_for(dev)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(seed + 31)
    IH, ID, k = cfg.index_heads, cfg.index_head_dim, cfg.index_topk
    rows: list[dict] = []
    for L in lengths:
        iq = ops.fp4_e8m0_qdq(torch.randn(IH, ID, generator=gen, device=dev).to(torch.bfloat16)).view(1, IH, ID)
        hw = (torch.randn(1, IH, generator=gen, device=dev) * (ID**-0.5 * IH**-0.5)).to(torch.bfloat16)
        keys = torch.empty(L, ID, dtype=torch.bfloat16, device=dev)
        for j in range(0, L, 1 << 18):
            c = min(1 << 18, L - j)
            ops.fp4_e8m0_qdq(torch.randn(c, ID, generator=gen, device=dev).to(torch.bfloat16), out=keys[j : j + c])
        vis = torch.full((1,), L, dtype=torch.int32, device=dev)
        scores = torch.empty(1, L, dtype=torch.bfloat16, device=dev)
        sel = torch.empty(1, k, dtype=torch.int32, device=dev)
        kk = min(k, L)
        # correctness first
        ops.index_scores(iq, hw, keys, vis, out=scores)
        want = ref.index_scores(iq, hw, keys, vis)
        err = (scores.float() - want.float()).abs().max().item()
        tol = 2.0**-7 * want.float().abs().max().item()  # the kernel test's rule: bf16 rounding order
        if not err <= tol:
            raise RuntimeError(f"index scores over {L} positions: max error {err:.3g} > tolerance {tol:.3g}")
        ops.topk_fixed(scores, vis, kk, 0, out=sel[:, :kk])
        check_selection(scores, sel[:, :kk], kk)

        # COPIES distinct buffers (same values): each call in a timed graph reads cold memory
        keys_c = [keys] + [keys.clone() for _ in range(COPIES - 1)] if timer.cuda else [keys]
        scores_c = [scores] + [scores.clone() for _ in keys_c[1:]]
        sel_c = [sel] + [sel.clone() for _ in keys_c[1:]]
        t_sc = _time(
            timer, [partial(ops.index_scores, iq, hw, k_, vis, out=s_) for k_, s_ in zip(keys_c, scores_c)], reps
        )
        t_tk = _time(
            timer, [partial(ops.topk_fixed, s_, vis, kk, 0, out=o_[:, :kk]) for s_, o_ in zip(scores_c, sel_c)], reps
        )
        t_torch_tk = _time(timer, [partial(torch.topk, s_, kk, dim=-1) for s_ in scores_c], reps)
        t_ref_sc = _time(timer, [partial(ref.index_scores, iq, hw, k_, vis) for k_ in keys_c], max(3, reps // 5))
        kb = L * ID * 2
        sc_bytes = kb + L * 2 + IH * ID * 2 + IH * 2
        tk_bytes = L * 2 + kk * 4
        f_sc = 2 * IH * ID * L
        shape = f"H={IH} d={ID} k={kk}"
        r_sc = _row("index scores (ours)", shape, t_sc, sc_bytes, f_sc, ceil, L)
        r_ref = _row("index scores (torch einsum)", shape, t_ref_sc, sc_bytes, f_sc, ceil, L)
        r_tk = _row("top-k select (ours, tie rule, ascending)", shape, t_tk, tk_bytes, 0, ceil, L)
        r_ttk = _row("torch.topk (unsorted)", shape, t_torch_tk, tk_bytes, 0, ceil, L)
        r_sc["x_torch"] = r_sc["ms"] / r_ref["ms"]
        r_tk["x_torch"] = r_tk["ms"] / r_ttk["ms"]
        both = r_sc["ms"] + r_tk["ms"]
        base = r_ref["ms"] + r_ttk["ms"]
        total = {
            "name": "scores + top-k (ours)",
            "shape": shape,
            "positions": L,
            "ms": both,
            "gbps": (sc_bytes + tk_bytes) / (both * 1e-3) / 1e9,
            "floor_ms": r_sc["floor_ms"] + r_tk["floor_ms"],
            "x_floor": both / (r_sc["floor_ms"] + r_tk["floor_ms"]),
            "x_torch": both / base,
            "launch_ms": r_sc["launch_ms"] + r_tk["launch_ms"],
        }
        rows += [r_sc, r_ref, r_tk, r_ttk, total]
        del keys, scores, want, keys_c, scores_c, sel_c
    return rows


COPIES = 4


def _time(timer: Timer, calls: list, reps: int) -> tuple[Timing, Timing]:
    gpu, launch, _ = timer.gpu_and_launch(calls, reps)
    return gpu, launch


def _row(name: str, shape: str, t: tuple[Timing, Timing], nbytes: int, flops: int, ceil: Ceilings, L: int) -> dict:
    return kernel_row(name, shape, t[0], nbytes, flops, ceil, positions=L, launch_ms=t[1].median_ms)
