"""`attnv41 bench`, part (b): each kernel alone, timed, against its own floor.

One row per (kernel, regime): decode is one token (m = 1), prefill is m = prefill_tokens
(`attnv41 bench` passes the largest `--prefill` length: FP8 prefill is judged at 8K tokens,
the largest of the GPU default 2048,8192), at the config's geometry with `context` cached rows.

Projections run in each selected weight format (column "weights"): bf16 (`mm`, `group_mm`
for wo_a) and FP8 (`fp8_mm`, the released linear: e4m3 weight with e8m0 32×32 block
scales from `quant_weight` of a random matrix, activation quantized per 32 columns) for
each of `FP8_LINEARS`, and "wo_a fp8": wo_a stored as the checkpoint's e4m3 + scales and
run as its exact bf16 (`group_mm` with `scale=`; bf16 products, so the matmul rate). An
FP8 row's bytes count its weight at 1 byte per element plus the scales; an `fp8_mm` row's compute
floor uses the FP8 matmul rate (`Ceilings.fp8_mm_tflops`; the bf16/fp32 matmul rate
where none was measured, named in "floor rate"), and prefill FP8 rows report the
achieved share of that rate ("% of fp8 mm"). Every op runs through the op table
(`runtime/ops.py`: Triton on CUDA, torch twins on the CPU) into pre-allocated buffers,
on fresh random inputs from one seeded generator on the device.

The "packed" rows of sparse attention and index scores run the same ops over rows in
V4.1's packed byte formats (`attnv41.packed`: what `kv_format="packed"` caches hold), so
the cost of dequantizing in the kernel shows beside the bf16 rows.

Bytes are the fewest the op must move: each input read once, each output written once
(sparse attention: each distinct selected row once, at its stored width; in-place RoPE:
only the rotated tail). FLOPs count the dot products only (sparse attention's QK and PV, the index dots,
the projections); the elementwise ops count 0, so their floor is the copy bandwidth's.

Timing, on CUDA: "GPU ms" is the time per call inside a CUDA graph that runs the op on
COPIES input sets one after the other, L2 flushed before each replay: the kernel's own
time, as inside the captured decode step. "launch ms" times one eager call between CUDA
events, the Python launch included (what an uncaptured step pays per op). On the CPU
both are the eager time.

Before a kernel is timed it is checked once against its torch twin (`TORCH_OPS`) on the
same inputs: selections, masks and ring writes exactly, float outputs (FP8 GEMMs
included) to a relative tolerance (`check_output`); a mismatch raises RuntimeError
naming the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ..config import AttnV41Cfg
from ..packed import pack
from ..reference.fp8 import quant_weight
from ..reference.qdq import fp4_e4m3_qdq, fp4_e8m0_qdq, fp8_qdq
from ..runtime.ops import TORCH_OPS, Ops, ops_for
from ..weights import WEIGHT_FORMATS
from .common import Ceilings, Timer, Timing, kernel_row

__all__ = [
    "bench_kernels",
    "check_output",
    "check_case",
    "KernelCase",
    "KERNEL_COLS",
    "KERNEL_NAMES",
    "FP8_KERNEL_NAMES",
]

KERNEL_COLS = [
    ("name", "kernel"),
    ("regime", "regime"),
    ("weights", "weights"),
    ("shape", "shape"),
    ("ms", "GPU ms"),
    ("launch_ms", "launch ms"),
    ("gbps", "GB/s"),
    ("tflops", "TFLOP/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("bound", "bound"),
    ("pct_fp8_mm", "% of fp8 mm"),
]

# name → regimes it is timed in, in row order
KERNEL_NAMES = {
    "sparse_attn": ("decode", "prefill"),
    "sparse_attn packed": ("decode", "prefill"),  # over V4.1's packed rows (attnv41.packed)
    "index_scores": ("decode",),
    "index_scores packed": ("decode",),
    "topk_fixed": ("decode",),
    "candidate_mask_fixed": ("decode",),
    "compress_pool": ("decode", "prefill"),
    "rope_q": ("decode", "prefill"),
    "rms_norm_q": ("decode", "prefill"),
    "fp8_qdq_kv": ("decode", "prefill"),
    "fp4_e8m0_qdq_iq": ("decode", "prefill"),
    "fp4_e4m3_qdq_kv": ("decode", "prefill"),
    "ring_write": ("decode",),
    "wq_a": ("decode", "prefill"),
    "wq_b": ("decode", "prefill"),
    "wkv": ("decode", "prefill"),
    "wo_a": ("decode", "prefill"),
    "wo_b": ("decode", "prefill"),
    "indexer.wq_b": ("decode", "prefill"),
}
# FP8-format rows: the FP8 linears (op fp8_mm, the FP8 math) and wo_a stored FP8 (op group_mm: bf16 math)
FP8_KERNEL_NAMES = {f"{n} fp8": ("decode", "prefill") for n in ("wq_a", "wq_b", "wkv", "wo_b", "indexer.wq_b", "wo_a")}
PROJECTIONS = ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "indexer.wq_b")

COPIES = 8  # on CUDA, one graph runs the op on this many input sets (none hot in L2 from the previous call)
TOL = 1e-2  # float outputs: |err| <= TOL·(|ref| + mean|ref|)


@dataclass
class KernelCase:
    """One timed op: `call(fn, dst)` runs op table entry `op` writing into `dst` (its out=
    buffer, or the tensor it updates in place) and returns the result."""

    name: str
    regime: str
    op: str
    shape: str
    call: Callable[[Callable, torch.Tensor], torch.Tensor]
    dst: torch.Tensor
    bytes: int
    flops: int
    exact: bool = False
    weights: str | None = None  # a projection's weight format; None for the other ops


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def check_output(what: str, got: torch.Tensor, want: torch.Tensor, exact: bool = False, tol: float = TOL) -> None:
    """RuntimeError naming `what` unless `got` matches the twin's `want`: equal when `exact`,
    else no NaN, the same infinities, and `|got − want| <= tol·(|want| + mean|want|)`."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise RuntimeError(
            f"{what}: output {got.dtype} {tuple(got.shape)}; the torch twin gives {want.dtype} {tuple(want.shape)}"
        )
    if exact:
        if not torch.equal(got, want):
            n = int((got != want).sum())
            raise RuntimeError(f"{what}: {n} of {got.numel()} entries differ from the torch twin (exact check)")
        return
    g, w = got.double(), want.double()
    if bool(torch.isnan(g).any()) or bool(torch.isnan(w).any()):
        raise RuntimeError(f"{what}: NaN in the output ({int(torch.isnan(g).sum())}) or the twin's")
    inf = torch.isinf(g) | torch.isinf(w)
    if not torch.equal(g[inf], w[inf]):
        raise RuntimeError(f"{what}: infinities differ from the torch twin at {int((g[inf] != w[inf]).sum())} entries")
    err, ref = (g - w).abs()[~inf], w.abs()[~inf]
    if err.numel() == 0:
        return
    denom = ref + ref.mean() + 1e-30
    rel = err / denom
    if bool((rel > tol).any()):
        raise RuntimeError(
            f"{what}: {int((rel > tol).sum())} of {err.numel()} entries off the torch twin; "
            f"max |err|/(|ref| + mean|ref|) = {float(rel.max()):.3g} > {tol}"
        )


