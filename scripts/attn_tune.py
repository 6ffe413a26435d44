"""GPU sweep of the decode-regime sparse attention (`kernels.sparse_attn_split`) beside the
fused kernel and FlashMLA's legacy Hopper sparse decode (when `flash_mla` imports), at
the Flash geometry (64 heads × 512, window 128 + top-k 512, a ratio-1 cache of `--context`
rows per sequence), batch 1 and 64. Each config is checked against the split twin (on
the GPU, torch) before it is timed (CUDA graph of 8 calls on distinct inputs, L2 flushed).

    python3 scripts/attn_tune.py [--context 32768] [--batches 1,64] [--quick]

Prints one Markdown table; writes `$OUT/attn_tune.json` when OUT is set.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from functools import partial

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from attnv41.bench.common import Timer, measure_ceilings  # noqa: E402
from attnv41.bench.peer import COPIES, _problem, _run_peer, peer_status  # noqa: E402
from attnv41.config import v41_flash  # noqa: E402
from attnv41.kernels.sparse_attn import sparse_attn  # noqa: E402
from attnv41.kernels.sparse_attn_split import sparse_attn_split, sparse_attn_split_torch  # noqa: E402


def _err(got, ref) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--quick", action="store_true", help="the production config and two alternatives only")
    ap.add_argument(
        "--set", default="all", choices=["all", "blocks"], help="blocks: the block-parallel combine's tiles"
    )
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg = v41_flash()
    ceil = measure_ceilings(dev, quick=True)
    timer = Timer(dev, flush_l2=True)
    gen = torch.Generator(device=dev).manual_seed(7)
    fm, status = peer_status()
    print(f"peer: {status}; copy {ceil.copy_gbps:.0f} GB/s", flush=True)
    H, D, W = cfg.n_heads, cfg.head_dim, cfg.window
    scale = D**-0.5
    configs = [dict(), dict(only_logits=True)]  # production, then its first kernel's share
    if args.set == "blocks":  # the two combines (same bits) side by side, for the m rule
        configs += [dict(combine="loop"), dict(combine="blocks")]
    elif not args.quick:
        for ch, cd, warps, stages in itertools.product((16, 32, 64), (32, 64, 128), (4, 8), (2, 3)):
            if (ch, cd) not in ((64, 128), (32, 128)):
                configs.append(dict(comb_h=ch, comb_d=cd, warps_b=warps, stages_b=stages))
        configs.append(dict(dk=256, warps_a=4, stages_a=3))
        configs += [dict(bh=16), dict(bh=32), dict(bh=32, warps_a=8), dict(dk=64, stages_a=4)]
    rows = []
    for B in [int(b) for b in args.batches.split(",")]:
        pb = _problem(cfg, B, args.context, COPIES, gen, dev)
        sels = [torch.cat([pb.win_idx, ci + B * W], 1) for ci in pb.comp_idx]
        K = sels[0].shape[1]
        byts = B * (K * D * 2 + 2 * H * D * 2)
        outs = [torch.empty(B, H, D, dtype=torch.bfloat16, device=dev) for _ in range(COPIES)]
        ref_split = sparse_attn_split_torch(  # the reference order
            pb.q[0], pb.win, pb.comp, sels[0], B * W, pb.sink, scale
        )
        fused = [
            partial(sparse_attn, q, pb.win, pb.comp, s, B * W, pb.sink, scale, out=o)
            for q, s, o in zip(pb.q, sels, outs)
        ]
        o_fused = fused[0]().clone()
        o_loop = sparse_attn_split(pb.q[0], pb.win, pb.comp, sels[0], B * W, pb.sink, scale, combine="loop")
        t, _, _ = timer.gpu_and_launch(fused, 30)
        rows.append(dict(batch=B, name="fused (prefill regime)", us=t.median_ms * 1e3, err=_err(o_fused, ref_split)))
        print(rows[-1], flush=True)
        for kw in configs:
            name = "split " + (",".join(f"{k}={v}" for k, v in kw.items()) or "production")
            try:
                calls = [
                    partial(sparse_attn_split, q, pb.win, pb.comp, s, B * W, pb.sink, scale, out=o, **kw)
                    for q, s, o in zip(pb.q, sels, outs)
                ]
                o = calls[0]().clone()
                if kw.get("only_logits"):  # no output: time only
                    t, _, _ = timer.gpu_and_launch(calls, 30)
                    rows.append(dict(batch=B, name=name, us=t.median_ms * 1e3, err=float("nan")))
                    print(rows[-1], flush=True)
                    continue
                e = _err(o, ref_split)
                if not torch.isfinite(o.float()).all() or e > 2.0**-7:
                    raise RuntimeError(f"wrong result: rel err {e:.3g}")
                m1 = sparse_attn_split(pb.q[0][:1], pb.win, pb.comp, sels[0][:1], B * W, pb.sink, scale, **kw)
                inv = bool(torch.equal(m1, o[:1]))
                t, _, _ = timer.gpu_and_launch(calls, 30)
                rows.append(
                    dict(
                        batch=B,
                        name=name,
                        us=t.median_ms * 1e3,
                        err=e,
                        err_fused=float((o != o_fused).float().mean()),
                        err_loop=float((o != o_loop).float().mean()),
                        m_invariant=inv,
                    )
                )
            except Exception as ex:  # one config failing must not stop the sweep
                rows.append(dict(batch=B, name=name, error=f"{type(ex).__name__}: {str(ex)[:200]}"))
            print(rows[-1], flush=True)
        if fm is not None:
            peer = _run_peer(fm, pb, scale, timer, 30)
            if "error" in peer:
                rows.append(dict(batch=B, name="FlashMLA legacy", error=peer["error"]))
            else:
                rows.append(
                    dict(
                        batch=B,
                        name=f"FlashMLA legacy ({peer['layout']})",
                        us=peer["timing"].median_ms * 1e3,
                        err=_err(peer["out"], ref_split),
                    )
                )
            print(rows[-1], flush=True)
        for r in rows:
            if r["batch"] == B and "us" in r:
                r["gbps"] = byts / (r["us"] * 1e-6) / 1e9
        del pb, fused, outs
        torch.cuda.empty_cache()
    peer_us = {r["batch"]: r["us"] for r in rows if r["name"].startswith("FlashMLA") and "us" in r}
    print(f"\n### sparse attention, decode regime (context {args.context}, H={H}, D={D}, K={W}+{cfg.index_topk})\n")
    print(
        "| batch | kernel | µs | GB/s | x FlashMLA | max rel err vs reference order | share != fused | share != loop | m-invariant |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['batch']} | {r['name']} | error: {r['error']} | | | | | | |")
            continue
        xp = f"{r['us'] / peer_us[r['batch']]:.2f}" if r["batch"] in peer_us else "-"
        ef = f"{r['err_fused']:.2g}" if "err_fused" in r else "-"
        el = f"{r['err_loop']:.2g}" if "err_loop" in r else "-"
        inv = r.get("m_invariant", "-")
        print(
            f"| {r['batch']} | {r['name']} | {r['us']:.1f} | {r['gbps']:.0f} | {xp} | {r['err']:.2g} | {ef} | {el} | {inv} |"
        )
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "attn_tune.json"), "w") as f:
            json.dump(dict(context=args.context, copy_gbps=ceil.copy_gbps, peer=status, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
