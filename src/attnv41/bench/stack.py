"""Parts (a) and (e) of `attnv41 bench`: the 40-layer decode step at batch 1 for a set of
context lengths (eager `forward` and CUDA graphs), and prefill through all layers.

A context of P tokens is set up by `fill_context`, not by prefilling P tokens: every
layer's ring, compressed-KV cache, index-key cache and compressor remainder are filled
with random rows on the formats' grids (fp8 ring rows, fp4 cache rows) and the
positions set to P. A decode step then reads exactly what it would read after a real
prompt of P tokens: the same row counts, the same selection width, the same scores
over every visible key; only the values are random. Before timing, two steps at each
context run under the graph oracle (every layer's output, ring, compressor state, cache
rows, scores, selection and candidate mask compared byte for byte with eager `forward`).
Graph mode is the whole step as one CUDA graph per context bucket (no layer outside a
graph); its host time per replayed step (checks, bookkeeping, the replay launch) and the
capture time of each bucket (its eager warm-up step included) are reported.

Both parts run on one stack, whose weight format (`stack_weight_format`: "bf16", or
"fp8" with the FP8 linears' e4m3 bytes and scales) every row names in "weights".

Floors. Decode: the bytes one step must read or write (`decode_step_bytes`: every weight
once as stored, so an FP8 stack's FP8 linears count 1 byte per element plus their scales,
the window ring, the selected compressed rows, every visible index key
of each index source, the activations) over the copy bandwidth measured in the same run.
Prefill: the useful FLOPs (`prefill_flops`: projections, compressor, indexer scores over
causally visible keys, attention over present selection entries) over the measured
matmul rate; an FP8 stack's rows also give the achieved TFLOP/s as a share of the
measured FP8 matmul rate ("% of fp8 mm", where it was measured).
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Sequence

import torch

from ..config import AttnV41Cfg
from ..packed import pack
from ..runtime.graphs import DecodeGraphs
from ..runtime.stack import RuntimeStack
from ..state import CACHE_FORMATS
from ..synthetic import unit_rms_bf16
from .common import Ceilings, Timer, floor_ms

__all__ = [
    "fill_context",
    "decode_step_bytes",
    "prefill_flops",
    "stack_weight_format",
    "bench_decode",
    "bench_decode_one",
    "decode_room",
    "bench_prefill",
    "DECODE_COLS",
    "PREFILL_COLS",
]

_CHUNK = 1 << 16  # rows generated at a time while filling caches


def _randn(gen: torch.Generator, rows: int, cols: int, device) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen, device=device).to(torch.bfloat16)


def fill_context(stack: RuntimeStack, context: int, seed: int = 0) -> None:
    """Put every layer's state where it would be after `context` tokens, with random rows
    on the formats' grids; the next decode step runs at position `context`."""
    cfg, attn = stack.cfg, stack.attn
    if not 1 <= context < cfg.max_seq:
        raise ValueError(f"context = {context}; allowed: 1..{cfg.max_seq - 1} (max_seq - 1)")
    ops, dev = attn.ops, attn.device
    gen = torch.Generator(device=dev).manual_seed(seed)
    W, D = cfg.window, cfg.head_dim
    packed = attn.kv_format == "packed"

    def put(qdq, rows, cache, j, fmt):  # rows on the format's grid, into cache rows j.. (packed: in its bytes)
        v = qdq(rows)
        cache[j : j + rows.shape[0]].copy_(pack(v, fmt, check=False) if packed else v)

    for st in stack.states:
        st.reset()
        put(ops.fp8_qdq, _randn(gen, W, D, dev), st.ring, 0, CACHE_FORMATS["ring"])
        if st.role.is_kv_source:
            r = st.role.ratio
            n = context // r
            for j in range(0, n, _CHUNK):
                c = min(_CHUNK, n - j)
                put(ops.fp4_e4m3_qdq, _randn(gen, c, D, dev), st.compress_kv, j, CACHE_FORMATS["compress_kv"])
                put(ops.fp4_e8m0_qdq, _randn(gen, c, cfg.index_head_dim, dev), st.index_k, j, CACHE_FORMATS["index_k"])
            st.n_rows = n
            rem = context % r if r >= 2 else 0
            if rem:
                st.comp_a[:rem].normal_(generator=gen)
                st.comp_g[:rem].normal_(generator=gen)
    stack.shared.reset()
    stack.shared.continue_at(stack.states, context)


