"""`attnv41 bench`: runs the parts in one process so every ratio uses the ceilings
measured in the same run, after a correctness gate, and writes `bench.json`,
`bench.md` (the tables as Markdown) and `decode_step.png` into the output folder.

Parts: kernels (b), decode (a), prefill (e), peer (c), index (d), batch (f, g), and, only
when asked for (`--parts long`: minutes on a GPU), long (h): one prompt of
`long_context` tokens (1,048,000 on a GPU) prefilled in chunks, then decode at its end. Gate: the bundled
golden file (tensors from DeepSeek's released code) replayed through the runtime on the
bench device, both variants, must pass before anything is timed; each part checks its
own results as well (kernels against their torch twins, the decode step by the graph
oracle, the top-k as a set, the peer's output against ours).

Weight formats (`weights`: "both", "bf16" or "fp8"): the projection rows of (b) and the
stacks of (a) and (e) run in each selected format, one stack held at a time (freed
before the next format's is built; (e) starts with the stack (a) left); with a
checkpoint, "both" loads it once in each format (per part). A format that cannot run is refused up front when asked for
alone, and skipped with its reason logged and kept in the results (`skipped`) under
"both": FP8 on an op table without `fp8_mm` (CUDA until its kernel lands), FP8 stacks
from a checkpoint whose FP8 linears are stored dequantized. The gate replays the
bundled (bf16) golden file; FP8 is checked by (b) against the exact twin and by the
graph oracle in (a).
"""

from __future__ import annotations

import gc
import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..synthetic import PRESETS, random_weights
from ..tp import check_tp, tp_config, tp_sizes
from ..weights import WEIGHT_FORMATS
from .common import environment, format_table, markdown_table, measure_ceilings

__all__ = ["BenchOptions", "run_bench", "PARTS", "DEFAULT_PARTS", "WEIGHT_CHOICES", "write_outputs"]

PARTS = ("kernels", "decode", "prefill", "peer", "index", "batch", "long")
DEFAULT_PARTS = PARTS[:-1]  # "long" only when asked for: a whole 1M-token prefill takes minutes
WEIGHT_CHOICES = ("both", *WEIGHT_FORMATS)

# Repetitions (decode, prefill, peer, index) and timed steps (batch, long) of each part,
# (full run, --quick): one table for the parts' calls in `run_bench` and for the bounds
# `_resolve` derives from them (the positions a decode, batch or long row runs past its
# context depend on them).
PART_REPS = dict(decode=(50, 3), prefill=(3, 2), peer=(50, 5), index=(30, 3), batch=(10, 3), long=(20, 3))
STACK_PARTS = ("decode", "prefill", "batch", "long")  # the parts that run on a stack built by `_stack`

GPU_DEFAULTS = dict(
    contexts=(4096, 32768, 131072),
    prefill=(2048, 8192),
    index_lengths=(4096, 16384, 65536, 262144, 1048576),
    batches=(1, 64),
    batch_sizes=(1, 8, 64, 256),
    batch_contexts=(4096, 32768),
)
CPU_DEFAULTS = dict(
    contexts=(128, 512),
    prefill=(64, 128),
    index_lengths=(4096, 16384),
    batches=(1, 4),
    batch_sizes=(1, 4),
    batch_contexts=(128,),
)


