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

from functools import partial

import torch

from ..kernels.sparse_attn import sparse_attn
from .common import Ceilings, Timer, kernel_row

__all__ = ["v4_cache", "peer_status", "bench_attention_peer", "PEER_COLS"]

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
    ("ms", "ms"),
    ("gbps", "GB/s"),
    ("tflops", "TFLOP/s"),
    ("floor_ms", "floor ms"),
    ("x_floor", "x floor"),
    ("x_peer", "ours/peer"),
    ("rel_diff", "rel diff"),
]


def _problem(cfg, batch: int, context: int, gen: torch.Generator, dev):
    """Queries, rows and selections of `batch` sequences at `context` (ratio-1 cache)."""
    H, D, W, K = cfg.n_heads, cfg.head_dim, cfg.window, cfg.index_topk
    n_comp = -(-context // V4_BLOCK) * V4_BLOCK
    q = torch.randn(batch, H, D, generator=gen, device=dev).to(torch.bfloat16)
    win = torch.empty(batch * W, D, dtype=torch.bfloat16, device=dev)
    comp = torch.empty(batch * n_comp, D, dtype=torch.bfloat16, device=dev)
    for t in (win, comp):
        for j in range(0, t.shape[0], 1 << 20):
            t[j : j + (1 << 20)] = torch.randn(min(1 << 20, t.shape[0] - j), D, generator=gen, device=dev)
    k = min(K, context)
    pick = torch.rand(batch, context, generator=gen, device=dev).topk(k, dim=1).indices.sort(dim=1).values
    b = torch.arange(batch, device=dev)[:, None]
    win_idx = (b * W + torch.arange(W, device=dev)[None, :]).to(torch.int32)  # every ring slot present
    comp_idx = (b * n_comp + pick).to(torch.int32)
    sink = torch.rand(H, generator=gen, device=dev) * 2 - 1
    return q, win, comp, win_idx, comp_idx, sink


def bench_attention_peer(
    cfg, device, ceil: Ceilings, contexts=(4096, 32768, 131072), batches=(1, 64), reps: int = 50, seed: int = 0
) -> tuple[list[dict], str]:
    """Rows for ours and (when importable) the peer at each context and batch, plus the
    peer status line. Ours runs the runtime's kernel (Triton on CUDA)."""
    dev = torch.device(device)
    fm, status = peer_status() if dev.type == "cuda" else (None, "skipped (needs CUDA)")
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(seed + 23)
    H, D, W = cfg.n_heads, cfg.head_dim, cfg.window
    scale = D**-0.5
    rows: list[dict] = []
    use_peer = fm is not None and H in (64, 128) and D == 512
    if fm is not None and not use_peer:
        status += f"; not run: it needs 64 or 128 heads of width 512 (this geometry: {H} x {D})"
    for ctx in contexts:
        for B in batches:
            q, win, comp, win_idx, comp_idx, sink = _problem(cfg, B, ctx, gen, dev)
            K = W + comp_idx.shape[1]
            sel = torch.cat([win_idx, comp_idx + B * W], 1)  # offset = B·window: comp rows follow
            out = torch.empty(B, H, D, dtype=torch.bfloat16, device=dev)
            fn = sparse_attn if dev.type == "cuda" else _torch_twin
            o_ours = fn(q, win, comp, sel, B * W, sink, scale, out=out).clone()
            if not torch.isfinite(o_ours.float()).all():
                raise RuntimeError(f"sparse attention (context {ctx}, batch {B}): non-finite output")
            t = timer.time(partial(fn, q, win, comp, sel, B * W, sink, scale, out=out), warmup=5, reps=reps)
            flops = 2 * 2 * B * H * K * D
            ours = kernel_row(
                "attnv41 (bf16 rows)",
                f"B={B} H={H} K={K}",
                t,
                B * (K * D * 2 + 2 * H * D * 2),
                flops,
                ceil,
                context=ctx,
                batch=B,
            )
            rows.append(ours)
            if not use_peer:
                continue
            peer = _run_peer(fm, q, win, comp, win_idx, comp_idx, sink, scale, B, ctx, timer, reps)
            if "error" in peer:
                status += f"; context {ctx} batch {B}: {peer['error']}"
                continue
            rel = float((peer["out"].float() - o_ours.float()).norm() / o_ours.float().norm())
            row = kernel_row(
                f"FlashMLA legacy ({peer['layout']})",
                f"B={B} H={H} K={K}",
                peer["timing"],
                B * (K * V4_BYTES + 2 * H * D * 2),
                flops,
                ceil,
                context=ctx,
                batch=B,
                rel_diff=rel,
            )
            ours["x_peer"] = ours["ms"] / row["ms"]
            ours["rel_diff"] = rel
            rows.append(row)
            del peer
    return rows, status


def _torch_twin(q, win, comp, sel, offset, sink, scale, out):
    from ..kernels.sparse_attn import sparse_attn_torch

    return sparse_attn_torch(q, win, comp, sel, offset, sink, scale, out=out)


def _run_peer(fm, q, win, comp, win_idx, comp_idx, sink, scale, B, ctx, timer, reps) -> dict:
    """Time the peer: compressed rows as the main cache with the window as FlashMLA's
    'extra' cache; if that call is refused, one cache holding both (reported as such)."""
    D = q.shape[-1]
    q4 = q.view(B, 1, q.shape[1], D)
    n_comp = comp.shape[0]
    attempts = [
        (
            "main 512 + extra 128",
            lambda: dict(
                k_cache=v4_cache(comp),
                indices=comp_idx[:, None],
                extra_k_cache=v4_cache(win),
                extra_indices_in_kvcache=win_idx[:, None],
            ),
        ),
        (
            "one cache, 640",
            lambda: dict(
                k_cache=v4_cache(torch.cat([comp, win])), indices=torch.cat([win_idx + n_comp, comp_idx], 1)[:, None]
            ),
        ),
    ]
    errors = []
    for layout, build in attempts:
        kw = build()
        sched, _ = fm.get_mla_metadata()
        call = lambda kw=kw, sched=sched: fm.flash_mla_with_kvcache(  # noqa: E731
            q4,
            kw["k_cache"],
            None,
            None,
            D,
            sched,
            softmax_scale=scale,
            indices=kw["indices"],
            attn_sink=sink,
            extra_k_cache=kw.get("extra_k_cache"),
            extra_indices_in_kvcache=kw.get("extra_indices_in_kvcache"),
            use_legacy=True,
            kv_format="V4",
        )
        try:
            o, _ = call()
            torch.cuda.synchronize()
        except Exception as e:  # the peer's own validation (asserts, RuntimeError): record, try the next layout
            errors.append(f"{layout}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            continue
        t = timer.time(call, warmup=5, reps=reps)
        return {"out": o.view(B, q.shape[1], D), "timing": t, "layout": layout}
    return {"error": "peer call failed: " + " | ".join(errors)}
