"""The batched decode attention's two kernels (`sparse_attn_batch`: `_logits_kernel`,
`_pv_combine_kernel`) on synthetic inputs at the batched step's shapes, bf16 and packed
rows, for Nsight Compute (a development tool; CUDA only, or the CPU interpreter as a smoke
run at small shapes).

B tokens, 64 heads × 512 (the Flash attention), each token's 128 window rows of its own
and 512 compressed rows drawn from its own 8,192 (a 32K context at compress ratio 4),
window entries first as the runtime orders them. Each format runs twice (the first call
compiles). Under ncu, filter the kernels by name:

    ncu --clock-control none -k regex:"_logits_kernel|_pv_combine_kernel" \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 scripts/attn_ncu.py [--batch 64]

`--time '[{"dk": 64}, ...]'`: instead, each launch shape (overrides of `BATCH_TUNE`, or
with `--base single` of the single-sequence `_TUNE`) timed in a CUDA graph with the L2
flushed before each replay, its output's bytes against the production shape's; `--rounds
N` times the shapes N times in turn (the table: each shape's median over the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.common import Timer  # noqa: E402
from attnv41.kernels.sparse_attn_split import _TUNE as SINGLE_TUNE  # noqa: E402
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_batch, sparse_attn_split  # noqa: E402
from attnv41.packed import pack  # noqa: E402
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--topk", type=int, default=512)
    ap.add_argument("--comp-per-token", type=int, default=8192)
    ap.add_argument("--kv", default="bf16,packed")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--time", type=json.loads, default=None, help="a JSON list of launch shapes to time")
    ap.add_argument(
        "--base", choices=("batch", "single"), default="batch", help="the shapes override BATCH_TUNE or _TUNE"
    )
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    dev = torch.device(a.device)
    g = torch.Generator(device=dev).manual_seed(0)
    B, H, D, W, K, C = a.batch, a.heads, a.dim, a.window, a.topk, a.comp_per_token
    bf = torch.bfloat16
    q = torch.randn(B, H, D, generator=g, device=dev).to(bf)
    win = fp8_qdq(torch.randn(B * W, D, generator=g, device=dev).to(bf))
    comp = torch.empty(B * C, D, dtype=bf, device=dev)
    for r in range(0, B * C, 1 << 16):  # in slices: the qdq's fp32 temporaries stay small
        n = min(1 << 16, B * C - r)
        comp[r : r + n] = fp4_e4m3_qdq(torch.randn(n, D, generator=g, device=dev).to(bf))
    offset = B * W
    t = torch.arange(B, device=dev)
    w_sel = t[:, None] * W + torch.arange(W, device=dev)[None, :]
    c_sel = torch.rand(B, C, generator=g, device=dev).topk(K, dim=1).indices.sort(dim=1).values
    sel = torch.cat([w_sel, offset + t[:, None] * C + c_sel], dim=1).to(torch.int32)
    sink = torch.randn(H, generator=g, device=dev)
    outs = {}
    for kvf in a.kv.split(","):
        w_, c_ = (win, comp) if kvf == "bf16" else (pack(win, "fp8_e8m0"), pack(comp, "fp4_e4m3"))
        out = torch.empty(B, H, D, dtype=bf, device=dev)
        if a.time is not None:
            timer = Timer(dev, flush_l2=True)
            base_tune = BATCH_TUNE if a.base == "batch" else SINGLE_TUNE
            shapes = [{}] + a.time
            outs_t = [torch.empty_like(out) for _ in shapes]

            def call(tune, o, w_=w_, c_=c_, base_tune=base_tune):
                sparse_attn_split(q, w_, c_, sel, offset, sink, D**-0.5, out=o, **{**base_tune, **tune})

            for tune, o in zip(shapes, outs_t):
                call(tune, o)
            timer.sync()
            times = [[] for _ in shapes]
            for _ in range(a.rounds):
                for i, (tune, o) in enumerate(zip(shapes, outs_t)):
                    fn = lambda tune=tune, o=o: call(tune, o)  # noqa: E731
                    us = timer.time_graph([fn], reps=20) if dev.type == "cuda" else timer.time(fn, warmup=0, reps=1)
                    times[i].append(us.median_ms * 1e3)
            for tune, o, ts in zip(shapes, outs_t, times):
                same = torch.equal(o.view(torch.int16), outs_t[0].view(torch.int16))
                ts = sorted(ts)
                print(
                    f"| B={B} {a.base} | {kvf} | {json.dumps(tune)} | {ts[len(ts) // 2]:.1f} | {ts[0]:.1f}-{ts[-1]:.1f} | {same} |",
                    flush=True,
                )
        for _ in range(2):
            sparse_attn_batch(q, w_, c_, sel, offset, sink, D**-0.5, out=out)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        outs[kvf] = out
        print(f"{kvf}: B={B} H={H} D={D} K={W + K} finite={bool(torch.isfinite(out.float()).all())}", flush=True)
    if len(outs) == 2:
        same = torch.equal(outs["bf16"].view(torch.int16), outs["packed"].view(torch.int16))
        print(f"packed == bf16 bytes: {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