@dataclass
class BenchOptions:
    parts: Sequence[str] = DEFAULT_PARTS
    contexts: Sequence[int] | None = None
    prefill: Sequence[int] | None = None
    index_lengths: Sequence[int] | None = None
    batches: Sequence[int] | None = None
    batch_sizes: Sequence[int] | None = None  # part "batch": sequences per step
    batch_contexts: Sequence[int] | None = None  # part "batch": contexts of its decode rows
    batch_kv_formats: Sequence[str] = ("bf16", "packed")  # part "batch": cache formats of its decode rows
    verify_lens: Sequence[int] = (1,)  # part "batch": tokens per sequence per step (1: decode; k > 1: verify)
    kv_formats: Sequence[str] = ("bf16", "packed")  # part "decode": cache formats of its rows
    long_context: int | None = None  # part "long": the prompt's tokens (default 1,048,000 on a GPU, 96 on the CPU)
    long_kv_formats: Sequence[str] = ("bf16",)  # part "long": one prompt per cache format
    long_budget_s: float | None = None  # part "long": stop launching chunks after this many seconds (per format)
    preset: str = "auto"
    device: str = "auto"
    checkpoint: str | None = None
    seed: int = 0
    quick: bool = False
    progress: bool = True
    weights: str = "both"  # WEIGHT_CHOICES: the projections' and stacks' formats
    tp: int = 1  # tensor-parallel ranks: every part runs rank 0's share (`attnv41.tp.tp_config`)


def _resolve(opts: BenchOptions) -> tuple[torch.device, BenchOptions]:
    for p in opts.parts:
        if p not in PARTS:
            raise ValueError(f"part {p!r}; allowed: {', '.join(PARTS)}")
    if opts.weights not in WEIGHT_CHOICES:
        raise ValueError(f"weights = {opts.weights!r}; allowed: {', '.join(repr(w) for w in WEIGHT_CHOICES)}")
    if opts.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device = {opts.device!r}; allowed: 'auto', 'cpu', 'cuda'")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device = 'cuda', but torch.cuda.is_available() is False; allowed: 'cpu' or 'auto'")
    cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    dev = torch.device("cuda" if cuda else "cpu")
    d = GPU_DEFAULTS if cuda else CPU_DEFAULTS
    vals = {k: tuple(getattr(opts, k) or d[k]) for k in d}
    for k, v in vals.items():
        if not v or any(int(x) < 1 for x in v):
            raise ValueError(f"{k} = {v}; allowed: positive integers")
    if not opts.verify_lens or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in opts.verify_lens):
        raise ValueError(f"verify_lens = {tuple(opts.verify_lens)}; allowed: positive integers (1: decode steps)")
    long_ctx = opts.long_context if opts.long_context is not None else (1048000 if cuda else 96)
    if isinstance(long_ctx, bool) or not isinstance(long_ctx, int) or long_ctx < 1:
        raise ValueError(f"long_context = {long_ctx!r}; allowed: a positive integer")
    if opts.long_budget_s is not None and not opts.long_budget_s > 0:
        raise ValueError(f"long_budget_s = {opts.long_budget_s!r}; allowed: None or > 0 seconds")
    if not opts.long_kv_formats or any(f not in ("bf16", "packed") for f in opts.long_kv_formats):
        raise ValueError(f"long_kv_formats = {tuple(opts.long_kv_formats)}; allowed: a subset of bf16, packed")
    preset = opts.preset if opts.preset != "auto" else ("flash" if cuda else "small")
    if opts.checkpoint is None and preset not in PRESETS:
        raise ValueError(f"preset = {opts.preset!r}; allowed: 'auto', {', '.join(repr(k) for k in PRESETS)}")
    o = BenchOptions(**{**asdict(opts), **vals, "preset": preset, "device": dev.type, "long_context": long_ctx})
    if o.tp != 1:  # the sizes the geometry shards into (FP8's whole 32-blocks: `_weight_plan`)
        check_tp(_geometry(o, full=True), o.tp)
    _check_positions(o)
    return dev, o


def _reps(opts: BenchOptions, part: str) -> int:
    """The repetitions or timed steps `part` runs with (`PART_REPS`)."""
    full, quick = PART_REPS[part]
    return quick if opts.quick else full


