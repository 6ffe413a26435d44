"""Sparse attention with the attention sink (attention-v41.md §7), in plain PyTorch."""

from __future__ import annotations

import torch

__all__ = ["sparse_attn", "sparse_attn_exact"]

BLOCK = 64  # selection entries per online-softmax step of the released kernel


def _blocks(q, rows, sel, scale):
    """Per block of BLOCK selection entries: (logits fp32 `[m, H, BLOCK]`, absent → −inf;
    R `[m, BLOCK, D]` fp32). The selection is padded with −1 to a multiple of BLOCK, so
    every block has the same shape whatever the width."""
    s_all = torch.nn.functional.pad(sel.long(), (0, -sel.shape[1] % BLOCK), value=-1)
    qf = q.float()
    for b0 in range(0, s_all.shape[1], BLOCK):
        s_sel = s_all[:, b0 : b0 + BLOCK].contiguous()
        R = rows[s_sel.clamp_min(0)].float()  # [m, BLOCK, D]
        logits = scale * torch.einsum("chd,ckd->chk", qf, R)
        yield logits.masked_fill(~(s_sel >= 0)[:, None, :], float("-inf")), R


def sparse_attn(
    q: torch.Tensor,
    rows: torch.Tensor,
    sel: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    chunk: int = 256,
) -> torch.Tensor:
    """o[t, h] = Σ_j softmax_j(τ·q[t,h]·R_j ∪ sink_h) · R_j, as bf16 `[m, H, D]`, in the
    released kernel's order.

    q: bf16 `[m, H, D]`; rows: bf16 `[N, D]`, the attended rows (window rows first, then
    compressed rows); sel: int `[m, K]`, indices into rows, −1 = absent; sink: fp32 `[H]`,
    a logit NOT scaled by τ whose value is zero (it only enlarges the denominator).

    Order (the released kernel's, which the golden data matches bit for bit): an online
    softmax over blocks of 64 selection entries with an fp32 running max of the present
    logits and an fp32 running sum; each block's probabilities are rounded to bf16 before
    they weight the rows (the sum keeps their fp32 values); the sink's `exp(sink − max)`
    joins the sum at the end. Mathematically this is `M = max(sink, max s)` of §7 up to
    rounding. All entries absent gives exactly 0. Tokens are processed `chunk` at a time
    to bound memory.

    Width independence: the last block is padded with −1 to 64 entries (as the kernel
    masks it), so every block's dot products, row sum and weighted sum run over exactly
    64 entries. CPU reductions pick their summation order by length: a 14-entry sum
    taken at width 14 and at width 22 (8 trailing zeros) can differ in the last bit.
    With whole blocks, appending −1 entries (a wider launch) changes no output bit: an
    all-absent block rescales by exp(0) = 1 and adds exact zeros.
    """
    m, H, D = q.shape
    out = torch.empty(m, H, D, dtype=torch.bfloat16, device=q.device)
    sink = sink.float()
    for t0 in range(0, m, chunk):
        qc = q[t0 : t0 + chunk]
        c = qc.shape[0]
        mx = torch.full((c, H), float("-inf"), device=q.device)
        den = torch.zeros(c, H, device=q.device)
        acc = torch.zeros(c, H, D, device=q.device)
        for s, R in _blocks(qc, rows, sel[t0 : t0 + chunk], scale):
            new = torch.maximum(mx, s.amax(-1))
            base = torch.where(new == float("-inf"), 0.0, new)  # nothing present yet: keep exps at 0
            alpha = torch.exp(mx - base)
            p = torch.exp(s - base[..., None])  # absent → 0
            den = den * alpha + p.sum(-1)
            pv = torch.einsum("chk,ckd->chd", p.to(torch.bfloat16).float(), R)
            acc = acc * alpha[..., None] + pv
            mx = new
        # The sink joins the denominator last, against the running max of the keys.
        den = den + torch.exp(sink[None, :] - torch.where(mx == float("-inf"), sink[None, :], mx))
        den = torch.where(mx == float("-inf"), torch.ones_like(den), den)  # no key: acc is 0, o = 0
        out[t0 : t0 + chunk] = (acc / den[..., None]).to(torch.bfloat16)
    return out


def sparse_attn_exact(
    q: torch.Tensor,
    rows: torch.Tensor,
    sel: torch.Tensor,
    sink: torch.Tensor,
    scale: float,
    chunk: int = 256,
) -> torch.Tensor:
    """The same attention in fp64 with unrounded probabilities: the math of §7 without
    any kernel's order, to bound how far `sparse_attn` (or a kernel) may stray."""
    m, H, D = q.shape
    out = torch.empty(m, H, D, dtype=torch.float64, device=q.device)
    sink = sink.double()
    for t0 in range(0, m, chunk):
        s_sel = sel[t0 : t0 + chunk].long()
        R = rows[s_sel.clamp_min(0)].double()
        logits = scale * torch.einsum("chd,ckd->chk", q[t0 : t0 + chunk].double(), R)
        logits = logits.masked_fill(~(s_sel >= 0)[:, None, :], float("-inf"))
        mx = torch.maximum(logits.amax(-1), sink[None, :])
        p = torch.exp(logits - mx[..., None])
        den = torch.exp(sink[None, :] - mx) + p.sum(-1)
        out[t0 : t0 + chunk] = torch.einsum("chk,ckd->chd", p / den[..., None], R)
    return out
