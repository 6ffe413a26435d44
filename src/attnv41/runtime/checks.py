"""The host-side checks of `AttnV41` (runtime-api.md): arguments, positions, the order
of layers and steps in a sequence, that weights, state and shared state belong to the
runtime's config and the state to its sequence, what a layer reads having been
published; and the sequence's order bookkeeping (`_advance`). Everything here runs
before a call writes anything, on the host, without a device sync (`check_finite`
excepted), and raises naming the value and what is allowed.

A mixin: it reads the runtime's `cfg`, `device`, `kv_format`, `index_keys`,
`check_finite`, `_freed` and `_ticket` (a prepared decode step, `runtime/attn.py`).
"""

from __future__ import annotations

import operator
import reprlib

import torch

from ..config import KeyMismatchError
from ..state import AttnV41LayerState, SharedV41, cache_widths
from ..weights import AttnV41LayerWeights, expected_tensors

__all__ = ["AttnChecks", "check_released_keys", "keys_held", "not_an_int", "released_owners"]


def not_an_int(name: str, v, allowed: str | None = None) -> TypeError:
    """The TypeError for a position or slot that is not a Python int (numpy and tensor
    scalars included: they would be read on the host), naming the value and its type."""
    rng = f" ({allowed})" if allowed else ""
    hint = f" (int({name}) converts a numpy or 0-d tensor scalar)" if getattr(v, "ndim", None) == 0 else ""
    return TypeError(f"{name} = {reprlib.repr(v)} is a {type(v).__name__}; allowed: int{rng}{hint}")


def keys_held(cfg, j: int, i: int, s: int, m: int) -> int:
    """The index-key rows layer j (a kv source) holds when layer i of a call of m tokens at
    s runs: its complete groups after the call when it ran before i in it, else before."""
    rj = cfg.roles[j].ratio
    return (s + m) // rj if j <= i else s // rj


def released_owners(cfg, owner: int | None, s: int, m: int) -> tuple[dict[int, int | None], int | None]:
    """With released index keys, the walk of one call of m tokens at s over every layer in
    order, as the released code decides for one sequence (attention-v41.md §9;
    `AttnV41.forward`): an index source that is also a kv source publishes its own keys
    when the call completes at least one of its groups, and every index source scores the
    keys published last (`owner` at the start: None for none), its own or another
    layer's. Returns ({index source of ratio > 0: the layer whose keys it scores (None: no
    keys to score)}, the owner after the call). Raises ValueError naming the first layer
    that would score more rows than that publisher holds (`keys_held`: the released code
    reads unwritten rows there, which this runtime's caches do not keep) or that has keys
    to score and no publisher. The single-sequence runtime's whole-step checks and
    `BatchV41.begin` (per sequence) both walk here; `_check_sources` checks the same layer
    by layer."""
    plan: dict[int, int | None] = {}
    for role in cfg.roles:
        i, r = role.layer, role.ratio
        if r == 0 or not role.is_index_source:
            continue
        L = (s + m) // r
        if role.is_kv_source and L > s // r:  # a group completes: its own keys are published
            owner = i
        plan[i] = owner
        if L == 0 or owner == i:
            continue
        if owner is None:
            raise ValueError(
                f"layer {i} at start_pos {s} would score {L} index keys with index_keys='released' and no layer "
                "has published any; allowed: steps after a publishing one (attention-v41.md §9)"
            )
        have = keys_held(cfg, owner, i, s, m)
        if have < L:
            raise ValueError(
                f"layer {i} at start_pos {s} would score {L} index keys of layer {owner}, which holds {have} "
                "(the released code reads unwritten rows there, which this runtime's caches do not keep); "
                "allowed: at most the rows the last publisher holds"
            )
    return plan, owner


def check_released_keys(cfg, owner: int, s: int, m: int) -> None:
    """`released_owners` for the single-sequence runtime, whose shared state names no
    owner as −1 (`SharedV41.index_k_owner`): raises, before a whole step runs, naming the
    first layer that would score rows its publisher does not hold."""
    released_owners(cfg, None if owner < 0 else owner, s, m)