def _check_positions(o: BenchOptions) -> None:
    """The upper bounds the geometry's max_position_embeddings puts on the selected parts'
    values (resolved options `o`): ValueError naming the option, its value and the largest
    allowed, before the gate runs. Every stack holds max(prefill) tokens per call; a
    decode, batch or long row runs some positions past its context, each part's count
    derived from the same reps and steps it runs with."""
    from .batch import batch_room
    from .long import long_room
    from .stack import decode_room

    stacks = [p for p in STACK_PARTS if p in o.parts]
    if not stacks:
        return
    mpe = _geometry(o).max_position_embeddings
    if max(o.prefill) > mpe:
        raise ValueError(
            f"prefill = {tuple(o.prefill)}; allowed: <= {mpe} (max_position_embeddings; the stack that part"
            f"{'s' if len(stacks) > 1 else ''} {', '.join(stacks)} run{'' if len(stacks) > 1 else 's'} on takes "
            "max(prefill) tokens per call)"
        )
    if "decode" in o.parts:
        room = decode_room(_reps(o, "decode"))
        if max(o.contexts) > mpe - room:
            raise ValueError(
                f"contexts = {tuple(o.contexts)}; allowed: <= {mpe - room} (max_position_embeddings {mpe} "
                f"less the {room} positions the decode part runs past its context)"
            )
    if "batch" in o.parts:
        steps, k = _reps(o, "batch"), max(o.verify_lens)
        # A row runs batch_room(k, steps) positions past its context (k per step), after a
        # context of at least one token; one step holds batch × k tokens.
        room, per_token = batch_room(k, steps), batch_room(1, steps)
        if room > mpe - 1:
            raise ValueError(
                f"verify_lens = {tuple(o.verify_lens)}; allowed: <= {(mpe - 1) // per_token} (max_position_embeddings "
                f"{mpe}: the batch part runs {per_token} steps of k tokens past a context of at least one token)"
            )
        if max(o.batch_contexts) > mpe - room:
            raise ValueError(
                f"batch_contexts = {tuple(o.batch_contexts)}; allowed: <= {mpe - room} (max_position_embeddings "
                f"{mpe} less the {room} positions the batch part runs past its context, {k} per step)"
            )
        if max(o.batch_sizes) * k > mpe:
            raise ValueError(
                f"batch_sizes = {tuple(o.batch_sizes)}; allowed: <= {mpe // k} (max_position_embeddings {mpe} "
                f"over max(verify_lens) {k}: one step of the batch part takes batch × k tokens)"
            )
    if "long" in o.parts:
        room = long_room(_reps(o, "long"))
        if o.long_context > mpe - room:
            raise ValueError(
                f"long_context = {o.long_context}; allowed: <= {mpe - room} (max_position_embeddings {mpe} "
                f"less the {room} positions the long part decodes past its prompt)"
            )


def _weight_plan(opts: BenchOptions, dev: torch.device) -> tuple[tuple[str, ...], tuple[str, ...], dict[str, str]]:
    """(formats of the kernel rows, formats of the stacks, {what was skipped: why}). A
    format asked for alone that cannot run raises ValueError here, before anything runs."""
    from ..runtime.ops import ops_for

    asked = WEIGHT_FORMATS if opts.weights == "both" else (opts.weights,)
    no_op, no_ckpt = None, None
    ops = ops_for(dev)
    if ops.fp8_mm is None:
        no_op = f"the {ops.name!r} op table on {dev} has no FP8 GEMM (fp8_mm) yet"
    if opts.checkpoint is not None and "fp8" in asked:
        from ..checkpoint import checkpoint_weight_format

        if checkpoint_weight_format(opts.checkpoint) != "fp8":
            no_ckpt = f"checkpoint {opts.checkpoint} does not hold its FP8 linears as e4m3 with scales"
    if "fp8" in asked and opts.tp != 1 and opts.tp not in tp_sizes(_geometry(opts, full=True), fp8=True):
        try:  # the message names the sizes FP8 weights shard into
            check_tp(_geometry(opts, full=True), opts.tp, fp8=True)
        except ValueError as e:
            no_op = no_op or f"FP8 weights do not shard into it: {e}"
    if opts.weights == "fp8" and (no_op or no_ckpt):
        raise ValueError(f"weights = 'fp8', but {no_op or no_ckpt}; allowed: 'bf16' (or 'both', which skips FP8)")
    skipped = {}
    kernel_fmts = tuple(f for f in asked if f != "fp8" or not no_op)
    stack_fmts = tuple(f for f in asked if f != "fp8" or not (no_op or no_ckpt))
    if kernel_fmts != asked:
        skipped["kernels fp8"] = no_op
    if stack_fmts != asked:
        skipped["decode/prefill fp8"] = no_op or no_ckpt
    return kernel_fmts, stack_fmts, skipped


