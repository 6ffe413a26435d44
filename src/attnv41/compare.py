"""Comparing an implementation's layer results with a reference: golden tensors
(`golden.replay`) or another implementation's traces (`TraceRecorder`), by the golden
README's rules (`testing.py` holds the element-level comparisons)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .config import AttnV41Cfg
from .testing import Cmp, compare_bf16, compare_exact, compare_quantized, compare_selection

__all__ = ["KINDS", "LayerReport", "ReplayReport", "TraceRecorder", "selection_source"]

KINDS = ("q", "kv_win", "compress_kv", "index_k", "index_score", "index_k_owner", "candidates", "sel", "o", "out")


def _expected(role) -> set[str]:
    """The tensors the README lists for a layer of this role."""
    names = {"q", "kv_win", "sel", "o", "out"}
    if role.is_kv_source:
        names |= {"compress_kv", "index_k"}
    if role.is_index_source:
        names |= {"index_score", "index_k_owner"}
    if role.is_candidate_source:
        names |= {"candidates"}
    return names


@dataclass
class LayerReport:
    regime: str
    layer: int
    role: str
    cmps: list[Cmp] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cmps)


@dataclass
class ReplayReport:
    golden: str
    variant: str
    impl: str
    layers: list[LayerReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(lr.ok for lr in self.layers)

    @property
    def n_compared(self) -> int:
        return sum(len(lr.cmps) for lr in self.layers)

    @property
    def n_skipped(self) -> int:
        return sum(len(lr.skipped) for lr in self.layers)

    @property
    def n_failed(self) -> int:
        return sum(1 for lr in self.layers for c in lr.cmps if not c.ok)

    def worst(self) -> dict[str, float]:
        w: dict[str, float] = {}
        for lr in self.layers:
            for c in lr.cmps:
                w[c.name] = max(w.get(c.name, 0.0), c.ratio)
        return w

    def failures(self) -> list[str]:
        return [f"{lr.regime} L{lr.layer}: {c}" for lr in self.layers for c in lr.cmps if not c.ok]


def _cpu(t):
    if t is None:
        return None
    if isinstance(t, int):
        return torch.tensor([t], dtype=torch.int32)
    return t.detach().cpu()


def selection_source(cfg: AttnV41Cfg, layer: int) -> int:
    """The index source whose selection a ratio>0 layer attends with (itself, or the latest before it)."""
    return max(j for j in cfg.index_source_layers if j <= layer)


# Index scores: rows allowed past the bf16 tolerance, and by how much. A GEMM result one
# bf16 ulp away (cuBLAS vs the fp64 reference: about 1% of elements) moves many fp4
# elements of the index queries and keys by one quantization step, and each such step
# moves a row of scores by |w_h|·step·|k| — several tolerances, on many rows (measured on
# the H200 and with 1-3% ulp jitter on the CPU: up to 8x, on up to a third of the rows).
# So any number of rows may exceed the tolerance, each by at most SCORE_EXCUSE_FACTOR,
# and those rows are then judged by our own scores: the selection must be a valid top-k
# of them and the candidate mask must follow from them. The score kernel itself is held
# to tight bounds by its own tests, and the CPU runtime equals the reference bit for bit.
SCORE_EXCUSE_FRACTION = 1.0
SCORE_EXCUSE_FACTOR = 16.0


def _kv_source(cfg: AttnV41Cfg, layer: int) -> int:
    return max(j for j in cfg.kv_source_layers if j <= layer)


def _compare_layer(
    ref_get, cfg, rname, start, m, window_cols, offset, i, role, tr, traces, score_rows, rows
) -> LayerReport:
    """Compare one layer's results `tr` against reference tensors `ref_get(layer, name)`
    (golden tensors, or another implementation's trace) by the golden README's rules,
    extended where a rule's exception has consequences downstream:

    - index scores: up to SCORE_EXCUSE_FRACTION of the rows may exceed the tolerance by up
      to SCORE_EXCUSE_FACTOR (an fp4 step of an index query); those rows' selections and
      candidate masks must then be consistent with our own scores;
    - o / out of a row are compared only where the selection matches and every attended
      row (window and compressed) is bit-identical to the reference's: an accepted
      one-step quantization difference in an attended row moves o by more than bf16's
      tolerance when a token attends to few rows. Such rows count as excused.
    """
    from .reference.indexer import candidate_mask

    lr = LayerReport(rname, i, role.name)
    present = {n: ref_get(i, n) for n in KINDS}
    lr.skipped = sorted(n for n in _expected(role) if present.get(n) is None)

    def got(n):
        return _cpu(getattr(tr, n, None))

    not_produced = getattr(tr, "not_produced", None) or ()

    def missing(n) -> bool:
        if n in not_produced:  # by design (a captured step keeps only out and the ring)
            lr.skipped.append(n)
            return True
        if got(n) is None:
            lr.cmps.append(Cmp(n, False, float("inf"), "the implementation did not produce it"))
            return True
        return False

    r = role.ratio
    positions = torch.arange(start, start + m)
    visible = torch.div(positions + 1, r, rounding_mode="floor") if r else None
    sel_same_rows = torch.ones(m, dtype=torch.bool)
    cand_src = cfg.candidate_source_layer
    if present["index_score"] is not None and not missing("index_score"):
        own_rows = torch.zeros(m, dtype=torch.bool)
        if role.uses_candidates and cand_src is not None:
            cand_tie = ref_get(cand_src, "cand_tie")
            if cand_tie is not None:
                own_rows |= cand_tie.bool()
            for t in score_rows.get(("candidates", cand_src), set()):
                own_rows[t] = True  # our candidate row differs from the reference's, by our scores
        g_sc, r_sc = got("index_score"), present["index_score"]
        # Columns whose index key differs from the reference's (an accepted fp4 step in
        # the key row) are left out: the key was compared on its own; every row that
        # sees such a column is then judged by our own scores.
        bad_cols = _differing_key_rows(ref_get, tr, traces, r_sc.shape[1]) if g_sc is not None else None
        if bad_cols is not None and bad_cols.any() and g_sc.shape == r_sc.shape:
            g_sc, r_sc = g_sc.clone(), r_sc.clone()
            both = torch.isfinite(g_sc) & torch.isfinite(r_sc) & bad_cols[None, :]
            g_sc[both] = 0
            r_sc[both] = 0
            own_rows |= both.any(1)
        c = compare_bf16(
            "index_score",
            g_sc,
            r_sc,
            excuse_rows=max(1, int(m * SCORE_EXCUSE_FRACTION)),
            excuse_factor=SCORE_EXCUSE_FACTOR,
            finite_only_rows=own_rows if own_rows.any() else None,
        )
        if bad_cols is not None and bad_cols.any():
            c.detail += f"; {int(bad_cols.sum())} key columns differing by an fp4 step left out"
            c.excused += int(bad_cols.sum())
        lr.cmps.append(c)
        score_rows[i] = set(c.rows) | set(own_rows.nonzero().flatten().tolist())
    if present["sel"] is not None and not missing("sel"):
        ref_sel = present["sel"]
        k = ref_sel.shape[1] - window_cols
        src = selection_source(cfg, i) if r else i
        tie = ref_get(i, "sel_tie") if r else None  # reuse layers copy their source's flags
        ref_scores = ref_get(src, "index_score") if r else None
        own = traces.get(src)
        got_scores = _cpu(getattr(own, "index_score", None)) if own is not None else None
        own_on_ties = cfg.roles[src].uses_candidates  # ties judged with our own candidate row
        c = compare_selection(
            "sel",
            got("sel"),
            ref_sel,
            window_cols,
            offset,
            tie,
            ref_scores,
            got_scores,
            visible,
            k,
            own_on_ties,
            score_rows.get(src, set()),
        )
        lr.cmps.append(c)
        if got("sel").shape == ref_sel.shape:
            sel_same_rows = (got("sel").long() == ref_sel.long()).all(1)
    same_inputs = sel_same_rows & _attended_rows_equal(ref_get, cfg, i, role, tr, traces, m, offset)
    for n in ("q", "kv_win", "compress_kv", "index_k", "index_k_owner", "candidates", "o", "out"):
        ref = present[n]
        if ref is None or missing(n):
            continue
        g = got(n)
        if n in ("q", "o") and rows is not None:
            g = g[rows]
        if n == "kv_win":
            lr.cmps.append(compare_quantized(n, g, ref, "fp8"))
        elif n in ("compress_kv", "index_k"):
            lr.cmps.append(compare_quantized(n, g, ref, "fp4"))
        elif n == "index_k_owner":
            lr.cmps.append(compare_exact(n, g.reshape(-1).to(torch.int32), ref.reshape(-1).to(torch.int32)))
        elif n == "candidates":
            tie = ref_get(i, "cand_tie")
            keep = torch.ones(m, dtype=torch.bool) if tie is None else tie == 0
            own = torch.zeros(m, dtype=torch.bool)
            own[list(score_rows.get(i, set()))] = True
            keep &= ~own
            c = compare_exact(n, g.to(torch.uint8)[keep], ref.to(torch.uint8)[keep])
            differ = (~keep) & (g.to(torch.uint8) != ref.to(torch.uint8)).any(1)
            if c.ok and own.any():  # rows with excused scores: our mask must follow our own scores
                mine = candidate_mask(got("index_score")[own], visible[own], cfg.cand_blocks, cfg.cand_block)
                if not torch.equal(mine, g.bool()[own]):
                    c = Cmp(n, False, float("inf"), "candidate rows inconsistent with our own scores")
            c.excused = int((~keep).sum()) if c.ok else 0
            score_rows[("candidates", i)] = set(differ.nonzero().flatten().tolist())
            lr.cmps.append(c)
        else:  # q, o, out
            if n == "q":
                same = torch.ones(g.shape[0], dtype=torch.bool)
            else:
                same = same_inputs if n == "out" or rows is None else same_inputs[rows]
            c = compare_bf16(n, g[same], ref[same])
            c.excused = int((~same).sum())
            lr.cmps.append(c)
    return lr


def _differing_key_rows(ref_get, tr, traces, L: int) -> torch.Tensor | None:
    """Bool [L]: index-key rows the scores used that differ from the reference's."""
    owner = getattr(tr, "index_k_owner", None)
    if owner is None:
        return None
    owner = int(owner.reshape(-1)[0]) if isinstance(owner, torch.Tensor) else int(owner)
    ref_owner = ref_get(owner, "index_k")
    src = traces.get(owner)
    keys = _cpu(getattr(src, "index_k", None)) if src is not None else None
    if keys is None or ref_owner is None or keys.shape[0] < L or ref_owner.shape[0] < L:
        return None
    return ~(keys[:L] == ref_owner[:L]).all(1)


def _attended_rows_equal(ref_get, cfg, i, role, tr, traces, m, offset) -> torch.Tensor:
    """Bool [m]: whether every row token t attended (by our selection) is bit-identical to
    the reference's row. Unknown (not available) counts as equal."""
    ok = torch.ones(m, dtype=torch.bool)
    sel = _cpu(getattr(tr, "sel", None))
    win, ref_win = _cpu(getattr(tr, "kv_win", None)), ref_get(i, "kv_win")
    if sel is None or win is None or ref_win is None or win.shape != ref_win.shape:
        return ok
    bad_rows = [(~(win == ref_win).all(1)).nonzero().flatten()]
    bad_off = [0]
    if role.ratio > 0:
        src = _kv_source(cfg, i)
        comp = _cpu(getattr(traces.get(src), "compress_kv", None)) if traces.get(src) is not None else None
        ref_comp = ref_get(src, "compress_kv")
        if comp is not None and ref_comp is not None and comp.shape == ref_comp.shape:
            bad_rows.append((~(comp == ref_comp).all(1)).nonzero().flatten())
            bad_off.append(offset)
    bad = torch.cat([b + o for b, o in zip(bad_rows, bad_off)])
    if bad.numel():
        ok = ~torch.isin(sel.long(), bad.long()).any(1)
    return ok


class TraceRecorder:
    """Compare an implementation against another one (e.g. the runtime against the
    reference) call by call with the same rules as the golden replay. Feed both traces
    of each layer, in order, to `add`; `report` collects the comparisons."""

    def __init__(self, cfg: AttnV41Cfg, name: str = "reference", impl: str = "runtime"):
        self.cfg = cfg
        self.report = ReplayReport(name, "-", impl)
        self._step = None
        self._ref: dict[int, Any] = {}
        self._got: dict[int, Any] = {}
        self._score_rows: dict[int, set[int]] = {}

    def add(self, i: int, start_pos: int, m: int, ref_trace, got_trace, keep: bool = True) -> LayerReport:
        if self._step != start_pos:
            self._step, self._ref, self._got, self._score_rows = start_pos, {}, {}, {}
        self._ref[i] = _Frozen(ref_trace)
        self._got[i] = _Frozen(got_trace)
        W = self.cfg.window
        wc, off = (min(m, W), m) if start_pos == 0 else (W, W)

        def ref_get(layer, name):
            t = self._ref.get(layer)
            return None if t is None else t.get(name)

        name = "prefill" if start_pos == 0 else f"decode{start_pos}"
        lr = _compare_layer(
            ref_get,
            self.cfg,
            name,
            start_pos,
            m,
            wc,
            off,
            i,
            self.cfg.roles[i],
            self._got[i],
            self._got,
            self._score_rows,
            None,
        )
        if keep:
            self.report.layers.append(lr)
        return lr


class _Frozen:
    """CPU copies of a trace's tensors (runtime runs are views that the next call overwrites)."""

    def __init__(self, tr):
        # clone: on the CPU `.cpu()` returns the same tensor, a workspace view
        self._d = {n: (None if (t := _cpu(getattr(tr, n, None))) is None else t.clone()) for n in KINDS}
        self._d["index_k_owner"] = _cpu(getattr(tr, "index_k_owner", None))

    def get(self, name):
        return self._d.get(name)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._d.get(name)