def stack_weight_format(stack: RuntimeStack) -> str:
    """The stack's weight format: "bf16" or "fp8" when every layer has it, else "mixed"."""
    fmts = {lw.format for lw in stack.weights}
    return fmts.pop() if len(fmts) == 1 else "mixed"


def _weight_bytes(w) -> int:
    return sum(t.numel() * t.element_size() for t in w.tensors.values())


def decode_step_bytes(cfg: AttnV41Cfg, weights: Sequence, position: int, kv_format: str = "bf16") -> dict[str, int]:
    """The fewest bytes one decode step at `position` moves, by kind (and `total`);
    kv_format "packed": cached rows in V4.1's byte formats (`attnv41.packed`).

    weights: each layer's tensors once, as stored (`AttnV41LayerWeights` or a dict of
    tensors); window: the ring read plus the new row written; selected: the compressed
    rows the selection names (min(index_topk, visible rows)); index_keys: every visible
    index key, once per index source; compressor: the remainder state read and written,
    the new compressed row and index key when a group completes; activations: each
    layer's input and output row, q, o and the low-rank intermediates.
    """
    D, W = cfg.head_dim, cfg.window
    if kv_format == "packed":
        from ..packed import row_bytes  # noqa: PLC0415

        win_row, comp_row = row_bytes("fp8_e8m0", D), row_bytes("fp4_e4m3", D)
        key_row = row_bytes("fp4_e8m0", cfg.index_head_dim)
    elif kv_format == "bf16":
        win_row, comp_row, key_row = 2 * D, 2 * D, 2 * cfg.index_head_dim
    else:
        raise ValueError(f"kv_format = {kv_format!r}; allowed: 'bf16', 'packed'")
    b = dict(weights=0, window=0, selected=0, index_keys=0, compressor=0, activations=0)
    for i, role in enumerate(cfg.roles):
        w = weights[i]
        b["weights"] += _weight_bytes(w) if hasattr(w, "tensors") else sum(t.nbytes for t in w.values())
        b["window"] += (W + 1) * win_row
        r = role.ratio
        L = (position + 1) // r if r else 0
        if r:
            b["selected"] += min(cfg.index_topk, L) * comp_row
        if role.is_index_source:
            b["index_keys"] += L * key_row
        if role.is_kv_source:
            state = 2 * r * D * 4 if r >= 2 else 0
            completes = (position + 1) % r == 0
            b["compressor"] += state + (comp_row + key_row) * completes
        H = cfg.n_heads
        b["activations"] += 2 * (2 * cfg.dim + 2 * cfg.q_rank + 3 * H * D + cfg.groups * cfg.o_rank)
    b["total"] = sum(b.values())
    return b


def prefill_flops(cfg: AttnV41Cfg, m: int) -> float:
    """Useful FLOPs of a prefill of m tokens from position 0 through every layer."""
    H, D, W, dim = cfg.n_heads, cfg.head_dim, cfg.window, cfg.dim
    IH, ID = cfg.index_heads, cfg.index_head_dim
    t = torch.arange(m, dtype=torch.float64)
    win = (t + 1).clamp(max=W).sum().item()  # window entries present, summed over tokens
    total = 0.0
    for role in cfg.roles:
        proj = dim * cfg.q_rank + cfg.q_rank * H * D + dim * D + cfg.groups * cfg.o_rank * cfg.group_width
        proj += cfg.groups * cfg.o_rank * dim
        f = 2.0 * m * proj
        r = role.ratio
        sel = 0.0
        if r:
            L = torch.div(t + 1, r, rounding_mode="floor")
            sel = L.clamp(max=cfg.index_topk).sum().item()
            if role.is_kv_source:
                n_rows = m // r
                f += 2.0 * m * dim * D * (2 if r >= 2 else 1) + 2.0 * n_rows * D * ID
            if role.is_index_source:
                f += 2.0 * m * (cfg.q_rank * IH * ID + dim * IH) + 2.0 * IH * ID * L.sum().item()
        f += 2.0 * 2.0 * H * D * (win + sel)
        total += f
    return total