class AttnChecks:
    """`AttnV41`'s checks and order bookkeeping (module docstring)."""

    def _check(self, w: AttnV41LayerWeights, st: AttnV41LayerState, shared: SharedV41, x, start_pos: int) -> None:
        """Every check of runtime-api.md, before anything is written."""
        self._check_live("forward")
        m = self._check_x(x)
        self._check_pos(start_pos, m)
        self._check_layer(w, st)
        self._check_shared(shared)
        self._check_order(w.role.layer, shared, start_pos, m, self._book_for(shared, w.role.layer, start_pos))
        if start_pos > 0:
            self._check_bound(st, shared)
        self._check_sources(w.role, st, shared, start_pos, m)
        self._check_values(x, w.role.layer, start_pos)

    def _check_freed(self, what: str) -> None:
        if self._freed:
            raise RuntimeError(f"AttnV41.{what} after free(); allowed: before free() (build a new AttnV41)")

    def _check_live(self, what: str) -> None:
        self._check_freed(what)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"AttnV41.{what} was reached during CUDA graph capture; it does host work "
                "(only decode_body may be captured)"
            )

    def _check_values(self, x: torch.Tensor, layer: int, start_pos: int) -> None:
        """With `check_finite`: x must be finite (a host sync; before any state write)."""
        if self.check_finite:
            bad = int((~torch.isfinite(x)).sum())
            if bad:
                raise ValueError(
                    f"layer {layer} at start_pos {start_pos}: x holds {bad} non-finite values; "
                    "allowed: finite values (check_finite=True)"
                )

    def _check_x(self, x, m_max: int | None = None) -> int:
        c = self.cfg
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x is a {type(x).__name__}; allowed: a torch.Tensor")
        if x.layout != torch.strided:
            raise TypeError(f"x.layout = {x.layout}; allowed: torch.strided (a dense tensor)")
        if x.dtype != torch.bfloat16:
            raise TypeError(f"x.dtype = {x.dtype}; allowed: torch.bfloat16")
        if x.device != self.device:
            raise ValueError(f"x.device = {x.device}; allowed: {self.device} (the runtime's device)")
        if x.dim() != 2 or x.shape[1] != c.dim:
            raise ValueError(f"x.shape = {tuple(x.shape)}; allowed: [m, {c.dim}]")
        m = x.shape[0]
        hi = c.max_tokens if m_max is None else m_max
        if not 1 <= m <= hi:
            raise ValueError(f"m = {m}; allowed: 1..{hi}" + (" (max_tokens)" if m_max is None else " (decode)"))
        return m

    def _check_pos(self, start_pos: int, m: int) -> None:
        c = self.cfg
        if isinstance(start_pos, bool) or not isinstance(start_pos, int):
            raise not_an_int("start_pos", start_pos, f"0..{c.max_seq - m}")
        if start_pos < 0:
            raise ValueError(f"start_pos = {start_pos}; allowed: >= 0")
        if start_pos + m > c.max_seq:
            raise ValueError(
                f"positions {start_pos}..{start_pos + m - 1}; allowed: 0..{c.max_seq - 1} (max_seq = {c.max_seq})"
            )

    def _check_cfg(self, what: str, cfg) -> None:
        if cfg is not self.cfg and cfg != self.cfg:
            diff = [
                f"{f}={getattr(cfg, f)!r} (runtime: {getattr(self.cfg, f)!r})"
                for f in self.cfg.to_dict()
                if getattr(cfg, f, None) != getattr(self.cfg, f)
            ]
            raise ValueError(f"{what} was built for another config ({', '.join(diff[:4])}); allowed: this runtime's")

    def _check_role(self, w: AttnV41LayerWeights) -> None:
        if not isinstance(w, AttnV41LayerWeights):
            raise TypeError(f"weights are a {type(w).__name__}; allowed: AttnV41LayerWeights")
        c, role = self.cfg, w.role
        if not 0 <= role.layer < c.n_layers or (c.roles[role.layer] is not role and c.roles[role.layer] != role):
            raise ValueError(f"weights role {role}; allowed: the config's role for layer {role.layer}")

    def _check_state(self, st: AttnV41LayerState, role) -> None:
        c = self.cfg
        if not isinstance(st, AttnV41LayerState):
            raise TypeError(f"state is a {type(st).__name__}; allowed: AttnV41LayerState (attn.new_layer_state)")
        # checked before by this runtime, with the same ring, config and role: nothing to redo
        seen = st.__dict__.get("_checked_by")
        if seen is not None and seen[0] is self and seen[1] is st.ring and seen[2] is st.cfg and seen[3] is role:
            return
        if st.role != role:
            raise ValueError(
                f"state of layer {st.role.layer} given with weights of layer {role.layer}; allowed: layer "
                f"{role.layer}'s state (attn.new_layer_state({role.layer}))"
            )
        self._check_cfg(f"layer {role.layer}'s state", st.cfg)
        ring = st.ring
        if st.kv_format != self.kv_format:
            raise ValueError(
                f"layer {role.layer}: state kv_format = {st.kv_format!r}; allowed: {self.kv_format!r} (this runtime's; "
                "attn.new_layer_state)"
            )
        width = cache_widths(c, self.kv_format)["ring"]
        dt = torch.uint8 if self.kv_format == "packed" else torch.bfloat16
        if tuple(ring.shape) != (c.window, width) or ring.dtype != dt or ring.device != self.device:
            raise ValueError(
                f"layer {role.layer}: state ring {tuple(ring.shape)} {ring.dtype} on {ring.device}; "
                f"allowed: ({c.window}, {width}) {dt} on {self.device}"
            )
        st._checked_by = (self, ring, st.cfg, role)

    def _check_shared(self, shared: SharedV41) -> None:
        c = self.cfg
        if not isinstance(shared, SharedV41):
            raise TypeError(f"shared is a {type(shared).__name__}; allowed: SharedV41 (attn.new_shared)")
        self._check_cfg("the shared state", shared.cfg)
        t = shared.topk_idxs
        if tuple(t.shape) != (c.max_tokens, c.index_topk) or t.device != self.device:
            raise ValueError(
                f"shared.topk_idxs {tuple(t.shape)} on {t.device}; allowed: ({c.max_tokens}, {c.index_topk}) "
                f"on {self.device}"
            )

    def _check_layer(self, w: AttnV41LayerWeights, st: AttnV41LayerState) -> None:
        """Weights and state of one layer: roles, config, and every tensor's name, shape,
        dtype and device (re-checked whenever a tensor of `w` was replaced)."""
        self._check_role(w)
        self._check_state(st, w.role)
        self._check_weights(w)

    def _check_weights(self, w: AttnV41LayerWeights) -> None:
        """Every tensor's name, shape, dtype and device (role checked before)."""
        c, role = self.cfg, w.role
        # Kept on the weights object (not here: the runtime must not keep dropped weights alive)
        seen = w.__dict__.get("_checked_by")
        if seen is not None and seen[0] is self and seen[1] is w.tensors:
            if all(map(operator.is_, map(w.tensors.get, seen[2]), seen[3])):
                return  # checked before: the same dict holding the same tensors
        spec = expected_tensors(c, role, w.format)
        for name, (shape, dtypes) in spec.items():
            t = w.get(name)
            if t is None:
                raise KeyMismatchError(f"layer {role.layer}: weight {name!r} is missing")
            if t.dtype not in dtypes:
                raise TypeError(f"layer {role.layer}: {name}.dtype = {t.dtype}; allowed: {list(dtypes)}")
            if tuple(t.shape) != shape:
                raise ValueError(f"layer {role.layer}: {name}.shape = {tuple(t.shape)}; allowed: {shape}")
            if t.device != self.device:
                raise ValueError(f"layer {role.layer}: {name}.device = {t.device}; allowed: {self.device}")
        names = tuple(spec)
        w._checked_by = (self, w.tensors, names, tuple(w.tensors[n] for n in names))

    def _check_bound(self, st: AttnV41LayerState, shared: SharedV41) -> None:
        """A decode call's state must have been prefilled in this very sequence."""
        if st.seq_id != shared.seq_id:
            where = "no sequence (never prefilled)" if st.seq_id is None else f"sequence #{st.seq_id}"
            raise ValueError(
                f"layer {st.role.layer}: its state belongs to {where}; allowed: the state prefilled in this "
                f"sequence (#{shared.seq_id}, the shared state given)"
            )

    @staticmethod
    def _book(shared: SharedV41) -> tuple[int, int, int]:
        return shared.last_layer, shared.step_pos, shared.step_end

    def _book_for(self, shared: SharedV41, layer: int, start_pos: int) -> tuple[int, int, int]:
        """The order state a call of `layer` at `start_pos` is checked against: the shared
        state's, or, when that very step was prepared and its body has not run, the state
        before the prep (forward or a graph driver may run the prepared step instead)."""
        t = self._ticket
        if t is not None and not t.done and t.shared is shared and t.layer == layer and t.pos == start_pos:
            return t.before
        return self._book(shared)

    def _expected_next(self, book: tuple[int, int, int]) -> str:
        n = self.cfg.n_layers
        last, pos, end = book
        if last in (-1, n - 1):
            nxt = "layer 0 at start_pos 0 (a new sequence)"
            if last == n - 1:
                nxt += f" or layer 0 at start_pos {end} (the next step)"
            return nxt
        return (
            f"layer {last + 1} at start_pos {pos} with m = {end - pos} (layers run in order; layer {last} ran "
            "last), or layer 0 at start_pos 0 (a new sequence)"
        )

    def _check_order(
        self, layer: int, shared: SharedV41, start_pos: int, m: int, book: tuple[int, int, int] | None = None
    ) -> None:
        """Layers run strictly in order and steps one after another: layer 0 opens a step
        (at 0: a new sequence; else where the last complete step ended), layer i > 0
        follows layer i−1 of the same step. Anything else would write a ring slot twice,
        skip one, or leave the sequence half-stepped. `book`: the order state to check
        against (default: the shared state's)."""
        n = self.cfg.n_layers
        last, pos, end = self._book(shared) if book is None else book
        if layer == 0 and start_pos == 0:
            return  # a new sequence may always start
        self._check_failed(shared, f"layer {layer} at start_pos {start_pos}")
        if layer == 0:
            ok = last == n - 1 and start_pos == end
            if not ok and last == n - 1:
                raise ValueError(
                    f"layer 0: start_pos = {start_pos}; allowed: 0 (a new sequence) or {end} (the next token)"
                )
        else:
            ok = last == layer - 1 and start_pos == pos and start_pos + m == end
        if not ok:
            raise ValueError(
                f"layer {layer} at start_pos {start_pos} (m = {m}); allowed: {self._expected_next((last, pos, end))}"
            )

    @staticmethod
    def _check_failed(shared: SharedV41, what: str) -> None:
        """A sequence whose call raised part-way (`SharedV41.failed`) takes a new sequence only."""
        if shared.failed is not None:
            layer, p = shared.failed
            call = {None: "its decode step", "rollback": "its rollback"}.get(layer, f"its layer {layer} call")
            p = f"to {p}" if layer == "rollback" else f"at start_pos {p}"
            raise ValueError(
                f"{what}: {call} {p} raised part-way, so its caches hold part of that call; "
                f"allowed: layer 0 at start_pos 0 (a new sequence)"
            )

    def _check_sources(self, role, st: AttnV41LayerState | None, shared: SharedV41, start_pos: int, m: int) -> None:
        """What a ratio>0 layer reads from the shared state must have been published."""
        c = self.cfg
        i, r = role.layer, role.ratio
        if r == 0:
            return
        if m == 1 and start_pos > 0:  # a decode step: its selection goes through the shared plan
            self._check_plan_free(role, shared, start_pos)
        L = (start_pos + m) // r
        if not role.is_kv_source and (shared.compress_kv is None or shared.compress_ratio != r):
            raise ValueError(
                f"layer {i} (ratio {r}) runs before any kv source of ratio {r} published compressed rows "
                f"(published ratio: {shared.compress_ratio or 'none'})"
            )
        if role.is_index_source and L > 0:
            own_keys = role.is_kv_source and (self.index_keys == "own" or L > st.n_rows or start_pos == 0)
            if not own_keys and (shared.index_k is None or shared.index_k.shape[0] < L):
                raise ValueError(f"layer {i}: needs {L} published index keys; none of that length were published")
            j = shared.index_k_owner
            if not own_keys and j >= 0:  # released mode, another layer's keys: as many rows as it holds
                have = keys_held(c, j, i, start_pos, m)
                if have < L:
                    raise ValueError(
                        f"layer {i} at start_pos {start_pos} would score {L} index keys of layer {j}, which holds "
                        f"{have} (the released code reads unwritten rows there, which this runtime's caches do "
                        "not keep: BatchV41 refuses the same); allowed: at most the rows the last publisher holds"
                    )
            if role.uses_candidates and (shared.candidates is None or shared.candidates_pos != start_pos):
                raise ValueError(f"layer {i} uses candidates, but none were published for start_pos {start_pos}")
        if not role.is_index_source and L > 0:
            if shared.topk_pos != start_pos or shared.topk_m != m:
                raise ValueError(f"layer {i} reuses a selection, but none was published for start_pos {start_pos}")
            if shared.topk_k > c.index_topk:
                raise ValueError(f"selection width {shared.topk_k}; allowed: <= {c.index_topk} (the workspace)")

    def _advance(self, shared: SharedV41, layer: int, start_pos: int, m: int) -> None:
        """The host bookkeeping of a layer call that ran (or, for a prepared decode step,
        will run): the sequence's order state."""
        shared.last_layer, shared.step_pos, shared.step_end = layer, start_pos, start_pos + m
        shared.calls += 1
