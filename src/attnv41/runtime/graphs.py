"""Whole decode steps of a layer stack, one CUDA graph per context bucket.

Every layer's single-token step runs from device metadata (`DecodePlan`), so a whole
step, all `n_layers` layers, sources included, is one graph: `plan.derive()`, then each
layer's kernels reading its input from `x_in[i]` and writing its output to `y[i]`, then
`pos += 1` on the device. The host only checks the call, keeps its bookkeeping (counts,
the order state, what each source publishes) and replays.

Buckets: index sources score `bucket(p) // ratio` keys (`DecodePlan.bucket`: the next
power of two ≥ max(p + 1, bucket_min), capped at max_seq), so there is one graph per
bucket, captured on first entry: that step runs eagerly (the warm-up: it compiles the
kernels for the bucket's shapes and is the step itself, so nothing has to be undone),
then the graph is captured (capture runs nothing) and replayed from the next step on.
All graphs share one memory pool (they never run concurrently). In `released`
index-key mode a Full layer of ratio ≥ 2 scores another layer's keys on steps that
complete no group (attention-v41.md §9), a choice that follows the position; the
graphs are then keyed by bucket and that choice (two per bucket for V4.1-Flash).
Before each replay the tensors a graph baked (rings, caches, inputs, outputs, plan
buffers, every weight tensor) are compared with the current ones; a change recaptures
(`recaptures` counts those; `captures` counts all).

On the CPU (or `use_graphs=False`) the same step runs eagerly.

`oracle=True` runs every step twice: eagerly through `forward` on saved state, then by
graph replay, and raises `OracleMismatch` unless, for every layer, the output, the ring,
the compressor state, the cache rows written, the index scores, the selection and the
candidate mask agree byte for byte.

`step` is all or nothing: inputs, every layer's weights and state (config, role, bound to
this sequence) and the step's position in the sequence are checked before anything runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .checks import check_released_keys
from .device import on_own_device
from .stack import RuntimeStack

__all__ = ["DecodeGraphs", "OracleMismatch"]


class OracleMismatch(AssertionError):
    """Graph replay and eager forward disagreed on a byte."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    baked: tuple


