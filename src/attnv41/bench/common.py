"""What every part of `attnv41 bench` shares: timing, the measured ceilings (copy
bandwidth, matmul rate, and on CUDA the FP8 matmul rate), floors and ratios, table
printing, environment facts.

Timing: CUDA events around each repetition after warm-up, median reported (on the CPU,
`time.perf_counter` around each repetition). With `flush_l2`, a 256 MiB buffer is
overwritten between repetitions (outside the timed region) so a kernel whose inputs
fit in the 50 MB L2 is timed from device memory, as it runs inside a model step.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

__all__ = [
    "Timing",
    "Timer",
    "Ceilings",
    "measure_ceilings",
    "floor_ms",
    "kernel_row",
    "format_table",
    "markdown_table",
    "environment",
]

L2_FLUSH_BYTES = 256 << 20


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    reps: int

    def to_dict(self) -> dict:
        return asdict(self)


class Timer:
    """Times a callable on one device: warm-up calls, then `reps` timed calls."""

    def __init__(self, device: torch.device | str, flush_l2: bool = False):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self._flush = None
        if flush_l2 and self.cuda:
            self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], object], warmup: int = 3, reps: int = 20) -> Timing:
        ms = self.times(fn, warmup, reps)
        return Timing(statistics.median(ms), min(ms), max(ms), reps)

    def times(self, fn: Callable[[], object], warmup: int = 3, reps: int = 20) -> list[float]:
        """Each repetition's time in ms (CUDA events around each call; host clock on the CPU)."""
        if reps < 1:
            raise ValueError(f"reps = {reps}; allowed: >= 1")
        for _ in range(warmup):
            fn()
        self.sync()
        if not self.cuda:
            ms = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                ms.append((time.perf_counter() - t0) * 1e3)
            return ms
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for s, e in ev:
            if self._flush is not None:
                self._flush.fill_(1)
            s.record()
            fn()
            e.record()
        self.sync()
        return [s.elapsed_time(e) for s, e in ev]

    def time_graph(self, fns: Sequence[Callable[[], object]], warmup: int = 2, reps: int = 20) -> Timing:
        """GPU time per call, without launch overhead: one CUDA graph runs every callable
        of `fns` once (give several copies of an op on distinct inputs so that the calls
        in one replay do not hit each other's data in L2); the L2 is flushed before each
        replay (outside the events) and the replay time is divided by len(fns). CUDA only;
        a capture error propagates."""
        if not self.cuda:
            raise ValueError(f"time_graph on {self.device}; allowed: a CUDA device")
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                for f in fns:
                    f()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=torch.cuda.Stream(self.device)):  # a capture stream of this device
            for f in fns:
                f()
        t = self.time(g.replay, warmup=1, reps=reps)
        n = len(fns)
        del g
        return Timing(t.median_ms / n, t.min_ms / n, t.max_ms / n, t.reps)

    def gpu_and_launch(self, calls: Sequence[Callable[[], object]], reps: int = 20) -> tuple[Timing, Timing, str]:
        """(GPU time per call from a CUDA graph of `calls`, eager time of `calls[0]` with its
        launch, which of the two the first is: "graph" on CUDA, "launch" on the CPU where
        both are the eager time)."""
        launch = self.time(calls[0], warmup=2, reps=reps)
        if not self.cuda:
            return launch, launch, "launch"
        return self.time_graph(calls, reps=reps), launch, "graph"


