"""Whole batched decode and verify steps as CUDA graphs, one per (kind, token-count
bucket, context bucket).

`BatchGraphs` drives the steps of a `BatchV41`: in a decode step every sequence of the
step contributes one token at its next position (≥ 1); in the other kind ("cont") each
sequence any number of tokens from its next position or from 0 (a new prompt): verify
calls (draft tokens; `BatchV41.rollback` then returns a slot to any position inside a
call of 2..window tokens, from undo buffers the graph fills), prompt chunks, decode
tokens, mixed in one step. As engines do, it captures per size bucket: a step of B
tokens runs in the graph of its kind and the smallest size T ≥ B of `sizes`, its T − B
padding tokens computing in the pool's pad slot (`SeqPool.pad_slot`: position 1,
one-token calls, zero inputs, a spare block per ratio; nothing reads what they compute).
A "cont" step's undo buffers belong to its graph: the next "cont" step of the same size
reuses them, so a slot rolls back before that (refused after). Index sources
score `bucket // ratio` keys, bucket = `bucket_of(the step's last position, max_seq,
bucket_min)` (a power of two, as `DecodeGraphs`). A graph's shapes follow from (T, bucket)
only, so there is one graph per pair, captured on the pair's first step: that step runs
eagerly on a side stream (the warm-up: it compiles the kernels for the shapes and is the
step itself), then capture (which runs nothing); replays from the next step on. All
graphs share one memory pool. Before each replay the weights' tensors are compared with
those a graph baked; a change recaptures (`recaptures`).

Per step the host checks the call (all or nothing: a refused step changes nothing),
allocates the blocks sequences grow into (block-table entries written on the device, no
sync), uploads the step's metadata (each token's position and slot, and its index-key
owners in released mode: one copy of int32 rows, from pinned memory, non-blocking) and
replays. The graph derives the window selections and ring rows from that metadata
(`BatchV41._derive_decode`, `_derive_cont`), then runs every layer: layer i reads
`x_in[i, :T]` and writes `y[i, :T]`. Nothing waits for the device.

With `index_keys="released"` the host works out, per index source, the layer whose keys
each token scores (`BatchV41._keys_plan`, which also refuses a step the released rule
cannot run) and uploads it with the metadata; the graph scores every publishing layer's
keys with the other tokens' rows masked and keeps each token's owner's
(`BatchV41._released_scores_dev`).

A token's bytes are those the eager `BatchV41.step` gives it: graphs, padding and the
context bucket change no bits (the batch-invariance contract of the batched op table;
tested against eager steps on the CPU without graphs and on CUDA with them). On the CPU
(or `use_graphs=False`) the same body runs eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..weights import AttnV41LayerWeights
from .batch import BatchStep, BatchV41, seq_rows
from .device import on_own_device
from .graphs import _capture_graph, _Captured, _run_on_side_stream
from .plan import DEFAULT_BUCKET_MIN, bucket_of

__all__ = ["BatchGraphs", "default_sizes"]

PAD_POS = 1  # the padding tokens' position (a decode position: ≥ 1)
_OWN_ROW = 5  # the metadata's first owner row (released index keys)
KINDS = ("decode", "cont")


def default_sizes(n_slots: int, max_tokens: int) -> tuple[int, ...]:
    """Powers of two up to the first ≥ n_slots (the most sequences a step can hold),
    capped at max_tokens."""
    cap = min(1 << (n_slots - 1).bit_length(), max_tokens)
    out, t = [], 1
    while t < cap:
        out.append(t)
        t *= 2
    return tuple(out) + (cap,)


def _buckets(max_seq: int, bucket_min: int) -> set[int]:
    """Every value `bucket_of(p, max_seq, bucket_min)` takes for 0 ≤ p < max_seq."""
    out, b = set(), 1 << (max(bucket_min, 1) - 1).bit_length()
    while b < max_seq:
        out.add(b)
        b *= 2
    out.add(max_seq)
    return out


class BatchGraphs:
    """Steps of a `BatchV41` over `weights` (one `AttnV41LayerWeights` per layer, in
    order), captured per (kind, size, context bucket) (module docstring).

    `step(xs, slots, lens=None, starts=None)` returns `y[:, :B]` (`[n_layers, B, dim]`
    bf16, B tokens, valid until the next step). `captures`, `recaptures`: graphs
    captured; `capture_s[key]`: host seconds of each capture (its warm-up step included);
    `last_host_s`: host time of the last step (checks, bookkeeping, upload, replay; no
    device sync)."""

    def __init__(
        self,
        batch: BatchV41,
        weights: Sequence[AttnV41LayerWeights],
        sizes: Sequence[int] | None = None,
        use_graphs: bool | None = None,
        bucket_min: int = DEFAULT_BUCKET_MIN,
    ):
        if not isinstance(batch, BatchV41):
            raise TypeError(f"batch is a {type(batch).__name__}; allowed: a BatchV41")
        cfg = batch.cfg
        self.batch, self.cfg = batch, cfg
        cuda = batch.device.type == "cuda"
        self.use_graphs = cuda if use_graphs is None else bool(use_graphs)
        if self.use_graphs and not cuda:
            raise ValueError(f"use_graphs = True on {batch.device}; allowed: a CUDA device")
        weights = list(weights)
        if len(weights) != cfg.n_layers:
            raise ValueError(f"{len(weights)} layers' weights; allowed: exactly n_layers = {cfg.n_layers}")
        for i, w in enumerate(weights):
            if not isinstance(w, AttnV41LayerWeights) or w.role.layer != i:
                got = f"layer {w.role.layer}'s" if isinstance(w, AttnV41LayerWeights) else type(w).__name__
                raise ValueError(f"weights[{i}] is {got}; allowed: layer {i}'s AttnV41LayerWeights")
            batch.attn._check_role(w)
            batch.attn._check_weights(w)
        self.weights = weights
        if sizes is None:
            sizes = default_sizes(batch.pool.n_slots, cfg.max_tokens)
        sizes = tuple(sizes)
        if not sizes or any(
            isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= cfg.max_tokens for t in sizes
        ):
            raise ValueError(f"sizes = {sizes!r}; allowed: ints in 1..{cfg.max_tokens} (max_tokens), at least one")
        self.sizes = tuple(sorted(set(sizes)))
        if isinstance(bucket_min, bool) or not isinstance(bucket_min, int) or bucket_min < 1:
            raise ValueError(f"bucket_min = {bucket_min!r}; allowed: an int >= 1")
        self.bucket_min = bucket_min
        dev, T = batch.device, self.sizes[-1]
        self.x_in = torch.zeros(cfg.n_layers, T, cfg.dim, dtype=torch.bfloat16, device=dev)
        self.y = torch.zeros(cfg.n_layers, T, cfg.dim, dtype=torch.bfloat16, device=dev)
        # per token: position, slot; with released index keys, per index source the layer
        # whose keys the token scores (`BatchV41._keys_plan`, host-side, uploaded with them)
        self._released = batch.index_keys != "own"
        n_own = len(batch.index_sources) if self._released else 0
        # rows: position, slot, then (continuation steps) the sequence's first position, end
        # and first step row, then the owners
        self._meta = torch.zeros(_OWN_ROW + n_own, T, dtype=torch.int32, device=dev)
        self._steps: dict[tuple[str, int], BatchStep] = {}
        self._graphs: dict[tuple[str, int, int], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._capture_stream = torch.cuda.Stream(device=dev) if self.use_graphs else None
        self.captures = 0
        self.recaptures = 0
        self.capture_s: dict[tuple[int, int], float] = {}
        self.last_host_s = 0.0
        self._replaying = False  # set while a step's graph replays (`step`'s failure record)

    def size_for(self, n: int) -> int:
        """The captured size (tokens) a step of n tokens runs in."""
        for t in self.sizes:
            if t >= n:
                return t
        raise ValueError(f"{n} tokens in a step; allowed: 1..{self.sizes[-1]} (the largest of sizes)")

    # ------------------------------------------------------------------ stepping
    @on_own_device(lambda self: self.batch.attn)
    @torch.no_grad()
    def step(
        self, xs, slots: Sequence[int], lens: Sequence[int] | None = None, starts: Sequence[int] | None = None
    ) -> torch.Tensor:
        """For each of `slots` (distinct) `lens[i]` tokens from position `starts[i]`
        (default: the slot's length, its next position; 0 starts a new sequence in the
        slot, a prompt or its first chunk), through every layer. lens default 1: a decode
        step. Longer calls: draft tokens to verify (2..window tokens after position 0;
        `BatchV41.rollback` then returns a slot to any position inside them), prompt
        chunks, or both, mixed with decode tokens in one step. xs: `[n_layers, N, dim]`
        bf16 on the batch's device, N = Σ lens (layer i's inputs, the sequences' tokens
        contiguous in `slots` order), or `x_in[:, :N]` itself (no copy). Decode steps and
        the others run in separate graphs (`KINDS`). All or nothing: a refused call raises
        and changes no state. Runs without autograd (`BatchV41.step`): xs or weights that
        require grad are read as plain tensors; `y` has no history."""
        t0 = time.perf_counter()
        bt, pool, c = self.batch, self.batch.pool, self.cfg
        if not isinstance(slots, (list, tuple)) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in slots
        ):
            raise TypeError(f"slots = {slots!r}; allowed: a list of ints")
        if len(slots) == 0:
            raise ValueError(f"slots = {slots!r}; allowed: at least one slot")
        if lens is None:
            lens = [1] * len(slots)
        if not isinstance(lens, (list, tuple)) or not all(isinstance(m, int) and not isinstance(m, bool) for m in lens):
            raise TypeError(f"lens = {lens!r}; allowed: a list of ints")
        if len(lens) != len(slots):
            raise ValueError(f"{len(lens)} lens for {len(slots)} slots; allowed: one per slot")
        for sl, m in zip(slots, lens):
            if m < 1:
                raise ValueError(f"slot {sl}: lens = {m}; allowed: >= 1")
        lens = list(lens)
        B = sum(lens)
        T = self.size_for(B)
        for s in slots:
            pool._check_slot(s)
        if starts is None:
            starts = [pool.length[s] for s in slots]
            for s, p in zip(slots, starts):
                if p < 1:
                    raise ValueError(
                        f"slot {s} holds no sequence (length 0); allowed: slots holding one, or starts = 0 (a prompt)"
                    )
        elif (
            not isinstance(starts, (list, tuple))
            or len(starts) != len(slots)
            or not all(isinstance(p, int) and not isinstance(p, bool) for p in starts)
        ):
            raise ValueError(f"starts = {starts!r}; allowed: one int per slot (0 or the slot's length)")
        starts = list(starts)
        kind = "decode" if B == len(slots) and all(p > 0 for p in starts) else "cont"
        if bt.trace_slot is not None:
            raise ValueError(f"batch.trace_slot = {bt.trace_slot}; allowed: None (graph steps are not traced)")
        same = xs is self.x_in or (
            isinstance(xs, torch.Tensor)
            and xs.data_ptr() == self.x_in.data_ptr()
            and xs.shape == (c.n_layers, B, c.dim)
            and xs.stride() == self.x_in.stride()
        )
        if not same:
            if not isinstance(xs, torch.Tensor):
                raise TypeError(f"xs is a {type(xs).__name__}; allowed: a [{c.n_layers}, {B}, {c.dim}] bf16 tensor")
            if tuple(xs.shape) != (c.n_layers, B, c.dim):
                raise ValueError(f"xs.shape = {tuple(xs.shape)}; allowed: [{c.n_layers}, {B}, {c.dim}]")
            bt.attn._check_x(xs[0])  # dtype, device
        bt._check_begin(list(slots), starts, lens, None)
        bucket = bucket_of(max(s + m - 1 for s, m in zip(starts, lens)), c.max_seq, self.bucket_min)
        plan = bt._keys_plan(list(slots), starts, lens)  # released index keys (raises, nothing changed)
        for w in self.weights:  # cached: the same dict holding the same tensors
            bt.attn._check_weights(w)
        # nothing below can fail
        if not same:
            self.x_in[:, :B].copy_(xs)
        if T > B:
            self.x_in[:, B:T].zero_()
        bt._allocate(slots, starts, lens)
        cuda = bt.device.type == "cuda"
        offsets = [sum(lens[:b]) for b in range(len(lens))]
        host = torch.tensor(
            self._meta_rows(slots, starts, lens, offsets, T) + self._owner_rows(plan, T, lens), dtype=torch.int32
        )
        if cuda:
            host = host.pin_memory()  # the caching host allocator keeps it until the copy ran
        self._meta[:, :T].copy_(host, non_blocking=cuda)
        st = self._step_for(kind, T)
        st.slots, st.starts, st.lens, st.offsets, st.bucket = list(slots), starts, lens, offsets, bucket
        st.keys_plan = plan  # the owners after the step (`_finish`)
        bt._register(st)
        self._replaying = False
        try:
            self._run(st, kind, T, bucket)
        except BaseException:
            # the runtime free again, the step's slots marked failed (a replay runs every
            # layer at once: which one raised is not known)
            bt._abandon(st, "replay" if self._replaying else st.next_layer)
            raise
        st.next_layer = c.n_layers
        bt._finish(st)
        self.last_host_s = time.perf_counter() - t0
        return self.y[:, :B]

    def _run(self, st: BatchStep, kind: str, T: int, bucket: int) -> None:
        """A registered step's device work: eager, replayed, or warmed up and captured."""
        if not self.use_graphs:
            self._body(st)
        else:
            key = (kind, T, bucket)
            baked = tuple(tuple(t.data_ptr() for t in w.tensors.values()) for w in self.weights)
            cap = self._graphs.get(key)
            if cap is None or cap.baked != baked:
                if cap is not None:
                    self.recaptures += 1
                t1 = time.perf_counter()
                self._warm_up(st)
                self._graphs[key] = cap = self._capture(st, baked)
                self.capture_s[key] = time.perf_counter() - t1
            else:
                self._replaying = True
                cap.graph.replay()

    @on_own_device(lambda self: self.batch.attn)
    @torch.no_grad()
    def capture(
        self, buckets: Sequence[int], sizes: Sequence[int] | None = None, kinds: Sequence[str] = ("decode",)
    ) -> int:
        """Capture the graphs of `kinds` (`KINDS`: decode steps, steps with longer calls) ×
        `sizes` (default all) × context `buckets` before serving, largest size first (the
        shared pool is sized by the largest graph; smaller ones reuse its memory). Each
        warm-up step runs padding tokens only, in the pad slot, so no sequence's state
        changes. A bucket must be one `bucket_of` gives (a power of two ≥ bucket_min, or
        max_seq). Returns the number of graphs captured (keys already captured with the
        current weights are skipped). Without graphs (the CPU) the pad steps run eagerly
        and nothing is captured (0). Runs without autograd, as `step`."""
        c, bt = self.cfg, self.batch
        sizes = self.sizes if sizes is None else tuple(sizes)
        for t in sizes:
            if t not in self.sizes:
                raise ValueError(f"size {t!r}; allowed: one of sizes {self.sizes}")
        for k in kinds:
            if k not in KINDS:
                raise ValueError(f"kind {k!r}; allowed: one of {KINDS}")
        allowed = _buckets(c.max_seq, self.bucket_min)
        for b in buckets:
            if b not in allowed:
                raise ValueError(f"bucket {b!r}; allowed: one of {sorted(allowed)}")
        if bt._step is not None and 0 < bt._step.next_layer < c.n_layers:
            raise ValueError(f"capture during a step (layer {bt._step.next_layer} runs next); allowed: between steps")
        n = 0
        baked = tuple(tuple(t.data_ptr() for t in w.tensors.values()) for w in self.weights)
        todo = [
            (k, T, b)
            for T in sorted(set(sizes), reverse=True)
            for b in sorted(set(buckets), reverse=True)
            for k in kinds
            if (cap := self._graphs.get((k, T, b))) is None or cap.baked != baked
        ]
        # A warm-up runs the persistent step of its kind and size, whose undo buffers a
        # slot's last continuation of that size may still need (`BatchV41.rollback`)
        for slot, u in sorted(bt.undo.items()):
            if "cont" not in u or not u["done"] or u["step"] != bt.last_step[slot]:
                continue
            if u["seq"] != bt.pool.seq_ids[slot]:  # released, assumed or forked into since: the log is gone
                continue
            st0 = u["cont"][0]
            if st0.id == u["step"] and any(k == "cont" and self._steps.get((k, T)) is st0 for k, T, _ in todo):
                raise ValueError(
                    f"capture of 'cont' graphs of size {st0.T}: their warm-up would overwrite the undo buffers of "
                    f"slot {slot}'s last step (a continuation it may still roll back); allowed: after that slot's "
                    f"rollback or next step, or other sizes or kinds"
                )
        for kind, T, b in todo:
            pads = torch.tensor(self._meta_rows([], [], [], [], T) + self._owner_rows(None, T, []), dtype=torch.int32)
            if self.use_graphs:
                pads = pads.pin_memory()
            self._meta[:, :T].copy_(pads, non_blocking=self.use_graphs)
            self.x_in[:, :T].zero_()
            st = self._step_for(kind, T)
            st.slots, st.starts, st.lens, st.offsets, st.bucket = [], [], [], [], b
            st.keys_plan = None
            bt._steps += 1  # a new id: no undo log may take the warm-up's buffers for its own
            st.id = bt._steps
            try:
                if not self.use_graphs:  # the warm-up's state effects only (the pad slot's)
                    self._body(st)
                    continue
                t1 = time.perf_counter()
                self._warm_up(st)
                self._graphs[(kind, T, b)] = self._capture(st, baked)
                self.capture_s[(kind, T, b)] = time.perf_counter() - t1
                n += 1
            finally:  # also when it raised: a pad step changed no sequence, so the runtime is between steps
                st.next_layer = c.n_layers
        return n

    def _meta_rows(self, slots, starts, lens, offsets, T: int) -> list[list[int]]:
        """The step's metadata rows for T tokens (padding past Σ lens: one-token sequences
        at PAD_POS in the pad slot): position, slot, the sequence's first position, its
        end, its first row in the step."""
        rows = [
            [s + t for s, m in zip(starts, lens) for t in range(m)],
            [sl for sl, m in zip(slots, lens) for _ in range(m)],
            *seq_rows(starts, lens, offsets),
        ]
        for t in range(len(rows[0]), T):
            for row, v in zip(rows, (PAD_POS, self.batch.pool.pad_slot, PAD_POS, PAD_POS + 1, t)):
                row.append(v)
        return rows

    def _step_for(self, kind: str, T: int) -> BatchStep:
        """The persistent step of a kind and size T: its tensors are views of buffers the
        graphs bake (a continuation step's undo buffers too)."""
        st = self._steps.get((kind, T))
        if st is None:
            c, dev = self.cfg, self.batch.device
            cont = kind == "cont"
            st = BatchStep(
                slots=[],
                starts=[],
                lens=[],
                offsets=[],
                T=T,
                pos=self._meta[0, :T],
                tok_slot=self._meta[1, :T],
                win_sel=torch.full((T, c.window), -1, dtype=torch.int32, device=dev),
                win_width=torch.full((T,), c.window, dtype=torch.int64, device=dev),
                ring_dst=torch.zeros(T, dtype=torch.int64, device=dev),
                ring_src=torch.arange(T, dtype=torch.int64, device=dev),
                decode_only=not cont,
                owners_dev=self._meta[_OWN_ROW:, :T] if self._released else None,
                cont=cont,
                seq_start=self._meta[2, :T],
                seq_end=self._meta[3, :T],
                seq_off=self._meta[4, :T],
            )
            if cont:
                st.undo_ring, st.undo_state = self.batch._undo_buffers(T)
            self._steps[(kind, T)] = st
        return st

    def _owner_rows(self, plan, T: int, lens) -> list[list[int]]:
        """With released index keys: per index source, the layer whose keys each of the T
        tokens scores (the plan's owner of its sequence, lens[b] tokens each; the layer's
        own keys layer for a sequence with no owner yet and for padding tokens); else no
        rows."""
        if not self._released:
            return []
        bt = self.batch
        rows = []
        for i in bt.index_sources:
            own = bt.wiring[i][1]
            got = [] if plan is None else [own if j is None else j for j, m in zip(plan[0][i], lens) for _ in range(m)]
            rows.append(got + [own] * (T - len(got)))
        return rows

    def _body(self, st: BatchStep) -> None:
        """The whole step's device work from the uploaded metadata (capturable)."""
        bt = self.batch
        st.__dict__.pop("_plans", None)  # the compressor's index plans: derived in the body
        st.next_layer = 0
        (bt._derive_cont if st.cont else bt._derive_decode)(st)
        for i, w in enumerate(self.weights):
            bt._layer(w, self.x_in[i, : st.T], st, out=self.y[i, : st.T])

    def _warm_up(self, st: BatchStep) -> None:
        """The step itself, eagerly on a side stream (compiles, settles the allocator)."""
        _run_on_side_stream(lambda: self._body(st))

    def _capture(self, st: BatchStep, baked: tuple) -> _Captured:
        g = _capture_graph(
            lambda: self._body(st), self._pool, f"the batched decode step ({st.T}, {st.bucket})", self._capture_stream
        )
        self.captures += 1
        return _Captured(g, baked)
