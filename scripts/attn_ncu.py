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

`--time '[{"dk": 64}, ...]'`: instead, each launch shape (overrides of `BATCH_TUNE`) timed
in a CUDA graph with the L2 flushed before each replay, its output's bytes against the
production shape's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.common import Timer  # noqa: E402
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
            base = None
            for tune in [{}] + a.time:
                o = torch.empty_like(out)

                def call(tune=tune, o=o, w_=w_, c_=c_):
                    sparse_attn_split(q, w_, c_, sel, offset, sink, D**-0.5, out=o, **{**BATCH_TUNE, **tune})

                call()
                timer.sync()
                base = o.clone() if base is None else base
                us = timer.time_graph([call], reps=20) if dev.type == "cuda" else timer.time(call, warmup=0, reps=1)
                same = torch.equal(o.view(torch.int16), base.view(torch.int16))
                print(f"| {kvf} | {json.dumps(tune)} | {us.median_ms * 1e3:.1f} | {same} |", flush=True)
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