DECODE_COLS = [
    ("context", "context"),
    ("weights", "weights"),
    ("kv_format", "kv"),
    ("mode", "mode"),
    ("ms", "ms/step"),
    ("ms_min", "min ms"),
    ("tokens_s", "tok/s"),
    ("gbps", "GB/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("host_ms", "host ms"),
    ("n_sources", "eager layers"),
    ("capture_s", "capture s"),
    ("peer_est_ms", "peer-attn est ms"),
]

PREFILL_COLS = [
    ("tokens", "tokens"),
    ("weights", "weights"),
    ("ms", "ms"),
    ("tokens_s", "tok/s"),
    ("tflops", "TFLOP/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("pct_mm", "% of mm rate"),
    ("pct_fp8_mm", "% of fp8 mm"),
]


def bench_decode(
    stack: RuntimeStack, contexts: Sequence[int], ceil: Ceilings, kv_formats: Sequence[str] | None = None, **kw
) -> list[dict]:
    """`bench_decode_one` (its options `kw`) for each cache format in `kv_formats`
    (default: the stack's own): a format other than the stack's runs on a second stack
    over the same weights objects (its own caches and workspaces), built and freed here.
    Rows name it ("kv_format")."""
    rows = []
    for kvf in kv_formats or (stack.attn.kv_format,):
        st = stack
        if kvf != stack.attn.kv_format:
            st = RuntimeStack(stack.cfg, stack.weights, device=stack.attn.device, kv_format=kvf)
        rows += bench_decode_one(st, contexts, ceil, **kw)
        del st
        gc.collect()
    return rows


ORACLE_STEPS = 2  # decode steps per context under the graph oracle, before timing
DECODE_MODES = ("graphs", "eager")
DECODE_ROUNDS = 5  # round-robin visits of the contexts (`bench_decode_one`)
_WARMUP = 3  # untimed steps per mode and round


def _steps_per_round(reps: int, modes: Sequence[str], rounds: int) -> tuple[int, dict[str, int]]:
    """(rounds, {mode: timed steps per round}) of `bench_decode_one`: `reps` steps per
    context in graph mode, half as many (at least 3) eager, spread over the rounds."""
    rounds = max(1, min(rounds, reps))
    return rounds, {m: max(1, (reps if m == "graphs" else max(3, reps // 2)) // rounds) for m in modes}


def decode_room(
    reps: int, oracle_steps: int = ORACLE_STEPS, modes: Sequence[str] = DECODE_MODES, rounds: int = DECODE_ROUNDS
) -> int:
    """Positions `bench_decode_one` (same options) runs past its context: the stack's
    max_seq must be at least max(contexts) plus this. The first round runs the most (each
    round refills the context): the oracle steps, each mode's warm-up and timed steps, the
    graph mode's steps timed on the host, and one position more."""
    _, per = _steps_per_round(reps, modes, rounds)
    return oracle_steps + _WARMUP * len(modes) + sum(per.values()) + per.get("graphs", 0) + 1


def bench_decode_one(
    stack: RuntimeStack,
    contexts: Sequence[int],
    ceil: Ceilings,
    reps: int = 20,
    oracle_steps: int = ORACLE_STEPS,
    seed: int = 0,
    modes: Sequence[str] = DECODE_MODES,
    rounds: int = DECODE_ROUNDS,
) -> list[dict]:
    """Decode step time at each context, per mode ('graphs': `DecodeGraphs`, CUDA graphs
    on a GPU and the split path on the CPU; 'eager': `forward` layer by layer).

    The host work of the eager source layers makes step times drift over seconds, so the
    contexts are visited round robin, `rounds` times (each visit refills the context and
    times reps/rounds steps per mode, the garbage collector paused): a drift then lands on
    every context alike. Median and minimum are over all timed steps of a context."""
    cfg, dev = stack.cfg, stack.attn.device
    rounds, per = _steps_per_round(reps, modes, rounds)
    need = max(contexts) + decode_room(reps, oracle_steps, modes, rounds)
    if need > cfg.max_seq:
        raise ValueError(f"contexts up to {max(contexts)} need max_seq >= {need}; the stack has {cfg.max_seq}")
    timer = Timer(dev)
    gen = torch.Generator(device=dev).manual_seed(seed + 7)
    n_in = 4  # input sets rotated between steps
    inputs = torch.randn(n_in, cfg.n_layers, 1, cfg.dim, generator=gen, device=dev)
    inputs = unit_rms_bf16(inputs)
    driver = DecodeGraphs(stack)
    pos = [0]

    def graph_step():
        driver.step(inputs[pos[0] % n_in], pos[0])
        pos[0] += 1

    def eager_step():
        x = inputs[pos[0] % n_in]
        stack.step([x[i] for i in range(cfg.n_layers)], pos[0])
        pos[0] += 1

    steps = {"graphs": graph_step, "eager": eager_step}
    samples: dict = {(c, m): [] for c in contexts for m in modes}
    host: dict = {c: [] for c in contexts}
    for rnd in range(rounds):
        for ctx in contexts:
            fill_context(stack, ctx, seed)
            pos[0] = ctx
            if rnd == 0:  # correctness first: graph replay against eager forward, byte for byte
                check = DecodeGraphs(stack, oracle=True)
                for _ in range(oracle_steps):
                    check.step(inputs[pos[0] % n_in], pos[0])
                    pos[0] += 1
                del check
            for mode in modes:
                gc.collect()
                gc.disable()
                try:
                    samples[ctx, mode] += timer.times(steps[mode], warmup=_WARMUP, reps=per[mode])
                    if mode == "graphs":  # host time of steps that replayed (not the capturing one)
                        for _ in range(per[mode]):
                            graph_step()
                            host[ctx].append(driver.last_host_s * 1e3)
                finally:
                    gc.enable()
    rows = []
    fmt = stack_weight_format(stack)
    for ctx in contexts:
        nb = decode_step_bytes(cfg, stack.weights, ctx, stack.attn.kv_format)
        fl = floor_ms(nb["total"], 0.0, ceil)
        bucket = stack.attn.bucket(ctx)
        cap_s = [v for k, v in driver.capture_s.items() if k[0] == bucket]
        for mode in modes:
            ms = statistics.median(samples[ctx, mode])
            extra = {}
            if mode == "graphs":
                extra = {
                    "host_ms": statistics.median(host[ctx]),
                    "n_sources": 0 if driver.use_graphs else cfg.n_layers,  # layers run outside a graph
                    "bucket": bucket,
                    "capture_s": max(cap_s) if cap_s else None,
                }
            rows.append(
                {
                    **extra,
                    "context": ctx,
                    "weights": fmt,
                    "kv_format": stack.attn.kv_format,
                    "mode": mode if (mode != "graphs" or driver.use_graphs) else "split",
                    "ms": ms,
                    "ms_min": min(samples[ctx, mode]),
                    "steps": len(samples[ctx, mode]),
                    "tokens_s": 1e3 / ms,
                    "bytes": nb,
                    "gbps": nb["total"] / (ms * 1e-3) / 1e9,
                    "floor_ms": fl,
                    "x_floor": ms / fl,
                    "graphs": len(driver._graphs),
                    "captures": driver.captures,
                    "recaptures": driver.recaptures,
                    "oracle_steps": oracle_steps,
                }
            )
    return rows


def bench_prefill(stack: RuntimeStack, tokens: Sequence[int], ceil: Ceilings, reps: int = 3, seed: int = 0) -> list:
    """Prefill of each length from position 0 through every layer (all on one stack); an
    FP8 stack's rows add `pct_fp8_mm` (achieved TFLOP/s / `ceil.fp8_mm_tflops`) where that
    rate was measured."""
    cfg, dev = stack.cfg, stack.attn.device
    if max(tokens) > cfg.max_tokens:
        raise ValueError(f"prefill of {max(tokens)} tokens; the stack's max_tokens is {cfg.max_tokens}")
    timer = Timer(dev)
    gen = torch.Generator(device=dev).manual_seed(seed + 11)
    rows = []
    fmt = stack_weight_format(stack)
    for m in tokens:
        xs = torch.randn(cfg.n_layers, m, cfg.dim, generator=gen, device=dev)
        xs = unit_rms_bf16(xs)
        t = timer.time(lambda xs=xs: stack.step(list(xs), 0), warmup=1, reps=reps)
        fl = prefill_flops(cfg, m)
        floor = floor_ms(0.0, fl, ceil)
        tflops = fl / (t.median_ms * 1e-3) / 1e12
        fp8 = fmt == "fp8" and ceil.fp8_mm_tflops is not None
        rows.append(
            {
                "tokens": m,
                "weights": fmt,
                "ms": t.median_ms,
                "ms_min": t.min_ms,
                "tokens_s": m / (t.median_ms * 1e-3),
                "flops": fl,
                "tflops": tflops,
                "floor_ms": floor,
                "x_floor": t.median_ms / floor,
                "pct_mm": 100 * floor / t.median_ms,
                "pct_fp8_mm": 100 * tflops / ceil.fp8_mm_tflops if fp8 else None,
            }
        )
        del xs
    return rows
