"""Comparing an implementation's layer results with a reference: golden tensors
(`golden.replay`) or another implementation's traces (`TraceRecorder`), by the golden
README's rules (`testing.py` holds the element-level comparisons)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import AttnV41Cfg
from .testing import BF16_ABS, BF16_REL, Cmp, compare_bf16, compare_exact, compare_quantized, compare_selection

__all__ = [
    "KINDS",
    "LayerReport",
    "ReplayReport",
    "ScoreBound",
    "TraceRecorder",
    "index_score_bound",
    "selection_source",
]

KINDS = ("q", "kv_win", "compress_kv", "index_k", "index_score", "index_k_owner", "candidates", "sel", "o", "out")


def _expected(role, L: int = 1) -> set[str]:
    """The tensors the README lists for a layer of this role (`L`: compressed rows visible
    at the end of the call; an index source stores scores only when there are some)."""
    names = {"q", "kv_win", "sel", "o", "out"}
    if role.is_kv_source:
        names |= {"compress_kv", "index_k"}
    if role.is_index_source and L > 0:
        names |= {"index_score", "index_k_owner"}
    if role.is_candidate_source and L > 0:
        names |= {"candidates"}
    return names


@dataclass
class LayerReport:
    regime: str
    layer: int
    role: str
    cmps: list[Cmp] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    expected: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cmps)


@dataclass
class ReplayReport:
    golden: str
    variant: str
    impl: str
    layers: list[LayerReport] = field(default_factory=list)
    nonfinite: int | None = None  # runtime: non-finite values that entered a cache write (None: not counted)

    @property
    def ok(self) -> bool:
        return all(lr.ok for lr in self.layers) and not self.problems()

    @property
    def n_compared(self) -> int:
        return sum(len(lr.cmps) for lr in self.layers)

    @property
    def n_skipped(self) -> int:
        return sum(len(lr.skipped) for lr in self.layers)

    @property
    def n_failed(self) -> int:
        return sum(1 for lr in self.layers for c in lr.cmps if not c.ok)

    def problems(self) -> list[str]:
        """Why the run as a whole proves nothing, though no comparison failed: it compared
        no tensor, or it skipped every tensor of a kind the README says the file holds."""
        if self.nonfinite:
            return [f"{self.nonfinite} non-finite values entered a cache write (the golden inputs are finite)"]
        if self.n_compared == 0:
            n = len(self.layers)
            return [f"no tensor was compared ({n} layer results; every tensor absent or not produced)"]
        compared = {c.name for lr in self.layers for c in lr.cmps}
        out = []
        for k in KINDS:
            n = sum(1 for lr in self.layers if k in lr.expected)
            if n and k not in compared:
                out.append(f"every {k} was skipped ({n} expected by the README; absent from the file or not produced)")
        return out

    def worst(self) -> dict[str, float]:
        w: dict[str, float] = {}
        for lr in self.layers:
            for c in lr.cmps:
                w[c.name] = max(w.get(c.name, 0.0), c.ratio)
        return w

    def failures(self) -> list[str]:
        return [f"{lr.regime} L{lr.layer}: {c}" for lr in self.layers for c in lr.cmps if not c.ok] + [
            f"run: {p}" for p in self.problems()
        ]


def _cpu(t):
    if t is None:
        return None
    if isinstance(t, int):
        return torch.tensor([t], dtype=torch.int32)
    return t.detach().cpu()


def selection_source(cfg: AttnV41Cfg, layer: int) -> int:
    """The index source whose selection a ratio>0 layer attends with (itself, or the latest before it)."""
    return cfg.index_source_of(layer)


# Index scores. An implementation whose GEMMs round differently (cuBLAS against the
# reference: about 1% of outputs one bf16 ulp away) moves an fp4 element of an index query
# or key by one quantization step where its bf16 input sat next to a rounding boundary,
# and such a step moves a score by several tolerances. Those entries are excused only
# where the cause is shown: `index_score_bound` recomputes the reference's index queries
# and head weights from the golden x and weights, finds the elements whose fp4 code or
# block scale can change when every GEMM output feeding them moves by SCORE_GEMM_ULPS
# bf16 ulps, takes the index-key differences from the keys themselves, and bounds what
# all of that (and one rounding per stage of the score) can do to each score.
SCORE_GEMM_ULPS = 1
_FP32_EPS = 2.0**-24
_TABLES: dict = {}  # the RoPE tables of the last (cfg, device) a bound was computed for


def _bf16_step(v: torch.Tensor, n: int, up: bool) -> torch.Tensor:
    """`v` (bf16) moved by `n` bf16 ulps up or down, on its bit pattern (sign-magnitude:
    the int16 view grows with the magnitude of positive values and shrinks toward −0x7FFF
    with the magnitude of negative ones; ±0 steps to the smallest subnormal of that side)."""
    b = v.contiguous().view(torch.int16).int()
    special = (b & 0x7FFF) >= 0x7F80  # ±inf and NaN stay as they are
    for _ in range(n):
        zero = (b & 0x7FFF) == 0
        neg = b < 0
        if up:
            b = torch.where(zero, torch.ones_like(b), torch.where(neg, b - 1, b + 1))
        else:
            b = torch.where(zero, torch.full_like(b, -0x7FFF), torch.where(neg, b + 1, b - 1))
        b = torch.where(b == -0x8000, torch.zeros_like(b), b)  # −1 ulp from −(smallest subnormal) is −0
    b = torch.where(special, v.contiguous().view(torch.int16).int(), b)
    return b.to(torch.int16).view(torch.bfloat16)


def _bf16_enclosure(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 bounds of every round-to-nearest bf16 rounding of a value in the fp64 interval
    [lo, hi] computed in fp32 (fused or not, any order of a few operations): rounding to
    nearest is monotone, so the ends, widened by a few fp32 roundings, bound it."""
    lo = lo - lo.abs() * 4 * _FP32_EPS
    hi = hi + hi.abs() * 4 * _FP32_EPS
    return lo.to(torch.bfloat16), hi.to(torch.bfloat16)