def _gate(dev: torch.device, log) -> dict:
    from ..golden import IMPLS, VARIANTS, GoldenFile, bundled_golden_path, replay

    g = GoldenFile(bundled_golden_path())
    res = {}
    for v in VARIANTS:
        rep = replay(g, v, IMPLS["runtime"], device=str(dev), impl_name="runtime")
        res[v] = {"compared": rep.n_compared, "failed": rep.n_failed}
        if rep.n_failed:
            raise RuntimeError(
                f"correctness gate: the runtime fails the bundled golden file ({g.name}/{v}) on {dev}: "
                f"{rep.n_failed} of {rep.n_compared} tensors; nothing was timed"
            )
    log(
        f"gate: bundled golden {g.name} ({g.weights_dtype} weights) through the runtime on {dev}: "
        + ", ".join(f"{v} {r['compared']} tensors, {r['failed']} failed" for v, r in res.items())
    )
    return {"golden": g.name, "weights": g.weights_dtype, **res}


def _stack(opts: BenchOptions, dev: torch.device, log, fmt: str):
    from ..runtime.stack import RuntimeStack
    from .stack import decode_room

    max_tokens = max(opts.prefill)
    # room for the steps a decode row runs past its context (256 positions, or `decode_room`
    # where that is more), up to the geometry's last position (a 1M context: --contexts
    # 1048000 on V4.1-Flash, max_position_embeddings 2^20; `_resolve` refused any more)
    # (and at least max_tokens: the config requires max_tokens <= max_seq, e.g. --contexts 4096
    # beside the default 8,192-token prefill rows)
    room = max(256, decode_room(_reps(opts, "decode")))
    max_seq = min(max(max(opts.contexts) + room, max_tokens), _geometry(opts).max_position_embeddings)
    if opts.checkpoint is not None:
        from ..checkpoint import load_model
        from ..config import AttnV41Cfg

        full = AttnV41Cfg.from_checkpoint(opts.checkpoint, max_tokens=max_tokens, max_seq=max_seq)
        weights = load_model(
            opts.checkpoint,
            full,
            device=dev,
            progress=opts.progress,
            weights=fmt,
            tp_rank=0,
            tp_size=opts.tp,
        )
        cfg = tp_config(full, opts.tp)
        what = f"checkpoint {opts.checkpoint}"
    else:
        cfg = tp_config(PRESETS[opts.preset](max_tokens=max_tokens, max_seq=max_seq), opts.tp)
        weights = random_weights(cfg, opts.seed, dev, weights=fmt)  # a share's shapes: what rank 0 holds
        what = f"preset {opts.preset}, random weights (seed {opts.seed})"
    if opts.tp > 1:
        what += f", rank 0 of tp {opts.tp}"
    log(
        f"stack: {what}, {fmt} weights; dim {cfg.dim}, {cfg.n_heads}x{cfg.head_dim} heads, {cfg.n_layers} layers, "
        f"max_tokens {max_tokens}, max_seq {max_seq}"
    )
    # FP8 stacks hold wo_a as the checkpoint's bytes (the default of `load_model` and
    # `RuntimeStack`; weights.py): the FP8 rows of (a) and, when run in FP8, of (f)
    return RuntimeStack(cfg, weights, device=dev), what


