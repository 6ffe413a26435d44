"""Named comparisons shared by the tests and `attnv41 check`.

Every comparison returns a `Cmp` that names the tensor, reports the worst error as a
ratio to the tolerance (≤ 1 passes), and fails on any NaN, on an ±inf mismatch and on
a shape mismatch. Tolerances follow `../shared/golden/README.md` ("How to compare").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = [
    "Cmp",
    "compare_bf16",
    "compare_quantized",
    "compare_exact",
    "compare_selection",
    "bf16_ulp",
]

BF16_REL = 2.0**-7
BF16_ABS = 1e-4


@dataclass
class Cmp:
    """One tensor comparison. `ratio` = worst |error| / tolerance (0 when bit-equal)."""

    name: str
    ok: bool
    ratio: float
    detail: str = ""
    excused: int = 0  # elements accepted under a documented exception (quantization step, ulp swap, tie)
    rows: list[int] = field(default_factory=list)  # rows excused (index scores: judged by our own scores)

    def __str__(self) -> str:
        s = f"{self.name}: {'ok' if self.ok else 'FAIL'} ratio {self.ratio:.3g}"
        if self.excused:
            s += f", {self.excused} excused"
        return s + (f" ({self.detail})" if self.detail else "")


def _prelude(name: str, got: torch.Tensor, ref: torch.Tensor) -> Cmp | None:
    if tuple(got.shape) != tuple(ref.shape):
        return Cmp(name, False, math.inf, f"shape {tuple(got.shape)} vs reference {tuple(ref.shape)}")
    if torch.isnan(got.float()).any() or torch.isnan(ref.float()).any():
        return Cmp(name, False, math.inf, "NaN present")
    return None


def _inf_mismatch(name: str, g: torch.Tensor, r: torch.Tensor) -> Cmp | None:
    gi, ri = torch.isinf(g), torch.isinf(r)
    if not torch.equal(gi, ri) or not torch.equal(g[ri], r[ri]):
        n = int((gi != ri).sum())
        return Cmp(name, False, math.inf, f"±inf pattern differs ({n} elements)")
    return None


def _rows(mask: torch.Tensor) -> list[int]:
    """Indices along dim 0 holding a True (a 0-dim mask counts as row 0)."""
    return mask.reshape(mask.shape[0] if mask.dim() else 1, -1).any(1).nonzero().flatten().tolist()


def compare_bf16(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    rel: float = BF16_REL,
    abs_: float = BF16_ABS,
    allowance: torch.Tensor | None = None,
    finite_only_rows: torch.Tensor | None = None,
) -> Cmp:
    """`|got − ref| ≤ max|ref|·rel + abs_` elementwise over finite entries; ±inf must match exactly.

    `allowance` (fp64, the shape of `ref`; for index scores): an entry over the tolerance
    by at most its own allowance is accepted and counted in `Cmp.excused`; the rows
    holding one land in `Cmp.rows`. The caller computes the allowance from a known cause
    (`compare.index_score_bound`); where it is 0 the plain tolerance applies.
    `finite_only_rows` (bool `[m]`): on these rows only entries finite in both are
    compared (the row's ±inf pattern came from a tie-dependent candidate mask).
    """
    bad = _prelude(name, got, ref)
    if bad:
        return bad
    g, r = got.double().cpu(), ref.double().cpu()
    skip = torch.zeros(g.shape[:1], dtype=torch.bool) if finite_only_rows is None else finite_only_rows.cpu().bool()
    bad = _inf_mismatch(name, g[~skip], r[~skip])
    if bad:
        return bad
    fin = torch.isfinite(r) & torch.isfinite(g)
    if not fin.any():
        return Cmp(name, True, 0.0)
    tol = r[fin].abs().max().item() * rel + abs_
    err = torch.where(fin, (g - r).abs(), torch.zeros_like(g))
    over = err > tol
    if not over.any():
        return Cmp(name, True, err.max().item() / tol, f"max err {err.max().item():.3g}, tol {tol:.3g}")
    detail = f"max err {err.max().item():.3g}, tol {tol:.3g}"
    if allowance is None:
        rows = _rows(over)
        return Cmp(name, False, err.max().item() / tol, detail + f"; rows {rows[:6]} over tol")
    allow = allowance.double().cpu()
    if tuple(allow.shape) != tuple(r.shape):
        raise ValueError(f"allowance.shape = {tuple(allow.shape)}; allowed: the reference's {tuple(r.shape)}")
    beyond = over & (err > tol + allow)
    excused = over & ~beyond
    rest = torch.where(over, torch.zeros_like(err), err).max().item() / tol
    worst = (err[over] / (tol + allow[over])).max().item()
    if beyond.any():
        rows = _rows(beyond)
        detail += (
            f"; {int(beyond.sum())} entries in rows {rows[:6]} beyond tol + their computed bound "
            f"(worst err/(tol + bound) {worst:.3g})"
        )
        return Cmp(name, False, max(rest, worst), detail)
    rows = _rows(excused)
    detail += (
        f"; {int(excused.sum())} of {int(fin.sum())} entries ({len(rows)} rows) over tol, within their computed "
        f"bound (worst err/tol {(err[over] / tol).max().item():.3g}, err/(tol + bound) {worst:.3g})"
    )
    return Cmp(name, True, rest, detail, excused=int(excused.sum()), rows=rows)


def compare_quantized(name: str, got: torch.Tensor, ref: torch.Tensor, fmt: str, max_frac: float = 0.01) -> Cmp:
    """Quantized rows (fmt `fp8` or `fp4`): as `compare_bf16`, except that isolated
    elements may differ by one quantization step (an input one bf16 ulp away crosses a
    rounding boundary). At most `max_frac` of the elements (and at least 2) may be
    excused, each by at most one step: `2^(floor(log2 max(|a|,|b|)) − 2)` for e4m3
    (3 mantissa bits, counted generously), `max(|a|, |b|)` for e2m1 (neighbouring codes).
    """
    if fmt not in ("fp8", "fp4"):
        raise ValueError(f"fmt = {fmt!r}; allowed: 'fp8', 'fp4'")
    bad = _prelude(name, got, ref)
    if bad:
        return bad
    g, r = got.double().cpu(), ref.double().cpu()
    bad = _inf_mismatch(name, g, r)
    if bad:
        return bad
    if r.numel() == 0:
        return Cmp(name, True, 0.0)
    tol = r.abs().max().item() * BF16_REL + BF16_ABS
    err = (g - r).abs()
    over = err > tol
    n_over = int(over.sum())
    if n_over == 0:
        return Cmp(name, True, err.max().item() / tol)
    big = torch.maximum(g.abs(), r.abs())[over]
    if fmt == "fp8":
        step = torch.exp2(torch.floor(torch.log2(big)) - 2)
    else:
        step = big
    within = bool((err[over] <= step + 1e-30).all())
    allowed = max(2, int(max_frac * r.numel()))
    rest = err[~over]
    ratio = rest.max().item() / tol if rest.numel() else 0.0
    ok = within and n_over <= allowed
    detail = f"{n_over} elements one quantization step off (allowed {allowed})"
    if not within:
        detail += ", some by more than one step"
        ratio = max(ratio, err.max().item() / tol)
    return Cmp(name, ok, ratio, detail, excused=n_over if ok else 0)


def compare_exact(name: str, got: torch.Tensor, ref: torch.Tensor) -> Cmp:
    """Bit-for-bit equality (integers, masks, selections without ties)."""
    bad = _prelude(name, got, ref)
    if bad:
        return bad
    g, r = got.cpu(), ref.cpu().to(got.dtype)
    n = int((g != r).sum())
    return Cmp(name, n == 0, 0.0 if n == 0 else math.inf, f"{n} entries differ" if n else "")


def bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    """The bf16 ulp at each finite value (fp64)."""
    a = v.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def _is_valid_topk(chosen: set[int], scores: torch.Tensor, visible: int, k: int, slack: float) -> bool:
    """Whether `chosen` (compressed positions, −1 dropped) is a top-k of `scores` with ties
    broken any way: every position scoring above the k-th value (minus `slack`) is in,
    every chosen position scores at least the k-th value (minus `slack`)."""
    s = scores.double()
    if any(j >= visible for j in chosen):
        return False
    kth = torch.sort(s, descending=True).values[k - 1].item() if k >= 1 else math.inf
    must = {j for j in range(s.numel()) if s[j].item() > kth + slack}
    if not must <= chosen:
        return False
    return all(s[j].item() >= kth - slack for j in chosen)


def _swap_ok(gs: set[int], rs: set[int], ref_row, got_row, vis: int, k: int) -> bool:
    """README: positions whose golden scores lie within the row's score error (at least one
    bf16 ulp of the k-th value) of the golden k-th value may swap; ours must be a valid
    top-k of our own scores."""
    s = ref_row.double()
    kth = torch.sort(s, descending=True).values[k - 1].item()
    slack = bf16_ulp(torch.tensor(kth)).item() if math.isfinite(kth) else 0.0
    if got_row is not None:
        gsc = got_row.double()
        fin = torch.isfinite(s) & torch.isfinite(gsc)
        if fin.any():
            slack = max(slack, (gsc[fin] - s[fin]).abs().max().item())
    ok = len(gs) == len(rs) and all(abs(s[j].item() - kth) <= slack for j in gs ^ rs)
    return ok and (got_row is None or _is_valid_topk(gs, got_row, vis, k, 0.0))


def compare_selection(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    window_cols: int,
    offset: int,
    tie: torch.Tensor | None,
    ref_scores: torch.Tensor | None,
    got_scores: torch.Tensor | None,
    visible: torch.Tensor | None,
    k: int,
    own_scores_on_ties: bool = False,
    own_score_rows: set[int] | frozenset[int] = frozenset(),
) -> Cmp:
    """A selection `[m, window_cols + k]` against the golden one (README "How to compare").

    The window part must match exactly. The compressed part must match exactly, except:
    on rows flagged in `tie`, any valid top-k of the scores (golden scores, or our own
    when `own_scores_on_ties`, as for a layer that applies its own candidate mask);
    on other rows, positions whose golden scores lie within the row's score error (at
    least one bf16 ulp) of the row's k-th value may be swapped, provided ours is a
    valid top-k of our own scores; on rows in `own_score_rows` (whose scores were excused
    by `compare_bf16`), any valid top-k of our own scores. Without golden scores
    (`ref_scores` None: a file that stores `sel_tie` but no `index_score`), flagged rows
    are judged against our own scores and `detail` says so; other rows must match.
    Returns which rows were accepted under those rules in `excused`; `detail` lists the
    rows whose selection differs. A NaN in either score tensor fails.
    """
    bad = _prelude(name, got, ref)
    if bad:
        return bad
    for who, sc in (("our", got_scores), ("the reference's", ref_scores)):
        if sc is not None and torch.isnan(sc.float()).any():
            return Cmp(name, False, math.inf, f"NaN present in {who} index scores")
    g, r = got.cpu().long(), ref.cpu().long()
    if not torch.equal(g[:, :window_cols], r[:, :window_cols]):
        n = int((g[:, :window_cols] != r[:, :window_cols]).any(1).sum())
        return Cmp(name, False, math.inf, f"window part differs on {n} rows")
    diff_rows = (g[:, window_cols:] != r[:, window_cols:]).any(1).nonzero().flatten().tolist()
    if not diff_rows:
        return Cmp(name, True, 0.0)
    if visible is None:
        return Cmp(name, False, math.inf, f"compressed part differs on rows {diff_rows[:8]} and no visible counts")
    excused, own_ties = [], []
    for t in diff_rows:
        comp = [int(v) for v in g[t, window_cols:]]
        present = [v for v in comp if v >= 0]
        if present != sorted(set(present)) or comp[len(present) :] != [-1] * (len(comp) - len(present)):
            return Cmp(
                name, False, math.inf, f"compressed part of row {t} is not ascending with −1 at the tail: {comp}"
            )
        gs = {int(v) - offset for v in g[t, window_cols:] if v >= 0}
        rs = {int(v) - offset for v in r[t, window_cols:] if v >= 0}
        vis = int(visible[t])
        if t in own_score_rows and got_scores is not None:
            ok = _is_valid_topk(gs, got_scores[t], vis, k, 0.0) and len(gs) == len(rs)
        else:
            ok = False
            if tie is not None and bool(tie[t]):
                mine = own_scores_on_ties or ref_scores is None
                if mine and got_scores is None:
                    return Cmp(
                        name, False, math.inf, f"compressed part of tie-flagged row {t} differs and no scores to judge"
                    )
                ok = _is_valid_topk(gs, got_scores[t] if mine else ref_scores[t], vis, k, 0.0) and len(gs) == len(rs)
                if ok and ref_scores is None:
                    own_ties.append(t)
            if not ok and ref_scores is None:
                return Cmp(
                    name,
                    False,
                    math.inf,
                    f"compressed part of row {t}: got {sorted(gs)} vs {sorted(rs)}; "
                    "no index_score in the file to judge a swap",
                )
            # Positions may swap where the scores themselves differ (a tie flag makes no
            # row stricter): each swapped position's golden score lies within the row's
            # score error (at least one bf16 ulp) of the golden k-th value, and ours is a
            # valid top-k of our scores.
            if not ok:
                ok = _swap_ok(gs, rs, ref_scores[t], None if got_scores is None else got_scores[t], vis, k)
        if not ok:
            return Cmp(name, False, math.inf, f"compressed part of row {t}: got {sorted(gs)} vs {sorted(rs)}")
        excused.append(t)
    detail = f"rows {excused[:6]}{'…' if len(excused) > 6 else ''} differ within ties"
    if own_ties:
        detail += f"; tie rows {own_ties[:6]} judged against our own scores (the file holds no index_score)"
    return Cmp(name, True, 0.0, detail, excused=len(excused))
