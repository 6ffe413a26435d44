"""Tensor parallelism over heads: one rank's share of every attention layer.

How engines shard V4.1's attention (vLLM's and SGLang's attention TP): rank r of tp
ranks holds the query heads `r·H/tp … (r+1)·H/tp − 1` and the output groups
`r·G/tp …` (attention-v41.md §8: group g takes heads `g·H/G …`, so a rank's heads feed
exactly its groups), that is the rows of `wq_b` and `attn_sink` of its heads, the rows
of `wo_a` of its groups and the columns of `wo_b` that read them. Everything else is
replicated: `wq_a`, `q_norm`, `wkv`, `kv_norm`, the compressor and the indexer (every
rank computes the same caches and the same top-k: the selection is deterministic with
one tie rule), and so are the caches and the per-sequence state.

A rank's layer is a V4.1 layer of its own geometry (`tp_config`: n_heads/tp heads,
groups/tp groups, the group width unchanged), so the runtimes (`AttnV41`, `BatchV41`,
the graph drivers) and the reference run it as they are. Its output is the rank's
partial of `wo_b` (bf16 `[m, dim]`, rounded once from the rank's columns alone); the
layer's output is the sum of the ranks' partials, which the engine forms (an
all-reduce; `tp_reduce` for one process). Every value before `wo_b` (q, the caches, the
selection, o, u) is bit for bit the full layer's on the rank's heads; the sum of bf16
partials differs from the full layer's single rounding by at most half an ulp of each
partial plus half an ulp of the result (tests/test_tp.py checks that bound).

FP8 weights shard on their 32×32 scale blocks: `wq_b` always (head_dim is a multiple of
32), `wo_b` when a rank's input width (groups/tp · o_rank) is a multiple of 32, since
its input is quantized per 32 values: a block across two ranks would take a scale from
the other rank's values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch

from .config import AttnV41Cfg
from .weights import FP8_BLOCK, PREFIX, AttnV41LayerWeights

__all__ = ["check_tp", "tp_config", "tp_sizes", "shard_weights", "tp_reduce", "TPStack", "tp_impl"]


def tp_sizes(cfg: AttnV41Cfg, fp8: bool = False) -> tuple[int, ...]:
    """The tensor-parallel sizes this geometry shards into: the divisors of `groups`
    (a rank holds whole output groups), with `fp8` (FP8 weights) those whose rank's
    `wo_b` input width (groups/tp · o_rank) is a multiple of 32."""
    G = cfg.groups
    return tuple(t for t in range(1, G + 1) if G % t == 0 and not (fp8 and (G // t * cfg.o_rank) % FP8_BLOCK))


def check_tp(cfg: AttnV41Cfg, tp_size, tp_rank=0, fp8: bool = False) -> None:
    """TypeError / ValueError naming the value and the allowed range unless rank `tp_rank`
    of `tp_size` is a share of `cfg` (`tp_sizes`; `fp8`: FP8 weights)."""
    if not isinstance(cfg, AttnV41Cfg):
        raise TypeError(f"cfg is a {type(cfg).__name__}; allowed: the model's AttnV41Cfg")
    for name, v in (("tp_size", tp_size), ("tp_rank", tp_rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} = {v!r}; allowed: an int")
    sizes = tp_sizes(cfg, fp8)
    if tp_size not in sizes:
        why = (
            f"divisors of groups ({cfg.groups}) whose rank's wo_b input (groups/tp_size · o_rank = "
            f"{cfg.groups} / tp_size · {cfg.o_rank}) is a multiple of {FP8_BLOCK} (FP8 weights)"
            if fp8
            else f"divisors of groups ({cfg.groups}): a rank holds whole output groups"
        )
        raise ValueError(f"tp_size = {tp_size}; allowed: {list(sizes)} ({why})")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank = {tp_rank}; allowed: 0..{tp_size - 1}")


def tp_config(cfg: AttnV41Cfg, tp_size: int) -> AttnV41Cfg:
    """The geometry of one rank of `tp_size`: `n_heads / tp_size` heads and
    `groups / tp_size` output groups, everything else (the group width, the capacities,
    the schedule) as in `cfg`. `tp_size = 1` returns `cfg` itself."""
    check_tp(cfg, tp_size)
    if tp_size == 1:
        return cfg
    return dataclasses.replace(cfg, n_heads=cfg.n_heads // tp_size, groups=cfg.groups // tp_size)


def shard_weights(
    w: AttnV41LayerWeights, cfg: AttnV41Cfg, tp_rank: int, tp_size: int, device=None
) -> AttnV41LayerWeights:
    """Rank `tp_rank`'s share of one layer's weights `w` (the full model's, geometry
    `cfg`), checked against `tp_config(cfg, tp_size)`, on `device` (default: w's). The
    slices are copies (contiguous, what the kernels read); replicated tensors are shared
    with `w` when the device is the same. bf16 and FP8 weights (`wq_b` and `wo_b` with
    their scale rows / columns; an FP8 `wo_a` held as bytes with its scale rows, or as the
    exact bf16 values of its rows where a scale block would straddle two ranks)."""
    if not isinstance(w, AttnV41LayerWeights):
        raise TypeError(f"w is a {type(w).__name__}; allowed: AttnV41LayerWeights (the full model's)")
    fp8 = w.format == "fp8"
    check_tp(cfg, tp_size, tp_rank, fp8)
    role = w.role
    if not 0 <= role.layer < cfg.n_layers or cfg.roles[role.layer] != role:
        raise ValueError(f"w is layer {role.layer} ({role}); allowed: a layer of cfg ({cfg.n_layers} layers)")
    H, D, G, R = cfg.n_heads, cfg.head_dim, cfg.groups, cfg.o_rank
    hl, gl = H // tp_size, G // tp_size
    q0, q1 = tp_rank * hl * D, (tp_rank + 1) * hl * D  # wq_b rows: the rank's heads
    h0, h1 = tp_rank * hl, (tp_rank + 1) * hl
    o0, o1 = tp_rank * gl * R, (tp_rank + 1) * gl * R  # wo_a rows, wo_b columns: the rank's groups
    got = w.state_dict()
    want_q, want_o = (H * D,), (G * R,)
    for k, n, ax in (("wq_b.weight", want_q[0], 0), ("wo_a.weight", want_o[0], 0), ("wo_b.weight", want_o[0], 1)):
        t = got[PREFIX + k]
        if t.dim() != 2 or t.shape[ax] != n:
            raise ValueError(
                f"layer {role.layer}: {PREFIX}{k}.shape = {tuple(t.shape)}; allowed: dim {ax} of {n} (the full "
                f"model's, cfg: {H} heads, {G} groups; pass the unsharded weights)"
            )

    def rows(t, a, b):
        return t[a:b].contiguous()

    def blocks(a, b):
        return a // FP8_BLOCK, -(-b // FP8_BLOCK)

    out = dict(got)
    out[PREFIX + "wq_b.weight"] = rows(got[PREFIX + "wq_b.weight"], q0, q1)
    out[PREFIX + "attn_sink"] = rows(got[PREFIX + "attn_sink"], h0, h1)
    out[PREFIX + "wo_a.weight"] = rows(got[PREFIX + "wo_a.weight"], o0, o1)
    out[PREFIX + "wo_b.weight"] = got[PREFIX + "wo_b.weight"][:, o0:o1].contiguous()
    if fp8:  # the bounds are multiples of 32 (head_dim; tp_sizes for wo_b)
        a, b = blocks(q0, q1)
        out[PREFIX + "wq_b.scale"] = rows(got[PREFIX + "wq_b.scale"], a, b)
        a, b = blocks(o0, o1)
        out[PREFIX + "wo_b.scale"] = got[PREFIX + "wo_b.scale"][:, a:b].contiguous()
    wo_a_scale = got.get(PREFIX + "wo_a.scale")
    if wo_a_scale is not None and (o0 % FP8_BLOCK or o1 % FP8_BLOCK):
        # held as bytes, but a scale block straddles two ranks: the share holds the exact bf16
        # values those bytes stand for (as `from_state_dict` does where blocks straddle groups)
        from .reference.fp8 import dequant_weight  # noqa: PLC0415 (only this case needs it)

        whole = dequant_weight(got[PREFIX + "wo_a.weight"], wo_a_scale, FP8_BLOCK, name=f"layer {role.layer}: wo_a")
        out[PREFIX + "wo_a.weight"] = rows(whole, o0, o1)
        del out[PREFIX + "wo_a.scale"]
    elif wo_a_scale is not None:  # whole blocks: the share keeps the bytes and its scale rows
        a, b = blocks(o0, o1)
        out[PREFIX + "wo_a.scale"] = rows(wo_a_scale, a, b)
    local = tp_config(cfg, tp_size)
    if device is not None:
        out = {k: v.to(device) for k, v in out.items()}
    wo_a = "fp8" if PREFIX + "wo_a.scale" in out else "bf16"
    return AttnV41LayerWeights.from_state_dict(role, out, cfg=local, wo_a=wo_a)


def tp_reduce(partials) -> torch.Tensor:
    """The layer's output from its ranks' partials (bf16, one per rank in rank order, the
    same shape): summed in fp32 in rank order, rounded once to bf16. For one process (tests,
    `attnv41 check --tp`). An engine all-reduces the partials instead: summed in fp32 (in
    any order) and rounded once, the result lies within the module doc's bound of the full
    layer's output; a bf16 all-reduce rounds after each of its tp − 1 additions, adding up
    to half an ulp of each intermediate sum."""
    if not isinstance(partials, (list, tuple)) or not partials or not isinstance(partials[0], torch.Tensor):
        raise ValueError(f"partials is {partials!r:.60}; allowed: a non-empty list of bf16 tensors, one per rank")
    p0 = partials[0]
    for r, p in enumerate(partials):
        if not isinstance(p, torch.Tensor) or p.dtype != torch.bfloat16 or p.shape != p0.shape or p.device != p0.device:
            got = f"{p.dtype} {list(p.shape)} on {p.device}" if isinstance(p, torch.Tensor) else type(p).__name__
            raise ValueError(
                f"partials[{r}] is {got}; allowed: bf16 {list(p0.shape)} on {p0.device} (partials[0]'s shape)"
            )
    acc = p0.float()
    for p in partials[1:]:
        acc += p.float()
    return acc.to(torch.bfloat16)


class _TPRun:
    """One layer call over every rank: rank 0's run (the replicated fields: rows,
    selection, scores, caches), with `q` and `o` gathered over the ranks' heads in rank
    order and `out` the reduced output."""

    def __init__(self, run0, q: torch.Tensor, o: torch.Tensor, out: torch.Tensor, partials: list):
        self._run0, self.q, self.o, self.out, self.partials = run0, q, o, out, partials

    def __getattr__(self, name):
        return getattr(self._run0, name)

    def stored(self, name: str) -> torch.Tensor:
        """As `AttnV41Run.stored`: q, o and out as gathered (never packed), the rest rank 0's."""
        if name in ("q", "o", "out"):
            return getattr(self, name)
        return self._run0.stored(name)