def _rope_enclosure(lo, hi, cos, sin, positions) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 bounds of `apply_rope(v)` over every bf16 `v` with `lo ≤ v ≤ hi` (elementwise):
    each rotated value is linear in its pair, so its range is centre ± radius."""
    half = cos.shape[1]
    rd = 2 * half
    shape = (lo.shape[0],) + (1,) * (lo.dim() - 2) + (half,)
    c = cos[positions.long()].double().reshape(shape)
    s = sin[positions.long()].double().reshape(shape)
    tl, th = (t[..., -rd:].double().unflatten(-1, (half, 2)) for t in (lo, hi))
    mid, rad = (tl + th) / 2, (th - tl) / 2
    a, b, ra, rb = mid[..., 0], mid[..., 1], rad[..., 0], rad[..., 1]
    centre = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
    radius = torch.stack((ra * c.abs() + rb * s.abs(), ra * s.abs() + rb * c.abs()), -1).flatten(-2)
    rlo, rhi = _bf16_enclosure(centre - radius, centre + radius)
    return torch.cat((lo[..., :-rd], rlo), -1), torch.cat((hi[..., :-rd], rhi), -1)


def _fp4_e8m0_range(lo: torch.Tensor, hi: torch.Tensor, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise min and max (fp64) of `fp4_e8m0_qdq(v)` over every `v` with `lo ≤ v ≤ hi`:
    the block scale ranges over the powers of two between those of the smallest and the
    largest possible block maximum, and for a fixed scale the round trip is monotone."""
    from .reference.qdq import FP4_MAX, e2m1_round, pow2_ceil

    bl = lo.float().unflatten(-1, (lo.shape[-1] // block, block))
    bh = hi.float().unflatten(-1, (hi.shape[-1] // block, block))
    mag_lo = torch.where((bl <= 0) & (bh >= 0), torch.zeros_like(bl), torch.minimum(bl.abs(), bh.abs()))
    mag_hi = torch.maximum(bl.abs(), bh.abs())
    floor = FP4_MAX * 2.0**-126
    s_lo = pow2_ceil(mag_lo.amax(-1, keepdim=True).clamp_min(floor) / FP4_MAX)
    s_hi = pow2_ceil(mag_hi.amax(-1, keepdim=True).clamp_min(floor) / FP4_MAX)
    qmin = torch.full_like(bl, math.inf)
    qmax = torch.full_like(bl, -math.inf)
    s = s_lo
    while True:
        live = s <= s_hi
        if not live.any():
            break
        a = e2m1_round((bl / s).clamp(-FP4_MAX, FP4_MAX)) * s
        b = e2m1_round((bh / s).clamp(-FP4_MAX, FP4_MAX)) * s
        qmin = torch.where(live, torch.minimum(qmin, a), qmin)
        qmax = torch.where(live, torch.maximum(qmax, b), qmax)
        s = s * 2
    return qmin.flatten(-2).double(), qmax.flatten(-2).double()


def _tables_for(cfg: AttnV41Cfg, dev: torch.device):
    """The reference's RoPE tables for `cfg` on `dev` (the last pair asked for is kept)."""
    from .reference.layer import RefTables

    key = (cfg, str(dev))
    if key not in _TABLES:
        _TABLES.clear()
        _TABLES[key] = RefTables.build(cfg, dev)
    return _TABLES[key]


def _ulp(v: torch.Tensor) -> torch.Tensor:
    """The bf16 ulp at |v| (fp64), at least that of the smallest normal."""
    a = v.double().abs().clamp_min(2.0**-126)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


@dataclass
class ScoreBound:
    """`index_score_bound`'s result. `bound` (fp64 `[m, L]`): how far
    an implementation's score may lie from the reference's; `scores`: the reference's
    scores recomputed from the same inputs (bf16 `[m, L]`, every column visible);
    `fragile`: how many index-query elements can change their fp4 value."""

    bound: torch.Tensor
    scores: torch.Tensor
    fragile: int


def index_score_bound(
    cfg: AttnV41Cfg,
    w,
    x: torch.Tensor,
    start_pos: int,
    ref_keys: torch.Tensor,
    got_keys: torch.Tensor,
    ulps: int = SCORE_GEMM_ULPS,
) -> ScoreBound:
    """Bound `|ours − ref|` of the index scores of one index-source call (attention-v41.md
    §6.2–§6.4) for an implementation whose every GEMM output feeding the scores (the index
    queries, the head weights, the dot products) lies within `ulps` bf16 ulps of the
    reference's, with our index keys `got_keys` against the reference's `ref_keys`
    (bf16 `[L, index_head_dim]`, known exactly).

    w: the layer's weights by released name; x: its bf16 input `[m, dim]` at positions
    `start_pos …`. The reference's functions recompute its pre-quantization index queries;
    interval arithmetic carries the ±`ulps` through RoPE (with any fp32 rounding) and the
    fp4 round trip (codes and block scales), giving `Δq` per element; likewise `Δw` for
    the head weights. Then, per query row t, head h, key row j (ReLU is 1-Lipschitz):
    `Δdot ≤ Σ_d Δq·|k_ref| + Σ_d |q'|·|Δk| + 1 ulp + fp32 accumulation`,
    `Δprod ≤ |w'|·Δdot + Δw·relu(dot) + 1 ulp`, `Δscore ≤ Σ_h Δprod + 1 ulp + fp32 accumulation`
    (each bf16 rounding to nearest, as the reference's and the kernels' are: two roundings
    of values `a`, `b` differ by at most `|a − b|` + one ulp).
    """
    from .reference.indexer import index_scores
    from .reference.layer import project
    from .reference.norm import linear, rms_norm
    from .reference.qdq import fp4_e8m0_qdq
    from .reference.rope import apply_rope

    m = x.shape[0]
    H, d = cfg.index_heads, cfg.index_head_dim
    L = ref_keys.shape[0]
    if tuple(got_keys.shape) != (L, d) or tuple(ref_keys.shape) != (L, d):
        raise ValueError(f"keys {tuple(got_keys.shape)} and {tuple(ref_keys.shape)}; allowed: both [{L}, {d}]")
    dev = x.device  # computed where the inputs are (weights on a GPU stay there)
    tables = _tables_for(cfg, dev)
    pos = torch.arange(start_pos, start_pos + m, device=dev)
    # queries: the GEMM output, ±ulps, through RoPE and the fp4 round trip
    c = rms_norm(project(w, "wq_a", x), w["q_norm.weight"], cfg.norm_eps)  # FP8 weights: the released FP8 linear
    pre = project(w, "indexer.wq_b", c).view(m, H, d)
    q_ref = fp4_e8m0_qdq(apply_rope(pre, tables.yarn_cos, tables.yarn_sin, pos))
    lo, hi = _rope_enclosure(
        _bf16_step(pre, ulps, False), _bf16_step(pre, ulps, True), tables.yarn_cos, tables.yarn_sin, pos
    )
    qmin, qmax = _fp4_e8m0_range(lo, hi)
    qr = q_ref.double()
    if not bool(((qmin <= qr) & (qr <= qmax)).all()):
        raise AssertionError("index_score_bound: the reference's own query lies outside its enclosure")
    dq = torch.maximum(qmax - qr, qr - qmin)
    qabs = torch.maximum(qmin.abs(), qmax.abs())
    # head weights: the GEMM output ±ulps, times the fixed factor, rounded to bf16
    factor = cfg.index_head_dim**-0.5 * cfg.index_heads**-0.5
    hp = linear(x, w["indexer.weights_proj.weight"])
    w_ref = (hp.float() * factor).to(torch.bfloat16)
    wlo, whi = _bf16_enclosure(
        _bf16_step(hp, ulps, False).double() * factor, _bf16_step(hp, ulps, True).double() * factor
    )
    wr = w_ref.double()
    dw = torch.maximum(whi.double() - wr, wr - wlo.double())
    wabs = torch.maximum(wlo.double().abs(), whi.double().abs())
    # keys: known exactly
    k_ref, k_got = ref_keys.to(dev).double(), got_keys.to(dev).double()
    dk = (k_got - k_ref).abs()
    kabs = torch.maximum(k_ref.abs(), k_got.abs())
    dot = torch.einsum("mhd,ld->mhl", qr, k_ref)
    ddot = torch.einsum("mhd,ld->mhl", dq, k_ref.abs()) + torch.einsum("mhd,ld->mhl", qabs, dk)
    # one rounding each side: |RN(a) − RN(b)| ≤ |a − b| + 1 ulp; fp32 sums on both sides
    ddot += _ulp(dot.abs() + ddot) + 2 * d * _FP32_EPS * torch.einsum("mhd,ld->mhl", qabs, kabs)
    relu = dot.to(torch.bfloat16).double().relu()
    prod = relu * wr[..., None]
    dprod = wabs[..., None] * ddot + dw[..., None] * relu
    dprod += _ulp(prod.abs() + dprod)
    score = prod.sum(1)
    bound = dprod.sum(1)
    bound += _ulp(score.abs() + bound) + 2 * H * _FP32_EPS * (prod.abs() + dprod).sum(1)
    scores = index_scores(q_ref, w_ref, ref_keys.to(dev), torch.full((m,), L, device=dev))
    return ScoreBound(bound.cpu(), scores.cpu(), int((dq > 0).sum()))


def _kv_source(cfg: AttnV41Cfg, layer: int) -> int:
    return cfg.kv_source_of(layer)


def _compare_layer(
    ref_get,
    cfg,
    rname,
    start,
    m,
    window_cols,
    offset,
    i,
    role,
    tr,
    traces,
    score_rows,
    rows,
    inputs=None,
    keys: dict | None = None,
    kv_rows: torch.Tensor | None = None,
) -> LayerReport:
    """Compare one layer's results `tr` against reference tensors `ref_get(layer, name)`
    (golden tensors, or another implementation's trace) by the golden README's rules,
    extended where a rule's exception has consequences downstream:

    - index scores: an entry beyond the tolerance passes only within the bound
      `index_score_bound` computes for it from a shown cause (index-query elements next to
      an fp4 rounding boundary, index keys that differ, one rounding per stage); that
      needs `inputs(layer) -> (x, weights)`, the layer's reference input and weights, and
      our index keys (this step's trace of their owner, else `keys[owner]`, the rows the
      owner wrote at an earlier step: rows are written once). Without them the plain
      tolerance applies. Rows holding an excused entry are then judged by our own scores:
      the selection must be a valid top-k of them and the candidate mask must follow;
    - out of an FP8 `wo_b` (`compare_out`): a row over the tolerance passes only when at
      most `compare_out.MAX_FLIPS` one-step e4m3 flips of `wo_b`'s input (elements within
      one bf16 ulp of a rounding boundary, u recomputed from our `o`, else the
      reference's) account for it; that needs `inputs` (the weights);
    - o / out of a row are compared only where the selection matches and every attended
      row (window and compressed) is bit-identical to the reference's: an accepted
      one-step quantization difference in an attended row moves o by more than bf16's
      tolerance when a token attends to few rows. Such rows count as excused. A layer
      that did not report its selection inherits its selection source's verdict per row;
    - `kv_rows`: the rows of our `kv_win` the reference's holds (a reduced golden file;
      None: all of them); `kv_win` is compared on those, and the attended-rows check
      knows only those;
    - a captured decode step (a trace with `observed_from`, name → layer) reports tensors
      of other layers as it left them (its kv source's cache rows, the candidate mask);
      they are compared against that layer's reference tensors by that layer's rules.
      A trace's `errors` (name → message) fail that tensor outright.
    """
    from .reference.indexer import candidate_mask

    lr = LayerReport(rname, i, role.name)
    observed_from = getattr(tr, "observed_from", None) or {}
    errors = getattr(tr, "errors", None) or {}
    present = {n: ref_get(observed_from.get(n, i), n) for n in KINDS}
    r = role.ratio
    L_end = (start + m) // r if r else 0
    lr.expected = _expected(role, L_end)
    lr.skipped = sorted(n for n in lr.expected if present.get(n) is None)

    def got(n):
        return _cpu(getattr(tr, n, None))

    not_produced = getattr(tr, "not_produced", None) or ()

    def missing(n) -> bool:
        if n in errors:
            lr.cmps.append(Cmp(n, False, float("inf"), errors[n]))
            return True
        if n in not_produced:  # by design (a captured step does not keep q and o)
            lr.skipped.append(n)
            return True
        if got(n) is None:
            lr.cmps.append(Cmp(n, False, float("inf"), "the implementation did not produce it"))
            return True
        return False

    positions = torch.arange(start, start + m)
    visible = torch.div(positions + 1, r, rounding_mode="floor") if r else None
    sel_same_rows = None
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
        allowance, note = _score_allowance(ref_get, cfg, start, i, tr, traces, keys, inputs, r_sc)
        c = compare_bf16(
            "index_score", g_sc, r_sc, allowance=allowance, finite_only_rows=own_rows if own_rows.any() else None
        )
        c.detail += f"; {note}" if c.detail else note
        lr.cmps.append(c)
        score_rows[i] = set(c.rows) | set(own_rows.nonzero().flatten().tolist())
        if c.ok and g_sc.shape == r_sc.shape:  # rows whose scores differ at all, within the rules
            score_rows[("differ", i)] = set((g_sc.double() != r_sc.double()).any(1).nonzero().flatten().tolist())
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
    if sel_same_rows is None:
        # No selection of our own compared: a reuse layer attends with its source's, and
        # a row where that one legitimately differs from the reference's (a tie) differs here too.
        inherited = score_rows.get(("sel_same", selection_source(cfg, i))) if r else None
        sel_same_rows = inherited if inherited is not None else torch.ones(m, dtype=torch.bool)
    score_rows[("sel_same", i)] = sel_same_rows
    same_inputs = sel_same_rows & _attended_rows_equal(ref_get, cfg, i, role, tr, traces, m, offset, kv_rows)
    for n in ("q", "kv_win", "compress_kv", "index_k", "index_k_owner", "candidates", "o", "out"):
        ref = present[n]
        if ref is None or missing(n):
            continue
        g = got(n)
        owner = observed_from.get(n, i)
        suffix = f" (L{owner}'s, as this captured step left it)" if owner != i else ""
        if n in ("q", "o") and rows is not None:
            g = g[rows]
        if n == "kv_win":
            c = compare_quantized(n, g if kv_rows is None else g[kv_rows], ref, "fp8")
        elif n in ("compress_kv", "index_k"):
            c = compare_quantized(n, g, ref, "fp4")
        elif n == "index_k_owner":
            c = compare_exact(n, g.reshape(-1).to(torch.int32), ref.reshape(-1).to(torch.int32))
        elif n == "candidates":
            tie = ref_get(owner, "cand_tie")
            keep = torch.ones(m, dtype=torch.bool) if tie is None else tie == 0
            # Rows whose scores differ from the reference's (within the rules) are judged by
            # ours: the block maxima near the cut may order differently.
            own = torch.zeros(m, dtype=torch.bool)
            own[list(score_rows.get(owner, set()) | score_rows.get(("differ", owner), set()))] = True
            keep &= ~own
            c = compare_exact(n, g.to(torch.uint8)[keep], ref.to(torch.uint8)[keep])
            differ = (~keep) & (g.to(torch.uint8) != ref.to(torch.uint8)).any(1)
            if c.ok and own.any():  # rows with excused scores: our mask must follow our own scores
                src_tr = traces.get(owner) if owner != i else tr
                scores = _cpu(getattr(src_tr, "index_score", None)) if src_tr is not None else None
                if scores is None:
                    c = Cmp(n, False, float("inf"), f"rows judged by our own scores, but L{owner}'s are not available")
                else:
                    mine = candidate_mask(scores[own], visible[own], cfg.cand_blocks, cfg.cand_block)
                    if not torch.equal(mine, g.bool()[own]):
                        c = Cmp(n, False, float("inf"), "candidate rows inconsistent with our own scores")
            c.excused = int((~keep).sum()) if c.ok else 0
            if owner == i:
                score_rows[("candidates", i)] = set(differ.nonzero().flatten().tolist())
        else:  # q, o, out
            if n == "q":
                same = torch.ones(g.shape[0], dtype=torch.bool)
            else:
                same = same_inputs if n == "out" or rows is None else same_inputs[rows]
            if n == "out":
                c = _compare_out(cfg, i, role, start, tr, present, inputs, g, ref, same)
            else:
                c = compare_bf16(n, g[same], ref[same])
                c.excused = int((~same).sum())
        c.detail += suffix
        lr.cmps.append(c)
    if keys is not None and role.is_kv_source and "index_k" not in observed_from and got("index_k") is not None:
        keys[i] = got("index_k").clone()
    return lr


def _compare_out(cfg, i, role, start, tr, present, inputs, g, ref, same) -> Cmp:
    """`out` (`compare_out.compare_out`): FP8 `wo_b` rows over the tolerance may be explained
    by e4m3 flips of its input, recomputed from our `o` of every row (else the reference's
    when it holds every row, as at decode)."""
    from .compare_out import compare_out

    w = inputs(i)[1] if inputs is not None else None
    o = _cpu(getattr(tr, "o", None))
    m = ref.shape[0]
    if o is None or o.shape[0] != m:
        o = present.get("o")
    if o is not None and o.shape[0] != m:
        o = None
    return compare_out(cfg, w, o, start, role.ratio, g, ref, same)


def _score_allowance(ref_get, cfg, start, i, tr, traces, keys, inputs, r_sc) -> tuple[torch.Tensor | None, str]:
    """The per-entry allowance for layer i's index scores (`index_score_bound`), and a note
    for the report: how many query elements were fragile, or why there is no allowance."""
    if inputs is None:
        return None, "no score bound (no reference x and weights given): plain tolerance"
    ref_owner = ref_get(i, "index_k_owner")
    our_owner = getattr(tr, "index_k_owner", None)
    if ref_owner is None or our_owner is None:
        return None, "no score bound (index_k_owner unknown): plain tolerance"
    ref_owner = int(ref_owner.reshape(-1)[0]) if isinstance(ref_owner, torch.Tensor) else int(ref_owner)
    our_owner = int(our_owner.reshape(-1)[0]) if isinstance(our_owner, torch.Tensor) else int(our_owner)
    L = r_sc.shape[1]
    ref_keys = ref_get(ref_owner, "index_k")
    if ref_keys is None or ref_keys.shape[0] < L:
        return None, f"no score bound (no reference index_k of L{ref_owner} with {L} rows): plain tolerance"
    src = traces.get(our_owner)
    ours = _cpu(getattr(src, "index_k", None)) if src is not None else None
    if ours is None and keys is not None:
        ours = keys.get(our_owner)
    if ours is None or ours.shape[0] < L:
        return None, f"no score bound (our index keys of L{our_owner} with {L} rows unknown): plain tolerance"
    x, w = inputs(i)
    sb = index_score_bound(cfg, w, x, start, ref_keys[:L], ours[:L])
    fin = torch.isfinite(r_sc)
    rec, ref = sb.scores.double(), r_sc.double()
    gap = torch.where(fin, (rec - ref).abs(), torch.zeros_like(ref))
    tol = ref[fin].abs().max().item() * BF16_REL + BF16_ABS if fin.any() else 0.0
    if gap.max().item() > tol:
        return None, (
            f"no score bound: the scores recomputed from the reference's x and weights differ from its "
            f"index_score by up to {gap.max().item() / tol:.3g} tol: plain tolerance"
        )
    n_keys = int((ours[:L].cpu() != ref_keys[:L]).any(1).sum())
    return sb.bound + gap, (
        f"bound from {sb.fragile} fragile index-query elements of {x.shape[0] * cfg.index_heads * cfg.index_head_dim}"
        f" and {n_keys} differing key rows"
    )


def _attended_rows_equal(ref_get, cfg, i, role, tr, traces, m, offset, kv_rows=None) -> torch.Tensor:
    """Bool [m]: whether every row token t attended (by our selection) is bit-identical to
    the reference's row. Unknown (not available; window rows outside `kv_rows`) counts as equal."""
    ok = torch.ones(m, dtype=torch.bool)
    sel = _cpu(getattr(tr, "sel", None))
    win, ref_win = _cpu(getattr(tr, "kv_win", None)), ref_get(i, "kv_win")
    if win is not None and kv_rows is not None:
        win = win[kv_rows]
    if sel is None or win is None or ref_win is None or win.shape != ref_win.shape:
        return ok
    bad = (~(win == ref_win).all(1)).nonzero().flatten()
    bad_rows = [bad if kv_rows is None else kv_rows[bad]]
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
    of each layer, in order, to `add`; `report` collects the comparisons.

    With `weights` (per layer, by released name) and each call's input `x` given to `add`,
    index scores beyond the tolerance are judged against `index_score_bound`; without
    them the plain tolerance applies."""

    def __init__(self, cfg: AttnV41Cfg, name: str = "reference", impl: str = "runtime", weights=None):
        if weights is not None and len(weights) != cfg.n_layers:
            raise ValueError(f"{len(weights)} weight sets; allowed: exactly n_layers = {cfg.n_layers}")
        self.cfg = cfg
        self.report = ReplayReport(name, "-", impl)
        self._weights = weights
        self._step = None
        self._ref: dict[int, Any] = {}
        self._got: dict[int, Any] = {}
        self._x: dict[int, torch.Tensor] = {}
        self._score_rows: dict = {}
        self._ref_keys: dict[int, torch.Tensor] = {}  # per kv source, the latest rows (written once)
        self._got_keys: dict[int, torch.Tensor] = {}

    def add(self, i: int, start_pos: int, m: int, ref_trace, got_trace, keep: bool = True, x=None) -> LayerReport:
        if self._step != start_pos:
            self._step, self._ref, self._got, self._score_rows, self._x = start_pos, {}, {}, {}, {}
        self._ref[i] = _Frozen(ref_trace)
        self._got[i] = _Frozen(got_trace)
        if self._ref[i].index_k is not None:
            self._ref_keys[i] = self._ref[i].index_k
        if x is not None:
            self._x[i] = x
        W = self.cfg.window
        wc, off = (min(m, W), m) if start_pos == 0 else (W, W)

        def ref_get(layer, name):
            t = self._ref.get(layer)
            if name == "index_k" and (t is None or t.get(name) is None):
                return self._ref_keys.get(layer)  # an owner that has not run yet this step
            return None if t is None else t.get(name)

        inputs = None
        if self._weights is not None and i in self._x:
            inputs = lambda layer: (self._x[layer], self._weights[layer])  # noqa: E731

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
            inputs,
            self._got_keys,
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
