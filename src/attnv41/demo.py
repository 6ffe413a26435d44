"""`attnv41 demo`: the main job. A 40-layer V4.1 attention stack (V4.1-Flash geometry on
a GPU, a small geometry with the same schedule on the CPU, or a checkpoint), prefill,
then decode with whole-step CUDA graphs (the same step eagerly on the CPU) beside eager `forward`,
every step compared byte for byte, and a short report. Weights in either format
(`--weights`: "bf16", or "fp8" as the released checkpoint runs them; "auto" is the
checkpoint's own format, bf16 for random weights)."""

from __future__ import annotations

import gc
import resource
import sys
import time
from dataclasses import dataclass

import torch

from .config import AttnV41Cfg
from .synthetic import PRESETS, random_inputs, random_weights

__all__ = ["DemoResult", "DemoSetup", "WEIGHT_CHOICES", "prepare_demo", "run_demo", "run_prepared"]

WEIGHT_CHOICES = ("auto", "bf16", "fp8")  # --weights


@dataclass
class DemoResult:
    device: str
    geometry: str
    prompt: int
    steps: int
    prefill_s: float
    graph_step_ms: float  # mean over steps 2.. (the first step captures the graphs)
    eager_step_ms: float
    graph_first_ms: float  # the first step: graph captures and decode-kernel compiles included
    mismatched_steps: int
    captures: int
    recaptures: int
    memory: str
    nonfinite: int = 0  # non-finite values that entered a cache write, both stacks (finite inputs: 0)
    weights: str = "bf16"  # the weight format the stacks ran ("bf16" or "fp8")
    layers: int = 40  # the geometry's n_layers

    @property
    def ok(self) -> bool:
        return self.mismatched_steps == 0 and self.nonfinite == 0

    def lines(self) -> list[str]:
        mode = "CUDA graphs" if self.device.startswith("cuda") else "the device-driven step, eagerly"
        return [
            f"attnv41 demo: {self.geometry}, {self.weights} weights, on {self.device}",
            f"  prefill   {self.prompt} tokens x {self.layers} layers: {self.prefill_s * 1e3:.1f} ms, "
            f"{self.prompt / self.prefill_s:,.0f} tokens/s",
            f"  decode    {self.steps} steps, {mode}: {self.graph_step_ms:.3f} ms/step, "
            f"{1e3 / self.graph_step_ms:,.1f} tokens/s (first step apart: {self.graph_first_ms:.1f} ms"
            + (", with the graph captures)" if self.device.startswith("cuda") else ")"),
            f"  decode    eager forward: {self.eager_step_ms:.3f} ms/step "
            f"(graph/split path {self.eager_step_ms / self.graph_step_ms:.2f}x faster)",
            f"  captures  {self.captures} graphs, {self.recaptures} recaptures",
            "  check     graph vs eager, every step, byte for byte: "
            + ("all equal" if self.ok else f"{self.mismatched_steps} steps DIFFER"),
            f"  memory    {self.memory}",
            f"  finite    {self.nonfinite} non-finite values entered a cache write (attn.nonfinite_count())",
        ]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class DemoSetup:
    """Everything the demo runs on, validated and loaded: `prepare_demo` raises every user
    mistake (bad options, a missing or corrupt checkpoint) before any compute starts."""

    device: torch.device
    cfg: AttnV41Cfg
    weights: list
    weight_format: str  # "bf16" or "fp8": the format of `weights`
    geometry: str
    prompt: int
    steps: int
    seed: int
    index_keys: str
    progress: bool