def _geometry(opts: BenchOptions, full: bool = False):
    """The geometry every part runs: the preset's or the checkpoint's, rank 0's share of it
    with `opts.tp` > 1 (`full`: the whole model's)."""
    if opts.checkpoint is not None:
        from ..config import AttnV41Cfg

        cfg = AttnV41Cfg.from_checkpoint(opts.checkpoint)
    else:
        cfg = PRESETS[opts.preset]()
    return cfg if full else tp_config(cfg, opts.tp)


def _kv_bytes(cfg) -> dict:
    """The whole model's cache bytes per token (`packed.kv_bytes_per_token`) in V4.1's
    formats and in bf16, the runtimes' default cache format (`runtime`; the rows name the
    format each ran with), and the Hopper peers'
    figure: compressed rows in the V4 584 B record plus 68-132 B index keys
    (research/peers-2026-12.md §0.5), for the same kv sources."""
    from ..packed import kv_bytes_per_token

    p, b = kv_bytes_per_token(cfg, "packed"), kv_bytes_per_token(cfg, "bf16")
    share = sum(1 / cfg.roles[i].ratio for i in cfg.kv_source_layers)
    lo, hi = share * (584 + 68), share * (584 + 132)
    return dict(
        packed=p["per_token"],
        bf16=b["per_token"],
        runtime="bf16",
        peers_v4_record=f"{lo:,.0f}-{hi:,.0f}",
        window_per_sequence=dict(packed=p["window_per_sequence"], bf16=b["window_per_sequence"]),
    )


