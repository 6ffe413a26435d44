"""Layer outputs of FP8-weight layers: e4m3 flips of `wo_b`'s input.

With FP8 weights (golden README, v41_fp8) `wo_b` quantizes its bf16 input u (the grouped
`wo_a` output, `groups·o_rank` values per token) per 32 values to e4m3 before the GEMM.
An element of u that sits within one bf16 ulp of an e4m3 rounding boundary (or a block
maximum next to a change of the power-of-two scale) takes the other e4m3 value when u
moves by that ulp, and such an ulp comes from any difference upstream: attention `o` one
ulp away, or `wo_a` accumulated in another order (the reference's fp64 einsum, the released
CPU port's oneDNN, cuBLAS). One such step moves the whole output row by the step times a
column of `wo_b`: up to about one tolerance, for an element near its block's maximum.
The README's rule for quantized rows ("an element can cross a rounding boundary and move
by one quantization step; such isolated elements are expected and are not a bug") holds
for this round trip as for `kv_win`'s; this module carries its consequence to `out`.

`explain_out_rows`: for each output row over the tolerance, recompute u from our `o`
through the reference (`reference.layer.output_latent`), list the *events* (one element
moved by ±`OUT_U_ULPS` bf16 ulps changes the row's e4m3 round trip, the element's code
or its block's scale) and look for at most `MAX_FLIPS` of them, each applied with either
sign, whose effect on the output (`Δu · W_bᵀ`, fp64, with `wo_b` dequantized exactly)
brings every entry of the row within the plain tolerance. A row so explained is excused
and reported with its flips; any other row over the tolerance fails as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import AttnV41Cfg

__all__ = ["OUT_U_ULPS", "MAX_FLIPS", "OutFlips", "explain_out_rows", "applies"]

OUT_U_ULPS = 1  # how far (bf16 ulps) an implementation's u may lie from the one recomputed from its o
MAX_FLIPS = 4  # e4m3 steps of u that may explain one output row
KEEP = 0.5  # the flips must leave at most this fraction of the row's error (L2)
_PAIR_POOL = 24  # singles tried in pairs and triples (the best by residual norm)


@dataclass
class OutFlips:
    """`explain_out_rows`' result: `rows` explained (row → [(element, sign), ...]), rows
    over the tolerance left unexplained, the worst err/tol of explained rows after their
    flips, and how many events (candidate flips) the rows over the tolerance had."""

    rows: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    unexplained: list[int] = field(default_factory=list)
    worst_after: float = 0.0
    events: int = 0


def applies(w) -> bool:
    """Whether the layer's `wo_b` runs the released FP8 linear (its input is quantized)."""
    return w is not None and "wo_b.scale" in w