def _check_int(flag: str, value, lo: int, hi: int, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{flag} = {value!r}; allowed: {lo}..{hi}{why}")


def _check_lengths(prompt: int, steps: int, max_pos: int, source: str) -> None:
    """--prompt and --steps against the geometry: the demo holds prompt + steps + 1
    positions (max_seq), which max_position_embeddings bounds."""
    why = f" (--prompt + --steps + 1 <= max_position_embeddings = {max_pos} of {source})"
    _check_int("--steps", steps, 1, max_pos - 2, why)
    _check_int("--prompt", prompt, 1, max_pos - steps - 1, f" with --steps {steps}" + why)


def prepare_demo(
    preset: str = "auto",
    prompt: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    index_keys: str = "own",
    device: str = "auto",
    checkpoint: str | None = None,
    progress: bool = True,
    weights: str = "auto",
) -> DemoSetup:
    """Validate the options against the geometry's limits, then build the config and the
    weights (random, or loaded from `checkpoint`) in the format `weights` ("auto": the
    checkpoint's own, `checkpoint_weight_format`, bf16 for random weights; "fp8" with
    random weights: `random_weights(..., weights="fp8")`). Raises ValueError (or the
    checkpoint loader's FileNotFoundError / CheckpointError) naming the option and its
    allowed range; FP8 weights on a device whose op table has no FP8 GEMM are refused here."""
    if weights not in WEIGHT_CHOICES:
        raise ValueError(f"--weights = {weights!r}; allowed: {', '.join(repr(w) for w in WEIGHT_CHOICES)}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device = {device!r}; allowed: 'auto', 'cpu', 'cuda'")
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device = 'cuda'; allowed: 'cpu' or 'auto' (torch.cuda.is_available() is False)")
    if index_keys not in ("own", "released"):
        raise ValueError(f"--index-keys = {index_keys!r}; allowed: 'own', 'released'")
    _check_int("--seed", seed, 0, 2**62)
    gpu = dev.type == "cuda"
    prompt = prompt if prompt is not None else (4096 if gpu else 128)
    steps = steps if steps is not None else (256 if gpu else 48)
    if checkpoint is not None:
        from .checkpoint import checkpoint_weight_format, load_model

        # The geometry first (at the smallest capacity), to check the lengths before loading.
        cfg = AttnV41Cfg.from_checkpoint(checkpoint, max_tokens=1, max_seq=1)
        _check_lengths(prompt, steps, cfg.max_position_embeddings, f"checkpoint {checkpoint}")
        cfg = cfg.replace(max_tokens=prompt, max_seq=prompt + steps + 1)
        fmt = checkpoint_weight_format(checkpoint, cfg) if weights == "auto" else weights
        _check_format_runs(fmt, dev, weights)
        layers = load_model(checkpoint, cfg, device=dev, progress=progress, weights=fmt)
        geometry = f"checkpoint {checkpoint} (dim {cfg.dim}, {cfg.n_heads}x{cfg.head_dim} heads, {cfg.n_layers} layers)"
    else:
        name = preset if preset != "auto" else ("flash" if gpu else "small")
        if name not in PRESETS:
            raise ValueError(f"preset = {preset!r}; allowed: 'auto', {', '.join(repr(k) for k in PRESETS)}")
        _check_lengths(prompt, steps, PRESETS[name](max_tokens=1, max_seq=1).max_position_embeddings, f"preset {name}")
        cfg = PRESETS[name](max_tokens=prompt, max_seq=prompt + steps + 1)
        fmt = "bf16" if weights == "auto" else weights
        _check_format_runs(fmt, dev, weights)
        layers = random_weights(cfg, seed, dev, weights=fmt)
        geometry = (
            f"preset {name} (dim {cfg.dim}, {cfg.n_heads}x{cfg.head_dim} heads, {cfg.n_layers} layers), seed {seed}"
        )
    return DemoSetup(dev, cfg, layers, fmt, geometry, prompt, steps, seed, index_keys, progress)


def _check_format_runs(fmt: str, dev: torch.device, asked: str) -> None:
    """FP8 weights need an op table with an FP8 GEMM (`Ops.fp8_mm`); refused before loading."""
    from .runtime.ops import ops_for

    ops = ops_for(dev)
    if fmt == "fp8" and ops.fp8_mm is None:
        how = "the checkpoint's own format" if asked == "auto" else "asked"
        raise ValueError(
            f"--weights = {asked!r} gives 'fp8' ({how}), but the {ops.name!r} ops on {dev} have no FP8 GEMM yet; "
            "allowed here: --weights bf16 (or --device cpu, where FP8 weights run exactly)"
        )


def run_demo(
    preset: str = "auto",
    prompt: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    index_keys: str = "own",
    device: str = "auto",
    checkpoint: str | None = None,
    progress: bool = True,
    weights: str = "auto",
) -> DemoResult:
    """`prepare_demo` then `run_prepared`: the options are those of `attnv41 demo`."""
    return run_prepared(prepare_demo(preset, prompt, steps, seed, index_keys, device, checkpoint, progress, weights))


def run_prepared(setup: DemoSetup) -> DemoResult:
    """Prefill, then decode through the graph driver beside eager `forward`, timed and
    compared byte for byte."""
    from .runtime.graphs import DecodeGraphs
    from .runtime.stack import RuntimeStack

    dev, cfg, weights, geometry = setup.device, setup.cfg, setup.weights, setup.geometry
    prompt, steps, seed, index_keys, progress = setup.prompt, setup.steps, setup.seed, setup.index_keys, setup.progress
    gpu = dev.type == "cuda"
    eager = RuntimeStack(cfg, weights, device=dev, index_keys=index_keys)
    graph = RuntimeStack(cfg, eager.weights, device=dev, index_keys=index_keys)
    drv = DecodeGraphs(graph)
    xs = random_inputs(cfg, prompt, seed + 1, dev)
    dec = random_inputs(cfg, steps, seed + 2, dev)

    eager.step(xs, 0)  # warm-up and the eager stack's own prefill
    _sync(dev)
    t = time.perf_counter()
    graph.step(xs, 0)
    _sync(dev)
    prefill_s = time.perf_counter() - t

    bar = _bar(steps, progress and steps >= 64)
    y_graph = torch.empty(steps, cfg.n_layers, cfg.dim, dtype=torch.bfloat16, device=dev)
    y_eager = torch.empty_like(y_graph)
    # Decode is timed with Python's garbage collector paused, as an engine runs its decode
    # loop: collector pauses otherwise add milliseconds to single steps (BENCHMARKS.md).
    gc.collect()
    gc.disable()
    try:
        graph_first_ms, graph_ms = _timed_steps(
            steps,
            dev,
            bar,
            lambda s: y_graph[s].copy_(drv.step([x[s : s + 1] for x in dec], prompt + s).view_as(y_graph[s])),
        )
        _, eager_ms = _timed_steps(
            steps,
            dev,
            bar,
            lambda s: y_eager[s].copy_(torch.cat(eager.step([x[s : s + 1] for x in dec], prompt + s, keep=True))),
        )
    finally:
        gc.enable()
    bar(None)
    mismatched = int((y_graph.view(torch.int16) != y_eager.view(torch.int16)).flatten(1).any(1).sum())  # bytes
    if gpu:
        memory = (
            f"{torch.cuda.memory_allocated(dev) / 2**30:.2f} GiB allocated, "
            f"{torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB peak on the GPU"
        )
    else:
        memory = f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB peak resident (process)"
    return DemoResult(
        str(dev),
        geometry,
        prompt,
        steps,
        prefill_s,
        graph_ms,
        eager_ms,
        graph_first_ms,
        mismatched,
        drv.captures,
        drv.recaptures,
        memory,
        graph.attn.nonfinite_count() + eager.attn.nonfinite_count(),
        setup.weight_format,
        graph.cfg.n_layers,
    )


def _timed_steps(steps: int, dev: torch.device, bar, step) -> tuple[float, float]:
    """(ms of the first step, mean ms of the others). The first step of the graph path
    captures its graphs and compiles the decode kernels, so it is reported apart."""
    t = time.perf_counter()
    step(0)
    bar(1)
    _sync(dev)
    first = (time.perf_counter() - t) * 1e3
    if steps == 1:
        return first, first
    t = time.perf_counter()
    for s in range(1, steps):
        step(s)
        bar(1)
    _sync(dev)
    return first, (time.perf_counter() - t) / (steps - 1) * 1e3


def _bar(total: int, enabled: bool):
    """A progress callback: tqdm when enabled and importable; bar(None) closes it."""
    if not enabled:
        return lambda n: None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return lambda n: None
    b = tqdm(total=2 * total, desc="decode (graph, then eager)", unit="step", file=sys.stderr)

    def step(n):
        if n is None:
            b.close()
        else:
            b.update(n)

    return step
