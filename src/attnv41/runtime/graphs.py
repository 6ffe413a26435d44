"""Decode steps of a layer stack through `decode_prep` / `decode_body`, with CUDA graphs.

Source layers (kv or index sources) run eagerly through `forward`; each run of
capturable layers between two sources (and from layer 0) is one segment, captured into
one CUDA graph prepared for every selection class present in it. Before each replay
the driver compares the tensors the graph baked (rings, compressed rows, inputs,
outputs, decode buffers, weights) with the current ones and recaptures when one
changed (a new sequence, another kv source); `captures` and `recaptures` count them.
On the CPU (or with `use_graphs=False`) the same split path runs eagerly.

`oracle=True` runs every segment twice per step: eagerly through `forward` on saved
state, then by graph replay, and raises `OracleMismatch` unless outputs and rings agree
byte for byte.

`step` is all or nothing: inputs, every layer's weights and state (config, role, bound to
this sequence) and the step's position in the sequence are checked before the first layer
runs. The driver keeps the host bookkeeping (each state's `next_pos`, the shared order
state) that a replay cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .stack import RuntimeStack

__all__ = ["DecodeGraphs", "OracleMismatch", "segments_of"]


class OracleMismatch(AssertionError):
    """Graph replay and eager forward disagreed on a byte."""


def segments_of(capturable: Sequence[bool]) -> list[list[int]]:
    """Layers grouped in order: each source layer alone, each run of capturable layers together."""
    segs: list[list[int]] = []
    for i, cap in enumerate(capturable):
        if cap and segs and segs[-1] and capturable[segs[-1][-1]]:
            segs[-1].append(i)
        else:
            segs.append([i])
    return segs


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    baked: tuple


class DecodeGraphs:
    """Drives single-token decode steps of a `RuntimeStack`.

    Inputs go to `x_in[i]` (`[n_layers, 1, dim]` bf16, the graphs read them), outputs come
    out of `y[i]`; `step(xs, p)` copies `xs` in and returns `y`.
    """

    def __init__(self, stack: RuntimeStack, use_graphs: bool | None = None, oracle: bool = False):
        self.stack = stack
        attn = stack.attn
        self.cfg = cfg = stack.cfg
        cuda = attn.device.type == "cuda"
        self.use_graphs = cuda if use_graphs is None else use_graphs
        if self.use_graphs and not cuda:
            raise ValueError(f"use_graphs = True on {attn.device}; allowed: a CUDA device")
        self.oracle = oracle
        self.capturable = [attn.decode_capturable(w) for w in stack.weights]
        self.segments = segments_of(self.capturable)
        dev = attn.device
        self.x_in = torch.zeros(cfg.n_layers, 1, cfg.dim, dtype=torch.bfloat16, device=dev)
        self.y = torch.zeros(cfg.n_layers, 1, cfg.dim, dtype=torch.bfloat16, device=dev)
        self._graphs: dict[int, _Captured] = {}
        self.captures = 0
        self.recaptures = 0
        self.oracle_checks = 0
        self.on_source = None  # optional callback(layer, run) right after each source layer's forward
        # With `profile` (CUDA), step() records a pair of CUDA events around each segment into
        # `events` as (segment, start, end); the caller reads them after a synchronise.
        self.profile = False
        self.events: list = []
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None

    # ------------------------------------------------------------------ stepping
    def step(self, xs: Sequence[torch.Tensor] | torch.Tensor, start_pos: int) -> torch.Tensor:
        """One decode token at `start_pos` through every layer; returns `y` ([n_layers, 1, dim]).

        All or nothing: the inputs, every layer's weights and state, and the step's place
        in the sequence are checked before the first layer runs, so a bad call changes no
        state and a corrected retry works."""
        self._check_step(xs, start_pos)
        if isinstance(xs, torch.Tensor):
            self.x_in.copy_(xs.view_as(self.x_in))
        else:
            for i, x in enumerate(xs):
                self.x_in[i].copy_(x.view(1, -1))
        st = self.stack
        prof = self.profile and st.attn.device.type == "cuda"
        for k, seg in enumerate(self.segments):
            if prof:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            if not self.capturable[seg[0]]:
                i = seg[0]
                run = st.attn.forward(st.weights[i], st.states[i], st.shared, self.x_in[i], start_pos)
                self.y[i].copy_(run.out)
                if self.on_source is not None:
                    self.on_source(i, run)
            else:
                self._segment(k, seg, start_pos)
            if prof:
                ev[1].record()
                self.events.append((seg, *ev))
        return self.y

    def _check_step(self, xs, start_pos: int) -> None:
        """Everything a step needs, checked before any layer runs."""
        st, attn, cfg = self.stack, self.stack.attn, self.cfg
        attn._check_live("DecodeGraphs.step")
        n, shape = cfg.n_layers, (1, cfg.dim)
        if isinstance(xs, torch.Tensor):  # one tensor: checked once
            if xs.numel() != n * cfg.dim:
                raise ValueError(f"xs.shape = {tuple(xs.shape)}; allowed: [{n}, 1, {cfg.dim}] (one row per layer)")
            attn._check_x(xs.reshape(n, cfg.dim), m_max=n)
            rows = [xs]
        else:
            if len(xs) != n:
                raise ValueError(f"{len(xs)} layer inputs; allowed: exactly n_layers = {n}")
            rows = list(xs)
            dev, bf16 = attn.device, torch.bfloat16
            for i, x in enumerate(rows):
                if not isinstance(x, torch.Tensor) or x.numel() != cfg.dim:
                    got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                    raise ValueError(f"layer {i} input: {got}; allowed: {shape} bf16")
                if x.dtype is not bf16 or x.device != dev:
                    attn._check_x(x.reshape(shape), m_max=1)  # raises, naming what is wrong
        attn._check_pos_decode(start_pos)
        attn._check_shared(st.shared)
        attn._check_order(0, st.shared, start_pos, 1, attn._book_for(st.shared, 0, start_pos))
        for i in range(n):
            attn._check_layer(st.weights[i], st.states[i])
            attn._check_bound(st.states[i], st.shared)
        if attn.check_finite:
            for i, x in enumerate(rows):
                attn._check_values(x, i if len(rows) > 1 else "(all)", start_pos)

    def _prep(self, seg: list[int], start_pos: int) -> torch.Tensor | None:
        st, attn = self.stack, self.stack.attn
        attn._check_order(seg[0], st.shared, start_pos, 1, attn._book_for(st.shared, seg[0], start_pos))
        attn._ticket = None  # this driver runs the step: a decode_prep before it can no longer run
        for i in seg:
            attn._check_sources(st.weights[i].role, None, st.shared, start_pos, 1)
        classes = sorted({st.weights[i].role.ratio > 0 for i in seg})
        for cls in classes:
            attn.decode_prep_role(cls, st.shared, start_pos)
        return st.shared.compress_kv if True in classes else None

    def _body(self, seg: list[int], rows_b: torch.Tensor | None) -> None:
        st, attn = self.stack, self.stack.attn
        for i in seg:
            rb = rows_b if st.weights[i].role.ratio > 0 else None
            out = attn._decode_kernels(st.weights[i], st.states[i], self.x_in[i], rb)
            self.y[i].copy_(out)

    def _baked(self, seg: list[int], rows_b: torch.Tensor | None) -> tuple:
        st, attn = self.stack, self.stack.attn
        return (
            tuple(st.states[i].ring.data_ptr() for i in seg),
            None if rows_b is None else (rows_b.data_ptr(), tuple(rows_b.shape)),
            self.x_in.data_ptr(),
            self.y.data_ptr(),
            attn.out.data_ptr(),
            attn.dec_pos.data_ptr(),
            attn.nonfinite.data_ptr(),
            tuple(b.data_ptr() for b in attn.dec_sel.values()),
            # every weight tensor's memory: a tensor replaced in the weights' dict recaptures
            tuple(tuple(t.data_ptr() for t in st.weights[i].tensors.values()) for i in seg),
        )

    def _segment(self, k: int, seg: list[int], start_pos: int) -> None:
        st = self.stack
        rows_b = self._prep(seg, start_pos)
        saved = self._oracle_eager(seg, start_pos) if self.oracle else None
        if not self.use_graphs:
            self._body(seg, rows_b)
        else:
            baked = self._baked(seg, rows_b)
            cap = self._graphs.get(k)
            if cap is None or cap.baked != baked:
                if cap is not None:
                    self.recaptures += 1
                self._graphs[k] = cap = self._capture(seg, rows_b, baked)
            cap.graph.replay()
        for i in seg:
            st.states[i].next_pos = start_pos + 1
        st.attn._advance(st.shared, seg[-1], start_pos, 1)
        if saved is not None:
            self._oracle_compare(seg, start_pos, saved)

    def _capture(self, seg: list[int], rows_b: torch.Tensor | None, baked: tuple) -> _Captured:
        # Warm-up on a side stream compiles the Triton kernels and settles the allocator.
        # It runs this very step (same ring slot, same values as the replay writes), so it
        # leaves nothing the replay would not leave.
        # The non-finite counter is the one thing the warm-up must not leave behind (the
        # replay counts this step's values again): put it back, on the device.
        count = self.stack.attn.nonfinite.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(seg, rows_b)
        torch.cuda.current_stream().wait_stream(side)
        self.stack.attn.nonfinite.copy_(count)
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, pool=self._pool):
                self._body(seg, rows_b)
        except Exception as e:  # surface as an error, never fall back to eager silently
            raise RuntimeError(f"CUDA graph capture of layers {seg} failed: {e}") from e
        self.captures += 1
        return _Captured(g, baked)

    # ------------------------------------------------------------------ oracle
    def _oracle_eager(self, seg: list[int], start_pos: int):
        """Run the segment eagerly through `forward` on the current state, keep the
        results, and put the state back as it was."""
        st = self.stack
        rings = [st.states[i].ring.clone() for i in seg]
        count = st.attn.nonfinite.clone()  # the replay counts this step's values
        sh = st.shared
        book = ((sh.last_layer, sh.step_pos, sh.step_end), [st.states[i].next_pos for i in seg], st.attn._ticket)
        outs = []
        for i in seg:
            run = st.attn.forward(st.weights[i], st.states[i], st.shared, self.x_in[i], start_pos)
            outs.append(run.out.clone())
        after = [st.states[i].ring.clone() for i in seg]
        for i, r in zip(seg, rings):
            st.states[i].ring.copy_(r)
        sh.last_layer, sh.step_pos, sh.step_end = book[0]
        for i, n in zip(seg, book[1]):
            st.states[i].next_pos = n
        st.attn._ticket = book[2]
        st.attn.nonfinite.copy_(count)
        return outs, after

    def _oracle_compare(self, seg: list[int], start_pos: int, saved) -> None:
        outs, rings = saved
        st = self.stack
        for j, i in enumerate(seg):
            if not _same_bytes(outs[j], self.y[i]):
                n = int((_bits(outs[j]) != _bits(self.y[i])).sum())
                raise OracleMismatch(f"start_pos {start_pos} layer {i}: graph output differs from eager in {n} values")
            if not _same_bytes(rings[j], st.states[i].ring):
                raise OracleMismatch(f"start_pos {start_pos} layer {i}: ring after replay differs from eager")
        self.oracle_checks += 1


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte for byte (bf16): NaN equals the same NaN, −0 differs from +0."""
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))
