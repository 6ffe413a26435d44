"""`attnv41 bench`: runs the parts in one process so every ratio uses the ceilings
measured in the same run, after a correctness gate, and writes `bench.json`,
`bench.md` (the tables as Markdown) and `decode_step.png` into the output folder.

Parts: kernels (b), decode (a), prefill (e), peer (c), index (d). Gate: the bundled
golden file (tensors from DeepSeek's released code) replayed through the runtime on the
bench device, both variants, must pass before anything is timed; each part checks its
own results as well (kernels against their torch twins, the decode step by the graph
oracle, the top-k as a set, the peer's output against ours).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..synthetic import PRESETS, random_weights
from .common import environment, format_table, markdown_table, measure_ceilings

__all__ = ["BenchOptions", "run_bench", "PARTS", "write_outputs"]

PARTS = ("kernels", "decode", "prefill", "peer", "index")

GPU_DEFAULTS = dict(
    contexts=(4096, 32768, 131072),
    prefill=(2048, 8192),
    index_lengths=(4096, 16384, 65536, 262144, 1048576),
    batches=(1, 64),
)
CPU_DEFAULTS = dict(contexts=(128, 512), prefill=(64, 128), index_lengths=(4096, 16384), batches=(1, 4))


@dataclass
class BenchOptions:
    parts: Sequence[str] = PARTS
    contexts: Sequence[int] | None = None
    prefill: Sequence[int] | None = None
    index_lengths: Sequence[int] | None = None
    batches: Sequence[int] | None = None
    preset: str = "auto"
    device: str = "auto"
    checkpoint: str | None = None
    seed: int = 0
    quick: bool = False
    progress: bool = True


def _resolve(opts: BenchOptions) -> tuple[torch.device, BenchOptions]:
    for p in opts.parts:
        if p not in PARTS:
            raise ValueError(f"part {p!r}; allowed: {', '.join(PARTS)}")
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
    preset = opts.preset if opts.preset != "auto" else ("flash" if cuda else "small")
    if opts.checkpoint is None and preset not in PRESETS:
        raise ValueError(f"preset = {opts.preset!r}; allowed: 'auto', {', '.join(repr(k) for k in PRESETS)}")
    o = BenchOptions(**{**asdict(opts), **vals, "preset": preset, "device": dev.type})
    return dev, o


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
        f"gate: bundled golden {g.name} through the runtime on {dev}: "
        + ", ".join(f"{v} {r['compared']} tensors, {r['failed']} failed" for v, r in res.items())
    )
    return {"golden": g.name, **res}


def _stack(opts: BenchOptions, dev: torch.device, log):
    from ..runtime.stack import RuntimeStack

    max_seq = max(opts.contexts) + 256
    max_tokens = max(opts.prefill)
    if opts.checkpoint is not None:
        from ..checkpoint import load_model
        from ..config import AttnV41Cfg

        cfg = AttnV41Cfg.from_checkpoint(opts.checkpoint, max_tokens=max_tokens, max_seq=max_seq)
        weights = load_model(opts.checkpoint, cfg, device=dev, progress=opts.progress)
        what = f"checkpoint {opts.checkpoint}"
    else:
        cfg = PRESETS[opts.preset](max_tokens=max_tokens, max_seq=max_seq)
        weights = random_weights(cfg, opts.seed, dev)
        what = f"preset {opts.preset}, random weights (seed {opts.seed})"
    log(
        f"stack: {what}; dim {cfg.dim}, {cfg.n_heads}x{cfg.head_dim} heads, {cfg.n_layers} layers, "
        f"max_tokens {max_tokens}, max_seq {max_seq}"
    )
    return RuntimeStack(cfg, weights, device=dev), what


def _geometry(opts: BenchOptions):
    if opts.checkpoint is not None:
        from ..config import AttnV41Cfg

        return AttnV41Cfg.from_checkpoint(opts.checkpoint)
    return PRESETS[opts.preset]()


def run_bench(
    opts: BenchOptions, log: Callable[[str], None] = print, on_part: Callable[[dict], None] | None = None
) -> dict:
    """Run the selected parts; returns the results (what `bench.json` holds). `on_part(res)`
    is called after each part (the command saves partial results with it)."""
    dev, opts = _resolve(opts)
    t0 = time.perf_counter()
    res: dict = {"environment": environment(dev), "options": asdict(opts)}
    if dev.type == "cpu":
        log(
            "attnv41 bench on the CPU: a smoke run of every part at a small geometry; the times say nothing about a GPU"
        )
    res["gate"] = _gate(dev, log)
    ceil = measure_ceilings(dev, quick=opts.quick or dev.type == "cpu")
    res["ceilings"] = ceil.to_dict()
    log(
        f"ceilings: copy {ceil.copy_gbps:,.0f} GB/s (read + write), matmul {ceil.mm_tflops:,.1f} TFLOP/s "
        f"({'bf16' if dev.type == 'cuda' else 'fp32'} {ceil.mm_shape[0]}^3)"
    )
    geo = _geometry(opts)
    held: dict = {}

    def stack():
        if "stack" not in held:
            held["stack"], res["stack"] = _stack(opts, dev, log)
        return held["stack"]

    def kernels():
        from .kernels import bench_kernels

        ctx = sorted(opts.contexts)[len(opts.contexts) // 2]
        return bench_kernels(
            geo, dev, ceil, context=ctx, prefill_tokens=min(opts.prefill), quick=opts.quick, seed=opts.seed
        )

    def decode():
        from .stack import bench_decode

        rows = bench_decode(stack(), opts.contexts, ceil, reps=3 if opts.quick else 50, seed=opts.seed)
        res["nonfinite_values"] = stack().attn.nonfinite_count()
        return rows

    def prefill():
        from .stack import bench_prefill

        rows = bench_prefill(stack(), opts.prefill, ceil, reps=2 if opts.quick else 3, seed=opts.seed)
        res["nonfinite_values"] = stack().attn.nonfinite_count()  # since the stack was built (decode too)
        held.clear()  # the stack's weights and caches go before the peer's data arrive
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return rows

    def peer():
        from .peer import bench_attention_peer

        rows, res["peer_status"] = bench_attention_peer(
            geo, dev, ceil, opts.contexts, opts.batches, reps=5 if opts.quick else 50, seed=opts.seed
        )
        log(f"peer: {res['peer_status']}")
        return rows

    def index():
        from .index import bench_index_topk

        return bench_index_topk(geo, dev, ceil, opts.index_lengths, reps=3 if opts.quick else 30, seed=opts.seed)

    # One part failing does not stop the others; its error is kept and the command fails.
    for name, fn in (("kernels", kernels), ("decode", decode), ("prefill", prefill), ("peer", peer), ("index", index)):
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
    held.clear()
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
    from .index import INDEX_COLS
    from .kernels import KERNEL_COLS
    from .peer import PEER_COLS
    from .stack import DECODE_COLS, PREFILL_COLS

    fmt = markdown_table if md else format_table
    out = []
    for key, title, cols in (
        ("decode", "(a) decode step, 40 layers, batch 1", DECODE_COLS),
        ("kernels", "(b) each kernel alone", KERNEL_COLS),
        ("peer", "(c) sparse attention vs FlashMLA legacy sparse decode", PEER_COLS),
        ("index", "(d) index scores + top-k, one query", INDEX_COLS),
        ("prefill", "(e) prefill through 40 layers", PREFILL_COLS),
    ):
        if res.get(key):
            out.append((title, fmt(res[key], cols)))
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
        + f"; copy {ceil['copy_gbps']:,.0f} GB/s, matmul {ceil['mm_tflops']:,.1f} TFLOP/s (measured in this run)"
    )
    md = [head, ""]
    for title, table in _tables(res, md=True):
        md += [f"### {title}", "", table, ""]
    if "nonfinite_values" in res:
        md.append(f"Non-finite values that entered a cache write (decode/prefill stack): {res['nonfinite_values']}")
    if "peer_status" in res:
        md.append(f"Peer: {res['peer_status']}")
    paths[1].write_text("\n".join(md) + "\n")
    if res.get("decode"):
        paths.append(plot_decode(res, out / "decode_step.png"))
    log(head)
    for title, table in _tables(res, md=False):
        log(f"\n{title}\n{table}")
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
    for mode, style in (("graphs", "o-"), ("split", "o-"), ("eager", "s--")):
        rs = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["context"])
        if rs:
            ax.plot([r["context"] for r in rs], [r["ms"] for r in rs], style, label=f"attnv41, {mode}")
    fl = sorted({(r["context"], r["floor_ms"]) for r in rows})
    ax.plot([c for c, _ in fl], [f for _, f in fl], "k.:", label="floor (bytes / measured copy bandwidth)")
    pe = sorted((r["context"], r["peer_est_ms"]) for r in rows if r.get("peer_est_ms") is not None)
    if pe:
        ax.plot([c for c, _ in pe], [v for _, v in pe], "^-", label="attnv41 graphs with FlashMLA's attention (est.)")
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
