"""Part "long" (h) of `attnv41 bench`: one prompt of `context` tokens prefilled in chunks
through `BatchGraphs` at batch 1, then decode steps at its end (issue 15: a 1M-token
context on one H200, prefilled in chunks with no buffer that grows as m × L).

Each chunk's layer inputs are drawn on the device into the graphs' own input buffer (no
[n_layers, context, dim] tensor: 420 GB at 1M on V4.1-Flash). Every chunk is timed with
CUDA events; the row gives the whole prefill's wall time, the part of it spent capturing
graphs (one per context bucket the prompt crosses, its first use), the chunk times at
each tenth of the prompt, the peak memory beside the caches' own bytes, and the decode
steps at the end. `budget_s` stops launching chunks once that much wall time has passed
(checked every few chunks): the row then says how far it got (`reached`) and the decode
steps run at that length. Every chunk's outputs are checked finite, and the decode steps'
(all but the timed ones before the last; a NaN raises)."""

from __future__ import annotations

import gc
import time

import torch

from ..runtime.batch_graphs import BatchGraphs
from .batch import _batch

__all__ = ["bench_long", "long_room", "LONG_COLUMNS", "pool_bytes"]

LONG_COLUMNS = (
    ("context", "context"),
    ("reached", "reached"),
    ("chunk", "chunk"),
    ("weights", "weights"),
    ("kv_format", "caches"),
    ("prefill_s", "prefill s"),
    ("tok_s", "tok/s"),
    ("capture_s", "captures s"),
    ("first_ms", "chunk ms at 10%"),
    ("last_ms", "last chunk ms"),
    ("decode_ms", "decode ms/step"),
    ("caches_gib", "caches GiB"),
    ("peak_gib", "peak GiB"),
)
_SYNC_EVERY = 8  # chunks between the budget checks (each one a device sync)


def long_room(steps: int) -> int:
    """Positions `bench_long` (`steps` timed decode steps) runs past its prompt: the decode
    step that captures the graph, one more untimed, the timed ones, and one position more."""
    return steps + 3


def pool_bytes(pool) -> int:
    """Bytes of every tensor a `SeqPool` holds (caches, tables, staging rows)."""
    seen, total = set(), 0

    def add(v):
        nonlocal total
        if isinstance(v, torch.Tensor):
            if v.data_ptr() not in seen:
                seen.add(v.data_ptr())
                total += v.numel() * v.element_size()
        elif isinstance(v, (list, tuple)):
            for x in v:
                add(x)
        elif isinstance(v, dict):
            for x in v.values():
                add(x)

    for v in vars(pool).values():
        add(v)
    return total


def bench_long(
    stack,
    context: int,
    chunk: int,
    kv_format: str = "bf16",
    steps: int = 10,
    seed: int = 0,
    budget_s: float | None = None,
    log=print,
) -> dict:
    """The row for one prompt of `context` tokens in chunks of `chunk` (module doc).
    `stack`: a `RuntimeStack` whose weights (and format) are used."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"context = {context!r}; allowed: an int >= 1")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk = {chunk!r}; allowed: an int >= 1")
    if budget_s is not None and not budget_s > 0:
        raise ValueError(f"budget_s = {budget_s!r}; allowed: None or > 0 seconds")
    dev = stack.attn.device
    cuda = dev.type == "cuda"
    c = min(chunk, context)
    room = long_room(steps)
    max_seq = context + room
    if max_seq > stack.cfg.max_position_embeddings:
        raise ValueError(
            f"context = {context} (+ {room} decode positions); allowed: <= "
            f"{stack.cfg.max_position_embeddings - room} (the geometry's max_position_embeddings)"
        )
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    bt = _batch(stack, 1, max_seq, c, kv_format)
    caches = pool_bytes(bt.pool)
    g = BatchGraphs(bt, stack.weights, sizes=tuple(sorted({1, c})))
    gen = torch.Generator(device=dev).manual_seed(seed)
    n_chunks = -(-context // c)
    events = []
    bad = torch.zeros((), dtype=torch.bool, device=dev)  # any non-finite output so far (no sync per chunk)
    t0 = time.perf_counter()
    pos = 0
    for j in range(n_chunks):
        m = min(c, context - pos)
        xs = g.x_in[:, :m]
        xs.normal_(generator=gen)  # this chunk's layer inputs, in the graphs' own buffer
        ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        if ev:
            ev[0].record()
        t1 = time.perf_counter()
        y = g.step(xs, [0], [m], [pos])
        if ev:
            ev[1].record()
        bad |= ~torch.isfinite(y).all()
        events.append((pos + m, ev, time.perf_counter() - t1))
        pos += m
        if j == n_chunks - 1 or (j + 1) % _SYNC_EVERY == 0:
            if cuda:
                torch.cuda.synchronize(dev)
            if bool(bad):
                raise RuntimeError(f"long prefill: non-finite outputs in a chunk ending at or before position {pos}")
            if (j + 1) % (8 * _SYNC_EVERY) == 0:  # progress: a run cut short still shows the growth
                last = events[-1][1][0].elapsed_time(events[-1][1][1]) if cuda else events[-1][2] * 1e3
                log(f"long prefill: {pos:,} tokens in {time.perf_counter() - t0:.1f} s, last chunk {last:.1f} ms")
            if budget_s is not None and time.perf_counter() - t0 > budget_s and j < n_chunks - 1:
                log(f"long prefill: budget of {budget_s:.0f} s spent at position {pos:,} of {context:,}")
                break
    if cuda:
        torch.cuda.synchronize(dev)
    prefill_s = time.perf_counter() - t0
    ms = [(end, e[0].elapsed_time(e[1]) if e else host * 1e3) for end, e, host in events]
    capture_s = sum(g.capture_s.values())

    def at(frac: float) -> float:
        k = min(len(ms) - 1, max(0, int(round(frac * len(ms))) - 1))
        return ms[k][1]

    # decode steps at the end: the first captures the decode graph, then `steps` timed
    xd = g.x_in[:, :1]
    for _ in range(2):
        xd.normal_(generator=gen)
        bad |= ~torch.isfinite(g.step(xd, [0])).all()
    if cuda:
        torch.cuda.synchronize(dev)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    t1 = time.perf_counter()
    for _ in range(steps):
        y = g.step(xd, [0])
    if cuda:
        e1.record()
        torch.cuda.synchronize(dev)
    dec_ms = (e0.elapsed_time(e1) if cuda else (time.perf_counter() - t1) * 1e3) / max(steps, 1)
    if bool(bad | ~torch.isfinite(y).all()):
        raise RuntimeError(f"long decode: non-finite outputs at position {bt.pool.length[0] - 1}")
    row = dict(
        context=context,
        reached=pos,
        chunk=c,
        weights=stack.weights[0].format,
        kv_format=kv_format,
        prefill_s=prefill_s,
        tok_s=pos / prefill_s,
        capture_s=capture_s,
        first_ms=at(0.1),
        last_ms=ms[-1][1],
        decode_ms=dec_ms,
        decode_at=bt.pool.length[0],
        caches_gib=caches / 2**30,
        chunk_ms=[(end, round(t, 3)) for end, t in ms[:: max(1, len(ms) // 64)]],
    )
    if cuda:
        row["peak_gib"] = (torch.cuda.max_memory_allocated(dev) - base) / 2**30
    del g, bt
    gc.collect()
    return row