@dataclass
class Ceilings:
    """The rates every floor divides by, measured in the same run."""

    copy_gbps: float  # device-to-device copy: (bytes read + bytes written) / time
    copy_bytes: int
    mm_tflops: float  # bf16 matmul on random data (fp32 on the CPU)
    mm_shape: tuple[int, int, int]
    # FP8 matmul (torch._scaled_mm, e4m3 operands, per-tensor scales, bf16 out); CUDA only:
    # None on the CPU or where it cannot run, with the reason in fp8_mm_note.
    fp8_mm_tflops: float | None = None
    fp8_mm_note: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def measure_ceilings(device: torch.device | str, quick: bool = False) -> Ceilings:
    """Copy bandwidth from a large device-to-device copy (bytes read plus bytes written),
    the matmul rate from a large product of random matrices, and on CUDA the FP8 matmul
    rate (`fp8_mm_rate`) at the same size."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    timer = Timer(dev)
    n_bytes = (1 << 30) if cuda and not quick else (64 << 20)
    copy_gbps = 2 * n_bytes / (_copy_ms(timer, n_bytes) * 1e-3) / 1e9
    n = 8192 if cuda and not quick else 512
    dt = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(n, n, device=dev).to(dt)
    b = torch.randn(n, n, device=dev).to(dt)
    c = torch.empty(n, n, device=dev, dtype=dt)
    t = timer.time(lambda: torch.mm(a, b, out=c), warmup=3, reps=20 if cuda else 5)
    mm_tflops = 2 * n**3 / (t.median_ms * 1e-3) / 1e12
    fp8, note = fp8_mm_rate(timer, n)
    return Ceilings(copy_gbps, 2 * n_bytes, mm_tflops, (n, n, n), fp8, note)


def fp8_mm_rate(timer: Timer, n: int = 8192) -> tuple[float | None, str | None]:
    """(TFLOP/s, None) of `torch._scaled_mm` on random n×n×n float8_e4m3fn operands (b
    column-major: the transpose of a row-major [N, K] weight, as the FP8 linears hold it),
    per-tensor fp32 scales 1.0, bf16 out; (None, why) on the CPU or where it cannot run."""
    if not timer.cuda:
        return None, "not measured on the CPU (no FP8 matmul there; FP8 floors use the matmul rate)"
    scaled_mm = getattr(torch, "_scaled_mm", None)
    if scaled_mm is None:
        return None, f"torch {torch.__version__} has no torch._scaled_mm"
    dev = timer.device
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)  # row-major [N, K]
    one = torch.ones((), dtype=torch.float32, device=dev)
    try:
        t = timer.time(lambda: scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps=20)
    except (RuntimeError, TypeError) as e:  # e.g. a GPU without FP8 tensor cores
        return None, f"torch._scaled_mm failed: {type(e).__name__}: {e}"[:300]
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12, None


def _copy_ms(timer: Timer, n_bytes: int) -> float:
    src = torch.randint(0, 255, (n_bytes,), dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    return timer.time(lambda: dst.copy_(src), warmup=3, reps=20 if timer.cuda else 5).median_ms


def floor_ms(bytes_moved: float, flops: float, ceil: Ceilings, tflops: float | None = None) -> float:
    """The larger of bytes / copy bandwidth and FLOPs / matmul rate, in ms; `tflops`: the
    rate to use instead of `ceil.mm_tflops` (the FP8 rate for FP8 GEMMs)."""
    rate = ceil.mm_tflops if tflops is None else tflops
    return max(bytes_moved / (ceil.copy_gbps * 1e9), flops / (rate * 1e12)) * 1e3


def kernel_row(
    name: str,
    shape: str,
    t: Timing,
    bytes_moved: float,
    flops: float,
    ceil: Ceilings,
    tflops_rate: float | None = None,
    **extra,
) -> dict:
    """One row of a kernel table: time, achieved GB/s and TFLOP/s, floor and ratio; the
    compute floor at `tflops_rate` (default `ceil.mm_tflops`)."""
    s = t.median_ms * 1e-3
    rate = ceil.mm_tflops if tflops_rate is None else tflops_rate
    fl = floor_ms(bytes_moved, flops, ceil, rate)
    return {
        "name": name,
        "shape": shape,
        "ms": t.median_ms,
        "ms_min": t.min_ms,
        "bytes": int(bytes_moved),
        "flops": int(flops),
        "gbps": bytes_moved / s / 1e9,
        "tflops": flops / s / 1e12,
        "floor_ms": fl,
        "x_floor": t.median_ms / fl if fl > 0 else float("inf"),
        "bound": "memory" if bytes_moved / (ceil.copy_gbps * 1e9) >= flops / (rate * 1e12) else "compute",
        **extra,
    }


def _cell(v) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.4f}"
    return str(v)


def format_table(rows: Sequence[dict], cols: Sequence[tuple[str, str]], title: str = "") -> str:
    """A plain-text table; `cols` = (key, header). Missing keys print as '-'."""
    cells = [[h for _, h in cols]] + [[_cell(r[k]) if r.get(k) is not None else "-" for k, _ in cols] for r in rows]
    widths = [max(len(row[j]) for row in cells) for j in range(len(cols))]
    lines = [title] if title else []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict], cols: Sequence[tuple[str, str]]) -> str:
    """The same table in Markdown, for BENCHMARKS.md."""
    out = ["| " + " | ".join(h for _, h in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r[k]) if r.get(k) is not None else "-" for k, _ in cols) + " |")
    return "\n".join(out)


def environment(device: torch.device | str) -> dict:
    """Date, device and software versions, for the JSON and BENCHMARKS.md."""
    dev = torch.device(device)
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(dev),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=p.name,
            gpu_memory_gib=round(p.total_memory / 2**30, 1),
            sms=p.multi_processor_count,
            capability=f"{p.major}.{p.minor}",
            cuda=torch.version.cuda,
        )
    else:
        env["cpu"] = platform.processor() or platform.machine()
    return env
