"""Batched decode steps and chunked prefill through `BatchV41` (issue 14): ms per step
against the floor and tokens/s at several batch sizes and contexts.

Floor of a batched decode step: every weight read once plus, per sequence, the bytes
its own decode step moves besides the weights (`stack.decode_step_bytes`: window,
selected rows, index keys, compressor, activations), over the copy bandwidth measured in
the same run. The contexts are set up without running them: each slot gets the blocks
for `context` tokens (`SeqPool.assume`) and the index-key pools random values, so the
top-k works on distinct scores; the steps then run at positions context, context + 1, …
Steps run through `BatchGraphs` (CUDA graphs on a GPU): `host ms` is the step's host time
(checks, upload, replay), `ms/step` the device time between events around the steps.
With `verify_lens` k > 1 a row's steps are verify steps: k tokens per sequence (the
"cont" graph kind), its floor counting k tokens' bytes per sequence besides the weights,
tok/s counting B·k tokens (none rolled back: the context grows by k per step).

Chunked prefill of one prompt: eagerly (`BatchV41.step`, host-planned) and through
`BatchGraphs` (the "cont" graph kind, one graph per context bucket the prompt crosses);
each timed on its second pass, after the kernels compiled and the graphs were captured.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

import torch

from ..packed import pack
from ..reference.qdq import fp4_e8m0_qdq
from ..runtime.batch import BatchV41
from ..runtime.batch_graphs import BatchGraphs
from .common import Ceilings, floor_ms
from .stack import decode_step_bytes

__all__ = ["bench_batch", "batch_room", "BATCH_COLUMNS", "CHUNK_COLUMNS"]

BATCH_COLUMNS = (
    ("context", "context"),
    ("batch", "batch"),
    ("k", "tokens/seq"),
    ("weights", "weights"),
    ("kv_format", "caches"),
    ("ms", "ms/step"),
    ("host_ms", "host ms"),
    ("tok_s", "tok/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
)
CHUNK_COLUMNS = (
    ("prompt", "prompt"),
    ("chunk", "chunk"),
    ("mode", "mode"),
    ("weights", "weights"),
    ("ms", "ms"),
    ("tok_s", "tok/s"),
)


def batch_room(k: int, steps: int) -> int:
    """Positions a row of `bench_batch` (k tokens per sequence, `steps` timed steps) runs
    past its context: the capture step, one replay, the timed steps, and one step more."""
    return k * (steps + 3)


def _batch(stack, n_slots: int, max_seq: int, max_tokens: int, kv_format: str = "bf16") -> BatchV41:
    """A `BatchV41` on the stack's geometry holding `max_seq` positions per sequence and
    `max_tokens` tokens per step. max_seq is raised to max_tokens where it is smaller (the
    config requires max_tokens <= max_seq; max_seq only sizes the RoPE tables and the
    caches): B sequences of k tokens at a short context, e.g. 512 × 1 at context 128."""
    cfg = stack.cfg.replace(max_seq=max(max_seq, max_tokens), max_tokens=max_tokens)
    return BatchV41(cfg, stack.attn.device, n_slots=n_slots, kv_format=kv_format)


def _random_keys(bt: BatchV41, gen: torch.Generator) -> None:
    """Every index-key pool filled with random keys on the fp4_e8m0 grid (packed pools:
    packed), so the top-k works on distinct scores."""
    for k in bt.pool.index_k.values():
        if not bt.pool.packed:
            k.normal_(generator=gen)
            continue
        d = bt.cfg.index_head_dim
        for a in range(0, k.shape[0], 1 << 16):  # in slices: the bf16 temporaries stay small
            b = min(k.shape[0], a + (1 << 16))
            v = torch.randn(b - a, d, generator=gen, device=k.device).to(torch.bfloat16)
            k[a:b] = pack(fp4_e8m0_qdq(v), "fp4_e8m0", check=False)


def bench_batch(
    stack,
    contexts: Sequence[int],
    batches: Sequence[int],
    ceil: Ceilings,
    steps: int = 10,
    chunk: int = 2048,
    seed: int = 0,
    kv_formats: Sequence[str] = ("bf16",),
    verify_lens: Sequence[int] = (1,),
) -> dict[str, list[dict]]:
    """Rows for each (context, batch, k in verify_lens): steps of `batch` sequences at
    `context`, k tokens each (1: decode steps); and per context a chunked prefill of one
    `context`-token prompt in chunks of `chunk`. `stack`: a `RuntimeStack` whose weights
    (and format) are used."""
    dev = stack.attn.device
    cuda = dev.type == "cuda"
    fmt = stack.weights[0].format
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows, chunks = [], []
    for ctx in contexts:
        for B, kvf, k in ((B, f, k) for B in batches for f in kv_formats for k in verify_lens):
            bt = _batch(stack, B, ctx + batch_room(k, steps), max(B * k, 1), kvf)
            for sl in range(B):
                bt.pool.assume(sl, ctx)
            _random_keys(bt, gen)
            g = BatchGraphs(bt, stack.weights, sizes=(B * k,))
            xs = g.x_in[:, : B * k]  # the graphs' input buffer itself: no copy per step
            xs.copy_(torch.randn(xs.shape, generator=gen, device=dev).to(torch.bfloat16))
            slots, lens = list(range(B)), [k] * B
            for _ in range(2):  # the capture (its warm-up is a real step) and one replay
                g.step(xs, slots, lens)
            if cuda:
                torch.cuda.synchronize(dev)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter()
            host_ms = []
            for _ in range(steps):
                g.step(xs, slots, lens)
                host_ms.append(g.last_host_s * 1e3)
            if cuda:
                e1.record()
                torch.cuda.synchronize(dev)
            ms = (e0.elapsed_time(e1) if cuda else (time.perf_counter() - t0) * 1e3) / steps
            nb = decode_step_bytes(stack.cfg, stack.weights, ctx, kvf)
            total = nb["weights"] + B * k * (nb["total"] - nb["weights"])
            fl = floor_ms(total, 0.0, ceil)
            rows.append(
                dict(
                    context=ctx,
                    batch=B,
                    k=k,
                    weights=fmt,
                    kv_format=kvf,
                    ms=ms,
                    host_ms=sorted(host_ms)[len(host_ms) // 2],
                    tok_s=B * k / (ms * 1e-3),
                    floor_ms=fl,
                    x_floor=ms / fl,
                    bytes=total,
                )
            )
            del g, bt, xs
            gc.collect()
        # chunked prefill of one prompt of ctx tokens, eager (`BatchV41.step`) and through
        # `BatchGraphs` (the "cont" kind: one graph per context bucket the prompt crosses)
        # (the whole prefill twice, the second timed: the first pays the kernels'
        # compilation and the captures; on 2026-12-02 a 32K prefill timed first in its
        # process took 6.0 s, 4.1 s in a process that had run the 4K one before)
        c = min(chunk, ctx)
        xs = torch.randn(len(stack.weights), ctx, stack.cfg.dim, generator=gen, device=dev).to(torch.bfloat16)
        for mode in ("eager", "graphs"):
            bt = g = None
            for _pass in range(2):  # the second pass is the one recorded
                if mode == "eager" or bt is None:
                    bt = _batch(stack, 1, ctx, c)
                    g = BatchGraphs(bt, stack.weights, sizes=(c,)) if mode == "graphs" else None
                if cuda:
                    torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                for s in range(0, ctx, c):
                    m = min(c, ctx - s)
                    if g is None:
                        bt.step(stack.weights, list(xs[:, s : s + m]), [0], [s], [m], keep=False)
                    else:
                        g.step(xs[:, s : s + m], [0], [m], [s])
                if cuda:
                    torch.cuda.synchronize(dev)
                ms = (time.perf_counter() - t0) * 1e3
            del bt, g
            gc.collect()
            chunks.append(dict(prompt=ctx, chunk=c, mode=mode, weights=fmt, ms=ms, tok_s=ctx / (ms * 1e-3)))
    return {"decode": rows, "prefill": chunks}