def _reference_rank(cfg: AttnV41Cfg, weights: list, device, index_keys: str):
    from .reference.layer import RefStack  # noqa: PLC0415 (the reference stays an optional import)

    plain = [{k.removeprefix(PREFIX): v for k, v in w.state_dict().items()} for w in weights]
    return RefStack(cfg, plain, device=device, index_keys=index_keys)


def _runtime_rank(cfg: AttnV41Cfg, weights: list, device, index_keys: str, **kw):
    from .runtime.stack import RuntimeStack  # noqa: PLC0415 (tp.py sits below the runtime otherwise)

    return RuntimeStack(cfg, weights, device=device, index_keys=index_keys, **kw)


class TPStack:
    """`tp_size` ranks of one sequence in one process, each a stack over its share of the
    weights (`shard_weights`): what an engine runs on `tp_size` GPUs, run one rank after
    the other on one device, to check the sharding (`attnv41 check --tp N`, tests/test_tp.py).
    `impl`: "runtime" (`RuntimeStack`, `kw` passed on: kv_format, ops, ...) or "reference".
    `layer(i, x, start_pos)` runs layer i on every rank and returns rank 0's run with `q`
    and `o` over all heads, `out` = `tp_reduce` of the ranks' partials and `partials`
    (copies; the other fields are views valid until rank 0's next call). `wo_a`: how an
    FP8 `wo_a` given in a mapping is held ("fp8", the default, or "bf16": `from_state_dict`).
    `ranks`: the per-rank stacks."""

    def __init__(
        self,
        cfg: AttnV41Cfg,
        weights: Sequence[AttnV41LayerWeights | Mapping[str, torch.Tensor]],
        tp_size: int,
        device="cpu",
        index_keys: str = "own",
        impl: str = "runtime",
        **kw,
    ):
        makers = {"runtime": _runtime_rank, "reference": _reference_rank}
        if impl not in makers:
            raise ValueError(f"impl = {impl!r}; allowed: {tuple(makers)}")
        if impl == "reference" and set(kw) - {"wo_a"}:
            bad = sorted(set(kw) - {"wo_a"})
            raise ValueError(f"{bad} with impl='reference'; allowed: runtime options with impl='runtime' only")
        if not isinstance(weights, Sequence) or len(weights) != cfg.n_layers:
            got = f"{len(weights)} layers" if isinstance(weights, Sequence) else f"a {type(weights).__name__}"
            raise ValueError(f"weights: {got}; allowed: a list of cfg.n_layers = {cfg.n_layers} layers")
        wo_a = kw.pop("wo_a", "fp8")  # how an FP8 wo_a given as a mapping is held (from_state_dict)
        full = [
            w
            if isinstance(w, AttnV41LayerWeights)
            else AttnV41LayerWeights.from_state_dict(cfg.roles[i], w, cfg=cfg, wo_a=wo_a)
            for i, w in enumerate(weights)
        ]
        fp8 = any(w.format == "fp8" for w in full)
        check_tp(cfg, tp_size, 0, fp8)
        self.cfg, self.tp_size, self.local = cfg, tp_size, tp_config(cfg, tp_size)
        self.ranks = [
            makers[impl](
                self.local, [shard_weights(w, cfg, r, tp_size, device) for w in full], device, index_keys, **kw
            )
            for r in range(tp_size)
        ]

    def nonfinite_count(self) -> int | None:
        """Non-finite values the ranks wrote into their caches (summed; None for reference ranks)."""
        if not hasattr(self.ranks[0], "attn"):
            return None
        return sum(rk.attn.nonfinite_count() for rk in self.ranks)

    def layer(self, i: int, x: torch.Tensor, start_pos: int) -> _TPRun:
        runs = [rk.layer(i, x, start_pos) for rk in self.ranks]
        partials = [r.out.clone() for r in runs]  # the runs' out are views of each rank's workspace
        return _TPRun(
            runs[0],
            q=torch.cat([r.q for r in runs], dim=1),
            o=torch.cat([r.o for r in runs], dim=1),
            out=tp_reduce(partials),
            partials=partials,
        )

    def step(self, xs: Sequence[torch.Tensor], start_pos: int) -> list:
        """All layers in order; `xs[i]` is layer i's input."""
        return [self.layer(i, xs[i], start_pos) for i in range(self.cfg.n_layers)]


def tp_impl(tp_size: int, impl: str = "runtime", **kw) -> Callable:
    """A golden implementation (`golden.replay`'s `make_impl`): `TPStack` of `tp_size`
    ranks over `impl`."""

    def make(cfg: AttnV41Cfg, weights, index_keys: str, device):
        return TPStack(cfg, weights, tp_size, device=device, index_keys=index_keys, impl=impl, **kw)

    make.weights_dtypes = ("bf16", "fp8")
    return make
