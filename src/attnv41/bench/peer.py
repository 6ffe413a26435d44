"""Part (c) of `attnv41 bench`: our sparse attention kernel beside FlashMLA's legacy
Hopper sparse decode kernel (PyPI `sgl-flash-mla`, `flash_mla_with_kvcache(...,
use_legacy=True)`), when that package is importable. It is a speed reference only.

Both attend, per query token, over the 128 window rows plus 512 selected compressed rows
of its own sequence, 64 heads of width 512, with the attention sink. Batch B is B
sequences decoding one token each. Ours reads bf16 rows: the B rings side by side
(`win`, B·window rows) and the B compressed caches side by side (`comp`), each token's
selection pointing into its own sequence's part. The peer reads the V4 KV-cache layout
(`v4_cache`): 584 bytes per token, FlashMLA's paged blocks of 64 tokens. The same rows
are quantised into it, so both compute the same attention up to that format's rounding;
the relative difference of their outputs is reported beside the times.

V4 layout, as FlashMLA documents it: per token 448 "nope" values as fp8 e4m3 in 7 tiles
of 64, each tile with a power-of-two scale stored as an e8m0 byte, and the 64 rope
values as bf16. A page block of 64 tokens stores the 64 × 576 data bytes first (448 fp8
+ 128 bf16 bytes per token), then 64 × 8 scale bytes (7 used), and blocks start every
ceil(64·584 / 576)·576 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from ..kernels.sparse_attn import sparse_attn
from ..kernels.sparse_attn_gluon import HAVE_GLUON, sparse_attn_gluon
from ..kernels.sparse_attn_split import sparse_attn_batch, sparse_attn_split
from .common import Ceilings, Timer, kernel_row

__all__ = ["v4_cache", "v4_grid_", "peer_status", "bench_attention_peer", "PEER_COLS"]

V4_NOPE, V4_ROPE, V4_TILE, V4_BLOCK = 448, 64, 64, 64
V4_BYTES = V4_NOPE + 2 * V4_ROPE + V4_NOPE // V4_TILE + 1  # 584 bytes per token


def v4_cache(rows: torch.Tensor, block: int = V4_BLOCK) -> torch.Tensor:
    """bf16 rows `[N, 512]` (N a multiple of `block`) in FlashMLA's V4 layout, viewed
    `[N / block, block, 1, 584]` as float8_e4m3fn (the view FlashMLA's own tests pass)."""
    N, D = rows.shape
    if D != V4_NOPE + V4_ROPE:
        raise ValueError(f"rows.shape[1] = {D}; allowed: {V4_NOPE + V4_ROPE}")
    if N % block:
        raise ValueError(f"rows.shape[0] = {N}; allowed: a multiple of the page block {block}")
    nb, tiles = N // block, V4_NOPE // V4_TILE
    data_bytes = block * (V4_NOPE + 2 * V4_ROPE)
    stride = -(-block * V4_BYTES // 576) * 576
    buf = torch.zeros(nb, stride, dtype=torch.uint8, device=rows.device)
    step = max(1, (1 << 20) // block)  # page blocks per chunk: fp32 temporaries stay ~2 GB
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        part = rows[b0 * block : b1 * block]
        n = part.shape[0]
        nope = part[:, :V4_NOPE].float().view(n, tiles, V4_TILE)
        exp = torch.ceil(torch.log2(nope.abs().amax(-1).clamp_min(1e-4) / 448.0))  # [n, tiles]
        fp8 = (nope / torch.exp2(exp)[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).view(n, V4_NOPE)
        rope = part[:, V4_NOPE:].contiguous().view(torch.uint8)  # [n, 128]
        scales = torch.zeros(n, 8, dtype=torch.uint8, device=rows.device)
        scales[:, :tiles] = (exp + 127).to(torch.uint8)
        buf[b0:b1, :data_bytes] = torch.cat([fp8, rope], 1).view(b1 - b0, data_bytes)
        buf[b0:b1, data_bytes : block * V4_BYTES] = scales.view(b1 - b0, block * 8)
    return buf[:, : block * V4_BYTES].view(torch.float8_e4m3fn).view(nb, block, 1, V4_BYTES)


def peer_status() -> tuple[object | None, str]:
    """(the flash_mla module or None, a line saying what was found)."""
    try:
        import flash_mla
    except Exception as e:  # ImportError, or an OSError from its extension
        return None, f"not importable ({type(e).__name__}: {e})"
    has = getattr(flash_mla, "has_legacy", None)
    legacy = has() if callable(has) else bool(has)
    if not legacy:
        return None, f"flash_mla {getattr(flash_mla, '__version__', '?')} has no legacy (SM90) kernels"
    return flash_mla, f"flash_mla {getattr(flash_mla, '__version__', '?')} (legacy sparse decode)"


PEER_COLS = [
    ("context", "context"),
    ("batch", "batch"),
    ("name", "kernel"),
    ("ms", "GPU ms"),
    ("launch_ms", "launch ms"),
    ("gbps", "GB/s"),
    ("tflops", "TFLOP/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("x_peer", "ours/peer"),
    ("rel_diff", "rel diff"),
]


COPIES = 8  # query/selection sets per timed graph (on CUDA): distinct rows per call, as in a real step


def v4_grid_(rows: torch.Tensor) -> torch.Tensor:
    """Round bf16 rows `[N, 512]` in place onto the V4 format's grid (fp8 e4m3 with a
    power-of-two scale per 64-value tile of the first 448 values; the rope tail is bf16
    already), so that FlashMLA's cache holds exactly the rows ours reads."""
    tiles = V4_NOPE // V4_TILE
    for j in range(0, rows.shape[0], 1 << 20):
        part = rows[j : j + (1 << 20), :V4_NOPE]
        nope = part.float().view(-1, tiles, V4_TILE)
        scale = torch.exp2(torch.ceil(torch.log2(nope.abs().amax(-1, keepdim=True).clamp_min(1e-4) / 448.0)))
        part.copy_(((nope / scale).to(torch.float8_e4m3fn).float() * scale).view(-1, V4_NOPE))
    return rows


@dataclass
class _Problem:
    """`batch` sequences at `context` (a ratio-1 cache): their rings and caches side by side,
    and COPIES sets of queries and selections (each token's entries in its own sequence)."""

    q: list[torch.Tensor]  # [B, H, D] each
    win: torch.Tensor  # [B·window, D]
    comp: torch.Tensor  # [B·n_comp, D]
    win_idx: torch.Tensor  # [B, window], rows of win
    comp_idx: list[torch.Tensor]  # [B, k] each, rows of comp
    sink: torch.Tensor  # [H]


def _problem(cfg, batch: int, context: int, copies: int, gen: torch.Generator, dev) -> _Problem:
    H, D, W, K = cfg.n_heads, cfg.head_dim, cfg.window, cfg.index_topk
    n_comp = -(-context // V4_BLOCK) * V4_BLOCK
    win = torch.empty(batch * W, D, dtype=torch.bfloat16, device=dev)
    comp = torch.empty(batch * n_comp, D, dtype=torch.bfloat16, device=dev)
    for t in (win, comp):
        for j in range(0, t.shape[0], 1 << 20):
            t[j : j + (1 << 20)] = torch.randn(min(1 << 20, t.shape[0] - j), D, generator=gen, device=dev)
        if D == V4_NOPE + V4_ROPE:
            v4_grid_(t)
    k = min(K, context)
    b = torch.arange(batch, device=dev)[:, None]
    comp_idx = []
    for _ in range(copies):
        pick = torch.rand(batch, context, generator=gen, device=dev).topk(k, dim=1).indices.sort(dim=1).values
        comp_idx.append((b * n_comp + pick).to(torch.int32))
    q = [torch.randn(batch, H, D, generator=gen, device=dev).to(torch.bfloat16) for _ in range(copies)]
    win_idx = (b * W + torch.arange(W, device=dev)[None, :]).to(torch.int32)  # every ring slot present
    sink = torch.rand(H, generator=gen, device=dev) * 2 - 1
    return _Problem(q, win, comp, win_idx, comp_idx, sink)


def bench_attention_peer(
    cfg, device, ceil: Ceilings, contexts=(4096, 32768, 131072), batches=(1, 64), reps: int = 50, seed: int = 0
) -> tuple[list[dict], str]:
    """Rows for ours and (when importable) the peer at each context and batch, plus the
    peer status line. Ours runs the runtime's kernel (Triton on CUDA). Times are GPU time
    per call from a CUDA graph of COPIES calls on distinct queries and selections."""
    dev = torch.device(device)
    fm, status = peer_status() if dev.type == "cuda" else (None, "skipped (needs CUDA)")
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(seed + 23)
    H, D, W = cfg.n_heads, cfg.head_dim, cfg.window
    scale = D**-0.5
    copies = COPIES if dev.type == "cuda" else 1
    rows: list[dict] = []
    # FlashMLA's sparse decode takes 64 or 128 heads: a tensor-parallel share's fewer heads
    # run padded with zero queries, as engines hand them to it (vLLM's get_padded_num_q_heads)
    hp = next((n for n in (64, 128) if H <= n), None)
    use_peer = fm is not None and hp is not None and D == 512
    if fm is not None and not use_peer:
        status += f"; not run: it needs at most 128 heads of width 512 (this geometry: {H} x {D})"
    elif use_peer and hp != H:
        status += (
            f"; {H} heads padded to {hp} for it (zero queries), as engines pad a tensor-parallel share (its row's "
            f"bytes count the {hp} heads' q and o, its FLOPs the {H} real heads')"
        )
    kernels = (
        [
            ("attnv41 decode (split, bf16 rows)", sparse_attn_split),
            ("attnv41 decode, batched runtime (sparse_attn_batch)", sparse_attn_batch),
            ("attnv41 fused (prefill regime)", sparse_attn),
        ]
        + (
            [("attnv41 decode, one-pass Gluon (sparse_attn_gluon; opt-in)", sparse_attn_gluon)]
            if dev.type == "cuda"
            and HAVE_GLUON
            and torch.cuda.get_device_capability(dev)[0] == 9
            and H <= 64
            and D <= 512
            else []
        )
        if dev.type == "cuda"
        else [("attnv41 (torch twin)", _torch_twin)]
    )
    for ctx in contexts:
        for B in batches:
            pb = _problem(cfg, B, ctx, copies, gen, dev)
            K = W + pb.comp_idx[0].shape[1]
            sels = [torch.cat([pb.win_idx, ci + B * W], 1) for ci in pb.comp_idx]  # offset B·window: comp follows
            outs = [torch.empty(B, H, D, dtype=torch.bfloat16, device=dev) for _ in range(copies)]
            flops = 2 * 2 * B * H * K * D
            shape = f"B={B} H={H} K={K}"
            ours_rows = []
            for kname, fn in kernels:
                calls = [
                    partial(fn, q, pb.win, pb.comp, sel, B * W, pb.sink, scale, out=o)
                    for q, sel, o in zip(pb.q, sels, outs)
                ]
                o_k = calls[0]().clone()
                if not torch.isfinite(o_k.float()).all():
                    raise RuntimeError(f"sparse attention {kname} (context {ctx}, batch {B}): non-finite output")
                t, t_launch, how = timer.gpu_and_launch(calls, reps)
                row = kernel_row(
                    kname,
                    shape,
                    t,
                    B * (K * D * 2 + 2 * H * D * 2),
                    flops,
                    ceil,
                    context=ctx,
                    batch=B,
                    timing=how,
                    launch_ms=t_launch.median_ms,
                )
                rows.append(row)
                ours_rows.append((row, o_k))
            o_ours = ours_rows[0][1]
            if not use_peer:
                continue
            peer = _run_peer(fm, pb if hp == H else _padded(pb, hp), scale, timer, reps)
            if "error" in peer:
                status += f"; context {ctx} batch {B}: {peer['error']}"
                continue
            peer["out"] = peer["out"][:, :H]  # the padded heads' outputs are dropped
            rel = float((peer["out"].float() - o_ours.float()).norm() / o_ours.float().norm())
            pad = f", {H} heads padded to {hp}" if hp != H else ""
            row = kernel_row(
                f"FlashMLA legacy ({peer['layout']}{pad})",
                shape,
                peer["timing"],
                B * (K * V4_BYTES + 2 * hp * D * 2),
                flops,
                ceil,
                context=ctx,
                batch=B,
                rel_diff=rel,
                timing="graph",
                launch_ms=peer["launch"].median_ms,
            )
            for r, o_k in ours_rows:
                r["x_peer"] = r["ms"] / row["ms"]
                r["rel_diff"] = float((peer["out"].float() - o_k.float()).norm() / o_k.float().norm())
            rows.append(row)
            del peer, pb, calls
    return rows, status


def _padded(pb: _Problem, hp: int) -> _Problem:
    """The problem with every query padded to `hp` heads by zero queries (and zero sinks):
    what the peer computes for a tensor-parallel share; the first heads' outputs are the
    share's."""
    B, H, D = pb.q[0].shape
    q = [torch.cat([x, x.new_zeros(B, hp - H, D)], 1) for x in pb.q]
    sink = torch.cat([pb.sink, pb.sink.new_zeros(hp - H)])
    return _Problem(q, pb.win, pb.comp, pb.win_idx, pb.comp_idx, sink)


def _torch_twin(q, win, comp, sel, offset, sink, scale, out):
    from ..kernels.sparse_attn import sparse_attn_torch

    return sparse_attn_torch(q, win, comp, sel, offset, sink, scale, out=out)


def _run_peer(fm, pb: _Problem, scale: float, timer: Timer, reps: int) -> dict:
    """Time the peer: compressed rows as the main cache with the window as FlashMLA's
    'extra' cache; if that call is refused, one cache holding both (reported as such)."""
    B, H, D = pb.q[0].shape
    n_comp = pb.comp.shape[0]
    attempts = [
        (
            "main 512 + extra 128",
            lambda: (
                dict(k_cache=v4_cache(pb.comp), extra_k_cache=v4_cache(pb.win)),
                [dict(indices=ci[:, None], extra_indices_in_kvcache=pb.win_idx[:, None]) for ci in pb.comp_idx],
            ),
        ),
        (
            "one cache, 640",
            lambda: (
                dict(k_cache=v4_cache(torch.cat([pb.comp, pb.win]))),
                [dict(indices=torch.cat([pb.win_idx + n_comp, ci], 1)[:, None]) for ci in pb.comp_idx],
            ),
        ),
    ]
    errors = []
    for layout, build in attempts:
        caches, per_call = build()
        sched, _ = fm.get_mla_metadata()

        def call(kw, caches=caches, sched=sched, q=None):
            o, _ = fm.flash_mla_with_kvcache(
                q.view(B, 1, H, D),
                caches["k_cache"],
                None,
                None,
                D,
                sched,
                softmax_scale=scale,
                indices=kw["indices"],
                attn_sink=pb.sink,
                extra_k_cache=caches.get("extra_k_cache"),
                extra_indices_in_kvcache=kw.get("extra_indices_in_kvcache"),
                use_legacy=True,
                kv_format="V4",
            )
            return o

        calls = [partial(call, kw, q=q) for kw, q in zip(per_call, pb.q)]
        try:
            o = calls[0]()
            torch.cuda.synchronize()
        except Exception as e:  # the peer's own validation (asserts, RuntimeError): record, try the next layout
            errors.append(f"{layout}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            continue
        t, launch, _ = timer.gpu_and_launch(calls, reps)
        return {"out": o.view(B, H, D), "timing": t, "launch": launch, "layout": layout}
    return {"error": "peer call failed: " + " | ".join(errors)}