def _row_events(u: torch.Tensor, ulps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Events of one row u (bf16 `[R]`, R a multiple of 32): every (element, direction) whose
    ±`ulps` move changes the row's e4m3 round trip. Returns (element index `[E]`, Δ of the
    round trip fp64 `[E, 32]` over the element's block)."""
    from .compare import _bf16_step
    from .reference.qdq import fp8_qdq

    R = u.shape[0]
    nb = R // 32
    blocks = u.reshape(nb, 32)
    base = fp8_qdq(blocks).double()  # [nb, 32]
    eye = torch.eye(32, dtype=torch.bool)
    deltas, elems = [], []
    for up in (True, False):
        moved = _bf16_step(blocks, ulps, up)  # [nb, 32]
        # [nb, 32 variants, 32]: variant j moves element j of its block only
        var = torch.where(eye[None], moved[:, None, :], blocks[:, None, :])
        d = fp8_qdq(var.reshape(nb * 32, 32)).double().reshape(nb, 32, 32) - base[:, None, :]
        hit = (d != 0).any(-1)  # [nb, 32]
        b, j = hit.nonzero(as_tuple=True)
        elems.append(b * 32 + j)
        deltas.append(d[b, j])
    return torch.cat(elems), torch.cat(deltas)


def explain_out_rows(
    cfg: AttnV41Cfg,
    w,
    o: torch.Tensor,
    start_pos: int,
    ratio: int,
    got: torch.Tensor,
    ref: torch.Tensor,
    tol: float,
    rows: list[int],
    ulps: int = OUT_U_ULPS,
    max_flips: int = MAX_FLIPS,
) -> OutFlips:
    """Explain output rows over the tolerance by e4m3 flips of `wo_b`'s input (module doc).

    cfg, w: the layer's config and weights (released names, `wo_b` FP8); o: our attention
    output bf16 `[m, H, D]` (all m rows of the call, positions `start_pos …`); ratio: the
    layer's compress ratio (its RoPE table); got, ref: our and the reference's `out`
    `[m, dim]`; tol: the plain tolerance of the tensor; rows: the rows to explain.
    """
    from .compare import _tables_for
    from .reference.fp8 import dequant_weight
    from .reference.layer import output_latent

    res = OutFlips()
    if not rows:
        return res
    tables = _tables_for(cfg, torch.device("cpu"))
    cos, sin = tables.for_ratio(ratio)
    idx = torch.tensor(rows, dtype=torch.long)
    wc = {k: v.cpu() for k, v in w.items() if k.startswith(("wo_a.", "wo_b."))}
    u = output_latent(cfg, wc, o[idx].cpu(), idx + start_pos, cos, sin)  # [r, R]
    wb = dequant_weight(wc["wo_b.weight"], wc["wo_b.scale"]).double()  # [dim, R]
    for t, urow in zip(rows, u):
        resid = ref[t].double().cpu() - got[t].double().cpu()  # what the flips must account for
        elems, deltas = _row_events(urow, ulps)
        res.events += int(elems.numel())
        found = _search(elems, deltas, wb, resid, tol, max_flips) if elems.numel() else None
        if found is None:
            res.unexplained.append(t)
            continue
        flips, after = found
        res.rows[t] = flips
        res.worst_after = max(res.worst_after, after / tol)
    return res


def _search(elems, deltas, wb, resid, tol, max_flips):
    """At most `max_flips` events with signs whose output effect accounts for `resid`: what
    is left is within `tol` everywhere AND has at most `KEEP` of its L2 norm (a flip moves
    the whole row along a column of `wo_b`; an error of another shape, one entry off say,
    is not reduced so by any column). Singles first, then pairs among the `_PAIR_POOL`
    singles that reduce the norm most, then greedy extensions of the best pair. Returns
    ([(element, sign), ...], max |rest|) or None."""
    blk = (elems // 32)[:, None] * 32 + torch.arange(32)  # [E, 32] columns of each event's block
    eff = torch.einsum("ek,dek->ed", deltas, wb[:, blk])  # [E, dim]: Δout of each event
    eff = torch.cat((eff, -eff))  # both signs
    sign = torch.cat((torch.ones(len(elems)), -torch.ones(len(elems)))).long()
    el = torch.cat((elems, elems))
    limit = KEEP * resid.norm()

    def left(vec):  # [n, dim] candidate effects -> (max |rest|, ||rest||)
        r = resid - vec
        return r.abs().max(-1).values, r.norm(dim=-1)

    def accept(mx, nrm):
        return (mx <= tol) & (nrm <= limit)

    mx, nrm = left(eff)
    ok = accept(mx, nrm)
    if ok.any():
        k = int(torch.where(ok, nrm, torch.inf).argmin())
        return [(int(el[k]), int(sign[k]))], float(mx[k])
    if max_flips < 2:
        return None
    pool = torch.topk(nrm, min(_PAIR_POOL, nrm.numel()), largest=False).indices
    a, b = torch.triu_indices(len(pool), len(pool), 1)
    ia, ib = pool[a], pool[b]
    keep = el[ia] != el[ib]
    ia, ib = ia[keep], ib[keep]
    if ia.numel() == 0:
        return None
    mx, nrm = left(eff[ia] + eff[ib])
    ok = accept(mx, nrm)
    k = int(torch.where(ok, nrm, torch.inf).argmin()) if ok.any() else int(nrm.argmin())
    chosen = [int(ia[k]), int(ib[k])]
    while not bool(ok.any()) and len(chosen) < max_flips:
        used = {int(el[c]) for c in chosen}
        cand = torch.tensor([int(c) for c in pool if int(el[c]) not in used], dtype=torch.long)
        if cand.numel() == 0:
            return None
        mx, nrm = left(eff[chosen].sum(0)[None] + eff[cand])
        ok = accept(mx, nrm)
        k = int(torch.where(ok, nrm, torch.inf).argmin()) if ok.any() else int(nrm.argmin())
        chosen.append(int(cand[k]))
    if not bool(ok.any()):
        return None
    return [(int(el[c]), int(sign[c])) for c in chosen], float(left(eff[chosen].sum(0)[None])[0][0])


def compare_out(cfg: AttnV41Cfg, w, o, start_pos: int, ratio: int, got, ref, same):
    """`out` by the plain bf16 rule on the rows `same` (bool `[m]`), then, for an FP8 `wo_b`
    (`applies(w)`) with our `o` of every row known, rows over the tolerance explained by
    e4m3 flips of `wo_b`'s input are excused (`explain_out_rows`). Returns a `Cmp`."""
    from .testing import BF16_ABS, BF16_REL, Cmp, compare_bf16

    c = compare_bf16("out", got[same], ref[same])
    c.excused = int((~same).sum())
    if c.ok or not applies(w):
        return c
    g, r = got.double().cpu(), ref.double().cpu()
    m = r.shape[0]
    if o is None or o.shape[0] != m or g.shape != r.shape or not bool(torch.isfinite(g[same]).all()):
        c.detail += "; no e4m3-flip explanation (our o of every row unknown, or non-finite output)"
        return c
    tol = r[same].abs().max().item() * BF16_REL + BF16_ABS
    err = (g - r).abs().amax(1)
    over = (same & (err > tol)).nonzero().flatten().tolist()
    if not over:  # failed for another reason (the ±inf pattern): nothing to explain
        return c
    fl = explain_out_rows(cfg, w, o, start_pos, ratio, got, ref, tol, over)
    before = max(err[t].item() for t in over) / tol
    rest = err[same & ~torch.isin(torch.arange(m), torch.tensor(over, dtype=torch.long))]
    rest_ratio = rest.max().item() / tol if rest.numel() else 0.0
    n_flips = sum(len(v) for v in fl.rows.values())
    if fl.unexplained:
        worst = max(err[t].item() for t in fl.unexplained) / tol
        return Cmp(
            "out",
            False,
            worst,
            f"max err {err[same].max().item():.3g}, tol {tol:.3g}; rows {fl.unexplained[:6]} over tol and not explained "
            f"by <= {MAX_FLIPS} e4m3 flips of wo_b's input ({len(fl.rows)} other rows were)",
        )
    shown = "; ".join(
        f"row {t}: " + ", ".join(f"u[{j}]{'+' if s > 0 else '-'}" for j, s in v) for t, v in fl.rows.items()
    )
    return Cmp(
        "out",
        True,
        max(rest_ratio, fl.worst_after),
        f"{len(over)} rows over tol (worst err/tol {before:.3g}) explained by {n_flips} e4m3 flips of wo_b's input "
        f"(elements within {OUT_U_ULPS} bf16 ulp of a rounding boundary; {fl.events} such events in those rows), "
        f"err/tol after the flips {fl.worst_after:.3g}: {shown[:200]}",
        excused=int(c.excused + len(over)),
        rows=sorted(fl.rows),
    )