def _run_on_side_stream(body) -> None:
    """`body()` eagerly on a side stream, ordered after and before the current stream's
    work: a graph's warm-up (it compiles the kernels for the shapes and settles the
    allocator before capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)


def _capture_graph(body, pool, what: str, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """`body()` captured into a new CUDA graph in memory pool `pool` on `stream`, a stream
    of the runtime's device (torch's default capture stream is one per process, made on
    whichever device was current at the first capture, and entering it makes that device
    current); a failure raises a RuntimeError naming `what` (never a silent eager
    fallback)."""
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, pool=pool, stream=stream):
            body()
    except Exception as e:
        raise RuntimeError(f"CUDA graph capture of {what} failed: {e}") from e
    return g


class DecodeGraphs:
    """Drives single-token decode steps of a `RuntimeStack`.

    Inputs go to `x_in[i]` (`[n_layers, 1, dim]` bf16, the graphs read them), outputs come
    out of `y[i]`; `step(xs, p)` copies `xs` in (nothing when `xs` is `x_in`) and returns `y`.

    After each step: `key_owner[i]` is the layer whose index keys index source i scored
    (−1 for other layers); `capture_s[key]` the host seconds each capture took (the
    eager warm-up step included); `last_host_s` the host time of the last `step` call
    (checks, bookkeeping, launch or replay; no device sync).
    """

    def __init__(
        self, stack: RuntimeStack, use_graphs: bool | None = None, oracle: bool = False, oracle_defer: int = 0
    ):
        self.stack = stack
        attn = stack.attn
        self.cfg = cfg = stack.cfg
        cuda = attn.device.type == "cuda"
        self.use_graphs = cuda if use_graphs is None else use_graphs
        if self.use_graphs and not cuda:
            raise ValueError(f"use_graphs = True on {attn.device}; allowed: a CUDA device")
        self.oracle = oracle
        # oracle_defer = N > 0: the comparison stays on the device (no host sync per step, so
        # the replay overlaps the next step's host work) and is read every N steps and by
        # `oracle_flush()`; a mismatch then names the step, not the tensors.
        if isinstance(oracle_defer, bool) or not isinstance(oracle_defer, int) or oracle_defer < 0:
            raise ValueError(f"oracle_defer = {oracle_defer!r}; allowed: an int >= 0")
        self.oracle_defer = oracle_defer
        self._pending: list[tuple[int, torch.Tensor]] = []
        dev = attn.device
        self.x_in = torch.zeros(cfg.n_layers, 1, cfg.dim, dtype=torch.bfloat16, device=dev)
        self.y = torch.zeros(cfg.n_layers, 1, cfg.dim, dtype=torch.bfloat16, device=dev)
        self._graphs: dict[tuple, _Captured] = {}
        self.captures = 0
        self.recaptures = 0
        self.oracle_checks = 0
        self.capture_s: dict[tuple, float] = {}
        self.last_host_s = 0.0
        self.key_owner = [-1] * cfg.n_layers
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self._capture_stream = torch.cuda.Stream(device=dev) if self.use_graphs else None
        self._rows: list = [None] * cfg.n_layers
        self._keys: list = [None] * cfg.n_layers

    # ------------------------------------------------------------------ stepping
    @on_own_device(lambda self: self.stack.attn)
    @torch.no_grad()  # an inference runtime: x and weights may require grad, nothing is recorded
    def step(self, xs: Sequence[torch.Tensor] | torch.Tensor, start_pos: int) -> torch.Tensor:
        """One decode token at `start_pos` through every layer; returns `y` ([n_layers, 1, dim]).

        All or nothing: the inputs, every layer's weights and state, and the step's place
        in the sequence are checked before the first layer runs, so a bad call changes no
        state and a corrected retry works."""
        t0 = time.perf_counter()
        self._check_step(xs, start_pos)
        if xs is not self.x_in:
            if isinstance(xs, torch.Tensor):
                self.x_in.copy_(xs.view_as(self.x_in))
            else:
                for i, x in enumerate(xs):
                    self.x_in[i].copy_(x.view(1, -1))
        st, attn = self.stack, self.stack.attn
        plan = attn.plan
        saved = self._oracle_eager(start_pos) if self.oracle else None
        try:
            self._run(start_pos)
        except BaseException:
            st.shared.failed = (None, start_pos)  # part of the step may be written: a new sequence only
            raise
        plan.pos_at, plan.derived_at = start_pos + 1, start_pos  # the step ends with pos += 1
        for s in st.states:
            s.next_pos = start_pos + 1
        attn._advance(st.shared, self.cfg.n_layers - 1, start_pos, 1)
        attn._ticket = None  # this driver ran the step: a decode_prep before it can no longer run
        st.shared.prepared = None
        if saved is not None:
            self._oracle_compare(start_pos, saved)
        self.last_host_s = time.perf_counter() - t0
        return self.y

    def _run(self, start_pos: int) -> None:
        """A checked step's host bookkeeping and device work: eager, replayed, or warmed up and captured."""
        plan = self.stack.attn.plan
        self._publish(start_pos)
        bucket = plan.bucket(start_pos)
        plan.set_pos(start_pos, derive=False)  # the step derives; after a replay pos is there already
        if not self.use_graphs:
            self._body(bucket)
        else:
            key = (bucket, tuple(self.key_owner))
            baked = self._baked()
            cap = self._graphs.get(key)
            if cap is None or cap.baked != baked:
                if cap is not None:
                    self.recaptures += 1
                t1 = time.perf_counter()
                self._warm_up(bucket)
                self._graphs[key] = cap = self._capture(bucket, baked)
                self.capture_s[key] = time.perf_counter() - t1
            else:
                cap.graph.replay()

    def _check_step(self, xs, start_pos: int) -> None:
        """Everything a step needs, checked before any layer runs."""
        st, attn, cfg = self.stack, self.stack.attn, self.cfg
        attn._check_live("DecodeGraphs.step")
        n, shape = cfg.n_layers, (1, cfg.dim)
        if isinstance(xs, torch.Tensor):  # one tensor: checked once
            if tuple(xs.shape) not in ((n, 1, cfg.dim), (n, cfg.dim)):
                raise ValueError(
                    f"xs.shape = {tuple(xs.shape)}; allowed: [{n}, 1, {cfg.dim}] or [{n}, {cfg.dim}] (one row per layer)"
                )
            attn._check_x(xs.reshape(n, cfg.dim), m_max=n)
            rows = [xs]
        else:
            if len(xs) != n:
                raise ValueError(f"{len(xs)} layer inputs; allowed: exactly n_layers = {n}")
            rows = list(xs)
            dev, bf16 = attn.device, torch.bfloat16
            for i, x in enumerate(rows):
                if not isinstance(x, torch.Tensor) or tuple(x.shape) not in (shape, (cfg.dim,)):
                    got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                    raise ValueError(f"layer {i} input: {got}; allowed: {shape} or ({cfg.dim},) bf16")
                if x.dtype is not bf16 or x.device != dev:
                    attn._check_x(x.reshape(shape), m_max=1)  # raises, naming what is wrong
        attn._check_pos_decode(start_pos)
        attn._check_shared(st.shared)
        attn._check_order(0, st.shared, start_pos, 1, attn._book_for(st.shared, 0, start_pos))
        for i in range(n):
            attn._check_layer(st.weights[i], st.states[i])
            attn._check_bound(st.states[i], st.shared)
        for i in cfg.index_source_layers:  # the plan's writers (candidate sources are index sources)
            attn._check_plan_free(st.weights[i].role, st.shared, start_pos)
        if attn.index_keys == "released":
            check_released_keys(cfg, st.shared.index_k_owner, start_pos, 1)
        for i in cfg.kv_source_layers:
            if st.shared.sources.get(i) is not st.states[i]:
                raise ValueError(
                    f"layer {i} (a kv source): the sequence's published state is not the stack's; "
                    "allowed: decode after prefilling this stack"
                )
        if attn.check_finite:
            for i, x in enumerate(rows):
                attn._check_values(x, i if len(rows) > 1 else "(all)", start_pos)

    def _publish(self, p: int) -> None:
        """The host bookkeeping of every layer's step (checked: it cannot fail)."""
        st, attn = self.stack, self.stack.attn
        sh = st.shared
        for i, w in enumerate(st.weights):
            role = w.role
            self._keys[i] = attn._decode_publish(role, st.states[i], sh, p)
            src = self.cfg.kv_source_of(i)  # static wiring: the rows the layer attends to
            self._rows[i] = None if src is None else st.states[src].compress_kv
            self.key_owner[i] = sh.index_k_owner if role.is_index_source else -1

    def _body(self, bucket: int) -> None:
        """The whole step's device work, from `plan.pos` (capturable)."""
        st, attn = self.stack, self.stack.attn
        attn.plan.derive()
        for i, w in enumerate(st.weights):
            attn._decode_kernels(w, st.states[i], self.x_in[i], self._rows[i], self._keys[i], bucket, out=self.y[i])
        attn.plan.pos.add_(1)

    def _baked(self) -> tuple:
        st, attn = self.stack, self.stack.attn
        return (
            tuple(s.ring.data_ptr() for s in st.states),
            tuple(None if r is None else (r.data_ptr(), tuple(r.shape)) for r in self._rows),
            tuple(None if k is None else (k.data_ptr(), tuple(k.shape)) for k in self._keys),
            tuple(None if s.comp_a is None else (s.comp_a.data_ptr(), s.comp_g.data_ptr()) for s in st.states),
            tuple(
                None if s.compress_kv is None else (s.compress_kv.data_ptr(), s.index_k.data_ptr()) for s in st.states
            ),
            self.x_in.data_ptr(),
            self.y.data_ptr(),
            attn.nonfinite.data_ptr(),
            tuple(t.data_ptr() for t in attn.plan.tensors().values()),
            # every weight tensor's memory: a tensor replaced in the weights' dict recaptures
            tuple(tuple(t.data_ptr() for t in w.tensors.values()) for w in st.weights),
        )

    def _warm_up(self, bucket: int) -> None:
        """The step itself, eagerly on a side stream: compiles the bucket's kernels and
        settles the allocator before capture. It is this step's real run (no replay
        follows it), so there is nothing to undo."""
        _run_on_side_stream(lambda: self._body(bucket))

    def _capture(self, bucket: int, baked: tuple) -> _Captured:
        g = _capture_graph(
            lambda: self._body(bucket), self._pool, f"the decode step (bucket {bucket})", self._capture_stream
        )
        self.captures += 1  # capture ran nothing: the warm-up left pos at p + 1, the metadata of p
        return _Captured(g, baked)

    # ------------------------------------------------------------------ oracle
    def _written(self, p: int) -> dict:
        """Every tensor a step at p may write, by name (views: clone to keep)."""
        st, attn = self.stack, self.stack.attn
        d: dict = {"nonfinite": attn.nonfinite}
        for k, v in attn.plan.tensors().items():
            d[f"plan.{k}"] = v
        for i, s in enumerate(st.states):
            d[f"{i}.ring"] = s.ring
            if s.comp_a is not None:
                d[f"{i}.comp_a"], d[f"{i}.comp_g"] = s.comp_a, s.comp_g
            if s.compress_kv is not None:
                j = p // s.role.ratio
                d[f"{i}.compress_kv.row"] = s.compress_kv[j]
                d[f"{i}.index_k.row"] = s.index_k[j]
        return d

    def _observed(self, p: int) -> tuple[list[str], list[torch.Tensor]]:
        """What a step leaves observable once it ran: every layer's output, ring,
        compressor state and cache rows, and the plan (each index source's scores and
        selection, the candidate mask, the position), by name."""
        d = self._written(p)
        for i in range(self.cfg.n_layers):
            d[f"{i}.out"] = self.y[i]
        return list(d), list(d.values())

    def _oracle_eager(self, p: int):
        """Run the step eagerly through `forward` on the current state, keep what it
        leaves observable (one flat byte copy), and put the state back as it was."""
        st, attn = self.stack, self.stack.attn
        plan, sh = attn.plan, st.shared
        written = list(self._written(p).values())
        before = _unflat(_flat(written), written)
        host = (dict(vars(sh)), dict(sh.sources), [(s.next_pos, s.n_rows) for s in st.states], attn._ticket)
        host_plan = (plan.pos_at, plan.derived_at)
        for i, w in enumerate(st.weights):
            run = attn.forward(w, st.states[i], sh, self.x_in[i], p)
            self.y[i].copy_(run.out)  # y is an output buffer: the replay overwrites it
        plan.pos.add_(1)  # a step ends there
        names, tensors = self._observed(p)
        got = (names, tensors, _flat(tensors))
        torch._foreach_copy_(written, before)
        sh.__dict__.update(host[0])
        sh.sources = host[1]
        for s, (n, r) in zip(st.states, host[2]):
            s.next_pos, s.n_rows = n, r
        attn._ticket = host[3]
        plan.pos_at, plan.derived_at = host_plan
        return got

    def _oracle_compare(self, p: int, eager) -> None:
        """One comparison of all bytes (one host sync); on a mismatch, name the tensors."""
        names, _, flat = eager
        names2, tensors = self._observed(p)
        mine = _flat(tensors)
        if self.oracle_defer and names2 == names:
            self._pending.append((p, torch.ne(mine, flat).any()))
            if len(self._pending) >= self.oracle_defer:
                self.oracle_flush()
            return
        if names2 != names or not torch.equal(mine, flat):
            bad = []
            for name, (o, n) in zip(names, _spans(tensors)):
                a, b = flat[o : o + n], mine[o : o + n]
                if not torch.equal(a, b):
                    bad.append(f"{name} ({int((a != b).sum())} bytes)")
            raise OracleMismatch(f"start_pos {p}: after replay, differs from eager forward: {', '.join(bad)}")
        self.oracle_checks += 1

    def oracle_flush(self) -> None:
        """Read the deferred oracle comparisons (one host sync); raise on the first step
        whose replay differed from eager forward."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        bad = torch.stack([b for _, b in pending]).cpu()
        if bool(bad.any()):
            p = pending[int(bad.nonzero()[0, 0])][0]
            raise OracleMismatch(
                f"start_pos {p}: after replay, differs from eager forward (deferred check: "
                "oracle_defer=0 names the tensors)"
            )
        self.oracle_checks += len(pending)


_ALIGN = 16  # bytes: every tensor's bytes start aligned in the flat copy, so views of any dtype work


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Every tensor's bytes, in order, each padded to `_ALIGN`, in one uint8 tensor (a copy)."""
    pad = torch.zeros(_ALIGN, dtype=torch.uint8, device=tensors[0].device)
    parts = []
    for t in tensors:
        n = t.numel() * t.element_size()
        parts.append(t.reshape(-1).view(torch.uint8))
        if n % _ALIGN:
            parts.append(pad[: _ALIGN - n % _ALIGN])
    return torch.cat(parts)


def _spans(like: list[torch.Tensor]):
    """(offset, bytes) of each tensor in `_flat(like)`."""
    off = 0
    for t in like:
        n = t.numel() * t.element_size()
        yield off, n
        off += -(-n // _ALIGN) * _ALIGN


def _unflat(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of `flat` (from `_flat(like)`) shaped and typed as `like`."""
    return [flat[o : o + n].view(t.dtype).view(t.shape) for t, (o, n) in zip(like, _spans(like))]