def check_case(case: KernelCase, ops: Ops) -> None:
    """Run `case` through `ops` and through `TORCH_OPS` on copies of its buffer and compare."""
    got = case.call(getattr(ops, case.op), case.dst.clone())
    want = case.call(getattr(TORCH_OPS, case.op), case.dst.clone())
    check_output(f"kernel {case.name} ({case.regime}, op {ops.name}.{case.op})", got, want, exact=case.exact)


class _Rand:
    """Fresh random inputs from one seeded generator on the device."""

    def __init__(self, dev: torch.device, seed: int):
        self.dev = dev
        self.g = torch.Generator(device=dev)
        self.g.manual_seed(seed)

    def f32(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g, device=self.dev)

    def bf16(self, *shape: int) -> torch.Tensor:
        return self.f32(*shape).to(torch.bfloat16)

    def angles(self, rows: int, half: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random cos/sin tables (unit pairs, so repeated in-place rotation stays bounded)."""
        theta = torch.rand(rows, half, generator=self.g, device=self.dev) * (2 * math.pi)
        return theta.cos().contiguous(), theta.sin().contiguous()

    def distinct(self, m: int, n: int, k: int) -> torch.Tensor:
        """Per row, k distinct indices in 0..n−1, ascending (as top-k hands them over); int64 [m, k]."""
        return torch.rand(m, n, generator=self.g, device=self.dev).topk(k, dim=1).indices.sort(dim=1).values


def _sparse(rnd: _Rand, cfg: AttnV41Cfg, regime: str, m: int, context: int, packed: bool = False) -> KernelCase:
    """The regime's attention over W window rows and `context` compressed rows; packed:
    the rows on their grids in V4.1's byte formats, as the packed caches hold them (the
    decode regime reads packed window and compressed rows, the prefill regime the chunk's
    own bf16 window rows and packed compressed rows)."""
    H, D, W = cfg.n_heads, cfg.head_dim, cfg.window
    k = min(cfg.index_topk, context)
    q, ring, comp, sink = rnd.bf16(m, H, D), rnd.bf16(W, D), rnd.bf16(context, D), rnd.f32(H)
    win_b, comp_b = 2 * D, 2 * D
    if packed:
        comp = pack(fp4_e4m3_qdq(comp), "fp4_e4m3")
        comp_b = comp.shape[1]
        if regime == "decode":
            ring = pack(fp8_qdq(ring), "fp8_e8m0")
            win_b = ring.shape[1]
    picked = rnd.distinct(m, context, k)
    win = torch.arange(W, device=rnd.dev).expand(m, W)
    sel = torch.cat([win, picked + W], dim=1).to(torch.int32).contiguous()
    K = W + k
    return KernelCase(
        "sparse_attn packed" if packed else "sparse_attn",
        regime,
        "sparse_attn_decode" if regime == "decode" else "sparse_attn",  # the op each regime runs
        f"m={m} H={H} D={D} K={K} Nc={context}",
        lambda f, d: f(q, ring, comp, sel, W, sink, D**-0.5, out=d),
        torch.empty(m, H, D, dtype=torch.bfloat16, device=rnd.dev),
        W * win_b + int(torch.unique(picked).numel()) * comp_b + _nbytes(q, q, sel, sink),
        2 * 2 * m * H * K * D,
    )


def _index_cases(rnd: _Rand, cfg: AttnV41Cfg, context: int) -> Iterator[KernelCase]:
    dev, ih, d = rnd.dev, cfg.index_heads, cfg.index_head_dim
    iq, hw, keys = rnd.bf16(1, ih, d), rnd.bf16(1, ih), rnd.bf16(context, d)
    vis = torch.full((1,), context, dtype=torch.int32, device=dev)
    out = torch.empty(1, context, dtype=torch.bfloat16, device=dev)
    packed_keys = pack(fp4_e8m0_qdq(keys), "fp4_e8m0")  # the keys as a packed cache holds them
    for name, kk in (("index_scores", keys), ("index_scores packed", packed_keys)):
        yield KernelCase(
            name,
            "decode",
            "index_scores",
            f"m=1 H={ih} d={d} L={context}",
            lambda f, o, kk=kk: f(iq, hw, kk, vis, out=o),
            out,
            _nbytes(iq, hw, kk, vis, out),
            2 * ih * d * context,
        )
    scores = rnd.bf16(1, context)
    k = min(cfg.index_topk, context)
    idx = torch.empty(1, k, dtype=torch.int32, device=dev)
    yield KernelCase(  # the decode step's ops (fixed width over the bucket; Triton radix select on CUDA)
        "topk_fixed",
        "decode",
        "topk_fixed",
        f"L={context} k={k}",
        lambda f, o: f(scores, vis, k, cfg.window, out=o),
        idx,
        _nbytes(scores, vis, idx),
        0,
        exact=True,
    )
    mask = torch.empty(1, context, dtype=torch.bool, device=dev)
    yield KernelCase(
        "candidate_mask_fixed",
        "decode",
        "candidate_mask_fixed",
        f"L={context} blocks={cfg.cand_blocks}x{cfg.cand_block}",
        lambda f, o: f(scores, vis, cfg.cand_blocks, cfg.cand_block, out=o),
        mask,
        _nbytes(scores, vis, mask),
        0,
        exact=True,
    )


def _elementwise_cases(rnd: _Rand, cfg: AttnV41Cfg, regime: str, m: int, context: int) -> Iterator[KernelCase]:
    dev, H, D = rnd.dev, cfg.n_heads, cfg.head_dim
    bf = dict(dtype=torch.bfloat16, device=dev)
    r = min((x for x in cfg.compress_ratios if x >= 2), default=2)
    n = max(1, m // r)
    a, g = rnd.f32(n, r, D), rnd.f32(n, r, D)
    pooled = torch.empty(n, D, dtype=torch.float32, device=dev)
    yield KernelCase(
        "compress_pool",
        regime,
        "compress_pool",
        f"n={n} r={r} D={D}",
        lambda f, o: f(a, g, out=o),
        pooled,
        _nbytes(a, g, pooled),
        0,
    )
    half = cfg.rope_dim // 2
    cos, sin = rnd.angles(context + m, half)
    pos = torch.arange(context, context + m, dtype=torch.int32, device=dev)
    q = rnd.bf16(m, H, D)  # rotated in place, as the runtime does: only the rope tail moves
    yield KernelCase(
        "rope_q",
        regime,
        "apply_rope",
        f"m={m} H={H} D={D} rope={cfg.rope_dim}",
        lambda f, x: f(x, cos, sin, pos, out=x),
        q,
        2 * m * H * cfg.rope_dim * 2 + 2 * m * half * 4 + _nbytes(pos),
        0,
    )
    x, wn = rnd.bf16(m, cfg.q_rank), rnd.bf16(cfg.q_rank)
    y = torch.empty(m, cfg.q_rank, **bf)
    yield KernelCase(
        "rms_norm_q",
        regime,
        "rms_norm",
        f"m={m} width={cfg.q_rank}",
        lambda f, o: f(x, wn, cfg.norm_eps, out=o),
        y,
        _nbytes(x, wn, y),
        0,
    )
    for name, op, rows_, width in (
        ("fp8_qdq_kv", "fp8_qdq", m, D),
        ("fp4_e8m0_qdq_iq", "fp4_e8m0_qdq", m * cfg.index_heads, cfg.index_head_dim),
        ("fp4_e4m3_qdq_kv", "fp4_e4m3_qdq", m, D),
    ):
        yield _qdq_case(rnd, name, op, regime, rows_, width)
    if regime == "decode":
        ring, row = rnd.bf16(cfg.window, D), rnd.bf16(1, D)
        at = torch.tensor([context], dtype=torch.int32, device=dev)
        yield KernelCase(
            "ring_write",
            regime,
            "ring_write",
            f"window={cfg.window} D={D}",
            lambda f, rg: f(rg, row, at),
            ring,
            2 * _nbytes(row) + _nbytes(at),
            0,
            exact=True,
        )


def _qdq_case(rnd: _Rand, name: str, op: str, regime: str, rows: int, width: int) -> KernelCase:
    x = rnd.bf16(rows, width)
    out = torch.empty_like(x)
    return KernelCase(name, regime, op, f"[{rows}, {width}]", lambda f, o: f(x, out=o), out, _nbytes(x, out), 0)


def _projection_cases(
    rnd: _Rand, cfg: AttnV41Cfg, regime: str, m: int, formats: tuple[str, ...]
) -> Iterator[KernelCase]:
    """Each projection in each format of `formats`, the FP8 row right after its bf16 row."""
    bf = dict(dtype=torch.bfloat16, device=rnd.dev)
    G, gw = cfg.groups, cfg.group_width
    dims = {
        "wq_a": (cfg.q_rank, cfg.dim),
        "wq_b": (cfg.n_heads * cfg.head_dim, cfg.q_rank),
        "wkv": (cfg.head_dim, cfg.dim),
        "wo_b": (cfg.dim, G * cfg.o_rank),
        "indexer.wq_b": (cfg.index_heads * cfg.index_head_dim, cfg.q_rank),
    }
    for name in PROJECTIONS:
        if "bf16" in formats:
            if name == "wo_a":
                x, w = rnd.bf16(m, G, gw), rnd.bf16(G, cfg.o_rank, gw)
                y = torch.empty(m, G, cfg.o_rank, **bf)
                op, shape, flops = "group_mm", f"m={m} G={G} out={cfg.o_rank} in={gw}", 2 * m * G * cfg.o_rank * gw
            else:
                n_out, n_in = dims[name]
                x, w = rnd.bf16(m, n_in), rnd.bf16(n_out, n_in)
                y = torch.empty(m, n_out, **bf)
                op, shape, flops = "mm", f"m={m} out={n_out} in={n_in}", 2 * m * n_out * n_in
            yield KernelCase(name, regime, op, shape, _mm_call(x, w), y, _nbytes(x, w, y), flops, weights="bf16")
        if "fp8" in formats and name == "wo_a":  # stored as the checkpoint's e4m3 + scales, run as its bf16
            x = rnd.bf16(m, G, gw)
            q, sc = quant_weight(rnd.f32(G * cfg.o_rank, gw) * gw**-0.5, name="wo_a fp8")
            q = q.view(G, cfg.o_rank, gw)
            y = torch.empty(m, G, cfg.o_rank, **bf)
            yield KernelCase(
                "wo_a fp8",
                regime,
                "group_mm",
                f"m={m} G={G} out={cfg.o_rank} in={gw}",
                lambda f, o, x=x, q=q, sc=sc: f(x, q, o, scale=sc),
                y,
                _nbytes(x, q, sc, y),
                2 * m * G * cfg.o_rank * gw,
                weights="fp8",
            )
        elif "fp8" in formats:
            n_out, n_in = dims[name]
            x = rnd.bf16(m, n_in)
            q, sc = quant_weight(rnd.f32(n_out, n_in) * n_in**-0.5, name=f"{name} fp8")  # outputs O(1)
            y = torch.empty(m, n_out, **bf)
            yield KernelCase(
                f"{name} fp8",
                regime,
                "fp8_mm",
                f"m={m} out={n_out} in={n_in}",
                lambda f, o, x=x, q=q, sc=sc: f(x, q, sc, out=o),
                y,
                _nbytes(x, q, sc, y),
                2 * m * n_out * n_in,
                weights="fp8",
            )


def _mm_call(x: torch.Tensor, w: torch.Tensor) -> Callable[[Callable, torch.Tensor], torch.Tensor]:
    return lambda f, o: f(x, w, out=o)


def _cases(
    cfg: AttnV41Cfg, dev: torch.device, context: int, prefill_tokens: int, seed: int, formats: tuple[str, ...]
) -> Iterator[KernelCase]:
    """Every case, built one at a time (a case's buffers are freed once it has been timed)."""
    rnd = _Rand(dev, seed)
    regimes = (("decode", 1), ("prefill", prefill_tokens))
    for regime, m in regimes:
        yield _sparse(rnd, cfg, regime, m, context)
        yield _sparse(rnd, cfg, regime, m, context, packed=True)
    yield from _index_cases(rnd, cfg, context)
    for regime, m in regimes:
        yield from _elementwise_cases(rnd, cfg, regime, m, context)
    for regime, m in regimes:
        yield from _projection_cases(rnd, cfg, regime, m, formats)


def _time(timer: Timer, case: KernelCase, fn: Callable, warmup: int, reps: int) -> Timing:
    return timer.time(lambda: case.call(fn, case.dst), warmup=warmup, reps=reps)


def bench_kernels(
    cfg: AttnV41Cfg,
    device,
    ceil: Ceilings,
    context: int = 32768,
    prefill_tokens: int = 2048,
    quick: bool = False,
    seed: int = 0,
    *,
    ops: Ops | None = None,
    weights: Sequence[str] = WEIGHT_FORMATS,
) -> list[dict]:
    """Time each kernel alone (decode: m = 1; prefill: m = prefill_tokens) over `context`
    cached rows; one `kernel_row` per (kernel, regime), with keys `regime`, `op` and
    `weights` (a projection's format, else None) added.

    `ops`: the table under test (default `ops_for(device)`); each case is first checked
    against `TORCH_OPS` (RuntimeError naming the kernel on a mismatch). `weights`: the
    projection formats to time (a non-empty subset of `WEIGHT_FORMATS`; "fp8" needs
    `ops.fp8_mm`). `quick`: warm-up 1, 3 repetitions (smoke tests); otherwise 5 and 50 on
    CUDA, 2 and 10 on the CPU.
    """
    for name, v in (("context", context), ("prefill_tokens", prefill_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} = {v!r}; allowed: an integer >= 1")
    formats = tuple(weights)
    if not formats or any(f not in WEIGHT_FORMATS for f in formats):
        raise ValueError(f"weights = {formats!r}; allowed: a non-empty subset of {WEIGHT_FORMATS}")
    dev = torch.device(device)
    ops = ops_for(dev) if ops is None else ops
    if "fp8" in formats and ops.fp8_mm is None:
        raise ValueError(f"weights = {formats!r}: the {ops.name!r} op table has no fp8_mm; allowed: ('bf16',)")
    timer = Timer(dev, flush_l2=True)
    warmup, reps = (1, 3) if quick else ((5, 50) if timer.cuda else (2, 10))
    copies = COPIES if timer.cuda else 1
    rows = []
    gens = [_cases(cfg, dev, context, prefill_tokens, seed + 1009 * i, formats) for i in range(copies)]
    for group in zip(*gens):
        case = group[0]
        check_case(case, ops)
        fn = getattr(ops, case.op)
        t_launch = _time(timer, case, fn, warmup, reps)
        t, how, extra = t_launch, "launch", {}
        if timer.cuda:
            try:
                t = timer.time_graph([partial(c.call, fn, c.dst) for c in group], reps=reps)
                how = "graph"
            except Exception as e:  # kept in the row: the table then shows launch timing for it
                extra["graph_error"] = f"{type(e).__name__}: {e}"[:300]
        fp8 = case.op == "fp8_mm"  # the FP8 math (not wo_a stored FP8: its products are bf16)
        if fp8:  # FP8 GEMMs against the FP8 matmul rate, where it was measured
            rate = ceil.fp8_mm_tflops if ceil.fp8_mm_tflops is not None else ceil.mm_tflops
            extra["floor_rate"] = "fp8_mm" if ceil.fp8_mm_tflops is not None else "mm"
            if case.regime == "prefill" and ceil.fp8_mm_tflops is not None:
                extra["pct_fp8_mm"] = case.flops / (t.median_ms * 1e-3) / 1e12 / ceil.fp8_mm_tflops * 100
        rows.append(
            kernel_row(
                case.name,
                case.shape,
                t,
                case.bytes,
                case.flops,
                ceil,
                rate if fp8 else None,
                regime=case.regime,
                weights=case.weights,
                op=case.op,
                impl=ops.name,
                timing=how,
                launch_ms=t_launch.median_ms,
                **extra,
            )
        )
        del group, case
    return rows