def run_bench(
    opts: BenchOptions, log: Callable[[str], None] = print, on_part: Callable[[dict], None] | None = None
) -> dict:
    """Run the selected parts; returns the results (what `bench.json` holds). `on_part(res)`
    is called after each part (the command saves partial results with it)."""
    dev, opts = _resolve(opts)
    kernel_fmts, stack_fmts, skipped = _weight_plan(opts, dev)
    t0 = time.perf_counter()
    res: dict = {"environment": environment(dev), "options": asdict(opts)}
    if dev.type == "cpu":
        log(
            "attnv41 bench on the CPU: a smoke run of every part at a small geometry; the times say nothing about a GPU"
        )
    res["weights"] = {"kernels": list(kernel_fmts), "stacks": list(stack_fmts)}
    log(f"weights: kernel projections in {', '.join(kernel_fmts)}; decode/prefill stacks in {', '.join(stack_fmts)}")
    if skipped:
        res["skipped"] = skipped
        for what, why in skipped.items():
            log(f"skipped: {what}: {why}")
    res["gate"] = _gate(dev, log)
    ceil = measure_ceilings(dev, quick=opts.quick or dev.type == "cpu")
    res["ceilings"] = ceil.to_dict()
    fp8_rate = (
        f"fp8 matmul {ceil.fp8_mm_tflops:,.1f} TFLOP/s (e4m3 {ceil.mm_shape[0]}^3, torch._scaled_mm)"
        if ceil.fp8_mm_tflops is not None
        else f"fp8 matmul: {ceil.fp8_mm_note}"
    )
    log(
        f"ceilings: copy {ceil.copy_gbps:,.0f} GB/s (read + write), matmul {ceil.mm_tflops:,.1f} TFLOP/s "
        f"({'bf16' if dev.type == 'cuda' else 'fp32'} {ceil.mm_shape[0]}^3), {fp8_rate}"
    )
    geo = _geometry(opts)
    if opts.tp > 1:
        log(
            f"tensor parallelism: every part runs rank 0 of {opts.tp} ({geo.n_heads} heads, {geo.groups} output "
            f"groups; the caches, compressor and indexer replicated, as on every rank)"
        )
    res["kv_bytes_per_token"] = _kv_bytes(geo)
    kb = res["kv_bytes_per_token"]
    log(
        f"KV bytes per token, whole model: {kb['packed']:,.0f} in V4.1's formats, {kb['bf16']:,.0f} in bf16 "
        f"(the runtimes' default caches: {kb['runtime']}; each table row names its own); peers on Hopper (V4 584 B record): {kb['peers_v4_record']}"
    )
    held: dict = {}
    nonfinite: dict[int, int] = {}  # per stack built: its non-finite count (cumulative over its parts)

    def stack(fmt: str):
        """The stack in format `fmt`; the one held before is freed first (one at a time)."""
        if held.get("fmt") != fmt:
            drop()
            held["stack"], res["stack"] = _stack(opts, dev, log, fmt)
            held["fmt"], held["id"] = fmt, len(nonfinite)
        return held["stack"]

    def count() -> None:
        nonfinite[held["id"]] = held["stack"].attn.nonfinite_count()
        res["nonfinite_values"] = sum(nonfinite.values())

    def drop() -> None:
        held.clear()
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    def kernels():
        from .kernels import bench_kernels

        ctx = sorted(opts.contexts)[len(opts.contexts) // 2]
        return bench_kernels(
            geo,
            dev,
            ceil,
            context=ctx,
            prefill_tokens=max(opts.prefill),
            quick=opts.quick,
            seed=opts.seed,
            weights=kernel_fmts,
        )

    def decode():
        from .stack import bench_decode

        rows = []
        for fmt in stack_fmts:
            rows += bench_decode(
                stack(fmt),
                opts.contexts,
                ceil,
                reps=_reps(opts, "decode"),
                seed=opts.seed,
                kv_formats=opts.kv_formats,
            )
            count()
        return rows

    def prefill():
        from .stack import bench_prefill

        rows = []
        for fmt in sorted(stack_fmts, key=lambda f: f != held.get("fmt")):  # the held stack first: one build less
            rows += bench_prefill(stack(fmt), opts.prefill, ceil, reps=_reps(opts, "prefill"), seed=opts.seed)
            count()
        drop()  # the stack's weights and caches go before the peer's data arrive
        return sorted(rows, key=lambda r: stack_fmts.index(r["weights"]))

    def peer():
        from .peer import bench_attention_peer

        rows, res["peer_status"] = bench_attention_peer(
            geo, dev, ceil, opts.contexts, opts.batches, reps=_reps(opts, "peer"), seed=opts.seed
        )
        log(f"peer: {res['peer_status']}")
        return rows

    def index():
        from .index import bench_index_topk

        return bench_index_topk(geo, dev, ceil, opts.index_lengths, reps=_reps(opts, "index"), seed=opts.seed)

    def batch():
        from .batch import bench_batch

        rows, chunks = [], []
        for fmt in sorted(stack_fmts, key=lambda f: f != held.get("fmt")):  # the held stack first: one build less
            b = bench_batch(
                stack(fmt),
                opts.batch_contexts,
                opts.batch_sizes,
                ceil,
                steps=_reps(opts, "batch"),
                chunk=2048 if dev.type == "cuda" else 32,
                seed=opts.seed,
                kv_formats=opts.batch_kv_formats,
                verify_lens=opts.verify_lens,
            )
            rows, chunks = rows + b["decode"], chunks + b["prefill"]
            count()
        order = lambda r: stack_fmts.index(r["weights"])  # noqa: E731
        res["batch_prefill"] = sorted(chunks, key=order)
        return sorted(rows, key=order)

    def long_prompt():
        from .long import bench_long

        fmt = "bf16" if "bf16" in stack_fmts else stack_fmts[0]
        rows = []
        for kvf in opts.long_kv_formats:
            r = bench_long(
                stack(fmt),
                opts.long_context,
                2048 if dev.type == "cuda" else 32,
                kv_format=kvf,
                steps=_reps(opts, "long"),
                seed=opts.seed,
                budget_s=opts.long_budget_s,
                log=log,
            )
            log(
                f"long: {r['reached']:,} of {r['context']:,} tokens ({kvf} caches) in {r['prefill_s']:.1f} s "
                f"({r['tok_s']:,.0f} tok/s, {r['capture_s']:.1f} s of captures), decode {r['decode_ms']:.2f} ms/step"
            )
            rows.append(r)
            count()
        return rows

    # One part failing does not stop the others; its error is kept and the command fails.
    parts = (("kernels", kernels), ("decode", decode), ("prefill", prefill), ("peer", peer), ("index", index))
    for name, fn in (*parts, ("batch", batch), ("long", long_prompt)):
        if name not in opts.parts:
            continue
        t = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:
            res.setdefault("errors", {})[name] = traceback.format_exc()
            log(f"{name}: FAILED: {type(e).__name__}: {e}")
            continue
        log(f"{name}: {len(res[name])} rows, {time.perf_counter() - t:.1f} s")
        if on_part is not None:
            on_part(res)
    drop()
    _peer_estimate(res, geo)
    if dev.type == "cuda":
        res["memory_peak_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    res["wall_s"] = time.perf_counter() - t0
    return res


def _peer_estimate(res: dict, cfg) -> None:
    """Decode step with our sparse attention swapped for the peer's, batch 1: the step time
    minus (ours − peer) per layer for the ratio>0 layers (the 640-entry launches)."""
    peer = [r for r in res.get("peer", []) if r["batch"] == 1]
    n = sum(1 for role in cfg.roles if role.ratio > 0)
    for row in res.get("decode", []):
        ours = [r for r in peer if r["context"] == row["context"] and r["name"].startswith("attnv41")]
        theirs = [r for r in peer if r["context"] == row["context"] and r["name"].startswith("FlashMLA")]
        if ours and theirs and row["mode"] != "eager":
            row["peer_est_ms"] = row["ms"] - n * (ours[0]["ms"] - theirs[0]["ms"])


def _tables(res: dict, md: bool) -> list[tuple[str, str]]:
    from .batch import BATCH_COLUMNS, CHUNK_COLUMNS
    from .index import INDEX_COLS
    from .kernels import KERNEL_COLS
    from .long import LONG_COLUMNS
    from .peer import PEER_COLS
    from .stack import DECODE_COLS, PREFILL_COLS

    fmt = markdown_table if md else format_table
    out = []
    tp = res.get("options", {}).get("tp", 1)
    share = f"; rank 0 of tensor parallelism {tp}" if tp > 1 else ""
    for key, title, cols in (
        ("decode", "(a) decode step, 40 layers, batch 1", DECODE_COLS),
        ("kernels", "(b) each kernel alone", KERNEL_COLS),
        ("peer", "(c) sparse attention vs FlashMLA legacy sparse decode", PEER_COLS),
        ("index", "(d) index scores + top-k, one query", INDEX_COLS),
        ("prefill", "(e) prefill through 40 layers", PREFILL_COLS),
        ("batch", "(f) batched decode and verify steps (BatchGraphs)", BATCH_COLUMNS),
        (
            "batch_prefill",
            "(g) chunked prefill of one prompt, eager (BatchV41) and graphs (BatchGraphs)",
            CHUNK_COLUMNS,
        ),
        ("long", "(h) one long prompt in chunks (BatchGraphs, batch 1), then decode at its end", LONG_COLUMNS),
    ):
        if res.get(key):
            fmts = list(dict.fromkeys(r["weights"] for r in res[key] if r.get("weights")))
            if fmts:
                title += f", {' and '.join(fmts)} weights" + (" (projections)" if key == "kernels" else "")
            out.append((title + share, fmt(res[key], cols)))
    return out


def write_outputs(res: dict, out_dir: str | Path, log: Callable[[str], None] = print) -> list[Path]:
    """bench.json, bench.md and (with decode rows) decode_step.png; prints the tables."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.json", out / "bench.md"]
    paths[0].write_text(json.dumps(res, indent=1, default=str))
    env, ceil = res["environment"], res["ceilings"]
    head = (
        f"{env['date']}, {env.get('gpu') or env.get('cpu')}, torch {env['torch']}, triton {env['triton']}"
        + (f", CUDA {env['cuda']}" if env.get("cuda") else "")
        + f"; copy {ceil['copy_gbps']:,.0f} GB/s, matmul {ceil['mm_tflops']:,.1f} TFLOP/s"
        + (f", fp8 matmul {ceil['fp8_mm_tflops']:,.1f} TFLOP/s" if ceil.get("fp8_mm_tflops") is not None else "")
        + " (measured in this run)"
    )
    md = [head, ""]
    for title, table in _tables(res, md=True):
        md += [f"### {title}", "", table, ""]
    for what, why in res.get("skipped", {}).items():
        md.append(f"Skipped: {what}: {why}")
    if "nonfinite_values" in res:
        md.append(f"Non-finite values that entered a cache write (decode/prefill stacks): {res['nonfinite_values']}")
    if "kv_bytes_per_token" in res:
        kb = res["kv_bytes_per_token"]
        md.append(
            f"KV bytes per token, whole model: {kb['packed']:,.0f} in V4.1's formats, {kb['bf16']:,.0f} in bf16 "
            f"(the runtimes' default caches: {kb['runtime']}; each table row names its own); Hopper peers (V4 584 B record): {kb['peers_v4_record']}"
        )
    if "peer_status" in res:
        md.append(f"Peer: {res['peer_status']}")
    paths[1].write_text("\n".join(md) + "\n")
    if res.get("decode"):
        try:
            import matplotlib  # noqa: F401 (an optional dependency: pip install attnv41[bench])
        except ImportError:
            (out / "decode_step.png").unlink(missing_ok=True)  # an earlier run's plot would not be this run's
            log("plot: not drawn, matplotlib is not installed (pip install 'attnv41[bench]')")
        else:
            paths.append(plot_decode(res, out / "decode_step.png"))
    log(head)
    for title, table in _tables(res, md=False):
        log(f"\n{title}\n{table}")
    for what, why in res.get("skipped", {}).items():
        log(f"\nskipped: {what}: {why}")
    if "nonfinite_values" in res:
        log(f"\nnon-finite values that entered a cache write: {res['nonfinite_values']}")
    if "peer_status" in res:
        log(f"\npeer: {res['peer_status']}")
    return paths


def plot_decode(res: dict, path: Path) -> Path:
    """Decode step time against context: ours (graphs, eager), the floor, and the step
    with the peer's attention kernel in place of ours (when measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["decode"]
    fig, ax = plt.subplots(figsize=(7, 4.5))

    def key(r):
        return r.get("weights", "bf16"), r.get("kv_format", "bf16")

    fmts = list(dict.fromkeys(key(r) for r in rows))
    for fmt in fmts:
        of = [r for r in rows if key(r) == fmt]
        name = f"{fmt[0]} weights, {fmt[1]} kv"
        for mode, style in (("graphs", "o-"), ("split", "o-"), ("eager", "s--")):
            rs = sorted((r for r in of if r["mode"] == mode), key=lambda r: r["context"])
            if rs:
                ax.plot([r["context"] for r in rs], [r["ms"] for r in rs], style, label=f"attnv41 {name}, {mode}")
        fl = sorted({(r["context"], r["floor_ms"]) for r in of})
        ax.plot([c for c, _ in fl], [f for _, f in fl], "k.:" if fmt == fmts[0] else "kx:", label=f"floor, {name}")
        pe = sorted((r["context"], r["peer_est_ms"]) for r in of if r.get("peer_est_ms") is not None)
        if pe:
            ax.plot(
                [c for c, _ in pe], [v for _, v in pe], "^-", label=f"attnv41 {fmt} with FlashMLA's attention (est.)"
            )
    ax.set_xscale("log", base=2)
    ticks = sorted({r["context"] for r in rows})
    ax.set_xticks(ticks, [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in ticks])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("ms per decode step (40 layers, batch 1)")
    env = res["environment"]
    ax.set_title(f"attnv41 decode step, {env.get('gpu') or env.get('cpu')}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
