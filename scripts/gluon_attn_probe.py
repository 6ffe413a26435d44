"""The Gluon one-pass decode attention (`kernels.sparse_attn_gluon`) against the batched
runtime's two-kernel attention (`sparse_attn_batch`) on synthetic Flash-shape inputs (as
scripts/attn_ncu.py builds them): bytes (o and the inverse-RoPE output), distance to the
reference, and time (one CUDA graph per call, L2 flushed before each replay). CUDA only.

    python3 scripts/gluon_attn_probe.py --batches 1,64 --tunes '[{}, {"stages": 3}]'
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.common import Timer  # noqa: E402
from attnv41.kernels.sparse_attn import sparse_attn_torch  # noqa: E402
from attnv41.kernels.sparse_attn_gluon import sparse_attn_gluon  # noqa: E402
from attnv41.kernels.sparse_attn_split import BATCH_TUNE, sparse_attn_batch, sparse_attn_split  # noqa: E402
from attnv41.reference.qdq import fp4_e4m3_qdq, fp8_qdq  # noqa: E402


def inputs(B, H=64, D=512, W=128, K=512, C=8192, absent=0, seed=0):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16
    q = torch.randn(B, H, D, generator=g, device=dev).to(bf)
    win = fp8_qdq(torch.randn(B * W, D, generator=g, device=dev).to(bf))
    comp = fp4_e4m3_qdq(torch.randn(B * C, D, generator=g, device=dev).to(bf))
    offset = B * W
    t = torch.arange(B, device=dev)
    w_sel = t[:, None] * W + torch.arange(W, device=dev)[None, :]
    c_sel = torch.rand(B, C, generator=g, device=dev).topk(K, dim=1).indices.sort(dim=1).values
    sel = torch.cat([w_sel, offset + t[:, None] * C + c_sel], dim=1).to(torch.int32)
    if absent:  # the last `absent` entries of every token −1 (fixed-width padding)
        sel[:, -absent:] = -1
    sink = torch.randn(H, generator=g, device=dev)
    pos = ((torch.arange(B, device=dev) * 97 + 5) % 8192).to(torch.int32)  # within the tables
    ang = torch.arange(8192, device=dev, dtype=torch.float32)[:, None] * torch.logspace(0, -4, 32, device=dev)[None, :]
    return q, win, comp, sel, offset, sink, (ang.cos(), ang.sin(), pos)


def bits(x):
    return x.view(torch.int16)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--tunes", type=json.loads, default=[{}])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    timer = Timer("cuda", flush_l2=True)
    print("| B | absent | form | µs | o == Triton | o_rot == Triton | max |o − ref| |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    for B in [int(b) for b in a.batches.split(",")]:
        for absent in (0, 100):
            q, win, comp, sel, offset, sink, (cos, sin, pos) = inputs(B, absent=absent)
            D = q.shape[2]
            ref = sparse_attn_torch(q, win, comp, sel, offset, sink, D**-0.5).float()
            prod = torch.empty_like(q)
            prod_r = torch.empty_like(q)
            sparse_attn_split(
                q, win, comp, sel, offset, sink, D**-0.5, out=prod, rot=(cos, sin, pos, prod_r), **BATCH_TUNE
            )
            single = sparse_attn_batch(q, win, comp, sel, offset, sink, D**-0.5)
            args = (q, win, comp, sel, offset, sink, D**-0.5)
            forms = [
                (
                    "Triton (BATCH_TUNE)",
                    lambda o, r, args=args, t=(cos, sin, pos): sparse_attn_split(
                        *args, out=o, rot=(*t, r), **BATCH_TUNE
                    ),
                )
            ]
            for tune in a.tunes:
                forms.append(
                    (
                        f"gluon {json.dumps(tune)}",
                        lambda o, r, tune=tune, args=args, t=(cos, sin, pos): sparse_attn_gluon(
                            *args, out=o, rot=(*t, r), **tune
                        ),
                    )
                )
            for name, fn in forms:
                o, r = torch.empty_like(q), torch.empty_like(q)
                try:
                    fn(o, r)
                    torch.cuda.synchronize()
                    us = timer.time_graph([lambda fn=fn, o=o, r=r: fn(o, r)], reps=a.reps).median_ms * 1e3
                except Exception as e:  # a probe: report and go on
                    print(f"| {B} | {absent} | {name} | error: {type(e).__name__}: {str(e)[:300]} | | | |", flush=True)
                    continue
                same = torch.equal(bits(o), bits(prod))
                same_r = torch.equal(bits(r), bits(prod_r))
                nd = int((bits(o) != bits(prod)).sum())
                err = (o.float() - ref).abs().max().item()
                fin = bool(torch.isfinite(o.float()).all())
                print(
                    f"| {B} | {absent} | {name} | {us:.1f} | {same} ({nd} differ) | {same_r} | {err:.3g} finite={fin} |",
                    flush=True,
                )
            print(
                f"(sparse_attn_batch == Triton BATCH_TUNE bytes: {torch.equal(bits(single), bits(prod))})", flush=True
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
